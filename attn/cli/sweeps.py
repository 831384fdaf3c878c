"""`attn sweep`, `attn report`, `attn verify` and `attn publish`: experiments,
their progress and summary, their reports."""

from __future__ import annotations

import argparse
import json
import queue
import shlex
import signal
import sys
import threading
from pathlib import Path

from attn.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SIGNAL,
    UsageError,
    flagged,
    install_stop_handlers,
    integer_at_least,
    is_interactive,
    one_line,
    say,
    terminal_text,
)
from attn.config.loading import load_config
from attn.config.yamlio import ConfigError, read_yaml_file, truncate
from attn.experiment.verification import VARIANTS, verify_markdown
from attn.store import runs
from attn.train import lifecycle
from attn.train.loop import StopFlag


def cmd_sweep(args) -> int:
    from attn.experiment import sweep, timeline

    with flagged({"address": "--executor"}):
        if args.executor:
            sweep.check_address(args.executor)  # before the experiment's directory is written
    experiment = _experiment_to_sweep(args)
    with flagged({"address": "--executor"}):
        executor = sweep.executor_from_address(args.executor) if args.executor else sweep.default_executor(args.workers)
    stop = StopFlag()
    with sweep.active_sweep(experiment) as last_one_out:
        record = timeline.Timeline(experiment.directory, sweep.worker_slots(executor), len(experiment.cells))
        try:
            return _sweep_and_report(args, experiment, executor, stop, last_one_out, record)
        finally:
            record.close()
            if record.error:
                say(f"timeline: not written ({record.error}); the runs and report are not affected", file=sys.stderr)


def _sweep_and_report(args, experiment, executor, stop: StopFlag, last_one_out, record) -> int:
    """cmd_sweep's sweep, its summary and its report, each phase into the sweep's timeline `record`;
    the runs read for the report as they finish (ReadAhead)."""
    read_ahead = ReadAhead(experiment) if args.report else None
    restore_signals = install_stop_handlers(stop, second_stops_at_once=False)
    outcomes = None
    try:
        outcomes = _run_sweep(experiment, executor, stop, record, read_ahead)
    finally:
        restore_signals()
        # a stopped or failed sweep writes no report: the runs waiting to be read are left
        known = read_ahead.stop(finish=outcomes is not None and not stop.reason) if read_ahead is not None else None
    failed = [o for o in outcomes if o.action == "failed"]
    say(sweep_summary(experiment, outcomes), file=sys.stderr)
    for outcome in failed:
        say(f"failed: {outcome.cell}: {outcome.detail}", file=sys.stderr)
    unknown = [o for o in outcomes if o.action == "unknown"]
    if unknown:  # no report until every cell is accounted for
        say(
            f"error: the Dask scheduler at {args.executor} was lost mid-sweep: what became of {len(unknown)} "
            f"of {len(outcomes)} runs is unknown (a worker may still be training them), so no report is "
            f"written; run the same command again to finish the rest: {shlex.join(['attn', *sys.argv[1:]])}",
            file=sys.stderr,
        )
        say(experiment.directory)
        return EXIT_FAILED
    if stop.reason:
        say(
            f"stopped by {stop.reason}: interrupted runs are checkpointed; re-run the same command to resume",
            file=sys.stderr,
        )
        say(experiment.directory)
        return EXIT_SIGNAL.get(stop.reason, 130)
    report_failed = False
    if not args.report:
        say(f"report: not written (--no-report; attn report {experiment.path} writes it)", file=sys.stderr)
    elif not last_one_out():
        say(
            f"report: left to another sweep of {experiment.name} that is still running (the last to finish "
            f"writes it; or: attn report {experiment.path})",
            file=sys.stderr,
        )
    else:
        try:
            with record.phase("report"):
                print_report(experiment, known)
        except Exception as err:  # the runs are done and kept; only the summary of them failed
            say(
                f"error: report failed: {type(err).__name__}: {one_line(str(err))} (the runs are kept; "
                f"attn report {experiment.path} writes it again)",
                file=sys.stderr,
            )
            report_failed = True
    say(experiment.directory)
    return EXIT_FAILED if failed or report_failed else EXIT_OK


