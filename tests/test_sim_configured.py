"""`janus sim --config` (sim/configured.py): the simulator runs a daemon's own configuration:
its pinned devices and start states, its [control] (the room only under policy janus) and
its refusals of a config it cannot run as given."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from janusd.bench.cluster_setup import config
from janusd.config import parse_config
from janusd.engine.checkpoint.demo import demo_arch
from janusd.hw.model_spec import ModelSpec
from janusd.lifecycle.states import InstanceState
from janusd.sim.configured import ConfigError
from janusd.sim.run import simulate
from janusd.sim.specs import SimModel
from janusd.trace.formats import Trace

S = InstanceState
APPS = ("burst-a", "burst-b", "quiet-a", "quiet-b", "steady-a", "steady-b")


def _archs() -> dict[str, SimModel]:
    spec = ModelSpec.from_config(msgspec.to_builtins(demo_arch("llama", "tiny")))
    return {a: SimModel.from_spec(a, spec, 1, 2048) for a in APPS}


def _trace(burst_rps: float = 0.0) -> Trace:
    """1 req/s per app for 40 s; burst-b adds `burst_rps` from 10 s to 25 s."""
    rng = np.random.default_rng(0)
    t, names = [], []
    for a in APPS:
        x = np.sort(rng.uniform(0.0, 40.0, 40))
        if a == "burst-b" and burst_rps:
            x = np.sort(np.concatenate([x, rng.uniform(10.0, 25.0, int(burst_rps * 15))]))
        t.append(x)
        names += [a] * len(x)
    arr = np.concatenate(t)
    o = np.argsort(arr, kind="stable")
    n = len(arr)
    names_arr = np.array(names)[o]
    return Trace.build(arr[o], names_arr, names_arr, np.full(n, 50), np.full(n, 16), np.full(n, 1000.0),
                       np.full(n, 100.0))


def test_static_runs_the_operators_split_and_janus_starts_the_warm_replicas_warm(tmp_path):
    static = parse_config(config("static", str(tmp_path)))
    c, s = simulate(_trace(), _archs(), 2, "static", "cpu", config=static)
    assert {n: sorted(m.instances) for n, m in c.core.registry.models.items()} == \
        {a: [0 if a.endswith("-a") else 1] for a in APPS}
    assert s["outcomes"].get("ok") == 240
    assert s["device_hours"] * 3600 == pytest.approx(2 * s["sim_end_s"], rel=0.05)  # both devices, all run

    janus = parse_config(config("janus", str(tmp_path)))
    c, s = simulate(_trace(), _archs(), 2, "janus", "cpu", config=janus)
    bursty = {n: {d: i.state for d, i in c.core.registry.models[n].instances.items()} for n in ("burst-a", "burst-b")}
    assert bursty == {"burst-a": {0: S.ACTIVE, 1: S.WARM}, "burst-b": {0: S.ACTIVE, 1: S.WARM}}
    assert s["device_hours"] * 3600 < 1.2 * s["sim_end_s"]  # one device at this load


def test_a_burst_wakes_the_bursty_models_warm_replica_under_janus(tmp_path):
    janus = parse_config(config("janus", str(tmp_path)).replace("scale_in_hold_s = 10.0", "scale_in_hold_s = 60.0"))
    c, _ = simulate(_trace(burst_rps=60.0), _archs(), 2, "janus", "cpu", config=janus)
    assert c.core.registry.models["burst-b"].instances[1].state is S.ACTIVE  # held past the run's end
    assert c.core.registry.models["burst-a"].instances[1].state is S.WARM


def test_a_config_the_simulation_cannot_run_is_refused_with_the_reason(tmp_path):
    cfg = parse_config(config("static", str(tmp_path)))
    with pytest.raises(ValueError, match="janus .* or static"):
        simulate(_trace(), _archs(), 2, "blitzscale", "cpu", config=cfg)
    with pytest.raises(ConfigError, match="not in a pool of 1"):
        simulate(_trace(), _archs(), 1, "static", "cpu", config=cfg)
    fewer = msgspec.structs.replace(cfg, models=[m for m in cfg.models if m.name != "quiet-b"])
    with pytest.raises(ConfigError, match=r"\['quiet-b'\] are not in the config"):
        simulate(_trace(), _archs(), 2, "static", "cpu", config=fewer)
