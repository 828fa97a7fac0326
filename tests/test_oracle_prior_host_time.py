"""oracle/prior.py's capacity on a cpu device counts the engine's host time per step in the
compute share ([W]: two bursty demo models were packed on one cpu device as if free,
"Phi 0.0001"); on an accelerator it does not (the host overlaps other workers' kernels).
Figures: the demo small model and the host times this machine's step probe measured."""

from __future__ import annotations

import math

import msgspec

from janusd.engine.checkpoint.demo import demo_arch
from janusd.hw.devices import PRESETS
from janusd.hw.model_spec import ModelSpec
from janusd.hw.spec import DeviceSpec
from janusd.oracle.prior import RooflinePrior
from janusd.oracle.types import LoadFeatures
from janusd.policy.demand import replicas_to_fit

SPEC = ModelSpec.from_config(msgspec.to_builtins(demo_arch("llama", "small")), dtype="float32")
CPU = DeviceSpec(name="cpu", hbm_bytes=1024 * 2**20, peak_flops=8.3e10, hbm_bw=1.7e10, d2d_bw=1.2e9, h2d_bw=1.0e10,
                 source="test", step_overhead_s=0.0, layer_overhead_s=1.05e-3, seq_overhead_s=2.2e-4,
                 prefill_token_overhead_s=1.3e-5)
ACCEL = msgspec.structs.replace(CPU, name="h100")


def _load(rate: float) -> LoadFeatures:
    return LoadFeatures(request_rate=rate, input_token_rate=rate * 200, output_token_rate=rate * 64,
                        input_len_mean=200, input_len_var=0.0, output_len_mean=64, output_len_var=0.0)


def test_the_cpu_compute_share_is_the_flops_share_plus_the_host_share():
    cpu, accel = RooflinePrior(SPEC, CPU, 1.0, 0.1), RooflinePrior(SPEC, ACCEL, 1.0, 0.1)
    z = _load(1.5)
    c_cpu, c_acc = cpu.capacity("m", z).mean, accel.capacity("m", z).mean
    assert c_cpu[0] == c_acc[0] and c_cpu[2] == c_acc[2]  # memory and bandwidth as before
    b, t_step = cpu._decode(z.request_rate, z)
    host = z.request_rate * CPU.prefill_time_floor(SPEC.layers, 200) \
        + (1 - math.exp(-b)) / t_step * CPU.step_time_floor(SPEC.layers, b)
    assert math.isclose(c_cpu[1] - c_acc[1], host, rel_tol=1e-9)
    assert c_acc[1] < 0.05 < 0.2 < c_cpu[1]  # the FLOPs alone said "nearly free"; the host time, a fifth or more


def test_two_bursty_models_do_not_fit_one_cpu_device_at_a_burst_and_one_does_at_its_base_rate():
    cpu = RooflinePrior(SPEC, CPU, 1.0, 0.1)
    assert replicas_to_fit("m", _load(1.5), cpu, 0.0, 8)[0] == 1
    assert 2 * cpu.capacity("m", _load(1.5)).mean[1] < 1.0
    assert cpu.capacity("m", _load(16.0)).mean[1] > 1.0  # a burst's 16 req/s: more than one device
    assert replicas_to_fit("m", _load(16.0), cpu, 0.0, 8)[0] >= 2
    assert replicas_to_fit("m", _load(16.0), RooflinePrior(SPEC, ACCEL, 1.0, 0.1), 0.0, 8)[0] == 1


def test_only_the_cpu_spec_is_host_bound():
    assert CPU.host_is_device and not any(p.host_is_device for p in PRESETS.values())
