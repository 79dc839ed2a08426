"""The columnar remote pool: `RemotePool`'s model of one rank, held in arrays and applied by compiled code.

`ColumnarPool` keeps exactly what `engine.remote.pool.RemotePool` (the reference, kept as
it is) keeps, and answers the same questions with the same methods, but it holds no
Python object per block, per hash or per token id:

- One open-addressing hash table (linear probing, backward-shift deletion) maps a
  (tier, hash) to a slot. Its uint32 entries hold the slot + 1 in the low bits (as few
  as the table's size needs, its last entry says how many), above them how far the entry
  sits past its home (4 bits, fewer past 2**20 entries, saturated at 15: `_disp_bits`)
  and a fingerprint of the hash in the rest (8 bits at 1M slots): a probe passes another
  hash's entry without reading that slot's row, so a hash not held is found absent from
  the table alone, about one cache line, where it read a row of two arrays per entry
  passed (3.1 entries at the table's load), and a deletion shifts the entries after it
  back by their displacements, where it read two rows for each one's home (~3.5 entries
  a deletion). A slot is a row of a few typed arrays: the hash, its parent's
  hash, the tier, where its token ids start in the pool's one growing token array
  (uint16 while every id seen is below 2**16, as SmolLM2's 49,152 are; widened once to
  uint32 on the first larger one, such as Llama 3's 128,256; read back as uint32 either
  way) and how many there are, its store's row in the batch table (each batch that
  stored a block: its seq and time, once for all its blocks; rows no held block names
  are dropped as the table fills), its store order, its tenant (an index into the
  pool's tenant names; a journalled pool keeps the hash, the parent and the tenant with
  the block's store alone, K, PX and RX, `SO` naming it), how often its hash was announced and removed on that tier, its copies in KV
  cache group 0 and in all. Copies in other groups (sliding-window layers, rare) sit in a
  numba dict keyed by (slot, group). Free slots are a list threaded through their token
  start; a free slot keeps its old token range (its start in the batch-row column) and
  count, and a block with as many token ids stored in it (an evicting server's usual
  case) is written over that range, so eviction leaves no garbage in the token array
  (a journalled pool, whose rows read every store's ids, always appends). Token start,
  batch row and order are uint32 (the orders renumbered, in order, before they would
  pass 2**32; the columns widened once to int64 before a token start would, `_widen`,
  which a journalled pool, whose token array only grows, reaches first). At 16 token ids
  a block, a plain pool's slot is 43 bytes (K 16, L 12, C 12, F 3), a journalled pool's 19
  (L 4, C 8, F 3, its store's number SO 4: the store, 9 more, keeps its hash in K, where
  the slot's probes read it through SO, and its parent's width in JS; its parent, token
  count and tenant are kept once for many stores, PX and RX), beside 32 of token ids and
  5.7 of the table (at a load
  of 0.7), with the arrays' room to grow (an eighth) on top; F has a fourth byte once a raw
  medium name came.
- An 8-byte hash (vLLM's and SGLang's integer hashes) is its uint64 value; any other
  hash (a 32-byte digest) gets a surrogate number from a dict, once per distinct digest.
- `removed_at` and `departed` (the last `max_removed` hashes that left a tier) are
  insertion-ordered maps over one set of entries (`_RemovalMaps`): one table, an
  entry's key, values and FIFO positions in one 32-byte row, and a FIFO for each map, a
  ring whose head moves on at the bound (no key moved to make room). A hash that leaves a tier is
  one probe and at most one new entry for both maps (in vLLM's streams they hold the
  same keys in the same order), and an entry is freed once both maps dropped it. A table
  entry carries 31 bits of its key's hash beside the entry's index, so a probe passes
  other keys and a deletion shifts entries back without reading their rows (the maps
  hold 200,000 keys: each row read was a cache miss).
- `apply(batch)` takes a `fastwire.ColumnarBatch` (`fastwire.decode_columns`: the
  frame's hashes, token ids and event fields as arrays) or a `VllmBatch`. One compiled
  loop applies every run of common events (stores and removals with block hashes, a
  parent, token ids, a block size and a medium, whatever its name: a connector's own,
  `DISK` or `cpu`, is a per-pool code, kept per slot (F_RAW) as the name the reference
  keeps in `details`); an event naming anything more (extra keys, a salt, a KV cache
  group, a session, ownership or locality, a clear) is handled by Python around the
  same compiled per-block functions.

- `apply_many(batches)` applies batches in order as `apply` does each, but every run of
  batches made only of common events in one compiled call (`_run_frames`): what an
  attachment holds between two idle moments of its stream costs one call, not one per
  frame. Before each frame's events, one pass prefetches every table entry and slot
  row they will probe (`_pretouch`, with `_prefetch`, LLVM's prefetch): the CPU fetches
  them side by side, where the probes themselves wait for one another. The compiled
  loops release the GIL while they run (`nogil`), so the many subscriber threads of a
  fleet leave the consumer's event loop its turn; a pool is still applied by one thread
  at a time (the attachment's lock).
  They are compiled without numba's reference counting (`_nrt=False`): with it, every
  call of a helper took and dropped a reference (an atomic add and subtract) on each of
  its ~40 array arguments, about half of the loop's time. The per-block helpers (a table
  probe or deletion, a map's operations, a slot freed, a journal row) are inlined into
  their callers (`inline="always"`): a call still passed ~50 words of array arguments on
  the stack, and the maps' calls nested four deep. All but one: a map's oldest entry
  popped (`_om_pop_oldest`, only past `max_removed`) stays a call, or each inlined site
  of the maps' operations carries its loops (a cold `warm_up()` 69 -> 49 s of CPU with
  eight sites, the apply unchanged). Python calls them through
  `*_py` entries that keep it (unboxing the group dict needs it), once per call.

Reading (`tiers`, `find`, `held`, `details_of`, ...) builds the same plain values as the
reference, from the arrays, on demand. Emitting Cachescope events per block is what the
columnar pool does NOT do; the journal says the same in arrays instead.

The journal (`ColumnarPool(..., journal=True)`): the compiled loop appends one row per
block operation, in the order the reference emits its events: a stored block (each block
of a BlockStored that is not vLLM's reuse report, a copy of a held hash too: the
reference's `BlockStored`), a removed hash (each hash a BlockRemoved names, held or not:
its `BlockEvicted`) and a clear (one row per AllBlocksCleared or `reset`: its
`CacheReset`). `take_journal()` gives the rows added since the last call, and
`journal_since(row)` those from a row on, as a `JournalRows` of numpy views:

    j = pool.take_journal()
    j.op, j.tier, j.slot, j.seq      # OP_STORED / OP_REMOVED / OP_CLEARED, tier code, slot, vLLM batch
    j.key, j.width                   # the hash: pool.hash_of(j.key[r], j.width[r]) -> bytes
    j.store                          # a store's row in the per-store arrays below (kept for good);
                                     # a removal's: the store that made the slot it took (-1: none);
                                     # a clear's: how many copies it cleared
    j.store_key                      # per store, whole: its hash (a stored row's key, and a
                                     # removal's that took its block: j.store_key[j.store[r]])
    j.parent, j.parent_width, j.token_start, j.token_count, j.tenant   # per store, whole
    j.token_ids(j.store[r])          # that store's token ids (a view of the pool's token array)

The per-store arrays are 9 bytes a store: its hash (K, uint64) and its parent's width (JS,
uint8). Its parent is the store before's hash, or for its event's first a row of PX
(`j.parent`, a `StoreParents`); its token count, tenant and token start are its run's of
RX, the stores as runs of one count and tenant (`j.token_count`, `j.tenant`,
`j.token_start`, `StoreRuns`: a journalled pool appends every store's token ids in store
order, so a store's start is its run's first's and the counts of the stores before it in
its run). Those read as fields would be read: an int for an int, an int64 array for an
array of stores or a slice, and `np.asarray` whole; the rows are int64 columns of J.

Row numbers are global: `release_journal(row)` says a reader copied what it reads of the
rows before `row`, and the pool drops them once enough are released (into a new array:
rows given out before keep the old one); `journal_base` is the first row held,
`num_journal_rows` how many there were in all, `S[S_JROWS]` how many J holds (its local
index). Released or not, the per-store arrays and token ids are kept whole.
A store row keeps its hash, parent hash, token ids and tenant after its slot is freed and
reused, so a view scrubbed back still shows a removed block. With the journal on, the
pool's token array only grows (a journalled pool's token ids are its log's: each stored
once); a tier code names `j.tier_names[code]`, -1 a clear of every tier. Not thread-safe, as
the reference. `tests/test_colpool.py` proves both give the same answers on every
recorded fixture and on corrupted frames.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import repeat
from operator import attrgetter, is_, is_not
from typing import Any, Iterator

import numpy as np
from numba import njit, types
from numba.typed import Dict as NumbaDict

from engine.core.growth import unheld
from engine.core.live_journal import prefetch_intrinsic
from engine.remote import fastwire
from engine.remote.fastwire import (
    KIND_CLEARED, KIND_REMOVED, KIND_STORED, M_DATA0, M_KEYS, M_MOST_HASHES, M_MOST_ID, M_MOST_TOKENS, M_REMOVALS,
    M_ROW0, M_ROWS, M_TOKENS, R_HASH0, R_KIND, R_MEDIUM, R_NHASH, R_NTOK, R_PARENT, R_RARE, R_SIZE, R_TOK0, R_WIDTH,
    ColumnarBatch, DecodedRun,
)
from engine.remote.pool import GroupSpec, LifetimeStats, salt_of
from engine.remote.tiers import CPU, GPU, REMOTE, STORAGE, tier_of_medium, tier_order
from engine.remote.wire import MEDIUM_DEFAULT, VllmBatch, VllmEvent

# ---- layout ---------------------------------------------------------------------------

MAX_TIERS = 256  # tier codes, module-wide; GPU, CPU, STORAGE, REMOTE first
MAX_GROUP = (1 << 20) - 1  # KV cache groups beyond this share its count (a server has a few)
# slot columns
K_KEY, K_PARENT = 0, 1                                            # uint64 (a journalled pool: K_KEY only)
# L (uint32; int64 once widened): where the slot's token ids start (a free slot: the next
# free slot + 1, 0 none), its store's row in the batch table, its store order. A journalled
# pool's L has one column, L_JBID: a held slot's batch row, a free slot's next free slot + 1
# (its token ids start where its store's do, `StoreRuns`, and its store row, SO,
# orders the held slots as the store order would: both grow with each new slot's store)
L_TOK, L_BID, L_ORDER = 0, 1, 2
L_JBID = 0
# C: uint16 while every count, token count and tenant fits (`_widen_counts` makes it uint32
# once before one would not: S_CMAX bounds the counts); C_TENANT is tenant + 1, 0 none. A
# journalled pool's C has the first four columns alone: its slot's store (SO, its run in RX) keeps
# the token count and the tenant (F_PW_NOTOK says a slot has no token ids), 2 bytes a slot less
C_ANN, C_REM, C_C0, C_TOT, C_NTOK, C_TENANT = 0, 1, 2, 3, 4, 5
NUM_C_JOURNAL = C_NTOK
C_LIMITS = {np.dtype(np.uint16).char: 0xFFFF, np.dtype(np.uint32).char: 0xFFFFFFFF}  # S_CLIMIT by C's type
F_W, F_TIER, F_PW, F_RAW = 0, 1, 2, 3                             # uint8 (width code; tier + 1, 0 = free)
# F_PW: the parent's width code, and F_PW_TENANT set when the slot's store named a tenant (its
# C_TENANT, or its store's run in a journalled pool, is not 0): a store naming the slot as its
# parent reads the tenant only then, from a row it would not read otherwise (dependent cache
# misses in a journalled pool, SO then RX: 8 ms of 200K recorded events, none with a tenant)
F_PW_TENANT = 0x80
# ... and, in a journalled pool, F_PW_NOTOK set when the slot's store gave no token ids (its
# store row's count is 0): what a slot freed counts off its tier's hashes without token ids
F_PW_NOTOK = 0x40
F_PW_FLAGS = F_PW_TENANT | F_PW_NOTOK
# F_RAW: the raw medium name the slot's latest store gave when it is not the tier's own
# (`DISK` for STORAGE, `cpu` for CPU): its code in the pool's raw names, 0 none, RAW_IN_DETAILS
# (past MAX_RAW names) the name is in the pool's details dict, as the reference keeps it.
# F has this column only once the pool has seen such a name (`_add_raw_column`)
RAW_IN_DETAILS = 255
W_U64, W_WIDE = 1, 2  # width codes: an 8-byte hash, a surrogate of any other
# pool scalars (int64)
S_LIVE, S_FREE, S_ORDER, S_TOKUSED, S_STORED, S_REMOVED, S_UNKNOWN, S_RESTORED, S_REPORTED, S_LIFE_N, \
    S_BLOCK_SIZE, S_HITS, S_TIERSEQ, S_MAXREM, S_TOKLIVE, S_MEDIA_SEEN, S_JON, S_JROWS, S_JSTORES, \
    S_NTIERS, S_BID, S_TENANTED, S_CMAX, S_CLIMIT, S_NPX, S_NRX = range(26)
NUM_S = 26  # S_FREE: the first free slot + 1 (0: none); S_BID: the batch row being applied;
# S_NPX, S_NRX: the rows of PX and RX (a journalled pool's explicit parents, its stores' runs);
# S_TENANTED: 1 once a block was stored with a tenant (a slot's F_PW_TENANT set), never reset;
# S_CMAX: the most announcements a slot has had (never lowered). A slot's C_TOT, C_C0 and
# C_REM are never more than its C_ANN (each copy and each removal of one is announced first),
# and an event adds at most one to C_ANN per hash it names; S_CLIMIT: the most C holds. A
# batch's hashes that could take S_CMAX past it widen C first (`_count_room`); the compiled
# loops over many frames (`_run_frames`, `_run_decoded`) stop before such a frame, for C to be widened
# the journal (`ColumnarPool(journal=True)`): rows (int64, dropped once released) and, per
# stored block, its store row (kept for good): its hash in K, its parent's width in JS (a
# byte), its token count, tenant and token start in its run of RX, its parent in K or PX;
# L and SO widened once to int64 before a store row, slot or batch row would pass 2**32 - 1
# (`_widen`). Each store's ids follow the one before's in the token array
J_OP, J_TIER, J_SLOT, J_SEQ, J_STORE, J_KEY, J_WIDTH = range(7)
NUM_J = 7
# The arrays a journal's rows were held in, kept to hold them again (`ColumnarPool._journal_array`):
# at most this many, of at most this many bytes each (a burst's larger array goes)
JOURNAL_ROOMS = 2
JOURNAL_ROOM_BYTES = 16 << 20
SLACK_ROWS = 1024  # the rows of room a growth keeps past what it needs
# RX: the stores as runs of one token count and tenant (int64 rows: the run's first store,
# the count, the tenant + 1, the first store's token start; in store order, S_NRX of them):
# a store's count, tenant and token start are its run's (`StoreRuns`). An event's blocks
# make at most three runs (full blocks, a part, none: a tenant is one an event) and a stream
# of full blocks with no tenant one, where they were 4 bytes a store
RX_FIRST, RX_NTOK, RX_TENANT, RX_TOK0 = range(4)
# a store's parent is not in its row: a store that is not its event's first has the block
# before it in its event as its parent (the key of the store before, K's row), and an
# event's first store that names a parent has a row of PX (int64: the store, the parent's
# key's bits; in store order, S_NPX of them): `StoreParents`
PX_STORE, PX_KEY = 0, 1
OP_STORED, OP_REMOVED, OP_CLEARED = 0, 1, 2
# per tier (int64): present, creation order, hashes, copies beyond one per hash, hashes
# without token ids, when it first held an extra copy
T_PRESENT, T_BORN, T_HASHES, T_EXTRA, T_NOTOK, T_EXTRA_BORN = range(6)
NUM_T = 6
# per raw medium name (int64, row = its code in the pool's raw names: 0 `GPU`, 1 `CPU`, then
# the others in order of appearance): its tier code, the code a slot keeps for it (F_RAW:
# 0 for the tier's own name), stores counted since the last sync; RM_ORDER's first
# S[S_MEDIA_SEEN] rows list the codes counted in the order they were first counted
RM_TIER, RM_SLOT, RM_COUNT, RM_ORDER = range(4)
MAX_RAW = RAW_IN_DETAILS  # codes 0..254
RAW_ROW = 1 << 16  # R_MEDIUM of a common event naming raw name c (>= 2) on tier t: RAW_ROW | c << 8 | t


def _medium_row(t: int, c: int) -> int:
    return RAW_ROW | c << 8 | t
# the removal maps (`_RemovalMaps`): an entry is a 32-byte row, read as uint64 (the key and
# removed_at's batch seq, as int64) and as int32 (departed's announced and removed counts, as
# uint32, then its FIFO position in each map, -1: not in it); the entries' scalars; each
# map's scalars
K_KEY, K_SEQ = range(2)
V_ANN, V_REM, V_RPOS, V_DPOS = range(4, 8)
NUM_K = 4
E_LIVE, E_FREE = range(2)
O_LIVE, O_HEAD, O_TAIL = range(3)
POS_LIMIT = 1 << 31  # a FIFO position (int32 in an entry's row) stays below it

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_S33 = np.uint64(33)
_S32 = np.uint64(32)
_S56 = np.uint64(56)

_EMPTY_U8 = np.zeros(0, np.uint8)
_EMPTY_I64 = np.zeros(0, np.int64)
# a frame's attributes, read by `map` over a run of frames (`ColumnarPool._apply_run`)
_SEQ, _TS, _ROWS, _DATA = attrgetter("seq"), attrgetter("ts"), attrgetter("rows"), attrgetter("data")
_NUM_KEYS, _NUM_TOKENS, _IS_NOT = attrgetter("num_keys"), attrgetter("num_tokens"), is_not
_RUN, _RUN_AT, _EVENTS = attrgetter("run"), attrgetter("run_at"), attrgetter("events")
_TIER_CODES: dict[str, int] = {GPU: 0, CPU: 1, STORAGE: 2, REMOTE: 3}
_TIER_NAMES: list[str] = [GPU, CPU, STORAGE, REMOTE]


def tier_code(tier: str) -> int:
    """The code of a normalized tier (GPU 0, CPU 1, STORAGE 2, REMOTE 3, others in order
    of appearance, at most MAX_TIERS; past that, one more tier name cannot be held)."""
    code = _TIER_CODES.get(tier)
    if code is None:
        if len(_TIER_NAMES) >= MAX_TIERS:
            raise ValueError(f"more than {MAX_TIERS} tiers")
        code = _TIER_CODES[tier] = len(_TIER_NAMES)
        _TIER_NAMES.append(tier)
    return code


# ---- the compiled part ----------------------------------------------------------------

# Ask the CPU for the cache line of arr[i] (of row i, for a 2-D array) and go on: no value,
# no wait, nothing written (i must be a valid index: it is not checked). The placer's and
# the overlay's passes ask the same way.
_prefetch = prefetch_intrinsic()


@njit(cache=True, inline="always")
def _mix(k, w, t):  # pragma: no cover - compiled
    x = k ^ (np.uint64(w) << _S56) ^ (np.uint64(t + 1) * _GOLD)
    x ^= x >> _S33
    x *= _M1
    x ^= x >> _S33
    x *= _M2
    x ^= x >> _S33
    return x


@njit(cache=True, inline="always")
def _home(x, size):  # pragma: no cover - compiled
    """A table position from a mixed hash: its high 32 bits scaled to the table's size
    (any size, not only a power of two, so the table can sit at a load near 0.7)."""
    return np.int64(((x >> _S32) * np.uint64(size)) >> _S32)


@njit(cache=True, inline="always")
def _slot_bits(tab):  # pragma: no cover - compiled
    """The table's slot bits (its last entry): an entry is
    (fingerprint << (bits + `_disp_bits`)) | (displacement << bits) | (slot + 1)."""
    return np.int64(tab[len(tab) - 1])


@njit(cache=True, inline="always")
def _disp_bits(sb):  # pragma: no cover - compiled
    """Bits of an entry's displacement (how far past its home it sits, up to 2**bits - 2;
    2**bits - 1: that far or more) for a table of `sb` slot bits: 4 while 8 bits of
    fingerprint remain beside them, fewer above 2**20 entries, none from 2**24 (then a
    deletion reads the rows, as with a saturated displacement)."""
    return np.int64(max(0, min(4, 24 - sb)))


@njit(cache=True, inline="always")
def _fingerprint(x, sb):  # pragma: no cover - compiled
    """The low 32 - sb - `_disp_bits(sb)` bits of a mixed hash (its high 32 bits place it: `_home`)."""
    return np.int64(x & ((np.uint64(1) << np.uint64(32 - sb - _disp_bits(sb))) - np.uint64(1)))


@njit(cache=True, _nrt=False, inline="always")
def _slot_key(K, SO, s):  # pragma: no cover - compiled
    """Held slot s's hash (its key): K's row s, or in a journalled pool (whose K has a row
    per store, `SO` naming the slot's) its store's row."""
    if len(SO):
        return K[SO[s], K_KEY]
    return K[s, K_KEY]


@njit(cache=True, _nrt=False, inline="always")
def _find(tab, K, SO, F, k, w, t):  # pragma: no cover - compiled
    """The slot holding hash (k, w) on tier t, or -1. An entry whose fingerprint differs is
    passed over without reading its slot's row: an absent hash reads the table alone."""
    return _find_x(tab, K, SO, F, k, w, t, _mix(k, w, t))


@njit(cache=True, _nrt=False, inline="always")
def _find_or_hole(tab, K, SO, F, k, w, t, x):  # pragma: no cover - compiled
    """The slot holding hash (k, w) on tier t, its mix x = `_mix(k, w, t)` given, and where
    the hash would go when absent: (slot, -1) when held, else (-1, the table entry) that
    `_tab_put` fills (the first empty entry from its home: linear probing inserts there),
    so a store of a new hash probes the table once, not twice."""
    size = len(tab) - 1
    sb = _slot_bits(tab)
    fb = sb + _disp_bits(sb)
    i = _home(x, size)
    want = _fingerprint(x, sb)
    smask = (np.int64(1) << sb) - 1
    tt = t + 1
    while True:
        e = np.int64(tab[i])
        if e == 0:
            return np.int64(-1), i
        if (e >> fb) == want:
            s = (e & smask) - 1
            if _slot_key(K, SO, s) == k and F[s, 0] == w and F[s, 1] == tt:
                return s, np.int64(-1)
        i += 1
        if i == size:
            i = 0


@njit(cache=True, _nrt=False, inline="always")
def _bid_col(L):  # pragma: no cover - compiled
    """L's batch-row column: L_BID, or L_JBID in a journalled pool's one-column L."""
    return L_BID if L.shape[1] > L_BID else L_JBID


@njit(cache=True, _nrt=False, inline="always")
def _find_x(tab, K, SO, F, k, w, t, x):  # pragma: no cover - compiled
    """`_find` given x = `_mix(k, w, t)` (a caller that needs x again computes it once)."""
    return _find_or_hole(tab, K, SO, F, k, w, t, x)[0]


@njit(cache=True, _nrt=False, inline="always")
def _touch_slot(tab, K, SO, L, C, F, x):  # pragma: no cover - compiled
    """Prefetch the row (K, L, C, F) of the first slot whose table entry, from the home of
    mix x, has x's fingerprint (the slot `_find_x` reads first; another hash's only on a
    fingerprint collision), reading the table alone. Nothing when the hash is absent."""
    size = len(tab) - 1
    sb = _slot_bits(tab)
    fb = sb + _disp_bits(sb)
    i = _home(x, size)
    want = _fingerprint(x, sb)
    while True:
        e = np.int64(tab[i])
        if e == 0:
            return
        if (e >> fb) == want:
            s = (e & ((np.int64(1) << sb) - 1)) - 1
            if len(SO):  # (its key is in its store's row of K: SO first)
                _prefetch(SO, s)
            else:
                _prefetch(K, s)
            _prefetch(L, s)
            _prefetch(C, s)
            _prefetch(F, s)
            return
        i += 1
        if i == size:
            i = 0


@njit(cache=True, inline="always")
def _entry(x, sb, d, s):  # pragma: no cover - compiled
    """The table entry of slot s, its hash mixed to x, `d` entries past its home."""
    db = _disp_bits(sb)
    return np.uint32((_fingerprint(x, sb) << (sb + db)) | (min(d, (np.int64(1) << db) - 1) << sb) | (s + 1))


@njit(cache=True, inline="always")
def _tab_put(tab, i, x, s):  # pragma: no cover - compiled
    """Slot s, its hash mixed to x, into empty table entry i (`_find_or_hole`'s)."""
    size = len(tab) - 1
    d = i - _home(x, size)
    if d < 0:
        d += size
    tab[i] = _entry(x, _slot_bits(tab), d, s)


@njit(cache=True, _nrt=False)
def _tab_insert(tab, K, SO, F, s):  # pragma: no cover - compiled
    size = len(tab) - 1
    sb = _slot_bits(tab)
    x = _mix(_slot_key(K, SO, s), F[s, 0], np.int64(F[s, 1]) - 1)
    home = _home(x, size)
    i = home
    while tab[i] != 0:
        i += 1
        if i == size:
            i = 0
    tab[i] = _entry(x, sb, i - home if i >= home else i - home + size, s)


@njit(cache=True, _nrt=False, inline="always")
def _tab_delete(tab, K, SO, F, s, x):  # pragma: no cover - compiled
    """Take slot s, its hash mixed to x, out of the table (backward-shift deletion: no
    tombstones). An entry after it moves back when its displacement reaches the hole; the
    displacement is read from the entry (a slot's row only when it is saturated: the
    rows of the ~3.5 entries a deletion passes were read for their homes before)."""
    size = len(tab) - 1
    sb = _slot_bits(tab)
    smask = (np.int64(1) << sb) - 1
    dmax = (np.int64(1) << _disp_bits(sb)) - 1
    i = _home(x, size)
    while (np.int64(tab[i]) & smask) != s + 1:
        i += 1
        if i == size:
            i = 0
    tab[i] = 0
    j = i
    while True:
        j += 1
        if j == size:
            j = 0
        e = np.int64(tab[j])
        if e == 0:
            return
        d = (e >> sb) & dmax
        if d == dmax:  # that far or more (every entry, with no displacement bits): from its row
            x = (e & smask) - 1
            d = j - _home(_mix(_slot_key(K, SO, x), F[x, 0], np.int64(F[x, 1]) - 1), size)
            if d < 0:
                d += size
        gap = j - i if j > i else j - i + size
        if d >= gap:  # its home is at or before the hole: it moves there, gap entries nearer
            tab[i] = np.uint32((e & ~(dmax << sb)) | (min(d - gap, dmax) << sb))
            tab[j] = 0
            i = j


@njit(cache=True, nogil=True)
def _rehash(tab, K, SO, F, n):  # pragma: no cover - compiled
    tab[:len(tab) - 1] = 0
    for s in range(n):
        if F[s, 1]:
            _tab_insert(tab, K, SO, F, s)


# the removal maps (removed_at, departed): one set of entries for both, one table. An entry
# is a key (hash, width), the maps' values (removed_at's batch seq, departed's announced and
# removed counts) and its position in each map's FIFO (-1: not in that map): a row of 32
# bytes and the width's byte (48 bytes and the key's 8 apart were 57: their growth and their
# cache lines). A table entry is (31 bits of the key's mixed hash << 32) | entry: a probe
# passes another key's entry, and a deletion shifts entries back, without reading a row
# (only the deleted entry's key, hashed again for its home). A key that leaves a tier
# goes into both maps at once (one probe, one entry) and an entry is freed when it has left
# both: in vLLM's streams the two maps hold the same keys in the same order.

_OM_BITS = np.uint64(0x7FFFFFFF)


@njit(cache=True, inline="always")
def _om_hash(k, w):  # pragma: no cover - compiled
    return np.int64(_mix(k, w, -1) & _OM_BITS)


@njit(cache=True, _nrt=False, inline="always")
def _om_find(otab, OK, OW, k, w, h):  # pragma: no cover - compiled
    """The entry of (k, w), whose `_om_hash` is h, or -1."""
    mask = len(otab) - 1
    i = h & mask
    while True:
        x = otab[i]
        if x < 0:
            return -1
        if (x >> 32) == h:
            e = x & 0xFFFFFFFF
            if OK[e, K_KEY] == k and OW[e] == w:
                return e
        i = (i + 1) & mask


@njit(cache=True, _nrt=False, inline="always")
def _om_tab_delete(otab, OK, OW, e):  # pragma: no cover - compiled
    mask = len(otab) - 1
    i = _om_hash(OK[e, K_KEY], OW[e]) & mask
    while (otab[i] & 0xFFFFFFFF) != e:
        i = (i + 1) & mask
    otab[i] = -1
    j = i
    while True:
        j = (j + 1) & mask
        x = otab[j]
        if x < 0:
            return
        home = (x >> 32) & mask
        if (j > i and (home <= i or home > j)) or (j < i and home <= i and home > j):
            otab[i] = x
            otab[j] = -1
            i = j


@njit(cache=True, _nrt=False, inline="always")
def _om_leave(otab, OK, OW, OV, ofree, ES, OS, e, pos, other):  # pragma: no cover - compiled
    """Entry e leaves the map whose FIFO positions are OV's column `pos` (OS its scalars); it
    is freed when it is not in the other map (column `other`) either."""
    OV[e, pos] = -1
    OS[O_LIVE] -= 1
    if OV[e, other] < 0:
        _om_tab_delete(otab, OK, OW, e)
        OW[e] = 0
        ofree[ES[E_FREE]] = e
        ES[E_FREE] += 1
        ES[E_LIVE] -= 1


@njit(cache=True, _nrt=False)  # a call: see the module docstring (compile time)
def _om_pop_oldest(otab, OK, OW, OV, ofree, ES, ofifo, OS, pos, other):  # pragma: no cover - compiled
    """The oldest key of one map leaves it (OrderedDict.popitem(last=False))."""
    while OS[O_HEAD] < OS[O_TAIL]:
        q = OS[O_HEAD]
        e = ofifo[q & (len(ofifo) - 1)]
        OS[O_HEAD] += 1
        if e >= 0 and OV[e, pos] == q:  # (else a key that left this map since: passed over)
            _om_leave(otab, OK, OW, OV, ofree, ES, OS, e, pos, other)
            return


@njit(cache=True, _nrt=False, inline="always")
def _om_join(OV, ofifo, OS, e, pos):  # pragma: no cover - compiled
    """Entry e into one map, last, unless it is in it; whether it came in."""
    if OV[e, pos] >= 0:
        return False
    OV[e, pos] = OS[O_TAIL]
    ofifo[OS[O_TAIL] & (len(ofifo) - 1)] = e
    OS[O_TAIL] += 1
    OS[O_LIVE] += 1
    return True


@njit(cache=True, _nrt=False, inline="always")
def _om_note(otab, OK, OW, OV, ofree, ES, ra_fifo, ra_os, dp_fifo, dp_os, k, w, h, seq, a, r, to_ra, maxn,
             trim_ra):  # pragma: no cover - compiled
    """A key (k, w), whose `_om_hash` is h (a caller hashes it once), left a tier: `a` announced
    and `r` removed added to its `departed` counts and, with `to_ra`, `removed_at` set to
    batch `seq`; a key new to a map goes last in it. Then each map drops its oldest keys
    while it holds more than `maxn` (`removed_at` only with `trim_ra`: the reference's fast
    path trims it once, at the end of a removal)."""
    e = _om_find(otab, OK, OW, k, w, h)
    if e < 0:
        ES[E_FREE] -= 1
        e = ofree[ES[E_FREE]]
        OK[e, K_KEY] = k
        OW[e] = w
        OV[e, V_RPOS] = -1
        OV[e, V_DPOS] = -1
        ES[E_LIVE] += 1
        mask = len(otab) - 1
        i = h & mask
        while otab[i] >= 0:
            i = (i + 1) & mask
        otab[i] = (h << 32) | e
    if to_ra:
        _om_join(OV, ra_fifo, ra_os, e, V_RPOS)
        OK[e, K_SEQ] = np.uint64(seq)
    if _om_join(OV, dp_fifo, dp_os, e, V_DPOS):
        OV[e, V_ANN] = a
        OV[e, V_REM] = r
    else:
        OV[e, V_ANN] += a
        OV[e, V_REM] += r
    if to_ra and trim_ra:
        while ra_os[O_LIVE] > maxn:
            _om_pop_oldest(otab, OK, OW, OV, ofree, ES, ra_fifo, ra_os, V_RPOS, V_DPOS)
    while dp_os[O_LIVE] > maxn:
        _om_pop_oldest(otab, OK, OW, OV, ofree, ES, dp_fifo, dp_os, V_DPOS, V_RPOS)


@njit(cache=True, _nrt=False, inline="always")
def _om_unremove(otab, OK, OW, OV, ofree, ES, ra_os, k, w, h):  # pragma: no cover - compiled
    """A key stored again leaves `removed_at` (its `departed` counts stay)."""
    if ra_os[O_LIVE] == 0:
        return
    e = _om_find(otab, OK, OW, k, w, h)
    if e >= 0 and OV[e, V_RPOS] >= 0:
        _om_leave(otab, OK, OW, OV, ofree, ES, ra_os, e, V_RPOS, V_DPOS)


@njit(cache=True, _nrt=False, inline="always")
def _om_trim(otab, OK, OW, OV, ofree, ES, ra_fifo, ra_os, maxn):  # pragma: no cover - compiled
    """`removed_at` drops its oldest keys while it holds more than `maxn`."""
    while ra_os[O_LIVE] > maxn:
        _om_pop_oldest(otab, OK, OW, OV, ofree, ES, ra_fifo, ra_os, V_RPOS, V_DPOS)


# the blocks


@njit(cache=True, _nrt=True)  # NRT on: called from functions without it (numba would inherit their off)
def _group_count(G, s, g):  # pragma: no cover - compiled
    key = np.int64(s) * (MAX_GROUP + 1) + g
    if key in G:
        return G[key]
    return np.int64(0)


@njit(cache=True, _nrt=False, no_cpython_wrapper=True)
def _copies_in(C, G, s, g):  # pragma: no cover - compiled
    if g == 0:
        return np.int64(C[s, C_C0])
    if C[s, C_TOT] == 1 and C[s, C_C0] == 1:
        return np.int64(0)
    return _group_count(G, s, g)


@njit(cache=True, _nrt=True)  # NRT on: called from functions without it (numba would inherit their off)
def _set_group(G, s, g, n):  # pragma: no cover - compiled
    key = np.int64(s) * (MAX_GROUP + 1) + g
    if n:
        G[key] = n
    elif key in G:
        del G[key]


@njit(cache=True, _nrt=True)  # NRT on: called from functions without it (numba would inherit their off)
def _first_group(C, G, s):  # pragma: no cover - compiled
    """The first KV cache group holding a copy of slot s (the reference's `group=None`)."""
    if C[s, C_C0]:
        return np.int64(0)
    best = np.int64(-1)
    base = np.int64(s) * (MAX_GROUP + 1)
    for key in G.keys():
        if base < key <= base + MAX_GROUP and G[key] > 0:
            g = key - base
            if best < 0 or g < best:
                best = g
    return best


@njit(cache=True, _nrt=True)  # NRT on: called from functions without it (numba would inherit their off)
def _drop_groups(G, s):  # pragma: no cover - compiled
    if len(G):
        base = np.int64(s) * (MAX_GROUP + 1)
        drop = [k for k in G.keys() if base < k <= base + MAX_GROUP]
        for k in drop:
            del G[k]


@njit(cache=True, _nrt=False, no_cpython_wrapper=True, inline="always")
def _free_slot(tab, K, SO, L, C, F, T, G, S, TI, s, x):  # pragma: no cover - compiled
    """Slot s, its hash mixed to x, leaves the pool."""
    t = np.int64(F[s, F_TIER]) - 1
    if not (C[s, C_TOT] == 1 and C[s, C_C0] == 1):
        _drop_groups(G, s)
    _tab_delete(tab, K, SO, F, s, x)
    TI[t, T_HASHES] -= 1
    if S[S_JON]:  # (a journalled pool keeps no token-live count: its token array only grows)
        if F[s, F_PW] & F_PW_NOTOK:
            TI[t, T_NOTOK] -= 1
    else:
        if C[s, C_NTOK] == 0:
            TI[t, T_NOTOK] -= 1
        S[S_TOKLIVE] -= C[s, C_NTOK]
    F[s, F_TIER] = 0
    if L.shape[1] > L_BID:  # a free slot keeps its token range (and C_NTOK) for its next store
        L[s, L_BID] = L[s, L_TOK]
    L[s, L_TOK] = S[S_FREE]  # (L_JBID in a journalled pool's L: the same column)
    S[S_FREE] = s + 1
    S[S_LIVE] -= 1


@njit(cache=True, _nrt=False, inline="always")
def _journal_row(J, S, op, t, s, seq, store, k, w):  # pragma: no cover - compiled
    r = S[S_JROWS]
    J[r, J_OP] = op
    J[r, J_TIER] = t
    J[r, J_SLOT] = s
    J[r, J_SEQ] = seq
    J[r, J_STORE] = store
    J[r, J_KEY] = np.int64(k)  # the uint64's bits (read back through a uint64 view)
    J[r, J_WIDTH] = w
    S[S_JROWS] = r + 1


@njit(cache=True, _nrt=False, inline="always")
def _journal_store(J, JS, K, PX, RX, S, t, s, seq, k, w, has_prev, chained, pk, pw, ntok,
                   tenant):  # pragma: no cover - compiled
    # (the store's `ntok` token ids were just appended at the token array's end, S_TOKUSED)
    o = S[S_JSTORES]
    _journal_row(J, S, OP_STORED, t, s, seq, o, k, w)
    K[o, K_KEY] = k
    if has_prev:
        # its parent: the store before's key when `chained` (its event's block before, whose
        # store row is o - 1), else a row of PX (`StoreParents`)
        if not chained:
            x = S[S_NPX]
            PX[x, PX_STORE] = o
            PX[x, PX_KEY] = np.int64(pk)  # the uint64's bits
            S[S_NPX] = x + 1
        JS[o] = pw
    else:
        JS[o] = 0
    x = S[S_NRX]
    if x == 0 or RX[x - 1, RX_NTOK] != ntok or RX[x - 1, RX_TENANT] != tenant + 1:  # a run of its own
        RX[x, RX_FIRST] = o
        RX[x, RX_NTOK] = ntok
        RX[x, RX_TENANT] = tenant + 1
        RX[x, RX_TOK0] = S[S_TOKUSED] - ntok
        S[S_NRX] = x + 1
    S[S_JSTORES] = o + 1


@njit(cache=True, _nrt=False, inline="always")
def _run_of(RX, n, o):  # pragma: no cover - compiled
    """The row of RX's first `n` (runs of stores) that store `o` is in."""
    lo, hi = np.int64(0), n  # the last run whose first store is at most o
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if RX[mid, RX_FIRST] <= o:
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=True, _nrt=False, inline="always")
def _copy_ids(tok, u, ftok, f, n):  # pragma: no cover - compiled
    """n token ids from ftok[f:] to tok[u:] by unsigned indices: numba adds no wraparound
    for a negative index to them, so the loop is loads and stores (with it, a gather and
    a word extracted per id)."""
    d, s = np.uint64(u), np.uint64(f)
    for j in range(np.uint64(n)):
        tok[d + j] = ftok[s + j]


