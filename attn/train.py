"""The training loop: config -> task batches -> forward/backward -> optimiser -> run directory.

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
schedule is a function of the budget, so attn.jobs refuses to extend it).
A run with no checkpoint yet resumes from step 0 (attn.jobs.prepare_resume).
Every checkpoint is kept as checkpoint-<s>.npz (written first; then
checkpoint.npz becomes a second name of it, a hard link, so keeping costs
no bytes twice; a kill between the two leaves checkpoint.npz at an
earlier step, which a resume replays from): a fork starts a new run from any of them
(prepare(..., checkpoint=...), attn.jobs.plan_fork).

Randomness: one SeedSequence(seed) spawns three independent generators,
for the initial parameters, the training batches and the fixed eval set.
Two configs that differ only in, say, the score scale share their initial
weights, batches and eval set for the same seed: paired comparisons.

Stacks. Runs that share every shape (stack_key: the same task, model
widths, batch, eval set size, optimiser and dtype) train as one stack: their
parameters carry a leading member axis and every step is one computation
(attn.layers). Each member keeps its own seed, generators, learning rate
and schedule, score scale, initial gains, budget, logging and run
directory, and its numbers are those it would have alone (a single run is
a stack of one: the same code). A member that completes, diverges or is
stopped leaves the stack; the others go on. Members must start from the
same step.

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
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from attn import layers, mechanism, model, optim, runs
from attn.config import Config, estimate_memory_bytes, flatten_config, to_dict
from attn.model import Batch, ModelSpec
from attn.tasks import CopyTask, RetrievalTask

METRIC_TIMING_KEYS = ("wall_time", "steps_per_sec")  # the only record fields that vary run to run
HEARTBEAT_SECONDS = 5.0  # while running, summary.json (step, best, heartbeat) is rewritten this often
# Config keys whose values may differ between the members of one stack; every other key is shared.
PER_MEMBER_KEYS = ("name", "runs_dir", "seed", "model.scale", "model.qk_gain", "model.v_gain", "model.o_gain",
                   "model.readout_gain", "optim.lr", "optim.lr_mult", "optim.qk_lr_exponent", "optim.clip_norm",
                   "optim.schedule",
                   "optim.warmup_steps", "optim.min_lr_ratio", "train.steps", "train.on_nonfinite")
PER_MEMBER_SECTIONS = ("logging.",)
MAX_STACK_MEMBERS = 16  # beyond about this many, a stack of small runs gains no more per member
STACK_MEMORY_BYTES = 128 << 20  # a stack's estimated memory; past it, more members cost more than they save


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
        o_gain=m.o_gain, readout_gain=m.readout_gain, dtype=config.dtype, score=m.score, qk_norm=m.qk_norm,
        qk_norm_gain=m.qk_norm_gain, softcap=m.softcap, temperature_init=m.temperature_init,
        length_scale_init=m.length_scale_init, mup_zero_init_q=m.mup_zero_init_q,
    )


def lr_multipliers(config: Config) -> dict[str, float]:
    """Each parameter's rate multiplier: optim.lr_mult, with W_q's and W_k's
    times d_k ** optim.qk_lr_exponent."""
    o = config.optim
    multipliers = dict(o.lr_mult)
    if o.qk_lr_exponent:
        for name in ("W_q", "W_k"):
            multipliers[name] = multipliers.get(name, 1.0) * config.model.d_k ** o.qk_lr_exponent
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
    params = model.init_params(spec, gens.init)
    return task, spec, params, build_optimizer(config, params), gens


def stack_key(config: Config) -> tuple:
    """What runs must share to train as one stack: every config value but
    PER_MEMBER_KEYS and the logging section."""
    flat = flatten_config(to_dict(config))
    return tuple((k, repr(v)) for k, v in sorted(flat.items())
                 if k not in PER_MEMBER_KEYS and not k.startswith(PER_MEMBER_SECTIONS))


def members_per_stack(config: Config) -> int:
    """How many runs of this config's shape to stack: as many as fit
    STACK_MEMORY_BYTES by config.estimate_memory_bytes, at most
    MAX_STACK_MEMBERS (a stack's arrays then still fit the caches), at least one."""
    return max(1, min(MAX_STACK_MEMBERS, STACK_MEMORY_BYTES // estimate_memory_bytes(config)))


def stack_cost(configs: list[Config]) -> int:
    """A stack's relative cost, for ordering work: its members' steps times
    the multiply-adds of one head step (attn.layers.head_costs) and the
    elementwise work on X."""
    total = 0
    for config in configs:
        task = build_task(config)
        spec = build_spec(config, task)
        positions = 1 if task.name == "retrieval" else task.seq_len
        head = min(layers.head_costs(config.train.batch_size, positions, task.seq_len, spec.d_model, spec.d_k,
                                     spec.d_v).values())
        total += config.train.steps * (head + 10 * config.train.batch_size * task.seq_len * spec.d_model)
    return total


class StopFlag:
    """Set by a signal handler; the loop stops cleanly after the current update."""

    def __init__(self):
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        self.reason = reason


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
    buffers: dict = field(default_factory=dict)  # the score mode's state across steps (attn.model.buffer_shapes)


def prepare(config: Config, run_dir: Path, *, resume: bool = False, checkpoint: Path | None = None) -> RunState:
    """The state a run starts from: fresh, or its checkpoint when resuming
    (`checkpoint`: that file instead of the run's checkpoint.npz, as a fork
    starts from another run's). Writes nothing; a checkpoint that does not
    fit is refused with RunError."""
    task, spec, params, optimizer, gens = build(config)
    state = RunState(config, Path(run_dir), task, spec, params, optimizer.state, gens,
                     task.sample(gens.eval, config.task.eval_size), buffers=model.init_buffers(spec, params, gens.init))
    if resume or checkpoint is not None:
        _restore_checkpoint(state, checkpoint_file(run_dir) if checkpoint is None else Path(checkpoint))
    return state


BUFFER = "buffer/"  # the model's buffers ride in the checkpoint beside the optimiser's state, under this prefix
KEPT_CHECKPOINT = re.compile(r"^checkpoint-(\d+)\.npz$")


def checkpoint_file(run_dir: Path, step: int | None = None) -> Path:
    """The run's last checkpoint, checkpoint.npz; with a step, the one kept at that step, checkpoint-<step>.npz."""
    return Path(run_dir) / ("checkpoint.npz" if step is None else f"checkpoint-{step}.npz")


def kept_checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the checkpoints kept in a run directory (checkpoint-<step>.npz), in order."""
    try:
        names = [p.name for p in Path(run_dir).iterdir()]
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in map(KEPT_CHECKPOINT.match, names) if m)


def save_checkpoint(state: RunState, params: dict | None = None, optimizer_state: dict | None = None,
                    buffers: dict | None = None) -> None:
    """The checkpoint at state.step: checkpoint-<step>.npz, then checkpoint.npz
    (the arrays default to the state's own)."""
    meta = {"step": state.step, "wall_time": state.wall_time, "data_rng": state.gens.data.bit_generator.state,
            "best": state.best, "nonfinite_steps": state.nonfinite_steps}
    carried = {**(state.optimizer_state if optimizer_state is None else optimizer_state),
               **{BUFFER + k: v for k, v in (state.buffers if buffers is None else buffers).items()}}
    kept = checkpoint_file(state.run_dir, state.step)
    runs.save_checkpoint(kept, state.params if params is None else params, carried, meta)
    runs.link_atomic(kept, checkpoint_file(state.run_dir))


def _restore_checkpoint(state: RunState, path: Path) -> None:
    template = {**state.optimizer_state, **{BUFFER + k: v for k, v in state.buffers.items()}}
    state.params, carried, meta = runs.load_checkpoint(path, model.param_shapes(state.spec), template,
                                                       state.config.dtype)
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


class Stack:
    """The stacked arrays of the members still training: parameters and
    optimiser state (M, ...), score scales and eval batches, one per member."""

    def __init__(self, states: list[RunState]):
        first = states[0]
        self.spec = first.spec
        self.params = {name: np.stack([s.params[name] for s in states]) for name in first.params}
        multipliers = [lr_multipliers(s.config) for s in states]
        lr_mult = {n: np.array([m.get(n, 1.0) for m in multipliers]) for n in set().union(*multipliers)}
        self.optimizer = build_optimizer(first.config, self.params, lr_mult)
        self.optimizer.state = {k: np.stack([s.optimizer_state[k] for s in states]) for k in first.optimizer_state}
        self.scales = np.array([s.spec.score_scale for s in states])
        self.buffers = {k: np.stack([s.buffers[k] for s in states]) for k in first.buffers}
        self.eval_batch = stack_batches([s.eval_batch for s in states])

    def keep(self, kept: list[int]) -> None:
        """Drop every member but those at the indices `kept`."""
        take = np.array(kept, dtype=np.intp)
        self.params = {n: p[take] for n, p in self.params.items()}
        self.optimizer.state = {k: v[take] for k, v in self.optimizer.state.items()}
        self.optimizer.lr_mult = {n: v[take] for n, v in self.optimizer.lr_mult.items()}
        self.scales = self.scales[take]
        self.buffers = {k: v[take] for k, v in self.buffers.items()}
        self.eval_batch = Batch(*(getattr(self.eval_batch, f)[take] for f in BATCH_FIELDS))

    def member_params(self, m: int) -> dict:
        return {n: p[m] for n, p in self.params.items()}

    def member_buffers(self, m: int) -> dict:
        return {n: b[m] for n, b in self.buffers.items()}

    def member_optimizer_state(self, m: int) -> dict:
        return {k: v[m] for k, v in self.optimizer.state.items()}


BATCH_FIELDS = ("tokens", "targets", "target_mask", "target_key")


def stack_batches(batches: list[Batch]) -> Batch:
    """One batch per member -> a stacked batch (M, B, ...)."""
    return Batch(*(np.stack([getattr(b, f) for b in batches]) for f in BATCH_FIELDS))


def member_batch(batch: Batch, m: int, n: int | None = None) -> Batch:
    """Member m's batch of a stacked batch (its first n examples)."""
    return Batch(*(getattr(batch, f)[m, :n] for f in BATCH_FIELDS))


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
    model.advance_buffers(stack.params, stack.buffers, stack.spec)
    loss, grads, train_cache = model.loss_and_grads(stack.params, stack.spec, batch, stack.scales, stack.buffers)
    faults = _find_nonfinite(loss, grads, stack.params)
    logged = [m.logs(step) or faults[k] is not None for k, m in enumerate(members)]
    records = _measure(stack, members, step, loss, grads, train_cache, batch, logged)
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
    eval_loss, eval_cache = model.forward(stack.params, stack.spec, stack.eval_batch, scale=stack.scales,
                                          buffers=stack.buffers)
    stats = model.diagnostics(eval_cache, stack.eval_batch)
    train_accuracy = model.accuracy(train_cache, batch)
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
        if member.config.logging.mechanism_step is not None and step in (0, member.config.logging.mechanism_step):
            _save_mechanism(member, stack, k, step)
        records.append(record)
    return records


def _save_mechanism(member: Member, stack: Stack, k: int, step: int) -> None:
    """mechanism.npz: attn.mechanism.row_statistics of the eval set's query
    rows at `step`, as arrays named '<step>/<statistic>' (added to the file)."""
    rows = mechanism.row_statistics(stack.member_params(k), member.state.spec, member_batch(stack.eval_batch, k),
                                    stack.member_buffers(k))
    path = member.run_dir / "mechanism.npz"
    arrays = runs.load_arrays(path) if step and path.exists() else {}
    arrays.update({f"{step}/{name}": values for name, values in rows.items()})
    runs.save_arrays(path, arrays)


def _apply_update(stack: Stack, members: list[Member], grads: dict, step: int, records: list, skipped: list[int]) -> None:
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
    _, cache = model.forward(stack.member_params(k), stack.spec, shown, all_queries=True, scale=stack.scales[k],
                             buffers=stack.member_buffers(k))
    path = member.run_dir / "attention.npz"
    arrays = {}
    if when == "final" and path.exists():
        arrays = runs.load_arrays(path)
    arrays.update({f"attn_{when}": cache["attn"]["attn"], "tokens": shown.tokens,
                   "target_key": shown.target_key, "target_mask": shown.target_mask})
    runs.save_arrays(path, arrays)
