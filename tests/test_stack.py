"""Stacked training: runs of one shape trained as one computation, each
member's numbers those of the same run trained alone.

On this machine they agree bit for bit, in float32 as in float64: every
matrix product of a stack is one BLAS call per member on that member's own
contiguous blocks (numpy's stacked matmul), and every logged reduction is
taken member by member. The tests assert that; a BLAS whose batched
product rounds by stack size would break them, and then the claim to make
is the float64 one at 1e-12.
"""

import numpy as np
import pytest
from helpers import SIZES, without_timing

from attn.config.loading import load_config
from attn.store import arrayfiles, runs, runstate
from attn.train import loop, stack

SHORT = [*SIZES, "logging.plots=false", "train.steps=40", "logging.log_every=5", "logging.checkpoint_every=15"]


def config(*overrides):
    return load_config(None, [*SHORT, *overrides])


def train_stack(tmp_path, configs, tag: str, stop_at: int | None = None):
    states = []
    for i, c in enumerate(configs):
        run_dir = tmp_path / f"{tag}{i}"
        run_dir.mkdir()
        states.append(runstate.prepare(c, run_dir))
    stop = loop.StopFlag()

    def progress(_member, step, _record):
        if step == stop_at:
            stop.request("SIGTERM")

    return loop.run_stack(states, stop=stop, progress=progress), [s.run_dir for s in states]


def train_alone(tmp_path, c, tag: str):
    run_dir = tmp_path / tag
    run_dir.mkdir()
    return loop.train(c, run_dir), run_dir


def assert_same_run(a, b):
    assert without_timing(runs.read_metrics(a)) == without_timing(runs.read_metrics(b))
    ca, cb = arrayfiles.load_arrays(a / "checkpoint.npz"), arrayfiles.load_arrays(b / "checkpoint.npz")
    assert ca.keys() == cb.keys()
    for key in ca:
        if key != "meta":
            assert np.array_equal(ca[key], cb[key]), key
    assert (a / loop.MECHANISM_TRACE).exists(), "every member traces its rows (logging.mechanism_trace)"
    for snapshot in ("mechanism.npz", loop.MECHANISM_TRACE):
        sa, sb = arrayfiles.load_arrays(a / snapshot), arrayfiles.load_arrays(b / snapshot)
        assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k], equal_nan=True) for k in sa), snapshot


MEMBERS = [
    ("seed=0", "optim.lr=0.2"),
    ("seed=1", "optim.lr=0.5", "model.scale=none"),
    ("seed=2", "optim.lr=0.1", "model.qk_gain=2.0", "train.steps=25", "logging.log_every=3"),
    ("seed=3", "optim.lr=0.3", "optim.schedule=cosine", "optim.warmup_steps=5", "optim.clip_norm=0.5"),
    ("seed=4", "optim.lr=0.3", "optim.lr_mult={W_q: 0.1, W_k: 0.1}", "model.scale=linear"),
    ("seed=5", "optim.lr=0.3", "optim.qk_lr_exponent=-0.5", "model.scale=none"),
]


@pytest.mark.parametrize(
    "shared",
    [
        ("dtype=float32",),
        ("dtype=float64",),
        ("optim.momentum=0.5", "optim.nesterov=true"),
        ("optim.name=adam", "optim.lr=0.01"),
        (
            "task.name=copy",
            "task.length=6",
            "model.causal=true",
            "task.n_keys=16",
            "task.n_values=16",
            "task.n_pairs=8",
        ),
    ],
    ids=["float32", "float64", "nesterov", "adam", "copy-causal"],
)
def test_each_member_of_a_stack_is_its_run_alone_bit_for_bit(tmp_path, shared):
    configs = [config(*shared, *member) for member in MEMBERS]
    summaries, stacked = train_stack(tmp_path, configs, "stack")
    assert [s["status"] for s in summaries] == ["completed"] * len(configs)
    assert {s["stack_size"] for s in summaries} == {len(configs)}
    for i, c in enumerate(configs):
        alone, run_dir = train_alone(tmp_path, c, f"alone{i}")
        assert alone["step"] == summaries[i]["step"] == c.train.steps
        assert_same_run(stacked[i], run_dir)


