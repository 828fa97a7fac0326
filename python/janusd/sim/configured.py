"""`janus sim --config FILE`: the simulator runs a daemon's own configuration, so that its
figure for a config is a prediction of that daemon ([W]: `janus bench cluster` puts the
two side by side). From the file it takes each served model's pins (`devices`,
`warm_devices`, `cold_devices`, `pool`), the [control] section (periods, window, every
policy setting; `control.managed` decides whether the room runs at all, as in the daemon)
and [dispatch]. The trace's model names must be the config's. Its own module: the one
place a daemon config becomes simulator input."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec

from janusd.config import JanusConfig, load_config
from janusd.config.model import ModelConfig
from janusd.sim.served import Served


class ConfigError(ValueError):
    """A daemon config the simulation cannot run as given; says what and where."""


def read(path: str | Path) -> JanusConfig:
    try:
        return load_config(Path(path))
    except Exception as e:  # the config's own errors name file and key
        raise ConfigError(f"{path}: {e}") from None


def pinned(cfg: JanusConfig, served: list[Served], n_devices: int) -> dict[str, ModelConfig]:
    """The config's model of each served model (by name), checked against the pool."""
    by_name = {m.name: m for m in cfg.models}
    missing = sorted(s.name for s in served if s.name not in by_name)
    if missing:
        raise ConfigError(f"the trace's model(s) {missing} are not in the config's [[models]] "
                          f"(it has {sorted(by_name)})")
    out = {}
    for s in served:
        m = by_name[s.name]
        bad = [d for d in m.devices if d >= n_devices]
        if bad:
            raise ConfigError(f"model {s.name!r}: devices {bad} not in a pool of {n_devices}")
        out[s.name] = m
    return out


def apply(core_models: Mapping, configs: dict[str, ModelConfig]) -> None:
    """The pins onto the simulated core's models (their checkpoint, tp and lengths stay the
    simulator's)."""
    for name, m in core_models.items():
        c = configs[name]
        m.cfg = msgspec.structs.replace(m.cfg, devices=list(c.devices), warm_devices=list(c.warm_devices),
                                        cold_devices=list(c.cold_devices), pool=c.pool)


def start_states(m: ModelConfig) -> list[tuple[int, str]]:
    """Where a pinned model starts and in which state, as the daemon starts it."""
    return [(d, "warm" if d in m.warm_devices else "cold" if d in m.cold_devices else "active") for d in m.devices]
