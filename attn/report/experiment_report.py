"""An experiment's report: every cell's statistics, the rate each arm is
judged at, the expectations judged, and a conclusion generated from them.

Everything is computed from the experiment's run directories
(attn.analysis.results) and the experiment file (attn.experiment.spec); nothing in the
text is typed in. It writes, into the experiment directory:

    report.json   every cell's statistics, the selected settings, each
                  expectation (id, rule, verdict, the numbers behind it), the
                  platform the runs were made on, the conclusion
    seeds.json.gz each cell's per-seed records (attn.store.runs.write_report_json)
    report.md     the same for people: tables, verdicts, conclusion
    report.csv    one row per cell
    *.png         attn.report.experiment_figures

Where each (x, arm) is judged, and how an expectation is: attn.analysis.verdicts;
the conclusion's paragraph: attn.report.conclusion.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from attn import outcomes
from attn.analysis.results import (
    SELF_ATTENDING,
    CellResult,
    Excluded,
    KnownRuns,
    cells_lr_sensitivity,
    collect,
    sort_key,
    stall_mechanism,
)
from attn.analysis.verdicts import (
    Layout,
    edge_notes,
    groups,
    judge_all,
    judged_cells,
    on_seeds,
)
from attn.config.loading import build_task, config_from_mapping, runs_width_free
from attn.experiment import report_spec
from attn.experiment.spec import Experiment, result_change
from attn.model import widthfree
from attn.report import claims_table
from attn.report.conclusion import arm_sentences, counts_summary, effect_bound, headline, scope
from attn.report.report_tables import (
    cell_json,
    cell_rows,
    csv_text,
    every_setting_rows,
    length_rows,
    mechanism_rows,
    rows_table,
    sensitivity_rows,
    stall_rows,
    threshold_rows,
)
from attn.store import locks, runs
from attn.text import format_value, json_number, number_said, value_of


# ---------------------------------------------------------------------------
# The platform the runs were made on
# ---------------------------------------------------------------------------
def platforms(cells: list[CellResult]) -> dict[str, list[str]]:
    """Each provenance fact (cpu, blas, openblas_coretype, denormals, dtype,
    attn_commit, numpy; W_q, W_k: materialized or width-free, and how first drawn) -> its
    distinct values over the runs reported; and, where a cell holds runs
    carried both ways (attn verify's materialized re-run), those cells."""
    facts: dict[str, set] = {}
    two_ways = []
    for cell in cells:
        carried_here = set()
        for seed in cell.seeds:
            provenance = seed.run.provenance
            for key in ("cpu", "blas", "openblas_coretype", "attn_commit", "numpy"):
                facts.setdefault(key, set()).add(str(provenance.get(key)))
            # runs made before attn flushed subnormals (attn.train.denormals) kept them
            facts.setdefault("denormals", set()).add(provenance.get("denormals", "kept"))
            facts.setdefault("dtype", set()).add(str(seed.run.settings.get("dtype")))
            carried = re.sub(r" \((?:width )?\d+\)", "", str((provenance.get("head") or {}).get("W_q, W_k")))
            facts.setdefault("W_q, W_k", set()).add(carried)  # its widths left out: one value per way
            carried_here.add(carried)
        if len(carried_here) > 1:
            two_ways.append(", ".join(f"{k}={format_value(v)}" for k, v in cell.settings.items()))
    out = {k: sorted(v) for k, v in facts.items()}
    if two_ways:
        out["cells with runs carried both ways"] = [f"{len(two_ways)} ({two_ways[0]}, ...)"]
    return out


def code_states(cells: list[CellResult]) -> dict[str, int]:
    """Each code state the reported runs were made with (provenance attn_commit, `git describe
    --always --dirty`: a '-dirty' suffix is uncommitted code; 'unknown' where none was recorded)
    -> its number of runs."""
    counts: dict[str, int] = {}
    for seed in (s for c in cells for s in c.seeds):
        commit = seed.run.provenance.get("attn_commit")
        key = str(commit) if commit else "unknown"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def is_clean_state(state: str) -> bool:
    """A code state (code_states' key) of committed code, recorded."""
    return not (state.endswith("-dirty") or state == "unknown")


def code_state_note(states: dict[str, int]) -> str:
    """'' for runs of one clean commit; else one sentence saying how many states and which are not clean."""
    unclean = {k: n for k, n in states.items() if not is_clean_state(k)}
    if len(states) <= 1 and not unclean:
        return ""
    parts = []
    if len(states) > 1:
        parts.append(
            f"the runs come from {len(states)} code states (" + ", ".join(f"{k}: {n}" for k, n in states.items()) + ")"
        )
    if unclean:
        parts.append(f"{sum(unclean.values())} from uncommitted or unrecorded code ({', '.join(unclean)})")
    return "Not one clean commit: " + "; ".join(parts) + "."


def frozen_claims(experiment: Experiment) -> dict:
    """The claims frozen when the sweep first started (report_spec.CLAIMS_FILE) against the file's
    now: {frozen: bool, digest, frozen_at, changes (report_spec.claim_changes)}."""
    current = report_spec.claims_record(experiment.report, {c.seed for c in experiment.cells})
    path = experiment.directory / report_spec.CLAIMS_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"frozen": False, "digest": current["digest"]}
    return {
        "frozen": True,
        "digest": current["digest"],
        "frozen_digest": record.get("digest"),
        "frozen_at": record.get("frozen_at"),
        "runs_before": record.get("runs_before", 0),
        "changes": report_spec.claim_changes(record, current),
        "power": record.get("power") or {},
    }


