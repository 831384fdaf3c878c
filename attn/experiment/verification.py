"""A verification's record: which re-runs it holds, how two of one report merge, and what it says in words.

attn verify (attn.experiment.verify) makes the re-runs and compares their reports into a record
(runs/verify/<name>.json): each expectation's verdict per re-run, each cell's count of seeds that learned,
the runs left bit for bit, the platforms, what the materialized re-run did. Here are the facts about such a
record that its readers share (the markers of what a re-run did not make or judge, which re-runs it holds,
whether verdicts agree), the merge of two records of one report (a large experiment verified a re-run at a
time), and the record in words: verify.md, and the phrases attn.results_text builds README's lines from.
"""

from __future__ import annotations

import json
from pathlib import Path

from attn.store import runs
from attn.text import and_list, markdown_table

NOT_RERUN = "not re-run"  # a claim or cell a re-run did not make (attn.report.judged_cells): no test there


def verdicts_agree(verdicts: dict[str, str]) -> bool:
    """Whether a claim's verdicts agree across the re-runs that judged it (NOT_RERUN: one that did not)."""
    return len({v for v in verdicts.values() if v != NOT_RERUN}) <= 1


def cell_key(*parts) -> str:
    """A cell's settings (and a seed) as one hashable text, the same in every report."""
    return json.dumps(parts, sort_keys=True)


LINKED = "linked"  # a cell a re-run did not make: its runs are the runs as run, so it says nothing there
UNCOMPARED = (LINKED, NOT_RERUN)  # a cell's count where a re-run did not make it: left out of the comparison


def cells_agreement(cells: list[dict], variants: int) -> str:
    """'the same count in all four in N of M cells', and how many of those one re-run linked or did not make."""
    same = [c for c in cells if c["same"]]
    linked = sum(LINKED in c.get("learned", {}).values() for c in same)
    not_rerun = sum(NOT_RERUN in c.get("learned", {}).values() for c in same)
    without = [
        *(
            [f"{linked} of them compared without the materialized re-run, which has them as run: the same algorithm"]
            if linked
            else []
        ),
        *(
            [f"{not_rerun} of them compared without the materialized re-run, which did not make them"]
            if not_rerun
            else []
        ),
    ]
    return f"the same count in {in_all(variants)} in {len(same)} of {len(cells)} cells" + (
        f" ({'; '.join(without)})" if without else ""
    )


VARIANTS = ("float64", "kernel", "materialized")  # the re-runs verify makes (the kernel's is named after it)
JUDGED_ONLY = "materialized_judged_only"  # a verification's flag: its materialized re-run made the judged cells alone
NOT_ASKED = "not made (attn verify --variants)"  # the materialized re-run, when --variants leaves it out


