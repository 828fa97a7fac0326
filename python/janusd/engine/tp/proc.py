"""One shard of a local tensor-parallel group, as a process:
`python -m janusd.engine.tp.proc --rank R --size N --store-port P ...` (spawn/exec, never
fork; engine/tp/group.py starts N of them).

Every shard opens its own device's xTensor pool (a DeviceEngine sized to its part of the
model), reads only its slices of the checkpoint, and joins the instance's process group
(engine/tp/comm.py). Rank 0, the leader, talks to the driver over the inherited socket
`--fd` (engine/tp/msgs.py) and runs the instance's ModelEngine; the others follow its
announcements (engine/tp/shard.py Follower). A follower that fails mid-step exits, so the
leader's next collective fails at once (gloo: connection closed) instead of hanging; the
leader reports the error to the driver and the group is over (the driver restarts it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import msgspec

from janusd.engine.tp import msgs


def _log(rank: int, text: str) -> None:
    sys.stderr.write(f"[tp shard {rank}] {text}\n")
    sys.stderr.flush()


class ShardHost:
    """This process's device (one xTensor pool, a DeviceEngine) and its shards of the
    group's models, by name; `slots` is the order they were loaded in (the followers' index)."""

    def __init__(self, rank: int, size: int, kind: str, device_index: int, comm: Any, memory_bytes: int,
                 page_size: int) -> None:
        from janusd.engine.device_engine import DeviceEngine

        self.rank, self.size, self.kind, self.device_index, self.comm = rank, size, kind, device_index, comm
        self.de = DeviceEngine(kind=kind, device_index=device_index, memory_bytes=memory_bytes, page_size=page_size)
        self.slots: list[str] = []
        self.follower: Any = None  # ranks > 0: engine/tp/shard.py Follower

    def load(self, cmd: msgs.Load) -> tuple[msgs.ShardInfo, Any]:
        from janusd.config import EngineConfig, ModelConfig
        from janusd.engine.loader import open_checkpoint
        from janusd.engine.tp.layout import ShardLayout
        from janusd.engine.tp.shard import TPShard

        info = msgs.ShardInfo(rank=self.rank, device=f"{self.kind}:{self.device_index}")
        if cmd.name in self.slots:
            info.error = f"model {cmd.name!r} is already loaded on this group"
            return info, None
        try:
            ck = open_checkpoint(cmd.spec, Path(cmd.cache_dir) if cmd.cache_dir else None)
            shard = TPShard(ShardLayout(ck.arch, self.size, self.rank), self.comm) if self.size > 1 else None
            model_cfg = ModelConfig(name=cmd.name, checkpoint=cmd.spec, dtype=cmd.dtype, kv_cache_mib=cmd.kv_cache_mib,
                                    max_model_len=cmd.max_model_len)
            engine_cfg = EngineConfig(block_size=cmd.block_size, max_num_seqs=cmd.max_num_seqs,
                                      max_num_batched_tokens=cmd.max_num_batched_tokens)
            me = self.de.load_model(model_cfg, engine_cfg, checkpoint=ck, shard=shard)
        except Exception as e:  # reported to the driver through the leader, naming this shard
            _log(self.rank, "load failed:\n" + traceback.format_exc())
            info.error = str(e) if isinstance(e, ValueError | RuntimeError) else f"{type(e).__name__}: {e}"
            return info, None
        self.slots.append(cmd.name)
        info.weight_bytes = me.weight_bytes  # type: ignore[attr-defined]  # DeviceEngine sets it
        info.bytes_read = ck.bytes_read
        info.kv_bytes_per_token = me.kv.bytes_per_token
        specs = ck.tensor_specs()
        if shard is not None:
            specs = shard.layout.local_specs(specs)
        info.shapes = {n: list(t[0]) for n, t in specs.items()}
        return info, me

    def unload(self, name: str) -> None:
        if name in self.de.models:
            self.de.unload_model(name)

    def on_call(self, data: bytes) -> None:
        """A follower's answer to the leader's OP_CALL (JSON commands)."""
        cmd = json.loads(data)
        op = cmd.pop("op")
        if op == "load":
            info, me = self.load(msgspec.convert(cmd, msgs.Load))
            if me is not None:
                self.follower.models[len(self.slots) - 1] = me
            self.comm.gather_bytes(msgspec.json.encode(info))
        elif op == "unload":
            slot = self.slots.index(cmd["name"]) if cmd["name"] in self.slots else -1
            self.follower.models.pop(slot, None)
            self.unload(cmd["name"])
        elif op == "allreduce":
            bare_allreduce(self.comm, cmd)
        else:
            raise RuntimeError(f"unknown call {op!r} from the leader")


def bare_allreduce(comm: Any, cmd: dict[str, Any]) -> list[float]:
    """`reps` all-reduces of a [rows, hidden] tensor of the model's dtype: seconds each."""
    import torch

    from janusd.engine.runner import torch_dtype

    t = torch.zeros(cmd["rows"], cmd["hidden"], dtype=torch_dtype(cmd["dtype"]), device=comm.device)
    out = []
    for _ in range(cmd["reps"]):
        t0 = time.perf_counter()
        comm.pg.allreduce([t]).wait()
        out.append(time.perf_counter() - t0)
    return out