@njit(cache=True, _nrt=False, inline="always")
def _announce(C, S, s):  # pragma: no cover - compiled
    """Slot s announced once more (a copy or vLLM's reuse report), S_CMAX kept the most."""
    v = np.int64(C[s, C_ANN]) + 1
    C[s, C_ANN] = v
    if v > S[S_CMAX]:
        S[S_CMAX] = v


@njit(cache=True, nogil=True, _nrt=False, no_cpython_wrapper=True)
def _store(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_os,
           t, raw, rawgpu, group, hk, hw, h0, nh, has_parent, pk, pw, ftok, t0, nt, bs_given, tenant, salts,
           next_continues, seq, ts, J, JS, SO, PX, RX):  # pragma: no cover - compiled
    """One BlockStored (`RemotePool._stored` on arrays). Returns 1 for vLLM's reuse
    report (no copy added), 0 for a store, -1 when it names no hash. `raw`: the F_RAW code
    of the medium's name (0 the tier's own: a copy keeps the name an earlier store gave).
    With the journal on, one row per block stored (a copy of a held hash too, its token ids
    kept for it)."""
    if nh == 0:
        return -1
    if TI[t, T_PRESENT] == 0:
        TI[t, T_PRESENT] = 1
        if t + 1 > S[S_NTIERS]:
            S[S_NTIERS] = t + 1  # the tiers this pool ever held are codes below it
        TI[t, T_BORN] = S[S_TIERSEQ]
        S[S_TIERSEQ] += 1
    if has_parent == 0 and rawgpu:
        if _find(tab, K, SO, F, hk[h0], hw[h0], t) >= 0:
            every = True
            for i in range(nh):
                s = _find(tab, K, SO, F, hk[h0 + i], hw[h0 + i], t)
                if s < 0 or _copies_in(C, G, s, group) == 0:
                    every = False
                    break
            if every and (S[S_REPORTED] > 0 or next_continues):
                S[S_REPORTED] += nh
                S[S_HITS] += nh
                for i in range(nh):
                    _announce(C, S, _find(tab, K, SO, F, hk[h0 + i], hw[h0 + i], t))
                return 1
    bs = bs_given if bs_given else nt // nh
    if bs and group == 0:
        S[S_BLOCK_SIZE] = bs
    if has_parent and S[S_TENANTED]:
        # the parent's slot is looked for only for its tenant: while no block was stored with
        # one, no slot has F_PW_TENANT and none is inherited (its K and F rows were two cache
        # misses a store of 200K recorded events, where no tenant is ever named)
        ps = _find(tab, K, SO, F, pk, pw, t)
        if ps < 0:
            num_present = 0
            for x in range(S[S_NTIERS]):
                num_present += TI[x, T_PRESENT]
            if num_present > 1:
                # the reference looks through its tiers in the order they were made
                best_born = np.int64(-1)
                for x in range(S[S_NTIERS]):
                    if TI[x, T_PRESENT] and x != t:
                        cand = _find(tab, K, SO, F, pk, pw, x)
                        if cand >= 0 and (best_born < 0 or TI[x, T_BORN] < best_born):
                            ps = cand
                            best_born = TI[x, T_BORN]
        if ps >= 0 and tenant < 0 and F[ps, F_PW] & F_PW_TENANT:
            if S[S_JON]:  # a journalled pool's C has no tenant column: its store's run has it
                tenant = RX[_run_of(RX, S[S_NRX], np.int64(SO[ps])), RX_TENANT] - 1
            else:
                tenant = np.int64(C[ps, C_TENANT]) - 1
    prev_k, prev_w = pk, pw
    has_prev = has_parent
    for i in range(nh):
        if len(salts) and salts[i] >= 0:
            tenant = salts[i]
        k = hk[h0 + i]
        w = hw[h0 + i]
        x = _mix(k, w, t)
        s, hole = _find_or_hole(tab, K, SO, F, k, w, t, x)
        if s >= 0:  # held already: one more copy
            cur = _copies_in(C, G, s, group)
            if group and C[s, C_TOT] == 1 and C[s, C_C0] == 1:
                cur = 0
            if cur:
                S[S_RESTORED] += 1
            if group == 0:
                C[s, C_C0] += 1
            else:
                _set_group(G, s, group, cur + 1)
            C[s, C_TOT] += 1
            TI[t, T_EXTRA] += 1
            if TI[t, T_EXTRA_BORN] == 0:  # the reference's num_extra_copies gets the tier now
                TI[t, T_EXTRA_BORN] = S[S_TIERSEQ] + 1
                S[S_TIERSEQ] += 1
            _announce(C, S, s)
            if raw:  # (a raw code is given only once F has its F_RAW column)
                F[s, F_RAW] = raw
            if S[S_JON]:  # the journal keeps this copy's own token ids (the slot keeps the first's)
                a = i * bs
                n_i = min(bs, nt - a) if bs > 0 else 0
                if n_i < 0:
                    n_i = 0
                u = S[S_TOKUSED]
                _copy_ids(tok, u, ftok, t0 + a, n_i)
                S[S_TOKUSED] = u + n_i
                _journal_store(J, JS, K, PX, RX, S, t, s, seq, k, w, has_prev, i > 0, prev_k, prev_w, n_i, tenant)
        else:
            s = S[S_FREE] - 1
            S[S_FREE] = np.int64(L[s, L_TOK])
            if S[S_JON] == 0:  # (a journalled pool's K has a row per store: `_journal_store` writes it)
                K[s, K_KEY] = k
            F[s, F_W] = w
            F[s, F_TIER] = t + 1
            if F.shape[1] > F_RAW:  # F_RAW exists once a raw medium name was seen
                F[s, F_RAW] = raw
            # (a journalled pool's K has a row per store: `StoreParents` reads its parent)
            if has_prev:
                F[s, F_PW] = prev_w | (F_PW_TENANT if tenant >= 0 else 0)
                if S[S_JON] == 0:
                    K[s, K_PARENT] = prev_k
            else:
                F[s, F_PW] = F_PW_TENANT if tenant >= 0 else 0
                if S[S_JON] == 0:
                    K[s, K_PARENT] = 0
            if tenant >= 0:
                S[S_TENANTED] = 1
            a = i * bs
            n_i = min(bs, nt - a) if bs > 0 else 0
            if n_i < 0:
                n_i = 0
            u = S[S_TOKUSED]
            if S[S_JON] == 0 and n_i > 0 and C[s, C_NTOK] == n_i:
                # the token ids this slot held before it was freed (`_free_slot`): written over
                # in place, so an evicting stream leaves no garbage for `_compact_tokens`
                u = np.int64(L[s, L_BID])
            else:
                S[S_TOKUSED] = u + n_i
            _copy_ids(tok, u, ftok, t0 + a, n_i)
            if S[S_JON] == 0:
                C[s, C_NTOK] = n_i
                S[S_TOKLIVE] += n_i
            elif n_i == 0:
                F[s, F_PW] |= F_PW_NOTOK
            if L.shape[1] > L_BID:
                L[s, L_TOK] = u
                L[s, L_BID] = S[S_BID]
                L[s, L_ORDER] = S[S_ORDER]
            else:
                L[s, L_JBID] = S[S_BID]
            S[S_ORDER] += 1
            if S[S_JON] == 0:
                C[s, C_TENANT] = tenant + 1
            C[s, C_ANN] = 1
            C[s, C_REM] = 0
            C[s, C_TOT] = 1
            if group:
                C[s, C_C0] = 0
                _set_group(G, s, group, 1)
            else:
                C[s, C_C0] = 1
            _tab_put(tab, hole, x, s)  # (nothing changed the table since the probe)
            S[S_LIVE] += 1
            TI[t, T_HASHES] += 1
            if n_i == 0:
                TI[t, T_NOTOK] += 1
            if S[S_JON]:
                SO[s] = S[S_JSTORES]
                _journal_store(J, JS, K, PX, RX, S, t, s, seq, k, w, has_prev, i > 0, prev_k, prev_w, n_i, tenant)
        _om_unremove(om_tab, om_k, om_w, om_v, om_free, om_es, ra_os, k, w, _om_hash(k, w))
        S[S_STORED] += 1
        prev_k, prev_w, has_prev = k, w, 1
    return 0


