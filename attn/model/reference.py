"""The textbook model: README's equations, line for line, and their backward.

    X      = sum_f E_f[tokens[..., f]] + P[:T]          (B, T, D)
    Q, K, V = X W_q, X W_k, X W_v                        (B, T, d_k), (B, T, d_k), (B, T, d_v)
    S      = s Q K^T    (-inf above the diagonal if causal, on it if mask_self)   (B, T, T)
    A      = softmax(S)  over keys                       (B, T, T)
    C      = A V                                         (B, T, d_v)
    out    = C W_o                                       (B, T, D)
    H      = X + out    (or out, without the residual)   (B, T, D)
    logits = H W_out + b_out                             (B, T, C)
    loss   = mean over target positions of -log softmax(logits)[target]

The middle three lines are the blog post's: scores = Q K^T / sqrt(d_k),
softmax, A V. Nothing here is clever: every position is a query, K and V
are formed, one model at a time. It is the page to learn the model from,
and the yardstick of attn.model.fast, which computes the same loss and
gradients faster (the tests hold every fast path to this, in float64).

A score mode (attn.model.scores) changes one line or two: W_q, W_k become
gamma W / sigma(W) (sigma_reparam); Q and K are normalised (qk_norm); S is
capped, or multiplied by exp(theta) or by s_len ln(n) (softcap,
temperature, log_length); s is 1/d_k (mup). The backward undoes each in turn.
"""

from __future__ import annotations

import numpy as np

from attn.model import fast, scores
from attn.model.fast import Batch, ModelSpec, sinusoidal_positions


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax over the last axis, the row max subtracted first."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def forward(params: dict, spec: ModelSpec, batch: Batch, buffers: dict | None = None):
    """(loss, cache): the equations above, every row of every matrix
    (buffers: sigma_reparam's power-iteration vectors)."""
    tokens, T = batch.tokens, batch.tokens.shape[1]
    X = sum(params[f"E_{name}"][tokens[..., f]] for f, (name, _) in enumerate(spec.fields))
    if spec.positional == "learned":
        X = X + params["E_pos"][:T]
    elif spec.positional == "sinusoidal":
        X = X + sinusoidal_positions(T, spec.d_model, spec.n_sources**-0.5, spec.dtype)
    W_q, W_k, spectral = params["W_q"], params["W_k"], None
    if spec.score == "sigma_reparam":
        (W_q, query), (W_k, key) = (
            scores.spectral_forward(params[f"W_{w}"], params[f"gamma_{w}"], buffers[f"u_{w}"], buffers[f"v_{w}"])
            for w in "qk"
        )
        spectral = (query, key)
    Q, K, V = X @ W_q, X @ W_k, X @ params["W_v"]
    norms = None
    if spec.score == "qk_norm":
        gains = (None, None) if spec.qk_norm_gain == "none" else (params["g_q"], params["g_k"])
        (Q, query_norm), (K, key_norm) = (
            scores.norm_forward(Z, g, spec.qk_norm, spec.norm_width) for Z, g in zip((Q, K), gains)
        )
        norms = (query_norm, key_norm)
    masked = np.zeros((T, T), dtype=bool)  # True where query i may not look at key j
    if spec.causal:
        masked |= np.triu(np.ones((T, T), dtype=bool), k=1)  # keys after the query
    if spec.mask_self:
        masked |= np.eye(T, dtype=bool)  # the query's own position
    masked = masked if masked.any() else None
    S, transform = scores.transform_forward(
        spec.score_scale * Q @ K.transpose(0, 2, 1), fast.head_score(params, spec), masked, slice(None)
    )
    if masked is not None:
        S = np.where(masked, -np.inf, S)
    A = softmax(S)
    C = A @ V
    out = C @ params["W_o"]
    H = X + out if spec.residual else out
    logits = H @ params["W_out"] + params["b_out"]
    z = logits - logits.max(axis=-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    targets = np.where(batch.target_mask, batch.targets, 0)  # Batch: any value where no target, even out of range
    picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # (B, T)
    n_targets = batch.target_mask.sum()
    loss = -(picked * batch.target_mask).sum() / n_targets
    cache = dict(
        params=params,
        batch=batch,
        X=X,
        Q=Q,
        K=K,
        V=V,
        S=S,
        A=A,
        C=C,
        H=H,
        W_q=W_q,
        W_k=W_k,
        probs=np.exp(log_probs),
        n_targets=n_targets,
        transform=transform,
        norms=norms,
        spectral=spectral,
    )
    return loss, cache


def backward_to_scores(cache, spec: ModelSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
    """The chain rule from the loss down to the scores (the first half of
    `backward`), with no weight's gradient on the way (attn.model.mechanism
    needs none): (dlogits; dH; dV; dS, the gradient of S = s Q K^T before the
    mode's map of it; the gradients of a score mode's own parameters)."""
    p, batch = cache["params"], cache["batch"]
    onehot = np.eye(spec.n_classes)[np.where(batch.target_mask, batch.targets, 0)]  # (B, T, C); see forward
    dlogits = (cache["probs"] - onehot) * batch.target_mask[..., None] / cache["n_targets"]
    dH = dlogits @ p["W_out"].T
    dC = dH @ p["W_o"].T
    A = cache["A"]
    dA = dC @ cache["V"].transpose(0, 2, 1)
    dV = A.transpose(0, 2, 1) @ dC
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))
    dS, mode_grads = scores.transform_backward(dS, cache["transform"])  # the gradient of S = s Q K^T
    return dlogits, dH, dV, dS, mode_grads


