"""The base of every component's settings Struct and the bounded numbers they share.

A component owns its settings (policy/policy_config.py, config/sections.py for the
daemon's own sections) and config/ only composes them into the file's tables; so the
base lives below both, here, and imports nothing of janusd: policy/ may use it without
reaching up into config/.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

PositiveInt = Annotated[int, Meta(gt=0)]
NonNegInt = Annotated[int, Meta(ge=0)]
PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegFloat = Annotated[float, Meta(ge=0.0)]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]


class Section(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Frozen (handed to a component, never changed by it), unknown keys refused (a typo
    in a TOML file is an error naming the key, not a silent default), keyword-only (a
    section is built from names, never by position)."""