def bench_steps(me: Any, comm: Any, cmd: msgs.Bench) -> dict[str, float]:
    """Median prefill step (every prompt prefilled in one step) and decode step of `batch`
    sequences on `me` (a ModelEngine: one device, or a tp group's leader), with the
    leader's wait in the model's collectives per step (`comm`: None on one device)."""
    from janusd.engine.types import SamplingParams

    vocab = me.arch.vocab_size
    params = SamplingParams(max_tokens=cmd.decode_steps + 2, temperature=0.0, ignore_eos=True)
    me.generate({"warm": [5, 6, 7, 8]}, SamplingParams(max_tokens=3, temperature=0.0))
    pre: list[float] = []
    dec: list[float] = []
    pre_comm: list[float] = []
    dec_comm: list[float] = []
    calls: list[int] = []
    announce: list[float] = []
    for rep in range(cmd.prefill_reps):
        for b in range(cmd.batch):
            me.add_request(f"r{rep}-{b}", [(31 * b + 7 * j + rep) % (vocab - 10) + 5 for j in range(cmd.prompt_len)],
                           params)
        first = 0
        while first < cmd.batch:
            c0 = comm.comm_s if comm is not None else 0.0
            t0 = time.perf_counter()
            first += sum(1 for o in me.step() if o.num_output_tokens == 1)
            pre.append(time.perf_counter() - t0)
            pre_comm.append((comm.comm_s if comm is not None else 0.0) - c0)
        for _ in range(cmd.decode_steps):
            c0, n0, a0 = (comm.comm_s, comm.calls, comm.announce_s) if comm is not None else (0.0, 0, 0.0)
            t0 = time.perf_counter()
            me.step()
            dec.append(time.perf_counter() - t0)
            if comm is not None:
                dec_comm.append(comm.comm_s - c0)
                calls.append(comm.calls - n0)
                announce.append(comm.announce_s - a0)
        for rid in list(me.seqs):
            me.abort(rid)
    med = statistics.median

    def ms(xs: list[float]) -> float:
        return round(1000 * med(xs), 3) if xs else 0.0

    return {"prefill_step_ms": ms(pre), "decode_step_ms": ms(dec),
            "comm_ms_per_prefill_step": ms(pre_comm), "comm_ms_per_decode_step": ms(dec_comm),
            "collectives_per_decode_step": float(med(calls)) if calls else 0.0,
            "announce_ms_per_step": ms(announce), "prefill_steps": float(len(pre)), "decode_steps": float(len(dec))}


