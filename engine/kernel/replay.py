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
from dataclasses import asdict, dataclass, field
from itertools import chain, count, filterfalse, islice, repeat
from operator import attrgetter, is_not
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from engine.core.columnar import COLUMNS, MISS_REASONS, ColumnarLog, KeyTable, RequestTable, fits
from engine.core.errors import CapacityError, InputError, TraceError
from engine.core.hashing import SERVER_HASHES, VLLM_HASHES, BlockHasher
from engine.core.pool_state import Counters
from engine.core.served import ReplayResult
from engine.core.trace import TraceRequest
from engine.kernel.intern import KIND_EXTERNAL, KIND_TOKENS, intern_trace, root_tag
from engine.kernel.loop import ERR_CAPACITY, ERR_DUPLICATE, cut_items, new_state, replay_arrays
from engine.kernel.result import ServedColumns

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
    """A trace as the kernel reads it: per request, its sizes and salt; per block, its item.
    Per request also what its result row names (input position, output length; its id is
    `names[uid]`), so the result is made from arrays, not from the requests."""

    requests: Sequence[TraceRequest]
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
    index: np.ndarray
    nout: np.ndarray
    names: list[str]
    prepare_s: float = 0.0
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    @property
    def num_blocks(self) -> int:
        """Full prompt blocks looked up, summed over requests (what `blocks/s` counts)."""
        return int(self.nfull.sum())


# Requests are read in chunks of this many: each chunk's fields are taken out in C-level
# passes (`map` over attribute getters, `np.fromiter`), and a lazily read trace never
# holds more than one chunk's id tuples at once. Few, so that the parse's Python objects
# (a line's dict, its hash ids as ints) fill few of Python's 1 MiB small-object arenas,
# which stay resident once filled while any object the open keeps lies in them: with
# 8,192 the Mooncake trace's open kept 10 such arenas (60 B per distinct block), with
# 256 three to five, its prepare no slower (`tests/test_openmem_h4_parse.py`).
CHUNK = 256
_LINE = attrgetter("line")
_TIMESTAMP = attrgetter("timestamp")
_TOKENS = attrgetter("tokens")
_SIZES = attrgetter("index", "input_length", "output_length")
_HASH_IDS = attrgetter("hash_ids")


def _codes(values: list, table: dict, dtype: type = np.int32) -> np.ndarray:
    """The id of each value in `table` (first-seen order from 0; None is -1 where `table`
    maps it so), adding the values it has not seen: C-level passes, no bytecode per value.
    The usual cases cost less: all None (no tenant, no model), all new and distinct (ids)."""
    n = len(values)
    if None in table and values.count(None) == n:
        return np.full(n, table[None], dtype)
    start = len(table) - (None in table)
    new = dict(zip(values, count(start)))
    if len(new) == n and table.keys().isdisjoint(new):
        table.update(new)  # into an empty table (the first chunk) a copy of the hash table, no inserts
        return np.arange(start, start + n, dtype=dtype)
    new = dict.fromkeys(filterfalse(table.__contains__, new))
    table.update(zip(new, count(start)))
    return np.fromiter(map(table.__getitem__, values), dtype, n)


