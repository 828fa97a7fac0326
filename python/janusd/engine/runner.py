"""ModelEngine: one model on one device — weights in an xTensor segment, paged KV in an
xTensor region, a continuous-batching scheduler, the forward and the sampler.

`step()` runs one engine step: schedule (decodes + chunked prefills under the token
budget), build the packed batch's metadata, run the forward, sample the rows that reach
the end of their tokens, and turn tokens into StepOutputs (detokenized, stop rules
applied). Time is split into `forward_s` (model forward + logits) and `overhead_s`
(scheduling, metadata, sampling, detokenization) so the bench can report the share
spent outside the forward.

Roles: "mixed" does everything; "prefill" stops a request after its prefill (and first
token) with `kv_ready=True` and holds its blocks for `export_kv`; "decode" additionally
accepts `import_kv` of a prefill done elsewhere (any role accepts plain requests).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from janusd.engine.kv_transfer import KVTransferMixin
from janusd.engine.models.attention import build_attn_batch
from janusd.engine.models.llama import LlamaModel
from janusd.engine.sampler import SampleRequest, make_generator, sample
from janusd.engine.scheduler import Scheduler
from janusd.engine.sequence import Sequence, Status
from janusd.engine.types import STALL_WAIT_S, EngineError, RequestError, SamplingParams, StepOutput, TokenLogprob

__all__ = ["EngineStats", "ModelEngine", "RequestError", "SamplingParams", "StepOutput", "TokenLogprob", "EngineError"]


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_stream(device: torch.device) -> Any:
    """One stream per model on cuda/npu (PAPER.md §7: the hardware interleaves kernels of
    co-located models); None on cpu, where a step already uses every intra-op thread.
    Only the cpu path has run on our machines; the cuda/npu branches are untested here."""
    if device.type == "cuda":
        return torch.cuda.Stream(device=device)
    if device.type == "npu":
        return torch.npu.Stream(device=device)  # type: ignore[attr-defined]
    return None


def stream_scope(stream: Any) -> Any:
    """`with` this around a model's kernels: its own stream, or nothing on cpu."""
    if stream is None:
        return contextlib.nullcontext()
    if stream.device.type == "npu":
        return torch.npu.stream(stream)  # type: ignore[attr-defined]
    return torch.cuda.stream(stream)


def torch_dtype(name: str) -> torch.dtype:
    """The dtype activations, KV and unpacked weights take; "auto" is float32 (what packed
    weights are not: engine/models/qlinear.py, device_engine.weight_plan)."""
    if name in ("auto", "int8", "int4"):  # weights kept as blocks; activations and KV float32
        return torch.float32
    if name not in _DTYPES:
        raise EngineError(f"dtype {name!r} is not supported (supported: {', '.join(_DTYPES)})")
    return _DTYPES[name]


@dataclass
class EngineStats:
    steps: int = 0
    forward_s: float = 0.0
    overhead_s: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    preemptions: int = 0
    stalled_steps: int = 0  # steps that scheduled nothing: every request waited for KV pages

    @property
    def overhead_share(self) -> float:
        total = self.forward_s + self.overhead_s
        return self.overhead_s / total if total > 0 else 0.0


