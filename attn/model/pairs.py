"""The building blocks: forward/backward pairs for every piece of the model but the head.

Each layer is a pair in the CS231n style:

    out, cache = thing_forward(inputs...)
    grads      = thing_backward(dout, cache)

Forward caches exactly what backward needs; backward never recomputes the
forward. No state, no I/O, no configs: plain numpy arrays in, arrays out, and
the dtype of the inputs is the dtype of the outputs (float32 stays float32).

Members. Every pair also computes M models at once (attn.train.stack's stacked
runs): each weight then carries a leading member axis, W (M, n_in, n_out),
every activation the same axis in front, x (M, B, T, D). Shape comments
write it as `*M`: absent for one model, (M,) for a stack. attn.model.head
builds the attention head from these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from math import prod

import numpy as np


# --------------------------------------------------------------------------
# A gradient held as factors: when few query positions carry the loss (retrieval: one of T),
# the gradient reaching X is a sum of a few outer products per example; kept as its factors it is
# never formed, and the embeddings take it as such (embedding_backward).
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Factored:
    """A (*M, B, T, n) array kept as factors: value[b] = left[b]^T right[b].

    left (*M, B, R, T), right (*M, B, R, n): per example, a sum of R outer
    products. When few query positions carry the loss, the gradient reaching
    X is of low rank R (a few per query), and its consumers, the embeddings,
    need it only through onehot^T value (see embedding_backward): kept as
    factors, it is never formed.
    """

    left: np.ndarray  # (*M, B, R, T)
    right: np.ndarray  # (*M, B, R, n)

    def dense(self) -> np.ndarray:
        """The (*M, B, T, n) array itself."""
        out = np.empty((*self.left.shape[:-2], self.left.shape[-1], self.right.shape[-1]), dtype=self.right.dtype)
        sum_of_outer_products(self.left, self.right, out=out)
        return out


def stacked_rows(pieces: list[np.ndarray]) -> np.ndarray:
    """The pieces (..., R_i, n) stacked along R: (..., R, n)."""
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=-2)


def keep_factored(T: int, P: int) -> bool:
    """Whether the head hands X's gradient back as Factored: when its factors
    have fewer rows, 3 per query (through the keys, the values, and the
    query's own row with the residual's gradient), than X has positions.
    Every product of that path is then smaller than the formed path's, and
    so is the embeddings' work on it. With a query at every position (copy),
    forming dX costs less."""
    return 3 * P < T


def _position_indicator(shape: tuple, T: int, positions, dtype) -> np.ndarray:
    """(*shape, P, T) rows e_p for each of `positions` along T (an index array or a slice); read-only."""
    columns = range(T)[positions] if isinstance(positions, slice) else positions.tolist()
    return _indicator(shape, T, tuple(columns), np.dtype(dtype))


@lru_cache(maxsize=32)
def _indicator(shape: tuple, T: int, columns: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    indicator = np.zeros((len(columns), T), dtype=dtype)
    indicator[np.arange(len(columns)), columns] = 1
    return np.broadcast_to(indicator, (*shape, *indicator.shape))


def add_at_positions(grad, positions, values: np.ndarray):
    """grad plus `values` (*M, B, P, n) at the distinct `positions` along T (zero elsewhere).

    An array is added to in place; a Factored gradient gains P rows (the
    indicator e_p on the left, the values on the right).
    """
    if isinstance(grad, Factored):
        return factored_with_rows([grad.left], [grad.right], positions, values)
    grad[..., positions, :] += values
    return grad


def factored_with_rows(lefts: list[np.ndarray], rights: list[np.ndarray], positions, values: np.ndarray) -> Factored:
    """Factored([*lefts; E], [*rights; values]), E the indicator rows e_p of
    the `positions`: the factors' pieces (lefts (*M, B, R_i, T), rights
    (*M, B, R_i, n)), and `values` (*M, B, P, n) added at those positions."""
    indicator = _position_indicator(values.shape[:-2], lefts[0].shape[-1], positions, values.dtype)  # (*M, B, P, T)
    return Factored(stacked_rows([*lefts, indicator]), stacked_rows([*rights, values]))


def sum_of_outer_products(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a^T b for stacks a (..., P, m) and b (..., P, n): (..., m, n), the
    sum over the P positions of their outer products. With P = 1 it is a
    broadcast product: numpy's matmul is slower when the inner dimension is 1."""
    if a.shape[-2] == 1:
        np.multiply(a.swapaxes(-1, -2), b, out=out)
    else:
        np.matmul(a.swapaxes(-1, -2), b, out=out)


