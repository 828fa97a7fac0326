"""`janus models`: make demo checkpoints and inspect any checkpoint spec.

  janus models make-demo DIR --arch llama|qwen2|qwen3 --size tiny|small [--dtype float32] [--seed 0]
  janus models inspect SPEC        (an HF dir, a .gguf file, builtin:NAME or demo:ARCH-SIZE)
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    demo = sub.add_parser("make-demo", help="write a small random checkpoint in HF format")
    demo.add_argument("dir", help="output directory (created; must be empty)")
    demo.add_argument("--arch", choices=("llama", "qwen2", "qwen3"), default="llama")
    demo.add_argument("--size", choices=("tiny", "small"), default="tiny")
    demo.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    demo.add_argument("--seed", type=int, default=0)
    inspect = sub.add_parser("inspect", help="print a checkpoint's architecture as one JSON object")
    inspect.add_argument("spec", help="HF dir | file.gguf | builtin:smollm2-135m-instruct | demo:ARCH-SIZE")
    inspect.add_argument("--cache-dir", default=None, help="where demo checkpoints are cached")
    inspect.add_argument("--json", action="store_true",
                         help="accepted for uniformity: the JSON object is always the last line")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import msgspec

    from janusd.engine.loader import CheckpointError, open_checkpoint

    try:
        if args.models_command == "make-demo":
            from janusd.engine.checkpoint.demo import make_demo

            out = make_demo(Path(args.dir), args.arch, args.size, dtype=args.dtype, seed=args.seed)
            print(f"wrote {args.arch}-{args.size} demo checkpoint to {out}")
            return 0
        ck = open_checkpoint(args.spec, Path(args.cache_dir) if args.cache_dir else None)
    except CheckpointError as e:
        print(f"janus models: {e}", file=sys.stderr)
        return 2
    info = {
        "path": str(ck.path),
        "format": ck.format,
        "arch": msgspec.to_builtins(ck.arch),
        "num_tensors": len(ck.tensor_specs()),
        "num_parameters": ck.num_parameters(),
        "tokenizer_vocab_size": ck.tokenizer.vocab_size,
        "eos_token_ids": ck.eos_token_ids,
        "generation_defaults": ck.generation_defaults,
        "has_chat_template": ck.tokenizer.chat_template is not None,
    }
    print(json.dumps(info))
    return 0
