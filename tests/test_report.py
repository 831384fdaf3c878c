"""The experiment report (attn.report.experiment_report), from hand-made run directories
(config.yaml, metrics.jsonl and summary.json written directly, no
training): every seed's outcome class as attn.outcomes defines it, the
unfinished runs counted apart; each (x, arm) judged at the best_of value
the declared `select` rule picks, the edge notes, the shared value; every
kind of expectation judged confirmed / not confirmed / inconclusive with the
numbers behind it, computed here from attn.analysis.stats; runs left out with the
reason; the figures; a grid over a mapping field; bad `report:` sections
refused."""

import csv
import io
import itertools
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import PNG_SIGNATURE, facts_in

from attn import outcomes
from attn.analysis import stats
from attn.analysis.results import BOOTSTRAP_SEED, COUNTED, collect
from attn.config.loading import build_task, load_config, replace
from attn.config.schema import to_dict
from attn.config.yamlio import ConfigError
from attn.experiment import report_spec
from attn.experiment import spec as experiments
from attn.model import mechanism
from attn.outcomes import DIVERGED, LEARNED, LEARNED_THEN_LOST, SLOW, STALLED
from attn.report import experiment_figures
from attn.report.experiment_report import Layout, judged_cells, write_report
from attn.store import arrayfiles, runs
from attn.text import format_value

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "configs" / "default.yaml"
BUDGET = 100
NAN = math.nan
BASE_CONFIG = load_config(BASE)
REFERENCES = build_task(BASE_CONFIG).reference_losses()
PLATEAU = REFERENCES["chance"]  # L: the level a stalled seed never left, chance ln C (issue 24)
CHANCE = 1 / BASE_CONFIG.task.n_values  # 1/C
SQRT, NONE = {"model.scale": "sqrt"}, {"model.scale": "none"}  # arms, as an expectation names them


def curve(outcome: str, step: int = 40, final_loss: float = 0.01) -> list[tuple]:
    """(step, eval loss, eval accuracy) records of a seed meant to be of that
    outcome class (test_each_seed_is_classed_as_attn_outcomes_defines checks
    that it is): a learner first reaches the threshold at `step`. Two
    records each: every record is a durable write, and they add up."""
    reached = (step, 0.05, 0.995)
    return {
        LEARNED: [reached, (BUDGET, final_loss, 1.0)],
        LEARNED_THEN_LOST: [reached, (BUDGET, final_loss, 0.8)],
        SLOW: [(50, 0.5 * PLATEAU, 0.5), (BUDGET, final_loss, 0.7)],
        STALLED: [(50, PLATEAU, CHANCE), (BUDGET, 0.95 * PLATEAU, 1.5 * CHANCE)],
        DIVERGED: [(50, 1.2 * PLATEAU, 1.5 * CHANCE), (60, NAN, 0.3)],  # 0.3: garbage beside the NaN
    }[outcome]


def status_of(records) -> str:
    return "diverged" if math.isnan(records[-1][1]) else "completed"


def reached_step(records) -> int | None:
    """The first logged step with eval accuracy at the threshold."""
    return next((step for step, _, accuracy in records if accuracy >= outcomes.THRESHOLD), None)


def load(tmp_path, grid, seeds, report, name="exp", stem=None):
    """The experiment file <stem or name>.yaml, written and loaded; its runs under tmp_path/runs/<name>."""
    data = {
        "name": name,
        "base": str(BASE),
        "overrides": {"train.steps": BUDGET, "logging.log_every": 10},
        "grid": grid,
        "seeds": list(seeds),
        "report": report,
    }
    path = tmp_path / f"{stem or name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return experiments.load_experiment(path, str(tmp_path / "runs"))


def cell_of(experiment, settings: dict, seed: int) -> experiments.Cell:
    return next(c for c in experiment.cells if dict(c.settings) == settings and c.seed == seed)


def write_run(experiment, settings: dict, seed: int, records, status=None, config=None):
    """A run directory as training leaves it, with `records` (step, eval
    loss, eval accuracy); status: completed, or diverged where the last loss
    is NaN, unless given; config: the cell's unless given."""
    cell = cell_of(experiment, settings, seed)
    run_dir = experiment.directory / cell.name
    run_dir.mkdir(parents=True)
    runs.write_config(run_dir, to_dict(config or cell.config), {})
    for step, loss, accuracy in records:
        runs.append_metrics(run_dir, {"step": step, "eval_loss": loss, "eval_accuracy": accuracy})
    status = status or status_of(records)
    writer = runs.heartbeat_fields() if status == "running" else {}  # this process: running, not stale
    runs.write_json(
        run_dir / "summary.json",
        {
            "status": status,
            "step": records[-1][0],
            "steps": BUDGET,
            "task": "retrieval",
            "references": REFERENCES,
            **writer,
        },
    )
    return cell


def write_plan(experiment, plan, keys: tuple) -> None:
    """plan: (the values of `keys`, each seed's records (seed = its index)) pairs."""
    for values, curves in plan:
        for seed, records in enumerate(curves):
            write_run(experiment, dict(zip(keys, values)), seed, records)


@dataclass
class Report:
    experiment: experiments.Experiment
    paths: dict
    data: dict  # report.json
    md: str

    def cell(self, **settings) -> dict:
        """report.json's cell with these settings (short keys: d_k=64)."""
        [match] = [c for c in self.data["cells"] if all(c["settings"][k] == v for k, v in full(settings).items())]
        return match

    def expectation(self, id_: str) -> dict:
        [match] = [e for e in self.data["expectations"] if e["id"] == id_]
        return match


def full(settings: dict) -> dict:
    keys = {"d_k": "model.d_k", "scale": "model.scale", "lr": "optim.lr", "lr_mult": "optim.lr_mult"}
    return {keys[k]: v for k, v in settings.items()}


def report_of(experiment, figures: bool = True) -> Report:
    """write_report's files, read back; figures=False: none drawn (they take
    most of a report's time, and the figure tests draw them for other reports)."""
    with pytest.MonkeyPatch.context() as patch:
        if not figures:
            patch.setattr(experiment_figures, "draw_all", lambda *args, **kwargs: {})
        paths = write_report(experiment)
    return Report(experiment, paths, runs.read_report_json(paths["json"].parent), paths["md"].read_text())


def as_json(value):
    return "inf" if value == math.inf else pytest.approx(value)


def markdown_rows(md: str, title: str) -> list[dict]:
    """The rows of the first table after the line `title`, as column -> text."""
    lines = md[md.index(title) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table]
    return [dict(zip(header, row)) for row in rows]


# ---------------------------------------------------------------------------
# 1. Outcome classes; the unfinished counted apart
# ---------------------------------------------------------------------------
NONE_SEEDS = {  # the unscaled cell: one seed of each class, one diverged after reaching, three unfinished
    0: curve(LEARNED),
    1: curve(LEARNED_THEN_LOST, final_loss=0.7),
    2: curve(SLOW),
    3: curve(STALLED),
    4: curve(DIVERGED),
    5: [(30, 0.05, 0.995), (60, 2.0, 0.07)],  # diverged after reaching, between two logged evals
}
DIVERGED_RUNS = {4, 5}  # summary status diverged
EXPECTED_CLASS = {0: LEARNED, 1: LEARNED_THEN_LOST, 2: SLOW, 3: STALLED, 4: DIVERGED, 5: DIVERGED}
UNFINISHED = {6: "interrupted", 7: "running", 8: "failed"}
SQRT_SEEDS = {seed: curve(LEARNED, step=10 + 10 * seed) for seed in range(5)}
LINEAR_SEEDS = {seed: curve(DIVERGED) for seed in range(3)}
MECHANISM_STEPS = (0, 10)


