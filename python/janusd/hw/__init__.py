"""Hardware and model figures: what a device can do and what a model costs per token.

spec.py        DeviceSpec: a device's roofline figures and host time per step
devices.py     the presets (cpu, h100, h200, ascend-910c-die), with sources, and the lookup
cpu_peaks.py   the cpu device's peaks, measured once on the machine and cached
model_spec.py  ModelSpec from a model config (HF config.json keys): parameters, KV bytes,
               FLOPs and bytes per prefill token and per decode step

Shared by the oracle's roofline prior and profiler and by the simulator; imports neither
(nothing here imports janusd's other packages).
"""

from janusd.hw.devices import PRESETS, device_spec
from janusd.hw.spec import DeviceSpec
from janusd.hw.model_spec import ModelSpec

__all__ = ["PRESETS", "DeviceSpec", "ModelSpec", "device_spec"]
