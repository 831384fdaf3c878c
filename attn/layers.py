"""Forward/backward pairs for every piece of the one-head attention model.

Each layer is a pair in the CS231n style:

    out, cache = thing_forward(inputs...)
    grads      = thing_backward(dout, cache)

Forward caches exactly what backward needs; backward never recomputes the
forward. No state, no I/O, no configs: plain numpy arrays in, arrays out, and
the dtype of the inputs is the dtype of the outputs (float32 stays float32).

Shapes: B batch, T positions, D = d_model, d_k query/key width, d_v value
width, C number of output classes, F token fields per position.

Members. Every pair also computes M models at once (attn.train's stacked
runs: seeds, rates and scales of one shape trained as one computation).
Then each weight carries a leading member axis, W (M, n_in, n_out), every
activation carries the same axis in front, x (M, B, T, D), and a scale is
one per member, (M,). Shape comments below write it as `*M`: absent for
one model, (M,) for a stack. Member m's numbers are those of model m alone.
"""

from __future__ import annotations

import numpy as np

from attn import scores
from attn.factored import Factored, add_at_positions, keep_factored, sum_of_outer_products, sum_over_examples  # noqa: F401 (part of the layers API)

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


def _members(weight: np.ndarray) -> int:
    """How many leading member axes a weight matrix (or table) carries: 0 or 1."""
    return weight.ndim - 2


def _per_member(value, like: np.ndarray) -> np.ndarray:
    """A scalar, or one value per member (*M,), shaped to broadcast over `like`'s matrices."""
    return np.asarray(value, dtype=like.dtype)[..., None, None]


# --------------------------------------------------------------------------
# Embedding: out[b, t] = table[ids[b, t]]
# --------------------------------------------------------------------------
def embedding_forward(ids: np.ndarray, table: np.ndarray):
    """Look up rows of `table` (*M, V, D) for integer `ids` (*M, ...) -> (*M, ..., D)."""
    out = np.take(*_flat_lookup(ids, table), axis=0)  # (*M, ..., D)
    return out, (ids, table.shape)


