"""The one-head attention model, composed from `attn.model.head`.

For a batch of token ids with F fields per position (retrieval: key and
value; copy: one token):

    X      = sum_f E_f[tokens[..., f]] + P[:T]        (B, T, D)
    Q, K, V = X W_q, X W_k, X W_v                      (B, T, d_k), (B, T, d_k), (B, T, d_v)
    A      = softmax(s * Q K^T  [+ causal and/or self -inf mask])  (B, T, T)
    out    = (A V) W_o                                 (B, T, D)
    H      = X + out   (residual)   or   out           (B, T, D)
    logits = H W_out + b_out                           (B, T, C)
    loss   = mean over target positions of -log softmax(logits)[target]

s is 1/sqrt(d_k) ("sqrt"), 1 ("none") or 1/d_k ("linear"); see
`attn.model.head.SCORE_SCALES`. Only positions with a target feed the loss, so
`forward` computes the query side (Q, A, out, H, logits, loss) at those P
positions alone: A is (B, P, T) and out, H, logits (B, P, ·); see `forward`.
attn.model.reference computes the equations exactly as written, every row; the
tests hold this model to it.

A stack of M models of one shape (seeds, rates, scales: attn.train.stack's
stacked runs) is the same code with a leading member axis on every
parameter, (M, ...), and on the batch, tokens (M, B, T, F); the loss,
accuracy and diagnostics then come one per member. See attn.model.head.

Initialisation (all weights zero-mean Gaussian; `gain`s from the spec):
    E_f, E_pos ~ N(0, 1/n_sources)   n_sources = F + 1 (the fields and the
                                     positions, learned or sinusoidal, which
                                     are scaled alike; F with positional
                                     none), so each component of X has
                                     variance ~1
    W_q, W_k   ~ N(0, qk_gain^2 / D) so each component of q, k has variance
                                     qk_gain^2 (the paper's footnote 4 at gain 1)
    W_v        ~ N(0, v_gain^2 / D)
    W_o        ~ N(0, o_gain^2 / d_v)
    W_out      ~ N(0, readout_gain^2 / D),  b_out = 0

Hence at initialisation Var(score) ~ d_k * qk_gain^4 * s^2.

Parameters are a dict name -> array; gradients a dict with the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

import numpy as np

from attn.model import head, pairs, scores, widthfree


@dataclass(frozen=True)
class ModelSpec:
    """Everything that fixes the model's shapes and arithmetic."""

    fields: tuple[tuple[str, int], ...]  # (field name, vocabulary size) per token field
    n_positions: int  # T: sequence length
    n_classes: int  # C: output vocabulary
    d_model: int = 64
    d_k: int = 32
    d_v: int = 32
    scale: str = "sqrt"
    causal: bool = False
    mask_self: bool = False  # each query's own position is masked out of its keys (-inf before the softmax)
    residual: bool = True
    positional: str = "learned"  # learned | sinusoidal | none
    qk_gain: float = 1.0
    v_gain: float = 1.0
    o_gain: float = 1.0
    readout_gain: float = 1.0
    dtype: str = "float32"
    score: str = "dot"  # a mode of attn.model.scores.SCORE_MODES
    qk_norm: str = "rms"  # qk_norm: rms | layer
    qk_norm_gain: str = "vector"  # qk_norm: vector | scalar | none
    softcap: float = 10.0  # softcap: c
    temperature_init: float | None = None  # temperature: theta at init; None: ln of `scale`'s s
    length_scale_init: float | None = None  # log_length: s_len at init; None: 1 / ln T
    mup_zero_init_q: bool = True  # mup: W_q starts at zero
    width_free: bool = False  # carry W_q, W_k (W_v, W_o) wider than 2 d_model as coordinates (attn.model.widthfree)

    @property
    def score_scale(self) -> float:
        """The fixed s of s q.k: `scale`'s, except 1/d_k for mup, 1 for a learned
        temperature (exp(theta) is its s) and 1/sqrt(d_k) for log_length."""
        if self.score == "mup":
            return 1.0 / self.d_k
        if self.score == "temperature":
            return 1.0
        return head.score_scale("sqrt" if self.score == "log_length" else self.scale, self.d_k)

    @property
    def normed(self) -> bool:
        """Whether q and k pass through a norm (qk_norm): the head's bilinear form is then its Gram form."""
        return self.score in scores.NORMED_MODES

    @property
    def norm_width(self) -> int | None:
        """The d_k a qk_norm's mean runs over when q, k are carried narrower (width-free), else None."""
        return self.d_k if self.k_width != self.d_k else None

    @property
    def k_width(self) -> int:
        """The width W_q, W_k are carried at: d_k, or 2 d_model when width-free and d_k is wider."""
        return widthfree.carried_width(self.d_model, self.d_k) if self.width_free else self.d_k

    @property
    def v_width(self) -> int:
        """The width W_v, W_o are carried at: d_v, or 2 d_model when width-free and d_v is wider."""
        return widthfree.carried_width(self.d_model, self.d_v) if self.width_free else self.d_v

    @cached_property
    def param_names(self) -> tuple[str, ...]:
        """The parameters' names in param_shapes' order (asked every backward: kept on the spec)."""
        return tuple(param_shapes(self))

    @cached_property
    def embedding_names(self) -> tuple[str, ...]:
        """The tables summed into X, in order: each field's, then the learned positions' (E_pos)."""
        return (*(f"E_{name}" for name, _ in self.fields), *(("E_pos",) if self.positional == "learned" else ()))

    @property
    def n_sources(self) -> int:
        """How many embeddings are summed into X: the fields', and the positions' unless none."""
        return len(self.fields) + (self.positional != "none")


