"""The files a newcomer reads and runs: README and docs/ say what the code
does, their generated blocks are what `attn publish` makes from the
committed results, every link leads somewhere, and every shipped config
and experiment file loads."""

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY

import attn
from attn import publish, results_text
from attn.config.loading import load_config
from attn.experiment.spec import load_experiment

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
DOCS = sorted((REPO / "docs").glob("*.md"))


@functools.cache
def shipped_experiment(path: Path):
    """An experiment file of experiments/, read and validated (every cell's config built) once for the tests
    here, which only read it."""
    return load_experiment(path)


def test_readme_is_short_enough_to_read_and_starts_with_the_two_commands():
    """What a reader needs, within limits that long lines cannot meet: the two commands near the top, the
    headline figure and the findings in the results, the rest a link away."""
    lines = README.splitlines()
    assert len(lines) <= 300 and len(README) <= 20_000
    assert [n for n, line in enumerate(lines, 1) if len(line) > 400] == [], "break the line, or move it to docs/"
    first_block = README.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split()[:2] for line in first_block.splitlines()]
    assert commands[:2] == [["make", "train"], ["make", "test"]] and ["make", "demo"] in commands  # then the demo
    assert {line.split()[1] for line in lines[:40] if line.startswith(("make train", "make test"))} == {"train", "test"}
    assert "![make demo" in README.split("## What the experiments show")[0]  # the picture the demo draws, first
    results = README.split(results_text.RESULTS_BEGIN, 1)[1].split(results_text.RESULTS_END, 1)[0]
    assert f"![the headline](experiments/results/{results_text.HEADLINE}/headline.png)" in results
    claims = json.loads((REPO / "experiments" / "results" / results_text.HEADLINE / "report.json").read_text())
    rows = [line for line in results.splitlines() if line.startswith("| ") and not line.startswith("| claim |")]
    assert [row.split(" | ")[1].split(" (")[0] for row in rows] == [e["verdict"] for e in claims["expectations"]]


