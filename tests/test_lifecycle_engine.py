"""Warm / Cold on one DeviceEngine (no daemon): host copies, H2D restore in chunks with
identical greedy (and seeded) outputs, an out-of-memory restore that leaves the pool and
the host copy as they were, freeing back to the baseline with the process RSS flat, and
the fork helpers (segment pieces, sampled checksums, layout signature)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from engine_fixtures import cuda_available
from janusd.config import EngineConfig, LifecycleConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.restore import Copier
from janusd.engine.types import EngineError, SamplingParams
from janusd.engine.worker_fork import checksums, layout_signature, sample_blocks
from janusd.wire import worker_msgs as wm

torch.set_num_threads(1)
CACHE = Path(tempfile.gettempdir()) / "janusd-test-cache"
MC = ModelConfig(name="m", checkpoint="demo:llama-tiny", kv_cache_mib=4)
EC = EngineConfig()
WMC, WEC = wm.WorkerModel.of(MC), wm.WorkerEngine.of(EC)  # as the daemon sends them


def _life(**kw: object) -> wm.WorkerLifecycle:
    return wm.WorkerLifecycle.of(LifecycleConfig(**kw))


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024


def generate(de: DeviceEngine, seed: int | None = None) -> list[int]:
    params = SamplingParams(max_tokens=10, temperature=0.0 if seed is None else 0.8, seed=seed, ignore_eos=True)
    out = de.models["m"].generate({"r": [5, 6, 7, 8, 9]}, params)
    return [t for o in out["r"] for t in o.token_ids]


@pytest.fixture
def de():
    e = DeviceEngine(memory_bytes=16 << 20)
    e.load_model(MC, EC, CACHE)
    yield e
    e.pool.close()


def test_warm_restore_is_identical_and_chunked(de):
    greedy, seeded = generate(de), generate(de, seed=7)
    seg_before = de.models["m"].placement.segment.tensor().clone()
    copier = Copier(streams=3, chunk_bytes=64 << 10)  # many chunks for a ~300 KiB segment
    host, _ = de.release(de.detach("m"), copier, keep_host=True)
    assert torch.equal(host.buf, seg_before[: host.nbytes])
    assert de.pool.stats().weight_pages == 0
    phases: dict[str, float] = {}
    de.register(de.restore_model(host, copier, phases))
    assert set(phases) == {"prepare", "transfer", "restore"}
    assert torch.equal(de.models["m"].placement.segment.tensor()[: host.nbytes], host.buf)
    assert generate(de) == greedy and generate(de, seed=7) == seeded


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not cuda_available(), reason="no CUDA driver (libcuda.so.1) / device here"))])
def any_de(request):
    """The `de` engine on each device kind there is (cuda on a lent GPU machine)."""
    e = DeviceEngine(kind=request.param, memory_bytes=16 << 20)
    e.load_model(MC, EC, CACHE)
    yield e
    e.pool.close()


def test_out_of_memory_restore_rolls_back(any_de):
    de = any_de
    host, _ = de.release(de.detach("m"), Copier(1), keep_host=True)
    filler = de.pool.alloc_weights("filler", de.pool.stats().free_pages * de.pool.page_size)
    before = de.pool.stats()
    with pytest.raises(EngineError, match="device memory"):
        de.restore_model(host, Copier(1), {})
    after = de.pool.stats()
    assert (after.free_pages, after.pages_by_owner) == (before.free_pages, before.pages_by_owner)
    assert "m" not in de.models and not de._building
    del filler
    de.pool.free("filler")
    de.register(de.restore_model(host, Copier(1), {}))  # the host copy was left intact
    assert len(generate(de)) == 10


def test_cycles_free_back_to_baseline_and_rss_flat():
    de = DeviceEngine(memory_bytes=64 << 20)
    base = de.pool.stats()
    de.load_model(MC, EC, CACHE)
    ref = generate(de)
    copier = Copier(2, 1 << 20)
    rss0 = None
    for i in range(100):
        keep = i % 2 == 0
        host, _ = de.release(de.detach("m"), copier, keep_host=keep)
        if host is None:  # Cold: read back from the checkpoint into a fresh host copy
            host = de.stage_host_copy(MC, EC, CACHE)
        de.register(de.restore_model(host, copier, {}))
        del host
        if i == 9:
            rss0 = rss_mib()
    assert generate(de) == ref
    de.unload_model("m")
    de.pool.wait_maintenance()
    end = de.pool.stats()
    assert (end.free_pages, end.weight_pages, end.kv_pages) == (base.free_pages, base.weight_pages, base.kv_pages)
    assert rss_mib() - rss0 < 16, (rss0, rss_mib())
    de.pool.close()


def test_fork_helpers(de):
    pl = de.models["m"].placement
    n = pl.plan.total_bytes
    pieces = pl.segment.global_pieces(n)
    assert sum(p[1] for p in pieces) == n
    assert pieces[0][0] == pl.segment.page_ids[0] * de.pool.page_size
    blocks = sample_blocks(n, 5, 4096)
    assert blocks[0][0] == 0 and blocks[-1][0] + blocks[-1][1] == n and len(blocks) == 5
    sums = checksums(pl.segment.tensor(), blocks)
    host, _ = de.release(de.detach("m"), Copier(1), keep_host=True)
    assert checksums(host.buf, blocks) == sums
    host.buf[blocks[2][0]] ^= 1  # one flipped bit in a sampled block changes its checksum
    assert checksums(host.buf, blocks)[2] != sums[2]
    other = de.stage_host_copy(ModelConfig(name="m", checkpoint="demo:llama-tiny", dtype="bfloat16"), EC, CACHE)
    assert layout_signature(other.plan) != layout_signature(host.plan)


def test_host_image_round_trip(de, tmp_path):
    """A Cold start from the converted image: same bytes, same tokenizer, same tokens; an
    image of a changed checkpoint is a different one; a damaged image is not trusted."""
    from janusd.engine.host_image import image_dir, open_image, write_image
    from janusd.engine.loader import checkpoint_path
    from janusd.engine.restore import HostCopy

    ref = generate(de)
    me = de.models["m"]
    pl = me.placement
    ckpt = checkpoint_path(MC.checkpoint, CACHE)
    root = image_dir(tmp_path, ckpt, "float32")
    sig = layout_signature(pl.plan)
    assert write_image(root, me.checkpoint, pl.plan, sig, "float32", pl.segment.tensor())
    assert not write_image(root, me.checkpoint, pl.plan, sig, "float32", pl.segment.tensor())  # once
    de.release(de.detach("m"), None, keep_host=False)
    img = open_image(root)
    assert img is not None and img.meta.layout == sig
    text = "hello world, the quick brown fox"
    assert img.tokenizer.encode(text) == me.checkpoint.tokenizer.encode(text)
    assert img.eos_token_ids == list(me.checkpoint.eos_token_ids)
    host = HostCopy("m", MC, EC, img, pl.plan, None, file=img.root / "weights.bin")
    de.register(de.restore_model(host, Copier(2, 64 << 10), {}))
    assert generate(de) == ref
    (root / "meta.msgpack").write_bytes(b"\x00garbage")
    assert open_image(root) is None
    other = tmp_path / "copy"
    other.mkdir()
    (other / "x.safetensors").write_bytes(b"1")
    assert image_dir(tmp_path, other, "float32") != root
    before = image_dir(tmp_path, other, "float32")
    (other / "x.safetensors").write_bytes(b"22")
    assert image_dir(tmp_path, other, "float32") != before


def test_image_tokenizer_built_in_background(de, tmp_path):
    """A Cold start builds the image's tokenizer on a thread while the weights are read:
    the engine gets the same tokenizer; one that fails to build fails the restore with a
    CheckpointError and leaves the pool as it was (nothing half-loaded)."""
    from janusd.engine.checkpoint.base import CheckpointError
    from janusd.engine.host_image import image_dir, open_image, write_image
    from janusd.engine.loader import checkpoint_path
    from janusd.engine.restore import HostCopy

    me = de.models["m"]
    pl = me.placement
    root = image_dir(tmp_path, checkpoint_path(MC.checkpoint, CACHE), "float32")
    assert write_image(root, me.checkpoint, pl.plan, layout_signature(pl.plan), "float32", pl.segment.tensor())
    ref, plan = generate(de), pl.plan
    text = "hello world, the quick brown fox"
    de.release(de.detach("m"), None, keep_host=False)
    img = open_image(root, background=True)
    assert img is not None
    de.register(de.restore_model(HostCopy("m", MC, EC, img, plan, None, file=img.root / "weights.bin"), Copier(2), {}))
    assert de.models["m"].tokenizer.encode(text) == me.checkpoint.tokenizer.encode(text)
    assert img.built_tokenizer() is de.models["m"].tokenizer
    assert generate(de) == ref
    de.release(de.detach("m"), None, keep_host=False)
    before = de.pool.stats()
    (root / "tokenizer.json").write_text("{not json")
    img = open_image(root, background=True)
    assert img is not None  # the metadata is fine; the tokenizer fails where it is first needed
    with pytest.raises(CheckpointError, match="tokenizer"):
        de.restore_model(HostCopy("m", MC, EC, img, plan, None, file=img.root / "weights.bin"), Copier(2), {})
    assert img.built_tokenizer() is None  # failed: a Cold worker keeps none (never waits for one)
    after = de.pool.stats()
    assert (after.free_pages, after.pages_by_owner) == (before.free_pages, before.pages_by_owner)
    assert "m" not in de.models and not de._building
    assert open_image(root) is None  # opened in the foreground, a bad tokenizer means no image


def test_cold_keeps_its_tokenizer():
    """lifecycle.cold_keeps_tokenizer: a model that went Cold on a worker comes back from
    the image with the very tokenizer it had (nothing rebuilt); with it off, a new one is
    built from the image, encoding the same."""
    import queue

    from janusd.engine.worker_lifecycle import Done, Lifecycle
    from janusd.engine.worker_pd import PDLink

    de = DeviceEngine(memory_bytes=16 << 20)
    inbox: queue.Queue = queue.Queue()
    sent: list = []
    life = Lifecycle(de, inbox, PDLink(de.pool, "cpu", inbox), sent.append, lambda *a: None)

    def run(seq: int, target: str, keep: bool = True) -> object:
        life.set_state(wm.SetState(seq, WMC, WEC, str(CACHE), target, _life(cold_keeps_tokenizer=keep)))
        while True:
            item = inbox.get(timeout=60)
            if isinstance(item, Done):
                life.done(item)
                return sent[-1]

    try:
        run(1, "active")  # from the image, or the checkpoint (which writes the image)
        tok, ref = de.models["m"].tokenizer, generate(de)
        run(2, "cold")
        assert life.images.tokenizers["m"][1] is tok
        r = run(3, "active")
        assert r.path == "image" and de.models["m"].tokenizer is tok and generate(de) == ref
        run(4, "cold", keep=False)
        assert "m" not in life.images.tokenizers
        r = run(5, "active", keep=False)
        text = "the quick brown fox"
        assert r.path == "image" and de.models["m"].tokenizer is not tok
        assert de.models["m"].tokenizer.encode(text) == tok.encode(text) and generate(de) == ref
        run(6, "cold")
        life.images.forget("m")  # unloaded: nothing of it stays
        assert "m" not in life.images.tokenizers
    finally:
        de.pool.close()


def test_restored_models_host_copy_is_freed_when_the_worker_idles():
    """Warm -> Active frees the host copy only once the worker idles after a grace period
    (or after FREE_DEFER_S while busy), not during the waking request's first step."""
    import queue
    import time

    from janusd.engine import worker_lifecycle as wl
    from janusd.engine.worker_pd import PDLink

    de = DeviceEngine(memory_bytes=16 << 20)
    inbox: queue.Queue = queue.Queue()
    sent: list = []
    life = wl.Lifecycle(de, inbox, PDLink(de.pool, "cpu", inbox), sent.append, lambda *a: None)
    try:
        for seq, target in enumerate(("active", "warm", "active")):
            life.set_state(wm.SetState(seq, WMC, WEC, str(CACHE), target, _life()))
            while not isinstance(item := inbox.get(timeout=60), wl.Done):
                pass
            life.done(item)
        assert sent[-1].state == "active" and sent[-1].path == "h2d" and "m" not in de.host
        assert len(life._freeing) == 1
        life.reap(idle=True)  # idle, but within the grace period: the waking request may be on its way
        life.reap(idle=False)
        assert len(life._freeing) == 1
        time.sleep(wl.FREE_GRACE_S)
        life.reap(idle=False)  # busy: kept until FREE_DEFER_S
        assert len(life._freeing) == 1
        life.reap(idle=True)
        assert life._freeing == []
    finally:
        de.pool.close()