def made_up_rows(rng: np.random.Generator, n_rows: int = 12) -> dict:
    """Per-row statistics as attn.model.mechanism.row_statistics gives them, made up."""
    max_p = rng.uniform(0.3, 1.0, n_rows)
    max_p[:3] = 0.995  # some saturated rows
    bound = 2 * (1 - max_p)
    return {
        "max_p": max_p,
        "saturated": max_p > mechanism.SATURATED,
        "grad_W_q": rng.uniform(0.1, 1.0, n_rows),
        "grad_W_k": rng.uniform(0.1, 1.0, n_rows),
        "jacobian": bound * rng.uniform(0.2, 1.0, n_rows),
        "bound": bound,
    }


MECHANISM = {
    seed: {step: made_up_rows(np.random.default_rng([seed, step])) for step in MECHANISM_STEPS} for seed in (0, 1)
}  # the scaled seeds with a mechanism.npz


@pytest.fixture(scope="module")
def classes(tmp_path_factory):
    """d_k = 64 x scale: every outcome class and three unfinished runs in the
    unscaled cell; the scaled one all learned, two seeds with mechanism.npz;
    the linear one all diverged."""
    experiment = load(
        tmp_path_factory.mktemp("classes"),
        {"model.d_k": [64], "model.scale": ["sqrt", "linear", "none"]},
        range(9),
        {"x": "model.d_k", "arm": "model.scale"},
    )
    write_plan(experiment, [((64, "linear"), LINEAR_SEEDS.values())], ("model.d_k", "model.scale"))
    for seed, records in NONE_SEEDS.items():
        write_run(
            experiment,
            {"model.d_k": 64, "model.scale": "none"},
            seed,
            records,
            "diverged" if seed in DIVERGED_RUNS else "completed",
        )
    for seed, status in UNFINISHED.items():
        write_run(experiment, {"model.d_k": 64, "model.scale": "none"}, seed, curve(LEARNED)[:1], status)
    for seed, records in SQRT_SEEDS.items():
        cell = write_run(experiment, {"model.d_k": 64, "model.scale": "sqrt"}, seed, records)
        if seed in MECHANISM:
            arrayfiles.save_arrays(
                experiment.directory / cell.name / "mechanism.npz",
                {f"{step}/{k}": v for step, rows in MECHANISM[seed].items() for k, v in rows.items()},
            )
    return report_of(experiment)


def classify(records, diverged: bool) -> str:
    steps, losses, accuracies = zip(*records)
    return outcomes.classify(
        steps,
        accuracies,
        losses,
        diverged=diverged,
        budget=BUDGET,
        chance_loss=PLATEAU,
        no_retrieval_loss=REFERENCES["no_retrieval"],
    ).outcome


def test_each_seed_is_classed_as_attn_outcomes_defines(classes):
    assert {seed: classify(records, seed in DIVERGED_RUNS) for seed, records in NONE_SEEDS.items()} == EXPECTED_CLASS
    assert set(EXPECTED_CLASS.values()) == set(outcomes.OUTCOMES), "the unscaled cell has every class"
    cell = classes.cell(scale="none")
    assert {s["seed"]: s["outcome"] for s in cell["seeds"]} == EXPECTED_CLASS
    counts = Counter(EXPECTED_CLASS.values())
    assert cell["outcomes"] == {name: counts[name] for name in outcomes.OUTCOMES}
    n = len(EXPECTED_CLASS)
    for name, outcome in COUNTED.items():
        low, high = stats.wilson_interval(counts[outcome], n)
        assert cell[f"{name}_rate"] == {
            "k": counts[outcome],
            "n": n,
            "rate": counts[outcome] / n,
            "low": low,
            "high": high,
        }, name
    reached = [reached_step(NONE_SEEDS[s]) for s in EXPECTED_CLASS]
    assert [s["reached_step"] for s in cell["seeds"]] == reached and reached.count(None) == 3
    km = stats.km_median([BUDGET if t is None else t for t in reached], [t is not None for t in reached])
    assert cell["median_time"] == {"median": km.median, "low": km.low, "high": km.high}
    losses = [math.inf if s in DIVERGED_RUNS else NONE_SEEDS[s][-1][1] for s in EXPECTED_CLASS]  # diverged: +inf
    assert [s["final_loss"] for s in cell["seeds"]] == [as_json(loss) for loss in losses]
    with np.errstate(invalid="ignore"):
        low, _ = stats.bootstrap_interval(np.array(losses), np.median, np.random.default_rng(BOOTSTRAP_SEED))
    # 2 of 6 seeds at +inf: about a third of the resamples have a median of +inf, so has the upper bound
    assert cell["final_loss"] == {"median": pytest.approx(np.median(losses)), "low": pytest.approx(low), "high": "inf"}


def test_unfinished_runs_are_counted_apart_never_as_seeds(classes):
    cell = classes.cell(scale="none")
    assert cell["n"] == len(EXPECTED_CLASS) and cell["unfinished"] == {s: 1 for s in UNFINISHED.values()}
    assert not set(UNFINISHED) & {s["seed"] for s in cell["seeds"]}
    assert classes.data["runs"] == len(NONE_SEEDS) + len(UNFINISHED) + len(SQRT_SEEDS) + len(LINEAR_SEEDS)
    rows = {row["scale"]: row for row in csv.DictReader(io.StringIO(classes.paths["csv"].read_text()))}
    counts = Counter(EXPECTED_CLASS.values())
    assert {name: int(rows["none"][name]) for name in outcomes.OUTCOMES} == {n: counts[n] for n in outcomes.OUTCOMES}
    assert rows["none"]["seeds"] == str(len(EXPECTED_CLASS))
    assert rows["none"]["unfinished"] == ", ".join(f"1 {s}" for s in sorted(UNFINISHED.values()))
    assert rows["sqrt"]["seeds"] == rows["sqrt"][LEARNED] == str(len(SQRT_SEEDS))
    assert rows["sqrt"]["unfinished"] == "—"
    low, high = stats.wilson_interval(counts[LEARNED], len(EXPECTED_CLASS))
    assert rows["none"]["success [95%]"] == f"{counts[LEARNED]}/{len(EXPECTED_CLASS)} [{low:.2f}, {high:.2f}]"
    finished = len(NONE_SEEDS) + len(SQRT_SEEDS) + len(LINEAR_SEEDS)
    assert f"{finished} finished runs of {len(classes.experiment.cells)}" in classes.md


def test_a_cell_whose_seeds_all_diverged_has_an_infinite_final_loss_and_interval(classes):
    cell = classes.cell(scale="linear")
    assert cell["outcomes"][DIVERGED] == cell["n"] == len(LINEAR_SEEDS)
    assert cell["final_loss"] == {"median": "inf", "low": "inf", "high": "inf"}
    [row] = [r for r in markdown_rows(classes.md, "## Every cell") if r["scale"] == "linear"]
    assert row["median final loss [95%]"] == "inf [inf, inf]"


