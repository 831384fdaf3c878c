"""Figures of one run, drawn from its directory only (never from live objects),
so any run, finished or not, can be re-plotted: `python -m attn plot runs/<run>`.

    loss.png         train and eval loss against step (log y) from step 0, with
                     the chance and no-retrieval levels inside the axes
    attention.png    attention weights of a few eval examples, at init and at
                     the end; the key each query should read is circled
    diagnostics.png  score std, attention entropy, saturated rows, and the
                     gradient norms of W_q and W_k (log) over training, from step 0
    mechanism.png    score std against s·√d_k·g² (its spread at init in theory),
                     the saturated rows, and ‖∇W_q‖ of saturated and of other
                     rows over training (mechanism_trace.npz and mechanism.npz:
                     attn.model.mechanism's row statistics, their medians)

Its panels (draw_series, draw_score_std, draw_row_gradients, set_limits)
also draw `attn demo`'s figure (attn.report.demo).

Axes. A y range holds every value drawn, or for a run that went non-finite
the bulk of them (attn.store.runs.robust_limits: a diverged tail does not
flatten the rest), and always the value at step 0 and the reference lines
(hold). A log axis spanning few decades is labelled in plain numbers
(label_log_axis), so a curve at chance never reads as falling. A value of
0, which no log axis can show, is a ▼ at the axis' foot (a float32
gradient through a saturated row is exactly 0).

Uses matplotlib's object API with the Agg canvas: no display, no pyplot state.
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path

import numpy as np
from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine, PlaceHolderLayoutEngine
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter

from attn.model import head, mechanism
from attn.store import arrayfiles, runs
from attn.store.runs import robust_limits
from attn.train.loop import MECHANISM_TRACE

REFERENCE_STYLE = {"chance": ("chance", ":", "0.4"), "no_retrieval": ("no retrieval", "--", "0.55")}
ZERO_LABEL = "▼ 0 (below any log axis)"
ROW_KINDS = ("other", "saturated")  # mechanism.summary's grad_W_q_median_<kind>
LABELLED_DECADES = 3  # a log axis holding fewer whole powers of ten than this is labelled in plain numbers
TITLE_POINTS = 9


def draw_references(ax, references: dict) -> None:
    for key, (label, style, color) in REFERENCE_STYLE.items():
        if references.get(key) is not None:
            ax.axhline(  # over the curves: a run that sits at chance does not hide the chance line
                references[key],
                linestyle=style,
                color=color,
                linewidth=1,
                zorder=3,
                label=f"{label} ({references[key]:.2f})",
            )


def plot_run(run_dir: Path) -> list[Path]:
    """Draw every figure of a run; returns the paths written. Every file is
    read and checked before the first figure is written (RunError names a
    damaged one), so a damaged run gets no figures rather than some. The
    caller holds the run's RunLock (attn.store.locks)."""
    run_dir = Path(run_dir)
    records = runs.read_metrics(run_dir)
    summary = runs.read_summary(run_dir) or {}
    attention = read_attention(run_dir / "attention.npz") if (run_dir / "attention.npz").exists() else None
    rows = read_mechanism_rows(run_dir)
    model = runs.read_config_dict(run_dir).get("model") or {}
    figures = {
        "loss.png": loss_figure(run_dir.name, records, summary),
        "diagnostics.png": diagnostics_figure(run_dir.name, records, summary),
        "mechanism.png": training_mechanism_figure(run_dir.name, records, summary, rows, model_theory_score_std(model)),
    }
    if attention is not None:
        figures["attention.png"] = attention_figure(run_dir.name, attention)
    return [save_figure(fig, run_dir / name, tight=name != "attention.png") for name, fig in figures.items()]


def read_attention(path: Path) -> dict[str, np.ndarray]:
    """attention.npz, checked: snapshots `attn_init` and/or `attn_final` of n
    examples (n, T, T) in [0, 1], beside their `target_mask` (n, T) and
    `target_key` (n, T) integers; RunError naming what is wrong."""
    data = arrayfiles.load_arrays(path)
    moments = [k for k in ("attn_init", "attn_final") if k in data]
    shape = data[moments[0]].shape if moments else ()
    problem = None
    if not moments:
        problem = "holds neither attn_init nor attn_final"
    elif len(shape) != 3 or shape[1] != shape[2] or not shape[0]:
        problem = f"{moments[0]} has shape {list(shape)}, expected (examples, T, T)"
    elif any(data[k].shape != shape or data[k].dtype.kind != "f" for k in moments):
        problem = "attn_init and attn_final differ in shape, or are not floating point"
    elif (
        any(data.get(k) is None or data[k].shape != shape[:2] for k in ("target_mask", "target_key"))
        or data["target_key"].dtype.kind not in "iu"
    ):
        problem = f"target_mask and target_key must be {list(shape[:2])} arrays (target_key of integers)"
    if problem:
        raise runs.RunError(f"{path}: {problem}; delete it (the other figures do not need it) or move the run away")
    return data


