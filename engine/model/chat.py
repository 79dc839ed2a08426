"""Chat messages to token ids, the one way the model sees them: the tokenizer's own chat
template. The runner, sessions, sweeps, diffs, billing, the demos and the app's token strips
all render here, so positions agree everywhere. Needs a tokenizer only, never weights.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import Any, Sequence

from engine.core.errors import InputError

# Roles whose message makes the client send a request (the model answers after it).
REQUEST_ROLES = ("user", "tool", "function")
# Probe texts no real chat contains: they find what the template adds around a message.
_PROBE_USER = "\u2063cachescope probe user\u2063"
_PROBE_SYSTEM = "\u2063cachescope probe system\u2063"


def _apply_template(tokenizer: Any, messages: Any, **kwargs: Any) -> Any:
    """The one call of `tokenizer.apply_chat_template`: a template the Jinja sandbox refuses
    (or that raises on these messages) is one `InputError`, not an internal error."""
    try:
        from jinja2 import TemplateError
    except ImportError:  # pragma: no cover - transformers depends on jinja2
        TemplateError = RuntimeError  # noqa: N806
    try:
        return tokenizer.apply_chat_template(messages, **kwargs)
    except TemplateError as exc:
        name = getattr(tokenizer, "name_or_path", "") or "the model"
        raise InputError(f"{name}: the chat template refused these messages "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no reason given'})") from None


def render_chat(tokenizer: Any, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True,
                tools: list[Any] | None = None) -> list[int]:
    """Token ids of `messages` through the tokenizer's chat template; with
    `add_generation_prompt` they end with the header the model's reply follows. `tools`
    (OpenAI-style definitions) go to the template's own tool slot, which a template
    without one ignores (see `template_renders_tools`)."""
    if not messages:
        raise InputError("a chat needs at least one message")
    extra = {"tools": list(tools)} if tools else {}
    encoded = _apply_template(tokenizer, list(messages), add_generation_prompt=add_generation_prompt,
                              tokenize=True, return_dict=True, **extra)
    return list(encoded["input_ids"])


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template has a tool slot: a probe tool passed as `tools=` shows up
    in the rendered text (SmolLM2's template has none and drops it silently)."""
    name = "cachescope_probe_tool_⁣"
    probe = [{"type": "function", "function": {"name": name, "description": _PROBE_SYSTEM,
                                               "parameters": {"type": "object", "properties": {}}}}]
    try:
        text = _apply_template(tokenizer, [{"role": "user", "content": _PROBE_USER}], tools=probe, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot take tools has no slot for them
        return False
    return isinstance(text, str) and name in text


def default_system_prompt(tokenizer: Any) -> str:
    """The system text the chat template inserts when no system message is given ('' if none)."""
    try:
        plain = _apply_template(tokenizer, [{"role": "user", "content": _PROBE_USER}], tokenize=False)
        with_sys = _apply_template(tokenizer, [{"role": "system", "content": _PROBE_SYSTEM},
                                               {"role": "user", "content": _PROBE_USER}], tokenize=False)
    except Exception:  # noqa: BLE001 - a template without system support has no default either
        return ""
    a = plain[:plain.find(_PROBE_USER)]
    b = with_sys[:with_sys.find(_PROBE_USER)].replace(_PROBE_SYSTEM, "")
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    j = 0
    while j < min(len(a), len(b)) - i and a[len(a) - 1 - j] == b[len(b) - 1 - j]:
        j += 1
    return a[i:len(a) - j].strip()


def message_ends(tokenizer: Any, messages: Sequence[dict[str, str]], tools: list[Any] | None = None) -> list[int]:
    """The token index where each message ends in the rendered chat (no generation prompt).

    Message k spans `ends[k-1]:ends[k]` (from 0 for the first); tokens the template puts
    before the first message (a default system prompt, its tool slot) belong to the first span."""
    return [len(render_chat(tokenizer, messages[:i + 1], False, tools)) for i in range(len(messages))]


def request_positions(roles: Sequence[str]) -> list[int]:
    """Positions of the messages a request is sent after: every user or tool message,
    except that parallel tool results go out together, after the last one."""
    return [p for p, role in enumerate(roles)
            if role in REQUEST_ROLES and not (p + 1 < len(roles) and roles[p + 1] in ("tool", "function"))]


@dataclass(slots=True, frozen=True)
class Turn:
    """One request of a chat: the prompt sent after message `message_position` and the
    recorded reply (messages up to `reply_end`), as token ids."""

    index: int
    message_position: int
    reply_end: int
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    message_starts: tuple[int, ...]  # token index where each message 0..reply_end starts

    def message_at(self, token_index: int | None) -> int | None:
        """The position of the message that holds token `token_index` (None if unknown)."""
        if token_index is None:
            return None
        return max(bisect.bisect_right(self.message_starts, token_index) - 1, 0)


def render_turns(messages: Sequence[Any], tokenizer: Any, tools: list[Any] | None = None) -> list[Turn]:
    """Cut a chat into requests (see `request_positions`), each prompt rendered with the
    generation prompt; the following assistant messages are the reply. `messages` are
    objects with `role` and `content` (stored rows, parsed messages). `tools` go to the
    template's tool slot when it has one, else ahead of the system text."""
    chat = [{"role": m.role, "content": m.content} for m in messages]
    shift = 0
    slot = tools if tools and template_renders_tools(tokenizer) else None
    if tools and slot is None:
        # The template has no tool slot; tool definitions lead the prefix, as hosted APIs order them.
        tool_text = "Tools:\n" + json.dumps(tools, ensure_ascii=False, sort_keys=True)
        if chat and chat[0]["role"] == "system":
            chat[0] = {"role": "system", "content": tool_text + "\n\n" + chat[0]["content"]}
        else:
            chat.insert(0, {"role": "system", "content": tool_text})
            shift = 1
    ends = message_ends(tokenizer, chat, slot)
    starts = [0] + ends[:-1]
    eos = getattr(tokenizer, "eos_token_id", None)
    turns: list[Turn] = []
    for p in request_positions([m.role for m in messages]):
        r = p + shift
        prompt = render_chat(tokenizer, chat[:r + 1], True, slot)
        q = r
        while q + 1 < len(chat) and chat[q + 1]["role"] == "assistant":
            q += 1
        output: list[int] = []
        if q > r:
            full = render_chat(tokenizer, chat[:q + 1], False, slot)
            if full[:len(prompt)] == prompt:
                output = full[len(prompt):]
            else:
                output = list(tokenizer.encode("\n".join(c["content"] for c in chat[r + 1:q + 1]),
                                               add_special_tokens=False))
                output += [eos] if eos is not None else []
            # The template's newline after end-of-turn belongs to the next prompt, not the reply.
            if eos is not None and eos in output:
                output = output[:len(output) - output[::-1].index(eos)]
        turns.append(Turn(len(turns), p, q - shift, tuple(prompt), tuple(output), tuple(starts[shift:q + 1])))
    return turns


def message_spans(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[list[int]]:
    """The token ids of each message as the template frames it inside the whole chat.

    Tokens the template adds before the first message on its own (a default system prompt
    when the chat has none) belong to no message and are left out: they are the bundled
    model's preamble, not part of what a client sent."""
    if not messages:
        return []
    ids = render_chat(tokenizer, messages, False)
    ends = message_ends(tokenizer, messages)
    # The first message rendered twice shows its own framing; the rest of its first span is preamble.
    alone = ends[0]
    twice = len(render_chat(tokenizer, [messages[0], messages[0]], False))
    preamble = max(alone - (twice - alone), 0)
    starts = [preamble] + ends[:-1]
    return [ids[s:e] for s, e in zip(starts, ends)]


def requests_after_edit(roles: Sequence[str], position: int, *, keep_replies: bool) -> list[int]:
    """Where an edit invalidates: the positions of the requests that editing message
    `position` makes re-run (see `request_positions`), in order.

    Every block from the edited token on changes its hash (each block's hash covers all
    tokens before it), so every request whose tokens include the edit must be served
    again. With `keep_replies` (recorded replies are teacher-forced) a request's tokens are
    its prompt and its reply, so editing a reply re-runs the request that produced it;
    otherwise the model answers afresh and only prompts count, so an edited reply is kept
    as the user wrote it and the next request is the first to re-run.
    """
    if not 0 <= position < len(roles):
        raise InputError(f"there is no message {position}; messages are numbered 0 to {len(roles) - 1}")
    out = []
    for p in request_positions(roles):
        reply_end = p
        while keep_replies and reply_end + 1 < len(roles) and roles[reply_end + 1] == "assistant":
            reply_end += 1
        if reply_end >= position:
            out.append(p)
    return out
