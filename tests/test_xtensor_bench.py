"""`janus bench xtensor` at a small size: the headline keys, real measured values."""

from __future__ import annotations

import argparse

import pytest

from janusd.bench import xtensor


def test_bench_reports_the_seven_headline_figures(capsys) -> None:  # type: ignore[no-untyped-def]
    p = argparse.ArgumentParser()
    xtensor.add_arguments(p)
    args = p.parse_args(
        ["--map-pages", "16", "--map-rounds", "3", "--book-pages", "4096", "--book-ops", "20000",
         "--churn-pages", "4096", "--churn-ops", "20000"]
    )
    out = xtensor.run(args)
    assert list(out)[:7] == [
        "map_us_per_page", "unmap_us_per_page", "raw_map_us_per_page", "raw_unmap_us_per_page",
        "bookkeeping_ns_per_op", "fragmentation_mean_pct", "fragmentation_max_pct",
    ]
    assert all(out[k] > 0 for k in list(out)[:5])
    assert 0 <= out["fragmentation_mean_pct"] <= out["fragmentation_max_pct"] <= 100
    # Touched pages (every 4 KiB written after mapping, both sides) and the ratios.
    for prefix in ("", "touched_"):
        for op in ("map", "unmap"):
            ours, raw = out[f"{prefix}{op}_us_per_page"], out[f"raw_{prefix}{op}_us_per_page"]
            assert ours > 0 and raw > 0
            assert out[f"{prefix}{op}_ratio"] == pytest.approx(ours / raw, rel=0.01, abs=0.002)
    # Faulting in 512 OS pages costs far more than one mmap call, on both sides.
    assert out["raw_touched_map_us_per_page"] > out["raw_map_us_per_page"]
    assert out["bookkeeping_wall_ns_per_op"] > 0
    assert '"churn_ops": 20000' in capsys.readouterr().err


def test_bad_arguments_are_usage_errors_not_tracebacks(capsys) -> None:  # type: ignore[no-untyped-def]
    p = argparse.ArgumentParser()
    xtensor.add_arguments(p)
    for bad, why in (
        (["--map-pages", "0"], "must be >= 1"), (["--churn-ops", "-5"], "must be >= 1"),
        (["--page-size", "12288"], "power of two"), (["--page-size", "x"], "expected an integer"),
        (["--churn-pages", "10"], "must be >= 1024"),  # too small to load any model: 0% would be fake
    ):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            p.parse_args(bad)
        assert e.value.code == 2
        assert why in capsys.readouterr().err