def move_axis(a: np.ndarray, source: int, destination: int) -> np.ndarray:
    """np.moveaxis(a, source, destination) as one transpose (a view): the same
    array, without np.moveaxis's checks, which cost more than the move."""
    return a.transpose(_moved_order(a.ndim, source, destination))


@lru_cache(maxsize=64)
def _moved_order(ndim: int, source: int, destination: int) -> tuple[int, ...]:
    order = list(range(ndim))
    order.insert(destination % ndim, order.pop(source % ndim))
    return tuple(order)


def member_axes(weight: np.ndarray) -> int:
    """How many leading member axes a weight matrix (or table) carries: 0 or 1."""
    return weight.ndim - 2


def per_member_matrix(value, like: np.ndarray) -> np.ndarray:
    """A scalar, or one value per member (*M,), shaped to broadcast over `like`'s matrices."""
    return np.asarray(value, dtype=like.dtype)[..., None, None]


# --------------------------------------------------------------------------
# Embeddings: out = sum_s table_s[ids_s]
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class LazyEmbeddings:
    """X (*M, B, T, D), X[..., t, :] = sum_s table[ids[s, ..., t]], kept as
    its stacked table (*M, V, D) and ids (S, *M, B, T): formed on demand
    (`dense`), its rows at a few positions looked up alone (`rows`), and its
    products with a few query rows y (*M, B, P, D) and weights a (*M, B, P, T)
    taken through the table, which every example shares:

        y X^T = (y table^T)[ids]   one matrix product (B P rows against V), then S T entries per row
        a X   = bin(a) table       bin(a)[.., p, v] = sum of a[.., p, t] over the (s, t) with ids[s, .., t] = v

    Formed, X is S B T D entries gathered and each product a matrix-vector
    product per example over T D of them; through the table the products are
    matrix-matrix, over the V rows alone (lookup_is_cheaper says when that
    pays). Sums over the sources run in their order, as forming X sums them.
    """

    table: np.ndarray  # (*M, V, D): the sources' tables stacked
    ids: np.ndarray  # (S, *M, B, T): the row of the stacked table each source adds at each position
    positions_from: int | None = None  # the last source is the position itself, from this row (embedding_forward)
    _flat_indices_of: dict = field(
        default_factory=dict, compare=False, repr=False
    )  # (P, keys_first) -> _flat_indices_for

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.ids.shape[1:], self.table.shape[-1])

    def dense(self) -> np.ndarray:
        """X itself (*M, B, T, D)."""
        return self.rows(slice(None))

    def rows(self, positions) -> np.ndarray:
        """X[..., positions, :] (*M, B, P, D), only those rows looked up."""
        rows, ids = self._flat
        looked_up = rows.take(ids[..., positions], axis=0)  # (S, *M, B, P, D)
        # the sources summed in their order, in place into a fresh array (a sum over their axis costs more)
        out = looked_up[0]
        for s in range(1, len(looked_up)):
            out += looked_up[s]
        return out

    def key_major_product(self, y: np.ndarray) -> np.ndarray:
        """y X^T (*M, B, P, T) for y (*M, B, P, D), laid out keys outermost
        (T, *M, B, P) in memory, as attn.model.head._key_major_product's."""
        products = y.reshape(*y.shape[:-3], -1, y.shape[-1]) @ self._table_transposed  # (*M, B P, V)
        looked_up = products.take(self._flat_indices_for(y.shape[-2], keys_first=True))  # (S, T, *M, B, P)
        return move_axis(looked_up.sum(axis=0), 0, -1)  # (*M, B, P, T), a view

    def weighted_sum(self, weights: np.ndarray) -> np.ndarray:
        """weights X (*M, B, P, D) for weights (*M, B, P, T): bin(weights) table (binned)."""
        products = as_rows(self.binned(weights), self.table.ndim - 2) @ self.table  # (*M, B P, D)
        return products.reshape(*weights.shape[:-1], self.table.shape[-1])

    def binned(self, weights: np.ndarray) -> np.ndarray:
        """bin(weights) (*M, B, R, V) for weights (*M, B, R, T) (_binned)."""
        indices = self._binning_indices_for(weights.shape[-2])
        return _binned(weights, indices, self.table.shape[-2], self.positions_from)

    @cached_property
    def _table_transposed(self) -> np.ndarray:
        """table^T (*M, D, V), a view: the scores' two products with the table share it."""
        return self.table.swapaxes(-1, -2)

    @cached_property
    def _flat(self) -> tuple[np.ndarray, np.ndarray]:
        """(the table as rows (M V, D), the ids as rows of it (S, *M, B, T))."""
        return _flat_lookup(self.ids, self.table)

    def _flat_indices_for(self, P: int, keys_first: bool) -> np.ndarray:
        """_flat_indices for P query rows per example, formed once per P and layout
        (a step's products share them): as the weights are laid out, for the
        bins; keys first (S, T, *M, B, P), as the scores are, for the lookups."""
        if (P, False) not in self._flat_indices_of:
            self._flat_indices_of[P, False] = _flat_indices(self.ids, P, self.table.shape[-2])  # (S, *M, B, P, T)
        if keys_first and (P, True) not in self._flat_indices_of:
            self._flat_indices_of[P, True] = move_axis(self._flat_indices_of[P, False], -1, 1)  # (S, T, *M, B, P)
        return self._flat_indices_of[P, keys_first]

    def _binning_indices_for(self, P: int) -> np.ndarray:
        """_binning_indices for P rows, formed once per P (the forward's A X and the backward's dS X share them)."""
        if (P, "binned") not in self._flat_indices_of:
            self._flat_indices_of[P, "binned"] = _binning_indices(
                self._flat_indices_for(P, keys_first=False), self.positions_from
            )
        return self._flat_indices_of[P, "binned"]