@njit(cache=True, nogil=True, _nrt=False, no_cpython_wrapper=True)
def _remove(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os, dp_fifo,
            dp_os, t, group, hk, hw, h0, nh, batch_seq, ts, left, J, SO):  # pragma: no cover - compiled
    """One BlockRemoved (`RemotePool._removed`, not emitting). `group` -1 is None; `left[i]`
    is set to 1 for each hash that is no longer on the tier after it. With the journal
    on, one row per hash named (held or not: the reference emits a BlockEvicted for each).
    `tok` is only prefetched: a freed slot's token range, which the next store of as many
    ids writes over (`_store`), asked for as the slot is freed."""
    maxn = S[S_MAXREM]
    fast = group <= 0  # the reference's fast path: removed_at trimmed once, at the end
    present = TI[t, T_PRESENT]
    if present:
        # the rows of the slots the hashes name, asked for side by side before the loop
        # below reads them one after another (a slot's K, C, L and F were ~half of it)
        for i in range(nh):
            _touch_slot(tab, K, SO, L, C, F, _mix(hk[h0 + i], hw[h0 + i], t))
    for i in range(nh):
        k = hk[h0 + i]
        w = hw[h0 + i]
        x = _mix(k, w, t)
        s = _find_x(tab, K, SO, F, k, w, t, x) if present else -1
        if S[S_JON]:
            _journal_row(J, S, OP_REMOVED, t, s, batch_seq, SO[s] if s >= 0 else -1, k, w)
        # what the removal maps note (`_om_note`): announced and removed added to departed's
        # counts and, when the hash left the tier (or was never on it), removed_at's seq
        a, r, to_ra = np.int64(0), np.int64(1), False
        if s < 0:
            S[S_UNKNOWN] += 1
            to_ra = True
            left[i] = 1
        else:
            last = False
            common = C[s, C_TOT] == 1 and C[s, C_C0] == 1
            if common:
                if group > 0:  # one copy, in group 0: not this group's
                    S[S_UNKNOWN] += 1
                else:
                    last = True
            else:
                g = group if group >= 0 else _first_group(C, G, s)
                cnt = _copies_in(C, G, s, g) if g >= 0 else 0
                if cnt == 0:
                    S[S_UNKNOWN] += 1
                else:
                    if g == 0:
                        C[s, C_C0] -= 1
                    else:
                        _set_group(G, s, g, cnt - 1)
                    C[s, C_TOT] -= 1
                    if C[s, C_TOT] == 0:
                        last = True
                    else:  # copies left: the hash stays, neither map notes it
                        TI[t, T_EXTRA] -= 1
                        C[s, C_REM] += 1
                        continue
            if last:
                seconds = ts - T[L[s, _bid_col(L)]]
                if seconds > 0:
                    SF[0] += seconds
                    if seconds > SF[1]:
                        SF[1] = seconds
                S[S_LIFE_N] += 1
                a, r, to_ra = np.int64(C[s, C_ANN]), np.int64(C[s, C_REM]) + 1, True
                _free_slot(tab, K, SO, L, C, F, T, G, S, TI, s, x)
                if S[S_JON] == 0 and C[s, C_NTOK] > 0:
                    # the store that takes this slot next (the free list is last in, first out:
                    # usually the next one, a few events on) writes its token ids over this
                    # range; asked for now, its lines are there by then (they were a write miss
                    # a block, ~3 ms of 200K recorded events; a journalled pool appends its ids)
                    u = np.int64(L[s, L_BID])
                    _prefetch(tok, u)
                    _prefetch(tok, u + np.int64(C[s, C_NTOK]) - 1)
                left[i] = 1
        _om_note(om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os, dp_fifo, dp_os, k, w, _om_hash(k, w),
                 batch_seq, a, r, to_ra, maxn, not fast)
    S[S_REMOVED] += nh
    if fast:
        _om_trim(om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os, maxn)


@njit(cache=True, nogil=True)
def _clear_tier(tab, K, L, C, F, T, G, S, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os, dp_fifo, dp_os,
                t, batch_seq, n, SO):  # pragma: no cover
    """Every hash of tier t leaves it, in the order they were stored (L_ORDER, or SO in a
    journalled pool)."""
    tt = t + 1
    count = 0
    for s in range(n):
        if F[s, F_TIER] == tt:
            count += 1
    slots = np.empty(count, np.int64)
    orders = np.empty(count, np.int64)
    j = 0
    for s in range(n):
        if F[s, F_TIER] == tt:
            slots[j] = s
            orders[j] = L[s, L_ORDER] if L.shape[1] > L_ORDER else SO[s]
            j += 1
    maxn = S[S_MAXREM]
    for s in slots[np.argsort(orders)]:
        k, w = _slot_key(K, SO, s), F[s, F_W]
        _om_note(om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os, dp_fifo, dp_os, k, w, _om_hash(k, w),
                 batch_seq, np.int64(C[s, C_ANN]), np.int64(C[s, C_REM]), True, maxn, True)
        _free_slot(tab, K, SO, L, C, F, T, G, S, TI, s, _mix(k, w, t))
    TI[t, T_PRESENT] = 0
    TI[t, T_EXTRA] = 0
    TI[t, T_EXTRA_BORN] = 0


@njit(cache=True, inline="always")
def _medium_of(m):  # pragma: no cover - compiled
    """A common event's tier and raw name code from its R_MEDIUM (`_medium_row`)."""
    if m >= RAW_ROW:
        return m & 0xFF, (m >> 8) & 0xFF
    return (1, 1) if m == 2 else (0, 0)


@njit(cache=True, nogil=True, _nrt=False, no_cpython_wrapper=True)
def _run(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os, dp_fifo,
         dp_os, rows, parents, keys, widths, ftok, tiers, groups, rawgpu, start, stop_on_remove, seq, ts, left, n, J,
         JS, SO, PX, RX, RM):  # pragma: no cover - compiled
    """Apply events start..n-1 of one batch (rows of a batch, or one frame's among many
    concatenated) while they are common ones; returns the index of the first event
    Python must handle (or n). A common event's medium is nil or `GPU` (R_MEDIUM 0, 1),
    `CPU` (2) or the pool's raw name c on tier t (`_medium_row(t, c)`)."""
    nosalt = tiers[:0]  # a view: this function allocates nothing (no NRT)
    for i in range(start, n):
        if rows[i, R_RARE]:
            return i
        kind = rows[i, R_KIND]
        t, c = _medium_of(rows[i, R_MEDIUM])
        nh = rows[i, R_NHASH]
        h0 = rows[i, R_HASH0]
        if kind == KIND_STORED:
            nxt = False
            rg = rows[i, R_MEDIUM] <= 1
            if rows[i, R_PARENT] == 0 and rg and nh:
                lk, lw = keys[h0 + nh - 1], widths[h0 + nh - 1]
                for j in range(i + 1, n):
                    if rows[j, R_RARE]:
                        rgj, gj = rawgpu[j], groups[j]
                    else:
                        rgj, gj = rows[j, R_MEDIUM] <= 1, 0
                    if rows[j, R_KIND] == KIND_STORED and rgj and gj == 0:
                        nxt = rows[j, R_PARENT] != 0 and parents[j] == lk and widths_parent(rows, j) == lw
                        break
            r = _store(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_os,
                       t, RM[c, RM_SLOT], rg, 0, keys, widths, h0, nh, rows[i, R_PARENT], parents[i], W_U64, ftok,
                       rows[i, R_TOK0], rows[i, R_NTOK], rows[i, R_SIZE], -1, nosalt, nxt, seq, ts, J, JS, SO, PX, RX)
            if r == 0:  # counted per raw name, into the pool's dicts after the run (`_sync`)
                if RM[c, RM_COUNT] == 0:
                    RM[S[S_MEDIA_SEEN], RM_ORDER] = c
                    S[S_MEDIA_SEEN] += 1
                RM[c, RM_COUNT] += nh
        elif kind == KIND_REMOVED:
            if stop_on_remove:
                return i
            _remove(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os,
                    dp_fifo, dp_os, t, np.int64(-1), keys, widths, h0, nh, seq, ts, left, J, SO)
        else:
            return i
    return n


# Entry points from Python. The compiled core above runs without NRT (no reference count
# is touched per array argument, per call: that was 45% of the apply's time); unboxing the
# group dict from Python needs NRT, so Python calls these, which take one reference per
# argument once and hand everything on (named parameters, not *args: numba types a star
# argument's arrays in Python, 40 a call).


@njit(cache=True, nogil=True, _nrt=True)
def _store_py(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_os, t, raw, rawgpu,
              group, hk, hw, h0, nh, has_parent, pk, pw, ftok, t0, nt, bs_given, tenant, salts, next_continues, seq, ts,
              J, JS, SO, PX, RX):  # pragma: no cover - compiled
    return _store(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_os, t, raw,
                  rawgpu, group, hk, hw, h0, nh, has_parent, pk, pw, ftok, t0, nt, bs_given, tenant, salts,
                  next_continues, seq, ts, J, JS, SO, PX, RX)


@njit(cache=True, nogil=True, _nrt=True)
def _remove_py(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os,
               dp_fifo, dp_os, t, group, hk, hw, h0, nh, batch_seq, ts, left, J, SO):  # pragma: no cover - compiled
    return _remove(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os,
                   dp_fifo, dp_os, t, group, hk, hw, h0, nh, batch_seq, ts, left, J, SO)


@njit(cache=True, nogil=True, _nrt=True)
def _run_py(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os, dp_fifo,
            dp_os, rows, parents, keys, widths, ftok, tiers, groups, rawgpu, start, stop_on_remove, seq, ts, left, n, J,
            JS, SO, PX, RX, RM):  # pragma: no cover - compiled
    return _run(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os,
                dp_fifo, dp_os, rows, parents, keys, widths, ftok, tiers, groups, rawgpu, start, stop_on_remove, seq,
                ts, left, n, J, JS, SO, PX, RX, RM)


@njit(cache=True, nogil=True, _nrt=True)
def _run_frames_py(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os,
                   dp_fifo, dp_os, rows, parents, keys, widths, ftok, bounds, seqs, tss, left, J, JS, SO, PX, RX,
                   RM):  # pragma: no cover - compiled
    return _run_frames(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os,
                       dp_fifo, dp_os, rows, parents, keys, widths, ftok, bounds, seqs, tss, left, J, JS, SO, PX, RX, RM)



@njit(cache=True, _nrt=False)
def _touch_oldest(otab, ok, ow, ov, fifo, os, num, home):  # pragma: no cover - compiled
    """Prefetch the entries of a removal map's `num` oldest keys (the ones a full map drops
    next) or, with `home`, their home entries in the maps' table (which read the entries:
    once those are on their way)."""
    mask = len(otab) - 1
    for q in range(os[O_HEAD], min(os[O_HEAD] + num, os[O_TAIL])):
        e = fifo[q & (len(fifo) - 1)]
        if e >= 0:
            if home:
                _prefetch(otab, _om_hash(ok[e, K_KEY], ow[e]) & mask)
            else:
                _prefetch(ow, e)
                _prefetch(ov, e)


@njit(cache=True, _nrt=False)
def _pretouch(tab, K, L, C, F, ra_tab, ra_k, ra_w, ra_v, ra_fifo, ra_os, dp_tab, dp_k, dp_w, dp_v, dp_fifo, dp_os,
              rows, parents, keys, lo, hi, with_parents=True):  # pragma: no cover - compiled
    """Prefetch, before events lo..hi-1 of common events use them, the table entries their
    hashes will probe: the home entry of each hash (and parent) in the pool's table and
    the removal maps' (one table for both: `dp_tab` is `ra_tab`, `dp_k` `ra_k`, ...), and
    the maps' oldest entries that the removals will drop, then their home entries. The
    run's own probes, each waiting for the one before, then find them in the cache (on
    this VM a dependent random read costs about 190 ns, an independent one about 14).
    Prefetches, not loads: a load that misses holds the CPU's window of instructions until
    it comes (the pass read each of these before, and cost about what it saved: 0.301 s
    against 0.325 s without it, 0.252 s prefetching, for 200K recorded events). A second
    pass that read the table entries to prefetch the slots' rows they name cost more than
    it saved once the helpers were inlined (its reads waited on the entries the first pass
    asked for): 0.2415 -> 0.2316 s without it. Reads only (the slots' arrays, K, L, C, F,
    and the maps' keys are no longer read: kept in the signature). A parent's entry only
    `with_parents` (S_TENANTED: `_store` looks for a parent only then)."""
    size = len(tab) - 1
    ra_mask = len(ra_tab) - 1
    removed = 0
    for i in range(lo, hi):  # the table entries
        t = _medium_of(rows[i, R_MEDIUM])[0]
        h0 = rows[i, R_HASH0]
        if rows[i, R_KIND] == KIND_REMOVED:
            removed += rows[i, R_NHASH]
        for j in range(h0, h0 + rows[i, R_NHASH]):
            k = keys[j]
            _prefetch(tab, _home(_mix(k, W_U64, t), size))
            y = _om_hash(k, W_U64)
            _prefetch(ra_tab, y & ra_mask)
        if with_parents and rows[i, R_PARENT]:
            _prefetch(tab, _home(_mix(parents[i], W_U64, t), size))
    if removed:
        # in vLLM's streams both maps hold the same keys in the same order: when their oldest
        # entries are the same, departed's are not asked for a second time
        same = ra_os[O_HEAD] < ra_os[O_TAIL] and dp_os[O_HEAD] < dp_os[O_TAIL] and \
            ra_fifo[ra_os[O_HEAD] & (len(ra_fifo) - 1)] == dp_fifo[dp_os[O_HEAD] & (len(dp_fifo) - 1)]
        _touch_oldest(ra_tab, ra_k, ra_w, ra_v, ra_fifo, ra_os, removed, False)
        if not same:
            _touch_oldest(dp_tab, dp_k, dp_w, dp_v, dp_fifo, dp_os, removed, False)
        _touch_oldest(ra_tab, ra_k, ra_w, ra_v, ra_fifo, ra_os, removed, True)
        if not same:
            _touch_oldest(dp_tab, dp_k, dp_w, dp_v, dp_fifo, dp_os, removed, True)


