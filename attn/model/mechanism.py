"""Softmax saturation and the gradient each query row passes to W_q and W_k, measured row by row.

It measures; it does not say why a run learns or not (the two_factors
experiment sets initial score variance and step size apart). With scores of
variance d_k the softmax saturates, and the gradient a saturated row passes
to the scores is its upstream gradient times the row's softmax Jacobian,
whose norm has the bound `bound` below. Each query row i that carries a
target (retrieval: one per example) gives, from the textbook model's
forward and backward (attn.model.reference; the row's share of the batch loss):

    max_p      its largest attention weight; saturated when max_p > 0.99
    grad_W_q   ||d loss_i / d W_q|| = s ||x_i|| ||dS_i K||     (a rank-one matrix)
    grad_W_k   ||d loss_i / d W_k|| = s ||dS_i X|| ||q_i||     (so is this)
    jacobian   ||J||_2 of the row's softmax, J = diag(p) - p p^T
    bound      2 (1 - max_p), which bounds it: J is symmetric, and row j of
               J sums in absolute value to 2 p_j (1 - p_j) <= 2 (1 - max_p)
               (for j the argmax since p_j <= 1; for any other j since
               p_j <= 1 - max_p), so ||J||_2 <= ||J||_inf <= 2 (1 - max_p)

Since W_q and W_k reach the loss only through the scores, a row whose
Jacobian is near zero passes almost no gradient to them through that row.

For a score mode (attn.model.scores), dS is the gradient of S = s q.k before the
mode's map of it, so the closed forms hold as written for every mode but two.
For sigma_reparam they are those of the reparametrised W'. For qk_norm, q and
k pass through a norm (k_j -> g_k n_j, n_j = r_j z_j, z_j = k_j or k_j - mean(k_j),
r_j = 1 / sqrt(|z_j|^2 / d_k + eps)): row i's W_q gradient is still rank one,
x_i times its q's gradient taken back through q_i's norm; its W_k gradient is
not, since each key's norm bends it its own way (`_normed_key_gradients`).
"""

from __future__ import annotations

import numpy as np

from attn.model import reference
from attn.model.fast import SATURATED, Batch, ModelSpec

TOP_FRACTION = 0.1  # the share of the squared gradient carried by this fraction of the rows
CHUNK_EXAMPLES = 64  # examples per pass through the reference model


def row_statistics(params: dict, spec: ModelSpec, batch: Batch, buffers: dict | None = None) -> dict[str, np.ndarray]:
    """Per query row with a target, (N,) arrays: max_p, saturated, grad_W_q,
    grad_W_k, jacobian, bound (module docstring). params, batch and buffers of
    one model. The batch goes through the reference model CHUNK_EXAMPLES
    examples at a time (so memory does not grow with the eval set), each
    chunk's gradients rescaled to the rows' share of the whole batch's loss."""
    n_total = int(batch.target_mask.sum())
    chunks = [
        _chunk_statistics(
            params,
            spec,
            Batch(
                *(
                    field[start : start + CHUNK_EXAMPLES]
                    for field in (batch.tokens, batch.targets, batch.target_mask, batch.target_key)
                )
            ),
            buffers,
            n_total,
        )
        for start in range(0, len(batch.tokens), CHUNK_EXAMPLES)
    ]
    return {name: np.concatenate([chunk[name] for chunk in chunks]) for name in chunks[0]}


def _chunk_statistics(params: dict, spec: ModelSpec, batch: Batch, buffers: dict | None, n_total: int) -> dict:
    _, cache = reference.forward(params, spec, batch, buffers)
    dS = reference.backward_to_scores(cache, spec)[3]  # (B, T, T): each row's score gradient
    rows = batch.target_mask  # (B, T)
    share = spec.score_scale * int(rows.sum()) / n_total  # s, and the chunk's loss as a share of the batch's
    X, Q, K, A = cache["X"], cache["Q"], cache["K"], cache["A"]  # (B, T, D), (B, T, d_k), (B, T, d_k), (B, T, T)
    if spec.score == "qk_norm":  # q and k pass through a norm
        dQ = cache["mode"].queries_and_keys_backward(dS @ K, np.zeros_like(K))[0]  # (B, T, d_k): row i's alone
        grad_q = share * _row_norms(X) * _row_norms(dQ)  # (B, T)
        grad_k = share * _normed_key_gradients(cache, dS, spec.d_k)  # (B, T)
    else:
        grad_q = share * _row_norms(X) * _row_norms(dS @ K)  # (B, T)
        grad_k = share * _row_norms(dS @ X) * _row_norms(Q)  # (B, T)
    p = A[rows].astype(np.float64)  # (N, T)
    p = p / p.sum(axis=-1, keepdims=True)  # a float32 row sums to 1 only to 1e-7, as large as a saturated row's bound
    max_p = p.max(axis=-1)  # (N,)
    rest = _rest(p)  # (N,): 1 - max_p, as the sum of the other weights (no cancellation when max_p is near 1)
    finite = np.isfinite(p).all(axis=-1)  # a diverged model's rows are NaN: their norms are too
    jacobian = np.full(len(p), np.nan)
    jacobian[finite] = np.abs(np.linalg.eigvalsh(_softmax_jacobian(p[finite], rest[finite]))).max(axis=-1)
    return {
        "max_p": max_p,
        "saturated": max_p > SATURATED,
        "grad_W_q": grad_q[rows],
        "grad_W_k": grad_k[rows],
        "jacobian": jacobian,
        "bound": 2 * rest,
    }


