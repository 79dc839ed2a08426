"""`engine.analysis.statistics.compute` over a columnar log: the same `Statistics` for the
events a per-event mask keeps (the shared filter with its range), from the columns, so the
Statistics pane counts the whole log of a 7M-event trace in seconds; `compute` stays the
reference (and what a live `EventLog` uses), held equal by tests/test_statistics.py. The
two sequential loops (LRU stack distances, each eviction paired with its hash's oldest
store, a cache reset ending every open one) are compiled with numba as the replay kernel's
are; the rest is numpy. A columnar log's events carry no server or model: every lookup counts
under "local" and "(none)". A live log is counted from its `snapshot()`; an attached server's
(journal-fed: a hash numbered again each time it is stored) by its hashes' identities, on
the server's batch times.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np
from numba import njit

from engine.analysis.statistics import (
    Decode, GroupRate, Histogram, Killer, SharedPrefix, Statistics, _ids,
)
from engine.core.columnar import EVICTED, LOOKUP, MISS_REASONS, RESET, STARTED, STORED

_NEW_CONTENT = MISS_REASONS.index("new_content")


@njit(cache=True)
def _stack_distances(accesses: np.ndarray, num_keys: int) -> tuple[np.ndarray, int]:  # pragma: no cover - compiled
    """`engine.analysis.statistics.reuse_distances` over int key ids."""
    n = len(accesses)
    tree = np.zeros(n + 1, np.int64)
    last = np.full(num_keys, -1, np.int64)
    out = np.empty(n, np.int64)
    m = 0
    cold = 0
    for pos in range(n):
        h = accesses[pos]
        prev = last[h]
        if prev < 0:
            cold += 1
        else:
            s = 0
            i = pos
            while i > 0:
                s += tree[i]
                i -= i & -i
            i = prev + 1
            while i > 0:
                s -= tree[i]
                i -= i & -i
            out[m] = s
            m += 1
            i = prev + 1
            while i <= n:
                tree[i] -= 1
                i += i & -i
        i = pos + 1
        while i <= n:
            tree[i] += 1
            i += i & -i
        last[h] = pos
    return out[:m], cold


@njit(cache=True)
def _lifetimes(keys: np.ndarray, is_store: np.ndarray, when: np.ndarray, epoch: np.ndarray,
               reset_when: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:  # pragma: no cover - compiled
    """Rows grouped by (epoch, key), in log order within a group, an epoch the rows between
    two cache resets: each eviction ends the oldest store of its key still open, when there
    is one, and the reset that ends an epoch (`reset_when[epoch]`, if one does) every store
    of it still open. Returns (lifetimes, the grouped row each came from: an eviction's, or
    the last of its group's for a reset's; stores still open at the end)."""
    n = len(keys)
    out = np.empty(n, np.float64)
    order = np.empty(n, np.int64)  # the eviction's row index, to restore the log order
    queue = np.empty(n, np.float64)
    m = 0
    still = 0
    i = 0
    while i < n:
        j = i
        head = tail = 0
        while j < n and keys[j] == keys[i] and epoch[j] == epoch[i]:
            if is_store[j]:
                queue[tail] = when[j]
                tail += 1
            elif head < tail:
                out[m] = when[j] - queue[head]
                order[m] = j
                head += 1
                m += 1
            j += 1
        if epoch[i] < len(reset_when):  # a reset ends the epoch: every store still open
            while head < tail:
                out[m] = reset_when[epoch[i]] - queue[head]
                order[m] = j - 1
                head += 1
                m += 1
        still += tail - head
        i = j
    return out[:m], order[:m], still


def _segments(flat: np.ndarray, starts: np.ndarray, which: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The concatenated segments flat[starts[w]:starts[w + 1]] for w in `which`, the index
    into `which` each element came from and its place in its segment."""
    lo = starts[which]
    lens = starts[which + 1] - lo
    total = int(lens.sum())
    owner = np.repeat(np.arange(len(which), dtype=np.int64), lens)
    if not total:
        return flat[:0].astype(np.int64), owner, owner.copy()
    first = np.cumsum(lens) - lens
    depth = np.arange(total, dtype=np.int64) - np.repeat(first, lens)
    return flat[depth + np.repeat(lo, lens)].astype(np.int64), owner, depth


