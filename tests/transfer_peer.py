"""A peer worker for tests/test_transfer_mooncake.py: its own DevicePool (cpu) filled with
a seeded pattern and a GlobalRegionTransport, driven by JSON lines on stdin.

Prints {"session", "base", "nbytes"} as one JSON line once ready; then answers
{"op": "sha256"} with the sha256 of its whole global region, until stdin closes."""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import torch

from janusd.lifecycle.transfer import GlobalRegionTransport
from janusd.memory import DevicePool


def pattern(seed: int, nbytes: int) -> np.ndarray:
    """The bytes a peer with this seed starts with (reproducible in the test process)."""
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def main() -> int:
    seed, num_pages, page_size = (int(a) for a in sys.argv[1:4])
    pool = DevicePool("cpu", num_pages, page_size, background=False)
    region = pool.global_tensor()
    region.copy_(torch.from_numpy(pattern(seed, pool.global_nbytes)))
    transport = GlobalRegionTransport(pool.global_base, pool.global_nbytes)
    print(json.dumps({"session": transport.session, "base": transport.base, "nbytes": transport.nbytes}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("op") == "sha256":
            digest = hashlib.sha256(region.numpy().tobytes()).hexdigest()
            print(json.dumps({"sha256": digest}), flush=True)
        else:
            print(json.dumps({"error": f"unknown op {msg!r}"}), flush=True)
    transport.close()
    pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
