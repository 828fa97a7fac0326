"""What `janus bench dispatch-replay` runs (bench/dispatch_replay.py): the policies, plans,
objectives and baseline kinds asked, the variants they make and their interleaved order,
each run's daemon config, and the capacity figure of the closed loop. Pure (no daemon,
no clock), so the run plan is tested without running anything."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

POLICIES = ("lst_imh", "round_robin", "least_load")
PLANS = ("global", "window")
DEFAULT_PLAN = "global"
OBJECTIVES = ("requests", "tokens")
BASELINES = ("peer", "guarded")
# the [dispatch] keys of a "peer" baseline: no deadline anywhere (bench/dispatch_replay.py's doc)
PEER_DISPATCH = 'requeue = "keep"\nadmission = "queue"\ndecode_guard = false\n'
DEFAULT_OBJECTIVE = "requests"
MODEL_NAME = "llm"
RELAXED_SLO_MS = 600_000.0  # capacity and warm-up requests: never rejected, never late
SCENARIOS = ("one", "mixed")


@dataclass(frozen=True)
class MixedClass:
    """One model of the mixed scenario: its SLO, its share of the requests and its length
    mix (lognormal around the means, capped)."""

    name: str
    ttft_slo_ms: float
    tpot_slo_ms: float
    share: float
    input_mean: float
    input_sigma: float
    input_cap: int
    output_mean: float
    output_sigma: float
    output_cap: int


# Three models co-located on both devices (issue 36): an interactive chat model (tight TTFT,
# short prompts), a batch model (2 s TTFT, long answers) and a RAG model (long prompts, 1 s
# TTFT). Their bursts overlap (replay_trace.make_mixed_trace), so the order of prefills on a
# shared device decides which SLO is met; with one class and identical devices (scenario
# "one") every order is FIFO.
MIXED = (
    MixedClass("chat", 300.0, 50.0, 0.5, 120.0, 0.6, 512, 48.0, 0.6, 128),
    MixedClass("batch", 2000.0, 100.0, 0.2, 300.0, 0.5, 1024, 160.0, 0.4, 256),
    MixedClass("rag", 1000.0, 50.0, 0.3, 850.0, 0.25, 1024, 64.0, 0.5, 128),
)


def scenario_models(scenario: str, ttft_slo_ms: float, tpot_slo_ms: float) -> list[tuple[str, float, float]]:
    """(name, TTFT SLO ms, TPOT SLO ms) of each model the scenario serves on devices [0, 1]."""
    if scenario == "mixed":
        return [(c.name, c.ttft_slo_ms, c.tpot_slo_ms) for c in MIXED]
    return [(MODEL_NAME, ttft_slo_ms, tpot_slo_ms)]


def parse_list(text: str, allowed: Sequence[str] | None = None, what: str = "value") -> list[str]:
    """'a, b,a' -> ['a', 'b'] (order kept, duplicates dropped); checked against `allowed`."""
    out = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not out:
        raise ValueError(f"give at least one {what}")
    bad = [x for x in out if allowed is not None and x not in allowed]
    if bad:
        raise ValueError(f"unknown {what} {bad}; choose from {list(allowed or [])}")
    return out


def parse_loads(text: str) -> list[float]:
    loads = [float(x) for x in parse_list(text, what="load")]
    if any(not (math.isfinite(x) and x > 0) for x in loads):
        raise ValueError(f"loads must be > 0, got {loads}")
    return loads


def variants(policies: Sequence[str], plans: Sequence[str], objectives: Sequence[str] = (DEFAULT_OBJECTIVE,),
             baselines: Sequence[str] = ("guarded",)) -> list[dict[str, str | None]]:
    """(label, policy, plan, objective, baseline) of each daemon configuration to compare.

    Plan and objective only change LST-IMH, so they multiply lst_imh alone; baseline
    kinds multiply the other policies alone. Each is None where no key is to be written
    (the default; "guarded" is the daemon's default). Labels: the policy, plus /plan and
    /objective for lst_imh, /kind for a baseline, when more than one of that kind is asked.
    """
    out: list[dict[str, str | None]] = []
    for pol in policies:
        lst = pol == "lst_imh"
        for plan in (plans if lst else [DEFAULT_PLAN]):
            for obj in (objectives if lst else [DEFAULT_OBJECTIVE]):
                for kind in ([None] if lst else baselines):
                    label = pol
                    if lst and len(plans) > 1:
                        label += f"/{plan}"
                    if lst and len(objectives) > 1:
                        label += f"/{obj}"
                    if not lst and len(baselines) > 1:
                        label += f"/{kind}"
                    out.append({"label": label, "policy": pol, "plan": None if plan == DEFAULT_PLAN else plan,
                                "objective": None if obj == DEFAULT_OBJECTIVE else obj,
                                "baseline": None if kind in (None, "guarded") else kind})
    return out


def schedule(loads: Sequence[float], labels: Sequence[str], runs: int) -> list[tuple[int, float, str]]:
    """Interleaved order: run 1 of every load and variant, then run 2, ... (run numbers from 1)."""
    return [(r, load, v) for r in range(1, runs + 1) for load in loads for v in labels]


def capacity_rps(done_s: Sequence[float], warmup_s: float, end_s: float) -> float:
    """Completions per second within [warmup_s, end_s) of a closed loop (times from its start)."""
    if not end_s > warmup_s >= 0:
        raise ValueError(f"need 0 <= warmup ({warmup_s}) < end ({end_s})")
    return sum(1 for t in done_s if warmup_s <= t < end_s) / (end_s - warmup_s)


def daemon_config(*, run_dir: Path, cache: str, checkpoint: str, policy: str, plan: str | None,
                  ttft_slo_ms: float, tpot_slo_ms: float, memory_mib: int, kv_cache_mib: int,
                  objective: str | None = None, baseline: str | None = None,
                  models: Sequence[tuple[str, float, float]] | None = None) -> str:
    """The daemon's TOML: one model on devices [0, 1] (or `models`, (name, TTFT, TPOT)
    each, all of the checkpoint, all on both devices); `plan` (`objective`) None writes no
    plan (objective) key; `baseline` "peer" writes PEER_DISPATCH."""
    plan_line = f'plan = "{plan}"\n' if plan is not None else ""
    plan_line += f'objective = "{objective}"\n' if objective is not None else ""
    plan_line += PEER_DISPATCH if baseline == "peer" else ""
    served = list(models) if models is not None else [(MODEL_NAME, ttft_slo_ms, tpot_slo_ms)]
    model_lines = "".join(
        f'[[models]]\nname = "{name}"\ncheckpoint = "{checkpoint}"\ndevices = [0, 1]\n'
        f"ttft_slo_ms = {float(ttft)}\ntpot_slo_ms = {float(tpot)}\nkv_cache_mib = {kv_cache_mib}\n"
        for name, ttft, tpot in served)
    return (
        f'[server]\nport = 0\nadmin_socket = "{run_dir / "admin.sock"}"\ncache_dir = "{cache}"\n'
        f"queue_limit = 100000\n"
        f"[devices]\nkind = \"cpu\"\ncount = 2\nmemory_mib = {memory_mib}\n"
        f'[dispatch]\npolicy = "{policy}"\n{plan_line}'
        f"{model_lines}"
    )


def warmup_lengths(pairs: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """n (input, 2) lengths spread over the mix's input lengths (sorted quantiles)."""
    if n <= 0 or not pairs:
        return []
    ins = sorted(p[0] for p in pairs)
    return [(ins[min(len(ins) - 1, (2 * k + 1) * len(ins) // (2 * n))], 2) for k in range(n)]
