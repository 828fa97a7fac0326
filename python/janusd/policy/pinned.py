"""Static placement: the devices each model is pinned to by its config (PAPER.md §2,
the operator override). Models without `devices` are spread round-robin over the devices
in config order. Pure; the controller ([C]) will place the models it manages, and never
moves a pinned one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Pinnable(Protocol):
    """What placement reads of a model (config.ModelConfig has it): policy/ never imports
    config/, which composes the policies' settings and so sits above them."""

    @property
    def name(self) -> str: ...

    @property
    def devices(self) -> Sequence[int]: ...


def place(models: Sequence[Pinnable], device_count: int) -> dict[str, list[int]]:
    """Devices for each model: its own list, or round-robin for those without one."""
    out: dict[str, list[int]] = {}
    k = 0
    for m in models:
        if m.devices:
            out[m.name] = sorted(set(m.devices))
        else:
            out[m.name] = [k % device_count]
            k += 1
    return out
