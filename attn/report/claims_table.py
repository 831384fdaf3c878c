"""A judged claim said in one row: its verdict and how it stands to the claims frozen before the runs, the
number it rests on with its 95% interval at the point that decides it, and its test (with the Holm-adjusted p).
Read from report.json's expectations; written into report.md's opening (attn.report.experiment_report) and
README's results block (attn.results_text)."""

from __future__ import annotations

import math
import re

from attn.analysis.verdicts import CONFIRMED, INCONCLUSIVE, NOT_CONFIRMED
from attn.experiment import report_spec
from attn.report.conclusion import effect_bound
from attn.text import format_value, markdown_table, number_said

TEST_NAMES = {"interval": "95% interval", "mcnemar": "exact McNemar", "sign": "sign test", "fisher": "Fisher's exact"}


def findings_table(expectations: list[dict], x_name: str, setting_name: str | None = None) -> str:
    """The judged claims (report.json's expectations) as a short table, one row each: the claim, its verdict
    (with claim_standing), the number it rests on with its 95% interval (effect_said) and the test, with the
    Holm-adjusted p of a tested claim. Every point's numbers are in the report's "Expectations, judged"."""
    rows = [
        [
            e["claim"][:1].upper() + e["claim"][1:],
            e["verdict"] + (f" ({standing})" if (standing := claim_standing(e)) else ""),
            effect_said(e, x_name, setting_name),
            TEST_NAMES.get(e.get("test", "interval"), str(e.get("test")))
            + ("" if e.get("test", "interval") == "interval" else f", Holm p {number_said(e.get('p_holm'))}"),
        ]
        for e in expectations
    ]
    return markdown_table(["claim", "verdict", "effect [95% interval]", "test"], rows)


def claim_standing(expectation: dict) -> str:
    """How a claim stands to the claims frozen before its runs, unless as frozen ('changed', 'added after the
    runs began'), or 'edited after its runs' (its file's edited_after_runs); '' for a claim as frozen."""
    if expectation.get("edited_after_runs"):
        return "edited after its runs"
    frozen = expectation.get("frozen")
    return "" if frozen in (None, "as frozen") else str(frozen)


def effect_said(expectation: dict, x_name: str, setting_name: str | None = None) -> str:
    """'difference of rates D [lo, hi] at d_k X, the weakest of N': the number a verdict rests on
    with its interval, at the point that decides it (deciding_point), or at each point where all agree."""
    points = expectation.get("points") or []
    if not points:
        return "—"
    point = deciding_point(expectation)
    numbers = _point_numbers(point, expectation)
    if len(points) == 1:
        return f"{numbers} at {_point_where(point, x_name, setting_name)}"
    if all(_point_numbers(p, expectation) == numbers for p in points):
        return f"{numbers} at each of {len(points)} points ({_span(points, x_name, setting_name)})"
    return f"{numbers} at {_point_where(point, x_name, setting_name)}, the weakest of {len(points)}"


def deciding_point(expectation: dict) -> dict:
    """The point of a claim that decides its verdict: one without evidence (its note) first; of a tested
    claim, the largest p (its p is theirs; among equal p, the effect interval nearest no effect), or the
    smallest opposite p of one refuted; of a bound, one with the claim's verdict, or of a confirmed one the
    interval nearest the bound."""
    points = expectation["points"]
    noted = [p for p in points if "note" in p]
    if noted:
        return noted[0]
    rule = str(expectation.get("rule", ""))
    apart = re.search(r" (higher|lower) than of ", rule)
    if expectation.get("test", "interval") != "interval":
        if expectation["verdict"] == NOT_CONFIRMED:
            return min(points, key=lambda p: _as_float(p.get("p_reverse"), math.inf))

        def effect_margin(p: dict) -> float:  # how far its effect interval keeps from no effect (0, or 1 for a ratio)
            effect = p.get("effect") or {}
            null = 1.0 if "ratio" in str(effect.get("name")) else 0.0
            if apart is None:
                return 0.0
            if apart.group(1) == "higher":
                return _as_float(effect.get("low"), math.inf) - null
            return null - _as_float(effect.get("high"), -math.inf)

        return max(points, key=lambda p: (_as_float(p.get("p"), -math.inf), -_finite_or(effect_margin(p), math.inf)))
    if expectation["verdict"] != CONFIRMED:
        return next((p for p in points if p.get("verdict") == expectation["verdict"]), points[0])
    bound = re.search(r" (above|below) (\S+) \(its 95% interval wholly", rule)
    if bound:
        try:
            level = float(bound.group(2))
        except ValueError:
            return points[0]
        margin = (
            (lambda p: _as_float(p.get("low"), math.inf) - level)
            if bound.group(1) == "above"
            else (lambda p: level - _as_float(p.get("high"), -math.inf))
        )
    elif apart:
        margin = (
            (lambda p: _as_float(p.get("low"), math.inf) - _as_float(p.get("other_high"), -math.inf))
            if apart.group(1) == "higher"
            else (lambda p: _as_float(p.get("other_low"), math.inf) - _as_float(p.get("high"), -math.inf))
        )
    else:
        return points[0]
    return min(points, key=lambda p: _finite_or(margin(p), math.inf))


