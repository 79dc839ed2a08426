"""`--publish` for `replay` and `demo`: send the embedded engine's blocks as vLLM 0.33 does."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from app.commands.attach import seconds


def add_publish_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("publishing (vLLM KV-event wire format)")
    g.add_argument("--publish", metavar="ENDPOINT", default=None,
                   help="send stored/removed/cleared blocks as vLLM's ZmqEventPublisher does, e.g. tcp://*:5557")
    g.add_argument("--publish-replay", metavar="ENDPOINT", default=None,
                   help="serve the replay socket too, e.g. tcp://*:5558")
    g.add_argument("--publish-topic", default="", metavar="TOPIC", help="ZMQ topic (default: none, as vLLM)")
    g.add_argument("--publish-hold", type=seconds, default=0.0, metavar="S",
                   help="keep the sockets open S seconds after the run, so late subscribers can replay it")


class Publishing:
    """The publisher of one command run; `hook(engine_or_bus)` attaches an engine's bus."""

    def __init__(self, args: argparse.Namespace) -> None:
        from engine.core.errors import InputError
        from engine.remote.publisher import VllmPublisher

        if args.publish is None:
            if args.publish_replay is not None:
                raise InputError("--publish-replay needs --publish ENDPOINT")
            self.publisher = None
            return
        self.hold = args.publish_hold
        self.publisher = VllmPublisher(args.publish, args.publish_replay, args.publish_topic)
        self._engines: list[Any] = []

    @property
    def active(self) -> bool:
        return self.publisher is not None

    def hook(self, bus: Any, block_size: int) -> None:
        from engine.remote.publisher import EnginePublisher

        if self.publisher is None:
            return
        if self._engines:
            # A new engine starts from an empty pool: tell subscribers so, as a restarted
            # vLLM's first events would.
            self._engines[-1].close()
            self.publisher.publish([_cleared()])
        self._engines.append(EnginePublisher(self.publisher, bus, block_size))

    def close(self) -> None:
        if self.publisher is None:
            return
        for e in self._engines:
            e.close()
        if self.hold:
            sys.stderr.write(f"cachescope: published {self.publisher.next_seq} batch(es) on {self.publisher.endpoint}; "
                             f"holding {self.hold:g} s\n")
            time.sleep(self.hold)
        self.publisher.close()


def _cleared() -> Any:
    from engine.remote.wire import VllmEvent

    return VllmEvent("AllBlocksCleared")
