"""Conclusions that do not depend on rounding: an experiment re-run where
its floating point differs, and its verdicts compared one by one.

    attn verify experiments/sqrt_dk.yaml [--kernel Sandybridge] [--workers N]

The experiment's own report (runs/<name>/report.json, from `attn sweep`)
is the reference, or with --as-run DIR the report in DIR: a published one
(experiments/results/<name>), whose runs need not be here, so that anyone can
re-run a published result on their own machine from the commit it names.
It is re-run, each time through `attn sweep` in a child process, into
runs/verify/<variant>/<name>:

    float64   every cell in float64 (dtype=float64), on the same BLAS kernel
    <kernel>  float32 again, with OPENBLAS_CORETYPE=<kernel> set for that
              child alone: another of OpenBLAS's kernels for this CPU, whose
              products round differently (by default Sandybridge, which has
              no fused multiply-add; SkylakeX where the CPU has AVX-512 and
              Sandybridge is what runs already)

    materialized  where some cell carries its head width-free (attn.model.widthfree:
              coordinates over the initial span), those cells again with
              model.width_free=false: the d_k-wide weights, a second
              algorithm for the same maths, whose float32 rounding differs;
              where both fit: a cell wider than MATERIALIZED_WIDTH cannot be
              re-run so (its step's cost grows with d_k); it and the cells
              that are not width-free are the runs as run, hard-linked in
              (re-run as they ran where those runs are not here, which
              tells whether they took the same path bit for bit),
              so the report is whole (`attn sweep --only` passes, one per
              block of the grid, into one directory, then `attn report` of
              all; a report counts either algorithm's run as the cell's,
              attn.config.schema's `algorithm` fact)

Each writes its report; a report is compared only if it covers every run of
the file, each finished, under the claims and seeds the file has now (one
written mid-sweep, or before the claims changed, is refused). Then every
expectation's verdict is compared across them. A verdict that flips when the
same seeds are re-run is run-to-run variance, reported as such (how many
verdicts and cells moved): the frozen claim stands, and a claim changes only
through a new experiment on fresh seeds.
Beside the verdicts, each cell's count of seeds that learned is set side by
side, and the cells where it differs are listed (a cell the materialized
re-run linked is compared across the re-runs that made it): per-seed outcomes
of a chaotic arm may flip, which is why claims are made on rates with
intervals and not on counts. And it counts the runs each re-run left bit for
bit where they were (the same train loss at every logged step): a second
kernel changes the BLAS products but not what numpy computes without BLAS,
and at a small rate a rounding difference can stay below a weight's last
bit; where a re-run changed no run, the check tested nothing. An experiment
that declares no expectations claims nothing, so no verdict can flip; it
says so rather than "every verdict agrees". The comparison is written to
runs/verify/<name>.md and .json, and verify exits 1 if any verdict differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from attn.config.loading import build_task, runs_width_free, value_width
from attn.config.yamlio import yaml_line
from attn.experiment import report_spec
from attn.experiment.spec import Experiment, only_argument
from attn.experiment.verification import (
    LINKED,
    NOT_ASKED,
    NOT_RERUN,
    UNCOMPARED,
    VARIANTS,
    cell_key,
    verdicts_agree,
    write_record,
)
from attn.store import processes, runs
from attn.text import settings_json

KERNELS = ("Sandybridge", "SkylakeX", "Nehalem")  # OpenBLAS core types to try as the second kernel, in order
# the widest d_k (d_v) the materialized re-run carries as d_k-wide weights: the widest the headline ran
# materialized before width-free training (issue 21); a wider one's step costs d_k / 4096 times as much
MATERIALIZED_WIDTH = 4096
RUN_ENDED = re.compile(r"\[\d+/\d+\] ")  # the line a sweep prints as each run ends (attn.cli.sweeps)


def running_kernel(env: dict | None = None) -> str | None:
    """The OpenBLAS kernel numpy uses under `env` (a child process asked)."""
    code = (
        "from threadpoolctl import threadpool_info; import numpy; "
        "print(next((i.get('architecture') for i in threadpool_info() if i.get('internal_api') == 'openblas'), ''))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or None


def second_kernel(requested: str | None = None) -> str:
    """An OpenBLAS kernel other than the one running that this CPU runs
    (`requested` if it does); RunError when there is none (not OpenBLAS)."""
    current = running_kernel()
    if current is None:
        raise runs.RunError(
            "verify: numpy's BLAS is not OpenBLAS, whose kernels OPENBLAS_CORETYPE chooses, so "
            "there is no second kernel to re-run under; the float64 re-run alone is "
            "`attn sweep EXPERIMENT dtype=float64 --runs-dir runs/verify/float64`"
        )
    for kernel in [requested] if requested else KERNELS:
        if kernel != current and running_kernel({**os.environ, "OPENBLAS_CORETYPE": kernel}) == kernel:
            return kernel
    raise runs.RunError(
        f"verify: --kernel {requested or ', '.join(KERNELS)}: not available on this CPU "
        f"besides {current}; expected an OpenBLAS core type such as {', '.join(KERNELS)}"
    )


def variant_directory(experiment: Experiment, variant: str) -> Path:
    """runs/verify/<variant>: the runs_dir of a re-run."""
    return Path(experiment.cells[0].config.runs_dir) / "verify" / variant


def rerun(
    experiment: Experiment,
    variant: str,
    passes: list[list[str]],
    env: dict,
    workers: int | None,
    progress: Callable[[str], None],
    attn: tuple[list[str], Path | None, str] | None = None,
) -> Path:
    """`attn sweep` of the experiment into runs/verify/<variant>, once per
    pass (each its overrides and options); with several passes (each --only
    a part), then `attn report` of the whole; the directory of its report.
    Each run's end, as the sweep says it ('[k/N] cell: ...'), goes to `progress` as it comes.
    `attn`: another checkout's attn to run it with (its python command, working directory and the
    experiment file's path there; default: this one's)."""
    runs_dir = variant_directory(experiment, variant)
    report = runs_dir / experiment.name / runs.REPORT_FILE
    parts = ["--no-report"] if len(passes) > 1 else []  # each pass a part: one report of the whole, at the end
    report.unlink(missing_ok=True)  # a report left by an earlier verify must not stand in for this one's
    python, cwd, file = attn or ([sys.executable], None, str(experiment.path))
    commands = [
        ["sweep", file, *arguments, "--runs-dir", str(runs_dir), *parts]
        + (["--workers", str(workers)] if workers else [])
        for arguments in passes
    ]
    if len(passes) > 1:
        commands.append(["report", file, "--runs-dir", str(runs_dir)])
    for last, command in enumerate(commands, start=1 - len(commands)):
        progress(f"{variant}: attn {' '.join(command)}")
        done = processes.run_child(
            [*python, "-m", "attn", *command],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            on_line=lambda line: progress(f"{variant}: {line}") if RUN_ENDED.match(line) else None,
        )
        if done.returncode != 0 or (last == 0 and not report.exists()):
            lines = done.stderr.strip().splitlines()
            raise runs.RunError(
                f"verify: the {variant} re-run failed (exit {done.returncode}): {lines[-1] if lines else 'no output'}"
            )
    return report.parent


@dataclass(frozen=True)
class MaterializedPlan:
    """The materialized re-run: its `attn sweep` passes, the cells they re-run with model.width_free=false
    (width-free cells at most MATERIALIZED_WIDTH wide), the other cells (their finished runs are linked from
    the experiment as run: the same algorithm, nothing to re-run), and what it does, in words."""

    passes: list[list[str]]
    rerun: frozenset
    reused: frozenset
    said: str


def materialized_plan(experiment: Experiment) -> MaterializedPlan:
    """The cells to re-run materialized and the passes that do it, each a block of the grid
    (--only KEY=values); no pass where no cell would change."""

    def wide(cell) -> int:
        return max(cell.config.model.d_k, value_width(cell.config))

    free = {cell.name for cell in experiment.cells if runs_width_free(cell.config, build_task(cell.config))}
    fits = frozenset(c.name for c in experiment.cells if c.name in free and wide(c) <= MATERIALIZED_WIDTH)
    if not fits:
        said = "no cell runs width-free" if not free else f"every width-free cell is wider than {MATERIALIZED_WIDTH}"
        return MaterializedPlan([], frozenset(), frozenset(), said)
    blocks = _blocks(list(experiment.cells), list(experiment.grid_keys), fits, ())
    passes = [
        (["model.width_free=false"] if fit else [])
        + [a for key, values in only for a in ("--only", only_argument(key, values))]
        for only, fit in blocks
    ]
    said = (
        "; ".join(
            " ".join(f"{key} {', '.join(map(yaml_line, values))}" for key, values in only) or "every cell"
            for only, fit in blocks
            if fit
        )
        + " re-run with model.width_free=false"
    )
    return MaterializedPlan(passes, fits, frozenset(c.name for c in experiment.cells) - fits, said)


def reused_said(reused: frozenset, linked: frozenset) -> str:
    """What the materialized re-run did with the runs it does not make with the other algorithm."""
    if not reused:
        return ""
    kept = [f"{len(linked)} linked as they ran: not re-run"] if linked else []
    if reused - linked:
        kept.append(f"{len(reused - linked)} not here as run, so made again as they ran")
    return (
        f"; the other {len(reused)} runs (not width-free, or wider than {MATERIALIZED_WIDTH}) keep the "
        f"algorithm they ran with: {', '.join(kept)}"
    )


def link_finished_runs(experiment: Experiment, target: Path, names: frozenset) -> frozenset:
    """Hard-link the finished runs of these cells from the experiment's directory into `target` (a finished
    run is never written again, so the links share nothing that changes); the names whose runs in `target`
    are such links, made now or by an earlier verify. A run not finished there is left for the re-run's
    sweep to train."""
    for name in sorted(names):
        source, destination = experiment.directory / name, target / name
        if not destination.exists() and (runs.read_summary(source) or {}).get("status") in runs.FINISHED:
            shutil.copytree(source, destination, copy_function=os.link)
    return linked_runs(experiment, target, names)


def linked_runs(experiment: Experiment, target: Path, names: frozenset) -> frozenset:
    """The names whose run in `target` is a hard link of the experiment's own run."""

    def same(name: str) -> bool:
        source, destination = (d / name / "summary.json" for d in (experiment.directory, target))
        return source.exists() and destination.exists() and os.path.samefile(source, destination)

    return frozenset(name for name in names if same(name))


