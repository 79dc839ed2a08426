"""`replay_kernel`: `engine.core.replay.replay` through the compiled loop, same results.

The trace becomes flat arrays (one item per full block: a Mooncake hash id, or the id of
a block's token ids), blocks are interned into chain ids (`engine.kernel.intern`) and
`engine.kernel.loop.replay_arrays` runs the manager's bookkeeping over them. With
`record=True` the events come back as an `engine.core.columnar.ColumnarLog`, which turns
them into the Python engine's `Event` objects on demand. The Python engine stays the
reference; `tests/test_kernel.py` holds the two equal.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from engine.core.columnar import COLUMNS, MISS_REASONS, ColumnarLog, KeyTable, RequestTable
from engine.core.errors import CapacityError, InputError, TraceError
from engine.core.hashing import SERVER_HASHES, VLLM_HASHES, BlockHasher
from engine.core.pool_state import Counters
from engine.core.served import ReplayResult, ReplayTotals, ServedRequest
from engine.core.trace import TraceRequest
from engine.kernel.intern import KIND_EXTERNAL, KIND_TOKENS, intern_chains, root_tag
from engine.kernel.loop import ERR_CAPACITY, ERR_DUPLICATE, new_state, replay_arrays

if TYPE_CHECKING:
    from engine.core.replay import ReplayConfig


KERNEL_HASHES = ("sha256", "xxh3", *VLLM_HASHES)


def unsupported_reason(config: ReplayConfig, arrays: TraceArrays | None = None) -> str | None:
    """Why the kernel cannot run `config` on this trace (None when it can)."""
    if config.hash not in KERNEL_HASHES:
        return f"the {config.hash} hash runs on the Python engine only"
    if config.hash in SERVER_HASHES and arrays is not None and "" in arrays.salts:
        # vLLM's and SGLang's recipes hash an empty salt as no salt; the chain ids keep the two apart.
        return f"with the {config.hash} hash, a tenant named '' runs on the Python engine only"
    return None


@dataclass(slots=True)
class TraceArrays:
    """A trace as the kernel reads it: per request, its sizes and salt; per block, its item."""

    requests: list[TraceRequest]
    nprompt: np.ndarray
    kvout: np.ndarray
    salt: np.ndarray
    model: np.ndarray
    kind: np.ndarray
    uid: np.ndarray
    koff: np.ndarray
    nfull: np.ndarray
    items: np.ndarray
    content: np.ndarray
    salts: list[str | None]
    models: list[str]
    num_uids: int
    prepare_s: float = 0.0
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    @property
    def num_blocks(self) -> int:
        """Full prompt blocks looked up, summed over requests (what `blocks/s` counts)."""
        return int(self.nfull.sum())


def prepare(requests: Iterable[TraceRequest], block_size: int, keep_content: bool = True) -> TraceArrays:
    """The trace as the kernel reads it, one request at a time from `requests`.

    With `keep_content=False`, `TraceArrays.requests` keeps each request without its token
    ids or hash ids (both None: `slim`), which the arrays now hold: a trace read lazily
    (`read_trace`) then never has all its Python id tuples alive at once (a token id is 36
    bytes as a Python int in a tuple, 4 in the arrays). Such arrays replay on the kernel
    only; `engine.core.replay.replay` needs the ids."""
    t0 = time.perf_counter()
    bs = block_size
    reqs: list[TraceRequest] = []
    nprompt, kvout, counts = array("q"), array("q"), array("q")
    salt, model, uid, nfull = array("i"), array("i"), array("i"), array("i")
    kind = array("B")
    model_ids: dict[str | None, int] = {None: -1}
    salt_ids: dict[str | None, int] = {None: -1}
    uids: dict[str, int] = {}
    ext_parts: list[np.ndarray] = []
    token_parts: list[np.ndarray] = []
    for tr in requests:
        nprompt.append(tr.input_length)
        kv = max(tr.output_length - 1, 0)
        kvout.append(kv)
        s = salt_ids.get(tr.tenant)
        if s is None:
            s = salt_ids[tr.tenant] = len(salt_ids) - 1
        salt.append(s)
        m = model_ids.get(tr.model)
        if m is None:
            m = model_ids[tr.model] = len(model_ids) - 1
        model.append(m)
        u = uids.get(tr.id)
        if u is None:
            u = uids[tr.id] = len(uids)
        uid.append(u)
        full = tr.input_length // bs
        nfull.append(full)
        if tr.tokens is not None:
            kind.append(KIND_TOKENS)
            seq = tr.tokens + (tr.output_tokens or ())[:kv]
            nb = len(seq) // bs
            token_parts.append(np.asarray(seq[:nb * bs], np.uint32))
            counts.append(nb)
        else:
            kind.append(KIND_EXTERNAL)
            ids = (tr.hash_ids or ())[:full]
            ext_parts.append(np.asarray(ids, np.uint64).view(np.int64))
            counts.append(len(ids))
        reqs.append(tr if keep_content else slim(tr))
    n = len(reqs)
    nprompt, kvout, counts = (np.frombuffer(a, np.int64).copy() for a in (nprompt, kvout, counts))
    salt, model, uid, nfull = (np.frombuffer(a, np.int32).copy() for a in (salt, model, uid, nfull))
    kind = np.frombuffer(kind, np.uint8).copy()
    part_kind = kind.tolist()
    koff = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=koff[1:])
    items = np.empty(int(koff[-1]), np.int64)
    if token_parts:
        flat = np.concatenate(token_parts).reshape(-1, bs)
        rows = np.ascontiguousarray(flat).view(np.dtype((np.void, 4 * bs))).ravel()
        uniq, inverse = np.unique(rows, return_inverse=True)
        content = uniq.view(np.uint32).reshape(-1, bs).copy()
        token_items = inverse.astype(np.int64).ravel()
    else:
        content = np.zeros((1, bs), np.uint32)
        token_items = np.zeros(0, np.int64)
    ti = ext_i = 0
    for i in range(n):
        a, b = koff[i], koff[i + 1]
        if part_kind[i] == KIND_TOKENS:
            items[a:b] = token_items[ti:ti + (b - a)]
            ti += b - a
        else:
            items[a:b] = ext_parts[ext_i]
            ext_i += 1
    salts = [None] * (len(salt_ids) - 1)
    for name, sid in salt_ids.items():
        if sid >= 0:
            salts[sid] = name
    models = [name for name, mid in sorted(model_ids.items(), key=lambda x: x[1]) if mid >= 0]
    return TraceArrays(reqs, nprompt, kvout, salt, model, kind, uid, koff, nfull, items, content, salts, models,
                       len(uids), time.perf_counter() - t0)


def slim(tr: TraceRequest) -> TraceRequest:
    """`tr` without its token ids and hash ids: what a replay's rows and errors read."""
    return TraceRequest(tr.index, tr.line, tr.id, tr.tenant, None, None, None, tr.input_length, tr.output_length,
                        tr.timestamp, tr.model)


