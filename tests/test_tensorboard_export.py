"""attn export --tensorboard, read back with TensorBoard's own loaders: its event accumulator (scalars, text,
images) and the HParams plugin's handlers (the experiment and session groups its dashboard shows)."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from board_runs import write_run
from matplotlib.image import imsave

from attn import cli
from attn.config.yamlio import yaml_line
from attn.report import tensorboard
from attn.store import runs

pytest.importorskip("tensorboard", reason="the tensorboard package is not installed (optional: attn[tensorboard])")

from google.protobuf import json_format  # noqa: E402 (only with tensorboard, which brings it)
from tensorboard import context  # noqa: E402
from tensorboard.backend.event_processing import data_provider, event_accumulator  # noqa: E402
from tensorboard.backend.event_processing import plugin_event_multiplexer as multiplexer  # noqa: E402
from tensorboard.plugins import base_plugin  # noqa: E402
from tensorboard.plugins.hparams import api_pb2, backend_context, get_experiment, list_session_groups  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

EVERYTHING = {tag: 0 for tag in ("scalars", "images", "tensors", "histograms", "audio", "compressedHistograms")}


def finish(run_dir, outcome=None):
    """summary.json as a run that ended writes it: final and best figures, and its outcome."""
    records = runs.read_metrics(run_dir)
    best = min(records, key=lambda r: r["eval_loss"])
    summary = {
        **runs.read_summary(run_dir),
        "final": {k: v for k, v in records[-1].items() if k in ("step", "eval_loss", "eval_accuracy")},
        "best": {"eval_loss": best["eval_loss"], "eval_loss_step": best["step"], "steps_to_99": 50},
        "started_at": 1.7e9,
    }
    if outcome:
        summary["outcome"] = outcome
    runs.write_json(run_dir / "summary.json", summary)
    imsave(run_dir / "loss.png", np.linspace(0, 1, 12).reshape(3, 4))
    return run_dir


@pytest.fixture
def exp(tmp_path):
    finish(write_run(tmp_path / "runs" / "exp" / "s0", "seed=0", steps=100), "learned")
    finish(write_run(tmp_path / "runs" / "exp" / "s1", "seed=1", "model.scale=none", steps=100), "stalled")
    write_run(tmp_path / "runs" / "exp" / "live", "seed=2", status="running", steps=100, logged_until=40)
    return tmp_path / "runs"


def accumulator(run_dir):
    loaded = event_accumulator.EventAccumulator(str(run_dir), size_guidance=EVERYTHING)
    loaded.Reload()
    return loaded


def hparams_dashboard(logdir):
    """(experiment, session groups) as the HParams dashboard asks its plugin for them."""
    mux = multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    plugin_context = backend_context.Context(base_plugin.TBContext(logdir=str(logdir), data_provider=provider))
    request = context.RequestContext()
    experiment = get_experiment.Handler(
        request, plugin_context, "", api_pb2.GetExperimentRequest(include_metrics=True)
    ).run()
    columns = [{"hparam": h.name} for h in experiment.hparam_infos]
    columns += [{"metric": {"tag": m.name.tag, "group": m.name.group}} for m in experiment.metric_infos]
    query = {"startIndex": 0, "sliceSize": 100, "colParams": columns, "aggregationType": "AGGREGATION_AVG"}
    query["allowedStatuses"] = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]
    request_proto = json_format.Parse(json.dumps(query), api_pb2.ListSessionGroupsRequest())
    groups = list_session_groups.Handler(request, plugin_context, "", request_proto).run()
    return experiment, groups.session_groups


def plain(value):
    return json_format.MessageToDict(value)


def test_every_scalar_text_and_figure_reads_back_with_tensorboards_accumulator(exp, tmp_path, capsys):
    assert cli.main(["export", str(exp), "--tensorboard", str(tmp_path / "tb")]) == 0
    out = capsys.readouterr()
    assert "tensorboard --logdir" in out.err
    assert [Path(line.split("  ")[0]).parent.name for line in out.out.splitlines()] == ["live", "s0", "s1"]
    assert "running, not finished" in out.out.splitlines()[0]
    for name in ("s0", "s1", "live"):
        run_dir, loaded = exp / "exp" / name, accumulator(tmp_path / "tb" / "exp" / name)
        records = runs.read_metrics(run_dir)
        metrics = {key for record in records for key in record} - {"step"}
        assert set(loaded.Tags()["scalars"]) == metrics | (
            {"best/eval_loss", "best/steps_to_99"} if name != "live" else set()
        )
        for key in metrics:
            logged = [(r["step"], r[key]) for r in records if runs.is_finite_number(r.get(key))]
            read = [(s.step, s.value) for s in loaded.Scalars(key)]
            assert [s for s, _ in read] == [s for s, _ in logged]
            assert all(math.isclose(a, b, rel_tol=1e-6) for (_, a), (_, b) in zip(read, logged))
        config = tensor_util.make_ndarray(loaded.Tensors("config")[0].tensor_proto).item().decode()
        assert config == tensorboard.code_block((run_dir / "config.yaml").read_text())
        summary = tensor_util.make_ndarray(loaded.Tensors("summary")[0].tensor_proto).item().decode()
        assert json.loads(summary.replace("\n    ", "\n")) == runs.read_summary(run_dir)
        if name == "live":
            assert "outcome" not in loaded.Tags()["tensors"] and loaded.Tags()["images"] == []
            continue
        summary = runs.read_summary(run_dir)
        best = loaded.Scalars("best/eval_loss")
        assert [(s.step, s.value) for s in best] == [
            (summary["best"]["eval_loss_step"], pytest.approx(summary["best"]["eval_loss"]))
        ]
        outcome = tensor_util.make_ndarray(loaded.Tensors("outcome")[0].tensor_proto).item().decode()
        assert outcome == summary["outcome"]
        (image,) = loaded.Images("figures/loss")
        assert image.encoded_image_string == (run_dir / "loss.png").read_bytes()
        assert (image.height, image.width, image.step) == (3, 4, records[-1]["step"])


def test_the_hparams_dashboard_lists_each_run_with_its_settings_outcome_and_final_and_best_metrics(
    exp, tmp_path, capsys
):
    assert cli.main(["export", str(exp), "--tensorboard", str(tmp_path / "tb")]) == 0
    experiment, groups = hparams_dashboard(tmp_path / "tb")
    assert sorted(g.name for g in groups) == ["exp/live", "exp/s0", "exp/s1"]
    from attn.analysis import grouping

    for group in groups:
        run = grouping.load_run(exp / group.name)
        expected = {k: v for k, v in run.settings.items() if v is not None} | {"status": run.status}
        if run.summary.get("outcome"):
            expected["outcome"] = run.summary["outcome"]
        read = {k: plain(v) for k, v in group.hparams.items()}
        assert read.keys() == expected.keys()
        for key, value in expected.items():
            if isinstance(value, (bool, str)) or not isinstance(value, (int, float)):
                assert read[key] == (value if isinstance(value, (bool, str)) else yaml_line(value)), key
            else:
                assert read[key] == pytest.approx(value), key
        values = {m.name.tag: m.value for m in group.metric_values}
        assert values["eval_loss"] == pytest.approx(run.records[-1]["eval_loss"], rel=1e-6)  # the final value
        if run.summary.get("best"):
            assert values["best/eval_loss"] == pytest.approx(run.summary["best"]["eval_loss"], rel=1e-6)
    infos = {h.name: h for h in experiment.hparam_infos}
    assert {name for name, h in infos.items() if h.differs} == {"seed", "model.scale", "outcome", "status"}
    assert [plain(v) for v in infos["outcome"].domain_discrete.values] == ["learned", "stalled"]
    assert sorted(m.name.tag for m in experiment.metric_infos) == [
        "best/eval_loss",
        "eval_accuracy",
        "eval_loss",
    ]


def test_exporting_again_replaces_each_runs_file_and_keeps_the_experiments_settings(exp, tmp_path, capsys):
    out = tmp_path / "tb"
    assert cli.main(["export", str(exp), "--tensorboard", str(out)]) == 0
    first = sorted(p.relative_to(out) for p in out.rglob("events.out.tfevents.*"))
    runs.append_metrics(exp / "exp" / "live", {"step": 50, "eval_loss": 0.5})  # the live run trained on
    assert cli.main(["export", str(exp / "exp" / "live"), "--tensorboard", str(out / "exp")]) == 0
    assert cli.main(["export", str(exp), "--tensorboard", str(out)]) == 0
    nested = (out / "exp" / tensorboard.EXPERIMENT_FILE).relative_to(out)  # the export into out/exp made its own
    assert sorted(p.relative_to(out) for p in out.rglob("events.out.tfevents.*")) == sorted([*first, nested])
    (out / "exp" / tensorboard.EXPERIMENT_FILE).unlink()
    loaded = accumulator(out / "exp" / "live")
    assert [s.step for s in loaded.Scalars("eval_loss")] == [0, 10, 20, 30, 40, 50]  # once each, the new one too
    shutil.rmtree(exp / "exp" / "s1")  # the only unscaled run: exported before, so still in the experiment
    assert cli.main(["export", str(exp), "--tensorboard", str(out)]) == 0
    experiment, groups = hparams_dashboard(out)
    assert len(groups) == 3 and "model.scale" in {h.name for h in experiment.hparam_infos if h.differs}


def test_a_damaged_run_is_one_line_and_skipped_and_the_others_exported(exp, tmp_path, capsys):
    with open(exp / "exp" / "s1" / "metrics.jsonl", "a") as out:
        out.write("not json\n" + json.dumps({"step": 999}) + "\n")
    assert cli.main(["export", str(exp), "--tensorboard", str(tmp_path / "tb")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in err if line.startswith("skipped")] == [f"skipped {exp / 'exp' / 's1'}"]
    assert "metrics.jsonl" in err[0] and "line 12" in err[0]
    assert sorted(p.name for p in (tmp_path / "tb" / "exp").iterdir()) == ["live", "s0"]


def test_without_tensorboard_the_export_is_refused_in_one_line(exp, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tensorboard, "RecordWriter", None)  # as the module leaves it when the import fails
    assert cli.main(["export", str(exp), "--tensorboard", str(tmp_path / "tb")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --tensorboard: needs the tensorboard package")
    assert "attn[tensorboard]" in err[0] and not (tmp_path / "tb").exists()