def _blocks(cells: list, keys: list[str], fits: set, only: tuple) -> list[tuple[tuple, bool]]:
    """The cells as blocks of the grid that each fit or not (fits: the names
    that do): split by the first key whose values each fit or not, else by the
    values of the first key that varies, and again within each."""
    if len({c.name in fits for c in cells}) == 1:
        return [(only, cells[0].name in fits)]
    for key in keys:
        by_value = _by_value(cells, key)
        fit_of = {text: {c.name in fits for c in group} for text, (_, group) in by_value.items()}
        if all(len(fit) == 1 for fit in fit_of.values()):
            return [
                (only + ((key, tuple(by_value[t][0] for t, fit in fit_of.items() if fit == {wanted})),), wanted)
                for wanted in (True, False)
            ]
    key = next(k for k in keys if len(_by_value(cells, k)) > 1)
    return [
        block
        for value, group in _by_value(cells, key).values()
        for block in _blocks(group, keys, fits, only + ((key, (value,)),))
    ]


def _by_value(cells: list, key: str) -> dict[str, tuple[object, list]]:
    """The cells by their value of `key` (None: a block that does not set it), keyed by its YAML text,
    as a mapping value is not hashable: text -> (value, cells)."""
    out: dict[str, tuple[object, list]] = {}
    for cell in cells:
        value = dict(cell.settings).get(key)
        out.setdefault(yaml_line(value), (value, []))[1].append(cell)
    return out


