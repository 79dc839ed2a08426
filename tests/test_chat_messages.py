"""The chat message model (`app.runtime.chat_messages`) stays Qt-free: nothing it imports,
directly or not, reaches Qt."""

from __future__ import annotations

import grimp

from app.runtime.chat_messages import ChatMessage, chat_dicts, title_of


def test_chat_messages_import_no_qt():
    graph = grimp.build_graph("app", "engine", include_external_packages=True)
    for qt in ("PySide6", "pyqtgraph"):
        assert graph.find_shortest_chain(importer="app.runtime.chat_messages", imported=qt) is None, qt


def test_chat_dicts_and_title():
    assert chat_dicts([ChatMessage("user", "hi")]) == [{"role": "user", "content": "hi"}]
    assert title_of(" a\n b ") == "a b"
    assert len(title_of("x" * 100)) == 60
