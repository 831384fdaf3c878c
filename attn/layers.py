"""Forward/backward pairs for every piece of the one-head attention model.

Each layer is a pair in the CS231n style:

    out, cache = thing_forward(inputs...)
    grads      = thing_backward(dout, cache)

Forward caches exactly what backward needs; backward never recomputes the
forward. No state, no I/O, no configs: plain numpy arrays in, arrays out, and
the dtype of the inputs is the dtype of the outputs (float32 stays float32).

Shapes: B batch, T positions, D = d_model, d_k query/key width, d_v value
width, C number of output classes, F token fields per position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# --------------------------------------------------------------------------
# Score scales.  scores = s * Q K^T.  Adding a mode is one entry here.
# --------------------------------------------------------------------------
SCORE_SCALES = {
    "sqrt": lambda d_k: d_k ** -0.5,  # Vaswani et al.: keeps Var(score) ~ 1
    "none": lambda d_k: 1.0,  # the ablation: Var(score) ~ d_k
    "linear": lambda d_k: 1.0 / d_k,  # muP-style: Var(score) ~ 1/d_k at init
}


def score_scale(mode: str, d_k: int) -> float:
    """The factor s that multiplies Q K^T for a scaling `mode`."""
    return float(SCORE_SCALES[mode](d_k))


# --------------------------------------------------------------------------
# Embedding: out[b, t] = table[ids[b, t]]
# --------------------------------------------------------------------------
def embedding_forward(ids: np.ndarray, table: np.ndarray):
    """Look up rows of `table` (V, D) for integer `ids` (...,) -> (..., D)."""
    out = table[ids]  # (..., D)
    return out, (ids, table.shape)


def embedding_backward(dout, cache) -> np.ndarray:
    """Sum the upstream gradient into the rows that were looked up:

        dtable = onehot(ids)^T dout      (V, N) @ (N, D), N = number of ids

    One matrix product: O(N V D) FLOPs, yet for the vocabularies here (tens
    of ids) far faster than np.add.at's row-by-row scatter. Repeated ids add up.

    dout may be Factored (dout[b] = L_b^T R_b, ids (B, T)); then, by
    associativity, dtable = sum_b (L_b onehot_b)^T R_b: L binned by token id,
    (B, R, V), times R, and dout is never formed.
    """
    ids, (V, D) = cache
    if isinstance(dout, Factored):
        onehot = (ids[..., None] == np.arange(V)).astype(dout.right.dtype)  # (B, T, V)
        binned = dout.left @ onehot  # (B, R, V)
        return binned.reshape(-1, V).T @ dout.right.reshape(-1, D)  # (V, D)
    onehot = (np.arange(V)[:, None] == ids.reshape(1, -1)).astype(dout.dtype)  # (V, N)
    return onehot @ dout.reshape(-1, D)  # (V, D)


# --------------------------------------------------------------------------
# Linear: out = x W (+ b)
# --------------------------------------------------------------------------
def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None):
    """x (..., n_in) @ W (n_in, n_out) (+ b (n_out,)) -> (..., n_out); cache (x, W, has_bias).

    The leading axes are flattened first, so the product is one matrix
    multiply over all rows rather than one per leading index.
    """
    n_in, n_out = W.shape
    out = x.reshape(-1, n_in) @ W  # (N, n_out)
    if b is not None:
        out += b
    return out.reshape(*x.shape[:-1], n_out), (x, W, b is not None)


def linear_backward(dout: np.ndarray, cache):
    """Returns (dx, dW, db); db is None when the forward had no bias."""
    x, W, has_bias = cache
    n_in, n_out = W.shape
    dout2 = dout.reshape(-1, n_out)  # (N, n_out)
    dx = (dout2 @ W.T).reshape(x.shape)  # (..., n_in)
    dW = x.reshape(-1, n_in).T @ dout2  # (n_in, n_out)
    db = dout2.sum(axis=0) if has_bias else None
    return dx, dW, db


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

    logits (B, T, C), targets (B, T) ints, target_mask (B, T) bool.
    With z = logits - max(logits), -log softmax(z)[y] = log sum exp z - z[y]:
    only the target's entry is needed, not the whole log-softmax.
    Returns (loss as a 0-d array of the logits' dtype, cache); the cache
    holds softmax(logits), which backward needs and which gives the
    predicted class for accuracy at no extra cost, as its first entry.
    """
    z = np.moveaxis(logits, -1, 0).copy()  # (C, B, T): classes first in memory (see _keys_first)
    z -= z.max(axis=0)  # shifted logits
    onehot = np.arange(z.shape[0])[:, None, None] == targets  # (C, B, T) bool
    picked = (z * onehot).sum(axis=0)  # (B, T) z[target]
    np.exp(z, out=z)
    sum_exp = z.sum(axis=0)  # (B, T)
    z /= sum_exp
    probs = np.moveaxis(z, 0, -1)  # (B, T, C) softmax, a view of z
    weight = target_mask.astype(logits.dtype) / logits.dtype.type(target_mask.sum())  # (B, T)
    loss = ((np.log(sum_exp) - picked) * weight).sum(dtype=logits.dtype)
    return loss, (probs, np.moveaxis(onehot, 0, -1), weight)


