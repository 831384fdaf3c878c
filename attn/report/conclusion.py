"""An experiment's conclusion, generated: one paragraph that claims only what
was tested (headline: the scope, then each expectation's verdict with its test,
effect size and corrected p), and beside the tables the per-cell counts in words
(counts_summary) and one sentence per arm, from the cells each arm is judged at
(attn.analysis.verdicts) and nothing typed in.

The counts summary says which arms learned in every seed at every x at their own
best setting and which fell short where (with what the other seeds did);
whether each arm's best setting was the same at every x (a rate that
transfers); the same at the shared setting, and so which arms need their
own; the learning-rate sensitivities' least and most sensitive arm at the
largest x; the attention on the queried key from the shortest to the
longest length asked; and the count of expectations by verdict.
"""

from __future__ import annotations

import numpy as np

from attn import outcomes
from attn.analysis.grouping import canonical
from attn.analysis.results import CellResult, in_order
from attn.analysis.verdicts import CONFIRMED, INCONCLUSIVE, NOT_CONFIRMED, Layout
from attn.text import format_value, number_said


def _others(cell: CellResult) -> str:
    """' (3 learned then lost, 1 slow)': what the seeds that did not learn did; '' if every seed learned."""
    others = ", ".join(f"{cell.count(n)} {n}" for n in outcomes.OUTCOMES if n != outcomes.LEARNED and cell.count(n))
    return f" ({others})" if others else ""


def arm_sentences(chosen: dict[tuple, CellResult], layout: Layout, where: str) -> list[str]:
    """One sentence per arm: at each x, how many seeds learned, and what the others did."""
    sentences = []
    for arm in in_order(a for _, a in chosen):
        parts = []
        for (x, a), cell in chosen.items():
            if a != arm:
                continue
            rate = (
                f" at {layout.names[layout.best_of]} {format_value(cell.settings[layout.best_of])}"
                if layout.best_of and where == "best"
                else ""
            )
            parts.append(f"{layout.x_label(x)}: {cell.count(outcomes.LEARNED)}/{cell.n} learned{rate}{_others(cell)}")
        sentences.append(f"- {layout.arm_label(arm) if arm else 'The runs'}, {where}: " + "; ".join(parts) + ".")
    return sentences


def _named(layout: Layout, arm: tuple) -> str:
    """An arm's label in code quotes, so that a list of labels with commas in them reads
    ('the runs' when the experiment has no arm key: one arm, every run)."""
    return f"`{layout.arm_label(arm)}`" if arm else "the runs"


def _success_sentence(label: str, chosen: dict[tuple, CellResult], layout: Layout) -> tuple[str, set]:
    """'At ..., A and B learned in every seed at every d_k; C in fewer at d_k 4096 (1/5 (4 slow)).'
    and the arms that fell short somewhere."""
    everywhere, short = [], []
    for arm in in_order(a for _, a in chosen):
        cells = [(x, c) for (x, a), c in chosen.items() if a == arm and c.n]
        missing = [(x, c) for x, c in cells if c.count(outcomes.LEARNED) < c.n]
        if not missing:
            everywhere.append(_named(layout, arm))
        else:
            short.append(
                (
                    arm,
                    f"{_named(layout, arm)} at {layout.x_name} "
                    + ", ".join(
                        f"{layout.x_label(x)}: {c.count(outcomes.LEARNED)}/{c.n}{_others(c)}" for x, c in missing
                    ),
                )
            )
    parts = []
    if everywhere:
        parts.append(
            f"{' and '.join(everywhere) if len(everywhere) < 3 else ', '.join(everywhere)} learned in "
            f"every seed at every {layout.x_name}"
        )
    if short:
        parts.append(
            ("fewer learned for " if everywhere else "not every seed learned for ")
            + "; ".join(text for _, text in short)
        )
    return f"{label[:1].upper() + label[1:]}, " + "; ".join(parts) + ".", {arm for arm, _ in short}


def _sensitivity_sentence(sensitivities: dict, best: dict[tuple, CellResult], layout: Layout) -> str:
    """The least and most rate-sensitive arm at the largest x, with intervals,
    and a caution when the least sensitive one learns in few seeds at any rate."""
    x = in_order(x for x, _ in sensitivities)[-1]
    at_x = {arm: v for (xx, arm), v in sensitivities.items() if xx == x and v["sensitivity"] is not None}
    if len(at_x) < 2:
        return ""
    ranked = sorted(at_x, key=lambda arm: at_x[arm]["sensitivity"])
    low, high = ranked[0], ranked[-1]

    def shown(arm):
        v = at_x[arm]
        return f"{_named(layout, arm)}, {v['sensitivity']:.3g} [{v['low']:.3g}, {v['high']:.3g}]"

    text = f"Learning-rate sensitivity at {layout.x_name} {layout.x_label(x)} runs from {shown(low)} to {shown(high)}"
    cell = best.get((x, low))
    if cell is not None and 2 * cell.count(outcomes.LEARNED) <= cell.n:
        text += (
            f"; the lowest belongs to an arm that learned in {cell.count(outcomes.LEARNED)}/{cell.n} seeds even at "
            "its best rate: the measure is small when no rate does well, so read it beside the success rates"
        )
    return text + "."


