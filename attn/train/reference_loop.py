"""How attn trains, on one page: the training loop of one run, written plainly.

    summary = train(prepare(config, run_dir))      # prepare: attn.store.runstate

Each iteration `step` of a run:

    1. a batch, the loss and its gradients
    2. a record: every log_every steps, at the last step, and whenever a value is non-finite
    3. the end: at step train.steps (the last iteration only measures), or at a
       non-finite value when train.on_nonfinite is stop
    4. the optimiser step (none when a value is non-finite)
    5. a checkpoint: every checkpoint_every updates, before the last iteration, and when asked to stop

attn trains through attn.train.loop, which runs many runs of one shape as one
computation (a leading member axis, attn.train.stack). This is the same loop
for one run, as attn.model.reference is the model's textbook twin; it shares no
code with the stacked loop, and tests/test_reference_loop.py holds the two
equal bit for bit: records, checkpoints, snapshots and summaries. Left to the
real loop: the progress callback, the summary's heartbeat while running,
Ctrl-C, and taking a resumed run's directory back.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from attn import optim, outcomes
from attn.model import fast, mechanism
from attn.store import arrayfiles, runs
from attn.store.runstate import RunState, build_optimizer, save_checkpoint


def train(state: RunState, stop=None) -> dict:
    """Train one run from `state` to its end, recording into its run directory;
    returns the final summary. `stop`: an object whose `reason` a signal
    handler sets to stop after the current iteration (attn.train.loop.StopFlag)."""
    config, spec, params, buffers = state.config, state.spec, state.params, state.buffers
    optimizer = build_optimizer(config, params)
    optimizer.state = state.optimizer_state  # updated in place: the dict a checkpoint saves
    summary = _summary_at_start(state)
    clock = _Clock(state.wall_time, state.step)
    last_record = None
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # non-finite values are caught below
        for step in itertools.count(state.step):  # until the run ends: at train.steps, or before
            # 1. a batch, the loss and its gradients
            batch = state.task.sample(state.gens.data, config.train.batch_size)  # tokens (B, T, F)
            fast.advance_buffers(params, buffers, spec)  # sigma_reparam's power iteration; nothing in other modes
            loss, grads, cache = fast.loss_and_grads(params, spec, batch, buffers=buffers)
            fault = _what_is_nonfinite(loss, grads, params)  # None, or (what, a note)

            # 2. a record, and the snapshots at their steps
            record = None
            if _is_logged(config, step) or fault is not None:
                record = _measure(state, step, loss, grads, cache, batch, clock)
                last_record = record
            if _is_mechanism_step(config, step):
                _save_mechanism(state, step)
            if config.logging.mechanism_trace and _is_trace_step(step):
                _save_trace(state, step)
            if fault is not None:
                record["nonfinite"] = "".join(fault)
                state.nonfinite_steps += 1

            # 3. the end: (status, reason), or None while the run goes on
            ending = None
            if fault is not None and config.train.on_nonfinite == "stop":
                what, note = fault
                ending = "diverged", f"non-finite {what} at step {step}{note}"
            elif step == config.train.steps:
                ending = "completed", None
            if ending is not None:
                _append(state, record)
                return _finish(state, summary, clock, last_record, *ending, end_step=step)

            # 4. the optimiser step, and how far it moved each parameter: ||w_new - w|| / ||w||
            if config.optim.clip_norm:
                optim.clip_by_global_norm(grads, config.optim.clip_norm)
            before = {n: p.copy() for n, p in params.items()} if record is not None else {}
            if fault is None:
                optimizer.step(params, grads, _learning_rate(config, step))
            for n, w in before.items():
                norm_w = math.sqrt(optim.squared_norm(w))
                record[f"update_ratio/{n}"] = math.sqrt(optim.squared_norm(params[n] - w)) / norm_w if norm_w else None
            _append(state, record)
            state.step = step + 1

            # 5. a checkpoint
            stopping = stop.reason if stop is not None else None  # read once: a signal may set it meanwhile
            if _is_checkpointed(config, state.step) or stopping:
                state.wall_time = clock.seconds()
                save_checkpoint(state)
            if stopping:
                reason = f"stopped by {stopping} at step {state.step}; checkpoint saved"
                return _finish(state, summary, clock, last_record, "interrupted", reason, end_step=state.step)


def _is_logged(config, step: int) -> bool:
    """Whether iteration `step` writes a record (besides one whose values are non-finite)."""
    return step % config.logging.log_every == 0 or step == config.train.steps


def _is_checkpointed(config, updates: int) -> bool:
    """Whether a checkpoint is written after `updates` updates."""
    return updates % config.logging.checkpoint_every == 0 or updates == config.train.steps


def _is_mechanism_step(config, step: int) -> bool:
    """Whether iteration `step` measures each query row's saturation and gradient (mechanism.npz)."""
    return config.logging.mechanism_step is not None and step in (0, config.logging.mechanism_step)