def _flat_indices(ids: np.ndarray, R: int, V: int) -> np.ndarray:
    """(S, *M, B, R, T): the index in a flat (*M, B R, V) array of each
    (source, example, row, position), for ids (S, *M, B, T)."""
    return ids[..., None, :] + _row_starts(ids.shape[1:-1], R, V)


def _binning_indices(flat_indices: np.ndarray, positions_from: int | None) -> np.ndarray:
    """The flat indices (_flat_indices) _binned counts into, raveled: every source's but a positional last one's."""
    return (flat_indices if positions_from is None else flat_indices[:-1]).ravel()  # (S' *M B R T,)


def _binned(weights: np.ndarray, binning_indices: np.ndarray, V: int, positions_from: int | None = None) -> np.ndarray:
    """weights (*M, B, R, T) summed into the V rows of a table, (*M, B, R, V):
    out[.., r, v] = sum of weights[.., r, t] over the (s, t) whose id is v, at
    `binning_indices` (_binning_indices). One np.bincount over every (source, example, row,
    position), accumulated in float64, then the weights' dtype: a batch of
    tiny products would cost more. A positional last source (`positions_from`:
    its first row) is not binned: position t adds weights[.., r, t] to row
    positions_from + t alone, so its T columns are the weights themselves,
    as the bincount would have made them."""
    sources = binning_indices.size // weights.size
    spread = weights if sources == 1 else weights[None].repeat(sources, axis=0)  # (S', *M, B, R, T)
    binned = np.bincount(binning_indices, spread.ravel(), prod(weights.shape[:-1]) * V)  # (*M B R V,)
    binned = binned.astype(weights.dtype).reshape(*weights.shape[:-1], V)
    if positions_from is not None:
        binned[..., positions_from : positions_from + weights.shape[-1]] = weights
    return binned


# What one entry gathered, looked up, binned or streamed through a matrix-vector
# product costs, in multiply-adds of a matrix-matrix product: a few. Where the
# two forms cross at d_model 64 (T 9 and 33; one model, and stacks of 12)
# puts it between 3 and 8; `attn bench` times both forms at its sizes.
MOVE_COST = 4


@lru_cache(maxsize=64)
def lookup_is_cheaper(S: int, T: int, V: int, P: int, D: int) -> bool:
    """Whether LazyEmbeddings's products with P query rows per example (y X^T and
    a X, two of each in a step) cost less through the table than with X
    formed. Only with few queries (P < T / 3, as keep_factored): then the
    products with X formed are thin, a matrix-vector product per example, and
    per example

        formed      S T D entries gathered, 4 P T D streamed through those products
        looked up   4 P V D multiply-adds of matrix-matrix products, 4 S P T entries looked up or binned

    an entry moved weighing MOVE_COST multiply-adds. With more queries the
    products with X are matrix-matrix already, and X is formed."""
    formed = MOVE_COST * (S + 4 * P) * T * D
    return keep_factored(T, P) and 4 * P * V * D + MOVE_COST * 4 * S * P * T <= formed