def power_lines(claims: dict) -> list[str]:
    """Each claim's power as frozen with it before the runs (report_spec.power): a table, or nothing."""
    rows = [
        {
            "claim": claim,
            "test": figures.get("test"),
            "judging seeds per arm": figures.get("n"),
            "level": number_said(figures.get("level")),
            "smallest p it can reach": number_said(figures.get("smallest_p")) if "smallest_p" in figures else "—",
            "smallest effect that confirms it": figures.get("smallest_effect"),
        }
        for claim, figures in (claims.get("power") or {}).items()
    ]
    if not rows:
        return []
    return [
        "Each claim's power, from the design alone, frozen with the claims before the runs:",
        "",
        rows_table(rows),
        "",
    ]


def claims_lines(claims: dict) -> list[str]:
    """The report's paragraph on whether its claims are the ones frozen before the runs."""
    if not claims["frozen"]:
        return [
            f"The claims were not frozen before these runs (no `{report_spec.CLAIMS_FILE}` in the experiment "
            "directory: its sweep started before attn recorded them); they may have been written after.",
            "",
        ]
    if claims.get("runs_before"):
        return [
            f"The claims were recorded ({claims['frozen_at']}) only when {claims['runs_before']} of the "
            "experiment's runs already existed (its sweep first started before attn froze claims): they are not "
            "claims frozen before those runs.",
            "",
        ]
    changes = claims["changes"]
    if not any(changes.values()):
        return [
            f"Every claim and the design (layout, selection rule, level, seeds) are as frozen when the sweep first "
            f"started ({claims['frozen_at']}, digest `{(claims['frozen_digest'] or '')[:12]}`).",
            "",
        ]
    lines = [
        f"The claims differ from those frozen when the sweep first started ({claims['frozen_at']}, digest "
        f"`{(claims['frozen_digest'] or '')[:12]}`): {len(changes['changed'])} changed, {len(changes['added'])} "
        f"added, {len(changes['removed'])} removed after runs existed (each marked below)."
    ]
    lines += [f"- design `{k}` was {before!r}, now {now!r}" for k, (before, now) in changes["design"].items()]
    lines += [f"- removed: **{i}** — frozen as: {text}" for i, text in changes["removed"].items()]
    return lines + [""]