def merge(earlier: dict, later: dict) -> dict:
    """Two verifications of one report (the same as_run digest) as one: each re-run the later made, and
    those the earlier made that the later did not; every agreement taken afresh over them all. A large
    experiment is so verified a re-run at a time (each its own platform and commit, as each says)."""
    if later.get(JUDGED_ONLY) and "materialized" in earlier["platforms"] and not earlier.get(JUDGED_ONLY):
        raise runs.RunError(
            f"verify: the verification of {later['experiment']} re-ran the judged cells alone with the "
            "materialized head, and the one it would be merged with re-ran every cell so: keep that one"
        )
    for which, verification in (("earlier", earlier), ("later", later)):
        if not (verification.get("as_run") or {}).get("sha256"):
            raise runs.RunError(
                f"verify: the {which} verification of {verification['experiment']} does not say "
                "which report it took as run (an older attn verify made it), so it cannot be merged"
            )
    if earlier["as_run"]["sha256"] != later["as_run"]["sha256"] or earlier["experiment"] != later["experiment"]:
        raise runs.RunError(
            f"verify: the verifications of {earlier['experiment']} and {later['experiment']} took "
            "different reports as run; only re-runs of one report can be set side by side"
        )
    platforms = {**earlier["platforms"], **later["platforms"]}
    platforms = {v: platforms[v] for v in reruns_in_order(platforms)}
    expectations = []
    for eid in dict.fromkeys(r["id"] for v in (earlier, later) for r in v["expectations"]):
        verdicts = {
            k: x
            for v in (earlier, later)
            for r in v["expectations"]
            if r["id"] == eid
            for k, x in r["verdicts"].items()
        }
        verdicts = {v: verdicts.get(v, "absent") for v in platforms}
        expectations.append({"id": eid, "verdicts": verdicts, "agree": verdicts_agree(verdicts)})
    cells = {}
    for row in (*earlier.get("cells", []), *later.get("cells", [])):
        key = cell_key(row["settings"])
        learned = {**cells.get(key, {}).get("learned", {}), **row["learned"]}
        compared = {count for count in learned.values() if count not in UNCOMPARED}
        cells[key] = {
            "settings": row["settings"],
            "learned": {v: learned.get(v, "absent") for v in platforms},
            "same": len(compared) == 1,
        }
    made_materialized = (
        later
        if "materialized" in later["platforms"]
        else earlier
        if "materialized" in earlier["platforms"]
        else later
        if later.get("materialized") != NOT_ASKED
        else earlier
    )
    merged = {
        **earlier,
        **later,
        "platforms": platforms,
        "expectations": expectations,
        "agree": all(r["agree"] for r in expectations),
        "cells": list(cells.values()),
        "unchanged": {**earlier.get("unchanged", {}), **later.get("unchanged", {})},
        "materialized": made_materialized.get("materialized"),
    }
    for key in ("remade", JUDGED_ONLY):
        merged.pop(key, None)
        if key in made_materialized:
            merged[key] = made_materialized[key]
    merged.pop("files", None)
    return merged


RERUN_WORDS = {
    "float64": "in float64",
    "kernel": "on a second BLAS kernel",
    "materialized": "with the materialized head",
}


def kernel_reruns(platforms) -> list[str]:
    """The re-runs of a verification made on a second kernel (each named after its kernel)."""
    return [v for v in platforms if v not in ("as run", *VARIANTS)]


def reruns_made(result: dict) -> dict[str, bool]:
    """Which of VARIANTS' re-runs a verification made."""
    platforms = result["platforms"]
    return {
        "float64": "float64" in platforms,
        "kernel": bool(kernel_reruns(platforms)),
        "materialized": "materialized" in platforms,
    }


def reruns_said(result: dict) -> str:
    """The re-runs a verification made, in VARIANTS' order, in words, and those it did not make (attn verify
    --variants left them out): 'in float64, not yet with the materialized head'."""
    made = reruns_made(result)
    words = {**RERUN_WORDS, "kernel": f"{RERUN_WORDS['kernel']} ({', '.join(kernel_reruns(result['platforms']))})"}
    partly = partly_judged(result).get("materialized") if result.get(JUDGED_ONLY) else None
    if partly:
        words["materialized"] += f" on the cells of {partly[0]} of the {partly[1]} claims alone"
    text = and_list([words[v] for v in VARIANTS if made[v]]) or "nowhere"
    if not made["materialized"] and result.get("materialized") and result.get("materialized") != NOT_ASKED:
        text += f" (the materialized re-run: {result['materialized']})"
    missing = reruns_missing_said(result)
    return text + (f", not yet {missing}" if missing else "")


def reruns_missing_said(result: dict) -> str:
    """The re-runs of VARIANTS a verification was asked not to make, in words, 'in float64 or with the
    materialized head' (those that apply: a materialized re-run where no cell runs width-free is not
    missing); empty when none is."""
    made = reruns_made(result)
    made["materialized"] = made["materialized"] or result.get("materialized") != NOT_ASKED
    return " or ".join(RERUN_WORDS[v] for v in VARIANTS if not made[v])


