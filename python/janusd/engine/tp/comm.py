"""One torch.distributed process group per tensor-parallel instance.

The group is built from its backend's ProcessGroup class over a store the instance's
driver hosts (a TCPStore), not through `init_process_group`: that one is global to a
process, and a process may some day hold shards of several instances (a device's worker
does in the daemon). Backends by device kind:
- cpu: gloo over tcp (127.0.0.1 for the local groups of `janus generate --tp`, tests and
  `janus bench tp`), the model's collectives and (a second gloo group) the step announcements;
- cuda: nccl for the model's collectives (tensors on the device), plus a gloo group for the
  leader's step announcements (host ints: no device round trip per step);
- npu: hccl through torch_npu (`torch.distributed.ProcessGroupHCCL(store, rank, size,
  timeout)`, as torch_npu documents it), plus a gloo group as on cuda.
Only the cpu/gloo path has run on our machines; the nccl and hccl branches are written
against the documented constructors and untested here.

Each collective is timed (`comm_s`, `calls`) as the wall time the calling thread waits
in it, which on cpu includes waiting for a slower peer; on cuda/npu the wait returns once
the collective is enqueued on the device, so those counters undercount there.
A peer that dies makes the next collective raise at once (gloo: "Connection closed by
peer"); a peer that hangs makes a model collective raise after `timeout_s`. The
announcements' group waits IDLE_WAIT_S: an idle instance's followers wait there between
steps (the supervisor, LocalGroup's reply bound or the daemon's heartbeat, ends a hung one).
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch

from janusd.engine.types import EngineError

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
IDLE_WAIT_S = 30 * 86400.0  # how long a follower waits for its leader's next announcement


def backend_for(kind: str) -> str:
    if kind not in BACKENDS:
        raise EngineError(f"unknown device kind {kind!r} for tensor parallelism (cpu: gloo, cuda: nccl, npu: hccl)")
    return BACKENDS[kind]


def open_store(host: str, port: int, timeout_s: float, *, is_master: bool = False) -> Any:
    """The instance's rendezvous store: the driver hosts it (port 0: any free port, read
    back as `.port`), the shards connect to it."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, None, is_master, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def make_group(backend: str, store: Any, rank: int, size: int, timeout_s: float, host: str = "127.0.0.1") -> Any:
    """A ProcessGroup of `backend` over `store` (a PrefixStore per group)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        opts._timeout = timeout
        return dist.ProcessGroupGloo(store, rank, size, opts)
    if backend == "nccl":  # untested here (no GPU lent): the documented constructor
        if not dist.is_nccl_available():
            raise EngineError("tp on cuda needs torch's nccl backend, which this torch lacks")
        return dist.ProcessGroupNCCL(store, rank, size, timeout)  # type: ignore[arg-type]  # the timeout overload
    if backend == "hccl":  # untested here (no NPU): torch_npu registers ProcessGroupHCCL on torch.distributed
        try:
            import torch_npu  # type: ignore[import-not-found]  # noqa: F401
        except ImportError as e:
            raise EngineError(f"tp on npu needs torch_npu (hccl), which cannot be imported: {e}") from None
        cls = getattr(dist, "ProcessGroupHCCL", None)
        if cls is None:
            raise EngineError("tp on npu: this torch_npu does not expose torch.distributed.ProcessGroupHCCL")
        return cls(store, rank, size, timeout)
    raise EngineError(f"unknown tp backend {backend!r} (gloo, nccl, hccl)")


class TPComm:
    """Shard `rank` of `size`'s end of one instance's group. `device`: the shard's torch
    device (the model's collectives run on tensors there)."""

    def __init__(self, store: Any, rank: int, size: int, device: torch.device, *, timeout_s: float = 60.0,
                 host: str = "127.0.0.1", prefix: str = "tp") -> None:
        import torch.distributed as dist

        self.rank, self.size, self.device = rank, size, device
        self.backend = backend_for(device.type)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.pg = make_group(self.backend, dist.PrefixStore(f"{prefix}/dev/", store), rank, size, timeout_s, host)
        # the announcements' own group, always: a follower waits in it for the next step as long as
        # the instance idles (gloo's timeout there broke an idle group after `timeout_s`); a leader
        # that dies still ends the wait at once (connection closed)
        self.cpu = make_group("gloo", dist.PrefixStore(f"{prefix}/cpu/", store), rank, size, IDLE_WAIT_S, host)
        self.comm_s = 0.0  # seconds waited in the model's collectives (all-reduce, logits gather)
        self.calls = 0
        self.announce_s = 0.0  # seconds in the leader's step announcements (cpu group)

    # ---- the model's collectives (device tensors) ----
    def all_reduce(self, t: torch.Tensor) -> None:
        """Sum `t` over the group, in place."""
        t0 = time.perf_counter()
        self.pg.allreduce([t]).wait()
        self.comm_s += time.perf_counter() - t0
        self.calls += 1

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every shard's `t` (equal shapes), in rank order."""
        t0 = time.perf_counter()
        outs = [torch.empty_like(t) for _ in range(self.size)]
        self.pg.allgather([outs], [t.contiguous()]).wait()
        self.comm_s += time.perf_counter() - t0
        self.calls += 1
        return outs

    # ---- host ints and bytes (the cpu group) ----
    def broadcast_(self, t: torch.Tensor, root: int = 0) -> torch.Tensor:
        """`t` (a cpu tensor) from `root` to everyone, in place."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = root
        self.cpu.broadcast([t], opts).wait()
        return t

    def agree(self, ok: bool) -> bool:
        """True on every shard iff every shard said True (one MIN all-reduce)."""
        import torch.distributed as dist

        flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self.cpu.allreduce([flag], opts).wait()
        return bool(flag.item())

    def gather_bytes(self, data: bytes) -> list[bytes]:
        """Every shard's bytes, in rank order (on every shard)."""
        n = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.empty_like(n) for _ in range(self.size)]
        self.cpu.allgather([sizes], [n]).wait()
        most = max(int(s.item()) for s in sizes)
        buf = torch.zeros(max(most, 1), dtype=torch.uint8)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        outs = [torch.empty_like(buf) for _ in range(self.size)]
        self.cpu.allgather([outs], [buf]).wait()
        return [bytes(o[: int(s.item())].numpy().tobytes()) for o, s in zip(outs, sizes)]

    def broadcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        """`data` from `root` (others pass None)."""
        n = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        self.broadcast_(n, root)
        buf = torch.zeros(max(int(n.item()), 1), dtype=torch.uint8)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self.broadcast_(buf, root)
        return bytes(buf[: int(n.item())].numpy().tobytes())

    def reset_counters(self) -> None:
        self.comm_s = 0.0
        self.calls = 0
        self.announce_s = 0.0
