"""What the controller's policies take and return: one owner for their shapes.

The daemon's controller and the simulator ([S]) build these snapshots from their own
state and run the very same policies on them, so every input a policy needs is a field
here (time included: `now` is an argument, never a clock read) and every decision comes
back with its reason, for `janus ctl plan`, the logs and the tests.

Resource vectors are fractions of one device in oracle/types.py's RESOURCE_DIMS order
(hbm, compute, bandwidth); a device holds a set of vectors when their sum is at most 1.0
in every dimension (placement.FIT_EPS absorbs float rounding). A steady "item" is one
steady instance of a model: a model too big for one device is split into replicas by
demand.py before packing.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from janusd.lifecycle.states import RoleStateWord, TargetWord

Vec3 = tuple[float, float, float]
Pool = Literal["steady", "elastic"]
Residency = TargetWord  # the lifecycle's names (lifecycle/states.py; [L], PAPER.md §8)
MoveKind = Literal["place", "migrate", "remove"]


class _Frozen(msgspec.Struct, frozen=True, kw_only=True):
    pass


# ---- steady placement (placement.py) -------------------------------------------------

class SteadyItem(_Frozen):
    """One steady instance to place. `key` is unique in a snapshot (model, or model#k for
    its k-th replica); `pinned_device` set means the operator put it there (config
    `devices`): its vector counts on that device and the controller never moves it."""

    key: str
    model: str
    vector: Vec3
    pinned_device: int | None = None


class Assignment(_Frozen):
    """Where an item is. `vector` is the one it was planned with (a plan fills it in, so
    the next snapshot's `current` can be the last plan's `assignment`): it tells how much
    an item that then leaves gave back, the damage placement weighs for a repack."""

    key: str
    device: int
    vector: Vec3 | None = None


class PlacementSnapshot(_Frozen):
    """The steady pool now: the devices the controller may use (`pool`), every steady
    item with its current capacity vector, and where the managed ones are today
    (`current`; pinned items are placed by their own field and need no entry here).
    An opened device is the lowest-id free one, else the lowest-id elastic one.
    An item of `current` that is no longer in `items` has left; an item of `items` that
    is not in `current` is new."""

    pool: tuple[int, ...]
    items: tuple[SteadyItem, ...]
    current: tuple[Assignment, ...] = ()
    # devices of the pool that elastic instances hold now: the steady pool has priority
    # (PAPER.md §2) and may take them, but opens a free device first
    elastic_devices: tuple[int, ...] = ()


class Move(_Frozen):
    """One step of a plan, in execution order. `src`/`dst` are None for a placement of a
    new item / a removal. `forced` moves restore feasibility or follow the snapshot (new,
    leaving, device gone, device over capacity); the others are optional improvements
    and are the only ones the migration budget counts. `bins_freed` and `phi_gain`
    (decrease of the summed imbalance potential) are what this move earns."""

    kind: MoveKind
    key: str
    model: str
    src: int | None
    dst: int | None
    reason: str
    forced: bool
    bins_freed: int = 0
    phi_gain: float = 0.0


class DeviceLoad(_Frozen):
    device: int
    load: Vec3  # summed vectors of the items on it
    phi: float  # imbalance potential of `load` (PAPER.md §4)
    keys: tuple[str, ...]  # items on it, sorted


class Unplaced(_Frozen):
    key: str
    model: str
    reason: str


class PlacementPlan(_Frozen):
    """Where every steady item goes, the ordered moves from `current` to it, and what the
    plan looks like (for ctl). Devices of the pool that hold nothing are not listed in
    `devices`; they are what the elastic pool may use."""

    assignment: tuple[Assignment, ...]  # sorted by key; pinned items included
    moves: tuple[Move, ...]
    unplaced: tuple[Unplaced, ...]
    devices: tuple[DeviceLoad, ...]  # devices holding at least one item, by id
    bins_used: int
    phi: float  # summed over `devices`
    migrations: int  # optional moves taken (<= the budget given)
    overloaded: tuple[int, ...] = ()  # devices over capacity by pinned items alone


# ---- elastic scaling (scaling.py) ----------------------------------------------------

class ElasticApp(_Frozen):
    """One elastic app at a fast tick. `demand` is m* (the Elasticity GP's minimum count
    for the SLO target, demand.elastic_demand); `current` the instances it holds now;
    `prefill_share` the part of its work that is prefill (0..1), to split P from D;
    `devices` the devices one instance takes (its tp: the budget counts devices)."""

    app: str
    demand: int
    current: int = 0
    prefill_share: float = 0.5
    devices: int = 1


class ScalingState(_Frozen):
    """What the debounce remembers between ticks, per app (sorted by app): its latest
    raw demands (up to debounce_plans - 1 of them, oldest first) and its last debounced
    demand. The empty state is the first tick."""

    recent_demands: tuple[tuple[str, tuple[int, ...]], ...] = ()
    debounced: tuple[tuple[str, int], ...] = ()


class AppCount(_Frozen):
    app: str
    demand: int  # m* this tick
    debounced: int  # after the two-plan debounce (what the app asks the budget for)
    count: int  # instances given (after compression to the budget)
    prefill: int  # of `count`, prefill-only instances (0 below pd_min_instances)
    decode: int  # the rest: decode-only, or mixed (prefill and decode) when prefill is 0
    reason: str


class ScalingPlan(_Frozen):
    apps: tuple[AppCount, ...]  # sorted by app
    budget: int  # devices
    asked: int  # devices the debounced demands take (sum of demand x devices per instance)
    given: int  # devices of the counts: == budget when asked > budget (all tp 1), else == asked
    compressed: bool
    state: ScalingState  # feed back at the next tick


# ---- an elastic P/D app's roles (roles.py) -------------------------------------------

Role = Literal["prefill", "decode", "mixed"]
RoleState = RoleStateWord  # lifecycle/states.py
RoleOpKind = Literal["activate", "reassign", "deactivate", "wait"]


class RoleInstance(_Frozen):
    """One instance of the app now: its engine role (the one it was loaded or last
    activated with; a Warm copy keeps it), its state in roles.py's words, and the
    requests it holds (a drain's length). `busy`: an operation is in flight on it (it
    counts where it is going: `state` coming_up or draining; never touched)."""

    device: int
    role: Role
    state: RoleState
    load: int = 0
    busy: bool = False


class RoleOp(_Frozen):
    """activate: a Warm/Cold instance comes up as `role` (`previous_role` the one its
    copy was made with); reassign: an Active instance drains to Warm and comes back as
    `role` (two lifecycle moves, one device); deactivate: an Active one drains to Warm;
    wait (only in RolePlan.held): a surplus instance with an operation in flight, to be
    deactivated once it ends."""

    device: int
    kind: RoleOpKind
    role: Role
    previous_role: Role
    reason: str


class RolePlan(_Frozen):
    """`ops` to start now, in order; `held`: removals that would leave the app with no
    way to serve while an activation is still coming, and waits (planned again next tick);
    `target`: (device, role) of every instance Active once all of them are done;
    `short`: instances of each role the app wanted but had no instance for."""

    ops: tuple[RoleOp, ...]
    held: tuple[RoleOp, ...]
    target: tuple[tuple[int, Role], ...]
    short: tuple[tuple[Role, int], ...] = ()


# ---- bursty isolation (classify.py) --------------------------------------------------

class AppTraffic(_Frozen):
    """An app's recent traffic: `rate` its mean request rate over the long window,
    `peak_rate` the highest rate over the short windows inside it (peak/mean is the
    volatility), and the operator's pin to a pool, if any."""

    app: str
    rate: float
    peak_rate: float
    pin: Pool | None = None


class AppPool(_Frozen):
    """An app's pool and, for an elastic app, since when it has been quiet (None: not
    quiet at the last evaluation). The classifier's state between evaluations."""

    app: str
    pool: Pool
    quiet_since: float | None = None


class PoolDecision(_Frozen):
    app: str
    pool: Pool
    changed: bool
    reason: str


class Classification(_Frozen):
    decisions: tuple[PoolDecision, ...]  # sorted by app
    state: tuple[AppPool, ...]  # feed back at the next evaluation


# ---- keep-alive (keepalive.py) -------------------------------------------------------

class ModelActivity(_Frozen):
    """A model's residency now and its last request. `last_request_at` None: no request
    since it was loaded (`since` then counts from when it got its residency)."""

    model: str
    residency: Residency
    since: float  # when it entered `residency`
    last_request_at: float | None
    in_flight: int = 0
    pinned: bool = False


class ResidencyDecision(_Frozen):
    model: str
    residency: Residency  # the target; == the current one when nothing changes
    changed: bool
    reason: str