def embedding_forward(ids: np.ndarray, tables: list[np.ndarray], positional: bool = False):
    """Look up and sum rows of several tables: out = sum_s tables[s][ids[s]],
    for integer `ids` (S, *M, ...), row s indexing table s (*M, V_s, D):
    X as LazyEmbeddings (*M, ..., D), formed by its consumers as they need it.

    The tables are looked up as one, stacked (*M, V, D) with V = sum V_s, so
    that the lookup is one take and the backward one product for them all. A
    table may be shared by the members ((V_s, D) in a stack: fixed positions).
    `positional`: the last source's ids are each position's own index
    (0..T-1, ids (S, *M, B, T)), which the binnings need not count (_binned)."""
    sizes = tuple(table.shape[-2] for table in tables)
    lead = tables[0].shape[:-2]  # (*M,): a field's table has the members'
    tables = [
        table if table.ndim == len(lead) + 2 else np.broadcast_to(table, (*lead, *table.shape)) for table in tables
    ]
    table = tables[0] if len(tables) == 1 else np.concatenate(tables, axis=-2)  # (*M, V, D)
    stacked = ids + _table_offsets(sizes, ids.ndim)  # (S, *M, ...): rows of the stacked table
    positions_from = sum(sizes[:-1]) if positional else None
    x = LazyEmbeddings(table, stacked, positions_from)
    return x, (x, sizes)


@lru_cache(maxsize=32)
def _table_offsets(sizes: tuple[int, ...], ndim: int) -> np.ndarray:
    """(S, 1, ...) the first row of each table in the stacked one (read-only)."""
    offsets = np.cumsum((0, *sizes[:-1])).reshape(-1, *[1] * (ndim - 1))
    offsets.flags.writeable = False
    return offsets