def _rest(p: np.ndarray) -> np.ndarray:
    """(N,): each row's weight off its largest entry, summed: 1 - max_p without subtracting from 1."""
    off = p.copy()
    np.put_along_axis(off, p.argmax(axis=-1)[:, None], 0.0, axis=-1)
    return off.sum(axis=-1)


def _softmax_jacobian(p: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """(N, T, T): J = diag(p) - p p^T, its diagonal p_j (1 - p_j) with 1 - p_j = rest for the largest
    weight, so that a saturated row's entries, all of the order of `rest`, keep their digits."""
    jacobian = -p[:, :, None] * p[:, None, :]  # (N, T, T)
    complement = 1.0 - p  # (N, T)
    np.put_along_axis(complement, p.argmax(axis=-1)[:, None], rest[:, None], axis=-1)
    diagonal = np.einsum("nii->ni", jacobian)  # a writable view of the diagonal
    diagonal[...] = p * complement
    return jacobian


def _normed_key_gradients(cache: dict, dS: np.ndarray, d_k: int) -> np.ndarray:
    """(B, T): ||d loss_i / d W_k|| for each query row i when k passes through a norm (qk_norm),
    in the units of dS (the caller multiplies by s and the chunk's share, as for W_q).

    Row i's score gradient reaches key j's output k̂_j = g_k n_j as dS_ij q̂_i; the
    norm's backward (attn.model.reference.ScoreMode._norm_backward) takes it to
    v_ij = dS_ij r_j (w_i - (w_i.n_j / d_k) n_j), w_i = g_k q̂_i (less its mean
    for LayerNorm; n_j is centred then, so w_i.n_j is unchanged). So
    d loss_i / d W_k = sum_j x_j v_ij^T, whose squared norm sum_jl (x_j.x_l)(v_ij.v_il)
    needs only T x T products, never a (D, d_k) matrix per row. With, for row i,
    the T-vectors c_j = dS_ij r_j and P_j = w_i.n_j (products elementwise),
        |.|^2 = |w_i|^2 c^T Gx c - (2 / d_k) c^T Gx (c P^2) + (1 / d_k^2) (c P)^T (Gx * Gn) (c P),
    Gx = X X^T and Gn = n n^T (the keys' normed rows), per example. In float64,
    since the terms may cancel: only when every key row i sees is parallel to
    w_i does rounding decide, and a square that rounds below 0 reads as 0."""
    mode = cache["mode"]
    n, r, g = (a if a is None else a.astype(np.float64) for a in mode.key_norm)  # (B, T, k_width), (B, T, 1), gain
    w = cache["Q"].astype(np.float64) * (1.0 if g is None else g)  # (B, T, k_width): w_i = g_k q̂_i
    if mode.spec.qk_norm == "layer":
        w = w - w.mean(axis=-1, keepdims=True)
    X = cache["X"].astype(np.float64)  # (B, T, D)
    Gx = X @ X.mT  # (B, T, T)
    Gn = n @ n.mT  # (B, T, T)
    P = w @ n.mT  # (B, T, T): P_ij = w_i.n_j
    c = dS.astype(np.float64) * r[..., 0][:, None, :]  # (B, T, T): c_ij = dS_ij r_j
    cGx = c @ Gx  # (B, T, T): row i is c_i^T Gx
    cP = c * P  # (B, T, T)
    squared = (
        (w * w).sum(axis=-1) * (cGx * c).sum(axis=-1)
        - (2.0 / d_k) * (cGx * c * P * P).sum(axis=-1)
        + ((cP @ (Gx * Gn)) * cP).sum(axis=-1) / d_k**2
    )  # (B, T)
    return np.sqrt(np.maximum(squared, 0.0))


def _row_norms(a: np.ndarray) -> np.ndarray:
    """|row| over the last axis, summed in float64: a saturated row's gradient
    can have entries below 1e-19, whose float32 squares would be subnormal or 0."""
    a64 = a.astype(np.float64)
    return np.sqrt(np.einsum("...i,...i->...", a64, a64))


def top_share(values: np.ndarray, fraction: float = TOP_FRACTION) -> float:
    """The share of sum(values^2) carried by the largest `fraction` of the
    values (at least one); nan when they are all zero."""
    squares = np.sort(np.asarray(values, dtype=np.float64) ** 2)[::-1]
    total = squares.sum()
    return float(squares[: max(1, int(round(fraction * len(squares))))].sum() / total) if total > 0 else float("nan")


def summary(rows: dict[str, np.ndarray]) -> dict[str, float]:
    """One model's rows in numbers: the saturated fraction; the median
    gradient norms of saturated and of other rows (nan where there are
    none); the top rows' share of each squared gradient; the largest
    ratio of a row's Jacobian norm to its bound (<= 1)."""
    saturated = rows["saturated"]
    out = {"saturated_frac": float(saturated.mean()) if len(saturated) else float("nan")}
    for name in ("grad_W_q", "grad_W_k"):
        values = rows[name]
        out[f"{name}_median_saturated"] = float(np.median(values[saturated])) if saturated.any() else float("nan")
        out[f"{name}_median_other"] = float(np.median(values[~saturated])) if (~saturated).any() else float("nan")
        out[f"{name}_top_share"] = top_share(values)
    bounded = rows["bound"] > 0
    out["jacobian_over_bound_max"] = (
        float((rows["jacobian"][bounded] / rows["bound"][bounded]).max()) if bounded.any() else float("nan")
    )
    return out
