"""A SUB socket's queued messages read by one compiled call: libzmq's own receive, no
Python object per part.

`read_queued` (engine.remote.subscriber) reads a vLLM frame as three zmq Frames and three
bytes objects, about 4 us a message: 26-37 ms of the subscriber thread for the 7,213
frames of 100K vLLM events, with the GIL held throughout. `Receiver.read` calls libzmq's
`zmq_msg_recv` from numba (nogil) and copies each part into one buffer: 9-11 ms for the
same frames, their run checked and its payload views made (2026-12-06), the GUI thread
free to run meanwhile. What it gives,
`QueuedMessages`, reads as the list of messages `read_queued` gives (`messages[i]` the
parts of message i as bytes, made when asked for), and tells at once how many of them
follow on (`follow_on`) and where their payloads lie (`payloads`), so the run the
subscriber decodes is read from the buffer where it lies.

libzmq is the one pyzmq loaded (found in the process's maps, its symbols handed to LLVM by
address: `llvmlite.binding.add_symbol`); where it cannot be found (pyzmq linked it into its
own module, or a system without /proc) `available()` is False and the subscriber reads
with `read_queued`.
"""

from __future__ import annotations

import ctypes
import errno as _errno_codes
import re
import sys
import threading
from typing import Any

import numpy as np

from engine.core.growth import unheld

MSG_BYTES = 64  # sizeof(zmq_msg_t)
_NAMES = ("zmq_msg_init", "zmq_msg_recv", "zmq_msg_data", "zmq_msg_size", "zmq_msg_more", "zmq_msg_close",
          "zmq_errno")
_READY: list[Any] = []  # [the compiled half, `_receive_compiled`] once made; [None] when it cannot be
_LOCK = threading.Lock()


def libzmq_path() -> str | None:
    """The file of the libzmq this process loaded with pyzmq (None if none is found)."""
    import zmq  # noqa: F401 - loads libzmq

    try:
        with open("/proc/self/maps") as f:
            for line in f:
                m = re.search(r"(/\S*/libzmq[^/\s]*\.so[^/\s]*)$", line.strip())
                if m:
                    return m.group(1)
    except OSError:
        return None
    return None


def available() -> bool:
    """Whether the compiled receive can be used here (made, or loaded from numba's cache, now)."""
    return _reader() is not None


def warm_up() -> bool:
    """Make the compiled receive (or load it from numba's disk cache) now, with its
    run-checking pass, and say whether it runs here: a subscriber does this before its
    thread starts, not on its first frames."""
    if _reader() is None:
        return False
    if not _WARM:
        import zmq

        sock = zmq.Context.instance().socket(zmq.SUB)  # nothing queued: one receive, EAGAIN
        try:
            receiver = Receiver(sock)
            receiver.read(1, 1)
            receiver.close()
        finally:
            sock.close(linger=0)
        QueuedMessages.of([[b"t", bytes(8), b""]]).follow_on(0, b"t", 0)
        _WARM.append(True)
    return True


_WARM: list[bool] = []


def _reader() -> Any:
    with _LOCK:
        if not _READY:
            _READY.append(_make())
        return _READY[0]


