"""Results text generated from reports: `attn publish` copies each report
into experiments/results/ and writes the results text from report.json
alone; `attn verify` compares verdicts across re-runs."""

import json
import re
import subprocess

import pytest
from helpers import facts_in, publish_into, verification, write_experiment_file

from attn import publish, results_text
from attn.config.yamlio import ConfigError
from attn.experiment import report_spec, verify
from attn.experiment import verification as record
from attn.store import runs


def report(verdicts: dict, headline="At each arm's own best lr, ...") -> dict:
    return {
        "description": "what it tests",
        "runs": 4,
        "headline": headline,
        "platform": {
            "attn_commit": ["abc1234"],
            "cpu": ["a CPU"],
            "blas": ["openblas (Haswell kernel)"],
            "dtype": ["float32"],
        },
        "expectations": [{"id": i, "claim": f"claim {i}", "verdict": v} for i, v in verdicts.items()],
    }


def verifiable(experiment, verdicts: dict) -> dict:
    """A report verify compares: of the file's claims now, every run of it finished."""
    from attn.experiment import report_spec

    digest = report_spec.claims_record(experiment.report, {c.seed for c in experiment.cells})["digest"]
    return {
        **report(verdicts),
        "claims": {"digest": digest},
        "cells": [
            {
                "settings": {},
                "n": len(experiment.cells),
                "unfinished": {},
                "success_rate": {"k": 0, "n": 1},
                "seeds": [],
            }
        ],
    }


