"""The `janus` command line: one console script, one module per subcommand.

Subcommands are registered here by module path and imported lazily, so that
`janus trace stats` does not pay for importing torch. A subcommand module exposes
`add_arguments(parser)` and `run(args) -> int`. Only real commands are listed.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module path, one-line help). Keep sorted by name.
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("janusd.bench.cli", "run a benchmark and print one JSON object last"),
    "ctl": ("janusd.ctl_cli", "talk to a running daemon over its admin socket"),
    "generate": ("janusd.engine.generate_cli", "offline generation with the engine (one prompt, one model)"),
    "models": ("janusd.models_cli", "make demo checkpoints, inspect checkpoints"),
    "oracle": ("janusd.oracle_cli", "evaluate the performance oracle on profiled points"),
    "profile": ("janusd.profile_cli", "measure a model on the real engine: oracle training points"),
    "replay": ("janusd.replay_cli", "replay a trace open-loop against an OpenAI-compatible server"),
    "report": ("janusd.report_cli", "plots and a markdown table from replay/sim run directories"),
    "serve": ("janusd.serve_cli", "run the serving daemon (janusd) in the foreground"),
    "sim": ("janusd.sim_cli", "simulate a supernode on a trace: the daemon's core on a virtual clock"),
    "top": ("janusd.top_cli", "watch a running daemon: devices, models against their SLOs, the controller's "
            "decisions"),
    "trace": ("janusd.trace_cli", "convert, synthesise, sample, compress and inspect request traces"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand's parser, or (`only`) the one the command line names: the others
    are listed but their modules are not imported (`janus top` and `janus ctl` start fast)."""
    parser = argparse.ArgumentParser(prog="janus", description="janusd: multi-LLM serving (Janus design)")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if only is None or name == only:
            importlib.import_module(module).add_arguments(p)
    return parser


def _version() -> str:
    from janusd import __version__

    return f"janus {__version__}"


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    args, rest = parser.parse_known_args(argv)
    module = importlib.import_module(args._module)
    # a positional after an option (`ctl state NAME --device N warm`) is one argparse
    # leaves over; a subcommand that takes such words says so (`take_rest`)
    if rest and not getattr(module, "take_rest", lambda a, r: False)(args, rest):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def serve_main() -> int:
    """`janusd` is `janus serve`."""
    return main(["serve", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
