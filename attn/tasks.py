"""Toy tasks that one attention head can solve, generated from a seeded Generator.

retrieval (associative recall)
    Positions 0..P-1 each hold a (key, value) pair, keys distinct within a
    sequence, values drawn uniformly with replacement. Position P holds one
    of those keys again as the query, with the value field set to a query
    marker (id n_values). The target at position P is the queried key's
    value. T = P + 1, C = n_values.

copy
    T tokens drawn uniformly from the vocabulary; the target at position i
    is the input token at position perm(i), where perm is reverse
    (T - 1 - i) or shift ((i + shift) mod T). Every position carries a
    target, so the head must attend by position. C = vocab_size.

Reference losses, for plots:
    chance         ln C: a model that knows nothing
    no_retrieval   (retrieval only) the best loss of a model that knows the
                   multiset of values in the context but not which key was
                   asked for: E[-ln(c / P)], c = occurrences of the target
                   value among the P values; exact, from c - 1 ~ Binomial(P - 1, 1/n_values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attn.model.fast import Batch


class Task:
    """What the tasks share: a batch is a task's random draws (`draws`, in its
    generator's order), assembled (`assemble`, for any leading axes)."""

    def sample(self, rng: np.random.Generator, batch_size: int) -> Batch:
        """A batch of `batch_size` examples drawn from rng."""
        return self.assemble(*self.draws(rng, batch_size))

    def sample_stack(self, rngs: list[np.random.Generator], batch_size: int) -> Batch:
        """One batch per generator, stacked (M, B, ...): member m's numbers are
        those `sample` draws from rngs[m], assembled once for the stack."""
        return self.assemble(*(np.stack(parts) for parts in zip(*(self.draws(rng, batch_size) for rng in rngs))))


@dataclass(frozen=True)
class RetrievalTask(Task):
    n_keys: int
    n_values: int
    n_pairs: int

    name = "retrieval"

    @property
    def fields(self) -> tuple[tuple[str, int], ...]:
        return (("key", self.n_keys), ("value", self.n_values + 1))  # + the query marker

    @property
    def seq_len(self) -> int:
        return self.n_pairs + 1

    @property
    def n_classes(self) -> int:
        return self.n_values

    def draws(self, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, ...]:
        """One batch's random numbers, in the generator's order: a random
        ranking of the keys per example (B, n_keys), the values (B, P), which
        pair is asked for (B,)."""
        B, P = batch_size, self.n_pairs
        return rng.random((B, self.n_keys)), rng.integers(0, self.n_values, size=(B, P)), rng.integers(0, P, size=B)

    def assemble(self, ranking: np.ndarray, values: np.ndarray, queried: np.ndarray) -> Batch:
        """The batch of `draws`' numbers, for any leading axes (*M, B, ...)."""
        P = self.n_pairs
        keys = np.argsort(ranking, axis=-1)[..., :P]  # (*M, B, P) distinct per row
        asked = np.take_along_axis(np.stack([keys, values]), queried[None, ..., None], axis=-1)[..., 0]  # (2, *M, B)
        tokens = np.empty((*values.shape[:-1], P + 1, 2), dtype=np.int64)
        tokens[..., :P, 0] = keys
        tokens[..., :P, 1] = values
        tokens[..., P, 0] = asked[0]
        tokens[..., P, 1] = self.n_values  # query marker
        targets = np.zeros(tokens.shape[:-1], dtype=np.int64)
        targets[..., P] = asked[1]
        target_mask = np.zeros(tokens.shape[:-1], dtype=bool)
        target_mask[..., P] = True
        target_key = np.full(tokens.shape[:-1], -1, dtype=np.int64)
        target_key[..., P] = queried
        return Batch(tokens, targets, target_mask, target_key)

    def reference_losses(self) -> dict[str, float]:
        P, p = self.n_pairs, 1.0 / self.n_values
        no_retrieval = sum(
            math.comb(P - 1, j) * p**j * (1 - p) ** (P - 1 - j) * -math.log((j + 1) / P) for j in range(P)
        )
        return {"chance": math.log(self.n_values), "no_retrieval": no_retrieval}


@dataclass(frozen=True)
class CopyTask(Task):
    vocab_size: int
    length: int
    mode: str = "reverse"  # reverse | shift
    shift: int = 1

    name = "copy"

    @property
    def fields(self) -> tuple[tuple[str, int], ...]:
        return (("token", self.vocab_size),)

    @property
    def seq_len(self) -> int:
        return self.length

    @property
    def n_classes(self) -> int:
        return self.vocab_size

    def source_positions(self) -> np.ndarray:
        """perm: the target at position i is the input at perm[i]."""
        i = np.arange(self.length)
        return self.length - 1 - i if self.mode == "reverse" else (i + self.shift) % self.length

    def draws(self, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, ...]:
        """One batch's random numbers: the tokens (B, T, 1)."""
        return (rng.integers(0, self.vocab_size, size=(batch_size, self.length, 1)),)

    def assemble(self, tokens: np.ndarray) -> Batch:
        """The batch of `draws`' numbers, for any leading axes (*M, B, ...)."""
        perm = self.source_positions()
        targets = tokens[..., perm, 0]
        target_mask = np.ones(targets.shape, dtype=bool)
        target_key = np.broadcast_to(perm, targets.shape).copy()
        return Batch(tokens, targets, target_mask, target_key)

    def reference_losses(self) -> dict[str, float]:
        return {"chance": math.log(self.vocab_size)}