def _flat_lookup(ids: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(table as rows (M V, D), ids (S, M, ...) into those rows): member m's row v is row m V + v."""
    if not member_axes(table):
        return table, ids
    M, V, D = table.shape
    return table.reshape(M * V, D), ids + (np.arange(M) * V).reshape(M, *[1] * (ids.ndim - 2))


def embedding_backward(dout, cache) -> list[np.ndarray]:
    """Sum the upstream gradient into the rows that were looked up, for every
    table at once (views of one (*M, V, D) array, in the tables' order):

        dtable = onehot(ids)^T dout      (V, N) @ (N, D), N = number of positions

    onehot with one 1 per table in each column: one matrix product, O(N V D)
    FLOPs, yet for the vocabularies here (tens of ids) far faster than
    np.add.at's row-by-row scatter. Repeated ids add up.

    dout may be Factored (dout[b] = L_b^T R_b, ids (S, B, T)); then, by
    associativity, dtable = sum_b (L_b onehot_b)^T R_b: L binned by row of
    the stacked table (LazyEmbeddings.binned), (B, R, V), times R, and dout
    is never formed.
    """
    x, sizes = cache  # x: the LazyEmbeddings X, its ids (S, *M, ..., T) into its stacked table (*M, V, D)
    ids, V, lead = x.ids, x.table.shape[-2], x.table.shape[:-2]
    if isinstance(dout, Factored):
        binned = x.binned(dout.left)  # (*M, B, R, V)
        dtable = as_rows(binned, len(lead)).swapaxes(-1, -2) @ as_rows(dout.right, len(lead))  # (*M, V, D)
    else:
        columns = ids.reshape(len(sizes), *lead, 1, -1)  # (S, *M, 1, N)
        onehot = (np.arange(V)[:, None] == columns).any(axis=0).astype(dout.dtype)  # (*M, V, N)
        dtable = onehot @ as_rows(dout, len(lead))  # (*M, V, D)
    return [dtable[..., start:stop, :] for start, stop in _table_bounds(sizes)]


@lru_cache(maxsize=32)
def _row_starts(batch: tuple[int, ...], R: int, V: int) -> np.ndarray:
    """(*batch, R, 1): the flat index where each (example, row)'s V bins start, V apart (read-only)."""
    bins = np.arange(int(np.prod(batch)) * R).reshape(*batch, R, 1) * V
    bins.flags.writeable = False
    return bins


@lru_cache(maxsize=32)
def _table_bounds(sizes: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Each table's rows (start, stop) in the stacked table."""
    stops = np.cumsum(sizes).tolist()
    return tuple(zip([0, *stops[:-1]], stops))


def as_rows(x: np.ndarray, members: int) -> np.ndarray:
    """x (*M, ..., n) as a stack of matrices (*M, N, n): every row of one member together."""
    return x.reshape(*x.shape[:members], -1, x.shape[-1])


# --------------------------------------------------------------------------
# Linear: out = x W (+ b)
# --------------------------------------------------------------------------
def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None):
    """x (*M, ..., n_in) @ W (*M, n_in, n_out) (+ b (*M, n_out)) -> (*M, ..., n_out);
    cache (x, W, has_bias).

    The leading axes are flattened first, so the product is one matrix
    multiply over all rows (per member) rather than one per leading index.
    """
    n_out = W.shape[-1]
    out = as_rows(x, member_axes(W)) @ W  # (*M, N, n_out)
    if b is not None:
        out += b[..., None, :]
    return out.reshape(*x.shape[:-1], n_out), (x, W, b is not None)


def linear_backward(dout: np.ndarray, cache):
    """Returns (dx, dW, db); db is None when the forward had no bias."""
    x, W, has_bias = cache
    members = member_axes(W)
    dout2 = as_rows(dout, members)  # (*M, N, n_out)
    dx = (dout2 @ W.swapaxes(-1, -2)).reshape(x.shape)  # (*M, ..., n_in)
    dW = as_rows(x, members).swapaxes(-1, -2) @ dout2  # (*M, n_in, n_out)
    db = dout2.sum(axis=-2) if has_bias else None
    return dx, dW, db


# --------------------------------------------------------------------------
# A linear map through a product of two matrices: out = x U V
# --------------------------------------------------------------------------
def merge_is_cheaper(rows: int, n_in: int, rank: int, n_out: int) -> bool:
    """Whether x (U V) costs fewer multiply-adds than (x U) V, forward and
    backward together, for `rows` rows of x:

        chained  (x U) V:  3 rows rank (n_in + n_out)
        merged   x (U V):  3 n_in rank n_out + 3 rows n_in n_out

    (forward one of each product, backward two: the input's and the weight's
    gradient). Merging wins when the rank is large and the rows are many."""
    return n_in * rank * n_out + rows * n_in * n_out < rows * rank * (n_in + n_out)


def factorised_linear_forward(x: np.ndarray, U: np.ndarray, V: np.ndarray, scale=None, merged: bool | None = None):
    """out = s x U V for x (*M, ..., n_in), U (*M, n_in, r), V (*M, r, n_out),
    s a scalar or one per member (*M, 1, 1), or None for none (s = 1, no multiply):

        chained:  h = s (x U),  out = h V
        merged:   W = s (U V),  out = x W        (W: n_in x n_out, formed once)

    The same map either way; `merged` None picks the cheaper (merge_is_cheaper).
    s multiplies the smaller product (h or W), never U itself.
    """
    members = member_axes(U)
    n_in, rank, n_out = *U.shape[-2:], V.shape[-1]
    rows = as_rows(x, members)  # (*M, N, n_in)
    if merged is None:
        merged = merge_is_cheaper(rows.shape[-2], n_in, rank, n_out)
    if merged:
        W = U @ V  # (*M, n_in, n_out)
        if scale is not None:
            W *= scale
        out = rows @ W
        cache = (rows, U, V, scale, W, None)
    else:
        hidden = rows @ U  # (*M, N, r)
        if scale is not None:
            hidden *= scale
        out = hidden @ V
        cache = (rows, U, V, scale, None, hidden)
    return out.reshape(*x.shape[:-1], n_out), (x.shape, cache)


def factorised_linear_backward(dout: np.ndarray, cache):
    """(dx, dU, dV) of out = s x U V:

    chained:  dV = h^T dout,  dh = s dout V^T,  dx = dh U^T,  dU = x^T dh
    merged:   dW = x^T dout,  dx = dout W^T,  dU = s dW V^T,  dV = s U^T dW
    """
    x_shape, (rows, U, V, scale, W, hidden) = cache
    dout2 = as_rows(dout, member_axes(U))  # (*M, N, n_out)
    if W is not None:
        dW = rows.swapaxes(-1, -2) @ dout2  # (*M, n_in, n_out)
        dx = dout2 @ W.swapaxes(-1, -2)
        if scale is not None:
            dW *= scale
        dU, dV = dW @ V.swapaxes(-1, -2), _product_laid_out_as(V, U.swapaxes(-1, -2), dW)
    else:
        dV = _product_laid_out_as(V, hidden.swapaxes(-1, -2), dout2)
        dhidden = dout2 @ V.swapaxes(-1, -2)  # (*M, N, r)
        if scale is not None:
            dhidden *= scale
        dx = dhidden @ U.swapaxes(-1, -2)
        dU = rows.swapaxes(-1, -2) @ dhidden
    return dx.reshape(x_shape), dU, dV


def _product_laid_out_as(like: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b in the memory layout of `like`: computed as (b^T a^T)^T when
    `like` is a transposed view (W_k^T), so that the gradient is as
    contiguous as its weight and the optimiser walks it in order. numpy then
    takes a stack's product as it takes one run's: without it the stacked
    loop and its one-run twin differ in the last bits (tests/test_reference_loop)."""
    if like.ndim >= 2 and like.swapaxes(-1, -2).flags.c_contiguous and not like.flags.c_contiguous:
        return (b.swapaxes(-1, -2) @ a.swapaxes(-1, -2)).swapaxes(-1, -2)
    return a @ b


# --------------------------------------------------------------------------
# Softmax over the last axis.  -inf entries (masks) get exactly zero weight.
# --------------------------------------------------------------------------
def softmax_forward(scores: np.ndarray):
    """P = exp(z - max z) / sum exp(z - max z), row-wise over the last axis.

    Subtracting the row max keeps exp() finite for any finite scores, so
    scores of +-1e4 give a valid distribution. -inf entries become exact 0.
    """
    probs = scores - scores.max(axis=-1, keepdims=True)
    np.exp(probs, out=probs)
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs, probs


def softmax_backward(dprobs: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Vector-Jacobian product of softmax: P * (dP - sum(dP * P, -1)),
    computed as P dP - P sum(P dP, -1) with one temporary.

    Masked entries have P = 0 and so receive exactly zero gradient.
    """
    dscores = dprobs * probs
    dscores -= probs * dscores.sum(axis=-1, keepdims=True)
    return dscores


# --------------------------------------------------------------------------
# Cross-entropy through log-softmax, averaged over positions with a target.
# --------------------------------------------------------------------------
def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray, target_mask: np.ndarray):
    """Mean of -log softmax(logits)[target] over positions where target_mask.

    logits (*M, B, T, C), targets (*M, B, T) ints, target_mask (*M, B, T) bool.
    With z = logits - max(logits), -log softmax(z)[y] = log sum exp z - z[y]:
    only the target's entry is needed, not the whole log-softmax.
    Returns (loss of each member, (*M,), a 0-d array for one model, of the
    logits' dtype; cache); the cache holds softmax(logits), which backward
    needs and which gives the predicted class for accuracy at no extra cost,
    as its first entry.
    """
    z = move_axis(logits, -1, 0).copy()  # (C, *M, B, T): classes outermost (see attn.model.head._key_major_product)
    z -= z.max(axis=0)  # shifted logits
    onehot = _classes(z.shape[0], targets.ndim) == targets  # (C, *M, B, T) bool
    picked = (z * onehot).sum(axis=0)  # (*M, B, T) z[target]
    np.exp(z, out=z)
    sum_exp = z.sum(axis=0)  # (*M, B, T)
    z /= sum_exp
    probs = move_axis(z, 0, -1)  # (*M, B, T, C) softmax, a view of z
    counts = target_mask.sum(axis=(-2, -1), keepdims=True)  # (*M, 1, 1) ints
    weight = np.divide(target_mask, counts, dtype=logits.dtype)  # (*M, B, T): each in the logits' dtype, then divided
    loss = ((np.log(sum_exp) - picked) * weight).sum(axis=(-2, -1), dtype=logits.dtype)
    return loss, (probs, move_axis(onehot, 0, -1), weight)


@lru_cache(maxsize=32)
def _classes(C: int, ndim: int) -> np.ndarray:
    """(C, 1, ...) the class indices, to broadcast against targets of `ndim` axes (read-only)."""
    classes = np.arange(C).reshape(-1, *[1] * ndim)
    classes.flags.writeable = False
    return classes


def cross_entropy_backward(dloss: float, cache) -> np.ndarray:
    """dlogits = dloss * weight * (softmax(logits) - onehot(target)); dloss a
    scalar (a stack's members each have their own loss, each of gradient dloss)."""
    probs, onehot, weight = cache
    dlogits = probs - onehot  # (*M, B, T, C)
    dlogits *= weight[..., None] * probs.dtype.type(dloss)
    return dlogits
