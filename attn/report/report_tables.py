"""An experiment's cells as report.json holds them and as the report's tables hold them: each cell's figures
(success with its interval, the time to 99%, the final loss) as JSON and as rows, the counts at each threshold,
every setting, the mechanism, the stalls, the lengths and the rate sensitivities, and rows as Markdown or CSV.
attn.report.experiment_report puts them into the report's files."""

from __future__ import annotations

import csv
import io

import numpy as np

from attn import outcomes
from attn.analysis.results import COUNTED, SELF_ATTENDING, CellResult, in_order, median, sort_key
from attn.analysis.verdicts import Layout, at_every
from attn.text import format_value, json_number, markdown_table, number_said, settings_json, value_of


def cell_json(cell: CellResult) -> dict:
    km = cell.time()
    return {
        "settings": settings_json(cell.settings),
        "n": cell.n,
        "unfinished": dict(cell.unfinished),
        "budget": cell.budget,
        "outcomes": {name: cell.count(name) for name in outcomes.OUTCOMES},
        "slow_kinds": cell.slow_kinds(),
        "sat_at": cell.sat_at(),
        "at_thresholds": {f"{t:g}": cell.counts_at(t) for t in outcomes.THRESHOLDS},
        **{f"{name}_rate": cell.rate(name) for name in COUNTED},
        "median_time": {"median": km.median, "low": km.low, "high": km.high},
        "final_loss": {k: json_number(v) for k, v in cell.final_loss().items()},
        "final_losses": [json_number(v) for v in cell.final_losses()],
        "theory_score_std": json_number(cell.theory_score_std),
        "at_init": {
            k: _mean(cell.at_init(k))
            for k in ("score_std", "attn_entropy", "saturated_frac", "grad_norm/W_q", "grad_norm/W_k")
        },
        "seeds": [
            {
                "seed": s.seed,
                "run": s.run.path.name,
                "outcome": s.outcome.outcome,
                "reached_step": s.outcome.reached_step,
                "left_plateau_step": s.outcome.left_plateau_step,
                "final_accuracy": s.outcome.final_accuracy,
                "final_loss": json_number(s.final_loss),
                "best_accuracy": s.outcome.best_accuracy,
                "slow_kind": s.outcome.slow_kind,
                "sat_at": s.outcome.sat_at,
                "path": s.path_digest,
                "mechanism": s.mechanism,
            }
            for s in cell.seeds
        ],
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _rate_text(rate: dict) -> str:
    return f"{rate['k']}/{rate['n']} [{rate['low']:.2f}, {rate['high']:.2f}]" if rate["n"] else "—"


def _time_text(cell: CellResult) -> str:
    km = cell.time()
    if not cell.n:
        return "—"
    if km.median is None:
        return f"not reached (> {cell.budget})"
    low = "?" if km.low is None else f"{km.low:g}"
    high = f"> {cell.budget}" if km.high is None else f"{km.high:g}"
    return f"{km.median:g} [{low}, {high}]"


def _loss_text(cell: CellResult) -> str:
    loss = cell.final_loss()
    if loss["median"] is None:
        return "—"
    return f"{loss['median']:.3g} [{loss['low']:.3g}, {loss['high']:.3g}]"


def cell_rows(cells: list[CellResult], layout: Layout, keys: list[str]) -> list[dict]:
    rows = []
    for cell in cells:
        row = {
            layout.names[k]: format_value(cell.settings[k]) if k in cell.settings else "—" for k in keys
        }  # — : a block that does not set k
        row.update(
            {
                "seeds": cell.n,
                **{name: cell.count(name) for name in outcomes.OUTCOMES},
                "success [95%]": _rate_text(cell.rate("success")),
                f"median steps to {outcomes.THRESHOLD:.0%} [95%]": _time_text(cell),
                "median final loss [95%]": _loss_text(cell),
                "unfinished": ", ".join(f"{n} {s}" for s, n in sorted(cell.unfinished.items())) or "—",
            }
        )
        rows.append(row)
    return rows


def threshold_rows(chosen: dict[tuple, CellResult], layout: Layout) -> list[dict]:
    """Per judged cell: learned / slow / stalled seeds with the threshold at each of outcomes.THRESHOLDS,
    what the slow seeds did (near, unstable, far) and the plateau the seeds that never reached sat at."""
    rows = []
    for (x, arm), cell in chosen.items():
        row = {layout.x_name: layout.x_label(x), "arm": layout.arm_label(arm), "seeds": cell.n}
        for t in outcomes.THRESHOLDS:
            counts = cell.counts_at(t)
            row[f"learned / slow / stalled @{t:g}"] = (
                f"{counts[outcomes.LEARNED]} / {counts[outcomes.SLOW]} / {counts[outcomes.STALLED]}"
            )
        kinds, levels = cell.slow_kinds(), cell.sat_at()
        row["slow: near / unstable / far"] = " / ".join(
            str(kinds[k]) for k in (outcomes.NEAR, outcomes.UNSTABLE, outcomes.FAR)
        )
        row["sat at chance / no-retrieval"] = f"{levels[outcomes.CHANCE_LEVEL]} / {levels[outcomes.NO_RETRIEVAL_LEVEL]}"
        rows.append(row)
    return rows


def every_setting_rows(cells: list[CellResult], layout: Layout) -> list[dict]:
    """Per (x, arm): the seeds that learned at each value of best_of (a column for every value any arm
    tried; — where this one did not), on the judging seeds, and the most at any: where the most is few,
    no value of the grid made that arm learn."""
    by_key = at_every(cells, layout)
    values = sorted({value_of(c.settings[layout.best_of]) for row in by_key.values() for c in row}, key=sort_key)
    rows = []
    for (x, arm), row_cells in by_key.items():
        counts = {value_of(c.settings[layout.best_of]): (c.count(outcomes.LEARNED), c.n) for c in row_cells}
        row = {layout.x_name: layout.x_label(x), "arm": layout.arm_label(arm)}
        row.update({format_value(v): "{}/{}".format(*counts[v]) if v in counts else "—" for v in values})
        row["most at any"] = "{}/{}".format(*max(counts.values()))
        rows.append(row)
    return rows


def rows_table(rows: list[dict]) -> str:
    return markdown_table(list(rows[0]), [list(map(str, row.values())) for row in rows]) if rows else "(none)"


def mechanism_rows(cells: dict[tuple, CellResult], layout: Layout, steps: list[int]) -> list[dict]:
    """Per judged cell: score std at init against theory, and the row
    mechanism (attn.model.mechanism.summary, median over seeds) at each step."""
    rows = []
    for (x, arm), cell in cells.items():
        row = {
            layout.x_name: layout.x_label(x),
            "arm": layout.arm_label(arm),
            "score std @0 (theory)": (
                f"{number_said(_mean(cell.at_init('score_std')))} ({number_said(cell.theory_score_std)})"
            ),
        }
        for step in steps:
            row[f"saturated @{step}"] = number_said(median(cell.mechanism(step, "saturated_frac")))
            row[f"‖∇W_q‖ saturated / other @{step}"] = (
                f"{number_said(median(cell.mechanism(step, 'grad_W_q_median_saturated')))}"
                f" / {number_said(median(cell.mechanism(step, 'grad_W_q_median_other')))}"
            )
            row[f"top-10% share of ‖∇W_q‖² @{step}"] = number_said(median(cell.mechanism(step, "grad_W_q_top_share")))
        rows.append(row)
    return rows


def stall_rows(stalls: dict, layout: Layout) -> list[dict]:
    """Per (x, arm), over its runs at every setting: the stalled and learned runs
    whose query ends attending to itself, and their initial attention on the right key."""

    def ends(figures):
        rate = figures["self_attending"]
        return f"{rate['k']}/{rate['n']} [{rate['low']:.2f}, {rate['high']:.2f}]" if rate["n"] else "—"

    def initial(figures):
        t = figures["initial_target_attn"]
        return f"{t['median']:.3f} [{t['min']:.3f}, {t['max']:.3f}]" if t["n"] else "—"

    rows = []
    for (x, arm), value in stalls.items():
        rows.append(
            {
                layout.x_name: layout.x_label(x),
                "arm": layout.arm_label(arm),
                "stalled runs": value["stalled"]["n"],
                "learned runs": value["learned"]["n"],
                f"stalled: self > {SELF_ATTENDING:g} at end [95%]": ends(value["stalled"]),
                f"learned: self > {SELF_ATTENDING:g} at end [95%]": ends(value["learned"]),
                "stalled: target_attn @0 median [min, max]": initial(value["stalled"]),
                "learned: target_attn @0 median [min, max]": initial(value["learned"]),
                "AUC of low target_attn @0 for a stall": number_said(value["auc"]),
            }
        )
    return rows


def csv_text(rows: list[dict]) -> str:
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buffer.getvalue()


def length_rows(at_lengths: dict, layout: Layout) -> list[dict]:
    """One row per judged cell: the median over seeds of the attention on the queried key, and of the
    accuracy, per P."""
    rows = []
    for (x, arm), by_length in at_lengths.items():
        row = {layout.x_name: layout.x_label(x), "arm": layout.arm_label(arm)}
        for P, figures in sorted(by_length.items()):
            row[f"{P} pairs: attention on the key / accuracy"] = (
                f"{np.median(figures['target_attn']):.3f} / {np.median(figures['accuracy']):.3f}"
            )
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
            row[f"{layout.x_name} = {layout.x_label(x)}"] = (
                "—"
                if not value or value["sensitivity"] is None
                else f"{value['sensitivity']:.3g} [{value['low']:.3g}, {value['high']:.3g}] ({value['seeds']} seeds)"
            )
        rows.append(row)
    return rows