def in_all(n_reports: int) -> str:
    """'both' for the run and one re-run, 'all three' with two, 'all four' with three."""
    return "both" if n_reports == 2 else "all " + {3: "three", 4: "four"}.get(n_reports, str(n_reports))


def reruns_in_order(platforms) -> list[str]:
    """The re-runs' names as run first, then VARIANTS' order (the kernel's by its own name): a verification
    read back from JSON has them sorted."""
    rank = {"as run": 0, "float64": 1, "materialized": 3}
    return sorted(platforms, key=lambda variant: rank.get(variant, 2))


def verify_markdown(result: dict) -> str:
    variants = reruns_in_order(result["platforms"])
    header = ["expectation", *variants, "agree"]
    rows = [
        [r["id"], *(r["verdicts"][v] for v in variants), "yes" if r["agree"] else "NO"] for r in result["expectations"]
    ]
    platforms = "; ".join(
        f"{v}: {', '.join(p.get('cpu', []))}, {', '.join(p.get('blas', []))}, "
        f"{', '.join(p.get('dtype', []))}, "
        f"OPENBLAS_CORETYPE {', '.join(p.get('openblas_coretype', []))}, "
        f"subnormals {', '.join(p.get('denormals', ['kept']))}, attn {', '.join(p.get('attn_commit', []))}"
        for v, p in ((v, result["platforms"][v]) for v in variants)
    )
    if not rows:
        verdicts = ["The experiment declares no expectations: it claims nothing that could flip."]
    else:
        verdicts = [
            markdown_table(header, rows),
            "",
            "Every verdict agrees."
            if result["agree"]
            else f"{sum(not r['agree'] for r in result['expectations'])} of {len(rows)} verdicts differ between runs "
            "of the same seeds: run-to-run variance (per-seed outcomes of chaotic arms move with rounding), not "
            "evidence for or against those claims. The frozen claims stand as judged on the runs they were frozen "
            "for; a claim changes only through a new experiment on fresh seeds.",
            *not_rerun_said(result),
        ]
    return "\n".join(
        [
            f"### {result['experiment']}: verdicts as run and re-run ({', '.join(variants[1:])})",
            "",
            *_as_run_markdown(result),
            f"Platforms: {platforms}.",
            "",
            *platform_said(result),
            f"Re-run {reruns_said(result)}.",
            "",
            *([f"Materialized re-run: {result['materialized']}.", ""] if result.get("materialized") else []),
            *(
                [
                    f"Of those made as they ran, {result['remade']['same']} of {result['remade']['runs']} "
                    "took bit for bit the path they took as run (finite in both).",
                    "",
                ]
                if result.get("remade")
                else []
            ),
            *verdicts,
            "",
            *_cells_markdown(result.get("cells", []), variants),
            *_unchanged_markdown(result.get("unchanged", {})),
        ]
    )


def partly_judged(result: dict) -> dict[str, tuple[int, int]]:
    """The re-runs that judged only some claims (NOT_RERUN for the rest): variant -> (judged, claims)."""
    rows = result["expectations"]
    left = {v: sum(r["verdicts"].get(v) == NOT_RERUN for r in rows) for v in result["platforms"]}
    return {v: (len(rows) - n, len(rows)) for v, n in left.items() if n}


def not_rerun_said(result: dict) -> list[str]:
    """A word where a re-run judged only some claims (NOT_RERUN): how many it left and why that is no test,
    and what the claims it judged had been as run (a check of inconclusive claims alone tests no confirmed one)."""
    said = []
    for variant, (judged, claims) in partly_judged(result).items():
        as_run = [r["verdicts"].get("as run") for r in result["expectations"] if r["verdicts"][variant] != NOT_RERUN]
        were = ", ".join(f"{as_run.count(v)} {v}" for v in dict.fromkeys(as_run))
        said.append(
            f"The {variant} re-run judged {judged} of the {claims} claims ({were} as run); the other "
            f"{claims - judged} read '{NOT_RERUN}': it did not re-judge them (not all their cells re-made, the "
            "re-made report choosing another rate beside a cell, or judged within a declared budget, at every "
            "rate or over every rate), so they are not compared there."
        )
    return said


