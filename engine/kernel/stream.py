"""Replaying a trace too large to hold: chunks of requests through one kernel state.

`replay_stream` takes chunks (`StreamChunk`: flat arrays of hash-id requests, no Python
object per request or block), interns their blocks into a growing key table, and runs
`engine.kernel.loop.replay_arrays` on one state, chunk after chunk: the requests still
running at a chunk's end are carried to the front of the next, so the schedule is the
one a single run would have. Memory is the pool, the distinct blocks seen and one chunk;
only totals are kept. Token traces go through `replay_kernel` (they are hashed whole).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import numpy as np

from engine.core.errors import InputError
from engine.kernel.intern import KIND_EXTERNAL, Interner, root_tag
from engine.kernel.loop import (
    C_CACHED, C_EVICTED, C_PROMPT, C_STORED, COUNTERS, ERR_CAPACITY, ERR_DUPLICATE, EVICTED_BUF, K_PARENT, KEYS,
    ORDER, S_REQ, SCALARS, TABLES, UID, new_keys, new_state, replay_arrays,
)

if TYPE_CHECKING:
    from engine.core.replay import ReplayConfig


@dataclass(slots=True)
class StreamChunk:
    """Hash-id requests: prompt and output sizes, ids (uid: any int naming the request),
    model ids (-1: none) and their hash ids, `items[offsets[i]:offsets[i + 1]]`."""

    num_prompt_tokens: np.ndarray
    num_output_tokens: np.ndarray
    uid: np.ndarray
    model: np.ndarray
    offsets: np.ndarray
    items: np.ndarray


@dataclass(slots=True)
class StreamTotals:
    requests: int
    refused_requests: int
    lookup_blocks: int
    prompt_tokens: int
    cached_tokens: int
    stored_blocks: int
    evicted_blocks: int
    distinct_blocks: int
    chunks: int

    @property
    def hit_rate(self) -> float:
        return round(self.cached_tokens / self.prompt_tokens, 6) if self.prompt_tokens else 0.0


def _grow(arr: np.ndarray, size: int, fill: int) -> np.ndarray:
    if len(arr) >= size:
        return arr
    out = np.full(max(size, 2 * len(arr)), fill, arr.dtype)
    out[:len(arr)] = arr
    return out


def replay_stream(chunks: Iterable[StreamChunk], config: ReplayConfig, num_models: int = 0,
                  num_uids: int = 1 << 16) -> StreamTotals:
    """Totals of replaying every chunk in order on a fresh pool (as one `replay` would)."""
    if config.hash not in ("sha256", "xxh3", "vllm-sha256", "vllm-sha256-cbor"):
        raise InputError(f"the {config.hash} hash runs on the Python engine only")
    bs, K = config.block_size, config.concurrency
    interner = Interner()
    state = new_state(config.capacity_blocks, K, np.zeros(0, np.int32), 0, num_models, num_uids, 1)
    carried = None  # (arrays of the running requests, their keys) from the last chunk
    keys_known = 0  # keys whose row in the key table has its parent
    totals = dict(requests=0, refused=0, lookup_blocks=0, prompt=0, served_prompt=0, cached=0)
    n_chunks = 0
    chunk_list = iter(chunks)
    pending = next(chunk_list, None)
    while pending is not None:
        nxt = next(chunk_list, None)
        final = nxt is None
        n_new = len(pending.num_prompt_tokens)
        nprompt = pending.num_prompt_tokens.astype(np.int64)
        kvout = np.maximum(pending.num_output_tokens.astype(np.int64) - 1, 0)
        nfull = (nprompt // bs).astype(np.int32)
        counts = np.minimum(np.diff(pending.offsets), nfull)
        if np.any(counts < nfull):
            raise InputError("a request has fewer hash ids than its prompt has full blocks")
        starts = pending.offsets[:-1]
        take = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts) + np.arange(counts.sum())
        items = pending.items[take].astype(np.int64)
        koff = np.zeros(n_new + 1, np.int64)
        np.cumsum(counts, out=koff[1:])
        model = pending.model.astype(np.int32)
        kind = np.full(n_new, KIND_EXTERNAL, np.uint8)
        salt = np.full(n_new, -1, np.int32)
        keys = interner.intern(items, koff, kind.astype(np.int64),
                               root_tag(kind.astype(np.int64), salt.astype(np.int64), model.astype(np.int64)))
        uid = pending.uid.astype(np.int32)
        if carried is not None:
            c = carried
            nprompt = np.concatenate([c["nprompt"], nprompt])
            kvout = np.concatenate([c["kvout"], kvout])
            nfull = np.concatenate([c["nfull"], nfull])
            model = np.concatenate([c["model"], model])
            kind = np.concatenate([c["kind"], kind])
            salt = np.concatenate([c["salt"], salt])
            uid = np.concatenate([c["uid"], uid])
            koff = np.concatenate([c["koff"][:-1], c["koff"][-1] + koff])
            keys = np.concatenate([c["keys"], keys])
            items = np.concatenate([c["items"], items])
        n_carried = 0 if carried is None else len(carried["nprompt"])
        # grow what the new keys, uids and block tables need
        nk = interner.num_keys
        if len(state[KEYS]) < nk + 1:  # rows for the new keys, and room for more
            state[KEYS] = new_keys(np.zeros(max(nk, 2 * (len(state[KEYS]) - 1)), np.int32), state[KEYS])
        state[KEYS][1 + keys_known:1 + nk, K_PARENT] = interner.k_parent[keys_known:nk]
        keys_known = nk
        if len(uid) and int(uid.max()) >= len(state[UID]):
            state[UID] = _grow(state[UID], int(uid.max()) + 1, 0)
        max_nb = int(((nprompt + kvout + bs - 1) // bs).max()) if len(nprompt) else 1
        if state[TABLES].shape[1] < max_nb:
            grown = np.zeros((K, max_nb), np.int32)
            grown[:, :state[TABLES].shape[1]] = state[TABLES]
            state[TABLES] = grown
            state[EVICTED_BUF] = np.zeros((max_nb, 2), np.int32)
        if carried is not None:
            # the running slots point at the carried requests, now first in this chunk
            s_req, order, nrun = state[S_REQ], state[ORDER], int(state[SCALARS][4])
            for j in range(nrun):
                s_req[order[j]] = carried["position"][order[j]]
        k_salt = np.full(nk, -1, np.int32)
        status, fault, counters, cached, computed, reason, first, div, refused, _cols, _rows, _seq = replay_arrays(
            config.capacity_blocks, bs, K, False, n_carried, final, nprompt, kvout, salt, model, kind, uid, koff, nfull,
            keys, items, interner.table, interner.k_parent, interner.k_item, interner.k_tag, k_salt,
            np.zeros((1, bs), np.uint32), *state, 1)
        if status == ERR_DUPLICATE:
            raise InputError(f"request {int(uid[fault])} of the stream is already running")
        if status == ERR_CAPACITY:
            raise InputError("a running request ran out of blocks")
        new = slice(n_carried, None)
        served = refused[new] == 0
        totals["requests"] += n_new
        totals["refused"] += int(np.count_nonzero(~served))
        totals["lookup_blocks"] += int(nfull[new].sum())
        totals["served_prompt"] += int(nprompt[new][served].sum())
        totals["cached"] += int(cached[new][served].sum())
        # carry the running requests to the next chunk
        s_req, order, nrun = state[S_REQ], state[ORDER], int(state[SCALARS][4])
        running = [int(s_req[order[j]]) for j in range(nrun)]
        if running:
            idx = np.array(running, np.int64)
            counts_r = koff[idx + 1] - koff[idx]
            take = np.concatenate([np.arange(koff[i], koff[i + 1]) for i in running])
            position = {}
            for j in range(nrun):
                position[int(order[j])] = j
            carried = dict(nprompt=nprompt[idx], kvout=kvout[idx], nfull=nfull[idx], model=model[idx], kind=kind[idx],
                           salt=salt[idx], uid=uid[idx], keys=keys[take], items=items[take],
                           koff=np.concatenate([[0], np.cumsum(counts_r)]).astype(np.int64), position=position)
        else:
            carried = None
        n_chunks += 1
        pending = nxt
    counters = state[COUNTERS]
    return StreamTotals(totals["requests"], totals["refused"], totals["lookup_blocks"], int(counters[C_PROMPT]),
                        int(counters[C_CACHED]), int(counters[C_STORED]), int(counters[C_EVICTED]),
                        interner.num_keys, n_chunks)


def chunks_of(requests, size: int, models: dict[str | None, int] | None = None) -> Iterable[StreamChunk]:
    """`TraceRequest`s (hash-id ones) as chunks of `size` requests (for tests and small inputs)."""
    models = models if models is not None else {None: -1}
    uids: dict[str, int] = {}
    batch = []
    for tr in requests:
        batch.append(tr)
        if len(batch) == size:
            yield _chunk(batch, models, uids)
            batch = []
    if batch:
        yield _chunk(batch, models, uids)


def _chunk(batch, models, uids) -> StreamChunk:
    ids = [list(tr.hash_ids or ()) for tr in batch]
    offsets = np.zeros(len(batch) + 1, np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    items = np.array([h for x in ids for h in x], np.uint64).view(np.int64)
    for tr in batch:
        if tr.model not in models:
            models[tr.model] = len(models) - 1
    return StreamChunk(np.array([tr.input_length for tr in batch], np.int64),
                       np.array([tr.output_length for tr in batch], np.int64),
                       np.array([uids.setdefault(tr.id, len(uids)) for tr in batch], np.int32),
                       np.array([models[tr.model] for tr in batch], np.int32), offsets, items)
