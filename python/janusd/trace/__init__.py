"""Request traces, SLO accounting, open-loop replay and reports (PAPER.md §1, §9).

formats.py  the canonical trace (CSV/JSONL) and its one loader `read_trace`
azure.py, servegen.py  loaders of the public traces into that format
synth.py    the production-like generator (skew, diurnal shape, bursts, per-app lengths)
transform.py  sample / compress / remap / clip;  stats.py  skew and burstiness figures
slo.py      pure per-token / TTFT / TPOT / end-to-end attainment and goodput
results.py  per-request run results (results.jsonl) shared by replay, daemon and sim
replay.py   open-loop aiohttp replayer;  report.py  PNG figures and a markdown table
"""