# ---------------------------------------------------------------------------
# Writing it all
# ---------------------------------------------------------------------------
def write_report(experiment: Experiment, known: KnownRuns | None = None) -> dict[str, Path]:
    """Compute the report of an experiment from its run directories and write
    report.json, report.md, report.csv and the figures into the experiment
    directory, holding its locks.RunLock (one report writer at a time).
    `known`: runs read ahead (attn.analysis.results.KnownRuns, for result_change)."""
    out = experiment.directory
    cells, excluded = collect(experiment, result_change, known=known)
    if not any(c.seeds for c in cells):
        left_out = f" ({len(excluded)} left out: {excluded[0].name}: {excluded[0].reason}, ...)" if excluded else ""
        raise runs.RunError(
            f"{out}: no finished runs of this experiment yet{left_out}; run `attn sweep {experiment.path}` first"
        )
    with locks.RunLock(out, "report"):
        return _write(experiment, [c for c in cells if c.n or c.unfinished], excluded)


@dataclass(frozen=True)
class Findings:
    """What an experiment's report says, computed once for its report.json, report.md and report.csv."""

    experiment: Experiment
    layout: Layout
    cells: list[CellResult]  # as collected
    ordered: list[CellResult]  # in table order (by keys)
    keys: list[str]  # the grid keys a table orders by: x, arm, best_of
    excluded: list[Excluded]
    best: dict  # (x, arm) -> the cell judged at the arm's best setting
    shared: dict  # (x, arm) -> the cell at the shared setting
    judged: list[dict]  # one verdict per expectation
    steps: list[int]  # the steps the mechanism was measured at
    sensitivities: dict  # (x, arm) -> its learning-rate sensitivity
    at_lengths: dict  # (x, arm) -> its figures at longer contexts
    headline: str  # the verdicts in words, with their tests and scope
    counts_summary: str  # the per-cell counts in words (described, not tested)
    platform: dict
    sensitivity_table: str | None
    claims: dict  # the claims frozen before the runs, against the file's now
    code_states: dict  # each code state the runs were made with -> its number of runs
    stalls: dict  # (x, arm) -> what its stalled and learned runs did (attn.analysis.results.stall_mechanism)
    shared_draws: list[int]  # the d_k whose cells start a seed from the same deviates (shared_initial_draws)


def findings(experiment: Experiment, cells: list[CellResult], excluded: list[Excluded]) -> Findings:
    layout = Layout(experiment)
    best = judged_cells(cells, layout, "best")
    shared = judged_cells(cells, layout, "shared") if experiment.report.shared is not None else {}
    judge_on = experiment.report.judge_on  # lr_sensitivity can be a claim's stat: over the judging seeds only
    sensitivities = (
        {
            key: cells_lr_sensitivity([on_seeds(c, judge_on) for c in group], layout.best_of)
            for key, group in groups(cells, layout).items()
        }
        if experiment.report.sensitivity
        else {}
    )
    judged = judge_all(experiment.report.expect, cells, layout, sensitivities)
    claims = frozen_claims(experiment)
    edited = {e.id: e.edited_after_runs for e in experiment.report.expect if e.edited_after_runs}
    for j in judged:
        changes = claims.get("changes") or {}
        j["frozen"] = (
            "not frozen"
            if not claims["frozen"] or claims.get("runs_before")
            else "changed"
            if j["id"] in changes["changed"]
            else "added after the runs began"
            if j["id"] in changes["added"]
            else "as frozen"
        )
        if j["id"] in changes.get("changed", {}):
            j["frozen_text"] = changes["changed"][j["id"]]
        if j["id"] in edited:
            j["edited_after_runs"] = edited[j["id"]]
    stalls = {key: stall_mechanism([s for c in group for s in c.seeds]) for key, group in groups(cells, layout).items()}
    steps = sorted({int(step) for c in cells for s in c.seeds for step in s.mechanism})
    keys = layout.x + layout.arm + ([layout.best_of] if layout.best_of else [])
    ordered = sorted(cells, key=lambda c: [sort_key(value_of(c.settings.get(k))) for k in keys])
    at_lengths = length_results(best, experiment) if experiment.report.lengths else {}
    return Findings(
        experiment,
        layout,
        cells,
        ordered,
        keys,
        excluded,
        best,
        shared,
        judged,
        steps,
        sensitivities,
        at_lengths,
        headline(judged, layout, scope(experiment)),
        counts_summary(best, shared, layout, judged, sensitivities, at_lengths),
        platforms(cells),
        rows_table(sensitivity_rows(sensitivities, layout)) if sensitivities else None,
        claims,
        code_states(cells),
        stalls,
        shared_initial_draws(experiment),
    )


