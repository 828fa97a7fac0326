"""janusd configuration: frozen msgspec Structs, TOML files, and the shipped default.

Each component receives only its own section (ServerConfig, DevicesConfig, ...), never
the whole JanusConfig. Unknown keys, wrong types and impossible values fail with a
ConfigError naming the file and the key path (e.g. `models[1].ttft_slo_ms`).

types.py holds the shared value types and ConfigError, sections.py the component
sections, model.py ModelConfig and JanusConfig, checks.py the cross-field rules,
janusd.toml the default (package data, so it is in every install; etc/janusd.toml, the
operator's copy to start from, is a link to it); this module parses and loads.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import msgspec

from janusd.config.checks import check_config
from janusd.config.model import JanusConfig, ModelConfig
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
from janusd.config.types import (
    AdmissionPolicy,
    ConfigError,
    DeviceKind,
    DispatchObjective,
    DispatchPlan,
    DispatchPolicy,
    DType,
    Name,
    Port,
    RequeuePolicy,
    Role,
)
from janusd.settings import NonNegInt, PositiveFloat, PositiveInt

__all__ = [
    "DEFAULT_CONFIG_TOML", "AdmissionPolicy", "ConfigError", "ControlConfig", "DType", "DeviceKind",
    "DevicesConfig", "DispatchConfig", "DispatchObjective", "DispatchPlan", "DispatchPolicy", "EngineConfig",
    "JanusConfig", "LifecycleConfig", "ModelConfig", "Name", "NonNegInt", "OracleConfig", "Port",
    "PositiveFloat", "PositiveInt", "RayConfig", "RequeuePolicy", "Role", "ServerConfig", "cache_dir", "check_config",
    "dump_config", "load_config", "parse_config",
]

# What `janus serve` runs with no file: read from the package, where the wheel and an
# editable install both put it (no second copy of its text in Python).
DEFAULT_CONFIG_TOML = resources.files(__name__).joinpath("janusd.toml").read_text(encoding="utf-8")


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
        check_config(cfg)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None
    return cfg


def load_config(path: str | os.PathLike[str] | None = None) -> JanusConfig:
    """Load a TOML file, or the shipped default when `path` is None."""
    if path is None:
        return parse_config(DEFAULT_CONFIG_TOML, "<default janusd.toml>")
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
