"""Paged KV cache inside a model's xTensor KV region.

Layout is block-major: [num_blocks, layers, 2 (k, v), block_size, kv_heads, head_dim].
Block b occupies bytes [b * block_bytes, (b + 1) * block_bytes) of the region, so
mapping more pages at the top of the region adds whole blocks, and unmapping the top
removes them. The region starts with no pages mapped; `allocate` maps pages from the
device's shared pool on demand (`KVRegion.resize`), `shrink` hands the pages above the
highest block in use back to the pool, where another model's KV or weights can take
them. Block ids are handed out lowest-first so the used set stays compact at the
bottom and the region can shrink once the high blocks are released.

`BlockAllocator` is the pure bookkeeping (no tensors, property-tested);
`PagedKVCache` adds the region, the per-layer tensor views and the page mapping.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import torch


class BlockAllocator:
    """Free/used block ids in [0, capacity); lowest free id first."""

    def __init__(self, capacity: int = 0) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._free = list(range(capacity))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def max_blocks(self) -> int:
        """A standalone allocator never holds more than its capacity (the scheduler's ceiling)."""
        return self.capacity

    @property
    def num_used(self) -> int:
        return len(self._used)

    def allocate(self, n: int) -> list[int] | None:
        """n lowest free ids, or None (and nothing taken) when fewer than n are free."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        if n > len(self._free):
            return None
        ids = [heapq.heappop(self._free) for _ in range(n)]
        self._used.update(ids)
        return ids

    def free(self, ids: list[int]) -> None:
        for b in ids:
            if b not in self._used:
                raise ValueError(f"block {b} is not allocated")
            self._used.remove(b)
            heapq.heappush(self._free, b)

    def high_water(self) -> int:
        """1 + the highest id in use (0 when nothing is used): the smallest capacity that fits."""
        return max(self._used) + 1 if self._used else 0

    def grow(self, capacity: int) -> None:
        if capacity < self.capacity:
            raise ValueError(f"grow to {capacity} < current capacity {self.capacity}")
        for b in range(self.capacity, capacity):
            heapq.heappush(self._free, b)
        self.capacity = capacity

    def shrink(self, capacity: int) -> None:
        """Drop ids >= capacity; all of them must be free."""
        if capacity < self.high_water():
            raise ValueError(f"cannot shrink to {capacity}: block {self.high_water() - 1} is in use")
        if capacity >= self.capacity:
            return
        self._free = [b for b in self._free if b < capacity]
        heapq.heapify(self._free)
        self.capacity = capacity


class PagedKVCache:
    """KV blocks of one model, backed by an xTensor KV region of the device pool."""

    def __init__(self, region: Any, arch: Any, dtype: torch.dtype, block_size: int) -> None:
        self.region = region
        self.block_size = block_size
        self.dtype = dtype
        self.num_layers = arch.num_hidden_layers
        self.kv_heads = arch.num_key_value_heads
        self.head_dim = arch.head_dim
        elt = torch.empty((), dtype=dtype).element_size()
        self.bytes_per_token = self.num_layers * 2 * self.kv_heads * self.head_dim * elt
        self.block_bytes = self.bytes_per_token * block_size
        self.page_size = int(region.page_size)
        self.max_blocks = int(region.max_pages) * self.page_size // self.block_bytes
        if self.max_blocks < 1:
            raise ValueError(
                f"KV region of {region.max_pages} pages cannot hold one block of {self.block_bytes} bytes; raise kv_cache_mib"
            )
        full = region.view(0, (self.max_blocks, self.num_layers, 2, block_size, self.kv_heads, self.head_dim), dtype)
        self.layers = [(full[:, i, 0], full[:, i, 1]) for i in range(self.num_layers)]
        self.alloc = BlockAllocator(self._usable(int(region.mapped_pages)))
        # tensor parallelism (engine/tp/shard.py): the leader shard's region tells the
        # followers' regions each new page count first; False = a follower could not map them
        self.mirror: Callable[[int], bool] | None = None

    def _usable(self, pages: int) -> int:
        return min(self.max_blocks, pages * self.page_size // self.block_bytes)

    def _pages_for(self, blocks: int) -> int:
        return -(-blocks * self.block_bytes // self.page_size)

    def blocks_within(self, pages: int) -> int:
        """The most blocks this cache could ever map with `pages` pool pages (capped by the
        region): with pages = the pool less this model's weights, the ceiling beyond which
        a request can never fit, however long it waits for other owners' pages."""
        return self._usable(max(0, pages))

    @property
    def num_free_blocks(self) -> int:
        return self.alloc.num_free

    def allocate(self, n: int) -> list[int] | None:
        """n block ids, mapping more pages from the pool if needed; None when neither the
        region's maximum nor the pool can supply them (nothing is taken then)."""
        short = n - self.alloc.num_free
        if short > 0 and not self._grow(self.alloc.capacity + short):
            return None
        return self.alloc.allocate(n)

    def _grow(self, blocks: int) -> bool:
        from janusd.memory import XTensorError

        if blocks > self.max_blocks:
            return False
        pages = self._pages_for(blocks)
        before = int(self.region.mapped_pages)
        if pages > before:
            try:
                self.region.resize(pages)
            except XTensorError:
                return False
            if self.mirror is not None and not self.mirror(pages):
                self.region.resize(before)
                self.mirror(before)  # the followers that did map them give them back
                return False
        self.alloc.grow(self._usable(int(self.region.mapped_pages)))
        return True

    def free(self, ids: list[int]) -> None:
        self.alloc.free(ids)

    def shrink(self) -> int:
        """Unmap every page above the highest block in use; returns pages released."""
        before = int(self.region.mapped_pages)
        pages = self._pages_for(self.alloc.high_water())
        if pages >= before:
            return 0
        self.alloc.shrink(self._usable(pages))
        self.region.resize(pages)  # the refill thread trims the spare pages to the watermark
        if self.mirror is not None:
            self.mirror(pages)
        return before - pages

    def block_view(self, block_id: int) -> torch.Tensor:
        """The raw bytes of one block (uint8), for KV export/import copies."""
        if not 0 <= block_id < self.alloc.capacity:
            raise ValueError(f"block {block_id} is outside the mapped blocks [0, {self.alloc.capacity})")
        return self.region.view(block_id * self.block_bytes, (self.block_bytes,), torch.uint8)

    def page_ids(self, block_ids: list[int]) -> list[int]:
        """The pool pages (sorted, unique) that hold the given blocks."""
        region_pages = self.region.page_ids()
        out: set[int] = set()
        for b in block_ids:
            first = b * self.block_bytes // self.page_size
            last = ((b + 1) * self.block_bytes - 1) // self.page_size
            out.update(region_pages[first : last + 1])
        return sorted(out)

    def global_offsets(self, block_id: int) -> list[tuple[int, int]]:
        """(offset, length) pieces of one block in the pool's global range."""
        return [(int(o), int(n)) for o, n in self.region.global_offsets(block_id * self.block_bytes, self.block_bytes)]