def test_an_h2d_restore_takes_the_activations_role_not_the_host_copys():
    """An elastic P/D instance comes back from Warm in the role its activation asks for
    (policy/roles.py), not the one its host copy was made in: a copy made as a prefill
    instance restored as decode runs whole requests to the end (no kv_ready), and one
    restored without a role keeps the copy's."""
    import msgspec

    pre = msgspec.structs.replace(MC, role="prefill", prefill_devices=[0], devices=[0, 1])
    e = DeviceEngine(memory_bytes=16 << 20)
    try:
        e.load_model(pre, EC, CACHE)
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        first = e.models["m"].generate({"r": [5, 6, 7]}, params)["r"]
        assert first[-1].kv_ready and len([t for o in first for t in o.token_ids]) == 1  # prefill stops at token 1
        e.models["m"].abort("r")
        host, _ = e.release(e.detach("m"), Copier(1), keep_host=True)
        me = e.register(e.restore_model(host, Copier(1), {}, msgspec.structs.replace(pre, role="decode"), EC))
        assert me.role == "decode" and me.placement.model_cfg.role == "decode"
        out = me.generate({"r": [5, 6, 7]}, params)["r"]
        assert not any(o.kv_ready for o in out) and len([t for o in out for t in o.token_ids]) == 4
        host, _ = e.release(e.detach("m"), Copier(1), keep_host=True)  # a copy made as decode now
        assert host.model_cfg.role == "decode"
        assert e.register(e.restore_model(host, Copier(1), {})).role == "decode"
    finally:
        e.pool.close()