def _finite_or(value: float, instead: float) -> float:
    return instead if math.isnan(value) else value


def rule_stat(expectation: dict) -> str:
    """The statistic a judged claim's rule is on ('success_rate', 'stall_rate', ...): its rule's first word."""
    return str(expectation.get("rule", "")).split(" ", 1)[0]


def _point_numbers(point: dict, expectation: dict) -> str:
    if "note" in point:
        return str(point["note"])
    if "effect" in point:
        e = point["effect"]
        bounds = f"[{number_said(e['low'])}, {number_said(e['high'])}]"
        return f"{e['name']} {effect_bound(e)}{number_said(e['value'])} {bounds}"
    stat = rule_stat(expectation)
    said = f"{number_said(point.get('value'))} [{number_said(point.get('low'))}, {number_said(point.get('high'))}]"
    if "other_value" in point:
        said += (
            f" vs {number_said(point['other_value'])} "
            f"[{number_said(point.get('other_low'))}, {number_said(point.get('other_high'))}]"
        )
    return f"{stat.replace('_', ' ')} {said}" if stat in report_spec.STATS else said


def _point_where(point: dict, x_name: str, setting_name: str | None) -> str:
    where = f"{x_name} {' / '.join(map(str, point['x']))}" if point.get("x") else "all runs"
    if "setting" in point and setting_name:
        where += f" at {setting_name} {format_value(point['setting'])}"
    return where


def _span(points: list[dict], x_name: str, setting_name: str | None) -> str:
    """'d_k 16 to 1048576', and the setting's span where the points are at each setting ('d_k 1048576, lr
    0.001 to 1'): the first and last of a claim's points."""

    def spanned(values: list[str]) -> str:
        return values[0] if values[0] == values[-1] else f"{values[0]} to {values[-1]}"

    said = f"{x_name} {spanned([' / '.join(map(str, p.get('x') or ['all runs'])) for p in points])}"
    if setting_name and all("setting" in p for p in points):
        said += f", {setting_name} {spanned([format_value(p['setting']) for p in points])}"
    return said


def _as_float(value, missing: float) -> float:
    """A number as report.json writes one (inf as text, NaN as null), as a float; `missing` for none."""
    if value in ("inf", "-inf"):
        return float(value)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else missing


def verdicts_by_point(expectations: list[dict], x_name: str, earlier=()) -> list[str]:
    """Where a design judges several claims at each of several x points (a factorial's contrasts, one point
    each), a table of them by point: which are confirmed, not confirmed and inconclusive there, each with its
    effect. It says what decides where, as the verdicts say it. [] for other designs. `earlier`: the ids of
    claims judged under the earlier definition of stalled, marked so."""
    at: dict[tuple, list[dict]] = {}
    for e in expectations:
        if len(e.get("points") or []) == 1:
            at.setdefault(tuple(e["points"][0].get("x") or ()), []).append(e)
    at = {x: claims for x, claims in at.items() if len(claims) > 1}
    if len(at) < 2:
        return []

    def said(e: dict) -> str:  # its id, its effect, and the marks a verdict line gives it
        effect = e["points"][0].get("effect") or {}
        marks = [f"{effect['name']} {number_said(effect.get('value'))}"] if "name" in effect else []
        marks += [report_spec.EDITED_SAID] if e.get("edited_after_runs") else []
        marks += ["under the earlier definition of stalled"] if e["id"] in earlier else []
        return f"`{e['id']}`" + (f" ({'; '.join(marks)})" if marks else "")

    rows = [
        [" / ".join(map(str, x))]
        + [
            ", ".join(said(e) for e in claims if e["verdict"] == v) or "—"
            for v in (CONFIRMED, NOT_CONFIRMED, INCONCLUSIVE)
        ]
        for x, claims in at.items()
    ]
    return [
        f"The claims judged at one {x_name} each, by where they are judged:",
        "",
        markdown_table([x_name, CONFIRMED, NOT_CONFIRMED, INCONCLUSIVE], rows),
        "",
    ]
