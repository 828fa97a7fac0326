"""The plan's optional moves (policy/placement.py, steps 2 and 3), each counted against
the migration budget: the local repack of a device an instance left (emptied when the
rest fits on used devices, else balancing moves when its Phi rose past
`repack_phi_threshold`) and consolidation on the 30 s tick (emptying a device with the
fewest moves first, then single moves worth at least `min_phi_gain`). Apart from the
forced moves because only these are optional: every one is feasible when made, and a
plan may stop after any of them. A part of placement.py's planner (a mixin)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from janusd.policy.bins import TIE_EPS, Bins, fits, phi
from janusd.policy.placement_batch import relocate
from janusd.policy.policy_config import PlacementConfig
from janusd.policy.snapshot import Move, SteadyItem


class OptionalMoves:
    """What it uses of the planner (made in placement.py's _Planner.__init__)."""

    cfg: PlacementConfig
    left: int  # optional moves still allowed
    taken: int  # optional moves made
    items: dict[str, SteadyItem]
    vec: dict[str, np.ndarray]
    bins: Bins
    where: dict[str, int]  # key -> bin index
    moves: list[Move]
    touched: dict[int, str]  # bin index -> who left it (first one)
    phi_before: dict[int, float]

    if TYPE_CHECKING:
        def dev(self, i: int) -> int: ...

        def managed_on(self, i: int) -> list[str]: ...

    def _optional(self, key: str, i: int, j: int, reason: str, bins_freed: int, phi_gain: float) -> None:
        """Record an optional migration from bin i to bin j (already applied to the bins)."""
        self.moves.append(Move(kind="migrate", key=key, model=self.items[key].model, src=self.dev(i), dst=self.dev(j),
                               reason=reason, forced=False, bins_freed=bins_freed, phi_gain=round(phi_gain, 9)))
        self.left -= 1
        self.taken += 1

    def _empty_plan(self, i: int) -> list[tuple[str, int]] | None:
        """Where each instance of device i would go so that i ends empty (onto used
        devices only), or None when one of them fits nowhere or a pinned one sits there."""
        b = self.bins
        keys = self.managed_on(i)
        if not keys or len(keys) != b.count[i]:
            return None
        dest = relocate(b, self.vec, i)
        if dest is None:
            return None
        for k, j in dest.items():  # undo: the caller applies the plan as moves
            b.remove(j, k, self.vec[k])
            b.add(i, k, self.vec[k])
        order = sorted(dest, key=lambda k: (-float(self.vec[k].max()), k))
        return [(k, dest[k]) for k in order]

    def _apply_empty(self, i: int, steps: list[tuple[str, int]], reason: str) -> None:
        for n, (k, j) in enumerate(steps):
            v = self.vec[k]
            b = self.bins
            gain = float(phi(b.load[i]) + phi(b.load[j]) - phi(b.load[i] - v) - phi(b.load[j] + v))
            b.remove(i, k, v)
            b.add(j, k, v)
            self.where[k] = j
            last = n == len(steps) - 1
            self._optional(k, i, j, reason, bins_freed=int(last), phi_gain=gain)

    def _best_balance(self, sources: Sequence[int] | None, min_gain: float) -> tuple[float, str, int, int] | None:
        """The single move of a managed instance between used devices that lowers the
        summed Phi most (at least min_gain): (gain, key, src, dst). `sources`: only
        instances on these devices, or moves onto them."""
        b = self.bins
        used = b.open() & b.allowed
        onto = used
        if sources is not None:
            onto = np.zeros(len(b.ids), dtype=bool)
            onto[list(sources)] = True
            onto &= used
        best: tuple[float, str, int, int] | None = None
        phis = phi(b.load)
        for k, i in sorted(self.where.items()):
            v = self.vec[k]
            after = b.load + v
            ok = (used if sources is None or i in sources else onto) & fits(after)
            ok[i] = False
            if not ok.any():
                continue
            src_gain = phis[i] - float(phi(b.load[i] - v))
            gains = np.where(ok, src_gain + phis - phi(after), -np.inf)
            top = float(gains.max())
            j = int(np.flatnonzero(gains >= top - TIE_EPS)[0])
            g = float(gains[j])
            if g >= min_gain and (best is None or g > best[0] + TIE_EPS):
                best = (g, k, i, j)
        return best

    def _apply_balance(self, move: tuple[float, str, int, int], reason: str) -> None:
        g, k, i, j = move
        v = self.vec[k]
        self.bins.remove(i, k, v)
        self.bins.add(j, k, v)
        self.where[k] = j
        self._optional(k, i, j, reason, bins_freed=int(self.bins.count[i] == 0), phi_gain=g)

    def repack(self) -> None:
        for i in sorted(self.touched):
            if self.left <= 0:
                return
            b = self.bins
            if b.count[i] == 0 or not b.allowed[i]:
                continue
            who = self.touched[i]
            empty = self._empty_plan(i)
            if empty is not None and len(empty) <= self.left:
                self._apply_empty(i, empty, f"repack after {who}: the rest of device {self.dev(i)} fits on used devices")
                continue
            rise = float(phi(b.load[i])) - self.phi_before.get(i, 0.0)
            if rise < self.cfg.repack_phi_threshold:
                continue
            for _ in range(min(self.cfg.repack_max_moves, self.left)):
                m = self._best_balance([i], max(self.cfg.min_phi_gain, 1e-12))
                if m is None:
                    break
                self._apply_balance(m, f"repack after {who}: Phi of device {self.dev(i)} rose by {rise:.3f}")

    def consolidate(self) -> None:
        while self.left > 0:
            b = self.bins
            order = sorted(map(int, np.flatnonzero(b.open() & b.allowed)),
                           key=lambda i: (int(b.count[i]), float(b.load[i].sum()), i))
            found: tuple[tuple[int, float, int], list[tuple[str, int]]] | None = None
            for i in order:
                if found is not None and b.count[i] > found[0][0]:
                    break
                if b.count[i] > self.left:
                    break
                empty = self._empty_plan(i)
                if empty is None:
                    continue
                score = (len(empty), -float(phi(b.load[i])), i)
                if found is None or score < found[0]:
                    found = (score, empty)
            if found is not None:
                i = found[0][2]
                self._apply_empty(i, found[1], f"consolidation: device {self.dev(i)} freed in {len(found[1])} moves")
                continue
            m = self._best_balance(None, max(self.cfg.min_phi_gain, 1e-12))
            if m is None:
                return
            self._apply_balance(m, f"consolidation: summed Phi lowered by {m[0]:.3f}")
