"""The training loop: config -> task batches -> forward/backward -> optimiser -> run directory.

    summary = train(config, run_dir)                  # one run: a stack of one
    summaries = run_stack([state, ...], stop=stop)    # runs of one shape (attn.train.stack) as one computation

Each run starts from its attn.store.runstate.RunState (prepare) and iterates as
attn.train.loop numbers its steps, checkpointing through attn.store.runstate.save_checkpoint;
every member of a stack keeps its own numbers, summary and run directory,
and leaves the stack when it ends.

Non-finite values: a NaN/inf loss or gradient at iteration s is logged with
a `nonfinite` field naming what went wrong. With train.on_nonfinite = stop
the run ends there, status `diverged`; with `continue` update s + 1 is
skipped and the run goes on (summary `nonfinite_steps` counts them).

Stopping: a StopFlag set (by a signal handler) ends every member after the
current iteration with a checkpoint, status `interrupted`. A
KeyboardInterrupt ends them at once, without a checkpoint (the parameters
may be half-updated): status `interrupted`, and resuming continues from
the last checkpoint written.

This module never prints; `progress(step, record)` is called after every
iteration (record is None except on logged steps).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import numpy as np

from attn import optim
from attn.config.schema import Config
from attn.model import fast, mechanism
from attn.model.fast import Batch
from attn.store import arrayfiles, runs
from attn.store.runstate import RunState, prepare, save_checkpoint
from attn.train.stack import Stack, member_batch, stack_batches, stack_key

METRIC_TIMING_KEYS = ("wall_time", "steps_per_sec")  # the only record fields that vary run to run
HEARTBEAT_SECONDS = 5.0  # while running, summary.json (step, best, heartbeat) is rewritten this often


class StopFlag:
    """Set by a signal handler; the loop stops cleanly after the current update."""

    def __init__(self):
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        self.reason = reason


def train(config: Config, run_dir: Path, *, resume: bool = False, stop: StopFlag | None = None,
          progress: Callable[[int, dict | None], None] | None = None) -> dict:
    """Train `config`, recording into `run_dir` (which holds config.yaml already).

    Returns the final summary (also in summary.json): status `completed`,
    `interrupted` (stop requested; checkpointed) or `diverged`.
    """
    return run(prepare(config, run_dir, resume=resume), stop=stop, progress=progress)


def run(state: RunState, *, stop: StopFlag | None = None,
        progress: Callable[[int, dict | None], None] | None = None) -> dict:
    """One run, from `state` to the end (or a stop, or divergence): a stack of one."""
    member_progress = None if progress is None else (lambda _member, step, record: progress(step, record))
    return run_stack([state], stop=stop, progress=member_progress)[0]


class Member:
    """One run of a stack while it trains: its state, summary and clock."""

    def __init__(self, state: RunState, stack_size: int):
        self.state, self.config, self.run_dir = state, state.config, state.run_dir
        self.summary = {
            "status": "running", "step": state.step, "steps": state.config.train.steps, "task": state.task.name,
            "references": state.task.reference_losses(), "started_at": time.time(),
            "resumed_from": state.step if state.resumed else None, "best": state.best,
            "nonfinite_steps": state.nonfinite_steps, "stack_size": stack_size,
        }
        self.clock = _Clock(state.wall_time, state.step)
        self.last_checkpoint = state.step if state.resumed else None
        self.final_record = None

    def lr(self, step: int) -> float:
        return optim_lr(self.config, step)

    def logs(self, step: int) -> bool:
        return step % self.config.logging.log_every == 0 or step == self.config.train.steps


def run_stack(states: list[RunState], *, stop: StopFlag | None = None,
              progress: Callable[[int, int, dict | None], None] | None = None) -> list[dict]:
    """Train every member from its state to its end; returns their final
    summaries (also in each summary.json), in the order of `states`.
    `progress(member index, step, record)` after each member's iteration."""
    steps_at = {s.step for s in states}
    if len(steps_at) != 1 or len({stack_key(s.config) for s in states}) != 1:
        raise ValueError("the members of a stack share their shapes (stack_key) and start at one step")
    stop = stop or StopFlag()
    members = [Member(state, len(states)) for state in states]
    for member in members:
        if member.state.resumed:  # take the directory back from the process that stopped
            runs.truncate_metrics(member.run_dir, member.state.step)
            runs.remove_dead_temporaries(member.run_dir)
        _write_summary(member)
    stack, active = Stack(states), list(range(len(members)))  # indices into members, in stack order
    step, last_write = steps_at.pop(), time.perf_counter()
    try:
        # Overflow to inf/NaN is detected and handled here, not warned about.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            while active:
                active = _iterate(stack, [members[i] for i in active], active, step, stop, progress)
                step += 1
                if time.perf_counter() - last_write > HEARTBEAT_SECONDS:
                    for i in active:
                        _write_summary(members[i])
                    last_write = time.perf_counter()
    except KeyboardInterrupt:
        for member in (members[i] for i in active if members[i].summary["status"] == "running"):
            resumable = (f"resume continues from step {member.last_checkpoint}" if member.last_checkpoint is not None
                         else "no checkpoint yet")
            member.summary.update(status="interrupted", reason=f"stopped immediately during step {step}; {resumable}",
                                  wall_time=member.clock.elapsed())
            _write_summary(member)
        raise
    return [member.summary for member in members]