# ---------------------------------------------------------------------------
# 2. The selection rule and its edge notes
# ---------------------------------------------------------------------------
LRS = (0.01, 0.1, 1.0)
SELECTION = {  # (d_k, scale, lr) -> the records of seeds 0 and 1; one arm for each way the rule decides
    # the success rate first (0.01 is fastest but 1/2), then the median time (1.0), though 0.1 ends lower
    (64, "sqrt", 0.01): [curve(LEARNED, 10), curve(STALLED)],
    (64, "sqrt", 0.1): [curve(LEARNED, 80, 0.01)] * 2,
    (64, "sqrt", 1.0): [curve(LEARNED, 30, 0.05)] * 2,
    # rates and times tie: the final loss decides
    **{(64, "linear", lr): [curve(LEARNED, 40, final)] * 2 for lr, final in zip(LRS, (0.02, 0.01, 0.03))},
    # everything ties: the smallest lr
    **{(64, "none", lr): [curve(LEARNED, 40, 0.02)] * 2 for lr in LRS},
}
SELECTION_KEYS = ("model.d_k", "model.scale", "optim.lr")
BY_DEFAULT_RULE = {(64, "sqrt"): 1.0, (64, "linear"): 0.1, (64, "none"): 0.01}
BY_TIME_ALONE = {(64, "sqrt"): 0.01, (64, "linear"): 0.01, (64, "none"): 0.01}  # select: [min median_time]
SHARED_BOUND = 0.03  # sqrt's final loss is below it at lr 0.1 (shared), above it at its best lr 1.0
SHARED_CLAIMS = [
    {
        "id": f"loss-at-{at}",
        "claim": "scaled ends low",
        "stat": "final_loss",
        "arm": SQRT,
        "below": SHARED_BOUND,
        "at": at,
    }
    for at in ("shared", "best")
]


def selection_experiment(tmp_path, stem="selection", **report):
    return load(
        tmp_path,
        {"model.d_k": [64], "model.scale": ["sqrt", "linear", "none"], "optim.lr": list(LRS)},
        [0, 1],
        {
            "x": "model.d_k",
            "arm": "model.scale",
            "best_of": "optim.lr",
            "shared": 0.1,
            "expect": SHARED_CLAIMS,
            **report,
        },
        "selection",
        stem,
    )


@pytest.fixture(scope="module")
def selection(tmp_path_factory):
    experiment = selection_experiment(tmp_path_factory.mktemp("selection"))
    write_plan(experiment, SELECTION.items(), SELECTION_KEYS)
    return report_of(experiment, figures=False)


def best_lr(report: Report) -> dict:
    """(d_k, scale) -> the lr report.json says each is judged at."""
    return {(b["x"][0], b["arm"][0]): b["settings"]["optim.lr"] for b in report.data["best"]}


def test_each_x_and_arm_is_judged_at_the_value_the_declared_rule_picks(selection):
    assert selection.experiment.report.select == report_spec.DEFAULT_SELECT
    assert best_lr(selection) == BY_DEFAULT_RULE
    assert selection.data["layout"]["select"] == list(report_spec.DEFAULT_SELECT)
    rows = markdown_rows(selection.md, "## Headline: each arm at its own best optim.lr")
    assert {(int(r["d_k"]), r["scale"]): float(r["lr"]) for r in rows} == BY_DEFAULT_RULE


def test_a_select_rule_in_the_file_changes_the_choice(selection):
    """The same runs, read by a file that declares another rule."""
    by_time = selection_experiment(selection.experiment.path.parent, "by_time", select=["min median_time"])
    assert by_time.directory == selection.experiment.directory and by_time.report.select == ("min median_time",)
    cells, _ = collect(by_time, experiments.config_change)
    chosen = judged_cells(cells, Layout(by_time), "best")
    assert {(x[0], arm[0]): cell.settings["optim.lr"] for (x, arm), cell in chosen.items()} == BY_TIME_ALONE
    assert BY_TIME_ALONE != BY_DEFAULT_RULE


def test_an_edge_note_for_each_choice_at_the_lowest_or_highest_value_tried(selection):
    notes = [line for line in selection.md.splitlines() if line.endswith("the best may lie beyond the grid.")]
    assert sorted(notes) == [  # none for scale=linear: 0.1 lies inside the grid
        "- scale=none at d_k = 64: lr = 0.01 is the lowest value tried: the best may lie beyond the grid.",
        "- scale=sqrt at d_k = 64: lr = 1 is the highest value tried: the best may lie beyond the grid.",
    ]


# ---------------------------------------------------------------------------
# 3. The shared value (of the selection experiment: 0.1)
# ---------------------------------------------------------------------------
def test_the_shared_value_is_used_for_every_arm(selection):
    rows = markdown_rows(selection.md, "## Headline: every arm at the shared optim.lr = 0.1")
    assert {r["scale"]: r["lr"] for r in rows} == {"sqrt": "0.1", "linear": "0.1", "none": "0.1"}
    assert set(BY_DEFAULT_RULE.values()) != {0.1}, "each arm's own best is not always the shared value"
    sentence = selection.data["counts_summary"].split("At the shared lr 0.1, ")[1].split(". ")[0]
    learned_everywhere = sentence.split(" learned in every seed at every d_k")[0]
    assert all(f"`scale={scale}`" in learned_everywhere for _, scale in BY_DEFAULT_RULE), sentence
    for at, lr, verdict, where in (
        ("shared", 0.1, "confirmed", "at the shared lr"),
        ("best", BY_DEFAULT_RULE[(64, "sqrt")], "not confirmed", "at each arm's best lr"),
    ):
        result = selection.expectation(f"loss-at-{at}")
        [point] = result["points"]
        assert [point[k] for k in ("value", "low", "high")] == [
            as_json(v) for v in expected_interval("final_loss", SELECTION[(64, "sqrt", lr)])
        ], at
        assert result["verdict"] == verdict and where in result["rule"], at


# ---------------------------------------------------------------------------
# 4. Expectations
# ---------------------------------------------------------------------------
FAST = (10, 10, 20, 30, 40)  # steps to the threshold of five seeds
SLOW_STEPS = (60, 70, 70, 80, 90)
JUDGED = {  # (d_k, scale) -> the seeds' records
    (16, "sqrt"): [curve(LEARNED)] * 3,
    (16, "none"): [curve(STALLED)] * 3,
    (64, "sqrt"): [curve(LEARNED, step, 0.01) for step in FAST * 2],
    (64, "none"): [curve(STALLED)] * 10,
    (256, "sqrt"): [curve(LEARNED, step, 0.01 + 0.002 * i) for i, step in enumerate(FAST)],
    (256, "none"): [curve(LEARNED, step, 0.3 + 0.02 * i) for i, step in enumerate(SLOW_STEPS)],
}
EXPECTATIONS = [  # (id, stat, arm, rule, where: d_k values, the verdict)
    ("rate-apart", "success_rate", SQRT, {"better_than": NONE}, [64], "confirmed"),  # 10/10 vs 0/10
    ("rate-overlap", "success_rate", SQRT, {"better_than": NONE}, [16], "inconclusive"),  # 3/3 vs 0/3
    ("rate-wrong-way", "success_rate", NONE, {"better_than": SQRT}, [64], "not confirmed"),
    ("rate-everywhere", "success_rate", SQRT, {"better_than": NONE}, None, "inconclusive"),
    ("rate-above", "success_rate", SQRT, {"above": 0.5}, [64], "confirmed"),
    ("rate-not-above", "success_rate", NONE, {"above": 0.5}, [64], "not confirmed"),
    ("rate-across-above", "success_rate", SQRT, {"above": 0.5}, [16], "inconclusive"),
    ("any-not-confirmed", "success_rate", NONE, {"above": 0.5}, None, "not confirmed"),
    ("stall-below", "stall_rate", SQRT, {"below": 0.5}, [64], "confirmed"),
    ("stall-not-below", "stall_rate", NONE, {"below": 0.5}, [64], "not confirmed"),
    ("stall-across-below", "stall_rate", SQRT, {"below": 0.5}, [16], "inconclusive"),
    ("time-apart", "median_time", SQRT, {"better_than": NONE}, [256], "confirmed"),  # lower is better
    ("time-wrong-way", "median_time", NONE, {"better_than": SQRT}, [256], "not confirmed"),
    ("time-below", "median_time", SQRT, {"below": 50}, [256], "confirmed"),
    ("time-not-below", "median_time", NONE, {"below": 50}, [256], "not confirmed"),
    ("time-across-above", "median_time", SQRT, {"above": 20}, [256], "inconclusive"),
    # neither arm reached (d_k 64: sqrt learned there at 10..40): see time-not-reached-vs-reached
    ("time-not-reached", "median_time", NONE, {"better_than": SQRT}, [64], "not confirmed"),
    ("loss-apart", "final_loss", SQRT, {"better_than": NONE}, [256], "confirmed"),
    ("loss-wrong-way", "final_loss", NONE, {"better_than": SQRT}, [256], "not confirmed"),
    ("loss-below", "final_loss", SQRT, {"below": 0.1}, [256], "confirmed"),
    ("loss-not-below", "final_loss", NONE, {"below": 0.1}, [256], "not confirmed"),
]


