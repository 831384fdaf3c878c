"""Experiments: a base config, a grid of overrides and a list of seeds, run as
ordinary run directories under runs/<experiment>/, in parallel.

An experiment file (experiments/*.yaml):

    name: sqrt_dk                    # output folder: <runs_dir>/sqrt_dk/
    base: ../configs/default.yaml    # relative to the experiment file
    overrides: {train.steps: 600}    # applied to every cell
    grid:                            # a mapping: the cartesian product of its lists;
      model.d_k: [16, 64, 256]       # or a list of such mappings: the union of their products
      model.scale: [sqrt, none]
    seeds: [0, 1, 2, 3, 4]
    report: {x: model.d_k, arm: model.scale}   # how attn.report lays out the results

The `report:` section may name `x` (a grid key or a list of them), `arm`
(the same) and `best_of` (one grid key), each a key of the grid and each
key in one role only; anything else is refused, with a did-you-mean.

Every cell of every grid is validated before any run starts, each grid
point's config once (its seeds differ only in `seed`). The number of cells
(grid points x seeds) is computed from the grid's shape before anything is
expanded, and more than MAX_CELLS (`--max-cells` raises it) is refused.
Each (cell, seed) is one run directory named after its settings, e.g.
runs/sqrt_dk/d_k-64_scale-none_seed-3, or lr_mult-W_k0.1-W_q0.1_seed-0 for
a mapping (its items sorted by key); names hold only [A-Za-z0-9._=-].
Re-running an experiment skips runs that finished (completed or diverged),
resumes interrupted, stale or failed runs from their checkpoint, and starts
the rest; a finished or resumable run whose config.yaml differs from the
cell's config (config_change) is neither skipped nor resumed: it is a
`failed` outcome with status `config-changed` and the difference, so an
edited experiment file never silently reuses old runs. A cell is run under
its run directory's runs.RunLock, taken before its status is read, so two
sweeps (or a sweep and `attn train --resume`) never run the same cell at
once: the second one skips it (`skipped-locked`, naming the holder).

Stopping: SIGINT or SIGTERM in a local worker process sets that process's
stop flag (for good): its current run stops after the step with a
checkpoint (status `interrupted`), and every cell it is handed afterwards
is returned as `cancelled` without a run directory. The workers are started
with both signals blocked until that handler is in place, so a Ctrl-C while
they start up is kept, not lost or turned into a traceback.

The runner takes any concurrent.futures.Executor: a process pool (default,
one worker per core, each with one BLAS thread) or a Dask cluster's
`Client(address).get_executor()`; then the run directories are written by
the workers, and runs_dir must be a path they share.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fcntl
import functools
import itertools
import math
import os
import re
import signal
import threading
from concurrent.futures import FIRST_COMPLETED, CancelledError, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from attn import jobs, runs
from attn.config import (Config, ConfigError, all_keys, build, check_run_name, cut, nearest_key, read_yaml_file,
                         set_dotted, to_dict, validate, with_values)
from attn.train import StopFlag

EXPERIMENT_KEYS = ("name", "base", "overrides", "grid", "seeds", "report", "description")
REPORT_KEYS = ("x", "arm", "best_of")
FINISHED = ("completed", "diverged")
NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_POLL_SECONDS = 0.2  # how often the sweep checks should_stop while it waits for runs
MAX_CELLS = 10_000  # runs (grid points x seeds) one experiment may have unless --max-cells says more

# This process's stop flag when it is a local worker: set by SIGINT/SIGTERM
# (see _init_worker), never cleared; other executors' threads never set it.
_worker_stop = StopFlag()


@dataclass(frozen=True)
class Cell:
    """One run of an experiment: a validated config and where it goes."""

    name: str  # run directory name, e.g. d_k-64_scale-none_seed-3
    settings: tuple[tuple[str, object], ...]  # the grid values of this cell (dotted key, value)
    seed: int
    config: Config


@dataclass(frozen=True)
class Experiment:
    name: str
    path: Path
    cells: tuple[Cell, ...]
    grid_keys: tuple[str, ...]
    report: dict = field(default_factory=dict)
    description: str = ""

    @property
    def directory(self) -> Path:
        return Path(self.cells[0].config.runs_dir) / self.name


@dataclass(frozen=True)
class RunOutcome:
    """What happened to one cell in this sweep."""

    cell: str
    action: str  # ran | resumed | skipped-finished | skipped-locked | failed | cancelled
    status: str  # the run's status afterwards
    detail: str = ""  # error message, reason, or final figures


@functools.lru_cache(maxsize=16)
def _short_keys(keys: tuple[str, ...]) -> dict[str, str]:
    """Each key by its leaf where no other key shares it, else in full with '-' for '.'."""
    leaves = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: leaf if leaves.count(leaf) == 1 else key.replace(".", "-") for key, leaf in zip(keys, leaves)}


def _format_value(value) -> str:
    """A grid value as part of a run directory name: 0.001, sqrt, W_k0.1-W_q0.1
    for a mapping (sorted by key), a-b for a list; other characters than
    [A-Za-z0-9._=-] become `_`."""
    if isinstance(value, dict):
        text = "-".join(f"{k}{_format_value(v)}" for k, v in sorted(value.items(), key=lambda item: str(item[0])))
    elif isinstance(value, list):
        text = "-".join(_format_value(v) for v in value)
    else:
        text = f"{value:g}" if isinstance(value, float) else str(value)
    return NAME_UNSAFE.sub("_", text)


def cell_name(settings: tuple[tuple[str, object], ...], seed: int, grid_keys: list[str]) -> str:
    short = _short_keys(tuple(grid_keys))
    parts = [f"{short[k]}-{_format_value(v)}" for k, v in settings]
    return "_".join(parts + [f"seed-{seed}"])


def _expand_grid(grid, source: str, n_seeds: int, max_cells: int) -> list[dict]:
    """A mapping -> its cartesian product; a list of mappings -> the union of
    theirs. Refused before expanding when the points times n_seeds exceed max_cells."""
    blocks = grid if isinstance(grid, list) else [grid]
    if not blocks or any(not isinstance(b, dict) or not b for b in blocks):
        raise ConfigError(f"{source}: grid: expected a non-empty mapping of dotted key -> list of values "
                          "(or a list of such mappings)")
    for block in blocks:
        for key, values in block.items():
            if key not in all_keys() or key in ("seed", "name", "runs_dir"):
                suggestion = nearest_key(str(key))
                hint = f"; did you mean `{suggestion}`?" if suggestion else ""
                reason = "set with `seeds:`" if key == "seed" else "not a config field that a grid can vary"
                raise ConfigError(f"{source}: grid: `{cut(str(key))}`: {reason}{hint}")
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{source}: grid: {key}: got {cut(repr(values))}; expected a non-empty list of values")
    n_cells = sum(math.prod(len(values) for values in block.values()) for block in blocks) * n_seeds
    if n_cells > max_cells:
        raise ConfigError(f"{source}: grid: {n_cells:,} cells (grid points x {n_seeds} seeds) is more than the "
                          f"limit of {max_cells:,}; make the grid smaller, or raise the limit with --max-cells {n_cells}")
    cells = []
    for block in blocks:
        keys = list(block)
        for combo in itertools.product(*(block[k] for k in keys)):
            cells.append(dict(zip(keys, combo)))
    return cells


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f"; did you mean `{close[0]}`?" if close else ""


def check_report(report, grid_keys: list[str], source: str) -> dict:
    """The experiment's `report:` section: only REPORT_KEYS; x and arm a grid
    key or a list of them, best_of one grid key; no key in two roles."""
    if not isinstance(report, dict):
        raise ConfigError(f"{source}: report: got {cut(repr(report))}; expected a mapping with keys {', '.join(REPORT_KEYS)}")
    for key in report:
        if key not in REPORT_KEYS:
            raise ConfigError(f"{source}: report: unknown key `{cut(str(key))}`{_did_you_mean(key, REPORT_KEYS)}; "
                              f"expected {', '.join(REPORT_KEYS)}")
    role_of = {}
    for role in (r for r in REPORT_KEYS if r in report):
        value = report[role]
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names) \
                or (role == "best_of" and not isinstance(value, str)):
            expected = "one grid key" if role == "best_of" else "a grid key or a list of grid keys"
            raise ConfigError(f"{source}: report: {role}: got {cut(repr(value))}; expected {expected} ({', '.join(grid_keys)})")
        for name in names:
            if name not in grid_keys:
                raise ConfigError(f"{source}: report: {role}: `{cut(name)}` is not a key of the grid"
                                  f"{_did_you_mean(name, grid_keys)}; expected one of {', '.join(grid_keys)}")
            if name in role_of:
                raise ConfigError(f"{source}: report: {role}: `{name}` is already the report's {role_of[name]}; "
                                  "a grid key has one role")
            role_of[name] = role
    return report


def load_experiment(path: str | os.PathLike, runs_dir: str | None = None, max_cells: int = MAX_CELLS) -> Experiment:
    """Read and validate an experiment file: every cell's config is built and
    checked here, so a bad cell is reported before any run starts."""
    path = Path(path)
    data = read_yaml_file(path, "experiment file")
    source = str(path)
    unknown = [k for k in data if k not in EXPERIMENT_KEYS]
    if unknown:
        raise ConfigError(f"{source}: unknown key `{cut(str(unknown[0]))}`; expected one of {', '.join(EXPERIMENT_KEYS)}")
    for key in ("name", "base", "grid", "seeds"):
        if key not in data:
            raise ConfigError(f"{source}: missing `{key}`")
    name = check_run_name(data["name"], f"{source}: name")
    seeds = data["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise ConfigError(f"{source}: seeds: got {cut(repr(seeds))}; expected a non-empty list of distinct integers >= 0")
    overrides = data.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"{source}: overrides: got {cut(repr(overrides))}; expected a mapping of dotted key -> value")
    if not isinstance(data["base"], str) or not data["base"]:
        raise ConfigError(f"{source}: base: got {cut(repr(data['base']))}; expected the path of a config file")
    base_path = path.parent / data["base"]  # an absolute base stays as it is
    try:
        base = read_yaml_file(base_path)
    except ConfigError as err:
        raise ConfigError(f"{source}: base: {err}") from None
    base.pop("provenance", None)
    for key, value in overrides.items():
        set_dotted(base, str(key), value)
    if runs_dir is not None:
        base["runs_dir"] = runs_dir
    base_config = validate(build(Config, base, f"{source}: base + overrides"), f"{source}: base + overrides")

    grid_cells = _expand_grid(data["grid"], source, len(seeds), max_cells)
    grid_keys = list(dict.fromkeys(k for c in grid_cells for k in c))
    cells, names = [], set()
    for settings in grid_cells:
        shown = ", ".join(f"{k}: {cut(str(v))}" for k, v in settings.items())
        where = f"{source}: grid cell {{{shown}}}"
        config = with_values(base_config, settings, where)  # once per point: the seeds change nothing else
        for seed in seeds:
            cname = check_run_name(cell_name(tuple(settings.items()), seed, grid_keys), f"{where}: its run name")
            if cname in names:
                raise ConfigError(f"{source}: grid: cell {{{shown}}} appears twice")
            names.add(cname)
            cells.append(Cell(cname, tuple(settings.items()), seed, dataclasses.replace(config, seed=seed)))
    report = check_report(data.get("report") or {}, grid_keys, source)
    return Experiment(name, path, tuple(cells), tuple(grid_keys), report, str(data.get("description", "")))


# ---------------------------------------------------------------------------
# Running one cell (in a worker process, or a Dask worker)
# ---------------------------------------------------------------------------
def config_change(run_dir: Path, config: Config) -> list[str]:
    """How the config a run directory was made with differs from `config`
    ('key: stored -> wanted', jobs.config_difference), leaving out the
    jobs.RESULT_NEUTRAL_KEYS; [] when the run is the config's run. ConfigError
    if its config.yaml cannot be read."""
    return jobs.config_difference(jobs.config_of(run_dir), config, ignore=jobs.RESULT_NEUTRAL_KEYS)


def run_cell(cell: Cell, experiment_dir: str, experiment_file: str) -> RunOutcome:
    """Train one cell into experiment_dir/cell.name, unless the sweep was
    stopped, the run finished, or another writer holds it (skipped-locked).
    The run's RunLock is taken before its state is read. Every problem comes
    back as a `failed` outcome, never as an exception."""
    if _worker_stop.reason:
        return RunOutcome(cell.name, "cancelled", "not started",
                          f"the sweep was stopped by {_worker_stop.reason} before it started")
    _one_blas_thread()
    run_dir = Path(experiment_dir) / cell.name
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return RunOutcome(cell.name, "failed", "failed",
                          f"{run_dir}: cannot be used as the run directory ({type(err).__name__}: {err.strerror})")
    try:
        with runs.RunLock(run_dir, "sweep"):
            return _run_locked_cell(cell, run_dir, experiment_file)
    except runs.RunLocked as err:
        holder = err.holder
        who = (f"another sweep is running this cell (pid {holder.get('pid')} on {holder.get('host')})"
               if holder.get("purpose") == "sweep" else f"{runs.describe_holder(holder)} is running this cell")
        return RunOutcome(cell.name, "skipped-locked", "running", who)
    except (runs.RunError, ConfigError) as err:  # the run directory, its files, its checkpoint
        return RunOutcome(cell.name, "failed", "failed", str(err))
    except Exception as err:  # recorded in the run directory; never stops the other cells
        return RunOutcome(cell.name, "failed", "failed", f"{type(err).__name__}: {err}")


def _run_locked_cell(cell: Cell, run_dir: Path, experiment_file: str) -> RunOutcome:
    """run_cell's work, under the run's lock: skip, refuse a changed config, resume or start."""
    summary = runs.read_summary(run_dir) or {}
    finished = summary.get("status") in FINISHED
    resume = not finished and (run_dir / "config.yaml").exists() and (run_dir / "checkpoint.npz").exists()
    if finished or resume:
        diff = config_change(run_dir, cell.config)
        if diff:
            what = f"the run {summary['status']}" if finished else "the run has a checkpoint"
            return RunOutcome(cell.name, "failed", "config-changed",
                              f"{run_dir}: config differs from the experiment's: {'; '.join(diff)} "
                              f"({what}; move or delete its directory to run the cell with the new config)")
    if finished:
        return RunOutcome(cell.name, "skipped-finished", summary["status"], _figures(summary))
    if not resume:
        runs.write_config(run_dir, to_dict(cell.config),
                          {**jobs.provenance(experiment_file, []), "experiment": experiment_file,
                           "cell": dict(cell.settings), "seed": cell.seed})
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    summary = jobs.execute(cell.config, run_dir, resume=resume, stop=_worker_stop)
    return RunOutcome(cell.name, "resumed" if resume else "ran", summary["status"], _figures(summary))


_blas_lock = threading.Lock()
_blas_limits = []  # this worker process's one threadpool_limits, once set


def _one_blas_thread() -> None:
    """Cap this worker process's BLAS at one thread (cells run one per core),
    once, before its first cell. Once and not per cell: threadpoolctl finds
    the BLAS by walking the loaded libraries under the dynamic loader's lock
    while running Python, so a cell in another thread loading an extension
    module meanwhile (numpy.random on first use, matplotlib) deadlocks both;
    the other threads wait here until the walk is over."""
    from threadpoolctl import threadpool_limits

    with _blas_lock:
        if not _blas_limits:
            _blas_limits.append(threadpool_limits(limits=1))


def _figures(summary: dict) -> str:
    return runs.summary_figures(summary) + (f" ({summary['reason']})" if summary.get("reason") else "")


def _init_worker() -> None:
    """A local worker's first act: SIGINT/SIGTERM set its stop flag; then the
    signals blocked since it was spawned (see _stop_signals_blocked) arrive."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda received, _frame: _worker_stop.request(signal.Signals(received).name))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def _stop_signals_blocked():
    """Hold SIGINT/SIGTERM back in this thread; processes spawned meanwhile
    inherit the blocked mask. Held signals are delivered at the end."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


# ---------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------
def default_executor(workers: int | None = None) -> Executor:
    import multiprocessing

    return ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1,
                               mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker)


def executor_from_address(address: str) -> Executor:
    """`dask://HOST:PORT` -> that Dask cluster's executor."""
    if not address.startswith("dask://"):
        raise ConfigError(f"--executor: got {address!r}; expected dask://HOST:PORT (or omit it for local processes)")
    try:
        from distributed import Client
    except ImportError:
        raise ConfigError("--executor dask://...: the `distributed` package is not installed") from None
    try:
        client = Client(f"tcp://{address.removeprefix('dask://')}", timeout="10s")
    except OSError as err:
        raise ConfigError(f"--executor: cannot reach the Dask scheduler at {address}: {err}") from None
    return DaskExecutor(client)


