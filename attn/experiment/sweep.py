"""Running an experiment: its cells as ordinary run directories under
runs/<experiment>/, stacked (attn.train.stack) and in parallel.

The experiment file itself, its grid and its cells are attn.experiment.spec's.
Cells of one shape train as one stack (plan_stacks: at most
attn.train.stack.members_per_stack of them, the costliest stacks first; the
last stacks split, split_tail, so that the workers finish together). Re-running
an experiment skips runs that finished (completed or diverged), resumes
interrupted, stale or failed runs from their checkpoint, and starts the
rest; a finished or resumable run whose config.yaml differs from the
cell's config (experiment.config_change) is neither skipped nor resumed: it
is a `failed` outcome with status `config-changed` and the difference, so
an edited experiment file never silently reuses old runs. (A finished run
that differs only in how the same maths was computed, an `algorithm` field
such as model.width_free, is the cell's, as in its report: skipped.) A cell is run
under its run directory's locks.RunLock, taken before its status is read,
so two sweeps (or a sweep and `attn train --resume`) never run the same
cell at once: the second one skips it (`skipped-locked`, naming the
holder). A cell refused before its stack trains is reported when the stack ends.

Stopping: SIGINT or SIGTERM in a local worker process sets that process's
stop flag (for good): its current stack stops after the step with a
checkpoint of every member (status `interrupted`), and every stack it is
handed afterwards is returned as `cancelled` without run directories. The
workers are started with both signals blocked until that handler is in
place, so a Ctrl-C while they start up is kept, not lost or turned into a
traceback.

The runner takes any concurrent.futures.Executor: a process pool (default,
one worker per core, each with one BLAS thread) or a Dask cluster's
`Client(address).get_executor()`; then the run directories are written by
the workers, and runs_dir must be a path they share.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import queue
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, CancelledError, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from attn.config.schema import to_dict
from attn.config.yamlio import ArgumentError, ConfigError
from attn.experiment import report_spec, timeline
from attn.experiment.spec import Cell, Experiment, config_change, result_change
from attn.store import locks, processes, runs, runstate
from attn.text import summary_figures
from attn.train import lifecycle
from attn.train.loop import StopFlag, WriteLog
from attn.train.stack import members_per_stack, stack_cost, stack_key

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_POLL_SECONDS = 0.2  # how often the sweep checks should_stop while it waits for runs

# This process's stop flag when it is a local worker: set by SIGINT/SIGTERM
# (see _init_worker), never cleared; other executors' threads never set it.
_worker_stop = StopFlag()
# A local worker's queue to the sweep (LocalPool.started): the names of the cells of each stack as it starts.
_started = None


UNKNOWN = "unknown (the scheduler was lost)"  # the status of a cell whose stack a lost Dask scheduler had


@dataclass(frozen=True)
class CellAction:
    """What happened to one cell in this sweep."""

    cell: str
    action: str  # ran | resumed | skipped-finished | skipped-locked | failed | cancelled | unknown
    status: str  # the run's status afterwards (UNKNOWN when the executor lost track of it)
    detail: str = ""  # error message, reason, or final figures
    train_seconds: float = 0.0  # this cell's share of its stack's training time (the stack's over its members)


class StackOutcomes(list):
    """run_cells' outcomes, one per cell, carrying `timing`: the stack's record for the sweep's
    timeline (attn.experiment.timeline.StackClock)."""

    def __init__(self, outcomes: list[CellAction], timing: dict):
        super().__init__(outcomes)
        self.timing = timing


def run_cells(cells: list[Cell], experiment_dir: str, experiment_file: str) -> StackOutcomes:
    """Train cells of one shape into experiment_dir/<cell name> as one stack
    (attn.train.loop; those resuming from different steps as one stack per step),
    each unless the sweep was stopped, the run finished, or another writer
    holds it (skipped-locked). Each run's RunLock is taken before its state
    is read and held until its stack ends. Every problem comes back as a
    `failed` outcome, never as an exception; one outcome per cell, in order,
    with the stack's record for the sweep's timeline (StackOutcomes.timing)."""
    clock, write_log = timeline.StackClock(), WriteLog()
    if _worker_stop.reason:
        cancelled = [
            CellAction(
                c.name, "cancelled", "not started", f"the sweep was stopped by {_worker_stop.reason} before it started"
            )
            for c in cells
        ]
        return StackOutcomes(cancelled, clock.record(write_log, len(cells), 0))
    _one_blas_thread()
    outcomes: dict[str, CellAction] = {}
    trained = 0
    # what made the stack's runs (the code's commit, the machine, the BLAS), asked once a stack: it asks git
    made = functools.cache(lambda: lifecycle.provenance(experiment_file, []))
    with contextlib.ExitStack() as held:
        ready: dict[int, list[tuple[Cell, runstate.RunState]]] = {}  # start step -> the cells to train from it
        for cell in cells:
            prepared = _claim(cell, Path(experiment_dir) / cell.name, experiment_file, held, made)
            if isinstance(prepared, CellAction):
                outcomes[cell.name] = prepared
            else:
                ready.setdefault(prepared.step, []).append((cell, prepared))
        clock.training()
        for group in ready.values():
            if _started is not None:
                _started.put([cell.name for cell, _ in group])
            start = time.perf_counter()
            try:
                summaries = lifecycle.execute_stack(
                    [state for _, state in group], stop=_worker_stop, write_log=write_log
                )
            except (runs.RunError, ConfigError) as err:  # the run directories, their files
                summaries = [{"status": "failed", "reason": str(err)}] * len(group)
            except Exception as err:  # recorded in the run directories; never stops the other cells
                summaries = [{"status": "failed", "reason": f"{type(err).__name__}: {err}"}] * len(group)
            share = (time.perf_counter() - start) / len(group)
            trained += len(group)
            for (cell, state), summary in zip(group, summaries):
                action = "failed" if summary["status"] == "failed" else "resumed" if state.resumed else "ran"
                detail = summary["reason"] if action == "failed" else _figures(summary)
                outcomes[cell.name] = CellAction(cell.name, action, summary["status"], detail, share)
    return StackOutcomes([outcomes[cell.name] for cell in cells], clock.record(write_log, len(cells), trained))


def _claim(cell: Cell, run_dir: Path, experiment_file: str, held: contextlib.ExitStack, made: Callable[[], dict]):
    """Take the cell's run directory (its RunLock, entered on `held`) and
    the state to train it from; or the outcome that says why not. `made`:
    the provenance of the stack's new runs (lifecycle.provenance)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        held.enter_context(locks.RunLock(run_dir, "sweep"))
    except OSError as err:
        return CellAction(
            cell.name,
            "failed",
            "failed",
            f"{run_dir}: cannot be used as the run directory ({type(err).__name__}: {err.strerror})",
        )
    except locks.RunLocked as err:
        holder = err.holder
        who = (
            f"another sweep is running this cell (pid {holder.get('pid')} on {holder.get('host')})"
            if holder.get("purpose") == "sweep"
            else f"{locks.describe_holder(holder)} is running this cell"
        )
        return CellAction(cell.name, "skipped-locked", "running", who)
    except runs.RunError as err:
        return CellAction(cell.name, "failed", "failed", str(err))
    try:
        return _prepare_locked_cell(cell, run_dir, experiment_file, made)
    except (runs.RunError, ConfigError) as err:  # the run directory, its files, its checkpoint
        return CellAction(cell.name, "failed", "failed", str(err))
    except Exception as err:
        return CellAction(cell.name, "failed", "failed", f"{type(err).__name__}: {err}")


