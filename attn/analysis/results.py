"""An experiment's results, cell by cell: each seed's outcome, each cell's statistics.

Which runs. A cell's run directory counts if it holds a summary and was
made with the cell's config (attn.experiment.spec.config_change: equal but for
fields that change no logged number); a run made with another config, or
one that cannot be read, is left out with the reason. Of the runs kept, the
finished ones (completed or diverged) are the seeds every statistic is
over; interrupted, running, stale and failed runs are counted apart.

Per seed: its outcome class and time to the threshold (attn.outcomes, from
the logged eval accuracy and loss); its step-0 record (score std, entropy,
saturated rows, gradient norms of W_q and W_k, attention on the right key
and on the query's own position); the same attention at its last record;
the per-row mechanism at the steps it was measured (mechanism.npz,
attn.model.mechanism.summary).

Per cell (attn.analysis.stats):
    success      seeds that `learned` (reached the threshold and held it), Wilson 95%
    stalled, diverged, learned then lost, slow: the same, each a Wilson interval
    time         Kaplan–Meier median steps to the threshold, a seed that never
                 got there censored at the budget, Brookmeyer–Crowley 95%
    final loss   every seed's last eval loss (a diverged seed: +inf), and their
                 median with a percentile-bootstrap 95% interval over seeds
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attn import outcomes
from attn.analysis import stats
from attn.analysis.grouping import Run, canonical, load_runs
from attn.config.loading import config_from_mapping, qk_gain
from attn.config.yamlio import ConfigError
from attn.model import mechanism
from attn.model.head import theory_score_std
from attn.store import arrayfiles, runs

AT_INIT_KEYS = (
    "eval_loss",
    "score_std",
    "attn_entropy",
    "saturated_frac",
    "grad_norm/W_q",
    "grad_norm/W_k",
    "target_attn",
    "self_attn",
)
AT_END_KEYS = ("target_attn", "self_attn")  # read from a seed's last record
SELF_ATTENDING = 0.9  # a query attends to itself when more than this of its attention is on its own position
BOOTSTRAP_SEED = 0  # the bootstrap's resampling is seeded: a report is the same every time it is written
COUNTED = {
    "success": outcomes.LEARNED,
    "stalled": outcomes.STALLED,
    "diverged": outcomes.DIVERGED,
    "lost": outcomes.LEARNED_THEN_LOST,
    "slow": outcomes.SLOW,
}  # rate name -> outcome class


@dataclass(frozen=True)
class Seed:
    """One finished seed of a cell."""

    seed: int
    run: Run
    outcome: outcomes.RunOutcome
    budget: int
    at_init: dict  # AT_INIT_KEYS -> the step-0 record's value (None where missing)
    mechanism: dict  # step -> attn.model.mechanism.summary of the rows at that step
    at_thresholds: dict = field(default_factory=dict)  # outcomes.THRESHOLDS -> its outcome class at that threshold
    at_end: dict = field(default_factory=dict)  # AT_END_KEYS -> the last record's value (None where missing)
    threshold: float = outcomes.THRESHOLD  # the eval accuracy `outcome` was judged at

    @property
    def final_loss(self) -> float:
        """The last eval loss, +inf for a diverged seed (worse than any loss)."""
        loss = self.outcome.final_loss
        return math.inf if self.outcome.outcome == outcomes.DIVERGED or loss is None else loss

    @property
    def path_digest(self) -> str:
        """A digest of the train loss at every logged step: two runs share it
        only if they took the same path to the bit (final losses can agree by
        chance at convergence, where float32 losses are coarse)."""
        losses = np.array(
            [r.get("train_loss") if runs.is_finite_number(r.get("train_loss")) else np.nan for r in self.run.records],
            dtype=np.float64,
        )
        return hashlib.sha256(losses.tobytes()).hexdigest()[:16]


def plateau_level(summary: dict, name: str = "chance") -> float:
    """A plateau level of the run's task from its summary's reference losses:
    chance, ln C (the level a stalled seed never left), or no_retrieval (a
    model that retrieves nothing; nan where the task has none, or unknown)."""
    level = (summary.get("references") or {}).get(name)
    return float(level) if runs.is_finite_number(level) else math.nan


def seed_of(run: Run, seed: int, threshold: float, budget: int | None = None, rows_by_step: dict | None = None) -> Seed:
    """One finished run as a seed of its cell; with `budget`, as if it had stopped at that step (its
    records up to it; diverged only if it diverged by then). rows_by_step: its read_mechanism, if read."""
    records = run.records if budget is None else [r for r in run.records if r["step"] <= budget]
    steps = np.array([r["step"] for r in records], dtype=np.int64)

    def values(key):
        return np.array([r[key] if runs.is_finite_number(r.get(key)) else np.nan for r in records], dtype=float)

    all_kept = len(records) == len(
        run.records
    )  # a diverged run diverged by the budget if none of its records is past it
    budget = int(run.summary.get("steps") or 0) if budget is None else budget
    curve = (steps, values("eval_accuracy"), values("eval_loss"))
    levels = {
        "diverged": run.status == "diverged" and all_kept,
        "budget": budget,
        "chance_loss": plateau_level(run.summary),
        "no_retrieval_loss": plateau_level(run.summary, "no_retrieval"),
    }
    outcome = outcomes.classify(*curve, **levels, threshold=threshold)
    at = {t: outcomes.classify(*curve, **levels, threshold=t).outcome for t in outcomes.THRESHOLDS}
    first = records[0] if records and records[0]["step"] == 0 else {}
    at_init = {k: first.get(k) if runs.is_finite_number(first.get(k)) else None for k in AT_INIT_KEYS}
    last = records[-1] if records else {}
    at_end = {k: last.get(k) if runs.is_finite_number(last.get(k)) else None for k in AT_END_KEYS}
    rows_by_step = read_mechanism(run) if rows_by_step is None else rows_by_step
    return Seed(seed, run, outcome, budget, at_init, rows_by_step, at, at_end, threshold)


def at_budget(cell: "CellResult", budget: int) -> "CellResult":
    """The cell as if its runs had stopped at step `budget`: each seed re-classified on its records up
    to that step (seed_of), at the threshold it was judged at."""
    return dataclasses.replace(
        cell, seeds=[seed_of(s.run, s.seed, s.threshold, budget, s.mechanism) for s in cell.seeds], _final_loss={}
    )


def mechanism_arrays(run: Run) -> dict[int, dict[str, np.ndarray]]:
    """step -> the run's per-row arrays at that step (mechanism.npz; {} without one)."""
    path = run.path / "mechanism.npz"
    if not path.exists():
        return {}
    rows: dict[int, dict] = {}
    for name, values in arrayfiles.load_arrays(path).items():
        step, _, statistic = name.partition("/")
        rows.setdefault(int(step), {})[statistic] = values
    return rows