def backward(cache, spec: ModelSpec) -> dict[str, np.ndarray]:
    """Every parameter's gradient, the chain rule taken backwards through forward:

        dlogits = (softmax(logits) - onehot(target)) * mask / n_targets
        dH = dlogits W_out^T                dW_out = H^T dlogits,  db_out = sum dlogits
        dC = dH W_o^T                       dW_o = C^T dH
        dA = dC V^T                         dV = A^T dC
        dS = A * (dA - sum(dA * A, -1))     (the softmax's vector-Jacobian product)
        dQ = s dS K,   dK = s dS^T Q
        dX = dH (residual) + dQ W_q^T + dK W_k^T + dV W_v^T
        dW_q = X^T dQ,  dW_k = X^T dK,  dW_v = X^T dV
        dE_f[id] += dX at every position holding id,   dE_pos[:T] = sum over the batch of dX

    with a score mode's map of S, norm of Q and K, or reparametrisation of
    W_q and W_k undone at its place in that chain (attn.model.scores' backwards).
    The first five lines are backward_to_scores, but for the weights' gradients.
    """
    p, batch = cache["params"], cache["batch"]
    X, Q, K = cache["X"], cache["Q"], cache["K"]
    s = spec.score_scale
    dlogits, dH, dV, dS, grads = backward_to_scores(cache, spec)
    grads.update(
        W_out=np.einsum("btd,btc->dc", cache["H"], dlogits),
        b_out=dlogits.sum(axis=(0, 1)),
        W_o=np.einsum("btv,btd->vd", cache["C"], dH),
    )
    dQ = s * dS @ K
    dK = s * dS.transpose(0, 2, 1) @ Q
    if cache["norms"] is not None:
        (dQ, grads["g_q"]), (dK, grads["g_k"]) = (
            scores.norm_backward(dZ, n) for dZ, n in zip((dQ, dK), cache["norms"])
        )
    grads.update(
        W_q=np.einsum("btd,btk->dk", X, dQ), W_k=np.einsum("btd,btk->dk", X, dK), W_v=np.einsum("btd,btv->dv", X, dV)
    )
    if cache["spectral"] is not None:
        for w, spectral in zip("qk", cache["spectral"]):
            grads[f"W_{w}"], grads[f"gamma_{w}"] = scores.spectral_backward(grads[f"W_{w}"], spectral)
    dX = dQ @ cache["W_q"].T + dK @ cache["W_k"].T + dV @ p["W_v"].T
    if spec.residual:
        dX = dX + dH
    for f, (name, vocab) in enumerate(spec.fields):
        dE = np.zeros((vocab, spec.d_model), dtype=dX.dtype)
        np.add.at(dE, batch.tokens[..., f], dX)
        grads[f"E_{name}"] = dE
    if spec.positional == "learned":
        dE_pos = np.zeros((spec.n_positions, spec.d_model), dtype=dX.dtype)
        dE_pos[: X.shape[1]] = dX.sum(axis=0)
        grads["E_pos"] = dE_pos
    return {name: grads[name] for name in spec.param_names}


def loss_and_grads(params: dict, spec: ModelSpec, batch: Batch, buffers: dict | None = None):
    """(loss, grads, cache), as attn.model.fast.loss_and_grads returns them."""
    loss, cache = forward(params, spec, batch, buffers)
    return loss, backward(cache, spec), cache