def read_mechanism_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    """step -> attn.model.mechanism.summary of the eval set's query rows at that
    step: from mechanism.npz (every row, at step 0 and logging.mechanism_step)
    and mechanism_trace.npz (the summaries themselves, at log-spaced steps);
    {} for a run with neither. RunError naming a file that is not as written."""
    found: dict[int, dict[str, float]] = {}
    for name in ("mechanism.npz", MECHANISM_TRACE):
        path = Path(run_dir) / name
        if not path.exists():
            continue
        by_step: dict[int, dict] = {}
        for key, values in arrayfiles.load_arrays(path).items():
            step, slash, statistic = key.partition("/")
            if not (slash and step.isdigit() and statistic):
                raise runs.RunError(
                    f"{path}: array {key!r} is not named <step>/<statistic>; delete it or move the run away"
                )
            by_step.setdefault(int(step), {})[statistic] = values
        for step, arrays in by_step.items():
            try:
                numbers = (
                    {k: float(v) for k, v in arrays.items()} if name == MECHANISM_TRACE else mechanism.summary(arrays)
                )
            except (KeyError, TypeError, ValueError) as err:
                raise runs.RunError(
                    f"{path}: step {step}'s arrays are not the rows' statistics ({type(err).__name__}: {err}); "
                    "delete it or move the run away"
                ) from None
            found.setdefault(step, {}).update(numbers)
    return dict(sorted(found.items()))


def model_theory_score_std(model: dict) -> float | None:
    """attn.model.head.theory_score_std of a run's model section (config.yaml), None where it has none."""
    d_k, gain, exponent = model.get("d_k"), model.get("qk_gain", 1.0), model.get("qk_gain_exponent", 0.0)
    if not isinstance(d_k, int) or not all(isinstance(v, (int, float)) for v in (gain, exponent)):
        return None
    qk_gain = gain * d_k**exponent  # the gain as attn.config.loading.qk_gain makes it
    temperature_init = model.get("temperature_init")
    if temperature_init is not None and not isinstance(temperature_init, (int, float)):
        return None
    score, scale = model.get("score", "dot"), model.get("scale", "sqrt")
    return head.theory_score_std(score, scale, d_k, qk_gain, temperature_init)


def without_layout_engine(fig: Figure) -> None:
    """No layout engine on the figure, whatever matplotlibrc asks (figure.autolayout or
    figure.constrained_layout.use would put one back, and a save would lay it out again)."""
    with rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
        fig.set_layout_engine(None)


def save_figure(fig: Figure, path: Path, tight: bool = True) -> Path:
    """Render to memory, then write atomically (a crash never leaves half a PNG).
    A figure laid out already (tight_layout, which leaves matplotlib's placeholder
    engine behind) is drawn once: with an engine set, savefig draws it a second time
    first, to lay it out again. A figure under constrained layout is laid out by its
    first save only: saved again (in another format), it keeps that layout."""
    if tight:
        fig.tight_layout()
    if isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine):
        without_layout_engine(fig)  # its layout is made; savefig's extra draw would change nothing
    buffer = io.BytesIO()
    fmt = path.suffix.lstrip(".")
    fig.savefig(buffer, dpi=110, format=fmt, metadata={"Date": None} if fmt == "svg" else None)  # reproducible SVG
    if isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine):
        without_layout_engine(fig)  # laid out by the save above, which left each panel where it put it
    runs.write_atomic(path, buffer.getvalue())
    return path


def wrapped(text: str, inches: float, points: float = TITLE_POINTS) -> str:
    """Text wrapped to `inches` at a font of `points`: a title never cut at the figure's edges."""
    return textwrap.fill(text, max(20, int(inches * 72 / (0.56 * points)) - 4))


