"""A gradient held as factors, and what its consumers do with it.

When few query positions carry the loss (retrieval: one of T), the gradient
reaching X is a sum of a few outer products per example: kept as its
factors, it is never formed, and the embeddings take it as such
(attn.layers.embedding_backward, sum_over_examples).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Factored:
    """A (*M, B, T, n) array kept as factors: value[b] = left[b]^T right[b].

    left (*M, B, R, T), right (*M, B, R, n): per example, a sum of R outer
    products. When few query positions carry the loss, the gradient reaching
    X is of low rank R (a few per query), and its consumers, the embeddings,
    need it only through onehot^T value (see embedding_backward and
    sum_over_examples): kept as factors, it is never formed.
    """

    left: np.ndarray  # (*M, B, R, T)
    right: np.ndarray  # (*M, B, R, n)

    def dense(self) -> np.ndarray:
        """The (*M, B, T, n) array itself."""
        shape = (*self.left.shape[:-2], self.left.shape[-1], self.right.shape[-1])
        out = np.empty(shape, dtype=self.right.dtype)
        sum_of_outer_products(self.left, self.right, out=out)
        return out


def keep_factored(T: int, P: int) -> bool:
    """Whether the head hands X's gradient back as Factored: when its factors
    have fewer rows, 4 per query (through the keys, the values, the query's
    own row, the residual), than X has positions. Every product of that path
    is then smaller than the formed path's, and so is the embeddings' work
    on it. With a query at every position (copy), forming dX costs less."""
    return 4 * P < T


def _position_indicator(shape: tuple, T: int, positions, dtype) -> np.ndarray:
    """(*shape, P, T) rows e_p for each of `positions` along T (an index array or a slice)."""
    columns = np.arange(T)[positions]
    indicator = np.zeros((len(columns), T), dtype=dtype)
    indicator[np.arange(len(columns)), columns] = 1
    return np.broadcast_to(indicator, (*shape, *indicator.shape))


def add_at_positions(grad, positions, values: np.ndarray):
    """grad plus `values` (*M, B, P, n) at the distinct `positions` along T (zero elsewhere).

    An array is added to in place; a Factored gradient gains P rows (the
    indicator e_p on the left, the values on the right).
    """
    if isinstance(grad, Factored):
        indicator = _position_indicator(values.shape[:-2], grad.left.shape[-1], positions, values.dtype)  # (*M, B, P, T)
        return Factored(np.concatenate([grad.left, indicator], axis=-2), np.concatenate([grad.right, values], axis=-2))
    grad[..., positions, :] += values
    return grad


def sum_over_examples(grad) -> np.ndarray:
    """sum_b grad[b]: (*M, T, n). For Factored, sum_b left[b]^T right[b] = L^T R
    with the examples' rows stacked: one (T, B R) @ (B R, n) product per member."""
    if isinstance(grad, Factored):
        *lead, B, R, T = grad.left.shape
        left = np.moveaxis(grad.left, -1, -3).reshape(*lead, T, B * R)  # (*M, T, B R)
        return left @ grad.right.reshape(*lead, B * R, grad.right.shape[-1])
    return grad.sum(axis=-3)


def sum_of_outer_products(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a^T b for stacks a (..., P, m) and b (..., P, n): (..., m, n), the
    sum over the P positions of their outer products. With P = 1 it is a
    broadcast product: numpy's matmul is several times slower when the inner
    dimension is 1."""
    if a.shape[-2] == 1:
        np.multiply(a.swapaxes(-1, -2), b, out=out)
    else:
        np.matmul(a.swapaxes(-1, -2), b, out=out)
