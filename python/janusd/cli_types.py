"""argparse types the command lines share: a bad number is refused with the option named
(argparse prefixes it) and the value shown, never read as 0 or as a default."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive_number(text: str) -> float:
    """A float > 0 (intervals and timeouts: 0 would spin, or make a socket non-blocking)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def whole_number(least: int) -> Callable[[str], int]:
    """An int >= `least` (counts, sizes)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if v < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {text}")
        return v

    return parse
