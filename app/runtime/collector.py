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
own thresholds (the recipe of calibre's `GarbageCollector`), and, as CPython does, a full
collection only once the objects that reached the oldest generation since the last one are
a quarter of those it held then (a full collection walks every object in the process: with
a trace open or a server attached, 0.1-0.5 s with the GIL held; without the rule one came
every ten young collections, a window stall each time). Reference counting still frees
everything that is not in a cycle at once, on any thread; only cycles wait, at most one
timer interval (0.1 s: the young generations a check collects stay a few milliseconds'
worth while a stream allocates). When the last window is gone, automatic collection comes
back as it was.

    window = MainWindow(ctx)      # install(window) is called by the window itself
    ...
    window.close()                # the last one: gc.isenabled() is what it was before

Background jobs that allocate a lot pause automatic collection too (`app.runtime.jobs.
collector_paused`, on their own thread), and the timer's checks wait for them: what a job
makes is frozen out of collection at its end, so collecting it meanwhile only stalled the
window (while an attach's tokenizer thread imported transformers, two checks collected the
young generations it filled for 17-25 ms each on the GUI thread). Each window's collector
and each paused job is a hold (`hold_automatic` / `give_back_automatic`): automatic collection comes back only when
the last hold is given back, and only if it was on before the first. A job that ended under
a window opened meanwhile once switched it back on there; two overlapping jobs, the first to
end switched it on under the second.
"""

from __future__ import annotations

import gc
import threading

from PySide6.QtCore import QCoreApplication, QObject, QTimer

INTERVAL_MS = 100
# CPython's rule (Modules/gcmodule.c): a full collection waits until the objects promoted to
# the oldest generation since the last one exceed this share of those that survived it.
FULL_COLLECTION_SHARE = 0.25

_holds_lock = threading.Lock()
_holds = 0
_enabled_before_holds = True
_jobs = 0  # background jobs holding it (`hold_automatic(job=True)`, `jobs.collector_paused`)


def hold_automatic(job: bool = False) -> None:
    """Automatic collection off until the matching `give_back_automatic` (any thread). A
    background job's hold (`job`) keeps the GUI thread's checks waiting too."""
    global _holds, _enabled_before_holds, _jobs
    with _holds_lock:
        if _holds == 0:
            _enabled_before_holds = gc.isenabled()
        _holds += 1
        _jobs += job
        gc.disable()


def give_back_automatic(job: bool = False) -> None:
    """End one hold (a job's: `job`, as it was taken); the last one switches automatic
    collection back on if it was on."""
    global _holds, _jobs
    with _holds_lock:
        if _holds == 0 or _jobs < job:
            raise RuntimeError("give_back_automatic without hold_automatic")
        _holds -= 1
        _jobs -= job
        if _holds == 0 and _enabled_before_holds:
            gc.enable()


def jobs_running() -> int:
    """Background jobs holding collection now (`hold_automatic(job=True)`)."""
    return _jobs


class GuiThreadCollector(QObject):
    """Collects on a timer of the thread it lives in, with the interpreter's thresholds."""

    def __init__(self, parent: QObject | None = None, interval_ms: int = INTERVAL_MS) -> None:
        super().__init__(parent)
        self.threshold = gc.get_threshold()
        self.collections = [0, 0, 0]  # per generation, for tests and `--debug`
        # long_lived_total and long_lived_pending of gcmodule.c, counted from Python: the
        # oldest generation's size after a full collection, and what the generation-1
        # collections promoted into it since (the young objects walked, less those freed).
        self.long_lived_total = len(gc.get_objects(2))
        self.long_lived_pending = 0
        hold_automatic()
        self._holding = True
        self._timer = QTimer(self, interval=interval_ms, timeout=self.check)
        self._timer.start()

    def check(self) -> int | None:
        """One step of what automatic collection would do now; the generation collected
        (None: nothing due, or a background job runs, whose objects its end freezes)."""
        if _jobs:
            return None
        c0, c1, c2 = gc.get_count()
        t0, t1, t2 = self.threshold
        if c0 <= t0:
            return None
        generation = 1 if c1 > t1 else 0
        if generation and c2 > t2 and self.long_lived_pending > self.long_lived_total * FULL_COLLECTION_SHARE:
            generation = 2
        if generation == 1:
            young = len(gc.get_objects(0)) + len(gc.get_objects(1))
            self.long_lived_pending += max(0, young - gc.collect(1))
        else:
            gc.collect(generation)
        if generation == 2:
            self.long_lived_total = len(gc.get_objects(2))
            self.long_lived_pending = 0
        self.collections[generation] += 1
        return generation

    def stop(self) -> None:
        self._timer.stop()
        if self._holding:
            self._holding = False
            give_back_automatic()


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
