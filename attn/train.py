"""The training loop: config -> task batches -> forward/backward -> optimiser -> run directory.

Step numbering: record `step` s describes the parameters after s updates.
Iteration s draws batch s, computes loss and gradients there, logs (when
s % log_every == 0, and at s = steps), and then applies update s + 1. The
last iteration, s = steps, only measures. A checkpoint "at step s" holds the
parameters after s updates and the batch generator's state after s draws,
so resuming from it re-runs iteration s and everything after it exactly.

The resume invariant: a checkpoint at step s is only ever written between
iterations s - 1 and s (never after iteration s has drawn its batch), with
`best` and `nonfinite_steps` as iterations 0..s-1 left them; resuming from
it first drops every record with step >= s, then runs iterations s..steps.
The last checkpoint of a completed run is the one at s = steps, written
before the final (measuring) iteration, so a run killed anywhere after it
resumes by re-running that iteration alone, bit for bit. (A run with no
checkpoint yet resumes from step 0: attn.jobs.prepare_resume.)

Randomness: one SeedSequence(seed) spawns three independent generators,
for the initial parameters, the training batches and the fixed eval set.
Two configs that differ only in, say, the score scale share their initial
weights, batches and eval set for the same seed: paired comparisons.

Non-finite values: a NaN/inf loss or gradient at iteration s is logged with
a `nonfinite` field naming what went wrong. With train.on_nonfinite = stop
the run ends there, status `diverged`; with `continue` update s + 1 is
skipped and the run goes on (summary `nonfinite_steps` counts them).

Stopping: a StopFlag set (by a signal handler) ends the run after the
current iteration with a checkpoint, status `interrupted`. A
KeyboardInterrupt ends it at once, without a checkpoint (the parameters may
be half-updated): status `interrupted`, and resuming continues from the
last checkpoint written.

This module never prints; `progress(step, record)` is called after every
iteration (record is None except on logged steps).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from attn import model, optim, runs
from attn.config import Config
from attn.model import Batch, ModelSpec
from attn.tasks import CopyTask, RetrievalTask

METRIC_TIMING_KEYS = ("wall_time", "steps_per_sec")  # the only record fields that vary run to run
HEARTBEAT_SECONDS = 5.0  # while running, summary.json (step, best, heartbeat) is rewritten this often


def build_task(config: Config):
    t = config.task
    if t.name == "retrieval":
        return RetrievalTask(t.n_keys, t.n_values, t.n_pairs)
    return CopyTask(t.vocab_size, t.length, t.mode, t.shift)


def build_spec(config: Config, task) -> ModelSpec:
    m = config.model
    return ModelSpec(
        fields=task.fields, n_positions=task.seq_len, n_classes=task.n_classes,
        d_model=m.d_model, d_k=m.d_k, d_v=m.d_v or m.d_k, scale=m.scale, causal=m.causal,
        residual=m.residual, positional=m.positional, qk_gain=m.qk_gain, v_gain=m.v_gain,
        o_gain=m.o_gain, readout_gain=m.readout_gain, dtype=config.dtype,
    )


def build_optimizer(config: Config, params: dict):
    o = config.optim
    if o.name == "sgd":
        return optim.SGD(params, o.momentum, o.nesterov, o.weight_decay, o.lr_mult)
    return optim.Adam(params, o.beta1, o.beta2, o.eps, o.weight_decay, o.name == "adamw", o.lr_mult)


@dataclass
class Generators:
    init: np.random.Generator
    data: np.random.Generator
    eval: np.random.Generator


def make_generators(seed: int) -> Generators:
    return Generators(*(np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)))


def build(config: Config):
    """(task, spec, params, optimizer, generators) for a fresh run."""
    task = build_task(config)
    spec = build_spec(config, task)
    gens = make_generators(config.seed)
    params = model.init_params(spec, gens.init)
    return task, spec, params, build_optimizer(config, params), gens


class StopFlag:
    """Set by a signal handler; the loop stops cleanly after the current update."""

    def __init__(self):
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        self.reason = reason


@dataclass
class RunState:
    """A run at an iteration boundary: what a checkpoint holds (params,
    optimiser state, batch generator, step, training seconds, best figures,
    non-finite count) and what is rebuilt from the config."""

    config: Config
    run_dir: Path
    task: RetrievalTask | CopyTask
    spec: ModelSpec
    params: dict
    optimizer: optim.SGD | optim.Adam
    gens: Generators
    eval_batch: Batch
    step: int = 0  # the next iteration to run
    wall_time: float = 0.0  # training seconds spent before this process
    best: dict = field(default_factory=dict)
    nonfinite_steps: int = 0
    resumed: bool = False


def prepare(config: Config, run_dir: Path, *, resume: bool = False) -> RunState:
    """The state a run starts from: fresh, or its checkpoint when resuming.
    Writes nothing; a checkpoint that does not fit is refused with RunError."""
    task, spec, params, optimizer, gens = build(config)
    state = RunState(config, Path(run_dir), task, spec, params, optimizer, gens,
                     task.sample(gens.eval, config.task.eval_size))
    if resume:
        _restore_checkpoint(state)
    return state


def _save_checkpoint(state: RunState) -> None:
    meta = {"step": state.step, "wall_time": state.wall_time, "data_rng": state.gens.data.bit_generator.state,
            "best": state.best, "nonfinite_steps": state.nonfinite_steps}
    runs.save_checkpoint(state.run_dir / "checkpoint.npz", state.params, state.optimizer.state, meta)


def _restore_checkpoint(state: RunState) -> None:
    path = state.run_dir / "checkpoint.npz"
    state.params, state.optimizer.state, meta = runs.load_checkpoint(
        path, model.param_shapes(state.spec), state.optimizer.state, state.config.dtype)
    try:
        state.gens.data.bit_generator.state = meta["data_rng"]
        state.step, state.wall_time = int(meta["step"]), float(meta["wall_time"])
        state.best, state.nonfinite_steps = dict(meta["best"]), int(meta["nonfinite_steps"])
    except (KeyError, TypeError, ValueError) as err:
        raise runs.RunError(f"{path}: refused: malformed metadata ({type(err).__name__}: {err})") from None
    if not 0 <= state.step <= state.config.train.steps:
        raise runs.RunError(f"{path}: refused: step {state.step} is outside 0..{state.config.train.steps}")
    state.resumed = True


def train(config: Config, run_dir: Path, *, resume: bool = False, stop: StopFlag | None = None,
          progress: Callable[[int, dict | None], None] | None = None) -> dict:
    """Train `config`, recording into `run_dir` (which holds config.yaml already).

    Returns the final summary (also in summary.json): status `completed`,
    `interrupted` (stop requested; checkpointed) or `diverged`.
    """
    return run(prepare(config, run_dir, resume=resume), stop=stop, progress=progress)


def run(state: RunState, *, stop: StopFlag | None = None,
        progress: Callable[[int, dict | None], None] | None = None) -> dict:
    """The loop, from `state` to the end (or a stop, or divergence)."""
    config, run_dir = state.config, state.run_dir
    stop = stop or StopFlag()
    steps, start_step = config.train.steps, state.step
    if state.resumed:  # take the directory back from the process that stopped
        runs.truncate_metrics(run_dir, start_step)
        runs.remove_dead_temporaries(run_dir)
    summary = {
        "status": "running", "step": start_step, "steps": steps, "task": state.task.name,
        "references": state.task.reference_losses(), "started_at": time.time(),
        "resumed_from": start_step if state.resumed else None, "best": state.best,
        "nonfinite_steps": state.nonfinite_steps,
    }
    _write_summary(run_dir, summary)
    clock = _Clock(state.wall_time, start_step)
    last_write, last_checkpoint = time.perf_counter(), start_step if state.resumed else None
    final_record, status, reason = None, "completed", None
    step = start_step
    try:
        # Overflow to inf/NaN is detected and handled here, not warned about.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for step in range(start_step, steps + 1):
                record, fault = _iterate(state, step, clock)
                if record is not None:
                    runs.append_metrics(run_dir, record)
                    final_record = record
                    summary.update(step=step, nonfinite_steps=state.nonfinite_steps)
                if time.perf_counter() - last_write > HEARTBEAT_SECONDS:
                    _write_summary(run_dir, summary)
                    last_write = time.perf_counter()
                if progress is not None:
                    progress(step, record)
                if fault is not None and config.train.on_nonfinite == "stop":
                    what, note = fault
                    status, reason = "diverged", f"non-finite {what} at step {step}{note}"
                    break
                if step < steps and (state.step % config.logging.checkpoint_every == 0 or state.step == steps
                                     or stop.reason):
                    state.wall_time = clock.elapsed()
                    _save_checkpoint(state)
                    last_checkpoint = state.step
                    if stop.reason:
                        status, reason = "interrupted", f"stopped by {stop.reason} at step {state.step}; checkpoint saved"
                        break
    except KeyboardInterrupt:
        resumable = f"resume continues from step {last_checkpoint}" if last_checkpoint is not None else "no checkpoint yet"
        summary.update(status="interrupted", reason=f"stopped immediately during step {step}; {resumable}",
                       wall_time=clock.elapsed())
        _write_summary(run_dir, summary)
        raise
    wall = clock.elapsed()
    end_step = step if status == "diverged" else state.step
    summary.update(
        status=status, reason=reason, step=end_step, wall_time=wall, best=state.best,
        nonfinite_steps=state.nonfinite_steps, final=_final_figures(final_record),
        steps_per_sec=clock.rate_since_start(end_step),
    )
    _write_summary(run_dir, summary)
    return summary


def _iterate(state: RunState, step: int, clock: _Clock) -> tuple[dict | None, tuple[str, str] | None]:
    """Iteration `step`: a batch, its loss and gradients, a metrics record on
    logged steps, then update step + 1 unless a value is non-finite or this is
    the last step. Returns (record or None, what went non-finite or None)."""
    config = state.config
    batch = state.task.sample(state.gens.data, config.train.batch_size)
    loss, grads, train_cache = model.loss_and_grads(state.params, state.spec, batch)
    fault = _find_nonfinite(loss, grads, state.params)
    record = None
    if step % config.logging.log_every == 0 or step == config.train.steps or fault is not None:
        record = {**_measure(state, step, loss, grads, train_cache, batch), **clock.lap(step)}
    if fault is not None:
        record["nonfinite"] = "".join(fault)
        state.nonfinite_steps += 1
    elif step < config.train.steps:
        ratios = _apply_update(state, grads, optim_lr(config, step), measure=record is not None)
        if record is not None:
            record.update(ratios)
    state.step = min(step + 1, config.train.steps)
    return record, fault


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


def _write_summary(run_dir: Path, summary: dict) -> None:
    summary.update(runs.heartbeat_fields())
    runs.write_json(run_dir / "summary.json", summary)


def optim_lr(config: Config, step: int) -> float:
    o = config.optim
    return optim.learning_rate(step, o.lr, o.schedule, o.warmup_steps, config.train.steps, o.min_lr_ratio)


def _find_nonfinite(loss, grads: dict, params: dict) -> tuple[str, str] | None:
    """None if the loss and gradients are finite; else (what, note) naming a
    parameter: ('gradient of W_q', ''), or for the loss the parameter that is
    itself non-finite or else holds the largest weight (the likely culprit)."""
    if math.isfinite(loss):
        bad = next((name for name, g in grads.items() if not np.isfinite(g).all()), None)
        return None if bad is None else (f"gradient of {bad}", "")
    bad = next((name for name, p in params.items() if not np.isfinite(p).all()), None)
    if bad is not None:
        return "loss", f"; parameter {bad} is non-finite"
    largest = {name: float(np.abs(p).max()) for name, p in params.items()}
    name = max(largest, key=largest.get)
    return "loss", f"; largest weight in {name}: |w| = {largest[name]:.3g}"


def _measure(state: RunState, step: int, loss, grads: dict, train_cache, batch: Batch) -> dict:
    """One metrics record (without timing and update ratios); evaluates on the
    fixed eval set and snapshots its attention at the first and last step."""
    eval_loss, eval_cache = model.forward(state.params, state.spec, state.eval_batch)
    stats = model.diagnostics(eval_cache, state.eval_batch)
    if not np.isfinite(eval_loss):  # argmax and entropies of NaN scores/logits mean nothing
        stats = dict.fromkeys(stats)
    squares = {n: optim.squared_norm(g) for n, g in grads.items()}
    record = {
        "step": step,
        "lr": optim_lr(state.config, step),
        "train_loss": float(loss),
        "train_accuracy": model.accuracy(train_cache, batch),
        "eval_loss": float(eval_loss),
        "eval_accuracy": stats.pop("accuracy"),
        **stats,
        "grad_norm": math.sqrt(sum(squares.values())),  # = optim.global_norm(grads), bit for bit
        **{f"grad_norm/{n}": math.sqrt(square) for n, square in squares.items()},
    }
    _update_best(state.best, record)
    n_examples = min(state.config.logging.attention_examples, state.config.task.eval_size)
    if n_examples and step in (0, state.config.train.steps):
        _save_attention(state, "init" if step == 0 else "final", n_examples)
    return record


def _apply_update(state: RunState, grads: dict, lr: float, measure: bool) -> dict:
    """Clip, step the optimiser; with `measure`, the update-to-weight ratio
    ||w_new - w|| / ||w|| of each parameter (None where w = 0)."""
    if state.config.optim.clip_norm is not None:
        optim.clip_by_global_norm(grads, state.config.optim.clip_norm)
    before = {n: p.copy() for n, p in state.params.items()} if measure else {}
    state.optimizer.step(state.params, grads, lr)
    ratios = {}
    for n, w in before.items():
        norm_w = math.sqrt(optim.squared_norm(w))
        ratios[f"update_ratio/{n}"] = math.sqrt(optim.squared_norm(state.params[n] - w)) / norm_w if norm_w else None
    return ratios


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


def _save_attention(state: RunState, when: str, n: int) -> None:
    """attention.npz: weights of the first n eval examples at init and at the end
    (the end's snapshot is added beside the init one already on disk). Every
    row of the map, not only the rows with a target that training computes."""
    b = state.eval_batch
    shown = Batch(b.tokens[:n], b.targets[:n], b.target_mask[:n], b.target_key[:n])
    _, cache = model.forward(state.params, state.spec, shown, all_queries=True)
    path = state.run_dir / "attention.npz"
    arrays = {}
    if when == "final" and path.exists():
        arrays = runs.load_arrays(path)
    arrays.update({f"attn_{when}": cache["attn"]["attn"], "tokens": shown.tokens,
                   "target_key": shown.target_key, "target_mask": shown.target_mask})
    runs.save_arrays(path, arrays)
