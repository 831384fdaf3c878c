"""Command line: the only module that prints.

    attn train [CONFIG] [key=value ...] [--name NAME]
    attn train --resume RUN_DIR [train.steps=N]   continue a run; a larger N extends it
    attn train --fork RUN_DIR[@STEP] [key=value ...] [--name NAME]   a new run from its checkpoint
    attn config [CONFIG] [key=value ...]     resolved config; no CONFIG: the schema
    attn plot RUN_DIR ...                     redraw a run's figures
    attn sweep EXPERIMENT [--workers N]       run an experiment's grid, then its report
    attn sweep CONFIG --grid KEY=V1,V2 ... [--seeds 0-4] [--name N] [key=value ...]
    attn report EXPERIMENT                    rewrite an experiment's report
    attn compare PATH ... [--metric M] [--where K=V] [--group-by K ...] [--facet K] [--xlim LO,HI]
                                              overlay runs (mean ± std over seeds), tabulate

Options, positionals and key=value overrides mix in any order
(parse_intermixed_args).
    attn runs [PATH] [--status S]             list runs
    attn board [PATH ...] [--port N]          the live run board in a browser (--static DIR: as files)
    attn bench [--sizes default,mid,large]    time the training step against PyTorch

(`attn` is the console script of the editable install that the make targets
make in .venv; `python -m attn` is the same.)

Exit codes: 0 done; 1 failed during training (recorded in the run directory
when the disk allows); 2 bad input (config, override, path, checkpoint,
unwritable runs_dir), refused before anything is written; 3 diverged;
130 SIGINT; 143 SIGTERM (a first signal checkpoints, a second stops at once).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
from pathlib import Path

import yaml

from attn import jobs, locks, runs
from attn.board import DEFAULT_HOST, DEFAULT_PORT
from attn.config import all_keys, check_run_name, describe_schema, load_config, nearest_key, to_dict
from attn.train import StopFlag
from attn.yamlio import ConfigError, cut, read_yaml_file, show_value

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_DIVERGED = 0, 1, 2, 3
EXIT_SIGNAL = {"SIGINT": 130, "SIGTERM": 143}


class UsageError(Exception):
    """Bad command-line usage; one line."""


def one_line(text: str) -> str:
    """A message as one line: a newline or other unprintable character that
    came with a path or an argument is shown escaped (`\\n`), not printed."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise UsageError(f"{self.prog}: {message}")


def _split_config_and_overrides(items: list[str]) -> tuple[str | None, list[str]]:
    """[CONFIG] key=value ...: the first item is the config file unless it has an '='."""
    if items and "=" not in items[0]:
        if items[0] in all_keys() and not Path(items[0]).exists():
            raise ConfigError(f"{items[0]}: no such config file; to set that field, write {items[0]}=VALUE")
        return items[0], items[1:]
    return None, items


@contextlib.contextmanager
def _progress_printer(total_steps: int):
    """Yields progress(step, record): a tqdm bar on a terminal, plain lines every
    ~10% elsewhere (CI, pipes). The bar starts at the first step reported (a
    resumed run's) and is closed however the run ends."""
    if not _is_interactive():
        every = max(1, total_steps // 10)
        next_line = 0

        def progress(step, record):
            nonlocal next_line
            if record is not None and (step >= next_line or step == total_steps or "nonfinite" in record):
                next_line = step + every
                number = runs.format_number
                print(f"step {step:>6}/{total_steps}  train_loss {number(record['train_loss'], '.4g')}  "
                      f"eval_loss {number(record['eval_loss'], '.4g')}  eval_acc {number(record['eval_accuracy'], '.3f')}  "
                      f"score_std {number(record['score_std'], '.3g')}", file=sys.stderr, flush=True)

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
            bar.set_postfix(loss=runs.format_number(record["train_loss"], ".3f"),
                            eval_acc=runs.format_number(record["eval_accuracy"], ".3f"))

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()


def _install_stop_handlers(stop: StopFlag, second_stops_at_once: bool = True):
    """SIGINT/SIGTERM: the first asks the run to stop after the current step,
    with a checkpoint; a second stops it at once (KeyboardInterrupt), or with
    `second_stops_at_once` false is ignored. Returns a function that puts the
    previous handlers back."""
    def handler(signum, _frame):
        if not stop.reason:
            stop.request(signal.Signals(signum).name)
        elif second_stops_at_once:
            raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}

    def restore():
        for signum, old in previous.items():
            signal.signal(signum, signal.SIG_DFL if old is None else old)

    return restore


