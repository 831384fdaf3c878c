"""A sweep's timeline as a figure (attn.experiment.timeline's records and summary).

Top: one row for the main process (start-up, plan, train: waiting on the workers and collecting,
report) and one per worker (spawning and importing; each stack: preparing its runs, training, and
over it the moments its loop waited on durable writes; the tail, from a worker's last stack to the
end of the last one). Bottom: the core-seconds no process spent, by cause, beside the CPU seconds.
The title gives the wall time, the CPU seconds and the cores busy on average.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from attn.experiment.timeline import IDLE_CAUSES
from attn.train.figures import save_figure

COLORS = {
    "start-up": "#c7c7c7",
    "plan": "#9467bd",
    "train": "#e8e8f4",
    "report": "#d62728",
    "spawning": "#dddddd",
    "preparing": "#17becf",
    "training": "#1f77b4",
    "writes": "#ff7f0e",
    "tail": "#f4b6b6",
}
LABELS = {
    "start-up": "main: start-up (read, check)",
    "plan": "main: plan, hand out",
    "train": "main: wait, collect",
    "report": "main: report, figures",
    "spawning": "worker: spawn, import",
    "preparing": "stack: prepare its runs",
    "training": "stack: train",
    "writes": "stack: wait on durable writes",
    "tail": "tail: no work left",
}
CAUSE_LABELS = {
    "start": "before first stack",
    "waiting": "waiting for work",
    "tail": "tail",
    "end": "after last stack",
    "preparing": "preparing runs (off CPU)",
    "writes": "durable writes",
    "other": "other (off CPU in stacks)",
}


def draw_timeline(records: list[dict], summary: dict, path: Path) -> Path:
    """The figure of one sweep's records (attn.experiment.timeline.read_timeline) and their summary, at `path`."""
    header = next(r for r in records if r["event"] == "sweep")
    t0 = header["start"]
    stacks = sorted((r for r in records if r["event"] == "stack"), key=lambda r: r["start"])
    workers = list(dict.fromkeys(r["worker"] for r in stacks))
    last_end = max((r["end"] for r in stacks), default=t0)
    fig = Figure(figsize=(11, 2.6 + 0.45 * (len(workers) + 1)))
    grid = fig.add_gridspec(2, 1, height_ratios=[1 + 0.4 * len(workers), 1.4])
    ax, bars = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])

    def span(row: int, start: float, end: float, kind: str, height: float = 0.7, edge: bool = False) -> None:
        ax.broken_barh(
            [(start - t0, max(end - start, 0.0))],
            (row - height / 2, height),
            facecolor=COLORS[kind],
            edgecolor="white" if edge else "none",
            lw=0.5 if edge else 0,
        )

    for phase in (r for r in records if r["event"] == "phase"):
        span(0, phase["start"], phase["end"], phase["name"] if phase["name"] in COLORS else "train")
    for row, worker in enumerate(workers, start=1):
        mine = [r for r in stacks if r["worker"] == worker]
        if mine[0].get("worker_start") is not None:
            span(row, mine[0]["worker_start"], mine[0]["start"], "spawning")
        for r in mine:
            span(row, r["start"], r["trained"], "preparing")
            span(row, r["trained"], r["end"], "training", edge=True)  # white edges: where one stack ends
            for offset, seconds in r.get("write_moments", []):
                start = r["start"] + offset
                span(row, start, start + max(seconds, (last_end - t0) / 2000), "writes", height=0.45)
        span(row, mine[-1]["end"], last_end, "tail", height=0.3)
    ax.set_yticks(range(len(workers) + 1), ["main", *[f"worker {i}" for i in range(1, len(workers) + 1)]])
    ax.invert_yaxis()
    ax.set_xlim(0, summary["wall_s"])
    ax.set_xlabel("seconds since the sweep's process started")
    shown = {*(r["name"] for r in records if r["event"] == "phase"), "spawning", "preparing", "training", "writes"}
    shown |= {"tail"} if any(r["end"] < last_end for r in stacks) else set()
    ax.legend(
        handles=[Patch(color=COLORS[k], label=LABELS[k]) for k in COLORS if k in shown],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35),
        ncol=5,
        fontsize=7,
        frameon=False,
    )
    ax.set_title(
        f"{summary['runs']} runs in {summary['stacks']} stacks on {summary['workers']} workers: "
        f"{summary['wall_s']:.1f} s wall, {summary['cpu_s']:.1f} CPU-s, "
        f"{summary['cores_busy']:.2f} cores busy on average",
        fontsize=10,
    )

    idle = summary["core_idle_s"]
    causes = [c for c in IDLE_CAUSES if c in idle]
    bars.barh(
        ["CPU (every process)", *[CAUSE_LABELS[c] for c in causes]],
        [summary["cpu_s"], *[idle[c] for c in causes]],
        color=["#2ca02c", *["#7f7f7f"] * len(causes)],
    )
    for y, value in enumerate([summary["cpu_s"], *[idle[c] for c in causes]]):
        bars.annotate(f" {value:.1f}", (max(value, 0.0), y), va="center", fontsize=8)
    bars.invert_yaxis()
    bars.axvline(0, color="black", lw=0.6)
    bars.set_xlabel(f"core-seconds of {summary['workers']} cores x {summary['wall_s']:.1f} s: used, and idle by cause")
    bars.tick_params(axis="y", labelsize=8)
    return save_figure(fig, Path(path))
