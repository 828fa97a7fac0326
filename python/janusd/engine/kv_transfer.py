"""KV export/import between ModelEngines by block lists and global offsets (P/D split).

A prefill-role engine finishes a request's prefill, samples its first token and holds
its blocks (`kv_ready`). `export_kv` describes those blocks by id and by (offset,
length) pieces of the pool's global xTensor range, which is what a transfer engine
(Mooncake) reads. On the decode side, `begin_import` reserves blocks and returns their
global pieces (the transfer writes there), `finish_import` starts decoding. In one
process, `import_kv(meta, params, source)` does the three steps with a byte copy per
block. Both sides must share block size and layout (same model, dtype and block_size).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from janusd.engine.sequence import Status
from janusd.engine.types import KVCapacityError, KVExport, KVImport, RequestError, SamplingParams


class KVTransferMixin:
    name: str
    kv: Any
    seqs: dict[str, Any]
    scheduler: Any
    dtype_name: str
    block_size: int

    def export_kv(self, req_id: str) -> KVExport:
        seq = self.seqs.get(req_id)
        if seq is None:
            raise RequestError(f"req_id: unknown request {req_id!r}")
        if seq.status is not Status.KV_READY:
            raise RequestError(f"req_id: {req_id!r} is {seq.status.value}, not kv_ready (only prefill-role requests export)")
        return KVExport(
            req_id=req_id, model=self.name, block_size=self.block_size, block_bytes=self.kv.block_bytes,
            dtype=self.dtype_name, block_ids=list(seq.blocks),
            global_offsets=[self.kv.global_offsets(b) for b in seq.blocks],
            num_cached_tokens=seq.num_computed, prompt_len=seq.prompt_len, token_ids=list(seq.tokens),
            page_ids=self.kv.page_ids(seq.blocks),
            rng_state=bytes(seq.generator.get_state().numpy().tobytes()) if seq.generator is not None else None,
        )

    def release_kv(self, req_id: str) -> bool:
        """The exported KV was copied: free the blocks and forget the request."""
        return bool(self.abort(req_id))  # type: ignore[attr-defined]

    def begin_import(self, meta: KVExport, params: SamplingParams, req_id: str | None = None) -> KVImport:
        """Reserve blocks for `meta`'s KV; the request stays out of scheduling until finish_import."""
        if meta.block_size != self.block_size or meta.block_bytes != self.kv.block_bytes or meta.dtype != self.dtype_name:
            raise RequestError(
                f"kv import: layout mismatch (block_size {meta.block_size} vs {self.block_size}, block_bytes "
                f"{meta.block_bytes} vs {self.kv.block_bytes}, dtype {meta.dtype} vs {self.dtype_name})"
            )
        need = -(-meta.num_cached_tokens // self.block_size)
        if len(meta.block_ids) != need or meta.num_cached_tokens >= len(meta.token_ids):
            raise RequestError("kv import: block count or token count inconsistent")
        if not 1 <= meta.prompt_len <= meta.num_cached_tokens:
            raise RequestError(f"kv import: prompt_len {meta.prompt_len} must be in [1, num_cached_tokens="
                               f"{meta.num_cached_tokens}] (the prefill side exports a whole prompt)")
        n_out = len(meta.token_ids) - meta.prompt_len
        if n_out >= params.max_tokens:
            raise RequestError(f"max_tokens: {params.max_tokens} leaves nothing to decode after the {n_out} "
                               "token(s) the prefill side produced")
        if need + 1 > self.scheduler.max_blocks:  # its KV plus one block to decode into
            raise RequestError(f"kv import: {need} KV blocks can never fit model {self.name!r} here "
                               f"(at most {self.scheduler.max_blocks})")
        # blocks first: a worker retries an import that finds no room as pages come back,
        # and such a retry must cost one allocation attempt, not a sequence built for nothing
        blocks = self.kv.allocate(need)
        if blocks is None:
            raise KVCapacityError(f"kv import: no room for {need} KV blocks on model {self.name!r}")
        rid = req_id or meta.req_id
        try:
            seq = self._sequence_for_import(rid, meta, params)
        except BaseException:
            self.kv.free(blocks)
            raise
        seq.blocks = blocks
        seq.num_computed = meta.num_cached_tokens
        seq.status = Status.IMPORTING
        self.seqs[rid] = seq
        return KVImport(req_id=rid, block_ids=list(blocks), global_offsets=[self.kv.global_offsets(b) for b in blocks])

    def _sequence_for_import(self, rid: str, meta: KVExport, params: SamplingParams) -> Any:
        """The decode side's sequence for `meta`: tokens streamed so far, RNG state restored."""
        n_out = len(meta.token_ids) - meta.prompt_len
        seq = self._new_sequence(rid, meta.token_ids, params, n_out=n_out)  # type: ignore[attr-defined]
        seq.resume_streamed(meta.token_ids[meta.prompt_len :])
        if meta.rng_state is not None and seq.generator is not None:
            try:
                seq.generator.set_state(torch.frombuffer(bytearray(meta.rng_state), dtype=torch.uint8))
            except RuntimeError as e:
                raise RequestError(f"kv import: bad rng_state: {e}") from None
        return seq

    def finish_import(self, req_id: str) -> None:
        seq = self.seqs.get(req_id)
        if seq is None or seq.status is not Status.IMPORTING:
            raise RequestError(f"req_id: {req_id!r} is not being imported")
        self.scheduler.add_running(seq)

    def block_bytes_view(self, block_id: int) -> torch.Tensor:
        return self.kv.block_view(block_id)

    def import_kv(self, meta: KVExport, params: SamplingParams, source: KVTransferMixin | Callable[[int, int], torch.Tensor],
                  req_id: str | None = None) -> KVImport:
        """In-process import: reserve, copy every block's bytes, start decoding.

        `source` is the exporting engine (blocks copied by id) or `read(global_offset, n)`
        returning n bytes (uint8) of the source pool's global range."""
        ticket = self.begin_import(meta, params, req_id)
        try:
            for src_id, pieces, dst_id in zip(meta.block_ids, meta.global_offsets, ticket.block_ids):
                dst = self.kv.block_view(dst_id)
                if isinstance(source, KVTransferMixin):
                    dst.copy_(source.block_bytes_view(src_id))
                else:
                    at = 0
                    for off, n in pieces:
                        dst[at : at + n].copy_(source(off, n))
                        at += n
        except Exception:
            self.abort(ticket.req_id)  # type: ignore[attr-defined]
            raise
        self.finish_import(ticket.req_id)
        return ticket