def cmd_train(args) -> int:
    config_path, overrides = _split_config_and_overrides(args.items)
    if args.resume is not None and args.fork is not None:
        raise UsageError("train: --resume and --fork cannot be given together (--fork starts a new run from a "
                         "checkpoint; --resume continues the run itself)")
    if args.resume is not None and args.name is not None:
        raise UsageError("train: --name cannot be given with --resume (a resumed run keeps its directory)")
    if args.fork is not None and config_path is not None:
        raise UsageError(f"train: --fork starts from its run's config: give changes as key=value, not the config "
                         f"file {config_path}")
    stop = StopFlag()
    restore_signals = _install_stop_handlers(stop)
    try:
        if args.resume is not None:
            return _resume(args.resume, config_path, overrides, stop)
        if args.fork is not None:
            return _fork(args.fork, overrides, args.name, stop)
        config = _load_run_config(config_path, overrides)
        with jobs.new_run(config, config_path, overrides, args.name) as run_dir:
            print(f"run directory: {run_dir}", file=sys.stderr)
            return _train_and_report(config, run_dir, False, stop)
    finally:
        restore_signals()


def _load_run_config(config_path: str | None, overrides: list[str]):
    """load_config, saying so when the file is an experiment file, not a config."""
    from attn.experiment import is_experiment_file

    try:
        return load_config(config_path, overrides)
    except ConfigError:
        if config_path is not None and is_experiment_file(config_path):
            raise ConfigError(f"{config_path}: is an experiment file (it has a grid and seeds), not a run config; "
                              f"run it with: attn sweep {config_path}") from None
        raise


def _resume(text: str, config_path: str | None, overrides: list[str], stop: StopFlag) -> int:
    """--resume RUN [train.steps=N]: continue the run, or extend it to N steps."""
    run_dir = _run_dir_argument(text, "--resume")
    with locks.RunLock(run_dir, "train --resume"):  # before the checks: none can start it in between
        requested = _load_run_config(config_path, overrides) if config_path else None
        resumption = jobs.check_resumable(run_dir, requested, () if config_path else overrides)
        state = resumption.state
        if resumption.extended_from is not None:
            jobs.record_extension(run_dir, resumption)
            print(f"extending {run_dir}: train.steps {resumption.extended_from} -> {state.config.train.steps} "
                  "(recorded in its config.yaml)", file=sys.stderr)
        print(f"resuming {run_dir} from step {state.step}/{state.config.train.steps}", file=sys.stderr)
        return _train_and_report(state.config, run_dir, True, stop, state)


def _fork(text: str, overrides: list[str], name: str | None, stop: StopFlag) -> int:
    """--fork RUN[@STEP] [key=value ...]: a new run from the run's checkpoint at STEP."""
    source_text, at, step_text = text.rpartition("@")
    if not at or not (step_text.isascii() and step_text.isdigit()) or (Path(text) / "config.yaml").is_file():
        source_text, step_text = text, None  # no @STEP (or a run whose own name ends in one)
    source = _run_dir_argument(source_text, "--fork")
    plan = jobs.plan_fork(source, None if step_text is None else int(step_text), overrides)
    with jobs.new_fork(plan, overrides, name) as run_dir:
        state = jobs.prepare_resume(plan.config, run_dir)
        changed = "; ".join(plan.changes) or "no change: it continues as its source"
        print(f"forking {source} at step {plan.step} into {run_dir} ({changed})", file=sys.stderr)
        print(f"resuming {run_dir} from step {state.step}/{state.config.train.steps}", file=sys.stderr)
        return _train_and_report(plan.config, run_dir, True, stop, state)


def _run_dir_argument(text: str, what: str) -> Path:
    """A RUN_DIR argument: its last component a valid run name (config.check_run_name),
    a directory holding config.yaml; else one line, before anything is touched."""
    run_dir = Path(text)
    name = Path(os.path.abspath(text)).name if text else text  # `.` is the directory it stands for
    check_run_name(name, f"{what} {show_value(text)}: the run directory's name")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{what} {show_value(text)}: not a run directory (no config.yaml); "
                          "expected a directory such as runs/<name>")
    return run_dir


