"""Where the files shipped with Cachescope live: traces, sample sessions, demo inputs,
labelled pairs and billing rules, all under the project's `resources/` folder.

One locator, so a source checkout and a desktop bundle find them the same way.
"""

from __future__ import annotations

from pathlib import Path

RESOURCES = Path(__file__).resolve().parents[1] / "resources"


def resource_path(*parts: str) -> Path:
    """The path of a shipped file, e.g. ``resource_path("traces", "demo_tokens.jsonl")``."""
    return RESOURCES.joinpath(*parts)
