"""Helpers shared by the test modules (tests/ is on sys.path under pytest)."""

SIZES = [
    "model.d_model=16",
    "model.d_k=8",
    "model.d_v=8",
    "task.n_keys=8",
    "task.n_values=8",
    "task.n_pairs=4",
    "train.batch_size=16",
    "task.eval_size=64",
]
TINY = [*SIZES, "optim.lr=0.2", "logging.plots=false"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
METRIC_TIMING_KEYS = ("wall_time", "steps_per_sec")  # the metric record fields (attn.train.loop) that vary run to run


def parsed_with_and_without_libyaml(text: str) -> tuple[str, str]:
    """attn.config.yamlio.parse_yaml's value (repr) or one-line message for text: with libyaml where it takes
    the text, then by the pure parser alone (as a PyYAML without libyaml)."""
    from attn.config import yamlio

    def parsed():
        try:
            return repr(yamlio.parse_yaml(text, "t.yaml"))
        except yamlio.ConfigError as err:
            return str(err)

    with_libyaml = parsed()
    cparser, yamlio.CParser = yamlio.CParser, None
    try:
        return with_libyaml, parsed()
    finally:
        yamlio.CParser = cparser


def without_timing(records: list[dict]) -> list[dict]:
    """Metric records minus the fields that vary run to run (wall time, speed)."""
    return [{k: v for k, v in r.items() if k not in METRIC_TIMING_KEYS} for r in records]


def facts_in(line: str, *facts: str) -> bool:
    """Every fact (a field, a value, what is accepted, a path) is in the line: the facts, not its wording."""
    missing = [fact for fact in facts if fact not in line]
    assert not missing, (missing, line)
    return True


def write_experiment_file(repo, name: str, runs: int = 4) -> None:
    """repo/experiments/<name>.yaml: an experiment of `runs` runs (seeds) on a tiny base config, and no claims,
    the design a published report of that many runs without a claims record is compared with."""
    (repo / "configs").mkdir(parents=True, exist_ok=True)
    (repo / "configs" / "tiny.yaml").write_text(
        "task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n"
    )
    (repo / "experiments").mkdir(parents=True, exist_ok=True)
    (repo / "experiments" / f"{name}.yaml").write_text(
        f"name: {name}\nbase: ../configs/tiny.yaml\ngrid: {{optim.lr: [0.1]}}\nseeds: {list(range(runs))}\n"
    )


def billion_laughs(levels: int = 9) -> str:
    """A YAML alias bomb: `seed` expands to 9**(levels + 1) strings."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nseed: *a{levels}\n"


def publish_into(repo, monkeypatch, readme: str | None = None):
    """attn.publish pointed at `repo` (its REPO and RESULTS), with repo/experiments/sqrt_dk.yaml
    (write_experiment_file) and a README.md of `readme` (default: the results block alone); repo/experiments/results."""
    from attn import publish, results_text

    write_experiment_file(repo, "sqrt_dk")
    (repo / "README.md").write_text(
        f"# attn\n\n{results_text.RESULTS_BEGIN}\n{results_text.RESULTS_END}\n" if readme is None else readme
    )
    monkeypatch.setattr(publish, "REPO", repo)
    monkeypatch.setattr(publish, "RESULTS", repo / "experiments" / "results")
    return repo / "experiments" / "results"


def verification(variants: dict, digest: str = "d1", cells: dict | None = None, experiment: str = "w") -> dict:
    """A verify.json of these re-runs (variant -> the verdict of claim a), cells: settings' d_k -> variant -> count."""
    platforms = {"as run": {}, **{v: {"attn_commit": [f"{v}-commit"]} for v in variants}}
    verdicts = {"as run": "confirmed", **variants}
    learned = {d_k: {"as run": "4/4", **counts} for d_k, counts in (cells or {}).items()}
    return {
        "experiment": experiment,
        "as_run": {"report": "r.json", "given": True, "sha256": digest},
        "platforms": platforms,
        "expectations": [{"id": "a", "verdicts": verdicts, "agree": len(set(verdicts.values())) == 1}],
        "agree": len(set(verdicts.values())) == 1,
        "materialized": "not made (attn verify --variants)",
        "cells": [
            {"settings": {"model.d_k": d}, "learned": c, "same": len(set(c.values())) == 1} for d, c in learned.items()
        ],
        "unchanged": {v: {"same": 0, "runs": 4} for v in variants},
    }
