"""P/D pieces that need no processes: its config rules, the decode routing policy
(policy/decode_route.py) against a brute-force reference, and the Scheduler keeping
prefill work off decode instances while routing handoffs by backlog."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from janusd.config import ConfigError, DispatchConfig, parse_config
from janusd.policy.decode_route import DecodeLoad, least_decode_backlog
from janusd.server.scheduling import Scheduler

BASE = "[devices]\ncount = 3\n[[models]]\nname = 'm'\ncheckpoint = 'demo:llama-tiny'\n"


@pytest.mark.parametrize("extra, message", [
    ("role = 'prefill'\n", "models[0].role: 'prefill' alone leaves no instance to decode"),
    ("devices = [0, 1]\nprefill_devices = [2]\n", "models[0].prefill_devices: [2] not in devices"),
    ("devices = [0, 1]\nprefill_devices = [0, 1]\n", "at least one device in devices must be left to decode"),
    ("devices = [0, 1]\nprefill_devices = [0]\nrole = 'decode'\n", "leave role at 'mixed'"),
])  # fmt: skip
def test_pd_config_mistakes_name_the_key(extra, message):
    with pytest.raises(ConfigError, match="prefill|role") as e:
        parse_config(BASE + extra, "t.toml")
    assert message in str(e.value) and "t.toml" in str(e.value)


def test_a_pd_model_config_is_accepted():
    cfg = parse_config(BASE + "devices = [0, 1, 2]\nprefill_devices = [0]\n")
    assert cfg.models[0].prefill_devices == [0] and cfg.models[0].role == "mixed"


loads = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 50)), max_size=6).map(
    lambda xs: [DecodeLoad(i + 1, s, t) for i, (s, t) in enumerate(xs)]
)


@given(loads)
def test_least_decode_backlog_is_the_brute_force_minimum(xs):
    pick = least_decode_backlog(xs)
    if not xs:
        assert pick is None
        return
    # reference: an instance no other beats on (sequences, then tokens, then id)
    best = [x for x in xs if all((x.sequences, x.token_budget, x.instance_id) <= (y.sequences, y.token_budget,
                                                                                 y.instance_id) for y in xs)]
    assert [b.instance_id for b in best] == [pick]
    for perm in itertools.islice(itertools.permutations(xs), 6):  # order of the candidates does not matter
        assert least_decode_backlog(list(perm)) == pick


def test_the_scheduler_sends_prefill_work_only_to_prefill_instances_and_hands_off_by_backlog():
    assigned: list[tuple[int, int]] = []
    s = Scheduler(DispatchConfig(policy="lst_imh"), lambda rid, inst: assigned.append((rid, inst.device)),
                  lambda rid: None)
    p = s.add_instance("m", 0, "prefill")
    d1 = s.add_instance("m", 1, "decode")
    d2 = s.add_instance("m", 2, "decode")
    for inst in (p, d1, d2):
        s.set_ready(inst, True)
    for rid in range(1, 7):
        s.submit(rid, "m", 0.0, 100.0, 10)
    s.tick(0.0)
    assert {dev for _, dev in assigned} == {0} and len(assigned) == 6
    # each handoff goes to the least loaded decode instance; loads as the daemon records them
    picks = []
    for rid, budget in ((1, 100), (2, 50), (3, 10), (4, 10)):
        t = s.decode_target("m")
        assert t is not None
        t.decoding[rid] = budget
        picks.append(t.device)
    assert picks == [1, 2, 2, 1]  # (0,0)->1; (1,0)->2; (1,1) tie on sequences, 50 < 100 -> 2; (1,2)->1
    s.set_ready(d1, False)
    assert s.decode_target("m") is d2
    s.set_ready(d2, False)
    assert s.decode_target("m") is None
    assert s.remove_instance(d1) == [] and s.pending("m") == 0