def api_table() -> dict[str, str]:
    section = (REPO / "docs" / "api.md").read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `(attn\.[\w.]+)\(([^`]*)\)` \| .+ \|$", section, re.M)}


def test_each_claim_what_the_factor_does_cites_is_confirmed_in_its_published_report():
    """The words under "What the factor does" say what experiments found: each claim they cite by id (`a-claim-id`)
    is confirmed as run in the report of an experiment the paragraph names before it; where a published re-run
    of a cited claim's experiment differs on a cited claim, the paragraph says how many claims its re-run
    differs on; a re-run it says agrees on every verdict does."""
    opening = README.split("## What the factor does", 1)[1].split("\n## ", 1)[0]
    cited = [(m.start(), m.group(1)) for m in re.finditer(r"`([a-z0-9]+(?:-[a-z0-9_.]+)+)`", opening)]
    assert len(cited) >= 4, opening
    results = REPO / "experiments" / "results"
    flipped = set()
    for at, claim in cited:
        named = [name for name in re.findall(r"`([a-z0-9_]+)`", opening[:at]) if (results / name).is_dir()]
        assert named, f"{claim}: no experiment named before it"
        report = json.loads((results / named[-1] / "report.json").read_text())
        verdicts = {e["id"]: e["verdict"] for e in report["expectations"]}
        assert verdicts.get(claim) == "confirmed", (claim, named[-1], verdicts.get(claim))
        verification = results / named[-1] / "verify.json"
        rows = json.loads(verification.read_text())["expectations"] if verification.exists() else []
        differing = [r["id"] for r in rows if not r["agree"]]
        if claim in differing:
            flipped.add((named[-1], len(differing)))
    for said in re.finditer(r"re-run in (\w+) agrees on every verdict", opening):
        named = [name for name in re.findall(r"`([a-z0-9_]+)`", opening[: said.start()]) if (results / name).is_dir()]
        rows = json.loads((results / named[-1] / "verify.json").read_text())["expectations"]
        assert all(r["verdicts"][said.group(1)] == r["verdicts"]["as run"] for r in rows), (named[-1], said.group(0))
    for experiment, count in flipped:
        words = {2: "two", 3: "three", 4: "four", 5: "five"}.get(count, str(count))
        assert re.search(rf"differs? on {words} claims", opening), (experiment, count)


def test_the_headlines_scope_line_names_the_widths_it_ran():
    """The scope line names the d_k values the headline's cells ran (the paper's own 64 among them)."""
    report = json.loads((REPO / "experiments" / "results" / results_text.HEADLINE / "report.json").read_text())
    widths = sorted({c["settings"]["model.d_k"] for c in report["cells"]})
    line = next(line for line in README.splitlines() if line.startswith("**The headline**"))
    named = ", ".join(map(str, widths[:-1])) + f" and {widths[-1]}"
    assert 64 in widths and f"d_k {named}" in line, line


def test_the_api_table_lists_exactly_the_public_functions_and_they_exist():
    documented = api_table()
    assert list(documented) == [f"attn.{name}" for name in attn.API]
    for name in attn.API:
        function = getattr(attn, name)
        assert callable(function) and function.__doc__, name
        assert name in dir(attn)


def test_import_attn_is_cheap_and_each_name_is_imported_on_first_use():
    code = (
        "import sys, attn; before = {m for m in sys.modules if m.startswith(('attn.', 'numpy', 'matplotlib'))}; "
        "attn.list_runs; print(sorted(before), 'matplotlib' in sys.modules, 'attn.analysis.listing' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "False", "True"]


def test_attn_train_run_trains_a_run_as_attn_train_does(tmp_path):
    config = attn.load_config(None, [*TINY, f"runs_dir={tmp_path}", "train.steps=4"])
    run_dir = attn.train_run(config, name="api")
    assert run_dir == tmp_path / "api" and attn.read_summary(run_dir)["status"] == "completed"
    with pytest.raises(AttributeError, match="no_such_name"):
        attn.no_such_name


def test_the_generated_blocks_are_what_publish_makes_from_the_committed_results():
    results = REPO / "experiments" / "results"
    reports = {p.parent.name: json.loads(p.read_text()) for p in sorted(results.glob("*/report.json"))}
    verifications, histories = publish.read_verifications(results), publish.read_histories(results)
    block = results_text.results_block(reports, verifications, REPO, histories=histories)
    assert results_text.with_block(README, results_text.RESULTS_BEGIN, results_text.RESULTS_END, block) == README, (
        "run `make publish`; do not edit the block"
    )
    bench = json.loads((results / "bench.json").read_text())
    block = results_text.bench_block(bench, results / "bench.json")
    assert results_text.with_block(README, results_text.BENCH_BEGIN, results_text.BENCH_END, block) == README
    assert (REPO / "experiments" / "README.md").read_text() == results_text.experiments_readme(
        reports, verifications, results, REPO, histories=histories
    )


@pytest.mark.parametrize(
    "page", [REPO / "README.md", REPO / "experiments" / "README.md", *DOCS], ids=lambda p: str(p.relative_to(REPO))
)
def test_every_relative_link_and_image_exists(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" not in target:
            assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_the_worked_example_in_the_docs_runs_and_passes_its_check(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    [example] = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "training.md").read_text(), re.S)
    exec(compile(example, "docs/training.md", "exec"), {})
    errors = [float(e) for e in re.findall(r"worst rel err ([0-9.e+-]+)", capsys.readouterr().out)]
    assert errors and max(errors) < 1e-6


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    load_config(path)


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_experiment_loads_and_make_ablations_runs_it(path):
    assert shipped_experiment(path).cells
    ablations = re.search(r"^ABLATIONS := (.+)$", (REPO / "Makefile").read_text(), re.M).group(1).split()
    assert path.stem in ablations


def test_every_published_experiment_has_its_line_in_readmes_results_block_and_boundaries_their_own_number():
    """The block's findings are the headline's; every other experiment published has a line linking its
    report (one published but never shown would be lost to a reader); the boundary experiments are
    numbered, each number once."""
    results = README.split(results_text.RESULTS_BEGIN, 1)[1].split(results_text.RESULTS_END, 1)[0]
    numbers = {}
    for path in sorted((REPO / "experiments").glob("*.yaml")):
        found = results_text.BOUNDARY.match(shipped_experiment(path).description.strip())
        if found:
            numbers.setdefault(int(found.group(1)), []).append(path.stem)
    assert {n: names for n, names in numbers.items() if len(names) > 1} == {}
    number_of = {names[0]: n for n, names in numbers.items()}
    for path in sorted((REPO / "experiments" / "results").glob("*/report.json")):
        name = path.parent.name
        if name != results_text.HEADLINE:
            number = f"({number_of[name]}) " if name in number_of else ""
            assert f"- {number}[`{name}`](experiments/results/{name}/report.md)" in results