def run_title(name: str, summary: dict) -> str:
    """'<run>  [completed · learned]', '<run>  [diverged: <reason>]': status, reason and outcome."""
    status = summary.get("status", "?")
    said = summary.get("outcome_said")
    words = status + (f": {summary['reason']}" if summary.get("reason") else "")
    if said and said != status:
        words += f" · {said}"
    return f"{name}  [{words}]"


def ended_non_finite(records: list[dict], key: str) -> bool:
    """Whether the metric's last logged value is non-finite (NaN or ±inf): the run diverged in it."""
    logged = [r[key] for r in records if key in r and r[key] is not None]
    return bool(logged) and not runs.is_finite_number(logged[-1])


def draw_series(ax, records: list[dict], key: str, label: str, log: bool, diverged: bool = False, **style) -> list:
    """Plot a metric's finite values; a × at the last one if the metric then
    went non-finite or the run diverged. On a log axis a value of 0 (or below)
    breaks the line and is a ▼ at the axis' foot (mark_zeros). Returns the
    values drawn (for the y range)."""
    x, y = runs.series(records, key)
    if not len(x):
        return []
    shown = np.where(y > 0, y, np.nan) if log else y
    (line,) = ax.plot(x, shown, label=label, linewidth=1.4, marker="." if len(x) < 5 else None, **style)
    if log:
        mark_zeros(ax, x[y <= 0], line.get_color())
    last = np.flatnonzero(np.isfinite(shown))
    if (diverged or ended_non_finite(records, key)) and len(last):
        ax.plot(
            x[last[-1]],
            shown[last[-1]],
            marker="x",
            markersize=8,
            linestyle="none",
            color=line.get_color(),
            label="diverged (last finite value)",
        )
    return [shown[np.isfinite(shown)]]


def mark_zeros(ax, steps, color) -> None:
    """A ▼ at the foot of a log axis at each step whose value is 0 (or below): drawn, and said in the legend."""
    if not len(steps):
        return
    ax.plot(
        steps,
        np.zeros(len(steps)),
        marker="v",
        markersize=6,
        linestyle="none",
        color=color,
        transform=ax.get_xaxis_transform(),  # x in data, y in axes fraction: at the foot whatever the range
        clip_on=False,
        label=ZERO_LABEL,
    )


def hold(limits: tuple[float, float] | None, values, log: bool) -> tuple[float, float] | None:
    """`limits` widened (with a 5% margin) to hold every finite value of
    `values` (positive, on a log axis): what a figure must never hide, such
    as step 0 and the reference lines."""
    kept = np.asarray([v for v in values if v is not None], dtype=float)
    kept = kept[np.isfinite(kept) & ((kept > 0) if log else True)]
    if limits is None:
        return robust_limits([kept], log, robust=False) if len(kept) else None
    outside = kept[(kept < limits[0]) | (kept > limits[1])]
    return robust_limits([np.asarray(limits), outside], log, robust=False) if len(outside) else limits


def first_values(records: list[dict], keys) -> list[float]:
    """Each metric's first finite value (step 0's, for a run that logged it)."""
    found = []
    for key in keys:
        _, values = runs.series(records, key)
        found += list(values[:1])
    return found


def label_log_axis(axis) -> None:
    """Tick labels on a log axis (ax.yaxis or ax.xaxis, its range set) that a
    reader can read whatever its span: matplotlib labels only whole powers of
    ten, so an axis spanning less than a few has one label or none. An axis
    within one decade gets evenly spaced plain-number ticks (2, 2.5, 3, 3.5),
    one within a few 1, 2, 5 × 10^k, each labelled; a wider one keeps
    matplotlib's powers of ten."""
    low, high = sorted(axis.get_view_interval())
    if not (low > 0 and math.isfinite(high)):
        return
    powers = math.floor(math.log10(high)) - math.ceil(math.log10(low)) + 1
    if powers >= LABELLED_DECADES:
        return
    ticks = []
    if high / low >= 10:
        for subs in ((1, 2, 5), (1, 2, 3, 4, 5, 6, 7, 8, 9)):
            ticks = [
                m * 10.0**k
                for k in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
                for m in subs
                if low <= m * 10.0**k <= high
            ]
            if len(ticks) >= 3:
                break
    if len(ticks) < 3:
        ticks = [t for t in MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high) if low <= t <= high]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda value, _: plain_number(value)))
    axis.set_minor_formatter(NullFormatter())