@njit(cache=True, nogil=True, _nrt=False, no_cpython_wrapper=True)
def _run_frames(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os,
                dp_fifo, dp_os, rows, parents, keys, widths, ftok, bounds, seqs, tss, left, J, JS, SO, PX, RX,
                RM):  # pragma: no cover - compiled
    """Many frames of common events in one call: frame f is rows bounds[f]..bounds[f+1]-1
    with batch seq seqs[f] and time tss[f], applied in order exactly as `apply` applies
    each (rows, hashes and token ids of all frames concatenated; `widths` W_U64 for each).
    Returns the frames applied: all, or those before one whose hashes C may not count
    (S_CLIMIT), S_BID that frame's batch row: C is widened, the rest applied after."""
    empty_u8 = widths[:0]
    empty_i64 = bounds[:0]
    bid0 = S[S_BID]  # the run's frames are rows bid0.. of the batch table
    for f in range(len(seqs)):
        lo, hi = bounds[f], bounds[f + 1]
        S[S_BID] = bid0 + f
        if hi > lo:
            nk = 0
            for j in range(lo, hi):
                nk += rows[j, R_NHASH]
            if S[S_CMAX] + nk > S[S_CLIMIT]:
                return f
            _pretouch(tab, K, L, C, F, om_tab, om_k, om_w, om_v, ra_fifo, ra_os, om_tab, om_k, om_w, om_v, dp_fifo,
                      dp_os, rows, parents, keys, lo, hi, S[S_TENANTED] != 0)
            _run(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os,
                 dp_fifo, dp_os, rows, parents, keys, widths, ftok, empty_i64, empty_i64, empty_u8, lo, np.bool_(False),
                 seqs[f], tss[f], left, hi, J, JS, SO, PX, RX, RM)
            if S[S_LIVE] == 0 and S[S_JON] == 0:
                S[S_TOKUSED] = 0
                C[:, C_NTOK] = 0  # no free slot's token range is kept past this
    return len(seqs)


@njit(cache=True, nogil=True, _nrt=False, no_cpython_wrapper=True)
def _run_decoded(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os,
                 dp_fifo, dp_os, meta, rows, data, words, widths, f0, seqs, tss, left, J, JS, SO, PX, RX,
                 RM):  # pragma: no cover - compiled
    """`_run_frames` of frames f0.. of one `fastwire.decode_columns_many` call, read where
    its compiled pass left them (`DecodedRun`: frame f's rows from meta[f, M_ROW0], its
    parents, hashes and token ids in `data` from meta[f, M_DATA0], `words` its uint32
    view), each frame's arrays a view: nothing is joined or copied first. `widths`: W_U64
    for at least a frame's hashes. Returns the frames applied, as `_run_frames`."""
    empty_u8 = widths[:0]
    empty_i64 = seqs[:0]
    bid0 = S[S_BID]
    for f in range(len(seqs)):
        g = f0 + f
        S[S_BID] = bid0 + f
        m = meta[g, M_ROWS]
        if m > 0:
            r, d, nk = meta[g, M_ROW0], meta[g, M_DATA0], meta[g, M_KEYS]
            if S[S_CMAX] + nk > S[S_CLIMIT]:
                return f
            fr, parents, keys = rows[r:r + m], data[d:d + m], data[d + m:d + m + nk]
            ftok = words[2 * (d + m + nk):]
            _pretouch(tab, K, L, C, F, om_tab, om_k, om_w, om_v, ra_fifo, ra_os, om_tab, om_k, om_w, om_v, dp_fifo,
                      dp_os, fr, parents, keys, np.int64(0), m, S[S_TENANTED] != 0)
            _run(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os,
                 dp_fifo, dp_os, fr, parents, keys, widths, ftok, empty_i64, empty_i64, empty_u8, np.int64(0),
                 np.bool_(False), seqs[f], tss[f], left, m, J, JS, SO, PX, RX, RM)
            if S[S_LIVE] == 0 and S[S_JON] == 0:
                S[S_TOKUSED] = 0
                C[:, C_NTOK] = 0  # no free slot's token range is kept past this
    return len(seqs)


@njit(cache=True, nogil=True, _nrt=True)
def _run_decoded_py(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo, ra_os,
                    dp_fifo, dp_os, meta, rows, data, words, widths, f0, seqs, tss, left, J, JS, SO, PX, RX,
                    RM):  # pragma: no cover - compiled
    return _run_decoded(tab, K, L, C, F, T, G, tok, S, SF, TI, om_tab, om_k, om_w, om_v, om_free, om_es, ra_fifo,
                        ra_os, dp_fifo, dp_os, meta, rows, data, words, widths, f0, seqs, tss, left, J, JS, SO, PX, RX, RM)


@njit(cache=True)
def _decoded_figures(meta, f0, f1):  # pragma: no cover - compiled
    """Of frames f0..f1-1 of a `DecodedRun`: (rows, blocks, the most token ids and hashes a
    row names, hashes the removals name, token ids, the largest token id), summed from
    what its compiled pass noted per frame."""
    num_rows = blocks = most_tokens = most_hashes = removals = num_tokens = most_id = np.int64(0)
    for f in range(f0, f1):
        num_rows += meta[f, M_ROWS]
        blocks += meta[f, M_KEYS]
        most_tokens = max(most_tokens, meta[f, M_MOST_TOKENS])
        most_hashes = max(most_hashes, meta[f, M_MOST_HASHES])
        removals += meta[f, M_REMOVALS]
        num_tokens += meta[f, M_TOKENS]
        most_id = max(most_id, meta[f, M_MOST_ID])
    return num_rows, blocks, most_tokens, most_hashes, removals, num_tokens, most_id


@njit(cache=True, inline="always")
def widths_parent(rows, j):  # pragma: no cover - compiled
    """The width code of event j's parent: a common event's parent is an 8-byte hash."""
    return np.uint8(W_U64) if rows[j, R_RARE] == 0 or rows[j, R_PARENT] == 1 else np.uint8(W_WIDE)


@njit(cache=True, nogil=True)
def _compact_tokens(C, L, F, tok, n, out):  # pragma: no cover - compiled
    """Held slots' token ids, in slot order, into `out`; a free slot's kept range is dropped."""
    u = 0
    for s in range(n):
        if F[s, F_TIER]:
            a = L[s, L_TOK]
            m = C[s, C_NTOK]
            for j in range(m):
                out[u + j] = tok[a + j]
            L[s, L_TOK] = u
            u += m
        else:
            C[s, C_NTOK] = 0
    return u


def _grow_rows(owner: Any, name: str, rows: int, copied_rows: int = 0) -> None:
    """The array `owner.<name>` with `rows` rows, the new ones zero: resized where it lies
    (realloc, which moves a large block's pages rather than copying them and faulting in
    new ones: the copies were half of a growing pool's apply at a sixteenth a growth)
    unless anything else refers to it (numpy checks), else copied into a new one of
    `copied_rows` rows when more (an array copied at every growth grows by more, so that
    it is copied fewer times: its new rows are zero pages, faulted in only when written)."""
    shape = (rows,) + getattr(owner, name).shape[1:]
    try:
        getattr(owner, name).resize(shape)
    except ValueError:  # a view or another reference to it: copied, as those keep the old one
        old = getattr(owner, name)
        arr = np.zeros((max(rows, copied_rows),) + shape[1:], old.dtype)
        arr[:len(old)] = old
        setattr(owner, name, arr)


def _new_group_dict() -> Any:
    return NumbaDict.empty(key_type=types.int64, value_type=types.int64)


class _RemovalMaps:
    """The entries of both removal maps (`removed_at`, `departed`) and their one table, in
    arrays; each map is an `_OrderedMap` over them (its FIFO and scalars)."""

    __slots__ = ("tab", "k", "w", "v", "free", "es", "removed", "departed")

    def __init__(self, cap: int = 1024) -> None:
        # a power of two, load <= 1/2; -1 empty, else (31 bits of the key's hash << 32) | entry
        self.tab = np.full(1 << int(2 * cap - 1).bit_length(), -1, np.int64)
        self.k = np.zeros((cap, NUM_K), np.uint64)  # the rows: K_* as uint64
        self.v = self.k.view(np.int32)  # the same rows, V_* as int32
        self.w = np.zeros(cap, np.uint8)  # the key's width code, 0: a free entry
        self.free = np.arange(cap - 1, -1, -1, dtype=np.int32)
        self.es = np.array([0, cap], np.int64)  # E_LIVE, E_FREE
        self.removed = _OrderedMap(self, V_RPOS, K_SEQ, -1, cap)
        self.departed = _OrderedMap(self, V_DPOS, V_ANN, V_REM, cap)

    def __len__(self) -> int:
        return int(self.es[E_LIVE])

    def compiled(self) -> tuple:
        """What the compiled loops take: the entries, then each map's FIFO and scalars."""
        return (self.tab, self.k, self.w, self.v, self.free, self.es, self.removed.fifo, self.removed.os,
                self.departed.fifo, self.departed.os)

    def reserve(self, more: int, most: int | None = None) -> None:
        """Room for `more` new keys before the next compiled call, in maps that keep at most
        `most` keys each between calls (the pool's `max_removed`; None: no bound)."""
        live, cap = int(self.es[E_LIVE]), len(self.k)
        if live + more > cap:
            # half again as many entries, but no more than the bound and one call's keys: a
            # map is full at its bound, so the room left idle is passing (an eighth at a time
            # was 29 rehashes on the way to 200,000 keys, a quarter of a new pool's apply).
            # Both maps hold the same keys in vLLM's streams; keys stored again after they
            # left (in departed, not removed_at) can take the entries up to twice the bound
            new = max(cap + cap // 2, live + more + 1024)
            if most is not None:
                top = most if live <= most else min(2 * most, live + live // 2)
                new = max(min(new, top + more + 1024), live + more)
            # entries keep their numbers (resized or copied whole, the FIFOs as they are); the
            # new ones go under the free ones, and the table is made again when its size changes.
            # The new rows' values stay 0, not -1: an entry taken from the free list has its
            # FIFO positions set then (`_om_note`), and its values are read only while it is in
            # a map (filling them was a second pass over the largest of the maps' arrays)
            nfree = int(self.es[E_FREE])
            self.v = None  # (k resized where it lies: no view of it left)
            for name in ("k", "w"):
                _grow_rows(self, name, new)
            self.v = self.k.view(np.int32)
            free = np.empty(new, np.int32)
            free[:new - cap] = np.arange(new - 1, cap - 1, -1, dtype=np.int32)
            free[new - cap:new - cap + nfree] = self.free[:nfree]
            self.free = free
            self.es[E_FREE] = nfree + new - cap
            size = 1 << int(2 * new - 1).bit_length()
            if size != len(self.tab):  # (entries keep their numbers: a table of the same size stays)
                self.tab = np.empty(size, np.int64)  # (`_om_rehash` fills it with -1 first)
                _om_rehash(self.tab, self.k, self.w, self.v, cap)
        self.removed.fifo_room(more)
        self.departed.fifo_room(more)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.tab, self.k, self.w, self.free, self.es, self.removed.fifo,
                                      self.removed.os, self.departed.fifo, self.departed.os))


