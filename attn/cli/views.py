"""`attn compare`, `attn runs`, `attn board`, `attn export` and `attn bench`: looking at runs, and timing the step."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from attn import outcomes
from attn.board import DEFAULT_HOST, DEFAULT_PORT
from attn.cli.common import (
    EXIT_OK,
    UsageError,
    flagged,
    integer_at_least,
    number_where,
    say,
    terminal_text,
)
from attn.config.loading import as_number
from attn.store import runs
from attn.text import format_value

# compare()'s arguments -> the flags of `attn compare` that give them
A_NUMBER = number_where(lambda v: True, "a number")  # its range checked where the value is used
COMPARE_FLAGS = {
    "metrics": "--metric",
    "x": "--x",
    "smoothing": "--smooth",
    "threshold": "--threshold",
    "yscale": "--yscale",
    "group_by": "--group-by",
    "facet": "--facet",
    "xlim": "--xlim",
    "where": "--where",
    "all_y": "--all-y",
}


def cmd_compare(args) -> int:
    from attn.report import compare, compare_figure
    from attn.train.lifecycle import check_directory_path

    if args.out is not None:
        check_directory_path(args.out, "--out")
    with flagged(COMPARE_FLAGS):
        result = compare.compare(
            args.paths,
            args.metric or compare_figure.DEFAULT_METRICS,
            args.x,
            args.smooth,
            args.threshold,
            args.yscale,
            args.out,
            where=args.where or (),
            group_by=args.group_by,
            facet=args.facet,
            xlim=args.xlim,
            include_unfinished=args.include_unfinished,
            all_y=args.all_y,
        )
    for skipped in result.skipped:
        say(f"skipped {skipped.path}: {skipped.reason}", file=sys.stderr)
    for warning in result.warnings:
        say(f"warning: {warning}", file=sys.stderr)
    say(result.table, end="")
    for path in result.written:
        say(path)
    return EXIT_OK


def cmd_runs(args) -> int:
    from attn.analysis import listing as listings

    with flagged({"status": "--status", "experiment": "--experiment", "outcome": "--outcome"}):
        listing = listings.list_runs(Path(args.path), args.status, args.experiment, args.outcome)
    for skipped in listing.skipped:
        say(f"skipped {skipped.path}: {skipped.reason}", file=sys.stderr)
    if not listing.rows:
        which = " and".join(
            f" with {name} {value}" for name, value in (("status", args.status), ("outcome", args.outcome)) if value
        )
        say(f"no runs in {args.path}{which}", file=sys.stderr)
        return EXIT_OK
    header = [
        "name",
        "status",
        "outcome",
        "task",
        *(listing.names[k] for k in listing.keys),
        "eval_loss",
        "eval_acc",
        "age",
        "disk",
    ]
    table = [header] + [
        [
            row.name,
            row.status,
            row.outcome or "—",
            row.task,
            *(format_value(row.settings[k]) if k in row.settings else "—" for k in listing.keys),
            "—" if row.final[0] is None else f"{row.final[0]:.4g}",
            "—" if row.final[1] is None else f"{row.final[1]:.3f}",
            listings.format_age(row.age),
            runs.format_bytes(row.disk),
        ]
        for row in listing.rows
    ]
    table = [[terminal_text(cell) for cell in line] for line in table]  # aligned as the terminal shows them
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        say("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    return EXIT_OK


def _limits(text: str) -> tuple[float, float]:
    low, comma, high = text.partition(",")
    limits = (as_number(low), as_number(high))
    if not comma or None in limits or not all(map(math.isfinite, limits)) or limits[0] >= limits[1]:
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
        try:
            say(export.export(board, Path(args.static)))
        except runs.RunError as err:  # about the directory --static names
            raise runs.RunError(f"--static {err}") from None
        return EXIT_OK
    try:
        httpd, taken = server.open_server(board, args.host, args.port)
    except OSError as err:
        port = DEFAULT_PORT if args.port is None else args.port
        raise UsageError(
            f"board: cannot listen on {args.host}:{port}: {err.strerror}; "
            "choose another with --port N (0: any free port) or --host"
        ) from None
    with httpd:
        if taken:
            say(f"port {taken} is taken: serving on port {httpd.server_address[1]} instead", file=sys.stderr)
        if not server.is_loopback(args.host):
            say(f"--host {args.host}: the board is open to other machines on that network", file=sys.stderr)
        shown = json.loads(board.snapshot_json()[1])  # built once: the page's first look is then a cached answer
        say(f"attn board: {len(shown['runs'])} runs under {board.title}, live; Ctrl-C stops it", file=sys.stderr)
        say(httpd.url, flush=True)
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            say("attn board: stopped", file=sys.stderr)
    return EXIT_OK


def cmd_export(args) -> int:
    from attn.report import exports
    from attn.train.lifecycle import check_directory_path

    targets = {}  # flag -> (its path, the check that its library is installed, the writer, how to view what it wrote)
    if args.tensorboard is not None:
        from attn.report import tensorboard

        check_directory_path(args.tensorboard, "--tensorboard")
        view = f"TensorBoard event files; view them with tensorboard --logdir {args.tensorboard}"
        targets["--tensorboard"] = (
            args.tensorboard,
            tensorboard.require_tensorboard,
            tensorboard.write_event_files,
            view,
        )
    if args.mlflow is not None:
        from attn.report import mlflow_export  # imports mlflow, for seconds: only when asked for

        if not str(args.mlflow).strip() or Path(args.mlflow).is_dir():
            raise UsageError(f"--mlflow {args.mlflow!r}: not a file path; choose a file, e.g. --mlflow mlflow.db")
        uri = mlflow_export.tracking_uri(args.mlflow)
        view = f"MLflow runs in {args.mlflow}; view them with mlflow ui --backend-store-uri {uri}"
        targets["--mlflow"] = (args.mlflow, mlflow_export.require_mlflow, mlflow_export.write_to_store, view)
    if not targets:
        raise UsageError("export: nothing to write: give --tensorboard DIR, --mlflow FILE or both")
    found, skipped = exports.find_runs(args.paths)
    if not found:  # every run found was skipped: nothing was exported
        raise runs.RunError("export: no run exported: " + "; ".join(f"{s.path}: {s.reason}" for s in skipped))
    for one in skipped:
        say(f"skipped {one.path}: {one.reason}", file=sys.stderr)
    for flag, (_, require, _, _) in targets.items():
        try:
            require()
        except exports.MissingLibrary as err:
            raise UsageError(f"{flag}: {err}") from None
    for flag, (out, _, write, view) in targets.items():
        try:
            exported = write(found, Path(out))
        except exports.DestinationError as err:
            raise UsageError(f"{flag} {out}: {err}") from None
        except OSError as err:
            raise UsageError(
                f"{flag} {out}: cannot write: {runs.describe_os_error(err)}; choose a place you can write to"
            ) from None
        for one in exported.skipped:
            say(f"skipped {one.path}: {one.reason}", file=sys.stderr)
        for written in exported.written:
            run = written.found.run
            new = "" if written.new_steps is None else f", {written.new_steps} new"
            note = "" if written.found.finished else f"; {run.status}, not finished: the steps it has so far"
            say(f"{written.where}  ({written.steps} steps{new} of {run.path}{note})")
        say(f"attn export: {len(exported.written)} runs as {view}", file=sys.stderr)
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
    if not counts or not all(n.isascii() and n.isdigit() and len(n) <= 20 and int(n) >= 1 for n in counts):
        raise argparse.ArgumentTypeError(
            f"got {text!r}; expected a comma-separated list of thread counts >= 1, e.g. 1,2"
        )
    return [int(n) for n in counts]


def cmd_bench(args) -> int:
    from attn.bench import rivals, suite

    _check_bench_arguments(args)
    if args.board:
        from attn.board import bench as board_bench

        result = board_bench.measure_board(
            args.board_runs,
            args.board_megabytes,
            (args.board_code,) if args.board_code else (),
            progress=lambda message: say(f"bench: {message}", file=sys.stderr, flush=True),
        )
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stamp = result["date"].replace(" ", "-").replace(":", "")
        (out / f"board-{stamp}.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / f"board-{stamp}.md").write_text(board_bench.markdown(result))
        say(board_bench.markdown(result))
        say(out / f"board-{stamp}.json")
        sizes = (args.board_runs, args.board_megabytes)
        if sizes != (board_bench.TABLE_RUNS, board_bench.TABLE_MEGABYTES):
            say(
                f"docs/bench.md: not written: measured at {sizes[0]:,} runs and {sizes[1]:g} MB, not the table's "
                f"{board_bench.TABLE_RUNS:,} and {board_bench.TABLE_MEGABYTES:g}"
            )
        elif board_bench.doc_problem() is not None:  # no docs/ (an installed attn): the files above are the result
            say(f"docs/bench.md: not written: {board_bench.doc_problem()}")
        else:
            say(board_bench.write_board_block(result))
        return EXIT_OK

    if args.devices or args.devices_table:
        return _bench_devices(args)
    if (args.headline_code or args.rounds != 1) and not (args.headline or args.only):
        given = "--headline-code" if args.headline_code else "--rounds"
        raise UsageError(f"bench: {given}: applies to the headline's sweep; expected it with --headline or --only")
    for code in args.headline_code or ():
        _check_checkout(code, "bench")
    only = tuple(args.only or ())
    if only:
        from attn.bench.sweeps import HEADLINE
        from attn.experiment.spec import load_experiment

        load_experiment(HEADLINE, runs_dir=str(args.out), only=only)  # a bad --only says so before anything runs
    missing = [f for f in args.rivals if not rivals.available(f)]
    if missing:
        say(
            f"bench: not installed: {', '.join(missing)}; timing the rivals that are "
            "(make bench installs requirements-bench.txt)",
            file=sys.stderr,
        )
    result = suite.run_suite(
        args.sizes,
        args.threads,
        args.warmup,
        args.steps,
        processes=not args.no_processes,
        headline=args.headline,
        frameworks=args.rivals,
        progress=lambda message: say(f"bench: {message}", file=sys.stderr, flush=True),
        only=only,
        other_codes=tuple(Path(code) for code in args.headline_code or ()),
        rounds=args.rounds,
    )
    paths = suite.write(result, Path(args.out))
    say(suite.bench_markdown(result))
    for path in paths.values():
        say(path)
    return EXIT_OK


def _check_checkout(code, command: str, option: str = "--headline-code") -> None:
    """UsageError unless `code` (given as `option`) is a checkout of attn."""
    if not (Path(code) / "attn" / "__main__.py").is_file():
        raise UsageError(
            f"{command}: {option}: got {code}; expected a checkout of attn (a directory holding "
            "attn/__main__.py, e.g. one made with git worktree add or git archive)"
        )


def _check_bench_arguments(args) -> None:
    """What attn bench can refuse before it measures anything: modes given together, --board-code without
    --board or that is no checkout, an --out that is no directory."""
    modes = [flag for flag, given in (("--board", args.board), ("--devices", args.devices)) if given]
    modes += ["--devices-table"] if args.devices_table and not args.devices else []
    if len(modes) > 1:
        raise UsageError(f"bench: {' and '.join(modes)}: each is a bench of its own; expected one of them")
    if args.board_code is not None:
        if not args.board:
            raise UsageError("bench: --board-code: applies to the board's bench; expected it with --board")
        _check_checkout(args.board_code, "bench --board", "--board-code")
    if args.board:
        from attn.board import bench as board_bench

        problem = board_bench.doc_problem()
        if problem is not None and "not there" not in problem:  # found after minutes of measuring, otherwise
            raise UsageError(f"bench --board: {problem}")
    out = Path(args.out)
    there = next((p for p in (out, *out.parents) if p.exists()), None)  # the part of the path that exists
    if there is not None and not there.is_dir():
        raise UsageError(f"bench: --out: got {args.out}; expected a directory ({there} is not one)")


def _bench_devices(args) -> int:
    """attn bench --devices: each fast-path device's gain (attn.bench.device_gains), its files, the docs' table."""
    from attn import publish
    from attn.bench import device_gains

    if args.devices_table:
        result = device_gains.newest(Path(args.out))
        if result is None:
            raise UsageError(
                f"bench --devices-table: no devices-*.json with steps in {args.out}; run attn bench --devices"
            )
        say(publish.write_devices_block(result))
        return EXIT_OK
    if args.headline:
        raise UsageError("bench --devices: --headline: expected --only to sweep a part of the headline")
    if len(args.headline_code or ()) > 1:
        raise UsageError(f"bench --devices: --headline-code: got {len(args.headline_code)} checkouts; expected one")
    other = Path(args.headline_code[0]) if args.headline_code else None
    if other is not None:
        _check_checkout(other, "bench --devices")
    only = tuple(args.only or ())
    if only:
        from attn.experiment.spec import load_experiment

        load_experiment(device_gains.HEADLINE, runs_dir=str(args.out), only=only)  # a bad --only says so first
    result = device_gains.measure_devices(
        args.sizes,
        device_gains.HEADLINE_D_K,
        device_gains.ROUNDS,
        device_gains.CALLS,
        device_gains.WARMUP,
        lambda message: say(f"bench: {message}", file=sys.stderr, flush=True),
        only,
        args.rounds,
        other,
    )
    paths = device_gains.write_devices(result, Path(args.out))
    pooled = device_gains.newest(Path(args.out))
    say(device_gains.table(result))
    for path in paths.values():
        say(path)
    if pooled is None:  # a sweep or code comparison alone: the docs' table joins it to the steps measured in --out
        say(f"{publish.BENCH_DOC.name}: not written: no step measurements in {args.out} (attn bench --devices)")
    else:
        say(publish.write_devices_block(pooled))
    return EXIT_OK


def add_commands(sub) -> None:
    """The compare, runs, board and bench commands' arguments, on the subparsers `sub` (attn.cli.build_parser)."""
    from attn.board import bench as board_bench

    p = sub.add_parser("compare", help="overlay runs' curves (mean ± std over seeds) and tabulate them")
    p.add_argument("paths", nargs="+", metavar="PATH", help="run directories, directories of runs, or globs")
    p.add_argument(
        "--metric",
        action="append",
        help="a logged metric to plot; repeat for panels (default: eval_loss and eval_accuracy)",
    )
    p.add_argument("--x", default="step", choices=["step", "wall_time"], help="x axis (default: step)")
    p.add_argument(
        "--smooth",
        type=A_NUMBER,
        default=0.0,
        metavar="BETA",
        help="bias-corrected EMA smoothing by step in [0, 1), the raw curve drawn faint behind (default: 0, none)",
    )
    p.add_argument(
        "--threshold",
        type=A_NUMBER,
        default=outcomes.THRESHOLD,
        help=f"accuracy for `steps to` (default: {outcomes.THRESHOLD:g})",
    )
    p.add_argument(
        "--yscale",
        default="auto",
        choices=["auto", "log", "linear"],
        help="y axes; auto: log for losses, gradient norms and update ratios and for positive values "
        "spanning more than 3 decades, else linear",
    )
    p.add_argument(
        "--out",
        help="output directory (default: <dir>/compare when every run lies directly in "
        "one directory <dir>, else a new compare-<time> in the runs' deepest common directory)",
    )
    p.add_argument(
        "--where",
        action="append",
        metavar="KEY=VALUE",
        help="only the runs whose setting KEY (a "
        "dotted config key) has VALUE, typed as in an override; repeat to require several",
    )
    p.add_argument(
        "--group-by",
        nargs="+",
        metavar="KEY",
        help="group by these config keys only: seeds and every "
        "other setting are pooled in a group (default: every setting but the seed)",
    )
    p.add_argument("--facet", metavar="KEY", help="one row of panels per value of this config key")
    p.add_argument(
        "--xlim",
        type=_limits,
        metavar="LOW,HIGH",
        help="the x range of every panel; runs of very "
        "different lengths on one x axis: e.g. --xlim 0,500 shows the first 500 steps of all",
    )
    p.add_argument(
        "--all-y",
        action="store_true",
        help="y ranges that hold every finite value (default: the bulk "
        "of them, 5-95%% widened, so a diverged run's tail does not flatten the rest)",
    )
    p.add_argument(
        "--include-unfinished",
        action="store_true",
        help="count runs that did not finish (running, "
        "stale, interrupted, failed) in the table's statistics too (default: drawn, but left out)",
    )
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("runs", help="list runs: status, task, differing settings, final loss, age")
    p.add_argument("path", nargs="?", default="runs", help="a directory of runs (default: runs)")
    p.add_argument(
        "--status",
        help="only runs with this status (running, completed, diverged, interrupted, failed, stale, unknown)",
    )
    p.add_argument("--experiment", metavar="NAME", help="only the runs under PATH/NAME")
    p.add_argument(
        "--outcome",
        choices=outcomes.OUTCOMES,
        metavar="CLASS",
        help="only runs that ended so: " + ", ".join(outcomes.OUTCOMES) + " (attn/outcomes.py)",
    )
    p.set_defaults(func=cmd_runs)
    p = sub.add_parser("board", help="serve the run board: runs and experiments in a browser, live")
    p.add_argument(
        "paths",
        nargs="*",
        default=["runs"],
        metavar="PATH",
        help="run directories, directories of runs, or globs (default: runs)",
    )
    p.add_argument(
        "--port",
        type=_port,
        help=f"port to serve on (default: {DEFAULT_PORT}, or a free one if that is taken; 0: any free port)",
    )
    p.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on (default: {DEFAULT_HOST}, this machine only)"
    )
    p.add_argument(
        "--static",
        metavar="DIR",
        help="write the page with its data into DIR (opens from disk, no server) instead of serving it",
    )
    p.set_defaults(func=cmd_board)
    p = sub.add_parser("bench", help="time the training step against PyTorch and JAX; sweeps")
    p.add_argument("--sizes", type=_bench_sizes, default="default,wide,copy,large", help="which sizes (default: all)")
    p.add_argument("--threads", type=_thread_counts, default="1,2", help="thread counts to time at (default: 1,2)")
    p.add_argument("--steps", type=integer_at_least(1), default=50, help="timed steps per side and size (default: 50)")
    p.add_argument("--warmup", type=integer_at_least(0), default=10, help="untimed steps first (default: 10)")
    p.add_argument("--out", default="runs/bench", help="where the JSON and Markdown go (default: runs/bench)")
    p.add_argument(
        "--rivals",
        type=_rivals,
        default="torch,torch.compile,jax",
        help="rival frameworks to time, those installed (default: torch,torch.compile,jax)",
    )
    p.add_argument("--no-processes", action="store_true", help="skip peak memory and the sweep measurements")
    p.add_argument(
        "--headline",
        action="store_true",
        help="also time the headline experiment: every run of experiments/sqrt_dk.yaml swept on every core, report "
        "included: wall time, CPU seconds, cores busy, and its timeline as a figure beside the result",
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="KEY=V1,V2,...",
        help="time only the headline's cells whose grid KEY is one of these values (repeat: all must hold), "
        "and nothing else: a quick before/after measure; its files are headline-<time>.*, never published",
    )
    p.add_argument(
        "--headline-code",
        action="append",
        metavar="DIR",
        help="also sweep the headline with another checkout's code (e.g. git worktree add DIR main) in each "
        "round, the order turned each round; repeat for several",
    )
    p.add_argument(
        "--rounds",
        type=integer_at_least(1),
        default=1,
        help="how many times to sweep the headline (each code once a round; default: 1)",
    )
    p.add_argument(
        "--devices",
        action="store_true",
        help="instead, each fast-path device's gain, side by side with it switched off (attn.bench.devices), at "
        "these sizes and the headline's d_k; with --only, instead that part of the headline swept with the devices "
        "outside the step off (--rounds rounds); with --headline-code DIR, every device on, this checkout against "
        "DIR's (all removed against none: steps, and the --only sweep); the table goes into docs/bench.md",
    )
    p.add_argument(
        "--devices-table",
        action="store_true",
        help="write docs/bench.md's devices table from the measurements in --out (devices-*.json), measuring nothing",
    )
    p.add_argument(
        "--board",
        action="store_true",
        help="instead, the board at scale: /api/board with many runs "
        "(cold, and warm polls), /api/records of one huge metrics.jsonl (time, peak memory)",
    )
    p.add_argument(
        "--board-runs",
        type=integer_at_least(1),
        default=board_bench.TABLE_RUNS,
        help=f"runs for --board (default: {board_bench.TABLE_RUNS}, docs/bench.md's table)",
    )
    p.add_argument(
        "--board-megabytes",
        type=number_where(lambda v: 0 < v <= 1e5, "megabytes in (0, 100000]"),
        default=board_bench.TABLE_MEGABYTES,
        help=f"size of --board's big metrics.jsonl in MB (default: {board_bench.TABLE_MEGABYTES:g}, "
        "docs/bench.md's table)",
    )
    p.add_argument(
        "--board-code",
        metavar="DIR",
        help="also measure the board of another checkout (e.g. a worktree or git archive of an older commit), "
        "first, on the same files: the table sets the two side by side",
    )
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("export", help="write runs into TensorBoard event files or an MLflow store")
    p.add_argument("paths", nargs="+", metavar="PATH", help="run directories, directories of runs, or globs")
    p.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="write DIR/<run>/events.out.tfevents.* (open with tensorboard --logdir DIR)",
    )
    p.add_argument(
        "--mlflow",
        metavar="FILE",
        help="write into the SQLite MLflow store FILE (open with mlflow ui --backend-store-uri sqlite:///FILE)",
    )
    p.set_defaults(func=cmd_export)
