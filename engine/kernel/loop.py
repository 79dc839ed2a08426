"""The compiled replay loop: `engine.core.replay.replay` over flat arrays, in numba.

It keeps the manager's bookkeeping (engine/core/manager.py, block_pool.py) in two int32
tables indexed by dense ids (a row per pool block, a row per interned key, so every map is
an array index): the free queue as a doubly linked list over block ids (vLLM's
FreeKVCacheBlockQueue: LRU cached blocks at the tail, hashless ones at the head), ref
counts, the holders of each hash in insertion order, the cached children of each parent
(for divergence) and the seq of the event that evicted each hash. It numbers events exactly as the manager's
`EventBus` would and, when recording, writes them as rows of the columnar log
(`engine.core.columnar`). Nothing here allocates per block or per event.

It also holds the chain interning's hash table (`intern_chains`, used through
`engine.kernel.intern`): every compiled function of the kernel is in this one file, so
that numba's disk cache, keyed on a file's stamp, is invalidated by any edit to any of
them (`engine.kernel.jit`).
"""

from __future__ import annotations

import numpy as np

from engine.core.validation import check_memory
from engine.kernel.jit import kernel_jit

KIND_EXTERNAL, KIND_TOKENS = 0, 1  # a block's item: a trace's hash id, or the id of its token ids
# Row kinds; engine.core.columnar names them.
STARTED, LOOKUP, ALLOCATED, STORED, REF, FREED, EVICTED, REFUSED, FINISHED = 1, 2, 3, 4, 5, 6, 7, 8, 9
# Miss reasons, in engine.core.manager.MISS_REASONS order.
NEW_CONTENT, EVICTED_MISS, SALT, MODEL, PARTIAL, LAST_TOKEN = 0, 1, 2, 3, 4, 5
OK, ERR_DUPLICATE, ERR_CAPACITY = 0, 1, 2
MAX_SALTS_CHECKED = 64
MORE = 3
# Counters, in engine.core.pool_state.Counters order.
C_REQ, C_PROMPT, C_CACHED, C_STORED, C_EVICTED, C_REFUSED, C_FINISHED, C_COLLISIONS = range(8)


# ---- chain interning (engine.kernel.intern): every distinct block of a trace as a dense id.
# Two blocks have the same digest exactly when they have the same parent digest, the same
# content (a Mooncake hash id, or the same token ids) and, for a first block, the same salt
# (DESIGN 4.1's chain). So the kernel keys a block by (parent id, item, tag) in an
# open-addressing table and never computes a digest; `engine.core.columnar` computes the
# real digests of the ids it shows, once each.

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xC2B2AE3D27D4EB4F)
_M3 = np.uint64(0x165667B19E3779F9)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@kernel_jit(inline="always")
def _slot(parent: np.int64, item: np.int64, tag: np.int64, mask: np.uint64) -> np.uint64:
    x = np.uint64(parent + 1) * _M1 ^ np.uint64(item) * _M2 ^ np.uint64(tag) * _M3
    x = (x ^ (x >> _S30)) * _MIX1
    x = (x ^ (x >> _S27)) * _MIX2
    return (x ^ (x >> _S31)) & mask


@kernel_jit()
def find_key(table, k_parent, k_item, k_tag, parent, item, tag):
    """The id of chain block (parent, item, tag), or -1 if no request of the trace has it."""
    mask = np.uint64(table.shape[0] - 1)
    s = _slot(parent, item, tag, mask)
    while True:
        k = table[s]
        if k < 0:
            return -1
        if k_parent[k] == parent and k_item[k] == item and k_tag[k] == tag:
            return k
        s = (s + np.uint64(1)) & mask


@kernel_jit()
def _find_or_claim(table, k_parent, k_item, k_tag, parent, item, tag, n_keys):
    """The id of chain block (parent, item, tag) in `table`; if it has none, its slot is
    given the next id, `n_keys`, which the caller then fills in."""
    mask = np.uint64(table.shape[0] - 1)
    s = _slot(parent, item, tag, mask)
    while True:
        k = table[s]
        if k < 0:
            table[s] = n_keys
            return n_keys
        if k_parent[k] == parent and k_item[k] == item and k_tag[k] == tag:
            return k
        s = (s + np.uint64(1)) & mask