def _train_and_report(config, run_dir: Path, resume: bool, stop: StopFlag, state=None) -> int:
    """Run it (from `state` when given); one line on how it ended; the run
    directory as the last stdout line."""
    summary = None
    try:
        with _progress_printer(config.train.steps) as progress:
            summary = jobs.execute(config, run_dir, resume=resume, stop=stop, progress=progress, state=state)
    except KeyboardInterrupt:  # a second signal: the run recorded where it stopped
        summary = runs.read_summary(run_dir) or {"status": "interrupted"}
    except runs.RunError as err:  # the disk or the run directory, mid-run
        print(f"error: run failed: {one_line(str(err))}", file=sys.stderr)
    except Exception as err:
        traceback_file = run_dir / "error.txt"
        where = f" (traceback in {traceback_file})" if traceback_file.exists() else ""
        print(f"error: run failed: {type(err).__name__}: {one_line(str(err))}{where}", file=sys.stderr)
    status = summary["status"] if summary else "failed"
    if summary:
        line = f"{status}: step {summary.get('step', 0)}/{config.train.steps}"
        if summary.get("reason"):
            line += f"  ({summary['reason']})"
        if summary.get("final"):  # absent when stopped at once
            line += (f"  {runs.summary_figures(summary)}  "
                     f"{summary.get('steps_per_sec') or 0:.0f} steps/s  wall {summary['wall_time']:.1f}s")
        print(line, file=sys.stderr)
    if status in ("interrupted", "failed") and (run_dir / "checkpoint.npz").exists():
        print(f"resume with: make train RESUME={run_dir}", file=sys.stderr)
    print(run_dir)
    if status == "interrupted":
        return EXIT_SIGNAL.get(stop.reason, 130)
    return {"completed": EXIT_OK, "diverged": EXIT_DIVERGED}.get(status, EXIT_FAILED)


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
    from attn import plots  # matplotlib takes ~1 s to import: only for commands that draw

    for text in args.run_dirs:
        run_dir = _run_dir_argument(text, "plot")
        with locks.RunLock(run_dir, "plot"):
            for path in plots.plot_run(run_dir):
                print(path)
    return EXIT_OK


def _is_interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def cmd_sweep(args) -> int:
    from attn import sweep

    experiment = _experiment_to_sweep(args)
    executor = sweep.executor_from_address(args.executor) if args.executor else sweep.default_executor(args.workers)
    stop = StopFlag()
    with sweep.active_sweep(experiment) as last_one_out:
        restore_signals = _install_stop_handlers(stop, second_stops_at_once=False)
        try:
            outcomes = _run_sweep(experiment, executor, stop)
        finally:
            restore_signals()
        failed = [o for o in outcomes if o.action == "failed"]
        print(_sweep_summary(experiment, outcomes), file=sys.stderr)
        for outcome in failed:
            print(f"failed: {outcome.cell}: {outcome.detail}", file=sys.stderr)
        if stop.reason:
            print(f"stopped by {stop.reason}: interrupted runs are checkpointed; re-run the same command to resume",
                  file=sys.stderr)
            print(experiment.directory)
            return EXIT_SIGNAL.get(stop.reason, 130)
        report_failed = False
        if not last_one_out():
            print(f"report: left to another sweep of {experiment.name} that is still running (the last to finish "
                  f"writes it; or: attn report {experiment.path})", file=sys.stderr)
        else:
            try:
                _print_report(experiment)
            except Exception as err:  # the runs are done and kept; only the summary of them failed
                print(f"error: report failed: {type(err).__name__}: {one_line(str(err))} (the runs are kept; "
                      f"attn report {experiment.path} writes it again)", file=sys.stderr)
                report_failed = True
    print(experiment.directory)
    return EXIT_FAILED if failed or report_failed else EXIT_OK


SWEEP_OPTIONS = {"seeds": "--seeds", "seed": "--seeds", "grid": "--grid"}  # overrides that mean a sweep's option


