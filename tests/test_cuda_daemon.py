"""A real daemon whose worker serves on a CUDA device: two models co-located in one VMM
pool, greedy completions identical to the same models on a cpu daemon, Warm and Cold
round trips through `ctl state` with identical outputs and the pool back at its
baseline, and a request for a Warm model held and served. Skipped where there is no
CUDA driver and device (CI); run on a lent device machine (bench/RESULTS.md "cuda")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from daemon_harness import server_section, start_daemon
from engine_fixtures import cuda_available
from janusd.wire import admin_msgs as am


pytestmark = pytest.mark.skipif(not cuda_available(), reason="no CUDA driver (libcuda.so.1) / device here")

MODELS = """
[[models]]
name = "demo-llama"
checkpoint = "demo:llama-small"
kv_cache_mib = 16
devices = [0]

[[models]]
name = "demo-qwen2"
checkpoint = "demo:qwen2-tiny"
kv_cache_mib = 16
devices = [0]
"""


def _daemon(kind: str):
    text = (server_section(Path("@RUN@"), model_wait_timeout_s=30.0)
            + f'[devices]\nkind = "{kind}"\ncount = 1\nmemory_mib = 256\n\n[oracle]\nonline = false\n'
            + 'state_dir = "@RUN@/state"\n' + MODELS)
    return start_daemon(text)


def complete(d, model: str) -> tuple[int, str]:
    status, _, body = d.http("POST", "/v1/completions", {"model": model, "prompt": "the quick brown fox",
                                                        "max_tokens": 16, "temperature": 0, "ignore_eos": True})
    return status, body["choices"][0]["text"] if status == 200 else str(body)


def ok(d, req) -> dict:
    reply = d.ctl(req)
    assert isinstance(reply, am.AdminResult), getattr(reply, "message", reply)
    return reply.data


@pytest.fixture(scope="module")
def cpu_ref() -> dict[str, tuple[int, str]]:
    d = _daemon("cpu")
    try:
        return {m: complete(d, m) for m in ("demo-llama", "demo-qwen2")}
    finally:
        d.stop()


@pytest.fixture(scope="module")
def daemon():
    free_before = torch.cuda.mem_get_info()[0]
    d = _daemon("cuda")
    d.gpu_taken = free_before - torch.cuda.mem_get_info()[0]  # type: ignore[attr-defined]
    yield d
    d.stop()


def test_cuda_worker_serves_what_the_cpu_does(daemon, cpu_ref):
    pool = ok(daemon, am.PoolsReq())["pools"][0]
    assert pool["num_pages"] * pool["page_size"] == 256 << 20
    assert daemon.gpu_taken >= 256 << 20, daemon.gpu_taken  # the worker's pool is on the GPU
    for m in ("demo-llama", "demo-qwen2"):
        assert complete(daemon, m) == cpu_ref[m]


def test_warm_cold_round_trips_and_a_held_request(daemon, cpu_ref):
    base = ok(daemon, am.PoolsReq())["pools"][0]
    for rest in ("warm", "cold"):
        out = ok(daemon, am.StateReq("demo-llama", 0, rest))
        assert out["state"] == rest, out
        back = ok(daemon, am.StateReq("demo-llama", 0, "active"))
        assert back["state"] == "active" and {"transfer", "first_token"} <= set(back["phases"]), back
        print(rest, "->active phases", back["phases"], "path", back.get("path"))
        assert complete(daemon, "demo-llama") == cpu_ref["demo-llama"]
        assert complete(daemon, "demo-qwen2") == cpu_ref["demo-qwen2"]
    ok(daemon, am.StateReq("demo-llama", 0, "warm"))
    assert complete(daemon, "demo-llama") == cpu_ref["demo-llama"]  # held, woken, served
    now = ok(daemon, am.PoolsReq())["pools"][0]
    assert now["free_pages"] == base["free_pages"], (base, now)
