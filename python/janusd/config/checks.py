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
        if m.dtype in ("int8", "int4") and (cfg.devices.kind != "cpu" or m.tp > 1):
            raise ValueError(f"models[{i}].dtype: {m.dtype!r} quantizes the weights for the cpu kernels of one "
                             f"device (devices.kind = {cfg.devices.kind!r}, tp = {m.tp}); use a float dtype")
        if m.tp > cfg.devices.count:
            raise ValueError(f"models[{i}].tp: {m.tp} exceeds devices.count = {cfg.devices.count}")
        if m.tp > 1:
            _check_tp(cfg, i)
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
    if cfg.devices.launcher == "ray":
        _check_ray(cfg)
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


def _check_tp(cfg: JanusConfig, i: int) -> None:
    """A tp > 1 model in the daemon (server/tp_groups.py): each entry of `devices` is the
    lead of an aligned group [lead, lead + tp) (control/groups.py's shape), held whole.
    What the daemon cannot do with a group yet is refused by name."""
    m = cfg.models[i]
    tp = m.tp
    where = f"models[{i}]"
    # the controller places models without `devices` (steady or elastic): a tp one on a free
    # aligned group at start (server/steady_start.py, control/start.py start_groups), then
    # its replicas on free groups (control/groups.py, control/extras.py)
    placed = cfg.control.managed and cfg.control.place_at_start
    if not m.devices and not placed:
        raise ValueError(f"{where}.devices: a tp = {tp} model lists the lead device of each of its groups "
                         f"(multiples of {tp}: lead 0 serves devices 0-{tp - 1}), unless the controller places "
                         "it (control.managed with control.place_at_start)")
    for d in m.devices:
        if d % tp:
            raise ValueError(f"{where}.devices: {d} is not the lead of an aligned group of tp = {tp} devices "
                             f"(leads are multiples of {tp}: lead {d - d % tp} serves devices "
                             f"{d - d % tp}-{d - d % tp + tp - 1})")
        if d + tp > cfg.devices.count:
            raise ValueError(f"{where}.devices: the group led by {d} needs devices {d}-{d + tp - 1}; "
                             f"devices.count = {cfg.devices.count}")
    if m.prefill_devices or m.role != "mixed":
        raise ValueError(f"{where}.tp: a tp > 1 instance serves the mixed role only (P/D export/import of a "
                         "sharded KV, one piece per shard, is not built)")
    if m.warm_devices:
        raise ValueError(f"{where}.warm_devices: a tp > 1 instance cannot start Warm (host copies shard by shard "
                         "are not built); cold_devices can")
    groups = {d: (m.name, tp, lead) for lead in m.devices for d in range(lead, lead + tp)}
    for j, o in enumerate(cfg.models):
        if j == i:
            continue
        if not o.devices and not placed:
            raise ValueError(f"models[{j}].devices: with tp > 1 models configured, every model lists its devices "
                             f"(round robin would place {o.name!r} inside a tp group of {m.name!r}), unless "
                             "the controller places them (control.managed with control.place_at_start)")
        for lead in o.devices:
            for d in range(lead, lead + o.tp):
                if d in groups and (o.tp, lead) != groups[d][1:]:
                    raise ValueError(f"models[{j}].devices: device {d} is in the tp = {tp} group "
                                     f"{groups[d][2]}-{groups[d][2] + tp - 1} of {m.name!r}; a group's devices are "
                                     "held whole (only models of the same group shape share them)")


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


def _check_ray(cfg: JanusConfig) -> None:
    """The ray launcher's settings (server/ray_launcher.py)."""
    r = cfg.ray
    if r.address:
        host, _, port = r.address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"ray.address: {r.address!r} is not 'host:port' (the GCS address `ray start --head` "
                             "prints), or \"\" to start a local head")
    for key in ("node_ip_address", "listen_host", "device_resource"):
        if not getattr(r, key).strip():
            raise ValueError(f"ray.{key}: empty")
    for i, m in enumerate(cfg.models):
        if m.tp > 1:
            raise ValueError(f"models[{i}].tp: {m.tp} under devices.launcher = \"ray\": a tp group's collectives "
                             "assume its shards on one host (gloo over loopback); serve tp models with the local "
                             "launcher")
