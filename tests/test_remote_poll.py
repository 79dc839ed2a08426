"""The attached window's health poll does not wait on a busy attachment: a subscriber holds
the attachment's lock while it applies a run of frames (a stack sampler of the window's GUI
thread found a 60 ms pass, half of it in `_poll` waiting for that lock). The poll waits at most
LOCK_WAIT_S and keeps the last health; after POLL_SKIPS polls without the lock, one waits."""

from __future__ import annotations

import threading
import time

from app.runtime.context import make_test_context
from app.runtime.remote import LOCK_WAIT_S, POLL_SKIPS
from engine.remote import AttachOptions
from engine.remote.attachment import Attachment


def test_a_health_poll_leaves_a_held_lock_and_waits_after_a_second(qtbot, tmp_path):
    ctx = make_test_context(tmp_path)
    try:
        ctrl = ctx.remote
        att = Attachment(AttachOptions(endpoints=("tcp://127.0.0.1:5999",)))
        ctrl.attachment = att
        heard: list = []
        ctrl.sigHealth.connect(heard.append)
        ctrl._poll()  # the lock free: polled at once
        assert len(heard) == 1
        release = threading.Event()
        held = threading.Event()

        def hold() -> None:
            with att.lock:
                held.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait(5)
        try:
            for _ in range(POLL_SKIPS):
                t = time.perf_counter()
                ctrl._poll()
                assert time.perf_counter() - t < LOCK_WAIT_S + 0.05  # did not wait for the holder
            assert len(heard) == 1  # the last health stays shown
            threading.Timer(0.2, release.set).start()
            t = time.perf_counter()
            ctrl._poll()  # the skips used up: this one waits for the lock
            assert time.perf_counter() - t >= 0.15 and len(heard) == 2
        finally:
            release.set()
            holder.join(5)
        assert att.health(0) == [] and ctrl._polls_skipped == 0
    finally:
        ctx.shutdown()
