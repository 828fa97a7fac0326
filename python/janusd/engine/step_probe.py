"""The engine's host time per step on this machine: what a roofline cannot see.

A decode step of a small model on a CPU costs far more than its FLOPs and bytes (a
4-layer demo model: ~1.7 ms where the roofline says ~0.4 ms): Python and op dispatch per
layer, scheduling and sampling per step, bookkeeping per sequence. The oracle's prior
adds DeviceSpec.step_time_floor(layers, batch) = step + layers * layer + batch * seq
(hw/devices.py) to every step; this module measures those three figures on the real
engine, once per machine (hw/cpu_peaks.py caches them with the peaks):
- decode steps of two demo models that differ in depth (PROBE_MODELS: 2 and 4 layers,
  tiny widths, so that their FLOPs and bytes are a small part of a step) at batch 1 and
  BATCH, the fastest of STEPS timed steps each, after a warm-up;
- minus each step's roofline (the peaks just measured), then a non-negative least-
  squares fit of the remainder to step + layers * layer + batch * seq;
- prefills (one sequence) of the same two models at two prompt lengths (PREFILL_TOKENS),
  the fastest of PREFILLS each: how much longer the longer prompt takes than its roofline
  says, beyond the shorter one's, over layers x the extra tokens, is the host time per
  prompt token per layer (least squares through 0 over the two models, non-negative; the
  difference cancels the step's own floor). A torch profile of a 240-token prefill of
  demo:llama-small: the GEMMs ~2/3 of it at about the 512^3 matmul peak, the attention
  kernel ~1/6 (more than its counted FLOPs), norms, RoPE and the KV write the rest.
The fastest of the timed steps counts, not the median: on a shared machine other
processes' time slices land inside some steps, and the fastest is the closest to the
engine's own cost (cpu_peaks.py takes the best run for the same reason).
It runs the ModelEngine in process (scheduler, forward, sampler, detokenizer), not the
worker's socket loop: the frame per step a worker sends is left out (tens of us).
Lives in engine/ because it drives the engine; hw/ only receives the function.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

PROBE_MODELS = ("demo:llama-tiny", "demo:llama-small")
BATCH = 16
STEPS = 15
PROMPT = 16
PREFILL_TOKENS = (32, 192)
PREFILLS = 5
POOL_BYTES = 64 << 20


def _fastest_decode_step(me: Any, batch: int, salt: int) -> float:
    from janusd.engine.types import SamplingParams

    params = SamplingParams(max_tokens=STEPS + 4, temperature=0.0, ignore_eos=True)
    vocab = me.arch.vocab_size
    for i in range(batch):
        me.add_request(f"p{salt}-{i}", [(31 * i + 7 * j + salt) % (vocab - 10) + 5 for j in range(PROMPT)], params)
    while any(s.num_output == 0 for s in me.seqs.values()):  # prefills and the first token, untimed
        me.step()
    me.step()  # one decode step of warm-up
    times = []
    for _ in range(STEPS):
        t = time.perf_counter()
        me.step()
        times.append(time.perf_counter() - t)
    while me.has_work():
        me.step()
    return min(times)


def _fastest_prefill(me: Any, tokens: int, salt: int) -> float:
    from janusd.engine.types import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    vocab = me.arch.vocab_size
    times = []
    for k in range(PREFILLS + 1):  # the first one warms up, untimed
        me.add_request(f"f{salt}-{k}", [(29 * k + 13 * j + salt) % (vocab - 10) + 5 for j in range(tokens)], params)
        t = time.perf_counter()
        me.step()
        times.append(time.perf_counter() - t)
        while me.has_work():
            me.step()
    return min(times[1:])


def measure(threads: int, peaks: dict[str, float], kind: str = "cpu", cache_dir: Path | None = None
            ) -> dict[str, float]:
    """{step_overhead_s, layer_overhead_s, seq_overhead_s, prefill_token_overhead_s} of the
    engine on this machine (module doc); `peaks`: {"peak_flops", "mem_bw"} to subtract the
    roofline with."""
    import msgspec
    import numpy as np
    import torch
    from scipy.optimize import nnls

    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.loader import open_checkpoint
    from janusd.hw.model_spec import ModelSpec

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows: list[list[float]] = []
    excess: list[float] = []
    prefills: list[tuple[float, float]] = []  # (layers x extra tokens, extra seconds beyond the roofline)
    try:
        for k, name in enumerate(PROBE_MODELS):
            ck = open_checkpoint(name, cache_dir)
            spec = ModelSpec.from_config(msgspec.to_builtins(ck.arch), dtype="float32")
            de = DeviceEngine(kind=kind, memory_bytes=POOL_BYTES)
            me = de.load_model(ModelConfig(name="probe", checkpoint=name, kv_cache_mib=16, max_model_len=256),
                               EngineConfig(max_num_seqs=BATCH, max_num_batched_tokens=512), checkpoint=ck)
            try:
                _fastest_decode_step(me, 1, 1000 + k)  # warm the model's code paths once
                for b in (1, BATCH):
                    step_s = _fastest_decode_step(me, b, 100 * k + b)
                    ctx = b * (PROMPT + STEPS / 2.0)
                    roof = max(spec.decode_step_flops(b, ctx) / peaks["peak_flops"],
                               spec.decode_step_bytes(b, ctx) / peaks["mem_bw"])
                    rows.append([1.0, float(spec.layers), float(b)])
                    excess.append(max(step_s - roof, 0.0))
                excess_pf = []
                for n in PREFILL_TOKENS:
                    roof = max(spec.prefill_flops(n) / peaks["peak_flops"], spec.prefill_bytes(n) / peaks["mem_bw"])
                    excess_pf.append(_fastest_prefill(me, n, 7 + k + n) - roof)
                prefills.append((float(spec.layers * (PREFILL_TOKENS[1] - PREFILL_TOKENS[0])),
                                 excess_pf[1] - excess_pf[0]))
            finally:
                de.unload_model("probe")
    finally:
        torch.set_num_threads(old)
    coef, _ = nnls(np.array(rows), np.array(excess))
    x, y = (np.array(c) for c in zip(*prefills, strict=True))
    per_token = max(float(x @ y / (x @ x)), 0.0)
    return {"step_overhead_s": float(coef[0]), "layer_overhead_s": float(coef[1]), "seq_overhead_s": float(coef[2]),
            "prefill_token_overhead_s": per_token}


def bind(cache_dir: str | Path | None, kind: str = "cpu") -> Any:
    """measure as hw/cpu_peaks.py's overhead_probe: (threads, peaks) -> figures."""
    where = Path(cache_dir).expanduser() if cache_dir else None
    return lambda threads, peaks: measure(threads, peaks, kind, where)