def read_mechanism(run: Run) -> dict:
    """step -> attn.model.mechanism.summary of the run's rows at that step."""
    return {step: mechanism.summary(rows) for step, rows in mechanism_arrays(run).items()}


@dataclass
class CellResult:
    """The runs of one grid cell (one setting of every grid key), read back."""

    settings: dict  # grid key -> value
    theory_score_std: float  # attn.model.head.theory_score_std; NaN for a mode without one
    seeds: list[Seed] = field(default_factory=list)  # the finished ones
    unfinished_runs: dict = field(default_factory=dict)  # seed -> status of each run not finished
    _final_loss: dict = field(default_factory=dict, repr=False, compare=False)  # final losses -> final_loss()

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def unfinished(self) -> Counter:
        """status -> how many runs not finished."""
        return Counter(self.unfinished_runs.values())

    @property
    def budget(self) -> int:
        return max((s.budget for s in self.seeds), default=0)

    def count(self, outcome: str) -> int:
        return sum(s.outcome.outcome == outcome for s in self.seeds)

    def slow_kinds(self) -> dict[str, int]:
        """What the slow seeds did: outcomes.NEAR, UNSTABLE, FAR -> how many."""
        return {
            kind: sum(s.outcome.slow_kind == kind for s in self.seeds)
            for kind in (outcomes.NEAR, outcomes.UNSTABLE, outcomes.FAR)
        }

    def sat_at(self) -> dict[str, int]:
        """Of the seeds that never reached the threshold, how many sat at each plateau level."""
        return {
            level: sum(s.outcome.sat_at == level for s in self.seeds)
            for level in (outcomes.CHANCE_LEVEL, outcomes.NO_RETRIEVAL_LEVEL)
        }

    def counts_at(self, threshold: float) -> dict[str, int]:
        """Each outcome class -> its seeds, with the seeds classified at this threshold (outcomes.THRESHOLDS)."""
        return {name: sum(s.at_thresholds.get(threshold) == name for s in self.seeds) for name in outcomes.OUTCOMES}

    def rate(self, name: str) -> dict:
        """{k, n, rate, low, high}: seeds of class COUNTED[name], Wilson 95%."""
        k = self.count(COUNTED[name])
        low, high = stats.wilson_interval(k, self.n)
        return {"k": k, "n": self.n, "rate": k / self.n if self.n else None, "low": low, "high": high}

    def time(self) -> stats.KMMedian:
        """Kaplan–Meier median steps to the threshold (censored at the budget)."""
        if not self.seeds:
            return stats.KMMedian(None, None, None)
        times = [s.outcome.time_to_threshold for s in self.seeds]
        return stats.km_median([t.time for t in times], [t.observed for t in times])

    def final_losses(self) -> list[float]:
        return [s.final_loss for s in self.seeds]

    def final_loss(self) -> dict:
        """Median final eval loss over seeds (inf if half or more diverged) and a
        bootstrap 95% interval (computed once: a cell's seeds are read, then fixed)."""
        key = tuple(self.final_losses())
        if key not in self._final_loss:
            self._final_loss.clear()
            self._final_loss[key] = self._final_loss_of(np.array(key))
        return self._final_loss[key]

    def _final_loss_of(self, losses: np.ndarray) -> dict:
        if not len(losses):
            return {"median": None, "low": None, "high": None}
        # the resampled medians are finite or +inf, never NaN: a NaN bound is np.quantile interpolating
        # between two +inf medians (inf - inf), and the bound is +inf
        with np.errstate(invalid="ignore"):
            bounds = stats.bootstrap_interval(losses, np.median, np.random.default_rng(BOOTSTRAP_SEED))
        low, high = (math.inf if math.isnan(b) else b for b in bounds)
        return {"median": float(np.median(losses)), "low": float(low), "high": float(high)}

    def median_final_loss(self) -> float | None:
        """final_loss()'s median without its interval (a selection rule needs no bootstrap)."""
        losses = self.final_losses()
        return float(np.median(losses)) if losses else None

    def at_init(self, key: str) -> list[float]:
        return [s.at_init[key] for s in self.seeds if s.at_init.get(key) is not None]

    def mechanism(self, step: int, key: str) -> list[float]:
        """The seeds' mechanism.summary[key] at `step` (finite values only)."""
        return [
            s.mechanism[step][key] for s in self.seeds if runs.is_finite_number((s.mechanism.get(step) or {}).get(key))
        ]

    def dominant(self) -> str:
        """The most frequent outcome class of the seeds (ties: outcomes.OUTCOMES order)."""
        return max(outcomes.OUTCOMES, key=lambda name: (self.count(name), -outcomes.OUTCOMES.index(name)))

    def selection_figures(self) -> dict:
        """What a selection rule may name (attn.analysis.stats.select): success_rate,
        stall_rate, divergence_rate, median_time (None: not reached, the
        worst), final_loss (the median)."""
        return {
            "success_rate": self.rate("success")["rate"],
            "stall_rate": self.rate("stalled")["rate"],
            "divergence_rate": self.rate("diverged")["rate"],
            "median_time": self.time().median,
            "final_loss": self.median_final_loss(),
        }


