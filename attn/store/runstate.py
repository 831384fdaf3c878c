"""A run's training state: built fresh from its config, or restored from its checkpoint.

    task, spec, params, optimizer, gens = build(config)
    state = prepare(config, run_dir, resume=True)   # RunState at an iteration boundary

The loop that trains from a RunState is attn.train.loop's (a single run is a
stack of one); it numbers its iterations as below and writes the
checkpoints (save_checkpoint) that prepare reads back.

Step numbering: record `step` s describes the parameters after s updates.
Iteration s draws batch s, computes loss and gradients there, logs (when
s % log_every == 0, and at s = steps), and then applies update s + 1. The
last iteration, s = steps, only measures.

Checkpoints. A checkpoint "at step s" holds the parameters and optimiser
state after s updates, the batch generator's state after s draws, and
`best` and `nonfinite_steps` as iterations 0..s-1 left them; it is only
ever written between iterations s - 1 and s (never after iteration s has
drawn its batch). Resuming from it first drops every record with step >= s,
then runs iterations s..steps: exactly the run that was stopped. The last
checkpoint of a completed run is the one at s = steps, written before the
final (measuring) iteration, so a run killed anywhere after it resumes by
re-running that iteration alone, bit for bit; and extending the run to
more steps continues from it as if the budget had been larger from the
start (with a constant schedule, the same numbers bit for bit; a cosine
schedule is a function of the budget, so attn.train.lifecycle refuses to extend it).
A run with no checkpoint yet resumes from step 0 (attn.train.lifecycle.prepare_resume).
Each checkpoint is written as checkpoint-<s>.npz (first; then
checkpoint.npz becomes a second name of it, a hard link, so keeping costs
no bytes twice; a kill between the two leaves checkpoint.npz at an
earlier step, which a resume replays from): a fork starts a new run from any of them
(prepare(..., checkpoint=...), attn.train.lifecycle.plan_fork).
Retention: once the new one is in place, only the last
logging.keep_checkpoints of them are kept, plus those at multiples of
logging.keep_every (retained_steps); older ones are removed, so a run's
disk use is bounded, and the newest is never removed (a run always has a
valid checkpoint, and checkpoint.npz is its own name of its file).

Randomness: one SeedSequence(seed) spawns three independent generators,
for the initial parameters, the training batches and the fixed eval set.
Two configs that differ only in, say, the score scale share their initial
weights, batches and eval set for the same seed: paired comparisons.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attn import optim
from attn.config.loading import build_spec, build_task
from attn.config.schema import Config
from attn.model import fast
from attn.model.fast import Batch, ModelSpec
from attn.store import arrayfiles, runs
from attn.tasks import CopyTask, RetrievalTask


def lr_multipliers(config: Config) -> dict[str, float]:
    """Each parameter's rate multiplier: optim.lr_mult, with W_q's and W_k's
    times d_k ** optim.qk_lr_exponent."""
    o = config.optim
    multipliers = dict(o.lr_mult)
    if o.qk_lr_exponent:
        for name in ("W_q", "W_k"):
            multipliers[name] = multipliers.get(name, 1.0) * config.model.d_k**o.qk_lr_exponent
    return multipliers


def build_optimizer(config: Config, params: dict, lr_mult: dict | None = None):
    """The config's optimiser over `params`; `lr_mult` (default lr_multipliers)
    may hold one multiplier per member for a stack."""
    o = config.optim
    lr_mult = lr_multipliers(config) if lr_mult is None else lr_mult
    if o.name == "sgd":
        return optim.SGD(params, o.momentum, o.nesterov, o.weight_decay, lr_mult)
    return optim.Adam(params, o.beta1, o.beta2, o.eps, o.weight_decay, o.name == "adamw", lr_mult)


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
    params = fast.init_params(spec, gens.init)
    return task, spec, params, build_optimizer(config, params), gens


@dataclass
class RunState:
    """One run at an iteration boundary: what a checkpoint holds (params,
    optimiser state, batch generator, step, training seconds, best figures,
    non-finite count) and what is rebuilt from the config."""

    config: Config
    run_dir: Path
    task: RetrievalTask | CopyTask
    spec: ModelSpec
    params: dict
    optimizer_state: dict
    gens: Generators
    eval_batch: Batch
    step: int = 0  # the next iteration to run
    wall_time: float = 0.0  # training seconds spent before this process
    best: dict = field(default_factory=dict)
    nonfinite_steps: int = 0
    resumed: bool = False
    buffers: dict = field(default_factory=dict)  # the score mode's state across steps (attn.model.fast.buffer_shapes)


def prepare(config: Config, run_dir: Path, *, resume: bool = False, checkpoint: Path | None = None) -> RunState:
    """The state a run starts from: fresh, or its checkpoint when resuming
    (`checkpoint`: that file instead of the run's checkpoint.npz, as a fork
    starts from another run's). Writes nothing; a checkpoint that does not
    fit is refused with RunError."""
    task, spec, params, optimizer, gens = build(config)
    state = RunState(
        config,
        Path(run_dir),
        task,
        spec,
        params,
        optimizer.state,
        gens,
        task.sample(gens.eval, config.task.eval_size),
        buffers=fast.init_buffers(spec, params, gens.init),
    )
    if resume or checkpoint is not None:
        _restore_checkpoint(state, checkpoint_file(run_dir) if checkpoint is None else Path(checkpoint))
    return state


BUFFER = "buffer/"  # the model's buffers ride in the checkpoint beside the optimiser's state, under this prefix
KEPT_CHECKPOINT = re.compile(r"^checkpoint-(\d+)\.npz$")


def checkpoint_file(run_dir: Path, step: int | None = None) -> Path:
    """The run's last checkpoint, checkpoint.npz; with a step, the one kept at that step, checkpoint-<step>.npz."""
    return Path(run_dir) / ("checkpoint.npz" if step is None else f"checkpoint-{step}.npz")


def linked_checkpoint_step(run_dir: Path) -> int | None:
    """The step checkpoint.npz is at (the kept checkpoint it is a link to), None without one."""
    last = checkpoint_file(run_dir)
    for step in reversed(kept_checkpoint_steps(run_dir)):
        try:
            if os.path.samefile(last, checkpoint_file(run_dir, step)):
                return step
        except OSError:  # checkpoint.npz not there (yet), or the kept one just removed
            continue
    return None


def kept_checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the checkpoints kept in a run directory (checkpoint-<step>.npz), in order."""
    try:
        names = [p.name for p in Path(run_dir).iterdir()]
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in map(KEPT_CHECKPOINT.match, names) if m)


def save_checkpoint(
    state: RunState, params: dict | None = None, optimizer_state: dict | None = None, buffers: dict | None = None
) -> None:
    """The checkpoint at state.step: checkpoint-<step>.npz, then checkpoint.npz
    (the arrays default to the state's own), after the records logged before it are on disk."""
    runs.sync_metrics(state.run_dir)
    meta = {
        "step": state.step,
        "wall_time": state.wall_time,
        "data_rng": state.gens.data.bit_generator.state,
        "best": state.best,
        "nonfinite_steps": state.nonfinite_steps,
    }
    carried = {
        **(state.optimizer_state if optimizer_state is None else optimizer_state),
        **{BUFFER + k: v for k, v in (state.buffers if buffers is None else buffers).items()},
    }
    kept = checkpoint_file(state.run_dir, state.step)
    arrayfiles.save_checkpoint_arrays(kept, state.params if params is None else params, carried, meta)
    runs.link_atomic(kept, checkpoint_file(state.run_dir))
    keep_retained(state.run_dir, state.step, state.config)


def keep_retained(run_dir: Path, newest: int, config: Config, *, later_too: bool = False) -> list[int]:
    """Remove the kept checkpoints the config's retention no longer keeps once the one at `newest` is the last
    (retained_steps); the steps removed. later_too: those beyond `newest` stay (a finished run's tidying,
    which is not rewriting them)."""
    logging = config.logging
    steps = kept_checkpoint_steps(run_dir)
    keep = retained_steps(steps, newest, logging.keep_checkpoints, logging.keep_every)
    return remove_checkpoints(run_dir, [*keep, *(s for s in steps if s > newest)] if later_too else keep)


def retained_steps(steps: list[int], newest: int, keep_last: int | None, keep_every: int | None) -> list[int]:
    """Which kept checkpoints stay once the one at `newest` is written: the
    last `keep_last` up to it (None: all), every multiple of `keep_every`, and
    `newest` itself always (so a run never has none). A checkpoint beyond
    `newest` (left by the process that stopped before a resume replayed the
    steps) is the stopped run's future, which this run is rewriting: not kept."""
    upto = sorted(s for s in steps if s <= newest)
    if keep_last is None:
        return sorted({newest, *upto})
    last = upto[-keep_last:]
    return sorted({newest, *last, *(s for s in upto if keep_every and s % keep_every == 0)})


def remove_checkpoints(run_dir: Path, keep: list[int]) -> list[int]:
    """Delete every checkpoint-<step>.npz whose step is not in `keep` (their
    bytes are freed unless checkpoint.npz is another name of one); returns the
    steps removed. Called only after the newest checkpoint is in place, by the
    run's RunLock holder; a file that cannot be removed is left for the next call."""
    removed = []
    for step in kept_checkpoint_steps(run_dir):
        if step not in keep:
            try:
                checkpoint_file(run_dir, step).unlink()
            except FileNotFoundError:
                pass
            except OSError:
                continue  # a later checkpoint tries again; the run's files stay sound either way
            removed.append(step)
    return removed


def _restore_checkpoint(state: RunState, path: Path) -> None:
    template = {**state.optimizer_state, **{BUFFER + k: v for k, v in state.buffers.items()}}
    state.params, carried, meta = arrayfiles.load_checkpoint(
        path, fast.param_shapes(state.spec), template, state.config.dtype
    )
    state.optimizer_state = {k: v for k, v in carried.items() if not k.startswith(BUFFER)}
    state.buffers = {k.removeprefix(BUFFER): v for k, v in carried.items() if k.startswith(BUFFER)}
    try:
        state.gens.data.bit_generator.state = meta["data_rng"]
        state.step, state.wall_time = int(meta["step"]), float(meta["wall_time"])
        state.best, state.nonfinite_steps = dict(meta["best"]), int(meta["nonfinite_steps"])
    except (KeyError, TypeError, ValueError) as err:
        raise runs.RunError(f"{path}: refused: malformed metadata ({type(err).__name__}: {err})") from None
    if not 0 <= state.step <= state.config.train.steps:
        raise runs.RunError(f"{path}: refused: step {state.step} is outside 0..{state.config.train.steps}")
    state.resumed = True
