"""The Python face of xTensor (PAPER.md §7): one device's page pool, weight segments and
per-model KV regions, with zero-copy torch views.

The bookkeeping and the mapping live in Rust (rust/janus-core/src/xtensor); this module
validates arguments, converts results and builds tensors. Every error a caller can cause
is an `XTensorError` (a ValueError) with a message, and leaves the pool unchanged.

Lifetimes: tensors from `tensor()`/`view()` keep their segment/region object alive, and
through it the virtual reservation. Free an owner only after dropping its views: after
`free`, a KV view faults on touch (its range is kept reserved but inaccessible), while a
contiguous weight view still points into the global region, whose pages may already
belong to someone else. `close()` frees every owner; reservations still referenced by
views (the global region included) are released when the last view goes.
"""

from __future__ import annotations

from typing import Any

import msgspec
import torch

from janusd import _native
from janusd.memory import residency, views

XTensorError = _native.XTensorError

DEFAULT_CACHE_LOW = 2
DEFAULT_CACHE_HIGH = 4
_KINDS = ("cpu", "cuda", "npu")


_I64_MAX = (1 << 63) - 1  # the native layer takes i64: larger ints would be PyO3 OverflowErrors


def _int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise XTensorError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise XTensorError(f"{name} must be >= {minimum}, got {value}")
    if value > _I64_MAX:
        raise XTensorError(f"{name} must be <= {_I64_MAX}, got {value}")
    return value


def _owner(owner: Any) -> str:
    if not isinstance(owner, str) or not owner:
        raise XTensorError(f"owner must be a non-empty str, got {owner!r}")
    return owner