class _OrderedMap:
    """One removal map, insertion-ordered, of hashes (k, w) to two values: a FIFO of the
    shared entries (`_RemovalMaps`) and its scalars; an entry is in it while its FIFO position
    (column `pos`) is not -1. `tab`, `k`, `w`, `v` and `free` are the shared arrays. The FIFO
    is a ring (a power of two long): position q, counted from the map's start, lies at
    q & (len - 1), so the head moving on at the bound makes room without moving a key."""

    __slots__ = ("entries", "pos", "values", "fifo", "os")

    def __init__(self, entries: _RemovalMaps, pos: int, v0: int, v1: int, cap: int) -> None:
        self.entries = entries
        self.pos, self.values = pos, (v0, v1)  # v1 -1: the second value is always 0
        self.fifo = np.full(1 << int(2 * cap - 1).bit_length(), -1, np.int32)  # a ring
        self.os = np.zeros(3, np.int64)  # O_LIVE, O_HEAD, O_TAIL (positions, not ring indices)

    tab = property(lambda self: self.entries.tab)
    k = property(lambda self: self.entries.k)
    w = property(lambda self: self.entries.w)
    v = property(lambda self: self.entries.v)
    free = property(lambda self: self.entries.free)

    def __len__(self) -> int:
        return int(self.os[O_LIVE])

    def fifo_room(self, more: int) -> None:
        """Room in the FIFO for `more` keys to come in (its window, head to tail, holes and
        all, at most the ring's length): a larger ring, its keys at their positions, or their
        positions moved to the start of a new one."""
        head, tail = int(self.os[O_HEAD]), int(self.os[O_TAIL])
        n = int(self.os[O_LIVE])
        if tail + more >= POS_LIMIT:  # positions are int32 in the rows: counted again from 0
            moved = True
        elif tail - head + more <= len(self.fifo):
            return  # (a map at its bound: the head moved on as far as the tail did)
        else:
            # next to no key left it (a map filling up): the window copied as it is, each entry
            # keeping its position (moving them read every entry's row: 14 moves, ~4 ms, on
            # the way to 200,000 keys); else the holes dropped, the keys moved
            moved = tail - head - n > n // 8
        need = (n if moved else tail - head) + more
        fifo = np.full(max(len(self.fifo), 1 << int(need + need // 4 + 1024).bit_length()), -1, np.int32)
        if moved:
            self.os[O_HEAD], self.os[O_TAIL] = 0, _om_refifo(self.fifo, self.entries.v, self.os, self.pos, fifo)
        else:
            _om_rering(self.fifo, self.os, fifo)
        self.fifo = fifo

    def ordered(self) -> np.ndarray:
        """Live entries, oldest first."""
        out = np.empty(int(self.os[O_LIVE]), np.int64)
        return out[:_om_ordered(self.fifo, self.entries.v, self.os, self.pos, out)]

    def columns(self, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The two values of entries `e` (int64)."""
        v0, v1 = self.values
        if v1 < 0:  # removed_at: the batch seq, int64 in the rows' uint64 columns
            return self.entries.k.view(np.int64)[e, v0], np.zeros(len(e), np.int64)
        u = self.entries.v.view(np.uint32)  # departed's counts
        return u[e, v0].astype(np.int64), u[e, v1].astype(np.int64)

    def get(self, k: int, w: int) -> tuple[int, int] | None:
        m = self.entries
        e = _om_get(m.tab, m.k, m.w, np.uint64(k), np.uint8(w)) if len(self) else -1
        if e < 0 or m.v[e, self.pos] < 0:
            return None
        v0, v1 = self.columns(np.array([e]))
        return int(v0[0]), int(v1[0])


@njit(cache=True)
def _om_get(otab, OK, OW, k, w):  # pragma: no cover - compiled
    return _om_find(otab, OK, OW, k, w, _om_hash(k, w))


@njit(cache=True)
def _om_rehash(otab, OK, OW, OV, n):  # pragma: no cover - compiled
    """The table made again from the entries' keys (OV, the rows as int32, is not read)."""
    otab[:] = -1
    mask = len(otab) - 1
    for e in range(n):
        if OW[e]:
            h = _om_hash(OK[e, K_KEY], OW[e])
            i = h & mask
            while otab[i] >= 0:
                i = (i + 1) & mask
            otab[i] = (h << 32) | e


@njit(cache=True, nogil=True)
def _om_ordered(ofifo, OV, OS, pos, out):  # pragma: no cover - compiled
    """A map's live entries (FIFO positions: OV's column `pos`), oldest first, into `out`;
    how many. (numpy's masks over a full map's FIFO, 400,000 positions, were a millisecond
    a call, one per map every ~100,000 removals.)"""
    n = 0
    for q in range(OS[O_HEAD], OS[O_TAIL]):
        e = ofifo[q & (len(ofifo) - 1)]
        if e >= 0 and OV[e, pos] == q and n < len(out):
            out[n] = e
            n += 1
    return n


@njit(cache=True, nogil=True)
def _om_refifo(ofifo, OV, OS, pos, out):  # pragma: no cover - compiled
    """A map's live entries, oldest first, to the start of a new FIFO `out`, each entry's
    position moved with it; how many."""
    n = 0
    for q in range(OS[O_HEAD], OS[O_TAIL]):
        e = ofifo[q & (len(ofifo) - 1)]
        if e >= 0 and OV[e, pos] == q:
            out[n] = e
            OV[e, pos] = n
            n += 1
    return n


@njit(cache=True, nogil=True)
def _drop_unnamed_bids(F, L, nb, T, BSEQ, T2, BSEQ2):  # pragma: no cover - compiled
    """The batch rows (of the first `nb`) that held slots name, in order, into T2 and BSEQ2,
    and the slots' rows renumbered; how many. (numpy's masks, gathers and scatters over every
    slot were ~5 ms a 200K-event attach.)"""
    named = np.zeros(nb, np.bool_)
    c = _bid_col(L)
    for s in range(len(F)):
        if F[s, F_TIER] > 0:
            named[L[s, c]] = True
    renumber = np.empty(nb, np.int64)
    n = 0
    for b in range(nb):
        if named[b]:
            renumber[b] = n
            T2[n] = T[b]
            BSEQ2[n] = BSEQ[b]
            n += 1
    for s in range(len(F)):
        if F[s, F_TIER] > 0:
            L[s, c] = renumber[L[s, c]]
    return n


@njit(cache=True, nogil=True)
def _om_rering(ofifo, OS, out):  # pragma: no cover - compiled
    """A map's FIFO window (positions head..tail-1, holes and all) into a larger ring `out`,
    each at its own position: no entry's row is read or written."""
    for q in range(OS[O_HEAD], OS[O_TAIL]):
        out[q & (len(out) - 1)] = ofifo[q & (len(ofifo) - 1)]


_warm = False


def _num_removals(rows: np.ndarray) -> int:
    """Hashes the removals among `rows` name: what they may add to the removal maps."""
    return int(rows[rows[:, R_KIND] == KIND_REMOVED, R_NHASH].sum())


@njit(cache=True, inline="always")
def _count_row(rows, r, blocks, most_tokens, most_hashes, removals):  # pragma: no cover - compiled
    """Joined row r added to the figures `_join_starts` and `_join_data` return."""
    nh = rows[r, R_NHASH]
    if rows[r, R_KIND] == KIND_REMOVED:
        removals += nh
    return blocks + nh, max(most_tokens, rows[r, R_NTOK]), max(most_hashes, nh), removals


@njit(cache=True)
def _join_starts(rows, sizes):  # pragma: no cover - compiled
    """Frames' rows concatenated (frame f: sizes[f] = its rows, hashes, token ids): each row's
    token and hash starts moved past the frames before it. Returns (blocks, the most token
    ids a row names, the most hashes a row names, hashes the removals name)."""
    r = 0
    hash0 = np.int64(0)
    tok0 = np.int64(0)
    blocks = most_tokens = most_hashes = removals = np.int64(0)  # `_count_row`'s figures
    for f in range(len(sizes)):
        for _ in range(sizes[f, 0]):
            rows[r, R_TOK0] += tok0
            rows[r, R_HASH0] += hash0
            blocks, most_tokens, most_hashes, removals = _count_row(rows, r, blocks, most_tokens, most_hashes,
                                                                    removals)
            r += 1
        hash0 += sizes[f, 1]
        tok0 += sizes[f, 2]
    return blocks, most_tokens, most_hashes, removals


@njit(cache=True)
def _join_data(rows, data, sizes, parents):  # pragma: no cover - compiled
    """`_join_starts` for frames of the one-pass reader joined by their `data` (frame f:
    sizes[f] = its rows, hashes, token ids, words of data): each row's hash start moved to
    its hashes in the joined data, its token start to its token ids in the joined data's
    uint32 view, its parent gathered into `parents`. Returns `_join_starts`'s figures and
    the largest token id."""
    r = 0
    at = np.int64(0)
    blocks = most_tokens = most_hashes = removals = np.int64(0)  # `_count_row`'s figures
    most_id = np.uint64(0)
    ids = data.view(np.uint32)
    for f in range(len(sizes)):
        m, nk, nt = sizes[f, 0], sizes[f, 1], sizes[f, 2]
        t0 = 2 * (at + m + nk)
        for j in range(t0, t0 + nt):
            most_id = max(most_id, np.uint64(ids[j]))
        for j in range(m):
            parents[r] = data[at + j]
            rows[r, R_TOK0] += t0
            rows[r, R_HASH0] += at + m
            blocks, most_tokens, most_hashes, removals = _count_row(rows, r, blocks, most_tokens, most_hashes,
                                                                    removals)
            r += 1
        at += sizes[f, 3]
    return blocks, most_tokens, most_hashes, removals, most_id


def _pieces(run: list[ColumnarBatch]) -> list[list[ColumnarBatch]]:
    """`run` cut before each frame that does not follow the one before it in the same `DecodedRun`."""
    out, start = [], 0
    for i in range(1, len(run)):
        a, b = run[i - 1], run[i]
        if b.run is not a.run or b.run_at != a.run_at + 1:
            out.append(run[start:i])
            start = i
    out.append(run[start:])
    return out


def _names_only_a_medium(e: VllmEvent) -> bool:
    """Whether a store or removal says nothing beyond the common fields but its medium."""
    return e.lora_id is None and e.lora_name is None and e.extra_keys is None and e.group_idx is None \
        and e.kv_cache_spec_kind is None and e.locality is None and e.session_id is None and e.cache_salt is None \
        and e.ownership is None and e.lookahead_token_ids is None and e.kv_cache_spec_sliding_window is None


def warm_up() -> None:
    """Compile (or load from numba's disk cache) the pool's loops now, not on the first batch."""
    global _warm
    if _warm:
        return
    _warm = True
    fastwire.warm_up()
    pool = ColumnarPool("warm-up")
    from engine.remote.wire import encode_batch

    p = encode_batch(1.0, [VllmEvent("BlockStored", (b"\x00" * 7 + b"\x01", b"\x00" * 7 + b"\x02"), None,
                                     tuple(range(32)), 16),
                           VllmEvent("BlockStored", (b"\x00" * 7 + b"\x01",), None, tuple(range(16)), 16),
                           VllmEvent("BlockRemoved", (b"\x00" * 7 + b"\x02",)),
                           VllmEvent("BlockStored", (b"\x00" * 7 + b"\x03",), None, tuple(range(16)), 16,
                                     group_idx=1),
                           VllmEvent("BlockRemoved", (b"\x00" * 7 + b"\x03",), group_idx=1),
                           VllmEvent("AllBlocksCleared")], 0)
    pool.apply(fastwire.decode_columns(0, p))
    # the many-frames loop an attachment uses, and the journal's paths
    common = [encode_batch(2.0 + i, [VllmEvent("BlockStored", ((i + 9 << 56).to_bytes(8, "big"),), None,
                                               tuple(range(16)), 16),
                                     VllmEvent("BlockRemoved", ((i + 9 << 56).to_bytes(8, "big"),)),
                                     VllmEvent("BlockStored", ((i + 11 << 56).to_bytes(8, "big"),), None,
                                               tuple(range(16)), 16, medium="DISK")], 0)
              for i in range(2)]
    # frames of common events only, as `decode_columns_many` reads a run of them (`_run_decoded`)
    decoded = [encode_batch(3.0 + i, [VllmEvent("BlockStored", ((i + 15 << 56).to_bytes(8, "big"),), None,
                                                tuple(range(16)), 16),
                                      VllmEvent("BlockRemoved", ((i + 15 << 56).to_bytes(8, "big"),))], 0)
               for i in range(2)]
    # the journalled pool (an attach's) in each layout it may take: narrow, its counts wide (a
    # hash announced past 2**16 - 1 times: a long-lived server's hot prefix), all wide
    for journal, counts, wide in ((False, False, False), (True, False, False), (True, True, False),
                                  (True, True, True)):
        pool = ColumnarPool("warm-up", journal=journal)
        if counts:
            pool._widen_counts()
        if wide:  # past 2**32 token ids (or a pool's journal past its narrow columns): `_widen`
            pool._widen()
        pool.apply_many([fastwire.decode_columns(1 + i, q) for i, q in enumerate(common)])
        pool.apply_many(fastwire.decode_columns_many(3, decoded))
        pool.apply(fastwire.decode_columns(0, p))
        # a pool that grows: a new table (`_rehash`), the maps' (`_om_rehash`), the token
        # array compacted (`_compact_tokens`), with narrow token ids and then wide ones
        pool._reserve(4096, 1 << 16, block_tokens=16)
        pool._reserve(0, 0, np.array([1 << 16], np.uint32))
        pool._reserve(4096 * 4, 1 << 18, block_tokens=16)
        # a full batch table: the rows no held slot names dropped (`_drop_unnamed_bids`)
        pool._batch_rows(np.zeros(len(pool.T) + 1, np.int64), np.zeros(len(pool.T) + 1))
    pool.removed.ordered()  # what `removed_at` and `departed` read (`_om_ordered`)
    # a removal map's FIFO made larger as it is (`_om_rering`) or its keys moved (`_om_refifo`):
    # here over empty windows, for their types
    m = ColumnarPool("warm-up").removed
    _om_rering(m.fifo, m.os, np.full(2 * len(m.fifo), -1, np.int32))
    _om_refifo(m.fifo, m.entries.v, m.os, m.pos, np.full(len(m.fifo), -1, np.int32))
    # a run of frames the one-pass reader read whole, joined by their data (`_join_data`)
    plain = [encode_batch(4.0 + i, [VllmEvent("BlockStored", ((i + 13 << 56).to_bytes(8, "big"),), None,
                                              tuple(range(16)), 16)], 0) for i in range(2)]
    ColumnarPool("warm-up").apply_many([fastwire.decode_columns(3 + i, q) for i, q in enumerate(plain)])


# ---- reading: what the reference's objects would say ---------------------------------------

class ColumnarBlock:
    """One held hash of a `ColumnarPool`, read from its arrays when asked (the reference's
    `RemoteBlock` fields); made on demand, never kept by the pool."""

    __slots__ = ("block_hash", "parent_hash", "tokens", "stored_seq", "stored_time", "tenant", "num_announced",
                 "num_removed")

    def __init__(self, pool: ColumnarPool, s: int) -> None:
        self.block_hash = pool._bytes(int(pool.slot_keys(s)), int(pool.F[s, F_W]))
        pw = int(pool.F[s, F_PW]) & ~F_PW_FLAGS
        if pw:
            parent = pool.per_store().parent[int(pool.SO[s])] if pool.journal else pool.K[s, K_PARENT]
            self.parent_hash = pool._bytes(int(parent), pw)
        else:
            self.parent_hash = None
        a, n = pool._token_range(s)
        self.tokens = pool.tok[a:a + n].astype(np.uint32).tobytes()  # uint32 bytes, as the reference's
        bid = int(pool.L[s, L_JBID if pool.journal else L_BID])
        self.stored_seq = int(pool.BSEQ[bid])
        self.stored_time = float(pool.T[bid])
        ten = int(pool.per_store().tenant[int(pool.SO[s])] if pool.journal else pool.C[s, C_TENANT])
        self.tenant = pool.tenant_names[ten - 1] if ten else None
        self.num_announced = int(pool.C[s, C_ANN])
        self.num_removed = int(pool.C[s, C_REM])

    @property
    def parent(self) -> bytes | None:
        return self.parent_hash

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(np.frombuffer(self.tokens, np.uint32).tolist())


class _TierView:
    """A tier of a `ColumnarPool` as the reference's `tiers[tier]` dict reads: hash ->
    block, in the order the hashes were stored."""

    __slots__ = ("pool", "code")

    def __init__(self, pool: ColumnarPool, code: int) -> None:
        self.pool, self.code = pool, code

    def _slots(self) -> np.ndarray:
        return self.pool._tier_slots(self.code)

    def __len__(self) -> int:
        return int(self.pool.TI[self.code, T_HASHES])

    def __bool__(self) -> bool:
        return len(self) > 0

    def _slot(self, h: bytes) -> int:
        kw = self.pool._key(h)
        if kw is None:
            return -1
        p = self.pool
        return int(_find(p.tab, p.K, p.SO, p.F, np.uint64(kw[0]), np.uint8(kw[1]), self.code))

    def __contains__(self, h: object) -> bool:
        return isinstance(h, (bytes, bytearray)) and self._slot(bytes(h)) >= 0

    def __getitem__(self, h: bytes) -> ColumnarBlock:
        s = self._slot(h)
        if s < 0:
            raise KeyError(h)
        return ColumnarBlock(self.pool, s)

    def get(self, h: bytes, default: Any = None) -> Any:
        s = self._slot(h)
        return default if s < 0 else ColumnarBlock(self.pool, s)

    def keys(self) -> list[bytes]:
        p = self.pool
        slots = self._slots()
        return [p._bytes(int(k), int(w)) for k, w in zip(p.slot_keys(slots), p.F[slots, F_W])]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.keys())

    def values(self) -> list[ColumnarBlock]:
        return [ColumnarBlock(self.pool, int(s)) for s in self._slots()]

    def items(self) -> list[tuple[bytes, ColumnarBlock]]:
        return [(b.block_hash, b) for b in self.values()]


class _CopiesView:
    """`RemotePool.copies` read from the arrays: (tier, hash) -> copies per KV cache group,
    only for hashes that are not exactly one copy in group 0."""

    __slots__ = ("pool",)

    def __init__(self, pool: ColumnarPool) -> None:
        self.pool = pool

    def _counts(self, s: int) -> list[int] | None:
        p = self.pool
        c0, tot = int(p.C[s, C_C0]), int(p.C[s, C_TOT])
        if tot == 1 and c0 == 1:
            return None
        counts = [c0]
        base = s * (MAX_GROUP + 1)
        for key, n in p.G.items():
            if base < key <= base + MAX_GROUP and n:
                g = key - base
                counts.extend([0] * (g + 1 - len(counts)))
                counts[g] = int(n)
        return counts

    def get(self, key: tuple[str, bytes], default: Any = None) -> Any:
        tier, h = key
        code = _TIER_CODES.get(tier)
        if code is None:
            return default
        s = _TierView(self.pool, code)._slot(h)
        if s < 0:
            return default
        counts = self._counts(s)
        return default if counts is None else counts

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and self.get(key) is not None  # type: ignore[arg-type]

    def items(self) -> list[tuple[tuple[str, bytes], list[int]]]:
        p = self.pool
        n = len(p.F)
        live = p.F[:n, F_TIER] > 0
        odd = np.flatnonzero(live & ~((p.C[:n, C_TOT] == 1) & (p.C[:n, C_C0] == 1)))
        odd = odd[np.argsort(p._store_order(odd), kind="stable")]
        out = []
        for s in odd.tolist():
            tier = _TIER_NAMES[int(p.F[s, F_TIER]) - 1]
            out.append(((tier, p._bytes(int(p.slot_keys(s)), int(p.F[s, F_W]))), self._counts(s) or []))
        return out

    def __len__(self) -> int:
        return len(self.items())

    def __bool__(self) -> bool:
        return len(self) > 0


# ---- the journal ----------------------------------------------------------------------

class JournalRows:
    """Rows `start..stop-1` of a `ColumnarPool`'s journal, as numpy views (see the module
    docstring): per row `op` (OP_STORED, OP_REMOVED, OP_CLEARED), `tier` (a tier code,
    `tier_names[code]`; -1 for a clear of every tier), `slot` (-1: no slot held it),
    `seq` (the vLLM batch), `store` (a stored block's row of the per-store arrays; for a
    removal the store row of the block it took, -1 when none; for a clear the number of
    copies it cleared), `key`/`width` (the hash, `pool.hash_of(key, width)`). The
    per-store arrays, whole (indexed by `store`): `store_key` (the store's hash, the key of
    its rows and of a removal that took its block), `parent`/`parent_width` (width 0: no
    parent), `token_start`/`token_count` into `tokens`, `tenant` (index + 1 into
    `pool.tenant_names`, 0: none)."""

    __slots__ = ("pool", "start", "stop", "op", "tier", "slot", "seq", "store", "key", "width", "store_counts")

    def __init__(self, pool: ColumnarPool, start: int) -> None:
        held = int(pool.S[S_JROWS])  # `start` a held row (local); start and stop are global
        self.pool, self.start, self.stop = pool, pool.journal_base + start, pool.journal_base + held
        self._columns(pool.J[start:held])
        # the per-store arrays are read through the pool when asked (`per_store`), as of these
        # counts: rows taken and not yet written (an app's placed ticks) hold no view of them,
        # and the pool grows them where they lie
        self.store_counts = pool.store_counts()

    def _columns(self, J: np.ndarray) -> None:
        self.op, self.tier, self.slot, self.seq = J[:, J_OP], J[:, J_TIER], J[:, J_SLOT], J[:, J_SEQ]
        self.store, self.width = J[:, J_STORE], J[:, J_WIDTH]
        self.key = J[:, J_KEY].view(np.uint64)

    def copy(self) -> JournalRows:
        """These rows in an array of their own (the per-store arrays still read through the
        pool): a reader that keeps them while the pool goes on (the app's placed blocks, until
        written) holds no view of the pool's J, which then grows and drops its rows where it
        lies (`_journal_reserve`, `release_journal`). One copy of the rows: with views held,
        an attached window's J grew into another array ~30 times per 100K vLLM events, each
        growth a copy of every row held, 25-35 ms of the subscriber thread."""
        rows = object.__new__(JournalRows)
        rows.pool, rows.start, rows.stop, rows.store_counts = self.pool, self.start, self.stop, self.store_counts
        n = len(self)
        J = self.op.base  # the array the columns are views of: their rows are one block of it
        if J is not None and J.ndim == 2 and J.shape[1] == NUM_J and J.dtype == np.int64 and J.flags.c_contiguous:
            first = (self.op.ctypes.data - J.ctypes.data) // J.strides[0]
            rows._columns(J[first:first + n].copy())  # (one copy of the block: half the time of seven columns)
        else:
            block = np.empty((n, NUM_J), np.int64)
            for col, name in ((J_OP, "op"), (J_TIER, "tier"), (J_SLOT, "slot"), (J_SEQ, "seq"),
                              (J_STORE, "store"), (J_WIDTH, "width")):
                block[:, col] = getattr(self, name)
            block[:, J_KEY] = self.key.view(np.int64)
            rows._columns(block)
        return rows

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def tier_names(self) -> list[str]:
        return list(_TIER_NAMES)

    def per_store(self) -> PoolStores:
        """The per-store arrays as of these rows (`PoolStores`), views to read and let go."""
        return PoolStores(self.pool, self.store_counts)

    store_key = property(lambda self: self.per_store().store_key, doc="Each store's hash key (`PoolStores`).")
    parent = property(lambda self: self.per_store().parent, doc="Each store's parent key (`StoreParents`).")
    parent_width = property(lambda self: self.per_store().parent_width, doc="Each store's parent's width code.")
    token_start = property(lambda self: self.per_store().token_start, doc="Where each store's token ids start.")
    token_count = property(lambda self: self.per_store().token_count, doc="How many token ids each store has.")
    tenant = property(lambda self: self.per_store().tenant, doc="Each store's tenant + 1 (0: none).")
    tokens = property(lambda self: self.per_store().tokens, doc="The token ids, every store's, in store order.")

    def token_ids(self, store: int) -> np.ndarray:
        """The token ids of stored block `store` (a view of the pool's token array)."""
        return self.per_store().token_ids(store)


class PoolStores:
    """A journalled pool's per-store arrays as of `ColumnarPool.store_counts` (`per_store`):
    `store_key`, `parent`, `parent_width`, `token_start`, `token_count`, `tenant` and
    `tokens` as `JournalRows` has them, views of the pool's arrays as they are when made.
    Rows below the counts are written once and kept for good, so a reader that keeps the
    pool and its counts (the app's log, `live_journal.StoreArrays`) reads them through a
    `PoolStores` made when it asks, holding no view of the pool's arrays in between: the
    pool then grows them where they lie (`_grow_rows`), where a kept view had each growth
    of the token ids copied whole."""

    __slots__ = ("store_key", "parent", "parent_width", "token_start", "token_count", "tenant", "tokens")

    def __init__(self, pool: ColumnarPool, counts: tuple[int, int, int, int]) -> None:
        o, npx, nrx, used = counts
        self.store_key = pool.K[:o, K_KEY]
        self.parent_width = pool.JS[:o]
        self.parent = StoreParents(self.store_key, self.parent_width, pool.PX[:npx])
        rx = pool.RX[:nrx]
        self.token_start, self.token_count = StoreRuns(rx, o, RX_TOK0), StoreRuns(rx, o, RX_NTOK)
        self.tenant = StoreRuns(rx, o, RX_TENANT)
        self.tokens = pool.tok[:used]

    def token_ids(self, store: int) -> np.ndarray:
        """The token ids of stored block `store` (a view of the pool's token array)."""
        a = int(self.token_start[store])
        return self.tokens[a:a + int(self.token_count[store])]


class _PerStore:
    """A per-store value the pool does not keep for each store, read as a field of the
    per-store rows would be read: `field[o]` for an int (an int), for an array of stores or a
    slice (an int64 or uint64 array), `np.asarray` whole; each made by `of` from what the pool
    keeps instead."""

    __slots__ = ()

    def __len__(self) -> int:
        raise NotImplementedError

    def of(self, stores: np.ndarray) -> np.ndarray:
        """The values of `stores` (an int64 array of stores below `len(self)`)."""
        raise NotImplementedError

    def __getitem__(self, o: Any) -> Any:
        n = len(self)
        if isinstance(o, slice):
            return self.of(np.arange(*o.indices(n)))
        if np.ndim(o) == 0:
            i = int(o)
            i = i + n if i < 0 else i
            if not 0 <= i < n:
                raise IndexError(f"store {int(o)} is not one of the {n:,} stores")
            return int(self.of(np.array([i], np.int64))[0])
        stores = np.asarray(o, np.int64)
        if len(stores) and (int(stores.min()) < 0 or int(stores.max()) >= n):
            raise IndexError(f"stores {stores.min()}..{stores.max()} are not all of the {n:,} stores")
        return self.of(stores)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.of(np.arange(len(self)))
        return out if dtype is None else out.astype(dtype)


class StoreParents(_PerStore):
    """`JournalRows.parent`: each store's parent hash key (0: none, its width 0), from the
    stores' keys (`keys`, K's) and widths and the explicit parents (`px`, PX's rows): a store
    that is not its event's first has the store before it as its parent (its event's block
    before), an event's first a row of `px`. Not kept per store: 8 bytes a store, where one
    row of 16 a stored event names a parent."""

    __slots__ = ("keys", "widths", "px")

    def __init__(self, keys: np.ndarray, widths: np.ndarray, px: np.ndarray) -> None:
        self.keys, self.widths, self.px = keys, widths, px

    def __len__(self) -> int:
        return len(self.widths)

    def of(self, stores: np.ndarray) -> np.ndarray:
        out = np.zeros(len(stores), np.uint64)
        has = np.asarray(self.widths[stores]) != 0
        chained = has
        if len(self.px):
            at = np.searchsorted(self.px[:, PX_STORE], stores)
            ok = at < len(self.px)
            explicit = has & ok
            explicit[ok] &= self.px[at[ok], PX_STORE] == stores[ok]
            out[explicit] = self.px[at[explicit], PX_KEY].view(np.uint64)
            chained = has & ~explicit
        out[chained] = self.keys[stores[chained] - 1]
        return out


class StoreRuns(_PerStore):
    """`JournalRows.token_count`, `.tenant` and `.token_start`: each store's token count,
    tenant (+ 1, 0 none) or token start (`column`: RX_NTOK, RX_TENANT, RX_TOK0), from the runs
    of stores (`rx`, RX's rows) they are in: a store's start is its run's first's, and as many
    ids on as the stores before it in its run have (each store's ids follow the one before's)."""

    __slots__ = ("rx", "n", "column")

    def __init__(self, rx: np.ndarray, n: int, column: int) -> None:
        self.rx, self.n, self.column = rx, n, column

    def __len__(self) -> int:
        return self.n

    def of(self, stores: np.ndarray) -> np.ndarray:
        rx = self.rx
        r = np.searchsorted(rx[:, RX_FIRST], stores, side="right") - 1
        if self.column == RX_TOK0:
            return rx[r, RX_TOK0] + (stores - rx[r, RX_FIRST]) * rx[r, RX_NTOK]
        return rx[r, self.column]


# ---- the pool -------------------------------------------------------------------------

class ColumnarPool:
    """One rank of one server (`RemotePool`'s model and reading API) in arrays; see the
    module docstring. `events` is accepted for the same constructor, never emitted to."""

    def __init__(self, source: str, rank: int = 0, events: Any = None, max_removed: int = 200_000,
                 server: str = "", capacity: int = 1024, journal: bool = False) -> None:
        self.source, self.rank, self.events, self.server = source, rank, events, server
        self.journal = bool(journal)
        self.max_removed = max_removed
        self.num_batches = 0
        self.num_cleared = 0
        self.last_batch_seq: int | None = None
        self.last_batch_time: float | None = None
        self.tenants: set[str] = set()
        self.tenant_names: list[str] = []
        self._tenant_ids: dict[str, int] = {}
        self.media: dict[str, dict[str, int]] = {}
        self.hits_by_session: dict[str | None, int] = {}
        self.num_unknown_events: dict[str, int] = {}
        self.groups: dict[int, GroupSpec] = {}
        # the reference's `details` but for a raw medium name a slot keeps (F_RAW): see `details`
        self._details: dict[tuple[str, bytes], dict[str, Any]] = {}
        self._raw_names: list[str] = [GPU, CPU]  # raw medium names by code (RM's rows)
        self._raw_codes: dict[str, int] = {GPU: 0, CPU: 1}
        self.RM = np.zeros((MAX_RAW, 4), np.int64)
        self.RM[1, RM_TIER] = _TIER_CODES[CPU]
        self._wide: dict[bytes, int] = {}
        self._wide_bytes: list[bytes] = []
        self._hits_synced = 0
        self.S = np.zeros(NUM_S, np.int64)
        self.S[S_MAXREM] = max_removed
        self.S[S_JON] = 1 if journal else 0
        self.J = np.zeros((1024 if journal else 0, NUM_J), np.int64)
        self.JS = np.zeros(1024 if journal else 0, np.uint8)  # each store's parent's width code
        self.PX = np.zeros((1024 if journal else 0, 2), np.int64)  # explicit parents (`StoreParents`)
        self.RX = np.zeros((1024 if journal else 0, 4), np.int64)  # the stores' runs (`StoreRuns`)
        self._journal_taken = 0  # global rows, as journal_since's
        self.journal_base = 0  # the global number of the first row J holds (rows before it released)
        self._journal_released_to = 0  # the furthest row a reader released
        # rows that arrived between the last drops (`release_journal`), oldest first (none
        # before the first), and the rows kept at the last: the journal's room after a drop
        self._journal_arrivals: tuple[int, ...] = (0,) * self._journal_drops_seen
        self._journal_kept = 0
        self._journal_rooms: list[np.ndarray] = []  # arrays J was held in, to hold it again (`_journal_array`)
        self.SF = np.zeros(2, np.float64)
        self.TI = np.zeros((MAX_TIERS, NUM_T), np.int64)
        self.G = _new_group_dict()
        self._alloc(capacity)
        self.tok = np.zeros(max(capacity * 16, 1024), np.uint16)  # widened to uint32 on the first id >= 2**16
        self.maps = _RemovalMaps()
        self.removed, self.departed_map = self.maps.removed, self.maps.departed  # removed_at's, departed's
        self._cache: dict[Any, Any] = {}
        self._revision = 0
        self._batch_blocks = 0
        self._left = np.zeros(64, np.uint8)  # per hash of a removal: it left its tier
        self._u64_widths = _EMPTY_U8  # `_run_columns`' widths: W_U64 for every key

    def _alloc(self, cap: int) -> None:
        # the hash and its parent's, a row a slot; a journalled pool's, the hash alone, a row a
        # store (grown with JS, kept for good: a slot reads its store's, `SO`), where its log
        # reads each stored and removed block's hash (`engine.core.live_journal.JournalKeys`)
        self.K = np.zeros((1024, 1) if self.journal else (cap, 2), np.uint64)
        # uint32 while every token start, batch row and store order fits (`_narrow_room`
        # renumbers or widens before one would not); a journalled pool's, the batch row alone
        self.L = np.zeros((cap, 1 if self.journal else 3), np.uint32)
        # a journalled pool's store's run (RX) has the tenant: its C has no C_TENANT column;
        # uint16 until a count would not fit (`_widen_counts`)
        self.C = np.zeros((cap, NUM_C_JOURNAL if self.journal else 6), np.uint16)
        self.S[S_CLIMIT] = C_LIMITS[self.C.dtype.char]
        # F_RAW, the fourth column, is added when the pool first sees a raw medium name
        # (`_raw_code`): a stream that names only GPU and CPU keeps 3 bytes a slot
        self.F = np.zeros((cap, 3), np.uint8)
        self.L[:, L_TOK] = np.arange(2, cap + 2)  # the free list: slot 0, 1, ... in order
        self.L[cap - 1, L_TOK] = 0
        self.S[S_FREE] = 1
        self.tab = self._new_table(cap)
        # journal: a slot's store row (int64 before one would pass 2**32 - 1: `_journal_reserve`)
        self.SO = np.zeros(cap if self.journal else 0, np.uint32)
        # the batch table: per batch that stored a block, its seq and time (a slot names its
        # row, L_BID); rows no held slot names go when it fills (`_batch_rows`)
        self.T = np.zeros(256, np.float64)
        self.BSEQ = np.zeros(256, np.int64)
        self._num_bids = 0

    @staticmethod
    def _table_size(cap: int) -> int:
        """Entries of the (tier, hash) table for `cap` slots: a load of at most 0.7 when
        every slot is used (linear probing stays short there), 4 bytes each."""
        return max(1024, (10 * cap) // 7 + 1)

    @classmethod
    def _new_table(cls, cap: int) -> np.ndarray:
        """An empty (tier, hash) table for `cap` slots: uint32 entries, 0 empty, else
        (fingerprint << (bits + d)) | (displacement << bits) | (slot + 1) where `bits` (the
        table's last entry) is the fewest that hold size + 1, d = `_disp_bits(bits)` (4 up
        to 2**20 entries, 3 at 1M slots, 0 from 2**24 entries) and the fingerprint is the
        rest of 32 bits of the mixed hash (8 bits at 1M slots, 11 before the displacement;
        7 at 10M, unchanged; at least 1 below 2**31 slots)."""
        size = cls._table_size(cap)
        bits = size.bit_length()
        if bits > 31:
            raise ValueError(f"a pool of {cap:,} slots is more than one table holds")
        tab = np.zeros(size + 1, np.uint32)
        tab[size] = bits
        return tab

    # ---- room before a compiled call ---------------------------------------------------

    def _reserve(self, blocks: int, tokens: int, ids: np.ndarray | None = None, block_tokens: int | None = None,
                 removals: int | None = None, most_id: int | None = None, events: int | None = None) -> None:
        """Room for `blocks` more blocks and `tokens` more token ids (`ids`: the ones that
        come, or `most_id` the largest of them, which widen the token array once to uint32
        when one is 2**16 or more; `block_tokens`: the most one block may take, at most
        `tokens`) and, in the removal maps, for `removals` more hashes (None: `blocks`; only
        a removal adds to them)."""
        if self.tok.dtype == np.uint16:
            if most_id is None and ids is not None and len(ids):
                most_id = int(ids.max())
            if most_id is not None and most_id > 0xFFFF:
                self.tok = self.tok.astype(np.uint32)
        live = int(self.S[S_LIVE])
        cap = len(self.F)
        if live + blocks > cap:
            new = max(cap + self._growth(cap, self._slots_small), live + blocks + 1024)
            n = cap
            for name in ("L", "C", "F", "SO") if self.journal else ("K", "L", "C", "F"):
                _grow_rows(self, name, new)
            # the new slots, in order, go before the free ones
            self.L[n:new, L_TOK] = np.arange(n + 2, new + 2)
            self.L[new - 1, L_TOK] = self.S[S_FREE]
            self.S[S_FREE] = n + 1
            if self._table_size(new) > len(self.tab) - 1:
                # a large pool's table is made for an eighth more slots than it has: its slots
                # grow by a sixteenth, the table (5.7 bytes a slot) is made again every other time
                self.tab = self._new_table(new + new // 8 if new >= 8 * self._slots_small else new)
                _rehash(self.tab, self.K, self.SO, self.F, n)
        used = int(self.S[S_TOKUSED])
        if used + tokens > len(self.tok):
            live_tok = int(self.S[S_TOKLIVE])
            size = max(live_tok + tokens + self._growth(live_tok + tokens, self._tokens_small), 1024)
            if self.journal:  # the journal's rows point into the token array: it only grows,
                # by a fraction (as the slots: doubling left up to half of it unused), copied
                # only while a reader holds a view of it (`PoolStores.tokens`, made when read)
                need = used + tokens + 1024
                _grow_rows(self, "tok", max(len(self.tok) + self._copied_growth(len(self.tok), self._tokens_small),
                                            need), max(len(self.tok) + len(self.tok) // 2, need))
                out = self.tok
            elif used - live_tok <= used // 64:  # next to no garbage: a plain copy, no compaction
                # (a walk over every slot that cost as much as the copies' page faults)
                _grow_rows(self, "tok", max(used + tokens + self._growth(used + tokens, self._tokens_small), 1024))
                out = self.tok
            else:
                if live_tok * 2 < used and live_tok + tokens <= len(self.tok):
                    size = len(self.tok)  # mostly garbage: compact in place of growing
                out = np.zeros(size, self.tok.dtype)
                self.S[S_TOKUSED] = _compact_tokens(self.C, self.L, self.F, self.tok, len(self.F), out)
            self.tok = out
        self._narrow_room(blocks, tokens)
        removals = blocks if removals is None else removals
        self.maps.reserve(removals, self.max_removed)
        if self.journal:
            self._journal_reserve(blocks, blocks, blocks if events is None else events)
            # (a store row, slot or batch row past 2**32 - 1 widened L and SO: `_narrow_room`,
            # `_journal_reserve`)
        self._fit_16bit(tokens if block_tokens is None else block_tokens)  # a block's token count

    # Below these sizes an array grows by half again, up to 8 times them by an eighth, above
    # by a sixteenth: a new pool reaches its size in a few growths (each copies every slot
    # and rehashes the table: an eighth at a time made 15 of them on the way to 36,000
    # blocks, a third of the apply), and a large one keeps at most a seventeenth of its room
    # idle. At 16 token ids a block, a held block was 93.3 bytes with no room (55 of slot
    # before its counts were uint16, 5.7 of table, 32 of token ids); an eighth idle in slots
    # and token ids was up to 105, a sixteenth is at most 99.1 at any size (`bench attach`'s
    # columnar_memory, 1M blocks)
    _slots_small = 1 << 16
    _tokens_small = 1 << 20
    _rows_small = 1 << 16

    @staticmethod
    def _copied_growth(size: int, small: int) -> int:
        """`_growth` for an array that is copied whole into a new one when it grows while a
        reader holds a view of it (a journalled pool's token ids and store rows: `_grow_rows`
        resizes them in place only when none does): half again up to 8 times `small`, then a
        sixty-fourth when resized in place; copied, always half again (`_reserve` and
        `_journal_reserve` give `_grow_rows` both sizes): a sixteenth copied the token ids
        ~16 times over past 8M of them, each copy into fresh pages whose faults (kernel time)
        made the app's pool stage grow faster than its stream (400K events). An eighth at a time was ~17
        copies (and a new array's page faults each) on the way to 8M token ids, most of a
        journalled pool's room-making: 200K recorded events into a journalled pool, taking
        and releasing its rows after every 64 frames, 0.3033 -> 0.2848 s (median of 9).
        In place, a growth moves the pages where they lie (realloc) and zeroes the new room,
        so that room is resident from the start (a copy's was untouched pages): a sixteenth
        kept up to 2 B a block of a 10M-block pool's token ids idle and resident (bench held:
        96.0 -> 97.2 B a block once nothing held a view of them), a sixty-fourth at most 0.5,
        for more reallocs of as many new bytes in all."""
        return size // 2 if size < 8 * small else size // 64

    @staticmethod
    def _growth(size: int, small: int) -> int:
        """How many more an array of `size` gets when it grows (`size` below `small`: half
        again; below 8 * `small`: an eighth; above: a sixteenth)."""
        return size // 2 if size < small else size // 8 if size < 8 * small else size // 16

    # The most a uint32 column of L holds, and the store order renumbered past it (class
    # attributes, so tests can make them small).
    _narrow_limit = (1 << 32) - 1
    _order_limit = (1 << 32) - 1

    def _narrow_room(self, blocks: int, tokens: int) -> None:
        """Before a compiled call on a uint32 L: renumber the store orders when they would
        pass what it holds (only their order is ever read), and widen L to int64 once when
        the token ids would (a pool of more than 4G held token ids)."""
        if self.L.dtype != np.uint32:
            return
        limit = self._narrow_limit
        if self.journal:  # (its L keeps no token start or store order)
            if len(self.F) + 2 > limit or self._num_bids + 2 > limit:
                self._widen()
            return
        if int(self.S[S_ORDER]) + blocks > self._order_limit:
            live = np.flatnonzero(self.F[:, F_TIER] > 0)
            ranks = np.empty(len(live), np.int64)
            ranks[np.argsort(self.L[live, L_ORDER], kind="stable")] = np.arange(len(live))
            self.L[live, L_ORDER] = ranks
            self.S[S_ORDER] = len(live)
        if int(self.S[S_TOKUSED]) + tokens > limit or len(self.F) + 2 > limit or self._num_bids + 2 > limit \
                or int(self.S[S_ORDER]) + blocks > limit:
            self._widen()

    def _batch_rows(self, seqs: np.ndarray, tss: np.ndarray) -> None:
        """Rows of the batch table for batches about to be applied; the first is S_BID.
        When the table is full, the rows no held slot names are dropped (the slots' rows
        renumbered, in order), and it grows if it is still more than half full."""
        k = len(seqs)
        nb = self._num_bids
        if nb + k > len(self.T):
            T, BSEQ = np.zeros(len(self.T), np.float64), np.zeros(len(self.T), np.int64)
            nb = _drop_unnamed_bids(self.F, self.L, nb, self.T, self.BSEQ, T, BSEQ)
            if 2 * (nb + k) > len(T):
                size = max(2 * len(T), 2 * (nb + k))
                T = np.concatenate([T[:nb], np.zeros(size - nb, np.float64)])
                BSEQ = np.concatenate([BSEQ[:nb], np.zeros(size - nb, np.int64)])
            self.T, self.BSEQ = T, BSEQ
        if self.L.dtype == np.uint32 and nb + k > self._narrow_limit:
            self._widen()
        self.T[nb:nb + k] = tss
        self.BSEQ[nb:nb + k] = seqs
        self.S[S_BID] = nb
        self._num_bids = nb + k

    def _journal_reserve(self, rows: int, stores: int, events: int = 0) -> None:
        # the store rows grow with every block held: by a fraction (`_growth`), not doubling
        # (resized where they lie unless a reader holds a view of them: `_grow_rows`). The
        # rows (J) hold only what the reader has not released, dropped when it does
        # (`release_journal`): they grow by half again, where they lie while no reader's rows
        # refer to them (the app's feed copies what it takes, `JournalRows.copy`), else into
        # an array they were held in before when one is free (`_journal_array`). An attached
        # window's backlog (the rows its GUI ticks have not committed) grew them 28-35 times
        # per 100K vLLM events by an eighth, 33-50 ms of the subscriber thread; into other
        # arrays by half again while its feed held views, 25-35 ms
        r, o = int(self.S[S_JROWS]), int(self.S[S_JSTORES])
        if r + rows > len(self.J):
            size = max(len(self.J) + len(self.J) // 2, r + rows + SLACK_ROWS)
            try:  # where it lies (realloc) while no reader's rows refer to it (`JournalRows.copy`)
                self.J.resize((size, NUM_J))
            except ValueError:  # else into an array held before of any size (its memory is
                # held either way; a new one leaves at most half again the room)
                J = self._journal_array(size, None, size)
                J[:r] = self.J[:r]
                self._hold_journal(J)
        # (K: a row per store; PX at most a row per stored event, `StoreParents`)
        for name, used, more in (("JS", o, stores), ("K", o, stores), ("PX", int(self.S[S_NPX]), events),
                                 ("RX", int(self.S[S_NRX]), min(stores, 3 * events))):
            have = len(getattr(self, name))
            if used + more > have:
                need = used + more + 1024
                _grow_rows(self, name, max(have + self._copied_growth(have, self._rows_small), need),
                           max(have + have // 2, need))
        if o + stores > self._narrow_limit:
            self._widen()

    def _widen(self) -> None:
        """L and SO in int64 from now on, both at once when one of them would no longer hold
        a value (the compiled loops get one more specialization, not one per column; a pool
        without a journal widens its empty SO for the same), and C in uint32 with them if it
        is not yet. Rows given out before keep the narrow arrays, exact for theirs."""
        self._widen_counts()
        if self.L.dtype != np.int64:
            self.L = self.L.astype(np.int64)
        if self.SO.dtype != np.int64:
            self.SO = self.SO.astype(np.int64)

    def _fit_16bit(self, value: int) -> None:
        """C wide enough for `value`: a block's token count or a tenant number, which it keeps
        in 16 bits while they fit (the counts: `_count_room`; a journalled pool's runs of
        stores, RX, keep them in int64)."""
        if value > 0xFFFF and not self.journal:  # (a journalled pool's C has counts of copies alone)
            self._widen_counts()

    def _frames_widening(self, n: int, bid: int, run: Any) -> None:
        """`run(done)` (a compiled run of frames from frame `done` on, which returns how many
        it applied: it stops before a frame whose hashes C may not count) until all `n` are
        applied, C widened each time it stops; frame f's batch row is `bid` + f."""
        done = 0
        while True:
            self.S[S_BID] = bid + done
            done += run(done)
            if done == n:
                return
            self._widen_counts()

    def _count_room(self, hashes: int) -> None:
        """C wide enough for a batch naming `hashes` hashes (each adds at most one announcement)."""
        if int(self.S[S_CMAX]) + hashes > int(self.S[S_CLIMIT]):
            self._widen_counts()

    def _widen_counts(self) -> None:
        """C in uint32 from now on: a count, a block's token count or a tenant number would
        soon pass 2**16 - 1. Its own widening, before `_widen`'s (which makes it too): a hot
        prefix's announcements pass it on a long-lived server, where nothing else is near its
        limit. Three layouts, not four: C narrow with L narrow, C wide with either."""
        if self.C.dtype != np.uint32:
            self.C = self.C.astype(np.uint32)
        self.S[S_CLIMIT] = C_LIMITS[self.C.dtype.char]

    def _token_range(self, s: int) -> tuple[int, int]:
        """Where held slot s's token ids start in `tok`, and how many."""
        if self.journal:  # its first store's (the store row that made it: SO)
            o, stores = int(self.SO[s]), self.per_store()
            return stores.token_start[o], stores.token_count[o]
        return int(self.L[s, L_TOK]), int(self.C[s, C_NTOK])

    def slot_keys(self, slots: Any) -> Any:
        """The hash keys (uint64) held by slots `slots` (an int or an array of them): K's
        rows, or in a journalled pool, whose K has a row per store, their stores' (`SO`)."""
        return self.K[self.SO[slots], K_KEY] if self.journal else self.K[slots, K_KEY]

    def store_counts(self) -> tuple[int, int, int, int]:
        """A journalled pool's stores, rows of PX, runs of RX and token ids so far: what
        `per_store` reads (each row below them written once and kept for good)."""
        S = self.S
        return int(S[S_JSTORES]), int(S[S_NPX]), int(S[S_NRX]), int(S[S_TOKUSED])

    def per_store(self, counts: tuple[int, int, int, int] | None = None) -> PoolStores:
        """The per-store arrays as of `counts` (`store_counts`; None: now), as views (`PoolStores`)."""
        return PoolStores(self, self.store_counts() if counts is None else counts)

    def _store_order(self, slots: np.ndarray) -> np.ndarray:
        """Held slots' store orders, to sort them by (a journalled pool's store rows)."""
        return self.SO[slots] if self.journal else self.L[slots, L_ORDER]

    def _jn(self) -> tuple:
        return self.J, self.JS, self.SO, self.PX, self.RX

    # ---- keys --------------------------------------------------------------------------

    def _key(self, h: bytes) -> tuple[int, int] | None:
        """(k, w) of a canonical hash; None for a digest this pool never saw."""
        if len(h) == 8:
            return int.from_bytes(h, "big"), W_U64
        k = self._wide.get(h)
        return None if k is None else (k, W_WIDE)

    def _key_new(self, h: bytes) -> tuple[int, int]:
        if len(h) == 8:
            return int.from_bytes(h, "big"), W_U64
        k = self._wide.get(h)
        if k is None:
            k = self._wide[h] = len(self._wide_bytes)
            self._wide_bytes.append(h)
        return k, W_WIDE

    def _bytes(self, k: int, w: int) -> bytes:
        return k.to_bytes(8, "big") if w == W_U64 else self._wide_bytes[k]

    def _tenant_id(self, name: str | None) -> int:
        if name is None:
            return -1
        i = self._tenant_ids.get(name)
        if i is None:
            i = self._tenant_ids[name] = len(self.tenant_names)
            self.tenant_names.append(name)
            self._fit_16bit(i + 1)  # (C_TENANT, or a journalled pool's store row, keeps i + 1)
        return i

    # ---- applying ----------------------------------------------------------------------

    def apply(self, batch: ColumnarBatch | VllmBatch) -> list:
        """Apply one batch in sequence order (a `fastwire.ColumnarBatch`, or any VllmBatch);
        returns [] (the columnar pool emits no Cachescope events)."""
        cols = batch if isinstance(batch, ColumnarBatch) else fastwire.columns_of(batch)
        if cols.events:
            cols = self._common_media(cols)
        self.num_batches += 1
        self.last_batch_seq = cols.seq
        self.last_batch_time = cols.ts
        self._revision += 1
        self._cache.clear()
        n = len(cols.rows)
        if not n:
            return []
        keys = cols.keys
        parents = cols.parents
        rare = cols.events
        if rare:  # fill the columns of the events Python decodes
            widths = np.full(len(keys), W_U64, np.uint8)
            tiers = np.zeros(n, np.int64)
            tiers[cols.rows[:, R_MEDIUM] == 2] = 1
            groups = np.zeros(n, np.int64)
            rawgpu = (cols.rows[:, R_MEDIUM] <= 1).astype(np.uint8)
            keys = self._rare_columns(cols, keys, widths, tiers, groups, rawgpu)
            widths = self._widths
            parents = self._parents
        else:
            widths, tiers, groups, rawgpu = np.full(len(keys), W_U64, np.uint8), _EMPTY_I64, _EMPTY_I64, _EMPTY_U8
        rows = cols.rows
        nblocks = self._batch_blocks = int(rows[:, R_NHASH].sum())
        self._reserve(nblocks, len(cols.tokens), cols.tokens, int(rows[:, R_NTOK].max()), _num_removals(rows),
                      events=len(rows))
        self._count_room(nblocks)
        self._batch_rows(np.array([cols.seq], np.int64), np.array([cols.ts], np.float64))
        most = int(rows[:, R_NHASH].max())
        if len(self._left) < most:
            self._left = np.zeros(2 * most, np.uint8)
        left = self._left
        i = 0
        while i < n:
            i = _run_py(self.tab, self.K, self.L, self.C, self.F, self.T, self.G, self.tok, self.S, self.SF,
                     self.TI, *self.maps.compiled(), rows, parents, keys, widths, cols.tokens, tiers, groups,
                     rawgpu, i, bool(self._details), cols.seq, cols.ts, left, n, *self._jn(), self.RM)
            self._sync()
            if i < n:
                self._apply_rare(cols, i, rare.get(i), keys, widths, tiers, groups, rawgpu, parents, left)
                i += 1
        if self.S[S_LIVE] == 0 and not self.journal:
            self.S[S_TOKUSED] = 0
            self.C[:, C_NTOK] = 0  # no free slot's token range is kept past this
        return []

    def apply_many(self, batches: list[ColumnarBatch | VllmBatch]) -> list:
        """Apply batches in sequence order, as `apply` applies each one, but every run of
        batches made only of common events (no event kept whole) in one compiled call;
        the pool after it is the pool after applying them one by one; consecutive frames of
        one `fastwire.decode_columns_many` call (an attachment's usual run) from the arrays
        that call read them into (`_apply_decoded`). Returns []."""
        decoded = getattr(batches[0], "run", None) if batches else None
        if decoded is not None and not self._details and self._one_run(decoded, batches):
            self._apply_decoded([(decoded, batches)])
            return []
        run: list[ColumnarBatch] = []
        for batch in batches:
            if isinstance(batch, ColumnarBatch):
                if not batch.events:
                    run.append(batch)
                    continue
                batch = self._common_media(batch)
                if not batch.events:
                    run.append(batch)
                    continue
            if run:
                self._apply_run(run)
                run = []
            self.apply(batch)
        if run:
            self._apply_run(run)
        return []

    @staticmethod
    def _one_run(decoded: DecodedRun, batches: list) -> bool:
        """Whether `batches` are consecutive frames of `decoded`, none of them with an event kept whole."""
        f0 = batches[0].run_at
        return all(map(is_, map(_RUN, batches), repeat(decoded))) and not any(map(_EVENTS, batches)) \
            and list(map(_RUN_AT, batches)) == list(range(f0, f0 + len(batches)))

    def _apply_decoded(self, pieces: list[tuple[DecodedRun, list[ColumnarBatch]]]) -> None:
        """Pieces of `decode_columns_many` calls (each consecutive frames of common events of
        one call) from their arrays as they are, a compiled call (`_run_decoded`) a piece:
        the figures room is made by were noted per frame by the calls' passes
        (`_decoded_figures`), no frame's arrays are read or joined in Python. Room and batch
        rows are made once for all the pieces, as the join route makes them for the same
        frames (so both give the same slots)."""
        run = pieces[0][1] if len(pieces) == 1 else [b for _, piece in pieces for b in piece]
        k = len(run)
        seqs = np.fromiter(map(_SEQ, run), np.int64, k)
        figures = []
        for decoded, piece in pieces:
            f0 = piece[0].run_at
            figures.append(_decoded_figures(decoded.meta, f0, f0 + len(piece)))
        if len(pieces) == 1:
            tss = pieces[0][0].tss[pieces[0][1][0].run_at:pieces[0][1][0].run_at + k]
            num_rows, nblocks, most_tokens, most, removals, num_tokens, most_id = figures[0]
        else:
            tss = np.concatenate([d.tss[p[0].run_at:p[0].run_at + len(p)] for d, p in pieces])
            num_rows, nblocks, most_tokens, most, removals, num_tokens, most_id = (
                f(column) for f, column in zip((sum, sum, max, max, sum, sum, max), zip(*figures)))
        self.num_batches += k
        self.last_batch_seq = int(seqs[-1])
        self.last_batch_time = float(tss[-1])
        self._revision += 1
        self._cache.clear()
        if not num_rows:
            return
        self._batch_blocks = nblocks
        self._reserve(nblocks, num_tokens, None, most_tokens, removals, most_id, events=num_rows)
        if len(self._left) < most:
            self._left = np.zeros(2 * most, np.uint8)
        self._batch_rows(seqs, tss)
        if len(self._u64_widths) < nblocks:  # (only read: one array of W_U64 kept for every call)
            self._u64_widths = np.full(2 * nblocks, W_U64, np.uint8)
        bid = int(self.S[S_BID])
        at = 0
        for decoded, piece in pieces:
            n = len(piece)
            data = decoded.data
            # (the piece's batch rows from bid + at on: `_batch_rows` made them all)
            self._frames_widening(n, bid + at, lambda done: _run_decoded_py(
                self.tab, self.K, self.L, self.C, self.F, self.T, self.G, self.tok, self.S, self.SF, self.TI,
                *self.maps.compiled(), decoded.meta, decoded.rows, data, data.view(np.uint32), self._u64_widths,
                piece[0].run_at + done, seqs[at + done:at + n], tss[at + done:at + n], self._left, *self._jn(),
                self.RM))
            at += n
        self._sync()

    def _apply_run(self, run: list[ColumnarBatch]) -> None:
        if self._details or len(run) == 1:  # removals must drop details: one by one
            for batch in run:
                self.apply(batch)
            return
        decoded = run[0].run
        if decoded is not None and self._one_run(decoded, run):
            self._apply_decoded([(decoded, run)])
            return
        if all(map(_RUN, run)):  # pieces of several runs: an attachment holds 64 frames across its reads
            pieces = _pieces(run)
            if all(self._one_run(piece[0].run, piece) for piece in pieces):
                self._apply_decoded([(piece[0].run, piece) for piece in pieces])
                return
        # each figure a frame's attribute read by map (C), not a comprehension: 14,000 frames
        # took ~5 ms in comprehensions, a tenth of the Python around the compiled call
        seqs = np.fromiter(map(_SEQ, run), np.int64, len(run))
        tss = np.fromiter(map(_TS, run), np.float64, len(run))
        rows = list(map(_ROWS, run))
        per = list(map(len, rows))
        bounds = np.zeros(len(run) + 1, np.int64)
        np.cumsum(per, out=bounds[1:])
        if 0 in per:
            full = [b for b, n in zip(run, per) if n]
            if not full:
                self._run_columns(seqs[:0], None, None, None, bounds, seqs, tss)
                return
            rows = list(map(_ROWS, full))
            num_rows = [n for n in per if n]
        else:
            full, num_rows = run, per
        data = list(map(_DATA, full))
        if all(map(_IS_NOT, data, repeat(None))):  # every frame from the one-pass reader: its data joined
            sizes = np.array([num_rows, list(map(_NUM_KEYS, full)), list(map(_NUM_TOKENS, full)),
                              list(map(len, data))], np.int64).T.copy()
            rows, data = np.concatenate(rows), np.concatenate(data)
            parents = np.empty(len(rows), np.uint64)
            *figures, most_id = _join_data(rows, data, sizes, parents)
            # the token ids are the joined data's uint32 view, hashes and parents between them:
            # how many and the largest are given, not read from it
            self._run_columns(rows, parents, data, data.view(np.uint32), bounds, seqs, tss, tuple(figures),
                              int(sizes[:, 2].sum()), int(most_id))
            return
        keys, tokens = [b.keys for b in full], [b.tokens for b in full]
        # one compiled pass for the starts' fix-ups and the figures _reserve needs: numpy's
        # repeat, cumsum and four strided reductions over rows cost more than the pass
        sizes = np.array([num_rows, list(map(len, keys)), list(map(len, tokens))], np.int64).T.copy()
        rows, keys, tokens = np.concatenate(rows), np.concatenate(keys), np.concatenate(tokens)
        parents = np.concatenate([b.parents for b in full])
        self._run_columns(rows, parents, keys, tokens, bounds, seqs, tss, _join_starts(rows, sizes))

    def _run_columns(self, rows: np.ndarray, parents: Any, keys: Any, tokens: Any, bounds: np.ndarray,
                     seqs: np.ndarray, tss: np.ndarray, figures: tuple | None = None, num_tokens: int | None = None,
                     most_id: int | None = None) -> None:
        """Frames of common events in one compiled call: frame f is rows bounds[f]..bounds[f+1]-1
        (hashes and token ids of all frames concatenated, the rows' starts counting from 0);
        `figures`: what `_join_starts` returns for rows, when it has read them."""
        self.num_batches += len(seqs)
        self.last_batch_seq = int(seqs[-1])
        self.last_batch_time = float(tss[-1])
        self._revision += 1
        self._cache.clear()
        if not len(rows):
            return
        if figures is None:
            figures = (int(rows[:, R_NHASH].sum()), int(rows[:, R_NTOK].max()), int(rows[:, R_NHASH].max()),
                       _num_removals(rows))
        nblocks, most_tokens, most, removals = figures
        self._batch_blocks = nblocks
        if num_tokens is None:
            self._reserve(nblocks, len(tokens), tokens, most_tokens, removals, events=len(rows))
        else:  # (`tokens` a view of more than token ids: `_apply_run`'s joined data)
            self._reserve(nblocks, num_tokens, None, most_tokens, removals, most_id, events=len(rows))
        if len(self._left) < most:
            self._left = np.zeros(2 * most, np.uint8)
        self._batch_rows(seqs, tss)
        if len(self._u64_widths) < len(keys):  # (only read: one array of W_U64 kept for every call)
            self._u64_widths = np.full(2 * len(keys), W_U64, np.uint8)
        self._frames_widening(len(seqs), int(self.S[S_BID]), lambda done: _run_frames_py(
            self.tab, self.K, self.L, self.C, self.F, self.T, self.G, self.tok, self.S, self.SF, self.TI,
            *self.maps.compiled(), rows, parents, keys, self._u64_widths[:len(keys)], tokens, bounds[done:],
            seqs[done:], tss[done:], self._left, *self._jn(), self.RM))
        self._sync()


    def _rare_columns(self, cols: ColumnarBatch, keys: np.ndarray, widths: np.ndarray, tiers: np.ndarray,
                      groups: np.ndarray, rawgpu: np.ndarray) -> np.ndarray:
        """Keys, widths, tiers, groups and parents of the events kept whole (rare ones)."""
        rows = cols.rows
        counts = rows[:, R_NHASH].copy()
        for i, e in cols.events.items():
            counts[i] = len(e.block_hashes)
        total = int(counts.sum())
        starts = np.cumsum(counts) - counts
        if total != len(keys) or np.any(starts != rows[:, R_HASH0]):
            new_keys = np.zeros(total, np.uint64)
            new_w = np.full(total, W_U64, np.uint8)
            for i in range(len(rows)):
                if i not in cols.events and counts[i]:
                    a = rows[i, R_HASH0]
                    new_keys[starts[i]:starts[i] + counts[i]] = keys[a:a + counts[i]]
            rows = cols.rows = rows.copy()
            rows[:, R_HASH0] = starts
            rows[:, R_NHASH] = counts
            keys, widths = new_keys, new_w
        parents = cols.parents.copy()
        pws = np.zeros(len(rows), np.uint8)
        for i, e in cols.events.items():
            a = int(starts[i])
            for j, h in enumerate(e.block_hashes):
                k, w = self._key_new(h)
                keys[a + j] = k
                widths[a + j] = w
            kind = KIND_STORED if e.kind == "BlockStored" else KIND_REMOVED if e.kind == "BlockRemoved" else \
                KIND_CLEARED if e.kind == "AllBlocksCleared" else 3
            rows[i, R_KIND] = kind
            tiers[i] = tier_code(tier_of_medium(e.medium))
            groups[i] = min(max(e.group_idx or 0, 0), MAX_GROUP)
            rawgpu[i] = (e.medium or MEDIUM_DEFAULT) == MEDIUM_DEFAULT
            if e.parent_block_hash is not None:
                k, w = self._key_new(e.parent_block_hash)
                parents[i] = k
                pws[i] = w
                rows[i, R_PARENT] = 1 if w == W_U64 else 2
            else:
                rows[i, R_PARENT] = 0
        self._widths, self._parents, self._pws = widths, parents, pws
        return keys

    def _raw_code(self, raw: str) -> int | None:
        """The code of a raw medium name (RM's row), made on first sight; None past MAX_RAW names."""
        c = self._raw_codes.get(raw)
        if c is None:
            if len(self._raw_names) >= MAX_RAW:
                return None
            c = self._raw_codes[raw] = len(self._raw_names)
            self._raw_names.append(raw)
            tier = tier_of_medium(raw)
            self.RM[c, RM_TIER] = tier_code(tier)
            self.RM[c, RM_SLOT] = 0 if raw == tier else c
            if raw != tier:
                self._add_raw_column()
        return c

    def _add_raw_column(self) -> None:
        """F gets its F_RAW column (0: the tier's own name) before a slot is given a raw code."""
        if self.F.shape[1] <= F_RAW:
            F = np.zeros((len(self.F), F_RAW + 1), np.uint8)
            F[:, :F_RAW] = self.F
            self.F = F

    def _slot_raw(self, s: Any) -> Any:
        """F_RAW of slot(s) s: 0 while F has no such column."""
        if self.F.shape[1] <= F_RAW:
            return np.zeros(len(s), np.uint8) if isinstance(s, (slice, np.ndarray)) else 0
        return self.F[s, F_RAW]

    def _common_media(self, cols: ColumnarBatch) -> ColumnarBatch:
        """`cols` with every event that is rare only for its medium's name (a connector's
        `DISK`, `cpu`, `cuda:0`: fastwire decodes GPU and CPU alone) made common, its row
        naming the pool's code c of that name (`_medium_row`), so the compiled loop applies
        it; the batch given is left as it was."""
        rows = cols.rows
        common = []
        for i, e in cols.events.items():
            # R_MEDIUM 3: fastwire read this event's fields (a batch from `columns_of` has 0)
            if rows[i, R_MEDIUM] == 3 and rows[i, R_WIDTH] == 8 and rows[i, R_PARENT] != 2 \
                    and rows[i, R_KIND] in (KIND_STORED, KIND_REMOVED) and _names_only_a_medium(e):
                c = self._raw_code(e.medium)
                if c is not None:
                    common.append((i, c))
        if not common:
            return cols
        rows = rows.copy()
        events = dict(cols.events)
        for i, c in common:
            rows[i, R_RARE] = 0
            rows[i, R_MEDIUM] = _medium_row(int(self.RM[c, RM_TIER]), c)
            del events[i]
        return ColumnarBatch(cols.seq, cols.ts, cols.data_parallel_rank, rows, cols.parents, cols.keys, cols.tokens,
                             events, cols.payload)

    def _sync(self) -> None:
        """Counts the compiled loop keeps (stores per raw medium name, hits without a
        session) into the dicts, in the order they came."""
        seen = int(self.S[S_MEDIA_SEEN])
        if seen:
            self.S[S_MEDIA_SEEN] = 0
            RM = self.RM
            for c in RM[:seen, RM_ORDER].tolist():
                raw = self._raw_names[c]
                names = self.media.setdefault(_TIER_NAMES[int(RM[c, RM_TIER])], {})
                names[raw] = names.get(raw, 0) + int(RM[c, RM_COUNT])
                RM[c, RM_COUNT] = 0
        delta = int(self.S[S_HITS]) - self._hits_synced
        if delta:
            self.hits_by_session[None] = self.hits_by_session.get(None, 0) + delta
            self._hits_synced = int(self.S[S_HITS])

    def _apply_rare(self, cols: ColumnarBatch, i: int, e: VllmEvent | None, keys: np.ndarray, widths: np.ndarray,
                    tiers: np.ndarray, groups: np.ndarray, rawgpu: np.ndarray, parents: np.ndarray,
                    left: np.ndarray) -> None:
        rows = cols.rows
        kind = int(rows[i, R_KIND])
        h0, nh = int(rows[i, R_HASH0]), int(rows[i, R_NHASH])
        if e is None:  # a common event the loop stopped at (a removal while details are kept)
            t = int(_medium_of(rows[i, R_MEDIUM])[0])
            if len(widths) < len(keys):
                widths = np.full(len(keys), W_U64, np.uint8)
            medium_name = _TIER_NAMES[t]
            group_idx = None
        else:
            t = int(tiers[i])
            medium_name = tier_of_medium(e.medium)
            group_idx = e.group_idx
        if kind == KIND_STORED:
            self._rare_store(cols, i, e, keys, widths, tiers, groups, rawgpu, parents)
        elif kind == KIND_REMOVED:
            left[:max(nh, 1)] = 0
            g = -1 if group_idx is None else min(max(group_idx, -1), MAX_GROUP)
            if g < 0 and group_idx is not None:
                g = 0
            _remove_py(self.tab, self.K, self.L, self.C, self.F, self.T, self.G, self.tok, self.S, self.SF,
                       self.TI, *self.maps.compiled(), t, g, keys, widths, h0, nh, cols.seq, cols.ts, left, self.J,
                       self.SO)
            if self._details:
                for j in np.flatnonzero(left[:nh]).tolist():
                    self._details.pop((medium_name, self._bytes(int(keys[h0 + j]), int(widths[h0 + j]))), None)
        elif kind == KIND_CLEARED:
            self._clear(e.medium if e is not None else None, cols.seq)
        else:  # a type a newer server added: counted, never fatal
            self.num_unknown_events[e.kind] = self.num_unknown_events.get(e.kind, 0) + 1

    def _rare_store(self, cols: ColumnarBatch, i: int, e: VllmEvent, keys: np.ndarray, widths: np.ndarray,
                    tiers: np.ndarray, groups: np.ndarray, rawgpu: np.ndarray, parents: np.ndarray) -> None:
        rows = cols.rows
        nh = len(e.block_hashes)
        if not nh:
            return
        h0 = int(rows[i, R_HASH0])
        t = int(tiers[i])
        group = int(groups[i])
        raw_medium = e.medium or MEDIUM_DEFAULT
        medium = tier_of_medium(raw_medium)
        c = self._raw_code(raw_medium)
        raw_code = int(self.RM[c, RM_SLOT]) if c is not None else 0 if raw_medium == medium else RAW_IN_DETAILS
        if raw_code:
            self._add_raw_column()
        nxt = False
        if e.parent_block_hash is None and raw_medium == MEDIUM_DEFAULT:
            last = e.block_hashes[-1]
            for j in range(i + 1, len(rows)):
                if rows[j, R_KIND] == KIND_STORED and rawgpu[j] and groups[j] == group:
                    later = cols.events.get(j)
                    if later is not None:
                        nxt = later.parent_block_hash == last
                    else:
                        nxt = rows[j, R_PARENT] == 1 and len(last) == 8 and int(parents[j]) == int.from_bytes(last, "big")
                    break
        raw = e.token_bytes
        if not raw and e.token_ids:
            raw = np.asarray(e.token_ids, np.uint32).tobytes()
        # writable, as the compiled loop's own token ids are: a read-only array is another
        # signature of `_store` to compile (7 s each on this machine)
        ftok = np.frombuffer(bytearray(raw), np.uint32) if raw else np.zeros(0, np.uint32)
        self._reserve(nh, len(ftok), ftok, removals=0, events=nh)  # (a salt a block: a run each)
        salts = np.full(nh, -1, np.int64)
        salt_names: list[str] = []
        extra = e.extra_keys
        if extra is not None:
            for j in range(min(nh, len(extra))):
                if extra[j] is not None:
                    salt = salt_of(extra[j], e.lora_name)
                    if salt is not None:
                        salts[j] = self._tenant_id(salt)
                        salt_names.append(salt)
        tenant = self._tenant_id(e.cache_salt)
        pk, pw = (self._key_new(e.parent_block_hash) if e.parent_block_hash is not None else (0, 0))
        r = _store_py(self.tab, self.K, self.L, self.C, self.F, self.T, self.G, self.tok, self.S, self.SF,
                      self.TI, *self.maps.compiled()[:6], self.removed.os, t, raw_code, bool(rawgpu[i]), group, keys,
                      widths, h0, nh, 1 if pw else 0, np.uint64(pk), np.uint8(pw), ftok, 0, len(ftok),
                      e.block_size or 0, tenant, salts, nxt, cols.seq, cols.ts, *self._jn())
        if r == 1:
            self.S[S_HITS] -= nh  # the loop counts hits without a session; this one names its own
            self.hits_by_session[e.session_id] = self.hits_by_session.get(e.session_id, 0) + nh
            return
        names = self.media.setdefault(medium, {})
        names[raw_medium] = names.get(raw_medium, 0) + nh
        bs = e.block_size or (len(raw) // 4 // nh)
        if e.group_idx is not None or e.kv_cache_spec_kind is not None:
            spec = GroupSpec(e.group_idx or 0, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window, bs or None)
            if self.groups.get(e.group_idx or 0) != spec:
                self.groups[e.group_idx or 0] = spec
        if e.ownership is not None or e.locality is not None or e.lookahead_token_ids is not None \
                or raw_code == RAW_IN_DETAILS:
            said = {k: v for k, v in (("ownership", e.ownership), ("locality", e.locality),
                                      ("lookahead_token_ids", e.lookahead_token_ids)) if v is not None}
            for h in e.block_hashes:
                d = self._details.setdefault((medium, h), {})
                if raw_code == RAW_IN_DETAILS:
                    d["medium"] = raw_medium
                elif "medium" not in d and self._slot_raw(self._slot_of(h, t)):
                    # where the reference's dict has the name: before what this store adds
                    # (`_said` gives it the slot's name when read)
                    d["medium"] = raw_medium
                d.update(said)
        if e.cache_salt is not None:
            self.tenants.add(e.cache_salt)
        self.tenants.update(salt_names)

    def _clear(self, medium: str | None, seq: int | None = None) -> None:
        tiers = [tier_of_medium(medium)] if medium is not None else list(self._tier_order())
        batch_seq = self.last_batch_seq or -1
        if self.journal:  # one row, as the reference emits one CacheReset: the copies it clears
            self._journal_reserve(1 + self._batch_blocks, 0)  # and room for the rest of the batch's rows
            num = sum(self.num_cached_in(m) for m in tiers)
            _journal_row(self.J, self.S, OP_CLEARED, tier_code(tiers[0]) if medium is not None else -1, -1,
                         batch_seq if seq is None else seq, num, np.uint64(0), 0)
        for m in tiers:
            code = _TIER_CODES.get(m)
            if code is None or not self.TI[code, T_PRESENT]:
                continue
            # room for what the clear adds and for what the rest of the batch may add
            more = int(self.TI[code, T_HASHES]) + self._batch_blocks
            self.maps.reserve(more, self.max_removed)
            _clear_tier(self.tab, self.K, self.L, self.C, self.F, self.T, self.G, self.S, self.TI,
                        *self.maps.compiled(), code, batch_seq, len(self.F), self.SO)
        if self._details:
            for key in [k for k in self._details if k[0] in tiers]:
                del self._details[key]
        self.num_cleared += 1

    def reset(self, batch_seq: int = -1, batch_time: float = 0.0) -> list:
        """Forget every block (the server restarted)."""
        self._revision += 1
        self._cache.clear()
        self._clear(None, batch_seq)
        return []

    # ---- the journal -------------------------------------------------------------------

    def take_journal(self) -> JournalRows:
        """The journal's rows added since the last call (all of them the first time)."""
        rows = self.journal_since(self._journal_taken)
        self._journal_taken = rows.stop
        return rows

    @property
    def num_journal_rows(self) -> int:
        """Rows the journal has had in all (global row numbers run 0..this-1), released or not."""
        return self.journal_base + int(self.S[S_JROWS])

    def journal_since(self, row: int) -> JournalRows:
        """The journal's rows from global row `row` on (numpy views; they stay valid as it
        grows and after a release)."""
        if not self.journal:
            raise ValueError("this pool keeps no journal (make it with journal=True)")
        row = max(0, int(row))
        if row < self.journal_base:
            raise ValueError(f"journal row {row:,} was released (release_journal): this pool holds its "
                             f"rows from {self.journal_base:,} on")
        return JournalRows(self, min(row - self.journal_base, int(self.S[S_JROWS])))

    # Rows released are dropped once at least this many and at least as many as are kept
    # (each row is then copied at most once on average, and a release per tick costs
    # nothing while a few rows are released).
    _release_min_rows = 1024
    # The drops whose arrivals size the journal after a drop (their median)
    _journal_drops_seen = 8

    def release_journal(self, row: int) -> None:
        """A reader no longer needs the journal's rows before global row `row` (it copied
        what it reads of them): the pool may drop them, where J lies when no `JournalRows`
        refers to it, else into another array (one given out before stays valid: its views
        keep the old one). Global row numbers stay
        as they were (`journal_base` is the first held); the per-store arrays, the token
        ids and `SO` are kept whole. Rows already released are ignored."""
        if not self.journal:
            raise ValueError("this pool keeps no journal (make it with journal=True)")
        row = int(row)
        if row > self.num_journal_rows:
            raise ValueError(f"journal row {row:,} is past the journal's end: it has {self.num_journal_rows:,} rows")
        self._journal_released_to = max(self._journal_released_to, row)
        held = int(self.S[S_JROWS])
        drop = self._journal_released_to - self.journal_base
        keep = held - drop
        if drop < max(keep, self._release_min_rows):
            return
        # room for what a steady stream brings between two drops: the median of the rows that
        # arrived between the recent ones (a quarter more for their spread), so a stream whose
        # drops each follow about as many rows makes no growth copy, and a burst (a server's
        # whole cache stored at once, taken in a bite or two) is not kept as room once it was
        # dropped (room for as many rows again as the pool held kept 33.6 MB, 30 B a block,
        # after the 1M blocks of bench gui's held pool were taken in two bites)
        self._journal_arrivals = self._journal_arrivals[1:] + (held - self._journal_kept,)
        steady = sorted(self._journal_arrivals)[len(self._journal_arrivals) // 2]
        rows = keep + max(steady + steady // 4, 1024)
        # one more than twice as large as that is a burst's: it goes (a steady stream's room is
        # kept, not a peak's); a new one an eighth larger, so the next drops' room fits in it
        self._journal_rooms[:] = [room for room in self._journal_rooms if len(room) <= 2 * rows + SLACK_ROWS]
        if unheld(self.J) and rows <= len(self.J) and self.J.nbytes <= JOURNAL_ROOM_BYTES:
            # no reader's rows refer to it (`JournalRows.copy`), and it is no larger than an
            # array kept for later: the rows kept move to its front (drop >= keep: apart)
            self.J[:keep] = self.J[drop:held]
        else:
            J = self._journal_array(rows, 2 * rows + SLACK_ROWS, rows + rows // 8)
            J[:keep] = self.J[drop:held]
            self._hold_journal(J)
        self.S[S_JROWS] = keep
        self._journal_kept = keep
        self.journal_base += drop
        self._journal_released(drop)

    def _journal_array(self, rows: int, most: int | None, new: int) -> np.ndarray:
        """An array for the journal's rows, `rows` to `most` (None: any size; rows past the
        held ones are never read: not zeroed): one J was held in before that nothing refers
        to any more (no `JournalRows` a reader kept), else a new one of `new`. An attached window's J
        grew 26-36 times per 100K vLLM events (its backlog between two takes), each growth
        and drop a new array whose pages were faulted in again: 18-30 ms of the subscriber
        thread."""
        rooms = self._journal_rooms
        for k in range(len(rooms)):
            if rows <= len(rooms[k]) and (most is None or len(rooms[k]) <= most) and unheld(rooms[k]):
                # (held by the list alone)
                return rooms.pop(k)
        return np.empty((new, NUM_J), np.int64)

    def _hold_journal(self, J: np.ndarray) -> None:
        """J from now on; the array before kept for a later `_journal_array` (the largest
        JOURNAL_ROOMS of at most JOURNAL_ROOM_BYTES each)."""
        old, self.J = self.J, J
        if old.nbytes <= JOURNAL_ROOM_BYTES:
            rooms = self._journal_rooms
            rooms.append(old)
            if len(rooms) > JOURNAL_ROOMS:  # (by position: arrays compare element by element)
                del rooms[min(range(len(rooms)), key=lambda k: len(rooms[k]))]

    def _journal_released(self, dropped: int) -> None:
        """Called after the journal dropped its first `dropped` held rows (`release_journal`):
        a subclass with arrays indexed like J shifts them by as many."""

    def hash_of(self, key: int, width: int) -> bytes:
        """The hash a (key, width) pair of the journal stands for (an 8-byte value or a digest)."""
        return self._bytes(int(key), int(width))

    # ---- reading -----------------------------------------------------------------------

    def _tier_order(self) -> list[str]:
        """Tiers held, in the order they were made (the reference's dict order)."""
        codes = np.flatnonzero(self.TI[:, T_PRESENT])
        codes = codes[np.argsort(self.TI[codes, T_BORN], kind="stable")]
        return [_TIER_NAMES[c] for c in codes.tolist()]

    def _tier_slots(self, code: int) -> np.ndarray:
        key = ("slots", code)
        hit = self._cache.get(key)
        if hit is None:
            n = len(self.F)
            slots = np.flatnonzero(self.F[:n, F_TIER] == code + 1)
            hit = self._cache[key] = slots[np.argsort(self._store_order(slots), kind="stable")]
        return hit

    @property
    def tiers(self) -> dict[str, _TierView]:
        return {m: _TierView(self, _TIER_CODES[m]) for m in self._tier_order()}

    @property
    def copies(self) -> _CopiesView:
        return _CopiesView(self)

    @property
    def num_extra_copies(self) -> dict[str, int]:
        codes = np.flatnonzero(self.TI[:, T_EXTRA_BORN])
        codes = codes[np.argsort(self.TI[codes, T_EXTRA_BORN], kind="stable")]
        return {_TIER_NAMES[c]: int(self.TI[c, T_EXTRA]) for c in codes.tolist()}

    @property
    def block_size(self) -> int | None:
        return int(self.S[S_BLOCK_SIZE]) or None

    @property
    def num_stored(self) -> int:
        return int(self.S[S_STORED])

    @property
    def num_removed(self) -> int:
        return int(self.S[S_REMOVED])

    @property
    def num_unknown_removed(self) -> int:
        return int(self.S[S_UNKNOWN])

    @property
    def num_restored(self) -> int:
        return int(self.S[S_RESTORED])

    @property
    def num_reported(self) -> int:
        return int(self.S[S_REPORTED])

    @property
    def lifetimes(self) -> LifetimeStats:
        return LifetimeStats(int(self.S[S_LIFE_N]), float(self.SF[0]), float(self.SF[1]))

    @property
    def removed_at(self) -> OrderedDict[bytes, tuple[int | None, int]]:
        """hash -> (None, vLLM batch seq) for the last `max_removed` hashes that left a tier, oldest first."""
        m = self.removed
        e = m.ordered()
        return OrderedDict((self._bytes(int(k), int(w)), (None, int(v))) for k, w, v in
                           zip(m.k[e, K_KEY], m.w[e], m.columns(e)[0]))

    @property
    def departed(self) -> OrderedDict[bytes, list[int]]:
        m = self.departed_map
        e = m.ordered()
        return OrderedDict((self._bytes(int(k), int(w)), [int(a), int(r)]) for k, w, a, r in
                           zip(m.k[e, K_KEY], m.w[e], *m.columns(e)))

    @property
    def num_cached(self) -> int:
        return int(self.TI[:, T_HASHES].sum() + self.TI[:, T_EXTRA].sum())

    def num_cached_in(self, medium: str) -> int:
        code = _TIER_CODES.get(tier_of_medium(medium))
        return 0 if code is None else int(self.TI[code, T_HASHES] + self.TI[code, T_EXTRA])

    def num_without_tokens(self, medium: str) -> int:
        code = _TIER_CODES.get(tier_of_medium(medium))
        return 0 if code is None else int(self.TI[code, T_NOTOK])

    def num_cached_by_group(self, medium: str) -> dict[int, int]:
        code = _TIER_CODES.get(tier_of_medium(medium))
        if code is None or not self.TI[code, T_HASHES]:
            return {}
        slots = self._tier_slots(code)
        c0 = self.C[slots, C_C0].astype(np.int64)
        tot = self.C[slots, C_TOT].astype(np.int64)
        out: dict[int, int] = {}
        if int(c0.sum()):
            out[0] = int(c0.sum())
        if np.any(tot != c0):
            view = _CopiesView(self)
            for s in slots[tot != c0].tolist():
                for g, n in enumerate(view._counts(s) or ()):
                    if g and n:
                        out[g] = out.get(g, 0) + n
        return dict(sorted(out.items()))

    def mediums(self) -> list[str]:
        return sorted(self._tier_order(), key=tier_order)

    def _slot_of(self, block_hash: bytes, code: int) -> int:
        kw = self._key(block_hash)
        if kw is None:
            return -1
        return int(_find(self.tab, self.K, self.SO, self.F, np.uint64(kw[0]), np.uint8(kw[1]), code))

    def num_copies(self, block_hash: bytes, medium: str = MEDIUM_DEFAULT, group: int | None = None) -> int:
        code = _TIER_CODES.get(tier_of_medium(medium))
        s = -1 if code is None else self._slot_of(block_hash, code)
        if s < 0:
            return 0
        if group is None:
            return int(self.C[s, C_TOT])
        counts = _CopiesView(self)._counts(s)
        if counts is None:
            return 1 if not group else 0
        return counts[group] if group < len(counts) else 0

    def cached_hashes(self) -> set[bytes]:
        out: set[bytes] = set()
        n = len(self.F)
        live = np.flatnonzero(self.F[:n, F_TIER] > 0)
        for k, w in zip(self.slot_keys(live).tolist(), self.F[live, F_W].tolist()):
            out.add(self._bytes(k, w))
        return out

    def find(self, block_hash: bytes) -> tuple[str, ColumnarBlock] | None:
        for key in (block_hash, block_hash[-8:]) if len(block_hash) > 8 else (block_hash,):
            for medium in self._tier_order():
                s = self._slot_of(key, _TIER_CODES[medium])
                if s >= 0:
                    return medium, ColumnarBlock(self, s)
        return None

    def tiers_holding(self, block_hash: bytes) -> list[str]:
        keys = (block_hash, block_hash[-8:]) if len(block_hash) > 8 else (block_hash,)
        return [m for m in self.mediums() if any(self._slot_of(k, _TIER_CODES[m]) >= 0 for k in keys)]

    def held_key(self, block_hash: bytes, medium: str) -> bytes:
        code = _TIER_CODES.get(medium)
        if code is None:
            return block_hash
        if self._slot_of(block_hash, code) < 0 and len(block_hash) > 8 and self._slot_of(block_hash[-8:], code) >= 0:
            return block_hash[-8:]
        return block_hash

    def held(self) -> Iterator[tuple[str, bytes, int]]:
        for medium in self.mediums():
            slots = self._tier_slots(_TIER_CODES[medium])
            for k, w, n in zip(self.slot_keys(slots).tolist(), self.F[slots, F_W].tolist(),
                               self.C[slots, C_TOT].tolist()):
                yield medium, self._bytes(k, w), n

    def _said(self, tier: str, block_hash: bytes, s: int) -> dict[str, Any]:
        """What the reference's `details[(tier, block_hash)]` holds for the block in slot s."""
        said = self._details.get((tier, block_hash))
        raw = int(self._slot_raw(s))
        if raw == 0 or raw == RAW_IN_DETAILS:
            return said if said is not None else {}
        return {**said, "medium": self._raw_names[raw]} if said else {"medium": self._raw_names[raw]}

    @property
    def details(self) -> dict[tuple[str, bytes], dict[str, Any]]:
        """The reference's `details`: (tier, hash) -> what its stores said beyond the common
        fields (a raw medium name, ownership, locality, lookahead token ids). Built when read."""
        out = dict(self._details)
        n = len(self.F)
        if self.F.shape[1] <= F_RAW:
            return out
        raw = self.F[:n, F_RAW]
        for s in np.flatnonzero((raw > 0) & (raw != RAW_IN_DETAILS) & (self.F[:n, F_TIER] > 0)).tolist():
            key = (_TIER_NAMES[int(self.F[s, F_TIER]) - 1], self._bytes(int(self.slot_keys(s)), int(self.F[s, F_W])))
            out[key] = self._said(*key, s)
        return out

    def details_of(self, block_hash: bytes) -> dict[str, Any]:
        key = block_hash
        tiers: dict[str, dict[str, Any]] = {}
        held = []
        for m in self.tiers_holding(block_hash):
            key = self.held_key(block_hash, m)
            s = self._slot_of(key, _TIER_CODES[m])
            tiers[m] = {"copies": self.num_copies(key, m), **self._said(m, key, s)}
            if not self._token_range(s)[1]:
                tiers[m]["no_token_ids"] = True
            held.append(s)
        kw = self._key(key)
        gone = self.departed_map.get(*kw) if kw is not None else None
        gone = gone or (0, 0)
        return {"hash": key.hex(), "tiers": tiers,
                "announced": gone[0] + sum(int(self.C[s, C_ANN]) for s in held),
                "removed": gone[1] + sum(int(self.C[s, C_REM]) for s in held)}

    def removal_of(self, block_hash: bytes) -> tuple[int | None, int] | None:
        for key in (block_hash, block_hash[-8:]) if len(block_hash) > 8 else (block_hash,):
            kw = self._key(key)
            hit = self.removed.get(*kw) if kw is not None else None
            if hit is not None:
                return None, hit[0]
        return None

    def blocks(self) -> Iterator[tuple[str, ColumnarBlock]]:
        for medium, tier in self.tiers.items():
            for block in tier.values():
                yield medium, block

    # ---- memory ------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes of every array the pool holds (capacity, not only what is used)."""
        arrays = [self.K, self.L, self.C, self.F, self.T, self.BSEQ, self.tab, self.tok, self.S, self.SF, self.TI,
                  self.J, self.JS, self.SO, self.PX, self.RX, self.RM, *self._journal_rooms]
        return sum(a.nbytes for a in arrays) + self.maps.nbytes


__all__ = ["ColumnarPool", "ColumnarBlock", "JournalRows", "tier_code", "warm_up", "OP_STORED", "OP_REMOVED",
           "OP_CLEARED"]
