"""The attention head and its associations, built from the pairs in attn.model.pairs
(embedding, linear, a product of two matrices, softmax, cross-entropy, the
gradient held as factors), and the one cost rule that chooses an association.

The head is a pair in the CS231n style, as attn.model.pairs describes its own:
`attention_forward -> (out, cache)`, `attention_backward(dout, cache)`.

Shapes: B batch, T positions, D = d_model, d_k query/key width, d_v value
width, C number of output classes, F token fields per position.

Members. Every pair also computes M models at once (attn.train.stack's stacked
runs: seeds, rates and scales of one shape trained as one computation).
Then each weight carries a leading member axis, W (M, n_in, n_out), every
activation carries the same axis in front, x (M, B, T, D), and a scale is
one per member, (M,). Shape comments below write it as `*M`: absent for
one model, (M,) for a stack. Member m's numbers are those of model m alone.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from attn.model import scores, widthfree
from attn.model.pairs import (
    Factored,
    LazyEmbeddings,
    add_at_positions,
    as_rows,
    factored_with_rows,
    factorised_linear_backward,
    factorised_linear_forward,
    keep_factored,
    linear_backward,
    linear_forward,
    lookup_is_cheaper,
    member_axes,
    move_axis,
    per_member_matrix,
    softmax_backward,
    softmax_forward,
    stacked_rows,
    sum_of_outer_products,
)

# --------------------------------------------------------------------------
# Score scales.  scores = s * Q K^T.  Adding a mode is one entry here.
# --------------------------------------------------------------------------
SCORE_SCALES = {
    "sqrt": lambda d_k: d_k**-0.5,  # Vaswani et al.: keeps Var(score) ~ 1
    "none": lambda d_k: 1.0,  # the ablation: Var(score) ~ d_k
    "linear": lambda d_k: 1.0 / d_k,  # muP-style: Var(score) ~ 1/d_k at init
}


def score_scale(mode: str, d_k: int) -> float:
    """The factor s that multiplies Q K^T for a scaling `mode`."""
    return float(SCORE_SCALES[mode](d_k))


def theory_score_std(
    score: str, scale: str, d_k: int, qk_gain: float, temperature_init: float | None = None
) -> float | None:
    """The scores' std at initialisation in theory, s·√d_k·g², for s q.k with q, k of components of
    variance g² (README's model): `dot` with g the init gain of W_q, W_k (qk_gain, d_k's power applied);
    `temperature` likewise with s = exp(θ₀) (model.temperature_init; None: `scale`'s s);
    `qk_norm` with g = 1, since normed q, k have components of mean square 1 and their gains start at 1
    (LayerNorm: d_k/(d_k - 1) times the variance, near 1 but at small d_k). None for the modes
    whose start is not s q.k of that spread (softcap, mup, sigma_reparam, log_length) or an unknown scale."""
    if scale not in SCORE_SCALES or score not in ("dot", "temperature", "qk_norm"):
        return None
    s = (
        math.exp(temperature_init)
        if score == "temperature" and temperature_init is not None
        else score_scale(scale, d_k)
    )
    return s * math.sqrt(d_k) * (1.0 if score == "qk_norm" else qk_gain**2)


# --------------------------------------------------------------------------
# One attention head.
# --------------------------------------------------------------------------
@lru_cache(maxsize=32)
def causal_mask(T: int) -> np.ndarray:
    """Boolean (T, T) mask, True where query i may NOT look at key j (j > i).
    Read-only: one per T, asked every forward."""
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)
    mask.flags.writeable = False
    return mask


def _key_major_product(keys, queries: np.ndarray) -> np.ndarray:
    """queries @ keys^T, (..., P, T) for keys (..., T, n) (an array or LazyEmbeddings)
    and queries (..., P, n), in an array laid out with the keys outermost in memory.

    The softmax reduces over keys, and numpy reduces an outer axis (across
    rows, vectorised) faster than an inner one (along rows of
    T, often ~10, entries)."""
    if isinstance(keys, LazyEmbeddings):
        return keys.key_major_product(queries)
    *lead, T, _ = keys.shape
    P = queries.shape[-2]
    transposed = move_axis(np.empty((T, *lead, P), dtype=keys.dtype), 0, -2)  # (..., T, P), keys outermost
    np.matmul(keys, queries.swapaxes(-1, -2), out=transposed)
    return transposed.swapaxes(-1, -2)  # (..., P, T)


def _rows_at(x, positions) -> np.ndarray:
    """x[..., positions, :] for x (..., T, n), an array or LazyEmbeddings."""
    return x.rows(positions) if isinstance(x, LazyEmbeddings) else x[..., positions, :]


def _weighted_sum(weights: np.ndarray, x) -> np.ndarray:
    """weights @ x (..., P, n) for weights (..., P, T) and x (..., T, n), an array or LazyEmbeddings."""
    return x.weighted_sum(weights) if isinstance(x, LazyEmbeddings) else weights @ x


def _formed_or_looked_up(x, association: str, P: int, lookup: bool | None):
    """X as the association reads it: LazyEmbeddings (its products taken through its
    table) where the bilinear association's products with P queries cost less
    so (attn.model.pairs.lookup_is_cheaper) or `lookup` asks; else formed."""
    if not isinstance(x, LazyEmbeddings):
        return x
    if lookup is None:
        lookup = lookup_is_cheaper(len(x.ids), x.shape[-2], x.table.shape[-2], P, x.shape[-1])
    return x if lookup and association != "projected" else x.dense()


def head_costs(
    B: int, P: int, T: int, D: int, d_k: int, d_v: int, width_free: bool = False, normed: bool = False
) -> dict[str, int]:
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
        With a norm of q and k (`normed`, qk_norm: attn.model.scores.gram_forward),
        the query map is the Gram form: 7 D^2 d_k for M, G_q, G_k and their
        backward, 2 N_k D^2 + 5 N_q D^2 for the rows' products with them, and
        dX formed; the projected association's keys are formed. Only where
        d_k >= D: a narrower W has a singular Gram, where float32 cancels.
    widthfree   (only when `width_free`: the optimiser and score mode keep
        the weights in their initial span, attn.model.widthfree) the
        cheaper of the two above with d_k, d_v wider than 2D carried at 2D.
    """
    Nq, Nk, d = B * P, B * T, d_k + d_v
    factored = keep_factored(T, P) and not normed
    projected = (
        Nk * D * d
        + Nq * D * d_k
        + Nq * T * d
        + Nq * d_v * D
        + 2 * Nq * d_v * D
        + Nq * T * d
        + 2 * Nq * D * d_k
        + (2 * B * P * T * D + 2 * Nq * D * d if factored else Nq * T * d + 2 * Nk * D * d)
    )

    def map_cost(rank: int) -> int:
        return min(3 * Nq * rank * 2 * D, 3 * D * rank * D + 3 * Nq * D * D)

    query_map = 7 * D * D * d_k + 2 * Nk * D * D + 5 * Nq * D * D if normed else map_cost(d_k)
    bilinear = query_map + map_cost(d_v) + 4 * Nq * T * D + (0 if factored else 2 * Nq * T * D)
    costs = {"projected": projected, "bilinear": bilinear}
    if normed and d_k < D:  # G = W W^T of rank d_k < D: its rows' norms cancel in float32 (scores.row_norm_forward)
        del costs["bilinear"]
    if width_free:
        carried = head_costs(
            B, P, T, D, widthfree.carried_width(D, d_k), widthfree.carried_width(D, d_v), normed=normed
        )
        costs["widthfree"] = min(carried.values())
    return costs


@lru_cache(maxsize=64)
def choose_association(
    B: int, P: int, T: int, D: int, d_k: int, d_v: int, width_free: bool = False, normed: bool = False
) -> str:
    """The rule: the association of head_costs with fewer multiply-adds
    (ties: projected, then bilinear). Bilinear wins with few query rows
    (retrieval's one) or d_k, d_v wider than d_model; projected with a query
    at every position and narrow heads (copy at d_k = d_v < 2 D / 3);
    widthfree, where `width_free` allows it, once d_k or d_v is wider than 2D
    by enough to pay for nothing: its head is the others' at width 2D."""
    costs = head_costs(B, P, T, D, d_k, d_v, width_free, normed)
    return min(costs, key=lambda name: (costs[name], list(costs).index(name)))


def attention_forward(
    x,
    W_q,
    W_k,
    W_v,
    W_o,
    scale,
    mask: np.ndarray | None = None,
    queries=slice(None),
    association: str | None = None,
    score: scores.HeadScore | None = None,
    lookup: bool | None = None,
):
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
                    whichever is cheaper (factorised_linear_forward);
                    with a norm of q and k, S = s r_q r_k X_Q M X^T and
                    the rows' inverse norms r from G_q, G_k (_normed_forward)

    `score`: a score mode beyond s q.k (attn.model.scores): a map of S before the
    mask (softcap, a learned temperature or length scale), or a norm of q and k.

    x may be an array or LazyEmbeddings (attn.model.pairs): the bilinear association
    then takes its products through the embedding tables when that is cheaper
    (`lookup` None) or when `lookup` says so, else forms it; with a norm of q
    and k it forms it (every key's x G_k is needed).

    Returns (out, attn, cache): the head's output, the attention weights A,
    and what backward needs (including the scores, for diagnostics).
    """
    norm = score.norm if score is not None else None
    *_, B, T, D = x.shape
    P = len(range(T)[queries]) if isinstance(queries, slice) else len(queries)
    if association is None:
        association = choose_association(B, P, T, D, W_k.shape[-1], W_v.shape[-1], normed=norm is not None)
    x = _formed_or_looked_up(x, association, P, False if norm is not None else lookup)  # (*M, B, T, D)
    x_q = _rows_at(x, queries)  # (*M, B, P, D)
    scale = per_member_matrix(scale, W_q)  # s, or s per member (M, 1, 1)
    if association == "projected":
        d_k = W_k.shape[-1]
        kv, kv_projection = linear_forward(x, np.concatenate([W_k, W_v], axis=-1))  # (*M, B, T, d_k + d_v)
        k, v = kv[..., :d_k], kv[..., d_k:]  # views: (*M, B, T, d_k), (*M, B, T, d_v)
        q_scaled, q_projection = linear_forward(x_q, W_q)  # Q = X_Q W_q: (*M, B, P, d_k)
        key_norm = query_norm = None
        if norm is not None:  # q, k <- g norm(q), g norm(k) over d_k
            k, key_norm = scores.norm_forward(k, score.g_k, norm, score.norm_width)
            q_scaled, query_norm = scores.norm_forward(q_scaled, score.g_q, norm, score.norm_width)
        q_scaled *= scale[..., None]  # Q_s = s Q (the scale broadcast over examples)
        logits = _key_major_product(k, q_scaled)  # S = Q_s K^T: (*M, B, P, T)
    elif norm is not None:
        logits, q_circuit, norm_cache = _normed_forward(x, x_q, W_q, W_k, scale, score)  # (*M, B, P, T), (*M, B, P, D)
    else:
        q_circuit, query_map = factorised_linear_forward(
            x_q, W_q, W_k.swapaxes(-1, -2), scale
        )  # X_Q W_QK: (*M, B, P, D)
        logits = _key_major_product(x, q_circuit)  # S = X_Q W_QK X^T: (*M, B, P, T)
    logits, transform = scores.transform_forward(logits, score, mask, queries)
    if mask is not None:
        logits[..., mask[queries]] = -np.inf
    attn, _ = softmax_forward(logits)  # (*M, B, P, T)
    cache = dict(
        association=association,
        x=x,
        x_queries=x_q,
        queries=queries,
        scale=scale,
        scores=logits,
        attn=attn,
        transform=transform,
    )
    if association == "projected":
        out, output = linear_forward(attn @ v, W_o)  # C = A V: (*M, B, P, d_v);  C W_o: (*M, B, P, D)
        cache.update(
            k=k,
            v=v,
            q_scaled=q_scaled,
            kv_projection=kv_projection,
            q_projection=q_projection,
            output=output,
            key_norm=key_norm,
            query_norm=query_norm,
        )
    else:
        attended = _weighted_sum(attn, x)  # A X: (*M, B, P, D)
        out, value_map = factorised_linear_forward(attended, W_v, W_o)  # (A X) W_OV: (*M, B, P, D)
        cache.update(
            q_circuit=q_circuit,
            attended=attended,
            value_map=value_map,
            **(dict(norm_cache=norm_cache) if norm is not None else dict(query_map=query_map)),
        )
    return out, attn, cache


def _normed_forward(x: np.ndarray, x_q: np.ndarray, W_q, W_k, scale, score: scores.HeadScore):
    """S = s norm(q).norm(k) = r_k o (s r_q X_Q M) X^T with q, k never formed
    (attn.model.scores.gram_forward: M, G_q, G_k are D x D, and r the rows'
    inverse norms from them); (S, the query circuit s r_q X_Q M, cache)."""
    d_k = score.norm_width or W_q.shape[-1]  # the true d_k, also where W_q is carried narrower (width-free)
    (M, G_q, G_k), gram = scores.gram_forward(W_q, W_k, score.g_q, score.g_k, score.norm)  # (*M, D, D) each
    key_inverse, key_norm = scores.row_norm_forward(x, G_k, d_k)  # r_k: (*M, B, T)
    query_inverse, query_norm = scores.row_norm_forward(x_q, G_q, d_k)  # r_q: (*M, B, P)
    unnormed, query_map = linear_forward(x_q, M)  # X_Q M: (*M, B, P, D)
    factor = query_inverse[..., None] * scale[..., None]  # s r_q: (*M, B, P, 1)
    q_circuit = unnormed * factor  # (*M, B, P, D)
    raw = _key_major_product(x, q_circuit)  # s r_q X_Q M X^T: (*M, B, P, T), keys outermost
    logits = raw * key_inverse[..., None, :]  # the same layout (an elementwise product keeps it)
    return (
        logits,
        q_circuit,
        dict(
            gram=gram,
            key_norm=key_norm,
            query_norm=query_norm,
            query_map=query_map,
            unnormed=unnormed,
            factor=factor,
            raw=raw,
            key_inverse=key_inverse,
        ),
    )


def _normed_backward(dscores: np.ndarray, x: np.ndarray, scale, norm_cache: dict):
    """Through S = r_k o (s r_q X_Q M) X^T back to the weights and the gains:
    (dS' = dS r_k, the gradient of the unnormed product; dX at the queries;
    dX at every key through r_k; {W_q, W_k, g_q, g_k}).

        dr_k = sum over queries of dS o raw,   d(query circuit) = dS' X,
        d(X_Q M) = s r_q d(query circuit),     dr_q = s sum over D of d(query circuit) o X_Q M,
    then M's, G_q's and G_k's gradients to the weights (scores.gram_backward)."""
    dscores_unnormed = dscores * norm_cache["key_inverse"][..., None, :]  # (*M, B, P, T)
    dkey_inverse = (dscores * norm_cache["raw"]).sum(axis=-2)  # (*M, B, T)
    dq_circuit = dscores_unnormed @ x  # (*M, B, P, D)
    dquery_inverse = (dq_circuit * norm_cache["unnormed"]).sum(axis=-1) * scale  # (*M, B, P)
    dx_q, dM, _ = linear_backward(
        dq_circuit * norm_cache["factor"], norm_cache["query_map"]
    )  # (*M, B, P, D), (*M, D, D)
    dG_q, dx_query_norm = scores.row_norm_backward(dquery_inverse, norm_cache["query_norm"])
    dx_q += dx_query_norm
    dG_k, dx_keys = scores.row_norm_backward(dkey_inverse, norm_cache["key_norm"])  # (*M, D, D), (*M, B, T, D)
    dW_q, dW_k, dg_q, dg_k = scores.gram_backward(dM, dG_q, dG_k, norm_cache["gram"])
    grads = {"W_q": dW_q, "W_k": dW_k, **({"g_q": dg_q, "g_k": dg_k} if dg_q is not None else {})}
    return dscores_unnormed, dx_q, dx_keys, grads


def attention_backward(dout, cache, dx_queries=None):
    """Gradients of the head: dict with keys x, W_q, W_k, W_v, W_o.

    dout (*M, B, P, D) is the upstream gradient at the forward's query
    positions; dx_queries (*M, B, P, D), if given, a gradient that reaches X
    at those positions by another way (a residual H = X + out), added to the
    query rows' own so that X's gradient gains those rows once. What belongs
    to a query (dC, dA, dS, dQ) is computed at those
    P positions; the keys and values of all T positions get their gradient
    through them. The gradient of x is an array (*M, B, T, D), or Factored
    when few queries make that cheaper (keep_factored). A score mode's own
    parameters get theirs too (theta, length_scale, g_q, g_k).
    """
    backward = _projected_backward if cache["association"] == "projected" else _bilinear_backward
    return backward(dout, cache, dx_queries)


def _score_gradient(dattn_t: np.ndarray, cache) -> tuple[np.ndarray, dict]:
    """dS from dA (given keys-outermost, as _key_major_product leaves it)
    through the softmax and the score mode's map; and that map's parameter gradients."""
    dscores = softmax_backward(dattn_t, cache["attn"])  # zero where masked
    return scores.transform_backward(dscores, cache["transform"])


def _projected_backward(dout, cache, dx_queries):
    k, v, q_scaled, attn = (
        cache["k"],
        cache["v"],
        cache["q_scaled"],
        cache["attn"],
    )  # (*M, B, T, d_k), (*M, B, T, d_v), (*M, B, P, d_k), (*M, B, P, T)
    dcontext, dW_o, _ = linear_backward(dout, cache["output"])  # (*M, B, P, d_v), (*M, d_v, D)
    dscores, grads = _score_gradient(_key_major_product(v, dcontext), cache)  # dA = dC V^T; dS: (*M, B, P, T)
    dq = dscores @ k  # (*M, B, P, d_k)
    dq *= cache["scale"][..., None]  # Q_s = s Q
    if cache["query_norm"] is not None:
        dq, grads["g_q"] = scores.norm_backward(dq, cache["query_norm"])
    dx, dW_k, dW_v, grads["g_k"] = _key_value_backward(
        dscores, q_scaled, attn, dcontext, cache["kv_projection"], cache["key_norm"]
    )
    dx_q, dW_q, _ = linear_backward(dq, cache["q_projection"])  # (*M, B, P, D), (*M, D, d_k)
    if dx_queries is not None:
        dx_q += dx_queries
    dx = add_at_positions(dx, cache["queries"], dx_q)
    return {
        "x": dx,
        "W_q": dW_q,
        "W_k": dW_k,
        "W_v": dW_v,
        "W_o": dW_o,
        **{name: g for name, g in grads.items() if g is not None},
    }


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
    d_k, members = q_scaled.shape[-1], member_axes(W_kv)
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
    dW_k = as_rows(left_x[..., :P, :], members).swapaxes(-1, -2) @ as_rows(q_scaled, members)  # (*M, D, d_k)
    dW_v = as_rows(left_x[..., P:, :], members).swapaxes(-1, -2) @ as_rows(dcontext, members)  # (*M, D, d_v)
    return Factored(left, right), dW_k, dW_v, None


def _bilinear_backward(dout, cache, dx_queries):
    """Through out = (A X) W_OV and S = X_Q W_QK X^T:

        d(A X) = dout W_OV^T,   dA = d(A X) X^T,   dS = softmax VJP,
        d(X_Q W_QK) = dS X,
        dX = dS^T (X_Q W_QK) + A^T d(A X) + the query rows' own gradient,
    the first two as Factored([dS; A], [X_Q W_QK; d(A X)]) (formed when
    keep_factored says so), and the weights' through the two maps:
    dW_q = dU, dW_k = dV^T for the query map's U = W_q, V = W_k^T, scale s;
    with a norm of q and k, through its Gram form instead (_normed_backward),
    and dX formed, since the keys' norms reach every key row.
    """
    x, attn, q_circuit = cache["x"], cache["attn"], cache["q_circuit"]  # (*M, B, T, D), (*M, B, P, T), (*M, B, P, D)
    dattended, dW_v, dW_o = factorised_linear_backward(dout, cache["value_map"])  # (*M, B, P, D)
    dscores, grads = _score_gradient(_key_major_product(x, dattended), cache)  # dA = d(AX) X^T; dS: (*M, B, P, T)
    dx_keys = None
    if "norm_cache" in cache:  # with a norm of q and k: dS becomes dS', the unnormed product's
        dscores, dx_q, dx_keys, query_grads = _normed_backward(dscores, x, cache["scale"], cache["norm_cache"])
        grads.update(query_grads)
    else:
        dq_circuit = _weighted_sum(dscores, x)  # dS X: (*M, B, P, D)
        dx_q, grads["W_q"], dW_kT = factorised_linear_backward(dq_circuit, cache["query_map"])
        grads["W_k"] = dW_kT.swapaxes(-1, -2)
    if dx_queries is not None:
        dx_q += dx_queries
    if dx_keys is None and keep_factored(x.shape[-2], attn.shape[-2]):
        dx = factored_with_rows([dscores, attn], [q_circuit, dattended], cache["queries"], dx_q)
    else:
        dx = Factored(stacked_rows([dscores, attn]), stacked_rows([q_circuit, dattended])).dense()  # (*M, B, T, D)
        if dx_keys is not None:
            dx += dx_keys  # through the keys' norms
        dx = add_at_positions(dx, cache["queries"], dx_q)
    return {"x": dx, "W_q": grads.pop("W_q"), "W_k": grads.pop("W_k"), "W_v": dW_v, "W_o": dW_o, **grads}