def expectation_entry(id_, stat, arm, rule, where) -> dict:
    """Judged by its intervals (test: interval); the exact tests are tests/test_verdicts_tests.py's."""
    rule = {**rule, "test": "interval"} if "better_than" in rule else rule
    return {
        "id": id_,
        "claim": f"the claim {id_}",
        "stat": stat,
        "arm": arm,
        **rule,
        **({"where": {"model.d_k": where}} if where else {}),
    }


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    experiment = load(
        tmp_path_factory.mktemp("judged"),
        {"model.d_k": [16, 64, 256], "model.scale": ["sqrt", "none"]},
        range(10),
        {"x": "model.d_k", "arm": "model.scale", "expect": [expectation_entry(*e[:5]) for e in EXPECTATIONS]},
        "judged",
    )
    write_plan(experiment, JUDGED.items(), ("model.d_k", "model.scale"))
    return report_of(experiment, figures=False)


def expected_interval(stat: str, seeds: list) -> tuple[float, float, float]:
    """(value, low, high) of a stat over the seeds' records, from attn.analysis.stats;
    a median not reached is +inf, an unbounded end 0 or +inf."""
    if stat in ("success_rate", "stall_rate"):
        k = sum(classify(r, False) == (LEARNED if stat == "success_rate" else STALLED) for r in seeds)
        return (k / len(seeds), *stats.wilson_interval(k, len(seeds)))
    if stat == "median_time":
        reached = [reached_step(r) for r in seeds]
        km = stats.km_median([BUDGET if t is None else t for t in reached], [t is not None for t in reached])
        return (
            math.inf if km.median is None else km.median,
            km.low,  # not reached: low the budget at most
            math.inf if km.high is None else km.high,
        )
    losses = np.array([r[-1][1] for r in seeds])
    low, high = stats.bootstrap_interval(losses, np.median, np.random.default_rng(BOOTSTRAP_SEED))
    return float(np.median(losses)), low, high


def test_the_headline_names_the_arm_that_falls_short_where_and_how(judged):
    """sqrt learned in every seed at every d_k; none stalled at 16 (3 seeds) and 64 (10),
    and learned at 256 in every seed: the paragraph says so, with the counts."""
    headline = judged.data["counts_summary"]
    sentences = headline.split(". ")
    assert facts_in(sentences[0], "`scale=sqrt`", "every seed", "every d_k")
    assert facts_in(sentences[0], "fewer learned for `scale=none`", "16: 0/3 (3 stalled)", "64: 0/10 (10 stalled)")
    assert "256" not in sentences[0], "at 256 the unscaled arm learned in every seed"
    verdicts = [e[5] for e in EXPECTATIONS]
    assert facts_in(
        sentences[-1],
        f"{len(EXPECTATIONS)} expectations",
        f"{verdicts.count('confirmed')} confirmed",
        f"{verdicts.count('not confirmed')} not confirmed",
        f"{verdicts.count('inconclusive')} inconclusive",
    )


@pytest.mark.parametrize("id_, stat, arm, rule, where, verdict", EXPECTATIONS, ids=[e[0] for e in EXPECTATIONS])
def test_an_expectation_is_judged_by_its_intervals(judged, id_, stat, arm, rule, where, verdict):
    result = judged.expectation(id_)
    assert result["verdict"] == verdict
    assert [p["x"] for p in result["points"]] == [[d_k] for d_k in where or (16, 64, 256)], "`where` restricts x"
    lines = judged.md[judged.md.index(f"- **{id_}**") :].splitlines()
    assert lines[0].startswith(f"- **{id_}**") and facts_in(
        lines[0], f"the claim {id_}", f"**{verdict}**", result["rule"]
    )
    for point, line in zip(result["points"], lines[1:]):
        (d_k,) = point["x"]
        mine = expected_interval(stat, JUDGED[(d_k, arm["model.scale"])])
        numbers = {"value": mine[0], "low": mine[1], "high": mine[2]}
        text = f"{mine[0]:.3g} [{mine[1]:.3g}, {mine[2]:.3g}]"
        if "better_than" in rule:
            theirs = expected_interval(stat, JUDGED[(d_k, rule["better_than"]["model.scale"])])
            numbers.update(other_value=theirs[0], other_low=theirs[1], other_high=theirs[2])
            text += f" vs {theirs[0]:.3g} [{theirs[1]:.3g}, {theirs[2]:.3g}]"
        assert {k: point[k] for k in numbers} == {k: as_json(v) for k, v in numbers.items()}
        assert facts_in(line, f"d_k = {d_k}", text, point["verdict"])


def test_an_expectation_over_several_x_is_confirmed_only_if_every_one_is(judged):
    assert [p["verdict"] for p in judged.expectation("rate-everywhere")["points"]] == [
        "inconclusive",
        "confirmed",
        "inconclusive",
    ]
    assert [p["verdict"] for p in judged.expectation("any-not-confirmed")["points"]] == [
        "inconclusive",
        "not confirmed",
        "confirmed",
    ]
    verdicts = Counter(verdict for *_, verdict in EXPECTATIONS)
    last = judged.data["counts_summary"].split(". ")[-1]
    assert facts_in(last, f"{len(EXPECTATIONS)} expectations", f"{verdicts['confirmed']} confirmed")
    assert facts_in(last, f"{verdicts['not confirmed']} not confirmed", f"{verdicts['inconclusive']} inconclusive")


# ---------------------------------------------------------------------------
# 5. Runs left out; a cell with no finished seed
# ---------------------------------------------------------------------------
SQRT_64, NONE_64 = {"model.d_k": 64, "model.scale": "sqrt"}, {"model.d_k": 64, "model.scale": "none"}