def _iterate(stack: Stack, members: list[Member], indices: list[int], step: int, stop: StopFlag,
             progress) -> list[int]:
    """Iteration `step` of every active member: their batches, losses and
    gradients; a record for those that log; the members that end here
    (completed, or diverged with on_nonfinite = stop) finish and leave the
    stack; the others take update step + 1 (unless their values are
    non-finite) and checkpoint when due. Returns the indices still active."""
    batch = stack_batches([m.state.task.sample(m.state.gens.data, m.config.train.batch_size) for m in members])
    fast.advance_buffers(stack.params, stack.buffers, stack.spec)
    loss, grads, train_cache = fast.loss_and_grads(stack.params, stack.spec, batch, stack.scales, stack.buffers)
    faults = _find_nonfinite(loss, grads, stack.params)
    logged = [m.logs(step) or faults[k] is not None for k, m in enumerate(members)]
    records = _measure(stack, members, step, loss, grads, train_cache, batch, logged)
    for k, member in enumerate(members):  # at step 0 and logging.mechanism_step, logged or not
        if member.config.logging.mechanism_step is not None and step in (0, member.config.logging.mechanism_step):
            _save_mechanism(member, stack, k, step)
    reported = list(zip(indices, records))  # every member that ran this iteration, for `progress`
    ending, skipped = [], []  # (index, status, reason) of the members that end here; those not updated
    for k, member in enumerate(members):
        if faults[k] is not None:
            records[k]["nonfinite"] = "".join(faults[k])
            member.state.nonfinite_steps += 1
        if faults[k] is not None and member.config.train.on_nonfinite == "stop":
            what, note = faults[k]
            ending.append((k, "diverged", f"non-finite {what} at step {step}{note}"))
        elif step == member.config.train.steps:
            ending.append((k, "completed", None))
        elif faults[k] is not None:
            skipped.append(k)
    for k, status, reason in ending:
        _log(members[k], records[k], step)
        _finish(members[k], status, reason, step)
    if ending:
        kept = [k for k in range(len(members)) if k not in {e[0] for e in ending}]
        for name in grads:
            grads[name] = grads[name][kept]
        stack.keep(kept)
        members, indices = [members[k] for k in kept], [indices[k] for k in kept]
        records, skipped = [records[k] for k in kept], [kept.index(k) for k in skipped]
    if members:
        _apply_update(stack, members, grads, step, records, skipped)  # adds the update ratios to the records
    for k, member in enumerate(members):
        _log(member, records[k], step)
        member.state.step = step + 1
    if progress is not None:
        for index, record in reported:
            progress(index, step, record)
    for k, member in enumerate(members):
        state = member.state
        if (state.step % member.config.logging.checkpoint_every == 0 or state.step == member.config.train.steps
                or stop.reason):
            state.wall_time = member.clock.elapsed()
            save_checkpoint(state, stack.member_params(k), stack.member_optimizer_state(k), stack.member_buffers(k))
            member.last_checkpoint = state.step
    if stop.reason:
        for member in members:
            _finish(member, "interrupted", f"stopped by {stop.reason} at step {member.state.step}; checkpoint saved",
                    member.state.step)
        members, indices = [], []
    return indices