class Leader:
    """Rank 0: the driver's requests, the group's ModelEngines, the followers' announcements."""

    def __init__(self, conn: Any, host: ShardHost) -> None:
        from janusd.engine.tp.shard import LeaderLink

        self.conn = conn
        self.host = host
        self.link = LeaderLink(host.comm) if host.size > 1 else None
        self.broken: str | None = None  # a collective failed: the group is over

    def serve(self) -> None:
        dec = msgspec.msgpack.Decoder(msgs.ToLeader)
        while True:
            body = self.conn.recv()
            if body is None:  # the driver is gone
                break
            try:
                msg = dec.decode(body)
            except msgspec.DecodeError as e:
                self.conn.send(msgs.Error(f"undecodable request: {e}"))
                continue
            if isinstance(msg, msgs.Stop):
                break
            if self.broken is not None:
                self.conn.send(msgs.Error(f"the tp group is broken: {self.broken}"))
                continue
            try:
                self.conn.send(self.handle(msg))
            except Exception as e:
                from janusd.engine.types import RequestError

                if not isinstance(e, RequestError):
                    self.broken = f"{type(e).__name__}: {e}"
                    _log(0, "request failed:\n" + traceback.format_exc())
                self.conn.send(msgs.Error(str(e) or type(e).__name__))
        if self.link is not None and self.broken is None:
            self.link.stop()
        try:
            self.conn.send(msgs.Stopped())
        except OSError:
            pass

    def _model(self, name: str) -> Any:
        me = self.host.de.models.get(name)
        if me is None:
            from janusd.engine.types import RequestError

            raise RequestError(f"model {name!r} is not loaded on this group (loaded: {', '.join(self.host.slots)})")
        return me

    def handle(self, msg: Any) -> Any:
        if isinstance(msg, msgs.Load):
            return self.load(msg)
        if isinstance(msg, msgs.Unload):
            self._model(msg.name)
            if self.link is not None:
                self.link.call(json.dumps({"op": "unload", "name": msg.name}).encode())
            self.host.unload(msg.name)
            return msgs.Unloaded(msg.name)
        if isinstance(msg, msgs.Generate):
            return self.generate(msg)
        if isinstance(msg, msgs.Bench):
            return self.bench(msg)
        return msgs.Error(f"unknown request {type(msg).__name__}")

    def load(self, cmd: msgs.Load) -> Any:
        if self.link is not None:
            body = msgspec.to_builtins(cmd)
            body.pop("type", None)
            self.link.call(json.dumps({"op": "load", **body}).encode())
        info, me = self.host.load(cmd)
        infos = [info]
        if self.link is not None:
            infos = [msgspec.json.decode(b, type=msgs.ShardInfo)
                     for b in self.host.comm.gather_bytes(msgspec.json.encode(info))]
        bad = [i for i in infos if i.error]
        if bad:
            if me is not None:  # loaded here but not everywhere: no half instance stays
                self.host.slots.remove(cmd.name)
                self.host.unload(cmd.name)
            if len({i.error for i in bad}) == 1 and len(bad) == len(infos):
                return msgs.Error(bad[0].error or "")
            return msgs.Error("; ".join(f"shard {i.rank} ({i.device}): {i.error}" for i in bad))
        if self.link is not None:
            from janusd.engine.tp.shard import attach_leader

            attach_leader(me, self.link.for_model(len(self.host.slots) - 1))
        return msgs.Loaded(name=cmd.name, shards=infos, vocab_size=me.arch.vocab_size,
                           eos_token_ids=list(me.eos_token_ids))

    def generate(self, cmd: msgs.Generate) -> msgs.Generated:
        import numpy as np

        me = self._model(cmd.model)
        rows: dict[str, list[Any]] = {rid: [] for rid in cmd.prompts}
        if cmd.logits:
            me.logit_sink = lambda rid, row: rows[rid].append(row.numpy().copy())
        try:
            for rid, prompt in cmd.prompts.items():
                me.add_request(rid, prompt, cmd.params)
            out = msgs.Generated(token_ids={rid: [] for rid in cmd.prompts}, text={rid: "" for rid in cmd.prompts},
                                 finish_reason={rid: None for rid in cmd.prompts})
            while me.has_work():
                for o in me.step():
                    out.token_ids[o.req_id] += o.token_ids
                    out.text[o.req_id] += o.text
                    if o.finished:
                        out.finish_reason[o.req_id] = o.finish_reason
                    if o.error:
                        out.errors[o.req_id] = o.error
                    if cmd.stream and (o.token_ids or o.text):
                        self.conn.send(msgs.Out(req_id=o.req_id, token_ids=list(o.token_ids), text=o.text))
        finally:
            me.logit_sink = None
            for rid in list(me.seqs):
                me.abort(rid)
        if cmd.logits:
            out.logits = {rid: np.stack(r).astype(np.float32).tobytes() if r else b"" for rid, r in rows.items()}
        return out

    def bench(self, cmd: msgs.Bench) -> msgs.BenchResult:
        """bench_steps on the group's model, and a bare all-reduce of [batch, hidden] rows
        (one collective alone, no compute between)."""
        me = self._model(cmd.model)
        figures = bench_steps(me, self.host.comm, cmd)
        figures["allreduce_ms"] = 0.0
        if self.link is not None and cmd.allreduce_reps > 0:
            call = {"op": "allreduce", "rows": cmd.batch, "hidden": me.arch.hidden_size, "dtype": me.dtype_name,
                    "reps": cmd.allreduce_reps}
            self.link.call(json.dumps(call).encode())
            figures["allreduce_ms"] = round(1000 * statistics.median(bare_allreduce(self.host.comm, call)), 3)
        return msgs.BenchResult(figures=figures)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m janusd.engine.tp.proc", description=__doc__)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--store-host", default="127.0.0.1")
    p.add_argument("--store-port", type=int, default=0)
    p.add_argument("--kind", default="cpu")
    p.add_argument("--device-index", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a collective waits for a silent peer")
    p.add_argument("--fd", type=int, default=-1, help="rank 0: the socket to the driver")
    p.add_argument("--memory-bytes", type=int, default=1 << 30, help="this shard's device pool")
    p.add_argument("--page-size", type=int, default=2 << 20)
    args = p.parse_args(argv)
    # the driver owns our life: its Ctrl-C must not kill a shard mid-collective; we exit on
    # Stop, on the driver's EOF (leader) or on the leader's stop / death (followers)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = None
    if args.rank == 0:
        from janusd.wire.framing import BlockingFramedSocket

        conn = BlockingFramedSocket(socket.socket(fileno=args.fd))
    code = 0
    try:
        import torch

        if args.threads > 0:
            torch.set_num_threads(args.threads)
        from janusd.engine.device_engine import check_device_runtime

        device = check_device_runtime(args.kind, args.device_index)  # a missing runtime: one clear error
        comm = None
        if args.size > 1:
            from janusd.engine.tp.comm import TPComm, open_store

            store = open_store(args.store_host, args.store_port, args.timeout)
            comm = TPComm(store, args.rank, args.size, device, timeout_s=args.timeout, host=args.store_host)
        host = ShardHost(args.rank, args.size, args.kind, args.device_index, comm, args.memory_bytes, args.page_size)
        if conn is not None:
            Leader(conn, host).serve()
        else:
            from janusd.engine.tp.shard import Follower

            if comm is None:
                raise ValueError(f"rank {args.rank} of a group of {args.size}: followers need --size > 1")
            host.follower = Follower(comm, host.on_call)
            host.follower.serve()
    except Exception as e:
        _log(args.rank, "failed:\n" + traceback.format_exc())
        if conn is not None:
            try:
                conn.send(msgs.Error(f"tp shard 0: {type(e).__name__}: {e}"))
            except OSError:
                pass
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # nothing a shard holds outlives it; skip the interpreter's teardown


if __name__ == "__main__":
    sys.exit(main())
