"""The chat message model (`app.runtime.chat_messages`) stays Qt-free: it imports with Qt blocked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_chat_messages_import_without_qt():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('PySide6', 'shiboken6', 'pyqtgraph'):\n"
        "            raise ImportError('Qt is blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from app.runtime.chat_messages import ChatMessage, chat_dicts, title_of\n"
        "print(chat_dicts([ChatMessage('user', 'hi')]), title_of(' a\\n b '))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[{'role': 'user', 'content': 'hi'}] a b"
