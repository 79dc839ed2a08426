"""Imports made by more than one thread at start-up, kept from running at the same moment.

After the first paint the GUI thread builds the start-up panels (pyqtgraph, the views) while
two threads start: the live log's warm-up (numba) and the model load (torch, transformers,
then numba too). Two threads importing a package and its submodules at once can fail in
Python 3.11's importlib: a start-up build of the Conversation panel raised
`KeyError: 'colorama'` (pyqtgraph.util.cprint importing colorama.winterm while
numba.core.errors imported colorama) about once in 50 starts under load, and the panel was
left unbuilt. So:

- `import_shared()`: the GUI thread imports, before either thread starts, the packages those
  threads share with the panels (`SHARED_IMPORTS`, about 30 ms, which the panels would import
  a moment later anyway); tests/test_startup_import_race.py finds any the list misses.
- `BACKGROUND_IMPORTS`: the two threads take turns at their imports (the one that comes second
  waits; the GUI thread never takes it), and an attach's tokenizer load takes its turn too
  (transformers imports its submodules as they are first used).
"""

from __future__ import annotations

import importlib
import threading

SHARED_IMPORTS = ("colorama", "colorama.winterm", "colorama.ansitowin32", "html.entities", "importlib.resources",
                  "numpy.typing", "multiprocessing.connection", "multiprocessing.reduction", "engine.model.chat",
                  "engine.model.kv_memory")

BACKGROUND_IMPORTS = threading.Lock()


def import_shared() -> None:
    """Import `SHARED_IMPORTS` on this thread (those not installed are left out)."""
    for name in SHARED_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
