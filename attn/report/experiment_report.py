"""An experiment's report: every cell's statistics, the rate each arm is
judged at, the expectations judged, and a conclusion generated from them.

Everything is computed from the experiment's run directories
(attn.analysis.results) and the experiment file (attn.experiment.spec); nothing in the
text is typed in. It writes, into the experiment directory:

    report.json   every cell's statistics, the selected settings, each
                  expectation (id, rule, verdict, the numbers behind it), the
                  platform the runs were made on, the conclusion
    report.md     the same for people: tables, verdicts, conclusion
    report.csv    one row per cell
    *.png         attn.report.experiment_figures

Where each (x, arm) is judged, and how an expectation is: attn.analysis.verdicts;
the conclusion's paragraph: attn.report.conclusion.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

import numpy as np

from attn.analysis import outcomes
from attn.analysis.grouping import format_value
from attn.analysis.results import COUNTED, Cell, Excluded, collect, in_order, lr_sensitivity, median, sort_key
from attn.analysis.verdicts import Layout, edge_notes, groups, json_number, judge, judged_cells, value_of
from attn.experiment.spec import Experiment, config_change
from attn.report import experiment_figures
from attn.report.conclusion import arm_sentences, headline
from attn.store import locks, runs


# ---------------------------------------------------------------------------
# Cell figures as JSON and as table rows
# ---------------------------------------------------------------------------
def cell_json(cell: Cell) -> dict:
    km = cell.time()
    return {
        "settings": {k: json_number(value_of(v)) for k, v in cell.settings.items()}, "n": cell.n,
        "unfinished": dict(cell.unfinished), "budget": cell.budget,
        "outcomes": {name: cell.count(name) for name in outcomes.OUTCOMES},
        **{f"{name}_rate": cell.rate(name) for name in COUNTED},
        "median_time": {"median": km.median, "low": km.low, "high": km.high},
        "final_loss": {k: json_number(v) for k, v in cell.final_loss().items()},
        "final_losses": [json_number(v) for v in cell.final_losses()],
        "theory_score_std": cell.theory_score_std,
        "at_init": {k: _mean(cell.at_init(k)) for k in ("score_std", "attn_entropy", "saturated_frac",
                                                          "grad_norm/W_q", "grad_norm/W_k")},
        "seeds": [{"seed": s.seed, "run": s.run.path.name, "outcome": s.outcome.outcome,
                   "reached_step": s.outcome.reached_step, "left_plateau_step": s.outcome.left_plateau_step,
                   "final_accuracy": s.outcome.final_accuracy, "final_loss": json_number(s.final_loss),
                   "best_accuracy": s.outcome.best_accuracy, "path": s.path_digest, "mechanism": s.mechanism}
                  for s in cell.seeds],
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _rate_text(rate: dict) -> str:
    return f"{rate['k']}/{rate['n']} [{rate['low']:.2f}, {rate['high']:.2f}]" if rate["n"] else "—"


def _time_text(cell: Cell) -> str:
    km = cell.time()
    if not cell.n:
        return "—"
    if km.median is None:
        return f"not reached (> {cell.budget})"
    low = "?" if km.low is None else f"{km.low:g}"
    high = f"> {cell.budget}" if km.high is None else f"{km.high:g}"
    return f"{km.median:g} [{low}, {high}]"


def _loss_text(cell: Cell) -> str:
    loss = cell.final_loss()
    if loss["median"] is None:
        return "—"
    return f"{loss['median']:.3g} [{loss['low']:.3g}, {loss['high']:.3g}]"


def table_rows(cells: list[Cell], layout: Layout, keys: list[str]) -> list[dict]:
    rows = []
    for cell in cells:
        row = {layout.names[k]: format_value(cell.settings[k]) if k in cell.settings else "—" for k in keys}  # — : a block that does not set k
        row.update({
            "seeds": cell.n,
            **{name: cell.count(name) for name in outcomes.OUTCOMES},
            "success [95%]": _rate_text(cell.rate("success")),
            f"median steps to {outcomes.THRESHOLD:.0%} [95%]": _time_text(cell),
            "median final loss [95%]": _loss_text(cell),
            "unfinished": ", ".join(f"{n} {s}" for s, n in sorted(cell.unfinished.items())) or "—",
        })
        rows.append(row)
    return rows


def markdown_table(rows: list[dict]) -> str:
    return runs.markdown_table(list(rows[0]), [list(map(str, row.values())) for row in rows]) if rows else "(none)"


def mechanism_rows(cells: dict[tuple, Cell], layout: Layout, steps: list[int]) -> list[dict]:
    """Per judged cell: score std at init against theory, and the row
    mechanism (attn.model.mechanism.summary, median over seeds) at each step."""
    rows = []
    for (x, arm), cell in cells.items():
        row = {layout.x_name: layout.x_label(x), "arm": layout.arm_label(arm),
               "score std @0 (theory)": f"{_fmt(_mean(cell.at_init('score_std')))} ({cell.theory_score_std:.3g})"}
        for step in steps:
            row[f"saturated @{step}"] = _fmt(median(cell.mechanism(step, "saturated_frac")))
            row[f"‖∇W_q‖ saturated / other @{step}"] = (f"{_fmt(median(cell.mechanism(step, 'grad_W_q_median_saturated')))}"
                                                       f" / {_fmt(median(cell.mechanism(step, 'grad_W_q_median_other')))}")
            row[f"top-10% share of ‖∇W_q‖² @{step}"] = _fmt(median(cell.mechanism(step, "grad_W_q_top_share")))
        rows.append(row)
    return rows


def _fmt(value) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"


# ---------------------------------------------------------------------------
# The platform the runs were made on
# ---------------------------------------------------------------------------
def platforms(cells: list[Cell]) -> dict[str, list[str]]:
    """Each provenance fact (cpu, blas, openblas_coretype, dtype, attn_commit,
    numpy) -> its distinct values over the runs reported."""
    facts: dict[str, set] = {}
    for seed in (s for c in cells for s in c.seeds):
        try:
            data = runs.read_run_config(seed.run.path)
        except runs.RunError:  # it was read when the cell was collected: gone or damaged since
            continue
        provenance = data.get("provenance") or {}
        for key in ("cpu", "blas", "openblas_coretype", "attn_commit", "numpy"):
            facts.setdefault(key, set()).add(str(provenance.get(key)))
        facts.setdefault("dtype", set()).add(str(data.get("dtype")))
    return {k: sorted(v) for k, v in facts.items()}


# ---------------------------------------------------------------------------
# Writing it all
# ---------------------------------------------------------------------------
def write_report(experiment: Experiment) -> dict[str, Path]:
    """Compute the report of an experiment from its run directories and write
    report.json, report.md, report.csv and the figures into the experiment
    directory, holding its locks.RunLock (one report writer at a time)."""
    out = experiment.directory
    cells, excluded = collect(experiment, config_change)
    if not any(c.seeds for c in cells):
        left_out = f" ({len(excluded)} left out: {excluded[0].name}: {excluded[0].reason}, ...)" if excluded else ""
        raise runs.RunError(f"{out}: no finished runs of this experiment yet{left_out}; "
                            f"run `attn sweep {experiment.path}` first")
    with locks.RunLock(out, "report"):
        return _write(experiment, [c for c in cells if c.n or c.unfinished], excluded)


def _write(experiment: Experiment, cells: list[Cell], excluded: list[Excluded]) -> dict[str, Path]:
    out, layout = experiment.directory, Layout(experiment)
    best = judged_cells(cells, layout, "best")
    shared = judged_cells(cells, layout, "shared") if experiment.report.shared is not None else {}
    sensitivities = ({key: lr_sensitivity(group, layout.best_of) for key, group in groups(cells, layout).items()}
                     if experiment.report.sensitivity else {})
    judged = [judge(e, cells, layout, sensitivities) for e in experiment.report.expect]
    steps = sorted({int(step) for c in cells for s in c.seeds for step in s.mechanism})
    keys = layout.x + layout.arm + ([layout.best_of] if layout.best_of else [])
    ordered = sorted(cells, key=lambda c: [sort_key(value_of(c.settings.get(k))) for k in keys])
    at_lengths = length_results(best, experiment) if experiment.report.lengths else {}
    summary_text = headline(best, shared, layout, judged, sensitivities, at_lengths)
    data = {
        "experiment": experiment.name, "file": str(experiment.path), "description": experiment.description.strip(),
        "runs": sum(c.n for c in cells) + sum(sum(c.unfinished.values()) for c in cells),
        "cells_in_file": len(experiment.cells), "platform": platforms(cells),
        "definitions": outcomes.definitions(), "layout": {"x": layout.x, "arm": layout.arm, "best_of": layout.best_of,
                                                          "select": list(experiment.report.select),
                                                          "shared": json_number(experiment.report.shared)},
        "cells": [cell_json(c) for c in ordered],
        "best": [{"x": list(x), "arm": list(arm), "settings": cell_json(c)["settings"]} for (x, arm), c in best.items()],
        "expectations": [{**j, "points": [{k: json_number(v) for k, v in p.items()} for p in j["points"]]} for j in judged],
        "headline": summary_text, "excluded": [e.__dict__ for e in excluded],
        "sensitivity": [{"x": list(x), "arm": list(arm), **{k: json_number(v) for k, v in value.items()}}
                        for (x, arm), value in sensitivities.items()],
        "sensitivity_table": markdown_table(sensitivity_rows(sensitivities, layout)) if sensitivities else None,
    }
    data["lengths"] = [{"x": list(x), "arm": list(arm), "pairs": {str(P): v for P, v in by_length.items()}}
                       for (x, arm), by_length in at_lengths.items()]
    paths = {"json": out / "report.json", "md": out / "report.md", "csv": out / "report.csv"}
    runs.write_json(paths["json"], data, indent=None)  # every cell and seed: compact, it is read by programs
    runs.write_atomic(paths["csv"], _csv_text(table_rows(ordered, layout, keys)).encode())
    paths.update(experiment_figures.draw_all(experiment, groups(cells, layout), layout, best, shared, steps,
                                         sensitive=bool(sensitivities), at_lengths=at_lengths))
    runs.write_atomic(paths["md"], markdown(experiment, cells, layout, best, shared, judged, steps, excluded,
                                            summary_text, data["platform"], paths, sensitivities, at_lengths,
                                            data["sensitivity_table"]).encode())
    return paths


def _csv_text(rows: list[dict]) -> str:
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buffer.getvalue()


def length_results(best: dict, experiment: Experiment) -> dict:
    """(x, arm) -> P -> {statistic: [one value per seed]}: each judged cell's
    finished seeds asked about retrieval with P pairs (attn.analysis.lengths)."""
    from attn.analysis import lengths

    out = {}
    for key, cell in best.items():
        by_length: dict[int, dict[str, list]] = {}
        for seed in cell.seeds:
            if seed.outcome.outcome == outcomes.DIVERGED:
                continue
            config = next(c.config for c in experiment.cells if c.name == seed.run.path.name)
            for P, figures in lengths.at_lengths(seed.run.path, config, list(experiment.report.lengths)).items():
                for name, value in figures.items():
                    by_length.setdefault(P, {}).setdefault(name, []).append(value)
        out[key] = by_length
    return out


def length_rows(at_lengths: dict, layout: Layout) -> list[dict]:
    """One row per judged cell: the median over seeds of the attention on the queried key, and of the accuracy, per P."""
    rows = []
    for (x, arm), by_length in at_lengths.items():
        row = {layout.x_name: layout.x_label(x), "arm": layout.arm_label(arm)}
        for P, figures in sorted(by_length.items()):
            row[f"{P} pairs: attention on the key / accuracy"] = (
                f"{np.median(figures['target_attn']):.3f} / {np.median(figures['accuracy']):.3f}")
        rows.append(row)
    return rows


def sensitivity_rows(sensitivities: dict, layout: Layout) -> list[dict]:
    """One row per arm: its learning-rate sensitivity at each x, with the interval."""
    xs = in_order(x for x, _ in sensitivities)
    rows = []
    for arm in in_order(a for _, a in sensitivities):
        row = {"arm": layout.arm_label(arm)}
        for x in xs:
            value = sensitivities.get((x, arm))
            row[f"{layout.x_name} = {layout.x_label(x)}"] = "—" if not value or value["sensitivity"] is None else \
                f"{value['sensitivity']:.3g} [{value['low']:.3g}, {value['high']:.3g}] ({value['seeds']} seeds)"
        rows.append(row)
    return rows


def markdown(experiment, cells, layout, best, shared, judged, steps, excluded, summary_text, platform, paths,
             sensitivities, at_lengths, sensitivity_table) -> str:
    keys = layout.x + layout.arm + ([layout.best_of] if layout.best_of else [])
    n_runs = sum(c.n for c in cells)
    facts = "; ".join(f"{k}: {', '.join(v)}" for k, v in platform.items())
    text = [f"# {experiment.name}", "", experiment.description.strip(), "",
            f"{n_runs} finished runs of {len(experiment.cells)} from `{experiment.path}`; x = "
            + ", ".join(f"`{k}`" for k in layout.x)
            + (", arms = " + ", ".join(f"`{a}`" for a in layout.arm) if layout.arm else ", one arm (no arm key: every run)")
            + (f", each judged at the `{layout.best_of}` chosen by the rule declared in the file: "
               + ", then ".join(f"`{c}`" for c in experiment.report.select) + " (ties: the smaller value)"
               if layout.best_of else "") + ".", "", f"Made on: {facts}.", "",
            "## In one paragraph (generated)", "", summary_text, "",
            "## Outcome classes", "", outcomes.definitions(), ""]
    for title, chosen in (("each arm at its own best " + (layout.best_of or "setting"), best),
                          (f"every arm at the shared {layout.best_of} = {format_value(experiment.report.shared)}", shared)):
        if chosen:
            text += [f"## Headline: {title}", "", markdown_table(table_rows(list(chosen.values()), layout, keys)), ""]
            text += arm_sentences(chosen, layout, "best" if chosen is best else "shared") + [""]
    if layout.best_of:
        text += edge_notes(cells, layout) + [""]
    if judged:
        text += ["## Expectations, judged", ""]
        for j in judged:
            text.append(f"- **{j['id']}** — {j['claim']}: **{j['verdict']}**. Rule: {j['rule']}.")
            for p in j["points"]:
                numbers = p.get("note") or (f"{p['value']:.3g} [{p['low']:.3g}, {p['high']:.3g}]"
                                            + (f" vs {p['other_value']:.3g} [{p['other_low']:.3g}, {p['other_high']:.3g}]"
                                               if "other_value" in p else ""))
                text.append(f"  - {layout.x_name} = {' / '.join(map(str, p['x']))}: {numbers} → {p['verdict']}")
        text.append("")
    if sensitivities:
        rates = next(iter(sensitivities.values()))["rates"]
        text += [f"## Learning-rate sensitivity over {layout.best_of} in {', '.join(map(format_value, rates))}", "",
                 "Per seed run at every rate: the mean over the rates of min(final loss, loss at initialisation) "
                 "minus the seed's best final loss (0: every rate as good as the best; Wortsman et al.); the mean "
                 "over seeds, bootstrap 95% interval.", "", sensitivity_table, ""]
    if at_lengths:
        text += ["## Longer contexts than trained on (median over seeds)", "",
                 f"Each arm's model at its best setting, asked about retrieval with more pairs (attn.analysis.lengths: "
                 f"{', '.join(map(str, experiment.report.lengths))}); the attention it puts on the queried key and "
                 "its accuracy.", "", markdown_table(length_rows(at_lengths, layout)), ""]
    if steps:
        text += ["## The mechanism, measured (median over seeds)", "",
                 markdown_table(mechanism_rows(best, layout, steps)), ""]
    text += ["## Every cell", "", markdown_table(table_rows(sorted(cells, key=lambda c: [
        sort_key(value_of(c.settings.get(k))) for k in keys]), layout, keys)), ""]
    if excluded:
        text += [f"## Runs left out ({len(excluded)})", ""] + [f"- `{e.name}`: {e.reason}" for e in excluded] + [""]
    figures = [p for p in paths.values() if p.suffix == ".png"]
    text += ["## Figures", ""] + [f"![{p.stem}]({os.path.relpath(p, experiment.directory)})" for p in figures] + [""]
    return "\n".join(text)
