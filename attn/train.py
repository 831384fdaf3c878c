"""The training loop: config -> task batches -> forward/backward -> optimiser -> run directory.

Step numbering: record `step` s describes the parameters after s updates.
Iteration s draws batch s, computes loss and gradients there, logs (when
s % log_every == 0, and at s = steps), and then applies update s + 1. The
last iteration, s = steps, only measures. A checkpoint "at step s" holds the
parameters after s updates and the batch generator's state after s draws,
so resuming from it re-runs iteration s and everything after it exactly.

Randomness: one SeedSequence(seed) spawns three independent generators,
for the initial parameters, the training batches and the fixed eval set.
Two configs that differ only in, say, the score scale share their initial
weights, batches and eval set for the same seed: paired comparisons.

This module never prints; `progress(step, record)` is called after every
iteration (record is None except on logged steps).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from attn import model, optim, runs
from attn.config import Config
from attn.model import ModelSpec
from attn.tasks import CopyTask, RetrievalTask

METRIC_TIMING_KEYS = ("wall_time", "steps_per_sec")  # the only record fields that vary run to run


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


def _evaluate(params, spec, eval_batch):
    loss, cache = model.forward(params, spec, eval_batch)
    return float(loss), model.diagnostics(cache, eval_batch), cache


def _first_nonfinite(loss, grads) -> str | None:
    if not np.isfinite(loss):
        return "loss"
    for name, g in grads.items():
        if not np.isfinite(g).all():
            return name
    return None


def train(config: Config, run_dir: Path, *, resume: bool = False, stop: StopFlag | None = None,
          progress: Callable[[int, dict | None], None] | None = None) -> dict:
    """Train `config`, recording into `run_dir` (created, with config.yaml written).

    Returns the final summary (also in summary.json). On a stop request the
    run is checkpointed and its status is `interrupted`; on a non-finite loss
    or gradient with train.on_nonfinite = stop, `diverged`.
    """
    run_dir = Path(run_dir)
    stop = stop or StopFlag()
    task, spec, params, optimizer, gens = build(config)
    eval_batch = task.sample(gens.eval, config.task.eval_size)
    references = task.reference_losses()
    steps, log_every = config.train.steps, config.logging.log_every
    n_examples = min(config.logging.attention_examples, config.task.eval_size)

    start_step, wall_offset, best, nonfinite_steps = 0, 0.0, {}, 0
    if resume:
        params, optimizer.state, meta = runs.load_checkpoint(
            run_dir / "checkpoint.npz", model.param_shapes(spec), optimizer.state, config.dtype)
        gens.data.bit_generator.state = meta["data_rng"]
        start_step, wall_offset = meta["step"], meta["wall_time"]
        best, nonfinite_steps = meta["best"], meta["nonfinite_steps"]
        runs.truncate_metrics(run_dir, start_step)

    summary = {
        "status": "running", "step": start_step, "steps": steps, "task": task.name,
        "references": references, "started_at": time.time(), "resumed_from": start_step if resume else None,
        "best": best, **runs.heartbeat_fields(),
    }
    runs.write_json(run_dir / "summary.json", summary)

    def checkpoint(step: int, wall: float) -> None:
        meta = {"step": step, "wall_time": wall, "data_rng": gens.data.bit_generator.state,
                "best": best, "nonfinite_steps": nonfinite_steps}
        runs.save_checkpoint(run_dir / "checkpoint.npz", params, optimizer.state, meta)

    t0 = time.perf_counter() - wall_offset
    last_log_time, last_log_step = time.perf_counter(), start_step
    final_record = None
    status, reason = "completed", None
    for step in range(start_step, steps + 1):
        batch = task.sample(gens.data, config.train.batch_size)
        loss, grads, train_cache = model.loss_and_grads(params, spec, batch)
        bad = _first_nonfinite(loss, grads)
        logging_now = step % log_every == 0 or step == steps or bad is not None
        record = None
        if logging_now:
            eval_loss, stats, eval_cache = _evaluate(params, spec, eval_batch)
            now = time.perf_counter()
            record = {
                "step": step,
                "lr": optim_lr(config, step),
                "train_loss": float(loss),
                "train_accuracy": model.diagnostics(train_cache, batch)["accuracy"],
                "eval_loss": eval_loss,
                "eval_accuracy": stats.pop("accuracy"),
                **stats,
                "grad_norm": optim.global_norm(grads),
                **{f"grad_norm/{n}": math.sqrt(float(np.vdot(g, g))) for n, g in grads.items()},
                "wall_time": now - t0,
                "steps_per_sec": (step - last_log_step) / (now - last_log_time) if step > last_log_step else None,
            }
            last_log_time, last_log_step = now, step
            if n_examples and step in (0, steps):
                _save_attention(run_dir, "init" if step == 0 else "final", eval_cache, eval_batch, n_examples)
            _update_best(best, record)
        if bad is not None:
            record["nonfinite"] = bad
            nonfinite_steps += 1
            if config.train.on_nonfinite == "stop":
                runs.append_metrics(run_dir, record)
                status, reason = "diverged", f"non-finite {'loss' if bad == 'loss' else 'gradient of ' + bad} at step {step}"
                final_record = record
                summary["step"] = step
                break
        if step < steps and bad is None:
            lr = optim_lr(config, step)
            if config.optim.clip_norm is not None:
                optim.clip_by_global_norm(grads, config.optim.clip_norm)
            before = {n: p.copy() for n, p in params.items()} if logging_now else None
            optimizer.step(params, grads, lr)
            if before is not None:
                for n, p in params.items():
                    norm_w = math.sqrt(float(np.vdot(before[n], before[n])))
                    delta = p - before[n]
                    record[f"update_ratio/{n}"] = math.sqrt(float(np.vdot(delta, delta))) / norm_w if norm_w else None
        if record is not None:
            runs.append_metrics(run_dir, record)
            final_record = record
            summary.update(step=step, best=best, **runs.heartbeat_fields())
            runs.write_json(run_dir / "summary.json", summary)
        if progress is not None:
            progress(step, record)
        if step < steps and ((step + 1) % config.logging.checkpoint_every == 0 or stop.reason):
            checkpoint(step + 1, time.perf_counter() - t0)
            if stop.reason:
                status, reason = "interrupted", f"stopped by {stop.reason} after step {step + 1}"
                summary["step"] = step + 1
                break
    wall = time.perf_counter() - t0
    if status == "completed":
        checkpoint(steps, wall)
    summary.update(
        status=status, reason=reason, wall_time=wall, best=best, nonfinite_steps=nonfinite_steps,
        steps_per_sec=(summary["step"] - start_step) / (wall - wall_offset) if wall > wall_offset else None,
        final=_final_figures(final_record), **runs.heartbeat_fields(),
    )
    if status == "completed":
        summary["step"] = steps
    runs.write_json(run_dir / "summary.json", summary)
    return summary


def optim_lr(config: Config, step: int) -> float:
    o = config.optim
    return optim.learning_rate(step, o.lr, o.schedule, o.warmup_steps, config.train.steps, o.min_lr_ratio)


def _update_best(best: dict, record: dict) -> None:
    loss, acc = record["eval_loss"], record["eval_accuracy"]
    if math.isfinite(loss) and loss < best.get("eval_loss", math.inf):
        best.update(eval_loss=loss, eval_loss_step=record["step"])
    if acc > best.get("eval_accuracy", -1.0):
        best.update(eval_accuracy=acc, eval_accuracy_step=record["step"])
    if acc >= 0.99 and "steps_to_99" not in best:
        best["steps_to_99"] = record["step"]


def _final_figures(record: dict | None) -> dict:
    if record is None:
        return {}
    keys = ("step", "train_loss", "eval_loss", "eval_accuracy", "score_std", "attn_entropy", "saturated_frac")
    return {k: record[k] for k in keys if k in record}


def _save_attention(run_dir: Path, when: str, eval_cache, eval_batch, n: int) -> None:
    """attention.npz: weights of the first n eval examples at init and at the end
    (the end's snapshot is added beside the init one already on disk)."""
    path = run_dir / "attention.npz"
    arrays = {}
    if when == "final" and path.exists():
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    arrays.update({f"attn_{when}": eval_cache["attn"]["attn"][:n], "tokens": eval_batch.tokens[:n],
                   "target_key": eval_batch.target_key[:n], "target_mask": eval_batch.target_mask[:n]})
    runs.save_arrays(path, arrays)