def _prepare_locked_cell(cell: Cell, run_dir: Path, experiment_file: str, made: Callable[[], dict]):
    """Under the run's lock: skip a finished run (one made with another
    algorithm too: spec.result_change), refuse a changed config, else the
    state to resume or start it from (only from a run of this very config)."""
    summary = runs.read_summary(run_dir) or {}
    finished = summary.get("status") in runs.FINISHED
    resume = not finished and (run_dir / "config.yaml").exists() and (run_dir / "checkpoint.npz").exists()
    if finished or resume:  # a finished run of the same maths done another way is the cell's; a resume is not
        diff = (result_change if finished else config_change)(lifecycle.config_of(run_dir), cell.config)
        if diff:
            what = f"the run {summary['status']}" if finished else "the run has a checkpoint"
            return CellAction(
                cell.name,
                "failed",
                "config-changed",
                f"{run_dir}: config differs from the experiment's: {'; '.join(diff)} "
                f"({what}; move or delete its directory to run the cell with the new config)",
            )
    if finished:
        return CellAction(cell.name, "skipped-finished", summary["status"], _figures(summary))
    if resume:
        return lifecycle.prepare_resume(cell.config, run_dir)
    runs.write_config(
        run_dir,
        to_dict(cell.config),
        {
            **made(),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "experiment": experiment_file,
            "cell": dict(cell.settings),
            "seed": cell.seed,
            "head": lifecycle.head_provenance(cell.config),
        },
    )
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    return runstate.prepare(cell.config, run_dir)