def prepare(requests: Iterable[TraceRequest], block_size: int, keep_content: bool = True) -> TraceArrays:
    """The trace as the kernel reads it, `CHUNK` requests at a time from `requests`.

    With `keep_content=False`, `TraceArrays.requests` gives each request without its token
    ids or hash ids (both None), which the arrays now hold: a trace read lazily
    (`read_trace`) then never has all its Python id tuples alive at once (a token id is 36
    bytes as a Python int in a tuple, 4 in the arrays). Such arrays replay on the kernel
    only; `engine.core.replay.replay` needs the ids. Nor is a request kept as an object:
    `SlimRequests` makes each from the arrays when it is read (a slim request and its
    timestamp were ~250 bytes of Python objects each, made amid the parse's temporaries).

    Per request this costs a few C-level passes and no Python bytecode (fields by `map`
    over attribute getters, names coded through dicts by `_codes`); a hash-id request's
    ids go into one `np.fromiter` over all of the chunk's tuples, cut to its full blocks
    in the compiled `cut_items`. Token requests are cut into blocks one by one."""
    t0 = time.perf_counter()
    bs = block_size
    reqs: list[TraceRequest] = []
    model_ids: dict[str | None, int] = {None: -1}
    salt_ids: dict[str | None, int] = {None: -1}
    uids: dict[str, int] = {}
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("nprompt", "kvout", "counts", "salt", "model", "uid",
                                                         "nfull", "kind", "ext", "index", "nout")}
    token_parts: list[np.ndarray] = []
    lines: list[np.ndarray] = []
    stamps: list[np.ndarray] = []
    it = iter(requests)
    while chunk := list(islice(it, CHUNK)):
        n = len(chunk)
        # input position, prompt and output sizes in one pass: a tuple a request, three ints
        sizes = np.fromiter(chain.from_iterable(map(_SIZES, chunk)), np.int64, 3 * n).reshape(n, 3)
        index, nprompt, nout = (np.ascontiguousarray(sizes[:, i]) for i in range(3))
        kvout = np.maximum(nout - 1, 0)
        salt = _codes(list(map(_TENANT, chunk)), salt_ids)
        model = _codes(list(map(_MODEL, chunk)), model_ids)
        uid = _codes(list(map(_ID, chunk)), uids)
        full = nprompt // bs
        tokens = list(map(_TOKENS, chunk))
        kind = np.fromiter(map(is_not, tokens, repeat(None)), np.uint8, n)  # KIND_TOKENS is 1
        counts = np.zeros(n, np.int64)
        ext = np.flatnonzero(kind == KIND_EXTERNAL)
        if len(ext):
            hids = list(map(_HASH_IDS, chunk if len(ext) == n else [chunk[i] for i in ext]))
            try:
                lens = np.array(list(map(len, hids)), np.int64)
            except TypeError:  # a request made `slim` before: no ids kept
                hids = [h or () for h in hids]
                lens = np.array(list(map(len, hids)), np.int64)
            flat = np.fromiter(chain.from_iterable(hids), np.uint64, int(lens.sum())).view(np.int64)
            keep = np.minimum(lens, full[ext])
            cols["ext"].append(cut_items(flat, lens, keep))
            counts[ext] = keep
        for i in np.flatnonzero(kind == KIND_TOKENS).tolist():
            tr = chunk[i]
            seq = tr.tokens + (tr.output_tokens or ())[:int(kvout[i])]
            nb = len(seq) // bs
            token_parts.append(np.asarray(seq[:nb * bs], np.uint32))
            counts[i] = nb
        for name, col in (("nprompt", nprompt), ("kvout", kvout), ("counts", counts), ("salt", salt),
                          ("model", model), ("uid", uid), ("nfull", full.astype(np.int32)), ("kind", kind),
                          ("index", index), ("nout", nout)):
            cols[name].append(col)
        if keep_content:
            reqs.extend(chunk)
        else:
            lines.append(np.fromiter(map(_LINE, chunk), np.int64, n))
            stamps.append(np.array(list(map(_TIMESTAMP, chunk)), np.float64))  # None read as NaN (a stamp is finite)
        del chunk, tokens
    dtypes = {"nprompt": np.int64, "kvout": np.int64, "counts": np.int64, "salt": np.int32, "model": np.int32,
              "uid": np.int32, "nfull": np.int32, "kind": np.uint8, "ext": np.int64, "index": np.int64,
              "nout": np.int64}
    a = {k: (v[0] if len(v) == 1 else np.concatenate(v)) if v else np.zeros(0, dtypes[k]) for k, v in cols.items()}
    n = len(a["nprompt"])
    koff = np.zeros(n + 1, np.int64)
    np.cumsum(a["counts"], out=koff[1:])
    if not token_parts:  # a hash-id trace: the items are its ids, in order
        items = a["ext"]
        content = np.zeros((1, bs), np.uint32)
    else:
        items = np.empty(int(koff[-1]), np.int64)
        block_kind = np.repeat(a["kind"], a["counts"])
        items[block_kind == KIND_EXTERNAL] = a["ext"]
        flat = np.concatenate(token_parts).reshape(-1, bs)
        rows = np.ascontiguousarray(flat).view(np.dtype((np.void, 4 * bs))).ravel()
        uniq, inverse = np.unique(rows, return_inverse=True)
        content = uniq.view(np.uint32).reshape(-1, bs).copy()
        items[block_kind == KIND_TOKENS] = inverse.astype(np.int64).ravel()
    salts = [name for name, sid in salt_ids.items() if sid >= 0]  # in id order: a dict keeps insertion order
    models_l = [name for name, mid in model_ids.items() if mid >= 0]
    names = list(uids)
    if not keep_content:
        whole = {k: (v[0] if len(v) == 1 else np.concatenate(v)) if v else np.zeros(0, t)
                 for k, v, t in (("line", lines, np.int64), ("timestamp", stamps, np.float64))}
        kept: Sequence[TraceRequest] = SlimRequests(a["index"], whole["line"], a["uid"], names, a["salt"], salts,
                                                    a["nprompt"], a["nout"], whole["timestamp"], a["model"], models_l)
    else:
        kept = reqs
    return TraceArrays(kept, a["nprompt"], a["kvout"], a["salt"], a["model"], a["kind"], a["uid"], koff, a["nfull"],
                       items, content, salts, models_l, len(uids), a["index"], a["nout"], names,
                       time.perf_counter() - t0)


