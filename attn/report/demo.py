"""`attn demo`'s figure: runs that differ in one setting (the scaled head at
d_k 2^20 and its unscaled twin) on one page, drawn from their run
directories alone with the panels of a run's own figures (attn.train.figures):

    top      eval loss from step 0 with the chance and no-retrieval lines;
             the scores' std against s·√d_k·g²; the saturated rows;
             ‖∇W_q‖ of one row's loss term (median), saturated and other
    bottom   where each run's queries look, at init and at the end
    legend   each run's label, its outcome in it
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from attn.store import runs
from attn.train.figures import (
    REFERENCE_STYLE,
    draw_attention,
    draw_references,
    draw_row_gradients,
    draw_score_std,
    draw_series,
    first_values,
    last_step,
    model_theory_score_std,
    read_attention,
    read_mechanism_rows,
    set_limits,
    step_axis,
    went_non_finite,
    whole_run_axis,
    wrapped,
)


def draw_query_rows(ax, data: dict[str, np.ndarray], moment: str):
    """Where each example's query looks: with one target row per example
    (retrieval), that row of every example shown, one above the other; else
    example 0's whole map. The key each should read circled in red. Returns
    (image, what is shown, in words)."""
    mask, keys = data["target_mask"], data["target_key"]  # (n, T), (n, T)
    if not (mask.sum(axis=1) == 1).all():
        return draw_attention(ax, data[moment][0], mask[0], keys[0]), "example 0"
    rows = np.argmax(mask, axis=1)  # (n,): each example's query position
    examples = np.arange(len(rows))
    image = ax.imshow(data[moment][examples, rows], vmin=0, vmax=1, cmap="viridis", aspect="auto")  # (n, T)
    ax.scatter(keys[examples, rows], examples, s=60, facecolors="none", edgecolors="red", linewidths=1.2)
    ax.set_yticks(examples)
    ax.set_xlabel("key position", fontsize=7)
    ax.set_ylabel("eval example", fontsize=7)
    ax.tick_params(labelsize=6)
    return image, f"where {len(rows)} eval queries look"


def demo_figure(run_dirs: list[Path], labels: list[str], colors: list[str], title: str) -> Figure:
    """Runs that differ in one setting, on one page: eval loss from step 0 with
    the chance and no-retrieval levels; score std against s·√d_k·g²; the
    saturated rows; the median row's ‖∇W_q‖, saturated and other; and where
    each run's queries look at init and at the end. `labels`
    name each run (its outcome in them), `colors` draw it. The attention:
    each example's query row (draw_query_rows), at init and at the end."""
    fig = Figure(figsize=(4.0 * max(4, 2 * len(run_dirs)), 9.0))
    grid = fig.add_gridspec(2, max(4, 2 * len(run_dirs)), height_ratios=(1.15, 1.0))
    loss, std, saturated, gradient = (fig.add_subplot(grid[0, i]) for i in range(4))
    runs_read = [
        (
            runs.read_metrics(run_dir),
            runs.read_summary(run_dir) or {},
            read_mechanism_rows(run_dir),
            runs.read_config_dict(run_dir).get("model") or {},
            read_attention(run_dir / "attention.npz") if (run_dir / "attention.npz").exists() else None,
        )
        for run_dir in run_dirs
    ]
    loss.set_yscale("log")
    std.set_yscale("log")
    gradient.set_yscale("log")
    drawn = {"loss": [], "std": [], "gradient": []}
    held, last, references = [], 1, {}
    for (records, summary, rows, model, _), label, color in zip(runs_read, labels, colors):
        diverged = summary.get("status") == "diverged"
        drawn["loss"] += draw_series(loss, records, "eval_loss", label, log=True, diverged=diverged, color=color)
        held += first_values(records, ("eval_loss",))
        references = references or summary.get("references") or {}
        drawn["std"] += draw_score_std(std, records, model_theory_score_std(model), color=color, label=label)
        draw_series(saturated, records, "saturated_frac", label, log=False, color=color)
        drawn["gradient"] += draw_row_gradients(gradient, rows, records, color=color, whole=False)
        last = max(last, last_step(records, summary, rows))
    draw_references(loss, references)
    held += [v for v in (references.get(k) for k in REFERENCE_STYLE) if v is not None]
    robust = any(went_non_finite(summary, records) for records, summary, *_ in runs_read)
    set_limits(loss, drawn["loss"], held, log=True, robust=robust)
    set_limits(std, drawn["std"], [], log=True, robust=robust)
    set_limits(gradient, drawn["gradient"], [], log=True, robust=robust)
    saturated.set_ylim(-0.03, 1.03)
    whole_run_axis(loss, last)
    loss.set_ylabel("eval loss (nats)")
    loss.set_title("eval loss from step 0", fontsize=9)
    std.set_title("std of the scores s·q·k (dashed: s·√d_k·g²)", fontsize=9)
    saturated.set_title("saturated rows (largest weight > 0.99)", fontsize=9)
    gradient.set_title("‖∇W_q‖ of one row's loss term (median)", fontsize=9)
    for ax in (std, saturated, gradient):
        step_axis(ax, last)
    for ax in (loss, std, saturated, gradient):
        ax.grid(True, which="major", alpha=0.25)
    image = None
    for k, ((_, _, _, _, attention), label) in enumerate(zip(runs_read, labels)):
        for j, moment in enumerate(("attn_init", "attn_final")):
            ax = fig.add_subplot(grid[1, 2 * k + j])
            if attention is None or moment not in attention:
                ax.text(0.5, 0.5, "no attention snapshot", transform=ax.transAxes, ha="center", fontsize=8)
                ax.set_axis_off()
                continue
            image, shown = draw_query_rows(ax, attention, moment)
            when = "step 0" if moment == "attn_init" else f"step {last}"
            ax.set_title(wrapped(f"{label.split(' (')[0]}, {when}: {shown}", 3.6, 8), fontsize=8)
    if image is not None:
        colorbar = fig.add_axes((0.945, 0.16, 0.008, 0.3))
        fig.colorbar(image, cax=colorbar, label="attention weight (red ○: the key to read)")
    handles, texts = {}, []
    for ax in (loss, std, gradient):
        for handle, text in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(text, handle)
    texts = [t for t in labels if t in handles] + [t for t in handles if t not in labels]
    fig.legend([handles[t] for t in texts], texts, loc="lower center", ncol=min(3, len(texts)), fontsize=8.5)
    fig.suptitle(wrapped(title, fig.get_size_inches()[0], 11), fontsize=11)
    fig.subplots_adjust(left=0.05, right=0.93, top=0.9, bottom=0.16, hspace=0.45, wspace=0.35)
    return fig
