"""Physical blocks, the LRU free queue (where eviction order is decided) and the hash -> block map.

Plain Python bookkeeping, no tensors: the KV tensors live in `engine.model.kv_pool`, indexed by
the same block ids. Modelled on vLLM v1's `BlockPool` and `FreeKVCacheBlockQueue`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from engine.core.validation import check_block_pool


@dataclass(slots=True, eq=False)
class Block:
    """One physical block. `block_hash` stays set while the block sits free, so it can be hit."""

    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    parent_hash: bytes | None = None
    token_ids: tuple[int, ...] = ()
    salt: str | None = None
    external_id: int | None = None
    last_used: int = 0  # the pool's use clock when the ref count last changed
    prev_free: Block | None = None
    next_free: Block | None = None

    def __repr__(self) -> str:
        digest = self.block_hash.hex()[:8] if self.block_hash else None
        return f"Block(id={self.block_id}, ref={self.ref_count}, hash={digest})"


class FreeBlockQueue:
    """Doubly linked list of free blocks with O(1) removal from anywhere.

    The head is the next block taken for new data (its old hash, if any, is evicted then).
    Cached blocks join at the tail, so among them the least recently freed goes first;
    blocks without a hash join at the head, since reusing them evicts nothing.
    """

    __slots__ = ("_head", "_tail", "num_free_blocks")

    def __init__(self, blocks: list[Block]) -> None:
        self._head = Block(-1)
        self._tail = Block(-2)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free_blocks

    def popleft(self) -> Block:
        block = self._head.next_free
        if block is self._tail or block is None:
            raise IndexError("no free block left")
        self.remove(block)
        return block

    def remove(self, block: Block) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: Block) -> None:
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def prepend_n(self, blocks: list[Block]) -> None:
        """Put `blocks` at the head, in order: `blocks[0]` becomes the next one taken."""
        for block in reversed(blocks):
            first = self._head.next_free
            assert first is not None
            block.prev_free = self._head
            block.next_free = first
            first.prev_free = block
            self._head.next_free = block
            self.num_free_blocks += 1

    def __iter__(self) -> Iterator[Block]:
        """Blocks from the head (evicted next) to the tail (freed last)."""
        block = self._head.next_free
        while block is not None and block is not self._tail:
            yield block
            block = block.next_free

    def contains(self, block: Block) -> bool:
        return block.prev_free is not None


@dataclass(slots=True)
class BlockPool:
    """A fixed number of blocks, their free queue and the map from hash to cached blocks.

    Like vLLM, several physical blocks may hold the same hash (two requests computed the
    same block at once); a lookup takes any of them (the oldest copy). As vLLM 0.33.0's
    `BlockHashToBlockMap`, a hash maps to its one block, or to a dict of its copies by block
    id once there are several: most hashes have one copy, and a dict per block would cost
    an allocation per store.
    """

    num_blocks: int
    blocks: list[Block] = field(init=False)
    free_queue: FreeBlockQueue = field(init=False)
    blocks_by_hash: dict[bytes, Block | dict[int, Block]] = field(init=False, default_factory=dict)
    use_clock: int = 0

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError("the pool needs at least one block")
        check_block_pool(self.num_blocks)  # before a list of that many blocks is built
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.free_queue.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return sum(1 if type(v) is Block else len(v) for v in self.blocks_by_hash.values())

    def get_cached_block(self, block_hash: bytes) -> Block | None:
        found = self.blocks_by_hash.get(block_hash)
        if found is None or type(found) is Block:
            return found
        return next(iter(found.values()))

    def cached_blocks(self, block_hash: bytes) -> list[Block]:
        """Every block holding `block_hash`, oldest copy first (empty when none does)."""
        found = self.blocks_by_hash.get(block_hash)
        if found is None:
            return []
        return [found] if type(found) is Block else list(found.values())

    def iter_cached(self) -> Iterator[tuple[bytes, Block]]:
        """(hash, block) for every cached block, hash by hash."""
        for block_hash, found in self.blocks_by_hash.items():
            if type(found) is Block:
                yield block_hash, found
            else:
                for block in found.values():
                    yield block_hash, block

    def take_free_block(self) -> tuple[Block, bytes | None, bytes | None]:
        """Pop the LRU free block for new data; returns it, the hash it lost and that hash's parent."""
        block = self.free_queue.popleft()
        evicted = block.block_hash
        parent = self.uncache(block)
        return block, evicted, parent

    def uncache(self, block: Block) -> bytes | None:
        """Drop the block's hash from the map; returns the parent hash it had."""
        if block.block_hash is None:
            return None
        parent = block.parent_hash
        by_hash = self.blocks_by_hash
        found = by_hash.get(block.block_hash)
        if found is block:
            del by_hash[block.block_hash]
        elif found is not None and type(found) is not Block:
            found.pop(block.block_id, None)
            if not found:
                del by_hash[block.block_hash]
        block.block_hash = block.parent_hash = block.salt = block.external_id = None
        block.token_ids = ()
        return parent

    def cache(self, block: Block, block_hash: bytes, parent_hash: bytes | None,
              token_ids: tuple[int, ...], salt: str | None, external_id: int | None) -> None:
        block.block_hash = block_hash
        block.parent_hash = parent_hash
        block.token_ids = token_ids
        block.salt = salt
        block.external_id = external_id
        by_hash = self.blocks_by_hash
        found = by_hash.get(block_hash)
        if found is None or found is block:
            by_hash[block_hash] = block
        elif type(found) is Block:
            by_hash[block_hash] = {found.block_id: found, block.block_id: block}
        else:
            found[block.block_id] = block

    def touch(self, block: Block) -> None:
        """A request takes a reference; a free block leaves the free queue."""
        if block.ref_count == 0 and self.free_queue.contains(block):
            self.free_queue.remove(block)
        block.ref_count += 1
        self.use_clock += 1
        block.last_used = self.use_clock

    def touch_blocks(self, blocks: list[Block]) -> None:
        """`touch` each of `blocks` in order (a request's hits): one loop, no call per block."""
        queue = self.free_queue
        clock = self.use_clock
        for block in blocks:
            if block.ref_count == 0 and block.prev_free is not None:
                prev, nxt = block.prev_free, block.next_free
                prev.next_free = nxt
                nxt.prev_free = prev  # type: ignore[union-attr]
                block.prev_free = block.next_free = None
                queue.num_free_blocks -= 1
            block.ref_count += 1
            clock += 1
            block.last_used = clock
        self.use_clock = clock

    def take_blocks(self, n: int, on_evict: Callable[[Block, bytes, bytes | None], None]) -> list[Block]:
        """`take_free_block` and `touch`, `n` times: the `n` blocks at the head of the free
        queue, each with one reference. A block that held a hash is uncached and reported
        to `on_evict(block, old_hash, old_parent)` before the next one is taken, so the
        pool is then exactly as `n` single takes leave it. The caller has checked that `n`
        blocks are free; a queue that runs out raises `IndexError` as `popleft` does.
        """
        queue = self.free_queue
        head, tail = queue._head, queue._tail
        clock = self.use_clock
        taken: list[Block] = []
        append = taken.append
        for _ in range(n):
            block = head.next_free
            if block is tail or block is None:
                self.use_clock = clock
                raise IndexError("no free block left")
            nxt = block.next_free
            head.next_free = nxt
            nxt.prev_free = head  # type: ignore[union-attr]
            block.prev_free = block.next_free = None
            queue.num_free_blocks -= 1
            evicted = block.block_hash
            if evicted is not None:
                parent = self.uncache(block)
                self.use_clock = clock
                on_evict(block, evicted, parent)
            block.ref_count += 1
            clock += 1
            block.last_used = clock
            append(block)
        self.use_clock = clock
        return taken

    def free_blocks(self, ordered_blocks: list[Block]) -> list[Block]:
        """Drop one reference from each block, first to be evicted first; returns those now free.

        As vLLM 0.33.0's `BlockPool.free_blocks`: a freed block with a hash joins the tail
        (LRU among cached blocks), one without (a partial last block, or an aborted one's)
        joins the head and is reused first, so no cached block is evicted while it waits.
        """
        hashless: list[Block] = []
        cached: list[Block] = []
        clock = self.use_clock
        for block in ordered_blocks:
            if block.ref_count <= 0:
                self.use_clock = clock
                raise ValueError(f"block {block.block_id} has no reference to release")
            block.ref_count -= 1
            clock += 1
            block.last_used = clock
            if block.ref_count == 0:
                (cached if block.block_hash is not None else hashless).append(block)
        self.use_clock = clock
        queue = self.free_queue
        if hashless:
            queue.prepend_n(hashless)
        if cached:
            tail = queue._tail
            last = tail.prev_free
            for block in cached:
                last.next_free = block  # type: ignore[union-attr]
                block.prev_free = last
                last = block
            last.next_free = tail  # type: ignore[union-attr]
            tail.prev_free = last
            queue.num_free_blocks += len(cached)
        return [b for b in ordered_blocks if b.ref_count == 0 and b.prev_free is not None]