def _make() -> Any:
    path = libzmq_path() if sys.platform.startswith("linux") else None
    if path is None:
        return None
    try:
        import llvmlite.binding as ll
        import numba  # noqa: F401
    except ImportError:
        return None
    lib = ctypes.CDLL(path)  # the same library pyzmq loaded (dlopen of a loaded path returns it)
    try:
        for name in _NAMES:
            ll.add_symbol(f"cachescope_{name}", ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
    except AttributeError:
        return None
    from engine.remote import _receive_compiled

    return _receive_compiled


class QueuedMessages:
    """The messages one read took off a socket: `buf` holds every part, `parts[p]` the
    (offset, size) of part p, `starts[i]` message i's first part (and one past the last).
    Reads as a list of messages: `len`, `messages[i]` (its parts as bytes) and slices."""

    __slots__ = ("buf", "parts", "starts")

    def __init__(self, buf: np.ndarray, parts: np.ndarray, starts: np.ndarray) -> None:
        self.buf, self.parts, self.starts = buf, parts, starts

    @classmethod
    def of(cls, messages: list[list[bytes]]) -> QueuedMessages:
        """The messages as one read would have taken them (tests, recorded frames)."""
        flat = [bytes(p) for m in messages for p in m]
        sizes = np.fromiter(map(len, flat), np.int64, len(flat))
        offsets = np.zeros(len(flat), np.int64)
        np.cumsum(sizes[:-1], out=offsets[1:])
        buf = np.frombuffer(b"".join(flat), np.uint8).copy() if flat else np.zeros(0, np.uint8)
        starts = np.zeros(len(messages) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, messages), np.int64, len(messages)), out=starts[1:])
        return cls(buf, np.stack([offsets, sizes], axis=1) if flat else np.zeros((0, 2), np.int64), starts)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def _message(self, i: int) -> list[bytes]:
        buf, parts = self.buf, self.parts
        return [buf[o:o + n].tobytes() for o, n in parts[self.starts[i]:self.starts[i + 1]].tolist()]

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._message(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("message index out of range")
        return self._message(i)

    def follow_on(self, start: int, topic: bytes, first: int) -> int:
        """How many messages from `start` on are frames of `topic` (any, if empty) numbered
        `first`, `first` + 1, ...: three parts each, the second an 8-byte big-endian number
        (what `VllmSubscriber._run_payloads` hands on)."""
        from engine.remote import _receive_compiled

        return int(_receive_compiled.follow_on(self.buf, self.parts, self.starts, start,
                                               np.frombuffer(topic, np.uint8), first))

    def payloads(self, start: int, num: int) -> tuple[list[memoryview], np.ndarray, np.ndarray]:
        """The third parts of messages start..start+num-1 (frames `follow_on` counted): as
        views of the buffer, and their addresses and sizes (valid while `buf` lives)."""
        at = self.parts[self.starts[start:start + num] + 2]
        offsets, sizes = at[:, 0], at[:, 1]
        view = memoryview(self.buf)
        return ([view[o:o + n] for o, n in zip(offsets.tolist(), sizes.tolist())],
                offsets + self.buf.ctypes.data, sizes.copy())


class Receiver:
    """Reads what is queued on one socket, on its one thread (a zmq socket is not shared).

    `read` may keep a received part between its calls (one that did not fit: the message
    struct holds it); `close` frees it. The buffers are kept for the next read once
    nothing refers to them (a batch's payload view, a decoded run)."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.msg = np.zeros(MSG_BYTES // 8, np.int64)  # the zmq_msg_t (8-aligned)
        self.st = np.zeros(8, np.int64)  # the compiled reader's state (`_receive_compiled.ST_*`)
        self._bufs: list[np.ndarray] = []
        self._parts = np.empty((1024, 3), np.int64)
        self._error: int = 0  # a receive's failure, raised at the next read

    def _buffer(self, least: int) -> np.ndarray:
        """A kept buffer of `least` bytes at least that nothing else refers to, or a new one."""
        # (held by the list alone: no batch's payload view or `QueuedMessages` of it)
        free = [k for k in range(len(self._bufs)) if unheld(self._bufs[k])]
        for k in free:
            if len(self._bufs[k]) >= least:
                return self._bufs[k]
        buf = np.empty(max(least, 8 << 20), np.uint8)  # mapped apart: pages not reached cost nothing
        if len(self._bufs) < 4:
            self._bufs.append(buf)
        elif free:  # every unheld one is too small: the smallest gives way
            self._bufs[min(free, key=lambda k: len(self._bufs[k]))] = buf
        return buf

    def read(self, max_messages: int, max_bytes: int) -> QueuedMessages | None:
        """The whole messages queued, up to `max_messages` or until their last parts reach
        `max_bytes` (as `read_queued` reads them); None when none was queued. Raises what
        pyzmq's receive raises (`zmq.ContextTerminated`, a `ZMQError`) for a failure, after
        the messages read before it were handed out."""
        import zmq

        self._raise_kept()
        rc = _reader()
        sock = self.sock.underlying
        buf = self._buffer(max_bytes + (1 << 20))
        parts = self._parts
        st = self.st
        st[rc.ST_NUM] = st[rc.ST_PARTS] = st[rc.ST_USED] = st[rc.ST_FIRST] = st[rc.ST_LAST_BYTES] = 0  # (PENDING stays)
        while True:
            code = rc.recv_queued(sock, self.msg, buf, parts, st, max_messages, max_bytes)
            if code != rc.ROOM:
                break
            used, num_parts = int(st[rc.ST_USED]), int(st[rc.ST_PARTS])
            if num_parts == len(parts):
                parts = self._parts = np.concatenate([parts, np.empty_like(parts)])
            else:  # the kept part's bytes: a buffer with room for it (what was read, copied)
                grown = self._buffer(2 * len(buf) + int(rc.msg_size_of(self.msg)))
                grown[:used] = buf[:used]
                buf = grown
        if code < 0 and -code not in (zmq.EAGAIN, _errno_codes.EINTR):
            self._error = -code
        num = int(st[rc.ST_NUM])
        if not num:
            self._raise_kept()  # (nothing read before it: raised now)
            return None
        # a message cut short (never, in libzmq: a message's parts come together) is dropped, as
        # read_queued drops it
        starts = np.empty(num + 1, np.int64)
        first = int(st[rc.ST_FIRST])  # (one past the whole messages' parts)
        whole = parts[:first, 2]  # their `more` flags
        starts[0] = 0
        starts[1:] = np.flatnonzero(whole == 0) + 1
        return QueuedMessages(buf, parts[:first, :2].copy(), starts)

    def _raise_kept(self) -> None:
        """Raise a receive's failure kept from the read before, as pyzmq raises it."""
        if self._error:
            import zmq

            e, self._error = self._error, 0
            raise zmq.ContextTerminated(e) if e == zmq.ETERM else zmq.ZMQError(e)

    def close(self) -> None:
        """Free a part kept between reads (the socket closes after)."""
        rc = _READY[0] if _READY else None
        if rc is not None and self.st[rc.ST_PENDING]:
            rc.close_msg(self.msg)
            self.st[rc.ST_PENDING] = 0