def _length_sentence(at_lengths: dict, layout: Layout) -> str:
    """Per judged cell, the median attention on the queried key at the
    shortest and the longest number of pairs asked."""
    parts = []
    for (x, arm), by_length in at_lengths.items():
        if not by_length:
            continue
        shortest, longest = min(by_length), max(by_length)
        parts.append(
            f"{_named(layout, arm)}"
            + (f" at {layout.x_name} {layout.x_label(x)}" if len({k for k, _ in at_lengths}) > 1 else "")
            + f" from {np.median(by_length[shortest]['target_attn']):.3f} to "
            f"{np.median(by_length[longest]['target_attn']):.3f}"
        )
    if not parts:
        return ""
    pairs = sorted({P for by_length in at_lengths.values() for P in by_length})
    return (
        f"Asked about {pairs[0]} and then {pairs[-1]} pairs, the median attention on the queried key goes "
        + "; ".join(parts)
        + "."
    )


def _transfer_sentence(best: dict[tuple, CellResult], layout: Layout) -> str:
    """Which arms were judged at one and the same best_of value at every x
    (their rate transfers across x, as muP claims of its own), and which not."""
    if not layout.best_of or len({x for x, _ in best}) < 2:
        return ""
    same, moved = [], []
    xs = in_order(x for x, _ in best)
    for arm in in_order(a for _, a in best):
        values = [best[(x, arm)].settings[layout.best_of] for x in xs if (x, arm) in best]
        if len({canonical(v) for v in values}) == 1:
            same.append(f"{_named(layout, arm)} ({format_value(values[0])})")
        else:
            moved.append(f"{_named(layout, arm)} ({', '.join(map(format_value, values))})")
    if not same:
        return f"No arm's best {layout.names[layout.best_of]} was the same at every {layout.x_name}."
    return (
        f"The best {layout.names[layout.best_of]} was the same at every {layout.x_name} for "
        + ", ".join(same)
        + (f"; it moved with {layout.x_name} for " + ", ".join(moved) if moved else "")
        + "."
    )


def counts_summary(
    best: dict[tuple, CellResult],
    shared: dict[tuple, CellResult],
    layout: Layout,
    judged: list[dict],
    sensitivities: dict | None = None,
    at_lengths: dict | None = None,
) -> str:
    """The per-cell counts in words, beside the tables (not tested): which arms learn in
    every seed at every x at their own best setting, which fall short and
    where; the same at the shared setting, and which arms need their own;
    the learning-rate sensitivities' extremes; the attention on the queried
    key at the longest length asked; the expectations' verdicts."""
    text = []
    rate = layout.names[layout.best_of] if layout.best_of else None
    own_label = f"at each arm's own best {rate}" if rate else "at the grid's setting"
    sentence, short_at_best = _success_sentence(own_label, best, layout)
    text += [sentence, _transfer_sentence(best, layout)]
    if rate and shared:
        sentence, short_at_shared = _success_sentence(
            f"at the shared {rate} {format_value(layout.spec.shared)}", shared, layout
        )
        text.append(sentence)
        needs_own = in_order(short_at_shared - short_at_best)
        if needs_own:
            text.append(
                f"So {', '.join(_named(layout, a) for a in needs_own)} "
                f"need{'s' if len(needs_own) == 1 else ''} {'its' if len(needs_own) == 1 else 'their'} "
                f"own {rate}."
            )
    if sensitivities:
        text.append(_sensitivity_sentence(sensitivities, best, layout))
    if at_lengths:
        text.append(_length_sentence(at_lengths, layout))
    if judged:
        counts = {v: sum(j["verdict"] == v for j in judged) for v in (CONFIRMED, NOT_CONFIRMED, INCONCLUSIVE)}
        text.append(
            f"Of {len(judged)} expectation{'s' * (len(judged) != 1)}, "
            + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
            + "."
        )
    return " ".join(t for t in text if t)


