"""glibc's malloc returns a large block to the system when it is freed.

By default glibc serves an allocation of 128 KiB or more with mmap, but once such a block
is freed it raises that threshold to the block's size (up to 32 MiB), so later arrays of
that size come from the heap; freed there, they stay in the process (a hole below the top
of the heap is not given back). The app grows its arrays by half as a stream comes in
(the pool, the log, the placer's tables): every outgrown array of a few MiB became such
a hole. Holding a 1,000,000-block vLLM pool (`bench held`'s child), about a fifth of the
process's growth was arrays it had already freed (2026-12-04, in children alternating on
a loaded machine): 447-468 B a block with glibc's default; with the threshold fixed at
16 MiB 401-403 B, at 4 MiB 362-370 B, at 1 MiB 297-298 B. Below 4 MiB a tick's arrays
are mapped afresh each time (their pages zeroed again): at 1 MiB the attach path
(`live_path.journal_app_rate`) ran 12% slower (238K against 271K vLLM events/s, medians of 4 pairs);
at 4 MiB it did not (276K against 274K, 12 runs each).

`tune()` fixes the threshold at 4 MiB, once, as a process of the app starts (`cachescope`
and every `AppContext`): an array of 4 MiB or more is mapped on its own and unmapped when
freed. Smaller ones freed below the top still stay: `release_freed()` hands their pages
back (malloc_trim), for a caller that has just freed many. On another C library both do nothing.

`tune()` also turns off numpy's request for transparent huge pages (madvise) on its large
arrays, unless the user's NUMPY_MADVISE_HUGEPAGE says otherwise. Where the kernel honours
the request with direct compaction (`defrag` set to `madvise`, the common default), a first
touch of such an array can stall for a compaction: the subscriber thread of a window's first
attach spent 0.08-0.44 s of system time per 100K vLLM events with it, 0.09-0.10 without
(2026-12-05), and that window's attach ran at 143K and 214K vLLM events/s wall against 266K
and 304K (fresh processes alternated; later attaches, the pool, the route and the held
memory the same within their spread).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD = 4 << 20

_tuned: bool | None = None


def tune() -> bool:
    """Fix glibc's mmap threshold at `MMAP_THRESHOLD`; True if it is (now or before)."""
    global _tuned
    if _tuned is None:
        _no_huge_pages()
        _tuned = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL("libc.so.6")
                _tuned = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
            except (OSError, AttributeError):  # not glibc (musl has no mallopt to speak of)
                pass
    return _tuned


def _no_huge_pages() -> None:
    """numpy's large arrays without a request for transparent huge pages, unless the user's
    NUMPY_MADVISE_HUGEPAGE asks for them: the variable, for numpy imported from now on (and
    child processes), and numpy's own switch if it is imported already."""
    if os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0") != "0":
        return
    numpy = sys.modules.get("numpy")
    switch = getattr(getattr(getattr(numpy, "_core", None), "multiarray", None), "_set_madvise_hugepage", None)
    if switch is not None:
        switch(False)


def release_freed() -> bool:
    """Give the system back the whole pages of the heap's free chunks (glibc's malloc_trim:
    a few ms for a heap of hundreds of MB); True if it released any."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):  # another C library: nothing to hand back this way
        return False


class _Releaser:
    """The thread that runs `release_freed` when asked (`release_freed_soon`), made at the first
    request: runs asked for and done, counted, under one condition; when the oldest request
    not yet served was made (`time.monotonic`)."""

    cond = threading.Condition()
    asked = 0
    done = 0
    first_asked = 0.0
    thread: threading.Thread | None = None


# A run starts this long after the request it serves: the caller asks from inside the work
# whose temporaries it means to hand back (a journal tick), and frees them as it returns. Run
# at once, the trim raced that and mostly lost: the 1M-block pool of bench held's child kept
# 25.5 MB of freed heap (25 B a block) that a trim made after the tick handed back.
RELEASE_DELAY_S = 0.1


def release_freed_soon() -> None:
    """`release_freed` on a thread of its own, so that the caller (the window's thread) does
    not wait for it: malloc_trim walks the whole heap, and a heap left by other work is large
    (41.6 ms of one attached window's tick, after `bench all`'s stream and attach benches had
    run in the process; ctypes lets the GIL go while it runs). Requests made while one runs
    are served by one run after it (what was freed since is handed back too). A run starts
    `RELEASE_DELAY_S` after the oldest request it serves, so that the caller has freed what
    it was working on. The thread is started at the first request and waits for the next."""
    with _Releaser.cond:
        if _Releaser.done == _Releaser.asked:
            _Releaser.first_asked = time.monotonic()
        _Releaser.asked += 1
        if _Releaser.thread is None:
            _Releaser.thread = threading.Thread(target=_release_when_asked, name="cachescope-release-freed",
                                                daemon=True)
            _Releaser.thread.start()
        _Releaser.cond.notify_all()


def _release_when_asked() -> None:
    cond = _Releaser.cond
    while True:
        with cond:
            cond.wait_for(lambda: _Releaser.done < _Releaser.asked)
            delay = _Releaser.first_asked + RELEASE_DELAY_S - time.monotonic()
            if delay > 0:
                cond.wait(delay)  # (woken early by another request or a waiter: looked at again)
                continue
            upto = _Releaser.asked
        try:
            release_freed()
        finally:
            with cond:
                _Releaser.done = upto
                _Releaser.first_asked = time.monotonic()  # the requests made during the run: from its end
                cond.notify_all()


def wait_released(timeout: float | None = None) -> bool:
    """Wait until every run asked of `release_freed_soon` so far is done (a memory reading
    taken then sees the pages they hand back); False if `timeout` seconds passed first."""
    with _Releaser.cond:
        upto = _Releaser.asked
        return _Releaser.cond.wait_for(lambda: _Releaser.done >= upto, timeout)