def rank_auc(lower: list[float], higher: list[float]) -> float | None:
    """The rank-based AUC (Mann–Whitney U / (n m)) of a value for telling
    `lower` from `higher`: the chance that a draw from `lower` is below one
    from `higher`, ties counting half (0.5: no better than a coin; None if
    either side is empty)."""
    if not lower or not higher:
        return None
    a, b = np.asarray(lower, dtype=float)[:, None], np.asarray(higher, dtype=float)[None, :]
    return float(((a < b).sum() + 0.5 * (a == b).sum()) / (a.size * b.size))


def stall_mechanism(seeds: list[Seed]) -> dict:
    """Stalled and learned runs compared, over `seeds` (the runs of one x and arm, say, at every rate):
    for the stalled and the learned runs, how many, how many end with the query
    putting more than SELF_ATTENDING of its attention on its own position
    (Wilson 95%; over the runs whose last record has self_attn), and their
    initial attention on the right key (step-0 target_attn: median, min, max);
    and `auc`, the rank-based AUC of a low initial target_attn for telling a
    stalled run from a learned one (rank_auc: stalled as `lower`)."""
    out = {}
    for name, outcome in (("stalled", outcomes.STALLED), ("learned", outcomes.LEARNED)):
        chosen = [s for s in seeds if s.outcome.outcome == outcome]
        ends = [s.at_end["self_attn"] for s in chosen if s.at_end.get("self_attn") is not None]
        k = sum(value > SELF_ATTENDING for value in ends)
        low, high = stats.wilson_interval(k, len(ends))
        initial = [s.at_init["target_attn"] for s in chosen if s.at_init.get("target_attn") is not None]
        out[name] = {
            "n": len(chosen),
            "self_attending": {
                "k": k,
                "n": len(ends),
                "rate": k / len(ends) if ends else None,
                "low": low,
                "high": high,
            },
            "initial_target_attn": {
                "n": len(initial),
                "median": float(np.median(initial)) if initial else None,
                "min": min(initial, default=None),
                "max": max(initial, default=None),
                "values": initial,
            },
        }
    out["auc"] = rank_auc(
        out["stalled"]["initial_target_attn"]["values"], out["learned"]["initial_target_attn"]["values"]
    )
    return out


