"""Typed stub of `janusd._native`, the PyO3 binding of rust/janus-core.

Checked against the built extension by `make lint` (mypy.stubtest).
"""

__version__: str

# ---- dispatch (rust/janus-core/src/dispatch, rust/janus-py/src/dispatch.rs) ----

# ---- xtensor (rust/janus-core/src/xtensor, rust/janus-py/src/xtensor.rs) ----