def plain_number(value: float) -> str:
    """A tick label: 0.05, 2.5, 20000 as written; beyond that range m×10^k."""
    if value == 0 or 1e-4 <= abs(value) < 1e6:
        return f"{value:.6g}"
    exponent = math.floor(math.log10(abs(value)))
    mantissa = f"{value / 10**exponent:.3g}"
    return f"$10^{{{exponent}}}$" if mantissa == "1" else f"${mantissa}\\times10^{{{exponent}}}$"


def went_non_finite(summary: dict, records: list[dict]) -> bool:
    """Whether the run diverged or skipped a non-finite step: its values may have grown by orders of magnitude."""
    return (
        summary.get("status") == "diverged"
        or bool(summary.get("nonfinite_steps"))
        or any("nonfinite" in r for r in records)
    )


def set_limits(ax, drawn: list, held, log: bool, robust: bool) -> None:
    """The y range: every value drawn, or with `robust` (a run that went
    non-finite) their bulk (robust_limits), holding the values in `held`
    either way; a log axis labelled to read."""
    limits = hold(robust_limits(drawn, log, robust), held, log)
    if limits:
        ax.set_ylim(*limits)
    if log:
        label_log_axis(ax.yaxis)


def one_legend(ax, **kwargs) -> None:
    """The axes' legend with one entry per label (the diverged × once)."""
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    if unique:
        ax.legend(list(unique.values()), list(unique.keys()), **kwargs)


def loss_figure(name: str, records: list[dict], summary: dict) -> Figure:
    """Train and eval loss from step 0, the chance and no-retrieval levels inside the axes."""
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    ax.set_yscale("log")
    drawn = []
    for key, label in (("train_loss", "train"), ("eval_loss", "eval")):
        drawn += draw_series(ax, records, key, label, log=True, diverged=summary.get("status") == "diverged")
    references = summary.get("references", {})
    draw_references(ax, references)
    levels = [v for v in (references.get(k) for k in REFERENCE_STYLE) if v is not None]
    held = first_values(records, ("train_loss", "eval_loss")) + levels
    set_limits(ax, drawn, held, log=True, robust=went_non_finite(summary, records))
    whole_run_axis(ax, last_step(records, summary))
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(wrapped(f"{run_title(name, summary)}: train and eval loss", 7), fontsize=TITLE_POINTS)
    ax.grid(True, which="both", alpha=0.25)
    one_legend(ax, fontsize=8)
    return fig


def diagnostics_figure(name: str, records: list[dict], summary: dict) -> Figure:
    """Score std, attention entropy, saturated rows and ‖∇W_q‖, ‖∇W_k‖ (log), from step 0."""
    diverged, robust = summary.get("status") == "diverged", went_non_finite(summary, records)
    fig = Figure(figsize=(10, 6.5))
    panels = [
        ("score_std", "std of scores s·q·k", "linear"),
        ("attn_entropy", "attention entropy (nats)", "linear"),
        ("saturated_frac", "rows with max weight > 0.99", "fraction"),
        (("grad_norm/W_q", "grad_norm/W_k"), "‖∇W_q‖, ‖∇W_k‖", "log"),
    ]
    for i, (keys, title, yscale) in enumerate(panels):
        ax = fig.add_subplot(2, 2, i + 1)
        log = yscale == "log"
        ax.set_yscale("log" if log else "linear")
        keys = keys if isinstance(keys, tuple) else (keys,)
        values = []
        for key in keys:
            values += draw_series(ax, records, key, key.split("/")[-1], log=log, diverged=diverged)
        ax.set_title(title, fontsize=10)
        whole_run_axis(ax, last_step(records, summary))
        if not values:  # an empty panel says why
            ax.text(
                0.5,
                0.5,
                "no finite" + (" positive" if log else "") + " value logged",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=9,
                color="0.4",
            )
            continue
        if yscale == "fraction":
            ax.set_ylim(-0.03, 1.03)
        else:
            set_limits(ax, values, first_values(records, keys), log, robust)
        ax.grid(True, which="both" if log else "major", alpha=0.25)
        if len(ax.get_legend_handles_labels()[0]) > 1:
            one_legend(ax, fontsize=8)
    fig.suptitle(wrapped(f"{name}: attention diagnostics (eval set, target rows)", 10, 10), fontsize=10)
    return fig