def sort_key(value):
    """Numbers before text, each in order: how settings are laid out."""
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


def median(values: list[float]) -> float:
    """The median of the seeds' values; NaN when there are none (a gap in a figure, '—' in a table)."""
    return float(np.median(values)) if len(values) else float("nan")


def in_order(keys) -> list[tuple]:
    """Distinct tuples of setting values (each an x, or an arm) in layout order: value by value, by sort_key."""
    return sorted(set(keys), key=lambda key: [sort_key(v) for v in key])


def cells_lr_sensitivity(cells: list[CellResult], rate_key: str) -> dict:
    """The learning-rate sensitivity (attn.analysis.stats.lr_sensitivity) of cells that differ only in
    their rate: each seed's final loss at every rate and its eval loss at initialisation."""
    rates = sorted({c.settings[rate_key] for c in cells}, key=sort_key)
    finals: dict[int, dict] = {}
    initial: dict[int, float] = {}
    for cell in cells:
        for seed in cell.seeds:
            finals.setdefault(seed.seed, {})[cell.settings[rate_key]] = seed.final_loss
            if seed.at_init.get("eval_loss") is not None:
                initial[seed.seed] = seed.at_init["eval_loss"]
    return stats.lr_sensitivity(finals, initial, rates, np.random.default_rng(BOOTSTRAP_SEED))


@dataclass(frozen=True)
class Excluded:
    """A run directory of the experiment that the report leaves out."""

    name: str
    reason: str


