"""`janus bench restore`: what bringing weights back costs against the raw speed of the
same bytes on the same machine, in the same run (PAPER.md §8, issue [L]).

Synthetic segments of each size (default 64 MiB to 2 GiB), in this process's own cpu
pool, through the code the worker runs. The pool is all resident (`devices.resident_mib`:
its pages faulted in when it is made, `resident_populate_s_per_gib` is what that costs);
each `*_fresh_pages_*` figure is the same operation on pages given back to the OS first, as
a pool without a resident zone has them after a model went Cold (the kernel zeroes every
4 KiB page on first touch):
- H2D: a weight segment filled from a host copy by engine/restore.Copier (chunks, several
  in flight), against one plain copy of the same bytes into the same resident pages, the
  two timed in turns (ABBA), 3 to 15 turns by size, medians (`h2d_vs_memcpy` = memcpy
  time / restore time);
- D2D: engine/worker_fork.pull_segment (match the pieces, chunked batch read over
  Mooncake, sampled checksums) from a peer process into a new segment, against a raw
  Mooncake read of the same bytes from the same peer into the same kind of segment
  (`d2d_vs_raw_transfer`);
- Cold: the converted image read into a new segment (Copier.read_file: chunked preads in
  flight), against a sequential read() of the same file into one 16 MiB buffer
  (`cold_vs_disk`); the file is in the page cache for all of them.
Then through a real daemon serving the same small model (SmolLM2-135M-Instruct by
default, in `--dtype`, bfloat16 unless given: its GGUF holds 4-bit Q4_1 matrices, which no
16-bit float holds exactly; bf16 rounds them by 0.13% rms against Q4_1's own ~8% and halves
what each step reads and each restore moves; the JSON's `dtype` says which) on two cpu devices:
- `control_overhead_ms`: client-side time of `ctl state active` (Warm -> Active) minus the
  transfer and first-token phases: everything but moving bytes and the first token;
- `source_tpot_p99_increase_pct`: the p99 inter-token gap of a stream on the source
  device over the tokens that arrived while forks to the other device ran, against its
  gaps in quiet windows as long as each fork, in ABBA order (fork-quiet, quiet-fork, ...:
  drift and the machine's other work fall on both sides alike); at least --forks pairs,
  more (up to --max-forks) until both sides have --min-during-tokens gaps. The spread:
  `source_tpot_p99_increase_ci90` (5th-95th percentile of the figure over the pairs
  resampled) and `source_tpot_mean_increase_pct` (the mean gap, which one slow token does
  not move). `devices.transfer_nice` and `lifecycle.fork_bandwidth_mib_s` from
  --transfer-nice / --fork-bandwidth-mib-s; --tpot-null-fork-s S runs the same procedure
  with S seconds of no fork in each fork window (an A/A check: the figure's chance spread);
- `warm_first_token_s` / `cold_first_token_s`: a request to the model while its only
  instances are Warm / Cold, sent to the first streamed token (the request wakes one); the
  image is dropped from the page cache before the daemon starts (as a reboot or memory
  pressure leaves an image of an earlier run), `cold_image_cached_pct` is how much of it
  the page cache held at the first Cold start, and `cold_uncached_first_token_s` one more
  Cold start with the image dropped from the cache right before it (the disk's cost);
- `cold_rss_after_mib`: the worker's RSS once the model is Cold on its device, and
  `cold_rss_over_idle_mib` that less the RSS of a worker that never held the model
  (`worker_rss_idle_mib`; both hold the pool's resident zone, `resident_mib`).
The machine is shared and noisy: medians of a few repeats; ratios (same bytes, same run)
mean more than absolute times. The synthetic part is bench/restore_synthetic.py, the
daemon part bench/restore_daemon.py (the fork windows in restore_tpot.py); this module
holds the flags and the result.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from janusd.bench.restore_daemon import measure
from janusd.bench.restore_synthetic import synthetic


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes-mib", default="64,256,1024,2048", help="synthetic segment sizes (MiB)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per size and path (median)")
    p.add_argument("--fresh-repeats", type=int, default=1, help="repeats of the *_fresh_pages_* figures")
    p.add_argument("--streams", type=int, default=4, help="chunked copies in flight")
    p.add_argument("--chunk-mib", type=int, default=64, help="chunk size")
    p.add_argument("--checkpoint", default="builtin:smollm2-135m-instruct", help="model for the daemon part")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16",
                   help="the daemon part's model dtype (default bfloat16: SmolLM2's GGUF is 4-bit Q4_1, bf16 "
                        "rounds it by 0.13%% rms and halves the bytes each step reads and each restore moves)")
    p.add_argument("--no-daemon", action="store_true", help="synthetic segments only")
    p.add_argument("--forks", type=int, default=6, help="forks during the source stream (at least; an even number "
                   "of fork / quiet pairs is kept, ABBA)")
    p.add_argument("--min-during-tokens", type=int, default=800,
                   help="fork again (up to --max-forks) until this many source tokens arrived during forks and as "
                        "many in the quiet windows beside them: the p99 of ~400 gaps is its 4th-largest gap")
    p.add_argument("--max-forks", type=int, default=40, help="the most forks --min-during-tokens may take")
    p.add_argument("--tpot-null-fork-s", type=float, default=0.0,
                   help="A/A check of the TPOT comparison: each 'fork' window is this many seconds of no fork "
                        "(the same pairs, order and statistics: how far the figure moves by chance)")
    p.add_argument("--cache-dir", default=None, help="checkpoint cache dir (default: the config default)")
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--transfer-nice", type=int, default=None, help="devices.transfer_nice (default: the config's)")
    p.add_argument("--fork-bandwidth-mib-s", type=int, default=None,
                   help="lifecycle.fork_bandwidth_mib_s (default: the config's)")
    p.add_argument("--resident-mib", type=int, default=1024,
                   help="devices.resident_mib of the daemon part (0: pages backed on first touch)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(x) << 20 for x in args.sizes_mib.split(",")]
    with tempfile.TemporaryDirectory(prefix="janus-bench-restore-") as work:
        rows, populate_s_per_gib = synthetic(sizes, args, Path(work))
    daemon = {} if args.no_daemon else measure(args)
    worst = lambda key: round(min(r[key] for r in rows), 3)  # noqa: E731
    result: dict[str, Any] = {"bench": "restore", "streams": args.streams, "chunk_mib": args.chunk_mib,
                              "cpus": os.cpu_count(), "resident_populate_s_per_gib": round(populate_s_per_gib, 3),
                              "by_size": rows, **daemon}
    result.update(h2d_fresh_pages_vs_memcpy=worst("h2d_fresh_pages_vs_memcpy"),
                  d2d_fresh_pages_vs_raw_transfer=worst("d2d_fresh_pages_vs_raw_transfer"),
                  cold_fresh_pages_vs_disk=worst("cold_fresh_pages_vs_disk"),
                  h2d_vs_memcpy=worst("h2d_vs_memcpy"), d2d_vs_raw_transfer=worst("d2d_vs_raw_transfer"),
                  cold_vs_disk=worst("cold_vs_disk"))
    for key in ("control_overhead_ms", "source_tpot_p99_increase_pct", "warm_first_token_s", "cold_first_token_s",
                "cold_rss_after_mib"):
        if key in result:
            result[key] = result.pop(key)  # the keys last, in its order
    return result
