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
from itertools import chain, islice
from operator import attrgetter, gt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

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


# Requests are read in chunks of this many: each chunk's fields are taken out in C-level
# passes (`map` over attribute getters, `np.fromiter`), and a lazily read trace never
# holds more than one chunk's id tuples at once.
CHUNK = 8192
_TOKENS = attrgetter("tokens")
_HASH_IDS = attrgetter("hash_ids")


def prepare(requests: Iterable[TraceRequest], block_size: int, keep_content: bool = True) -> TraceArrays:
    """The trace as the kernel reads it, `CHUNK` requests at a time from `requests`.

    With `keep_content=False`, `TraceArrays.requests` keeps each request without its token
    ids or hash ids (both None: `slim`), which the arrays now hold: a trace read lazily
    (`read_trace`) then never has all its Python id tuples alive at once (a token id is 36
    bytes as a Python int in a tuple, 4 in the arrays). Such arrays replay on the kernel
    only; `engine.core.replay.replay` needs the ids.

    Per request this costs a few C-level passes (no Python bytecode per request but the
    interning of tenant, model and id names); a hash-id request's ids go into one
    `np.fromiter` over all of the chunk's tuples, cut to its full blocks with a mask."""
    t0 = time.perf_counter()
    bs = block_size
    reqs: list[TraceRequest] = []
    model_ids: dict[str | None, int] = {None: -1}
    salt_ids: dict[str | None, int] = {None: -1}
    uids: dict[str, int] = {}
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("nprompt", "kvout", "counts", "salt", "model", "uid",
                                                         "nfull", "kind", "ext")}
    token_parts: list[np.ndarray] = []
    it = iter(requests)
    while chunk := list(islice(it, CHUNK)):
        n = len(chunk)
        tenants, models, ids = map(_TENANT, chunk), map(_MODEL, chunk), map(_ID, chunk)
        nprompt = np.array(list(map(_INPUT, chunk)), np.int64)
        kvout = np.maximum(np.array(list(map(_OUTPUT, chunk)), np.int64) - 1, 0)
        # first-seen order; None is -1 (the default is evaluated before a new key goes in)
        salt = np.array([salt_ids.setdefault(t, len(salt_ids) - 1) for t in tenants], np.int32)
        model = np.array([model_ids.setdefault(m, len(model_ids) - 1) for m in models], np.int32)
        uid = np.array([uids.setdefault(u, len(uids)) for u in ids], np.int32)
        full = nprompt // bs
        tokens = list(map(_TOKENS, chunk))
        kind = np.array([t is not None for t in tokens], np.uint8)  # KIND_TOKENS is 1
        counts = np.zeros(n, np.int64)
        ext = np.flatnonzero(kind == KIND_EXTERNAL)
        if len(ext):
            hids = [h or () for h in map(_HASH_IDS, chunk if len(ext) == n else [chunk[i] for i in ext])]
            lens = np.fromiter(map(len, hids), np.int64, len(hids))
            flat = np.fromiter(chain.from_iterable(hids), np.uint64, int(lens.sum())).view(np.int64)
            keep = np.minimum(lens, full[ext])
            starts = np.repeat(np.cumsum(lens) - lens, lens)
            cols["ext"].append(flat[np.arange(len(flat)) - starts < np.repeat(keep, lens)])
            counts[ext] = keep
        for i in np.flatnonzero(kind == KIND_TOKENS).tolist():
            tr = chunk[i]
            seq = tr.tokens + (tr.output_tokens or ())[:int(kvout[i])]
            nb = len(seq) // bs
            token_parts.append(np.asarray(seq[:nb * bs], np.uint32))
            counts[i] = nb
        for name, col in (("nprompt", nprompt), ("kvout", kvout), ("counts", counts), ("salt", salt),
                          ("model", model), ("uid", uid), ("nfull", full.astype(np.int32)), ("kind", kind)):
            cols[name].append(col)
        reqs.extend(chunk if keep_content else map(slim, chunk))
        del chunk, tokens
    dtypes = {"nprompt": np.int64, "kvout": np.int64, "counts": np.int64, "salt": np.int32, "model": np.int32,
              "uid": np.int32, "nfull": np.int32, "kind": np.uint8, "ext": np.int64}
    a = {k: np.concatenate(v) if v else np.zeros(0, dtypes[k]) for k, v in cols.items()}
    n = len(reqs)
    koff = np.zeros(n + 1, np.int64)
    np.cumsum(a["counts"], out=koff[1:])
    items = np.empty(int(koff[-1]), np.int64)
    block_kind = np.repeat(a["kind"], a["counts"])
    items[block_kind == KIND_EXTERNAL] = a["ext"]
    if token_parts:
        flat = np.concatenate(token_parts).reshape(-1, bs)
        rows = np.ascontiguousarray(flat).view(np.dtype((np.void, 4 * bs))).ravel()
        uniq, inverse = np.unique(rows, return_inverse=True)
        content = uniq.view(np.uint32).reshape(-1, bs).copy()
        items[block_kind == KIND_TOKENS] = inverse.astype(np.int64).ravel()
    else:
        content = np.zeros((1, bs), np.uint32)
    salts = [None] * (len(salt_ids) - 1)
    for name, sid in salt_ids.items():
        if sid >= 0:
            salts[sid] = name
    models_l = [name for name, mid in sorted(model_ids.items(), key=lambda x: x[1]) if mid >= 0]
    return TraceArrays(reqs, a["nprompt"], a["kvout"], a["salt"], a["model"], a["kind"], a["uid"], koff, a["nfull"],
                       items, content, salts, models_l, len(uids), time.perf_counter() - t0)


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
                  source: str = "the trace", hasher: BlockHasher | None = None,
                  clock: Callable[[], float] = time.perf_counter) -> KernelReplay:
    """Replay like `engine.core.replay.replay` on a fresh manager; `record` keeps the events.
    `clock` times the stages (`KernelReplay.intern_s`, `kernel_s`): a bench passes
    `time.thread_time` for the CPU time of this thread."""
    arrays = requests if isinstance(requests, TraceArrays) else prepare(requests, config.block_size)
    why = unsupported_reason(config, arrays)
    if why is not None:
        raise InputError(why)
    bs = config.block_size
    t0 = clock()
    root_tags = root_tag(arrays.kind.astype(np.int64), arrays.salt.astype(np.int64), arrays.model.astype(np.int64))
    keys, table, k_parent, k_item, k_tag = intern_chains(arrays.items, arrays.koff, arrays.kind.astype(np.int64),
                                                         root_tags)
    k_salt = np.where(k_parent < 0, ((k_tag >> 1) & 0xFFFFFFFF) - 2, -1).astype(np.int32)
    t1 = clock()
    row_cap = max(1024, 8 * len(keys) + 16 * len(arrays.nprompt)) if record else 1
    max_nb = int(((arrays.nprompt + arrays.kvout + bs - 1) // bs).max()) if len(arrays.nprompt) else 1
    state = new_state(config.capacity_blocks, config.concurrency, k_parent, len(arrays.salts),
                      len(arrays.models), max(arrays.num_uids, 1), max_nb)
    (status, fault, counters, cached, computed, reason, first, div, refused, cols, n_rows, n_seq) = replay_arrays(
        config.capacity_blocks, bs, config.concurrency, record, 0, True, arrays.nprompt, arrays.kvout, arrays.salt,
        arrays.model, arrays.kind, arrays.uid, arrays.koff, arrays.nfull, keys, arrays.items, table, k_parent,
        k_item, k_tag, k_salt, arrays.content, *state, row_cap)
    t2 = clock()
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
    """The Python engine's rows from the kernel's per-request arrays, in input order (one
    positional `ServedRequest` per request: the only per-request Python of a result)."""
    computed_l = np.where(refused != 0, 0, computed).tolist()
    cached_l = np.where(refused != 0, 0, cached).tolist()
    div_l = [None if d < 0 else d for d in div.tolist()]
    rows = list(map(ServedRequest, map(_INDEX, reqs), map(_ID, reqs), map(_TENANT, reqs), map(_INPUT, reqs),
                    cached_l, computed_l, map(_OUTPUT, reqs), [MISS_REASONS[x] for x in reason.tolist()],
                    first.tolist(), div_l, map(bool, refused.tolist())))
    if any(map(gt, map(_INDEX, reqs), map(_INDEX, islice(reqs, 1, None)))):
        rows.sort(key=_INDEX)
    return rows


_INDEX, _ID, _TENANT = attrgetter("index"), attrgetter("id"), attrgetter("tenant")
_INPUT, _OUTPUT, _MODEL = attrgetter("input_length"), attrgetter("output_length"), attrgetter("model")