@kernel_jit()
def _intern_into(items, offsets, kinds, root_tags, table, first, k_parent, k_item, k_tag, n_keys, keys):
    """Intern every request's blocks (`intern_chains`' layout) into a table that holds
    `n_keys` keys already and has room for all the new ones; the ids go to `keys`.
    Returns the number of keys held now. One loop for one-shot and growing tables.
    With `first` (an entry per item; empty: none), the first key of each item is at
    `first[item]` and only the keys that share an item with an earlier one go in `table`."""
    dense = first.shape[0] > 0
    for r in range(offsets.shape[0] - 1):
        parent = -1
        for j in range(offsets[r], offsets[r + 1]):
            item = items[j]
            tag = root_tags[r] if parent < 0 else kinds[r]
            if not dense:
                k = _find_or_claim(table, k_parent, k_item, k_tag, parent, item, tag, n_keys)
            else:
                k = first[item]
                if k < 0:
                    k = n_keys
                    first[item] = k
                elif k_parent[k] != parent or k_tag[k] != tag:
                    k = _find_or_claim(table, k_parent, k_item, k_tag, parent, item, tag, n_keys)
            if k == n_keys:  # a new key
                k_parent[k] = parent
                k_item[k] = item
                k_tag[k] = tag
                n_keys += 1
            keys[j] = k
            parent = k
    return n_keys


@kernel_jit()
def intern_chains(items, offsets, kinds, root_tags):
    """Key ids for every block of every request, and the key table (parent, item, tag).

    `items[offsets[r]:offsets[r + 1]]` are request r's block items in chain order.
    """
    n = items.shape[0]
    cap = 16
    while cap < 2 * n + 16:
        cap *= 2
    table = np.full(cap, -1, np.int32)
    k_parent = np.empty(n, np.int32)
    k_item = np.empty(n, np.int64)
    k_tag = np.empty(n, np.int64)
    keys = np.empty(n, np.int32)
    n_keys = _intern_into(items, offsets, kinds, root_tags, table, np.zeros(0, np.int32), k_parent, k_item, k_tag,
                          np.int64(0), keys)
    return keys, table, k_parent[:n_keys].copy(), k_item[:n_keys].copy(), k_tag[:n_keys].copy()


@kernel_jit()
def intern_dense(items, offsets, kinds, root_tags, size):
    """`intern_chains` for items in 0..size-1 (a trace's dense hash ids, or token-block
    ids), without its table: the first key of each item is found at `first[item]` (in the
    usual trace every item has one key, and a chain walks its items nearly in order), and
    only the keys that share an item with an earlier one go into a hash table. Returns
    (keys, k_parent, k_item, k_tag); the same ids as `intern_chains` gives."""
    n = items.shape[0]
    cap = 16
    while cap < 2 * n + 16:
        cap *= 2
    k_parent = np.empty(n, np.int32)
    k_item = np.empty(n, np.int64)
    k_tag = np.empty(n, np.int64)
    keys = np.empty(n, np.int32)
    n_keys = _intern_into(items, offsets, kinds, root_tags, np.full(cap, -1, np.int32), np.full(size, -1, np.int32),
                          k_parent, k_item, k_tag, np.int64(0), keys)
    return keys, k_parent[:n_keys].copy(), k_item[:n_keys].copy(), k_tag[:n_keys].copy()


@kernel_jit()
def cut_items(flat, lens, keep):
    """Each request's first `keep[r]` of its `lens[r]` ids in `flat`, back to back (a
    hash-id request's full blocks: a trace may list ids past them)."""
    out = np.empty(keep.sum(), np.int64)
    src = 0
    dst = 0
    for r in range(lens.shape[0]):
        k = keep[r]
        out[dst:dst + k] = flat[src:src + k]
        src += lens[r]
        dst += k
    return out


@kernel_jit()
def _rehash(k_parent, k_item, k_tag, n_keys, size):
    table = np.full(size, -1, np.int32)
    mask = np.uint64(size - 1)
    for k in range(n_keys):
        s = _slot(k_parent[k], k_item[k], k_tag[k], mask)
        while table[s] >= 0:
            s = (s + np.uint64(1)) & mask
        table[s] = k
    return table