def _is_trace_step(step: int) -> bool:
    """Whether logging.mechanism_trace measures the rows at iteration `step`: 0, 1, 2, 5, 10, 20, 50, 100, ...
    (1, 2 or 5 times a power of ten), so that the first steps are seen as well as the last."""
    while step >= 10 and step % 10 == 0:
        step //= 10
    return step in (0, 1, 2, 5)


def _learning_rate(config, step: int) -> float:
    o = config.optim
    return optim.learning_rate(step, o.lr, o.schedule, o.warmup_steps, config.train.steps, o.min_lr_ratio)


def _what_is_nonfinite(loss, grads: dict, params: dict) -> tuple[str, str] | None:
    """None if the loss and every gradient are finite; else (what, a note):
    the first non-finite gradient, or the loss with the likely culprit, a
    parameter that is itself non-finite or else the one holding the largest weight."""
    if np.isfinite(loss):
        bad = next((name for name, g in grads.items() if not np.isfinite(g).all()), None)
        return None if bad is None else (f"gradient of {bad}", "")
    bad = next((name for name, p in params.items() if not np.isfinite(p).all()), None)
    if bad is not None:
        return "loss", f"; parameter {bad} is non-finite"
    largest = {name: float(np.abs(p).max()) for name, p in params.items()}
    name = max(largest, key=largest.get)
    return "loss", f"; largest weight in {name}: |w| = {largest[name]:.3g}"


def _measure(state: RunState, step: int, loss, grads: dict, cache, batch, clock: _Clock) -> dict:
    """The record of iteration `step` (the update ratios are added after the
    update): train loss and accuracy, the eval set's loss and diagnostics,
    gradient norms, time; the run's best figures follow it. The attention
    snapshot is saved at the first and the last step."""
    config = state.config
    eval_loss, eval_cache = fast.forward(state.params, state.spec, state.eval_batch, buffers=state.buffers)
    stats = {name: float(value) for name, value in fast.diagnostics(eval_cache, state.eval_batch).items()}
    if not np.isfinite(eval_loss):  # argmax and entropies of NaN scores and logits mean nothing
        stats = dict.fromkeys(stats)
    squares = {n: optim.squared_norm(g) for n, g in grads.items()}
    record = {
        "step": step,
        "lr": _learning_rate(config, step),
        "train_loss": float(loss),
        "train_accuracy": float(fast.accuracy(cache, batch)),
        "eval_loss": float(eval_loss),
        "eval_accuracy": stats.pop("accuracy"),
        **stats,
        "grad_norm": math.sqrt(sum(float(square) for square in squares.values())),
        **{f"grad_norm/{n}": math.sqrt(float(square)) for n, square in squares.items()},
        **clock.lap(step),
    }
    _update_best(state.best, record)
    shown = min(config.logging.attention_examples, config.task.eval_size)  # eval examples in the snapshot
    if shown and step in (0, config.train.steps):
        _save_attention(state, shown, "init" if step == 0 else "final")
    return record


def _update_best(best: dict, record: dict) -> None:
    """The run's best eval loss and accuracy so far, their steps, and the first step at 99% accuracy."""
    loss, accuracy = record["eval_loss"], record["eval_accuracy"]
    if math.isfinite(loss) and loss < best.get("eval_loss", math.inf):
        best.update(eval_loss=loss, eval_loss_step=record["step"])
    if accuracy is None:
        return
    if accuracy > best.get("eval_accuracy", -1.0):
        best.update(eval_accuracy=accuracy, eval_accuracy_step=record["step"])
    if accuracy >= 0.99 and "steps_to_99" not in best:
        best["steps_to_99"] = record["step"]