def _one_id_per_hash(keys: Any, key: np.ndarray, flat: np.ndarray,
                     tokens_of: dict[int, tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray, dict]:
    """`key` and `flat` (hash ids) as ids equal exactly when their hashes are
    (`keys.identities`: a journal-fed log numbers every row's hash anew), and `tokens_of`
    keyed by them."""
    both = np.concatenate([np.asarray(key, np.int64), np.asarray(flat, np.int64)])
    if not len(both):
        return key, flat, tokens_of
    _, code = np.unique(keys.identities(both), return_inverse=True)
    code = code.reshape(-1).astype(np.int64)
    first = {}
    for k in tokens_of:
        first[k] = int(code[int(np.flatnonzero(both == k)[0])])
    return code[:len(key)], code[len(key):], {first[k]: t for k, t in tokens_of.items()}


def compute_columnar(log: Any, keep: np.ndarray | None = None, prompts: Mapping[str, Sequence[int]] | None = None,
                     decode: Decode | None = None, block_size: int | None = None, top: int = 20,
                     killer_window: int = 4) -> Statistics:
    """The statistics of the events of `log` (a `ColumnarEventLog`) where `keep` holds (a
    bool per event position; every event for None): what `compute` gives for their dicts."""
    col = log.columnar
    n_events = len(log.seqs)
    if keep is None:
        keep = np.ones(n_events, bool)
    keep = np.asarray(keep, bool)[:n_events]
    if len(keep) < n_events:
        keep = np.concatenate([keep, np.zeros(n_events - len(keep), bool)])
    kind_all = col.col("kind")
    rows = np.flatnonzero(keep[log.row_events()] & np.isin(kind_all, (STARTED, LOOKUP, STORED, EVICTED, RESET)))
    kind = kind_all[rows]
    req = col.values_at("request", rows).astype(np.int64)
    key = col.values_at("hash", rows).astype(np.int64)
    a = col.values_at("a", rows)
    b = col.values_at("b", rows)
    flag = col.values_at("flag", rows)
    keys, reqs = col.keys, col.requests
    flat, kstart = log.request_keys()
    codes, _num_ids = log.id_codes()
    ids = reqs.ids
    is_start, is_look, is_store, is_evict = kind == STARTED, kind == LOOKUP, kind == STORED, kind == EVICTED
    is_reset = kind == RESET
    has_requests = bool(is_start.any())

    # token ids of the stored blocks the kept events carry (a hash-id trace's are empty)
    store_keys = np.flatnonzero(np.bincount(key[is_store])) if is_store.any() else np.zeros(0, np.int64)
    tokens_of: dict[int, tuple[int, ...]] = {}
    for k in store_keys[_may_carry_tokens(keys, store_keys)].tolist():
        t = keys.attributes(k)[1]
        if t:
            tokens_of[k] = t
    if not block_size and tokens_of:
        first = next(k for k in key[is_store].tolist() if k in tokens_of)
        block_size = len(tokens_of[first])
    if hasattr(keys, "identities"):  # a journal's hash ids, one per row: one id per hash here
        key, flat, tokens_of = _one_id_per_hash(keys, key, flat, tokens_of)
        num_keys = int(max(key.max() if len(key) else -1, flat.max() if len(flat) else -1)) + 1
    else:
        num_keys = max(len(keys), int(flat.max()) + 1 if len(flat) else 0, int(key.max()) + 1 if len(key) else 0)

    # the clock: kept request starts before each row; without any (a recorded attach) the
    # server's batch time, or the event's own time where its batch has none, as `compute` reads it
    if has_requests:
        clock = (np.cumsum(is_start) - is_start).astype(np.float64)
    else:
        clock = col.remote_batch_times(col.info_numbers(rows))
        own = np.flatnonzero(clock == 0.0)
        if len(own):
            clock[own] = log.times_at(log.row_events()[rows[own]])

    # accesses: a lookup's full-block keys, then a stored block its request's latest kept
    # lookup did not name (a block filled while decoding)
    look_at = np.flatnonzero(is_look)
    look_keys, look_owner, depth = _segments(flat, kstart, req[look_at])
    store_at = np.flatnonzero(is_store)
    first_access = np.ones(len(store_at), bool)
    if len(store_at) and len(look_at):
        # the latest kept lookup of the same request id before each store
        both = np.concatenate([look_at, store_at])
        code = codes[req[both]]
        order = np.lexsort((both, code))
        srt_code, srt_row = code[order], both[order]
        is_l = is_look[srt_row]
        idx = np.where(is_l, np.arange(len(order)), -1)
        idx = np.maximum.accumulate(idx)
        group_start = np.r_[0, np.flatnonzero(srt_code[1:] != srt_code[:-1]) + 1]
        group_first = np.repeat(group_start, np.diff(np.r_[group_start, len(order)]))
        latest = np.where(idx >= group_first, idx, -1)
        s_pos = ~is_l
        lat = latest[s_pos]
        s_rows = srt_row[s_pos]
        has = lat >= 0
        occ = np.full(len(s_rows), -1, np.int64)
        occ[has] = req[srt_row[lat[has]]]
        # is the stored key among that occurrence's lookup keys?
        named = np.zeros(len(s_rows), bool)
        if len(look_keys):
            pairs = np.sort(req[look_at][look_owner] * num_keys + look_keys)
            probe = occ[has] * num_keys + key[s_rows[has]]
            at = np.minimum(np.searchsorted(pairs, probe), len(pairs) - 1)
            named[has] = pairs[at] == probe
        where = np.searchsorted(store_at, s_rows)
        first_access[where] = ~named
    acc_row = np.concatenate([look_at[look_owner], store_at[first_access]])
    acc_key = np.concatenate([look_keys, key[store_at[first_access]]])
    acc_order = np.argsort(acc_row, kind="stable")
    distances, cold = _stack_distances(np.ascontiguousarray(acc_key[acc_order], np.int64), max(num_keys, 1))

    # lifetimes: an eviction ends its key's oldest open store, a cache reset every open one
    life_at = np.flatnonzero(is_store | is_evict)
    epoch = np.cumsum(is_reset)[life_at]  # the resets before each row
    lorder = np.lexsort((life_at, key[life_at], epoch))  # by epoch, then key, then log order
    g = life_at[lorder]
    life, evict_idx, still = _lifetimes(np.ascontiguousarray(key[g]), np.ascontiguousarray(is_store[g]),
                                        np.ascontiguousarray(clock[g]), np.ascontiguousarray(epoch[lorder]),
                                        np.ascontiguousarray(clock[is_reset]))
    life = life[np.argsort(g[evict_idx], kind="stable")]

    # hit rate per tenant / model / server
    tenant = _tenants(req[is_start | is_store], key[is_start | is_store], is_start[is_start | is_store], reqs,
                      keys, codes)
    look_req = req[look_at]
    prompt_sizes = reqs.prompt_sizes()
    bs = col.block_size
    prompt = prompt_sizes[look_req]
    cached = a[look_at].astype(np.int64) * bs
    look_code = codes[look_req]
    names = sorted(set(tenant.values()))
    code_name = np.full(int(codes.max()) + 1 if len(codes) else 1, -1, np.int64)
    if tenant:
        code_name[np.fromiter(tenant, np.int64, len(tenant))] = [names.index(v) for v in tenant.values()]
    labels = [("(none)" if v == "" else v) for v in names] + ["(none)"]
    tenant_of = code_name[look_code]  # -1, no salt: the last label
    one = np.zeros(len(look_at), np.int64)
    rates = {"tenant": _group_rates(labels, tenant_of, prompt, cached),
             "model": _group_rates(["(none)"], one, prompt, cached),
             "server": _group_rates(["local"], one, prompt, cached)}

    # shared prefixes: per chain node, the kept lookups whose hits reach it
    num_hit = a[look_at].astype(np.int64)
    hit = depth < num_hit[look_owner]
    prefixes = _shared_prefixes(look_keys[hit], depth[hit], look_owner[hit], num_keys, keys, tokens_of, block_size,
                                decode, top)

    # cache killers
    div = look_at[(flag[look_at] == _NEW_CONTENT) & (b[look_at] >= 0)]
    killers = _killers(div, b, req, codes, ids, look_at, look_keys, look_owner, tokens_of, prompts or {}, decode,
                       top, killer_window)

    notes = []
    if not has_requests:
        notes.append("the log has no requests (a recorded attach): lifetimes are in seconds and there are no hit "
                     "rates, shared prefixes or killers")
    unit = "requests" if has_requests else "seconds"
    return Statistics(_histogram(distances, "blocks", int(cold)), _histogram(life, unit, int(still)), rates, prefixes,
                      killers, int(np.count_nonzero(keep)), notes)


def _histogram(values: np.ndarray, unit: str, num_unbounded: int) -> Histogram:
    """`Histogram.of` with numpy: the same edges and counts; `values` stays an array."""
    top = float(values.max()) if len(values) else 0.0
    edges = [0, 1]
    while edges[-1] <= top:
        edges.append(edges[-1] * 2)
    v = np.asarray(values, np.float64)
    whole = np.trunc(v)
    # bin 0 below 1, else the bit length of int(v): frexp's exponent, exact for integers
    bins = np.where(v < 1, 0, np.frexp(np.maximum(whole, 1))[1]).astype(np.int64)
    counts = np.bincount(bins, minlength=len(edges) - 1)[:len(edges) - 1]
    return Histogram(unit, tuple(edges), tuple(int(c) for c in counts), num_unbounded, values)


def _tenants(req: np.ndarray, key: np.ndarray, is_start: np.ndarray, reqs: Any, keys: Any,
             codes: np.ndarray) -> dict[int, str]:
    """Per request-id code: the first salt its kept started or stored events carry."""
    out: dict[int, str] = {}
    if not len(req):
        return out
    code = codes[req]
    sid = _salt_ids(req, key, is_start, reqs, keys)
    if sid is not None:  # the kernel's tables: salt ids as arrays, -1 for none
        has = sid >= 0
        c, first = np.unique(code[has], return_index=True)
        salts = keys.salts
        return {int(k): str(salts[v]) for k, v in zip(c.tolist(), sid[has][first].tolist())}
    _, first = np.unique(code, return_index=True)
    # a code's first row gives its salt unless that is None; then look further (rare)
    pending = set()
    for i in np.sort(first).tolist():
        salt = _salt_of_row(bool(is_start[i]), int(req[i]), int(key[i]), reqs, keys)
        if salt is not None:
            out[int(code[i])] = str(salt)
        else:
            pending.add(int(code[i]))
    if pending:
        for i in range(len(req)):
            c = int(code[i])
            if c in pending:
                salt = _salt_of_row(bool(is_start[i]), int(req[i]), int(key[i]), reqs, keys)
                if salt is not None:
                    out[c] = str(salt)
                    pending.discard(c)
                    if not pending:
                        break
    return out


def _salt_ids(req: np.ndarray, key: np.ndarray, is_start: np.ndarray, reqs: Any, keys: Any) -> np.ndarray | None:
    """Per row, the salt id (into `keys.salts`) a started event (its request's) or a stored
    one (its root block's) carries, -1 for none; None when a table has live entries, whose
    salts are read one by one."""
    if len(reqs) != reqs.num_fixed or len(keys.live_ids()) or tuple(reqs.salts) != tuple(keys.salts):
        return None
    out = np.full(len(req), -1, np.int64)
    out[is_start] = reqs.fixed_salt_ids()[req[is_start]]
    st = ~is_start
    out[st] = keys.root_salt_ids(key[st])
    return out


def _may_carry_tokens(keys: Any, ids: np.ndarray) -> np.ndarray:
    """Per chain id: False where it surely carries no token ids (a kernel id of a hash-id
    block, its tag even), so a hash-id trace reads no attributes."""
    out = np.ones(len(ids), bool)
    fixed = ids < len(keys.parent)
    out[fixed] = keys.carries_tokens(ids[fixed]) | np.isin(ids[fixed], keys.live_ids())
    return out


def _salt_of_row(started: bool, r: int, k: int, reqs: Any, keys: Any) -> str | None:
    return reqs.salt(r) if started else keys.attributes(k)[2]


def _group_rates(labels: Sequence[str], group: np.ndarray, prompt: np.ndarray, cached: np.ndarray) -> list[GroupRate]:
    """Per label (a group is an index into `labels`; several may share one): lookups,
    prompt and cached tokens."""
    if not len(group):
        return []
    idx = np.asarray(group, np.int64) % len(labels)
    n = np.bincount(idx, minlength=len(labels))
    p = np.bincount(idx, weights=prompt, minlength=len(labels))
    c = np.bincount(idx, weights=cached, minlength=len(labels))
    acc: dict[str, list[int]] = {}
    for i, name in enumerate(labels):
        if n[i]:
            g = acc.setdefault(name, [0, 0, 0])
            g[0] += int(n[i])
            g[1] += int(p[i])
            g[2] += int(c[i])
    out = [GroupRate(k, *v) for k, v in acc.items()]
    return sorted(out, key=lambda r: (-r.prompt_tokens, r.group))


def _shared_prefixes(hit_keys: np.ndarray, depth: np.ndarray, owner: np.ndarray, num_keys: int, keys: Any,
                     tokens_of: Mapping[int, tuple[int, ...]], block_size: int | None, decode: Decode | None,
                     top: int) -> list[SharedPrefix]:
    """`statistics.shared_prefixes` with a node named by its chain's last key (a chain id
    names its whole chain)."""
    if not len(hit_keys):
        return []
    count = np.bincount(hit_keys, minlength=num_keys)
    nodes = np.flatnonzero(count)
    node_depth = np.zeros(num_keys, np.int64)
    node_depth[hit_keys] = depth + 1
    # children: the key after each hit key in the same lookup
    nxt = np.r_[hit_keys[1:], -1]
    same = np.r_[owner[1:] == owner[:-1], False]
    parents, children = hit_keys[same], nxt[same]
    best_child = np.zeros(num_keys, np.int64)
    np.maximum.at(best_child, parents, count[children])
    nodes = nodes[best_child[nodes] != count[nodes]]
    known = np.zeros(num_keys, bool)
    if tokens_of:
        known[np.fromiter(tokens_of, np.int64, len(tokens_of))] = True
    # a node's chain, for its token ids: the keys of one lookup that reached it
    at = np.zeros(num_keys, np.int64)
    at[hit_keys] = np.arange(len(hit_keys))
    nblocks = node_depth[nodes]
    all_known = np.zeros(len(nodes), bool)
    if tokens_of:
        kn = known[hit_keys].astype(np.int64)
        csum = np.r_[0, np.cumsum(kn)]
        end = at[nodes] + 1
        all_known = (csum[end] - csum[end - nblocks]) == nblocks
    ntok = np.zeros(len(nodes), np.int64)
    size = block_size or 0
    ntok[~all_known] = nblocks[~all_known] * size
    if all_known.any():
        for i in np.flatnonzero(all_known).tolist():
            end = int(at[nodes[i]]) + 1
            ntok[i] = sum(len(tokens_of[k]) for k in hit_keys[end - int(nblocks[i]):end].tolist())
    saved = count[nodes] * ntok
    # the top by (tokens saved, blocks) first; their ties broken by the hex digest
    order = np.lexsort((-nblocks, -saved))
    if len(order) > top:
        cut = order[top - 1] if top > 0 else order[0]
        order = order[(saved[order] > saved[cut]) | ((saved[order] == saved[cut]) & (nblocks[order] >= nblocks[cut]))]
    out = []
    for i in order.tolist():
        k = int(nodes[i])
        ids = None
        if all_known[i]:
            end = int(at[k]) + 1
            ids = tuple(t for kk in hit_keys[end - int(nblocks[i]):end].tolist() for t in tokens_of[kk])
        out.append(SharedPrefix(int(nblocks[i]), int(ntok[i]), int(count[k]), int(saved[i]), keys.digest(k).hex(),
                                ids, decode(ids) if decode is not None and ids is not None else None))
    out.sort(key=lambda p: (-p.tokens_saved, -p.num_blocks, p.last_hash))
    return out[:top]


def _killers(div: np.ndarray, b: np.ndarray, req: np.ndarray, codes: np.ndarray, ids: Sequence[str],
             look_at: np.ndarray, look_keys: np.ndarray, look_owner: np.ndarray,
             tokens_of: Mapping[int, tuple[int, ...]], prompts: Mapping[str, Sequence[int]], decode: Decode | None,
             top: int, window: int) -> list[Killer]:
    """`statistics.cache_killers`; a prompt not given is its request id's first kept lookup
    whose blocks all carry token ids."""
    total = len(div)
    if not total:
        return []
    pos = b[div]
    uniq, inv, num = np.unique(pos, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    rank = np.lexsort((uniq, -num))[:top]
    # prompts read back from the stored blocks, per request-id code
    first_lookup: dict[int, int] = {}
    if tokens_of and len(look_at):
        known = np.zeros(int(look_keys.max()) + 1 if len(look_keys) else 1, bool)
        tk = np.fromiter((k for k in tokens_of if k < len(known)), np.int64)
        known[tk] = True
        nk = np.bincount(look_owner, minlength=len(look_at))
        nknown = np.bincount(look_owner, weights=known[look_keys], minlength=len(look_at)) if len(look_keys) else nk
        ok = np.flatnonzero((nk > 0) & (nknown == nk))
        c = codes[req[look_at[ok]]]
        _, f = np.unique(c, return_index=True)
        first_lookup = dict(zip(c[f].tolist(), ok[f].tolist()))
    seg_start = np.searchsorted(look_owner, np.arange(len(look_at) + 1))
    out = []
    for u in rank.tolist():
        members = div[inv == u]
        p = int(uniq[u])
        texts: Counter[str] = Counter()
        for r in req[members].tolist():
            rid = ids[r]
            tok = prompts.get(rid)
            if tok is None:
                li = first_lookup.get(int(codes[r]))
                if li is not None:
                    tok = tuple(t for k in look_keys[seg_start[li]:seg_start[li + 1]].tolist() for t in tokens_of[k])
            if tok is not None and p < len(tok):
                piece = list(tok[p:p + window])
                texts[decode(piece) if decode is not None else _ids(piece)] += 1
        text = texts.most_common(1)[0][0] if texts else None
        rids = tuple(ids[r] for r in req[members[:5]].tolist())
        out.append(Killer(p, len(members), round(len(members) / total, 6), text, rids))
    return out
