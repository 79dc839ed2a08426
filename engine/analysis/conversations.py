"""Conversation files as plain chats for the analyses (sweep, diff, billing): parsed by
`engine.store.formats`, flattened to [{"role", "content"}] with text content. Rendering
them to token ids is `engine.model.chat`'s business.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.core.validation import check_regular_file
from engine.store.formats import load_conversations


def message_text(content: Any) -> str:
    """The text of an OpenAI/Anthropic message content: a string or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(message_text(p.get("text", p.get("content")) if isinstance(p, dict) else p) for p in content)
    return str(content)


def messages_of(conv: Any) -> list[dict[str, str]]:
    """[{"role", "content"}] with text content, from a formats.Conversation or a message list."""
    msgs = getattr(conv, "messages", conv)
    out = []
    for m in msgs:
        role = m.get("role") if isinstance(m, dict) else getattr(m, "role", None)
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", None)
        out.append({"role": str(role or "user"), "content": message_text(content)})
    return out


def load_conversation_file(path: str | Path) -> list[Any]:
    """Conversations of a message file (OpenAI, ShareGPT, Anthropic, MT-Bench, session files)."""
    p = Path(path)
    check_regular_file(p, "conversation file")  # missing, a directory, a FIFO or a device: one sentence
    return list(load_conversations(p))
