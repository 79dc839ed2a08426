"""A late-join replay answer interleaved with the live stream, in a fixed order.

Joining, the subscriber asks the replay socket for everything the server still buffers
and, while it waits, holds the first live frame that arrives: that frame's number is where
the answer may stop ("the live stream has these"). A forged reply numbered far past that
frame used to end the answer there, so the batch 0 that followed it in the same answer was
never read, and asking again (the same forged frame first) counted it missed. These tests
fix the order with a server that publishes live before it answers, and with the rules
driven directly, so the race cannot hide.
"""

from __future__ import annotations

import time

from engine.remote.subscriber import VllmSubscriber, _Answer
from tests.test_attach_hostile import ScriptedReplay, attach, counters
from tests.test_vllm_attach import wait_for


class LiveFirstReplay(ScriptedReplay):
    """Answers each replay request only after publishing every live frame (batches 1-4)
    and waiting long enough that the subscriber has read the first of them."""

    def __init__(self, script: list[list[bytes]] | None = None, delay: float = 0.6) -> None:
        self.delay = delay
        super().__init__(script)

    def _serve(self) -> None:
        # The first request waits, unread, until the live frames are out and the subscriber
        # has had time to read the first (it polls its SUB socket every 0.1 s meanwhile);
        # then the scripted server answers it, and every request after it, at once.
        while not self._stop.is_set() and not self.router.poll(50):
            pass
        for frames in self.pub_frames:
            self.send(frames)
        time.sleep(self.delay)
        super()._serve()


def test_a_forged_reply_past_the_held_live_frame_does_not_end_the_join():
    server = LiveFirstReplay()
    topic, _, payload = server.replay_frames[1][1:]
    forged = [b"", topic, (2 ** 62).to_bytes(8, "big"), payload]
    server.script = [forged, *server.replay_frames[:1], server.replay_frames[-1]]  # forged, batch 0, end
    att, seqs = attach(server, refill_timeout=10.0)
    try:
        server.wait_joined()
        wait_for(lambda: att.health()[0].last_seq == 4)
        # batch 0 from the answer, 1-4 live; the forged reply is one malformed frame
        assert seqs == [0, 1, 2, 3, 4]
        assert counters(att) == (5, 0, 1, 0, 4)
        assert server.num_replay_requests == 1
    finally:
        att.stop()
        server.close()


def test_without_a_forged_reply_the_same_order_keeps_every_batch():
    server = LiveFirstReplay()  # the recorded answer: batches 0-4 and the end marker
    att, seqs = attach(server, refill_timeout=10.0)
    try:
        server.wait_joined()
        wait_for(lambda: att.health()[0].last_seq == 4)
        assert seqs == [0, 1, 2, 3, 4] and counters(att) == (5, 0, 0, 0, 4)
    finally:
        att.stop()
        server.close()


def _rules() -> tuple[VllmSubscriber, list[int], bytes]:
    """A socket-less subscriber whose replay rules are driven by hand, what it delivered,
    and the payload of the recorded batch 0."""
    server = ScriptedReplay()
    try:
        payload0 = server.replay_frames[0][3]
    finally:
        server.close()
    delivered: list[int] = []
    sub = VllmSubscriber("tcp://127.0.0.1:1", lambda batch: delivered.append(batch.seq), socket=False)
    return sub, delivered, payload0


def _reply(seq: int, payload: bytes) -> list[bytes]:
    return [b"", b"kv-events", seq.to_bytes(8, "big"), payload]


def test_the_rules_a_reply_far_past_the_live_frame_is_malformed_not_the_end():
    sub, delivered, payload0 = _rules()
    answer = _Answer(0)
    # the live stream holds batch 1: replies from 1 on are the live stream's
    assert sub._take_reply(_reply(2 ** 62, payload0), answer, upto=1) is False
    assert sub.health.malformed == 1 and not answer.complete
    assert sub._take_reply(_reply(1 << 39, payload0), answer, upto=1) is False  # under MAX_FIRST_SEQ, still forged
    assert sub.health.malformed == 2 and not answer.complete
    assert sub._take_reply(_reply(0, payload0), answer, upto=1) is False
    assert delivered == [0] and answer.next_seq == 1
    # a reply at the live frame, or a little past it (the server went on), ends the answer
    assert sub._take_reply(_reply(3, payload0), answer, upto=1) is True and answer.complete
    assert sub.health.malformed == 2


def test_the_rules_a_huge_first_reply_with_no_live_frame_is_malformed():
    sub, delivered, payload0 = _rules()
    answer = _Answer(0)
    assert sub._take_reply(_reply(2 ** 62, payload0), answer, upto=None) is False
    assert sub.health.malformed == 1 and not answer.complete and delivered == []
