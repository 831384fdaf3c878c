"""The textbook model: README's equations, line for line, and their backward.

    X       = sum_f E_f[tokens[..., f]] + P[:T]         (B, T, D)
    Q, K, V = X W_q, X W_k, X W_v                       (B, T, d_k), (B, T, d_k), (B, T, d_v)
    scores  = Q K^T / sqrt(d_k)  (-inf where masked)    (B, T, T)
    A       = softmax(scores)  over keys                (B, T, T)
    C       = A V                                       (B, T, d_v)
    out     = C W_o                                     (B, T, D)
    H       = X + out  (or out, without the residual)   (B, T, D)
    logits  = H W_out + b_out                           (B, T, C)
    loss    = mean over target positions of -log softmax(logits)[target]

The middle lines are the blog post's: scores = Q @ K.T / sqrt(d_k), softmax,
A @ V. Nothing here is clever: every position is a query, K and V are formed,
one model at a time, numpy and nothing else. It is the page to learn the model
from, and the yardstick of attn.model.fast, which computes the same loss and
gradients faster (the tests hold every fast path to this one in float64).

The score modes (model.score: qk_norm, softcap, ...) change a line or two.
They sit behind one hook, ScoreMode at the end of this file, which hands every
input back unchanged for the paper's dot product: skip it on a first reading.
"""

from __future__ import annotations

import math

import numpy as np


def forward(params: dict, spec, batch, buffers: dict | None = None):
    """(loss, cache): the equations above, every row of every matrix.

    params: name -> array (E_<field>, E_pos, W_q, W_k, W_v, W_o, W_out, b_out and
    a score mode's own). spec: the model's settings, read by name
    (attn.model.fast.ModelSpec holds them). batch: tokens (B, T, F), targets
    (B, T) and target_mask (B, T) arrays (attn.model.fast.Batch holds them).
    buffers: sigma_reparam's power-iteration vectors."""
    tokens = batch.tokens  # (B, T, F) ints: each position's token in each field
    T = tokens.shape[1]
    mode = ScoreMode(spec, params, buffers)  # the score-mode hook (end of file): nothing for the paper's dot product

    X = sum(params[f"E_{name}"][tokens[..., f]] for f, (name, _) in enumerate(spec.fields))  # (B, T, D)
    if spec.positional == "learned":
        X = X + params["E_pos"][:T]  # (B, T, D)
    elif spec.positional == "sinusoidal":
        X = X + sinusoidal_codes(T, X.shape[-1], len(spec.fields) + 1, X.dtype)  # (B, T, D)

    W_q, W_k = mode.weights(params["W_q"], params["W_k"])  # hook: sigma_reparam's gamma W / sigma(W)
    Q = X @ W_q  # (B, T, d_k)
    K = X @ W_k  # (B, T, d_k)
    V = X @ params["W_v"]  # (B, T, d_v)
    Q, K = mode.queries_and_keys(Q, K)  # hook: qk_norm's g norm(q), g norm(k)

    scale = score_divisor(spec)  # sqrt(d_k), the paper's
    scores = Q @ K.mT / scale  # (B, T, T); K.mT is each example's K^T
    masked = masked_keys(T, spec.causal, spec.mask_self)  # (T, T): True where query i may not look at key j
    scores = mode.scores(scores, masked)  # hook: softcap, temperature, log_length
    scores = np.where(masked, -np.inf, scores)  # (B, T, T)
    A = softmax(scores)  # (B, T, T): each row sums to 1 over the keys
    C = A @ V  # (B, T, d_v)
    out = C @ params["W_o"]  # (B, T, D)
    H = X + out if spec.residual else out  # (B, T, D)
    logits = H @ params["W_out"] + params["b_out"]  # (B, T, C)

    z = logits - logits.max(axis=-1, keepdims=True)  # (B, T, C)
    log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))  # (B, T, C): log softmax(logits)
    targets = np.where(batch.target_mask, batch.targets, 0)  # (B, T): where no target, any value, even out of range
    picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # (B, T): log p(target)
    n_targets = batch.target_mask.sum()
    loss = -(picked * batch.target_mask).sum() / n_targets

    cache = dict(params=params, batch=batch, mode=mode, scale=scale, X=X, W_q=W_q, W_k=W_k, Q=Q, K=K, V=V)
    cache.update(scores=scores, A=A, C=C, H=H, probs=np.exp(log_probs), n_targets=n_targets)
    return loss, cache