def _log(member: Member, record: dict | None, step: int) -> None:
    """Append the member's record of this iteration, if it has one."""
    if record is not None:
        runs.append_metrics(member.run_dir, record)
        member.final_record = record
        member.summary.update(step=step, nonfinite_steps=member.state.nonfinite_steps)


def _finish(member: Member, status: str, reason: str | None, end_step: int) -> None:
    wall = member.clock.elapsed()
    member.summary.update(
        status=status, reason=reason, step=end_step, wall_time=wall, best=member.state.best,
        nonfinite_steps=member.state.nonfinite_steps, final=_final_figures(member.final_record),
        steps_per_sec=member.clock.rate_since_start(end_step),
    )
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


def _write_summary(member: Member) -> None:
    member.summary.update(runs.heartbeat_fields())
    runs.write_json(member.run_dir / "summary.json", member.summary)


def optim_lr(config: Config, step: int) -> float:
    o = config.optim
    return optim.learning_rate(step, o.lr, o.schedule, o.warmup_steps, config.train.steps, o.min_lr_ratio)


def _find_nonfinite(loss: np.ndarray, grads: dict, params: dict) -> list[tuple[str, str] | None]:
    """Per member, None if its loss and gradients are finite; else (what,
    note) naming a parameter: ('gradient of W_q', ''), or for the loss the
    parameter that is itself non-finite or else holds the largest weight
    (the likely culprit)."""
    finite_grads = {name: _all_finite(g) for name, g in grads.items()}
    faults = []
    for m, finite_loss in enumerate(np.isfinite(loss)):
        if finite_loss:
            bad = next((name for name, ok in finite_grads.items() if not ok[m]), None)
            faults.append(None if bad is None else (f"gradient of {bad}", ""))
            continue
        bad = next((name for name, p in params.items() if not np.isfinite(p[m]).all()), None)
        if bad is not None:
            faults.append(("loss", f"; parameter {bad} is non-finite"))
            continue
        largest = {name: float(np.abs(p[m]).max()) for name, p in params.items()}
        name = max(largest, key=largest.get)
        faults.append(("loss", f"; largest weight in {name}: |w| = {largest[name]:.3g}"))
    return faults


def _all_finite(stacked: np.ndarray) -> np.ndarray:
    """Per member, whether every entry is finite. A finite sum has only finite
    terms (one inf or NaN makes it non-finite), so one pass decides for most
    members; a sum that overflowed is checked entry by entry."""
    finite = np.isfinite(stacked.sum(axis=tuple(range(1, stacked.ndim))))  # (M,)
    for m in np.flatnonzero(~finite):
        finite[m] = np.isfinite(stacked[m]).all()
    return finite