def compare_verdicts(reports: dict[str, dict]) -> list[dict]:
    """Per expectation id: its verdict in every report, and whether they agree."""
    ids = list(dict.fromkeys(e["id"] for r in reports.values() for e in r["expectations"]))
    rows = []
    for eid in ids:
        verdicts = {
            variant: next((e["verdict"] for e in r["expectations"] if e["id"] == eid), "absent")
            for variant, r in reports.items()
        }
        rows.append({"id": eid, "verdicts": verdicts, "agree": verdicts_agree(verdicts)})
    return rows


def compare_cells(
    reports: dict[str, dict], linked: dict[str, set] | None = None, not_rerun: dict[str, set] | None = None
) -> list[dict]:
    """Per cell (its settings) of any report: seeds that learned out of seeds
    in every report ('absent' where a report lacks the cell, which then differs;
    LINKED where the re-run linked the runs as run, `linked`: variant -> cell
    keys, and NOT_RERUN where it did not make the cell, `not_rerun`: likewise,
    both left out of the comparison, as agreeing there would be no test)."""

    def counts(report: dict) -> dict[str, str]:
        return {cell_key(c["settings"]): f"{c['success_rate']['k']}/{c['success_rate']['n']}" for c in report["cells"]}

    per_variant = {variant: counts(r) for variant, r in reports.items()}
    rows = []
    for key in dict.fromkeys(key for by_cell in per_variant.values() for key in by_cell):
        learned = {
            variant: LINKED
            if key in (linked or {}).get(variant, ())
            else NOT_RERUN
            if key in (not_rerun or {}).get(variant, ())
            else by_cell.get(key, "absent")
            for variant, by_cell in per_variant.items()
        }
        compared = {count for count in learned.values() if count not in UNCOMPARED}
        rows.append({"settings": json.loads(key)[0], "learned": learned, "same": len(compared) == 1})
    return rows