def draw_attention(ax, weights: np.ndarray, target_mask: np.ndarray, target_key: np.ndarray, points: float = 7):
    """One example's attention map (T, T), the key each query should read circled in red; returns the image."""
    image = ax.imshow(weights, vmin=0, vmax=1, cmap="viridis")
    targets = np.nonzero(target_mask & (target_key >= 0))[0]
    ax.scatter(target_key[targets], targets, s=40, facecolors="none", edgecolors="red", linewidths=1)
    ax.set_xlabel("key position", fontsize=points)
    ax.set_ylabel("query position", fontsize=points)
    ax.tick_params(labelsize=points - 1)
    return image


def attention_figure(name: str, data: dict[str, np.ndarray]) -> Figure:
    moments = [k for k in ("attn_init", "attn_final") if k in data]
    n = data[moments[0]].shape[0]
    fig = Figure(figsize=(2.6 * n + 0.8, 2.7 * len(moments) + 0.3))
    for row, moment in enumerate(moments):
        for i in range(n):
            ax = fig.add_subplot(len(moments), n, row * n + i + 1)
            image = draw_attention(ax, data[moment][i], data["target_mask"][i], data["target_key"][i])
            ax.set_title(f"{moment.removeprefix('attn_')} · example {i}", fontsize=8)
    fig.colorbar(image, ax=fig.axes, shrink=0.8, label="attention weight")
    fig.suptitle(f"{name}: where each query looks (red: the key it should read)", fontsize=9)
    return fig


# ---------------------------------------------------------------------------
# The mechanism over training
# ---------------------------------------------------------------------------
def last_step(records: list[dict], summary: dict, traced=()) -> int:
    """The run's last step: where it ended (summary), or its last record or traced step, at least 1."""
    return max([r["step"] for r in records] + list(traced) + [summary.get("step") or 0, 1])


def whole_run_axis(ax, last: int) -> None:
    """x from step 0 to the run's last step, whole steps only: a run that diverged at step 4
    spans 0-4, not a point's width of fractional steps."""
    ax.set_xlim(-0.015 * last, last * 1.03)  # a margin either side, so a marker at step 0 is not cut in half
    ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", integer=True))  # as many as the width holds
    ax.set_xlabel("step")


STEP0_MARGIN = 0.03  # the share of a symlog step axis left of step 0
FIRST_MARKED = 10  # a symlog step axis marks the first this many points of each line