def backward_to_scores(cache, spec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
    """The chain rule from the loss down to the scores, the first half of
    `backward` (attn.model.mechanism reads it alone): (dlogits, dH, dV, dS,
    the score mode's own gradients), dS the gradient of Q K^T / scale."""
    p, batch = cache["params"], cache["batch"]
    # loss = -(picked * target_mask).sum() / n_targets, picked = log softmax(logits)[target]
    onehot = np.eye(spec.n_classes)[np.where(batch.target_mask, batch.targets, 0)]  # (B, T, C)
    dlogits = (cache["probs"] - onehot) * batch.target_mask[..., None] / cache["n_targets"]  # (B, T, C)
    # logits = H @ W_out + b_out
    dH = dlogits @ p["W_out"].T  # (B, T, D)
    # out = C @ W_o, and H = X + out (or out): out's gradient is dH
    dC = dH @ p["W_o"].T  # (B, T, d_v)
    # C = A @ V
    dA = dC @ cache["V"].mT  # (B, T, T)
    dV = cache["A"].mT @ dC  # (B, T, d_v)
    # A = softmax(scores): the softmax's vector-Jacobian product, zero where masked (A = 0 there)
    A = cache["A"]
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))  # (B, T, T)
    # scores = mode.scores(scores, masked)
    dS, mode_grads = cache["mode"].scores_backward(dS)  # (B, T, T)
    return dlogits, dH, dV, dS, mode_grads


def backward(cache, spec) -> dict[str, np.ndarray]:
    """Every parameter's gradient: the chain rule taken back through `forward`,
    each step under the forward line it undoes."""
    p, batch, mode = cache["params"], cache["batch"], cache["mode"]
    X, Q, K = cache["X"], cache["Q"], cache["K"]
    dlogits, dH, dV, dS, grads = backward_to_scores(cache, spec)
    # logits = H @ W_out + b_out
    grads["W_out"] = np.einsum("btd,btc->dc", cache["H"], dlogits)  # (D, C)
    grads["b_out"] = dlogits.sum(axis=(0, 1))  # (C,)
    # out = C @ W_o
    grads["W_o"] = np.einsum("btv,btd->vd", cache["C"], dH)  # (d_v, D)
    # scores = Q @ K.mT / scale
    dQ = dS @ K / cache["scale"]  # (B, T, d_k)
    dK = dS.mT @ Q / cache["scale"]  # (B, T, d_k)
    # Q, K = mode.queries_and_keys(Q, K)
    dQ, dK, mode_grads = mode.queries_and_keys_backward(dQ, dK)  # (B, T, d_k) each
    grads.update(mode_grads)
    # Q = X @ W_q,  K = X @ W_k,  V = X @ W_v
    grads["W_q"] = np.einsum("btd,btk->dk", X, dQ)  # (D, d_k)
    grads["W_k"] = np.einsum("btd,btk->dk", X, dK)  # (D, d_k)
    grads["W_v"] = np.einsum("btd,btv->dv", X, dV)  # (D, d_v)
    dX = dQ @ cache["W_q"].T + dK @ cache["W_k"].T + dV @ p["W_v"].T  # (B, T, D)
    # W_q, W_k = mode.weights(W_q, W_k)
    grads["W_q"], grads["W_k"], mode_grads = mode.weights_backward(grads["W_q"], grads["W_k"])
    grads.update(mode_grads)
    # H = X + out
    if spec.residual:
        dX = dX + dH  # (B, T, D)
    # X = sum_f E_f[tokens[..., f]] + E_pos[:T]: each row's gradient adds up where its id was looked up
    for f, (name, vocab) in enumerate(spec.fields):
        grads[f"E_{name}"] = np.zeros_like(p[f"E_{name}"])  # (vocab, D)
        np.add.at(grads[f"E_{name}"], batch.tokens[..., f], dX)
    if spec.positional == "learned":
        grads["E_pos"] = np.zeros_like(p["E_pos"])  # (n_positions, D)
        grads["E_pos"][: X.shape[1]] = dX.sum(axis=0)
    return {name: grads[name] for name in p}