def collect(
    experiment, config_change, threshold: float = outcomes.THRESHOLD, known: KnownRuns | None = None
) -> tuple[list[CellResult], list[Excluded]]:
    """Every cell's runs (module docstring: which runs), and the runs left
    out; `config_change(stored, config)` lists how a run's config (a Config)
    differs from its cell's. A cell with no run holding a summary is not listed.
    `known`: runs read before (KnownRuns), taken as read while their files are unchanged."""
    cells: dict[str, CellResult] = {}
    excluded = []
    for cell in experiment.cells:
        run_dir = experiment.directory / cell.name
        entry = known.entry(run_dir, config_change, threshold) if known is not None else None
        kind, value = entry if entry is not None else cell_run(run_dir, cell, config_change, threshold)
        if kind == "excluded":
            excluded.append(Excluded(cell.name, value))
        if kind not in ("seed", "unfinished"):
            continue
        key = canonical(cell.settings)
        if key not in cells:
            m = cell.config.model
            theory = theory_score_std(m.score, m.scale, m.d_k, qk_gain(cell.config), m.temperature_init)
            cells[key] = CellResult(dict(cell.settings), math.nan if theory is None else theory)
        if kind == "seed":
            cells[key].seeds.append(value)
        else:
            cells[key].unfinished_runs[cell.seed] = value
    return list(cells.values()), excluded


def cell_run(run_dir: Path, cell, config_change, threshold: float) -> tuple[str, object]:
    """What a cell's run directory gives collect(): ("absent", None) without a config.yaml,
    ("excluded", reason), ("not started", None) without a summary, ("seed", its Seed)
    when finished, else ("unfinished", its status)."""
    if not (run_dir / "config.yaml").is_file():
        return "absent", None
    loaded, skipped = load_runs([run_dir])
    if skipped:
        return "excluded", skipped[0].reason
    run = loaded[0]
    if not run.summary:
        return "not started", None
    try:
        difference = config_change(config_from_mapping(run.config_yaml, str(run_dir / "config.yaml")), cell.config)
    except ConfigError as err:
        return "excluded", f"config.yaml is not a valid config: {err}"
    if difference:
        return "excluded", "config differs from the experiment's: " + "; ".join(difference)
    if run.status in runs.FINISHED:
        return "seed", seed_of(run, cell.seed, threshold)
    return "unfinished", run.status


RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "mechanism.npz")  # the files cell_run reads


class KnownRuns:
    """Finished runs read ahead of a report (cell_run), each kept with the state of the files it
    was read from (RUN_FILES: inode, size, modification time, taken before reading): collect()
    takes a run as read while its files are as they were, and reads it again otherwise. A sweep
    reads its runs as they finish, while other runs train, so that its report rereads none."""

    def __init__(self, config_change, threshold: float = outcomes.THRESHOLD):
        self.config_change, self.threshold = config_change, threshold
        self.entries: dict[Path, tuple[tuple, tuple[str, object]]] = {}

    def read(self, run_dir: Path, cell) -> None:
        """Read the cell's run now, if it is finished; a run that cannot be read is left to collect()."""
        before = _file_states(run_dir)
        try:
            entry = cell_run(run_dir, cell, self.config_change, self.threshold)
        except Exception:  # collect() reads it again and says what is wrong
            return
        if entry[0] == "seed":
            self.entries[Path(run_dir)] = (before, entry)

    def entry(self, run_dir: Path, config_change, threshold: float) -> tuple[str, object] | None:
        """The run as read before, if it was read for this config_change and threshold and its files are unchanged."""
        known = self.entries.get(Path(run_dir))
        if known is None or config_change is not self.config_change or threshold != self.threshold:
            return None
        before, entry = known
        return entry if _file_states(run_dir) == before else None


def _file_states(run_dir: Path) -> tuple:
    states = []
    for name in RUN_FILES:
        try:
            stat = (Path(run_dir) / name).stat()
        except OSError:
            states.append(None)
            continue
        states.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
    return tuple(states)