def unchanged_runs(reports: dict[str, dict], only: dict[str, set] | None = None) -> dict[str, dict]:
    """Per re-run: of the runs that ended at a finite final eval loss both in it
    and in the first report, how many took bit for bit the same path (the
    same train loss at every logged step: the seed's `path` digest). A re-run
    that changes no run tests nothing: where rounding did not move (at a
    small rate, for one, a rounding difference in the gradient times the rate
    can fall below a weight's last bit), no verdict could flip. Runs that
    diverged in either are not counted; `only` (variant -> run keys) counts a
    re-run over the runs it re-ran alone (the materialized one's linked runs
    are the runs as run)."""

    def paths(report: dict) -> dict[str, str | None]:  # a diverged seed's final loss is "inf" (json_number)
        return {
            cell_key(c["settings"], s["seed"]): s.get("path") if runs.is_finite_number(s["final_loss"]) else None
            for c in report["cells"]
            for s in c["seeds"]
        }

    first, *others = (paths(r) for r in reports.values())
    result = {}
    for variant, by_run in zip(list(reports)[1:], others):
        both = [
            key
            for key, path in first.items()
            if path is not None
            and by_run.get(key) is not None
            and (only is None or variant not in only or key in only[variant])
        ]
        result[variant] = {"same": sum(first[key] == by_run[key] for key in both), "runs": len(both)}
    return result


def verify(
    experiment: Experiment,
    kernel: str | None,
    workers: int | None,
    progress: Callable[[str], None] = lambda message: None,
    variants: tuple[str, ...] = VARIANTS,
    as_run: Path | None = None,
    made: bool = False,
) -> dict:
    """Re-run the experiment in float64, under a second kernel and, where it runs width-free, with the
    materialized head (`variants`: those of VARIANTS to make); compare every verdict (module docstring).
    `as_run`: the directory of the report to verify (default: the experiment's own). `made`: the re-runs
    are in place already, with their reports (made by other code: attn.report.published), compared as
    they are."""
    reference = Path(as_run) if as_run is not None else experiment.directory
    main = reference / runs.REPORT_FILE
    if not main.exists():
        raise runs.RunError(
            f"verify: {main}: no report"
            + (
                "; expected a directory holding a report.json and its seeds file, e.g. experiments/results/<name>"
                if as_run is not None
                else f" yet; run `attn sweep {experiment.path}` first"
            )
        )
    reports = {"as run": checked_report(experiment, reference, "as run")}
    kernel = second_kernel(kernel) if "kernel" in variants else None  # refused before any re-run, not after one

    def remade(variant: str, passes: list[list[str]], env: dict) -> Path:
        if made:
            return variant_directory(experiment, variant) / experiment.name
        return rerun(experiment, variant, passes, env, workers, progress)

    directories = {}
    if "float64" in variants:
        directories["float64"] = remade("float64", [["dtype=float64"]], dict(os.environ))
    if kernel is not None:
        directories[kernel] = remade(kernel.lower(), [[]], {**os.environ, "OPENBLAS_CORETYPE": kernel})
    plan = materialized_plan(experiment)
    if "materialized" not in variants:
        plan = MaterializedPlan([], frozenset(), frozenset(), NOT_ASKED)
    linked, said = frozenset(), plan.said
    if plan.passes:
        target = variant_directory(experiment, "materialized") / experiment.name
        if as_run is None:
            target.mkdir(parents=True, exist_ok=True)
            linked = link_finished_runs(experiment, target, plan.reused)
        elif not made and (stale := linked_runs(experiment, target, plan.reused)):  # another sweep's, not the report's
            raise runs.RunError(
                f"verify: {target}: holds {len(stale)} runs linked from {experiment.directory}, "
                f"not the runs of {main}; remove them, or verify the experiment's own report"
            )
        said += reused_said(plan.reused, linked)
        directories["materialized"] = remade("materialized", plan.passes, dict(os.environ))
    reports.update(
        {variant: checked_report(experiment, directory, variant) for variant, directory in directories.items()}
    )
    rows = compare_verdicts(reports)

    def keys(names: frozenset, with_seed: bool) -> set[str]:
        return {
            cell_key(settings_json(c.settings), *([c.seed] if with_seed else []))
            for c in experiment.cells
            if c.name in names
        }

    result = {
        "experiment": experiment.name,
        "as_run": as_run_record(main, as_run is not None),
        "platforms": {v: r["platform"] for v, r in reports.items()},
        "expectations": rows,
        "agree": all(r["agree"] for r in rows),
        "cells": compare_cells(reports, {"materialized": keys(linked, with_seed=False)}),
        "unchanged": unchanged_runs(reports, {"materialized": keys(plan.rerun, with_seed=True)}),
        "materialized": said,
    }
    if plan.passes and plan.reused - linked:
        result["remade"] = unchanged_runs(
            {v: reports[v] for v in ("as run", "materialized")},
            {"materialized": keys(plan.reused - linked, with_seed=True)},
        )["materialized"]
    return write_record(result, Path(experiment.cells[0].config.runs_dir))


