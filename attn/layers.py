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
    """Scatter-add the upstream gradient into the rows that were looked up."""
    ids, table_shape = cache
    dtable = np.zeros(table_shape, dtype=dout.dtype)  # (V, D)
    np.add.at(dtable, ids.reshape(-1), dout.reshape(-1, table_shape[1]))
    return dtable


# --------------------------------------------------------------------------
# Linear: out = x W (+ b)
# --------------------------------------------------------------------------
def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None):
    """x (..., n_in) @ W (n_in, n_out) (+ b (n_out,)) -> (..., n_out)."""
    out = x @ W
    if b is not None:
        out += b
    return out, (x, W, b is not None)


def linear_backward(dout: np.ndarray, cache):
    """Returns (dx, dW, db); db is None when the forward had no bias."""
    x, W, has_bias = cache
    n_in, n_out = W.shape
    dx = dout @ W.T  # (..., n_in)
    dW = x.reshape(-1, n_in).T @ dout.reshape(-1, n_out)  # (n_in, n_out)
    db = dout.reshape(-1, n_out).sum(axis=0) if has_bias else None
    return dx, dW, db


# --------------------------------------------------------------------------
# Softmax over the last axis.  -inf entries (masks) get exactly zero weight.
# --------------------------------------------------------------------------
def softmax_forward(scores: np.ndarray):
    """P = exp(z - max z) / sum exp(z - max z), row-wise over the last axis.

    Subtracting the row max keeps exp() finite for any finite scores, so
    scores of +-1e4 give a valid distribution. -inf entries become exact 0.
    """
    shifted = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs, probs


def softmax_backward(dprobs: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Vector-Jacobian product of softmax: P * (dP - sum(dP * P, -1)).

    Masked entries have P = 0 and so receive exactly zero gradient.
    """
    return probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True))


# --------------------------------------------------------------------------
# Cross-entropy through log-softmax, averaged over positions with a target.
# --------------------------------------------------------------------------
def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray, target_mask: np.ndarray):
    """Mean of -log softmax(logits)[target] over positions where target_mask.

    logits (B, T, C), targets (B, T) ints, target_mask (B, T) bool.
    Returns (loss as a 0-d array of the logits' dtype, cache). Also caches
    the predicted class so accuracy costs nothing extra.
    """
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (B, T, C)
    log_norm = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # (B, T, 1)
    log_probs = shifted - log_norm  # (B, T, C)
    picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # (B, T)
    weight = target_mask.astype(logits.dtype) / logits.dtype.type(target_mask.sum())  # (B, T)
    loss = -(picked * weight).sum(dtype=logits.dtype)
    return loss, (log_probs, targets, weight)


def cross_entropy_backward(dloss, cache) -> np.ndarray:
    """dlogits = dloss * weight * (softmax(logits) - onehot(target))."""
    log_probs, targets, weight = cache
    dlogits = np.exp(log_probs)  # (B, T, C)
    np.put_along_axis(
        dlogits, targets[..., None],
        np.take_along_axis(dlogits, targets[..., None], axis=-1) - 1, axis=-1,
    )
    dlogits *= (weight * log_probs.dtype.type(dloss))[..., None]
    return dlogits


# --------------------------------------------------------------------------
# One attention head.
# --------------------------------------------------------------------------
def causal_mask(T: int) -> np.ndarray:
    """Boolean (T, T) mask, True where query i may NOT look at key j (j > i)."""
    return np.triu(np.ones((T, T), dtype=bool), k=1)


def attention_forward(x, W_q, W_k, W_v, W_o, scale: float, mask: np.ndarray | None = None):
    """One attention head, as in "Attention Is All You Need":

        Q = X W_q          (B, T, d_k)
        K = X W_k          (B, T, d_k)
        V = X W_v          (B, T, d_v)
        S = s * Q K^T      (B, T, T)     masked entries set to -inf
        A = softmax(S)     (B, T, T)     over keys (last axis)
        C = A V            (B, T, d_v)
        out = C W_o        (B, T, D)

    Returns (out, attn, cache): the head's output, the attention weights A,
    and what backward needs (including the scores, for diagnostics).
    """
    q = x @ W_q  # (B, T, d_k)
    k = x @ W_k  # (B, T, d_k)
    v = x @ W_v  # (B, T, d_v)
    scores = q @ k.transpose(0, 2, 1)  # (B, T, T)
    scores *= scores.dtype.type(scale)
    if mask is not None:
        scores[..., mask] = -np.inf
    attn, _ = softmax_forward(scores)  # (B, T, T)
    context = attn @ v  # (B, T, d_v)
    out = context @ W_o  # (B, T, D)
    cache = dict(x=x, W_q=W_q, W_k=W_k, W_v=W_v, W_o=W_o, scale=scale,
                 q=q, k=k, v=v, scores=scores, attn=attn, context=context)
    return out, attn, cache


def attention_backward(dout, cache):
    """Gradients of the head: dict with keys x, W_q, W_k, W_v, W_o."""
    x, q, k, v, attn, context = (cache[n] for n in ("x", "q", "k", "v", "attn", "context"))
    W_q, W_k, W_v, W_o, scale = (cache[n] for n in ("W_q", "W_k", "W_v", "W_o", "scale"))
    D = x.shape[-1]
    dW_o = context.reshape(-1, context.shape[-1]).T @ dout.reshape(-1, D)  # (d_v, D)
    dcontext = dout @ W_o.T  # (B, T, d_v)
    dattn = dcontext @ v.transpose(0, 2, 1)  # (B, T, T)
    dv = attn.transpose(0, 2, 1) @ dcontext  # (B, T, d_v)
    dscores = softmax_backward(dattn, attn)  # (B, T, T), zero where masked
    dscores *= dscores.dtype.type(scale)
    dq = dscores @ k  # (B, T, d_k)
    dk = dscores.transpose(0, 2, 1) @ q  # (B, T, d_k)
    x2 = x.reshape(-1, D)  # (B*T, D)
    dW_q = x2.T @ dq.reshape(-1, dq.shape[-1])  # (D, d_k)
    dW_k = x2.T @ dk.reshape(-1, dk.shape[-1])  # (D, d_k)
    dW_v = x2.T @ dv.reshape(-1, dv.shape[-1])  # (D, d_v)
    dx = dq @ W_q.T + dk @ W_k.T + dv @ W_v.T  # (B, T, D)
    return {"x": dx, "W_q": dW_q, "W_k": dW_k, "W_v": dW_v, "W_o": dW_o}
