"""The width-free head: W_q, W_k (and W_v, W_o) carried as coordinates over a fixed basis, never d_k wide.

Under SGD-family updates (SGD, heavy-ball or Nesterov momentum, L2 weight
decay, schedules, rate multipliers, global-norm clipping) the head's
weights never leave a 2D-dimensional subspace of R^{d_k} (D = d_model):
with G = dL/d(W_q W_k^T) (D x D),

    grad W_q = G W_k,   grad W_k = G^T W_q,

so every row of W_q, W_k and of their momentum buffers is a combination of
the 2D rows of B = [W_q0; W_k0] (2D x d_k), the weights at initialisation.
Write B = R Q with Q (2D x d_k) of orthonormal rows and R (2D x 2D) lower
triangular (R R^T = Gamma = B B^T: R is the Cholesky factor of the Gram
matrix; Q = R^{-1} B). Then every weight is W = C Q with coordinates
C (D x 2D), starting at C_q = R[:D], C_k = R[D:], and since Q Q^T = I:

    W_q W_k^T  = C_q C_k^T                       (D x D)
    grad W_q   = (G C_k) Q,  grad W_k = (G^T C_q) Q
    |W|_F = |C|_F,  <grad W, W> = <grad C, C>,  |grad W|_F = |grad C|_F

So the model with d_k-wide weights is, step for step, the model with
2D-wide weights C and the same score scale s (of the true d_k): its
gradients are the coordinates of the true ones, the optimiser's update of
C is the coordinates of the update of W (every SGD-family operation is
linear in the weights and gradients), and clipping, logged norms and
update ratios are the same numbers. (This is the Gram form
W_q W_k^T = C'_q Gamma C'_k^T with C' = C R^{-1}, the Gram absorbed into
the coordinates: Gamma is I in the basis Q.) The value circuit is the
same with B_v = [W_v0; W_o0^T] (2D x d_v): W_v = C_v Q_v, W_o^T = C_o Q_v,
W_v W_o = C_v C_o^T; W_o is carried as C_o^T (2D x D).

A step then costs what a step at d_k = d_v = 2D costs, whatever d_k.

Initialisation. Up to SAMPLE_LIMIT entries of B, B is drawn exactly as the
materialized model draws W_q0, W_k0 (same seed, same initial model) and
R comes from the QR decomposition of B^T (B^T = Q' R', R = R'^T with the
signs that make its diagonal non-negative). Beyond it R is drawn directly
(bartlett): B has independent rows of variances sigma_i^2, so
B = S Z with Z standard normal and S = diag(sigma), and R = S L with L the
Cholesky factor of the Wishart matrix Z Z^T, which by the Bartlett
decomposition is lower triangular with

    L_ii ~ sqrt(chi^2(n - i + 1))  (i = 1..2D),   L_ij ~ N(0, 1)  (i > j),

n = d_k, all independent: starting at d_k = 2^20 draws O(D^2) numbers, not D d_k.

sigma_reparam (W' = gamma W / sigma(W)) stays in the subspace: with v in
it and v_c = Q v (2D,), the power iteration on W is the one on C,

    u = C v_c / |C v_c|,   v_c = C^T u / |C^T u|,   sigma = u^T C v_c = sigma(C),

and d sigma / dW = u v^T = (u v_c^T) Q, so W' = C' Q and its gradient are
coordinates too; v is carried as v_c (attn.model.fast.init_buffers: the
same run as the materialized model's while B is drawn in full).

qk_norm's RMSNorm with one gain (or none) stays in it too: q = x W_q =
(x C_q) Q, so |q| = |x C_q|, and the gradient reaching q through
q' = g q / rms(q) is a combination of q and of the keys' k', rows in the
span. The norm's mean is over the true d_k: rms(q)^2 = |x C_q|^2 / d_k
(attn.model.scores.HeadScore.norm_width).

What leaves the subspace (and so keeps the materialized weights): Adam and
AdamW (elementwise over d_k), qk_norm's LayerNorm (its centring subtracts
the mean along the all-ones direction of R^{d_k}) and a gain per dimension.
keeps_span says which score modes stay.
"""

