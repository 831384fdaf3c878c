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
            ax.axhline(references[key], linestyle=style, color=color, linewidth=1, label=f"{label} ({references[key]:.2f})")


def plot_run(run_dir: Path) -> list[Path]:
    """Draw every figure of a run; returns the paths written. Every file is
    read and checked before the first figure is written (RunError names a
    damaged one), so a damaged run gets no figures rather than some. The
    caller holds the run's RunLock (attn.store.locks)."""
    run_dir = Path(run_dir)
    records = runs.read_metrics(run_dir)
    summary = runs.read_summary(run_dir) or {}
    attention = read_attention(run_dir / "attention.npz") if (run_dir / "attention.npz").exists() else None
    written = [_loss_figure(run_dir, records, summary), _diagnostics_figure(run_dir, records)]
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
    elif any(data.get(k) is None or data[k].shape != shape[:2] for k in ("target_mask", "target_key")) \
            or data["target_key"].dtype.kind not in "iu":
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


def _loss_figure(run_dir: Path, records: list[dict], summary: dict) -> Path:
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    for key, label in (("train_loss", "train"), ("eval_loss", "eval")):
        x, y = runs.series(records, key)
        if len(x):
            ax.plot(x, y, label=label, linewidth=1.4, marker="." if len(x) < 5 else None)
    draw_references(ax, summary.get("references", {}))
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(_title(run_dir, summary), fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    return save_figure(fig, run_dir / "loss.png")


def _diagnostics_figure(run_dir: Path, records: list[dict]) -> Path:
    fig = Figure(figsize=(10, 6.5))
    panels = [
        ("score_std", "std of scores s·q·k", "linear"),
        ("attn_entropy", "attention entropy (nats)", "linear"),
        ("saturated_frac", "rows with max weight > 0.99", "linear"),
        (("grad_norm/W_q", "grad_norm/W_k"), "‖∇W_q‖, ‖∇W_k‖", "log"),
    ]
    for i, (keys, title, yscale) in enumerate(panels):
        ax = fig.add_subplot(2, 2, i + 1)
        drawn = 0
        for key in (keys if isinstance(keys, tuple) else (keys,)):
            x, y = runs.series(records, key)
            if yscale == "log":
                keep = y > 0
                x, y = x[keep], y[keep]
            if len(x):
                ax.plot(x, y, label=key.split("/")[-1], linewidth=1.3, marker="." if len(x) < 5 else None)
                drawn += 1
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if not drawn:  # an empty panel says why
            ax.text(0.5, 0.5, "no finite" + (" positive" if yscale == "log" else "") + " value logged",
                    transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.4")
            continue
        ax.set_yscale(yscale)
        ax.grid(True, alpha=0.25)
        if drawn > 1:
            ax.legend(fontsize=8)
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
