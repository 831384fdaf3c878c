"""Many runs as one computation: which runs may share a stack, and their arrays with a leading member axis.

    stack_key(config)            equal for the configs that can train as one stack
    Stack(states)                their parameters, optimiser state, scales, buffers: (M, ...)

Runs that share every shape (stack_key: the same task, model widths,
batch, eval set size, optimiser and dtype) train as one stack: their
parameters carry a leading member axis and every step is one computation
(attn.model.head). Each member keeps its own seed, generators, learning rate
and schedule, score scale, initial gains, budget, logging and run
directory, and its numbers are those it would have alone (a single run is
a stack of one: the same code, attn.train.loop). A member that completes,
diverges or is stopped leaves the stack (Stack.keep); the others go on.
Members must start from the same step.
"""

from __future__ import annotations

import numpy as np

from attn.config.loading import build_spec, build_task, estimate_memory_bytes, flatten_config
from attn.config.schema import Config, per_member_keys, to_dict
from attn.model import head
from attn.model.fast import Batch
from attn.store.runstate import RunState, build_optimizer, lr_multipliers

MAX_STACK_MEMBERS = 16  # beyond about this many, a stack of small runs gains no more per member
STACK_MEMORY_BYTES = 128 << 20  # a stack's estimated memory; past it, more members cost more than they save


def stack_key(config: Config) -> tuple:
    """What runs must share to train as one stack: every config value but those
    of the fields declared per_member in the schema."""
    flat, per_member = flatten_config(to_dict(config)), per_member_keys()
    return tuple((k, repr(v)) for k, v in sorted(flat.items()) if k not in per_member)


def members_per_stack(config: Config) -> int:
    """How many runs of this config's shape to stack: as many as fit
    STACK_MEMORY_BYTES by config.estimate_memory_bytes, at most
    MAX_STACK_MEMBERS (a stack's arrays then still fit the caches), at least one."""
    return max(1, min(MAX_STACK_MEMBERS, STACK_MEMORY_BYTES // estimate_memory_bytes(config)))


def head_step_cost(config: Config) -> int:
    """Multiply-adds of one training step's head (attn.model.head.head_costs): the
    cheaper association, at the widths the head is carried at."""
    task = build_task(config)
    spec = build_spec(config, task)
    positions = 1 if task.name == "retrieval" else task.seq_len
    return min(
        head.head_costs(
            config.train.batch_size,
            positions,
            task.seq_len,
            spec.d_model,
            spec.k_width,
            spec.v_width,
            normed=spec.normed,
        ).values()
    )


# A stack's step pays numpy's per-call overhead once, whatever its members, and each member a share of its own
# (its batch drawn, its records measured) beside its products: in multiply-adds of the head's products, as CPU
# seconds per member-step of stacks of 1 to 16 members at d_k 16, 16384 and 2^20 of the headline put them.
STACK_STEP_COST = 13_000_000
MEMBER_STEP_COST = 6_500_000


def stack_cost(configs: list[Config]) -> int:
    """A stack's relative cost, for ordering and splitting work: STACK_STEP_COST
    for each step of its longest member, and its members' steps times the
    multiply-adds of one head step, the elementwise work on X and MEMBER_STEP_COST."""
    return max(config.train.steps for config in configs) * STACK_STEP_COST + sum(
        config.train.steps
        * (
            MEMBER_STEP_COST
            + head_step_cost(config)
            + 10 * config.train.batch_size * build_task(config).seq_len * config.model.d_model
        )
        for config in configs
    )


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
