"""The steady pool as bins: device loads, what fits, and the imbalance potential Phi.

One data structure and its arithmetic, no policy (placement.py decides). A bin is one
device with capacity 1.0 in each of the three dimensions (oracle/types.py
RESOURCE_DIMS). Loads are numpy rows so that "where does this vector fit, and at what
change of Phi" is one vectorised expression over all devices: at 768 devices a Python
loop per candidate would cost the slow loop its period.

Phi(x) = || x - mean(x) * 1 ||^2 (PAPER.md §4). Phi of the leftover 1 - x equals Phi of x
(centring removes the constant), so "keeps the leftover balanced" and "keeps the load
balanced" are the same number.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

import numpy as np

from janusd.oracle.types import RESOURCE_DIMS

# Sums of vectors are compared with 1.0 + FIT_EPS: float rounding of a sum of fractions
# (0.1 + 0.2 + 0.7) must not make an exact fill infeasible.
FIT_EPS = 1e-9
_NO_KEYS: frozenset[str] = frozenset()
# Scores within TIE_EPS of the best are a tie (broken by the lower device id): float
# rounding of mathematically equal Phi changes must not pick the device.
TIE_EPS = 1e-12


def phi(load: np.ndarray) -> np.ndarray:
    """Imbalance potential of each row of an (..., 3) array: sum x^2 - (sum x)^2 / 3, the
    same number as the centred form, in fewer array passes (this runs per candidate)."""
    s = load.sum(axis=-1)
    return np.maximum((load * load).sum(axis=-1) - s * s / 3.0, 0.0)


def fits(load: np.ndarray) -> np.ndarray:
    """Whether each row of an (..., 3) array is within one device in every dimension."""
    return np.asarray((load <= 1.0 + FIT_EPS).all(axis=-1))


def worst_dim(load: np.ndarray) -> tuple[str, float]:
    """The most loaded dimension of one row and its value (for reasons)."""
    k = int(np.argmax(load))
    return RESOURCE_DIMS[k], float(load[k])


class Bins:
    """Loads of a fixed, sorted list of devices and the keys on each.

    `allowed[i]` says whether managed items may go to device i (it is in the pool);
    devices outside the pool appear only because pinned items sit on them. `count[i]`
    counts every item on device i, pinned ones included: a device is open (used) when
    it is positive.

    The keys per device are copied on write: placement tries several packings on copies
    of the same bins (placement_batch.py), and copying 768 sets per trial was a tenth of
    the simulator's controller time; a copy shares every device's key set until one side
    changes that device (`_own` holds the sets this Bins made itself since its last copy).
    """

    def __init__(self, devices: list[int], allowed: list[bool], reluctant: list[bool] | None = None) -> None:
        self.ids = np.asarray(devices, dtype=np.int64)
        self.index = dict(zip(devices, range(len(devices))))
        self.allowed = np.asarray(allowed, dtype=bool)
        # opened only when no other empty device fits (elastic instances hold them)
        self.reluctant = np.zeros(len(devices), dtype=bool) if reluctant is None else np.asarray(reluctant, dtype=bool)
        self.load = np.zeros((len(devices), 3))
        self.count = np.zeros(len(devices), dtype=np.int64)
        self.keys: list[AbstractSet[str]] = [_NO_KEYS] * len(devices)
        self._own: dict[int, set[str]] = {}  # device index -> its key set, made by this Bins

    def copy(self) -> Bins:
        other = Bins.__new__(Bins)
        other.ids, other.index, other.allowed, other.reluctant = self.ids, self.index, self.allowed, self.reluctant
        other.load = self.load.copy()
        other.count = self.count.copy()
        other.keys = list(self.keys)
        other._own = {}
        self._own = {}  # the sets are shared now: the next change of either side copies
        return other

    def _keys_of(self, i: int) -> set[str]:
        s = self._own.get(i)
        if s is None:
            s = self._own[i] = set(self.keys[i])
            self.keys[i] = s
        return s

    def add(self, i: int, key: str, v: np.ndarray) -> None:
        self.load[i] += v
        self.count[i] += 1
        self._keys_of(i).add(key)

    def remove(self, i: int, key: str, v: np.ndarray) -> None:
        self.load[i] -= v
        self.count[i] -= 1
        self._keys_of(i).discard(key)
        if self.count[i] == 0:
            self.load[i] = 0.0  # no float residue on an empty device

    def open(self) -> np.ndarray:
        return self.count > 0

    def best(self, v: np.ndarray, exclude: np.ndarray | None = None, may_open: bool = True,
             rule: str = "phi") -> int | None:
        """The device for vector v: among open allowed devices where it fits, the one
        whose Phi changes least (rule "phi", PAPER.md §4) or that ends fullest (rule
        "fill": largest summed load, the classic best fit), lowest id on a tie (within
        TIE_EPS); else, if
        `may_open`, the lowest-id empty allowed device (a reluctant one only when no
        other fits); else None. `exclude` masks
        devices out."""
        after = self.load + v
        lim = 1.0 + FIT_EPS
        ok = self.allowed & (after[:, 0] <= lim) & (after[:, 1] <= lim) & (after[:, 2] <= lim)
        if exclude is not None:
            ok &= ~exclude
        used = ok & (self.count > 0)
        idx = np.flatnonzero(used)
        if idx.size:
            if rule == "phi":
                delta = phi(after[idx]) - phi(self.load[idx])
            else:
                delta = -after[idx].sum(axis=-1)
            return int(idx[np.flatnonzero(delta <= delta.min() + TIE_EPS)[0]])
        if may_open:
            empty = ok & ~self.open()
            first = np.flatnonzero(empty & ~self.reluctant)
            if first.size:
                return int(first[0])
            empty_idx = np.flatnonzero(empty)
            if empty_idx.size:
                return int(empty_idx[0])
        return None