def platform_said(result: dict) -> list[str]:
    """A word where a re-run other than the second kernel's ran on another CPU or BLAS kernel than the runs as
    run: a verdict it flips may come from the machine as well as from what it changes on purpose."""
    platforms = result["platforms"]
    first = platforms.get("as run", {})
    moved = [
        v
        for v in reruns_in_order(platforms)
        if v != "as run"
        and v not in kernel_reruns(platforms)
        and (p := platforms[v]).get("cpu") is not None
        and (p.get("cpu"), p.get("blas")) != (first.get("cpu"), first.get("blas"))
    ]
    if not moved:
        return []
    return [
        f"The {and_list(moved)} re-run{'s' if len(moved) > 1 else ''} also ran on another CPU or BLAS kernel than "
        "the runs as run (Platforms above): a verdict flipped there may come from the machine as well as from "
        f"{'what each' if len(moved) > 1 else 'what it'} changes on purpose.",
        "",
    ]


def _as_run_markdown(result: dict) -> list[str]:
    """The report taken as run when it was given, and a word where the re-runs ran other code than it."""
    lines = []
    if (result.get("as_run") or {}).get("given"):
        lines += [f"As run: {result['as_run']['report']}.", ""]
    commits = {v: tuple(p.get("attn_commit", [])) for v, p in result["platforms"].items()}
    other = sorted({c for v, cs in commits.items() if v != "as run" for c in cs} - set(commits.get("as run", ())))
    if other:
        lines += [
            f"The re-runs ran attn {', '.join(other)}, not the code the runs as run came from "
            f"({', '.join(commits.get('as run', ())) or 'unknown'}): a verdict that differs may come from the "
            "code as well as from rounding.",
            "",
        ]
    return lines


def _cells_markdown(cells: list[dict], variants: list[str]) -> list[str]:
    """How many cells learned in as many seeds everywhere, and a table of those that did not."""
    if not cells:
        return []
    differing = [c for c in cells if not c["same"]]
    summary = f"Seeds that learned, per cell: {cells_agreement(cells, len(variants))}"
    if not differing:
        return [summary + ".", ""]
    keys = list(dict.fromkeys(k for c in differing for k in c["settings"]))
    table = markdown_table(
        [*keys, *(f"learned {v}" for v in variants)],
        [[*(c["settings"].get(k, "—") for k in keys), *(c["learned"][v] for v in variants)] for c in differing],
    )
    return [summary + "; where it differs:", "", table, ""]


def _unchanged_markdown(unchanged: dict[str, dict]) -> list[str]:
    if not unchanged:
        return []
    return [
        "Runs that took bit for bit the path they took as run (the same train loss at every logged step; of "
        "those finite in both): "
        + ", ".join(
            f"{variant} {unchanged[variant]['same']} of {unchanged[variant]['runs']}"
            for variant in reruns_in_order(unchanged)
        )
        + " (where a re-run changed no run, it tested nothing there).",
        "",
    ]


def write_record(result: dict, runs_dir: Path) -> dict:
    """A verification written to <runs_dir>/verify/<name>.json, with its words in .md beside it; the result
    with the two paths (`files`)."""
    out = Path(runs_dir) / "verify"
    out.mkdir(parents=True, exist_ok=True)
    runs.write_json(out / f"{result['experiment']}.json", result)
    runs.write_atomic(out / f"{result['experiment']}.md", verify_markdown(result).encode())
    return {**result, "files": [str(out / f"{result['experiment']}.md"), str(out / f"{result['experiment']}.json")]}
