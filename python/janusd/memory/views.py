"""Zero-copy torch tensors over raw device addresses (what xTensor hands out).

cpu: a ctypes array at the address wrapped by `torch.frombuffer`; cuda: an object with
`__cuda_array_interface__` passed to `torch.as_tensor`. Either way the tensor keeps a
reference to `keep` (the segment/region/pool object), and through it to the native
reservation, so a view can never outlive the virtual range it points into.

Lifetime rule (see janusd.memory.xtensor): after `pool.free(owner)` a view of that owner's
KV region or non-contiguous segment points into an inaccessible reservation (touching it
faults, it never reads someone else's data); a view of a contiguous weight segment points
into the global region, whose pages may be handed to another owner. The engine drops its
views before freeing.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import torch


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class _CudaBuffer:
    """The minimal `__cuda_array_interface__` (v3) object torch.as_tensor accepts."""

    def __init__(self, addr: int, nbytes: int, keep: Any) -> None:
        self._keep = keep
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (addr, False),
            "strides": None,
            "version": 3,
        }


def raw_bytes(kind: str, device_index: int, addr: int, nbytes: int, keep: Any) -> torch.Tensor:
    """A 1-D uint8 tensor over [addr, addr + nbytes), zero-copy, keeping `keep` alive."""
    if nbytes <= 0:
        raise ValueError(f"a view needs a positive byte count, got {nbytes}")
    if kind == "cpu":
        arr = (ctypes.c_uint8 * nbytes).from_address(addr)
        arr._janus_keep = keep  # type: ignore[attr-defined]
        return torch.frombuffer(arr, dtype=torch.uint8)
    if kind == "cuda":
        return torch.as_tensor(_CudaBuffer(addr, nbytes, keep), device=f"cuda:{device_index}")
    raise ValueError(
        f"zero-copy torch views are not available for device kind {kind!r} "
        "(npu views need torch_npu's external-memory support, not wired yet)"
    )


def typed_view(
    kind: str,
    device_index: int,
    base: int,
    limit: int,
    offset_bytes: int,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    keep: Any,
) -> torch.Tensor:
    """A tensor of `shape`/`dtype` at base + offset_bytes, inside [base, base + limit)."""
    if isinstance(offset_bytes, bool) or not isinstance(offset_bytes, int):
        raise ValueError(f"offset_bytes must be an int, got {offset_bytes!r}")
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype, got {dtype!r}")
    shape = tuple(shape)
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise ValueError(f"shape must be non-negative ints, got {shape!r}")
    item = _itemsize(dtype)
    nbytes = math.prod(shape) * item
    if offset_bytes < 0 or offset_bytes + nbytes > limit:
        raise ValueError(f"view of {nbytes} bytes at offset {offset_bytes} is outside the {limit} bytes available")
    if (base + offset_bytes) % item:
        raise ValueError(f"offset {offset_bytes} is not aligned to {item} bytes for {dtype}")
    if nbytes == 0:
        return raw_bytes(kind, device_index, base, 1, keep)[:0].view(dtype).reshape(shape)
    return raw_bytes(kind, device_index, base + offset_bytes, nbytes, keep).view(dtype).reshape(shape)


def whole(kind: str, device_index: int, base: int, nbytes: int, dtype: torch.dtype, keep: Any) -> torch.Tensor:
    """1-D tensor of `dtype` over the whole range (trailing bytes short of an element are left out)."""
    item = _itemsize(dtype)
    count = nbytes // item
    return typed_view(kind, device_index, base, nbytes, 0, (count,), dtype, keep)
