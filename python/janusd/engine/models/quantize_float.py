"""Float weights quantized at load into the blocks our cpu kernels multiply (qkernel.py):
`dtype = "int8"` (GGUF Q8_0 blocks: 32 weights, one float16 scale, symmetric) and `dtype =
"int4"` (Q4_1 blocks: 32 weights, float16 scale and minimum) for an HF float checkpoint.

Why blocks and not torchao's per-channel int8: the kernels, the fork, the host image and
the Warm copy already move and multiply these blocks, and a 32-wide scale loses less than
one per row. The rounding is llama.cpp's (gguf.quants), so an `int8` model holds the same
weights a `convert_hf_to_gguf --outtype q8_0` file would; the reference its greedy output
must equal is the float32 model of those dequantized weights (tests/test_engine_int_weights.py).

A weight already stored quantized (a GGUF) keeps its own blocks; only float tensors are
quantized here. The LM head / embedding of `int4` is Q8_0, as llama.cpp's Q4 files keep it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FLOAT_STORED = ("float32", "float16", "bfloat16")
# config dtype -> (the linears' block format, the embedding / LM head's)
QUANTIZING = {"int8": ("q8_0", "q8_0"), "int4": ("q4_1", "q8_0")}


def target(dtype_name: str, stored: str, head: bool) -> str:
    """The format a tensor stored as `stored` is kept in under `dtype_name`: a float one
    quantized as the dtype says, anything else as it is."""
    formats = QUANTIZING.get(dtype_name)
    if formats is None or stored not in FLOAT_STORED:
        return stored
    return formats[1] if head else formats[0]


def q8_blocks(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float [N, K] -> (qs [N, K] int8, d [N, K/32] float16), as q8.decode_blocks gives a file's."""
    import gguf
    from gguf.quants import quantize

    from janusd.engine.models.q8 import decode_blocks

    return decode_blocks(quantize(np.ascontiguousarray(w, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0))


def q4_blocks(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, Any]:
    """float [N, K] -> Q4_1 (nibbles [N, K] uint8, d, m [N, K/32] float32), as qlinear.decode_blocks."""
    import gguf
    from gguf.quants import quantize

    from janusd.engine.models.qlinear import decode_blocks

    return decode_blocks(quantize(np.ascontiguousarray(w, dtype=np.float32), gguf.GGMLQuantizationType.Q4_1), "q4_1")
