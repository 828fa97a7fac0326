"""Device backends: cuda (driver VMM API via libcuda.so.1) and npu (ACL via the C shim).

Where the library is missing (as on CI) the pool must fail at creation with one error
naming it, never fall back to host memory; where it is present, real mapping is tested.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from janusd.memory import DevicePool, XTensorError


def loadable(name: str) -> bool:
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


HAVE_CUDA = loadable("libcuda.so.1")
HAVE_ACL = loadable("libascendcl.so")


@pytest.mark.skipif(HAVE_CUDA, reason="libcuda.so.1 is present: the missing-library path cannot be exercised")
def test_cuda_without_driver_names_the_library() -> None:
    with pytest.raises(XTensorError, match=r"^cuda backend: cannot load libcuda\.so\.1 \(.+\)$"):
        DevicePool("cuda", 4, 2 << 20)


@pytest.mark.skipif(HAVE_ACL, reason="libascendcl.so is present: the missing-library path cannot be exercised")
def test_npu_without_acl_names_the_library() -> None:
    with pytest.raises(XTensorError, match=r"^npu backend: cannot load libascendcl\.so \(.+\)$"):
        DevicePool("npu", 4, 2 << 20)


@pytest.mark.skipif(not (HAVE_CUDA and torch.cuda.is_available()), reason="no CUDA driver (libcuda.so.1) / device here")
def test_cuda_pages_appear_in_kv_and_global_views() -> None:
    with DevicePool("cuda", 8, 2 << 20, background=False) as pool:
        kv = pool.kv_region("m", 4 << 20, cache_low=0, cache_high=0)
        kv.resize(2)
        t = kv.tensor(torch.float32)
        assert t.is_cuda
        t[: (4 << 20) // 4] = torch.arange((4 << 20) // 4, device=t.device, dtype=torch.float32)
        g = pool.global_tensor(torch.float32)
        per_page = (2 << 20) // 4
        for i, pid in enumerate(kv.page_ids()):
            got = g[pid * per_page : (pid + 1) * per_page]
            assert torch.equal(got, t[i * per_page : (i + 1) * per_page])
        seg = pool.alloc_weights("w", 2 << 20)
        w = seg.view(0, (16, 16), torch.float32)
        g[seg.global_offset // 4 : seg.global_offset // 4 + 256] = 2.0
        torch.cuda.synchronize()
        assert float(w.sum()) == 512.0
        pool.check_integrity()


@pytest.mark.skipif(not HAVE_ACL, reason="no Ascend ACL runtime (libascendcl.so) here")
def test_npu_pool_maps_pages() -> None:
    with DevicePool("npu", 4, 2 << 20, background=False) as pool:
        kv = pool.kv_region("m", 4 << 20, cache_low=0, cache_high=0)
        kv.resize(2)
        assert kv.page_ids() == [0, 1]
        kv.resize(0)
        seg = pool.alloc_weights("w", 4 << 20)
        assert seg.contiguous and seg.page_ids == [2, 3]
        pool.free("w")
        pool.check_integrity()


def test_missing_cuda_library_named_by_the_operator_is_one_clear_error(monkeypatch) -> None:
    """Runs everywhere (also where libcuda exists): JANUSD_CUDA_LIBRARY names the driver."""
    monkeypatch.setenv("JANUSD_CUDA_LIBRARY", "libjanusd-no-such-cuda.so.1")
    with pytest.raises(XTensorError, match=r"^cuda backend: cannot load libjanusd-no-such-cuda\.so\.1 \(.+\)$"):
        DevicePool("cuda", 4, 2 << 20)


def test_missing_acl_library_named_by_the_operator_is_one_clear_error(monkeypatch) -> None:
    """Runs everywhere (also where CANN is installed): JANUSD_ACL_LIBRARY names libascendcl."""
    monkeypatch.setenv("JANUSD_ACL_LIBRARY", "libjanusd-no-such-ascendcl.so")
    with pytest.raises(XTensorError, match=r"^npu backend: cannot load libjanusd-no-such-ascendcl\.so \(.+\)$"):
        DevicePool("npu", 4, 2 << 20)