def shared_initial_draws(experiment: Experiment) -> list[int]:
    """The d_k of the cells whose width-free head is drawn by the Bartlett decomposition
    (attn.model.widthfree.bartlett) when there are two or more: at one seed they all start from
    the same deviates, so those cells are not independent of each other; else []."""
    widths = set()
    for cell in experiment.cells:
        config = cell.config
        if runs_width_free(config, build_task(config)) and not widthfree.sampled_directly(
            config.model.d_model, config.model.d_k
        ):
            widths.add(config.model.d_k)
    return sorted(widths) if len(widths) > 1 else []


def shared_draws_lines(widths: list[int], brief: bool = False) -> list[str]:
    """The report's word on cells that share their seeds' initial draws (shared_initial_draws); `brief`: one
    sentence, for README."""
    if not widths:
        return []
    if brief:
        return [
            f"Not independent: at d_k {', '.join(map(str, widths))} a seed starts nearly the same model (one "
            "Bartlett draw), so their verdicts are close to one observation, not one per d_k.",
            "",
        ]
    return [
        f"Not independent: at d_k {', '.join(map(str, widths))} a seed's initial head is drawn by the Bartlett "
        "decomposition from the same deviates at every width, and as d_k grows the scaled head tends to a "
        'd_k-independent limit (docs/training.md, "The width-free head"): a seed starts nearly the same model '
        "in these cells, so their verdicts are close to one observation, not one per d_k.",
        "",
    ]


def report_json(found: Findings) -> dict:
    experiment, layout = found.experiment, found.layout
    return {
        "experiment": experiment.name,
        "file": str(experiment.path),
        "description": experiment.description.strip(),
        "runs": sum(c.n for c in found.cells) + sum(sum(c.unfinished.values()) for c in found.cells),
        "code_states": found.code_states,
        "code_state_note": code_state_note(found.code_states),
        "claims": found.claims,
        "cells_in_file": len(experiment.cells),
        "platform": found.platform,
        "definitions": outcomes.definitions(),
        "shared_initial_draws": found.shared_draws,
        "layout": {
            "x": layout.x,
            "arm": layout.arm,
            "best_of": layout.best_of,
            "select": list(experiment.report.select),
            "shared": json_number(experiment.report.shared),
            **held_out_json(experiment.report),
        },
        "cells": [cell_json(c) for c in found.ordered],
        "best": [
            {"x": list(x), "arm": list(arm), "settings": cell_json(c)["settings"]} for (x, arm), c in found.best.items()
        ],
        **(
            {
                "selection": [
                    {"x": list(x), "arm": list(arm), **cell_json(c)}
                    for (x, arm), c in judged_cells(found.cells, layout, "best", on="select").items()
                ]
            }
            if experiment.report.select_on is not None
            else {}
        ),
        "expectations": [_json_safe(j) for j in found.judged],
        "headline": found.headline,
        "counts_summary": found.counts_summary,
        "excluded": [e.__dict__ for e in found.excluded],
        "sensitivity": [
            {"x": list(x), "arm": list(arm), **{k: json_number(v) for k, v in value.items()}}
            for (x, arm), value in found.sensitivities.items()
        ],
        "sensitivity_table": found.sensitivity_table,
        "stall_mechanism": [{"x": list(x), "arm": list(arm), **value} for (x, arm), value in found.stalls.items()],
        "lengths": [
            {"x": list(x), "arm": list(arm), "pairs": {str(P): v for P, v in by_length.items()}}
            for (x, arm), by_length in found.at_lengths.items()
        ],
    }


