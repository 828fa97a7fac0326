"""`janus generate`: offline generation through the same engine the daemon runs.

One model on one device (a DeviceEngine with a pool sized to the model), one request,
text streamed to stdout as it is produced. With `--tp N` the model runs as N shards on
devices --device-index .. +N-1, one process each (engine/tp/group.py LocalGroup: gloo on
127.0.0.1 for cpu devices; nccl / hccl on cuda / npu, untested here), driven from here;
a model whose heads do not split N ways is refused before anything starts. With --json nothing else goes to stdout and
the last line is {"text", "token_ids", "prompt_tokens", "completion_tokens",
"finish_reason"}. Imports of torch and the engine happen inside run() so `janus --help`
stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="checkpoint dir, .gguf file, builtin:NAME or demo:ARCH-SIZE")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--device", choices=["cpu", "cuda", "npu"], default="cpu")
    p.add_argument("--device-index", type=int, default=0)
    p.add_argument("--cache-dir", default=None, help="where demo: checkpoints are made (default ~/.cache/janusd)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (0: torch's default; with --tp, 1 per shard)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor parallelism: N shards, one process per device (devices --device-index .. +N-1)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine, weight_plan
    from janusd.engine.loader import CheckpointError, open_checkpoint
    from janusd.engine.types import EngineError, RequestError, SamplingParams

    if args.threads > 0 and args.tp == 1:
        import torch

        torch.set_num_threads(args.threads)
    try:
        ck = open_checkpoint(args.model, Path(args.cache_dir) if args.cache_dir else None)
        tok = ck.tokenizer
        if args.chat:
            text = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True)
            prompt = tok.encode(text, add_special_tokens=False)
        else:
            prompt = tok.encode(args.prompt, add_special_tokens=True)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, seed=args.seed, stop=list(args.stop))
        max_len = min(ck.arch.max_position_embeddings, len(prompt) + max(args.max_tokens, 1) + 16)
        page = 2 << 20
        kv_mib = max(4, -(-max_len * 2 * ck.arch.num_hidden_layers * ck.arch.num_key_value_heads * ck.arch.head_dim * 4 // (1 << 20)) + 2)
        if args.tp < 1:
            raise ValueError(f"--tp must be >= 1, got {args.tp}")
        if args.tp > 1:
            return _run_tp(args, ck, prompt, params, max_len, kv_mib, page)
        weights = weight_plan(ck, args.dtype, args.device).total_bytes
        memory = (-(-weights // page) + kv_mib // 2 + 8) * page
        de = DeviceEngine(kind=args.device, device_index=args.device_index, memory_bytes=memory, page_size=page)
        me = de.load_model(ModelConfig(name="generate", checkpoint=args.model, dtype=args.dtype, kv_cache_mib=kv_mib,
                                       max_model_len=max_len), EngineConfig(), checkpoint=ck)
        me.add_request("cli", prompt, params)
    except (CheckpointError, EngineError, RequestError, ValueError) as e:
        print(f"janus generate: {e}", file=sys.stderr)
        return 2
    ids: list[int] = []
    text_out = []
    finish = None
    while me.has_work():
        for o in me.step():
            ids += o.token_ids
            text_out.append(o.text)
            if not args.json and o.text:
                sys.stdout.write(o.text)
                sys.stdout.flush()
            if o.finished:
                finish = o.finish_reason
                if o.error:
                    print(f"janus generate: {o.error}", file=sys.stderr)
                    return 1
    return _finish(args, prompt, ids, "".join(text_out), finish)


def _finish(args: argparse.Namespace, prompt: list[int], ids: list[int], text: str, finish: str | None) -> int:
    if args.json:
        print(json.dumps({"text": text, "token_ids": ids, "prompt_tokens": len(prompt),
                          "completion_tokens": len(ids), "finish_reason": finish, "tp": args.tp}))
    else:
        sys.stdout.write("\n")
    return 0


def _run_tp(args: argparse.Namespace, ck: Any, prompt: list[int], params: Any, max_len: int, kv_mib: int,
            page: int) -> int:
    """The request on a LocalGroup of args.tp shard processes; text streamed as it comes."""
    from janusd.engine.models.weights import plan_weights
    from janusd.engine.runner import torch_dtype
    from janusd.engine.tp.group import LocalGroup
    from janusd.engine.tp.layout import ShardLayout, check_tp
    from janusd.engine.types import EngineError

    check_tp(ck.arch, args.tp, f"{args.model}")  # before any process starts
    lay = ShardLayout(ck.arch, args.tp, 0)
    weights = plan_weights(lay.local, lay.local_specs(ck.tensor_specs()), torch_dtype(args.dtype)).total_bytes
    memory = (-(-weights // page) + -(-(kv_mib << 20) // page) + 8) * page

    def out(o: Any) -> None:
        if not args.json and o.text:
            sys.stdout.write(o.text)
            sys.stdout.flush()

    group = LocalGroup(args.tp, kind=args.device, device_indices=list(range(args.device_index, args.device_index + args.tp)),
                       threads=args.threads or 1, memory_bytes=memory, page_size=page)
    try:
        group.load(args.model, name="generate", dtype=args.dtype, kv_cache_mib=kv_mib, max_model_len=max_len,
                   cache_dir=args.cache_dir or "")
        got = group.generate({"cli": prompt}, params, model="generate", on_out=out)
    except EngineError as e:
        print(f"janus generate: {e}", file=sys.stderr)
        return 1
    finally:
        group.close()
    if got.errors.get("cli"):
        print(f"janus generate: {got.errors['cli']}", file=sys.stderr)
        return 1
    return _finish(args, prompt, got.token_ids["cli"], got.text["cli"], got.finish_reason["cli"])