def _flat_lookup(ids: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(table as rows (M V, D), ids into those rows): member m's row v is row m V + v."""
    if not _members(table):
        return table, ids
    M, V, D = table.shape
    return table.reshape(M * V, D), ids + (np.arange(M) * V).reshape(M, *[1] * (ids.ndim - 1))


def embedding_backward(dout, cache) -> np.ndarray:
    """Sum the upstream gradient into the rows that were looked up:

        dtable = onehot(ids)^T dout      (V, N) @ (N, D), N = number of ids

    One matrix product: O(N V D) FLOPs, yet for the vocabularies here (tens
    of ids) far faster than np.add.at's row-by-row scatter. Repeated ids add up.

    dout may be Factored (dout[b] = L_b^T R_b, ids (B, T)); then, by
    associativity, dtable = sum_b (L_b onehot_b)^T R_b: L binned by token id,
    (B, R, V), times R, and dout is never formed. The binning is one
    np.bincount over every (example, row) (accumulated in float64, then
    the gradient's dtype): a batch of tiny products would cost more.
    """
    ids, shape = cache
    (V, D), lead = shape[-2:], shape[:-2]
    if isinstance(dout, Factored):
        *batch, R, T = dout.left.shape  # batch = (*M, B)
        n_rows = int(np.prod(batch)) * R
        bins = np.arange(n_rows).reshape(*batch, R, 1) * V + ids[..., None, :]  # (*M, B, R, T): bin of each entry
        binned = np.bincount(bins.ravel(), weights=dout.left.ravel(), minlength=n_rows * V)
        binned = binned.astype(dout.right.dtype).reshape(*lead, -1, V)  # (*M, B R, V)
        return binned.swapaxes(-1, -2) @ _rows(dout.right, len(lead))  # (*M, V, D)
    onehot = (np.arange(V)[:, None] == ids.reshape(*lead, 1, -1)).astype(dout.dtype)  # (*M, V, N)
    return onehot @ _rows(dout, len(lead))  # (*M, V, D)


def _rows(x: np.ndarray, members: int) -> np.ndarray:
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
    out = _rows(x, _members(W)) @ W  # (*M, N, n_out)
    if b is not None:
        out += b[..., None, :]
    return out.reshape(*x.shape[:-1], n_out), (x, W, b is not None)


def linear_backward(dout: np.ndarray, cache):
    """Returns (dx, dW, db); db is None when the forward had no bias."""
    x, W, has_bias = cache
    members = _members(W)
    dout2 = _rows(dout, members)  # (*M, N, n_out)
    dx = (dout2 @ W.swapaxes(-1, -2)).reshape(x.shape)  # (*M, ..., n_in)
    dW = _rows(x, members).swapaxes(-1, -2) @ dout2  # (*M, n_in, n_out)
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


def factorised_linear_forward(x: np.ndarray, U: np.ndarray, V: np.ndarray, scale=1.0, merged: bool | None = None):
    """out = s x U V for x (*M, ..., n_in), U (*M, n_in, r), V (*M, r, n_out),
    s a scalar or one per member (*M, 1, 1):

        chained:  h = s (x U),  out = h V
        merged:   W = s (U V),  out = x W        (W: n_in x n_out, formed once)

    The same map either way; `merged` None picks the cheaper (merge_is_cheaper).
    s multiplies the smaller product (h or W), never U itself.
    """
    members = _members(U)
    n_in, rank, n_out = *U.shape[-2:], V.shape[-1]
    rows = _rows(x, members)  # (*M, N, n_in)
    if merged is None:
        merged = merge_is_cheaper(rows.shape[-2], n_in, rank, n_out)
    if merged:
        W = U @ V  # (*M, n_in, n_out)
        W *= scale
        out = rows @ W
        cache = (rows, U, V, scale, W, None)
    else:
        hidden = rows @ U  # (*M, N, r)
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
    dout2 = _rows(dout, _members(U))  # (*M, N, n_out)
    if W is not None:
        dW = rows.swapaxes(-1, -2) @ dout2  # (*M, n_in, n_out)
        dx = dout2 @ W.swapaxes(-1, -2)
        dW *= scale
        dU, dV = dW @ V.swapaxes(-1, -2), _product_laid_out_as(V, U.swapaxes(-1, -2), dW)
    else:
        dV = _product_laid_out_as(V, hidden.swapaxes(-1, -2), dout2)
        dhidden = dout2 @ V.swapaxes(-1, -2)  # (*M, N, r)
        dhidden *= scale
        dx = dhidden @ U.swapaxes(-1, -2)
        dU = rows.swapaxes(-1, -2) @ dhidden
    return dx.reshape(x_shape), dU, dV


def _product_laid_out_as(like: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b in the memory layout of `like`: computed as (b^T a^T)^T when
    `like` is a transposed view (W_k^T), so that the gradient is as
    contiguous as its weight and the optimiser walks it in order."""
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
    z = np.moveaxis(logits, -1, 0).copy()  # (C, *M, B, T): classes outermost (see _keys_first)
    z -= z.max(axis=0)  # shifted logits
    onehot = np.arange(z.shape[0]).reshape(-1, *[1] * targets.ndim) == targets  # (C, *M, B, T) bool
    picked = (z * onehot).sum(axis=0)  # (*M, B, T) z[target]
    np.exp(z, out=z)
    sum_exp = z.sum(axis=0)  # (*M, B, T)
    z /= sum_exp
    probs = np.moveaxis(z, 0, -1)  # (*M, B, T, C) softmax, a view of z
    counts = target_mask.sum(axis=(-2, -1), keepdims=True)  # (*M, 1, 1)
    weight = target_mask.astype(logits.dtype) / counts.astype(logits.dtype)  # (*M, B, T)
    loss = ((np.log(sum_exp) - picked) * weight).sum(axis=(-2, -1), dtype=logits.dtype)
    return loss, (probs, np.moveaxis(onehot, 0, -1), weight)


def cross_entropy_backward(dloss, cache) -> np.ndarray:
    """dlogits = dloss * weight * (softmax(logits) - onehot(target)); dloss a
    scalar or one per member."""
    probs, onehot, weight = cache
    dlogits = probs - onehot  # (*M, B, T, C)
    dlogits *= (weight * np.asarray(dloss, dtype=probs.dtype)[..., None, None])[..., None]
    return dlogits


# --------------------------------------------------------------------------
# One attention head.
# --------------------------------------------------------------------------
def causal_mask(T: int) -> np.ndarray:
    """Boolean (T, T) mask, True where query i may NOT look at key j (j > i)."""
    return np.triu(np.ones((T, T), dtype=bool), k=1)


def _key_major_product(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """queries @ keys^T, (..., P, T) for keys (..., T, n) and queries (..., P, n),
    in an array laid out with the keys outermost in memory.

    The softmax reduces over keys, and numpy reduces an outer axis (across
    rows, vectorised) several times faster than an inner one (along rows of
    T, often ~10, entries)."""
    *lead, T, _ = keys.shape
    P = queries.shape[-2]
    transposed = np.moveaxis(np.empty((T, *lead, P), dtype=keys.dtype), 0, -2)  # (..., T, P), keys outermost
    np.matmul(keys, queries.swapaxes(-1, -2), out=transposed)
    return transposed.swapaxes(-1, -2)  # (..., P, T)


def head_costs(B: int, P: int, T: int, D: int, d_k: int, d_v: int) -> dict[str, int]:
    """Multiply-adds of one forward and backward of the head for each
    association (N_q = B P query rows, N_k = B T key rows, d = d_k + d_v):

    projected   K, V over all T, Q at the queries (the equations as written):
        forward    N_k D d + N_q D d_k + N_q T d + N_q d_v D
        backward   2 N_q d_v D + N_q T d + 2 N_q D d_k + the keys' and values':
                   formed   N_q T d + 2 N_k D d
                   factored 2 B P T D + 2 N_q D d          (keep_factored)
    bilinear    S = X_Q W_QK X^T, out = (A X) W_OV, never forming K or V:
        the two maps (factorised_linear, each chained or merged, the cheaper)
        + 4 N_q T D (S, A X and their backward) + 2 N_q T D if dX is formed.
    """
    Nq, Nk, d = B * P, B * T, d_k + d_v
    factored = keep_factored(T, P)
    projected = (Nk * D * d + Nq * D * d_k + Nq * T * d + Nq * d_v * D
                 + 2 * Nq * d_v * D + Nq * T * d + 2 * Nq * D * d_k
                 + (2 * B * P * T * D + 2 * Nq * D * d if factored else Nq * T * d + 2 * Nk * D * d))

    def map_cost(rank: int) -> int:
        return min(3 * Nq * rank * 2 * D, 3 * D * rank * D + 3 * Nq * D * D)

    bilinear = map_cost(d_k) + map_cost(d_v) + 4 * Nq * T * D + (0 if factored else 2 * Nq * T * D)
    return {"projected": projected, "bilinear": bilinear}


def choose_association(B: int, P: int, T: int, D: int, d_k: int, d_v: int) -> str:
    """The rule: the association of head_costs with fewer multiply-adds
    (ties: projected). Bilinear wins with few query rows (retrieval's one)
    or d_k, d_v wider than d_model; projected with a query at every position
    and narrow heads (copy at d_k = d_v < 2 D / 3)."""
    costs = head_costs(B, P, T, D, d_k, d_v)
    return "bilinear" if costs["bilinear"] < costs["projected"] else "projected"


def attention_forward(x, W_q, W_k, W_v, W_o, scale, mask: np.ndarray | None = None, queries=slice(None),
                      association: str | None = None, score: scores.HeadScore | None = None):
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
    without a target) can be skipped. The same head is a bilinear form in X,
    and `association` chooses how to compute it (None: choose_association):

        projected   as written, with K and V one product, [K V] = X [W_k W_v],
                    and s applied to the queries: S = (s X_Q W_q) K^T
        bilinear    S = X_Q W_QK X^T,   out = (A X) W_OV,
                    W_QK = s W_q W_k^T (D x D),  W_OV = W_v W_o (D x D),
                    each applied as a product of its two factors or formed,
                    whichever is cheaper (factorised_linear_forward)

    `score`: a score mode beyond s q.k (attn.scores): a map of S before the
    mask (softcap, a learned temperature or length scale), or a norm of q and
    k, which only the projected association can apply.

    Returns (out, attn, cache): the head's output, the attention weights A,
    and what backward needs (including the scores, for diagnostics).
    """
    norm = score.norm if score is not None else None
    if norm is not None:
        association = "projected"  # norm(q).norm(k) is no bilinear form in X
    if association is None:
        *_, B, T, D = x.shape
        association = choose_association(B, np.arange(T)[queries].size, T, D, W_k.shape[-1], W_v.shape[-1])
    scale = _per_member(scale, W_q)  # s, or s per member (M, 1, 1)
    x_q = x[..., queries, :]  # (*M, B, P, D)
    if association == "projected":
        d_k = W_k.shape[-1]
        kv, kv_projection = linear_forward(x, np.concatenate([W_k, W_v], axis=-1))  # (*M, B, T, d_k + d_v)
        k, v = kv[..., :d_k], kv[..., d_k:]  # views: (*M, B, T, d_k), (*M, B, T, d_v)
        q_scaled, q_projection = linear_forward(x_q, W_q)  # Q = X_Q W_q: (*M, B, P, d_k)
        key_norm = query_norm = None
        if norm is not None:  # q, k <- g norm(q), g norm(k) over d_k
            k, key_norm = scores.norm_forward(k, score.g_k, norm)
            q_scaled, query_norm = scores.norm_forward(q_scaled, score.g_q, norm)
        q_scaled *= scale[..., None]  # Q_s = s Q (the scale broadcast over examples)
        logits = _key_major_product(k, q_scaled)  # S = Q_s K^T: (*M, B, P, T)
    else:
        q_circuit, query_map = factorised_linear_forward(x_q, W_q, W_k.swapaxes(-1, -2), scale)  # X_Q W_QK: (*M, B, P, D)
        logits = _key_major_product(x, q_circuit)  # S = X_Q W_QK X^T: (*M, B, P, T)
    logits, transform = scores.transform_forward(logits, score, scores.keys_seen(x.shape[-2], mask, queries))
    if mask is not None:
        logits[..., mask[queries]] = -np.inf
    attn, _ = softmax_forward(logits)  # (*M, B, P, T)
    cache = dict(association=association, x=x, queries=queries, scale=scale, scores=logits, attn=attn,
                 transform=transform)
    if association == "projected":
        out, output = linear_forward(attn @ v, W_o)  # C = A V: (*M, B, P, d_v);  C W_o: (*M, B, P, D)
        cache.update(k=k, v=v, q_scaled=q_scaled, kv_projection=kv_projection, q_projection=q_projection,
                     output=output, key_norm=key_norm, query_norm=query_norm)
    else:
        attended = attn @ x  # A X: (*M, B, P, D)
        out, value_map = factorised_linear_forward(attended, W_v, W_o)  # (A X) W_OV: (*M, B, P, D)
        cache.update(q_circuit=q_circuit, query_map=query_map, attended=attended, value_map=value_map)
    return out, attn, cache


def attention_backward(dout, cache):
    """Gradients of the head: dict with keys x, W_q, W_k, W_v, W_o.

    dout (*M, B, P, D) is the upstream gradient at the forward's query
    positions. What belongs to a query (dC, dA, dS, dQ) is computed at those
    P positions; the keys and values of all T positions get their gradient
    through them. The gradient of x is an array (*M, B, T, D), or Factored
    when few queries make that cheaper (keep_factored). A score mode's own
    parameters get theirs too (theta, length_scale, g_q, g_k).
    """
    backward = _projected_backward if cache["association"] == "projected" else _bilinear_backward
    return backward(dout, cache)


def _score_gradient(dattn_t: np.ndarray, cache) -> tuple[np.ndarray, dict]:
    """dS from dA (given keys-outermost, as _key_major_product leaves it)
    through the softmax and the score mode's map; and that map's parameter gradients."""
    dscores = softmax_backward(dattn_t, cache["attn"])  # zero where masked
    return scores.transform_backward(dscores, cache["transform"])


def _projected_backward(dout, cache):
    k, v, q_scaled, attn = cache["k"], cache["v"], cache["q_scaled"], cache["attn"]  # (*M, B, T, d_k), (*M, B, T, d_v), (*M, B, P, d_k), (*M, B, P, T)
    dcontext, dW_o, _ = linear_backward(dout, cache["output"])  # (*M, B, P, d_v), (*M, d_v, D)
    dscores, grads = _score_gradient(_key_major_product(v, dcontext), cache)  # dA = dC V^T; dS: (*M, B, P, T)
    dq = dscores @ k  # (*M, B, P, d_k)
    dq *= cache["scale"][..., None]  # Q_s = s Q
    if cache["query_norm"] is not None:
        dq, grads["g_q"] = scores.norm_backward(dq, cache["query_norm"])
    dx, dW_k, dW_v, grads["g_k"] = _key_value_backward(dscores, q_scaled, attn, dcontext, cache["kv_projection"],
                                                       cache["key_norm"])
    dx_q, dW_q, _ = linear_backward(dq, cache["q_projection"])  # (*M, B, P, D), (*M, D, d_k)
    dx = add_at_positions(dx, cache["queries"], dx_q)
    return {"x": dx, "W_q": dW_q, "W_k": dW_k, "W_v": dW_v, "W_o": dW_o,
            **{name: g for name, g in grads.items() if g is not None}}


def _key_value_backward(dscores, q_scaled, attn, dcontext, kv_projection, key_norm=None):
    """dX, dW_k, dW_v (and the key norm's gain's gradient, or None) from the
    keys' and values' share of the gradient: dK = dS^T Q_s and dV = A^T dC,
    sums of P outer products per example; through the norm of the keys when
    there is one (formed, then: the norm is per key row).

    formed (many queries): [dK dV] (*M, B, T, d_k + d_v), side by side so
    that the projection's backward is two products, not four:
        dX = [dK dV] [W_k W_v]^T,   [dW_k dW_v] = X^T [dK dV].
    factored (few queries, keep_factored): never form dK, dV or dX; by
    associativity, with L = [dS; A] (B, 2P, T), R = [Q_s W_k^T; dC W_v^T]
    (B, 2P, D):
        dX = L^T R  (returned as Factored(L, R)),
        dW_k = (dS X)^T Q_s,   dW_v = (A X)^T dC,
    summed over examples.
    """
    x, W_kv, _ = kv_projection  # [K V] = X [W_k W_v]
    *_, P, T = attn.shape
    d_k, members = q_scaled.shape[-1], _members(W_kv)
    if key_norm is not None or not keep_factored(T, P):
        dkv = np.empty((*x.shape[:-1], W_kv.shape[-1]), dtype=x.dtype)  # (*M, B, T, d_k + d_v)
        sum_of_outer_products(dscores, q_scaled, out=dkv[..., :d_k])  # dK = dS^T Q_s
        sum_of_outer_products(attn, dcontext, out=dkv[..., d_k:])  # dV = A^T dC
        dgain = None
        if key_norm is not None:  # K = norm(X W_k)
            dkv[..., :d_k], dgain = scores.norm_backward(dkv[..., :d_k], key_norm)
        dx, dW_kv, _ = linear_backward(dkv, kv_projection)  # (*M, B, T, D), (*M, D, d_k + d_v)
        return dx, dW_kv[..., :d_k], dW_kv[..., d_k:], dgain
    W_kT = W_kv[..., :d_k].swapaxes(-1, -2)  # (*M, d_k, D)
    W_vT = W_kv[..., d_k:].swapaxes(-1, -2)  # (*M, d_v, D)
    left = np.concatenate([dscores, attn], axis=-2)  # L = [dS; A]  (*M, B, 2P, T)
    right = np.concatenate([linear_forward(q_scaled, W_kT)[0], linear_forward(dcontext, W_vT)[0]], axis=-2)  # R
    left_x = left @ x  # [dS X; A X]  (*M, B, 2P, D)
    dW_k = _rows(left_x[..., :P, :], members).swapaxes(-1, -2) @ _rows(q_scaled, members)  # (*M, D, d_k)
    dW_v = _rows(left_x[..., P:, :], members).swapaxes(-1, -2) @ _rows(dcontext, members)  # (*M, D, d_v)
    return Factored(left, right), dW_k, dW_v, None


def _bilinear_backward(dout, cache):
    """Through out = (A X) W_OV and S = X_Q W_QK X^T:

        d(A X) = dout W_OV^T,   dA = d(A X) X^T,   dS = softmax VJP,
        d(X_Q W_QK) = dS X,
        dX = dS^T (X_Q W_QK) + A^T d(A X) + the query rows' own gradient,
    the first two as Factored([dS; A], [X_Q W_QK; d(A X)]) (formed when
    keep_factored says so), and the weights' through the two maps:
    dW_q = dU, dW_k = dV^T for the query map's U = W_q, V = W_k^T, scale s.
    """
    x, attn, q_circuit = cache["x"], cache["attn"], cache["q_circuit"]  # (*M, B, T, D), (*M, B, P, T), (*M, B, P, D)
    dattended, dW_v, dW_o = factorised_linear_backward(dout, cache["value_map"])  # (*M, B, P, D)
    dscores, grads = _score_gradient(_key_major_product(x, dattended), cache)  # dA = d(AX) X^T; dS: (*M, B, P, T)
    dq_circuit = dscores @ x  # (*M, B, P, D)
    dx_q, dW_q, dW_kT = factorised_linear_backward(dq_circuit, cache["query_map"])
    dx = Factored(np.concatenate([dscores, attn], axis=-2), np.concatenate([q_circuit, dattended], axis=-2))
    if not keep_factored(x.shape[-2], attn.shape[-2]):
        dx = dx.dense()  # (*M, B, T, D)
    dx = add_at_positions(dx, cache["queries"], dx_q)
    return {"x": dx, "W_q": dW_q, "W_k": dW_kT.swapaxes(-1, -2), "W_v": dW_v, "W_o": dW_o, **grads}