def _save_attention(state: RunState, shown: int, when: str) -> None:
    """attention.npz: every row of the attention of the first `shown` eval examples, at init and at the end."""
    examples = fast.Batch(**{field: values[:shown] for field, values in vars(state.eval_batch).items()})
    _, cache = fast.forward(state.params, state.spec, examples, all_queries=True, buffers=state.buffers)
    arrays = {
        f"attn_{when}": cache["attn"]["attn"],  # (shown, T, T)
        "tokens": examples.tokens,
        "target_key": examples.target_key,
        "target_mask": examples.target_mask,
    }
    _save_arrays(state.run_dir / "attention.npz", arrays, beside_earlier=when == "final")


def _save_mechanism(state: RunState, step: int) -> None:
    """mechanism.npz: each eval query row's saturation and gradient norms at `step` (attn.model.mechanism)."""
    rows = mechanism.row_statistics(state.params, state.spec, state.eval_batch, state.buffers)
    arrays = {f"{step}/{name}": values for name, values in rows.items()}
    _save_arrays(state.run_dir / "mechanism.npz", arrays, beside_earlier=step > 0)


def _save_trace(state: RunState, step: int) -> None:
    """mechanism_trace.npz: the medians of the eval query rows' statistics at `step` (mechanism.summary)."""
    numbers = mechanism.summary(mechanism.row_statistics(state.params, state.spec, state.eval_batch, state.buffers))
    arrays = {f"{step}/{name}": np.float64(value) for name, value in numbers.items()}
    _save_arrays(state.run_dir / "mechanism_trace.npz", arrays, beside_earlier=step > 0)


def _save_arrays(path, arrays: dict, beside_earlier: bool) -> None:
    """Write `arrays` to path; with beside_earlier, beside (and over) those it holds already."""
    if beside_earlier and path.exists():
        arrays = {**arrayfiles.load_arrays(path), **arrays}
    arrayfiles.save_arrays(path, arrays)


def _append(state: RunState, record: dict | None) -> None:
    """The record of this iteration, if it has one, appended to metrics.jsonl."""
    if record is not None:
        runs.append_metrics(state.run_dir, record)


def _summary_at_start(state: RunState) -> dict:
    """What summary.json says of the run while it trains."""
    return {
        "status": "running",
        "step": state.step,
        "steps": state.config.train.steps,
        "task": state.task.name,
        "references": state.task.reference_losses(),
        "started_at": time.time(),
        "resumed_from": state.step if state.resumed else None,
        "best": state.best,
        "nonfinite_steps": state.nonfinite_steps,
        "stack_size": 1,
    }


def _finish(state: RunState, summary: dict, clock: _Clock, last_record, status: str, reason, end_step: int) -> dict:
    """The final summary, written to summary.json once the records are on disk, with the run's outcome."""
    runs.sync_metrics(state.run_dir)
    final = ("step", "train_loss", "eval_loss", "eval_accuracy", "score_std", "attn_entropy", "saturated_frac")
    summary.update(
        status=status,
        reason=reason,
        step=end_step,
        wall_time=clock.seconds(),
        best=state.best,
        nonfinite_steps=state.nonfinite_steps,
        final={k: last_record[k] for k in final if k in last_record} if last_record is not None else {},
        steps_per_sec=clock.rate_since_start(end_step),
        **runs.heartbeat_fields(),  # who wrote it: time, host, process
    )
    if status in outcomes.ENDED:  # completed or diverged: learned, stalled, ... (attn.outcomes)
        summary.update(outcomes.summary_fields(runs.read_metrics(state.run_dir), summary))
    runs.write_json(state.run_dir / "summary.json", summary)
    return summary


class _Clock:
    """Training seconds (those before a resume counted) and steps per second."""

    def __init__(self, seconds_before: float, step: int):
        self.seconds_before, self.first_step = seconds_before, step
        self.start = time.perf_counter() - seconds_before
        self.lap_time, self.lap_step = time.perf_counter(), step

    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def lap(self, step: int) -> dict:
        """wall_time, and steps_per_sec since the previous lap (None on the first)."""
        now = time.perf_counter()
        rate = (step - self.lap_step) / (now - self.lap_time) if step > self.lap_step else None
        self.lap_time, self.lap_step = now, step
        return {"wall_time": now - self.start, "steps_per_sec": rate}

    def rate_since_start(self, step: int) -> float | None:
        """Steps per second in this process."""
        seconds = self.seconds() - self.seconds_before
        return (step - self.first_step) / seconds if seconds > 0 else None
