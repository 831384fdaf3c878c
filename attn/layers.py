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


def embedding_backward(dout: np.ndarray, cache) -> np.ndarray:
    """Sum the upstream gradient into the rows that were looked up:

        dtable = onehot(ids)^T dout      (V, N) @ (N, D), N = number of ids

    One matrix product: O(N V D) FLOPs, yet for the vocabularies here (tens
    of ids) far faster than np.add.at's row-by-row scatter. Repeated ids add up.
    """
    ids, (V, D) = cache
    onehot = (np.arange(V)[:, None] == ids.reshape(1, -1)).astype(dout.dtype)  # (V, N)
    return onehot @ dout.reshape(-1, D)  # (V, D)


# --------------------------------------------------------------------------
# Linear: out = x W (+ b)
# --------------------------------------------------------------------------
def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None):
    """x (..., n_in) @ W (n_in, n_out) (+ b (n_out,)) -> (..., n_out).

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
    predicted class for accuracy at no extra cost.
    """
    z = np.moveaxis(logits, -1, 0).copy()  # (C, B, T): classes first in memory (see _keys_first)
    z -= z.max(axis=0)  # shifted logits
    picked = np.take_along_axis(z, targets[None], axis=0)[0]  # (B, T) z[target]
    np.exp(z, out=z)
    sum_exp = z.sum(axis=0)  # (B, T)
    z /= sum_exp
    probs = np.moveaxis(z, 0, -1)  # (B, T, C) softmax, a view of z
    weight = target_mask.astype(logits.dtype) / logits.dtype.type(target_mask.sum())  # (B, T)
    loss = ((np.log(sum_exp) - picked) * weight).sum(dtype=logits.dtype)
    return loss, (probs, targets, weight)


def cross_entropy_backward(dloss, cache) -> np.ndarray:
    """dlogits = dloss * weight * (softmax(logits) - onehot(target))."""
    probs, targets, weight = cache
    scaled_weight = weight * probs.dtype.type(dloss)  # (B, T)
    dlogits = probs * scaled_weight[..., None]  # (B, T, C)
    target_entries = np.take_along_axis(dlogits, targets[..., None], axis=-1)  # (B, T, 1)
    np.put_along_axis(dlogits, targets[..., None], target_entries - scaled_weight[..., None], axis=-1)
    return dlogits


# --------------------------------------------------------------------------
# One attention head.
# --------------------------------------------------------------------------
def causal_mask(T: int) -> np.ndarray:
    """Boolean (T, T) mask, True where query i may NOT look at key j (j > i)."""
    return np.triu(np.ones((T, T), dtype=bool), k=1)


def _keys_first(B: int, T: int, dtype) -> np.ndarray:
    """An empty (B, T_k, T_q) array laid out (T_k, B, T_q) in memory, for S^T or dA^T.

    Its transpose (B, T_q, T_k) has the keys outermost in memory. The softmax
    reduces over keys, and numpy reduces an outer axis (across rows, vectorised)
    several times faster than an inner one (along rows of T, often ~10, entries).
    """
    return np.empty((T, B, T), dtype=dtype).transpose(1, 0, 2)


def attention_forward(x, W_q, W_k, W_v, W_o, scale: float, mask: np.ndarray | None = None):
    """One attention head, as in "Attention Is All You Need":

        Q = X W_q          (B, T, d_k)
        K = X W_k          (B, T, d_k)
        V = X W_v          (B, T, d_v)
        S = s * Q K^T      (B, T, T)     masked entries set to -inf
        A = softmax(S)     (B, T, T)     over keys (last axis)
        C = A V            (B, T, d_v)
        out = C W_o        (B, T, D)

    Computed as one product for the three projections, with the scale s
    folded into the query weights (s Q K^T = (X s W_q) K^T, and s W_q is
    small where S is not):

        [Q_s K V] = X [s W_q  W_k  W_v]      (B T, 2 d_k + d_v)
        S = Q_s K^T

    Returns (out, attn, cache): the head's output, the attention weights A,
    and what backward needs (including the scores, for diagnostics).
    """
    B, T, _ = x.shape
    d_k = W_q.shape[1]
    W_qkv = np.concatenate([W_q * x.dtype.type(scale), W_k, W_v], axis=1)  # (D, 2 d_k + d_v)
    qkv, projection = linear_forward(x, W_qkv)  # (B, T, 2 d_k + d_v)
    q_scaled, k, v = np.split(qkv, [d_k, 2 * d_k], axis=-1)  # views: (B, T, d_k), (B, T, d_k), (B, T, d_v)
    scores_t = _keys_first(B, T, x.dtype)  # (B, T_k, T_q)
    np.matmul(k, q_scaled.transpose(0, 2, 1), out=scores_t)  # S^T = K Q_s^T
    scores = scores_t.transpose(0, 2, 1)  # (B, T_q, T_k)
    if mask is not None:
        scores[..., mask] = -np.inf
    attn, _ = softmax_forward(scores)  # (B, T, T)
    context = attn @ v  # (B, T, d_v)
    out, output = linear_forward(context, W_o)  # (B, T, D)
    cache = dict(x=x, scale=scale, q_scaled=q_scaled, k=k, v=v, scores=scores, attn=attn,
                 projection=projection, output=output)
    return out, attn, cache


def attention_backward(dout, cache):
    """Gradients of the head: dict with keys x, W_q, W_k, W_v, W_o.

    With dQ_s = dS K, dK = dS^T Q_s, dV = A^T dC written side by side as
    dQKV (B, T, 2 d_k + d_v), the projection's backward is two products,
    dX = dQKV [s W_q  W_k  W_v]^T and [s dW_q  dW_k  dW_v] = X^T dQKV,
    instead of six.
    """
    q_scaled, k, v, attn = (cache[n] for n in ("q_scaled", "k", "v", "attn"))
    B, T, d_k = k.shape
    dcontext, dW_o, _ = linear_backward(dout, cache["output"])  # (B, T, d_v), (d_v, D)
    dqkv = np.empty((B, T, 2 * d_k + v.shape[-1]), dtype=dout.dtype)  # (B, T, 2 d_k + d_v)
    dq_scaled, dk, dv = np.split(dqkv, [d_k, 2 * d_k], axis=-1)  # views, written in place below
    np.matmul(attn.transpose(0, 2, 1), dcontext, out=dv)  # (B, T, d_v)
    dattn_t = _keys_first(B, T, dout.dtype)  # (B, T_k, T_q)
    np.matmul(v, dcontext.transpose(0, 2, 1), out=dattn_t)  # dA^T = V dC^T
    dscores = softmax_backward(dattn_t.transpose(0, 2, 1), attn)  # (B, T_q, T_k), zero where masked
    np.matmul(dscores, k, out=dq_scaled)  # (B, T, d_k)
    np.matmul(dscores.transpose(0, 2, 1), q_scaled, out=dk)  # (B, T, d_k)
    dx, dW_qkv, _ = linear_backward(dqkv, cache["projection"])  # (B, T, D), (D, 2 d_k + d_v)
    dW_q, dW_k, dW_v = np.split(dW_qkv, [d_k, 2 * d_k], axis=1)  # (D, d_k), (D, d_k), (D, d_v)
    dW_q *= dW_q.dtype.type(cache["scale"])  # Q_s = X (s W_q)
    return {"x": dx, "W_q": dW_q, "W_k": dW_k, "W_v": dW_v, "W_o": dW_o}