def _experiment_to_sweep(args):
    """The experiment `attn sweep FILE ...` runs: FILE's own if it is an
    experiment file; for a run config, the one its --grid and --seeds make,
    whose file is written into its directory."""
    from attn import experiment as experiments

    for text in args.overrides:
        key, _, value = text.partition("=")
        if key.strip() in SWEEP_OPTIONS:
            option = SWEEP_OPTIONS[key.strip()]
            raise UsageError(f"sweep: {text}: did you mean {option} {value or '...'}? (a sweep's "
                             f"{'grid' if option == '--grid' else 'seeds'} are set with {option}, not as key=value)")
    given = [option for option, value in (("--grid", args.grid), ("--seeds", args.seeds), ("--name", args.name)) if value]
    if experiments.is_experiment_file(args.experiment):
        if given:
            raise UsageError(f"sweep: {args.experiment} is an experiment file: its grid, seeds and name are in it; "
                             f"drop {', '.join(given)} (they make an experiment from a run config)")
        return experiments.load_experiment(args.experiment, args.runs_dir, args.max_cells, plots=args.plots,
                                           overrides=args.overrides)
    if not args.grid:
        read_yaml_file(args.experiment, "experiment file")  # a file that is no YAML mapping says so
        load_config(args.experiment)  # a mapping that is no config either says why, as `attn train` would
        raise ConfigError(f"{args.experiment}: is a run config, not an experiment file; sweep it over a grid: "
                          f"attn sweep {args.experiment} --grid model.d_k=16,64,256 --seeds 0-4")
    if args.runs_dir is not None:
        jobs.check_directory_path(args.runs_dir, "--runs-dir")
    experiment, data = experiments.command_line_experiment(
        args.experiment, args.grid, args.seeds, args.name, args.overrides, args.runs_dir, args.max_cells, args.plots,
        command=" ".join(["attn", *sys.argv[1:]]))
    jobs.check_directory_path(experiment.directory.parent, "runs_dir")
    experiments.save_experiment_file(experiment.path, data)
    return experiment