def as_run_record(report: Path, given: bool) -> dict:
    """Which report a verification took as run: its path (from here, where it is below here), whether it
    was given rather than the experiment's own, and report_digest, by which `attn publish` tells that it
    verified the report it publishes beside."""
    resolved = Path(report).resolve()
    shown = resolved.relative_to(Path.cwd().resolve()) if resolved.is_relative_to(Path.cwd().resolve()) else resolved
    return {"report": str(shown), "given": given, "sha256": report_digest(resolved)}


def report_digest(report: Path) -> str:
    """SHA-256 of a report.json's content, but the experiment file's path as typed (`attn report` from
    another directory writes the same report)."""
    content = json.loads(Path(report).read_text())
    content.pop("file", None)
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


REPORT_READ = {  # what verify reads of a report (runs.json_shape_problem's shapes): checked before it is read
    "claims": dict,
    "platform": dict,
    "expectations": [{"id": str, "verdict": str}],
    "cells": [
        {
            "settings": dict,
            "n": int,
            "unfinished": runs.EachValue(int),
            "success_rate": {"k": int, "n": int},
            "seeds": [{"seed": object, "final_loss": object}],
        }
    ],
}


def checked_report(experiment: Experiment, directory: Path, what: str) -> dict:
    """A report to compare: of every run of the file, each finished, under the claims the file has now
    (a report written mid-sweep, or before the claims or seeds changed, would compare other rules), and
    holding what verify reads of it, of the types it reads (REPORT_READ; else RunError, one line)."""
    report = runs.read_report_json(directory)
    path = directory / runs.REPORT_FILE
    problem = runs.json_shape_problem(report, REPORT_READ)
    if problem:
        raise runs.RunError(
            f"verify: {path} ({what}): unreadable: {problem}; write it again with `attn report {experiment.path}`"
        )
    digest = report_spec.claims_record(experiment.report, {c.seed for c in experiment.cells})["digest"]
    if (report.get("claims") or {}).get("digest") != digest:
        raise runs.RunError(
            f"verify: {path} ({what}) was written under other claims or seeds than "
            f"{experiment.path} has now; write it again with `attn report {experiment.path}`"
        )
    unfinished = sum(sum(c["unfinished"].values()) for c in report["cells"])
    finished = sum(c["n"] for c in report["cells"])
    if unfinished or finished != len(experiment.cells):
        raise runs.RunError(
            f"verify: {path} ({what}) covers {finished} finished runs of the file's "
            f"{len(experiment.cells)} ({unfinished} unfinished); finish the sweep and write it again"
        )
    return report
