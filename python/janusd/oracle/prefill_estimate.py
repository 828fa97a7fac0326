"""Online prefill-time estimate for one (model, device): t(n) = a + b * n tokens.

Fitted by exponentially weighted least squares over observed (prompt tokens, prefill_s)
pairs from the engine (StepOutput.prefill_s), so it follows the device as load and
co-located models change. Before two distinct prompt lengths were seen it scales the
prior slope through the mean; before any observation it returns the prior. Pure: no
clock, no I/O. The dispatcher uses these numbers as p_j in LST-IMH (PAPER.md §6).
"""

from __future__ import annotations


class PrefillEstimator:
    def __init__(self, prior_a_s: float = 0.01, prior_b_s: float = 0.0005, decay: float = 0.98) -> None:
        if not (0.0 < decay <= 1.0):
            raise ValueError(f"decay: must be in (0, 1], got {decay}")
        if prior_a_s < 0 or prior_b_s < 0:
            raise ValueError("prior_a_s, prior_b_s: must be >= 0")
        self.prior_a = prior_a_s
        self.prior_b = prior_b_s
        self.decay = decay
        self.n = 0
        self._w = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._fit: tuple[float, float] | None = None  # coefficients() until the next observe

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens < 0 or not (seconds >= 0.0) or seconds == float("inf"):
            raise ValueError(f"bad observation: tokens={tokens}, seconds={seconds}")
        d = self.decay
        self._w = self._w * d + 1.0
        self._sx = self._sx * d + tokens
        self._sy = self._sy * d + seconds
        self._sxx = self._sxx * d + tokens * tokens
        self._sxy = self._sxy * d + tokens * seconds
        self.n += 1
        self._fit = None

    def coefficients(self) -> tuple[float, float]:
        """(a, b) of the current fit, both clamped to >= 0 (kept until the next
        observation: the dispatcher asks for every request, observations come per prefill)."""
        if self._fit is None:
            self._fit = self._coefficients()
        return self._fit

    def _coefficients(self) -> tuple[float, float]:
        if self.n == 0:
            return self.prior_a, self.prior_b
        mx, my = self._sx / self._w, self._sy / self._w
        var = self._sxx / self._w - mx * mx
        if var <= 1e-9 * max(1.0, mx * mx):
            # one prompt length so far: keep the prior's split between a and b
            prior = self.prior_a + self.prior_b * mx
            scale = my / prior if prior > 0 else 1.0
            return self.prior_a * scale, self.prior_b * scale
        b = (self._sxy / self._w - mx * my) / var
        b = max(b, 0.0)
        a = max(my - b * mx, 0.0)
        return a, b

    def estimate(self, tokens: int) -> float:
        a, b = self.coefficients()
        return a + b * max(tokens, 0)
