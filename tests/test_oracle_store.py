"""Oracle persistence (JSON + npz) and the points format: exact round trips, clear refusals."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from janusd.oracle import store
from janusd.oracle.dataset import DatasetError, Points, read_points, write_points
from janusd.oracle.elasticity import INPUT_SETS, LINKED, ElasticityModel
from janusd.oracle.fit import fit_points
from janusd.oracle.oracle import Oracle
from janusd.oracle.prior import RooflinePrior
from janusd.oracle.types import LoadFeatures
from janusd.hw import ModelSpec, device_spec

SPEC = ModelSpec.from_config({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512})
LOG = logging.getLogger("test-oracle-store")


def points(n: int = 30, seed: int = 0) -> Points:
    rng = np.random.default_rng(seed)
    rate = rng.uniform(1, 10, n)
    lin, lout = rng.uniform(20, 200, n), rng.uniform(10, 100, n)
    f = np.stack([rate, rate * lin, rate * lout, lin, 25.0 * np.ones(n), lout, 9.0 * np.ones(n)], axis=1)
    m = rng.integers(1, 3, n)
    res = np.stack([0.1 + 0.001 * rate / m, 0.01 * rate / m, 0.02 * rate / m], axis=1)
    att = np.clip(1.1 - 0.08 * rate / m, 0, 1)
    # the engine's counters (dataset.py ENGINE_COLUMNS) on every other row, from a known step time
    wall = np.full(n, 30.0)
    dec = rate * lout * wall
    steps = dec / (1.0 + 0.5 * rate / m)
    fwd = steps * 4e-4 + dec * (5e-4 + 2e-6 * (lin + lout / 2))
    engine = np.stack([steps, dec, fwd, wall], axis=1)
    engine[1::2] = np.nan
    return Points({"model": "demo/a:1", "source": "test"}, f, m, res, att, np.arange(n) // 2, engine)


PRIOR = RooflinePrior(SPEC, device_spec("h100"), 1.0, 0.05)


@pytest.fixture(scope="module")
def fitted():
    p = points()
    return p, *fit_points(p, prior=PRIOR)


def test_points_file_round_trips_and_refuses_foreign_or_corrupt_files(tmp_path):
    p = points()
    write_points(tmp_path / "p.npz", p)
    q = read_points(tmp_path / "p.npz")
    for k in ("features", "instances", "resources", "attainment", "point_id"):
        assert np.array_equal(getattr(p, k), getattr(q, k))
    assert np.array_equal(p.engine, q.engine, equal_nan=True) and np.isnan(q.engine[1::2]).all()
    assert q.header["format"] == "janusd-oracle-points" and q.header["source"] == "test" and q.header["version"] == 2
    # a version 1 file (no engine array) reads, its rows without counters; a version 2 file without one is refused
    v1 = {k: getattr(p, k) for k in ("features", "instances", "resources", "attainment", "point_id")}
    for version, ok in ((1, True), (2, False)):
        head = json.dumps({**p.header, "format": "janusd-oracle-points", "version": version}).encode()
        np.savez(tmp_path / f"v{version}.npz", header=np.frombuffer(head, dtype=np.uint8), **v1)
        if ok:
            old = read_points(tmp_path / f"v{version}.npz")
            assert np.isnan(old.engine).all() and old.engine.shape == (len(p), 4)
        else:
            with pytest.raises(DatasetError, match=r"v2.npz: missing arrays \['engine'\]"):
                read_points(tmp_path / f"v{version}.npz")
    neg = p.engine.copy()
    neg[0, 2] = -1.0
    with pytest.raises(DatasetError, match="engine counters must be NaN"):
        write_points(tmp_path / "x.npz", Points(p.header, p.features, p.instances, p.resources, p.attainment,
                                                p.point_id, neg))
    (tmp_path / "bad.npz").write_bytes(b"garbage")
    with pytest.raises(DatasetError, match="bad.npz: not a readable npz"):
        read_points(tmp_path / "bad.npz")
    np.savez(tmp_path / "other.npz", x=np.ones(3))
    with pytest.raises(DatasetError, match="other.npz: no header"):
        read_points(tmp_path / "other.npz")
    with pytest.raises(DatasetError, match="missing.npz: cannot read"):
        read_points(tmp_path / "missing.npz")
    bad = Points(p.header, p.features, p.instances, p.resources, p.attainment + 2, p.point_id)
    with pytest.raises(DatasetError, match="attainment in"):
        write_points(tmp_path / "x.npz", bad)


def test_store_round_trips_predictions_exactly(tmp_path, fitted):
    p, cap, ela = fitted
    store.save(tmp_path, "demo/a:1", p, cap, ela, SPEC.identity(), "cpu", {"fitted_at": 12.5})
    with pytest.raises(store.StoreError, match="corrects the roofline prior, and no prior was given"):
        store.load(tmp_path, "demo/a:1", SPEC.identity())
    q, cap2, ela2, header = store.load(tmp_path, "demo/a:1", SPEC.identity(), PRIOR)
    assert header["info"]["fitted_at"] == 12.5 and len(q) == len(p)
    rng = np.random.default_rng(5)
    probe = np.abs(rng.normal(1, 0.5, (20, 7))) * [5, 500, 200, 50, 25, 30, 9]
    m = rng.integers(1, 4, 20)
    assert np.array_equal(cap.predict(probe)[0], cap2.predict(probe)[0])
    assert np.array_equal(cap.predict(probe)[1], cap2.predict(probe)[1])
    assert np.array_equal(ela.predict_rows(probe, m)[0], ela2.predict_rows(probe, m)[0])
    assert np.array_equal(ela.predict_rows(probe, m)[1], ela2.predict_rows(probe, m)[1])
    assert header["elasticity_inputs"] == ela.input_set == ela2.input_set
    # the bandwidth's step-rate mean (capacity.py) keeps its form and fitted factor exactly
    assert cap.bw_form == cap2.bw_form == header["capacity_bw"]["form"] == "step-rate"
    assert cap2.step_factor == cap.step_factor == header["capacity_bw"]["step_factor"]
    # ... and the step time it read off the points' engine counters (step_rate.fit_step_time), with them
    assert cap.step_time is not None and cap2.step_time == cap.step_time
    assert header["capacity_bw"]["step_time"] == cap.step_time.to_list()
    assert np.array_equal(q.engine, p.engine, equal_nan=True)
    # every input set (fit.choose_input_set picks one per fit) round-trips, the calibrated one with its
    # pressure link, and a foreign set or a broken link is refused
    for other in INPUT_SETS:
        ela_o = ElasticityModel.fit(p.features, p.instances, p.attainment, prior=PRIOR, input_set=other)
        store.save(tmp_path, "demo/a:1", p, cap, ela_o, SPEC.identity(), "cpu", {})
        ela_o2 = store.load(tmp_path, "demo/a:1", SPEC.identity(), PRIOR)[2]
        assert ela_o2.input_set == other
        for k in (0, 1):
            assert np.array_equal(ela_o.predict_rows(probe, m)[k], ela_o2.predict_rows(probe, m)[k])
        assert (ela_o2.link is None) == (other not in LINKED)
        if ela_o2.link is not None:
            assert ela_o2.link.to_state() == ela_o.link.to_state()
    jpath = tmp_path / "demo%2Fa%3A1.json"
    h = json.loads(jpath.read_text())
    assert h["elasticity_inputs"] == "interference" and h["elasticity_link"]["interference"] > 0
    jpath.write_text(json.dumps({**h, "elasticity_link": {"knee": 1.0, "slope": -2.0}}))
    with pytest.raises(store.StoreError, match="slope > 0"):
        store.load(tmp_path, "demo/a:1", SPEC.identity(), PRIOR)
    jpath.write_text(json.dumps({**h, "elasticity_link": {**h["elasticity_link"], "interference": 0.0}}))
    with pytest.raises(store.StoreError, match="or the 'interference' one"):
        store.load(tmp_path, "demo/a:1", SPEC.identity(), PRIOR)
    jpath.write_text(json.dumps({**h, "elasticity_link": None}))
    with pytest.raises(store.StoreError, match="pressure link goes with the 'calibrated' input set"):
        store.load(tmp_path, "demo/a:1", SPEC.identity(), PRIOR)
    for bad, why in (([1e-3, -2e-4, 0.0], "per_seq must be finite and >= 0"), ([1e-3], "expected null or 3 numbers")):
        jpath.write_text(json.dumps({**h, "capacity_bw": {**h["capacity_bw"], "step_time": bad}}))
        with pytest.raises(store.StoreError, match=why):
            store.load(tmp_path, "demo/a:1", SPEC.identity(), PRIOR)
    jpath.write_text(json.dumps({**h, "elasticity_inputs": "everything"}))
    with pytest.raises(store.StoreError, match="unknown elasticity input set 'everything'"):
        store.load(tmp_path, "demo/a:1", SPEC.identity(), PRIOR)


def test_missing_corrupt_or_foreign_store_leaves_the_logged_prior(tmp_path, fitted, caplog):
    p, cap, ela = fitted
    prior = PRIOR
    z = LoadFeatures(2, 200, 100, 100, 0, 50, 0)

    def install(name: str) -> tuple[str, Oracle]:
        o = Oracle()
        o.set_prior(name, prior)
        src, _ = store.load_into(o, tmp_path, name, SPEC.identity(), LOG)
        return src, o

    with caplog.at_level(logging.INFO, logger=LOG.name):
        src, o = install("m1")
    assert src == "prior" and o.capacity("m1", z).source == "prior"
    assert "m1.json: no stored oracle model; m1 uses the roofline prior" in caplog.text

    store.save(tmp_path, "m1", p, cap, ela, SPEC.identity(), "cpu", {})
    assert install("m1")[0] == "gp"
    assert install("m1")[1].attainment("m1", z, 1).source == "gp"

    (tmp_path / "m1.npz").write_bytes(b"\x00" * 100)  # corrupt arrays
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOG.name):
        src, o = install("m1")
    assert src == "prior" and o.attainment("m1", z, 1).source == "prior"
    assert "m1.npz: unreadable npz" in caplog.text and "m1 uses the roofline prior" in caplog.text

    store.save(tmp_path, "m1", p, cap, ela, SPEC.identity(), "cpu", {})
    (tmp_path / "m2.json").write_text((tmp_path / "m1.json").read_text())  # another model's file under m2
    (tmp_path / "m2.npz").write_bytes((tmp_path / "m1.npz").read_bytes())
    with pytest.raises(store.StoreError, match="m2.json: holds model 'm1', not 'm2'"):
        store.load(tmp_path, "m2")
    other = {**SPEC.identity(), "layers": 3}
    with pytest.raises(store.StoreError, match="m1.json: fitted for another shape"):
        store.load(tmp_path, "m1", other)
    (tmp_path / "m1.json").write_text("{")
    with pytest.raises(store.StoreError, match="m1.json: unreadable"):
        store.load(tmp_path, "m1")


def test_oracle_eval_prints_the_headline_json_last_and_refuses_bad_files(tmp_path, capsys):
    import json

    import msgspec

    from janusd.cli import main

    p = points(n=24, seed=3)
    p.header.update({"model": "demo/a:1", "model_spec": SPEC.identity(),
                     "device": msgspec.to_builtins(device_spec("h100")), "slo": {"ttft_ms": 1000.0, "tpot_ms": 50.0}})
    write_points(tmp_path / "p.npz", p)
    assert main(["oracle", "eval", "--data", str(tmp_path / "p.npz"), "--plot", str(tmp_path / "p.png"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(out)[:6] == ["attainment_abs_err_median_pts", "attainment_abs_err_p90_pts", "compute_rel_err_p90_pct",
                             "bw_rel_err_p90_pct", "hbm_rel_err_p90_pct", "prior_attainment_abs_err_p90_pts"]
    assert out["points"] == 24 and out["attainment_abs_err_p90_pts"] < 15  # a smooth synthetic surface
    assert (tmp_path / "p.png").stat().st_size > 10_000
    # rows come in pairs of one point_id: repeats, whose spread is the noise floor
    assert out["repeated_points"] == 12 and out["noise_attainment_abs_dev_p90_pts"] > 0
    assert out["prior_device_overheads"]["layer_overhead_s"] == device_spec("h100").layer_overhead_s
    # the checks below read no fold's fit: two folds keep them cheap (each fit is seconds)
    assert main(["oracle", "eval", "--data", str(tmp_path / "p.npz"), "--folds", "2",
                 "--prior-overheads", "0.002,0.0003,0"]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["prior_device_overheads"] == {"step_overhead_s": 0.002, "layer_overhead_s": 0.0003,
                                               "seq_overhead_s": 0.0, "prefill_token_overhead_s": 0.0}
    assert main(["oracle", "eval", "--data", str(tmp_path / "p.npz"), "--prior-overheads", "1,-2,0"]) == 2
    assert "--prior-overheads: need 3 or 4 finite seconds >= 0" in capsys.readouterr().err
    (tmp_path / "bad.npz").write_text("no")
    assert main(["oracle", "eval", "--data", str(tmp_path / "bad.npz")]) == 1
    assert "bad.npz: not a readable npz" in capsys.readouterr().err
    # a second run of the same model: the floor between the runs; a corrupt one is named
    assert main(["oracle", "eval", "--data", str(tmp_path / "p.npz"), "--folds", "2",
                 "--runs-of", str(tmp_path / "p.npz")]) == 0
    same = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert same["runs_matched_points"] == 12 and same["runs_bw_rel_dev_p90_pct"] == 0.0  # a file against itself
    assert main(["oracle", "eval", "--data", str(tmp_path / "p.npz"), "--runs-of", str(tmp_path / "bad.npz")]) == 1
    assert "--runs-of " in capsys.readouterr().err