def _write(experiment: Experiment, cells: list[CellResult], excluded: list[Excluded]) -> dict[str, Path]:
    found = findings(experiment, cells, excluded)
    out = experiment.directory
    paths = {
        "json": out / runs.REPORT_FILE,
        "seeds": out / runs.SEEDS_FILE,
        "md": out / "report.md",
        "csv": out / "report.csv",
    }
    runs.write_report_json(out, report_json(found))  # every cell and seed: compact, it is read by programs
    runs.write_atomic(paths["csv"], csv_text(cell_rows(found.ordered, found.layout, found.keys)).encode())
    from attn.report import experiment_figures  # matplotlib: imported by the reports that draw, not by publish

    paths.update(
        experiment_figures.draw_all(
            experiment,
            groups(cells, found.layout),
            found.layout,
            found.best,
            found.shared,
            found.steps,
            sensitive=bool(found.sensitivities),
            at_lengths=found.at_lengths,
        )
    )
    runs.write_atomic(paths["md"], report_markdown(found, paths).encode())
    return paths


def held_out_json(spec: report_spec.ReportSpec) -> dict:
    """select_on / judge_on for report.json's layout ({} when the file declares none: all seeds do both)."""
    return {} if spec.select_on is None else {"select_on": list(spec.select_on), "judge_on": list(spec.judge_on)}


def held_out_lines(found: Findings) -> list[str]:
    """The paragraph and table saying which seeds chose each arm's setting and which judged it."""
    spec, layout = found.experiment.report, found.layout
    if spec.select_on is None:
        return []
    seeds = lambda values: ", ".join(map(str, values))  # noqa: E731
    lines = [
        f"## The selection seeds: they chose each arm's {layout.best_of} (reported, never judged)",
        "",
        f"Held-out selection: each arm's {layout.best_of} was chosen on seeds {seeds(spec.select_on)} only; "
        f"every verdict and headline table is judged on seeds {seeds(spec.judge_on)} only, at the chosen "
        "setting. The selection seeds' figures at that setting (reported, never judged):",
        "",
    ]
    chose = judged_cells(found.cells, layout, "best", on="select")
    return lines + [rows_table(cell_rows(list(chose.values()), layout, found.keys)), ""]


