"""The layout holds: engine imports with Qt blocked, app.runtime without widgets, the
import-linter contracts of pyproject.toml, and no import cycle anywhere (function-level and
typing-only imports included)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import app.runtime
import engine

ROOT = Path(__file__).resolve().parents[1]


def import_with_blocked(names: list[str], blocked: tuple[str, ...]) -> str:
    """Import `names` in a fresh interpreter in which `blocked` (top-level packages, or
    dotted modules) cannot be imported; returns what it printed, fails with its stderr."""
    code = (
        "import sys, importlib\n"
        f"blocked = {blocked!r}\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name in blocked or name.split('.')[0] in blocked:\n"
        "            raise ImportError('blocked here: ' + name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print('ok', len(sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_every_engine_module_imports_without_qt():
    names = sorted(m.name for m in pkgutil.walk_packages(engine.__path__, "engine."))
    assert "engine.core.manager" in names and len(names) >= 6
    assert import_with_blocked(names, ("PySide6", "shiboken6", "pyqtgraph", "PyQt5", "PyQt6")).startswith("ok")


def test_bookkeeping_modules_import_without_torch():
    names = ["engine.core.hashing", "engine.core.block_pool", "engine.core.manager", "engine.core.events",
             "engine.core.trace", "engine.core.replay"]
    assert import_with_blocked(names, ("torch", "transformers", "PySide6")).startswith("ok")


def test_import_contracts_hold():
    """The layout in pyproject's [tool.importlinter]: engine never imports app or Qt, the
    core imports neither torch nor SQLite, engine layers go one way."""
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def _import_cycles(package: str, exclude_type_checking_imports: bool) -> set[str]:
    import grimp

    graph = grimp.build_graph(package, exclude_type_checking_imports=exclude_type_checking_imports)
    cycles = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                members = (module, *back)
                start = members.index(min(members[:-1]))  # one spelling per cycle
                cycles.add(" -> ".join(members[start:-1] + members[:start + 1]))
    return cycles


@pytest.mark.parametrize("package", ["engine", "app"])
def test_no_import_cycle(package):
    """A function-level import hides a cycle from the reader but not from grimp, and a
    typing-only one still ties two modules together: shared types belong in one module
    both sides import, or in a Protocol the lower side declares."""
    assert not _import_cycles(package, exclude_type_checking_imports=False), \
        "import cycles:\n" + "\n".join(sorted(_import_cycles(package, False)))


def test_runtime_modules_import_without_widgets():
    """app.runtime holds the app's Qt objects (context, state, bridge, worker, jobs, remote,
    chat, replays, model load): QtCore only, so a headless tool can drive them."""
    names = sorted(m.name for m in pkgutil.walk_packages(app.runtime.__path__, "app.runtime."))
    assert "app.runtime.context" in names
    assert import_with_blocked(names, ("PySide6.QtWidgets", "PySide6.QtGui", "pyqtgraph")).startswith("ok")