def cross_entropy_backward(dloss, cache) -> np.ndarray:
    """dlogits = dloss * weight * (softmax(logits) - onehot(target))."""
    probs, onehot, weight = cache
    dlogits = probs - onehot  # (B, T, C)
    dlogits *= (weight * probs.dtype.type(dloss))[..., None]
    return dlogits


# --------------------------------------------------------------------------
# A gradient held as factors.
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Factored:
    """A (B, T, n) array kept as factors: value[b] = left[b]^T right[b].

    left (B, R, T), right (B, R, n): per example, a sum of R outer products.
    When few query positions carry the loss, the gradient reaching X is of
    low rank R (a few per query), and its consumers, the embeddings, need it
    only through onehot^T value (see embedding_backward and
    sum_over_examples): kept as factors, it is never formed.
    """

    left: np.ndarray  # (B, R, T)
    right: np.ndarray  # (B, R, n)

    def dense(self) -> np.ndarray:
        """The (B, T, n) array itself."""
        (B, _, T), n = self.left.shape, self.right.shape[-1]
        out = np.empty((B, T, n), dtype=self.right.dtype)
        _sum_of_outer_products(self.left, self.right, out=out)
        return out


def _position_indicator(B: int, T: int, positions, dtype) -> np.ndarray:
    """(B, P, T) rows e_p for each of `positions` along T (an index array or a slice)."""
    columns = np.arange(T)[positions]
    indicator = np.zeros((len(columns), T), dtype=dtype)
    indicator[np.arange(len(columns)), columns] = 1
    return np.broadcast_to(indicator, (B, *indicator.shape))


def add_at_positions(grad, positions, values: np.ndarray):
    """grad plus `values` (B, P, n) at the distinct `positions` along T (zero elsewhere).

    An array is added to in place; a Factored gradient gains P rows (the
    indicator e_p on the left, the values on the right).
    """
    if isinstance(grad, Factored):
        B, _, T = grad.left.shape
        indicator = _position_indicator(B, T, positions, values.dtype)  # (B, P, T)
        return Factored(np.concatenate([grad.left, indicator], axis=1), np.concatenate([grad.right, values], axis=1))
    grad[:, positions] += values
    return grad


def sum_over_examples(grad) -> np.ndarray:
    """sum_b grad[b]: (T, n). For Factored, sum_b left[b]^T right[b] = L^T R
    with the examples' rows stacked: one (T, B R) @ (B R, n) product."""
    if isinstance(grad, Factored):
        (B, R, T), n = grad.left.shape, grad.right.shape[-1]
        return grad.left.transpose(2, 0, 1).reshape(T, B * R) @ grad.right.reshape(B * R, n)
    return grad.sum(axis=0)


# --------------------------------------------------------------------------
# One attention head.
# --------------------------------------------------------------------------
def causal_mask(T: int) -> np.ndarray:
    """Boolean (T, T) mask, True where query i may NOT look at key j (j > i)."""
    return np.triu(np.ones((T, T), dtype=bool), k=1)


def _keys_first(B: int, T_k: int, T_q: int, dtype) -> np.ndarray:
    """An empty (B, T_k, T_q) array laid out (T_k, B, T_q) in memory, for S^T or dA^T.

    Its transpose (B, T_q, T_k) has the keys outermost in memory. The softmax
    reduces over keys, and numpy reduces an outer axis (across rows, vectorised)
    several times faster than an inner one (along rows of T, often ~10, entries).
    """
    return np.empty((T_k, B, T_q), dtype=dtype).transpose(1, 0, 2)