_blas_lock = threading.Lock()
_blas_limits = []  # this worker process's one threadpool_limits, once set


def _one_blas_thread() -> None:
    """Cap this worker process's BLAS at one thread (stacks run one per core),
    once, before its first stack. Once and not per stack: threadpoolctl finds
    the BLAS by walking the loaded libraries under the dynamic loader's lock
    while running Python, so a stack in another thread loading an extension
    module meanwhile (numpy.random on first use, matplotlib) deadlocks both;
    the other threads wait here until the walk is over."""
    from threadpoolctl import threadpool_limits

    with _blas_lock:
        if not _blas_limits:
            _blas_limits.append(threadpool_limits(limits=1))


def plan_stacks(cells) -> list[list[Cell]]:
    """The cells as stacks to train, in the order to hand them out: those of
    one shape (stack_key) together, as few stacks of at most members_per_stack
    as hold them, their sizes differing by one at most (20 cells of a shape
    that stacks 16: 10 and 10, not 16 and 4); the most costly stacks first
    (stack_cost), so that the long ones start early."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(stack_key(cell.config), []).append(cell)
    stacks = []
    for group in groups.values():
        stacks += _even_parts(group, -(-len(group) // members_per_stack(group[0].config)))
    return sorted(stacks, key=lambda stack: -stack_cost([c.config for c in stack]))


def split_tail(stacks: list[list[Cell]], workers: int) -> list[list[Cell]]:
    """The planned stacks (plan_stacks), their last ones split so that the workers finish together: a
    stack handed out when `remaining` work is left (its own cost and that of every stack after it) is
    split into even parts of at most remaining / workers each (to single cells at most), since a worker
    that takes more than its share of what is left trains on while the others run out of work. A member
    of a stack trains as it would alone (attn.train.stack), so splitting one changes no run's numbers."""
    if workers < 2:
        return list(stacks)
    planned, remaining = [], 0
    for stack in reversed(stacks):
        cost = stack_cost([c.config for c in stack])
        remaining += cost
        parts = min(len(stack), math.ceil(cost * workers / remaining))
        planned += reversed(_even_parts(stack, parts))
    return planned[::-1]


def _even_parts(cells: list[Cell], parts: int) -> list[list[Cell]]:
    """cells in order as `parts` runs of consecutive cells, their sizes differing by one at most."""
    size, larger = divmod(len(cells), parts)
    bounds = [i * size + min(i, larger) for i in range(parts + 1)]
    return [cells[a:b] for a, b in zip(bounds, bounds[1:])]


def _figures(summary: dict) -> str:
    return summary_figures(summary) + (f" ({summary['reason']})" if summary.get("reason") else "")


def _init_worker(started=None, parent: int | None = None) -> None:
    """A local worker's first act: die with the sweep (`parent`) even when it is
    killed outright (else the worker trains on, holding its runs, then waits
    forever on a queue no one feeds: SIGKILL, so its runs are left as a killed
    sweep leaves them, stale, for the sweep again to resume); keep the sweep's
    queue of started cells; SIGINT/SIGTERM set its stop flag; then the signals
    blocked since it was spawned (see _stop_signals_blocked) arrive."""
    global _started
    if parent is not None:
        processes.die_with(parent, signal.SIGKILL)
    _started = started
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
class LocalPool(ProcessPoolExecutor):
    """The default executor: spawned worker processes (_init_worker), and
    `started`, the queue on which they name the cells of each stack as it
    starts training (a future's running() says only that it was handed on)."""

    def __init__(self, workers: int | None = None):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.started = context.Queue()
        super().__init__(
            max_workers=workers or os.cpu_count() or 1,
            mp_context=context,
            initializer=_init_worker,
            initargs=(self.started, os.getpid()),
        )