@dataclass(slots=True)
class KernelReplay:
    """A kernel replay: the result (as the Python engine's), the log when recorded, timings."""

    result: ReplayResult
    log: ColumnarLog | None
    num_lookup_blocks: int
    prepare_s: float
    intern_s: float
    kernel_s: float


def replay_kernel(requests: Iterable[TraceRequest] | TraceArrays, config: ReplayConfig, record: bool = False,
                  source: str = "the trace", hasher: BlockHasher | None = None) -> KernelReplay:
    """Replay like `engine.core.replay.replay` on a fresh manager; `record` keeps the events."""
    arrays = requests if isinstance(requests, TraceArrays) else prepare(requests, config.block_size)
    why = unsupported_reason(config, arrays)
    if why is not None:
        raise InputError(why)
    bs = config.block_size
    t0 = time.perf_counter()
    root_tags = root_tag(arrays.kind.astype(np.int64), arrays.salt.astype(np.int64), arrays.model.astype(np.int64))
    keys, table, k_parent, k_item, k_tag = intern_chains(arrays.items, arrays.koff, arrays.kind.astype(np.int64),
                                                         root_tags)
    k_salt = np.where(k_parent < 0, ((k_tag >> 1) & 0xFFFFFFFF) - 2, -1).astype(np.int32)
    t1 = time.perf_counter()
    row_cap = max(1024, 8 * len(keys) + 16 * len(arrays.nprompt)) if record else 1
    max_nb = int(((arrays.nprompt + arrays.kvout + bs - 1) // bs).max()) if len(arrays.nprompt) else 1
    state = new_state(config.capacity_blocks, config.concurrency, len(k_parent), len(arrays.salts),
                      len(arrays.models), max(arrays.num_uids, 1), max_nb)
    (status, fault, counters, cached, computed, reason, first, div, refused, cols, n_rows, n_seq) = replay_arrays(
        config.capacity_blocks, bs, config.concurrency, record, 0, True, arrays.nprompt, arrays.kvout, arrays.salt,
        arrays.model, arrays.kind, arrays.uid, arrays.koff, arrays.nfull, keys, arrays.items, table, k_parent,
        k_item, k_tag, k_salt, arrays.content, *state, row_cap)
    t2 = time.perf_counter()
    reqs = arrays.requests
    if status == ERR_DUPLICATE:
        tr = reqs[fault]
        raise TraceError(source, tr.line, "id", f"request id {tr.id!r} is already running")
    if status == ERR_CAPACITY:  # admission reserves room for every running request's output
        raise CapacityError(reqs[fault].id, 1, 0, config.capacity_blocks)
    rows = served_rows(reqs, cached, computed, reason, first, div, refused)
    c = Counters(*(int(x) for x in counters))
    from dataclasses import asdict
    result = ReplayResult(asdict(config), ReplayTotals.of(rows, c), rows)
    log = None
    if record:
        hasher = hasher if hasher is not None else BlockHasher(config.hash, config.seed, config.model or "",
                                                               config.hash_seed)
        key_table = KeyTable(k_parent, k_item, k_tag, arrays.content, arrays.salts, hasher, bs, arrays.models)
        req_table = RequestTable([tr.id for tr in reqs], arrays.salts, arrays.salt, arrays.nprompt, keys,
                                 arrays.koff, arrays.nfull)
        columns: list[np.ndarray | None] = list(cols)
        del cols
        log = ColumnarLog.from_columns(config.capacity_blocks, bs, _own_rows(columns, int(n_rows)), key_table,
                                       req_table, c, int(n_seq))
    return KernelReplay(result, log, arrays.num_blocks, arrays.prepare_s, t1 - t0, t2 - t1)


def _own_rows(columns: list[np.ndarray | None], n_rows: int) -> list[np.ndarray]:
    """The kernel's record columns cut to their `n_rows` rows, each copied and its grown
    buffer dropped before the next is copied (`columns` is emptied): at most one column's
    buffer stands beside the log's rows, not all nine (a 7M-row log's are 0.6 GB)."""
    out = []
    for i, (_, dtype) in enumerate(COLUMNS):
        out.append(np.array(columns[i][:n_rows], dtype=dtype))
        columns[i] = None
    return out


def served_rows(reqs: Sequence[TraceRequest], cached, computed, reason, first, div,
                refused) -> list[ServedRequest]:
    cached_l, computed_l, reason_l = cached.tolist(), computed.tolist(), reason.tolist()
    first_l, div_l, refused_l = first.tolist(), div.tolist(), refused.tolist()
    rows = []
    for i, tr in enumerate(reqs):
        d = div_l[i]
        row = ServedRequest(tr.index, tr.id, tr.tenant, tr.input_length, output_tokens=tr.output_length,
                            miss_reason=MISS_REASONS[reason_l[i]], first_miss_block=first_l[i],
                            divergence_token=None if d < 0 else d)
        if refused_l[i]:
            row.refused = True
        else:
            row.cached_tokens = cached_l[i]
            row.computed_tokens = computed_l[i]
        rows.append(row)
    rows.sort(key=lambda r: r.index)
    return rows