SWEEP_OPTIONS = {"seeds": "--seeds", "seed": "--seeds", "grid": "--grid"}  # overrides that mean a sweep's option


def _experiment_to_sweep(args):
    """The experiment `attn sweep FILE ...` runs: FILE's own if it is an
    experiment file; for a run config, the one its --grid and --seeds make,
    whose file is written into its directory."""
    from attn.experiment import spec as experiments

    for text in args.overrides:
        key, _, value = text.partition("=")
        if key.strip() in SWEEP_OPTIONS:
            option = SWEEP_OPTIONS[key.strip()]
            raise UsageError(
                f"sweep: {text}: did you mean {option} {value or '...'}? (a sweep's "
                f"{'grid' if option == '--grid' else 'seeds'} are set with {option}, not as key=value)"
            )
    given = [
        option for option, value in (("--grid", args.grid), ("--seeds", args.seeds), ("--name", args.name)) if value
    ]
    if args.only and not experiments.is_experiment_file(args.experiment):
        raise UsageError(
            f"sweep: --only: {args.experiment} is not an experiment file; --only runs part of one "
            "(a run config's grid is the --grid given)"
        )
    if args.runs_dir is not None:
        lifecycle.check_directory_path(args.runs_dir, "--runs-dir")
    if experiments.is_experiment_file(args.experiment):
        if given:
            raise UsageError(
                f"sweep: {args.experiment} is an experiment file: its grid, seeds and name are in it; "
                f"drop {', '.join(given)} (they make an experiment from a run config)"
            )
        return experiments.load_experiment(
            args.experiment,
            args.runs_dir,
            args.max_cells,
            plots=args.plots,
            overrides=args.overrides,
            only=args.only or (),
        )
    if not args.grid:
        read_yaml_file(args.experiment, "experiment file")  # a file that is no YAML mapping says so
        load_config(args.experiment)  # a mapping that is no config either says why, as `attn train` would
        raise ConfigError(
            f"{args.experiment}: is a run config, not an experiment file; sweep it over a grid: "
            f"attn sweep {args.experiment} --grid model.d_k=16,64,256 --seeds 0-4"
        )
    experiment, data = experiments.command_line_experiment(
        args.experiment,
        args.grid,
        args.seeds,
        args.name,
        args.overrides,
        args.runs_dir,
        args.max_cells,
        args.plots,
        command=" ".join(["attn", *sys.argv[1:]]),
    )
    lifecycle.check_directory_path(experiment.directory.parent, "runs_dir")
    experiments.save_experiment_file(experiment.path, data)
    return experiment