def test_going_cold_reads_the_host_image_into_the_page_cache():
    """lifecycle.cold_prefetch_image: a model going Cold (from Active, and from Warm), or
    loaded (when an image exists), has its host image read into the page cache, so its Cold start reads memory and not the
    disk (an image written earlier and evicted since made the first Cold start of a
    `janus bench restore` run read the disk: 0.09-0.74 s for SmolLM2 on a 2-core VM);
    with it off, the image stays out of the cache. The worker's RSS is not what holds it."""
    import os
    import queue
    import time

    from janusd.engine.host_image import cached_fraction, drop_cached
    from janusd.engine.worker_lifecycle import Done, Lifecycle
    from janusd.engine.worker_pd import PDLink

    de = DeviceEngine(memory_bytes=16 << 20)
    inbox: queue.Queue = queue.Queue()
    sent: list = []
    life = Lifecycle(de, inbox, PDLink(de.pool, "cpu", inbox), sent.append, lambda *a: None)

    def msg(seq: int, target: str, prefetch: bool = True) -> wm.SetState:
        return wm.SetState(seq, WMC, WEC, str(CACHE), target, _life(cold_prefetch_image=prefetch))

    def run(seq: int, target: str, prefetch: bool = True) -> object:
        n = len(sent)
        life.set_state(msg(seq, target, prefetch))
        if len(sent) > n:  # answered at once (Warm -> Cold: the host copy is dropped on a thread)
            return sent[-1]
        while True:
            item = inbox.get(timeout=60)
            if isinstance(item, Done):
                life.done(item)
                return sent[-1]

    def cached_within(path: Path, s: float) -> float:
        deadline = time.monotonic() + s
        while (f := cached_fraction(path)) < 0.99 and time.monotonic() < deadline:
            time.sleep(0.02)
        return f

    try:
        run(1, "active")  # from the image, or the checkpoint (which writes the image)
        root = life.images.root(msg(0, "cold"))
        assert root is not None
        run(2, "cold")
        weights = root / "weights.bin"
        assert weights.is_file()
        drop_cached(weights)
        if cached_fraction(weights) > 0.5:
            pytest.skip("this filesystem keeps the file's pages (tmpfs?): nothing to read ahead")
        run(3, "active")  # reads the image: its pages are cached again; drop them
        drop_cached(weights)
        assert cached_fraction(weights) <= 0.5
        run(4, "cold", prefetch=False)
        time.sleep(0.3)
        assert cached_fraction(weights) <= 0.5  # off: the disk is left alone
        run(5, "active")
        drop_cached(weights)
        run(6, "cold")  # Active -> Cold
        assert cached_within(weights, 10.0) >= 0.99
        run(7, "warm")  # Cold -> Warm (reads the image), then Warm -> Cold
        drop_cached(weights)
        assert cached_fraction(weights) <= 0.5
        run(8, "cold")
        assert cached_within(weights, 10.0) >= 0.99
        drop_cached(weights)
        life.images.prefetch(wm.LoadModel(9, WMC, WEC, str(CACHE), _life()))  # what a worker's load does
        assert cached_within(weights, 10.0) >= 0.99
        drop_cached(weights)
        life.images.prefetch(wm.LoadModel(10, WMC, WEC, str(CACHE), _life(cold_prefetch_image=False)))
        time.sleep(0.3)
        assert cached_fraction(weights) <= 0.5
        assert os.path.getsize(weights) > 0
    finally:
        de.pool.close()


def test_prefetch_reads_a_whole_large_image(tmp_path):
    """host_image.prefetch caches all of an image bigger than the disk's readahead window:
    Linux reads at most that window (read_ahead_kb: 8 MiB on the bench VM, 128 KiB by
    default) per WILLNEED call, so one call over SmolLM2's 269 MB image cached 3% of it."""
    import os
    import time

    from janusd.engine.host_image import cached_fraction, drop_cached, prefetch

    root = tmp_path / "img"
    root.mkdir()
    with open(root / "weights.bin", "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(64):
            f.write(block)
    (root / "tokenizer.json").write_text("{}")
    (root / "meta.msgpack").write_bytes(b"\x80")
    w = root / "weights.bin"
    drop_cached(w)
    if cached_fraction(w) > 0.5:
        pytest.skip("this filesystem keeps the file's pages (tmpfs?): nothing to read ahead")
    assert prefetch(root)
    deadline = time.monotonic() + 20
    while cached_fraction(w) < 0.999 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cached_fraction(w) >= 0.999
    assert not prefetch(tmp_path / "none")  # no image: nothing advised