def loss_and_grads(params: dict, spec, batch, buffers: dict | None = None):
    """(loss, grads, cache), as attn.model.fast.loss_and_grads returns them."""
    loss, cache = forward(params, spec, batch, buffers)
    return loss, backward(cache, spec), cache


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax over the last axis, the row max subtracted first (exp stays finite; -inf gives 0)."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def score_divisor(spec) -> float:
    """What Q K^T is divided by: sqrt(d_k), the paper's (model.scale sqrt), 1
    (none) or d_k (linear). Three score modes fix their own: mup d_k,
    temperature 1 (exp(theta) scales instead), log_length sqrt(d_k)."""
    d_k = spec.d_k
    scale = {"sqrt": math.sqrt(d_k), "none": 1.0, "linear": float(d_k)}[spec.scale]
    return {"mup": float(d_k), "temperature": 1.0, "log_length": math.sqrt(d_k)}.get(spec.score, scale)


def masked_keys(T: int, causal: bool, mask_self: bool) -> np.ndarray:
    """(T, T) bools, True where query i may not look at key j: j > i if causal, j = i if mask_self."""
    masked = np.zeros((T, T), dtype=bool)
    if causal:
        masked |= np.triu(np.ones((T, T), dtype=bool), k=1)  # keys after the query
    if mask_self:
        masked |= np.eye(T, dtype=bool)  # the query's own position
    return masked