from __future__ import annotations

import numpy as np

WIDTH_FREE_SCORES = ("dot", "softcap", "temperature", "mup", "log_length", "sigma_reparam")  # keep W_q, W_k in span
WIDTH_FREE_QK_NORM = "rms"  # qk_norm's norm that keeps them in span too, with these gains:
WIDTH_FREE_QK_NORM_GAINS = ("scalar", "none")
SAMPLE_LIMIT = 1 << 22  # entries of B (2D x width) drawn as the materialized model draws them; beyond: bartlett


def keeps_span(score: str, qk_norm: str, qk_norm_gain: str) -> bool:
    """Whether a score mode keeps W_q, W_k in the span of their initial rows (module docstring)."""
    if score == "qk_norm":
        return qk_norm == WIDTH_FREE_QK_NORM and qk_norm_gain in WIDTH_FREE_QK_NORM_GAINS
    return score in WIDTH_FREE_SCORES


def carried_width(d_model: int, width: int) -> int:
    """The width a circuit of `width` is carried at: 2 d_model (its coordinates) when wider, else its own."""
    return min(width, 2 * d_model)


def sampled_directly(d_model: int, width: int) -> bool:
    """Whether a circuit's initial weights are drawn in full (then orthonormalised) rather than by bartlett."""
    return 2 * d_model * width <= SAMPLE_LIMIT


def coordinates(
    first: np.ndarray, second: np.ndarray, basis: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(C_1, C_2, Q) for rows first (D, n), second (D, n), B = [first; second] (2D, n), n >= 2D:
    first = C_1 Q, second = C_2 Q with Q (2D, n) of orthonormal rows and
    [C_1; C_2] = R lower triangular with a non-negative diagonal.
    Computed in float64 (Householder QR of B^T), returned in the inputs' dtype.
    Without `basis`, Q is None and never formed: R is the same factorisation's
    triangle, bit for bit, with Q's columns never formed (training needs R alone)."""
    rows = np.concatenate([first, second], axis=-2).astype(np.float64)  # (2D, n)
    if basis:
        q, r = np.linalg.qr(rows.T)  # B^T = q r: q (n, 2D), r (2D, 2D) upper
    else:
        q, r = None, np.linalg.qr(rows.T, mode="r")  # r alone: the Householder vectors never accumulated into q
    signs = np.where(np.diagonal(r) < 0, -1.0, 1.0)  # (2D,)
    r = r * signs[:, None]  # with q * signs the same product, r's diagonal >= 0
    coords = np.ascontiguousarray(r.T, dtype=first.dtype)  # (2D, 2D) lower triangular
    D = first.shape[-2]
    Q = None if q is None else np.ascontiguousarray((q * signs).T, dtype=first.dtype)
    return coords[:D].copy(), coords[D:].copy(), Q


def bartlett(sigmas: np.ndarray, n: int, rng: np.random.Generator, dtype) -> np.ndarray:
    """R = diag(sigmas) L (2D, 2D) for the Cholesky factor L of a Wishart(n, I)
    matrix drawn by the Bartlett decomposition (module docstring): the
    coordinates of 2D independent Gaussian rows of width n, row i of standard
    deviation sigmas[i], over the orthonormal basis of their span."""
    k = len(sigmas)
    L = np.tril(rng.standard_normal((k, k)), -1)  # (2D, 2D): N(0, 1) below the diagonal
    L[np.arange(k), np.arange(k)] = np.sqrt(rng.chisquare(n - np.arange(k)))  # chi^2(n - i + 1), i = 1..2D
    return (np.asarray(sigmas, dtype=np.float64)[:, None] * L).astype(dtype)


def materialize(coords: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """W = C Q: the d_k-wide weight (D, n) from its coordinates C (D, 2D) and basis Q (2D, n)."""
    return coords @ basis