def test_a_diverging_member_leaves_the_stack_and_the_others_go_on(tmp_path):
    configs = [
        config("seed=0"),
        config("seed=1", "optim.lr=1e4"),
        config("seed=2", "optim.lr=1e4", "train.on_nonfinite=continue"),
    ]
    summaries, stacked = train_stack(tmp_path, configs, "stack")
    assert [s["status"] for s in summaries] == ["completed", "diverged", "completed"]
    assert summaries[1]["step"] < 40 and "non-finite" in summaries[1]["reason"]
    assert summaries[2]["nonfinite_steps"] > 0
    for i in (0, 2):
        _, run_dir = train_alone(tmp_path, configs[i], f"alone{i}")
        assert_same_run(stacked[i], run_dir)
    alone, run_dir = train_alone(tmp_path, configs[1], "alone1")
    assert alone["status"] == "diverged" and alone["reason"] == summaries[1]["reason"]
    assert without_timing(runs.read_metrics(run_dir)) == without_timing(runs.read_metrics(stacked[1]))


def test_a_stopped_stack_checkpoints_every_member_and_each_resumes_alone_exactly(tmp_path):
    configs = [config(*member) for member in MEMBERS]
    summaries, stacked = train_stack(tmp_path, configs, "stack", stop_at=11)
    assert {s["status"] for s in summaries} == {"interrupted"} and {s["step"] for s in summaries} == {12}
    for i, c in enumerate(configs):
        resumed = loop.train(c, stacked[i], resume=True)
        assert resumed["status"] == "completed" and resumed["resumed_from"] == 12
        _, run_dir = train_alone(tmp_path, c, f"alone{i}")
        assert_same_run(stacked[i], run_dir)


def test_resuming_the_last_checkpoint_reproduces_the_last_record(tmp_path):
    """The last checkpoint is written before the final iteration: a run
    resumed from it (its summary lost, as when killed after the last record)
    re-runs that iteration and ends with the same record."""
    c = config("seed=5")
    _, run_dir = train_alone(tmp_path, c, "run")
    before = runs.read_metrics(run_dir)
    (run_dir / "summary.json").unlink()
    resumed = loop.train(c, run_dir, resume=True)
    assert resumed["status"] == "completed" and resumed["resumed_from"] == c.train.steps
    assert without_timing(runs.read_metrics(run_dir)) == without_timing(before)


def test_only_runs_of_one_shape_and_step_stack():
    key = stack.stack_key
    assert key(config("seed=0", "optim.lr=0.1", "model.scale=none", "train.steps=9")) == key(config("seed=3"))
    assert key(config("model.d_k=16")) != key(config())
    assert key(config("optim.momentum=0.9")) != key(config())
    assert key(config("train.batch_size=8")) != key(config())
    with pytest.raises(ValueError, match="share their shapes"):
        loop.run_stack([runstate.prepare(config(), "unused"), runstate.prepare(config("model.d_k=16"), "unused")])


def test_the_members_writes_of_one_moment_are_made_in_order_in_the_loops_thread_and_the_wait_logged():
    import threading

    made, log = [], loop.WriteLog()
    loop.DurableWrites(log).each(lambda k: made.append((k, threading.current_thread())), [0, 1, 2])
    assert made == [(k, threading.current_thread()) for k in range(3)]
    assert log.count == 1 and len(log.moments) == 1
    loop.DurableWrites(log).each(lambda k: None, [])
    assert log.count == 1  # no writes, no moment


def test_a_failed_write_is_raised_once_the_others_are_done():
    done = []

    def write(k):
        if k == 0:
            raise OSError("disk full")
        done.append(k)

    with pytest.raises(OSError, match="disk full"):
        loop.DurableWrites().each(write, [0, 1, 2])
    assert sorted(done) == [1, 2]
