"""How attn trains, on one page: the training loop of one run, written plainly.

    summary = train(prepare(config, run_dir))

attn trains through attn.train.loop, which runs many runs of one shape as
one computation (a leading member axis, attn.train.stack); this is the same
loop for one run, as attn.model.reference is the model's textbook twin.
tests/test_reference_loop.py holds the two equal bit for bit: records,
checkpoints, snapshots and summaries. Step numbering and checkpoints are
attn.store.runstate's; left to the real loop are the progress callback, the
summary's heartbeat, Ctrl-C, and taking a resumed run's directory back.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from attn import optim
from attn.model import fast
from attn.store.runstate import RunState, build_optimizer, save_checkpoint
from attn.train.loop import (
    Member,
    StopFlag,
    attention_examples,
    find_nonfinite,
    finish_run,
    log_record,
    metrics_record,
    save_attention,
    save_mechanism,
)


def train(state: RunState, stop: StopFlag | None = None) -> dict:
    """Train one run from `state` to its end, recording into its run
    directory; returns the final summary (attn.train.loop.run's)."""
    config, spec, params, buffers = state.config, state.spec, state.params, state.buffers
    optimizer = build_optimizer(config, params)
    optimizer.state = state.optimizer_state  # updated in place: the dict a checkpoint saves
    run = Member(state, 0, stack_size=1)  # the run's summary, clock and learning rate
    stop = stop or StopFlag()
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # non-finite values are caught below
        for step in itertools.count(state.step):  # until the run ends: at train.steps, or before
            # batch, forward, backward
            batch = state.task.sample(state.gens.data, config.train.batch_size)  # (B, T, F)
            fast.advance_buffers(params, buffers, spec)
            loss, grads, cache = fast.loss_and_grads(params, spec, batch, buffers=buffers)
            fault = find_nonfinite(loss, grads, params)  # None, or what went non-finite

            # measure: every log_every steps, at the end, and whenever a value is non-finite
            record = (
                _measure(run, step, loss, grads, cache, batch) if run.should_log(step) or fault is not None else None
            )
            if config.logging.mechanism_step is not None and step in (0, config.logging.mechanism_step):
                save_mechanism(state.run_dir, params, spec, state.eval_batch, buffers, step)
            if fault is not None:
                record["nonfinite"] = "".join(fault)
                state.nonfinite_steps += 1

            # stop: the last iteration only measures; a non-finite value ends the run if on_nonfinite = stop
            ending = run.ending_at(step, fault)
            if ending is not None:
                log_record(run, record, step)
                finish_run(run, *ending, step)
                return run.summary

            # optimiser step (none when a value is non-finite), and how far it moved each parameter
            if config.optim.clip_norm:
                optim.clip_by_global_norm(grads, config.optim.clip_norm)
            before = {n: p.copy() for n, p in params.items()} if record is not None else {}
            if fault is None:
                optimizer.step(params, grads, run.lr(step))
            for n, w in before.items():
                norm_w = math.sqrt(optim.squared_norm(w))
                record[f"update_ratio/{n}"] = math.sqrt(optim.squared_norm(params[n] - w)) / norm_w if norm_w else None
            log_record(run, record, step)
            state.step = step + 1

            # checkpoint: every checkpoint_every updates, before the last iteration, and when asked to stop
            if run.should_checkpoint(state.step) or stop.reason:
                state.wall_time = run.clock.elapsed()
                save_checkpoint(state)
            if stop.reason:
                finish_run(
                    run, "interrupted", f"stopped by {stop.reason} at step {state.step}; checkpoint saved", state.step
                )
                return run.summary


def _measure(run: Member, step: int, loss: float, grads: dict, cache, batch: fast.Batch) -> dict:
    """The record of iteration `step` (update ratios are added after the
    update): train loss and accuracy, the eval set's loss and diagnostics,
    gradient norms; the attention snapshot at the first and last step."""
    state = run.state
    eval_loss, eval_cache = fast.forward(state.params, state.spec, state.eval_batch, buffers=state.buffers)
    record = metrics_record(
        run,
        step,
        loss,
        fast.accuracy(cache, batch),
        eval_loss,
        fast.diagnostics(eval_cache, state.eval_batch),
        {n: optim.squared_norm(g) for n, g in grads.items()},
    )
    n = attention_examples(state.config)
    if n and step in (0, state.config.train.steps):
        shown = fast.Batch(**{field: values[:n] for field, values in vars(state.eval_batch).items()})
        save_attention(state.run_dir, state.params, state.spec, shown, state.buffers, "init" if step == 0 else "final")
    return record
