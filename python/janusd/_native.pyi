"""Typed stub of `janusd._native`, the PyO3 binding of rust/janus-core.

Checked against the built extension by `make lint` (mypy.stubtest).
"""

__all__ = [
    "__version__",
    "moore_hodgson",
    "lst_imh",
    "Dispatcher",
    "xtensor_bench_map",
    "xtensor_bench_bookkeeping",
    "xtensor_bench_churn",
    "XTensorError",
    "XtPool",
    "XtSegment",
    "XtKv",
    "XtRange",
    "SegmentLog",
    "quant_matmul",
    "quant_dequantize",
    "add_rms_norm",
    "decode_attention",
    "DecodePlan",
]

__version__: str

# ---- dispatch (rust/janus-core/src/dispatch, rust/janus-py/src/dispatch.rs) ----

from typing import final as _final

def moore_hodgson(proc: list[float], deadline: list[float], start: float) -> list[int]:
    """Indices of a maximum set of jobs that all finish by their deadlines on one machine
    free at `start`, in execution (earliest-deadline-first) order. O(n log n).

    Ties: equal deadlines run by lower index; of equal lengths the higher index is dropped.
    Raises ValueError for unequal lengths or a time that is NaN, infinite or negative.
    """

def lst_imh(proc: list[float], deadline: list[float], avail: list[float]) -> list[list[int]]:
    """LST-IMH: machines by descending `avail` (equal: lower index first) each take the
    Moore-Hodgson subset of the jobs still unassigned. Returns per machine, in input
    order, its job indices in execution order; jobs no machine can take are absent.
    Raises ValueError like `moore_hodgson`."""