def default_executor(workers: int | None = None) -> Executor:
    return LocalPool(workers)


def worker_slots(executor: Executor) -> int:
    """How many stacks the executor trains at once: a local pool's workers, a Dask cluster's threads;
    one for an executor that does not say."""
    if isinstance(executor, DaskExecutor):
        with contextlib.suppress(Exception):
            return max(1, sum(w.get("nthreads", 1) for w in executor.client.scheduler_info()["workers"].values()))
        return 1
    return getattr(executor, "_max_workers", None) or 1


def check_address(address: str) -> None:
    """ArgumentError unless `address` has the form dask://HOST:PORT (an IPv6 HOST in brackets)."""
    host, _, port = address.removeprefix("dask://").rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if not (
        address.startswith("dask://")
        and host
        and (":" not in host or bracketed)
        and port.isascii()
        and port.isdigit()
        and 0 < int(port) < 65536
    ):
        raise ArgumentError(
            "address",
            f"got {address!r}; expected dask://HOST:PORT with PORT in 1-65535, an IPv6 "
            "HOST in brackets (or omit it for local processes)",
        )


def executor_from_address(address: str) -> Executor:
    """`dask://HOST:PORT` -> that Dask cluster's executor."""
    check_address(address)
    try:
        from distributed import Client
    except ImportError:
        raise ArgumentError("address", "the `distributed` package is not installed", shown="dask://...") from None
    try:
        client = Client(f"tcp://{address.removeprefix('dask://')}", timeout="10s")
    except (OSError, ValueError) as err:  # ValueError: an address distributed cannot parse
        raise ArgumentError("address", f"cannot reach the Dask scheduler at {address}: {err}") from None
    return DaskExecutor(client)


class DaskExecutor(Executor):
    """A Dask client's executor that closes the client when it shuts down
    (else the client outlives the sweep, retrying a scheduler that is gone).
    While it is open, distributed's own log lines (a lost scheduler's
    tracebacks) are silenced: lost() says what happened, and the sweep
    reports it. lost() is why the cluster can no longer say what became of
    a stack (the scheduler was lost), or None while it can."""

    LOGGERS = ("distributed", "tornado")

    def __init__(self, client):
        self.client, self._executor = client, client.get_executor()
        names = [name for name in logging.root.manager.loggerDict if name.split(".")[0] in self.LOGGERS]
        self._levels = {name: logging.getLogger(name).level for name in {*self.LOGGERS, *names}}
        for name in self._levels:
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)

    def submit(self, fn, /, *args, **kwargs) -> Future:
        return self._executor.submit(fn, *args, **kwargs)

    def lost(self) -> str | None:
        return None if self.client.status in ("running", "newly-created") else "the scheduler was lost"

    def shutdown(self, wait: bool = True, **_) -> None:
        try:
            if self.lost():
                return  # nothing to wait for: the futures died with the scheduler (their workers may still run)
            self._executor.shutdown(wait)
        finally:
            with contextlib.suppress(Exception):
                self.client.close()
            for name, level in self._levels.items():
                logging.getLogger(name).setLevel(level)


