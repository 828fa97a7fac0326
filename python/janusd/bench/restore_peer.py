"""The source side of `janus bench restore`'s D2D measurement (a separate process: one
Mooncake engine per process). `python -m janusd.bench.restore_peer NBYTES` fills a weight
segment of NBYTES in its own cpu pool, registers the global region and prints one JSON
line: the wm.ForkSource of that segment (pieces, layout, sampled checksums). It serves
reads until stdin closes."""

from __future__ import annotations

import json
import sys

import msgspec
import torch


def main() -> int:
    from janusd.engine.worker_fork import checksums, sample_blocks
    from janusd.lifecycle.transfer import GlobalRegionTransport
    from janusd.memory import DevicePool
    from janusd.wire import worker_msgs as wm

    nbytes = int(sys.argv[1])
    page = 2 << 20
    pool = DevicePool("cpu", nbytes // page + 2, page, background=False)
    seg = pool.alloc_weights("w", nbytes)
    data = seg.tensor()[:nbytes]
    gen = torch.Generator().manual_seed(0)
    step = 64 << 20
    for a in range(0, nbytes, step):
        n = min(step, nbytes - a)
        data[a: a + n].copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen))
    transport = GlobalRegionTransport(pool.global_base, pool.global_nbytes)
    src = wm.ForkSource(transport.session, pool.global_base, seg.global_pieces(nbytes), nbytes, "synthetic",
                        checksums(data, sample_blocks(nbytes, 16, 64 << 10)))
    print(json.dumps(msgspec.to_builtins(src)), flush=True)
    sys.stdin.read()
    transport.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
