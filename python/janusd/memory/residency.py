"""Whether a cpu device pool's pages hold host memory: fault a range in ahead of use, or
give it back to the OS (PAPER.md §7-8 on cpu devices; `devices.resident_mib`).

Why: a cpu pool is one memfd, backed page by page on first touch. A restore, fork or
Cold start that writes into pages given back to the OS pays the kernel's zero-fill and a
fault per 4 KiB page (about 1 GB/s on the project's VM, 4-6x slower than the copy
itself); faulting them in ahead of time moves that cost off the activation, as an
accelerator's memory is physical before any model arrives. MADV_POPULATE_WRITE does it
in one call per range (Linux >= 5.14; older kernels get a plain write of zeros).
Ranges are virtual addresses in the pool's global region (page i at base + i * page_size),
which maps the memfd shared: what is done there holds for every other mapping of a page.
"""

from __future__ import annotations

import ctypes
import errno
import mmap

_MADV_REMOVE = 9  # free a shared mapping's backing store (the memfd's pages) for the range
_MADV_POPULATE_WRITE = 23  # fault the range in writable (allocating the pages), Linux >= 5.14

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


class ResidencyError(OSError):
    """The kernel refused to back or free a range (the message names it and why)."""


def _madvise(addr: int, nbytes: int, advice: int) -> int:
    """0, or the errno of a failed madvise."""
    if _libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(nbytes), advice) == 0:
        return 0
    return ctypes.get_errno()


def populate(addr: int, nbytes: int) -> None:
    """Fault [addr, addr + nbytes) in writable: the memfd pages get allocated (zeroed by the
    kernel now, not at the first write of a restore) and mapped. The bytes are zeros only
    for pages that were not backed before; callers populate free pages, whose bytes no one
    may read. Out of host memory is a ResidencyError, not a SIGBUS later."""
    if nbytes <= 0:
        return
    err = _madvise(addr, nbytes, _MADV_POPULATE_WRITE)
    if err == errno.EINVAL:  # a kernel without MADV_POPULATE_WRITE: touch every page instead
        ctypes.memset(addr, 0, nbytes)
        return
    if err:
        why = "out of host memory" if err in (errno.ENOMEM, errno.EFAULT) else errno.errorcode.get(err, str(err))
        raise ResidencyError(err, f"cannot make {nbytes >> 20} MiB of the page pool resident at {addr:#x}: {why}")


def give_back(addr: int, nbytes: int) -> None:
    """Free the host memory behind [addr, addr + nbytes) (MADV_REMOVE on the shared memfd
    mapping): the worker's RSS drops by it, the next touch reads zeros and pays the
    kernel's zero-fill."""
    if nbytes <= 0:
        return
    err = _madvise(addr, nbytes, _MADV_REMOVE)
    if err:
        raise ResidencyError(err, f"madvise(MADV_REMOVE) of {nbytes} bytes at {addr:#x} failed: "
                                  f"{errno.errorcode.get(err, str(err))}")


def resident_fraction(addr: int, nbytes: int) -> float:
    """Share of the OS pages of [addr, addr + nbytes) that hold memory now (mincore: for a
    memfd mapping, whether the page exists). For tests and benchmarks."""
    page_size = mmap.PAGESIZE
    n = (nbytes + page_size - 1) // page_size
    if n <= 0:
        return 0.0
    vec = (ctypes.c_ubyte * n)()
    if _libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(nbytes), vec) != 0:
        err = ctypes.get_errno()
        raise ResidencyError(err, f"mincore of {nbytes} bytes at {addr:#x}: {errno.errorcode.get(err, str(err))}")
    return sum(b & 1 for b in vec) / n


def runs(page_ids: list[int]) -> list[tuple[int, int]]:
    """(first page, count) for each run of consecutive ids (sorted, duplicates dropped)."""
    out: list[tuple[int, int]] = []
    for pid in sorted(set(page_ids)):
        if out and out[-1][0] + out[-1][1] == pid:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((pid, 1))
    return out