def run_experiment(
    experiment: Experiment,
    executor: Executor,
    on_outcome: Callable[[CellAction], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    on_start: Callable[[list[str]], None] | None = None,
    record: timeline.Timeline | None = None,
) -> list[CellAction]:
    """Submit every stack of cells (plan_stacks), report each cell's outcome
    as its stack ends; never stops on a failure. Once should_stop() is true,
    stacks not yet handed to a worker are cancelled (outcome `cancelled`,
    status `not started`). A stack whose fate the executor lost (a Dask
    scheduler gone: its worker may have finished it, or still be training
    it) is `unknown`, status UNKNOWN, detail the executor's lost(). With a LocalPool, on_start(cell names) is called
    as each stack starts training (the cells it trains, not those skipped),
    within STOP_POLL_SECONDS, and never after one of those cells' outcome
    (a start that arrives later is dropped); other executors report no starts.
    `record`: the sweep's timeline, given its plan and train phases and each stack."""
    phase = record.phase if record is not None else lambda _name: contextlib.nullcontext()
    with phase("plan"):
        experiment.directory.mkdir(parents=True, exist_ok=True)
        freeze_claims(experiment)
        plan = split_tail(plan_stacks(experiment.cells), worker_slots(executor))
        with _stop_signals_blocked():  # a local pool spawns its workers here
            futures: dict[Future, list[Cell]] = {
                executor.submit(run_cells, stack, str(experiment.directory), str(experiment.path)): stack
                for stack in plan
            }
        planned = (
            {
                id(stack): {"stack": index, "cost": stack_cost([c.config for c in stack])}
                for index, stack in enumerate(plan)
            }
            if record is not None
            else {}
        )
    with phase("train"):
        return _collect(futures, executor, planned, on_outcome, should_stop, on_start, record)


def _collect(futures, executor, planned, on_outcome, should_stop, on_start, record) -> list[CellAction]:
    """run_experiment's outcomes as the stacks end (see there); each stack's timing, with its place in
    the plan and its cost (`planned`), into `record`."""
    outcomes, pending, ended, cancelled = [], set(futures), set(), set()
    while pending:
        done, pending = wait(pending, timeout=STOP_POLL_SECONDS, return_when=FIRST_COMPLETED)
        for names in _drained(getattr(executor, "started", None)):
            fresh = [name for name in names if name not in ended]
            if on_start is not None and fresh:
                on_start(fresh)
        if should_stop():
            cancelled.update(future for future in pending if future.cancel())
        lost = getattr(executor, "lost", lambda: None)()
        for future in done:
            stack = futures[future]
            try:
                arrived = future.result()
                if record is not None and getattr(arrived, "timing", None) is not None:
                    record.stack({**arrived.timing, **planned[id(stack)]})
            except CancelledError:  # by this sweep's stop, or by a cluster that lost its scheduler
                arrived = (
                    [
                        CellAction(c.name, "cancelled", "not started", "the sweep was stopped before it started")
                        for c in stack
                    ]
                    if future in cancelled
                    else [CellAction(c.name, "unknown", UNKNOWN, lost or "the scheduler was lost") for c in stack]
                )
            except Exception as err:  # the worker itself died, or the cluster lost track of it
                arrived = (
                    [CellAction(c.name, "unknown", UNKNOWN, lost) for c in stack]
                    if lost
                    else [
                        CellAction(c.name, "failed", "failed", f"worker error: {type(err).__name__}: {err}")
                        for c in stack
                    ]
                )
            for outcome in arrived:
                ended.add(outcome.cell)
                outcomes.append(outcome)
                if on_outcome is not None:
                    on_outcome(outcome)
    return outcomes


def freeze_claims(experiment: Experiment) -> Path:
    """The experiment's claims as its first sweep found them (report_spec.claims_record: the
    report section's layout, selection rule, level, seeds and expectations, with their digest),
    written to <experiment dir>/claims.json when it starts the first time, and kept after: a
    report compares the file's claims with these; `runs_before` counts the cells that had run
    directories already (an experiment swept before attn froze claims): those claims were not
    frozen before those runs. Its path."""
    path = experiment.directory / report_spec.CLAIMS_FILE
    if not path.exists():
        experiment.directory.mkdir(parents=True, exist_ok=True)
        record = report_spec.claims_record(experiment.report, {c.seed for c in experiment.cells})
        before = sum((experiment.directory / cell.name / "config.yaml").exists() for cell in experiment.cells)
        runs.write_json(
            path,
            {
                **record,
                "experiment": str(experiment.path),
                "runs_before": before,
                "frozen_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
        )
    return path


def _drained(started) -> list[list[str]]:
    """Every start waiting on a LocalPool's queue (none for other executors)."""
    found = []
    while started is not None:
        try:
            found.append(started.get_nowait())
        except queue.Empty:
            break
    return found


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
    except OSError as err:
        raise runs.RunError(f"{experiment.directory}: cannot create the experiment directory: {err.strerror}") from None
    with locks.SharedLock(experiment.directory / ".sweeps.lock") as last_one_out:
        yield last_one_out


def signal_workers(executor: Executor, signum: int) -> None:
    """Pass a signal on to a local process pool's workers, so that each
    checkpoints its run (a terminal's Ctrl-C reaches them anyway): this
    process's multiprocessing children, as a sweep's process starts no others."""
    import multiprocessing

    if not isinstance(executor, LocalPool):
        return
    for process in multiprocessing.active_children():
        try:
            os.kill(process.pid, signum)
        except ProcessLookupError:
            pass