class _SweepProgress:
    """A sweep's progress as its runs start and end: done, running, skipped
    and failed counts and the cells in flight. On a terminal, a tqdm bar over
    the runs to train (a skipped run leaves its total; it appears with the
    first run that starts or ends, so a re-run with nothing to do shows none;
    a run never started is never counted done); elsewhere, one plain line per
    stack started and per run ended."""

    def __init__(self, total: int, interactive: bool, reports_starts: bool = True):
        self.total, self.interactive, self.reports_starts = total, interactive, reports_starts
        self.ended = 0  # outcomes so far, of every kind
        self.counts = dict.fromkeys(("done", "failed", "interrupted", "skipped"), 0)
        self.running: dict[str, None] = {}  # the cells in flight, in the order they started
        self.bar = None

    def tally(self) -> str:
        c = self.counts
        running = len(self.running) if self.reports_starts else "?"  # a Dask cluster does not say when a stack starts
        return (f"done {c['done']}, running {running}, skipped {c['skipped']}, failed {c['failed']}"
                + (f", interrupted {c['interrupted']}" if c["interrupted"] else ""))

    def started(self, names: list[str]) -> None:
        self.running.update(dict.fromkeys(names))
        if self.interactive:
            self._show()
        else:
            print(f"started {_few(names)}  ({self.tally()}; of {self.total})", file=sys.stderr, flush=True)

    def ended_with(self, outcome) -> None:
        self.ended += 1
        self.running.pop(outcome.cell, None)
        kind = ("skipped" if outcome.action.startswith("skipped") else None if outcome.action == "cancelled"
                else "failed" if "failed" in (outcome.action, outcome.status)
                else "interrupted" if outcome.status == "interrupted" else "done")
        if kind is not None:
            self.counts[kind] += 1
        line = f"[{self.ended}/{self.total}] {outcome.cell}: {outcome.action}, {outcome.status}  {outcome.detail}"
        if not self.interactive:
            print(line, file=sys.stderr, flush=True)
            return
        if kind in ("skipped", None):  # a skipped run leaves the total; a cancelled one stays in it, never done
            if self.bar is not None:
                self.bar.total -= kind == "skipped"
                self._show()
            return
        self._show()
        if kind in ("failed", "interrupted"):
            self.bar.write(line, file=sys.stderr)

    def _show(self) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total - self.counts["skipped"], unit="run", dynamic_ncols=True, file=sys.stderr)
        self.bar.n = self.counts["done"] + self.counts["failed"] + self.counts["interrupted"]
        flight = f"; in flight: {_few(list(self.running), 1)}" if self.reports_starts else ""
        self.bar.set_postfix_str(self.tally() + flight, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _few(names: list[str], shown: int = 3) -> str:
    """'a, b, c +5 more': the first few names."""
    more = f" +{len(names) - shown} more" if len(names) > shown else ""
    return (", ".join(names[:shown]) or "none") + more


def _run_sweep(experiment, executor, stop: StopFlag) -> list:
    """Run the experiment's cells, showing their progress (_SweepProgress)."""
    from attn import sweep

    total = len(experiment.cells)
    print(f"sweep {experiment.name}: {total} runs -> {experiment.directory}", file=sys.stderr)
    if experiment.path.name == "experiment.yaml" and experiment.path.parent == experiment.directory:
        print(f"experiment file: {experiment.path} (attn sweep {experiment.path} runs it again)", file=sys.stderr)
    progress = _SweepProgress(total, _is_interactive(), reports_starts=hasattr(executor, "started"))
    forwarded = False

    def should_stop() -> bool:
        """Polled while the runs go on: pass a stop on to the workers once,
        here rather than in the handler, as the signal may come before they exist."""
        nonlocal forwarded
        if stop.reason and not forwarded:
            sweep.signal_workers(executor, signal.Signals[stop.reason])
            forwarded = True
        return stop.reason is not None

    try:
        with executor:
            return sweep.run_experiment(experiment, executor, progress.ended_with, should_stop, progress.started)
    finally:
        progress.close()


def _sweep_summary(experiment, outcomes: list) -> str:
    """One line: the runs by status, those skipped, or that there was nothing to run."""
    counts, skipped = {}, 0
    for outcome in outcomes:
        label = "running in another sweep" if outcome.action == "skipped-locked" else outcome.status
        counts[label] = counts.get(label, 0) + 1
        skipped += outcome.action == "skipped-finished"
    by_status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if outcomes and skipped == len(outcomes):
        return f"sweep {experiment.name}: nothing to run: all {skipped} runs had finished ({by_status})"
    return (f"sweep {experiment.name}: {len(outcomes)} runs: {by_status}"
            + (f"; {skipped} of them had finished before (skipped)" if skipped else ""))


def _print_report(experiment) -> None:
    """Write the report; print its expectations' verdicts (from report.json) and its path."""
    from attn import report

    paths = report.write_report(experiment)
    judged = json.loads(paths["json"].read_text()).get("expectations") or []
    for expectation in judged:
        print(f"{expectation['verdict']:>13}  {expectation['id']}: {cut(one_line(expectation['claim']), 100)}",
              file=sys.stderr)
    print(f"report: {paths['md']}" + (f" ({len(judged)} expectations judged)" if judged else ""), file=sys.stderr)


def cmd_report(args) -> int:
    from attn.experiment import load_experiment

    experiment = load_experiment(args.experiment, args.runs_dir, args.max_cells, overrides=args.overrides)
    _print_report(experiment)
    print(experiment.directory)
    return EXIT_OK


def cmd_verify(args) -> int:
    from attn import verify
    from attn.experiment import load_experiment

    experiment = load_experiment(args.experiment, args.runs_dir, args.max_cells)
    result = verify.verify(experiment, args.kernel, args.workers,
                           progress=lambda message: print(f"verify: {message}", file=sys.stderr, flush=True))
    print(verify.markdown(result))
    for path in result["files"]:
        print(path)
    return EXIT_OK if result["agree"] else EXIT_FAILED


def cmd_publish(args) -> int:
    from attn import publish

    for path in publish.publish(args.names or None, Path(args.runs_dir)):
        print(path)
    return EXIT_OK


def cmd_compare(args) -> int:
    from attn import compare, compare_figure

    result = compare.compare(args.paths, args.metric or compare_figure.DEFAULT_METRICS, args.x, args.smooth,
                             args.threshold, args.yscale, args.out, where=args.where or (), group_by=args.group_by,
                             facet=args.facet, xlim=args.xlim, include_unfinished=args.include_unfinished)
    for skipped in result.skipped:
        print(f"skipped {skipped.path}: {skipped.reason}", file=sys.stderr)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(result.table, end="")
    for path in result.written:
        print(path)
    return EXIT_OK


def cmd_runs(args) -> int:
    from attn import grouping, listing as listings

    listing = listings.list_runs(Path(args.path), args.status, args.experiment)
    for skipped in listing.skipped:
        print(f"skipped {skipped.path}: {skipped.reason}", file=sys.stderr)
    if not listing.rows:
        print(f"no runs in {args.path}" + (f" with status {args.status}" if args.status else ""), file=sys.stderr)
        return EXIT_OK
    header = ["name", "status", "task", *(listing.names[k] for k in listing.keys), "eval_loss", "eval_acc", "age"]
    table = [header] + [
        [row.name, row.status, row.task,
         *(grouping.format_value(row.settings[k]) if k in row.settings else "—" for k in listing.keys),
         "—" if row.final[0] is None else f"{row.final[0]:.4g}",
         "—" if row.final[1] is None else f"{row.final[1]:.3f}", listings.format_age(row.age)]
        for row in listing.rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    return EXIT_OK


def _bench_sizes(text: str) -> list[str]:
    from attn.bench.timing import SIZES

    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SIZES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected a comma-separated list of {', '.join(SIZES)}")
    return names


def _rivals(text: str) -> list[str]:
    from attn.bench.rivals import FRAMEWORKS

    names = [n.strip() for n in text.split(",") if n.strip()]
    if any(n not in FRAMEWORKS for n in names):
        raise argparse.ArgumentTypeError(f"got {text!r}; expected a comma-separated list of {', '.join(FRAMEWORKS)}")
    return names


def _thread_counts(text: str) -> list[int]:
    counts = [n.strip() for n in text.split(",") if n.strip()]
    if not counts or not all(n.isdigit() and int(n) >= 1 for n in counts):
        raise argparse.ArgumentTypeError(f"got {text!r}; expected a comma-separated list of thread counts >= 1, e.g. 1,2")
    return [int(n) for n in counts]


def _count(minimum: int):
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"got {text!r}; expected an integer >= {minimum}")
        return int(text)

    return parse


def cmd_bench(args) -> int:
    from attn.bench import rivals, suite

    missing = [f for f in args.rivals if not rivals.available(f)]
    if missing:
        print(f"bench: not installed: {', '.join(missing)}; timing the rivals that are "
              "(make bench installs requirements-bench.txt)", file=sys.stderr)
    result = suite.run(args.sizes, args.threads, args.warmup, args.steps, processes=not args.no_processes,
                       headline=args.headline, frameworks=args.rivals, progress=lambda message: print(f"bench: {message}", file=sys.stderr,
                                                                              flush=True))
    paths = suite.write(result, Path(args.out))
    print(suite.markdown(result))
    for path in paths.values():
        print(path)
    return EXIT_OK


def _limits(text: str) -> tuple[float, float]:
    low, comma, high = text.partition(",")
    try:
        limits = (float(low), float(high))
    except ValueError:
        limits = None
    if not comma or limits is None or not all(map(math.isfinite, limits)) or limits[0] >= limits[1]:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected LOW,HIGH with LOW < HIGH, e.g. 0,500")
    return limits


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected a port number 0..65535 (0: any free port)")
    return int(text)


def cmd_board(args) -> int:
    from attn.board import data, export, server

    board = data.Board(args.paths)
    if args.static:
        print(export.export(board, Path(args.static)))
        return EXIT_OK
    try:
        httpd, taken = server.open_server(board, args.host, args.port)
    except OSError as err:
        port = DEFAULT_PORT if args.port is None else args.port
        raise UsageError(f"board: cannot listen on {args.host}:{port}: {err.strerror}; "
                         "choose another with --port N (0: any free port) or --host") from None
    with httpd:
        if taken:
            print(f"port {taken} is taken: serving on port {httpd.server_address[1]} instead", file=sys.stderr)
        if not server.is_loopback(args.host):
            print(f"--host {args.host}: the board is open to other machines on that network", file=sys.stderr)
        shown = board.snapshot()
        print(f"attn board: {len(shown['runs'])} runs under {board.title}, live; Ctrl-C stops it", file=sys.stderr)
        print(httpd.url, flush=True)
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            print("attn board: stopped", file=sys.stderr)
    return EXIT_OK


def _add_max_cells(parser) -> None:
    from attn.experiment import MAX_CELLS

    parser.add_argument("--max-cells", type=_count(1), default=MAX_CELLS,
                        help=f"refuse an experiment of more runs (grid points x seeds) than this (default: {MAX_CELLS})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attn", description="One-head attention, by hand, and why QK^T is divided by sqrt(d_k).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND",
                                title="commands")
    parser.commands = sub.choices  # name -> its parser, for parse_arguments
    p = sub.add_parser("train", help="train one run")
    p.add_argument("items", nargs="*", metavar="[CONFIG] key=value", help="config file, then overrides")
    p.add_argument("--name", help="run directory name (default: <config>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its checkpoint; with "
                   "train.steps=N larger than its budget, extend a completed (or stopped) run to N steps")
    p.add_argument("--fork", metavar="RUN_DIR[@STEP]", help="start a new run (default name <run>-fork-<step>) from "
                   "the run's checkpoint at STEP (default: its last), with key=value changes to its rates, "
                   "schedule, budget, score scale or logging")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("config", help="print the schema, or a resolved config")
    p.add_argument("items", nargs="*", metavar="[CONFIG] key=value")
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("plot", help="redraw the figures of run directories")
    p.add_argument("run_dirs", nargs="+")
    p.set_defaults(func=cmd_plot)
    p = sub.add_parser("sweep", help="run an experiment: a grid of configs x seeds, in parallel")
    p.add_argument("experiment", metavar="FILE", help="an experiment file, e.g. experiments/sqrt_dk.yaml; or a run "
                   "config with --grid")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                   help="set for every cell, e.g. dtype=float64")
    p.add_argument("--grid", action="append", metavar="KEY=V1,V2,...", help="with a run config: a grid key and its "
                   "values (typed as overrides are); repeat for more keys: their product is the grid")
    p.add_argument("--seeds", metavar="SEEDS", help="with a run config: the seeds, e.g. 0-4, 0,2,5 or 0-2,7 "
                   "(default: the config's seed)")
    p.add_argument("--name", help="with a run config: the experiment's name, its directory under runs_dir "
                   "(default: <config>-<grid keys>); its experiment.yaml is written there")
    p.add_argument("--workers", type=_count(1), help="local worker processes (default: one per core)")
    p.add_argument("--executor", metavar="dask://HOST:PORT", help="run on a Dask cluster instead")
    p.add_argument("--runs-dir", help="where the experiment folder goes (default: the config's runs_dir)")
    p.add_argument("--plots", action="store_true", help="draw every run's own figures as it ends (default: none; "
                   "attn plot RUN draws them at any time, and the report draws its own)")
    _add_max_cells(p)
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("report", help="(re)write an experiment's report from its run directories")
    p.add_argument("experiment", help="experiment file, e.g. experiments/sqrt_dk.yaml")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                   help="as given to its sweep, e.g. dtype=float64")
    p.add_argument("--runs-dir", help="where the experiment folder is (default: the config's runs_dir)")
    _add_max_cells(p)
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("verify", help="re-run an experiment in float64 and on another BLAS kernel")
    p.add_argument("experiment", help="experiment file, e.g. experiments/sqrt_dk.yaml (its sweep done)")
    p.add_argument("--kernel", help="the second OpenBLAS kernel (OPENBLAS_CORETYPE; default: the first of "
                   "Sandybridge, SkylakeX, Nehalem that runs here and is not the one running)")
    p.add_argument("--workers", type=_count(1), help="local worker processes (default: one per core)")
    p.add_argument("--runs-dir", help="where the experiment folder is (default: the config's runs_dir)")
    _add_max_cells(p)
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("publish", help="publish reports and their generated results text")
    p.add_argument("names", nargs="*", metavar="NAME", help="experiments to publish (default: every one with a report)")
    p.add_argument("--runs-dir", default="runs", help="where the experiment folders are (default: runs)")
    p.set_defaults(func=cmd_publish)
    p = sub.add_parser("compare", help="overlay runs' curves (mean ± std over seeds) and tabulate them")
    p.add_argument("paths", nargs="+", metavar="PATH", help="run directories, directories of runs, or globs")
    p.add_argument("--metric", action="append", help="a logged metric to plot; repeat for panels "
                   "(default: eval_loss and eval_accuracy)")
    p.add_argument("--x", default="step", choices=["step", "wall_time"], help="x axis (default: step)")
    p.add_argument("--smooth", type=float, default=0.0, metavar="BETA",
                   help="bias-corrected EMA smoothing in [0, 1) (default: 0, none)")
    p.add_argument("--threshold", type=float, default=0.99, help="accuracy for `steps to` (default: 0.99)")
    p.add_argument("--yscale", default="auto", choices=["auto", "log", "linear"],
                   help="y axes; auto: log for metrics named *loss* and for positive values spanning "
                   "more than 3 decades, else linear")
    p.add_argument("--out", help="output directory (default: <dir>/compare when every run lies directly in "
                   "one directory <dir>, else a new compare-<time> in the runs' deepest common directory)")
    p.add_argument("--where", action="append", metavar="KEY=VALUE", help="only the runs whose setting KEY (a "
                   "dotted config key) has VALUE, typed as in an override; repeat to require several")
    p.add_argument("--group-by", nargs="+", metavar="KEY", help="group by these config keys only: seeds and every "
                   "other setting are pooled in a group (default: every setting but the seed)")
    p.add_argument("--facet", metavar="KEY", help="one row of panels per value of this config key")
    p.add_argument("--xlim", type=_limits, metavar="LOW,HIGH", help="the x range of every panel; runs of very "
                   "different lengths on one x axis: e.g. --xlim 0,500 shows the first 500 steps of all")
    p.add_argument("--include-unfinished", action="store_true", help="count runs that did not finish (running, "
                   "stale, interrupted, failed) in the table's statistics too (default: drawn, but left out)")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("runs", help="list runs: status, task, differing settings, final loss, age")
    p.add_argument("path", nargs="?", default="runs", help="a directory of runs (default: runs)")
    p.add_argument("--status", help="only runs with this status (running, completed, diverged, interrupted, "
                   "failed, stale, unknown)")
    p.add_argument("--experiment", metavar="NAME", help="only the runs under PATH/NAME")
    p.set_defaults(func=cmd_runs)
    p = sub.add_parser("board", help="serve the run board: runs and experiments in a browser, live")
    p.add_argument("paths", nargs="*", default=["runs"], metavar="PATH",
                   help="run directories, directories of runs, or globs (default: runs)")
    p.add_argument("--port", type=_port, help=f"port to serve on (default: {DEFAULT_PORT}, or a free one if that is "
                   "taken; 0: any free port)")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default: {DEFAULT_HOST}, this "
                   "machine only)")
    p.add_argument("--static", metavar="DIR", help="write the page with its data into DIR (opens from disk, "
                   "no server) instead of serving it")
    p.set_defaults(func=cmd_board)
    p = sub.add_parser("bench", help="time the training step against PyTorch and JAX; sweeps")
    p.add_argument("--sizes", type=_bench_sizes, default="default,wide,copy,large", help="which sizes (default: all)")
    p.add_argument("--threads", type=_thread_counts, default="1,2", help="thread counts to time at (default: 1,2)")
    p.add_argument("--steps", type=_count(1), default=50, help="timed steps per side and size (default: 50)")
    p.add_argument("--warmup", type=_count(0), default=10, help="untimed steps first (default: 10)")
    p.add_argument("--out", default="runs/bench", help="where the JSON and Markdown go (default: runs/bench)")
    p.add_argument("--rivals", type=_rivals, default="torch,torch.compile,jax",
                   help="rival frameworks to time, those installed (default: torch,torch.compile,jax)")
    p.add_argument("--no-processes", action="store_true", help="skip peak memory and the sweep measurements")
    p.add_argument("--headline", action="store_true", help="also time the headline experiment (a few minutes)")
    p.set_defaults(func=cmd_bench)
    return parser


OVERRIDE_COMMANDS = ("train", "config", "sweep", "report")  # the commands that take key=value overrides


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
            after = argv[argv.index(flag) + 1:]  # its value may have been taken for a positional
            if not equals:
                value = after[0] if after and not after[0].startswith("-") and "=" not in after[0] else "VALUE"
            key = name.replace("-", "_")
            key = key if key in all_keys() else nearest_key(key)
            if key:
                message += f"; to set the config field {key}, write {key}={value} (no dashes)"
        raise UsageError(message)
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_arguments(list(sys.argv[1:] if argv is None else argv))
        return args.func(args)
    except (ConfigError, UsageError, runs.RunError) as err:
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_SIGNAL["SIGINT"]
