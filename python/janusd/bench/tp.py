"""`janus bench tp`: one model at tp 1 (the single-device engine, in this process) and at
tp 2 (engine/tp/group.py: 2 shard processes, gloo on 127.0.0.1 on cpu), same batches.

Per batch size and degree: the median prefill step (every prompt of the batch prefilled
in one step) and decode step; the leader's wait in the model's collectives per step
(`comm_ms_per_*_step`: the embedding's all-reduce, two per layer and the logits gather;
on cpu this wait includes a slower peer's compute, so it is an upper bound on the
communication itself); the collectives per decode step; the leader's step announcement
per step; and a bare all-reduce of one step's [batch, hidden] rows (`allreduce_ms`, no
compute between calls: the link's own cost), times the all-reduces per step
(`allreduce_ms_per_step`: 1 + 2 x layers). `greedy_equal`: tp 2 produced tp 1's greedy
tokens on the bench's prompt. Each shard and the tp 1 engine run `--threads` intra-op
threads, so tp 2 uses twice the cores of tp 1. `prior`: the oracle's roofline prior's decode
step and collectives for the same model, batches and degrees on this cpu's spec (recorded
with the spec and the model's spec: tests/test_tp_comm_prior.py checks the prior against
a recorded run).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="demo:llama-small", help="checkpoint (default demo:llama-small)")
    p.add_argument("--tp", type=int, default=2, help="the degree compared with tp 1 (default 2)")
    p.add_argument("--batches", default="1,8", help="batch sizes (default 1,8)")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt tokens per sequence (default 64)")
    p.add_argument("--decode-steps", type=int, default=16, help="decode steps timed per repetition (default 16)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per batch size (default 3)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per shard and for tp 1 (default 1)")
    p.add_argument("--cache-dir", default=None, help="where demo: checkpoints are made")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.loader import open_checkpoint
    from janusd.engine.tp.group import LocalGroup
    from janusd.engine.tp.layout import check_tp
    from janusd.engine.tp.msgs import Bench
    from janusd.engine.tp.proc import bench_steps
    from janusd.engine.types import SamplingParams

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cache = Path(args.cache_dir) if args.cache_dir else None
    ck = open_checkpoint(args.model, cache)
    a = ck.arch
    check_tp(a, args.tp, args.model)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    max_len = args.prompt_len + args.decode_steps + 16
    kv_mib = max(8, -(-max(batches) * max_len * a.num_hidden_layers * 2 * a.num_key_value_heads * a.head_dim * 4
                      // (1 << 20)) * 2)
    load = dict(dtype=args.dtype, kv_cache_mib=kv_mib, max_model_len=max_len,
                max_num_seqs=max(32, max(batches)), max_num_batched_tokens=max(512, max(batches) * args.prompt_len))
    probe = [(11 * j) % (a.vocab_size - 10) + 5 for j in range(args.prompt_len)]
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

    def steps(b: int) -> dict[str, Any]:
        return dict(batch=b, prompt_len=args.prompt_len, decode_steps=args.decode_steps, prefill_reps=args.reps,
                    allreduce_reps=200)

    # tp 1: the single-device engine, here
    de = DeviceEngine(kind="cpu", memory_bytes=1 << 31)
    me = de.load_model(ModelConfig(name="tp1", checkpoint=args.model, dtype=args.dtype, kv_cache_mib=kv_mib,
                                   max_model_len=max_len),
                       EngineConfig(max_num_seqs=load["max_num_seqs"],
                                    max_num_batched_tokens=load["max_num_batched_tokens"]), checkpoint=ck)
    tp1 = {f"b{b}": bench_steps(me, None, Bench(**steps(b))) for b in batches}
    ref = [t for o in me.generate({"p": probe}, greedy)["p"] for t in o.token_ids]
    de.unload_model("tp1")
    # tp N: N shard processes
    t0 = time.perf_counter()
    with LocalGroup(args.tp, threads=args.threads) as g:
        g.load(args.model, name="m", cache_dir=args.cache_dir or "", **load)
        start_s = time.perf_counter() - t0
        tpn = {f"b{b}": g.bench(model="m", **steps(b)) for b in batches}
        got = g.generate({"p": probe}, greedy, model="m").token_ids["p"]
    per_step = 1 + 2 * a.num_hidden_layers
    for f in tpn.values():
        f["allreduce_ms_per_step"] = round(f["allreduce_ms"] * per_step, 3)
    out: dict[str, Any] = {
        "model": args.model,
        "arch": {"layers": a.num_hidden_layers, "hidden": a.hidden_size, "heads": a.num_attention_heads,
                 "kv_heads": a.num_key_value_heads, "intermediate": a.intermediate_size, "vocab": a.vocab_size},
        "dtype": args.dtype, "threads_per_shard": args.threads, "tp": args.tp, "prompt_len": args.prompt_len,
        "host_cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "group_start_s": round(start_s, 2), "tp1": tp1, f"tp{args.tp}": tpn, "greedy_equal": got == ref,
    }
    out.update(_prior_figures(args, ck, batches, args.prompt_len + args.decode_steps / 2.0))
    for b in batches:
        k = f"b{b}"
        out[f"decode_speedup_{k}"] = round(tp1[k]["decode_step_ms"] / max(1e-9, tpn[k]["decode_step_ms"]), 3)
        out[f"prefill_speedup_{k}"] = round(tp1[k]["prefill_step_ms"] / max(1e-9, tpn[k]["prefill_step_ms"]), 3)
    return out


def _prior_figures(args: argparse.Namespace, ck: Any, batches: list[int], context: float) -> dict[str, Any]:
    """What the oracle's roofline prior predicts beside what was measured: the cpu's spec
    (hw/devices.py: the measured peaks and host time per step, gloo's link latency), the
    model's spec, and per degree and batch the prior's decode step and its collectives
    (at the decode's mean context). tests/test_tp_comm_prior.py holds a recorded run."""
    import msgspec

    from janusd.engine import step_probe
    from janusd.hw.devices import device_spec
    from janusd.hw.model_spec import ModelSpec
    from janusd.oracle.prior import RooflinePrior

    cache = str(Path(args.cache_dir or "~/.cache/janusd").expanduser())
    dev = device_spec("cpu", cache_dir=Path(cache), overhead_probe=step_probe.bind(cache))
    spec = ModelSpec.from_config(msgspec.to_builtins(ck.arch), dtype=args.dtype)
    prior: dict[str, Any] = {}
    for tp in (1, args.tp):
        p = RooflinePrior(spec, dev, 1.0, 1.0, tp=tp)
        prior[f"tp{tp}"] = {f"b{b}": {"decode_step_ms": round(p.decode_step_s(b, context) * 1e3, 3),
                                      "comm_ms_per_decode_step": round(p.comm_s(b) * 1e3, 3)} for b in batches}
    return {"prior": prior, "decode_context": context, "device_spec": msgspec.to_builtins(dev),
            "model_spec": msgspec.to_builtins(spec)}
