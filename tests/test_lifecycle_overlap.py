"""An overlapped Warm -> Active restore (lifecycle.overlap_restore): the copy runs in the
forward's order while the model already serves; the forward waits for each layer's bytes,
outputs are identical, and nothing reads or frees the segment before every byte is in."""

from __future__ import annotations

import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.config import EngineConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.loader import open_checkpoint
from janusd.engine.models.weights import landing_groups, plan_weights
from janusd.engine.restore import Copier, Landing
from janusd.engine.types import EngineError, SamplingParams

torch.set_num_threads(1)
CACHE = Path(tempfile.gettempdir()) / "janusd-test-cache"
EC = EngineConfig()


def _greedy(de: DeviceEngine) -> list[int]:
    out = de.models["m"].generate({"r": [5, 6, 7, 8, 9]}, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    return [t for o in out["r"] for t in o.token_ids]


class HeldCopier(Copier):
    """A Copier whose overlapped copies start only when `go` is set (a slow copy, made certain)."""

    def __init__(self) -> None:
        super().__init__(streams=2, chunk_bytes=64 << 10)
        self.go = threading.Event()
        self._landing_pool = ThreadPoolExecutor(1)
        self._landing_pool.submit(self.go.wait)


@pytest.mark.parametrize("spec", ["demo:llama-tiny", "demo:qwen2-tiny", "demo:qwen3-tiny"])
def test_landing_groups_cover_the_segment_once_in_forward_order(spec: str) -> None:
    ck = open_checkpoint(spec, CACHE)
    plan = plan_weights(ck.arch, ck.tensor_specs(), torch.float32)
    groups = landing_groups(plan, ck.arch.num_hidden_layers)
    assert len(groups) == ck.arch.num_hidden_layers + 2
    spans = sorted(r for g in groups for r in g)
    assert spans[0][0] == 0 and spans[-1][1] == plan.total_bytes
    assert all(a < b for a, b in spans) and all(b == c for (_, b), (c, _) in zip(spans, spans[1:]))
    elt = 4
    for name, slot in plan.slots.items():  # every tensor lies wholly inside its own group
        if slot.parent is not None:
            continue
        end = slot.offset + int(torch.tensor(slot.shape).prod()) * elt
        if name == "model.embed_tokens.weight":
            g = 0
        elif name.startswith("model.layers."):
            g = 1 + int(name.split(".")[2])
        else:
            g = len(groups) - 1
        assert any(a <= slot.offset and end <= b for a, b in groups[g]), name


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.lists(st.integers(1, 50_000), max_size=3), min_size=1, max_size=6), streams=st.integers(1, 4))
def test_copy_in_order_copies_every_byte(sizes: list[list[int]], streams: int) -> None:
    groups, at = [], 0
    for g in sizes:
        rs = []
        for n in g:
            rs.append((at, at + n))
            at += n
        groups.append(rs)
    src = torch.randint(0, 256, (max(at, 1),), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    copier = Copier(streams, 1 << 12)
    landing = copier.copy_in_order(dst[:at], src[:at], groups)
    landing.wait_all()
    assert landing.done and landing.seconds is not None and torch.equal(dst[:at], src[:at])
    copier.close()


def test_a_failed_piece_raises_in_every_waiter() -> None:
    landing = Landing([1, 2])

    def boom() -> None:
        raise OSError("bad page")

    landing.run(0, lambda: None)
    landing.run(1, boom)
    assert not landing.done
    landing.run(1, lambda: None)
    landing.wait_all(check=False)  # nothing writes any more
    with pytest.raises(EngineError, match="bad page"):
        landing.wait(0)
    with pytest.raises(EngineError, match="restoring the weights failed"):
        landing.wait_all()


def test_overlapped_restore_waits_per_layer_and_gives_identical_outputs() -> None:
    de = DeviceEngine(memory_bytes=16 << 20)
    try:
        de.load_model(ModelConfig(name="m", checkpoint="demo:llama-tiny", kv_cache_mib=4), EC, CACHE)
        greedy = _greedy(de)
        host, _ = de.release(de.detach("m"), Copier(1), keep_host=True)
        # the segment's pages hold other bytes first: a forward that did not wait would read them
        junk = de.pool.alloc_weights("junk", host.nbytes)
        junk.tensor().fill_(0x7F)
        de.pool.free("junk")
        copier = HeldCopier()
        phases: dict[str, float] = {}
        me = de.register(de.restore_model(host, copier, phases, overlap=True))
        assert set(phases) == {"prepare", "restore"}  # the transfer runs on
        landing = me.model.landing
        assert landing is not None and not landing.done
        got: list[int] = []
        th = threading.Thread(target=lambda: got.extend(_greedy(de)))
        th.start()
        time.sleep(0.3)
        assert th.is_alive() and not got  # the forward waits for the first layers' bytes
        copier.go.set()
        th.join(30)
        assert got == greedy
        assert me.model.landing is None  # all landed: the forward stops checking
        assert torch.equal(me.placement.segment.tensor()[: host.nbytes], host.buf)
        assert _greedy(de) == greedy
        copier.close()
    finally:
        de.pool.close()


def test_leaving_active_while_bytes_land_waits_for_them() -> None:
    de = DeviceEngine(memory_bytes=16 << 20)
    try:
        de.load_model(ModelConfig(name="m", checkpoint="demo:llama-tiny", kv_cache_mib=4), EC, CACHE)
        greedy = _greedy(de)
        host, _ = de.release(de.detach("m"), Copier(1), keep_host=True)
        base = bytes(host.buf.numpy())
        copier = HeldCopier()
        me = de.register(de.restore_model(host, copier, {}, overlap=True))
        landing = me.model.landing
        threading.Timer(0.2, copier.go.set).start()
        again, _ = de.release(de.detach("m"), Copier(1), keep_host=True)  # Active -> Warm at once
        assert landing.done  # release waited for the copy before copying out and freeing
        assert bytes(again.buf.numpy()) == base
        assert de.pool.stats().weight_pages == 0
        de.register(de.restore_model(again, Copier(1), {}))
        assert _greedy(de) == greedy
        copier.close()
    finally:
        de.pool.close()


def test_rotary_tables_are_built_once_per_setting_and_equal_a_fresh_build() -> None:
    """Every restore used to rebuild the cos/sin table (10-13 ms for 8192 positions): now
    models with the same rotary settings share one, which equals a table built afresh."""
    from janusd.engine.models import rope

    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    a = rope.RotaryTable(16, 10000.0, llama3, 128, torch.float32, torch.device("cpu"))
    b = rope.RotaryTable(16, 10000.0, dict(reversed(list(llama3.items()))), 128, torch.float32, torch.device("cpu"))
    assert a.cos is b.cos and a.sin is b.sin
    fresh = rope._cos_sin.__wrapped__(16, 10000.0, llama3, 128, torch.float32, "cpu")
    assert torch.equal(a.cos, fresh[0]) and torch.equal(a.sin, fresh[1])
    c = rope.RotaryTable(16, 10000.0, llama3, 256, torch.float32, torch.device("cpu"))
    assert c.cos.shape == (256, 16) and torch.equal(c.cos[:128], a.cos)