def scope(experiment) -> str:
    """What every run of the experiment shares, as the paragraph's scope: the
    optimiser(s) with warm-up and clipping where set (and "in some runs"
    where not every run sets them), one head, one layer, no
    LayerNorm, d_model, the budget, and the seeds per cell (with held-out
    selection, how many choose the setting and how many judge)."""
    configs = [c.config for c in experiment.cells]

    def values(get) -> str:  # the distinct values, numbers in numeric order; None (unset) left out
        found = {get(c) for c in configs} - {None}
        return ", ".join(str(v) for v in sorted(found, key=lambda v: (isinstance(v, str), v)))

    def where_set(said: str, get) -> list[str]:  # a setting some runs use: in which runs, if not all
        using = [bool(get(c)) for c in configs]
        return [said + ("" if all(using) else " in some runs")] if any(using) else []

    optimisers = values(lambda c: c.optim.name)
    extras = where_set(
        f"warm-up {values(lambda c: c.optim.warmup_steps or None)} steps", lambda c: c.optim.warmup_steps
    )
    extras += where_set(f"clipping at {values(lambda c: c.optim.clip_norm)}", lambda c: c.optim.clip_norm)
    n_seeds = len({c.seed for c in experiment.cells})
    spec = experiment.report
    held_out = (
        f" ({len(spec.select_on)} choose the {spec.best_of.rsplit('.', 1)[-1]}, {len(spec.judge_on)} judge)"
        if spec.select_on is not None
        else ""
    )
    optimiser = "plain SGD" if optimisers == "sgd" else f"optimiser {optimisers}"
    return (
        f"{optimiser}{' with ' + ' and '.join(extras) if extras else ''}; one attention head, one layer, no "
        f"LayerNorm; d_model {values(lambda c: c.model.d_model)}; {values(lambda c: c.train.steps)} steps; "
        f"{n_seeds} seeds per cell{held_out}"
    )


def effect_bound(effect: dict) -> str:
    """'at most ' before an effect whose point is a bound (a median not reached), else ''."""
    return f"{effect['bound']} " if effect.get("bound") else ""


def _evidence(j: dict, layout: Layout) -> str:
    """The numbers a verdict rests on, at each x: the effect size with its interval and the test's p,
    or the two intervals."""
    parts = []
    for p in j["points"]:
        where = f"{layout.x_name} {' / '.join(map(str, p['x']))}" if layout.x else "all runs"
        if "setting" in p:
            where += f" at {layout.names[layout.best_of]} {format_value(p['setting'])}"
        if "note" in p:
            parts.append(f"{where}: {p['note']}")
        elif "effect" in p:
            e = p["effect"]
            seeds = f"{p['n']} and {p['other_n']} seeds" if j.get("test") == "fisher" else f"{p['pairs']} paired seeds"
            parts.append(
                f"{where}: {e['name']} {effect_bound(e)}{number_said(e['value'])} "
                f"[{number_said(e['low'])}, {number_said(e['high'])}] "
                f"over {seeds}, one-sided p {number_said(p['p'])}"
            )
        else:
            parts.append(
                f"{where}: {number_said(p['value'])} [{number_said(p['low'])}, {number_said(p['high'])}]"
                + (
                    f" vs {number_said(p['other_value'])} "
                    f"[{number_said(p['other_low'])}, {number_said(p['other_high'])}]"
                    if "other_value" in p
                    else ""
                )
            )
    return "; ".join(parts)


def headline(judged: list[dict], layout: Layout, scope_text: str) -> str:
    """The paragraph for report.md and experiments/README.md: the scope, then each
    expectation with its verdict, its test and the evidence (attn.analysis.verdicts:
    for a tested claim the effect size with its 95% interval and the p-values,
    Holm-corrected; else the intervals), and the count by verdict. Per-cell
    counts stay in the tables (counts_summary)."""
    if not judged:
        return f"In scope ({scope_text}), this experiment makes no claims: its tables only describe."
    text = [f"Scope: {scope_text}."]
    for j in judged:
        test = j.get("test", "interval")
        test_name = {"mcnemar": "an exact McNemar", "sign": "a sign"}.get(test, "Fisher's exact")
        how = (
            "by 95% intervals"
            if test == "interval"
            else f"by {test_name} test, Holm-adjusted p {number_said(j.get('p_holm'))} "
            f"at level {number_said(j.get('alpha'))}"
        )
        frozen = ("" if j.get("frozen") in (None, "as frozen") else f", {j['frozen']}") + (
            ", edited after its runs" if j.get("edited_after_runs") else ""
        )
        text.append(
            f"{j['claim'][:1].upper() + j['claim'][1:]} (`{j['id']}`{frozen}): {j['verdict']} {how} "
            f"({_evidence(j, layout)})."
        )
    counts = {v: sum(j["verdict"] == v for j in judged) for v in (CONFIRMED, NOT_CONFIRMED, INCONCLUSIVE)}
    text.append(
        f"Of {len(judged)} claim{'s' * (len(judged) != 1)}, "
        + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        + "."
    )
    return " ".join(text)
