"""Slow path: the steady pool as three-dimensional bin packing (PAPER.md §4).

`plan(snapshot, config, consolidate=..., migrations_left=...)` turns the steady pool as
it is (where each instance sits, and each one's capacity vector now) into the pool as it
should be, and the ordered moves between the two, each with its reason. Pure and
deterministic: the same snapshot gives the same plan (ties go to the lower device id,
then the lower key), and every device of the plan fits in all three dimensions (except a
device that pinned items alone overfill: reported in `overloaded`, never added to).

Order of a plan's moves:
1. forced: instances that left the pool are removed; managed instances on a device that
   left the pool, or on a device their grown vectors overfill (the instance with the most
   of the worst dimension leaves first), and new instances are placed. New ones go where
   Phi changes least among used devices that fit; a new device only when none fits (a
   free one first, one that elastic instances hold only when no free one is left: the
   steady pool has priority, PAPER.md §2). A batch of new instances (a cold start, a
   device lost) is packed as the best (fewest devices, then least Phi) of first-fit-
   decreasing runs: five size orders x two rules (least Phi change; fullest device),
   each followed by emptying the devices it opened where the others can take their
   instances, then, while above the lower bound, size orders perturbed from a fixed seed.
2. local repack (optional moves): a device that lost an instance is emptied onto the
   other used devices when they can take all of its instances (a device freed), or, when
   its Phi rose by `repack_phi_threshold`, gets up to `repack_max_moves` balancing moves.
3. consolidation (optional, `consolidate=True`, the 30 s tick): the action with the
   largest gain first, until the migration budget is spent: first emptying a device
   (fewest moves per device freed), then single moves that lower the summed Phi by at
   least `min_phi_gain`.
Only optional moves count against `migrations_left`; each is feasible when it is made,
so the plan may be executed in order and stopped anywhere.
Step 1's batch search is policy/placement_batch.py's; steps 2 and 3 are
policy/placement_optional.py's; this module holds the planner, its forced moves and
the result.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from janusd.policy.bins import Bins, fits, phi, worst_dim
from janusd.policy.placement_batch import best_packing
from janusd.policy.placement_optional import OptionalMoves
from janusd.policy.policy_config import PlacementConfig
from janusd.policy.snapshot import (
    Assignment,
    DeviceLoad,
    Move,
    PlacementPlan,
    PlacementSnapshot,
    SteadyItem,
    Unplaced,
)


class PlacementError(ValueError):
    """A snapshot that cannot be planned (duplicate keys, bad vectors); names the item."""


def _check(snap: PlacementSnapshot) -> None:
    seen: set[str] = set()
    for it in snap.items:
        if it.key in seen:
            raise PlacementError(f"steady item {it.key!r} appears twice")
        seen.add(it.key)
        if len(it.vector) != 3 or not all(np.isfinite(x) and x >= 0.0 for x in it.vector):
            raise PlacementError(f"steady item {it.key!r}: vector must be 3 finite values >= 0, got {it.vector}")
        if it.pinned_device is not None and it.pinned_device < 0:
            raise PlacementError(f"steady item {it.key!r}: pinned_device must be >= 0")
    cur: set[str] = set()
    for a in snap.current:
        if a.key in cur:
            raise PlacementError(f"current assignment of {a.key!r} appears twice")
        cur.add(a.key)
    if any(d < 0 for d in snap.pool):
        raise PlacementError("pool: device ids must be >= 0")


class _Planner(OptionalMoves):
    """The working state of one plan() call; its optional moves are
    policy/placement_optional.py's, its batch search policy/placement_batch.py's."""

    def __init__(self, snap: PlacementSnapshot, cfg: PlacementConfig, migrations_left: int) -> None:
        self.cfg = cfg
        self.left = migrations_left
        self.taken = 0
        self.items = {it.key: it for it in snap.items}
        self.vec = {it.key: np.asarray(it.vector, dtype=float) for it in snap.items}
        pool = set(snap.pool)
        pinned_devs = {it.pinned_device for it in snap.items if it.pinned_device is not None}
        devices = sorted(pool | pinned_devs)
        elastic = set(snap.elastic_devices)
        self.bins = Bins(devices, [d in pool for d in devices], [d in elastic for d in devices])
        self.where: dict[str, int] = {}  # key -> bin index
        self.moves: list[Move] = []
        self.unplaced: list[Unplaced] = []
        self.touched: dict[int, str] = {}  # bin index -> who left it (first one)
        self.phi_before: dict[int, float] = {}

    # -- bookkeeping -------------------------------------------------------------
    def dev(self, i: int) -> int:
        return int(self.bins.ids[i])

    def managed_on(self, i: int) -> list[str]:
        return sorted(k for k in self.bins.keys[i] if self.items[k].pinned_device is None)

    def _leave(self, key: str, v: np.ndarray, why: str) -> None:
        i = self.where.pop(key)
        self.phi_before.setdefault(i, float(phi(self.bins.load[i])))
        self.touched.setdefault(i, why)
        self.bins.remove(i, key, v)

    # -- 1. forced ---------------------------------------------------------------
    def forced(self, snap: PlacementSnapshot) -> None:
        b = self.bins
        for pin in sorted((i for i in snap.items if i.pinned_device is not None), key=lambda i: i.key):
            b.add(b.index[pin.pinned_device], pin.key, self.vec[pin.key])  # type: ignore[index]
        current = {a.key: a for a in snap.current}
        displaced: dict[str, str] = {}  # key -> why it must be placed again
        src: dict[str, int] = {}
        leavers: list[tuple[str, np.ndarray]] = []
        for key in sorted(current):
            a = current[key]
            it = self.items.get(key)
            on_pool = a.device in b.index and bool(b.allowed[b.index[a.device]])
            if it is None:
                self.moves.append(Move(kind="remove", key=key, model=key.split("#")[0], src=a.device, dst=None,
                                       reason="left the steady pool", forced=True))
                if on_pool and a.vector is not None:  # count it, then take it out: the damage
                    i = b.index[a.device]
                    v = np.asarray(a.vector, dtype=float)
                    b.add(i, key, v)
                    self.where[key] = i
                    leavers.append((key, v))
                elif on_pool:
                    self.touched.setdefault(b.index[a.device], f"{key} left")
                continue
            if it.pinned_device is not None:
                if a.device != it.pinned_device:
                    self.moves.append(Move(kind="migrate", key=key, model=it.model, src=a.device,
                                           dst=it.pinned_device, reason=f"pinned by the operator to device "
                                           f"{it.pinned_device}", forced=True))
                continue
            if not on_pool:
                displaced[key] = f"device {a.device} left the steady pool"
                src[key] = a.device
                continue
            b.add(b.index[a.device], key, self.vec[key])
            self.where[key] = b.index[a.device]
        for key, v in leavers:  # after every stayer is counted: Phi before they left
            self._leave(key, v, f"{key} left")
        for i in map(int, np.flatnonzero(~fits(b.load))):
            while not fits(b.load[i]):
                managed = self.managed_on(i)
                if not managed:
                    break  # pinned items alone: reported as overloaded
                dim = int(np.argmax(b.load[i]))
                name, val = worst_dim(b.load[i])
                key = min(managed, key=lambda k: (-self.vec[k][dim], k))
                self._leave(key, self.vec[key], f"{key} was evicted")
                displaced[key] = f"device {self.dev(i)} over capacity in {name} ({val:.2f})"
                src[key] = self.dev(i)
        new = [k for k in sorted(self.items) if self.items[k].pinned_device is None and k not in current]
        self.place_batch(sorted(displaced) + new, displaced, src)

    def place_batch(self, keys: list[str], why: dict[str, str], src: dict[str, int]) -> None:
        too_big = [k for k in keys if not fits(self.vec[k])]
        for k in too_big:
            name, val = worst_dim(self.vec[k])
            self.unplaced.append(Unplaced(key=k, model=self.items[k].model,
                                          reason=f"needs more than one device: {name} {val:.2f}"))
            if k in src:
                self.moves.append(Move(kind="remove", key=k, model=self.items[k].model, src=src[k], dst=None,
                                       reason=f"{why[k]}; needs more than one device", forced=True))
        keys = [k for k in keys if k not in set(too_big)]
        if not keys:
            return
        if len(keys) == 1:
            (k,) = keys
            self.place_one(k, why.get(k), src.get(k))
            return
        how, placed, n = best_packing(self.bins, self.vec, keys)
        for k in keys:
            kind = "migrate" if k in src else "place"
            i = placed.get(k)
            if i is None:
                self._no_fit(k, why.get(k), src.get(k))
                continue
            v = self.vec[k]
            gain = float(phi(self.bins.load[i]) - phi(self.bins.load[i] + v))
            self.bins.add(i, k, v)
            self.where[k] = i
            self.moves.append(Move(kind=kind, key=k, model=self.items[k].model,  # type: ignore[arg-type]
                                   src=src.get(k), dst=self.dev(i), forced=True, phi_gain=round(gain, 9),
                                   reason=f"{why.get(k, 'new')}; placed with {len(keys) - 1} others at "
                                          f"once (best of {n} packings: {how})"))

    def place_one(self, k: str, why: str | None, src: int | None) -> None:
        """PAPER.md §4: the used device where Phi changes least; a new one if none fits."""
        v = self.vec[k]
        b = self.bins
        opened = not (b.open() & b.allowed & fits(b.load + v)).any()
        i = b.best(v)
        if i is None:
            self._no_fit(k, why, src)
            return
        gain = float(phi(b.load[i]) - phi(b.load[i] + v))
        b.add(i, k, v)
        self.where[k] = i
        tail = "opened a device: no used device fits" if opened else "least Phi change among used devices"
        self.moves.append(Move(kind="migrate" if src is not None else "place", key=k, model=self.items[k].model,
                               src=src, dst=self.dev(i), reason=f"{why or 'new'}; {tail}", forced=True,
                               phi_gain=round(gain, 9)))

    def _no_fit(self, k: str, why: str | None, src: int | None) -> None:
        self.unplaced.append(Unplaced(key=k, model=self.items[k].model, reason="no device of the pool fits it"))
        if src is not None:
            self.moves.append(Move(kind="remove", key=k, model=self.items[k].model, src=src, dst=None,
                                   reason=f"{why}; no device of the pool fits it", forced=True))

    # -- result ------------------------------------------------------------------
    def result(self) -> PlacementPlan:
        b = self.bins
        assignment = [Assignment(key=k, device=self.dev(i), vector=self.items[k].vector)
                      for k, i in self.where.items()]
        assignment += [Assignment(key=it.key, device=it.pinned_device, vector=it.vector)  # type: ignore[arg-type]
                       for it in self.items.values() if it.pinned_device is not None]
        devices = []
        total = 0.0
        for i in map(int, np.flatnonzero(b.open())):
            p = float(phi(b.load[i]))
            total += p
            load = tuple(round(float(x), 12) for x in b.load[i])
            devices.append(DeviceLoad(device=self.dev(i), load=load, phi=p, keys=tuple(sorted(b.keys[i]))))  # type: ignore[arg-type]
        overloaded = tuple(d.device for d in devices if not fits(np.asarray(d.load)))
        return PlacementPlan(assignment=tuple(sorted(assignment, key=lambda a: a.key)), moves=tuple(self.moves),
                             unplaced=tuple(sorted(self.unplaced, key=lambda u: u.key)), devices=tuple(devices),
                             bins_used=len(devices), phi=total, migrations=self.taken, overloaded=overloaded)


def plan(snap: PlacementSnapshot, cfg: PlacementConfig, *, consolidate: bool,
         migrations_left: int | None = None) -> PlacementPlan:
    """The steady pool's plan for this snapshot (see the module doc for the order of
    moves). `migrations_left`: optional moves still allowed in this slow period (the
    caller counts the ones it executed since the period began); None = the whole
    `cfg.migration_budget`."""
    _check(snap)
    left = cfg.migration_budget if migrations_left is None else max(0, int(migrations_left))
    p = _Planner(snap, cfg, left)
    p.forced(snap)
    p.repack()
    if consolidate:
        p.consolidate()
    return p.result()


def pack(vectors: Sequence[tuple[float, float, float]], devices: int | None = None) -> list[int]:
    """A fresh packing of bare vectors (no current placement, no budget): the device of
    each, in input order. What `janus bench placement` compares with the exact solver;
    a vector that fits no device gets -1."""
    n = len(vectors) if devices is None else devices
    items = tuple(SteadyItem(key=f"{i:06d}", model=f"{i:06d}", vector=tuple(map(float, v)))  # type: ignore[arg-type]
                  for i, v in enumerate(vectors))
    out = plan(PlacementSnapshot(pool=tuple(range(n)), items=items), PlacementConfig(migration_budget=0),
               consolidate=False)
    where = {a.key: a.device for a in out.assignment}
    return [where.get(f"{i:06d}", -1) for i in range(len(vectors))]