def _sum_of_outer_products(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a^T b for stacks a (B, P, m) and b (B, P, n): (B, m, n), the sum
    over the P positions of their outer products. With P = 1 it is a
    broadcast product: numpy's matmul is several times slower when the inner
    dimension is 1."""
    if a.shape[1] == 1:
        np.multiply(a.transpose(0, 2, 1), b, out=out)
    else:
        np.matmul(a.transpose(0, 2, 1), b, out=out)


def attention_forward(x, W_q, W_k, W_v, W_o, scale: float, mask: np.ndarray | None = None, queries=slice(None)):
    """One attention head, as in "Attention Is All You Need", for the queries
    at `queries` (distinct positions: an index array or a slice along T;
    default all T):

        K = X W_k          (B, T, d_k)   every position is a key
        V = X W_v          (B, T, d_v)   and a value
        Q = X_Q W_q        (B, P, d_k)   X_Q = X[:, queries]
        S = s * Q K^T      (B, P, T)     masked entries set to -inf
        A = softmax(S)     (B, P, T)     over keys (last axis)
        C = A V            (B, P, d_v)
        out = C W_o        (B, P, D)

    Each query row is computed alone, so rows no one reads (positions
    without a target) can be skipped. K and V are one product, and the
    scale s is folded into the query weights (s Q K^T = (X_Q s W_q) K^T,
    and s W_q is small where S is not):

        [K V] = X [W_k W_v]      (B T, d_k + d_v)
        S = Q_s K^T,  Q_s = X_Q (s W_q)

    Returns (out, attn, cache): the head's output, the attention weights A,
    and what backward needs (including the scores, for diagnostics).
    """
    B, T, _ = x.shape
    d_k = W_k.shape[1]
    kv, kv_projection = linear_forward(x, np.concatenate([W_k, W_v], axis=1))  # (B, T, d_k + d_v)
    k, v = kv[..., :d_k], kv[..., d_k:]  # views: (B, T, d_k), (B, T, d_v)
    q_scaled, q_projection = linear_forward(x[:, queries], W_q * x.dtype.type(scale))  # (B, P, d_k)
    P = q_scaled.shape[1]
    scores_t = _keys_first(B, T, P, x.dtype)  # (B, T_k, P)
    np.matmul(k, q_scaled.transpose(0, 2, 1), out=scores_t)  # S^T = K Q_s^T
    scores = scores_t.transpose(0, 2, 1)  # (B, P, T_k)
    if mask is not None:
        scores[..., mask[queries]] = -np.inf
    attn, _ = softmax_forward(scores)  # (B, P, T)
    context = attn @ v  # (B, P, d_v)
    out, output = linear_forward(context, W_o)  # (B, P, D)
    cache = dict(x=x, queries=queries, scale=scale, q_scaled=q_scaled, k=k, v=v, scores=scores, attn=attn,
                 kv_projection=kv_projection, q_projection=q_projection, output=output)
    return out, attn, cache


def attention_backward(dout, cache):
    """Gradients of the head: dict with keys x, W_q, W_k, W_v, W_o.

    dout (B, P, D) is the upstream gradient at the forward's query
    positions. What belongs to a query (dC, dA, dS, dQ) is computed at those
    P positions; the keys and values of all T positions get their gradient
    through them (see _key_value_backward). The gradient of x is an array
    (B, T, D), or Factored when few queries make that cheaper.
    """
    k, v, q_scaled, attn = cache["k"], cache["v"], cache["q_scaled"], cache["attn"]  # (B, T, d_k), (B, T, d_v), (B, P, d_k), (B, P, T)
    (B, T, _), P = k.shape, attn.shape[1]
    dcontext, dW_o, _ = linear_backward(dout, cache["output"])  # (B, P, d_v), (d_v, D)
    dattn_t = _keys_first(B, T, P, dout.dtype)  # (B, T_k, P)
    np.matmul(v, dcontext.transpose(0, 2, 1), out=dattn_t)  # dA^T = V dC^T
    dscores = softmax_backward(dattn_t.transpose(0, 2, 1), attn)  # (B, P, T), zero where masked
    dq_scaled = dscores @ k  # (B, P, d_k)
    dx, dW_k, dW_v = _key_value_backward(dscores, q_scaled, attn, dcontext, cache["kv_projection"])
    dx_q, dW_q, _ = linear_backward(dq_scaled, cache["q_projection"])  # (B, P, D), (D, d_k)
    dx = add_at_positions(dx, cache["queries"], dx_q)
    dW_q *= dW_q.dtype.type(cache["scale"])  # Q_s = X_Q (s W_q)
    return {"x": dx, "W_q": dW_q, "W_k": dW_k, "W_v": dW_v, "W_o": dW_o}


def factored_key_value_backward(T: int, P: int) -> bool:
    """Whether _key_value_backward keeps X's gradient as factors: when they
    have fewer rows, 4 per query (through K, V, the query's own row, the
    residual), than X has positions. Every product of that path is then
    smaller than the formed path's, and so is the embeddings' work on it.
    With a query at every position (copy), forming dX is the faster way:
    measured at d_k 256 and 1024, 3.6 and 11.0 ms a step against 4.5 and 14.1."""
    return 4 * P < T


def key_value_backward_flops(B: int, T: int, P: int, D: int, d_k: int, d_v: int) -> dict[str, int]:
    """Matrix-multiply FLOPs of each way _key_value_backward can go; for
    "factored" including the positional table's sum of the factors over
    the batch, L^T R, a (T, 4 P B) @ (4 P B, D) product."""
    d = d_k + d_v
    return {"outer": 2 * B * T * P * d + 4 * B * T * D * d,
            "factored": 4 * B * P * D * d + 4 * B * P * T * D + 8 * B * P * T * D}


def _key_value_backward(dscores, q_scaled, attn, dcontext, kv_projection):
    """dX, dW_k, dW_v from the keys' and values' share of the gradient:
    dK = dS^T Q_s and dV = A^T dC, sums of P outer products per example.

    "outer" (many queries): form [dK dV] (B, T, d_k + d_v), side by side so
    that the projection's backward is two products, not four:
        dX = [dK dV] [W_k W_v]^T,   [dW_k dW_v] = X^T [dK dV].
    "factored" (few queries, e.g. retrieval's one): never form dK, dV or dX;
    by associativity, with L = [dS; A] (B, 2P, T), R = [Q_s W_k^T; dC W_v^T]
    (B, 2P, D):
        dX = L^T R  (returned as Factored(L, R)),
        dW_k = (dS X)^T Q_s,   dW_v = (A X)^T dC,
    summed over examples. factored_key_value_backward says which.
    """
    x, W_kv, _ = kv_projection  # [K V] = X [W_k W_v]
    (B, P, T), (D, d_kv), d_k = attn.shape, W_kv.shape, q_scaled.shape[-1]
    if not factored_key_value_backward(T, P):
        dkv = np.empty((B, T, d_kv), dtype=x.dtype)  # (B, T, d_k + d_v)
        _sum_of_outer_products(dscores, q_scaled, out=dkv[..., :d_k])  # dK = dS^T Q_s
        _sum_of_outer_products(attn, dcontext, out=dkv[..., d_k:])  # dV = A^T dC
        dx, dW_kv, _ = linear_backward(dkv, kv_projection)  # (B, T, D), (D, d_k + d_v)
        return dx, dW_kv[:, :d_k], dW_kv[:, d_k:]
    left = np.concatenate([dscores, attn], axis=1)  # L = [dS; A]  (B, 2P, T)
    right = np.concatenate([linear_forward(q_scaled, W_kv[:, :d_k].T)[0],
                            linear_forward(dcontext, W_kv[:, d_k:].T)[0]], axis=1)  # R  (B, 2P, D)
    left_x = (left @ x).reshape(B, 2, P, D)  # [dS X; A X]
    dW_k = left_x[:, 0].reshape(-1, D).T @ q_scaled.reshape(-1, d_k)  # (D, d_k)
    dW_v = left_x[:, 1].reshape(-1, D).T @ dcontext.reshape(-1, d_kv - d_k)  # (D, d_v)
    return Factored(left, right), dW_k, dW_v
