"""Shared pytest setup: hypothesis profiles chosen by HYPOTHESIS_PROFILE (dev|ci)."""

import os

# `make test` runs two pytest processes on a two-core machine (pytest-xdist): BLAS and
# OpenMP pools of one thread each, in them and in the processes they start, or the GP
# fits of the oracle tests ran 2-3x slower, four threads fighting over two cores. Set
# before numpy and torch are imported (this file is read first).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
