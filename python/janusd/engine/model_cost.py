"""The ModelSpec of a checkpoint as this engine serves it: the config's shape, and, when
`dtype = "auto"` (or "int8" / "int4") keeps its weights quantized on the device kind (device_engine.weight_plan),
the plan's resident bytes as the weights' size. The oracle's prior, the profiler and the
roofline then charge a decode step what it really reads: for SmolLM2-135M Q4_1 about a
fifth of the float32 bytes they charged before."""

from __future__ import annotations

from typing import Any

import msgspec

from janusd.hw.model_spec import ModelSpec


def served_spec(ck: Any, dtype: str, device_kind: str) -> ModelSpec:
    """`ck` an opened checkpoint (engine/loader.open_checkpoint)."""
    from janusd.engine.models.qlinear import KEEPS_QUANTIZED

    keeps = dtype in KEEPS_QUANTIZED
    spec = ModelSpec.from_config(msgspec.to_builtins(ck.arch), dtype="auto" if keeps else dtype)
    if not keeps:
        return spec
    from janusd.engine.device_engine import weight_plan

    plan = weight_plan(ck, dtype, device_kind)
    if not (plan.quant or plan.q8):
        return spec
    return msgspec.structs.replace(spec, stored_bytes=int(plan.total_bytes))
