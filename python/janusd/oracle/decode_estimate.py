"""Online decode step-time estimate of one device: seconds per output token when n
sequences decode there, t(n) = a + b * n.

Fitted from the gaps between a request's consecutive tokens (what per-token SLOs see),
paired with how many sequences were decoding on the device then, so it takes in every
slowdown the device really has: batching, co-located models' steps, prefill chunks mixed
into decode steps. The dispatcher uses it to keep new prefill work off an instance whose
device would then decode slower than the model's TPOT SLO (PAPER.md §6 counts tokens
late after the first, not only TTFT). Same exponentially weighted least squares as the
prefill fit; pure.
"""

from __future__ import annotations

from janusd.oracle.prefill_estimate import PrefillEstimator


class DecodeStepEstimator(PrefillEstimator):
    def __init__(self, prior_a_s: float = 0.01, prior_b_s: float = 0.001, decay: float = 0.99) -> None:
        super().__init__(prior_a_s, prior_b_s, decay)

    def step_s(self, sequences: int) -> float:
        """Estimated seconds between two tokens of one sequence with `sequences` decoding."""
        return self.estimate(sequences)
