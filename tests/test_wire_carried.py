"""What of the config travels to a worker: wire/'s own Structs, filled from the config
sections by field name at the sender, carry the same values and survive the socket."""

from __future__ import annotations

import msgspec
import pytest

from janusd.config import EngineConfig, LifecycleConfig, ModelConfig
from janusd.wire import worker_msgs as wm

MODEL = ModelConfig(name="m", checkpoint="demo:llama-tiny", dtype="bfloat16", devices=[0, 2], prefill_devices=[0],
                    kv_cache_mib=96, max_model_len=512, ttft_slo_ms=250.0)
PAIRS = [(wm.WorkerModel, MODEL), (wm.WorkerEngine, EngineConfig(block_size=8, kv_wait_timeout_s=2.5)),
         (wm.WorkerLifecycle, LifecycleConfig(copy_streams=2, fork_bandwidth_mib_s=300, overlap_restore=False))]


@pytest.mark.parametrize(("cls", "section"), PAIRS, ids=lambda x: getattr(x, "__name__", ""))
def test_of_copies_every_carried_field_by_name(cls, section):
    carried = cls.of(section)
    assert msgspec.structs.asdict(carried) == {f: getattr(section, f) for f in cls.__struct_fields__}
    # every field the worker reads has an owner in config (a renamed config key fails here)
    assert set(cls.__struct_fields__) <= set(type(section).__struct_fields__)


def test_only_what_the_worker_needs_travels():
    carried = wm.WorkerModel.of(MODEL)
    assert (carried.name, carried.dtype, carried.kv_cache_mib, carried.max_model_len, carried.prefill_devices) == \
        ("m", "bfloat16", 96, 512, [0])
    assert not hasattr(carried, "ttft_slo_ms") and not hasattr(carried, "devices")  # steering stays in the daemon
    assert "fork_timeout_s" not in wm.WorkerLifecycle.__struct_fields__  # the daemon's timer, not the worker's


def test_a_set_state_round_trips_with_its_carried_sections():
    msg = wm.SetState(7, wm.WorkerModel.of(MODEL), wm.WorkerEngine.of(EngineConfig()), "/c", "warm",
                      wm.WorkerLifecycle.of(LifecycleConfig(cold_keeps_tokenizer=False)))
    back = wm.to_worker_decoder().decode(msgspec.msgpack.encode(msg))
    assert back == msg and back.lifecycle.cold_keeps_tokenizer is False and back.model.prefill_devices == [0]


def test_a_config_struct_sent_as_is_is_refused_by_the_worker():
    # the old way (config Structs on the wire) no longer decodes: the edge is wire/'s alone
    raw = msgspec.msgpack.encode(wm.LoadModel(1, MODEL, EngineConfig(), "/c", LifecycleConfig()))  # type: ignore[arg-type]
    with pytest.raises(msgspec.ValidationError):
        wm.to_worker_decoder().decode(raw)
