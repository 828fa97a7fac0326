"""The policies' configuration (policy/policy_config.py): documented defaults, decoding
from TOML the way janusd.config decodes its sections, clear errors for bad values."""

from __future__ import annotations

import msgspec
import pytest

from janusd.policy.policy_config import ControllerConfig

# The [control] subsections as the lead will add them to etc/janusd.toml (defaults).
DEFAULTS_TOML = """
[demand]
capacity_margin = 1.0
max_steady_replicas = 16
attainment_target = 0.95
attainment_margin = 1.0
max_elastic_instances = 64

[placement]
migration_budget = 8
repack_phi_threshold = 0.05
repack_max_moves = 2
min_phi_gain = 0.02

[scaling]
debounce_plans = 2
min_instances_per_app = 1
pd_min_instances = 2

[classify]
elastic_rate = 5.0
steady_rate = 2.0
elastic_volatility = 3.0
steady_volatility = 2.0
min_burst_rate = 0.5
quiet_s = 120.0

[keepalive]
warm_after_s = 300.0
cold_after_s = 3600.0
demote_pinned = false
"""


def test_documented_defaults_are_the_struct_defaults():
    assert msgspec.toml.decode(DEFAULTS_TOML, type=ControllerConfig) == ControllerConfig()
    assert msgspec.toml.decode("", type=ControllerConfig) == ControllerConfig()


@pytest.mark.parametrize("toml,match", [
    ("[placement]\nmigration_budgt = 3\n", "unknown field `migration_budgt`"),
    ("[placement]\nmigration_budget = -1\n", "placement.migration_budget"),
    ("[demand]\nattainment_target = 1.5\n", "demand.attainment_target"),
    ("[scaling]\npd_min_instances = 1\n", "scaling.pd_min_instances"),
    ("[classify]\nsteady_rate = 9.0\n", "steady_rate .* must be below elastic_rate"),
    ("[keepalive]\ncold_after_s = 10.0\n", "cold_after_s .* must exceed warm_after_s"),
])
def test_bad_values_fail_with_the_field_named(toml, match):
    with pytest.raises(msgspec.ValidationError, match=match):
        msgspec.toml.decode(toml, type=ControllerConfig)
