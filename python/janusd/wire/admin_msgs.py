"""Messages on the admin Unix socket (`janus ctl` <-> the daemon).

One request frame, one reply frame, then the client may send another. Requests are a
closed tagged union: anything else (garbage bytes, an unknown tag, wrong field types)
is answered with AdminError and the daemon keeps serving. Replies carry plain data
(dicts and lists of scalars) because ctl only prints them, as a table or as JSON.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

_OPTS = dict(array_like=True, omit_defaults=True, gc=False, tag=True)


class StatusReq(msgspec.Struct, **_OPTS):
    pass


class ModelsReq(msgspec.Struct, **_OPTS):
    pass


class InstancesReq(msgspec.Struct, **_OPTS):
    pass


class PoolsReq(msgspec.Struct, **_OPTS):
    """Each device's page pool; `refresh`: ask the workers now (else their last poll,
    at most a second old: what `janus top` reads every second)."""

    refresh: bool = True


class LoadReq(msgspec.Struct, **_OPTS):
    """Load a model: one named in the config, or a new one when `checkpoint` is given."""

    name: str
    checkpoint: str | None = None
    devices: list[int] = []


class UnloadReq(msgspec.Struct, **_OPTS):
    """End the model's instances (drain, free the devices); the model and its config stay,
    so requests for it wait (bounded) and `load NAME` brings it back."""

    name: str


class RemoveReq(msgspec.Struct, **_OPTS):
    """Unload the model and forget it: its requests get 404 from then on."""

    name: str


class StateReq(msgspec.Struct, **_OPTS):
    """Move the model's instance on `device` to `target` (active | warm | cold); the reply
    holds the path the weights took and the seconds of each phase."""

    name: str
    device: int
    target: str


class ForkReq(msgspec.Struct, **_OPTS):
    """Bring the model up on device `dst` by pulling the weights of its Active instance on
    `src` (D2D through the transfer engine; falls back to H2D / a Cold load)."""

    name: str
    src: int
    dst: int


class DrainReq(msgspec.Struct, **_OPTS):
    """Stop accepting requests, let in-flight ones finish, then stop (as SIGTERM does)."""

    pass


class ConfigReq(msgspec.Struct, **_OPTS):
    pass


class PlanReq(msgspec.Struct, **_OPTS):
    """The controller's last decisions: elastic counts (m*, budget), keep-alive, operations."""

    pass


class EventsReq(msgspec.Struct, **_OPTS):
    """The decisions carried out (the controller's Ops and the wakes requests start) with
    their reasons and outcomes, from the daemon's ring: those that changed after version
    `after` (0: all kept), the last `limit` of them (0: no limit). The reply's `version`
    is the `after` of the next call (`ctl events --follow`)."""

    after: Annotated[int, msgspec.Meta(ge=0)] = 0  # a negative one is refused with the field named
    limit: Annotated[int, msgspec.Meta(ge=0)] = 0


class OracleReq(msgspec.Struct, **_OPTS):
    """The performance oracle per model: prior or fitted, points, last fit, held-out error."""

    pass


AdminRequest = (StatusReq | ModelsReq | InstancesReq | PoolsReq | LoadReq | UnloadReq | RemoveReq | DrainReq | ConfigReq
                | StateReq | ForkReq | OracleReq | PlanReq | EventsReq)


class AdminResult(msgspec.Struct, **_OPTS):
    data: dict[str, Any]


class AdminError(msgspec.Struct, **_OPTS):
    message: str


AdminReply = AdminResult | AdminError


def request_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(AdminRequest)


def reply_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(AdminReply)
