"""The training loop's twin: attn.train.reference_loop.train (one run,
written plainly) against attn.train.loop (the stack it really trains
through), bit for bit: every record, every checkpoint, the attention and
mechanism snapshots, the summary. Alone and as a member of a stack."""

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import SIZES, without_timing

from attn.config.loading import load_config
from attn.store import arrayfiles, runs, runstate
from attn.train import loop, reference_loop

pytestmark = pytest.mark.filterwarnings("ignore:Degrees of freedom <= 0")  # the std of no finite scores: null
SHORT = [
    *(s for s in SIZES if not s.startswith("task.n_")),
    "logging.plots=false",
    "train.steps=30",
    "logging.log_every=4",
    "logging.checkpoint_every=10",
    "logging.mechanism_step=9",
]
CASES = {
    "sgd": ["optim.lr=0.3"],
    "momentum, clipped, cosine": [
        "optim.momentum=0.9",
        "optim.nesterov=true",
        "optim.clip_norm=0.5",
        "optim.schedule=cosine",
        "optim.warmup_steps=5",
    ],
    "adamw, rate multipliers": [
        "optim.name=adamw",
        "optim.lr=0.01",
        "optim.weight_decay=0.1",
        "optim.qk_lr_exponent=0.5",
        "optim.lr_mult={W_out: 0.5}",
    ],
    "sigma_reparam": ["model.score=sigma_reparam", "optim.lr=0.2"],
    "mask_self": ["model.mask_self=true", "model.scale=none", "optim.lr=0.3"],
    "copy task": ["task.name=copy", "task.vocab_size=8", "task.length=6", "model.positional=learned", "optim.lr=0.2"],
    "non-finite, continue": ["optim.lr=20", "model.scale=none", "train.on_nonfinite=continue"],
    "non-finite, stop": ["optim.lr=20", "model.scale=none"],
}
SNAPSHOTS = ("attention.npz", "mechanism.npz", "mechanism_trace.npz")
RESULT_KEYS = (
    "status",
    "reason",
    "step",
    "best",
    "nonfinite_steps",
    "final",
    "resumed_from",
    "outcome",
    "outcome_detail",
)


def trained(run_dir: Path, overrides: list[str], with_twin: bool, stop_at_once: bool = False) -> dict:
    run_dir.mkdir()
    state = runstate.prepare(load_config(None, [*SHORT, *overrides]), run_dir)
    stop = loop.StopFlag()
    if stop_at_once:
        stop.request("SIGTERM")
    return reference_loop.train(state, stop) if with_twin else loop.run(state, stop=stop)


def assert_same_run(a: Path, b: Path, summary_a: dict, summary_b: dict) -> None:
    assert without_timing(runs.read_metrics(a)) == without_timing(runs.read_metrics(b))
    result = [
        json.dumps({k: summary.get(k) for k in RESULT_KEYS}, sort_keys=True) for summary in (summary_a, summary_b)
    ]
    assert result[0] == result[1]  # as text: a final eval_loss may be NaN
    kept = runstate.kept_checkpoint_steps(a)
    assert kept == runstate.kept_checkpoint_steps(b)
    for name in [f"checkpoint-{s}.npz" for s in kept] + [s for s in SNAPSHOTS if (a / s).exists()]:
        arrays_a, arrays_b = arrayfiles.load_arrays(a / name), arrayfiles.load_arrays(b / name)
        assert arrays_a.keys() == arrays_b.keys(), name
        for key in arrays_a:
            if key != "meta":  # meta holds the training seconds
                assert np.array_equal(arrays_a[key], arrays_b[key], equal_nan=True), (name, key)
    assert [(b / s).exists() for s in SNAPSHOTS] == [(a / s).exists() for s in SNAPSHOTS]


@pytest.mark.parametrize("case", CASES)
def test_the_twin_trains_a_run_as_the_loop_does(tmp_path, case):
    real = trained(tmp_path / "loop", CASES[case], with_twin=False)
    twin = trained(tmp_path / "twin", CASES[case], with_twin=True)
    assert_same_run(tmp_path / "loop", tmp_path / "twin", real, twin)
    if case.startswith("non-finite"):
        assert real["nonfinite_steps"] > 0
        assert real["status"] == ("completed" if case.endswith("continue") else "diverged")


def test_the_twin_stops_and_checkpoints_as_the_loop_does(tmp_path):
    real = trained(tmp_path / "loop", [], with_twin=False, stop_at_once=True)
    twin = trained(tmp_path / "twin", [], with_twin=True, stop_at_once=True)
    assert real["status"] == "interrupted" and runstate.kept_checkpoint_steps(tmp_path / "loop") == [1]
    assert_same_run(tmp_path / "loop", tmp_path / "twin", real, twin)


def test_each_member_of_a_stack_trains_as_the_twin_trains_it_alone(tmp_path):
    members = [CASES["sgd"], ["seed=1", "optim.lr=0.5", "train.steps=17"], [*CASES["non-finite, stop"], "seed=2"]]
    states = []
    for i, overrides in enumerate(members):
        (tmp_path / f"stack{i}").mkdir()
        states.append(runstate.prepare(load_config(None, [*SHORT, *overrides]), tmp_path / f"stack{i}"))
    summaries = loop.run_stack(states)
    for i, overrides in enumerate(members):
        twin = trained(tmp_path / f"twin{i}", overrides, with_twin=True)
        assert_same_run(tmp_path / f"stack{i}", tmp_path / f"twin{i}", summaries[i], twin)