@_final
class Dispatcher:
    """Online, clock-injected dispatcher: per-model FIFO queues, one EPDT per device group,
    the pre-pull window, LST-IMH (or a baseline) and reject/relax requeue. Every time is an
    argument in seconds; nothing reads a clock. Bad times or ids (NaN, infinite, negative,
    an int too large for a float or a 64-bit id, unknown or duplicate) raise ValueError.

    Groups: the instances of one device group (co-located models one worker steps one
    after another) share one EPDT; every job given to any of them is charged to it.

    With policy lst_imh a tick plans every model's queued jobs together: the machines are
    the device groups with a ready instance of a model with work (each at its group's
    EPDT), a job runs only where its model has a ready instance, and takes there that
    instance's own prefill time (set_prefill_fit; else its submitted estimate):
    - plan="global" (default): LST-IMH over all those groups, the selected jobs balanced
      over them (earliest deadline first onto the group that would finish it first) when
      that keeps all of them on time; only the jobs whose planned start is inside the
      pre-pull window are assigned, the rest stay queued and are planned again at the next
      tick (next_wakeup says when).
    - plan="window": LST-IMH over the groups inside the window only; each takes its whole
      selected subset at once.
    round_robin / least_load serve the models by their earliest queued deadline (equal:
    the model seen first), one job per instance, and ignore plan and objective.

    objective="requests" (default): each machine keeps the most jobs on time (Moore-
    Hodgson, as the paper states it). objective="tokens": the most value on time, each
    job weighing what submit's `weight` says (the daemon: expected output tokens); with
    equal weights the plan is the same, otherwise a heuristic (Rust tests measure it at
    ~97% of the exact optimum on random instances, the count plan at ~92%).

    A job's latest start is deadline - (its least prefill time over its model's instances):
    past it no instance, even an idle one, finishes it in time. relax: a job past its
    latest start gets
    deadline = now + (original deadline - arrival) * relax_factor**k on its k-th
    relaxation, at most max_relax times, then is rejected.
    """

    def __new__(
        cls,
        policy: str = "lst_imh",
        prepull_window_s: float = 0.02,
        requeue: str = "reject",
        relax_factor: float = 1.5,
        max_relax: int = 2,
        plan: str = "global",
        objective: str = "requests",
    ) -> Dispatcher: ...
    @property
    def policy(self) -> str: ...
    @property
    def prepull_window_s(self) -> float: ...
    @property
    def plan(self) -> str:
        """"global" or "window" (see the class docstring)."""
    @property
    def objective(self) -> str:
        """"requests" or "tokens" (see the class docstring)."""
    def add_instance(self, instance_id: int, model: str, group: int | None = None) -> None:
        """Registers a ready instance of `model` in device group `group` (any int; None:
        the instance's own id, a group of its own). Instances of one group share one EPDT.
        ValueError if the id exists."""
    def remove_instance(self, instance_id: int) -> list[int]:
        """Forgets the instance; returns (assignment order) the requests it had been given
        and not completed, which the dispatcher forgets too, taking their remaining work
        off the group's EPDT. Queued jobs stay queued."""
    def set_instance_ready(self, instance_id: int, ready: bool) -> None:
        """Only ready instances get work."""
    def set_group_decode_load(self, group: int, load: float) -> None:
        """The decode load of a group's worker (sequences decoding there): breaks ties
        between equally free instances in the global plan. ValueError for a negative or
        non-finite load; an unknown group is ignored. Does not wake the dispatcher."""
    def submit(self, request_id: int, model: str, arrival_s: float, deadline_s: float, est_proc_s: float,
               weight: float = 1.0, tokens: float = 0.0) -> None:
        """Queues a request (an unknown model waits for an instance); ValueError for an id
        already queued or in flight, or a time, weight or token count that is NaN,
        infinite or negative. `weight` is its value under objective="tokens"; `tokens` its
        prompt length, which an instance's prefill fit (set_prefill_fit) reads."""
    def set_prefill_fit(self, instance_id: int, fit: tuple[float, float] | None = None) -> None:
        """The instance's own prefill fit (a, b): a job of `tokens` takes a + b * tokens on
        it (its EPDT, the plan, the latest start: the least over the model's instances);
        None: each job's submitted estimate. ValueError for an unknown instance or a bad
        number."""
    def earliest_finish(self, instance_ids: list[int], tokens: float, est: float, now: float) -> float | None:
        """The least EPDT(now) + own prefill time of `tokens` over the instances (est where
        one has no fit); None for none: the early-refusal test."""
    def tick(self, now: float) -> list[tuple[int, int]]:
        """Applies the requeue policy and returns the (request_id, instance_id) assignments
        made now (models by earliest deadline, per instance in execution order). With
        plan="global" only what starts inside the pre-pull window is assigned. Releases
        the GIL."""
    def complete(self, request_id: int, now: float) -> None:
        """The request's prefill finished: its remaining estimated work leaves its instance."""
    def cancel(self, request_id: int, now: float | None = None) -> bool:
        """Removes a queued or assigned request; False if the id is not known. With `now`,
        time since the instance's last event counts as done work first (as in `complete`),
        so the jobs behind a running one keep their real start; without it, the request's
        work still ahead as of that last event is removed."""
    def wants_tick(self) -> bool:
        """Work is queued and something changed since the last tick (a prefill done, an
        instance ready, a fit moved): a tick now may assign what the last one could not."""
    def take_rejected(self) -> list[int]:
        """Ids rejected since the last call."""
    def next_wakeup(self, now: float) -> float | None:
        """When tick should next run (a value <= now means now); None if nothing is queued.
        Includes each ready instance's window edge (group EPDT - window), when jobs the
        global plan deferred can be assigned."""
    def epdt(self, instance_id: int, now: float) -> float:
        """Estimated prefill done time of the work given to the instance's group (>= now)."""
    def instance_figures(self, instance_id: int, now: float) -> tuple[float, bool, int]:
        """(epdt(now), ready, requests given to it whose prefill is not done): what a
        refusal reports of each instance."""
    def min_epdt(self, instance_ids: list[int], now: float) -> float | None:
        """The least epdt() over the instances (None for none): one call per request."""
    def pending(self, model: str) -> int:
        """Queued requests of `model`."""
    def relaxed(self, model: str) -> int:
        """Deadline extensions granted to `model`'s requests so far (requeue = relax)."""
    def check_integrity(self) -> None:
        """Checks that every request is in exactly one place (queued once in its model's
        queue, or assigned to one existing instance), that the counters agree, and that
        each group's EPDT holds only jobs assigned to its instances. Raises RuntimeError
        naming the first broken rule. O(state): for tests and debugging."""
    def stats(self) -> dict[str, int]:
        """submitted, assigned, completed, rejected, relaxed, cancelled, orphaned (handed
        back by remove_instance), pending, in_flight, ticks."""

# ---- xtensor (rust/janus-core/src/xtensor, rust/janus-py/src/xtensor.rs) ----

from typing import final as _xt_final

class XTensorError(ValueError):
    """xTensor: bad arguments, unknown owner or double free, an exhausted pool, or a
    missing/failing device backend."""

@_xt_final
class XtRange:
    """A reserved virtual range, kept reserved while this object exists."""

    @property
    def base(self) -> int: ...
    @property
    def nbytes(self) -> int: ...

