"""Results text generated from reports: `attn publish` copies each report
into experiments/results/ and writes the results text from report.json
alone; `attn verify` compares verdicts across re-runs."""

import json

import pytest

from attn import publish, runs, verify


def report(verdicts: dict, headline="At each arm's own best lr, ...") -> dict:
    return {"description": "what it tests", "runs": 4, "headline": headline,
            "platform": {"attn_commit": ["abc1234"], "cpu": ["a CPU"], "blas": ["openblas (Haswell kernel)"],
                         "dtype": ["float32"]},
            "expectations": [{"id": i, "claim": f"claim {i}", "verdict": v} for i, v in verdicts.items()]}


def test_publish_copies_reports_and_writes_the_text_from_them(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "experiments").mkdir(parents=True)
    (repo / "experiments" / "sqrt_dk.yaml").write_text("name: sqrt_dk\n")
    readme = f"# attn\n\nbefore\n\n{publish.RESULTS_BEGIN}\nold numbers\n{publish.RESULTS_END}\n\nafter\n"
    (repo / "README.md").write_text(readme)
    monkeypatch.setattr(publish, "REPO", repo)
    monkeypatch.setattr(publish, "RESULTS", repo / "experiments" / "results")
    run_dir = tmp_path / "runs" / "sqrt_dk"
    run_dir.mkdir(parents=True)
    data = report({"a": "confirmed", "b": "inconclusive"}, headline="The generated paragraph, 7/10 seeds.")
    runs.write_json(run_dir / "report.json", data)
    (run_dir / "report.md").write_text("# the report")
    (run_dir / "headline.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    (tmp_path / "runs" / "verify").mkdir()
    (tmp_path / "runs" / "verify" / "sqrt_dk.md").write_text("table\n\nEvery verdict agrees.\n")
    written = publish.publish(None, tmp_path / "runs")
    results = repo / "experiments" / "results" / "sqrt_dk"
    assert {p.name for p in results.iterdir()} == {"report.json", "report.md", "headline.png", "verify.md"}
    assert json.loads((results / "report.json").read_text()) == data
    text = (repo / "README.md").read_text()
    assert text.startswith("# attn\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "old numbers" not in text
    assert "The generated paragraph, 7/10 seeds." in text and "**inconclusive** — claim b (`b`)" in text
    assert "every verdict agrees" in text
    assert "The generated paragraph, 7/10 seeds." in (repo / "experiments" / "README.md").read_text()
    assert repo / "README.md" in written


def test_publish_without_reports_or_a_results_block_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(publish, "REPO", tmp_path)
    (tmp_path / "experiments").mkdir()
    with pytest.raises(runs.RunError, match="no experiment has a report yet"):
        publish.publish(None, tmp_path / "runs")
    with pytest.raises(runs.RunError, match="README.md has no results block"):
        publish.with_results_block("# no block\n", report({}))


def test_verify_compares_every_verdict_and_names_the_flips():
    reports = {"as run": report({"a": "confirmed", "b": "inconclusive"}),
               "float64": report({"a": "confirmed", "b": "confirmed"}),
               "Sandybridge": report({"a": "confirmed", "b": "inconclusive"})}
    rows = verify.compare(reports)
    assert rows == [{"id": "a", "verdicts": {v: "confirmed" for v in reports}, "agree": True},
                    {"id": "b", "verdicts": {"as run": "inconclusive", "float64": "confirmed",
                                             "Sandybridge": "inconclusive"}, "agree": False}]
    text = verify.markdown({"experiment": "x", "platforms": {v: r["platform"] for v, r in reports.items()},
                            "expectations": rows, "agree": False})
    assert "| b | inconclusive | confirmed | inconclusive | NO |" in text and "too fine to make" in text
