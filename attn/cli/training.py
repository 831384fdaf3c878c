"""`attn train` (fresh, --resume, --fork), `attn config`, `attn plot` and `attn demo`: one run, its config,
its figures; the scaled head and its unscaled twin side by side."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from attn.cli.common import (
    EXIT_DIVERGED,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SIGNAL,
    UsageError,
    install_stop_handlers,
    is_interactive,
    one_line,
    run_dir_argument,
    say,
    split_config_and_overrides,
    training_threads,
)
from attn.config.loading import MAX_INTEGER, build_spec, build_task, integer_problem, load_config, parse_override
from attn.config.schema import describe_schema, to_dict
from attn.config.yamlio import ConfigError, dump_yaml, show_value
from attn.model.fast import describe_carried_weights
from attn.model.widthfree import WIDTH_FREE_QK_NORM, WIDTH_FREE_QK_NORM_GAINS, WIDTH_FREE_SCORES
from attn.optim import SUBSPACE_OPTIMIZERS
from attn.store import locks, runs
from attn.text import format_number, format_value, summary_figures
from attn.train import lifecycle
from attn.train.loop import StopFlag


@contextlib.contextmanager
def _progress_printer(total_steps: int):
    """Yields progress(step, record): a tqdm bar on a terminal, plain lines every
    ~10% elsewhere (CI, pipes). The bar starts at the first step reported (a
    resumed run's) and is closed however the run ends."""
    if not is_interactive():
        every = max(1, total_steps // 10)
        next_line = 0

        def progress(step, record):
            nonlocal next_line
            if record is not None and (step >= next_line or step == total_steps or "nonfinite" in record):
                next_line = step + every
                number = format_number
                say(
                    f"step {step:>6}/{total_steps}  train_loss {number(record['train_loss'], '.4g')}  "
                    f"eval_loss {number(record['eval_loss'], '.4g')}  "
                    f"eval_acc {number(record['eval_accuracy'], '.3f')}  "
                    f"score_std {number(record['score_std'], '.3g')}",
                    file=sys.stderr,
                    flush=True,
                )

        yield progress
        return
    from tqdm import tqdm

    bar = None

    def progress(step, record):
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total_steps, initial=step, unit="step", dynamic_ncols=True)
        if step < total_steps:
            bar.update(1)
        if record is not None:
            bar.set_postfix(
                loss=format_number(record["train_loss"], ".3f"), eval_acc=format_number(record["eval_accuracy"], ".3f")
            )

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()


def cmd_train(args) -> int:
    config_path, overrides = split_config_and_overrides(args.items)
    if args.resume is not None and args.fork is not None:
        raise UsageError(
            "train: --resume and --fork cannot be given together (--fork starts a new run from a "
            "checkpoint; --resume continues the run itself)"
        )
    if args.resume is not None and args.name is not None:
        raise UsageError("train: --name cannot be given with --resume (a resumed run keeps its directory)")
    if args.fork is not None and config_path is not None:
        raise UsageError(
            f"train: --fork starts from its run's config: give changes as key=value, not the config file {config_path}"
        )
    stop = StopFlag()
    restore_signals = install_stop_handlers(stop)
    try:
        if args.resume is not None:
            return _resume(args.resume, config_path, overrides, stop)
        if args.fork is not None:
            return _fork(args.fork, overrides, args.name, stop)
        config = _load_run_config(config_path, overrides)
        with training_threads(), lifecycle.new_run(config, config_path, overrides, args.name) as run_dir:
            say(f"run directory: {run_dir}", file=sys.stderr)  # the threads set before the provenance records them
            return _train_and_report(config, run_dir, False, stop)
    finally:
        restore_signals()


def _load_run_config(config_path: str | None, overrides: list[str]):
    """load_config, saying so when the file is an experiment file, not a config."""
    from attn.experiment.spec import is_experiment_file

    try:
        return load_config(config_path, overrides)
    except ConfigError:
        if config_path is not None and is_experiment_file(config_path):
            raise ConfigError(
                f"{config_path}: is an experiment file (it has a grid and seeds), not a run config; "
                f"run it with: attn sweep {config_path}"
            ) from None
        raise


def _resume(text: str, config_path: str | None, overrides: list[str], stop: StopFlag) -> int:
    """--resume RUN [train.steps=N]: continue the run, or extend it to N steps."""
    run_dir = run_dir_argument(text, "--resume")
    with training_threads(run_dir), locks.RunLock(run_dir, "train --resume"):  # the lock before the checks
        requested = _load_run_config(config_path, overrides) if config_path else None
        resumption = lifecycle.check_resumable(run_dir, requested, () if config_path else overrides)
        state = resumption.state
        if resumption.extended_from is not None:
            lifecycle.record_extension(run_dir, resumption)
            say(
                f"extending {run_dir}: train.steps {resumption.extended_from} -> {state.config.train.steps} "
                "(recorded in its config.yaml)",
                file=sys.stderr,
            )
        say(f"resuming {run_dir} from step {state.step}/{state.config.train.steps}", file=sys.stderr)
        return _train_and_report(state.config, run_dir, True, stop, state)


def _fork(text: str, overrides: list[str], name: str | None, stop: StopFlag) -> int:
    """--fork RUN[@STEP] [key=value ...]: a new run from the run's checkpoint at STEP."""
    source_text, at, step_text = text.rpartition("@")
    if not at or (Path(text) / "config.yaml").is_file():
        source_text, step_text = text, None  # no @STEP (or a run whose own name ends in one)
    elif not (step_text.isascii() and step_text.isdigit()):
        if (Path(source_text) / "config.yaml").is_file():  # RUN@STEP with a STEP that is no step
            raise ConfigError(
                f"--fork {show_value(text)}: STEP: got {show_value(step_text)}; expected an integer "
                ">= 0, a step the run checkpointed (RUN@STEP)"
            )
        source_text, step_text = text, None
    step = None if step_text is None else int(step_text) if len(step_text) <= 20 else MAX_INTEGER + 1
    if step is not None and integer_problem(step, ge=0):
        raise ConfigError(
            f"--fork {show_value(text)}: STEP: got {show_value(step_text)}; expected {integer_problem(step, ge=0)}"
        )
    source = run_dir_argument(source_text, "--fork")
    plan = lifecycle.plan_fork(source, step, overrides)
    with training_threads(source), lifecycle.new_fork(plan, overrides, name) as run_dir:  # it goes on as its source
        state = lifecycle.prepare_resume(plan.config, run_dir)
        changed = "; ".join(plan.changes) or "no change: it continues as its source"
        say(f"forking {source} at step {plan.step} into {run_dir} ({changed})", file=sys.stderr)
        say(f"resuming {run_dir} from step {state.step}/{state.config.train.steps}", file=sys.stderr)
        return _train_and_report(plan.config, run_dir, True, stop, state)


def _train_and_report(config, run_dir: Path, resume: bool, stop: StopFlag, state=None) -> int:
    """Run it (from `state` when given); one line on how it ended; the run
    directory as the last stdout line."""
    summary, stopped_at_once = None, False
    try:
        with _progress_printer(config.train.steps) as progress:
            summary = lifecycle.execute(config, run_dir, resume=resume, stop=stop, progress=progress, state=state)
    except KeyboardInterrupt:  # a second signal: the run recorded where it stopped
        summary, stopped_at_once = runs.read_summary(run_dir) or {"status": "interrupted"}, True
    except runs.RunError as err:  # the disk or the run directory, mid-run
        say(f"error: run failed: {one_line(str(err))}", file=sys.stderr)
    except Exception as err:
        traceback_file = run_dir / "error.txt"
        where = f" (traceback in {traceback_file})" if traceback_file.exists() else ""
        say(f"error: run failed: {type(err).__name__}: {one_line(str(err))}{where}", file=sys.stderr)
    status = summary["status"] if summary else "failed"
    if summary:
        line = f"{status}: step {summary.get('step', 0)}/{config.train.steps}"
        if summary.get("reason"):
            line += f"  ({summary['reason']})"
        if summary.get("final"):  # absent when stopped at once
            line += (
                f"  {summary_figures(summary)}  "
                f"{summary.get('steps_per_sec') or 0:.0f} steps/s  wall {summary['wall_time']:.1f}s"
            )
        say(line, file=sys.stderr)
    if status == "diverged":  # what to try next, and where the rates that did not diverge are
        say(
            f"a lower optim.lr (this run's: {config.optim.lr:g}) may not diverge; each experiment's report gives "
            "the best rate it found for its settings (experiments/README.md)",
            file=sys.stderr,
        )
    if status in ("interrupted", "failed") and (run_dir / "checkpoint.npz").exists():
        say(f"resume with: {resume_command(run_dir)}", file=sys.stderr)
    if stopped_at_once and status != "interrupted" and config.logging.plots:  # it ended, then the signal: no figures
        say(f"figures: not drawn (stopped); attn plot {run_dir} draws them", file=sys.stderr)
    say(run_dir)
    if status == "interrupted" or stopped_at_once:
        return EXIT_SIGNAL.get(stop.reason, 130)
    return {"completed": EXIT_OK, "diverged": EXIT_DIVERGED}.get(status, EXIT_FAILED)


def resume_command(run_dir: Path) -> str:
    """The command that resumes the run, in the words the user started it with: `make train` sets ATTN_VIA_MAKE."""
    if os.environ.get("ATTN_VIA_MAKE") == "train":
        return f"make train RESUME={run_dir}"
    return f"attn train --resume {run_dir}"


def cmd_config(args) -> int:
    config_path, overrides = split_config_and_overrides(args.items)
    if config_path is None and not overrides:
        rows = describe_schema()
        width = max(len(r[0]) for r in rows)
        say("attn config schema (YAML sections; override any field with key=value):")
        for key, accepted, default, help_text in rows:
            say(f"  {key:<{width}}  default {default:<10} {help_text}  [{accepted}]")
        say(
            f"width-free head (model.width_free; attn.model.widthfree): optim.name {', '.join(SUBSPACE_OPTIMIZERS)}"
            f" with model.score {', '.join(WIDTH_FREE_SCORES)}, or qk_norm with model.qk_norm "
            f"{WIDTH_FREE_QK_NORM} and model.qk_norm_gain {' or '.join(WIDTH_FREE_QK_NORM_GAINS)}; every other "
            "optimiser and mode keeps the d_k-wide weights"
        )
        return EXIT_OK
    config = _load_run_config(config_path, overrides)
    say(dump_yaml(to_dict(config), sort_keys=False), end="")
    carried = describe_carried_weights(build_spec(config, build_task(config)))
    say("# head: " + "; ".join(f"{weights} {how}" for weights, how in carried.items()))
    return EXIT_OK


def cmd_plot(args) -> int:
    from attn.train import figures  # matplotlib is imported only by commands that draw

    for run_dir in [run_dir_argument(text, "plot") for text in args.run_dirs]:  # every one checked before any is drawn
        with locks.RunLock(run_dir, "plot"):
            for path in figures.plot_run(run_dir):
                say(path)
    return EXIT_OK


DEMO_CONFIGS = ("configs/wide.yaml", "configs/wide_unscaled.yaml")  # the scaled head at d_k 2^20, its unscaled twin
DEMO_COLORS = ("#1f77b4", "#d62728")  # as every report draws scale=sqrt and scale=none
DEMO_RUNS_DIR = "runs/demo"
DEMO_OWN_KEYS = {  # overrides the demo refuses: key -> why, and what is accepted
    "name": "the demo names its runs after its configs (wide, wide_unscaled); expected a setting of both runs",
    "runs_dir": "expected --runs-dir DIR for where the demo's runs go",
    "model.scale": "the one setting the demo's two runs differ in; expected another setting of both runs",
}


def cmd_demo(args) -> int:
    """The claim, shown: DEMO_CONFIGS trained as `attn train` trains
    them (one stack when they share their shapes) into --runs-dir, a run
    already finished there with the same config reused; then one figure of
    both (attn.report.demo), each run's outcome printed."""
    from attn.config.loading import flatten_config
    from attn.config.schema import neutral_keys
    from attn.report import demo
    from attn.store import runstate
    from attn.train import figures

    for path in DEMO_CONFIGS:
        if not Path(path).is_file():
            raise UsageError(f"demo: {path}: no such file; run attn demo from the repository root, as make demo does")
    for text in args.overrides:  # what the demo sets itself, or the one setting its pair differs in
        key = parse_override(text)[0]
        if key in DEMO_OWN_KEYS:
            raise UsageError(f"demo: override {show_value(text)}: {DEMO_OWN_KEYS[key]}")
    overrides = [*args.overrides, f"runs_dir={args.runs_dir}"]
    configs = [_load_run_config(path, overrides) for path in DEMO_CONFIGS]
    run_dirs, fresh = [], []
    stop = StopFlag()
    restore_signals = install_stop_handlers(stop)
    try:
        with training_threads(), contextlib.ExitStack() as held:  # the threads before the runs' provenance
            for path, config in zip(DEMO_CONFIGS, configs):
                reused = lifecycle.finished_run(config, Path(config.runs_dir), Path(path).stem)
                if reused is not None:
                    say(f"reusing {reused}: it ended with this config (remove it to train it again)", file=sys.stderr)
                    run_dirs.append(reused)
                    continue
                run_dir = held.enter_context(lifecycle.new_run(config, path, overrides, Path(path).stem))
                say(f"run directory: {run_dir}", file=sys.stderr)
                run_dirs.append(run_dir)
                fresh.append(runstate.prepare(config, run_dir))
            failed = _train_demo(fresh, stop)
    finally:
        restore_signals()
    summaries = [runs.read_summary(run_dir) or {} for run_dir in run_dirs]
    flat = [flatten_config(to_dict(config)) for config in configs]
    differ = [k for k in flat[0] if k not in neutral_keys() and any(f.get(k) != flat[0][k] for f in flat)]
    labels = []
    for run_dir, summary, settings in zip(run_dirs, summaries, flat):
        line = (
            f"{run_dir}: {summary.get('status', 'failed')}: step {summary.get('step', 0)}/{summary.get('steps', '?')}"
        )
        say(line + (f"  {summary_figures(summary)}" if summary.get("final") else ""))
        what = summary.get("outcome_said") or summary.get("status", "failed")
        reached = (summary.get("best") or {}).get("steps_to_99")
        labels.append(
            f"{run_dir.name} ({', '.join(f'{k} {format_value(settings[k])}' for k in differ)}): {what}"
            + (f", 99% at step {reached}" if reached is not None else "")
        )
    if failed or any(s.get("status") not in runs.FINISHED for s in summaries):
        for run_dir, summary in zip(run_dirs, summaries):
            if summary.get("status") == "interrupted" and (run_dir / "checkpoint.npz").exists():
                say(f"resume with: attn train --resume {run_dir}", file=sys.stderr)
        say("figure: not drawn (a run did not end)", file=sys.stderr)
        return EXIT_SIGNAL.get(stop.reason, 130) if stop.reason else EXIT_FAILED
    first = configs[0]
    shared = (
        f"{first.task.name}, d_k {first.model.d_k}, {first.optim.name} lr {show_value(first.optim.lr)}, "
        f"seed {first.seed}, {first.train.steps} steps"
    )
    title = f"attn demo: {len(run_dirs)} runs that differ only in {', '.join(differ) or 'nothing'} ({shared})"
    fig = demo.demo_figure(run_dirs, labels, list(DEMO_COLORS[: len(run_dirs)]), title)
    path = figures.save_figure(fig, Path(first.runs_dir) / "demo.png", tight=False)
    say(f"figure: {path}")
    return EXIT_OK


def _train_demo(states: list, stop: StopFlag) -> bool:
    """Train the demo's fresh runs, one stack per shape (attn.train.stack),
    a line per run every tenth of its budget; whether training failed."""
    from attn.train.stack import stack_key

    names = [state.run_dir.name for state in states]
    width = max((len(n) for n in names), default=0)

    def progress(states_of, member, step, record):
        state = states_of[member]
        every = max(1, state.config.train.steps // 10)
        if record is not None and (step % every == 0 or step == state.config.train.steps):
            say(
                f"{state.run_dir.name:<{width}}  step {step:>6}/{state.config.train.steps}  "
                f"eval_loss {format_number(record['eval_loss'], '.4g')}  "
                f"eval_acc {format_number(record['eval_accuracy'], '.3f')}  "
                f"score_std {format_number(record['score_std'], '.3g')}",
                file=sys.stderr,
                flush=True,
            )

    stacks: dict = {}
    for state in states:
        stacks.setdefault(stack_key(state.config), []).append(state)
    for group in stacks.values():
        try:
            lifecycle.execute_stack(group, stop=stop, progress=lambda m, step, r, g=group: progress(g, m, step, r))
        except KeyboardInterrupt:  # a second signal: each run recorded where it stopped
            return True
        except Exception as err:
            say(f"error: run failed: {type(err).__name__}: {one_line(str(err))}", file=sys.stderr)
            return True
        if stop.reason:
            return True
    return False


def add_commands(sub) -> None:
    """The train, config and plot commands' arguments, on the subparsers `sub` (attn.cli.build_parser)."""
    p = sub.add_parser("train", help="train one run")
    p.add_argument("items", nargs="*", metavar="[CONFIG] key=value", help="config file, then overrides")
    p.add_argument("--name", help="run directory name (default: <config>-<time>)")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue an interrupted run from its checkpoint; with "
        "train.steps=N larger than its budget, extend a completed (or stopped) run to N steps",
    )
    p.add_argument(
        "--fork",
        metavar="RUN_DIR[@STEP]",
        help="start a new run (default name <run>-fork-<step>) from "
        "the run's checkpoint at STEP (default: its last), with key=value changes to its rates, "
        "schedule, budget, score scale or logging",
    )
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("config", help="print the schema, or a resolved config")
    p.add_argument("items", nargs="*", metavar="[CONFIG] key=value")
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("demo", help="train the scaled head and its unscaled twin; both in one figure")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides applied to both configs")
    p.add_argument(
        "--runs-dir", default=DEMO_RUNS_DIR, help=f"where the runs and demo.png go (default {DEMO_RUNS_DIR})"
    )
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("plot", help="redraw the figures of run directories")
    p.add_argument("run_dirs", nargs="+")
    p.set_defaults(func=cmd_plot)
