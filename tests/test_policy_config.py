"""The policies' configuration (policy/policy_config.py): documented defaults, decoding
from TOML the way janusd.config decodes its sections, clear errors for bad values."""

from __future__ import annotations

import tomllib
from importlib.resources import files

import msgspec
import pytest

from janusd.policy.policy_config import ControllerConfig

# The [control] subsections as the embedded janusd.toml documents them: read from that file,
# so a default changed on one side only fails here.
_EMBEDDED = tomllib.loads((files("janusd.config") / "janusd.toml").read_text())["control"]
DEFAULTS_TOML_SECTIONS = {k: v for k, v in _EMBEDDED.items() if k in ControllerConfig.__struct_fields__}


def test_documented_defaults_are_the_struct_defaults():
    assert set(DEFAULTS_TOML_SECTIONS) == set(ControllerConfig.__struct_fields__)
    assert msgspec.convert(DEFAULTS_TOML_SECTIONS, type=ControllerConfig) == ControllerConfig()
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