@pytest.fixture(scope="module")
def left_out(tmp_path_factory):
    """sqrt: seed 0 kept, seed 1 made with another lr (left out), seed 2 with
    another runs_dir (kept: no logged number changes); none: seed 0
    interrupted, seed 1's summary torn, seed 2's config not valid."""
    experiment = load(
        tmp_path_factory.mktemp("left_out"),
        {"model.d_k": [64], "model.scale": ["sqrt", "none"]},
        range(5),
        {
            "x": "model.d_k",
            "arm": "model.scale",
            "expect": [  # 5: 3 could refute no rate claim
                expectation_entry("loss-no-seed", "final_loss", NONE, {"below": 1.0}, None),
                expectation_entry("rate-no-seed", "success_rate", SQRT, {"better_than": NONE}, None),
            ],
        },
        "left_out",
    )
    write_run(experiment, SQRT_64, 0, curve(LEARNED))
    write_run(
        experiment,
        SQRT_64,
        1,
        curve(LEARNED),
        config=replace(cell_of(experiment, SQRT_64, 1).config, **{"optim.lr": 0.7}),
    )
    write_run(
        experiment,
        SQRT_64,
        2,
        curve(LEARNED),
        config=replace(cell_of(experiment, SQRT_64, 2).config, runs_dir="elsewhere"),
    )
    write_run(experiment, NONE_64, 0, curve(LEARNED)[:1], "interrupted")
    torn = write_run(experiment, NONE_64, 1, curve(LEARNED))
    (experiment.directory / torn.name / "summary.json").write_text("{torn")
    invalid = write_run(experiment, NONE_64, 2, curve(LEARNED))
    config = to_dict(invalid.config)
    config["model"]["scale"] = "cubic"
    runs.write_config(experiment.directory / invalid.name, config, {})
    return report_of(experiment)


def test_runs_made_with_another_config_or_unreadable_are_left_out_with_the_reason(left_out):
    other_lr, torn, invalid = (
        cell_of(left_out.experiment, settings, seed) for settings, seed in ((SQRT_64, 1), (NONE_64, 1), (NONE_64, 2))
    )
    reasons = {e["name"]: e["reason"] for e in left_out.data["excluded"]}
    assert list(reasons) == [other_lr.name, torn.name, invalid.name]
    assert facts_in(reasons[other_lr.name], "config differs", f"optim.lr: {0.7!r} -> {other_lr.config.optim.lr!r}")
    assert "summary.json: unreadable: not JSON" in reasons[torn.name]
    assert reasons[invalid.name].startswith("config.yaml is not a valid config: ") and "cubic" in reasons[invalid.name]
    assert f"## Runs left out ({len(reasons)})" in left_out.md
    assert all(f"- `{name}`: {reason}" in left_out.md for name, reason in reasons.items())
    assert [s["seed"] for s in left_out.cell(scale="sqrt")["seeds"]] == [0, 2], "a run elsewhere is the same run"


def test_a_cell_with_no_finished_seed_does_not_break_the_report(left_out):
    cell = left_out.cell(scale="none")
    assert (cell["n"], cell["unfinished"], cell["seeds"]) == (0, {"interrupted": 1}, [])
    [row] = [r for r in markdown_rows(left_out.md, "## Every cell") if r["scale"] == "none"]
    assert (row["seeds"], row["success [95%]"], row["unfinished"]) == ("0", "—", "1 interrupted")
    for id_ in ("loss-no-seed", "rate-no-seed"):  # no evidence, no verdict (an empty final loss is not +inf)
        result = left_out.expectation(id_)
        assert result["verdict"] == "inconclusive" and result["points"] == [
            {"x": [64], "verdict": "inconclusive", "note": "no finished runs"}
        ], id_
        lines = left_out.md[left_out.md.index(f"- **{id_}**") :].splitlines()
        assert facts_in(lines[0], "**inconclusive**", result["rule"])
        assert facts_in(lines[1], "d_k = 64", "no finished runs", "inconclusive")


# ---------------------------------------------------------------------------
# 6. Figures
# ---------------------------------------------------------------------------
def figures(report: Report) -> list[str]:
    return re.findall(r"!\[[^]]*\]\(([^)]+)\)", report.md)


@pytest.mark.parametrize("fixture", ["classes", "left_out", "mapping"])
def test_every_figure_named_in_the_markdown_is_a_png(request, fixture):
    report = request.getfixturevalue(fixture)
    named = figures(report)
    assert named and sorted(named) == sorted(p.name for p in report.experiment.directory.glob("*.png"))
    for name in named:
        assert (report.experiment.directory / name).read_bytes().startswith(PNG_SIGNATURE), name


def test_curves_are_drawn_only_where_a_judged_cells_seeds_split(classes, mapping):
    assert "curves.png" in figures(classes), "the unscaled cell splits"
    assert "curves.png" not in figures(mapping) and not (mapping.experiment.directory / "curves.png").exists(), (
        "its only split cell is not judged"
    )
    assert "phase.png" in figures(mapping) and "phase.png" not in figures(classes), "phase: with best_of only"


def test_the_mechanism_is_reported_from_mechanism_npz(classes):
    assert {"mechanism.png", "headline.png", "final_loss.png", "loss_curves.png"} <= set(figures(classes))
    [row] = [r for r in markdown_rows(classes.md, "## The mechanism, measured") if r["arm"] == "scale=sqrt"]
    for step in MECHANISM_STEPS:
        summaries = [mechanism.summary(MECHANISM[seed][step]) for seed in MECHANISM]
        assert row[f"saturated @{step}"] == f"{np.median([s['saturated_frac'] for s in summaries]):.3g}"
        top_share = np.median([s["grad_W_q_top_share"] for s in summaries])
        assert row[f"top-10% share of ‖∇W_q‖² @{step}"] == f"{top_share:.3g}"


class MechanismOnly:
    """A judged cell's mechanism medians and nothing else: `finite` keys have a value, the rest are NaN
    (as qk_norm's per-row gradient norms were in runs made before they were measured through the norm)."""

    n, seeds, theory_score_std = 1, (), 1.0

    def __init__(self, finite: set):
        self.finite = finite

    def at_init(self, key):
        return [1.0]

    def mechanism(self, step, key):
        return [0.5 if key in self.finite else math.nan]


def test_a_mechanism_panel_with_no_finite_value_says_why_and_a_drawn_one_says_nothing(classes, monkeypatch):
    figures_made = []
    monkeypatch.setattr(experiment_figures, "save_figure", lambda fig, path, tight=True: figures_made.append(fig))
    best = {((64,), ("none",)): MechanismOnly({"saturated_frac"})}
    experiment_figures.mechanism_figure(
        best, Layout(classes.experiment), {("none",): "C3"}, MECHANISM_STEPS, Path("mechanism.png")
    )
    said = [" ".join(t.get_text() for t in ax.texts) for ax in figures_made[0].axes[:5]]
    assert ["no finite value" in text for text in said] == [False, False, True, True, True]
    assert [len(ax.get_yticks()) > 0 for ax in figures_made[0].axes[:5]] == [True, True, False, False, False]


# ---------------------------------------------------------------------------
# 7. A grid over a mapping field (here best_of: the phase diagram's rows, the edge notes)
# ---------------------------------------------------------------------------
SMALL, LARGE = {"W_q": 0.1, "W_k": 0.1}, {"W_q": 1.0, "W_k": 1.0}
MAPPING_PLAN = [
    ((SMALL, "sqrt"), [curve(LEARNED, 60)] * 2),
    ((LARGE, "sqrt"), [curve(LEARNED, 20)] * 2),
    ((SMALL, "none"), [curve(LEARNED, 30)] * 2),
    ((LARGE, "none"), [curve(LEARNED, 30), curve(STALLED)]),
]  # split, and not judged: 1/2 < 2/2


