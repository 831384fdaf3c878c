"""Numbers and tables for people: a metric, a run's headline figures, a Markdown table, a setting as reports write it.

The store reads and writes run files; this formats what they hold (the CLI's
lines, a sweep's progress, reports, verify and the benchmark's tables).
"""

from __future__ import annotations

import math

from attn.store.runs import is_finite_number


def format_number(value, spec: str) -> str:
    """A metric for people: formatted if it is a finite number, else 'nan'
    (records store non-finite values, and meaningless ones, as null)."""
    return format(value, spec) if is_finite_number(value) else "nan"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; a '|' inside a cell is escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def and_list(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def summary_figures(summary: dict) -> str:
    """'outcome learned  eval_loss 0.0012 (chance 2.77, no retrieval 1.8)  eval_acc 1.000 (99% first at step 50)'
    from a summary, in memory (NaN) or read back from disk (null): the outcome where the run has one, the task's
    reference losses beside the loss, so a loss reads as learned or not, and the step eval accuracy first reached
    99%."""
    final, best = summary.get("final") or {}, summary.get("best") or {}
    outcome = summary.get("outcome_said") or summary.get("outcome")
    references = summary.get("references")
    levels = [
        f"{name.replace('_', ' ')} {format_number(value, '.3g')}"
        for name, value in (references.items() if isinstance(references, dict) else ())
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ]
    reached = best.get("steps_to_99")
    reached = reached if isinstance(reached, int) and not isinstance(reached, bool) else None
    return (
        (f"outcome {outcome}  " if isinstance(outcome, str) else "")
        + f"eval_loss {format_number(final.get('eval_loss'), '.4g')}"
        + (f" ({', '.join(levels)})" if levels else "")
        + f"  eval_acc {format_number(final.get('eval_accuracy'), '.3f')} "
        + (f"(99% first at step {reached})" if reached is not None else "(never 99%)")
    )


def format_value(value) -> str:
    """A config value as YAML would write it, short: null, true, 0.001, {W_q: 0.1}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def value_of(value):
    """A setting as a comparable, hashable value (a mapping or list as its text)."""
    return format_value(value) if isinstance(value, (dict, list)) else value


def json_number(value):
    """A number or string as JSON takes it (inf as the string 'inf')."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else "-inf" if value < 0 else None
    return value


def settings_json(settings) -> dict:
    """A cell's settings as its report's JSON has them (value_of, json_number): the key of a cell across reports."""
    return {k: json_number(value_of(v)) for k, v in dict(settings).items()}


def number_said(value) -> str:
    """A statistic in a sentence or a table: 3 significant figures; a string ('inf') as it is; '—' for no
    number (None, NaN)."""
    if isinstance(value, str):
        return value
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"