@dataclass(frozen=True)
class Batch:
    """One batch of examples, as a task produces it."""

    tokens: np.ndarray  # (B, T, F) int: token id of each field at each position
    targets: np.ndarray  # (B, T) int: class to predict (any value where no target)
    target_mask: np.ndarray  # (B, T) bool: which positions carry a target
    target_key: np.ndarray  # (B, T) int: position the query should attend to, -1 if none


def param_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every trainable parameter, in a stable order: the
    embeddings, the head, the readout, then the score mode's own
    (score_param_shapes)."""
    D = spec.d_model
    shapes = {f"E_{name}": (vocab, D) for name, vocab in spec.fields}
    if spec.positional == "learned":
        shapes["E_pos"] = (spec.n_positions, D)
    shapes.update(
        W_q=(D, spec.k_width),
        W_k=(D, spec.k_width),
        W_v=(D, spec.v_width),
        W_o=(spec.v_width, D),
        W_out=(D, spec.n_classes),
        b_out=(spec.n_classes,),
    )
    return {**shapes, **score_param_shapes(spec.score, spec.qk_norm_gain, spec.d_k)}


def score_param_shapes(score: str, qk_norm_gain: str, d_k: int) -> dict[str, tuple[int, ...]]:
    """The parameters a score mode adds: qk_norm's gains g_q, g_k (d_k,) or
    (1,) (none without a gain); temperature's theta (); log_length's
    length_scale (); sigma_reparam's gamma_q, gamma_k ()."""
    if score == "qk_norm" and qk_norm_gain != "none":
        width = d_k if qk_norm_gain == "vector" else 1
        return {"g_q": (width,), "g_k": (width,)}
    return {
        "temperature": {"theta": ()},
        "log_length": {"length_scale": ()},
        "sigma_reparam": {"gamma_q": (), "gamma_k": ()},
    }.get(score, {})


def buffer_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """State the model carries across steps that is not trained: sigma_reparam's
    power-iteration vectors u (D,), v (k_width,) for W_q and for W_k; width-free,
    v is carried as its coordinates v_c = Q v (2D,), as W_q, W_k are."""
    if spec.score != "sigma_reparam":
        return {}
    return {"u_q": (spec.d_model,), "v_q": (spec.k_width,), "u_k": (spec.d_model,), "v_k": (spec.k_width,)}