@pytest.fixture(scope="module")
def mapping(tmp_path_factory):
    experiment = load(
        tmp_path_factory.mktemp("mapping"),
        {"optim.lr_mult": [SMALL, LARGE], "model.scale": ["sqrt", "none"]},
        [0, 1],
        {"x": "model.scale", "best_of": "optim.lr_mult"},
        "mapping",
    )
    write_plan(experiment, MAPPING_PLAN, ("optim.lr_mult", "model.scale"))
    return report_of(experiment)


def test_a_grid_over_a_mapping_field_reports(mapping):
    assert all(
        re.fullmatch(r"[A-Za-z0-9._=-]+", path.name) for path in mapping.experiment.directory.iterdir() if path.is_dir()
    )
    assert {b["x"][0]: b["settings"]["optim.lr_mult"] for b in mapping.data["best"]} == {
        "sqrt": format_value(LARGE),
        "none": format_value(SMALL),
    }
    assert f"lr_mult = {format_value(LARGE)} is the highest value tried" in mapping.md
    assert f"lr_mult = {format_value(SMALL)} is the lowest value tried" in mapping.md
    assert [c["settings"]["optim.lr_mult"] for c in mapping.data["cells"]] == [
        format_value(mult) for (mult, _), _ in MAPPING_PLAN
    ]


# ---------------------------------------------------------------------------
# 8. Bad report sections
# ---------------------------------------------------------------------------
GOOD_EXPECTATION = {"id": "e", "claim": "c", "stat": "success_rate", "arm": SQRT, "better_than": NONE}
GOOD_REPORT = {"x": "model.d_k", "arm": "model.scale", "best_of": "optim.lr", "expect": [GOOD_EXPECTATION]}
BAD_REPORTS = [  # (the changes to GOOD_REPORT, what the message says after the file's path)
    (
        {"select": ["max succes_rate"]},
        "report: select: got 'max succes_rate'; expected 'max <figure>' or 'min <figure>' with a figure of "
        + ", ".join(report_spec.SELECTION_FIGURES),
    ),
    ({"shared": 0.2}, "report: shared: got 0.2; expected one of best_of's values (0.1, 1.0)"),
    (
        {"expect": [{**GOOD_EXPECTATION, "above": 0.5}]},
        "report: expect[0]: got 2 rules (better_than, above); expected exactly one of better_than, above, below",
    ),
    (
        {"expect": [{**GOOD_EXPECTATION, "stat": "succes_rate"}]},
        "report: expect[0]: stat: got 'succes_rate'; expected one of " + ", ".join(report_spec.STATS),
    ),
    (
        {"arm": ["model.scale", "model.qk_gain"]},
        "report: expect[0]: arm: got {'model.scale': 'sqrt'}; expected a mapping giving each arm key "
        "(model.scale, model.qk_gain) one of its grid values",
    ),
    (
        {"expect": [{**GOOD_EXPECTATION, "where": {"model.scale": ["sqrt"]}}]},
        "report: expect[0]: where: `model.scale` is not an x key of the report; expected model.d_k",
    ),
]


@pytest.mark.parametrize("changes, message", BAD_REPORTS, ids=["select", "shared", "two-rules", "stat", "arm", "where"])
def test_a_bad_report_section_is_refused_with_one_line(tmp_path, changes, message):
    grid = {"model.d_k": [16, 64], "model.scale": ["sqrt", "none"], "model.qk_gain": [1.0], "optim.lr": [0.1, 1.0]}
    seeds = range(10)  # enough for the exact test to confirm or refute (else the claim is refused)
    assert load(tmp_path, grid, seeds, GOOD_REPORT, "good").report.expect, "the section without the change is good"
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, grid, seeds, {**GOOD_REPORT, **changes})
    assert str(caught.value) == f"{tmp_path / 'exp.yaml'}: {message}"


def test_every_arm_has_its_own_colour_and_the_scales_keep_theirs_across_reports():
    from attn.report.experiment_figures import ARM_COLORS, arm_colors

    arms = [("dot", "linear"), ("dot", "none"), ("dot", "sqrt"), ("qk_norm", None), ("softcap", "none")]
    colors = arm_colors(arms)
    assert len(set(colors.values())) == len(arms), colors
    assert colors[("dot", "sqrt")] == ARM_COLORS["sqrt"] and colors[("dot", "none")] == ARM_COLORS["none"]
    assert arm_colors([("sqrt",), ("none",)]) == {("sqrt",): ARM_COLORS["sqrt"], ("none",): ARM_COLORS["none"]}


def test_the_paragraph_says_which_arms_best_rate_transfers_across_x():
    from types import SimpleNamespace

    from attn.report.conclusion import _transfer_sentence

    chosen = {((16,), ("sqrt",)): 0.3, ((256,), ("sqrt",)): 0.3, ((16,), ("none",)): 0.1, ((256,), ("none",)): 0.03}
    best = {key: SimpleNamespace(settings={"optim.lr": lr}) for key, lr in chosen.items()}
    layout = SimpleNamespace(
        best_of="optim.lr", names={"optim.lr": "lr"}, x_name="d_k", arm_label=lambda arm: f"scale={arm[0]}"
    )
    sqrt, none = _transfer_sentence(best, layout).split("; ")
    assert facts_in(sqrt, "best lr", "same at every d_k", "`scale=sqrt` (0.3)")
    assert facts_in(none, "moved with d_k", "`scale=none` (0.1, 0.03)")
    one_x = {key: cell for key, cell in best.items() if key[0] == (16,)}
    assert _transfer_sentence(one_x, layout) == "", "with one x there is nothing to transfer across"


def test_the_stall_table_counts_self_attending_ends_and_initial_target_attention(tmp_path):
    """Runs whose metrics carry self_attn and target_attn (as attn.model.fast.diagnostics
    logs them): the report's stall table and report.json's stall_mechanism read them."""
    experiment = load(
        tmp_path, {"model.d_k": [64], "model.scale": ["none"]}, range(4), {"x": "model.d_k", "arm": "model.scale"}
    )
    plan = {0: (STALLED, 0.03, 0.95), 1: (STALLED, 0.05, 0.5), 2: (LEARNED, 0.10, 0.01), 3: (LEARNED, 0.12, 0.02)}
    for seed, (outcome, initial_target, final_self) in plan.items():
        cell = write_run(
            experiment, {"model.d_k": 64, "model.scale": "none"}, seed, [(0, PLATEAU, CHANCE)] + curve(outcome)
        )
        path = experiment.directory / cell.name / "metrics.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        records[0].update(target_attn=initial_target, self_attn=0.1)
        records[-1].update(target_attn=0.0, self_attn=final_self)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = report_of(experiment, figures=False)
    [row] = markdown_rows(report.md, "## Stalled and learned runs")
    assert (row["stalled runs"], row["learned runs"]) == ("2", "2")
    assert row["stalled: self > 0.9 at end [95%]"].startswith("1/2 ")
    assert row["learned: self > 0.9 at end [95%]"].startswith("0/2 ")
    assert row["stalled: target_attn @0 median [min, max]"] == "0.040 [0.030, 0.050]"
    assert row["AUC of low target_attn @0 for a stall"] == "1"
    [entry] = report.data["stall_mechanism"]
    assert entry["stalled"]["initial_target_attn"]["values"] == [0.03, 0.05] and entry["auc"] == 1.0


