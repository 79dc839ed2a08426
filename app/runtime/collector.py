"""Python's cyclic garbage collector runs on the GUI thread only while a main window is open.

Python starts a collection in whichever thread happens to allocate past the threshold. A
collection set off by a background thread (a tokenizer load, a bill, a trace replay, the
subscriber decoding frames) can free a Qt object caught in a reference cycle: its C++
destructor then runs on that thread, takes a Qt lock and waits for the GIL, while the GUI
thread holds the GIL deleting a widget and waits for the same lock. That deadlock hung
`tests/test_remote_app.py` on a fresh clone (2026-12-01); Qt's rule is anyway that a QObject
is deleted in the thread it lives in.

So while a `MainWindow` is open, automatic collection is off and a timer on the GUI thread
does what the interpreter would have done, generation by generation with the interpreter's
own thresholds (the recipe of calibre's `GarbageCollector`). Reference counting still frees
everything that is not in a cycle at once, on any thread; only cycles wait, at most one
timer interval. When the last window is gone, automatic collection comes back as it was.

    window = MainWindow(ctx)      # install(window) is called by the window itself
    ...
    window.close()                # the last one: gc.isenabled() is what it was before
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QCoreApplication, QObject, QTimer

INTERVAL_MS = 1000


class GuiThreadCollector(QObject):
    """Collects on a timer of the thread it lives in, with the interpreter's thresholds."""

    def __init__(self, parent: QObject | None = None, interval_ms: int = INTERVAL_MS) -> None:
        super().__init__(parent)
        self.threshold = gc.get_threshold()
        self.was_enabled = gc.isenabled()
        self.collections = [0, 0, 0]  # per generation, for tests and `--debug`
        gc.disable()
        self._timer = QTimer(self, interval=interval_ms, timeout=self.check)
        self._timer.start()

    def check(self) -> int | None:
        """One step of what automatic collection would do now; the generation collected."""
        c0, c1, c2 = gc.get_count()
        t0, t1, t2 = self.threshold
        if c0 <= t0:
            return None
        generation = 2 if c1 > t1 and c2 > t2 else 1 if c1 > t1 else 0
        gc.collect(generation)
        self.collections[generation] += 1
        return generation

    def stop(self) -> None:
        self._timer.stop()
        if self.was_enabled:
            gc.enable()


_collector: GuiThreadCollector | None = None
_holders: set[int] = set()


def install(owner: QObject) -> GuiThreadCollector:
    """Hold GUI-thread collection for as long as `owner` lives (until `release(owner)` or its
    destruction); the first holder starts it, the last one to go stops it."""
    global _collector
    if _collector is None:
        _collector = GuiThreadCollector(QCoreApplication.instance())
    key = id(owner)
    if key not in _holders:
        _holders.add(key)
        owner.destroyed.connect(lambda *_a, key=key: _drop(key))
    return _collector


def release(owner: QObject) -> None:
    """`owner` no longer needs it (a closed window); idempotent."""
    _drop(id(owner))


def active() -> GuiThreadCollector | None:
    return _collector


def _drop(key: int) -> None:
    global _collector
    _holders.discard(key)
    if not _holders and _collector is not None:
        collector, _collector = _collector, None
        collector.stop()
        collector.deleteLater()
