"""Command line: the only part of attn that prints (this package).

    attn train [CONFIG] [key=value ...] [--name NAME]
    attn train --resume RUN_DIR [train.steps=N]   continue a run; a larger N extends it
    attn train --fork RUN_DIR[@STEP] [key=value ...] [--name NAME]   a new run from its checkpoint
    attn config [CONFIG] [key=value ...]     resolved config; no CONFIG: the schema
    attn plot RUN_DIR ...                     redraw a run's figures
    attn demo [key=value ...] [--runs-dir D]  the scaled head and its unscaled twin, trained, in one figure
    attn sweep EXPERIMENT [--workers N]       run an experiment's grid, then its report
    attn sweep CONFIG --grid KEY=V1,V2 ... [--seeds 0-4] [--name N] [key=value ...]
    attn report EXPERIMENT                    rewrite an experiment's report
    attn compare PATH ... [--metric M] [--where K=V] [--group-by K ...] [--facet K] [--xlim LO,HI]
                                              overlay runs (mean ± std over seeds), tabulate

Options, positionals and key=value overrides mix in any order
(parse_intermixed_args).
    attn runs [PATH] [--status S]             list runs
    attn board [PATH ...] [--port N]          the live run board in a browser (--static DIR: as files)
    attn export PATH ... --tensorboard DIR --mlflow FILE   runs as TensorBoard event files, into an MLflow store
    attn bench [--sizes default,wide,copy,large] [--headline]   the training step against PyTorch and JAX
    attn bench --board                        the board with 1,200 runs and a 200 MB metrics.jsonl

(`attn` is the console script of the editable install that the make targets
make in .venv; `python -m attn` is the same.)

Exit codes: 0 done; 1 failed during training (recorded in the run directory
when the disk allows); 2 bad input (config, override, path, checkpoint,
unwritable runs_dir), refused before anything is written; 3 diverged;
130 SIGINT; 143 SIGTERM (a first signal checkpoints, a second stops at once).
"""

from __future__ import annotations

import argparse
import sys

from attn.train import denormals

# Before numpy loads: BLAS starts its threads then, and each takes the mode of the thread that starts it.
denormals.set_flushing(True)

from attn.cli import sweeps, training, views  # noqa: E402 (after the flushing mode is set)
from attn.cli.common import EXIT_BAD_INPUT, EXIT_SIGNAL, Parser, UsageError, one_line, say  # noqa: E402 (after the flushing mode is set)
from attn.config.schema import all_keys, nearest_key  # noqa: E402 (after the flushing mode is set)
from attn.config.yamlio import ConfigError  # noqa: E402 (after the flushing mode is set)
from attn.store import runs  # noqa: E402 (after the flushing mode is set)


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser: each module of attn.cli adds its own (add_commands)."""
    parser = Parser(
        prog="attn", description="One-head attention, by hand, and what dividing QK^T by sqrt(d_k) changes."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND", title="commands")
    parser.commands = sub.choices  # name -> its parser, for parse_arguments
    for commands in (training, sweeps, views):
        commands.add_commands(sub)
    return parser


OVERRIDE_COMMANDS = ("train", "config", "sweep", "report", "demo")  # the commands that take key=value overrides


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    """A command's options, positionals and overrides in any order
    (parse_intermixed_args: `attn train cfg.yaml --name x optim.lr=0.1`).
    An unknown option is one line, and for a command that takes overrides it
    names the config field it looks like: `--steps 100` -> train.steps=100."""
    parser = build_parser()
    command = parser.commands.get(argv[0]) if argv else None
    if command is None:  # no command, an unknown one, or -h: argparse's own handling
        return parser.parse_args(argv)
    args, extra = command.parse_known_intermixed_args(argv[1:])
    if extra:
        message = f"{command.prog}: unrecognized arguments: {' '.join(extra)}"
        flag = next((e for e in extra if e.startswith("-")), None)
        if argv[0] in OVERRIDE_COMMANDS and flag:
            name, equals, value = flag.lstrip("-").partition("=")
            after = argv[argv.index(flag) + 1 :]  # its value may have been taken for a positional
            if not equals:
                value = after[0] if after and not after[0].startswith("-") and "=" not in after[0] else "VALUE"
            key = name.replace("-", "_")
            key = key if key in all_keys() else nearest_key(key)
            if key:
                message += f"; to set the config field {key}, write {key}={value} (no dashes)"
        raise UsageError(message)
    return args


def main(argv: list[str] | None = None) -> int:
    with denormals.flushing(False):  # only training flushes on this thread (BLAS's threads flush throughout)
        return _run_command(argv)


def _run_command(argv: list[str] | None) -> int:
    try:
        args = parse_arguments(list(sys.argv[1:] if argv is None else argv))
        return args.func(args)
    except (ConfigError, UsageError, runs.RunError) as err:
        say(f"error: {one_line(str(err))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as err:  # a path the user gave that the OS refused (too long, a file on the way, permission)
        where = err.filename if err.filename is not None else "a path"
        say(f"error: {one_line(runs.describe_path_error(where, err))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        say("error: interrupted", file=sys.stderr)
        return EXIT_SIGNAL["SIGINT"]
