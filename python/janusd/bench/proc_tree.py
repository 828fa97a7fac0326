"""Resident memory of a whole process tree, read from /proc (Linux).

Why a tree: a server is more than its first process. janusd is a daemon, a worker per
device and, once traffic starts, the oracle's refit helper; llama-server is one process.
Comparing their first processes alone would hide the workers, so the figures a peer
comparison reports are the sum over the root and every descendant alive at that moment.
RSS counts a page shared by two processes of the tree twice; PSS splits it between them,
so the tree's PSS is what the tree costs the host (both are reported).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass


def _children(pid: int) -> list[int]:
    """Direct children of pid: /proc/PID/task/*/children lists each thread's."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    return out


def tree_pids(root: int) -> list[int]:
    """root and its descendants alive now (root first; [] when root is gone)."""
    if not os.path.exists(f"/proc/{root}"):
        return []
    seen, todo = [root], [root]
    while todo:
        for c in _children(todo.pop()):
            if c not in seen:
                seen.append(c)
                todo.append(c)
    return seen


def _kib(path: str, key: str) -> int:
    """The `key:` line of a /proc status-like file in KiB; 0 when the process is gone."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass(frozen=True)
class TreeMemory:
    """One reading of a tree: RSS and PSS summed over its processes, and each one's RSS."""

    rss_mib: float
    pss_mib: float
    processes: dict[int, tuple[str, float]]  # pid -> (command name, RSS MiB)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    module = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-m", "-c")), None)
    return f"{os.path.basename(argv[0])} {module}" if module else (os.path.basename(argv[0]) if argv else "?")


def tree_memory(root: int) -> TreeMemory:
    procs: dict[int, tuple[str, float]] = {}
    pss = 0
    for pid in tree_pids(root):
        procs[pid] = (_comm(pid), _kib(f"/proc/{pid}/status", "VmRSS:") / 1024)
        pss += _kib(f"/proc/{pid}/smaps_rollup", "Pss:")
    return TreeMemory(round(sum(r for _, r in procs.values()), 1), round(pss / 1024, 1), procs)


class PeakSampler:
    """The highest tree RSS (and the PSS of that same reading) seen every period_s, on a
    thread, inside a `with` block: a server's peak under load, which one reading
    after the load would miss (a worker frees its batch's buffers when it idles)."""

    def __init__(self, root: int, period_s: float = 0.05) -> None:
        self.root = root
        self.period_s = period_s
        self.peak = TreeMemory(0.0, 0.0, {})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-peak", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            m = tree_memory(self.root)
            if m.rss_mib > self.peak.rss_mib:
                self.peak = m
            self._stop.wait(self.period_s)

    def __enter__(self) -> PeakSampler:
        self.peak = tree_memory(self.root)  # one reading at least, however short the load
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
