"""Keeping a vLLM attach in the session store (`attach --record`), so it opens later offline.

A capture is a `trace` session (settings `{"source": "vllm-attach", ...}`) with one run of
kind `attach` whose events are the converted Cachescope events, `remote` info included;
`Store.events(run_id)` gives them back as objects. Uses only the store's public API and
its writer thread. No Qt here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.core.events import EventBus
from engine.remote.attachment import AttachOptions

SOURCE = "vllm-attach"


@dataclass(slots=True)
class Recorder:
    """Open with `start(bus)`, close with `finish(totals)`; events are written on the
    store's writer thread so a burst never blocks a subscriber."""

    db: str | None
    options: AttachOptions
    title: str | None = None
    session_id: int = -1
    run_id: int = -1
    _store: Any = None
    _writer: Any = None
    _unsubscribe: Any = None
    num_events: int = 0
    _counter: list[int] = field(default_factory=lambda: [0])

    def start(self, bus: EventBus) -> Recorder:
        from engine.store.database import Store
        from engine.store.writer import StoreWriter

        self._store = Store(self.db)
        opts = self.options
        settings = {"source": SOURCE, "endpoints": list(opts.endpoints), "replay_endpoints": list(opts.replay_endpoints),
                    "topic": opts.topic, "data_parallel_size": opts.data_parallel_size, "bind": opts.bind}
        title = self.title or f"vLLM {', '.join(opts.endpoints)} {time.strftime('%Y-%m-%d %H:%M:%S')}"
        # vLLM's default prefix_caching_hash_algo: what a probe of this capture should assume.
        self.session_id = self._store.create_session(title, "trace", hash="vllm-sha256", source_format=SOURCE,
                                                     settings=settings)
        self.run_id = self._store.create_run(self.session_id, "attach", settings)
        self._writer = StoreWriter(self._store)
        write = self._writer.listener(self.run_id)
        counter = self._counter

        def listener(event: Any) -> None:
            counter[0] += 1
            write(event)

        self._unsubscribe = bus.subscribe(listener)
        return self

    def finish(self, totals: dict[str, Any], block_size: int | None = None) -> None:
        if self._store is None:
            return
        self._unsubscribe()
        try:
            self._writer.stop()
            if block_size:
                self._store.update_session(self.session_id, block_size=block_size)
            self.num_events = self._counter[0]
            streams = totals.get("streams", [])
            # The same total names as a replay's, so `sessions show` counts a capture too.
            self._store.finish_run(self.run_id, {**totals, "events": self.num_events,
                                                 "stored_blocks": sum(s.get("stored", 0) for s in streams),
                                                 "evicted_blocks": sum(s.get("removed", 0) for s in streams)})
        finally:
            self._store.close()
            self._store = None