def sinusoidal_codes(T: int, D: int, n_sources: int, dtype) -> np.ndarray:
    """Fixed sin/cos position codes (Vaswani et al. 3.5), (T, D), scaled as
    every embedding summed into X is: each component of variance 1/n_sources on average."""
    position = np.arange(T)[:, None]  # (T, 1)
    freq = np.exp(-np.log(10000.0) * (np.arange(0, D, 2) / D))  # (ceil(D/2),)
    table = np.zeros((T, D))
    table[:, 0::2] = np.sin(position * freq)
    table[:, 1::2] = np.cos(position * freq[: D // 2])
    table *= n_sources**-0.5 * np.sqrt(2.0)  # sin^2 + cos^2 = 1 per pair: mean square 1/2 per component
    return table.astype(dtype)


# ------------------------------------------------------------------------------------------------------
# The score-mode hook: skip it on a first reading. For the paper's dot product (model.score dot), and
# for mup, whose only change is the divisor, every method hands its input back unchanged.
# ------------------------------------------------------------------------------------------------------
NORM_EPS = 1e-6  # qk_norm: added to the mean square (or variance) before the square root


class ScoreMode:
    """The fixes for the attention-logit scale (attn.model.scores), each a line or two of the forward:

        sigma_reparam  W <- gamma W / sigma(W),  sigma = u^T W v   for W_q and W_k      (weights)
        qk_norm        q <- g_q norm(q),  k <- g_k norm(k)   (RMSNorm or LayerNorm)  (queries_and_keys)
        softcap        scores <- c tanh(scores / c)                                     (scores)
        temperature    scores <- exp(theta) scores
        log_length     scores <- s_len ln(n_i) scores,  n_i the keys query i may see

    Each forward method keeps what its backward needs on the object; each
    backward returns the gradients of its inputs, then the mode's own parameters'."""

    def __init__(self, spec, params: dict, buffers: dict | None):
        self.score, self.spec, self.params, self.buffers = spec.score, spec, params, buffers

    # W_q, W_k = mode.weights(W_q, W_k)
    def weights(self, W_q: np.ndarray, W_k: np.ndarray):
        if self.score != "sigma_reparam":
            return W_q, W_k
        self.W = {"q": W_q, "k": W_k}
        self.sigma = {w: self.buffers[f"u_{w}"] @ W @ self.buffers[f"v_{w}"] for w, W in self.W.items()}  # sigma(W)
        return W_q * (self.params["gamma_q"] / self.sigma["q"]), W_k * (self.params["gamma_k"] / self.sigma["k"])

    def weights_backward(self, dW_q: np.ndarray, dW_k: np.ndarray):
        if self.score != "sigma_reparam":
            return dW_q, dW_k, {}
        dW_q, dgamma_q = self._reparametrised_backward(dW_q, "q")
        dW_k, dgamma_k = self._reparametrised_backward(dW_k, "k")
        return dW_q, dW_k, {"gamma_q": dgamma_q, "gamma_k": dgamma_k}

    def _reparametrised_backward(self, dW_new: np.ndarray, w: str):
        """dW = (gamma / sigma) dW' - (gamma / sigma^2) <dW', W> u v^T (d sigma / dW = u v^T, the
        vectors held fixed: they carry no gradient), and dgamma = <dW', W> / sigma."""
        W, sigma, gamma = self.W[w], self.sigma[w], self.params[f"gamma_{w}"]
        inner = (dW_new * W).sum()  # <dW', W>
        dW = dW_new * (gamma / sigma) - (gamma * inner / sigma**2) * np.outer(
            self.buffers[f"u_{w}"], self.buffers[f"v_{w}"]
        )
        return dW, inner / sigma

    # Q, K = mode.queries_and_keys(Q, K)
    def queries_and_keys(self, Q: np.ndarray, K: np.ndarray):
        if self.score != "qk_norm":
            return Q, K
        Q, self.query_norm = self._norm(Q, self.params.get("g_q"))
        K, self.key_norm = self._norm(K, self.params.get("g_k"))
        return Q, K

    def _norm(self, Z: np.ndarray, g: np.ndarray | None):
        """(g n, (n, r, g)) for Z's rows normalised by r = 1 / sqrt(mean square over d_k + eps):
        rms n = Z r;  layer n = (Z - mean(Z)) r. g: the gain, (d_k,) or (1,), or None (none).
        The mean square is a sum over d_k: q, k may come carried narrower, as the coordinates
        of a width-free head (attn.model.widthfree), whose entries beyond are zeros."""
        centred = Z - Z.mean(axis=-1, keepdims=True) if self.spec.qk_norm == "layer" else Z  # (B, T, d_k)
        r = 1.0 / np.sqrt((centred * centred).sum(axis=-1, keepdims=True) / self.spec.d_k + NORM_EPS)  # (B, T, 1)
        n = centred * r  # (B, T, d_k)
        return (n if g is None else g * n), (n, r, g)

    def queries_and_keys_backward(self, dQ: np.ndarray, dK: np.ndarray):
        if self.score != "qk_norm":
            return dQ, dK, {}
        dQ, dg_q = self._norm_backward(dQ, *self.query_norm)
        dK, dg_k = self._norm_backward(dK, *self.key_norm)
        return dQ, dK, {} if dg_q is None else {"g_q": dg_q, "g_k": dg_k}

    def _norm_backward(self, dout: np.ndarray, n: np.ndarray, r: np.ndarray, g: np.ndarray | None):
        """(dZ, dg) of out = g n: with dn = dout g and means over d_k,
        dZ = r (dn - n mean(dn n))  (rms),   r (dn - mean(dn) - n mean(dn n))  (layer);   dg = sum of dout n."""
        dn = dout if g is None else dout * g  # (B, T, d_k)
        dZ = dn - n * (dn * n).sum(axis=-1, keepdims=True) / self.spec.d_k
        if self.spec.qk_norm == "layer":
            dZ = dZ - dn.mean(axis=-1, keepdims=True)
        if g is None:
            return r * dZ, None
        dg = (dout * n).sum(axis=(0, 1))  # (d_k,)
        return r * dZ, dg if dg.shape == g.shape else dg.sum(keepdims=True)  # one gain (1,): summed over d_k

    # scores = mode.scores(scores, masked)
    def scores(self, S: np.ndarray, masked: np.ndarray) -> np.ndarray:
        self.before = S  # (B, T, T)
        if self.score == "softcap":
            self.capped = np.tanh(S / self.spec.softcap)  # (B, T, T)
            return self.spec.softcap * self.capped
        if self.score == "temperature":
            self.factor = np.exp(self.params["theta"])
        elif self.score == "log_length":
            self.log_n = np.log((~masked).sum(axis=-1)).astype(S.dtype)[:, None]  # (T, 1): ln of the keys row i sees
            self.factor = self.params["length_scale"] * self.log_n  # (T, 1)
        else:
            return S
        return self.factor * S

    def scores_backward(self, dS: np.ndarray):
        if self.score == "softcap":
            return dS * (1 - self.capped * self.capped), {}
        if self.score == "temperature":
            return dS * self.factor, {"theta": (dS * self.before).sum() * self.factor}
        if self.score == "log_length":
            return dS * self.factor, {"length_scale": (dS * self.before * self.log_n).sum()}
        return dS, {}
