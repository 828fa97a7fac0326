"""One vocabulary ([U]): every state word other modules use is lifecycle/states.py's, and
the typed word sets there agree with the InstanceState enum (a state renamed or added
there and not here fails)."""

from __future__ import annotations

from typing import get_args

from janusd.control.ops import Target
from janusd.lifecycle import states
from janusd.lifecycle.states import COMING_UP_WORD, FAILED_WORD, STATE_WORDS, TARGETS, InstanceState
from janusd.policy import snapshot
from janusd.wire import worker_msgs


def test_the_word_sets_are_the_enums():
    assert STATE_WORDS == tuple(s.value for s in InstanceState) and len(STATE_WORDS) == 8
    assert set(TARGETS) == {"active", "warm", "cold"} and all(TARGETS[w].value == w for w in TARGETS)
    role_words = set(get_args(states.RoleStateWord))
    assert role_words == {"active", "draining", "warm", "cold", "unloaded", COMING_UP_WORD, FAILED_WORD}
    assert role_words - {COMING_UP_WORD, FAILED_WORD} <= set(STATE_WORDS)
    assert not {COMING_UP_WORD, FAILED_WORD} & set(STATE_WORDS)  # a role plan's own words never clash


def test_every_module_spells_states_through_the_one_owner():
    assert snapshot.Residency is states.TargetWord and snapshot.RoleState is states.RoleStateWord
    assert Target is states.TargetWord
    target_field = worker_msgs.SetState.__annotations__["target"]
    assert target_field in ("TargetWord", states.TargetWord)