def step_axis(ax, last: int) -> None:
    """x from step 0 on a log scale past step 1 (symlog): the first steps,
    where the rows saturate or not, as wide as the last thousand; 2 and 5 times
    a power of ten are ticks too when the run ends before step 100. Call it after drawing: it marks the first
    FIRST_MARKED points of each line drawn without markers, which the log scale spreads apart."""
    ax.set_xscale("symlog", linthresh=1, linscale=0.4)
    high = max(last, 1) * 1.15  # a margin right of the last step
    scale = ax.xaxis.get_transform()  # steps -> symlog units; linear left of step 1
    width = scale.transform([high])[0] - scale.transform([0.0])[0]
    low = scale.inverted().transform([-STEP0_MARGIN / (1 - STEP0_MARGIN) * width])[0]
    ax.set_xlim(low, high)  # step 0 a fixed share of the width in from the left, so its marker is whole on any run
    if last < 100:  # 2 and 5 between the powers of ten too, where there are few of them
        ticks = [t for t in (0, 1, 2, 5, 10, 20, 50) if t <= last]
    else:
        ticks = [0] + [10**k for k in range(0, int(math.log10(last)) + 1)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: plain_number(value)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("step (0, then a log scale)", fontsize=8)
    for line in ax.get_lines():  # the first logged steps, spread apart by the log scale, marked where they are
        if line.get_marker() in ("None", "", None) and len(line.get_xdata()) >= 2:
            line.set_marker(".")
            line.set_markersize(3)
            line.set_markevery(list(range(min(len(line.get_xdata()), FIRST_MARKED))))


def draw_score_std(ax, records: list[dict], theory: float | None, color=None, label: str = "score std") -> list:
    """The scores' std over training (log) and, dashed, s·√d_k·g²; returns the values that set the range."""
    drawn = draw_series(ax, records, "score_std", label, log=True, color=color)
    if theory is not None:
        value = f"{theory:.4g}" if abs(theory) < 1e4 else f"{theory:.0f}"  # digits, not 1.02e+03
        label = f"s·√d_k·g² = {value} (g: W_q, W_k init gain)"
        ax.axhline(theory, color=color or "0.3", linestyle="--", linewidth=1, label=label)
        drawn.append([theory])
    return drawn + [first_values(records, ("score_std",))]


def draw_row_gradients(ax, rows: dict[int, dict], records: list[dict], color=None, whole: bool = True) -> list:
    """‖∇W_q‖ over training: the median over rows of one row's loss term's, of saturated rows (×, dashed) and of
    the others (●), the line broken at traced steps without such rows; a median of 0 is a ▼ at the axis' foot;
    with `whole`, the gradient of the batch's loss (train, grey)."""
    drawn = []
    if whole:
        drawn += draw_series(ax, records, "grad_norm/W_q", "whole ‖∇W_q‖ (train batch)", log=True, color="0.65")
    labels = ("median row, other rows (eval)", "median row, saturated rows (eval; at steps with any)")
    for key, style, label in zip(ROW_KINDS, ("o-", "x--"), labels):
        steps = np.array(sorted(rows))
        values = np.array([rows[s].get(f"grad_W_q_median_{key}", math.nan) for s in steps], dtype=float)
        if not np.isfinite(values).any():
            continue
        positive = np.isfinite(values) & (values > 0)
        (line,) = ax.plot(
            steps,
            np.where(positive, values, np.nan),  # NaN: a gap, not a line drawn across steps without such rows
            style,
            color=color,
            markersize=4,
            linewidth=1.1,
            label=label,
        )
        mark_zeros(ax, steps[np.isfinite(values) & (values <= 0)], line.get_color())
        drawn.append(values[positive])
    return drawn


def training_mechanism_figure(
    name: str, records: list[dict], summary: dict, rows: dict, theory: float | None
) -> Figure:
    """Score std against s·√d_k·g², the saturated rows, and ‖∇W_q‖ of saturated and other rows, over training."""
    fig = Figure(figsize=(13, 5.0))
    axes = [fig.add_subplot(1, 3, i + 1) for i in range(3)]
    last = last_step(records, summary, rows)
    ax = axes[0]
    ax.set_yscale("log")
    robust = went_non_finite(summary, records)
    steps, stds = runs.series(records, "score_std")
    label = f"score std (step {steps[0]}: {stds[0]:.3g})" if len(steps) else "score std"  # the start, to be read
    set_limits(ax, draw_score_std(ax, records, theory, label=label), [], log=True, robust=robust)
    ax.set_title(
        "std of the scores s·q·k"
        + (
            " (dashed: s·√d_k·g², at init in theory)" if theory is not None else " (no theory line for this score mode)"
        ),
        fontsize=8.5,
    )
    ax = axes[1]
    draw_series(ax, records, "saturated_frac", "saturated rows", log=False)
    ax.set_ylim(-0.03, 1.03)
    ax.set_title("saturated rows: largest attention weight > 0.99", fontsize=8.5)
    ax = axes[2]
    ax.set_yscale("log")
    set_limits(ax, draw_row_gradients(ax, rows, records), [], log=True, robust=robust)
    ax.set_title("‖∇W_q‖ of the batch loss and of one row's term (median)", fontsize=8.5)
    measured = any(math.isfinite(r.get(f"grad_W_q_median_{k}", math.nan)) for r in rows.values() for k in ROW_KINDS)
    if not measured:  # the panel says why it holds no row
        why = (
            "NaN at every step traced (as in a qk_norm run\nmade before it was measured through the norm)"
            if rows
            else "logging.mechanism_step null, no trace"
        )
        ax.text(0.5, 0.5, f"no row's gradient measured:\n{why}", transform=ax.transAxes, ha="center", fontsize=8)
    for ax in axes:
        step_axis(ax, last)
        ax.grid(True, which="major", alpha=0.25)
        if ax.get_legend_handles_labels()[0]:  # below the axes, where it covers no curve
            one_legend(ax, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    title = f"{run_title(name, summary)}: score std, saturated rows and ‖∇W_q‖ over training (eval set's query rows)"
    fig.suptitle(wrapped(title, 13, 10), fontsize=10)
    return fig
