"""`attn bench`: every measurement of attn.bench, as one result, its table and its files.

    attn bench [--sizes default,wide,copy,large] [--threads 1,2] [--steps 50] [--warmup 10]
               [--rivals torch,torch.compile,jax] [--no-processes] [--headline] [--out runs/bench]
    attn bench --headline --only model.d_k=65536 [--headline-code DIR ... --rounds 2]

The step timings (attn.bench.timing, one child process per thread count),
then, unless --no-processes, the peak memory of a training process at each
size and the sweep measurements (attn.bench.sweeps); --headline adds the
headline experiment's wall time, CPU seconds and cores busy, with its
timeline (attn.experiment.timeline) as a figure beside the result. With
--only, the headline's part that it leaves is measured alone (nothing else
is timed, and the files are named headline-<time>, so that `attn publish`
never takes them for a benchmark); --headline-code DIR (repeatable) sweeps other
checkouts' code in the same rounds as this one, the order turned each round. The targets are ratios measured side by
side in one run: attn's step over the fastest rival's (at most
step_target(size) at every thread count), the sweep's efficiency (at least
TARGET_EFFICIENCY) and the speed-up of one worker per core over one worker
(at least TARGET_SPEEDUP on two cores); the table says which are met.
Beside attn's step time, its calls per step (attn.bench.calls): numpy's,
and function calls of any kind, the overhead that is the step at small sizes.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Callable

from attn.bench import rivals, sweeps, timing
from attn.store import runs
from attn.text import markdown_table
from attn.train import lifecycle

TARGET_STEP_RATIO = 0.7
# issue 21: at `default` numpy's per-call overhead is the step, at `wide` (d_k 4096) attn runs width-free
TARGET_STEP_RATIOS = {"default": 1.0, "wide": 0.5}
TARGET_WIDTH_RATIO = 1.5  # a step at d_k 2^20 over a step at d_k 64 (attn.bench.timing.width_ratio)
TARGET_EFFICIENCY = 0.8
TARGET_SPEEDUP = 1.8
TARGET_OLD_GRID_SECONDS = 30.0
TARGET_HEADLINE_SECONDS = 300.0
TARGET_CORES_BUSY_SHARE = 0.9  # issue 49: the headline keeps >= 1.8 of 2 cores busy on average


def run_suite(
    sizes: list[str],
    threads: list[int],
    warmup: int = 10,
    steps: int = 50,
    processes: bool = True,
    headline: bool = False,
    frameworks=rivals.FRAMEWORKS,
    progress: Callable[[str], None] = lambda message: None,
    only: tuple[str, ...] = (),
    other_codes: tuple[Path, ...] = (),
    rounds: int = 1,
) -> dict:
    """Every measurement, as one JSON-ready dict; `frameworks`: the rivals to time (those installed).
    With `only` (the headline's --only restrictions), the headline's part alone and its work
    (attn.bench.sweeps.headline_wall_time: `other_codes`, `rounds`); nothing else is timed."""
    headline_alone = bool(only)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "warmup": warmup,
        "steps": steps,
        "attn_commit": lifecycle.source_revision(),
        "machine": {
            "cpu": lifecycle.cpu_model(),
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            **lifecycle.platform_facts(),
        },
        "rivals": {f: ("installed" if rivals.available(f) else "not installed") for f in frameworks},
        "timings": []
        if headline_alone
        else [timing.timed_in_child(sizes, n, warmup, steps, progress, frameworks) for n in threads],
    }
    if processes and not headline_alone:
        result["memory"] = []
        for name in sizes:
            progress(f"peak memory of a training process at size {name}")
            result["memory"].append(sweeps.training_peak_memory(name))
        result["sweep"] = sweeps.sweep_scaling(progress)
    result["work"] = sweeps.headline_work(progress, only)
    if headline or headline_alone:
        result["headline"] = sweeps.headline_wall_time(progress, only, other_codes, rounds)
    return result


def work_line(work: dict, headline: dict | None = None) -> str:
    """The headline's counted work and the least time it takes here, against the headline target; with the
    headline measured (of the same runs), its wall time, CPU seconds and cores busy against that floor."""
    share = work["least_seconds"] / TARGET_HEADLINE_SECONDS
    part = f", {_only(work['only'])}" if work.get("only") else ""
    line = (
        f"the headline's head products alone ({work['runs']} runs{part}) are "
        f"{work['head_multiply_adds'] / 1e12:.3g} T multiply-adds: at least {work['least_seconds']:.0f} s on "
        f"{work['cores']} cores at this machine's {2 * work['matmul_rate_per_core'] / 1e9:.0f} GFLOP/s per core "
        f"(a {sweeps.PEAK_PRODUCT_SIZE}³ float32 product at 1 thread)"
    )
    if not work.get("only"):
        line += (
            f", so meeting ≤ {TARGET_HEADLINE_SECONDS:.0f} s would need {share:.0%} of that rate, sustained, "
            "from any implementation of this algorithm"
        )
    if headline is not None and "cpu_s" in headline and headline["runs"] == work["runs"]:
        floor_cpu = work["least_seconds"] * work["cores"]
        line += (
            f"; measured: {headline['wall_s']:.0f} s wall ({work['least_seconds'] / headline['wall_s']:.0%} of "
            f"that rate on {work['cores']} cores), {headline['cpu_s']:.0f} CPU-s "
            f"({floor_cpu / headline['cpu_s']:.0%} of it per CPU-second), {headline['cores_busy']:.2f} of "
            f"{work['cores']} cores busy on average"
        )
    return line


def _only(only: list[str]) -> str:
    return " ".join(f"--only {text}" for text in only)


def step_target(size: str) -> float:
    """The most attn's step may take over the fastest rival's at `size`."""
    return TARGET_STEP_RATIOS.get(size, TARGET_STEP_RATIO)


def _ratio(size: dict) -> str:
    """attn / fastest at one size, against its target."""
    ratio, target = size["ratio_to_fastest"], step_target(size["size"])
    return "—" if ratio is None else f"{ratio:.2f} ({_met(ratio <= target)} at ≤ {target})"


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def steps_table(result: dict) -> str:
    """One row per size and thread count: attn against every rival, the fastest named."""
    sides = sorted({side for t in result["timings"] for s in t["sizes"] for side in s["sides"] if side != "attn"})
    header = [
        "size",
        "task, B×T (P), d_model, d_k",
        "threads",
        "attn's head",
        "attn calls / step (numpy; all)",
        "attn ms",
        *[f"{s} ms" for s in sides],
        "fastest rival",
        "attn / fastest",
    ]
    rows = []
    for t in result["timings"]:
        for s in t["sizes"]:
            shape = s["shape"]
            rows.append(
                [
                    s["size"],
                    f"{shape['task']}, {shape['B']}×{shape['T']} ({shape['P']}), {shape['d_model']}, {shape['d_k']}",
                    str(t["threads"]),
                    s["association"],
                    f"{s['attn_calls']['numpy']:.0f}; {s['attn_calls']['functions']:.0f}",
                    _ms(s["sides"]["attn"]),
                    *[_ms(s["sides"][side]) if side in s["sides"] else "—" for side in sides],
                    s["fastest_rival"] or "none installed",
                    _ratio(s),
                ]
            )
    return markdown_table(header, rows)


def _ms(stats: dict) -> str:
    return f"{stats['median_ms']:.3g} ({stats['p25_ms']:.3g}–{stats['p75_ms']:.3g})"


def _commit(result: dict) -> str:
    return result.get("attn_commit") or "of unknown commit"


def bench_markdown(result: dict) -> str:
    machine = result["machine"]
    lines = [
        f"### attn benchmark: {result['date']}, {machine['cpu']}, {machine['cores']} cores, attn {_commit(result)}",
        "",
        f"numpy with {machine['blas']}; OPENBLAS_CORETYPE={machine['openblas_coretype']}; rivals: "
        + ", ".join(f"{k} {v}" for k, v in result["rivals"].items())
        + ".",
    ]
    if result["timings"]:
        lines += [
            "",
            f"Training step (forward, backward, SGD update; float32), median (interquartile range) of "
            f"{result['steps']} steps after {result['warmup']} warm-up steps, every side in alternating rounds; "
            "rivals in attn's algorithm (projected) and reassociated (bilinear):",
            "",
            steps_table(result),
        ]
    for t in result["timings"]:
        if "width" in t:
            lines += ["", f"At {t['threads']} thread(s): " + width_line(t["width"])]
        if "subnormal" in t:
            lines += ["", f"At {t['threads']} thread(s): " + subnormal_line(t["subnormal"])]
        if t.get("lookup"):
            lines += ["", f"At {t['threads']} thread(s): " + lookup_line(t["lookup"])]
    for t in result["timings"]:
        losses = "; ".join(
            f"{s['size']}: " + ", ".join(f"{k} {v['loss_after']:.5g}" for k, v in s["sides"].items())
            for s in t["sizes"]
        )
        lines += [
            "",
            f"Loss after the timed steps at {t['threads']} thread(s) (every side computed the same thing): {losses}.",
        ]
    if "memory" in result:
        memory = ", ".join(f"{m['size']} {m['peak_rss_mib']:.0f} MiB" for m in result["memory"])
        lines += ["", f"Peak memory (ru_maxrss) of `attn train` for {result['memory'][0]['steps']} steps: {memory}."]
    if "sweep" in result:
        sweep = result["sweep"]
        parts = [
            f"{r['workers']} worker(s): {r['wall_s']:.1f} s wall, {r['runs']} runs in {r['stacks']} stacks, "
            f"efficiency {r['efficiency']:.0%} ({_met(r['efficiency'] >= TARGET_EFFICIENCY)} "
            f"at ≥ {TARGET_EFFICIENCY:.0%})"
            for r in sweep["results"]
        ]
        last = sweep["results"][-1]
        lines += ["", "Sweep of the old headline grid (50 runs of 500 steps): " + "; ".join(parts) + "."]
        if sweep["speedup"] is not None:
            lines.append(
                f"Speed-up of {last['workers']} workers over 1: {sweep['speedup']:.2f}× "
                f"({_met(sweep['speedup'] >= TARGET_SPEEDUP)} at ≥ {TARGET_SPEEDUP}×); its wall time "
                f"{last['wall_s']:.1f} s ({_met(last['wall_s'] <= TARGET_OLD_GRID_SECONDS)} at "
                f"≤ {TARGET_OLD_GRID_SECONDS:.0f} s)."
            )
    if "headline" in result:
        lines += ["", *headline_lines(result["headline"])]
    if "work" in result:
        lines += ["", f"Work: {work_line(result['work'], result.get('headline'))}."]
    return "\n".join(lines) + "\n"


def headline_lines(h: dict) -> list[str]:
    """The headline's sweep: wall time, CPU seconds, cores busy (against the targets), its timeline's
    idle core-seconds by cause and phases, and every measurement when there were several (of a
    benchmark made before the sweep's CPU seconds were measured: its wall time and efficiency)."""
    if "measured" not in h:
        return [
            f"The headline experiment ({h['experiment']}: {h['runs']} runs in {h['stacks']} stacks) on "
            f"{h['workers']} workers: {h['wall_s']:.0f} s ({_met(h['wall_s'] <= TARGET_HEADLINE_SECONDS)} at "
            f"≤ {TARGET_HEADLINE_SECONDS:.0f} s), efficiency {h['efficiency']:.0%}."
        ]
    part = f", {_only(h['only'])}" if h.get("only") else ""
    stacks = f" in {h['stacks']} stacks" if h.get("stacks") else ""
    target = TARGET_CORES_BUSY_SHARE * h["workers"]
    wall = (
        f"{h['wall_s']:.0f} s wall ({_met(h['wall_s'] <= TARGET_HEADLINE_SECONDS)} at "
        f"≤ {TARGET_HEADLINE_SECONDS:.0f} s)"
        if not h.get("only")
        else f"{h['wall_s']:.0f} s wall"
    )
    mine = [m for m in h["measured"] if m["code"] == sweeps.THIS_CODE]
    median = f"median of {len(mine)}: " if len(mine) > 1 else ""
    lines = [
        f"The headline experiment ({h['experiment']}{part}: {h['runs']} runs{stacks}) swept as `attn sweep` "
        f"does, report included, on {h['workers']} workers: {median}{wall}, {h['cpu_s']:.0f} CPU-s of every "
        f"process, {h['cores_busy']:.2f} cores busy on average ({_met(h['cores_busy'] >= target)} at "
        f"≥ {target:.2g})" + (f", efficiency {h['efficiency']:.0%}" if h.get("efficiency") is not None else "") + ".",
    ]
    first = next((m for m in mine if m["timeline"]), None)
    if first is not None:
        lines += ["", timeline_line(first["timeline"], first.get("timeline_files", []))]
    if len(h["measured"]) > 1:
        rows = [
            [
                str(m["round"]),
                m["code"],
                f"{m['wall_s']:.1f}",
                f"{m['cpu_s']:.1f}",
                f"{m['cores_busy']:.2f}",
                str(m["exit_code"]),
                ", ".join(m.get("timeline_files", [])) or "—",
            ]
            for m in h["measured"]
        ]
        lines += [
            "",
            "Each sweep of the headline, in the order run (side by side: the codes alternate, so that load "
            "elsewhere hits both alike):",
            "",
            markdown_table(["round", "code", "wall s", "CPU s", "cores busy", "exit", "timeline"], rows),
        ]
    return lines


def timeline_line(summary: dict, files: list[str]) -> str:
    """A sweep's timeline in one paragraph: idle core-seconds by cause, the main process's phases, the stacks."""
    from attn.experiment.timeline import IDLE_CAUSES

    idle = summary["core_idle_s"]
    causes = "; ".join(f"{IDLE_CAUSES[c]} {idle[c]:.1f}" for c in IDLE_CAUSES if c in idle)
    phases = ", ".join(f"{name} {p['seconds']:.1f} s ({p['cpu_s']:.1f} CPU-s)" for name, p in summary["phases"].items())
    shown = f" (figure: {', '.join(files)}, beside this file)" if files else ""
    return (
        f"Its timeline{shown}: {summary['workers']} cores x {summary['wall_s']:.1f} s = "
        f"{summary['workers'] * summary['wall_s']:.1f} core-seconds, {summary['cpu_s']:.1f} of them used; "
        f"idle core-seconds by cause: {causes}. Main process: {phases}. Stacks: "
        f"{summary['stack_seconds']:.1f} s in all ({summary['stack_cpu_s']:.1f} CPU-s), "
        f"{summary['preparing_s']:.1f} s of it preparing runs, {summary['core_idle_s']['writes']:.1f} s "
        f"waiting on {summary['write_moments']} moments of durable writes; the first began "
        f"{summary['first_stack_s']:.1f} s after the sweep's process, the last ended at "
        f"{summary['last_stack_end_s']:.1f} s."
    )


def width_line(width: dict) -> str:
    """The width comparison: a step at d_k 2^20 against one at d_k 64, same d_model."""
    sides = ", ".join(
        f"d_k {d_k} {_ms(side)} ms ({'width-free' if side['width_free'] else 'materialized'})"
        for d_k, side in width["sides"].items()
    )
    return (
        f"step {sides}; ratio {width['ratio']:.2f} ({_met(width['ratio'] <= TARGET_WIDTH_RATIO)} at "
        f"≤ {TARGET_WIDTH_RATIO})."
    )


def subnormal_line(subnormal: dict) -> str:
    """The subnormal comparison: a step whose gradients are subnormal, with them kept and flushed to zero."""
    return (
        f"forward and backward of the materialized head at d_k 4096 with gradients as small as a saturated "
        f"run's, subnormals kept {_ms(subnormal['sides']['kept'])} ms, flushed to zero as training runs "
        f"{_ms(subnormal['sides']['flushed'])} ms: {subnormal['ratio']:.1f}× (attn.train.denormals)."
    )


def lookup_line(compared: list[dict]) -> str:
    """X formed against its products looked up through the embedding tables, at each size where the head can."""
    parts = [
        f"{c['size']} formed {_ms(c['sides']['formed'])} ms, looked up {_ms(c['sides']['looked up'])} ms, "
        f"{c['ratio']:.2f}× (the rule: {c['rule']})"
        for c in compared
    ]
    return (
        "forward and backward with X formed and with its products taken through the embedding tables "
        "(attn.model.pairs.LazyEmbeddings): " + "; ".join(parts) + "."
    )


def summary_markdown(result: dict) -> str:
    """The short form for README (attn.results_text.bench_block): per size and thread count,
    attn against the fastest rival, then the sweep and headline targets."""
    machine = result["machine"]
    rows = [
        [
            s["size"],
            str(t["threads"]),
            _ms(s["sides"]["attn"]),
            s["fastest_rival"] or "none installed",
            _ms(s["sides"][s["fastest_rival"]]) if s["fastest_rival"] else "—",
            _ratio(s),
        ]
        for t in result["timings"]
        for s in t["sizes"]
    ]
    lines = [
        f"Measured {result['date']} on {machine['cpu']} ({machine['cores']} cores), attn "
        f"{_commit(result)}, numpy on {machine['blas']}; "
        "step times in ms, median (interquartile range):",
        "",
        markdown_table(["size", "threads", "attn", "fastest rival", "its time", "attn / fastest"], rows),
    ]
    targets = []
    if "sweep" in result:
        sweep = result["sweep"]
        last = sweep["results"][-1]
        targets.append(
            "sweep efficiency "
            + ", ".join(f"{r['efficiency']:.0%} with {r['workers']} worker(s)" for r in sweep["results"])
            + f" ({_met(all(r['efficiency'] >= TARGET_EFFICIENCY for r in sweep['results']))} "
            f"at ≥ {TARGET_EFFICIENCY:.0%})"
        )
        if sweep["speedup"] is not None:
            targets.append(
                f"{last['workers']} workers {sweep['speedup']:.2f}× faster than 1 "
                f"({_met(sweep['speedup'] >= TARGET_SPEEDUP)} at ≥ {TARGET_SPEEDUP}×)"
            )
        targets.append(
            f"the old 50-run grid in {last['wall_s']:.1f} s "
            f"({_met(last['wall_s'] <= TARGET_OLD_GRID_SECONDS)} at ≤ {TARGET_OLD_GRID_SECONDS:.0f} s)"
        )
    if "headline" in result:
        h = result["headline"]
        targets.append(
            f"the headline experiment ({h['runs']} runs) in {h['wall_s']:.0f} s "
            f"({_met(h['wall_s'] <= TARGET_HEADLINE_SECONDS)} at ≤ {TARGET_HEADLINE_SECONDS:.0f} s)"
        )
    if "work" in result:
        targets.append(work_line(result["work"], result.get("headline")))
    if targets:
        lines += ["", "Sweeps:", "", *(f"- {target}" for target in targets)]  # a line each: README keeps lines short
    return "\n".join(lines) + "\n"


def write(result: dict, out_dir: Path) -> dict[str, Path]:
    """bench-<time>.json and .md in out_dir (headline-<time> when the headline's part was measured
    alone), with each headline sweep's timeline beside them (-timeline[-N].jsonl and .png, drawn by
    attn.report.timeline_figure); returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    kind = "headline" if result.get("headline", {}).get("only") else "bench"
    stem = out_dir / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    paths = {"json": stem.with_suffix(".json"), "md": stem.with_suffix(".md")}
    measured = result.get("headline", {}).get("measured", [])
    with_timeline = [m for m in measured if m.get("timeline_records")]
    for n, m in enumerate(with_timeline, start=1):
        name = f"{stem.name}-timeline" + (f"-{n}" if len(with_timeline) > 1 else "")
        records = m.pop("timeline_records")
        runs.write_atomic(out_dir / f"{name}.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode())
        paths[f"timeline{n}"] = _draw_timeline(records, m["timeline"], out_dir / f"{name}.png")
        m["timeline_files"] = [f"{name}.png", f"{name}.jsonl"]
    for m in measured:
        m.pop("timeline_records", None)
    runs.write_json(paths["json"], result)
    runs.write_atomic(paths["md"], bench_markdown(result).encode())
    return paths


def _draw_timeline(records: list[dict], summary: dict, path: Path) -> Path:
    from attn.report.timeline_figure import draw_timeline  # matplotlib only when a timeline is drawn

    return draw_timeline(records, summary, path)