def _json_safe(value):
    """value with every non-finite float as json_number makes it ('inf', None for NaN), at any depth."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return json_number(value)


def expectation_lines(j: dict, layout: Layout) -> list[str]:
    """The markdown of one judged expectation: its verdict and rule, then each x's numbers."""
    lines = [f"- **{j['id']}** — {j['claim']}: **{j['verdict']}**. Rule: {j['rule']}."]
    if j.get("test", "interval") != "interval":
        lines[0] += (
            f" p = {number_said(j['p'])} (Holm {number_said(j['p_holm'])}); "
            f"the opposite claim's p = {number_said(j['p_reverse'])} "
            f"(Holm {number_said(j['p_reverse_holm'])})."
        )
    if j.get("frozen") == "changed":
        lines.append(f"  - changed after the runs began; as frozen: {j['frozen_text']}")
    elif j.get("frozen") == "added after the runs began":
        lines.append("  - added after the runs began: not among the claims frozen when the sweep first started")
    if j.get("edited_after_runs"):
        lines.append(f"  - {report_spec.EDITED_SAID}: {j['edited_after_runs']}")
    for p in j["points"]:
        numbers = p.get("note") or (
            f"{p['value']:.3g} [{p['low']:.3g}, {p['high']:.3g}]"
            + (
                f" vs {p['other_value']:.3g} [{p['other_low']:.3g}, {p['other_high']:.3g}]"
                if "other_value" in p
                else ""
            )
        )
        if "effect" in p:
            effect = p["effect"]
            counts = ", ".join(f"{k} {v}" for k, v in p["counts"].items())
            numbers += (
                f"; {effect['name']} {effect_bound(effect)}{number_said(effect['value'])} "
                f"[{number_said(effect['low'])}, {number_said(effect['high'])}]; "
                f"{p['pairs']} pairs ({counts}); one-sided p {number_said(p['p'])}, "
                f"opposite {number_said(p['p_reverse'])}"
            )
        setting = f", {layout.names[layout.best_of]} = {format_value(p['setting'])}" if "setting" in p else ""
        lines.append(f"  - {layout.x_name} = {' / '.join(map(str, p['x']))}{setting}: {numbers} → {p['verdict']}")
    return lines


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
            # the run's own: a run of the cell made the other algorithm's way
            config = config_from_mapping(seed.run.config_yaml, str(seed.run.path / "config.yaml"))
            for P, figures in lengths.at_lengths(seed.run.path, config, list(experiment.report.lengths)).items():
                for name, value in figures.items():
                    by_length.setdefault(P, {}).setdefault(name, []).append(value)
        out[key] = by_length
    return out