POWER_ITERATIONS_AT_INIT = 15  # sigma_reparam: power-iteration steps before the first training step
SATURATED = 0.99  # a query row is saturated when its largest attention weight exceeds this


def init_params(spec: ModelSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Draw initial parameters (see the module docstring for the scheme)."""
    dtype = np.dtype(spec.dtype)
    D = spec.d_model
    std = {f"E_{name}": spec.n_sources**-0.5 for name, _ in spec.fields}
    std.update(
        E_pos=spec.n_sources**-0.5,
        W_q=spec.qk_gain / np.sqrt(D),
        W_k=spec.qk_gain / np.sqrt(D),
        W_v=spec.v_gain / np.sqrt(D),
        W_o=spec.o_gain / np.sqrt(spec.d_v),
        W_out=spec.readout_gain / np.sqrt(D),
        b_out=0.0,
    )
    if spec.score == "mup" and spec.mup_zero_init_q:
        std["W_q"] = 0.0  # the coordinates of a zero W_q are zero (its rows add nothing to the basis)
    params = {}
    mode = score_param_shapes(spec.score, spec.qk_norm_gain, spec.d_k)
    circuits = {"W_q": ("W_k", spec.d_k, spec.k_width), "W_v": ("W_o", spec.d_v, spec.v_width)}
    for name, shape in param_shapes(spec).items():
        if name in mode or (name in ("W_k", "W_o") and name in params):
            continue  # the mode's own take no random draw: every mode starts from the same weights
        second, width, carried = circuits.get(name, (None, 0, 0))
        if width == carried:
            params[name] = rng.standard_normal(shape, dtype=dtype) * dtype.type(std[name])
        else:
            second_shape = (spec.d_model, width) if second == "W_k" else (width, spec.d_model)
            params[name], params[second] = _initial_coordinates(spec, rng, std[name], std[second], width, second_shape)
            if second == "W_o":
                params[second] = np.ascontiguousarray(params[second].T)  # W_o carried as C_o^T (2D, D)
    if spec.score == "mup" and spec.mup_zero_init_q:
        params["W_q"][...] = 0  # +0 in every entry (a draw times 0 leaves -0 where it was negative)
    initial = {
        "g_q": 1.0,
        "g_k": 1.0,
        "gamma_q": 1.0,
        "gamma_k": 1.0,
        "theta": spec.temperature_init
        if spec.temperature_init is not None
        else np.log(head.score_scale(spec.scale, spec.d_k)),
        "length_scale": spec.length_scale_init
        if spec.length_scale_init is not None
        else 1.0 / np.log(spec.n_positions),
    }
    for name, shape in mode.items():
        params[name] = np.full(shape, initial[name], dtype=dtype)
    return params


def _initial_coordinates(
    spec: ModelSpec,
    rng: np.random.Generator,
    std_first: float,
    std_second: float,
    width: int,
    second_shape: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """The coordinates (C_1, C_2), each (D, 2D), of a circuit's two weights
    (W_q and W_k; W_v and W_o^T) of rows of width `width`, with entries of
    standard deviation std_first, std_second: drawn as the materialized
    model draws them (the second of `second_shape`: (D, d_k) for W_k,
    (d_v, D) for W_o) and orthonormalised while they fit, else by bartlett
    (attn.model.widthfree)."""
    dtype, D = np.dtype(spec.dtype), spec.d_model
    if widthfree.sampled_directly(D, width):
        first = rng.standard_normal((D, width), dtype=dtype) * dtype.type(std_first)
        second = rng.standard_normal(second_shape, dtype=dtype) * dtype.type(std_second)
        return widthfree.coordinates(first, second if second_shape[0] == D else second.T, basis=False)[:2]
    R = widthfree.bartlett(np.repeat([std_first, std_second], D), width, rng, dtype)  # (2D, 2D)
    return R[:D].copy(), R[D:].copy()


def describe_carried_weights(spec: ModelSpec) -> dict[str, str]:
    """How each circuit's weights are carried and were first drawn, for a run's
    provenance: `materialized` (d_k-wide, as written), `coordinates of the
    drawn weights` (attn.model.widthfree: the same initial model as the
    materialized one for the seed) or `coordinates drawn by bartlett`."""

    def how(width: int, carried: int) -> str:
        if width == carried:
            return "materialized"
        if widthfree.sampled_directly(spec.d_model, width):
            return f"width-free: coordinates ({carried}) of the drawn weights ({width})"
        return f"width-free: coordinates ({carried}) drawn by bartlett (width {width})"

    return {"W_q, W_k": how(spec.d_k, spec.k_width), "W_v, W_o": how(spec.d_v, spec.v_width)}


def materialize_params(params: dict, spec: ModelSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The parameters of a width-free model with its d_k-wide weights formed,
    W = C Q (attn.model.widthfree.materialize): for figures, export and
    checks. `rng`: a generator in the state init_params started from (the
    run's init generator, fresh from its seed), from which the basis Q is
    drawn again; only while the initial weights were drawn in full
    (widthfree.sampled_directly), since a bartlett draw has no basis."""
    out, full = dict(params), replace(spec, width_free=False)
    initial = init_params(full, rng)
    for first, second, width, carried in (
        ("W_q", "W_k", spec.d_k, spec.k_width),
        ("W_v", "W_o", spec.d_v, spec.v_width),
    ):
        if width == carried:
            continue
        if not widthfree.sampled_directly(spec.d_model, width):
            raise ValueError(f"{first}, {second} of width {width} were drawn by bartlett: no basis to form them on")
        transposed = second == "W_o"  # W_o is carried as C_o^T, its rows W_o^T's
        basis = widthfree.coordinates(initial[first], initial[second].T if transposed else initial[second])[2]
        out[first] = widthfree.materialize(params[first], basis)  # (*M, D, width)
        formed = widthfree.materialize(params[second].swapaxes(-1, -2) if transposed else params[second], basis)
        out[second] = formed.swapaxes(-1, -2) if transposed else formed
    return out


def init_buffers(spec: ModelSpec, params: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """sigma_reparam's u, v: random unit vectors, then POWER_ITERATIONS_AT_INIT
    steps toward W_q's and W_k's top singular pairs ({} for other modes).

    Width-free, v is carried as coordinates (buffer_shapes). While the initial
    weights are drawn in full (widthfree.sampled_directly) v is drawn d_k wide,
    as the materialized model draws it, so that u_k is the same draw and the run
    the same. Its coordinates Q v are not formed (Q is not kept), nor needed:
    each step sets v from u before reading it (scores.power_iteration), so v
    starts at the first step's value, C^T u / |C^T u|. Beyond (bartlett) v is
    drawn 2D wide, the distribution of Q v: as the weights, not the
    materialized run's draw."""
    buffers = {}
    drawn_width = spec.d_k if widthfree.sampled_directly(spec.d_model, spec.d_k) else spec.k_width  # v's draw
    for name, shape in buffer_shapes(spec).items():
        vector = rng.standard_normal((drawn_width,) if name.startswith("v") else shape).astype(spec.dtype)
        if vector.shape != shape:  # drawn d_k wide, carried as coordinates: the first step's v instead
            vector = buffers["u" + name[1:]] @ params["W" + name[1:]]  # (2D,): C^T u
        buffers[name] = vector / np.linalg.norm(vector)
    for _ in range(POWER_ITERATIONS_AT_INIT if buffers else 0):
        advance_buffers(params, buffers, spec)
    return buffers


def advance_buffers(params: dict, buffers: dict, spec: ModelSpec) -> None:
    """One power-iteration step for each reparametrised weight, in place (once per training step)."""
    if spec.score == "sigma_reparam":
        scores.power_iteration(params["W_q"], buffers["u_q"], buffers["v_q"])
        scores.power_iteration(params["W_k"], buffers["u_k"], buffers["v_k"])


@lru_cache(maxsize=32)
def sinusoidal_positions(T: int, D: int, std: float, dtype: str) -> np.ndarray:
    """Fixed sin/cos position codes (Vaswani et al. 3.5), rescaled so each
    component has standard deviation `std` on average. Read-only (T, D)."""
    position = np.arange(T)[:, None]
    freq = np.exp(-np.log(10000.0) * (np.arange(0, D, 2) / D))
    table = np.zeros((T, D))
    table[:, 0::2] = np.sin(position * freq)
    table[:, 1::2] = np.cos(position * freq[: D // 2])
    table *= std * np.sqrt(2.0)  # sin^2 + cos^2 = 1 per pair: mean square 1/2 per component
    table = table.astype(dtype)
    table.flags.writeable = False
    return table


@lru_cache(maxsize=32)
def key_mask(T: int, causal: bool, mask_self: bool) -> np.ndarray | None:
    """Boolean (T, T), True where query i may NOT look at key j: j > i if
    causal, j = i if mask_self (None if neither). Read-only, one per setting."""
    if not (causal or mask_self):
        return None
    mask = head.causal_mask(T) if causal else np.zeros((T, T), dtype=bool)
    if mask_self:
        mask = mask | np.eye(T, dtype=bool)
        mask.flags.writeable = False
    return mask


def target_positions(batch: Batch):
    """Positions along T where some example of the batch has a target: a
    slice of all T if every position has one, else an index array."""
    with_target = batch.target_mask.reshape(-1, batch.target_mask.shape[-1]).any(axis=0)  # (T,)
    return slice(None) if with_target.all() else with_target.nonzero()[0]


def embedding_tables(params: dict, spec: ModelSpec, T: int) -> list[np.ndarray]:
    """The tables summed into X: those of spec.embedding_names, each (*M, V_s, D),
    then the fixed sinusoidal positions (T, D), shared by every member, if any."""
    tables = [params[name] for name in spec.embedding_names]
    if spec.positional == "sinusoidal":
        tables.append(sinusoidal_positions(T, spec.d_model, spec.n_sources**-0.5, spec.dtype))
    return tables


def source_ids(tokens: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """The row of each table (embedding_tables) summed at each position:
    (S, *M, B, T), the token ids of each field, then the position itself
    (0..T-1) unless positional is none."""
    fields = tokens.transpose(tokens.ndim - 1, *range(tokens.ndim - 1))  # (F, *M, B, T)
    if spec.positional == "none":
        return fields
    ids = np.empty((len(fields) + 1, *fields.shape[1:]), dtype=tokens.dtype)
    ids[:-1] = fields
    ids[-1] = np.arange(tokens.shape[-2])  # every example's positions
    return ids


def forward(
    params: dict,
    spec: ModelSpec,
    batch: Batch,
    all_queries: bool = False,
    scale=None,
    association: str | None = None,
    buffers: dict | None = None,
    lookup: bool | None = None,
):
    """Loss of the batch and the cache that `backward` and `diagnostics` read.

    Only positions with a target feed the loss (retrieval: the query, one
    of T), so the query side of the head (Q, scores, attention, output),
    the residual, the readout and the cross-entropy are computed at those P
    positions alone (cache["positions"]); keys and values at all T. With
    `all_queries`, at every position: the attention map of every row (for
    figures), and the same loss. `scale` is the score scale, spec.score_scale
    by default, one per member for a stack; `association` forces the head's
    (attn.model.head.attention_forward; default: the cheaper), and `lookup`
    whether it takes X's products through the embedding tables (default: when
    cheaper); `buffers`: the score mode's state (init_buffers), for sigma_reparam.
    """
    T = batch.tokens.shape[-2]
    x, embed_cache = pairs.embedding_forward(
        source_ids(batch.tokens, spec), embedding_tables(params, spec, T), positional=spec.positional != "none"
    )  # (*M, B, T, D) LazyEmbeddings
    positions = slice(None) if all_queries else target_positions(batch)
    mask = key_mask(T, spec.causal, spec.mask_self)
    W_q, W_k, spectral = params["W_q"], params["W_k"], None
    if spec.score == "sigma_reparam":  # W' = gamma W / sigma(W)
        (W_q, query), (W_k, key) = (
            scores.spectral_forward(params[f"W_{w}"], params[f"gamma_{w}"], buffers[f"u_{w}"], buffers[f"v_{w}"])
            for w in "qk"
        )
        spectral = (query, key)
    out, attn, attn_cache = head.attention_forward(
        x,
        W_q,
        W_k,
        params["W_v"],
        params["W_o"],
        spec.score_scale if scale is None else scale,
        mask,
        positions,
        association,
        head_score(params, spec),
        lookup,
    )
    h = out  # (*M, B, P, D)
    if spec.residual:
        h += attn_cache["x_queries"]  # H = X + out, in place: out is the head's own fresh array
    logits, readout_cache = pairs.linear_forward(h, params["W_out"], params["b_out"])  # (*M, B, P, C)
    loss, ce_cache = pairs.cross_entropy_forward(
        logits, batch.targets[..., positions], batch.target_mask[..., positions]
    )
    cache = dict(
        embed=embed_cache, attn=attn_cache, readout=readout_cache, ce=ce_cache, positions=positions, spectral=spectral
    )
    return loss, cache


def head_score(params: dict, spec: ModelSpec) -> scores.HeadScore | None:
    """What the head's score mode needs besides s q.k (None for dot, mup and sigma_reparam)."""
    if spec.score == "qk_norm":
        gains = (None, None) if spec.qk_norm_gain == "none" else (params["g_q"], params["g_k"])
        return scores.HeadScore(norm=spec.qk_norm, g_q=gains[0], g_k=gains[1], norm_width=spec.norm_width)
    if spec.score == "softcap":
        return scores.HeadScore(cap=spec.softcap)
    if spec.score == "temperature":
        return scores.HeadScore(temperature=params["theta"])
    if spec.score == "log_length":
        return scores.HeadScore(length_scale=params["length_scale"])
    return None


def backward(cache, spec: ModelSpec) -> dict[str, np.ndarray]:
    """Gradient of the loss with respect to every parameter (same keys; for
    a stack, of each member's loss with respect to its own parameters).

    Everything from the readout back to the queries runs at the forward's P
    positions; keys and values at every position still get gradient,
    through the attention of those queries. With few queries the head
    hands back X's gradient as Factored, and the embeddings take it so.
    """
    grads = {}
    dlogits = pairs.cross_entropy_backward(1.0, cache["ce"])  # (*M, B, P, C)
    dh, grads["W_out"], grads["b_out"] = pairs.linear_backward(dlogits, cache["readout"])  # (*M, B, P, D)
    # the score mode's own too (theta, g_q, ...); with the residual H = X + out, dh reaches X at the queries as well
    head_grads = head.attention_backward(dh, cache["attn"], dh if spec.residual else None)
    dx = head_grads.pop("x")  # (*M, B, T, D): an array or Factored
    if cache["spectral"] is not None:
        for w, spectral in zip("qk", cache["spectral"]):
            head_grads[f"W_{w}"], head_grads[f"gamma_{w}"] = scores.spectral_backward(head_grads[f"W_{w}"], spectral)
    grads.update(head_grads)
    tables = pairs.embedding_backward(dx, cache["embed"])  # the learned tables', then the fixed positions' if any
    grads.update(zip(spec.embedding_names, tables[: len(spec.embedding_names)]))
    return {name: grads[name] for name in spec.param_names}


def loss_and_grads(params: dict, spec: ModelSpec, batch: Batch, scale=None, buffers: dict | None = None):
    """(loss, grads, cache) for one batch: the training step's model half."""
    loss, cache = forward(params, spec, batch, scale=scale, buffers=buffers)
    return loss, backward(cache, spec), cache


def _per_member(values: np.ndarray):
    """A float for one model, an (M,) float64 array for a stack."""
    return float(values) if values.ndim == 0 else values.astype(np.float64)


def accuracy(cache, batch: Batch):
    """Fraction of target positions whose most probable class is the target
    (one per member for a stack)."""
    probs, positions = cache["ce"][0], cache["positions"]  # (*M, B, P, C)
    rows = batch.target_mask[..., positions]  # (*M, B, P)
    right = (probs.argmax(axis=-1) == batch.targets[..., positions]) & rows
    return _per_member(right.sum(axis=(-2, -1)) / rows.sum(axis=(-2, -1)))


def diagnostics(cache, batch: Batch) -> dict:
    """What the experiments measure, read from a forward pass's cache (floats;
    for a stack, an (M,) array of each member's).

    Attention statistics are taken over the rows that feed the loss (query
    positions with a target): the rows whose gradient matters.
        accuracy        fraction of target positions predicted right
        score_std       std of the (unmasked) scores s * q.k in those rows
        attn_entropy    mean entropy of those rows of A, in nats
        saturated_frac  fraction of those rows whose largest weight > SATURATED (0.99)
        target_attn     mean weight those rows put on the key they should read
                        (absent when no row has such a key)
        self_attn       mean weight those rows put on the query's own position
                        (0 under mask_self; in some stalled retrieval
                        runs the query ends attending to itself)
    """
    positions = cache["positions"]
    rows = batch.target_mask[..., positions]  # (*M, B, P)
    key = batch.target_key[..., positions]  # (*M, B, P)
    attn_scores, attn = cache["attn"]["scores"], cache["attn"]["attn"]  # (*M, B, P, T) each
    own = np.broadcast_to(np.arange(attn.shape[-1])[positions], rows.shape)  # (*M, B, P): each row's own position
    if rows.ndim == 2:
        return {"accuracy": accuracy(cache, batch), **_attention_statistics(attn_scores, attn, rows, key, own)}
    # One member at a time, on its own contiguous arrays: numpy orders a
    # reduction by the array's shape, and a member's figures must not depend on the stack.
    members = [
        _attention_statistics(*(np.ascontiguousarray(a[m]) for a in (attn_scores, attn, rows, key, own)))
        for m in range(len(rows))
    ]
    stats = {"accuracy": accuracy(cache, batch)}
    for name in members[0]:
        stats[name] = np.array([member[name] for member in members])
    return stats


def _attention_statistics(attn_scores, attn, rows, key, own) -> dict[str, float]:
    """score_std, attn_entropy, saturated_frac, self_attn, target_attn of one model's rows (see diagnostics)."""
    attn_scores, attn, key, own = attn_scores[rows], attn[rows], key[rows], own[rows]  # (N, T), (N, T), (N,), (N,)
    unmasked = np.isfinite(attn_scores)
    safe_attn = np.where(attn > 0, attn, 1)
    entropy = -(attn * np.log(safe_attn)).sum(axis=-1)  # (N,)
    stats = {
        "score_std": float(attn_scores[unmasked].std(dtype=np.float64)),
        "attn_entropy": float(entropy.mean(dtype=np.float64)),
        "saturated_frac": float((attn.max(axis=-1) > SATURATED).mean()),
        "self_attn": float(attn[np.arange(len(own)), own].mean(dtype=np.float64)),
    }
    has_key = key >= 0
    if has_key.any():
        stats["target_attn"] = float(attn[has_key, key[has_key]].mean(dtype=np.float64))
    return stats
