"""The training loop: config -> task batches -> forward/backward -> optimiser -> run directory.

    summary = train(config, run_dir)                  # one run: a stack of one
    summaries = run_stack([state, ...], stop=stop)    # runs of one shape (attn.train.stack) as one computation

To learn how attn trains, read attn.train.reference_loop first: the same
loop for one run, on one page, held to this one bit for bit by
tests/test_reference_loop.py. Here the iteration (_iterate) runs over a
member axis: each run starts from its attn.store.runstate.RunState
(prepare), numbers its steps as runstate says and checkpoints through
runstate.save_checkpoint; every member of a stack keeps its own numbers,
summary and run directory, and a member that ends (completes, diverges,
is stopped) leaves the stack at the end of that iteration.

Non-finite values: a NaN/inf loss or gradient at iteration s is logged with
a `nonfinite` field naming what went wrong. With train.on_nonfinite = stop
the run ends there, status `diverged`; with `continue` update s + 1 is
skipped and the run goes on (summary `nonfinite_steps` counts them).

Stopping: a StopFlag set (by a signal handler) ends every member after the
current iteration with a checkpoint, status `interrupted`. A
KeyboardInterrupt ends them at once, without a checkpoint (the parameters
may be half-updated): status `interrupted`, and resuming continues from
the last checkpoint written; an error ends them the same way, status
`failed`. Either way every member's summary on disk says how it ended,
also one whose final summary the interruption cut short (_record_stop).

Disk: a stack's members write at the same moments (checkpoints, summaries,
snapshots), each durable write waiting on its fsync, one member after
another (DurableWrites), and the iteration goes on once all are on disk.
A WriteLog given to run_stack keeps when each of those moments began and
how long the loop waited on it (a sweep's timeline, attn.experiment.timeline).

This module never prints; `progress(step, record)` is called after every
iteration (record is None except on logged steps).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import numpy as np

from attn import optim, outcomes
from attn.config.schema import Config
from attn.model import fast, mechanism
from attn.model.fast import Batch
from attn.store import arrayfiles, runs
from attn.store.runstate import RunState, keep_retained, linked_checkpoint_step, prepare, save_checkpoint
from attn.train.stack import Stack, member_batch, stack_key

HEARTBEAT_SECONDS = 5.0  # while running, summary.json (step, best, heartbeat) is rewritten this often


class StopFlag:
    """Set by a signal handler; the loop stops cleanly after the current update."""

    def __init__(self):
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        self.reason = reason


def train(
    config: Config,
    run_dir: Path,
    *,
    resume: bool = False,
    stop: StopFlag | None = None,
    progress: Callable[[int, dict | None], None] | None = None,
) -> dict:
    """Train `config`, recording into `run_dir` (which holds config.yaml already).

    Returns the final summary (also in summary.json): status `completed`,
    `interrupted` (stop requested; checkpointed) or `diverged`.
    """
    return run(prepare(config, run_dir, resume=resume), stop=stop, progress=progress)


def run(
    state: RunState, *, stop: StopFlag | None = None, progress: Callable[[int, dict | None], None] | None = None
) -> dict:
    """One run, from `state` to the end (or a stop, or divergence): a stack of one."""
    member_progress = None if progress is None else (lambda _member, step, record: progress(step, record))
    return run_stack([state], stop=stop, progress=member_progress)[0]


class Member:
    """One run of a stack while it trains: its state, summary and clock, and
    its index in the list of states it was given with (for `progress`)."""

    def __init__(self, state: RunState, index: int, stack_size: int):
        self.state, self.config, self.run_dir, self.index = state, state.config, state.run_dir, index
        self.summary = {
            "status": "running",
            "step": state.step,
            "steps": state.config.train.steps,
            "task": state.task.name,
            "references": state.task.reference_losses(),
            "started_at": time.time(),
            "resumed_from": state.step if state.resumed else None,
            "best": state.best,
            "nonfinite_steps": state.nonfinite_steps,
            "stack_size": stack_size,
        }
        self.summary_on_disk: dict | None = None  # the summary as _write_summary last wrote it
        self.clock = _Clock(state.wall_time, state.step)
        self.final_record = None
        self.written: dict[str, dict] = {}  # array file name -> the arrays this member last wrote to it

    def add_arrays(self, name: str, arrays: dict, keep: bool) -> None:
        """The run's array file `name` written with `arrays`; with keep, beside (and over) those it holds,
        read from disk only if this member has not written it yet (a resumed run's first time)."""
        path = self.run_dir / name
        if keep:
            earlier = self.written.get(name)
            if earlier is None and path.exists():
                earlier = arrayfiles.load_arrays(path)
            arrays = {**(earlier or {}), **arrays}
        arrayfiles.save_arrays(path, arrays)
        self.written[name] = arrays

    def lr(self, step: int) -> float:
        return optim_lr(self.config, step)

    def should_log(self, step: int) -> bool:
        return step % self.config.logging.log_every == 0 or step == self.config.train.steps

    def should_checkpoint(self, step: int) -> bool:
        return step % self.config.logging.checkpoint_every == 0 or step == self.config.train.steps

    def ending_at(self, step: int, fault: tuple[str, str] | None) -> tuple[str, str | None] | None:
        """(status, reason) if iteration `step` is the member's last: it
        completed, or diverged with on_nonfinite = stop; else None."""
        if fault is not None and self.config.train.on_nonfinite == "stop":
            what, note = fault
            return "diverged", f"non-finite {what} at step {step}{note}"
        return ("completed", None) if step == self.config.train.steps else None


def run_stack(
    states: list[RunState],
    *,
    stop: StopFlag | None = None,
    progress: Callable[[int, int, dict | None], None] | None = None,
    write_log: WriteLog | None = None,
) -> list[dict]:
    """Train every member from its state to its end; returns their final
    summaries (also in each summary.json), in the order of `states`.
    `progress(member index, step, record)` after each member's iteration;
    `write_log` is told of every moment the loop waited on durable writes."""
    steps_at = {s.step for s in states}
    if len(steps_at) != 1 or len({stack_key(s.config) for s in states}) != 1:
        raise ValueError("the members of a stack share their shapes (stack_key) and start at one step")
    stop = stop or StopFlag()
    members = [Member(state, i, len(states)) for i, state in enumerate(states)]
    writes = DurableWrites(write_log)
    writes.each(_claim_run_directory, members)
    stack, alive = Stack(states), members  # alive: the members still training, in stack order
    step, last_write = steps_at.pop(), time.perf_counter()
    try:
        # Overflow to inf/NaN is detected and handled here, not warned about.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            while alive:
                alive = _iterate(stack, alive, step, stop, progress, writes)
                step += 1
                if time.perf_counter() - last_write > HEARTBEAT_SECONDS:
                    writes.each(_write_summary, alive)
                    last_write = time.perf_counter()
    except BaseException as err:
        for member in members:
            _record_stop(member, step, err)
        raise
    return [member.summary for member in members]


def _record_stop(member: Member, step: int, err: BaseException) -> None:
    """The member's summary as the loop ends by `err` during iteration `step`. A member still running is
    `interrupted` (a KeyboardInterrupt: a second signal; the reason names the checkpoint a resume continues
    from) or `failed` (an error; its traceback is the caller's to keep), at the step it last logged. A member
    that had ended but whose final summary the signal cut short is written again. Another signal meanwhile
    makes the write again (each write is atomic); a write the disk refuses is left to the caller, who
    re-raises `err`."""
    if member.summary["status"] == "running":
        if isinstance(err, KeyboardInterrupt):
            last = linked_checkpoint_step(member.run_dir)  # on disk: the signal may have come mid-checkpoint
            resumable = f"resume continues from step {last}" if last is not None else "no checkpoint yet"
            status, reason = "interrupted", f"stopped immediately during step {step}; {resumable}"
        else:
            status, reason = "failed", f"{type(err).__name__}: {err}"
        member.summary = {**member.summary, "status": status, "reason": reason, "wall_time": member.clock.elapsed()}
    while member.summary != member.summary_on_disk:
        try:
            _write_summary(member)
        except KeyboardInterrupt:
            continue
        except runs.RunError:
            return


class WriteLog:
    """The moments a loop waited on its durable writes: (start, seconds) each, start
    by time.time(); the first MAX_MOMENTS kept one by one, the seconds of all summed."""

    MAX_MOMENTS = 256  # a run that checkpoints every few steps keeps its total, not every moment

    def __init__(self):
        self.moments: list[tuple[float, float]] = []
        self.seconds = 0.0
        self.count = 0

    def add(self, start: float, seconds: float) -> None:
        self.seconds += seconds
        self.count += 1
        if len(self.moments) < self.MAX_MOMENTS:
            self.moments.append((start, seconds))


class DurableWrites:
    """The members' durable writes of one moment, made in the loop's thread one after another (each waits
    on its fsync); the moment's wait is told to `write_log`, if one is given."""

    def __init__(self, write_log: WriteLog | None = None):
        self.write_log = write_log

    def each(self, write: Callable, items: list) -> None:
        """write(item) for every item; an error is raised once every write has been made (the first that
        failed), so that one member's failed write leaves the others' on disk."""
        if not items:
            return
        start, began = time.perf_counter(), time.time()
        errors = []
        try:
            for item in items:
                try:
                    write(item)
                except Exception as error:  # raised below, once the others are written
                    errors.append(error)
        finally:
            if self.write_log is not None:
                self.write_log.add(began, time.perf_counter() - start)
        if errors:
            raise errors[0]


def _iterate(
    stack: Stack, members: list[Member], step: int, stop: StopFlag, progress, writes: DurableWrites
) -> list[Member]:
    """Iteration `step` of the stack (attn.train.reference_loop.train is the
    same iteration for one run, written plainly): every member's batch, loss
    and gradients; a record for those that log; update step + 1 for those
    that go on (unless their values are non-finite); their checkpoints. The
    members that end here leave the stack; returns those that go on."""
    # batch, forward, backward: one computation for the whole stack
    batch = members[0].state.task.sample_stack([m.state.gens.data for m in members], members[0].config.train.batch_size)
    fast.advance_buffers(stack.params, stack.buffers, stack.spec)
    loss, grads, train_cache = fast.loss_and_grads(stack.params, stack.spec, batch, stack.scales, stack.buffers)
    faults = _faults(stack, loss, grads, len(members))

    # measure; who ends here (the last iteration only measures; a non-finite value may end a run)
    records = _measure(stack, members, step, loss, grads, train_cache, batch, faults, writes)
    endings = [member.ending_at(step, faults[k]) for k, member in enumerate(members)]
    still_training = [k for k, ending in enumerate(endings) if ending is None]
    mechanisms = {
        k: mechanism_snapshot(
            stack.member_params(k), m.state.spec, member_batch(stack.eval_batch, k), stack.member_buffers(k), step
        )
        for k, m in enumerate(members)
        if m.config.logging.mechanism_step is not None and step in (0, m.config.logging.mechanism_step)
    }
    _add_each(writes, members, "mechanism.npz", mechanisms, step)
    traces = {
        k: trace_snapshot(
            stack.member_params(k), m.state.spec, member_batch(stack.eval_batch, k), stack.member_buffers(k), step
        )
        for k, m in enumerate(members)
        if m.config.logging.mechanism_trace and trace_step(step)
    }
    _add_each(writes, members, MECHANISM_TRACE, traces, step)
    for k, member in enumerate(members):
        if faults[k] is not None:
            records[k]["nonfinite"] = "".join(faults[k])
            member.state.nonfinite_steps += 1

    # optimiser step for the members that go on with finite values; log; progress
    measured = [k for k in still_training if records[k] is not None]
    # not updated: the members that end here, and those whose values are non-finite
    not_updated = [k for k in range(len(members)) if endings[k] is not None or faults[k] is not None]
    _apply_update(stack, members, grads, step, records, measured, not_updated)
    for k, member in enumerate(members):
        log_record(member, records[k], step)
        if endings[k] is None:
            member.state.step = step + 1
    writes.each(lambda k: finish_run(members[k], *endings[k], step), [k for k in range(len(members)) if endings[k]])
    if progress is not None:
        for k, member in enumerate(members):
            progress(member.index, step, records[k])

    # checkpoint, stop, and the members that ended leave the stack
    stopping = stop.reason  # read once: a signal may set it while the checkpoints are written

    def checkpoint(k: int) -> None:
        members[k].state.wall_time = members[k].clock.elapsed()
        save_checkpoint(
            members[k].state, stack.member_params(k), stack.member_optimizer_state(k), stack.member_buffers(k)
        )
        if stopping:
            finish_run(
                members[k], "interrupted", f"stopped by {stopping} at step {step + 1}; checkpoint saved", step + 1
            )

    writes.each(
        checkpoint, [k for k in still_training if members[k].should_checkpoint(members[k].state.step) or stopping]
    )
    if stopping:
        return []
    if len(still_training) < len(members):
        stack.keep(still_training)
    return [members[k] for k in still_training]


def log_record(member: Member, record: dict | None, step: int) -> None:
    """Append the member's record of this iteration, if it has one."""
    if record is not None:
        runs.append_metrics(member.run_dir, record)
        member.final_record = record
        member.summary.update(step=step, nonfinite_steps=member.state.nonfinite_steps)


def finish_run(member: Member, status: str, reason: str | None, end_step: int) -> None:
    """The member's final summary, written once its records are on disk."""
    runs.sync_metrics(member.run_dir)
    wall = member.clock.elapsed()
    summary = {
        **member.summary,
        "status": status,
        "reason": reason,
        "step": end_step,
        "wall_time": wall,
        "best": member.state.best,
        "nonfinite_steps": member.state.nonfinite_steps,
        "final": _final_figures(member.final_record),
        "steps_per_sec": member.clock.rate_since_start(end_step),
    }
    if status in outcomes.ENDED:  # learned, stalled, ...: the class every report uses
        summary.update(outcomes.summary_fields(runs.read_metrics(member.run_dir), summary))
    last = linked_checkpoint_step(member.run_dir)
    if last is not None:  # a kill between the last checkpoint's write and its retention left one too many
        keep_retained(member.run_dir, last, member.config, later_too=True)  # before the summary that ends the run
    member.summary = summary  # whole or not at all: a signal before this leaves the member running
    _write_summary(member)


class _Clock:
    """Training seconds (counting those before a resume) and steps per second."""

    def __init__(self, seconds_before: float, step: int):
        self.seconds_before, self.first_step = seconds_before, step
        self.start = time.perf_counter() - seconds_before
        self.lap_time, self.lap_step = time.perf_counter(), step

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def lap(self, step: int) -> dict:
        """wall_time, and steps_per_sec since the previous lap (None on the first)."""
        now = time.perf_counter()
        rate = (step - self.lap_step) / (now - self.lap_time) if step > self.lap_step else None
        self.lap_time, self.lap_step = now, step
        return {"wall_time": now - self.start, "steps_per_sec": rate}

    def rate_since_start(self, step: int) -> float | None:
        """Steps per second in this process."""
        seconds = self.elapsed() - self.seconds_before
        return (step - self.first_step) / seconds if seconds > 0 else None


def _claim_run_directory(member: Member) -> None:
    """The member's directory at its start: a resumed run's taken back from
    the process that stopped (records past its checkpoint and dead
    temporaries removed); its summary says it is running."""
    if member.state.resumed:
        runs.truncate_metrics(member.run_dir, member.state.step)
        runs.remove_dead_temporaries(member.run_dir)
    _write_summary(member)


def _write_summary(member: Member) -> None:
    member.summary.update(runs.heartbeat_fields())
    runs.write_json(member.run_dir / "summary.json", member.summary)
    member.summary_on_disk = dict(member.summary)


def optim_lr(config: Config, step: int) -> float:
    o = config.optim
    return optim.learning_rate(step, o.lr, o.schedule, o.warmup_steps, config.train.steps, o.min_lr_ratio)


def find_nonfinite(loss, grads: dict, params: dict) -> tuple[str, str] | None:
    """None if one run's loss and gradients are finite; else (what, note)
    naming a parameter: ('gradient of W_q', ''), or for the loss the
    parameter that is itself non-finite or else holds the largest weight
    (the likely culprit)."""
    if np.isfinite(loss):
        bad = next((name for name, g in grads.items() if not _all_finite(g)), None)
        return None if bad is None else (f"gradient of {bad}", "")
    bad = next((name for name, p in params.items() if not np.isfinite(p).all()), None)
    if bad is not None:
        return "loss", f"; parameter {bad} is non-finite"
    largest = {name: float(np.abs(p).max()) for name, p in params.items()}
    name = max(largest, key=largest.get)
    return "loss", f"; largest weight in {name}: |w| = {largest[name]:.3g}"


def _faults(stack: Stack, loss, grads: dict, n_members: int) -> list[tuple[str, str] | None]:
    """find_nonfinite of each member; one check over the whole stack first, as every step is finite but few."""
    if np.isfinite(loss).all() and all(_all_finite(g) for g in grads.values()):
        return [None] * n_members
    return [
        find_nonfinite(loss[k], {n: g[k] for n, g in grads.items()}, stack.member_params(k)) for k in range(n_members)
    ]


def _all_finite(a: np.ndarray) -> bool:
    """A finite sum has only finite terms (one inf or NaN makes it
    non-finite), so one pass decides; a sum that overflowed is checked entry by entry."""
    return bool(np.isfinite(a.sum()) or np.isfinite(a).all())


def _measure(
    stack: Stack,
    members: list[Member],
    step: int,
    loss,
    grads: dict,
    train_cache,
    batch: Batch,
    faults: list,
    writes: DurableWrites,
) -> list[dict | None]:
    """A metrics record (without update ratios) for each member that logs
    this step or has non-finite values, None for the others: it evaluates
    the stack on its fixed eval sets, and snapshots a member's attention at
    its first and last step."""
    logged = [m.should_log(step) or faults[k] is not None for k, m in enumerate(members)]
    if not any(logged):
        return [None] * len(members)
    eval_loss, eval_cache = fast.forward(
        stack.params, stack.spec, stack.eval_batch, scale=stack.scales, buffers=stack.buffers
    )
    stats = fast.diagnostics(eval_cache, stack.eval_batch)
    train_accuracy = fast.accuracy(train_cache, batch)
    squares = {n: optim.squared_norms(g) for n, g in grads.items()}
    records = []
    for k, member in enumerate(members):
        if not logged[k]:
            records.append(None)
            continue
        records.append(
            metrics_record(
                member,
                step,
                loss[k],
                train_accuracy[k],
                eval_loss[k],
                {name: values[k] for name, values in stats.items()},
                {n: square[k] for n, square in squares.items()},
            )
        )

    snapshots = {
        k: attention_snapshot(
            stack.member_params(k),
            stack.spec,
            member_batch(stack.eval_batch, k, attention_examples(m.config)),
            stack.member_buffers(k),
            "init" if step == 0 else "final",
            scale=stack.scales[k],
        )
        for k, m in enumerate(members)
        if logged[k] and attention_examples(m.config) and step in (0, m.config.train.steps)
    }
    _add_each(writes, members, "attention.npz", snapshots, step)
    return records


def attention_examples(config: Config) -> int:
    """How many eval examples the run's attention snapshots show."""
    return min(config.logging.attention_examples, config.task.eval_size)


def metrics_record(
    member: Member, step: int, train_loss, train_accuracy, eval_loss, stats: dict, grad_squares: dict
) -> dict:
    """One run's record of iteration `step` (updating its best figures), from
    its losses, eval diagnostics and squared gradient norms."""
    stats = {name: float(value) for name, value in stats.items()}
    if not np.isfinite(eval_loss):  # argmax and entropies of NaN scores/logits mean nothing
        stats = dict.fromkeys(stats)
    record = {
        "step": step,
        "lr": member.lr(step),
        "train_loss": float(train_loss),
        "train_accuracy": float(train_accuracy),
        "eval_loss": float(eval_loss),
        "eval_accuracy": stats.pop("accuracy"),
        **stats,
        "grad_norm": math.sqrt(sum(float(square) for square in grad_squares.values())),
        **{f"grad_norm/{n}": math.sqrt(float(square)) for n, square in grad_squares.items()},
        **member.clock.lap(step),
    }
    _update_best(member.state.best, record)
    return record


def save_mechanism(run_dir: Path, params: dict, spec, eval_batch: Batch, buffers: dict, step: int) -> None:
    """mechanism.npz: the eval set's row statistics at `step` (mechanism_snapshot), beside those of earlier steps."""
    add_arrays(run_dir / "mechanism.npz", mechanism_snapshot(params, spec, eval_batch, buffers, step), keep=step > 0)


def mechanism_snapshot(params: dict, spec, eval_batch: Batch, buffers: dict, step: int) -> dict:
    """attn.model.mechanism.row_statistics of the eval set's query rows at
    `step`, named '<step>/<statistic>' for mechanism.npz."""
    rows = mechanism.row_statistics(params, spec, eval_batch, buffers)
    return {f"{step}/{name}": values for name, values in rows.items()}


MECHANISM_TRACE = "mechanism_trace.npz"  # the rows' summaries at log-spaced steps, for the run's mechanism figure


def trace_step(step: int) -> bool:
    """Whether logging.mechanism_trace measures the rows at `step`: 0, 1, 2, 5, 10, 20, 50, 100, ...
    (1, 2 or 5 times a power of ten), so that the first steps are seen as well as the last."""
    while step >= 10 and step % 10 == 0:
        step //= 10
    return step in (0, 1, 2, 5)


def trace_snapshot(params: dict, spec, eval_batch: Batch, buffers: dict, step: int) -> dict:
    """attn.model.mechanism.summary of the eval set's query rows at `step` (their
    medians, not every row: a few numbers a step), named '<step>/<number>' for mechanism_trace.npz."""
    numbers = mechanism.summary(mechanism.row_statistics(params, spec, eval_batch, buffers))
    return {f"{step}/{name}": np.float64(value) for name, value in numbers.items()}


def _add_each(writes: DurableWrites, members: list[Member], name: str, arrays_of: dict, step: int) -> None:
    """Each member's arrays of this step (member index -> arrays) into its run's file `name`, beside
    those of earlier steps, the members' writes at once."""
    writes.each(lambda k: members[k].add_arrays(name, arrays_of[k], keep=step > 0), list(arrays_of))


def add_arrays(path: Path, arrays: dict, keep: bool) -> None:
    """Write arrays to path; with keep, beside (and over) those already in it."""
    if keep and path.exists():
        arrays = {**arrayfiles.load_arrays(path), **arrays}
    arrayfiles.save_arrays(path, arrays)


def _apply_update(
    stack: Stack,
    members: list[Member],
    grads: dict,
    step: int,
    records: list,
    measured: list[int],
    not_updated: list[int],
) -> None:
    """Clip, step the optimiser of every member but the `not_updated` ones (those
    that end here, or whose values are non-finite: their parameters and
    state are put back as they were); for the `measured` members, add the
    update-to-weight ratio ||w_new - w|| / ||w|| of each parameter to their
    record (None where w = 0)."""
    clip = np.array([m.config.optim.clip_norm or math.inf for m in members])
    if np.isfinite(clip).any():
        optim.clip_by_global_norm(grads, clip, stacked=True)
    before = {n: p.copy() for n, p in stack.params.items()} if measured else {}
    params_to_restore = {n: p[not_updated].copy() for n, p in stack.params.items()} if not_updated else {}
    state_to_restore = {k: v[not_updated].copy() for k, v in stack.optimizer.state.items()} if not_updated else {}
    stack.optimizer.step(stack.params, grads, np.array([m.lr(step) for m in members]))
    for n, values in params_to_restore.items():
        stack.params[n][not_updated] = values
    for key, values in state_to_restore.items():
        stack.optimizer.state[key][not_updated] = values
    for n, w in before.items():
        norm_w = np.sqrt(optim.squared_norms(w))
        norm_step = np.sqrt(optim.squared_norms(stack.params[n] - w))
        for k in measured:
            records[k][f"update_ratio/{n}"] = float(norm_step[k] / norm_w[k]) if norm_w[k] else None


def _update_best(best: dict, record: dict) -> None:
    loss, acc = record["eval_loss"], record["eval_accuracy"]
    if math.isfinite(loss) and loss < best.get("eval_loss", math.inf):
        best.update(eval_loss=loss, eval_loss_step=record["step"])
    if acc is None:
        return
    if acc > best.get("eval_accuracy", -1.0):
        best.update(eval_accuracy=acc, eval_accuracy_step=record["step"])
    if acc >= 0.99 and "steps_to_99" not in best:
        best["steps_to_99"] = record["step"]


def _final_figures(record: dict | None) -> dict:
    if record is None:
        return {}
    keys = ("step", "train_loss", "eval_loss", "eval_accuracy", "score_std", "attn_entropy", "saturated_frac")
    return {k: record[k] for k in keys if k in record}


def save_attention(run_dir: Path, params: dict, spec, shown: Batch, buffers: dict, when: str, scale=None) -> None:
    """attention.npz: the `shown` eval examples' attention at init, and at the end beside it (attention_snapshot)."""
    add_arrays(
        run_dir / "attention.npz", attention_snapshot(params, spec, shown, buffers, when, scale), keep=when == "final"
    )


def attention_snapshot(params: dict, spec, shown: Batch, buffers: dict, when: str, scale=None) -> dict:
    """The attention weights of the `shown` eval examples ('attn_init' or
    'attn_final') with the examples themselves: every row of the map, not
    only the rows with a target that training computes."""
    _, cache = fast.forward(params, spec, shown, all_queries=True, scale=scale, buffers=buffers)
    return {
        f"attn_{when}": cache["attn"]["attn"],
        "tokens": shown.tokens,
        "target_key": shown.target_key,
        "target_mask": shown.target_mask,
    }