# ---------------------------------------------------------------------------
# Held-out selection: the best chosen on select_on seeds, judged on judge_on seeds
# ---------------------------------------------------------------------------
HELD_SELECT, HELD_JUDGE = [0, 1], list(range(2, 10))
HELD_CLAIMS = [
    {
        "id": "learns",
        "claim": "the scaled head learns in most seeds",
        "stat": "success_rate",
        "arm": SQRT,
        "above": 0.5,
    },
    {
        "id": "beats-none",
        "claim": "the scaled head learns more often than the unscaled",
        "stat": "success_rate",
        "arm": SQRT,
        "better_than": NONE,
        "test": "mcnemar",
    },
]


def held_out_experiment(tmp_path, held_out=True, outcome_of=None):
    """One d_k, scale sqrt against none, lr 0.01 and 0.1, ten seeds. sqrt at 0.01: the selection seeds learn,
    the judge seeds stall; at 0.1 the other way round; none stalls everywhere. All ten seeds pick 0.1 (8/10
    against 2/10); the selection seeds alone pick 0.01 (2/2 against 0/2). `outcome_of`: (lr, seed) -> an
    outcome that replaces sqrt's there."""
    report = {"x": "model.d_k", "arm": "model.scale", "best_of": "optim.lr", "expect": HELD_CLAIMS}
    tmp_path.mkdir()
    if held_out:
        report.update(select_on=HELD_SELECT, judge_on=HELD_JUDGE)
    experiment = load(
        tmp_path,
        {"model.d_k": [64], "model.scale": ["sqrt", "none"], "optim.lr": [0.01, 0.1]},
        range(10),
        report,
        "held",
    )
    for lr in (0.01, 0.1):
        for seed in range(10):
            learns = (seed in HELD_SELECT) == (lr == 0.01)
            outcome = (outcome_of or {}).get((lr, seed), LEARNED if learns else STALLED)
            write_run(experiment, {"model.d_k": 64, "model.scale": "sqrt", "optim.lr": lr}, seed, curve(outcome))
            write_run(experiment, {"model.d_k": 64, "model.scale": "none", "optim.lr": lr}, seed, curve(STALLED))
    return report_of(experiment, figures=False)


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """held_out_experiment's report as the file declares it (chosen on seeds 0, 1; judged on 2-9): the tests
    below only read it."""
    return held_out_experiment(tmp_path_factory.mktemp("held") / "held")


def test_held_out_seeds_choose_a_different_rate_than_all_seeds_and_only_the_judge_seeds_judge(tmp_path, held):
    everyone = held_out_experiment(tmp_path / "all", held_out=False)
    assert best_lr(everyone)[(64, "sqrt")] == 0.1 and best_lr(held)[(64, "sqrt")] == 0.01
    learns, beats = held.expectation("learns"), held.expectation("beats-none")
    assert learns["points"][0]["n"] == len(HELD_JUDGE) and learns["points"][0]["value"] == 0  # 0/8 at 0.01
    assert learns["verdict"] == "not confirmed"
    assert beats["points"][0]["pairs"] == len(HELD_JUDGE) and beats["verdict"] == "inconclusive"
    assert held.data["layout"]["select_on"] == HELD_SELECT and held.data["layout"]["judge_on"] == HELD_JUDGE
    assert "select_on" not in everyone.data["layout"] and "selection" not in everyone.data
    [chose] = [s for s in held.data["selection"] if s["arm"] == ["sqrt"]]
    assert chose["settings"]["optim.lr"] == 0.01 and chose["success_rate"]["k"] == 2 and chose["n"] == 2
    assert "chosen on seeds 0, 1 only" in held.md and "judged on seeds 2, 3, 4, 5, 6, 7, 8, 9 only" in held.md
    assert "; 10 seeds per cell (2 choose the lr, 8 judge). " in held.data["headline"]
    assert "; 10 seeds per cell. " in everyone.data["headline"]
    rows = markdown_rows(held.md, "## Headline: each arm at its own best optim.lr")
    assert {r["scale"]: (float(r["lr"]), int(r["seeds"])) for r in rows} == {"sqrt": (0.01, 8), "none": (0.01, 8)}


def test_a_selection_seeds_outcome_never_moves_a_verdict_and_a_judge_seeds_can(tmp_path, held):
    def verdicts(report):
        return {e["id"]: (e["verdict"], [p.get("value") for p in e["points"]]) for e in report.data["expectations"]}

    before = verdicts(held)
    # seed 0 (selection) stalls at the chosen rate 0.01: 1/2 still beats 0/2, and no verdict moves
    assert verdicts(held_out_experiment(tmp_path / "selection", outcome_of={(0.01, 0): STALLED})) == before
    # the judge seeds learn at 0.01: both verdicts move
    after = held_out_experiment(tmp_path / "judge", outcome_of={(0.01, s): LEARNED for s in HELD_JUDGE})
    assert after.expectation("learns")["verdict"] == "confirmed" != before["learns"][0]
    assert after.expectation("beats-none")["verdict"] == "confirmed" != before["beats-none"][0]


@pytest.mark.parametrize(
    "held_out, message",
    [
        ({"select_on": [0, 1]}, "report: select_on: given without `judge_on`"),
        ({"select_on": [0, 1], "judge_on": [1, 2, 3]}, "sharing seed(s) 1 with select_on; expected seeds disjoint"),
        (
            {"select_on": [0, 12], "judge_on": [2, 3]},
            "report: select_on: got [0, 12]; expected a non-empty list of "
            "distinct seeds of the file's `seeds` (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)",
        ),
        ({"select_on": [], "judge_on": [2, 3]}, "report: select_on: got []"),
        ({"select_on": [0, 1], "judge_on": [2, 3, 4]}, "the mcnemar test on 3 seeds per arm cannot reach"),
    ],
)
def test_held_out_seeds_are_checked_when_the_file_is_read(tmp_path, held_out, message):
    report = {"x": "model.d_k", "arm": "model.scale", "best_of": "optim.lr", "expect": HELD_CLAIMS[1:], **held_out}
    with pytest.raises(ConfigError) as err:
        load(tmp_path, {"model.d_k": [64], "model.scale": ["sqrt", "none"], "optim.lr": [0.01, 0.1]}, range(10), report)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_frozen_claims_record_the_held_out_seeds_and_without_them_are_as_before(tmp_path):
    grid = {"model.d_k": [64], "model.scale": ["sqrt", "none"], "optim.lr": [0.01, 0.1]}
    base = {"x": "model.d_k", "arm": "model.scale", "best_of": "optim.lr"}
    plain = load(tmp_path, grid, range(10), base, stem="plain").report
    held = load(
        tmp_path, grid, range(10), {**base, "select_on": HELD_SELECT, "judge_on": HELD_JUDGE}, stem="held"
    ).report
    record = report_spec.claims_record(held, range(10))
    assert record["section"]["select_on"] == HELD_SELECT and record["section"]["judge_on"] == HELD_JUDGE
    assert "select_on" not in report_spec.claims_record(plain, range(10))["section"]
    changes = report_spec.claim_changes(report_spec.claims_record(plain, range(10)), record)
    assert changes["design"] == {"select_on": [None, HELD_SELECT], "judge_on": [None, HELD_JUDGE]}