@_xt_final
class XtPool:
    """One device's page pool; see janusd.memory.DevicePool for the documented face."""

    def __new__(
        cls, kind: str, num_pages: int, page_size: int, device_index: int = 0, background: bool = True
    ) -> XtPool: ...
    @property
    def kind(self) -> str: ...
    @property
    def page_size(self) -> int: ...
    @property
    def num_pages(self) -> int: ...
    @property
    def global_base(self) -> int: ...
    @property
    def global_nbytes(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def global_range(self) -> XtRange: ...
    def alloc_weights(self, owner: str, nbytes: int) -> XtSegment: ...
    def kv_region(self, owner: str, max_bytes: int, cache_low: int, cache_high: int) -> XtKv: ...
    def free(self, owner: str) -> None: ...
    def maintain(self) -> None: ...
    def maintenance_backlog(self) -> int: ...
    def stats(self) -> dict[str, object]: ...
    def check_integrity(self) -> None: ...
    def close(self) -> None: ...

@_xt_final
class XtSegment:
    @property
    def id(self) -> int: ...
    @property
    def addr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def page_ids(self) -> list[int]: ...
    @property
    def contiguous(self) -> bool: ...
    @property
    def global_offset(self) -> int: ...
    def range(self) -> XtRange: ...

@_xt_final
class XtKv:
    @property
    def id(self) -> int: ...
    @property
    def base(self) -> int: ...
    @property
    def max_pages(self) -> int: ...
    def range(self) -> XtRange: ...
    def resize(self, n_pages: int) -> None: ...
    def state(self) -> tuple[int, int, int, int, int]:
        """(used pages, cached pages, max pages, cache misses, cache hits)"""
    def page_ids(self) -> list[int]: ...
    def global_offsets(self, byte_offset: int, nbytes: int) -> list[tuple[int, int]]: ...

def xtensor_bench_map(pages: int = 256, page_size: int = ..., rounds: int = 15) -> dict[str, float]:
    """Per-page map/unmap microseconds through DevicePool vs bare mmap (host backend),
    untouched (`*_us_per_page`) and with every OS page written after mapping (`*touched_*`)."""

def xtensor_bench_bookkeeping(num_pages: int = 65536, ops: int = 1000000, seed: int = 1) -> tuple[float, float]:
    """(thread CPU ns, wall ns) per alloc/free of the pure page pool, medians of 3 trials."""

def xtensor_bench_churn(
    num_pages: int = 32768, page_size: int = 4096, ops: int = 1000000, seed: int = 7
) -> dict[str, float]:
    """Fragmentation statistics of a load/unload + KV grow/shrink churn."""

# ---- end xtensor ----

# ---- sim (rust/janus-core/src/sim, rust/janus-py/src/sim.rs) ----

@_final
class SegmentLog:
    """A simulated device's step segments and the exact per-request on-time token count
    (rust/janus-core/src/sim/segments.rs; python/janusd/sim/worker.py)."""

    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    def push(self, start: int, t0: float, dt: float) -> None:
        """A segment from step `start` at time `t0` of steps `dt` s long; ValueError when
        `start` is before the last segment's."""
    def trim(self, oldest: int) -> None:
        """Forget segments wholly before step `oldest`."""
    def tally(self, first: int, n_out: int, arrival: float, ttft: float, tpot: float,
              keep_times: bool = False) -> tuple[int, float, float, list[float] | None]:
        """(on-time tokens, first and last token s after arrival, every token's time after
        arrival when keep_times); ValueError for n_out < 1 or steps outside the history."""

# ---- quant and cpuops (rust/janus-core/src/quant, cpuops.rs; rust/janus-py/src/quant.rs) ----
# Addresses of tensors' memory: call them only through janusd.engine.models.qkernel, which
# checks every tensor's dtype, shape, contiguity and device first.

def quant_matmul(fmt: str, x: int, m: int, k: int, qs: int, sc: int, n: int, out: int, threads: int) -> None:
    """out [m, n] float32 = x [m, k] float32 @ w.T for w [n, k] in `fmt` ("q4" / "q8");
    ValueError for an unknown format or sizes that do not fit."""

def quant_dequantize(fmt: str, qs: int, sc: int, n: int, k: int, row0: int, rows: int, out: int) -> None:
    """out [rows, k] float32 = rows [row0, row0 + rows) of w [n, k] in `fmt`, dequantized."""

def add_rms_norm(h: int, add: int, w: int, out: int, rows: int, cols: int, eps: float) -> None:
    """h [rows, cols] += add (when add != 0); out = RMSNorm(h) * w, float32."""

def decode_attention(q: int, k_new: int, v_new: int, kc: int, vc: int, num_blocks: int, block_stride: int,
                     blocks: int, nblocks: int, block_size: int, hq: int, hkv: int, d: int, ctx: int,
                     out: int) -> None:
    """One decoding sequence's attention over its paged float32 KV cache: k_new / v_new
    written at position ctx - 1, out [hq, d] the attention of q over 0 .. ctx - 1."""

@_final
class DecodePlan:
    """A Llama-family model's layer weights as addresses, bound once
    (janusd.engine.models.native_step checks every tensor): per layer ln1, (fmt, qs, sc) of
    qkv, the qkv bias (0: none), (fmt, qs, sc) of o, ln2, (fmt, qs, sc) of gate_up and of
    down; fmt 4 = Q4, 8 = Q8_0. ValueError for a null address or an unknown format."""

    def __new__(cls, hidden: int, nq: int, nkv: int, hd: int, inter: int, eps: float, layers: list[int]) -> DecodePlan: ...
    @property
    def num_layers(self) -> int: ...
    def step(self, h: int, cos: int, sin_rot: int, kv: list[int], blocks: int, nblocks: int, ctx: int, block_size: int,
             block_stride: int, num_blocks: int, threads: int) -> None:
        """All layers of one batch-1 decode step on the float32 hidden row at `h` (in place):
        `cos` / `sin_rot` the position's rotary rows, `kv` each layer's (k, v) cache
        addresses, `blocks` the int64 block table, `ctx` positions attended (janus_core::decode)."""
