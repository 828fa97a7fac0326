"""The daemon's config sections: one frozen Struct per component, each handed only its own
section. Unknown keys are refused (forbid_unknown_fields); the cross-field rules live in
checks.py, the documented default in janusd.toml beside this file. The policies' sections
are policy/policy_config.py's (the policies own their settings); [control] only nests them."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from msgspec import Meta

from janusd.config.types import (
    AdmissionPolicy,
    DeviceKind,
    DispatchObjective,
    DispatchPlan,
    DispatchPolicy,
    Port,
    RequeuePolicy,
)
from janusd.policy.policy_config import ClassifyConfig, DemandConfig, KeepAliveConfig, PlacementConfig, ScalingConfig
from janusd.settings import NonNegInt, PositiveFloat, PositiveInt, Section


class ServerConfig(Section):
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


class DevicesConfig(Section):
    """Devices the daemon owns: one worker process per device."""

    kind: DeviceKind = "cpu"
    count: PositiveInt = 2
    # where the workers run (server/launcher.py): "local" = child processes of the daemon on
    # this host; "ray" = one Ray task per device on the node that declares it ([ray])
    launcher: Literal["local", "ray"] = "local"
    memory_mib: PositiveInt = 2048
    page_size_mib: PositiveInt = 2
    # cpu devices: the top resident_mib of each pool (where weight segments go first) is
    # faulted in at worker start and never given back, so a restore, fork or Cold start
    # writes it at memcpy speed instead of paying the kernel's page zeroing on first
    # touch; costs resident_mib of RSS per worker from start. 0: pages are backed on
    # first touch and given back when a model goes Cold (RSS follows use)
    resident_mib: NonNegInt = 0
    # torch intra-op threads per worker; 0 = share the host's cores evenly among workers
    # (with cpu_cores: as many as the worker's cores)
    torch_threads: NonNegInt = 0
    # cpu devices: the host cores each device's worker runs on (one list per device), e.g.
    # [[1], [2]]; [] = no pinning (the kernel moves workers across all cores). A pinned
    # engine does not share its core with the daemon or a load generator: on a 2-core VM a
    # profile's bandwidth at the engine's limit spread 14% unpinned, 6% pinned
    # (bench/RESULTS.md "The served range first")
    cpu_cores: list[list[NonNegInt]] = []
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
        if self.cpu_cores:
            return max(1, min(len(c) for c in self.cpu_cores))
        return max(1, (os.cpu_count() or 1) // self.count)


class RayConfig(Section):
    """The ray launcher (devices.launcher = "ray", server/ray_launcher.py): the cluster the
    daemon places its workers on, and the listener they connect back to."""

    # a running cluster's GCS "host:port" (`ray start --head` prints it); "" = start a
    # local head of this daemon's own, bound to node_ip_address
    address: str = ""
    # the daemon's address as a Ray node (and a local head's); loopback keeps Ray on this host
    node_ip_address: str = "127.0.0.1"
    # the worker listener (server/connect_back.py): workers on other hosts need an address
    # they can reach; listen_port 0 = any free port
    listen_host: str = "127.0.0.1"
    listen_port: Port = 0
    # the custom resource each node declares, one unit per device it owns
    # (`ray start --resources '{"janus_device": N}'`); devices are numbered by node name
    device_resource: str = "janus_device"
    # every Ray call the daemon makes (inventory, submit, cancel) is bounded by this; reaching
    # the cluster (or starting a local head: several seconds on a small host) by start_timeout_s
    call_timeout_s: PositiveFloat = 10.0
    start_timeout_s: PositiveFloat = 60.0
    # a connecting worker's Hello (its token) must arrive within this, or it is closed
    hello_timeout_s: PositiveFloat = 5.0
    # a local head only: its cpus for Ray's own bookkeeping, its object store (Ray moves no
    # janus data: worker frames go over the listener), and the devices it declares
    head_num_cpus: NonNegInt = 1
    head_object_store_mib: Annotated[int, Meta(ge=78)] = 80
    head_devices: NonNegInt = 0  # 0 = devices.count
    # device slots and nodes that join (server/node_joins.py): start waits up to
    # device_wait_s for devices.count devices, then starts with the ones found when there
    # are at least min_devices (else refuses); the other slots are absent until a node with
    # free `device_resource` units joins, looked for every join_check_s (also the slots of a
    # node that left: a node that replaces it takes them over)
    min_devices: PositiveInt = 1
    device_wait_s: Annotated[float, Meta(ge=0)] = 10.0
    join_check_s: PositiveFloat = 2.0


class EngineConfig(Section):
    """Per-model engine limits on a worker."""

    block_size: PositiveInt = 16
    max_num_seqs: PositiveInt = 32
    max_num_batched_tokens: PositiveInt = 512
    # how long a request may wait for KV pages held by other requests before it fails
    # (0: fail at once); engine/scheduler.py
    kv_wait_timeout_s: Annotated[float, Meta(ge=0)] = 30.0


class ControlConfig(Section):
    """Control periods (PAPER.md §2): slow placement loop and fast scaling loop."""

    slow_period_s: PositiveFloat = 30.0
    fast_period_s: PositiveFloat = 0.5
    # run the controller (server/controller.py): elastic models scale, idle models go
    # Warm then Cold; false = every model stays as configured (the operator's states)
    managed: bool = False
    # the telemetry window every per-model rate and length figure covers (controller,
    # oracle features, ctl, /metrics); shorter reacts faster, longer is steadier
    window_s: Annotated[float, Meta(ge=1.0)] = 60.0
    # steady placement (control/steady.py): models without `devices` are placed by the slow
    # loop on these devices (empty = every device); models with `devices` stay pinned
    pool_devices: list[NonNegInt] = []
    # weight transfers (activations, D2D forks: a fork counts on its source too) running
    # at once per device while the steady placement executes its moves
    max_transfers_per_device: PositiveInt = 1
    # models without `devices` start where the steady placement packs them (the oracle
    # reads their checkpoints for their priors before they load: server/steady_start.py);
    # false = round robin over the devices, repacked by the slow loop
    place_at_start: bool = True
    # the controller's last decisions kept in memory with their reasons (server/decisions.py:
    # `janus ctl events`, `janus top`); each is a few hundred bytes
    decisions_kept: PositiveInt = 500
    # the policies' own settings (policy/policy_config.py), each section its own table
    demand: DemandConfig = DemandConfig()
    placement: PlacementConfig = PlacementConfig()
    scaling: ScalingConfig = ScalingConfig()
    classify: ClassifyConfig = ClassifyConfig()
    keepalive: KeepAliveConfig = KeepAliveConfig()


class DispatchConfig(Section):
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
    # the guard yields an instance it holds to a queued request this long before the
    # request's latest start when no instance could start it in time otherwise, unless the
    # prefill's delay pushes more tokens of the sequences decoding there off their SLO curve
    # than the request's max_tokens (a refused request's tokens are all lost); 0: never
    guard_yield_ms: Annotated[float, Meta(ge=0)] = 20.0
    relax_factor: Annotated[float, Meta(gt=1.0)] = 1.5
    max_relax: NonNegInt = 2


class LifecycleConfig(Section):
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
    # a model that loads (its image exists) or goes Cold has the kernel read its host image
    # into the page cache (readahead, no process memory): a Cold start then reads memory,
    # not the disk (an image on disk only: 0.09-0.74 s for SmolLM2's 269 MB on the bench VM)
    cold_prefetch_image: bool = True
    # a request that wakes a Warm instance starts its prefill while the weights are still
    # copied in (cpu devices: layer by layer as each lands); false: after the whole copy
    overlap_restore: bool = True


class OracleConfig(Section):
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