class SweepProgress:
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
        return f"done {c['done']}, running {running}, skipped {c['skipped']}, failed {c['failed']}" + (
            f", interrupted {c['interrupted']}" if c["interrupted"] else ""
        )

    def started(self, names: list[str]) -> None:
        self.running.update(dict.fromkeys(names))
        if self.interactive:
            self._show()
        else:
            say(f"started {_few(names)}  ({self.tally()}; of {self.total})", file=sys.stderr, flush=True)

    def ended_with(self, outcome) -> None:
        self.ended += 1
        self.running.pop(outcome.cell, None)
        kind = (
            "skipped"
            if outcome.action.startswith("skipped")
            else None
            if outcome.action in ("cancelled", "unknown")
            else "failed"
            if "failed" in (outcome.action, outcome.status)
            else "interrupted"
            if outcome.status == "interrupted"
            else "done"
        )
        if kind is not None:
            self.counts[kind] += 1
        line = f"[{self.ended}/{self.total}] {outcome.cell}: " + (
            outcome.status
            if outcome.action == "unknown"
            # 'unknown (the scheduler was lost)'
            else f"{outcome.action}, {outcome.status}  {outcome.detail}"
        )
        if not self.interactive:
            say(line, file=sys.stderr, flush=True)
            return
        if kind in ("skipped", None):  # a skipped run leaves the total; a cancelled one stays in it, never done
            if self.bar is not None:
                self.bar.total -= kind == "skipped"
                self._show()
            return
        self._show()
        if kind in ("failed", "interrupted"):
            self.bar.write(terminal_text(line), file=sys.stderr)

    def _show(self) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total - self.counts["skipped"], unit="run", dynamic_ncols=True, file=sys.stderr)
        self.bar.n = self.counts["done"] + self.counts["failed"] + self.counts["interrupted"]
        flight = f"; in flight: {_few(list(self.running), 1)}" if self.reports_starts else ""
        self.bar.set_postfix_str(terminal_text(self.tally() + flight), refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _few(names: list[str], shown: int = 3) -> str:
    """'a, b, c +5 more': the first few names."""
    more = f" +{len(names) - shown} more" if len(names) > shown else ""
    return (", ".join(names[:shown]) or "none") + more


class ReadAhead:
    """The runs of a sweep read for its report as they finish (attn.analysis.results.KnownRuns),
    in a thread of the sweep's process, which otherwise waits on its workers while they train:
    the report then reads only the runs that changed since (none, as a rule)."""

    def __init__(self, experiment):
        from attn.analysis.results import KnownRuns
        from attn.experiment.spec import result_change

        self.known, self.directory = KnownRuns(result_change), experiment.directory
        self.cells = {cell.name: cell for cell in experiment.cells}
        self.waiting: queue.SimpleQueue = queue.SimpleQueue()
        self.abandoned = False
        self.thread = threading.Thread(target=self._read, name="report read-ahead", daemon=True)
        self.thread.start()

    def ended(self, outcome) -> None:
        """A cell's outcome: a run this sweep trained to its end is read next."""
        if outcome.action in ("ran", "resumed") and outcome.status in runs.FINISHED:
            self.waiting.put(outcome.cell)

    def _read(self) -> None:
        while (name := self.waiting.get()) is not None:
            if not self.abandoned:
                self.known.read(self.directory / name, self.cells[name])

    def stop(self, finish: bool = True):
        """The runs read, once those already waiting are (finish) or without them."""
        self.abandoned = not finish
        self.waiting.put(None)
        self.thread.join()
        return self.known


def _run_sweep(experiment, executor, stop: StopFlag, record=None, read_ahead: ReadAhead | None = None) -> list:
    """Run the experiment's cells, showing their progress (SweepProgress); each outcome to `read_ahead`."""
    from attn.experiment import sweep

    total = len(experiment.cells)
    say(f"sweep {experiment.name}: {total} runs -> {experiment.directory}", file=sys.stderr)
    if experiment.path.name == "experiment.yaml" and experiment.path.parent == experiment.directory:
        say(f"experiment file: {experiment.path} (attn sweep {experiment.path} runs it again)", file=sys.stderr)
    progress = SweepProgress(total, is_interactive(), reports_starts=hasattr(executor, "started"))
    forwarded = False

    def should_stop() -> bool:
        """Polled while the runs go on: pass a stop on to the workers once,
        here rather than in the handler, as the signal may come before they exist."""
        nonlocal forwarded
        if stop.reason and not forwarded:
            sweep.signal_workers(executor, signal.Signals[stop.reason])
            forwarded = True
        return stop.reason is not None

    def on_outcome(outcome) -> None:
        progress.ended_with(outcome)
        if read_ahead is not None:
            read_ahead.ended(outcome)

    try:
        with executor:
            return sweep.run_experiment(experiment, executor, on_outcome, should_stop, progress.started, record=record)
    finally:
        progress.close()


def sweep_summary(experiment, outcomes: list) -> str:
    """One line: the runs by status, those skipped, or that there was nothing to run."""
    counts, skipped = {}, 0
    for outcome in outcomes:
        label = "running in another sweep" if outcome.action == "skipped-locked" else outcome.status
        counts[label] = counts.get(label, 0) + 1
        skipped += outcome.action == "skipped-finished"
    by_status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if outcomes and skipped == len(outcomes):
        return f"sweep {experiment.name}: nothing to run: all {skipped} runs had finished ({by_status})"
    return f"sweep {experiment.name}: {len(outcomes)} runs: {by_status}" + (
        f"; {skipped} of them had finished before (skipped)" if skipped else ""
    )


def print_report(experiment, known=None) -> None:
    """Write the report (`known`: runs read ahead, attn.analysis.results.KnownRuns); print its
    expectations' verdicts (from report.json) and its path."""
    from attn.report import experiment_report

    paths = experiment_report.write_report(experiment, known)
    judged = json.loads(paths["json"].read_text()).get("expectations") or []
    for expectation in judged:
        say(
            f"{expectation['verdict']:>13}  {expectation['id']}: {truncate(one_line(expectation['claim']), 100)}",
            file=sys.stderr,
        )
    say(f"report: {paths['md']}" + (f" ({len(judged)} expectations judged)" if judged else ""), file=sys.stderr)


def _load_experiment_file(path: str, command: str, *args, **kwargs):
    """load_experiment, saying so when the file is a run config, not an experiment file."""
    from attn.experiment.spec import is_experiment_file, load_experiment

    try:
        return load_experiment(path, *args, **kwargs)
    except ConfigError:
        if not is_experiment_file(path):
            try:
                load_config(path)
            except ConfigError:
                pass
            else:
                raise ConfigError(
                    f"{path}: is a run config, not an experiment file; attn {command} reads an "
                    "experiment file, e.g. experiments/sqrt_dk.yaml, or the experiment.yaml "
                    "`attn sweep CONFIG --grid ...` wrote"
                ) from None
        raise


def cmd_report(args) -> int:
    experiment = _load_experiment_file(
        args.experiment, "report", args.runs_dir, args.max_cells, overrides=args.overrides
    )
    print_report(experiment)
    say(experiment.directory)
    return EXIT_OK


def cmd_verify(args) -> int:
    from attn.experiment import verify
    from attn.store.processes import ChildStopped

    if args.published and args.as_run is not None:
        raise UsageError(
            f"verify: --published with --as-run {args.as_run}: the first takes the published report as "
            "run, the second the report in DIR; expected one of them"
        )
    if args.judged_cells and (args.kernel or args.variants not in (None, ("materialized",))):
        given = f"--kernel {args.kernel}" if args.kernel else f"--variants {','.join(args.variants)}"
        raise UsageError(
            f"verify: --judged-cells with {given}: it makes the materialized re-run alone; expected "
            "no --kernel and no --variants but materialized"
        )
    variants = args.variants or VARIANTS
    experiment = _load_experiment_file(args.experiment, "verify", args.runs_dir, args.max_cells)
    progress = lambda message: say(f"verify: {message}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        if args.published:
            from attn import publish
            from attn.report.published import verify_published

            result = verify_published(
                experiment,
                publish.RESULTS,
                publish.REPO,
                args.kernel,
                args.workers,
                progress,
                variants,
                judged_cells=args.judged_cells,
            )
        elif args.judged_cells:
            from attn.report.judged_cells import verify_judged

            result = verify_judged(
                experiment, args.workers, progress, as_run=None if args.as_run is None else Path(args.as_run)
            )
        else:
            result = verify.verify(
                experiment,
                args.kernel,
                args.workers,
                progress,
                variants,
                as_run=None if args.as_run is None else Path(args.as_run),
            )
    except ChildStopped as stopped:
        say(
            f"stopped by {stopped.signal}: the step it was running was stopped with it (a re-run's sweep "
            f"checkpoints its interrupted runs); run the same command again to resume",
            file=sys.stderr,
        )
        return EXIT_SIGNAL.get(stopped.signal, 130)
    say(verify_markdown(result))
    for path in result["files"]:
        say(path)
    return EXIT_OK if result["agree"] else EXIT_FAILED


def variant_list(text: str) -> tuple[str, ...]:
    """'float64,kernel' -> those re-runs, each one of VARIANTS (argparse names the flag on an error)."""
    chosen = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [v for v in chosen if v not in VARIANTS]
    twice = [v for v in VARIANTS if chosen.count(v) > 1]
    if not chosen or unknown or twice:
        raise argparse.ArgumentTypeError(
            f"got {text!r}{f' ({twice[0]} twice)' if twice else ''}; "
            f"expected some of {', '.join(VARIANTS)}, each once, comma-separated"
        )
    return chosen


def cmd_publish(args) -> int:
    from attn import publish

    if args.text_only and args.names:
        raise UsageError(
            f"publish: --text-only: got the experiments {', '.join(args.names)}; it writes the text of "
            "every published one and copies none, so it takes no NAME"
        )
    if args.text_only and args.verification_only:
        raise UsageError(
            "publish: --text-only with --verification-only: the first copies nothing, the second the "
            "verifications; expected one of them"
        )
    if args.bench and (args.names or args.text_only or args.verification_only):
        given = ", ".join(args.names) if args.names else "--text-only" if args.text_only else "--verification-only"
        raise UsageError(
            f"publish: --bench with {given}: it publishes the newest benchmark alone; expected it "
            "without experiments or other modes"
        )
    try:
        written = (
            publish.publish_text()
            if args.text_only
            else publish.publish(
                args.names or None,
                Path(args.runs_dir),
                allow_mixed=args.allow_mixed,
                verification_only=args.verification_only,
                bench_only=args.bench,
            )
        )
    except publish.MixedCode as error:
        raise publish.MixedCode(f"{error}, or pass --allow-mixed to publish it as it is") from None
    for path in written:
        say(path)
    return EXIT_OK


def _add_max_cells(parser) -> None:
    from attn.experiment.spec import MAX_CELLS

    parser.add_argument(
        "--max-cells",
        type=integer_at_least(1),
        default=MAX_CELLS,
        help=f"refuse an experiment of more runs (grid points x seeds) than this (default: {MAX_CELLS})",
    )


def add_commands(sub) -> None:
    """The sweep, report, verify and publish commands' arguments, on the subparsers `sub` (attn.cli.build_parser)."""
    p = sub.add_parser("sweep", help="run an experiment: a grid of configs x seeds, in parallel")
    p.add_argument(
        "experiment",
        metavar="FILE",
        help="an experiment file, e.g. experiments/sqrt_dk.yaml; or a run config with --grid",
    )
    p.add_argument(
        "overrides", nargs="*", default=[], metavar="key=value", help="set for every cell, e.g. dtype=float64"
    )
    p.add_argument(
        "--grid",
        action="append",
        metavar="KEY=V1,V2,...",
        help="with a run config: a grid key and its "
        "values (typed as overrides are); repeat for more keys: their product is the grid",
    )
    p.add_argument(
        "--seeds",
        metavar="SEEDS",
        help="with a run config: the seeds, e.g. 0-4, 0,2,5 or 0-2,7 (default: the config's seed)",
    )
    p.add_argument(
        "--name",
        help="with a run config: the experiment's name, its directory under runs_dir "
        "(default: <config>-<grid keys>); its experiment.yaml is written there",
    )
    p.add_argument("--workers", type=integer_at_least(1), help="local worker processes (default: one per core)")
    p.add_argument("--executor", metavar="dask://HOST:PORT", help="run on a Dask cluster instead")
    p.add_argument("--runs-dir", help="where the experiment folder goes (default: the config's runs_dir)")
    p.add_argument(
        "--plots",
        action="store_true",
        help="draw every run's own figures as it ends (default: none; "
        "attn plot RUN draws them at any time, and the report draws its own)",
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="KEY=V1,V2,...",
        help="with an experiment file: run only "
        "the cells whose grid KEY is one of these values (repeat: all must hold); their report covers "
        "them (attn report FILE: every cell)",
    )
    p.add_argument(
        "--no-report",
        dest="report",
        action="store_false",
        help="train the cells, write no report "
        "(a part of an experiment whose whole attn report writes later, as attn verify's passes do)",
    )
    _add_max_cells(p)
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("report", help="(re)write an experiment's report from its run directories")
    p.add_argument("experiment", help="experiment file, e.g. experiments/sqrt_dk.yaml")
    p.add_argument(
        "overrides", nargs="*", default=[], metavar="key=value", help="as given to its sweep, e.g. dtype=float64"
    )
    p.add_argument("--runs-dir", help="where the experiment folder is (default: the config's runs_dir)")
    _add_max_cells(p)
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("verify", help="re-run an experiment in float64 and on another BLAS kernel")
    p.add_argument("experiment", help="experiment file, e.g. experiments/sqrt_dk.yaml (its sweep done)")
    p.add_argument(
        "--kernel",
        help="the second OpenBLAS kernel (OPENBLAS_CORETYPE; default: the first of "
        "Sandybridge, SkylakeX, Nehalem that runs here and is not the one running)",
    )
    p.add_argument("--workers", type=integer_at_least(1), help="local worker processes (default: one per core)")
    p.add_argument(
        "--variants",
        type=variant_list,
        help="the re-runs to make, comma-separated, of float64, kernel, materialized (default: all)",
    )
    p.add_argument("--runs-dir", help="where the experiment folder is (default: the config's runs_dir)")
    p.add_argument(
        "--published",
        action="store_true",
        help="verify the published report (experiments/results/<name>), whose runs need not be here, "
        "re-run by the commit it names (a git worktree under runs/published/ with its own .venv)",
    )
    p.add_argument(
        "--judged-cells",
        action="store_true",
        help="make the materialized re-run alone, of only the cells the report "
        "judges its claims at, every seed, and judge the claims there at the rates chosen as run (for an "
        "experiment too large to re-run whole; docs/experiments.md)",
    )
    p.add_argument(
        "--as-run",
        metavar="DIR",
        help="the report to verify, in DIR (default: the experiment's own, from its sweep); e.g. "
        "experiments/results/<name>, as published, whose runs need not be here: re-run it from the "
        "commit it names",
    )
    _add_max_cells(p)
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("publish", help="publish reports and their generated results text")
    p.add_argument("names", nargs="*", metavar="NAME", help="experiments to publish (default: every one with a report)")
    p.add_argument("--runs-dir", default="runs", help="where the experiment folders are (default: runs)")
    p.add_argument(
        "--allow-mixed",
        action="store_true",
        help="publish reports whose runs come from several code states or uncommitted code (they say "
        "so), verifications re-run by uncommitted or unrecorded code (the text says so), and a benchmark of "
        "uncommitted or unknown code (it names its commit)",
    )
    p.add_argument(
        "--verification-only",
        action="store_true",
        help="copy each experiment's verification (runs/verify/<name>.md, .json) alone, beside its published "
        "report, which it must have verified (attn verify --as-run experiments/results/<name>)",
    )
    p.add_argument(
        "--text-only",
        action="store_true",
        help="copy nothing: write experiments/README.md and README's generated blocks afresh from the "
        "results already published (after a change to an experiment file or to how the text is made)",
    )
    p.add_argument(
        "--bench",
        action="store_true",
        help="copy the newest benchmark (runs/bench/bench-*.json, .md: attn bench) into "
        "experiments/results and README's block, with no experiment's report; the rest of the "
        "text is written afresh from what is published, as with --text-only",
    )
    p.set_defaults(func=cmd_publish)