def report_markdown(found: Findings, paths: dict[str, Path]) -> str:
    experiment, layout, cells, keys = found.experiment, found.layout, found.cells, found.keys
    best, shared, judged, steps, excluded, sensitivities, at_lengths = (
        found.best,
        found.shared,
        found.judged,
        found.steps,
        found.excluded,
        found.sensitivities,
        found.at_lengths,
    )
    n_runs = sum(c.n for c in cells)
    facts = "; ".join(f"{k}: {', '.join(v)}" for k, v in found.platform.items())
    note = code_state_note(found.code_states)
    text = [
        f"# {experiment.name}",
        "",
        experiment.description.strip(),
        "",
        f"{n_runs} finished runs of {len(experiment.cells)} from `{experiment.path}`; x = "
        + ", ".join(f"`{k}`" for k in layout.x)
        + (", arms = " + ", ".join(f"`{a}`" for a in layout.arm) if layout.arm else ", one arm (no arm key: every run)")
        + (
            f", each judged at the `{layout.best_of}` chosen by the rule declared in the file: "
            + ", then ".join(f"`{c}`" for c in experiment.report.select)
            + " (ties: the smaller value)"
            if layout.best_of
            else ""
        )
        + ".",
        "",
        f"Made on: {facts}." + (f" {note}" if note else ""),
        "",
    ]
    headline_figure = [p for p in paths.values() if p.suffix == ".png" and p.stem == "headline"]
    if judged or headline_figure:
        text += ["## The result", ""]
        if judged:
            text += [claims_table.findings_table(judged, layout.x_name, layout.names.get(layout.best_of)), ""]
        text += [f"![headline]({os.path.relpath(p, experiment.directory)})" for p in headline_figure]
        text += [""] if headline_figure else []
        text += claims_table.verdicts_by_point(judged, layout.x_name)  # a factorial's claims by where they are judged
    text += shared_draws_lines(found.shared_draws)  # how independent the verdicts above are
    text += ["## In one paragraph (generated)", "", found.headline, ""]
    for title, chosen in (
        ("each arm at its own best " + (layout.best_of or "setting"), best),
        (f"every arm at the shared {layout.best_of} = {format_value(experiment.report.shared)}", shared),
    ):
        if chosen:
            text += [f"## Headline: {title}", "", rows_table(cell_rows(list(chosen.values()), layout, keys)), ""]
            text += arm_sentences(chosen, layout, "best" if chosen is best else "shared") + [""]
    text += [
        *held_out_lines(found),
        "## The counts, in words (generated; described, not tested)",
        "",
        found.counts_summary,
        "",
        "## Outcome classes",
        "",
        outcomes.definitions(),
        "",
    ]
    if layout.best_of:
        text += edge_notes(cells, layout) + [""]
        seeds = "the judging seeds" if experiment.report.judge_on is not None else "every seed"
        text += [
            f"## Seeds that learned at every {layout.names[layout.best_of]} ({seeds})",
            "",
            rows_table(every_setting_rows(cells, layout)),
            "",
        ]
    text += [
        "## How the counts move with the threshold (each arm at its best setting)",
        "",
        f"Each seed classified again with the threshold at {', '.join(f'{t:g}' for t in outcomes.THRESHOLDS)}; "
        f"slow seeds split by what they did ({outcomes.NEAR}: best accuracy >= {outcomes.NEAR_ACCURACY:g}; "
        f"{outcomes.UNSTABLE}: final loss > {outcomes.UNSTABLE_FACTOR:g} x its best; {outcomes.FAR}: neither), "
        f"at {outcomes.THRESHOLD:g}; and the plateau the seeds that never reached it sat at.",
        "",
        rows_table(threshold_rows(best, layout)),
        "",
    ]
    if judged:
        text += ["## Expectations, judged", ""] + claims_lines(found.claims) + power_lines(found.claims)
        for j in judged:
            text += expectation_lines(j, layout)
        text.append("")
    if sensitivities:
        rates = next(iter(sensitivities.values()))["rates"]
        text += [
            f"## Learning-rate sensitivity over {layout.best_of} in {', '.join(map(format_value, rates))}",
            "",
            "Per seed run at every rate: the mean over the rates of min(final loss, loss at initialisation) "
            "minus the seed's best final loss (0: every rate as good as the best; Wortsman et al.); the mean "
            "over seeds, bootstrap 95% interval.",
            "",
            found.sensitivity_table,
            "",
        ]
    if at_lengths:
        text += [
            "## Longer contexts than trained on (median over seeds)",
            "",
            f"Each arm's model at its best setting, asked about retrieval with more pairs (attn.analysis.lengths: "
            f"{', '.join(map(str, experiment.report.lengths))}); the attention it puts on the queried key and "
            "its accuracy.",
            "",
            rows_table(length_rows(at_lengths, layout)),
            "",
        ]
    if steps:
        text += [
            "## The mechanism, measured (median over seeds)",
            "",
            rows_table(mechanism_rows(best, layout, steps)),
            "",
        ]
    if found.stalls and any(
        v["stalled"]["self_attending"]["n"] + v["learned"]["self_attending"]["n"] for v in found.stalls.values()
    ):
        text += [
            "## Stalled and learned runs: self-attention at the end, the right key at the start",
            "",
            f"Over each {layout.x_name} and arm's runs at every setting: of the stalled and of the learned runs, "
            f"those whose query ends with more than {SELF_ATTENDING:g} of its attention on its own position "
            "(self_attn, Wilson 95%), and the attention on the right key at step 0 (target_attn); the AUC is "
            "the rank-based chance that a stalled run started with less attention on the right key than a "
            "learned one (0.5: no signal; — without both classes).",
            "",
            rows_table(stall_rows(found.stalls, layout)),
            "",
        ]
    text += ["## Every cell", "", rows_table(cell_rows(found.ordered, layout, keys)), ""]
    if excluded:
        text += [f"## Runs left out ({len(excluded)})", ""] + [f"- `{e.name}`: {e.reason}" for e in excluded] + [""]
    figures = [p for p in paths.values() if p.suffix == ".png" and p not in headline_figure]  # once each
    text += ["## Figures", ""] + [f"![{p.stem}]({os.path.relpath(p, experiment.directory)})" for p in figures] + [""]
    return "\n".join(text)
