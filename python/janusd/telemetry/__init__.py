"""Telemetry: per-model sliding windows of request events (pure; DESIGN.md, "telemetry").

windows.py    the time-bucketed sliding window primitive (counts, sums, stable variances)
telemetry.py  Telemetry (the event listener), ModelWindow and TelemetrySnapshot (what
              the oracle, the controller, /metrics and `janus ctl` read)
"""

from janusd.telemetry.telemetry import ModelWindow, Telemetry, TelemetrySnapshot

__all__ = ["ModelWindow", "Telemetry", "TelemetrySnapshot"]
