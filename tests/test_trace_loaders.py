"""Loaders of the public traces, on small excerpts in tests/data (provenance in its README)."""

import argparse
import csv
import functools
import json
from pathlib import Path

import numpy as np
import pytest

from janusd import trace_cli
from janusd.trace.azure import load_azure
from janusd.trace.formats import TraceError, read_trace
from janusd.trace.servegen import load_servegen

DATA = Path(__file__).parent / "data"
AZ = [DATA / "azure_llm_2023" / f"AzureLLMInferenceTrace_{a}.csv" for a in ("code", "conv")]
SG = DATA / "servegen" / "rates_language_m-large.csv"


def test_azure_two_services_on_one_time_axis():
    t = load_azure(AZ)
    assert len(t) == 300
    assert t.apps == ("code", "conv") and t.models == ("azure-code", "azure-conv")
    assert np.all(np.diff(t.arrival_s) >= 0)
    names = t.app_names()
    # conv starts first (18:15:46.6805900); code's first row is 18:17:03.9799600, 4808 in, 10 out
    assert names[0] == "conv" and t.arrival_s[0] == 0.0 and t.input_tokens[0] == 374
    code = np.flatnonzero(names == "code")
    assert t.arrival_s[code[0]] == pytest.approx(77.299370, abs=1e-6)
    assert (t.input_tokens[code[0]], t.output_tokens[code[0]]) == (4808, 10)
    assert (names == "code").sum() == 150


def test_azure_bad_row_has_line_number(tmp_path):
    p = tmp_path / "AzureLLMInferenceTrace_code.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n16/11/2023,1,1\n")
    with pytest.raises(TraceError, match=r"AzureLLMInferenceTrace_code.csv:3: TIMESTAMP '16/11/2023'"):
        load_azure([p])
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,0,10\n")
    with pytest.raises(TraceError, match=r":2: token counts must be >= 1"):
        load_azure([p])


def _rates():
    with open(SG) as f:
        return [(int(r["client_id"]), float(r["window_start_s"]), float(r["rate_rps"])) for r in csv.DictReader(f)]


def _quantiles(client, field):
    with open(DATA / "servegen" / "lengths_language_m-large.csv") as f:
        for r in csv.DictReader(f):
            if int(r["client_id"]) == client and r["field"] == field:
                return float(r["q0"]), float(r["q100"])
    return None


