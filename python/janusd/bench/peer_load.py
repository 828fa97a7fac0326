"""What `janus bench peer` does to one started server in one round, the same for both:
memory idle after load, batch-1 TTFT and decode (one request at a time), aggregate
tok/s at 8 and 32 requests at once (the tree's peak memory sampled during the 32), and
memory idle after the traffic. Every request is a streamed OpenAI chat completion of
exactly `tokens` output tokens (greedy, ignore_eos) on a prompt no other request of the
run has, so neither server answers from a prompt cache.
"""

from __future__ import annotations

import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from janusd.bench import daemon_proc
from janusd.bench.peer_servers import MODEL, Server
from janusd.bench.proc_tree import PeakSampler, tree_memory

_WORDS = ("harbor lantern meadow granite violet orbit canyon thistle ember glacier willow copper falcon "
          "saffron tundra marble quartz cedar juniper comet prairie basalt heron lagoon").split()


def prompts(count: int, seed: int, words: int = 40) -> list[str]:
    """`count` distinct prompts of about 60 tokens each with SmolLM2's chat template."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        topic = " ".join(rng.choice(_WORDS) for _ in range(words))
        out.append(f"Request {seed}-{i}. Write a long, detailed story that uses these words: {topic}.")
    return out


def _one(port: int, prompt: str, tokens: int) -> daemon_proc.ChatStream:
    return daemon_proc.stream_chat(port, MODEL, [{"role": "user", "content": prompt}], tokens)


def batch1(port: int, texts: list[str], tokens: int) -> dict[str, Any]:
    """One request at a time: median TTFT (ms) and decode tok/s (tokens after the first
    over the time from the first to the last)."""
    ttft, decode = [], []
    for p in texts:
        s = _one(port, p, tokens)
        if s.tokens != tokens or len(s.token_times) < 2:
            raise RuntimeError(f"batch-1: {s.tokens} tokens streamed in {len(s.token_times)} events, wanted {tokens}")
        ttft.append(s.token_times[0] * 1e3)
        decode.append((s.tokens - 1) / (s.token_times[-1] - s.token_times[0]))
    return {"ttft_ms": round(statistics.median(ttft), 1), "decode_tok_s": round(statistics.median(decode), 1),
            "ttft_ms_each": [round(x, 1) for x in ttft], "decode_tok_s_each": [round(x, 1) for x in decode]}


def concurrent(port: int, texts: list[str], tokens: int) -> dict[str, Any]:
    """All of texts at once: output tokens of the requests served over the wall time from
    sending to the last token; a refused request (janusd's 503 when it cannot meet the
    TTFT SLO) counts as 0 tokens and is reported."""
    def one(p: str) -> int:
        try:
            return _one(port, p, tokens).tokens
        except RuntimeError:
            return -1

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(texts)) as pool:
        got = list(pool.map(one, texts))
    wall = time.perf_counter() - t0
    served = [n for n in got if n >= 0]
    return {"tok_s": round(sum(served) / wall, 1), "refused": len(got) - len(served), "wall_s": round(wall, 2)}


def one_round(server: Server, seed: int, tokens: int, batch1_requests: int, settle_s: float) -> dict[str, Any]:
    """The measurements of one round on one server, in order; the server is left running."""
    time.sleep(settle_s)
    idle = tree_memory(server.proc.pid)
    _one(server.port, f"Warm-up {seed}: say hello.", 8)
    b1 = batch1(server.port, prompts(batch1_requests, seed * 10 + 1), tokens)
    c8 = concurrent(server.port, prompts(8, seed * 10 + 2), tokens)
    with PeakSampler(server.proc.pid) as peak:
        c32 = concurrent(server.port, prompts(32, seed * 10 + 3), tokens)
    time.sleep(settle_s)
    after = tree_memory(server.proc.pid)
    return {"ready_s": round(server.ready_s, 3), "ready_phases": server.phases, "batch1_ttft_ms": b1["ttft_ms"],
            "batch1_decode_tok_s": b1["decode_tok_s"], "c8_tok_s": c8["tok_s"], "c32_tok_s": c32["tok_s"],
            "c8_refused": c8["refused"], "c32_refused": c32["refused"],
            "rss_idle_mib": idle.rss_mib, "pss_idle_mib": idle.pss_mib,
            "rss_peak_c32_mib": peak.peak.rss_mib, "pss_peak_c32_mib": peak.peak.pss_mib,
            "rss_idle_after_mib": after.rss_mib, "pss_idle_after_mib": after.pss_mib,
            "processes_idle": {f"{n} ({pid})": mib for pid, (n, mib) in idle.processes.items()},
            "processes_after": {f"{n} ({pid})": mib for pid, (n, mib) in after.processes.items()},
            "batch1_ttft_ms_each": b1["ttft_ms_each"], "batch1_decode_tok_s_each": b1["decode_tok_s_each"]}