def test_publish_copies_reports_and_writes_the_text_from_them(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    publish_into(
        repo,
        monkeypatch,
        f"# attn\n\nbefore\n\n{results_text.RESULTS_BEGIN}\nold numbers\n{results_text.RESULTS_END}\n\nafter\n",
    )
    run_dir = tmp_path / "runs" / "sqrt_dk"
    run_dir.mkdir(parents=True)
    data = report({"a": "confirmed", "b": "inconclusive"}, headline="The generated paragraph, 7/10 seeds.")
    runs.write_json(run_dir / "report.json", data)
    (run_dir / "report.md").write_text("# the report")
    (run_dir / "headline.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    (tmp_path / "runs" / "verify").mkdir()
    (tmp_path / "runs" / "verify" / "sqrt_dk.md").write_text("table\n\nEvery verdict agrees.\n")
    made = verification(
        {"float64": "confirmed", "Sandybridge": "confirmed"},
        experiment="sqrt_dk",
        cells={
            16: {"float64": "4/4", "Sandybridge": "4/4"},
            64: {"float64": "3/4", "Sandybridge": "4/4"},
            256: {"float64": "4/4", "Sandybridge": "4/4"},
        },
    )
    runs.write_json(
        tmp_path / "runs" / "verify" / "sqrt_dk.json",
        {
            **made,
            "unchanged": {"float64": {"same": 0, "runs": 4}, "Sandybridge": {"same": 3, "runs": 4}},
            "as_run": verify.as_run_record(run_dir / "report.json", False),
        },
    )
    written = publish.publish(None, tmp_path / "runs")
    results = repo / "experiments" / "results" / "sqrt_dk"
    assert {p.name for p in results.iterdir()} == {
        "report.json",
        "report.md",
        "headline.png",
        "verify.md",
        "verify.json",
    }
    assert json.loads((results / "report.json").read_text()) == data
    text = (repo / "README.md").read_text()
    assert text.startswith("# attn\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "old numbers" not in text
    assert "| Claim b | inconclusive | — | 95% interval |" in text  # the findings, one row per claim
    assert "The generated paragraph, 7/10 seeds." not in text  # the paragraphs are in experiments/README.md
    assert (
        "every verdict agrees; seeds that learned, the same count in all three in 2 of 3 cells; Sandybridge "
        "left 3 of the 4 runs finite in both bit for bit as they were ("
    ) in (repo / "experiments" / "README.md").read_text()
    assert "`attn verify experiments/sqrt_dk.yaml`): every verdict agrees ([verify.md]" in text  # README: brief
    assert "The generated paragraph, 7/10 seeds." in (repo / "experiments" / "README.md").read_text()
    assert repo / "README.md" in written


def test_publish_refuses_a_verification_without_its_json(tmp_path, monkeypatch):
    monkeypatch.setattr(publish, "REPO", tmp_path / "repo")
    monkeypatch.setattr(publish, "RESULTS", tmp_path / "repo" / "experiments" / "results")
    (tmp_path / "repo" / "experiments").mkdir(parents=True)
    write_experiment_file(tmp_path / "repo", "sqrt_dk")
    (tmp_path / "runs" / "sqrt_dk").mkdir(parents=True)
    runs.write_json(tmp_path / "runs" / "sqrt_dk" / "report.json", report({"a": "confirmed"}))
    (tmp_path / "runs" / "verify").mkdir()
    (tmp_path / "runs" / "verify" / "sqrt_dk.md").write_text("Every verdict agrees.\n")
    (tmp_path / "repo" / "experiments" / "results" / "sqrt_dk").mkdir(parents=True)
    (tmp_path / "repo" / "experiments" / "results" / "sqrt_dk" / "report.json").write_text("{}")
    with pytest.raises(runs.RunError) as info:
        publish.publish(None, tmp_path / "runs")
    assert facts_in(str(info.value), "sqrt_dk.md:", "sqrt_dk.json", "attn verify experiments/sqrt_dk.yaml")
    assert (tmp_path / "repo" / "experiments" / "results" / "sqrt_dk" / "report.json").read_text() == "{}", (
        "the published results are left as they were"
    )


def test_publish_without_reports_or_a_results_block_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(publish, "REPO", tmp_path)
    (tmp_path / "experiments").mkdir()
    with pytest.raises(runs.RunError, match="no experiment has a report yet"):
        publish.publish(None, tmp_path / "runs")
    with pytest.raises(runs.RunError, match="README.md has no generated block"):
        results_text.with_block("# no block\n", results_text.RESULTS_BEGIN, results_text.RESULTS_END, "text")


def test_publish_refuses_a_name_that_is_not_an_experiment_before_touching_anything(tmp_path, monkeypatch):
    """A NAME becomes a directory of the results: `..` or a report of no experiment file is no name."""
    monkeypatch.setattr(publish, "REPO", tmp_path)
    monkeypatch.setattr(publish, "RESULTS", tmp_path / "experiments" / "results")
    (tmp_path / "experiments").mkdir()
    write_experiment_file(tmp_path, "real")
    for name in ("../outside", "stray"):
        (tmp_path / "runs" / name).mkdir(parents=True, exist_ok=True)
        (tmp_path / "runs" / name / "report.json").write_text(json.dumps(report({})))
        with pytest.raises(runs.RunError, match=rf"NAME '{re.escape(name)}'.*expected one of real$"):
            publish.publish([name], tmp_path / "runs")
    assert [p.name for p in (tmp_path / "experiments").iterdir() if p.name != ".lock"] == ["real.yaml"]  # nothing


def bench_result(attn_ms: float, jax_ms: float) -> dict:
    spread = lambda ms: {"median_ms": ms, "p25_ms": ms * 0.9, "p75_ms": ms * 1.1}  # noqa: E731
    return {
        "date": "2026-12-01 10:00 UTC",
        "attn_commit": "abc1234",
        "machine": {"cpu": "a CPU", "cores": 2, "blas": "openblas (Haswell)"},
        "timings": [
            {
                "threads": 1,
                "sizes": [
                    {
                        "size": "default",
                        "sides": {"attn": spread(attn_ms), "jax bilinear": spread(jax_ms)},
                        "fastest_rival": "jax bilinear",
                        "ratio_to_fastest": attn_ms / jax_ms,
                    }
                ],
            }
        ],
        "sweep": {
            "results": [
                {"workers": 1, "efficiency": 0.9, "wall_s": 40.0},
                {"workers": 2, "efficiency": 0.85, "wall_s": 21.0},
            ],
            "speedup": 1.9,
        },
    }


def test_publish_fills_the_bench_block_from_the_newest_benchmark(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "experiments").mkdir(parents=True)
    readme = (
        f"# attn\n\n{results_text.RESULTS_BEGIN}\n{results_text.RESULTS_END}\n\n"
        f"{results_text.BENCH_BEGIN}\nstale text\n{results_text.BENCH_END}\n"
    )
    (repo / "README.md").write_text(readme)
    monkeypatch.setattr(publish, "REPO", repo)
    monkeypatch.setattr(publish, "RESULTS", repo / "experiments" / "results")
    write_experiment_file(repo, "sqrt_dk")
    (tmp_path / "runs" / "sqrt_dk").mkdir(parents=True)
    runs.write_json(tmp_path / "runs" / "sqrt_dk" / "report.json", report({}))
    bench = tmp_path / "runs" / "bench"
    bench.mkdir()
    for stem, result in (
        ("bench-20261201-090000", bench_result(2.0, 1.0)),
        ("bench-20261201-100000", bench_result(0.6, 1.0)),
    ):
        runs.write_json(bench / f"{stem}.json", result)
        (bench / f"{stem}.md").write_text(f"# {stem}\n")
    publish.publish(["sqrt_dk"], tmp_path / "runs")
    text = (repo / "README.md").read_text()
    assert (
        "stale text" not in text
        and "| default | 1 | 0.6 (0.54–0.66) | jax bilinear | 1 (0.9–1.1) | 0.60 (met at ≤ 1.0) |" in text
    )
    assert "sweep efficiency 90% with 1 worker(s), 85% with 2 worker(s) (met at ≥ 80%)" in text
    assert "2 workers 1.90× faster than 1 (met at ≥ 1.8×)" in text
    assert (repo / "experiments" / "results" / "bench.md").read_text() == "# bench-20261201-100000\n"


def test_a_benchmark_is_published_alone_leaving_the_published_reports_as_they_are(tmp_path, monkeypatch, capsys):
    from attn import cli

    repo = tmp_path / "repo"
    results = publish_into(
        repo,
        monkeypatch,
        f"# attn\n\n{results_text.RESULTS_BEGIN}\n{results_text.RESULTS_END}\n\n"
        f"{results_text.BENCH_BEGIN}\nstale text\n{results_text.BENCH_END}\n",
    )
    (results / "sqrt_dk").mkdir(parents=True)
    runs.write_json(
        results / "sqrt_dk" / "report.json", report({"a": "confirmed"}, headline="The published paragraph.")
    )
    (tmp_path / "runs" / "sqrt_dk").mkdir(parents=True)  # a newer report in runs/ that --bench must not publish
    runs.write_json(tmp_path / "runs" / "sqrt_dk" / "report.json", report({"a": "refuted"}, headline="Unpublished."))
    bench = tmp_path / "runs" / "bench"
    bench.mkdir()
    runs.write_json(bench / "bench-20261201-100000.json", bench_result(0.6, 1.0))
    (bench / "bench-20261201-100000.md").write_text("# the newest\n")
    assert cli.main(["publish", "--bench", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert (results / "bench.md").read_text() == "# the newest\n"
    assert json.loads((results / "sqrt_dk" / "report.json").read_text())["headline"] == "The published paragraph."
    text = (repo / "README.md").read_text()
    assert "stale text" not in text and "| default | 1 | 0.6 (0.54–0.66) | jax bilinear |" in text
    assert "| Claim a | confirmed |" in text and "refuted" not in text
    capsys.readouterr()
    assert cli.main(["publish", "--bench", "sqrt_dk"]) == 2
    assert facts_in(capsys.readouterr().err, "--bench", "sqrt_dk")
    for other in ("--text-only", "--verification-only"):
        assert cli.main(["publish", "--bench", other]) == 2
        assert facts_in(capsys.readouterr().err, "--bench", other)


@pytest.mark.parametrize("commit", ["abc1234-dirty", None, ""])
def test_a_benchmark_of_uncommitted_or_unknown_code_is_refused_unless_allowed(tmp_path, monkeypatch, capsys, commit):
    from attn import cli

    repo = tmp_path / "repo"
    results = publish_into(repo, monkeypatch, f"# attn\n\n{results_text.BENCH_BEGIN}\nold\n{results_text.BENCH_END}\n")
    bench = tmp_path / "runs" / "bench"
    bench.mkdir(parents=True)
    runs.write_json(bench / "bench-20261201-100000.json", {**bench_result(0.6, 1.0), "attn_commit": commit})
    (bench / "bench-20261201-100000.md").write_text("# dirty\n")
    (tmp_path / "runs" / "sqrt_dk").mkdir()
    runs.write_json(tmp_path / "runs" / "sqrt_dk" / "report.json", report({}))
    for bench_only in (True, False):
        with pytest.raises(publish.MixedCode) as info:
            publish.publish(None, tmp_path / "runs", bench_only=bench_only)
        assert facts_in(str(info.value), "bench-20261201-100000.json", *(["abc1234-dirty"] if commit else []))
        assert "--allow-mixed" not in str(info.value), "the library names no CLI flag (attn.cli maps it)"
        assert cli.main(["publish", "--runs-dir", str(tmp_path / "runs"), *(["--bench"] if bench_only else [])]) == 2
        assert facts_in(capsys.readouterr().err, "bench-20261201-100000.json", "--allow-mixed")
        assert not results.exists() and not results.with_name(".results.new").exists()
        assert "old" in (repo / "README.md").read_text(), "nothing is touched"
    publish.publish(None, tmp_path / "runs", allow_mixed=True, bench_only=True)
    assert (results / "bench.md").read_text() == "# dirty\n"


def test_publishing_a_benchmark_alone_needs_one(tmp_path, monkeypatch):
    publish_into(tmp_path / "repo", monkeypatch)
    with pytest.raises(runs.RunError) as info:
        publish.publish(None, tmp_path / "runs", bench_only=True)
    assert facts_in(str(info.value), str(tmp_path / "runs" / "bench"), "attn bench")


def test_the_verification_line_says_when_every_re_run_changed_every_run():
    line = results_text.verification_line(
        "x",
        {
            "experiment": "x",
            "platforms": {"as run": {}, "float64": {}, "Sandybridge": {}},
            "expectations": [{"id": "a", "verdicts": {"as run": "confirmed"}, "agree": True}],
            "agree": True,
            "cells": [],
            "unchanged": {"float64": {"same": 0, "runs": 4}, "Sandybridge": {"same": 0, "runs": 3}},
        },
    )
    assert "every verdict agrees; each re-run changed the path of every run that stayed finite (" in line


def test_an_experiment_not_yet_verified_says_so_and_how_to_verify_it():
    line = results_text.verification_line("x", None)
    assert line.startswith("Not yet re-run") and "`attn verify experiments/x.yaml`" in line


def test_verify_compares_every_verdict_and_names_the_flips():
    reports = {
        "as run": report({"a": "confirmed", "b": "inconclusive"}),
        "float64": report({"a": "confirmed", "b": "confirmed"}),
        "Sandybridge": report({"a": "confirmed", "b": "inconclusive"}),
    }
    rows = verify.compare_verdicts(reports)
    assert rows == [
        {"id": "a", "verdicts": {v: "confirmed" for v in reports}, "agree": True},
        {
            "id": "b",
            "verdicts": {"as run": "inconclusive", "float64": "confirmed", "Sandybridge": "inconclusive"},
            "agree": False,
        },
    ]
    text = record.verify_markdown(
        {
            "experiment": "x",
            "platforms": {v: r["platform"] for v, r in reports.items()},
            "expectations": rows,
            "agree": False,
        }
    )
    assert (
        "| b | inconclusive | confirmed | inconclusive | NO |" in text
        and "run-to-run variance" in text
        and "1 of 2 verdicts differ" in text
    )


def test_verify_names_each_re_runs_code_and_what_it_did_with_subnormals():
    reports = {"as run": report({"a": "confirmed"}), "materialized": report({"a": "confirmed"})}
    reports["as run"]["platform"].update(attn_commit=["e3870a8"])  # made before attn flushed: no word of it
    reports["materialized"]["platform"].update(
        attn_commit=["1458a17", "e3870a8"], denormals=["flushed to zero", "kept"]
    )
    text = record.verify_markdown(
        {
            "experiment": "x",
            "platforms": {v: r["platform"] for v, r in reports.items()},
            "expectations": verify.compare_verdicts(reports),
            "agree": True,
        }
    )
    assert "as run: " in text and "subnormals kept, attn e3870a8;" in text
    assert "subnormals flushed to zero, kept, attn 1458a17, e3870a8." in text


def cell(d_k: int, learned: int, n: int = 4, losses=(0.5, 0.25), paths=("p0", "p1")) -> dict:
    return {
        "settings": {"model.d_k": d_k, "model.scale": "none"},
        "success_rate": {"k": learned, "n": n},
        "seeds": [
            {"seed": seed, "final_loss": loss, "path": path} for seed, (loss, path) in enumerate(zip(losses, paths))
        ],
    }


def test_verify_sets_each_cells_learned_count_side_by_side_and_lists_the_cells_that_differ():
    reports = {
        "as run": {**report({}), "cells": [cell(16, 4), cell(64, 2)]},
        "float64": {**report({}), "cells": [cell(16, 4), cell(64, 3)]},
        "Sandybridge": {**report({}), "cells": [cell(16, 4)]},
    }
    cells = verify.compare_cells(reports)
    assert [c["same"] for c in cells] == [True, False]
    assert cells[1]["learned"] == {"as run": "2/4", "float64": "3/4", "Sandybridge": "absent"}
    only_rerun = verify.compare_cells(
        {"as run": {"cells": [cell(16, 4)]}, "float64": {"cells": [cell(16, 4), cell(64, 1)]}}
    )
    assert only_rerun[1] == {
        "settings": cell(64, 1)["settings"],
        "learned": {"as run": "absent", "float64": "1/4"},
        "same": False,
    }, "a cell only a re-run has is listed, as differing"
    text = record.verify_markdown(
        {
            "experiment": "x",
            "platforms": {v: r["platform"] for v, r in reports.items()},
            "expectations": verify.compare_verdicts(reports),
            "agree": True,
            "cells": cells,
        }
    )
    assert "declares no expectations" in text and "Every verdict agrees" not in text
    assert "the same count in all three in 1 of 2 cells; where it differs:" in text
    assert "| 64 | none | 2/4 | 3/4 | absent |" in text and "| 16 | none |" not in text


def test_verify_counts_the_runs_a_re_run_left_bit_for_bit_where_they_were():
    reports = {
        "as run": {**report({}), "cells": [cell(16, 4), cell(64, 2)]},
        "float64": {
            **report({}),
            "cells": [cell(16, 4, paths=("p0", "other")), cell(64, 2, paths=("another", "yet another"))],
        },
        "Sandybridge": {**report({}), "cells": [cell(16, 4)]},
        "diverged": {**report({}), "cells": [cell(16, 0, losses=("inf", 0.25)), cell(64, 0, losses=(None,))]},
    }
    unchanged = verify.unchanged_runs(reports)
    assert unchanged == {
        "float64": {"same": 1, "runs": 4},
        "Sandybridge": {"same": 2, "runs": 2},
        "diverged": {"same": 1, "runs": 1},
    }, "a run diverged in a re-run is not counted"
    text = record.verify_markdown(
        {
            "experiment": "x",
            "platforms": {v: r["platform"] for v, r in reports.items()},
            "expectations": [],
            "agree": True,
            "cells": verify.compare_cells(reports),
            "unchanged": unchanged,
        }
    )
    assert "of those finite in both): float64 1 of 4, Sandybridge 2 of 2, diverged 1 of 1 (where" in text
    converged = {
        "as run": {"cells": [cell(16, 4, losses=(1e-4, 1e-4))]},
        "Sandybridge": {"cells": [cell(16, 4, losses=(1e-4, 1e-4), paths=("q0", "q1"))]},
    }
    assert verify.unchanged_runs(converged) == {"Sandybridge": {"same": 0, "runs": 2}}, (
        "runs that end at the same loss by another path were changed"
    )


def test_the_cells_table_has_a_column_for_every_key_of_the_cells_it_lists():
    wide = {
        "settings": {"model.d_k": 16, "model.scale": "none", "optim.qk_lr_exponent": 1},
        "success_rate": {"k": 1, "n": 4},
        "seeds": [],
    }
    reports = {
        "as run": {**report({}), "cells": [cell(16, 2), wide]},
        "float64": {**report({}), "cells": [cell(16, 3), {**wide, "success_rate": {"k": 2, "n": 4}}]},
    }
    text = record.verify_markdown(
        {
            "experiment": "x",
            "platforms": {v: r["platform"] for v, r in reports.items()},
            "expectations": [],
            "agree": True,
            "cells": verify.compare_cells(reports),
        }
    )
    assert "| model.d_k | model.scale | optim.qk_lr_exponent | learned as run | learned float64 |" in text
    assert "| 16 | none | — | 2/4 | 3/4 |" in text and "| 16 | none | 1 | 1/4 | 2/4 |" in text


def test_the_results_block_is_the_headlines_findings_table_and_a_line_for_every_other_experiment(tmp_path):
    """README's block is short: the headline's claims one row each (claim, verdict, effect, test), its
    paragraph of intervals and p-values only in experiments/README.md; then one line per other experiment,
    the two comparisons of score modes first, the rest after; then the boundary experiments in a list of their
    own, by their number."""
    headline = report({"a": "confirmed"}, headline="Scope: plain SGD; 20 seeds. The headline paragraph.")
    headline["layout"] = {"x": ["model.d_k"], "best_of": "optim.lr"}
    headline["expectations"][0].update(
        test="mcnemar",
        p_holm=0.0004,
        points=[
            {"x": [64], "p": 1e-6, "effect": {"name": "difference of rates", "value": 1.0, "low": 0.8, "high": 1.0}},
            {"x": [256], "p": 1e-4, "effect": {"name": "difference of rates", "value": 0.9, "low": 0.6, "high": 1.0}},
        ],
    )
    scores = {**report({"s": "confirmed", "t": "not confirmed"}), "description": "Every fix. Its arms."}
    boundary = {
        **report({"masked-a": "confirmed", "masked-b": "inconclusive", "masked-c": "confirmed"}),
        "description": "Where the claim stops holding, 7: the query's own position. More words.",
    }
    earlier = {**report({"w": "confirmed"}), "description": "Where the claim stops holding, 2: width."}
    block = results_text.results_block(
        {
            "sqrt_dk": headline,
            "mask_self": boundary,
            "width": earlier,
            "lengths": {**report({}), "description": "Length."},
            "scores_wide": report({"w-a": "confirmed"}),
            "scores": scores,
        },
        {},
        tmp_path,  # no experiment files: each report's own description
        changes={},
    )
    assert "The headline paragraph." not in block and "in scope: plain SGD; 20 seeds." in block
    [row] = [line for line in block.splitlines() if line.startswith("| Claim a")]
    assert row == (
        "| Claim a | confirmed | difference of rates 0.9 [0.6, 1] at d_k 256, the weakest of 2 "
        "| exact McNemar, Holm p 0.0004 |"
    )
    lines = [x for x in block.splitlines() if x.startswith("- ")]
    assert [x.split("`")[1] for x in lines] == ["scores", "scores_wide", "lengths", "width", "mask_self"]
    assert lines[0] == (
        "- [`scores`](experiments/results/scores/report.md) — Every fix: 1 confirmed, 1 not confirmed; not yet verified"
    )
    assert [x.split(" ")[1] for x in lines[3:]] == ["(2)", "(7)"]  # the boundary experiments, by their numbers
    assert "stops holding" not in "".join(lines)  # said once, above their list
    assert block.index("**Where the headline's claim stops holding**") > block.index(lines[2])
    assert facts_in(lines[4], "— the query's own position:", "2 confirmed, 1 inconclusive")
    assert "no claims" in lines[2]  # lengths


def test_verify_re_runs_with_the_materialized_head_where_a_cell_runs_width_free(tmp_path, monkeypatch):
    """A second algorithm for the same maths: a cell carried width-free is re-run with model.width_free=false too,
    and its verdicts compared beside float64's and the second kernel's; an experiment with none is not."""
    from attn.experiment.spec import build_experiment

    (tmp_path / "base.yaml").write_text("task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n")
    asked = []

    def rerun(experiment, variant, passes, env, workers, progress):
        asked.append((variant, passes))
        directory = tmp_path / variant
        directory.mkdir(exist_ok=True)
        runs.write_report_json(directory, verifiable(experiment, {"a": "confirmed"}))
        return directory

    monkeypatch.setattr(verify, "rerun", rerun)
    monkeypatch.setattr(verify, "second_kernel", lambda requested: "Sandybridge")
    for d_k, materialized in ((256, True), (8, False)):
        asked.clear()
        data = {"name": f"w{d_k}", "base": "base.yaml", "grid": {"model.d_k": [d_k], "model.d_v": [d_k]}, "seeds": [0]}
        experiment = build_experiment(data, tmp_path / "w.yaml", str(tmp_path / "runs"))
        experiment.directory.mkdir(parents=True)
        runs.write_json(experiment.directory / "report.json", verifiable(experiment, {"a": "confirmed"}))
        result = verify.verify(experiment, None, 1)
        assert (("materialized", [["model.width_free=false"]]) in asked) == materialized
        assert ("materialized" in result["platforms"]) == materialized
        assert all(r["agree"] for r in result["expectations"])


def test_the_materialized_re_run_passes_cover_every_cell_once_materializing_only_what_fits(tmp_path):
    """Width-free cells at most MATERIALIZED_WIDTH wide get model.width_free=false; the rest (not width-free, or
    too wide to materialize) are the runs as run; a grid no one key splits is split block by block, and each
    pass's --only values read back as the grid's (null for a block that does not set the key, a mapping)."""
    from attn.experiment.spec import build_experiment

    base = "task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8, d_v: 8}\ntrain: {steps: 2}\n"  # d_v narrow
    (tmp_path / "base.yaml").write_text(base)
    wide = 2 * verify.MATERIALIZED_WIDTH

    def plan(grid):
        data = {"name": "w", "base": "base.yaml", "grid": grid, "seeds": [0, 1]}
        experiment = build_experiment(data, tmp_path / "w.yaml", str(tmp_path / "runs"))
        made = verify.materialized_plan(experiment)

        def cells_of(arguments):  # the cells an `attn sweep` pass with these arguments builds and runs
            only = [arguments[i + 1] for i, a in enumerate(arguments) if a == "--only"]
            overrides = [a for a in arguments if "=" in a and a not in only]
            return [
                c.name
                for c in build_experiment(
                    data, tmp_path / "w.yaml", str(tmp_path / "runs"), overrides=overrides, only=only
                ).cells
            ]

        covered = [name for p in made.passes for name in cells_of(p)]
        if made.passes:
            assert sorted(covered) == sorted(cell.name for cell in experiment.cells), "every cell in one pass"
        rerun = [name for p in made.passes if "model.width_free=false" in p for name in cells_of(p)]
        assert set(rerun) == made.rerun and not made.rerun & made.reused
        return made

    made = plan({"model.d_k": [8, 256, wide]})
    assert made.passes == [["model.width_free=false", "--only", "model.d_k=256"], ["--only", f"model.d_k=8, {wide}"]]
    assert made.rerun == {"d_k-256_seed-0", "d_k-256_seed-1"} and "model.d_k 256" in made.said
    made = plan({"optim.name": ["sgd", "adam"], "model.d_k": [8, 256]})  # adam is never width-free
    assert made.passes == [
        ["model.width_free=false", "--only", "optim.name=sgd", "--only", "model.d_k=256"],
        ["--only", "optim.name=sgd", "--only", "model.d_k=8"],
        ["--only", "optim.name=adam"],
    ]
    plan(
        [
            {"model.scale": ["sqrt", "none"], "model.d_k": [8, 256]},  # the second block sets no scale
            {"model.score": ["mup"], "model.d_k": [256], "optim.lr_mult": [{"W_q": 0.5}, {}]},
        ]
    )
    assert plan({"model.d_k": [8, wide]}).passes == []


def test_only_reads_back_every_grid_value_as_only_argument_writes_it(tmp_path):
    """null for a block that does not set the key, a mapping, a string YAML would read as something else."""
    from attn.experiment.spec import build_experiment, only_argument

    (tmp_path / "base.yaml").write_text("task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n")
    grid = [
        {"model.scale": ["none"], "model.d_k": [8]},
        {"model.score": ["mup"], "model.d_k": [8], "optim.lr_mult": [{"W_q": 0.5}, {}]},
    ]
    data = {"name": "w", "base": "base.yaml", "grid": grid, "seeds": [0]}

    def restricted(*only):
        return build_experiment(data, tmp_path / "w.yaml", str(tmp_path / "runs"), only=only).cells

    every = build_experiment(data, tmp_path / "w.yaml", str(tmp_path / "runs")).cells
    assert [c.name for c in restricted(only_argument("model.scale", [None]))] == [
        c.name for c in every if "model.scale" not in dict(c.settings)
    ]
    [one] = restricted(only_argument("optim.lr_mult", [{"W_q": 0.5}]))
    assert dict(one.settings)["optim.lr_mult"] == {"W_q": 0.5}
    assert only_argument("k", [None, "yes", 0.001, {"W_q": 0.5}]) == "k=null, 'yes', 0.001, {W_q: 0.5}"
    with pytest.raises(ConfigError, match=r"no cell of w has all of these values"):
        restricted("model.scale=none", "model.score=mup")


def test_only_builds_and_checks_only_its_cells_so_an_override_need_hold_for_them_alone(tmp_path):
    """The materialized re-run's first pass: model.width_free=false would need d_k-wide weights at every d_k; a
    cell too wide for memory is left out by --only, and the claims are still checked against the whole grid."""
    from attn.experiment.spec import build_experiment

    (tmp_path / "base.yaml").write_text(
        "task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 64}\ntrain: {steps: 2}\n"
    )
    claim = {
        "id": "c",
        "claim": "c",
        "stat": "success_rate",
        "arm": {"model.scale": "sqrt"},
        "above": 0.5,
        "where": {"model.d_k": [1048576]},
    }
    data = {
        "name": "w",
        "base": "base.yaml",
        "grid": {"model.d_k": [256, 1048576], "model.scale": ["sqrt"]},
        "seeds": list(range(10)),
        "report": {"x": "model.d_k", "arm": "model.scale", "expect": [claim]},
    }
    with pytest.raises(ConfigError, match=r"memory"):
        build_experiment(data, tmp_path / "w.yaml", str(tmp_path / "runs"), overrides=["model.width_free=false"])
    experiment = build_experiment(
        data, tmp_path / "w.yaml", str(tmp_path / "runs"), overrides=["model.width_free=false"], only=["model.d_k=256"]
    )
    assert {dict(c.settings)["model.d_k"] for c in experiment.cells} == {256}
    assert [e.id for e in experiment.report.expect] == ["c"]


def test_the_materialized_re_run_links_the_finished_runs_it_does_not_re_run(tmp_path):
    from attn.experiment.spec import build_experiment

    (tmp_path / "base.yaml").write_text("task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n")
    experiment = build_experiment(
        {"name": "w", "base": "base.yaml", "grid": {"model.d_k": [8]}, "seeds": [0, 1]},
        tmp_path / "w.yaml",
        str(tmp_path / "runs"),
    )
    for cell, status in zip(experiment.cells, ("completed", "interrupted")):
        (experiment.directory / cell.name).mkdir(parents=True)
        runs.write_json(experiment.directory / cell.name / "summary.json", {"status": status})
    target = tmp_path / "verify" / "w"
    finished, unfinished = (c.name for c in experiment.cells)
    assert verify.link_finished_runs(experiment, target, frozenset(c.name for c in experiment.cells)) == {finished}
    assert (target / finished / "summary.json").stat().st_ino == (
        experiment.directory / finished / "summary.json"
    ).stat().st_ino  # a hard link, not a copy
    assert not (target / unfinished).exists()  # left for the re-run's sweep to train
    assert verify.link_finished_runs(experiment, target, frozenset({finished})) == {finished}, "linked before: still"


def test_a_materialized_re_runs_unchanged_count_is_over_the_runs_it_re_ran():
    def with_paths(paths):
        return {
            "cells": [
                {"settings": {"model.d_k": d}, "seeds": [{"seed": 0, "final_loss": 0.1, "path": p}]}
                for d, p in paths.items()
            ]
        }

    reports = {"as run": with_paths({16: "a", 256: "b"}), "materialized": with_paths({16: "a", 256: "c"})}
    rerun = {json.dumps(({"model.d_k": 256}, 0), sort_keys=True)}
    assert verify.unchanged_runs(reports) == {"materialized": {"same": 1, "runs": 2}}
    assert verify.unchanged_runs(reports, {"materialized": rerun}) == {"materialized": {"same": 0, "runs": 1}}


def test_a_stall_claim_judged_under_the_earlier_plateau_rule_is_marked_so_and_others_are_not():
    """Reports made before issue 45 let a seed leave the plateau on its accuracy too: their claims on a statistic
    that rests on that rule (stall_rate) are marked in the text, read raw or made markdown_safe; success and time
    claims, and reports under the current rule, are not."""
    from attn import outcomes

    def report(definitions):
        return {
            "definitions": definitions,
            "expectations": [
                {"id": "s", "rule": "stall_rate of scale=none below 0.3", "verdict": "confirmed", "claim": "c"},
                {"id": "l", "rule": "success_rate of scale=sqrt above 0.5", "verdict": "confirmed", "claim": "c"},
            ],
        }

    earlier = report(f"... leaves the plateau at the first logged step with {outcomes.EARLIER_PLATEAU_RULE} ...")
    for read in (earlier, results_text.markdown_safe(earlier)):
        assert results_text.on_earlier_plateau_rule(read) == ["s"]
        assert "1 of them" in results_text.earlier_rule_count(read)
        lines = results_text.verdict_lines(read)
        assert [results_text.EARLIER_RULE_SAID in line for line in lines] == [True, False]
    now = report(outcomes.definitions())
    assert results_text.on_earlier_plateau_rule(now) == [] and results_text.earlier_rule_count(now) == ""


def test_claims_judged_at_one_point_each_are_tabled_by_point_with_their_verdicts_and_effects():
    """A factorial's contrasts, each at one x point: a table says which are confirmed where (with the effect);
    a design with claims at fewer than two such points gets none."""

    def claim(cid, x, verdict, value):
        effect = {"name": "difference of rates", "value": value}
        return {"id": cid, "verdict": verdict, "points": [{"x": x, "effect": effect}]}

    spread = {"name": "every", "verdict": "confirmed", "points": [{"x": [16]}, {"x": [64]}]}
    expectations = [
        claim("a-at-16", [16], "confirmed", 0.45),
        claim("b-at-16", [16], "inconclusive", 0.05),
        claim("a-at-64", [64], "inconclusive", 0.1),
        claim("b-at-64", [64], "not confirmed", -0.5),
        {**spread, "id": "every"},
    ]
    report = {"layout": {"x": ["model.d_k"]}, "expectations": expectations}
    lines = "\n".join(results_text.verdicts_by_point_of(report)).splitlines()
    table = [line for line in lines if line.startswith(("| 16 ", "| 64 "))]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in table]
    assert cells == [
        ["16", "`a-at-16` (difference of rates 0.45)", "—", "`b-at-16` (difference of rates 0.05)"],
        ["64", "—", "`b-at-64` (difference of rates -0.5)", "`a-at-64` (difference of rates 0.1)"],
    ]
    assert results_text.verdicts_by_point_of({**report, "expectations": expectations[:2] + [expectations[4]]}) == []
    # a claim edited after the runs keeps its mark in the table, as in the list above it; the x keys are named
    # as the results block names them (short names among the x keys and best_of)
    edited = [{**expectations[0], "edited_after_runs": "reworded"}, *expectations[1:]]
    layout = {"x": ["optim.name", "model.d_k"], "best_of": "optim.lr"}
    text = "\n".join(results_text.verdicts_by_point_of({"layout": layout, "expectations": edited}))
    assert report_spec.EDITED_SAID in text.split("| 16 |")[1].split("\n")[0]
    assert "| name / d_k |" in text


def test_the_scope_line_names_each_numeric_x_keys_range_and_nothing_else():
    names = {"model.d_k": "d_k", "optim.name": "name"}

    def report(values, key="model.d_k"):
        return {"layout": {"x": [key]}, "cells": [{"settings": {key: v}} for v in values]}

    assert results_text.x_ranges(report([16, 1048576, 64]), names) == ["d_k 16, 64 and 1048576"]
    many = [2**k for k in range(4, 4 + results_text.LISTED + 1)]
    assert results_text.x_ranges(report(many), names) == [f"d_k 16 to {many[-1]} ({len(many)} values)"]
    assert results_text.x_ranges(report([64, 64]), names) == []  # one value: no range
    assert results_text.x_ranges(report(["sgd", "adamw"], "optim.name"), names) == []
    assert results_text.x_ranges(report([True, False]), names) == []
    assert (
        results_text.x_ranges({"cells": [{}]}, names) == []
        and results_text.x_ranges({"layout": {"x": ["model.d_k"]}, "cells": [{}]}, names) == []
    )


def test_verify_makes_only_the_re_runs_asked_for(tmp_path, monkeypatch):
    from attn.experiment.spec import build_experiment

    (tmp_path / "base.yaml").write_text("task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n")
    asked = []

    def rerun(experiment, variant, passes, env, workers, progress):
        asked.append(variant)
        directory = tmp_path / variant
        directory.mkdir(exist_ok=True)
        runs.write_report_json(directory, verifiable(experiment, {"a": "confirmed"}))
        return directory

    monkeypatch.setattr(verify, "rerun", rerun)
    monkeypatch.setattr(verify, "second_kernel", lambda requested: "Sandybridge")
    data = {"name": "w", "base": "base.yaml", "grid": {"model.d_k": [256]}, "seeds": [0]}  # width-free: all three
    experiment = build_experiment(data, tmp_path / "w.yaml", str(tmp_path / "runs"))
    experiment.directory.mkdir(parents=True)
    runs.write_json(experiment.directory / "report.json", verifiable(experiment, {"a": "confirmed"}))
    result = verify.verify(experiment, None, 1, variants=("float64", "kernel"))
    assert asked == ["float64", "sandybridge"] and list(result["platforms"]) == ["as run", "float64", "Sandybridge"]
    assert result["materialized"] == "not made (attn verify --variants)"
    asked.clear()
    verify.verify(experiment, None, 1)
    assert asked == ["float64", "sandybridge", "materialized"]
    asked.clear()

    def unavailable(requested):
        raise runs.RunError(f"verify: --kernel {requested}: not available")

    monkeypatch.setattr(verify, "second_kernel", unavailable)
    with pytest.raises(runs.RunError, match="--kernel foo"):
        verify.verify(experiment, "foo", 1)
    assert asked == [], "a kernel this CPU lacks is refused before the float64 re-run, not after it"


def test_a_re_run_says_each_run_as_its_sweep_ends_it(tmp_path, monkeypatch):
    """A re-run can take hours: each '[k/N] cell: ...' line its sweep prints goes on, named by the re-run, as
    it comes; the sweep's other lines do not."""
    import sys

    from attn.experiment.spec import build_experiment
    from attn.store import processes

    (tmp_path / "base.yaml").write_text("task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n")
    data = {"name": "w", "base": "base.yaml", "grid": {"model.d_k": [16]}, "seeds": [0, 1]}
    experiment = build_experiment(data, tmp_path / "w.yaml", str(tmp_path / "runs"))
    report = verify.variant_directory(experiment, "float64") / "w" / runs.REPORT_FILE
    sweep_says = [
        "sweep w: 2 runs",
        "[1/2] a: ran, completed  learned",
        "started b",
        "[2/2] b: ran, completed  stalled",
    ]
    script = "import pathlib, sys; print(*sys.argv[2:], sep='\\n', file=sys.stderr); p = pathlib.Path(sys.argv[1]);"
    script += "p.parent.mkdir(parents=True, exist_ok=True); p.write_text('{}')"
    told = processes.run_child
    monkeypatch.setattr(
        processes,
        "run_child",
        lambda command, **options: told([sys.executable, "-c", script, str(report), *sweep_says], **options),
    )
    said = []
    assert verify.rerun(experiment, "float64", [["dtype=float64"]], {}, 1, said.append) == report.parent
    assert said[1:] == ["float64: [1/2] a: ran, completed  learned", "float64: [2/2] b: ran, completed  stalled"]


def test_verify_compares_only_reports_of_every_run_under_the_claims_the_file_has_now(tmp_path, monkeypatch):
    """A report written mid-sweep, or before the claims changed, is refused, not compared; and a re-run's
    report left by an earlier verify never stands in for the re-run's own."""
    from attn.experiment.spec import build_experiment
    from attn.store import processes

    (tmp_path / "base.yaml").write_text("task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n")
    data = {"name": "w", "base": "base.yaml", "grid": {"model.d_k": [8]}, "seeds": [0, 1]}
    experiment = build_experiment(data, tmp_path / "w.yaml", str(tmp_path / "runs"))
    experiment.directory.mkdir(parents=True)
    good = verifiable(experiment, {})
    stale = {**good, "claims": {"digest": "0" * 64}}
    mid_sweep = {**good, "cells": [{**good["cells"][0], "n": 1, "unfinished": {"running": 1}}]}
    for bad, field in ((stale, "other claims"), (mid_sweep, "covers 1 finished runs of the file's 2 (1 unfinished)")):
        runs.write_json(experiment.directory / "report.json", bad)
        with pytest.raises(runs.RunError, match=re.escape(field)):
            verify.verify(experiment, None, 1)
    left = verify.variant_directory(experiment, "float64") / "w"
    left.mkdir(parents=True)
    runs.write_json(left / "report.json", good)
    monkeypatch.setattr(processes, "run_child", lambda *a, **k: subprocess.CompletedProcess(a, 0, "", ""))
    with pytest.raises(runs.RunError, match="the float64 re-run failed"):  # its sweep wrote none: no report
        verify.rerun(experiment, "float64", [[]], {}, 1, lambda message: None)


def test_a_cell_the_materialized_re_run_linked_is_compared_where_it_was_made():
    reports = {
        "as run": {"cells": [cell(16, 4), cell(256, 2)]},
        "float64": {"cells": [cell(16, 4), cell(256, 2)]},
        "materialized": {"cells": [cell(16, 4), cell(256, 2)]},
    }
    linked = {"materialized": {json.dumps([cell(16, 4)["settings"]], sort_keys=True)}}
    rows = verify.compare_cells(reports, linked)
    assert [r["learned"]["materialized"] for r in rows] == ["linked", "2/4"] and all(r["same"] for r in rows)
    said = record.cells_agreement(rows, 3)
    assert said.startswith("the same count in all three in 2 of 2 cells") and "(1 of them compared without" in said


def test_a_verification_says_which_re_runs_it_made_and_which_it_did_not():
    platforms = {"as run": {}, "float64": {}, "Sandybridge": {}, "materialized": {}}
    assert record.reruns_said({"platforms": platforms}) == (
        "in float64, on a second BLAS kernel (Sandybridge) and with the materialized head"
    )
    partial = {"platforms": {"as run": {}, "Sandybridge": {}}, "materialized": "no cell runs width-free"}
    said = record.reruns_said(partial)
    assert said.startswith("on a second BLAS kernel (Sandybridge) (the materialized re-run: no cell runs width-free)")
    assert said.endswith(", not yet in float64") and "kernel" not in said.split("not yet")[1]


def test_a_claim_restated_or_added_after_the_runs_says_so_in_the_results_text():
    changed = report({"a": "confirmed", "b": "confirmed", "c": "inconclusive"})
    frozen = {"a": "as frozen", "b": "changed", "c": "added after the runs began"}
    for e in changed["expectations"]:
        e["frozen"] = frozen[e["id"]]
    rows = [
        line
        for line in results_text.results_block(
            {results_text.HEADLINE: changed}, {}, publish.REPO, changes={}
        ).splitlines()
        if "| Claim" in line
    ]
    assert [row.split(" | ")[1] for row in rows] == [
        "confirmed",
        "confirmed (changed)",
        "inconclusive (added after the runs began)",
    ]
    assert results_text.verdict_lines(changed)[1] == "- **confirmed** — claim b (`b` (changed))"


def test_results_from_several_code_states_say_so_beside_their_verdicts():
    mixed = report({"a": "confirmed"})
    mixed["description"] = "Where the claim stops holding, 1: what it tests"
    mixed["platform"]["attn_commit"] = ["abc1234", "def5678-dirty", "None"]  # an older report: its commits alone
    assert results_text.code_states_said(mixed) == "runs from 3 code states, 2 of them uncommitted or unrecorded"
    assert (
        results_text.code_states_said({**mixed, "code_states": {"abc1234": 3, "0123abc": 1}})
        == "runs from 2 code states"
    )
    assert (
        results_text.code_states_said({**mixed, "code_states": {"abc1234-dirty": 4}})
        == "runs from uncommitted or unrecorded code"
    )
    assert results_text.code_states_said({**mixed, "code_states": {"abc1234": 4}}) == ""
    block = results_text.results_block(
        {results_text.HEADLINE: report({"h": "confirmed"}), "edge": mixed}, {}, publish.REPO, changes={}
    )
    assert (
        "- (1) [`edge`](experiments/results/edge/report.md) — what it tests (runs from "
        "3 code states, 2 of them uncommitted or unrecorded): 1 confirmed; not yet verified" in block
    )


def test_a_claim_a_re_run_flipped_is_named_with_each_verdict_and_where_it_came(tmp_path):
    (tmp_path / "edge").mkdir()
    runs.write_json(
        tmp_path / "edge" / "verify.json",
        {
            "experiment": "edge",
            "platforms": {"as run": {}, "float64": {}, "Sandybridge": {}},
            "agree": False,
            "cells": [],
            "unchanged": {},
            "expectations": [
                {
                    "id": "a",
                    "agree": True,
                    "verdicts": {"as run": "confirmed", "float64": "confirmed", "Sandybridge": "confirmed"},
                },
                {
                    "id": "b",
                    "agree": False,
                    "verdicts": {"as run": "inconclusive", "float64": "confirmed", "Sandybridge": "inconclusive"},
                },
            ],
        },
    )
    flips = "`b`: inconclusive as run and in Sandybridge, confirmed in float64"
    verifications = publish.read_verifications(tmp_path)
    assert f"some verdicts differ ({flips})" in results_text.verification_line("edge", verifications["edge"])
    edge = {
        **report({"a": "confirmed", "b": "inconclusive"}),
        "description": "Where the claim stops holding, 1: what it tests",
        "code_states": {"abc1234": 4},
    }
    block = results_text.results_block(
        {results_text.HEADLINE: report({"h": "confirmed"}), "edge": edge}, verifications, publish.REPO, changes={}
    )
    assert "1 confirmed, 1 inconclusive; re-runs differ on `b`" in block


def test_a_report_of_an_earlier_design_of_its_file_says_so_and_one_of_the_design_now_does_not(tmp_path):
    write_experiment_file(tmp_path, "sqrt_dk", runs=4)
    write_experiment_file(tmp_path, "edge", runs=6)
    edge = {**report({"e": "confirmed"}), "description": "Where the claim stops holding, 1: an edge."}
    reports = {"sqrt_dk": report({"h": "confirmed"}), "edge": edge, "gone": report({"g": "confirmed"})}
    changes = results_text.design_changes(reports, tmp_path)
    assert set(changes) == {"edge", "gone"} and facts_in(changes["edge"], "edge.yaml", "6 runs, not 4")
    digested = {**report({"h": "confirmed"}), "claims": {"digest": "0" * 64}}  # claims other than the file's now
    assert facts_in(results_text.design_changes({"sqrt_dk": digested}, tmp_path)["sqrt_dk"], "other claims or seeds")
    block = results_text.results_block(reports, {}, tmp_path)
    text = results_text.experiments_readme(reports, {}, tmp_path / "experiments" / "results", tmp_path)
    edge_line = next(line for line in block.splitlines() if line.startswith("- (1) [`edge`]"))
    assert "an earlier design of the file, re-run pending" in edge_line
    assert facts_in(text.split("## edge")[1], "earlier design", "6 runs, not 4", "attn sweep experiments/edge.yaml")
    assert "runs of an earlier design" not in text.split("## edge")[0]  # sqrt_dk: its file asks for the runs it has


def test_every_experiments_text_says_which_cells_share_a_seeds_initial_draws_from_its_report_or_else_its_file(
    tmp_path,
):
    """Issue 45 item 5: a report made before reports said it takes the fact from its file, where the design is the
    file's; a report that says it is taken at its word; a report of an earlier design says nothing it cannot know."""
    write_experiment_file(tmp_path, "sqrt_dk", runs=4)
    (tmp_path / "configs" / "wide.yaml").write_text("task: {name: retrieval, n_pairs: 4}\ntrain: {steps: 2}\n")
    for name, widths in (("wide", [65536, 1048576]), ("narrow", [256, 1024])):
        (tmp_path / "experiments" / f"{name}.yaml").write_text(
            json.dumps(
                {
                    "name": name,
                    "base": "../configs/wide.yaml",
                    "grid": {"model.d_k": widths, "model.scale": ["sqrt"]},
                    "seeds": [0, 1],
                }
            )
        )
    reports = {name: report({}) for name in ("sqrt_dk", "wide", "narrow")}

    def said(reports, changes=None) -> dict[str, str]:
        text = results_text.experiments_readme(reports, {}, tmp_path / "experiments" / "results", tmp_path, changes)
        return {part.split("\n")[0]: part for part in text.split("## ")[1:]}

    parts = said(reports)
    assert facts_in(parts["wide"], "Not independent", "at d_k 65536, 1048576")
    assert "Not independent" not in parts["narrow"] and "Not independent" not in parts["sqrt_dk"]
    assert "Not independent" not in said(reports, changes={"wide": "redesigned"})["wide"]
    told = {**reports, "narrow": {**reports["narrow"], "shared_initial_draws": [16384, 1048576]}}
    assert facts_in(said(told)["narrow"], "at d_k 16384, 1048576")
    assert "Not independent" not in said({**told, "wide": {**reports["wide"], "shared_initial_draws": []}})["wide"]


def test_a_claim_edited_after_its_runs_is_marked_and_a_corrected_description_used_where_the_design_is_the_same(
    tmp_path,
):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny.yaml").write_text(
        "task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n"
    )
    (tmp_path / "experiments").mkdir()
    claim = {
        "id": "a",
        "claim": "claim a",
        "stat": "success_rate",
        "arm": {"model.scale": "sqrt"},
        "above": 0.5,
        "edited_after_runs": "weakened from 0.9 after the runs of abc1234",
    }
    (tmp_path / "experiments" / "sqrt_dk.yaml").write_text(
        json.dumps(
            {
                "name": "sqrt_dk",
                "description": "The design, its words corrected since.",
                "base": "../configs/tiny.yaml",
                "grid": {"model.d_k": [8], "model.scale": ["sqrt"]},
                "seeds": [0, 1, 2, 3],
                "report": {"x": "model.d_k", "arm": "model.scale", "expect": [claim]},
            }
        )
    )
    reports = {"sqrt_dk": report({"a": "confirmed", "b": "inconclusive"})}
    assert results_text.design_changes(reports, tmp_path) == {}
    block = results_text.results_block(reports, {}, tmp_path)
    assert "| Claim a | confirmed (edited after its runs) |" in block and "| Claim b | inconclusive |" in block
    text = results_text.experiments_readme(reports, {}, tmp_path / "experiments" / "results", tmp_path)
    assert facts_in(
        text, "(`a`; edited after runs of its seeds had been seen", "weakened from 0.9 after the runs of abc1234"
    )
    assert "- **inconclusive** — claim b (`b`)" in text
    assert "The design, its words corrected since." in text and "what it tests" not in text  # same runs and claims
    assert "edited after" not in results_text.results_block(reports, {}, tmp_path, changes={"sqrt_dk": "redesigned"})


def test_the_text_alone_is_written_from_what_is_published_and_takes_no_name(tmp_path, monkeypatch, capsys):
    from attn import cli

    repo = tmp_path / "repo"
    publish_into(repo, monkeypatch, f"# attn\n\n{results_text.RESULTS_BEGIN}\nold\n{results_text.RESULTS_END}\n")
    (repo / "experiments" / "results" / "sqrt_dk").mkdir(parents=True)
    runs.write_json(
        repo / "experiments" / "results" / "sqrt_dk" / "report.json",
        report({"a": "confirmed"}, headline="The published paragraph."),
    )
    before = sorted(p.relative_to(repo) for p in (repo / "experiments" / "results").rglob("*"))
    assert cli.main(["publish", "--text-only"]) == 0
    assert sorted(p.relative_to(repo) for p in (repo / "experiments" / "results").rglob("*")) == before
    assert "| Claim a | confirmed |" in (repo / "README.md").read_text()
    assert "The published paragraph." in (repo / "experiments" / "README.md").read_text()
    capsys.readouterr()
    assert cli.main(["publish", "--text-only", "sqrt_dk"]) == 2
    assert facts_in(capsys.readouterr().err, "--text-only", "sqrt_dk", "NAME")
    assert cli.main(["publish", "--text-only", "--verification-only"]) == 2
    assert facts_in(capsys.readouterr().err, "--text-only", "--verification-only")


def as_run_setup(tmp_path, monkeypatch):
    """An experiment of a width-free cell that can be materialized and one too wide to be, two seeds each,
    whose report is published alone, its runs gone; and a verify whose re-runs each write a report that
    agrees, made by other code, where the materialized re-run left one run of the wide cell on its
    published path; the passes each re-run was given, by variant."""
    from attn.experiment.spec import build_experiment
    from attn.text import settings_json

    (tmp_path / "base.yaml").write_text("task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n")
    data = {
        "name": "w",
        "base": "base.yaml",
        "grid": {"model.d_k": [256, 2 * verify.MATERIALIZED_WIDTH]},
        "seeds": [0, 1],
    }
    experiment = build_experiment(data, tmp_path / "w.yaml", str(tmp_path / "runs"))

    def with_seeds(made: dict, paths: dict) -> dict:  # paths: d_k -> each seed's path digest
        cells = [
            {
                **made["cells"][0],
                "settings": settings_json(c.settings),
                "n": 2,
                "seeds": [
                    {"seed": seed, "final_loss": 0.1, "path": path}
                    for seed, path in enumerate(paths[c.config.model.d_k])
                ],
            }
            for c in experiment.cells
            if c.seed == 0
        ]
        return {**made, "cells": cells}

    as_run_paths = {256: ["a", "b"], 2 * verify.MATERIALIZED_WIDTH: ["c", "d"]}
    published = tmp_path / "results" / "w"
    published.mkdir(parents=True)
    runs.write_report_json(published, with_seeds(verifiable(experiment, {"a": "confirmed"}), as_run_paths))
    passes = {}

    def rerun(experiment, variant, variant_passes, env, workers, progress):
        passes[variant] = variant_passes
        directory = tmp_path / variant
        directory.mkdir(exist_ok=True)
        made = verifiable(experiment, {"a": "confirmed"})
        made["platform"] = {**made["platform"], "attn_commit": ["def5678"]}
        paths = {256: ["e", "f"], 2 * verify.MATERIALIZED_WIDTH: ["c", "g"]}  # seed 0 of the wide cell: as run
        runs.write_report_json(directory, with_seeds(made, paths))
        return directory

    monkeypatch.setattr(verify, "rerun", rerun)
    monkeypatch.setattr(verify, "second_kernel", lambda requested: "Sandybridge")
    return experiment, published, passes


def test_verify_takes_a_published_report_as_run_and_makes_the_runs_it_cannot_link(tmp_path, monkeypatch):
    """With --as-run a published report is the reference, its runs not here: the materialized re-run
    makes as they ran the cells it would have linked (their pass has no width_free=false), compares
    them, counts those that took the published path, and says so."""
    experiment, published, passes = as_run_setup(tmp_path, monkeypatch)
    with pytest.raises(runs.RunError, match="no report yet"):
        verify.verify(experiment, None, 1)  # the experiment's own report: none, its runs are gone
    with pytest.raises(runs.RunError, match="expected a directory holding a report.json"):
        verify.verify(experiment, None, 1, as_run=tmp_path)
    result = verify.verify(experiment, None, 1, as_run=published)
    assert result["as_run"] == verify.as_run_record(published / "report.json", True)
    materialized = [" ".join(p) for p in passes["materialized"]]
    assert len(materialized) == 2 and sum("model.width_free=false" in p for p in materialized) == 1
    assert facts_in(result["materialized"], "the other 2 runs", "2 not here as run, so made again as they ran")
    assert "linked" not in result["materialized"]
    assert result["remade"] == {"same": 1, "runs": 2}, "over the wide cell's two runs, remade, alone"
    assert result["unchanged"]["materialized"] == {"same": 0, "runs": 2}, "over the materialized cell's alone"
    assert all(record.LINKED not in c["learned"].values() for c in result["cells"]), "remade cells are compared"
    text = record.verify_markdown(result)
    assert f"As run: {result['as_run']['report']}" in text and "1 of 2 took bit for bit" in text
    assert "The re-runs ran attn def5678" in text and "(abc1234)" in text


def test_verify_of_a_published_report_refuses_runs_linked_from_another_sweep(tmp_path, monkeypatch):
    """Runs an earlier verify of the experiment's own sweep linked in are not the published report's."""
    experiment, published, _ = as_run_setup(tmp_path, monkeypatch)
    wide = next(c for c in experiment.cells if c.config.model.d_k > verify.MATERIALIZED_WIDTH)
    (experiment.directory / wide.name).mkdir(parents=True)
    runs.write_json(experiment.directory / wide.name / "summary.json", {"status": "completed"})
    target = verify.variant_directory(experiment, "materialized") / experiment.name
    assert verify.link_finished_runs(experiment, target, frozenset({wide.name})) == {wide.name}
    with pytest.raises(runs.RunError) as info:
        verify.verify(experiment, None, 1, as_run=published)
    assert facts_in(str(info.value), str(target), "1 runs linked from", str(published / "report.json"))


def test_the_runs_the_materialized_re_run_keeps_are_said_linked_or_made_again():
    assert verify.reused_said(frozenset(), frozenset()) == ""
    mixed = verify.reused_said(frozenset({"a", "b", "c"}), frozenset({"a"}))
    assert facts_in(mixed, "the other 3 runs", "1 linked as they ran", "2 not here as run, so made again")


def test_a_run_remade_where_one_was_linked_is_not_counted_linked(tmp_path):
    from attn.experiment.spec import build_experiment

    (tmp_path / "base.yaml").write_text("task: {name: retrieval, n_pairs: 4}\nmodel: {d_model: 8}\ntrain: {steps: 2}\n")
    experiment = build_experiment(
        {"name": "w", "base": "base.yaml", "grid": {"model.d_k": [8]}, "seeds": [0]},
        tmp_path / "w.yaml",
        str(tmp_path / "runs"),
    )
    name = experiment.cells[0].name
    target = tmp_path / "verify" / "w"
    for directory in (experiment.directory / name, target / name):  # the same files, not links of each other
        directory.mkdir(parents=True)
        runs.write_json(directory / "summary.json", {"status": "completed"})
    assert verify.link_finished_runs(experiment, target, frozenset({name})) == frozenset()


def test_a_verification_is_published_only_beside_the_report_it_verified(tmp_path, monkeypatch):
    """publish refuses a verification of another report before touching anything, in either flow;
    --verification-only copies a published report's verification alone, its report and figures kept."""
    repo = tmp_path / "repo"
    published = publish_into(repo, monkeypatch) / "sqrt_dk"
    published.mkdir(parents=True)
    runs.write_json(published / "report.json", report({"a": "confirmed"}))
    (published / "headline.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    runs_dir = tmp_path / "runs"
    (runs_dir / "sqrt_dk").mkdir(parents=True)
    runs.write_json(runs_dir / "sqrt_dk" / "report.json", report({"a": "inconclusive"}))  # a newer sweep's
    (runs_dir / "verify").mkdir(parents=True)
    (runs_dir / "verify" / "sqrt_dk.md").write_text("Every verdict agrees.\n")
    before = {p.name: p.read_bytes() for p in published.iterdir()}, (repo / "README.md").read_text()
    for as_run, refused in ((runs_dir / "sqrt_dk" / "report.json", True), (published / "report.json", False)):
        runs.write_json(
            runs_dir / "verify" / "sqrt_dk.json",
            {
                **verification({"float64": "confirmed"}, experiment="sqrt_dk"),
                "as_run": verify.as_run_record(as_run, True),
            },
        )
        if refused:
            with pytest.raises(runs.RunError) as info:
                publish.publish(["sqrt_dk"], runs_dir, verification_only=True)
            assert facts_in(str(info.value), "sqrt_dk.json:", str(published / "report.json"))
            assert ({p.name: p.read_bytes() for p in published.iterdir()}, (repo / "README.md").read_text()) == before
        else:
            with pytest.raises(runs.RunError, match="verified .*, not .*runs/sqrt_dk/report.json"):
                publish.publish(["sqrt_dk"], runs_dir)  # the normal flow: beside the sweep's report, refused
            assert ({p.name: p.read_bytes() for p in published.iterdir()}, (repo / "README.md").read_text()) == before
            publish.publish(["sqrt_dk"], runs_dir, verification_only=True)
    assert {p.name for p in published.iterdir()} == {"report.json", "headline.png", "verify.md", "verify.json"}
    assert json.loads((published / "verify.json").read_text())["as_run"]["given"] is True
    for made in (runs_dir / "verify").iterdir():
        made.unlink()
    with pytest.raises(runs.RunError, match="sqrt_dk.json: no verification of sqrt_dk"):
        publish.publish(["sqrt_dk"], runs_dir, verification_only=True)


def test_a_reports_digest_leaves_out_the_experiment_files_path_as_typed(tmp_path):
    a, b, c = (tmp_path / f"{x}.json" for x in "abc")
    runs.write_json(a, {**report({"a": "confirmed"}), "file": "experiments/w.yaml"})
    runs.write_json(b, {**report({"a": "confirmed"}), "file": "../attn/experiments/w.yaml"})
    runs.write_json(c, {**report({"a": "inconclusive"}), "file": "experiments/w.yaml"})
    assert verify.report_digest(a) == verify.report_digest(b) != verify.report_digest(c)


def test_two_verifications_of_one_report_merge_into_one_of_every_re_run_either_made():
    earlier = verification(
        {"float64": "confirmed", "Sandybridge": "confirmed"}, cells={16: {"float64": "4/4", "Sandybridge": "4/4"}}
    )
    later = {
        **verification({"materialized": "inconclusive"}, cells={16: {"materialized": "3/4"}}),
        "materialized": "model.d_k 16 re-run with model.width_free=false",
        "remade": {"same": 2, "runs": 2},
    }
    merged = record.merge(earlier, later)
    assert list(merged["platforms"]) == ["as run", "float64", "Sandybridge", "materialized"]
    assert merged["expectations"][0]["verdicts"] == {
        "as run": "confirmed",
        "float64": "confirmed",
        "Sandybridge": "confirmed",
        "materialized": "inconclusive",
    }
    assert merged["agree"] is False and merged["cells"][0]["same"] is False
    assert merged["cells"][0]["learned"]["materialized"] == "3/4" and set(merged["unchanged"]) == {
        "float64",
        "Sandybridge",
        "materialized",
    }
    assert merged["materialized"].startswith("model.d_k 16") and merged["remade"] == {"same": 2, "runs": 2}
    again = record.merge(later, verification({"float64": "confirmed"}))  # a later float64 replaces nothing else
    assert again["materialized"].startswith("model.d_k 16") and "remade" in again
    assert "re-run in float64" in record.verify_markdown(merged).lower()
    for other in (verification({"float64": "confirmed"}, digest="d2"), verification({}, experiment="v")):
        with pytest.raises(runs.RunError, match="different reports as run"):
            record.merge(earlier, other)
    with pytest.raises(runs.RunError, match="later verification of w does not say which report"):
        record.merge(earlier, {**later, "as_run": None})


def test_a_merge_takes_the_later_of_a_re_run_both_made_and_leaves_linked_cells_out():
    earlier = verification(
        {"float64": "confirmed", "materialized": "confirmed"},
        cells={16: {"float64": "3/4", "materialized": record.LINKED}},
    )
    redone = {
        **verification({"float64": "refuted"}, cells={16: {"float64": "4/4"}}),
        "unchanged": {"float64": {"same": 1, "runs": 4}},
    }
    merged = record.merge(earlier, redone)
    assert merged["expectations"][0]["verdicts"]["float64"] == "refuted" and merged["unchanged"]["float64"]["same"] == 1
    assert merged["cells"][0]["same"] is True, "a linked count is no test: as run and float64 both 4/4"
    not_asked = record.merge(
        verification({}, cells={}), {**verification({}), "materialized": "no cell runs width-free"}
    )
    assert not_asked["materialized"] == "no cell runs width-free"
    assert "remade" not in record.merge(
        {**earlier, "remade": {"same": 1, "runs": 1}}, verification({"materialized": "confirmed"})
    )


def test_a_verification_read_back_from_json_is_written_in_its_order():
    made = {
        **verification({"float64": "confirmed", "Sandybridge": "confirmed", "materialized": "confirmed"}),
        "unchanged": {"float64": {"same": 0, "runs": 4}, "Sandybridge": {"same": 1, "runs": 4}},
    }
    read_back = json.loads(json.dumps(made, sort_keys=True))
    text = record.verify_markdown(read_back)
    assert "re-run (float64, Sandybridge, materialized)" in text.splitlines()[0]
    assert "| expectation | as run | float64 | Sandybridge | materialized | agree |" in text
    assert "float64 0 of 4, Sandybridge 1 of 4" in text


def test_a_verification_published_alone_keeps_the_re_runs_published_before_of_the_same_report(tmp_path, monkeypatch):
    results = publish_into(tmp_path / "repo", monkeypatch)
    published = results / "sqrt_dk"
    published.mkdir(parents=True)
    runs.write_json(published / "report.json", report({"a": "confirmed"}))
    digest = verify.report_digest(published / "report.json")
    runs.write_json(published / "verify.json", verification({"float64": "confirmed"}, digest, experiment="sqrt_dk"))
    runs_dir = tmp_path / "runs"
    (runs_dir / "verify").mkdir(parents=True)
    (runs_dir / "verify" / "sqrt_dk.md").write_text("made by verify\n")
    runs.write_json(
        runs_dir / "verify" / "sqrt_dk.json", verification({"Sandybridge": "confirmed"}, digest, experiment="sqrt_dk")
    )
    publish.publish(["sqrt_dk"], runs_dir, verification_only=True)
    kept = json.loads((published / "verify.json").read_text())
    assert set(kept["platforms"]) == {"as run", "float64", "Sandybridge"} and kept["agree"]
    assert "| expectation | as run | float64 | Sandybridge | agree |" in (published / "verify.md").read_text()


def test_a_verification_published_alone_never_drops_re_runs_it_cannot_be_merged_with(tmp_path, monkeypatch):
    """The verifications published before as_run was recorded say no report: one made of fewer re-runs
    may not replace them; one of them all may."""
    results = publish_into(tmp_path / "repo", monkeypatch)
    published = results / "sqrt_dk"
    published.mkdir(parents=True)
    runs.write_json(published / "report.json", report({"a": "confirmed"}))
    older = verification({"float64": "confirmed", "Sandybridge": "confirmed"}, experiment="sqrt_dk")
    runs.write_json(published / "verify.json", {**older, "as_run": None})
    runs_dir = tmp_path / "runs"
    (runs_dir / "verify").mkdir(parents=True)
    digest = verify.report_digest(published / "report.json")
    runs.write_json(
        runs_dir / "verify" / "sqrt_dk.json", verification({"float64": "confirmed"}, digest, experiment="sqrt_dk")
    )
    with pytest.raises(runs.RunError) as info:
        publish.publish(["sqrt_dk"], runs_dir, verification_only=True)
    assert facts_in(str(info.value), "verify.json:", "Sandybridge re-runs", "cannot be merged")
    assert json.loads((published / "verify.json").read_text())["as_run"] is None, "left as it was"
    runs.write_json(
        runs_dir / "verify" / "sqrt_dk.json", {**older, "as_run": {"report": "r.json", "sha256": digest, "given": True}}
    )
    publish.publish(["sqrt_dk"], runs_dir, verification_only=True)
    assert json.loads((published / "verify.json").read_text())["as_run"]["sha256"] == digest


def test_a_boundary_experiment_verified_in_part_says_which_re_runs_it_still_lacks(tmp_path):
    (tmp_path / "mask_self").mkdir()
    runs.write_json(
        tmp_path / "mask_self" / "verify.json", verification({"float64": "confirmed"}, experiment="mask_self")
    )
    boundary = {
        **report({"masked-a": "confirmed"}),
        "description": "Where the claim stops holding, 7: the query's own position.",
    }
    block = results_text.results_block(
        {"sqrt_dk": report({"a": "confirmed"}), "mask_self": boundary},
        publish.read_verifications(tmp_path),
        publish.REPO,
        changes={},
    )
    line = next(x for x in block.splitlines() if x.startswith("- (7) [`mask_self`"))
    assert line.endswith(
        "1 confirmed; every verdict agrees so far, not yet re-run on a second BLAS kernel or with the materialized head"
    )


# ---------------------------------------------------------------------------
# Issue 46: what publish reads and writes at its edges
# ---------------------------------------------------------------------------
HAND_WRITTEN = "## The model\n\nHand-written, never generated.\n\n## Speed\n\nAlso by hand.\n\n"


def published_repo(tmp_path, monkeypatch):
    """repo/ with two experiments (sqrt_dk, edge) published from runs/ (reports, figures, a benchmark), its README
    a results block and a bench block among hand-written sections; (repo, runs_dir, the published results)."""
    repo, runs_dir = tmp_path / "repo", tmp_path / "runs"
    readme = (
        f"# attn\n\nWhat and why.\n\n{results_text.RESULTS_BEGIN}\nnone yet\n{results_text.RESULTS_END}\n\n"
        f"{HAND_WRITTEN}"
        f"{results_text.BENCH_BEGIN}\nnone yet\n{results_text.BENCH_END}\n\nThe end.\n"
    )
    results = publish_into(repo, monkeypatch, readme)
    write_experiment_file(repo, "edge")
    for name in ("sqrt_dk", "edge"):
        (runs_dir / name).mkdir(parents=True)
        runs.write_json(runs_dir / name / "report.json", report({f"{name}-a": "confirmed"}))
        (runs_dir / name / "report.md").write_text(f"# {name}\n")
        (runs_dir / name / "headline.png").write_bytes(b"\x89PNG " + name.encode())
    (runs_dir / "bench").mkdir()
    runs.write_json(runs_dir / "bench" / "bench-20261201-100000.json", bench_result(0.6, 1.0))
    (runs_dir / "bench" / "bench-20261201-100000.md").write_text("# bench\n")
    publish.publish(None, runs_dir)
    return repo, runs_dir, results


def snapshot(repo) -> dict[str, bytes]:
    """Every file publish writes or keeps: experiments/ (its lock aside) and README.md."""
    files = {p: p.read_bytes() for p in sorted((repo / "experiments").rglob("*")) if p.is_file() and p.name != ".lock"}
    return {
        **{str(p.relative_to(repo)): data for p, data in files.items()},
        "README.md": (repo / "README.md").read_bytes(),
    }


def outside_blocks(readme: str) -> list[str]:
    """README's text outside its generated blocks, piece by piece."""
    pieces = re.split(
        "|".join(
            re.escape(begin) + ".*?" + re.escape(end)
            for begin, end in (
                (results_text.RESULTS_BEGIN, results_text.RESULTS_END),
                (results_text.BENCH_BEGIN, results_text.BENCH_END),
            )
        ),
        readme,
        flags=re.S,
    )
    return pieces


HOSTILE = (
    f"{results_text.BENCH_BEGIN} {results_text.RESULTS_END} {results_text.BENCH_END} <!-- x --> "
    "<script>alert(1)</script> "
    "<img src=x onerror=alert(2)> [click](javascript:alert(3)) <javascript:alert(4)>\n[ref]: javascript:alert(5)\n"
    "\n## A heading of its own"
)


def test_report_and_experiment_file_text_holding_block_markers_and_html_never_leaves_its_place(tmp_path, monkeypatch):
    """A claim, a headline, an experiment file's description and a benchmark's field holding README's block
    markers, HTML and javascript: links, through publish into README.md and experiments/README.md: the
    README is unchanged outside its blocks, nothing in either file is markup or a link, and publishing the
    text again changes nothing (no block swallowed, none grown)."""
    repo, runs_dir, results = published_repo(tmp_path, monkeypatch)
    readme_before = (repo / "README.md").read_text()
    hostile = report({"a": "confirmed"}, headline=f"Scope: {HOSTILE}. The paragraph {HOSTILE}")
    hostile["expectations"][0]["claim"] = f"a claim {HOSTILE}"
    runs.write_json(runs_dir / "sqrt_dk" / "report.json", hostile)
    (repo / "experiments" / "edge.yaml").write_text(
        (repo / "experiments" / "edge.yaml").read_text() + f"description: {json.dumps(HOSTILE)}\n"
    )
    bench = bench_result(0.6, 1.0)
    bench["machine"]["cpu"] = HOSTILE
    runs.write_json(runs_dir / "bench" / "bench-20261201-110000.json", bench)
    (runs_dir / "bench" / "bench-20261201-110000.md").write_text("# bench\n")
    publish.publish(None, runs_dir)
    readme, experiments_text = (repo / "README.md").read_text(), (repo / "experiments" / "README.md").read_text()
    assert outside_blocks(readme) == outside_blocks(readme_before) and readme.count(HAND_WRITTEN) == 1
    for marker in (
        results_text.RESULTS_BEGIN,
        results_text.RESULTS_END,
        results_text.BENCH_BEGIN,
        results_text.BENCH_END,
    ):
        assert readme.count(marker) == 1 and marker not in experiments_text
    for text in (readme, experiments_text):
        assert "A claim" in readme and "<script" not in text and "<img" not in text and "<!-- x" not in text
        assert "](javascript:" not in text and "<javascript:" not in text and "\n[ref]:" not in text
        assert "\n## A heading of its own" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in readme, "shown as text, not dropped"
    for _ in range(2):
        publish.publish_text()
        assert (repo / "README.md").read_text() == readme
        assert (repo / "experiments" / "README.md").read_text() == experiments_text


def test_a_block_is_found_by_its_marker_lines_and_generated_text_holding_a_marker_is_refused():
    readme = (
        f"# attn\n\nThe block opens at `{results_text.RESULTS_BEGIN}`.\n\n{results_text.RESULTS_BEGIN}\nold\n"
        f"{results_text.RESULTS_END}\n\nafter, quoting {results_text.RESULTS_END}\n"
    )
    assert results_text.with_block(
        readme, results_text.RESULTS_BEGIN, results_text.RESULTS_END, "new"
    ) == readme.replace(f"{results_text.RESULTS_BEGIN}\nold\n", f"{results_text.RESULTS_BEGIN}\n\nnew\n\n")
    with pytest.raises(runs.RunError, match="holds a block marker"):
        results_text.with_block(
            readme, results_text.RESULTS_BEGIN, results_text.RESULTS_END, f"x\n{results_text.BENCH_END}\n"
        )
    twice = readme + f"\n{results_text.RESULTS_END}\n"
    with pytest.raises(runs.RunError) as info:
        results_text.with_block(twice, results_text.RESULTS_BEGIN, results_text.RESULTS_END, "new")
    assert facts_in(str(info.value), "README.md", "found 1 and 2", "git checkout -- README.md")


def test_a_verification_made_by_uncommitted_code_is_refused_unless_allowed_and_then_said(tmp_path, monkeypatch):
    repo, runs_dir, results = published_repo(tmp_path, monkeypatch)
    (runs_dir / "verify").mkdir()
    dirty = verification({"float64": "confirmed"}, experiment="sqrt_dk")
    dirty["platforms"]["float64"]["attn_commit"] = ["abc1234-dirty"]
    before = snapshot(repo)
    for verification_only, report_dir in ((False, runs_dir / "sqrt_dk"), (True, results / "sqrt_dk")):
        runs.write_json(
            runs_dir / "verify" / "sqrt_dk.json",
            {**dirty, "as_run": verify.as_run_record(report_dir / "report.json", verification_only)},
        )
        with pytest.raises(publish.MixedCode) as info:
            publish.publish(["sqrt_dk"], runs_dir, verification_only=verification_only)
        assert facts_in(str(info.value), "sqrt_dk.json", "float64: abc1234-dirty")
        assert snapshot(repo) == before and not results.with_name(".results.new").exists()
    publish.publish(["sqrt_dk"], runs_dir, verification_only=True, allow_mixed=True)
    said = "by uncommitted or unrecorded code (float64: abc1234-dirty)"
    assert said in (repo / "experiments" / "README.md").read_text() and said in (repo / "README.md").read_text()
    clean = {**dirty, "as_run": verify.as_run_record(results / "sqrt_dk" / "report.json", True)}
    clean["platforms"] = {**dirty["platforms"], "float64": {"attn_commit": ["abc1234"]}}
    runs.write_json(runs_dir / "verify" / "sqrt_dk.json", clean)
    publish.publish(["sqrt_dk"], runs_dir, verification_only=True)
    assert "uncommitted" not in (repo / "experiments" / "README.md").read_text()


def damaged(path, kind: str) -> None:
    text = path.read_bytes()
    data = json.loads(text)
    path.write_bytes(
        {
            "truncated": lambda: text[: len(text) // 2],
            "a list": lambda: b"[1, 2]",
            "empty": lambda: b"{}",
            "no headline": lambda: json.dumps({k: v for k, v in data.items() if k != "headline"}).encode(),
            "expectations as text": lambda: json.dumps({**data, "expectations": "x"}).encode(),
            "platform a number": lambda: json.dumps({**data, "platform": 5}).encode(),
            "a verdict a list": lambda: json.dumps(
                {**data, "expectations": [{**e, "verdict": [1]} for e in data.get("expectations", [])]}
            ).encode(),
            "not UTF-8": lambda: b"\xff\xfe" + text,
            "too deep": lambda: b"[" * 100000 + b"]" * 100000,
            "no machine": lambda: json.dumps({k: v for k, v in data.items() if k != "machine"}).encode(),
            "platforms a list": lambda: json.dumps({**data, "platforms": []}).encode(),
        }[kind]()
    )


REPORT_DAMAGE = [
    "truncated",
    "a list",
    "empty",
    "no headline",
    "expectations as text",
    "platform a number",
    "a verdict a list",
    "not UTF-8",
    "too deep",
]


@pytest.mark.parametrize(
    "where, kind, command",
    [
        *[("runs/sqrt_dk/report.json", kind, ["sqrt_dk"]) for kind in REPORT_DAMAGE],
        *[("experiments/results/edge/report.json", kind, ["sqrt_dk"]) for kind in REPORT_DAMAGE[:4] + ["not UTF-8"]],
        *[("experiments/results/edge/report.json", kind, ["--text-only"]) for kind in REPORT_DAMAGE[:4]],
        ("experiments/results/edge/report.json", "not UTF-8", ["--text-only"]),
        ("runs/bench/bench-20261201-100000.json", "no machine", ["sqrt_dk"]),
        ("runs/bench/bench-20261201-100000.json", "no machine", ["--bench"]),
        ("runs/bench/bench-20261201-100000.json", "a list", ["--bench"]),
        ("experiments/results/bench.json", "truncated", ["--text-only"]),
        ("experiments/results/bench.json", "no machine", ["--text-only"]),
        ("runs/verify/sqrt_dk.json", "platforms a list", ["sqrt_dk"]),
        ("runs/verify/sqrt_dk.json", "truncated", ["sqrt_dk", "--verification-only"]),
    ],
)
def test_a_damaged_json_file_gives_one_line_naming_it_and_nothing_is_staged_or_lost(
    tmp_path, monkeypatch, capsys, where, kind, command
):
    from attn import cli

    repo, runs_dir, results = published_repo(tmp_path, monkeypatch)
    if "verify" in where:  # a verification of the report it would go beside, but for its damage
        reported = (results if "--verification-only" in command else runs_dir) / "sqrt_dk" / "report.json"
        (runs_dir / "verify").mkdir()
        runs.write_json(
            runs_dir / "verify" / "sqrt_dk.json",
            {
                **verification({"float64": "confirmed"}, experiment="sqrt_dk"),
                "as_run": verify.as_run_record(reported, False),
            },
        )
    path = (runs_dir.parent if where.startswith("runs/") else repo) / where
    damaged(path, kind)
    before = snapshot(repo)
    capsys.readouterr()
    assert cli.main(["publish", *command, "--runs-dir", str(runs_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and err.count("\n") == 1
    assert snapshot(repo) == before and not results.with_name(".results.new").exists()


def test_symbolic_links_are_never_published_through_and_each_is_named_in_one_line(tmp_path, monkeypatch):
    repo, runs_dir, results = published_repo(tmp_path, monkeypatch)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    before = snapshot(repo)
    (runs_dir / "sqrt_dk" / "x.png").symlink_to(outside / "secret.txt")
    with pytest.raises(runs.RunError) as info:
        publish.publish(["sqrt_dk"], runs_dir)
    assert facts_in(str(info.value), str(runs_dir / "sqrt_dk" / "x.png"), "symbolic link")
    assert snapshot(repo) == before
    (runs_dir / "sqrt_dk" / "x.png").unlink()
    for link, target in (("evil", outside), ("edge/evil.png", outside / "secret.txt")):
        (results / link).symlink_to(target)
        for call in (lambda: publish.publish(["sqrt_dk"], runs_dir), publish.publish_text):
            with pytest.raises(runs.RunError) as info:
                call()
            assert facts_in(str(info.value), str(results / link), "symbolic link")
        assert (results / link).is_symlink() and (outside / "secret.txt").stat().st_nlink == 1
        (results / link).unlink()
    assert snapshot(repo) == before
    results.rename(tmp_path / "elsewhere")
    results.symlink_to(tmp_path / "elsewhere")
    for _ in range(2):
        with pytest.raises(runs.RunError) as info:
            publish.publish(["sqrt_dk"], runs_dir)
        assert facts_in(str(info.value), f"{results}: is a symbolic link")
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["bench.json", "bench.md", "edge", "sqrt_dk"]


def test_a_report_published_again_keeps_its_verification_and_another_report_does_not(tmp_path, monkeypatch):
    repo, runs_dir, results = published_repo(tmp_path, monkeypatch)
    (runs_dir / "verify").mkdir()
    runs.write_json(
        runs_dir / "verify" / "sqrt_dk.json",
        {
            **verification({"float64": "confirmed"}, experiment="sqrt_dk"),
            "as_run": verify.as_run_record(runs_dir / "sqrt_dk" / "report.json", False),
        },
    )
    publish.publish(["sqrt_dk"], runs_dir)
    (runs_dir / "verify" / "sqrt_dk.json").unlink()
    verified = (results / "sqrt_dk" / "verify.json").read_bytes()
    publish.publish(["sqrt_dk"], runs_dir)  # the same report, byte for byte
    assert (results / "sqrt_dk" / "verify.json").read_bytes() == verified
    assert (
        "Not yet re-run"
        not in (repo / "experiments" / "README.md").read_text().split("## sqrt_dk")[1].split("\n## ")[0]
    )
    runs.write_json(runs_dir / "sqrt_dk" / "report.json", report({"sqrt_dk-a": "inconclusive"}))
    publish.publish(["sqrt_dk"], runs_dir)  # another report: the verification is of the one it replaces
    assert not (results / "sqrt_dk" / "verify.json").exists()


def test_a_very_long_commit_is_shown_cut_where_publish_refuses_it(tmp_path, monkeypatch):
    repo, runs_dir, results = published_repo(tmp_path, monkeypatch)
    commit = "a" * 5000 + "-dirty"
    runs.write_json(
        runs_dir / "bench" / "bench-20261202-100000.json", {**bench_result(0.6, 1.0), "attn_commit": commit}
    )
    (runs_dir / "bench" / "bench-20261202-100000.md").write_text("# bench\n")
    with pytest.raises(publish.MixedCode) as info:
        publish.publish(None, runs_dir, bench_only=True)
    assert len(str(info.value)) < 400 and facts_in(str(info.value), "5006 characters")
    (runs_dir / "bench" / "bench-20261202-100000.json").unlink()
    note = f"Not one clean commit: 4 from uncommitted or unrecorded code ({commit})."
    runs.write_json(
        runs_dir / "sqrt_dk" / "report.json", {**report({}), "code_states": {commit: 4}, "code_state_note": note}
    )
    with pytest.raises(publish.MixedCode) as info:
        publish.publish(["sqrt_dk"], runs_dir)
    assert len(str(info.value)) < 400 and facts_in(str(info.value), "a… (", " characters)")


def test_a_report_made_again_on_seeds_published_before_is_said_a_re_run_with_the_verdicts_that_moved(
    tmp_path, monkeypatch
):
    repo = tmp_path / "repo"
    results = publish_into(repo, monkeypatch)
    run_dir = tmp_path / "runs" / "sqrt_dk"
    run_dir.mkdir(parents=True)

    def made(verdicts, digest, frozen_at, commit):
        data = report(verdicts)
        data["platform"]["attn_commit"] = [commit]
        claims = {"digest": digest, **({"frozen_at": frozen_at} if frozen_at else {})}
        runs.write_json(run_dir / "report.json", {**data, "claims": claims})
        publish.publish(["sqrt_dk"], tmp_path / "runs")
        history = results / "sqrt_dk" / "history.json"
        return [e["attn_commit"][0] for e in json.loads(history.read_text())] if history.exists() else []

    def findings():
        return (repo / "experiments" / "README.md").read_text()

    assert made({"a": "confirmed", "b": "confirmed"}, "d1", "2026-12-02T19:52:31Z", "5fa82fb") == []
    assert made({"a": "confirmed", "b": "confirmed"}, "d1", "2026-12-02T19:52:31Z", "5fa82fb") == []  # same runs
    assert made({"a": "confirmed", "b": "inconclusive"}, "d1", "2026-12-07T20:21:14Z", "f60fe01") == ["5fa82fb"]
    [earlier] = json.loads((results / "sqrt_dk" / "history.json").read_text())
    assert earlier["frozen_at"] == "2026-12-02T19:52:31Z" and earlier["verdicts"] == {
        "a": "confirmed",
        "b": "confirmed",
    }
    assert facts_in(findings(), "first run with attn 5fa82fb", "run 1 time before", "not a new test of its claims")
    assert (
        "`b` confirmed, now inconclusive (the same seeds again" in findings() and "`a` confirmed, now" not in findings()
    )
    assert "a re-run of seeds run before, on which `b` moved" in (repo / "README.md").read_text()
    assert made({"a": "confirmed", "b": "inconclusive"}, "d1", "2026-12-07T20:21:14Z", "f60fe01") == ["5fa82fb"]
    assert made({"a": "confirmed", "b": "confirmed"}, "d1", "2026-12-08T10:00:00Z", "1a2b3c4") == ["5fa82fb", "f60fe01"]
    assert facts_in(findings(), "first run with attn 5fa82fb", "run 2 times before")
    assert "`b` confirmed, inconclusive, now confirmed" in findings()
    # the first runs published again: the others are its earlier runs, never itself
    assert made({"a": "confirmed", "b": "confirmed"}, "d1", "2026-12-02T19:52:31Z", "5fa82fb") == ["f60fe01", "1a2b3c4"]
    assert made({"a": "confirmed"}, "d2", "2026-12-09T10:00:00Z", "1a2b3c4") == []  # another design: none of it
    assert "not a new test" not in findings()
    # reports that do not say when their claims were frozen: another report is other runs, the same one is not
    assert made({"a": "confirmed"}, "d3", None, "aaaaaaa") == []
    assert made({"a": "inconclusive"}, "d3", None, "bbbbbbb") == ["aaaaaaa"]
    assert made({"a": "inconclusive"}, "d3", None, "bbbbbbb") == ["aaaaaaa"]


def test_a_damaged_history_is_named_in_one_line_before_anything_is_replaced(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    results = publish_into(repo, monkeypatch)
    (results / "sqrt_dk").mkdir(parents=True)
    runs.write_json(results / "sqrt_dk" / "report.json", {**report({"a": "confirmed"}), "claims": {"digest": "d1"}})
    entry = {"frozen_at": None, "attn_commit": ["x"], "cpu": [], "blas": [], "verdicts": {"a": "maybe"}}
    runs.write_json(results / "sqrt_dk" / "history.json", [entry])
    run_dir = tmp_path / "runs" / "sqrt_dk"
    run_dir.mkdir(parents=True)
    runs.write_json(run_dir / "report.json", {**report({"a": "inconclusive"}), "claims": {"digest": "d1"}})
    monkeypatch.setattr(publish, "_stage", lambda *a: pytest.fail("staged before the history was checked"))
    before = (results / "sqrt_dk" / "report.json").read_bytes()
    with pytest.raises(runs.RunError) as err:
        publish.publish(["sqrt_dk"], tmp_path / "runs")
    assert facts_in(str(err.value), "history.json", "verdicts", "a verdict", "git checkout")
    assert (results / "sqrt_dk" / "report.json").read_bytes() == before


def test_a_damaged_published_report_is_replaced_keeping_the_history_beside_it(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    results = publish_into(repo, monkeypatch)
    (results / "sqrt_dk").mkdir(parents=True)
    (results / "sqrt_dk" / "report.json").write_text('{"cut short')
    entry = {"frozen_at": "t0", "attn_commit": ["x"], "cpu": [], "blas": [], "verdicts": {"a": "confirmed"}}
    runs.write_json(results / "sqrt_dk" / "history.json", [entry])
    run_dir = tmp_path / "runs" / "sqrt_dk"
    run_dir.mkdir(parents=True)
    runs.write_json(
        run_dir / "report.json", {**report({"a": "confirmed"}), "claims": {"digest": "d1", "frozen_at": "t2"}}
    )
    publish.publish(["sqrt_dk"], tmp_path / "runs")
    assert json.loads((results / "sqrt_dk" / "history.json").read_text()) == [entry]


def test_a_re_made_report_says_how_many_runs_took_the_earlier_runs_path_bit_for_bit(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    results = publish_into(repo, monkeypatch)
    run_dir = tmp_path / "runs" / "sqrt_dk"
    run_dir.mkdir(parents=True)

    def made(paths, frozen_at, cpu):
        data = {**report({"a": "confirmed"}), "claims": {"digest": "d1", "frozen_at": frozen_at}}
        data["platform"]["cpu"] = [cpu]
        seeds = [{"seed": s, "path": p, "final_loss": 0.1 if p else "inf"} for s, p in enumerate(paths)]
        runs.write_report_json(run_dir, {**data, "cells": [{"settings": {"model.d_k": 16}, "seeds": seeds}]})
        publish.publish(["sqrt_dk"], tmp_path / "runs")

    made(["p0", "p1", "p2", None], "2026-12-02T00:00:00Z", "Intel")
    made(["p0", "q1", "p2", "p3"], "2026-12-07T00:00:00Z", "AMD")  # two of the three finite in both kept
    [earlier] = json.loads((results / "sqrt_dk" / "history.json").read_text())
    assert earlier["paths_kept"] == {"same": 2, "runs": 3} and earlier["cpu"] == ["Intel"]
    assert (
        "(attn abc1234, Intel, openblas (Haswell kernel)), 2 of 3 took the same path bit for bit"
        in (repo / "experiments" / "README.md").read_text()
    )


def test_the_results_text_says_whether_every_report_comes_from_one_clean_commit_and_names_each_code_state():
    one = {name: {**report({}), "code_states": {"abc1234": 4}} for name in ("sqrt_dk", "edge")}
    assert "one clean commit, attn abc1234" in results_text.commits_said(one)
    two = {**one, "edge": {**one["edge"], "code_states": {"def5678": 3, "abc1234": 1}}, "old": report({})}
    said = results_text.commits_said(two)
    assert facts_in(said, "Not yet one clean commit", "3 reports", "2 code states", "def5678 (`edge`)")
    assert "abc1234 (`edge`, `old` and `sqrt_dk`)" in said  # a report without code_states: its platform's commit
    dirty = {"sqrt_dk": {**report({}), "code_states": {"abc1234-dirty": 4}}}
    assert facts_in(results_text.commits_said(dirty), "Not yet one clean commit", "1 code state of attn")
