"""Cross-field rules msgspec cannot express (a device that does not exist, a P/D model
with no decode device, an option pair that cannot work together). Each raises
ValueError('key: reason'); parse_config adds the file's name."""

from __future__ import annotations

from janusd.config.model import JanusConfig


def check_config(cfg: JanusConfig) -> None:
    """Cross-field rules msgspec cannot express; raises ValueError('key: reason')."""
    names = [m.name for m in cfg.models]
    for i, m in enumerate(cfg.models):
        if names.index(m.name) != i:
            raise ValueError(f"models[{i}].name: duplicate model name {m.name!r}")
        for d in m.devices:
            if d >= cfg.devices.count:
                raise ValueError(
                    f"models[{i}].devices: device {d} does not exist (devices.count = {cfg.devices.count})"
                )
        if m.role == "prefill":
            raise ValueError(f"models[{i}].role: 'prefill' alone leaves no instance to decode; for P/D list the "
                             "prefill devices in prefill_devices and the decode devices in devices")
        if m.prefill_devices:
            pd = set(m.prefill_devices)
            if m.role != "mixed":
                raise ValueError(f"models[{i}].prefill_devices: a P/D model's roles come from prefill_devices; "
                                 f"leave role at 'mixed' (it is {m.role!r})")
            if not pd <= set(m.devices):
                raise ValueError(f"models[{i}].prefill_devices: {sorted(pd - set(m.devices))} not in devices "
                                 f"{m.devices} (devices lists every instance, prefill and decode)")
            if not set(m.devices) - pd:
                raise ValueError(f"models[{i}].prefill_devices: every device of the model prefills; "
                                 "at least one device in devices must be left to decode")
        for key in ("warm_devices", "cold_devices"):
            extra = sorted(set(getattr(m, key)) - set(m.devices))
            if extra:
                raise ValueError(f"models[{i}].{key}: {extra} not in devices {m.devices} (list the model's devices "
                                 "in `devices`; these say which of them start warm or cold)")
        both = sorted(set(m.warm_devices) & set(m.cold_devices))
        if both:
            raise ValueError(f"models[{i}].cold_devices: {both} also in warm_devices (one start state per device)")
        if m.tp > cfg.devices.count:
            raise ValueError(f"models[{i}].tp: {m.tp} exceeds devices.count = {cfg.devices.count}")
        if m.tp > 1:
            # refused rather than ignored: a tp = 2 model would silently run unsharded. The
            # engine runs tp > 1 (engine/tp/); what the daemon lacks is named here
            raise ValueError(f"models[{i}].tp: the daemon does not serve tensor-parallel instances yet (its "
                             "workers start one device per instance, and the dispatcher and the controller's "
                             "oracle prior and placement take one device per instance); tp must be 1 here "
                             "(list several devices in `devices` for replicas). The engine runs tp > 1 offline: "
                             "`janus generate --tp N`, `janus bench tp`")
        if m.kv_cache_mib > cfg.devices.memory_mib:
            raise ValueError(
                f"models[{i}].kv_cache_mib: {m.kv_cache_mib} exceeds devices.memory_mib = {cfg.devices.memory_mib}"
            )
    for d in cfg.control.pool_devices:
        if d >= cfg.devices.count:
            raise ValueError(f"control.pool_devices: device {d} does not exist (devices.count = {cfg.devices.count})")
    if cfg.dispatch.requeue == "keep" and cfg.dispatch.policy == "lst_imh":
        raise ValueError("dispatch.requeue: 'keep' (serve late, never drop) is for the round_robin and least_load "
                         "baselines; lst_imh never selects a late request, so it would wait forever")
    _check_cpu_cores(cfg)
    if cfg.devices.kind == "cpu" and cfg.devices.transfer_protocol not in ("auto", "tcp"):
        raise ValueError(f"devices.transfer_protocol: {cfg.devices.transfer_protocol!r} moves device memory; cpu "
                         "devices use tcp (auto)")
    if cfg.devices.memory_mib % cfg.devices.page_size_mib:
        raise ValueError("devices.memory_mib: must be a multiple of devices.page_size_mib")
    if cfg.devices.resident_mib > cfg.devices.memory_mib:
        raise ValueError(f"devices.resident_mib: {cfg.devices.resident_mib} exceeds devices.memory_mib = "
                         f"{cfg.devices.memory_mib} (the part of the pool kept resident)")
    if cfg.devices.resident_mib % cfg.devices.page_size_mib:
        raise ValueError("devices.resident_mib: must be a multiple of devices.page_size_mib")
    if len(set(cfg.server.api_keys)) != len(cfg.server.api_keys) or any(not k for k in cfg.server.api_keys):
        raise ValueError("server.api_keys: keys must be non-empty and distinct")


def _check_cpu_cores(cfg: JanusConfig) -> None:
    """One non-empty core list per cpu device, no core in two lists (two pinned workers on
    one core would each get half of it, which is what pinning is for avoiding)."""
    cores = cfg.devices.cpu_cores
    if not cores:
        return
    if cfg.devices.kind != "cpu":
        raise ValueError(f"devices.cpu_cores: pins cpu devices' workers to host cores; kind is {cfg.devices.kind!r}")
    if len(cores) != cfg.devices.count:
        raise ValueError(f"devices.cpu_cores: {len(cores)} core lists for devices.count = {cfg.devices.count} "
                         "(one list per device)")
    seen: dict[int, int] = {}
    for d, cs in enumerate(cores):
        if not cs:
            raise ValueError(f"devices.cpu_cores[{d}]: empty (every device needs at least one core)")
        for c in cs:
            if c in seen and seen[c] != d:
                raise ValueError(f"devices.cpu_cores[{d}]: core {c} is also device {seen[c]}'s")
            seen[c] = d