class ModelEngine(KVTransferMixin):
    """Build with `DeviceEngine.load_model` (real pool) or directly from parts (tests)."""

    def __init__(self, name: str, model: LlamaModel, kv: Any, tokenizer: Any, *, eos_token_ids: list[int],
                 max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int, role: str = "mixed",
                 dtype_name: str = "float32", kv_wait_timeout_s: float = 30.0, max_kv_blocks: int | None = None) -> None:
        """`kv_wait_timeout_s`: how long a request may wait for KV pages other requests hold
        (scheduler.py); `max_kv_blocks`: the most blocks this model can ever hold (None: the
        KV region's maximum; DeviceEngine passes the pool less this model's weights too)."""
        if role not in ("mixed", "prefill", "decode"):
            raise EngineError(f"role {role!r} is not one of mixed, prefill, decode")
        self.name = name
        self.model = model
        self.arch = model.arch
        self.kv = kv
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self.max_model_len = max_model_len
        self.role = role
        self.dtype_name = dtype_name
        self.block_size = kv.block_size
        self.device = model.device
        self._stream = model_stream(self.device)
        self.scheduler = Scheduler(kv.block_size, max_num_seqs, max_num_batched_tokens, kv,
                                   kv_wait_timeout_s=kv_wait_timeout_s, max_blocks=max_kv_blocks)
        self.seqs: dict[str, Sequence] = {}
        self.stats = EngineStats()
        self._arrivals = itertools.count()
        self._window = getattr(self.arch, "sliding_window", None)
        self._kv_layers = kv.layers
        self.closed = False
        self._freed = False  # this step freed KV blocks: shrink the region after it
        self._stalled = False  # the last step scheduled nothing: its requests wait for KV pages
        # tests and tools may observe the float32 logits each sampled row came from
        self.logit_sink: Callable[[str, torch.Tensor], None] | None = None
        # tensor parallelism: the leader shard's link to its followers (engine/tp/shard.py
        # LeaderLink), told each step's inputs before the forward; None on one device
        self.group: Any = None

    # ---- requests -------------------------------------------------------------------
    def add_request(self, req_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        seq = self._new_sequence(req_id, prompt_token_ids, params)
        self.seqs[req_id] = seq
        self.scheduler.add(seq)

    def _new_sequence(self, req_id: str, prompt: list[int], params: SamplingParams, n_out: int = 0) -> Sequence:
        if self.closed:
            raise EngineError(f"model {self.name!r} was unloaded")
        if not isinstance(req_id, str) or not req_id:
            raise RequestError("req_id: must be a non-empty string")
        if req_id in self.seqs:
            raise RequestError(f"req_id: {req_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise RequestError("params: must be a SamplingParams")
        params.validate(self.arch.vocab_size)
        prompt = list(prompt)
        if not prompt:
            raise RequestError("prompt: must contain at least one token")
        vocab = self.arch.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
            raise RequestError(f"prompt: token ids must be integers in [0, {vocab})")
        prompt_len = len(prompt) - n_out
        if prompt_len + params.max_tokens > self.max_model_len:
            raise RequestError(
                f"prompt: {prompt_len} prompt tokens + max_tokens {params.max_tokens} exceed max_model_len {self.max_model_len}"
            )
        if -(-(prompt_len + params.max_tokens) // self.block_size) > self.kv.max_blocks:
            raise RequestError(
                f"prompt: {prompt_len} + {params.max_tokens} tokens need more KV blocks than this model's "
                f"KV region holds ({self.kv.max_blocks} blocks of {self.block_size})"
            )
        from janusd.engine.tokenizer import IncrementalDetokenizer

        detok = IncrementalDetokenizer(self.tokenizer, prompt[:prompt_len][-6:]) if self.tokenizer is not None else None
        gen = make_generator(params.seed) if params.temperature > 0 else None
        seq = Sequence(req_id, prompt[:prompt_len], params, next(self._arrivals), detok, self.eos_token_ids,
                       self.max_model_len, gen)
        seq.tokens = prompt
        return seq

    def abort(self, req_id: str) -> bool:
        """Drop a request wherever it is and free its KV blocks; False if unknown."""
        seq = self.seqs.pop(req_id, None)
        if seq is None:
            return False
        self.scheduler.remove(seq)
        if seq.blocks:  # held (KV_READY) or importing: not in the scheduler's queues
            self.kv.free(seq.blocks)
            seq.blocks = []
        seq.status = Status.FINISHED
        seq.finish_reason = "abort"
        if self.kv is not None:  # the worker may not step again: give the pages back now
            self._return_free_pages()
        return True

    def has_work(self) -> bool:
        return not self.closed and self.scheduler.has_work()

    def waiting_for_pages(self) -> bool:
        """The last step could schedule nothing (and gave no pages back by preempting): every
        request here waits for KV pages that other owners hold. Stepping again at once would
        do nothing either, so the caller should wait a little (worker: on its inbox) instead
        of spinning."""
        return self._stalled and self.has_work()

    def close(self) -> None:
        """Drop every view into device memory (before the pool frees this model's pages)."""
        self.closed = True
        self.model = None  # type: ignore[assignment]
        self.kv = None
        self._kv_layers = []
        self.scheduler.blocks = None

    def num_requests(self) -> int:
        return len(self.seqs)

    def shrink_kv(self) -> int:
        """Return KV pages above the highest used block to the pool; pages released."""
        return self.kv.shrink()

    # ---- the step -------------------------------------------------------------------
    def step(self, now: float | None = None) -> list[StepOutput]:
        """`now`: time.monotonic() seconds (read here when None), the clock of KV waits."""
        if self.closed:
            raise EngineError(f"model {self.name!r} was unloaded")
        t0 = time.perf_counter()
        sched = self.scheduler.schedule(time.monotonic() if now is None else now)
        self.stats.preemptions += len(sched.preempted)
        self._freed = bool(sched.preempted or sched.failed)
        self._stalled = not sched.items and not sched.failed
        self.stats.stalled_steps += int(self._stalled)
        self._stalled = self._stalled and not sched.preempted  # freed pages: worth another step now
        outputs = [self._fail(seq) for seq in sched.failed]
        if not sched.items:
            self._return_free_pages()
            self.stats.overhead_s += time.perf_counter() - t0
            return outputs
        # decodes (1 token with earlier context) first, then prefill chunks
        items = sorted(sched.items, key=lambda it: 0 if (it.n == 1 and it.start > 0) else 1)
        n_dec = sum(1 for it in items if it.n == 1 and it.start > 0)
        ids: list[int] = []
        pos: list[int] = []
        for it in items:
            ids += it.seq.tokens[it.start : it.start + it.n]
            pos += range(it.start, it.start + it.n)
        decodes = [(it.seq.blocks, it.start + 1) for it in items[:n_dec]]
        prefills = [(it.seq.blocks, it.start, it.n) for it in items[n_dec:]]
        meta = build_attn_batch(decodes, prefills, self.block_size, self.device, window=self._window)
        rows, sampling = [], []
        r = 0
        for it in items:
            r += it.n
            if it.samples:
                rows.append(r - 1)
                sampling.append(it)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        positions = torch.tensor(pos, dtype=torch.long, device=self.device)
        t1 = time.perf_counter()
        if self.group is not None:  # the other shards run this step's forward with us
            self.group.announce_step(ids, pos, decodes, prefills, rows)
        with torch.inference_mode(), stream_scope(self._stream):
            hidden = self.model.forward(input_ids, positions, meta, self._kv_layers)
            logits = self.model.logits(hidden[rows]).cpu() if rows else None
        t2 = time.perf_counter()
        fwd = t2 - t1
        self.scheduler.complete(sched)
        total = sched.num_tokens
        for it in items[n_dec:]:
            it.seq.prefill_s += fwd * it.n / total
        self.stats.prefill_tokens += sum(it.n for it in items[n_dec:])
        self.stats.decode_tokens += n_dec
        if logits is not None:
            if self.logit_sink is not None:
                for it, row in zip(sampling, logits):
                    self.logit_sink(it.seq.req_id, row)
            reqs = [SampleRequest(it.seq.params, it.seq.generator, it.seq.banned_now()) for it in sampling]
            for it, (tok, lp) in zip(sampling, sample(logits, reqs)):
                outputs.append(self._advance(it.seq, tok, lp))
        self.stats.steps += 1
        self.stats.forward_s += fwd
        if self._freed:
            self._return_free_pages()
        self.stats.overhead_s += (t1 - t0) + (time.perf_counter() - t2)
        return outputs

    def _return_free_pages(self) -> None:
        """After blocks were freed (finish, abort, preemption), hand the KV pages above the
        highest block still held back to the pool at once, not only when this model goes
        idle: under steady load another model on the device can grow into them."""
        self.kv.shrink()
        self._freed = False

    def _advance(self, seq: Sequence, tok: int, lp: TokenLogprob | None) -> StepOutput:
        text = seq.append_token(tok)
        out = StepOutput(req_id=seq.req_id, model=self.name, token_ids=[tok], text=text,
                         num_prompt_tokens=seq.prompt_len, num_output_tokens=seq.num_output,
                         logprobs=[lp] if lp is not None else None)
        if not seq.prefill_reported:
            seq.prefill_reported = True
            out.prefill_s = seq.prefill_s
        if seq.finish_reason is not None:
            self._finish(seq)
            out.finished = True
            out.finish_reason = seq.finish_reason
        elif self.role == "prefill" and seq.status is Status.RUNNING:
            self.scheduler.remove(seq, free_blocks=False)
            seq.status = Status.KV_READY
            out.kv_ready = True
        return out

    def _finish(self, seq: Sequence) -> None:
        self._freed = True
        self.scheduler.remove(seq)
        seq.status = Status.FINISHED
        self.seqs.pop(seq.req_id, None)

    def _fail(self, seq: Sequence) -> StepOutput:
        self.seqs.pop(seq.req_id, None)
        seq.status = Status.FINISHED
        return StepOutput(req_id=seq.req_id, model=self.name, finished=True, finish_reason="abort",
                          num_prompt_tokens=seq.prompt_len, num_output_tokens=seq.num_output,
                          error=seq.fail_reason or "KV cache exhausted: the device pool cannot supply a KV block")

    # ---- convenience ----------------------------------------------------------------
    def generate(self, prompts: dict[str, list[int]], params: SamplingParams | dict[str, SamplingParams]) -> dict[str, list[StepOutput]]:
        """Run requests to completion on this engine alone (tests, `janus generate`)."""
        for rid, p in prompts.items():
            self.add_request(rid, p, params[rid] if isinstance(params, dict) else params)
        outs: dict[str, list[StepOutput]] = {rid: [] for rid in prompts}
        while self.has_work():
            for o in self.step():
                outs.setdefault(o.req_id, []).append(o)
            if self.waiting_for_pages():  # pages held elsewhere; kv_wait_timeout_s bounds this
                time.sleep(STALL_WAIT_S)
        return outs
