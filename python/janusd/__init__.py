"""janusd: multi-LLM serving with a dense steady pool and an elastic P/D pool.

The compiled core is `janusd._native` (Rust, PyO3); everything a user imports is
re-exported from the rooms listed in DESIGN.md.
"""

__version__ = "0.1.0"
