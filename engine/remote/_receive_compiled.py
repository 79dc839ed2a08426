"""The compiled half of `engine.remote.receive`: libzmq's message calls as numba
intrinsics (each an external symbol `cachescope_<name>`, which `receive._make` hands to
LLVM by address before this module is imported), the loops that use them, and the codes
they share with it. Imported only through `receive`, once the symbols are there.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

ZMQ_DONTWAIT = 1
# the compiled call's outcomes (a negative one: -errno of a failed receive)
DONE = 0  # the bounds were reached
ROOM = 1  # a part did not fit: it is kept in the message struct until the call is made again
# state: messages, parts, bytes used, a part kept (1), first part of the message in progress,
# the last parts' bytes of the whole messages (the bound read_queued keeps to)
ST_NUM, ST_PARTS, ST_USED, ST_PENDING, ST_FIRST, ST_LAST_BYTES = range(6)
NUM_ST = 6

_I8P = ir.IntType(8).as_pointer()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def _call(builder, name, ret, argtys, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, argtys), f"cachescope_{name}")
    return builder.call(fn, args)


def _ptr(builder, address):
    return builder.inttoptr(address, _I8P)


def _on_msg(name: str, returns: str) -> Any:
    """An intrinsic f(address of a zmq_msg_t) -> int64 that calls libzmq's `name` on it;
    what `name` returns: "int" (widened), "size" (a size_t) or "pointer" (as an address)."""
    ret = {"int": _I32, "size": _I64, "pointer": _I8P}[returns]

    @intrinsic
    def call(typingctx, msg):  # pragma: no cover - compiled
        def codegen(context, builder, signature, args):
            got = _call(builder, name, ret, [_I8P], [_ptr(builder, args[0])])
            if returns == "int":
                return builder.sext(got, _I64)
            return builder.ptrtoint(got, _I64) if returns == "pointer" else got
        return types.int64(types.int64), codegen

    return call


_msg_init = _on_msg("zmq_msg_init", "int")
_msg_data = _on_msg("zmq_msg_data", "pointer")
_msg_size = _on_msg("zmq_msg_size", "size")
_msg_more = _on_msg("zmq_msg_more", "int")
_msg_close = _on_msg("zmq_msg_close", "int")


@intrinsic
def _msg_recv(typingctx, msg, sock, flags):  # pragma: no cover - compiled
    def codegen(context, builder, signature, args):
        got = _call(builder, "zmq_msg_recv", _I32, [_I8P, _I8P, _I32],
                    [_ptr(builder, args[0]), _ptr(builder, args[1]), builder.trunc(args[2], _I32)])
        return builder.sext(got, _I64)
    return types.int64(types.int64, types.int64, types.int64), codegen


@intrinsic
def _zmq_errno(typingctx):  # pragma: no cover - compiled
    def codegen(context, builder, signature, args):
        return builder.sext(_call(builder, "zmq_errno", _I32, [], []), _I64)
    return types.int64(), codegen


@intrinsic
def _copy(typingctx, dst, src, n):  # pragma: no cover - compiled
    def codegen(context, builder, signature, args):
        cgutils.raw_memcpy(builder, _ptr(builder, args[0]), _ptr(builder, args[1]), args[2], 1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


@njit(cache=True, nogil=True)
def recv_queued(sock, msg, buf, parts, st, max_messages, max_bytes):  # pragma: no cover - compiled
    """Receive (ZMQ_DONTWAIT) the parts queued on socket `sock` (its address) into `buf`,
    `parts[p]` = (offset, size, more) of each, message by message, until `max_messages`
    whole messages or their last parts reach `max_bytes` (looked at between messages, as
    `read_queued` does). `msg` is the zmq_msg_t; `st` the state (`ST_*`), which a call
    made again after ROOM goes on from. Returns DONE, ROOM (a received part is kept in
    `msg`, ST_PENDING 1: more room in `buf` or `parts`, then call again) or -errno of the
    receive that failed (EAGAIN: nothing more is queued)."""
    m = msg.ctypes.data
    base = buf.ctypes.data
    num, np_, used, pending = st[ST_NUM], st[ST_PARTS], st[ST_USED], st[ST_PENDING]
    first, last_bytes = st[ST_FIRST], st[ST_LAST_BYTES]
    code = np.int64(DONE)
    while True:
        if pending == 0:
            if np_ == first and (num >= max_messages or last_bytes >= max_bytes):
                break
            _msg_init(m)
            if _msg_recv(m, sock, ZMQ_DONTWAIT) < 0:
                code = -_zmq_errno()
                _msg_close(m)
                break
            pending = 1
        size = _msg_size(m)
        if used + size > len(buf) or np_ >= len(parts):
            code = ROOM
            break
        if size:
            _copy(base + used, _msg_data(m), size)
        more = _msg_more(m)
        _msg_close(m)
        pending = 0
        parts[np_, 0] = used
        parts[np_, 1] = size
        parts[np_, 2] = more
        np_ += 1
        used += size
        if more == 0:
            num += 1
            last_bytes += size
            first = np_
    st[ST_NUM], st[ST_PARTS], st[ST_USED], st[ST_PENDING] = num, np_, used, pending
    st[ST_FIRST], st[ST_LAST_BYTES] = first, last_bytes
    return code


@njit(cache=True, nogil=True)
def close_msg(msg):  # pragma: no cover - compiled
    _msg_close(msg.ctypes.data)


@njit(cache=True, nogil=True)
def msg_size_of(msg):  # pragma: no cover - compiled
    return _msg_size(msg.ctypes.data)


@njit(cache=True, nogil=True)
def follow_on(buf, parts, starts, start, topic, first):  # pragma: no cover - compiled
    """How many messages from `start` on are three parts, of `topic` (any when empty), the
    second an 8-byte big-endian signed number `first`, `first` + 1, ... in turn."""
    k = 0
    for i in range(start, len(starts) - 1):
        p = starts[i]
        if starts[i + 1] - p != 3 or parts[p + 1, 1] != 8:
            break
        if len(topic):
            o, n = parts[p, 0], parts[p, 1]
            if n != len(topic):
                break
            same = True
            for j in range(n):
                if buf[o + j] != topic[j]:
                    same = False
                    break
            if not same:
                break
        o = parts[p + 1, 0]
        v = np.int64(0)
        for j in range(8):
            v = (v << 8) | np.int64(buf[o + j])
        if v != first + k:
            break
        k += 1
    return k