class PoolStats(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of one pool (definitions: rust/janus-core/src/xtensor/stats.rs).

    `fragmentation_pct`: (free pages in the weight zone [at or above the lowest weight
    page] lying in runs shorter than the smallest weight segment requested so far + KV
    cache pages held beyond a region's high watermark) / num_pages * 100.
    `fragmentation_all_zones_pct`: the same counting short free runs anywhere (the KV zone
    too). `rounding_waste_pct`: page rounding of weight segments."""

    num_pages: int
    page_size: int
    free_pages: int
    largest_free_run: int
    free_runs: int
    pages_by_owner: dict[str, int]
    weight_pages: int
    kv_pages: int
    cached_pages: int
    idle_cache_pages: int
    stranded_free_pages: int
    stranded_threshold_pages: int
    stranded_weight_zone_pages: int
    fragmentation_pct: float
    fragmentation_all_zones_pct: float
    rounding_waste_pct: float
    cache_misses: int
    cache_hits: int
    weight_segments: int
    noncontiguous_segments: int
    kv_regions: int


class DevicePool:
    """One device's physical page pool with its global region mapped 1:1 (page i at
    global_base + i * page_size). kind: "cpu" (memfd host backend), "cuda" (driver VMM
    API) or "npu" (ACL); a missing backend library is an XTensorError naming it.

    `resident_pages` (cpu): the top pages of the pool (where weight segments are placed
    first) are faulted in now and never given back (`give_back` skips them), so a
    restore, fork or Cold start writing a segment there runs at memcpy speed instead of
    paying the kernel's zero-fill (memory/residency.py); they cost their size in RSS from
    now on. Device memory (cuda/npu) is physical from the start: the setting is moot."""

    def __init__(
        self,
        kind: str = "cpu",
        num_pages: int = 1024,
        page_size: int = 2 << 20,
        device_index: int = 0,
        *,
        background: bool = True,
        resident_pages: int = 0,
    ) -> None:
        if kind not in _KINDS:
            raise XTensorError(f"unknown device kind {kind!r}: expected one of {', '.join(_KINDS)}")
        self._device_index = _int(device_index, "device_index", 0)
        num_pages = _int(num_pages, "num_pages")
        resident = _int(resident_pages, "resident_pages", 0)
        if resident > num_pages:
            raise XTensorError(f"resident_pages ({resident}) exceeds the pool's {num_pages} pages")
        self._native = _native.XtPool(
            kind, num_pages, _int(page_size, "page_size"), self._device_index, bool(background)
        )
        self._global_range = self._native.global_range()
        self._resident_from = num_pages - resident if kind == "cpu" else 0
        try:
            self.populate(list(range(self._resident_from, num_pages)))
        except XTensorError:
            self._native.close()
            raise

    # ---- facts ----
    @property
    def kind(self) -> str:
        return self._native.kind

    @property
    def page_size(self) -> int:
        return self._native.page_size

    @property
    def num_pages(self) -> int:
        return self._native.num_pages

    @property
    def global_base(self) -> int:
        return self._native.global_base

    @property
    def global_nbytes(self) -> int:
        """Size of the global region (num_pages * page_size): what a transfer engine registers."""
        return self._native.global_nbytes

    @property
    def device_index(self) -> int:
        return self._device_index

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def resident_pages(self) -> int:
        """Pages kept backed by host memory whether used or not (cpu; all on cuda/npu)."""
        return self.num_pages - self._resident_from

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu") if self.kind == "cpu" else torch.device(self.kind, self._device_index)

    # ---- allocation ----
    def alloc_weights(self, owner: str, nbytes: int) -> WeightSegment:
        """A weight segment of `nbytes` (page-rounded) for `owner`: one contiguous best-fit
        run from the high end, or scattered high pages in their own range (contiguous=False)."""
        native = self._native.alloc_weights(_owner(owner), _int(nbytes, "nbytes"))
        return WeightSegment(self, owner, native)

    def kv_region(
        self,
        owner: str,
        max_bytes: int,
        *,
        cache_low: int = DEFAULT_CACHE_LOW,
        cache_high: int = DEFAULT_CACHE_HIGH,
    ) -> KvRegion:
        """Reserve a KV region of `max_bytes` (page-rounded) for `owner`, 0 pages mapped.
        Its cache of mapped-but-unused pages is refilled to `cache_high` when it falls
        below `cache_low` and trimmed back to `cache_high` (by the background thread)."""
        native = self._native.kv_region(
            _owner(owner), _int(max_bytes, "max_bytes"), _int(cache_low, "cache_low", 0), _int(cache_high, "cache_high", 0)
        )
        return KvRegion(self, owner, native)

    def free(self, owner: str) -> None:
        """Free `owner`'s weight segments and KV regions (unknown owner / double free raise)."""
        self._native.free(_owner(owner))

    # ---- host backing of cpu pages (memory/residency.py) ----
    def populate(self, page_ids: list[int]) -> None:
        """Fault these pages in (cpu): their next write runs at memory speed. XTensorError
        when the host has not the memory (rather than a SIGBUS at that write)."""
        if self.kind != "cpu":
            return
        page = self.page_size
        for first, count in residency.runs(page_ids):
            try:
                residency.populate(self.global_base + first * page, count * page)
            except residency.ResidencyError as e:
                raise XTensorError(str(e.strerror)) from None

    def give_back(self, page_ids: list[int]) -> None:
        """Hand the host memory behind these pages back to the OS (cpu; call before freeing
        them: nothing may read them after), except pages of the resident zone, which stay
        backed for the next segment. The pool's accounting is not touched."""
        if self.kind != "cpu":
            return
        page = self.page_size
        for first, count in residency.runs([p for p in page_ids if p < self._resident_from]):
            try:
                residency.give_back(self.global_base + first * page, count * page)
            except residency.ResidencyError as e:
                raise XTensorError(str(e.strerror)) from None

    # ---- views ----
    def global_tensor(self, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """The whole global region (num_pages * page_size bytes)."""
        r = self._global_range
        return views.whole(self.kind, self._device_index, r.base, r.nbytes, dtype, self)

    # ---- upkeep ----
    def stats(self) -> PoolStats:
        return msgspec.convert(self._native.stats(), PoolStats)

    def check_integrity(self) -> None:
        """Raise XTensorError if any bookkeeping invariant is broken."""
        self._native.check_integrity()

    def maintain(self) -> None:
        """Bring every KV cache to its watermarks now (what the background thread does)."""
        self._native.maintain()

    def wait_maintenance(self, timeout_s: float = 5.0) -> bool:
        """Wait until the refill thread has brought every KV cache to its watermarks (freed
        pages trimmed back to the pool, low caches refilled); False if not within timeout_s.
        For tests and stats that must see a settled pool: the request path never waits."""
        import time

        deadline = time.monotonic() + timeout_s
        while self._native.maintenance_backlog():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def close(self) -> None:
        self._native.close()

    def __enter__(self) -> DevicePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DevicePool(kind={self.kind!r}, num_pages={self.num_pages}, page_size={self.page_size})"


class WeightSegment:
    """Pages holding one owner's weights. Contiguous segments are views into the global
    region at `global_offset`; the fallback maps scattered pages into a range of its own."""

    def __init__(self, pool: DevicePool, owner: str, native: Any) -> None:
        self.pool = pool
        self.owner = owner
        self._native = native
        self._range = native.range()

    @property
    def nbytes(self) -> int:
        return self._native.nbytes

    @property
    def page_ids(self) -> list[int]:
        return list(self._native.page_ids)

    @property
    def contiguous(self) -> bool:
        return self._native.contiguous

    @property
    def global_offset(self) -> int:
        return self._native.global_offset

    @property
    def addr(self) -> int:
        return self._native.addr

    def global_pieces(self, nbytes: int | None = None) -> list[tuple[int, int]]:
        """(global offset, length) pieces of the segment's first `nbytes` bytes (all when
        None), in segment order: where a peer reads them in this device's global region
        (a D2D fork). One piece for a contiguous segment, one per run of pages otherwise."""
        page = self.pool.page_size
        left = self.nbytes if nbytes is None else _int(nbytes, "nbytes")
        if left > self.nbytes:
            raise XTensorError(f"nbytes {left} exceeds the segment's {self.nbytes}")
        out: list[tuple[int, int]] = []
        for pid in self.page_ids:
            if left <= 0:
                break
            n = min(page, left)
            if out and out[-1][0] + out[-1][1] == pid * page:
                out[-1] = (out[-1][0], out[-1][1] + n)
            else:
                out.append((pid * page, n))
            left -= n
        return out

    def tensor(self, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        return views.whole(self.pool.kind, self.pool.device_index, self.addr, self.nbytes, dtype, self)

    def view(self, offset_bytes: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return views.typed_view(
            self.pool.kind, self.pool.device_index, self.addr, self.nbytes, offset_bytes, shape, dtype, self
        )

    def __repr__(self) -> str:
        return f"WeightSegment(owner={self.owner!r}, nbytes={self.nbytes}, pages={len(self._native.page_ids)}, contiguous={self.contiguous})"


class KvRegion:
    """One model's KV range: `resize(n)` makes exactly pages [0, n) usable (mapped).

    `tensor()`/`view()` may span the whole reserved range; only bytes below
    mapped_pages * page_size may be touched (the rest is reserved but inaccessible: a
    touch faults on cpu). Pages never move: growing keeps the ids of pages [0, old)."""

    def __init__(self, pool: DevicePool, owner: str, native: Any) -> None:
        self.pool = pool
        self.owner = owner
        self._native = native
        self._range = native.range()

    @property
    def page_size(self) -> int:
        return self.pool.page_size

    @property
    def max_pages(self) -> int:
        return self._native.max_pages

    @property
    def max_bytes(self) -> int:
        return self._native.max_pages * self.pool.page_size

    @property
    def base(self) -> int:
        return self._native.base

    @property
    def mapped_pages(self) -> int:
        return self._native.state()[0]

    @property
    def cached_pages(self) -> int:
        return self._native.state()[1]

    @property
    def cache_misses(self) -> int:
        return self._native.state()[3]

    @property
    def cache_hits(self) -> int:
        return self._native.state()[4]

    def resize(self, n_pages: int) -> None:
        """Grow (cache first, then the pool's low end) or shrink (top pages go to the
        cache) to exactly `n_pages`. XTensorError, pool unchanged, if it cannot."""
        self._native.resize(_int(n_pages, "n_pages", 0))

    def page_ids(self) -> list[int]:
        return list(self._native.page_ids())

    def global_offsets(self, byte_offset: int, nbytes: int) -> list[tuple[int, int]]:
        """(global offset, length) pieces of [byte_offset, byte_offset + nbytes): where a
        remote peer finds these bytes in this device's global region (base + offset)."""
        return [tuple(p) for p in self._native.global_offsets(_int(byte_offset, "byte_offset", 0), _int(nbytes, "nbytes"))]

    def tensor(self, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        return views.whole(self.pool.kind, self.pool.device_index, self.base, self.max_bytes, dtype, self)

    def view(self, offset_bytes: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return views.typed_view(
            self.pool.kind, self.pool.device_index, self.base, self.max_bytes, offset_bytes, shape, dtype, self
        )

    def __repr__(self) -> str:
        return f"KvRegion(owner={self.owner!r}, mapped_pages={self.mapped_pages}, max_pages={self.max_pages})"