@kernel_jit()
def _cdiv(a, b):
    return -(-a // b)


@kernel_jit()
def _grow(kind, tier, seq, req, block, key, a, b, flag, cap):
    n = kind.shape[0]
    out = (np.zeros(cap, np.uint8), np.zeros(cap, np.uint8), np.zeros(cap, np.int64), np.zeros(cap, np.int32),
           np.zeros(cap, np.int32), np.zeros(cap, np.int32), np.zeros(cap, np.int64), np.zeros(cap, np.int64),
           np.zeros(cap, np.uint8))
    out[0][:n] = kind
    out[1][:n] = tier
    out[2][:n] = seq
    out[3][:n] = req
    out[4][:n] = block
    out[5][:n] = key
    out[6][:n] = a
    out[7][:n] = b
    out[8][:n] = flag
    return out


@kernel_jit(inline="always")
def _put(c_kind, c_seq, c_req, c_block, c_key, n_rows, kind, seq, r, block, key):
    """Row `n_rows` of the log: an event of `kind` numbered `seq`, of request r, on a pool
    block and a key (-1: none). The caller sets the row's other columns. Returns the next row."""
    c_kind[n_rows] = kind
    c_seq[n_rows] = seq
    c_req[n_rows] = r
    c_block[n_rows] = block
    c_key[n_rows] = key
    return n_rows + 1


# ---- the pool's bookkeeping, as two int32 tables (a row per pool block, a row per key).
# A row holds every field the loop reads together, so a lookup, a store or an eviction
# touches one cache line of each; and the helpers below take these two tables instead of a
# dozen arrays: numba counts a reference (an atomic add) for every array an inlined helper
# binds, and with a dozen arrays a store paid 34 of them (measured: 40% of the loop's time).
# Per block (rows 0..N-1; N and N+1 are the free queue's head and tail sentinels):
B_REF, B_KEY, B_QPREV, B_QNEXT, B_HNEXT, B_HPREV = range(6)
# Per key k, row k + 1 (row 0 is the root's, the parent of first blocks: only K_CHEAD):
# its holders (a list through B_HNEXT/B_HPREV, insertion order), copies held, its place in
# its parent's list of cached children, the head of its own, the seq of the event that
# evicted it (-2: never stored; -1: evicted, not recorded) and its parent.
K_HEAD, K_TAIL, K_COPIES, K_CNEXT, K_CPREV, K_CHEAD, K_EVSEQ, K_PARENT = range(8)
BLOCK_FIELDS = KEY_FIELDS = 8  # 32-byte rows


@kernel_jit()
def _chain_cached(table, k_parent, k_item, k_tag, kst, items, k0, k, kind, salt, model):
    """Whether blocks 0..k of a request's items, chained under `salt` and `model`, end in a
    cached block (the manager hashes the chain anew; a chain no request has was never stored)."""
    ck = find_key(table, k_parent, k_item, k_tag, np.int64(-1), items[k0],
                  np.int64(kind + 2 * (salt + 2) + (model + 1) * (1 << 33)))
    i = 1
    while ck >= 0 and i <= k:
        ck = find_key(table, k_parent, k_item, k_tag, ck, items[k0 + i], np.int64(kind))
        i += 1
    return ck >= 0 and kst[ck + 1, K_COPIES] > 0


@kernel_jit()
def _other_cached(ids, n_ids, own, by_model, table, k_parent, k_item, k_tag, kst, items, k0, k, kind, salt,
                  model):
    """The first id seen but the request's own (a salt, or a model when `by_model`) under
    which blocks 0..k of its chain end in a cached block, trying at most MAX_SALTS_CHECKED
    of them as the manager does; -2 when there is none (ids themselves may be -1)."""
    checked = 0
    for j in range(n_ids):
        other = ids[j]
        if other == own:
            continue
        checked += 1
        if checked > MAX_SALTS_CHECKED:
            break
        if by_model:
            found = _chain_cached(table, k_parent, k_item, k_tag, kst, items, k0, k, kind, salt, other)
        else:
            found = _chain_cached(table, k_parent, k_item, k_tag, kst, items, k0, k, kind, other, model)
        if found:
            return other
    return -2


@kernel_jit(inline="always")
def _store(bb, key, blk, kst):
    """The manager's `_store`: block `bb` gets hash `key` and becomes findable; 1 if it did
    (an event), 0 if the block had a hash already."""
    if blk[bb, B_KEY] >= 0:
        return 0
    blk[bb, B_KEY] = key
    row = key + 1
    if kst[row, K_COPIES] == 0:  # first copy: a cached child of its parent
        pi = kst[row, K_PARENT] + 1
        head = kst[pi, K_CHEAD]
        kst[row, K_CNEXT] = head
        kst[row, K_CPREV] = -1
        if head >= 0:
            kst[head + 1, K_CPREV] = key
        kst[pi, K_CHEAD] = key
    tail = kst[row, K_TAIL]
    blk[bb, B_HPREV] = tail
    blk[bb, B_HNEXT] = -1
    if tail >= 0:
        blk[tail, B_HNEXT] = bb
    else:
        kst[row, K_HEAD] = bb
    kst[row, K_TAIL] = bb
    kst[row, K_COPIES] += 1
    kst[row, K_EVSEQ] = -2
    return 1


@kernel_jit(inline="always")
def _link_after(p, x, blk):
    """Put block `x` into the free queue right after `p` (the head sentinel, or the block
    before the tail sentinel)."""
    nxt = blk[p, B_QNEXT]
    blk[x, B_QPREV] = p
    blk[x, B_QNEXT] = nxt
    blk[nxt, B_QPREV] = x
    blk[p, B_QNEXT] = x


@kernel_jit(inline="always")
def _unlink(x, blk):
    """Take block `x` out of the free queue, its neighbours joined."""
    qp = blk[x, B_QPREV]
    qn = blk[x, B_QNEXT]
    blk[qp, B_QNEXT] = qn
    blk[qn, B_QPREV] = qp
    blk[x, B_QPREV] = -1
    blk[x, B_QNEXT] = -1


@kernel_jit(inline="always")
def _allocate(num_new, s, ntab, tables, blk, kst, record, seq, evicted):
    """`BlockPool.take_free_block`, `num_new` times, for the request in slot `s`: blocks off
    the free queue's head into its table from position `ntab`; a block that held a hash is
    uncached first (its holder dropped, the child forgotten when no copy is left), one
    eviction event each, numbered from `seq`, its (block, key) into `evicted` for the
    caller's log. Returns (table length, evictions)."""
    head = blk.shape[0] - 2
    n_ev = 0
    for _ in range(num_new):
        bb = blk[head, B_QNEXT]
        _unlink(bb, blk)
        ek = blk[bb, B_KEY]
        if ek >= 0:
            row = ek + 1
            hp = blk[bb, B_HPREV]
            hn = blk[bb, B_HNEXT]
            if hp >= 0:
                blk[hp, B_HNEXT] = hn
            else:
                kst[row, K_HEAD] = hn
            if hn >= 0:
                blk[hn, B_HPREV] = hp
            else:
                kst[row, K_TAIL] = hp
            blk[bb, B_HNEXT] = -1
            blk[bb, B_HPREV] = -1
            blk[bb, B_KEY] = -1
            kst[row, K_COPIES] -= 1
            if kst[row, K_COPIES] == 0:  # no copy left: no longer a cached child
                cp = kst[row, K_CPREV]
                cn = kst[row, K_CNEXT]
                if cp >= 0:
                    kst[cp + 1, K_CNEXT] = cn
                else:
                    kst[kst[row, K_PARENT] + 1, K_CHEAD] = cn
                if cn >= 0:
                    kst[cn + 1, K_CPREV] = cp
                kst[row, K_CNEXT] = -1
                kst[row, K_CPREV] = -1
            kst[row, K_EVSEQ] = seq + n_ev if record else -1
            evicted[n_ev, 0] = bb
            evicted[n_ev, 1] = ek
            n_ev += 1
        blk[bb, B_REF] += 1
        tables[s, ntab] = bb
        ntab += 1
    return ntab, n_ev


@kernel_jit(inline="always")
def _record_evicted(n_ev, r, evicted, seq, n_rows, c_kind, c_seq, c_req, c_block, c_key):
    """The rows of `_allocate`'s evictions, numbered from `seq`. Returns the rows used."""
    for e in range(n_ev):
        n_rows = _put(c_kind, c_seq, c_req, c_block, c_key, n_rows, EVICTED, seq + e, r, evicted[e, 0],
                      evicted[e, 1])
    return n_rows


@kernel_jit(inline="always")
def _record_allocated(s, first, ntab, r, n_hit, tables, blk, seq, n_rows, c_kind, c_seq, c_req, c_block, c_key,
                      c_a):
    """The rows of one allocation: table entries first..ntab allocated (at `seq`, with the
    request's hit count), then their ref counts (at seq + 1). Returns the rows used."""
    for i in range(first, ntab):
        c_a[n_rows] = n_hit
        n_rows = _put(c_kind, c_seq, c_req, c_block, c_key, n_rows, ALLOCATED, seq, r, tables[s, i], -1)
    for i in range(first, ntab):
        c_a[n_rows] = blk[tables[s, i], B_REF]
        n_rows = _put(c_kind, c_seq, c_req, c_block, c_key, n_rows, REF, seq + 1, r, tables[s, i], -1)
    return n_rows


# Per pool block: a 32-byte row of the block table.
KERNEL_BYTES_PER_BLOCK = 4 * BLOCK_FIELDS


def new_blocks(num_blocks):
    """The block table of a fresh pool: every block free, in id order (the free queue's
    head is row N, its tail row N + 1)."""
    N = num_blocks
    HEAD, TAIL = N, N + 1
    blk = np.full((N + 2, BLOCK_FIELDS), -1, np.int32)
    blk[:N, B_REF] = 0
    blk[:N, B_QPREV] = np.arange(-1, N - 1, dtype=np.int32)
    blk[:N, B_QNEXT] = np.arange(1, N + 1, dtype=np.int32)
    blk[0, B_QPREV] = HEAD
    blk[N - 1, B_QNEXT] = TAIL
    blk[HEAD, B_QNEXT] = 0
    blk[TAIL, B_QPREV] = N - 1
    blk[HEAD, B_QPREV] = -2
    blk[TAIL, B_QNEXT] = -2
    return blk


def new_keys(k_parent, old=None):
    """The key table for keys with these parents (the root's row first); the rows of `old`,
    a smaller table of the same keys' first part, are kept."""
    kst = np.full((len(k_parent) + 1, KEY_FIELDS), -1, np.int32)
    kst[:, K_COPIES] = 0
    kst[:, K_EVSEQ] = -2
    kst[1:, K_PARENT] = k_parent
    if old is not None:
        kst[:len(old)] = old
    return kst


def new_state(num_blocks, concurrency, k_parent, n_salts, n_models, n_uids, max_nb):
    """The bookkeeping a replay carries from one chunk of requests to the next: the block
    and key tables, the running requests' slots and scalars (free blocks, salts and models
    seen, free slots, running, next seq). A pool larger than this machine's memory is
    refused before anything is allocated."""
    N = num_blocks
    check_memory(N * KERNEL_BYTES_PER_BLOCK, f"a pool of {N:,} blocks")
    K = concurrency
    scalars = np.array([N, 0, 0, K, 0, 0], np.int64)  # free, salts seen, models seen, free slots, running, seq
    nb = max(max_nb, 1)
    return [new_blocks(N), new_keys(k_parent),
            np.zeros(n_salts + 1, np.int32), np.zeros(n_salts + 1, np.uint8),
            np.zeros(n_models + 1, np.int32), np.zeros(n_models + 1, np.uint8),
            np.zeros(n_uids, np.uint8), np.zeros(8, np.int64),
            np.zeros((K, nb), np.int32), np.zeros(K, np.int64), np.zeros(K, np.int64),
            np.zeros(K, np.int64), np.zeros(K, np.int64), np.zeros(K, np.int64),
            np.arange(K - 1, -1, -1).astype(np.int64), np.zeros(K, np.int64), np.zeros((nb, 2), np.int32), scalars]


# Where new_state's entries are (a stream grows the key table, the uids and the block tables).
KEYS, UID, COUNTERS, TABLES, S_REQ, ORDER, EVICTED_BUF, SCALARS = 1, 6, 7, 8, 9, 15, 16, 17


@kernel_jit()
def replay_arrays(num_blocks, bs, concurrency, record, p0, final,
                  r_nprompt, r_kvout, r_salt, r_model, r_kind, r_uid, r_koff, r_nfull, keys, items,
                  table, k_parent, k_item, k_tag, k_salt, content,
                  blk, kst, salts_seen, salt_seen, models_seen, model_seen, running_uid, counters,
                  tables, s_req, s_ntab, s_ntok, s_app, s_nh, free_slots, order, evicted, scalars, row_cap):
    """Replay requests p0.. of these arrays on the state (`new_state`, changed in place);
    returns (status, request at fault or the first one not admitted, per-request results,
    log columns, rows used). Unless `final`, it stops where it would admit a request past
    the end: the caller brings the next chunk, the running requests first."""
    n_req = r_nprompt.shape[0]
    N = num_blocks
    HEAD, TAIL = N, N + 1
    n_free = scalars[0]
    n_seen = scalars[1]
    n_models_seen = scalars[2]
    n_free_slots = scalars[3]
    nrun = scalars[4]
    seq = scalars[5]
    # ---- per-request results
    res_cached = np.zeros(n_req, np.int64)
    res_computed = np.zeros(n_req, np.int64)
    res_reason = np.zeros(n_req, np.uint8)
    res_first = np.zeros(n_req, np.int64)
    res_div = np.full(n_req, -1, np.int64)
    res_refused = np.zeros(n_req, np.uint8)
    max_nb = tables.shape[1]
    K = concurrency
    hits = np.zeros(max_nb, np.int32)
    hashless = np.zeros(max_nb, np.int32)
    # ---- the log
    cap = row_cap if record else 1
    L = _grow(np.zeros(0, np.uint8), np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int32),
              np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64),
              np.zeros(0, np.uint8), cap)
    c_kind, c_tier, c_seq, c_req, c_block, c_key, c_a, c_b, c_flag = L
    n_rows = 0
    seq = 0
    margin = K * (12 * max_nb + 16) + 16

    p = p0
    more = False
    while p < n_req or nrun > 0 or (not final and not more):
        if record and n_rows + margin > c_kind.shape[0]:
            new_cap = max(2 * c_kind.shape[0], n_rows + 2 * margin)
            L = _grow(c_kind[:n_rows], c_tier[:n_rows], c_seq[:n_rows], c_req[:n_rows], c_block[:n_rows],
                      c_key[:n_rows], c_a[:n_rows], c_b[:n_rows], c_flag[:n_rows], new_cap)
            c_kind, c_tier, c_seq, c_req, c_block, c_key, c_a, c_b, c_flag = L
        while nrun < K:
            if p == n_req:
                more = not final  # the next chunk's first request would be admitted here
                break
            r = p
            n_prompt = r_nprompt[r]
            kv_out = r_kvout[r]
            reserve = 0
            for j in range(nrun):
                s = order[j]
                rq = s_req[s]
                reserve += _cdiv(r_nprompt[rq] + r_kvout[rq], bs) - s_ntab[s]
            # ---- lookup (PrefixCacheManager.lookup)
            k0 = r_koff[r]
            n_full = r_nfull[r]
            n_hit = 0
            for i in range(n_full):
                row = keys[k0 + i] + 1
                if kst[row, K_COPIES] == 0:
                    break
                hits[n_hit] = kst[row, K_HEAD]
                n_hit += 1
            max_hit = (n_prompt - 1) // bs
            div = -1
            if n_hit > max_hit:
                n_hit = max_hit
                reason = LAST_TOKEN
            elif n_hit < n_full:
                ev = kst[keys[k0 + n_hit] + 1, K_EVSEQ]
                if ev != -2:
                    reason = EVICTED_MISS
                    div = ev  # the lookup event carries it; rows show None
                else:
                    reason = NEW_CONTENT
                    # any model seen but the request's own is checked, then any other salt
                    other = -2
                    if _other_cached(models_seen, n_models_seen, r_model[r], np.uint8(1), table, k_parent, k_item,
                                     k_tag, kst, items, k0, np.int64(n_hit), r_kind[r], r_salt[r],
                                     r_model[r]) != -2:
                        reason = MODEL
                    else:
                        other = _other_cached(salts_seen, n_seen, r_salt[r], np.uint8(0), table, k_parent, k_item,
                                              k_tag, kst, items, k0, np.int64(n_hit), r_kind[r], r_salt[r],
                                              r_model[r])
                    if other != -2:
                        reason = SALT
                        div = other
                    elif reason == NEW_CONTENT:
                        start = n_hit * bs
                        best = 0
                        if r_kind[r] == KIND_TOKENS:
                            parent = keys[k0 + n_hit - 1] if n_hit > 0 else -1
                            mine = items[k0 + n_hit]
                            c = kst[parent + 1, K_CHEAD]
                            while c >= 0:
                                if not (parent < 0 and k_salt[c] != r_salt[r]):
                                    m = 0
                                    if k_tag[c] % 2 == KIND_TOKENS:
                                        theirs = k_item[c]
                                        while m < bs and content[mine, m] == content[theirs, m]:
                                            m += 1
                                    if m > best:
                                        best = m
                                c = kst[c + 1, K_CNEXT]
                        div = start + best
            else:
                reason = LAST_TOKEN if n_prompt - n_hit * bs == 1 else PARTIAL
            res_reason[r] = reason
            res_first[r] = n_hit
            res_div[r] = div if (reason == NEW_CONTENT) else -1
            if running_uid[r_uid[r]]:
                scalars[0], scalars[1], scalars[2], scalars[3], scalars[4], scalars[5] = \
                    n_free, n_seen, n_models_seen, n_free_slots, nrun, seq
                return (ERR_DUPLICATE, r, counters, res_cached, res_computed, res_reason, res_first, res_div,
                        res_refused, (c_kind, c_tier, c_seq, c_req, c_block, c_key, c_a, c_b, c_flag), n_rows, seq)
            # ---- allocate
            needed = _cdiv(n_prompt + kv_out + reserve * bs, bs) - n_hit
            hits_free = 0
            for i in range(n_hit):
                if blk[hits[i], B_REF] == 0:
                    hits_free += 1
            available = n_free - hits_free
            if needed > available:
                counters[C_REFUSED] += 1
                if record:
                    c_a[n_rows] = needed
                    c_b[n_rows] = available
                    n_rows = _put(c_kind, c_seq, c_req, c_block, c_key, n_rows, REFUSED, seq, r, -1, -1)
                seq += 1
                if nrun > 0:
                    break
                res_refused[r] = 1
                p += 1
                continue
            midx = r_model[r] + 1
            if not model_seen[midx]:
                model_seen[midx] = 1
                models_seen[n_models_seen] = r_model[r]
                n_models_seen += 1
            sidx = r_salt[r] + 1
            if not salt_seen[sidx]:
                salt_seen[sidx] = 1
                salts_seen[n_seen] = r_salt[r]
                n_seen += 1
            if record:
                n_rows = _put(c_kind, c_seq, c_req, c_block, c_key, n_rows, STARTED, seq, r, -1, -1)
                c_a[n_rows] = n_hit
                c_b[n_rows] = div
                c_flag[n_rows] = reason
                # the lookup's block column is the first missing block
                n_rows = _put(c_kind, c_seq, c_req, c_block, c_key, n_rows, LOOKUP, seq + 1, r, n_hit, -1)
            seq += 2
            s = free_slots[n_free_slots - 1]
            n_free_slots -= 1
            ntab = 0
            for i in range(n_hit):
                bb = hits[i]
                if blk[bb, B_REF] == 0 and blk[bb, B_QPREV] != -1:  # a hit on a free block: off the queue
                    _unlink(bb, blk)
                    n_free -= 1
                blk[bb, B_REF] += 1
                tables[s, ntab] = bb
                ntab += 1
            num_new = _cdiv(n_prompt, bs) - ntab
            n_free -= num_new
            ntab, n_ev = _allocate(num_new, s, np.int64(ntab), tables, blk, kst, record, seq, evicted)
            counters[C_EVICTED] += n_ev
            if record:
                n_rows = _record_evicted(n_ev, r, evicted, seq, n_rows, c_kind, c_seq, c_req, c_block, c_key)
                n_rows = _record_allocated(s, np.int64(0), ntab, r, np.int64(n_hit), tables, blk, seq + n_ev, n_rows,
                                           c_kind, c_seq, c_req, c_block, c_key, c_a)
            seq += n_ev + 2
            running_uid[r_uid[r]] = 1
            s_req[s] = r
            s_ntab[s] = ntab
            s_ntok[s] = n_prompt
            s_app[s] = 0
            s_nh[s] = n_full
            order[nrun] = s
            nrun += 1
            for i in range(n_hit, n_full):
                bb = tables[s, i]
                if _store(bb, keys[k0 + i], blk, kst):
                    counters[C_STORED] += 1
                    if record:
                        n_rows = _put(c_kind, c_seq, c_req, c_block, c_key, n_rows, STORED, seq, r, bb, keys[k0 + i])
                    seq += 1
            counters[C_REQ] += 1
            counters[C_PROMPT] += n_prompt
            counters[C_CACHED] += n_hit * bs
            res_cached[r] = n_hit * bs
            res_computed[r] = n_prompt - n_hit * bs
            p += 1
        if more:
            break
        if nrun == 0:
            continue
        # ---- decode round-robin, quiet steps in one go (as engine.core.replay)
        quiet = 1 << 62
        for j in range(nrun):
            s = order[j]
            rq = s_req[s]
            q = min(r_kvout[rq] - s_app[s], bs - (r_nprompt[rq] + s_app[s]) % bs)
            if q < quiet:
                quiet = q
        quiet -= 1
        for step in range(2):
            for j in range(nrun):
                s = order[j]
                rq = s_req[s]
                if step == 0:
                    n = quiet
                else:
                    n = 1 if s_app[s] < r_kvout[rq] else 0
                if n <= 0:
                    continue
                total = s_ntok[s] + n
                num_new = _cdiv(total, bs) - s_ntab[s]
                if num_new > n_free:
                    scalars[0], scalars[1], scalars[2], scalars[3], scalars[4], scalars[5] = \
                        n_free, n_seen, n_models_seen, n_free_slots, nrun, seq
                    return (ERR_CAPACITY, rq, counters, res_cached, res_computed, res_reason, res_first, res_div,
                            res_refused, (c_kind, c_tier, c_seq, c_req, c_block, c_key, c_a, c_b, c_flag),
                            n_rows, seq)
                first_new = s_ntab[s]
                n_free -= num_new
                ntab, n_ev = _allocate(num_new, s, first_new, tables, blk, kst, record, seq, evicted)
                counters[C_EVICTED] += n_ev
                if record:
                    n_rows = _record_evicted(n_ev, rq, evicted, seq, n_rows, c_kind, c_seq, c_req, c_block, c_key)
                seq += n_ev
                s_ntab[s] = ntab
                if num_new > 0:
                    if record:
                        n_rows = _record_allocated(s, first_new, ntab, rq, np.int64(0), tables, blk, seq, n_rows,
                                                   c_kind, c_seq, c_req, c_block, c_key, c_a)
                    seq += 2
                s_ntok[s] = total
                s_app[s] += n
                if r_kind[rq] == KIND_TOKENS:
                    k0 = r_koff[rq]
                    while s_nh[s] < total // bs:
                        i = s_nh[s]
                        bb = tables[s, i]
                        if _store(bb, keys[k0 + i], blk, kst):
                            counters[C_STORED] += 1
                            if record:
                                n_rows = _put(c_kind, c_seq, c_req, c_block, c_key, n_rows, STORED, seq, rq, bb,
                                              keys[k0 + i])
                            seq += 1
                        s_nh[s] += 1
        # ---- finish in order, keep the rest
        keep = 0
        for j in range(nrun):
            s = order[j]
            rq = s_req[s]
            if s_app[s] < r_kvout[rq]:
                order[keep] = s
                keep += 1
                continue
            running_uid[r_uid[rq]] = 0
            ntab = s_ntab[s]
            n_hashless = 0
            for i in range(ntab - 1, -1, -1):
                bb = tables[s, i]
                blk[bb, B_REF] -= 1
                if blk[bb, B_REF] == 0 and blk[bb, B_KEY] < 0:
                    hashless[n_hashless] = bb
                    n_hashless += 1
            for i in range(n_hashless - 1, -1, -1):  # prepend_n: hashless[0] ends at the head
                _link_after(HEAD, hashless[i], blk)
                n_free += 1
            n_freed = 0
            for i in range(ntab - 1, -1, -1):
                bb = tables[s, i]
                if blk[bb, B_REF] == 0:
                    n_freed += 1
                    if blk[bb, B_KEY] >= 0:  # cached: to the tail, evicted last
                        _link_after(blk[TAIL, B_QPREV], bb, blk)
                        n_free += 1
            counters[C_FINISHED] += 1
            if record:
                for i in range(ntab - 1, -1, -1):
                    c_a[n_rows] = blk[tables[s, i], B_REF]
                    n_rows = _put(c_kind, c_seq, c_req, c_block, c_key, n_rows, REF, seq, rq, tables[s, i], -1)
            seq += 1
            if n_freed > 0:
                if record:
                    for i in range(ntab - 1, -1, -1):
                        bb = tables[s, i]
                        if blk[bb, B_REF] == 0:
                            c_flag[n_rows] = 1 if blk[bb, B_KEY] >= 0 else 0
                            n_rows = _put(c_kind, c_seq, c_req, c_block, c_key, n_rows, FREED, seq, rq, bb, -1)
                seq += 1
            if record:
                c_a[n_rows] = s_ntok[s]
                c_flag[n_rows] = 0
                n_rows = _put(c_kind, c_seq, c_req, c_block, c_key, n_rows, FINISHED, seq, rq, -1, -1)
            seq += 1
            free_slots[n_free_slots] = s
            n_free_slots += 1
        nrun = keep
    scalars[0], scalars[1], scalars[2], scalars[3], scalars[4], scalars[5] = \
        n_free, n_seen, n_models_seen, n_free_slots, nrun, seq
    return (MORE if more else OK, p, counters, res_cached, res_computed, res_reason, res_first, res_div, res_refused,
            (c_kind, c_tier, c_seq, c_req, c_block, c_key, c_a, c_b, c_flag), n_rows, seq)
