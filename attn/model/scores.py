"""Score modes: the fixes for the attention-logit scale, each a forward/backward pair.

Every mode changes only how the scores S of a head are made from its
queries and keys; each is one pair here, used by attn.model.head' head:

    dot            S = s q.k                      the paper's, s = 1/sqrt(d_k) (model.scale)
    qk_norm        S = s norm(q).norm(k)          RMSNorm or LayerNorm over d_k with a gain g
                                                  (Henry et al. 2020; Dehghani et al. 2023)
    softcap        S = c tanh(s q.k / c)          (Gemma 2)
    temperature    S = exp(theta) q.k             theta trained (a learnable temperature)
    mup            S = q.k / d_k                  W_q zero-initialised (Yang et al., Tensor Programs V)
    sigma_reparam  S = s q'.k',  W' = gamma W / sigma(W) for W_q, W_k  (Zhai et al. 2023)
    log_length     S = s_len ln(n) q.k / sqrt(d_k)  n the keys a row sees (Nakanishi 2025)

Pairs on the scores (applied to S = s q.k before masking; `multiply` and
`softcap`), on q and k (`norm`), and on the weights (`spectral`). Shapes
carry the member axis of attn.model.head: a learned scalar is (*M,).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attn.model.pairs import as_rows, linear_forward, member_axes

SCORE_MODES = ("dot", "qk_norm", "softcap", "temperature", "mup", "sigma_reparam", "log_length")
NORMED_MODES = ("qk_norm",)  # the modes whose q and k pass through a norm (their head's Gram form)
NORM_EPS = 1e-6  # added to the mean square (or variance) before the square root


@dataclass(frozen=True)
class HeadScore:
    """How a head makes its scores beyond s q.k: at most one of a cap, a
    learned temperature, a learned length scale, or a norm of q and k."""

    cap: float | None = None  # softcap's c
    temperature: np.ndarray | None = None  # theta (*M,): S = exp(theta) q.k
    length_scale: np.ndarray | None = None  # s_len (*M,): S = s_len ln(n) s q.k
    norm: str | None = None  # qk_norm: rms | layer
    norm_width: int | None = None  # the d_k a norm's mean runs over, when q, k are carried narrower (width-free)
    g_q: np.ndarray | None = None  # qk_norm's gains (*M, d_k) or (*M, 1), or None
    g_k: np.ndarray | None = None


def keys_seen(T: int, mask: np.ndarray | None, queries) -> np.ndarray:
    """n of each query row (P,): the keys it may look at (T, or fewer under a causal mask)."""
    rows = np.arange(T)[queries]
    return np.full(len(rows), T) if mask is None else (~mask[rows]).sum(axis=-1)


def transform_forward(scores: np.ndarray, score: HeadScore | None, mask: np.ndarray | None, queries):
    """The mode's map of S = s q.k (before masking): c tanh(S / c), or
    exp(theta) S, or s_len ln(n) S per row, n the keys the row may see
    (keys_seen, under `mask` at the rows `queries`); (S', cache) with cache
    None when the mode has none."""
    if (
        score is None
        or score.norm is not None
        or (score.cap is None and score.temperature is None and score.length_scale is None)
    ):
        return scores, None
    if score.cap is not None:
        out, capped = softcap_forward(scores, score.cap)
        return out, ("cap", capped)
    if score.temperature is not None:
        kind, log_n = "temperature", None
        factor = np.exp(np.asarray(score.temperature, dtype=scores.dtype))[..., None, None, None]  # (*M, 1, 1, 1)
    else:
        kind, log_n = "length_scale", np.log(keys_seen(scores.shape[-1], mask, queries)).astype(scores.dtype)[:, None]
        factor = np.asarray(score.length_scale, dtype=scores.dtype)[..., None, None, None] * log_n  # (*M, 1, P, 1)
    out, cache = multiply_forward(scores, factor)
    return out, (kind, cache, log_n)  # log_n: (P, 1)


def transform_backward(dscores: np.ndarray, cache) -> tuple[np.ndarray, dict]:
    """(dS, the mode's parameter gradients: theta or length_scale, (*M,))."""
    if cache is None:
        return dscores, {}
    if cache[0] == "cap":
        return softcap_backward(dscores, cache[1]), {}
    kind, inner, log_n = cache
    dscores, product = multiply_backward(dscores, inner)  # (*M, B, P, T) each
    members = dscores.ndim - 3
    if kind == "temperature":  # S' = exp(theta) S: d/dtheta = exp(theta) sum dS' S
        return dscores, {"theta": _member_sums(product, members) * inner[1].reshape(inner[1].shape[:members])}
    return dscores, {"length_scale": _member_sums(product * log_n, members)}  # S' = s_len ln(n) S: sum dS' S ln(n)


# --------------------------------------------------------------------------
# S' = a S: a learned temperature exp(theta), or log_length's s_len ln(n_row)
# --------------------------------------------------------------------------
def multiply_forward(scores: np.ndarray, factor: np.ndarray):
    """S' = factor S for scores (*M, B, P, T) and a factor (*M, B, P, 1)-broadcastable; cache (S, factor)."""
    return scores * factor, (scores, factor)


def multiply_backward(dout: np.ndarray, cache):
    """(dS, dS' S): dS = factor dS', and the elementwise product dS' S whose
    sum over the entries a factor multiplies is that factor's gradient."""
    scores, factor = cache
    return dout * factor, dout * scores


def _member_sums(values: np.ndarray, members: int) -> np.ndarray:
    """The sum of each member's entries, (*M,): one contiguous run per member,
    so that a member's sum does not depend on the stack (numpy orders a
    reduction over several axes by the array's shape)."""
    return np.ascontiguousarray(values).reshape(*values.shape[:members], -1).sum(axis=-1)


# --------------------------------------------------------------------------
# S' = c tanh(S / c)
# --------------------------------------------------------------------------
def softcap_forward(scores: np.ndarray, cap: float):
    """S' = c tanh(S / c): |S'| < c, and S' ~ S where |S| << c; cache tanh(S / c)."""
    capped = np.tanh(scores / scores.dtype.type(cap))
    return capped * scores.dtype.type(cap), capped


def softcap_backward(dout: np.ndarray, capped: np.ndarray) -> np.ndarray:
    """dS = dS' (1 - tanh(S / c)^2)."""
    return dout * (1 - capped * capped)


# --------------------------------------------------------------------------
# q' = g norm(q) over the last axis: RMSNorm or LayerNorm
# --------------------------------------------------------------------------
def norm_forward(x: np.ndarray, gain: np.ndarray | None, kind: str, width: int | None = None):
    """rms:   x' = g x / sqrt(mean(x^2) + eps)
    layer: x' = g (x - mean(x)) / sqrt(var(x) + eps)
    over the last axis (d_k); g (*M, d_k) or (*M, 1) broadcast over the rows, or None (no gain).
    `width`: the mean of rms over that many entries, the last axis's and zeros
    beyond it (x the coordinates of a d_k-wide row, attn.model.widthfree)."""
    centred = x - x.mean(axis=-1, keepdims=True) if kind == "layer" else x
    inverse = 1.0 / np.sqrt(_mean(centred * centred, width) + x.dtype.type(NORM_EPS))
    normed = centred * inverse  # a fresh array, the caller's to scale in place: the cache keeps its factors
    g = None if gain is None else gain.reshape(gain.shape[:-1] + (1,) * (x.ndim - gain.ndim) + gain.shape[-1:])
    return (normed if g is None else normed * g), (centred, inverse, g, kind, gain is not None and gain.shape, width)


def _mean(x: np.ndarray, width: int | None) -> np.ndarray:
    """The mean over the last axis (keepdims), or its sum over `width`."""
    if width is None:
        return x.mean(axis=-1, keepdims=True)
    return x.sum(axis=-1, keepdims=True) / x.dtype.type(width)


def norm_backward(dout: np.ndarray, cache):
    """(dx, dgain): with n = x' / g the normalised x and r = 1/sqrt(...),
    dn = dout g,   dx = r (dn - mean(dn) - n mean(dn n))   (layer)
                   dx = r (dn - n mean(dn n))              (rms)
    dg = sum of dout n over every row (to g's shape)."""
    centred, inverse, g, kind, gain_shape, width = cache
    normed = centred * inverse
    dnormed = dout if g is None else dout * g
    dx = dnormed - normed * _mean(dnormed * normed, width)
    if kind == "layer":
        dx -= dnormed.mean(axis=-1, keepdims=True)
    dx *= inverse
    if g is None:
        return dx, None
    product = dout * normed  # (*M, ..., d_k)
    members = len(gain_shape) - 1
    rows = product.reshape(*product.shape[:members], -1, product.shape[-1])  # (*M, N, d_k)
    # summed over the rows axis: row after row into each dimension, whatever the stack (a sum over
    # the contiguous axis would need the (d_k, N) transpose, a copy as large as the keys)
    dgain = rows.sum(axis=-2)  # (*M, d_k)
    return dx, dgain.sum(axis=-1, keepdims=True) if gain_shape[-1] == 1 else dgain


# --------------------------------------------------------------------------
# norm(q).norm(k) as a bilinear form in x: the D x D Gram matrices
# --------------------------------------------------------------------------
def gram_forward(W_q: np.ndarray, W_k: np.ndarray, g_q: np.ndarray | None, g_k: np.ndarray | None, kind: str):
    """What the normed scores of q = x_q W_q, k = x_k W_k need, D x D whatever d_k:

        norm(q).norm(k) = r_q r_k  x_q M x_k^T,      M = W_q diag(g_q g_k) W_k^T
        r = 1 / sqrt(x G x^T / d_k + eps),           G = W W^T       (row_norm_forward)

    for rms; for layer the same with each W's rows centred first (the mean over
    d_k of q = x W_q is x W_q 1 / d_k, so q - mean(q) = x (W_q P), P = I - 1 1^T / d_k).
    Returns ((M, G_q, G_k), cache): three (*M, D, D) matrices."""
    # the weights as the norm sees them: W itself (rms), its rows centred (layer)
    seen_q, seen_k = (W - W.mean(axis=-1, keepdims=True) if kind == "layer" else W for W in (W_q, W_k))
    gains = None if g_q is None else g_q * g_k  # h = g_q g_k: (*M, d_k) or (*M, 1)
    weighted_q = seen_q if gains is None else seen_q * gains[..., None, :]  # W_q diag(h): (*M, D, d_k)
    M = weighted_q @ seen_k.swapaxes(-1, -2)  # (*M, D, D)
    G_q = seen_q @ seen_q.swapaxes(-1, -2)  # (*M, D, D)
    G_k = seen_k @ seen_k.swapaxes(-1, -2)  # (*M, D, D)
    return (M, G_q, G_k), (seen_q, seen_k, weighted_q, gains, g_q, g_k, kind)


def gram_backward(dM: np.ndarray, dG_q: np.ndarray, dG_k: np.ndarray, cache):
    """(dW_q, dW_k, dg_q, dg_k), the gains' None when there are none:

        dW_q = dM W_k diag(h) + (dG_q + dG_q^T) W_q,   dW_k = dM^T W_q diag(h) + (dG_k + dG_k^T) W_k,
        dh = sum over rows of W_q o (dM W_k),          dg_q = dh g_k,  dg_k = dh g_q,

    and for layer each dW minus its row mean (P is symmetric and idempotent)."""
    seen_q, seen_k, weighted_q, gains, g_q, g_k, kind = cache
    through_keys = dM @ seen_k  # dM W_k: (*M, D, d_k)
    dW_q = through_keys if gains is None else through_keys * gains[..., None, :]
    dW_q += (dG_q + dG_q.swapaxes(-1, -2)) @ seen_q
    dW_k = dM.swapaxes(-1, -2) @ weighted_q  # (*M, D, d_k)
    dW_k += (dG_k + dG_k.swapaxes(-1, -2)) @ seen_k
    if kind == "layer":
        dW_q -= dW_q.mean(axis=-1, keepdims=True)
        dW_k -= dW_k.mean(axis=-1, keepdims=True)
    if gains is None:
        return dW_q, dW_k, None, None
    dgains = (seen_q * through_keys).sum(axis=-2)  # (*M, d_k): each column summed over the D rows
    if gains.shape[-1] == 1:
        dgains = dgains.sum(axis=-1, keepdims=True)  # (*M, 1)
    return dW_q, dW_k, dgains * g_k, dgains * g_q


def row_norm_forward(x: np.ndarray, G: np.ndarray, d_k: int):
    """r = 1 / sqrt(x G x^T / d_k + eps) for each row of x (*M, ..., D): the
    inverse RMS over d_k of the row's x W, for G = W W^T (*M, D, D); (r (*M, ...), cache).

    x G x^T is |x W|^2 summed with terms of both signs: in float32 it loses
    about eps cond(G) of |x|^2 |G| and can fall below 0 where x is near W's
    null directions (always there when d_k < D). It is clamped at 0, and the
    cost rule takes this form only where d_k >= D (attn.model.head.head_costs)."""
    xG, _ = linear_forward(x, G)  # x G: (*M, ..., D)
    mean_square = np.einsum("...i,...i->...", xG, x)
    mean_square /= x.dtype.type(d_k)
    np.maximum(mean_square, 0, out=mean_square)
    mean_square += x.dtype.type(NORM_EPS)
    inverse = 1.0 / np.sqrt(mean_square)
    return inverse, (x, xG, inverse, d_k, member_axes(G))


def row_norm_backward(dinverse: np.ndarray, cache):
    """(dG, dx) of r = (x G x^T / d_k + eps)^(-1/2): with c = -r^3 dr / (2 d_k) per row,
    dG = x^T diag(c) x summed over the rows (*M, D, D), dx = 2 c x G (G symmetric)."""
    x, xG, inverse, d_k, members = cache
    c = dinverse * inverse**3
    c *= x.dtype.type(-0.5 / d_k)
    dG = as_rows(x, members).swapaxes(-1, -2) @ as_rows(x * c[..., None], members)  # x^T diag(c) x: (*M, D, D)
    return dG, 2 * c[..., None] * xG


# --------------------------------------------------------------------------
# W' = gamma W / sigma(W): spectral reparametrisation
# --------------------------------------------------------------------------
def power_iteration(W: np.ndarray, u: np.ndarray, v: np.ndarray):
    """One step of power iteration for W's top singular pair, in place on u
    (*M, n_in) and v (*M, n_out): v <- W^T u / |W^T u|, u <- W v / |W v|.
    Carried across training steps, it tracks sigma(W) as W moves."""
    v[...] = np.einsum("...i,...ij->...j", u, W)
    v /= np.linalg.norm(v, axis=-1, keepdims=True)
    u[...] = np.einsum("...ij,...j->...i", W, v)
    u /= np.linalg.norm(u, axis=-1, keepdims=True)


def spectral_forward(W: np.ndarray, gamma: np.ndarray, u: np.ndarray, v: np.ndarray):
    """W' = gamma W / sigma with sigma = u^T W v (the top singular value, from
    the power-iteration vectors u, v, held fixed: they carry no gradient)."""
    sigma = np.einsum("...i,...ij,...j->...", u, W, v)  # (*M,)
    factor = (gamma / sigma)[..., None, None]
    return W * factor, (W, gamma, sigma, u, v)


def spectral_backward(dout: np.ndarray, cache):
    """(dW, dgamma) of W' = gamma W / sigma, sigma = u^T W v (d sigma / dW = u v^T):
    dW = (gamma / sigma) G - (gamma / sigma^2) <G, W> u v^T,   dgamma = <G, W> / sigma."""
    W, gamma, sigma, u, v = cache
    inner = (dout * W).sum(axis=(-2, -1))  # <G, W>  (*M,)
    dW = dout * (gamma / sigma)[..., None, None]
    dW -= (gamma * inner / sigma**2)[..., None, None] * (u[..., :, None] * v[..., None, :])
    return dW, inner / sigma
