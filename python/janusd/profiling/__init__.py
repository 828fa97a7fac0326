"""`janus profile`: measure a model on the real engine, through real worker processes, and
write the oracle's training points. A tool that uses the oracle (its knee search, features,
dataset format and noise floor), not part of it: it drives a real daemon and reads a
checkpoint with the engine's loader, which the oracle's models never do.

load.py    the load a point offers: length mixes, windows, stratified traces
daemon.py  the profiled daemon: its config, the host's cores, the warm-up
measure.py one replay against it and the daemon's own figures (/metrics) around it
rows.py    the measured rows and the points file's header
run.py     the run: instance counts, series taking turns, load points and their repeats

For each instance count m = 1..k a real daemon (bench/daemon_proc.py) serves the model on
m devices; each load point is an open-loop replay (trace/replay.py: the same client
`janus replay` uses) at one rate and one length mix, stratified (make_trace: the rate's
request count and the mix's length quantiles in the measured window) so that repeats
offer the same load. The load
runs through a warm-up, the measured window and a cool-down (settle_seconds); only the
window counts, so the figures are the steady state's, not an empty engine's start or a
drain's tail (on the loaded afternoon of bench/RESULTS.md "oracle" a whole-run SmolLM2
point read 0.8 attainment and a third of its compute at three times its capacity: the
queue had not built up yet, and the drain stretched the wall). The window is measured by:
- load features: the requests that arrived in it, seen through telemetry's windows
  (oracle/features.py);
- per-token SLO attainment of those requests (trace/slo.py rules, failures and 503s are
  misses);
- compute and bandwidth: the work the engine did in it and in the cool-down (arrivals go
  on at the rate through both), FLOPs and bytes counted from the model config per token
  that landed there, against the device spec's peaks (oracle/features.py, hw/);
- HBM: weight pages plus the peak KV pages seen by polling the daemon's /metrics (the
  workers' xTensor pools) during the replay, over the device's memory.
Rates follow oracle/knee.py (bracket, then crowd the knee), series (m, mix) taking turns so a
short budget still covers every series; a point inside a series' knee bracket measures a
KNEE_STRETCH times longer window (in_knee: the budget goes where attainment changes); a series of m instances starts at m/2 times the
highest rate one instance served at knee.HIGH attainment with that mix. The budget bounds the whole run: a point starts
only when the time left covers the longest point so far. Each load point (rate, mix, m)
is measured `repeats` times back to back, each a fresh sample of the trace; the rows
share the point's point_id (a held-out split keeps them together) and the knee search
follows their mean. Their spread is the measurement's noise floor (oracle/noise.py), stored in
the header's notes and shown by `janus oracle eval`. Each row also keeps the
engine's own counters over its whole replay (steps, decode tokens, forward seconds, summed
over the instances, and the replay's wall time: oracle/dataset.py's engine array), from which
step_rate.fit_step_time reads the engine's step time under load. Back-to-back repeats share the
machine's state of the moment, so on a machine whose load drifts over minutes the floor
understates the noise. A replay whose replayer fell behind schedule (lag bound) is
dropped: it measured the client; its repeats are skipped and every series of that mix
stays below that rate from then on (oracle/knee.series_next_rate: a retried rate lagged again,
and one llama-small profile lost 9 replays and a third of its budget to it).
With --pin-cores (cpu) each worker runs on cores of its own and the daemon and the
replayer on the rest (split_cores; devices.cpu_cores), where the host has cores to spare:
near the engine's limit a worker sharing its core with the load generator falls into
small or large batches by chance (bench/RESULTS.md "Twice the budget ..."). The profiled
daemon's own oracle is off (no online refits: a helper process fitting GPs would take CPU
from the worker being measured). The points are written in oracle/dataset.py's format; the run's
last line is one JSON object.
"""
