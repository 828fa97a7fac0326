"""Loaders of the public traces, on small excerpts in tests/data (provenance in its README)."""

import argparse
import csv
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


def test_servegen_multimodal_input_is_text_plus_counted_items(tmp_path):
    (tmp_path / "rates_multimodal_mm-x.csv").write_text(
        "client_id,window_start_s,rate_rps,cv,iat_dist,iat_p1,iat_p2\n0,0,0.5,1.0,Gamma,1.0,2.0\n"
    )
    header = "client_id,window_start_s,field," + ",".join(f"q{k}" for k in range(101))
    const = {"text_tokens": 100, "image_tokens": 50, "image_count": 2, "audio_tokens": 7, "audio_count": 0, "output_tokens": 9}
    rows = [f"0,0,{f}," + ",".join([str(v)] * 101) for f, v in const.items()]
    (tmp_path / "lengths_multimodal_mm-x.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    t = load_servegen(tmp_path / "rates_multimodal_mm-x.csv", duration_s=600)
    assert len(t) == 300 and t.apps == ("mm-x-c0",)
    assert set(t.input_tokens.tolist()) == {100 + 2 * 50} and set(t.output_tokens.tolist()) == {9}


def test_azure_corrupt_gzip_is_a_trace_error(tmp_path):
    import gzip

    data = bytearray(gzip.compress(AZ[0].read_bytes() * 20))
    for i in range(30, 60):
        data[i] ^= 0xFF
    p = tmp_path / "AzureLLMInferenceTrace_code.csv.gz"
    p.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="AzureLLMInferenceTrace_code.csv.gz: broken gzip file"):
        load_azure([p])