class SlimRequests(Sequence[TraceRequest]):
    """The requests of `prepare(..., keep_content=False)` in input order, each made from the
    arrays when read, without its token ids and hash ids (what a replay's rows and errors
    read; its id, tenant and model kept by code)."""

    def __init__(self, index: np.ndarray, line: np.ndarray, uid: np.ndarray, names: list[str], salt: np.ndarray,
                 salts: list[str | None], nprompt: np.ndarray, nout: np.ndarray, timestamp: np.ndarray,
                 model: np.ndarray, models: list[str]) -> None:
        self._index, self._line, self._uid, self._names = index, line, uid, names
        self._salt, self._salts, self._nprompt, self._nout = salt, salts, nprompt, nout
        self._timestamp, self._model, self._models = timestamp, model, models

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # a negative position counted from the end; IndexError past it
        salt, model, ts = int(self._salt[i]), int(self._model[i]), float(self._timestamp[i])
        return TraceRequest(int(self._index[i]), int(self._line[i]), self._names[self._uid[i]],
                            self._salts[salt] if salt >= 0 else None, None, None, None, int(self._nprompt[i]),
                            int(self._nout[i]), None if ts != ts else ts, self._models[model] if model >= 0 else None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


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
    # Only a trace with more than one salt or model asks the table for another one's chain.
    need_table = len(np.unique(arrays.salt)) > 1 or len(np.unique(arrays.model)) > 1
    keys, table, k_parent, k_item, k_tag = intern_trace(arrays.items, arrays.koff, arrays.kind.astype(np.int64),
                                                        root_tags, need_table)
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
    columns = served_columns(arrays, cached, computed, reason, first, div, refused)
    c = Counters(*(int(x) for x in counters))
    result = ReplayResult(asdict(config), columns.totals(c), columns)
    log = None
    if record:
        hasher = hasher if hasher is not None else BlockHasher(config.hash, config.seed, config.model or "",
                                                               config.hash_seed)
        key_table = KeyTable(k_parent, k_item, k_tag, arrays.content, arrays.salts, hasher, bs, arrays.models)
        # the prompt sizes and key offsets the log keeps in int32 where they fit (the kernel's
        # are int64): 8 bytes a request less
        nprompt, koff = (a.astype(np.int32) if fits(a, np.int32) else a for a in (arrays.nprompt, arrays.koff))
        # each request's id by its code: the names the parse made, no request object read
        req_table = RequestTable(list(map(arrays.names.__getitem__, arrays.uid.tolist())), arrays.salts, arrays.salt, nprompt, keys, koff, arrays.nfull)
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


def served_columns(arrays: TraceArrays, cached, computed, reason, first, div, refused) -> ServedColumns:
    """The Python engine's rows as columns, from the kernel's per-request arrays, in input
    order (`ServedRequest` objects are made only if a caller reads `ReplayResult.requests`)."""
    served = refused == 0
    per_request = [arrays.index, arrays.uid, arrays.salt, arrays.nprompt, np.where(served, cached, 0),
                   np.where(served, computed, 0), arrays.nout, reason, first, div, refused]
    index = arrays.index
    if len(index) > 1 and np.any(index[1:] < index[:-1]):
        order = np.argsort(index, kind="stable")
        per_request = [col[order] for col in per_request]
    index, uid, salt, prompt, cached, computed, nout, reason, first, div, refused = per_request
    return ServedColumns(index, uid, arrays.names, salt, arrays.salts, prompt, cached, computed, nout, reason,
                         MISS_REASONS, first, div, refused)


_ID, _TENANT, _MODEL = attrgetter("id"), attrgetter("tenant"), attrgetter("model")