def _measure(stack: Stack, members: list[Member], step: int, loss, grads: dict, train_cache, batch: Batch,
             logged: list[bool]) -> list[dict | None]:
    """A metrics record (without update ratios) for each member that logs
    this step, None for the others: it evaluates the stack on its fixed eval
    sets, and snapshots a member's attention at its first and last step."""
    if not any(logged):
        return [None] * len(members)
    eval_loss, eval_cache = fast.forward(stack.params, stack.spec, stack.eval_batch, scale=stack.scales,
                                          buffers=stack.buffers)
    stats = fast.diagnostics(eval_cache, stack.eval_batch)
    train_accuracy = fast.accuracy(train_cache, batch)
    squares = {n: optim.squared_norms(g) for n, g in grads.items()}
    records = []
    for k, member in enumerate(members):
        if not logged[k]:
            records.append(None)
            continue
        member_stats = {name: float(values[k]) for name, values in stats.items()}
        if not np.isfinite(eval_loss[k]):  # argmax and entropies of NaN scores/logits mean nothing
            member_stats = dict.fromkeys(member_stats)
        record = {
            "step": step,
            "lr": member.lr(step),
            "train_loss": float(loss[k]),
            "train_accuracy": float(train_accuracy[k]),
            "eval_loss": float(eval_loss[k]),
            "eval_accuracy": member_stats.pop("accuracy"),
            **member_stats,
            "grad_norm": math.sqrt(sum(float(square[k]) for square in squares.values())),
            **{f"grad_norm/{n}": math.sqrt(float(square[k])) for n, square in squares.items()},
            **member.clock.lap(step),
        }
        _update_best(member.state.best, record)
        n_examples = min(member.config.logging.attention_examples, member.config.task.eval_size)
        if n_examples and step in (0, member.config.train.steps):
            _save_attention(member, stack, k, "init" if step == 0 else "final", n_examples)
        records.append(record)
    return records


def _save_mechanism(member: Member, stack: Stack, k: int, step: int) -> None:
    """mechanism.npz: attn.model.mechanism.row_statistics of the eval set's query
    rows at `step`, as arrays named '<step>/<statistic>' (added to the file)."""
    rows = mechanism.row_statistics(stack.member_params(k), member.state.spec, member_batch(stack.eval_batch, k),
                                    stack.member_buffers(k))
    path = member.run_dir / "mechanism.npz"
    arrays = arrayfiles.load_arrays(path) if step and path.exists() else {}
    arrays.update({f"{step}/{name}": values for name, values in rows.items()})
    arrayfiles.save_arrays(path, arrays)


def _apply_update(stack: Stack, members: list[Member], grads: dict, step: int, records: list,
                  skipped: list[int]) -> None:
    """Clip, step the optimiser of every member but the `skipped` ones (whose
    values are non-finite: their parameters and state are put back as they
    were); for the members with a record, the update-to-weight ratio
    ||w_new - w|| / ||w|| of each parameter (None where w = 0)."""
    clip = np.array([m.config.optim.clip_norm or math.inf for m in members])
    if np.isfinite(clip).any():
        optim.clip_by_global_norm(grads, clip, stacked=True)
    measured = [k for k, record in enumerate(records) if record is not None]
    before = {n: p.copy() for n, p in stack.params.items()} if measured else {}
    kept_as_was = ({n: p[skipped].copy() for n, p in stack.params.items()},
                   {k: v[skipped].copy() for k, v in stack.optimizer.state.items()}) if skipped else None
    stack.optimizer.step(stack.params, grads, np.array([m.lr(step) for m in members]))
    if kept_as_was is not None:
        for n, values in kept_as_was[0].items():
            stack.params[n][skipped] = values
        for key, values in kept_as_was[1].items():
            stack.optimizer.state[key][skipped] = values
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


def _save_attention(member: Member, stack: Stack, k: int, when: str, n: int) -> None:
    """attention.npz: weights of the first n eval examples at init and at the end
    (the end's snapshot is added beside the init one already on disk). Every
    row of the map, not only the rows with a target that training computes."""
    shown = member_batch(stack.eval_batch, k, n)
    _, cache = fast.forward(stack.member_params(k), stack.spec, shown, all_queries=True, scale=stack.scales[k],
                             buffers=stack.member_buffers(k))
    path = member.run_dir / "attention.npz"
    arrays = {}
    if when == "final" and path.exists():
        arrays = arrayfiles.load_arrays(path)
    arrays.update({f"attn_{when}": cache["attn"]["attn"], "tokens": shown.tokens,
                   "target_key": shown.target_key, "target_mask": shown.target_mask})
    arrayfiles.save_arrays(path, arrays)
