"""Exceptions a user can act on. Each carries one sentence meant to be shown as is.

`InputError` and its subclasses become exit status 2 on the command line and a dialog in
the app; anything else is an internal error.
"""

from __future__ import annotations

import json
from pathlib import Path


def show_path(path: str | Path) -> str:
    """`path` as a message shows it: as it is when every character prints, quoted with
    escapes otherwise, so a name holding a newline or a control character keeps the
    message on one line."""
    text = str(path)
    if text.isprintable():
        return text
    return json.dumps(text, ensure_ascii=False)


def one_line(message: str) -> str:
    """A message with any line break escaped: the command line's last guard of its
    one-line promise, for a sentence that quoted something without `show_path`."""
    return message if message.isprintable() else json.dumps(message, ensure_ascii=False)[1:-1]


class InputError(ValueError):
    """Bad input from the user: a file, an argument or a request that cannot be served."""


class TraceError(InputError):
    """A trace or conversation file that cannot be read, located to file, line and field."""

    def __init__(self, path: str, line: int | None, field: str | None, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.problem = problem
        where = show_path(self.path)
        if line is not None:
            where += f", line {line}"
        if field:
            where += f", field '{field}'"
        super().__init__(f"{where}: {problem}")


class CapacityError(InputError):
    """A request needs more free blocks than the pool can give; nothing was changed."""

    def __init__(self, request_id: str, num_needed: int, num_available: int, num_total: int) -> None:
        self.request_id = request_id
        self.num_needed = num_needed
        self.num_available = num_available
        self.num_total = num_total
        super().__init__(
            f"request {request_id!r} needs {num_needed} free blocks but only "
            f"{num_available} of {num_total} can be freed; it was refused and nothing changed"
        )


class ResetRefusedError(InputError):
    """`reset` was asked for while some blocks are still referenced by running requests."""
