"""One chat renderer: every consumer renders through `engine.model.chat`, so the token
positions the app, billing, sweeps and sessions show are the ones the model is fed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.core.errors import InputError
from engine.model.chat import message_ends, message_spans, render_chat, render_turns

ROOT = Path(__file__).resolve().parent.parent
CHAT = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "An apple."},
        {"role": "user", "content": "And a  vegetable?\n\n<|im_end|> tricky"}]


def test_render_chat_is_the_template_tokenized_once(default_tokenizer):
    tok = default_tokenizer
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert render_chat(tok, CHAT) == tok.encode(text, add_special_tokens=False)
    bare = render_chat(tok, CHAT, add_generation_prompt=False)
    assert render_chat(tok, CHAT)[:len(bare)] == bare
    assert tok.decode(render_chat(tok, CHAT)[len(bare):]) == "<|im_start|>assistant\n"
    with pytest.raises(InputError):
        render_chat(tok, [])


def test_message_ends_cut_the_whole_chat(default_tokenizer):
    ends = message_ends(default_tokenizer, CHAT)
    full = render_chat(default_tokenizer, CHAT, False)
    assert ends[-1] == len(full) and ends == sorted(ends)
    assert default_tokenizer.decode(full[ends[0]:ends[1]]).startswith("<|im_start|>assistant\nAn apple.")


def test_message_spans_leave_out_the_template_preamble(default_tokenizer):
    tok = default_tokenizer
    spans = message_spans(tok, CHAT)
    # Billing's counts: each message as ChatML frames it, without SmolLM2's default system prompt.
    hand = [tok.encode(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n", add_special_tokens=False) for m in CHAT]
    assert spans == hand
    with_system = [{"role": "system", "content": "Be brief."}] + CHAT
    assert message_spans(tok, with_system)[1:] == hand


def test_sessions_turns_use_the_same_tokens(default_tokenizer):
    class Row:
        def __init__(self, role, content):
            self.role, self.content = role, content

    turns = render_turns([Row(m["role"], m["content"]) for m in CHAT], default_tokenizer)
    assert [t.message_position for t in turns] == [0, 2]
    assert list(turns[1].prompt_token_ids) == render_chat(default_tokenizer, CHAT)


def test_no_other_module_renders_a_chat_template():
    # A copy that says "exactly as X does" should call X.
    allowed = {"engine/model/chat.py"}
    offenders = []
    for path in [*ROOT.glob("engine/**/*.py"), *ROOT.glob("app/**/*.py")]:
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        if rel not in allowed and (".apply_chat_template(" in text or re.search(r"<\|im_start\|>\{", text)):
            offenders.append(rel)
    assert offenders == []