class DaskExecutor(Executor):
    """A Dask client's executor that closes the client when it shuts down
    (else the client outlives the sweep, retrying a scheduler that is gone)."""

    def __init__(self, client):
        self.client, self._executor = client, client.get_executor()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        return self._executor.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, **_) -> None:
        self._executor.shutdown(wait)
        self.client.close()


def run_experiment(experiment: Experiment, executor: Executor,
                   on_outcome: Callable[[RunOutcome], None] | None = None,
                   should_stop: Callable[[], bool] = lambda: False) -> list[RunOutcome]:
    """Submit every cell, report each outcome as it arrives; never stops on a
    failure. Once should_stop() is true, cells not yet handed to a worker are
    cancelled (outcome `cancelled`, status `not started`)."""
    experiment.directory.mkdir(parents=True, exist_ok=True)
    with _stop_signals_blocked():  # a local pool spawns its workers here
        futures: dict[Future, Cell] = {
            executor.submit(run_cell, cell, str(experiment.directory), str(experiment.path)): cell
            for cell in experiment.cells
        }
    outcomes, pending = [], set(futures)
    while pending:
        done, pending = wait(pending, timeout=STOP_POLL_SECONDS, return_when=FIRST_COMPLETED)
        if should_stop():
            for future in pending:
                future.cancel()
        for future in done:
            cell = futures[future]
            try:
                outcome = future.result()
            except CancelledError:
                outcome = RunOutcome(cell.name, "cancelled", "not started", "the sweep was stopped before it started")
            except Exception as err:  # the worker itself died
                outcome = RunOutcome(cell.name, "failed", "failed", f"worker error: {type(err).__name__}: {err}")
            outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
    return outcomes


@contextlib.contextmanager
def active_sweep(experiment: Experiment):
    """While inside, this process counts as a running sweep of the experiment
    (a shared flock on <experiment>/.sweeps.lock). Yields last_one_out(): it
    ends this sweep's hold and tells whether no other sweep of the experiment
    is still running; if none is, it holds the lock exclusively until the end
    of the block. Of several sweeps running together, the last to finish
    writes the report; a sweep started meanwhile waits for it."""
    try:
        experiment.directory.mkdir(parents=True, exist_ok=True)
        lock = open(experiment.directory / ".sweeps.lock", "a")
    except OSError as err:
        raise runs.RunError(f"{experiment.directory}: cannot create the experiment directory: {err.strerror}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_SH)

        def last_one_out() -> bool:
            fcntl.flock(lock, fcntl.LOCK_UN)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        yield last_one_out


def signal_workers(executor: Executor, signum: int) -> None:
    """Pass a signal on to a local process pool's workers, so that each
    checkpoints its run (a terminal's Ctrl-C reaches them anyway)."""
    for process in (getattr(executor, "_processes", None) or {}).values():
        try:
            os.kill(process.pid, signum)
        except (ProcessLookupError, AttributeError):
            pass
