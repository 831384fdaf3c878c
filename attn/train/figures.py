"""Figures of one run, drawn from its directory only (never from live objects),
so any run, finished or not, can be re-plotted: `python -m attn plot runs/<run>`.

    loss.png         train and eval loss against step (log y), chance and
                     no-retrieval levels drawn
    attention.png    attention weights of a few eval examples, at init and at
                     the end; the key each query should read is circled
    diagnostics.png  score std, attention entropy, saturated rows, and the
                     gradient norms of W_q and W_k over training

Uses matplotlib's object API with the Agg canvas: no display, no pyplot state.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from attn.store import arrayfiles, runs

REFERENCE_STYLE = {"chance": ("chance", ":", "0.4"), "no_retrieval": ("no retrieval", "--", "0.55")}


def draw_references(ax, references: dict) -> None:
    for key, (label, style, color) in REFERENCE_STYLE.items():
        if references.get(key) is not None:
            ax.axhline(
                references[key], linestyle=style, color=color, linewidth=1, label=f"{label} ({references[key]:.2f})"
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
    written = [
        _loss_figure(run_dir, records, summary),
        _diagnostics_figure(run_dir, records, summary.get("status") == "diverged"),
    ]
    if attention is not None:
        written.append(_attention_figure(run_dir, attention))
    return written


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


def save_figure(fig: Figure, path: Path, tight: bool = True) -> Path:
    """Render to memory, then write atomically (a crash never leaves half a PNG)."""
    if tight:
        fig.tight_layout()
    buffer = io.BytesIO()
    fmt = path.suffix.lstrip(".")
    fig.savefig(buffer, dpi=110, format=fmt, metadata={"Date": None} if fmt == "svg" else None)  # reproducible SVG
    runs.write_atomic(path, buffer.getvalue())
    return path


def _title(run_dir: Path, summary: dict) -> str:
    status = summary.get("status", "?")
    return f"{run_dir.name}  [{status}{': ' + summary['reason'] if summary.get('reason') else ''}]"


def ended_non_finite(records: list[dict], key: str) -> bool:
    """Whether the metric's last logged value is non-finite (NaN or ±inf): the run diverged in it."""
    logged = [r[key] for r in records if key in r and r[key] is not None]
    return bool(logged) and not runs.is_finite_number(logged[-1])


def draw_series(ax, records: list[dict], key: str, label: str, log: bool, diverged: bool = False) -> list:
    """Plot a metric's finite (on a log axis, positive) values; a × at the last
    one if the metric then went non-finite or the run diverged. Returns the values drawn."""
    x, y = runs.series(records, key)
    if log:
        keep = y > 0
        x, y = x[keep], y[keep]
    if not len(x):
        return []
    (line,) = ax.plot(x, y, label=label, linewidth=1.4, marker="." if len(x) < 5 else None)
    if diverged or ended_non_finite(records, key):
        ax.plot(
            x[-1],
            y[-1],
            marker="x",
            markersize=8,
            linestyle="none",
            color=line.get_color(),
            label="diverged (last finite value)",
        )
    return [y]


def set_robust_ylim(ax, drawn: list, log: bool) -> None:
    """y range from the bulk of what is drawn (runs.robust_limits): a diverged tail does not flatten the rest."""
    limits = runs.robust_limits(drawn, log)
    if limits:
        ax.set_ylim(*limits)


def one_legend(ax, **kwargs) -> None:
    """The axes' legend with one entry per label (the diverged × once)."""
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    if unique:
        ax.legend(list(unique.values()), list(unique.keys()), **kwargs)


def _loss_figure(run_dir: Path, records: list[dict], summary: dict) -> Path:
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    ax.set_yscale("log")
    drawn = []
    for key, label in (("train_loss", "train"), ("eval_loss", "eval")):
        drawn += draw_series(ax, records, key, label, log=True, diverged=summary.get("status") == "diverged")
    references = summary.get("references", {})
    draw_references(ax, references)
    drawn.append([v for v in (references.get(k) for k in REFERENCE_STYLE) if v is not None])
    set_robust_ylim(ax, drawn, log=True)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(_title(run_dir, summary), fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    one_legend(ax, fontsize=8)
    return save_figure(fig, run_dir / "loss.png")


def _diagnostics_figure(run_dir: Path, records: list[dict], diverged: bool = False) -> Path:
    fig = Figure(figsize=(10, 6.5))
    panels = [
        ("score_std", "std of scores s·q·k", "linear"),
        ("attn_entropy", "attention entropy (nats)", "linear"),
        ("saturated_frac", "rows with max weight > 0.99", "linear"),
        (("grad_norm/W_q", "grad_norm/W_k"), "‖∇W_q‖, ‖∇W_k‖", "log"),
    ]
    for i, (keys, title, yscale) in enumerate(panels):
        ax = fig.add_subplot(2, 2, i + 1)
        ax.set_yscale(yscale)
        values = []
        for key in keys if isinstance(keys, tuple) else (keys,):
            values += draw_series(ax, records, key, key.split("/")[-1], log=yscale == "log", diverged=diverged)
        drawn = len(values)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if not drawn:  # an empty panel says why
            ax.text(
                0.5,
                0.5,
                "no finite" + (" positive" if yscale == "log" else "") + " value logged",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=9,
                color="0.4",
            )
            continue
        set_robust_ylim(ax, values, log=yscale == "log")
        ax.grid(True, alpha=0.25)
        if len(ax.get_legend_handles_labels()[0]) > 1:
            one_legend(ax, fontsize=8)
    fig.suptitle(f"{run_dir.name}: attention diagnostics (eval set, target rows)", fontsize=10)
    return save_figure(fig, run_dir / "diagnostics.png")


def _attention_figure(run_dir: Path, data: dict[str, np.ndarray]) -> Path:
    moments = [k for k in ("attn_init", "attn_final") if k in data]
    n = data[moments[0]].shape[0]
    fig = Figure(figsize=(2.6 * n + 0.8, 2.7 * len(moments) + 0.3))
    for row, moment in enumerate(moments):
        for i in range(n):
            ax = fig.add_subplot(len(moments), n, row * n + i + 1)
            weights = data[moment][i]  # (T, T)
            image = ax.imshow(weights, vmin=0, vmax=1, cmap="viridis")
            targets = np.nonzero(data["target_mask"][i] & (data["target_key"][i] >= 0))[0]
            ax.scatter(data["target_key"][i][targets], targets, s=40, facecolors="none", edgecolors="red", linewidths=1)
            ax.set_title(f"{moment.removeprefix('attn_')} · example {i}", fontsize=8)
            ax.set_xlabel("key position", fontsize=7)
            ax.set_ylabel("query position", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.colorbar(image, ax=fig.axes, shrink=0.8, label="attention weight")
    fig.suptitle(f"{run_dir.name}: where each query looks (red: the key it should read)", fontsize=9)
    return save_figure(fig, run_dir / "attention.png", tight=False)
