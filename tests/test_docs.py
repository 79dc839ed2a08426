"""Every command-line subcommand is documented in the README and answers --help."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.cli import build_parser, command_modules

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
NAMES = [m.NAME for m in command_modules()]


def test_readme_opens_with_the_two_commands():
    head = README[:600]
    assert "make run" in head and "make test" in head


@pytest.mark.parametrize("name", NAMES)
def test_subcommand_is_documented_in_readme(name):
    assert re.search(rf"^#+ .*`cachescope {re.escape(name)}\b", README, re.MULTILINE), \
        f"README.md has no section heading for `cachescope {name}`"


@pytest.mark.parametrize("name", NAMES)
def test_subcommand_help_works(name, capsys):
    parser = build_parser()
    with pytest.raises(SystemExit) as info:
        parser.parse_args([name, "--help"])
    assert info.value.code == 0
    assert "usage: cachescope " + name in capsys.readouterr().out


def test_every_design_subcommand_exists():
    for name in ("replay", "diff", "kv-memory", "semantic", "billing", "sessions", "attach", "bench",
                 "gui", "sweep", "demo"):
        assert name in NAMES, f"cachescope {name} is missing"


def test_readme_screenshots_exist():
    for rel in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README):
        assert (ROOT / rel).exists(), f"README shows {rel}, which is not in the repository"
