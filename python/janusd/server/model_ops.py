"""Changes to the set of served models: SIGHUP config reload and `janus ctl load|unload`.

Kept apart from daemon.py (the life cycle and the request path): these only edit the
daemon's config copy and ask ModelManager to load or unload, with drains bounded by
server.drain_timeout_s. Every refusal is a ValueError naming what is wrong, which the
admin socket turns into an error reply.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any

import msgspec

from janusd.config import ConfigError, ModelConfig, load_config
from janusd.server.models import place

if TYPE_CHECKING:
    from janusd.server.daemon import Daemon


def _log(msg: str) -> None:
    print(f"janusd: {msg}", file=sys.stderr, flush=True)


async def reload(d: Daemon) -> dict[str, Any]:
    try:
        new = load_config(d.config_path)
    except ConfigError as e:
        _log(f"reload refused: {e}")
        return {"error": str(e)}
    if d.server_overrides:
        new = msgspec.structs.replace(new, server=msgspec.structs.replace(new.server, **d.server_overrides))
    if new.server != d.cfg.server or new.devices != d.cfg.devices or new.engine != d.cfg.engine:
        _log("reload: [server], [devices] and [engine] changes need a restart; applying [[models]] only")
    old = {m.name: m for m in d.cfg.models}
    fresh = {m.name: m for m in new.models}
    retuned = [n for n in old if n in fresh and fresh[n] != old[n] and _same_instance(old[n], fresh[n])]
    for name in retuned:
        if name in d.models.models:
            d.models.models[name].cfg = fresh[name]  # new requests get the new SLOs at once
    removed = [n for n in old if n not in fresh or (fresh[n] != old[n] and n not in retuned)]
    added = [m for m in new.models if m.name not in old or (old[m.name] != m and m.name not in retuned)]
    for name in removed:
        if name in d.models.models:
            await d.models.unload(name, d.cfg.server.drain_timeout_s)
    d.cfg = msgspec.structs.replace(d.cfg, models=list(new.models))
    await load_new(d, added)
    _log(f"reload: removed {removed or 'none'}, added {[m.name for m in added] or 'none'}, "
         f"new SLOs {retuned or 'none'}")
    return {"removed": removed, "added": [m.name for m in added], "retuned": retuned}


# Fields that only steer requests (SLO targets, the app's name): changing them must not
# reload the model, which would turn its traffic away while the weights load again.
_REQUEST_ONLY_FIELDS = ("ttft_slo_ms", "tpot_slo_ms", "app")


def _same_instance(a: ModelConfig, b: ModelConfig) -> bool:
    return msgspec.structs.replace(a, **{f: getattr(b, f) for f in _REQUEST_ONLY_FIELDS}) == b


async def load_new(d: Daemon, added: list[ModelConfig]) -> None:
    placement = place(d.cfg.models, d.cfg.devices.count)
    entries = [d.models.add(m, placement[m.name]) for m in added]
    await asyncio.gather(*(d.models.load_all(e) for e in entries))


async def load_model(d: Daemon, name: str, checkpoint: str | None, devices: list[int]) -> dict[int, str]:
    if name in d.models.models:
        raise ValueError(f"model {name!r} is already loaded")
    if checkpoint is None:
        try:
            m = d.cfg.model(name)
        except KeyError:
            raise ValueError(f"model {name!r} is not in the config; give --checkpoint to add it") from None
        if devices:
            m = msgspec.structs.replace(m, devices=devices)
            pd = set(m.prefill_devices)
            if pd and not (pd <= set(devices) and set(devices) - pd):
                raise ValueError(f"devices: {name!r} is a P/D model with prefill_devices {m.prefill_devices}; "
                                 f"{devices} must hold all of them and at least one device to decode")
    else:
        try:
            m = msgspec.convert({"name": name, "checkpoint": checkpoint, "devices": devices}, ModelConfig)
        except msgspec.ValidationError as e:
            raise ValueError(f"bad model: {e}") from None
    if any(dev >= d.cfg.devices.count for dev in m.devices):
        raise ValueError(f"devices: only {d.cfg.devices.count} devices exist")
    others = [x for x in d.cfg.models if x.name != name]
    d.cfg = msgspec.structs.replace(d.cfg, models=[*others, m])
    await load_new(d, [m])
    entry = d.models.models[name]
    if not entry.active:
        errors = "; ".join(f"device {p.device}: {p.error}" for p in entry.placements.values())
        await unload_model(d, name)
        raise ValueError(f"model {name!r} failed to load: {errors}")
    return {p.device: p.state + (f": {p.error}" if p.error else "") for p in entry.placements.values()}


async def unload_model(d: Daemon, name: str) -> dict[str, Any]:
    if name not in d.models.models:
        raise ValueError(f"model {name!r} is not loaded")
    out = await d.models.unload(name, d.cfg.server.drain_timeout_s)
    d.cfg = msgspec.structs.replace(d.cfg, models=[x for x in d.cfg.models if x.name != name])
    return out