def test_servegen_rates_and_lengths_are_kept():
    t = load_servegen(SG, start_s=0, duration_s=1800, seed=3)
    assert t.models == ("m-large",)
    names = t.app_names()
    win = (t.arrival_s // 600).astype(int)
    for client, w0, rate in _rates():
        got = int(((names == f"m-large-c{client:02d}") & (win == int(w0 // 600))).sum())
        assert abs(got - rate * 600) < 1.0, (client, w0, got, rate * 600)
    for client in (0, 3, 20):
        sel = names == f"m-large-c{client:02d}"
        lo, hi = _quantiles(client, "input_tokens")
        assert lo - 0.5 <= t.input_tokens[sel].min() and t.input_tokens[sel].max() <= hi + 0.5
        lo, hi = _quantiles(client, "output_tokens")
        assert max(lo, 1) - 0.5 <= t.output_tokens[sel].min() and t.output_tokens[sel].max() <= hi + 0.5
    # client 25 has rates but no lengths: it gets the pooled distribution, still within the pooled range
    sel = names == "m-large-c25"
    assert sel.sum() > 0 and t.input_tokens[sel].max() <= max(_quantiles(c, "input_tokens")[1] for c in (0, 3, 4, 5, 7, 10, 20))


def test_servegen_is_deterministic_and_scales():
    a = load_servegen(SG, duration_s=1800, seed=1)
    b = load_servegen(SG, duration_s=1800, seed=1)
    c = load_servegen(SG, duration_s=1800, seed=2)
    assert a.arrival_s.tolist() == b.arrival_s.tolist() and a.input_tokens.tolist() == b.input_tokens.tolist()
    assert a.arrival_s.tolist() != c.arrival_s.tolist()
    half = load_servegen(SG, duration_s=1800, seed=1, rate_scale=0.5)
    assert abs(len(half) - len(a) / 2) < 15
    with pytest.raises(ValueError, match="lower --rate-scale"):
        load_servegen(SG, duration_s=1800, max_requests=1000)


def test_servegen_bad_row(tmp_path):
    p = tmp_path / "rates_language_x.csv"
    p.write_text(SG.read_text().splitlines()[0] + "\n0,0,1.0,1.0,Lognormal,1.0,1.0\n")
    (tmp_path / "lengths_language_x.csv").write_text((DATA / "servegen" / "lengths_language_m-large.csv").read_text())
    with pytest.raises(TraceError, match=r"rates_language_x.csv:2: iat_dist must be Gamma or Weibull"):
        load_servegen(p)


def _cli(*argv):
    parser = argparse.ArgumentParser()
    trace_cli.add_arguments(parser)
    return trace_cli.run(parser.parse_args(list(argv)))


def test_convert_cli_writes_canonical_traces(tmp_path, capsys):
    assert _cli("convert", "--format", "azure", *map(str, AZ), "--out", str(tmp_path / "az.csv")) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["requests"] == 300 and stats["apps"] == 2
    assert len(read_trace(tmp_path / "az.csv")) == 300
    assert _cli("convert", "--format", "servegen", str(SG), "--duration", "30m", "--out", str(tmp_path / "sg.jsonl")) == 0
    assert read_trace(tmp_path / "sg.jsonl").models == ("m-large",)
    assert _cli("convert", "--format", "azure", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "x.csv")) == 2
    assert "missing.csv: no such file" in capsys.readouterr().err


# The other ServeGen models, cut like m-large (tests/data/README.md): their first 1800 s.
SG_MORE = {name: DATA / "servegen" / f"rates_{name}.csv" for name in
           ("language_m-mid", "language_m-small", "reason_deepseek-r1", "multimodal_mm-image")}  # fmt: skip


@functools.cache
def _load_more(name):
    """The excerpt's whole 1800 s (m-small alone is ~115 k requests: load each once)."""
    return load_servegen(SG_MORE[name], duration_s=1800, seed=5)


@pytest.mark.parametrize("name", sorted(SG_MORE))
def test_servegen_excerpts_load_into_valid_traces(name):
    rates = SG_MORE[name]
    model = name.split("_", 1)[1]
    t = _load_more(name)
    t.validate(name)  # the canonical invariants, checked once more on the result
    assert t.models == (model,) and len(t) > 0
    assert np.all(np.diff(t.arrival_s) >= 0) and t.arrival_s.min() >= 0 and t.arrival_s.max() <= 1800
    assert t.input_tokens.min() >= 1 and t.output_tokens.min() >= 1
    # every (client, 600 s window) row of the excerpt keeps its rate: rate x 600, stochastically
    # rounded (< 1 off). Arrivals are rounded to 1 us, which can move one within 0.5 us of a window's
    # end to the next window (very bursty fits, Gamma shape ~0.03, put several there): those are
    # allowed per window, and the client's total over its windows must hold regardless.
    names = t.app_names()
    win = (t.arrival_s // 600).astype(int)
    edge = np.abs(t.arrival_s - np.round(t.arrival_s / 600) * 600) < 1e-6
    want: dict[int, list[float]] = {}
    with open(rates) as f:
        for r in csv.DictReader(f):
            c, w, rate = int(r["client_id"]), int(float(r["window_start_s"]) // 600), float(r["rate_rps"])
            mine = names == f"{model}-c{c:02d}"
            got = int((mine & (win == w)).sum())
            assert abs(got - rate * 600) < 1.0 + int((mine & edge).sum()), (c, w, got, rate * 600)
            want.setdefault(c, []).append(rate * 600)
    for c, counts in want.items():
        got = int((names == f"{model}-c{c:02d}").sum())
        assert abs(got - sum(counts)) < len(counts), (c, got, counts)
    assert sum(int((names == f"{model}-c{c:02d}").sum()) for c in want) == len(t)  # no other client


def test_servegen_excerpt_rows_parse_to_the_source_values():
    """Values hand-checked against /work/shared/traces/servegen/*.csv.gz (the rows are verbatim copies)."""
    from janusd.trace.servegen import _read_lengths, _read_rates

    r1 = _read_rates(SG_MORE["reason_deepseek-r1"], 0, 1800)
    assert r1[0] == (1, 0.0, 0.105, "Gamma", 1.1681033415865265, 8.05582170861377)
    assert (17, 600.0, 0.025, "Gamma", 0.13322190313501373, 175.74598276243606) in r1
    assert (19, 0.0, 0.2916666666666667, "Weibull", 0.4673289971941366, 3.352302712729438) in r1
    mid = _read_rates(SG_MORE["language_m-mid"], 0, 1800)
    assert (14, 600.0, 26.81833333333333, "Gamma", 0.10112685075319137, 0.3686513201209448) in mid
    assert _read_rates(SG_MORE["language_m-mid"], 600, 1200) == [r for r in mid if r[1] == 600.0]
    small = _read_rates(SG_MORE["language_m-small"], 0, 1800)
    assert (7, 0.0, 0.021666666666666667, "Gamma", 0.5118708482829514, 59.61497272722542) in small
    q = _read_lengths(DATA / "servegen" / "lengths_reason_deepseek-r1.csv")
    assert len(q) == 8 * 3 and q[(1, 0, "input_tokens")][[0, 1, 2, 50, 100]].tolist() == [39, 50, 62, 170, 402]
    assert q[(5, 0, "reason_ratio")][[0, 50, 100]].tolist() == [0.1317, 0.6287, 0.998]
    q = _read_lengths(DATA / "servegen" / "lengths_language_m-small.csv")
    assert q[(12, 0, "output_tokens")][[0, 50, 51, 100]].tolist() == [1, 1, 1, 288]
    q = _read_lengths(DATA / "servegen" / "lengths_multimodal_mm-image.csv")
    assert len(q) == 7 * 8 and set(q[(5, 0, "image_tokens")].tolist()) == {1196.0}
    assert q[(10, 0, "image_count")][[0, 50, 100]].tolist() == [1, 2, 49]


def _client(t, app):
    sel = t.app_names() == app
    assert sel.sum() > 0, app
    return t.input_tokens[sel], t.output_tokens[sel]


def test_servegen_multimodal_input_is_text_plus_counted_items():
    """mm-image has no input_tokens: input = text + image_count x image_tokens (+ audio, video)."""
    t = _load_more("multimodal_mm-image")
    # client 5 (window 0): text_tokens 90..94, image_tokens always 1196, image_count always 1
    inp, out = _client(t, "mm-image-c05")
    assert inp.min() >= 90 + 1196 and inp.max() <= 94 + 1196 and 6 <= out.min() and out.max() <= 252
    # client 3: text always 35, image_tokens 96..280, one image
    inp, _ = _client(t, "mm-image-c03")
    assert inp.min() >= 35 + 96 and inp.max() <= 35 + 280
    # client 10: text <= 4242, image_tokens <= 1280, image_count 1..49 (median 2): above 4242 + 1280
    # only when the count multiplies; the largest possible is 4242 + 49 x 1280
    inp, _ = _client(t, "mm-image-c10")
    assert inp.max() > 4242 + 1280 and inp.max() <= 4242 + 49 * 1280 and inp.min() >= 974 + 4


def test_servegen_language_lengths_and_missing_clients():
    mid = _load_more("language_m-mid")
    inp, out = _client(mid, "m-mid-c14")  # input quantiles 182..279, output 1..107
    assert inp.min() >= 182 and inp.max() <= 279 and out.max() <= 107
    # clients 2, 3 and 7 have rates but no lengths (too large upstream): pooled window-0 quantiles
    for c in ("02", "03", "07"):
        inp, out = _client(mid, f"m-mid-c{c}")
        assert inp.max() <= 16512 and out.max() <= 8193  # the largest q100 of the pooled clients
    small = _load_more("language_m-small")
    # client 12's output quantiles: q0..q97 = 1, q98 = q99 = 8, q100 = 288; interpolating u x 100 and
    # rounding gives 1 for u < 0.97 + 0.5 / 7 / 100 and <= 8 for u < 0.99 + 0.5 / 280 / 100
    _, out = _client(small, "m-small-c12")
    assert len(out) > 100_000 and out.max() <= 288
    assert (out == 1).mean() == pytest.approx(0.97 + 0.5 / 700, abs=0.003)
    assert (out <= 8).mean() == pytest.approx(0.99 + 0.5 / 28000, abs=0.002)
    r1 = _load_more("reason_deepseek-r1")
    sel = r1.app_names() == "deepseek-r1-c17"  # one window, 600..1200 s, 0.025 req/s: exactly 15 requests
    assert sel.sum() == 15 and np.all((r1.arrival_s[sel] >= 600) & (r1.arrival_s[sel] < 1200))


@pytest.mark.parametrize("name", sorted(SG_MORE))
def test_servegen_excerpt_with_a_bad_row_names_its_line(tmp_path, name):
    rates_src, lengths_src = SG_MORE[name], DATA / "servegen" / f"lengths_{name}.csv"
    rates = rates_src.read_text().splitlines()
    lengths = lengths_src.read_text().splitlines()
    (tmp_path / rates_src.name).write_text("\n".join(rates) + "\n")
    bad = lengths[3].split(",")
    bad[3], bad[103] = bad[103], "0" if bad[103] != "0" else "-1"  # q0 > q100 (or q100 < q0 = 0)
    lengths[3] = ",".join(bad)
    (tmp_path / lengths_src.name).write_text("\n".join(lengths) + "\n")
    with pytest.raises(TraceError, match=rf"lengths_{name}.csv:4: quantiles must be finite and non-decreasing"):
        load_servegen(tmp_path / rates_src.name)
    (tmp_path / lengths_src.name).write_text(lengths_src.read_text())
    cells = rates[5].split(",")
    cells[2] = "-0.5"
    rates[5] = ",".join(cells)
    (tmp_path / rates_src.name).write_text("\n".join(rates) + "\n")
    with pytest.raises(TraceError, match=rf"rates_{name}.csv:6: need rate_rps >= 0"):
        load_servegen(tmp_path / rates_src.name)


def test_azure_corrupt_gzip_is_a_trace_error(tmp_path):
    import gzip

    data = bytearray(gzip.compress(AZ[0].read_bytes() * 20))
    for i in range(30, 60):
        data[i] ^= 0xFF
    p = tmp_path / "AzureLLMInferenceTrace_code.csv.gz"
    p.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="AzureLLMInferenceTrace_code.csv.gz: broken gzip file"):
        load_azure([p])