def test_the_headline_experiment_chooses_on_ten_fresh_seeds_and_judges_on_twenty_others():
    """Restated on fresh seeds 300-329 (issue 45): 300-309 choose each arm's rate, 310-329 judge."""
    headline = experiments.load_experiment(ROOT / "experiments" / "sqrt_dk.yaml")
    select, judge = tuple(range(300, 310)), tuple(range(310, 330))
    assert headline.report.select_on == select and headline.report.judge_on == judge
    assert {c.seed for c in headline.cells} == set(range(300, 330))
    section = report_spec.claims_record(headline.report, {c.seed for c in headline.cells})["section"]
    assert section["select_on"] == list(select) and section["judge_on"] == list(judge)


def test_the_scope_lists_numbers_in_numeric_order_and_says_where_a_setting_is_set(tmp_path):
    """d_model 64, 256, 1024 (not 1024, 256, 64 as strings sort); warm-up and
    clipping only where set, and "in some runs" where not every run sets them."""
    from attn.report.conclusion import scope

    experiment = load(
        tmp_path,
        {"model.d_model": [1024, 64, 256], "optim.warmup_steps": [0, 150], "optim.clip_norm": [None, 1.0]},
        range(2),
        {"x": "model.d_model"},
    )
    said = scope(experiment)
    assert "d_model 64, 256, 1024;" in said and "None" not in said
    assert "warm-up 150 steps in some runs" in said and "clipping at 1.0 in some runs" in said
    everywhere = load(
        tmp_path, {"model.d_model": [64], "optim.warmup_steps": [150]}, range(2), {"x": "model.d_model"}, name="all"
    )
    assert "plain SGD with warm-up 150 steps;" in scope(everywhere) and "clipping" not in scope(everywhere)


def test_the_phase_figure_frames_each_arms_chosen_rate_with_held_out_seeds(tmp_path, monkeypatch):
    """The chosen cell comes back as a copy on the judging seeds; it is still the one framed, once per arm."""
    experiment = load(
        tmp_path,
        {"model.d_k": [16], "model.scale": ["sqrt", "none"], "optim.lr": [0.01, 0.1]},
        range(4),
        {"x": "model.d_k", "arm": "model.scale", "best_of": "optim.lr", "select_on": [0, 1], "judge_on": [2, 3]},
        "framed",
    )
    write_plan(
        experiment,
        [
            ((16, scale, lr), [curve(LEARNED if lr == 0.1 else STALLED)] * 4)
            for scale in ("sqrt", "none")
            for lr in (0.01, 0.1)
        ],
        ("model.d_k", "model.scale", "optim.lr"),
    )
    drawn = {}
    monkeypatch.setattr(
        experiment_figures, "save_figure", lambda fig, path, **_: drawn.setdefault(path.name, fig) and path
    )
    report_of(experiment)
    framed = [
        [(patch.get_x() + 0.5, patch.get_y() + 0.5) for patch in ax.patches if patch.get_linewidth() == 2.0]
        for ax in drawn["phase.png"].axes
    ]
    assert framed == [[(0, 1)], [(0, 1)]]  # per arm: column d_k 16, row lr 0.1


# ---------------------------------------------------------------------------
# report.md opens with its judged result: the findings table, the headline figure; the selection seeds after
# ---------------------------------------------------------------------------
def test_report_md_opens_with_its_judged_result_and_the_selection_seeds_come_after(held, classes):
    order = [
        "## The result",
        "## In one paragraph",
        "## Headline: each arm at its own best optim.lr",
        "## The selection seeds",
        "## Expectations, judged",
    ]
    assert [held.md.index(title) for title in order] == sorted(held.md.index(title) for title in order)
    assert held.md.index("## The result") < held.md.index("| d_k |"), "no table of cells before the verdicts"
    rows = markdown_rows(held.md, "## The result")
    assert [(r["verdict"].split(" (")[0], r["test"].split(",")[0]) for r in rows] == [
        (e["verdict"], {"interval": "95% interval", "mcnemar": "exact McNemar"}[e["test"]])
        for e in held.data["expectations"]
    ]
    assert (
        rows[0]["effect [95% interval]"].startswith("success rate 0 [0, ")
        and "at d_k 64" in rows[0]["effect [95% interval]"]
    )
    opening = classes.md.split("## In one paragraph")[0]
    assert "![headline](headline.png)" in opening and classes.md.count("(headline.png)") == 1


def point(x, value=None, low=None, high=None, **more) -> dict:
    return {"x": [x], "value": value, "low": low, "high": high, "verdict": "confirmed", **more}


def test_a_claims_effect_is_said_at_the_point_that_decides_its_verdict():
    from attn.report.claims_table import effect_said

    bound = {
        "claim": "learns",
        "verdict": "confirmed",
        "test": "interval",
        "rule": "success_rate of scale=sqrt above 0.5 (its 95% interval wholly above), at each arm's best lr",
        "points": [point(16, 1.0, 0.84, 1.0), point(64, 0.9, 0.7, 0.98), point(256, 1.0, 0.84, 1.0)],
    }
    assert effect_said(bound, "d_k") == "success rate 0.9 [0.7, 0.98] at d_k 64, the weakest of 3"
    below = {**bound, "rule": bound["rule"].replace("above 0.5", "below 0.95").replace("wholly above", "wholly below")}
    assert effect_said(below, "d_k").endswith("at d_k 16, the weakest of 3")  # the highest upper bound
    same = {**bound, "points": [point(16, 1.0, 0.84, 1.0), point(64, 1.0, 0.84, 1.0)]}
    assert effect_said(same, "d_k") == "success rate 1 [0.84, 1] at each of 2 points (d_k 16 to 64)"
    effect = lambda value, low, high: {"name": "ratio of medians", "value": value, "low": low, "high": high}  # noqa: E731
    tested = {
        "claim": "faster",
        "verdict": "confirmed",
        "test": "sign",
        "p_holm": 1e-5,
        "rule": "median_time of scale=sqrt lower than of scale=none (sign test ...), at each arm's best lr",
        "points": [
            point(256, p=1e-6, p_reverse=1.0, effect=effect(0.05, 0.03, 0.07)),
            point(1024, p=1e-6, p_reverse=1.0, effect=effect(0.11, 0.07, 0.14)),  # equal p: nearer 1, weaker
            point(4096, p=1e-7, p_reverse=1.0, effect=effect(0.5, 0.2, 0.9)),
        ],
    }
    assert effect_said(tested, "d_k") == "ratio of medians 0.11 [0.07, 0.14] at d_k 1024, the weakest of 3"
    refuted = {**tested, "verdict": "not confirmed", "points": [{**p, "p_reverse": p["p"]} for p in tested["points"]]}
    assert effect_said(refuted, "d_k").endswith("at d_k 4096, the weakest of 3")
    unseen = {
        **tested,
        "points": [*tested["points"], {"x": [8], "note": "no finished runs", "verdict": "inconclusive"}],
    }
    assert effect_said(unseen, "d_k") == "no finished runs at d_k 8, the weakest of 4"


def test_a_cell_whose_score_mode_has_no_theory_says_so_in_the_table_and_json():
    """attn.model.head.theory_score_std is None for softcap: NaN in the cell, '—' in the table, null in JSON."""
    from attn.analysis.results import CellResult
    from attn.report import report_tables

    cell = CellResult({"model.score": "softcap"}, math.nan)
    assert report_tables.cell_json(cell)["theory_score_std"] is None
    layout = type("Layout", (), {"x_name": "d_k", "x_label": staticmethod(str), "arm_label": staticmethod(str)})()
    (row,) = report_tables.mechanism_rows({(64, "softcap"): cell}, layout, [])
    assert row["score std @0 (theory)"].endswith("(—)")
