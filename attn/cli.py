"""Command line: the only module that prints.

    python -m attn train [CONFIG] [key=value ...] [--name NAME] [--resume RUN_DIR]
    python -m attn config [CONFIG] [key=value ...]     resolved config; no CONFIG: the schema
    python -m attn plot RUN_DIR ...                     redraw a run's figures

Exit codes: 0 done; 1 failed (error recorded in the run directory); 2 bad
input (config, override, path, checkpoint); 3 diverged; 130 SIGINT; 143 SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import yaml

from attn import jobs, plots, runs
from attn.config import ConfigError, describe_schema, load_config, to_dict
from attn.train import StopFlag

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_DIVERGED = 0, 1, 2, 3
EXIT_SIGNAL = {"SIGINT": 130, "SIGTERM": 143}


class UsageError(Exception):
    """Bad command-line usage; one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise UsageError(f"{self.prog}: {message}")


def _split_config_and_overrides(items: list[str]) -> tuple[str | None, list[str]]:
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, items


def _progress_printer(total_steps: int, start_step: int):
    """A tqdm bar on a terminal; plain lines every ~10% elsewhere (CI, pipes)."""
    interactive = sys.stderr.isatty() and not os.environ.get("CI")
    if interactive:
        from tqdm import tqdm

        bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, leave=True)

        def progress(step, record):
            bar.update(1) if step < total_steps else None
            if record is not None:
                bar.set_postfix(loss=f"{record['train_loss']:.3f}", eval_acc=f"{record['eval_accuracy']:.3f}")

        return progress, bar.close
    every = max(1, total_steps // 10)
    state = {"next": start_step}

    def progress(step, record):
        if record is not None and (step >= state["next"] or step == total_steps):
            state["next"] = step + every
            print(f"step {step:>6}/{total_steps}  train_loss {record['train_loss']:.4f}  "
                  f"eval_loss {record['eval_loss']:.4f}  eval_acc {record['eval_accuracy']:.3f}  "
                  f"score_std {record['score_std']:.2f}", file=sys.stderr, flush=True)

    return progress, lambda: None


def _install_stop_handlers(stop: StopFlag) -> None:
    def handler(signum, _frame):
        if stop.reason:  # second signal: stop now
            raise KeyboardInterrupt
        stop.request(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def cmd_train(args) -> int:
    config_path, overrides = _split_config_and_overrides(args.items)
    if args.resume:
        requested = load_config(config_path, overrides) if (config_path or overrides) else None
        run_dir = Path(args.resume)
        config = jobs.check_resumable(run_dir, requested)
        start_step = runs.read_json(run_dir / "summary.json").get("step", 0) if (run_dir / "summary.json").exists() else 0
    else:
        config = load_config(config_path, overrides)
        run_dir = jobs.create(config, config_path, overrides, args.name)
        start_step = 0
    print(f"run directory: {run_dir}", file=sys.stderr)
    stop = StopFlag()
    _install_stop_handlers(stop)
    progress, close = _progress_printer(config.train.steps, start_step)
    try:
        summary = jobs.execute(config, run_dir, resume=bool(args.resume), stop=stop, progress=progress)
    except runs.RunError as err:
        close()
        print(f"error: {err}", file=sys.stderr)
        print(run_dir)
        return EXIT_BAD_INPUT
    except Exception as err:
        close()
        print(f"error: run failed: {type(err).__name__}: {err} (traceback in {run_dir / 'error.txt'})", file=sys.stderr)
        print(run_dir)
        return EXIT_FAILED
    close()
    final = summary.get("final", {})
    best = summary.get("best", {})
    print(f"{summary['status']}: step {summary['step']}/{config.train.steps}"
          f"{'  (' + summary['reason'] + ')' if summary.get('reason') else ''}  "
          f"eval_loss {final.get('eval_loss', float('nan')):.4f}  eval_acc {final.get('eval_accuracy', float('nan')):.3f}  "
          f"steps_to_99 {best.get('steps_to_99', 'never')}  "
          f"{summary.get('steps_per_sec') or 0:.0f} steps/s  wall {summary['wall_time']:.1f}s", file=sys.stderr)
    if summary["status"] == "interrupted":
        print(f"resume with: make train RESUME={run_dir}", file=sys.stderr)
    print(run_dir)
    if summary["status"] == "interrupted":
        return EXIT_SIGNAL.get(stop.reason, 130)
    return EXIT_DIVERGED if summary["status"] == "diverged" else EXIT_OK


def cmd_config(args) -> int:
    config_path, overrides = _split_config_and_overrides(args.items)
    if config_path is None and not overrides:
        rows = describe_schema()
        width = max(len(r[0]) for r in rows)
        print("attn config schema (YAML sections; override any field with key=value):")
        for key, accepted, default, help_text in rows:
            print(f"  {key:<{width}}  default {default:<10} {help_text}  [{accepted}]")
        return EXIT_OK
    print(yaml.safe_dump(to_dict(load_config(config_path, overrides)), sort_keys=False), end="")
    return EXIT_OK


def cmd_plot(args) -> int:
    for run_dir in args.run_dirs:
        if not (Path(run_dir) / "config.yaml").exists():
            raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
        for path in plots.plot_run(Path(run_dir)):
            print(path)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m attn", description="One-head attention, by hand, and why QK^T is divided by sqrt(d_k).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("train", help="train one run")
    p.add_argument("items", nargs="*", metavar="[CONFIG] key=value", help="config file, then overrides")
    p.add_argument("--name", help="run directory name (default: <config>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its checkpoint")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("config", help="print the schema, or a resolved config")
    p.add_argument("items", nargs="*", metavar="[CONFIG] key=value")
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("plot", help="redraw the figures of run directories")
    p.add_argument("run_dirs", nargs="+")
    p.set_defaults(func=cmd_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (ConfigError, UsageError, runs.RunError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
