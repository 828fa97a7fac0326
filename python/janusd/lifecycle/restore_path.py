"""Which way a Warm or Cold instance comes back to Active: by estimated time, never by a
fixed order (PAPER.md §8). Pure: bandwidths and byte counts come in, a choice goes out.

Paths: `d2d` (a fork from an Active peer over the transfer engine), `h2d` (from the
instance's own host copy, Warm only), `checkpoint` (read the checkpoint, Cold). The
estimate of each is bytes / bandwidth + a fixed cost; bandwidths start from what the
worker measured at start (memcpy) or from a prior relative to it, and every transfer
refines them (an exponentially weighted mean). On cpu machines loopback TCP is ~7x
slower than memcpy, so a Warm instance restores by H2D; on a supernode D2D beats H2D,
and the same code picks the fork.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PATHS = ("d2d", "h2d", "checkpoint")

# Priors, relative to the measured memcpy bandwidth, used until a path has been measured:
# loopback TCP through Mooncake ~1/7 of memcpy (lifecycle/transfer.py), a checkpoint read
# and conversion ~1/10.
_PRIOR_SHARE = {"d2d": 1 / 7, "h2d": 1.0, "checkpoint": 1 / 10}
# Fixed cost per path (s): handshake and publish for a fork, opening the checkpoint.
_FIXED_S = {"d2d": 0.05, "h2d": 0.0, "checkpoint": 0.2}


@dataclass
class Bandwidths:
    """Bytes per second per path; `observe` refines them from every transfer."""

    memcpy: float = 5e9
    measured: dict[str, float] = field(default_factory=dict)
    weight: float = 0.3  # of a new observation in the running mean

    def of(self, path: str) -> float:
        return self.measured.get(path) or self.memcpy * _PRIOR_SHARE[path]

    def observe(self, path: str, nbytes: int, seconds: float) -> None:
        if path not in PATHS or nbytes <= 0 or seconds <= 0:
            return
        bw = nbytes / seconds
        old = self.measured.get(path)
        self.measured[path] = bw if old is None else (1 - self.weight) * old + self.weight * bw

    def estimate_s(self, path: str, nbytes: int) -> float:
        return _FIXED_S[path] + nbytes / self.of(path)

    def restore_s(self, state: str, nbytes: int, has_active_peer: bool = False) -> float:
        """The estimated seconds of the fastest way back from `state` (choose's pick)."""
        return min(self.estimate_s(p, nbytes) for p in options_for(state, has_active_peer))


def choose(options: list[str], nbytes: int, bw: Bandwidths) -> str:
    """The path of `options` with the least estimated time (ties: the order given)."""
    if not options:
        raise ValueError("no restore path to choose from")
    return min(options, key=lambda p: bw.estimate_s(p, nbytes))


def options_for(state: str, has_active_peer: bool) -> list[str]:
    """Paths open to an instance in `state` ("warm" | "cold" | "unloaded")."""
    out = ["d2d"] if has_active_peer else []
    if state == "warm":
        out.append("h2d")
    else:
        out.append("checkpoint")
    return out
