"""The value types the daemon's config sections share: names, ports, the enums, and the one
error a user sees (the bounded numbers and the Section base are janusd/settings.py's,
shared with the policies' own settings). Kept apart so that sections and checks import
them without importing each other."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

Port = Annotated[int, Meta(ge=0, le=65535)]
Name = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]

DeviceKind = Literal["cpu", "cuda", "npu"]
# "auto": float32, except that a GGUF's Q4_0/Q4_1/Q8_0 linears and Q8_0 embedding / LM head stay as the
# file's blocks on cpu (engine/models/qlinear.py, q8.py); "int8" / "int4": also a float checkpoint's
# weights, quantized at load into Q8_0 / Q4_1 blocks (engine/models/quantize_float.py), cpu only
DType = Literal["float32", "bfloat16", "float16", "auto", "int8", "int4"]
Role = Literal["mixed", "prefill", "decode"]
DispatchPolicy = Literal["lst_imh", "round_robin", "least_load"]
RequeuePolicy = Literal["reject", "relax", "keep"]
DispatchPlan = Literal["global", "window"]
AdmissionPolicy = Literal["reject_early", "queue"]
DispatchObjective = Literal["tokens", "requests"]


class ConfigError(ValueError):
    """A configuration problem a user can fix; the message names the file and the key."""
