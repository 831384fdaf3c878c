"""The config schema: every bad file, value and override is one ConfigError line
naming the source, the field, the bad value and what is accepted."""

import dataclasses
import os
import pickle
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import billion_laughs, facts_in, parsed_with_and_without_libyaml

from attn import cli
from attn.cli import common
from attn.config import yamlio
from attn.config.loading import build_spec, build_task, estimate_memory_bytes, load_config, memory_limit_bytes, replace
from attn.config.schema import Config, all_keys, describe_schema, to_dict
from attn.config.yamlio import ConfigError
from attn.model import fast
from attn.train import lifecycle

REPO = Path(__file__).resolve().parents[1]
ACCEPTED = {key: accepted for key, accepted, _, _ in describe_schema()}  # what each field's error promises


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_error(path, overrides=()) -> str:
    """The message of the ConfigError that loading raises; it must be one line."""
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert message and "\n" not in message, message
    return message


def file_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    message = config_error(path)
    assert message.startswith(f"{path}: "), message
    return message


# ---------------------------------------------------------------------------
# The file itself
# ---------------------------------------------------------------------------
def test_missing_file_is_named(tmp_path):
    path = tmp_path / "nope.yaml"
    assert config_error(path) == f"{path}: no such config file"


def test_directory_is_not_a_config(tmp_path):
    assert config_error(tmp_path) == f"{tmp_path}: is a directory, not a config file (and it holds no config.yaml)"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a chmod 000 file")
def test_unreadable_file_is_refused(tmp_path):
    path = write(tmp_path, "seed: 1\n")
    path.chmod(0)
    try:
        assert "permission denied" in config_error(path)
    finally:
        path.chmod(0o600)


@pytest.mark.parametrize(
    "text, phrase",
    [
        ("", "is empty"),
        ("# only a comment\n\n", "is empty"),
        ("optim: [\n", "not valid YAML: line 2"),
        ("optim: {lr: 0.1\n", "not valid YAML"),
        ("a: b: c\n", "not valid YAML: line 1"),
        ("\tseed: 1\n", "not valid YAML"),
        ("seed: 1\n---\nseed: 2\n", "not valid YAML"),
        ("- seed\n- 1\n", "must be a YAML mapping of sections, got a list"),
        ("just words\n", "must be a YAML mapping of sections, got a str"),
        ("3\n", "must be a YAML mapping of sections, got a int"),
        ("? [a, b]\n: 1\n", "unhashable key"),
    ],
)
def test_file_that_is_not_a_config_mapping(tmp_path, text, phrase):
    assert phrase in file_error(tmp_path, text)


def test_binary_and_oversized_files_are_refused(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"seed: \xff\xfe\n")
    assert config_error(binary) == f"{binary}: config file is not UTF-8 text"
    huge = write(tmp_path, "seed: 1\n" + "#" * (2 << 20) + "\n", "huge.yaml")
    assert "too large for a config file" in config_error(huge)


@pytest.mark.parametrize(
    "text, key, line",
    [
        ("seed: 1\nseed: 2\n", "seed", 2),
        ("optim:\n  lr: 0.1\n  momentum: 0.9\n  lr: 0.2\n", "lr", 4),
    ],
)
def test_duplicate_keys_are_refused_with_their_line(tmp_path, text, key, line):
    message = file_error(tmp_path, text)
    assert f"line {line}" in message and f"duplicate key {key!r}" in message


def test_merge_keys_are_not_duplicates(tmp_path):
    config = load_config(write(tmp_path, "optim:\n  <<: {lr: 0.1, momentum: 0.5}\n  lr: 0.2\n"))
    assert (config.optim.lr, config.optim.momentum) == (0.2, 0.5)


# ---------------------------------------------------------------------------
# Keys and values
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, unknown, suggestion",
    [
        ("optim: {lrr: 0.1}\n", "optim.lrr", "optim.lr"),
        ("lr: 0.1\n", "lr", "optim.lr"),  # a leaf at the wrong level
        ("steps: 10\n", "steps", "train.steps"),
        ("model: {dk: 8}\n", "model.dk", "model.d_k"),
        ("trian: {steps: 10}\n", "trian", "train"),  # a misspelt section
        ("optim: {wieght_decay: 0.1}\n", "optim.wieght_decay", "optim.weight_decay"),
        ("task: {lr: 0.1}\n", "task.lr", "optim.lr"),  # a leaf in the wrong section
    ],
)
def test_unknown_key_suggests_the_nearest_valid_key(tmp_path, text, unknown, suggestion):
    assert file_error(tmp_path, text).endswith(f"unknown key `{unknown}`; did you mean `{suggestion}`?")


def test_unknown_key_without_a_near_one_has_no_suggestion(tmp_path):
    assert file_error(tmp_path, "optim: {qqqqqqqqqq: 1}\n").endswith("unknown key `optim.qqqqqqqqqq`")


# (YAML text, field, the bad value as the message shows it); what is accepted comes from the schema.
BAD_VALUES = [
    ("seed: abc", "seed", "'abc'"),
    ("seed: 1.5", "seed", "1.5"),
    ("seed: true", "seed", "true"),
    ("seed: [1, 2]", "seed", "[1, 2]"),
    ("seed: -1", "seed", "-1"),
    ("model: {d_k: thirty-two}", "model.d_k", "'thirty-two'"),
    ("model: {d_k: 0}", "model.d_k", "0"),
    ("model: {d_k: -4}", "model.d_k", "-4"),
    ("model: {d_v: 0}", "model.d_v", "0"),
    ("model: {causal: 1}", "model.causal", "1"),
    ("model: {scale: SQRT}", "model.scale", "'SQRT'"),
    ("optim: {lr: true}", "optim.lr", "true"),
    ("optim: {lr: 0}", "optim.lr", "0"),
    ("optim: {lr: -0.1}", "optim.lr", "-0.1"),
    ("optim: {lr: .nan}", "optim.lr", ".nan"),
    ("optim: {lr: .inf}", "optim.lr", ".inf"),
    ("optim: {lr: nan}", "optim.lr", "'nan'"),
    ("optim: {lr: 1e400}", "optim.lr", "'1e400'"),
    ("optim: {momentum: 1}", "optim.momentum", "1"),
    ("optim: {beta2: 1.0}", "optim.beta2", "1.0"),
    ("optim: {min_lr_ratio: 1.5}", "optim.min_lr_ratio", "1.5"),
    ("optim: {clip_norm: 0}", "optim.clip_norm", "0"),
    ("optim: {lr_mult: [1]}", "optim.lr_mult", "[1]"),
    ("train: {batch_size: 0}", "train.batch_size", "0"),
    ("train: {steps: 2.5}", "train.steps", "2.5"),
    ("task: {n_values: 1}", "task.n_values", "1"),
    ("dtype: float16", "dtype", "'float16'"),
    ("runs_dir: 5", "runs_dir", "5"),
    ("name: 5", "name", "5"),
    ("seed: !!binary aGVsbG8=", "seed", "!!binary | aGVsbG8="),
]


@pytest.mark.parametrize("text, key, shown", BAD_VALUES, ids=[row[0] for row in BAD_VALUES])
def test_bad_value_names_field_value_and_what_is_accepted(tmp_path, text, key, shown):
    path = write(tmp_path, text + "\n")
    assert config_error(path) == f"{path}: {key}: got {shown}; expected {ACCEPTED[key]}"


@pytest.mark.parametrize(
    "text, key, shown",
    [
        ("optim: [1, 2]", "optim", "[1, 2]"),
        ("model: 3", "model", "3"),
        ("train:", "train", "null"),
    ],
)
def test_a_section_must_be_a_mapping(tmp_path, text, key, shown):
    path = write(tmp_path, text + "\n")
    assert facts_in(config_error(path), f"{path}: {key}: got {shown}", "a mapping", f"{key}.*")


@pytest.mark.parametrize(
    "text, phrase",
    [
        ("optim: {lr_mult: {W_q: 0}}", "optim.lr_mult.W_q: got 0; expected a float > 0"),
        ("optim: {lr_mult: {W_q: abc}}", "optim.lr_mult.W_q: got 'abc'; expected a float > 0"),
        ("optim: {lr_mult: {1: 2}}", "optim.lr_mult: got key 1; expected parameter names"),
        ("optim: {lr_mult: {W_q:0.1}}", "optim.lr_mult: got {W_q:0.1}; YAML needs a space after the colon: {W_q: 0.1}"),
    ],
)
def test_bad_lr_mult_entries(tmp_path, text, phrase):
    assert phrase in file_error(tmp_path, text + "\n")


def test_a_long_bad_value_stays_on_one_short_line(tmp_path):
    message = file_error(tmp_path, "seed: [" + ", ".join(["123456789"] * 500) + "]\n")
    assert len(message) < 300 and "..." in message


@pytest.mark.parametrize(
    "section, key, text, value",
    [
        ("optim", "lr", "1e-3", 0.001),  # PyYAML reads 1e-3 as a string
        ("optim", "lr", "2", 2.0),
        ("train", "steps", "1e3", 1000),
        ("train", "steps", "10.0", 10),
    ],
)
def test_numbers_are_read_by_the_field_type(tmp_path, section, key, text, value):
    config = load_config(write(tmp_path, f"{section}:\n  {key}: {text}\n"))
    got = getattr(getattr(config, section), key)
    assert got == value and type(got) is type(value)


# ---------------------------------------------------------------------------
# Combinations, sizes, names
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, phrase",
    [
        ("task: {n_keys: 4, n_pairs: 5}", "task.n_pairs: got 5; expected at most task.n_keys (4)"),
        ("task: {name: copy, length: 8, mode: shift, shift: 16}", "task.shift: got 16; expected a shift that is not"),
        ("task: {name: copy, length: 5, mode: shift, shift: 5}", "task.shift: got 5;"),
        ("optim: {lr_mult: {W_z: 0.1}}", "optim.lr_mult.W_z: not a parameter of this model"),
        ("optim: {lr_mult: {E_token: 0.1}}", "did you mean `E_key`?"),  # a copy parameter, in a retrieval run
        ("model: {positional: sinusoidal}\noptim: {lr_mult: {E_pos: 0.1}}", "optim.lr_mult.E_pos: not a parameter"),
    ],
)
def test_impossible_combinations_are_refused(tmp_path, text, phrase):
    assert phrase in file_error(tmp_path, text + "\n")


def test_edge_combinations_are_accepted(tmp_path):
    assert load_config(None, ["task.n_pairs=5", "task.n_keys=5"]).task.n_pairs == 5
    copy = load_config(
        None, ["task.name=copy", "task.mode=shift", "task.shift=9", "task.length=8", "optim.lr_mult={E_token: 0.5}"]
    )
    assert copy.optim.lr_mult == {"E_token": 0.5}


def test_absurd_sizes_are_refused_before_allocating(tmp_path):
    tracemalloc.start()
    try:
        message = file_error(tmp_path, "model: {d_model: 10000000, d_k: 10000000}\n")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "memory" in message and "model.d_model=10000000" in message
    assert peak < 10 << 20


def test_retrieval_key_sampling_counts_toward_the_memory_estimate(tmp_path):
    """A retrieval batch draws a (batch, n_keys) array: n_keys alone can exhaust memory."""
    eval_size = 512
    n_keys = memory_limit_bytes() // (16 * eval_size) + 1
    text = f"model: {{d_model: 1, d_k: 1}}\ntask: {{n_keys: {n_keys}, eval_size: {eval_size}}}\n"
    assert "memory" in file_error(tmp_path, text)


def test_memory_estimate_covers_the_parameters_and_their_optimiser_state():
    config = load_config(None, ["optim.name=adam", "dtype=float64"])
    task = build_task(config)
    params = fast.init_params(build_spec(config, task), np.random.default_rng(0))
    weights, grads, adam_moments, update_temporaries = 1, 1, 2, 2
    assert estimate_memory_bytes(config) >= (
        (weights + grads + adam_moments + update_temporaries) * sum(p.nbytes for p in params.values())
    )


@pytest.mark.parametrize("name", ["a/b", "..", ".", "/abs/run", ".hidden", "", "x\\y", "n" * 201])
def test_bad_run_names_are_refused(tmp_path, name):
    message = file_error(tmp_path, yaml.safe_dump({"name": name}))
    assert facts_in(message, f"name: got {name!r}", "directory name")


def test_empty_runs_dir_is_refused(tmp_path):
    path = write(tmp_path, "runs_dir: ' '\n")
    assert facts_in(config_error(path), f"{path}: runs_dir: got ' '", "a directory path")


@pytest.mark.parametrize(
    "text",
    [
        "seed: !!python/object/apply:os.system ['touch {pwned}']",
        "!!python/object/apply:os.system ['touch {pwned}']",
        "optim: {{lr: !!python/name:os.system }}",
        "seed: !custom 3",
    ],
)
def test_object_building_tags_are_refused(tmp_path, text):
    pwned = tmp_path / "pwned"
    message = file_error(tmp_path, text.format(pwned=pwned) + "\n")
    assert "tags that build objects are not allowed" in message
    assert not pwned.exists()


@pytest.mark.parametrize(
    "text, phrase",
    [
        (billion_laughs(), "alias bomb"),
        ("seed: &loop [*loop]\n", "recursive alias"),
        ("optim: &loop {lr: *loop}\n", "recursive alias"),
        ("seed: " + "[" * 2000 + "]" * 2000 + "\n", "nested deeper than"),
        ("seed: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested deeper than"),  # libyaml's composer would crash
    ],
    ids=["billion-laughs", "recursive-list", "recursive-mapping", "2000-deep", "100000-deep"],
)
def test_alias_bombs_and_deep_nesting_are_refused_without_blowing_up(tmp_path, text, phrase):
    tracemalloc.start()
    try:
        message = file_error(tmp_path, text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert phrase in message
    assert peak < 5 << 20


def test_libyaml_reads_every_shipped_file_and_a_run_config_as_the_pure_parser_does(tmp_path):
    """parse_yaml gives the pure parser's values for every config and experiment file, and a run's
    config.yaml as attn writes it is in the plain subset libyaml parses (yamlio.FAST_PARSE_REFUSED)."""
    config = load_config(None, [f"runs_dir={tmp_path}", "optim.lr=1e-3"])
    written = (lifecycle.create(config, name="r") / "config.yaml").read_text()
    assert not yamlio.FAST_PARSE_REFUSED.search(written)
    assert sum(map(written.count, "[{-:")) <= yamlio.FAST_PARSE_NESTING
    for path in [*(REPO / "configs").glob("*.yaml"), *(REPO / "experiments").glob("*.yaml")]:
        fast, pure = parsed_with_and_without_libyaml(path.read_text())
        assert fast == pure, path
    fast, pure = parsed_with_and_without_libyaml(written)
    assert fast == pure


@pytest.mark.parametrize(
    "text",
    [
        "seed: 3\nseed: 4\n",
        "optim: {lr: [1, 2}\n",
        "seed: 0o17\nname: 010\nlr: 1e-3\nat: 12:30:00\n",
        "a: \x01\n",
        "a:\t1\n",  # libyaml alone reads a tab as a space
        "a: [x?y]\n",
        "a: |# c\n  x\n",
        "[!!str, a]\n",
        "a: !\n",  # libyaml alone reads an empty tag's value as ''
        "---\n\ufeffa: 1\n",
        "a: 1\n\ufeff",
        "a: !!timestamp 2001-13-45\n",  # a tag's constructor refusing: one line, not a traceback
        "seed: " + "[" * 4000 + "]" * 4000 + "\n",
    ],
    ids=[
        "duplicate",
        "unclosed",
        "core-schema",
        "control-character",
        "tab",
        "question-mark",
        "block-header-comment",
        "tag-comma",
        "empty-tag",
        "later-bom",
        "trailing-bom",
        "bad-timestamp",
        "4000-deep",
    ],
)
def test_libyaml_and_the_pure_parser_refuse_and_read_alike(text):
    """A text gives the pure parser's message, or value, whether or not libyaml is there."""
    fast, pure = parsed_with_and_without_libyaml(text)
    assert fast == pure


def test_deep_nesting_is_refused_on_a_small_thread_stack_without_a_crash():
    """4,000 levels (libyaml's recursive composer needs more stack than a 512 KiB thread has for them) are
    refused in one line: such a text never reaches libyaml (yamlio.FAST_PARSE_NESTING)."""
    said = []

    def parse():
        try:
            yamlio.parse_yaml("seed: " + "[" * 4000 + "]" * 4000 + "\n", "t.yaml")
        except ConfigError as err:
            said.append(str(err))

    before = threading.stack_size(512 << 10)
    try:
        thread = threading.Thread(target=parse)
        thread.start()
        thread.join()
    finally:
        threading.stack_size(before)
    assert said and "nested deeper than" in said[0]


# ---------------------------------------------------------------------------
# Overrides
# ---------------------------------------------------------------------------
def test_overrides_are_typed_like_the_file():
    config = load_config(
        None,
        [
            "optim.lr=1e-3",
            "train.steps=1e3",
            "model.causal=true",
            "name=null",
            "model.d_v=12",
            "optim.lr_mult={W_q: 0.1, W_k: 0.2}",
        ],
    )
    assert config.optim.lr == 0.001 and isinstance(config.optim.lr, float)
    assert config.train.steps == 1000 and isinstance(config.train.steps, int)
    assert config.model.causal is True and config.name is None and config.model.d_v == 12
    assert config.optim.lr_mult == {"W_q": 0.1, "W_k": 0.2}


def test_overrides_apply_on_top_of_the_file_in_order(tmp_path):
    path = write(tmp_path, "optim: {momentum: 0.9, lr: 0.3}\n")
    config = load_config(path, ["optim.lr=0.1", "seed=4", "optim.lr=0.2"])
    assert (config.optim.lr, config.optim.momentum, config.seed) == (0.2, 0.9, 4)


@pytest.mark.parametrize("override", ["optim.lr", "=3", "a b=1", "optim..lr=1", ".lr=1", "optim.lr-x=1"])
def test_malformed_override_is_refused(override):
    assert facts_in(config_error(None, [override]), f"override {override!r}:", "key=value")


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lrr=0.1", "unknown key `optim.lrr`; did you mean `optim.lr`?"),
        ("lr=0.1", "unknown key `lr`; did you mean `optim.lr`?"),
        ("optim.lr_mult.W_q=0.1", "unknown key `optim.lr_mult.W_q`; did you mean `optim.lr_mult`?"),
        ("optim=3", "`optim` is a section; override one field, e.g. optim.<field>=value"),
        ("model.d_k=0", f"model.d_k: got 0; expected {ACCEPTED['model.d_k']}"),
        ("optim.lr=abc", f"optim.lr: got 'abc'; expected {ACCEPTED['optim.lr']}"),
        ("optim.lr=", f"optim.lr: got ''; expected {ACCEPTED['optim.lr']}"),
        ("train.steps=1.5", f"train.steps: got 1.5; expected {ACCEPTED['train.steps']}"),
        ("seed=١٢", f"seed: got '١٢'; expected {ACCEPTED['seed']}"),
        ("optim.lr=１e-3", f"optim.lr: got '１e-3'; expected {ACCEPTED['optim.lr']}"),
        ("train.steps=1e308", f"train.steps: got 1.0e+308; expected an integer of at most {2**53:,} (2^53)"),
        ("seed=[", "not valid YAML"),
        ("seed=!!python/object/apply:os.getcwd []", "tags that build objects are not allowed"),
    ],
)
def test_bad_override_names_itself_and_the_problem(override, message):
    error = config_error(None, [override])
    assert error.startswith(f"override {override!r}: ") and message in error


@pytest.mark.parametrize(
    "override, message",
    [
        ("task.n_pairs=17", "task.n_pairs: got 17; expected at most task.n_keys (16)"),
        ("optim.lr_mult={W_z: 1}", "optim.lr_mult.W_z: not a parameter of this model"),
        ("name=../up", "name: got '../up'; expected a plain directory name"),
    ],
)
def test_override_making_an_impossible_config_is_named(tmp_path, override, message):
    path = write(tmp_path, "seed: 1\n")
    assert config_error(path, ["seed=2", override]).startswith(f"{path} with overrides seed=2 {override}: {message}")


def test_cross_field_checks_see_the_config_after_all_overrides(tmp_path):
    for overrides in (["task.n_keys=5", "task.n_pairs=5"], ["task.n_pairs=5", "task.n_keys=5"]):
        assert load_config(None, overrides).task.n_keys == 5
    too_many_pairs = write(tmp_path, "task: {n_keys: 4, n_pairs: 6}\n")
    assert load_config(too_many_pairs, ["task.n_keys=6"]).task.n_pairs == 6


# ---------------------------------------------------------------------------
# The schema and the config object
# ---------------------------------------------------------------------------
def test_describe_schema_covers_every_field_with_its_default():
    rows = describe_schema()
    assert [row[0] for row in rows] == all_keys()
    defaults = to_dict(Config())
    for key, accepted, default, help_text in rows:
        assert accepted and help_text and default, key
        section = defaults
        for part in key.split(".")[:-1]:
            section = section[part]
        assert yaml.safe_load(default) == section[key.split(".")[-1]], key


def test_defaults_load_as_the_schema_defaults():
    assert load_config(None) == Config()


def test_config_is_immutable_all_the_way_down():
    config = load_config(None, ["optim.lr_mult={W_q: 0.5}"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.optim.lr = 3.0
    with pytest.raises(TypeError):
        config.optim.lr_mult["W_q"] = 2.0
    assert config.optim.lr_mult == {"W_q": 0.5}
    assert hash(config) == hash(load_config(None, ["optim.lr_mult={W_q: 0.5}"]))


def test_config_survives_yaml_and_pickle_round_trips(tmp_path):
    config = load_config(None, ["optim.lr_mult={W_q: 0.5}", "task.name=copy", "optim.lr=1e-3"])
    plain = to_dict(config)
    assert type(plain["optim"]["lr_mult"]) is dict
    assert load_config(write(tmp_path, yaml.safe_dump(plain))) == config
    assert pickle.loads(pickle.dumps(config)) == config


def test_a_runs_config_yaml_loads_as_its_config(tmp_path):
    config = load_config(None, [f"runs_dir={tmp_path}", "optim.lr_mult={W_k: 0.5}", "seed=7"])
    run_dir = lifecycle.create(config, None, ["seed=7"], "run")
    assert "provenance:" in (run_dir / "config.yaml").read_text()
    assert load_config(run_dir / "config.yaml") == config


def test_replace_validates_and_leaves_the_original_alone():
    config = load_config(None)
    changed = replace(config, **{"optim.lr": "1e-2", "task.n_pairs": 4})
    assert (changed.optim.lr, changed.task.n_pairs) == (0.01, 4)
    assert (config.optim.lr, config.task.n_pairs) == (Config().optim.lr, Config().task.n_pairs)
    for bad in ({"optim.lr": -1}, {"optim.lrr": 1}, {"task.n_pairs": 17}, {"name": "a/b"}):
        with pytest.raises(ConfigError):
            replace(config, **bad)


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["train", "{bad}"],
        ["train", "optim.lrr=0.1"],
        ["train", "model.d_k=0"],
        ["train", "--name", "../escape"],
        ["train", "{missing}"],
        ["config", "{bad}"],
    ],
)
def test_cli_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys, argv):
    bad = write(tmp_path, "optim:\n  lr: 0.1\n  lr: 0.2\n")
    runs_dir = tmp_path / "runs"
    argv = [a.format(bad=bad, missing=tmp_path / "missing.yaml") for a in argv] + [f"runs_dir={runs_dir}"]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert not runs_dir.exists()


def test_cli_process_refuses_an_object_tag_with_exit_2(tmp_path):
    pwned = tmp_path / "pwned"
    path = write(tmp_path, f"seed: !!python/object/apply:os.system ['touch {pwned}']\n")
    runs_dir = tmp_path / "runs"
    result = subprocess.run(
        [sys.executable, "-m", "attn", "train", str(path), f"runs_dir={runs_dir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "CI": "1"},
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert not pwned.exists() and not runs_dir.exists()


@pytest.mark.parametrize("key", [key for key, accepted, _, _ in describe_schema() if accepted.startswith("a float")])
def test_no_float_field_accepts_inf_or_nan(key):
    for value in (".inf", ".nan", "-.inf"):
        assert f"{key}: got {value}; expected" in config_error(None, [f"{key}={value}"])


BIG = 10**60 - 1  # 60 digits


@pytest.mark.parametrize(
    "where",
    [
        "config",
        "override",
        "experiment_seeds",
        "experiment_override",
        "report_lengths",
        "seeds_flag",
        "fork_step",
        "integer_flag",
    ],
)
def test_one_integer_rule_for_every_integer_a_user_writes(where, tmp_path, capsys):
    """Configs, experiment files (seeds included) and the command line: beyond 2^53 is refused, in one line naming
    the field and the value, exit 2, before any run starts (nothing is created)."""
    base = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"
    experiment = {
        "name": "e",
        "base": str(base),
        "overrides": {"train.steps": 2},
        "grid": {"optim.lr": [0.1]},
        "seeds": [0],
    }
    if where == "experiment_seeds":
        experiment["seeds"] = [BIG]
    if where == "experiment_override":
        experiment["overrides"] = {"seed": BIG}
    if where == "report_lengths":
        experiment["report"] = {"lengths": [BIG]}
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(experiment))
    (tmp_path / "c.yaml").write_text(f"seed: {BIG}\n")
    runs_dir = f"--runs-dir={tmp_path / 'runs'}"
    args = {
        "config": ["train", tmp_path / "c.yaml", f"runs_dir={tmp_path / 'runs'}"],
        "override": ["train", base, f"seed={BIG}", f"runs_dir={tmp_path / 'runs'}"],
        "experiment_seeds": ["sweep", tmp_path / "e.yaml", runs_dir],
        "experiment_override": ["sweep", tmp_path / "e.yaml", runs_dir],
        "report_lengths": ["sweep", tmp_path / "e.yaml", runs_dir],
        "seeds_flag": ["sweep", base, "--grid", "optim.lr=0.1", f"--seeds=0-{BIG}", runs_dir],
        "fork_step": ["train", "--fork", f"{tmp_path}@{BIG}"],
        "integer_flag": ["sweep", tmp_path / "e.yaml", runs_dir, f"--max-cells={BIG}"],
    }[where]
    code = cli.main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == common.EXIT_BAD_INPUT, err
    assert "Traceback" not in err and str(BIG)[:40] in err and f"{2**53:,}" in err
    assert not (tmp_path / "runs").exists()


def test_mask_self_is_a_retrieval_field_and_not_causal():
    """model.mask_self reaches the model spec; it is read only by retrieval, and
    with causal the first query would have no key: both refused with the reason."""
    config = load_config(None, ["model.mask_self=true"])
    assert build_spec(config, build_task(config)).mask_self
    with pytest.raises(ConfigError, match="model.mask_self: got true; read only with task.name retrieval"):
        load_config(None, ["task.name=copy", "model.mask_self=true"])
    with pytest.raises(ConfigError, match="model.mask_self: got true with model.causal true"):
        load_config(None, ["model.mask_self=true", "model.causal=true"])


def test_the_experiment_file_example_in_the_docstring_loads(tmp_path):
    """attn.experiment.spec's docstring shows every report key; it must be a file attn accepts."""
    from attn.experiment import spec as experiments

    text = experiments.__doc__.split("\n\n")[1]
    example = "\n".join(line[4:] for line in text.splitlines())
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "default.yaml").write_text((REPO / "configs" / "default.yaml").read_text())
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "example.yaml").write_text(example)
    experiment = experiments.load_experiment(tmp_path / "experiments" / "example.yaml", str(tmp_path / "runs"))
    assert len(experiment.cells) == 3 * 2 * 3 * 10 and experiment.report.judge_on == (4, 5, 6, 7, 8, 9)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["optim.name=adam", "optim.momentum=0.9"], "optim.momentum"),
        (["optim.nesterov=true"], "optim.nesterov"),  # with momentum 0: no momentum to be Nesterov's
        (["optim.beta1=0.5"], "optim.beta1"),
        (["optim.eps=1.0"], "optim.eps"),
        (["optim.min_lr_ratio=0.5"], "optim.min_lr_ratio"),  # with the constant schedule
    ],
)
def test_an_optimiser_setting_the_chosen_optimiser_never_reads_is_refused(overrides, key):
    with pytest.raises(ConfigError, match=rf"{key}: got .*; not read with"):
        load_config(None, overrides)


def test_the_same_settings_are_read_where_their_optimiser_is_chosen():
    config = load_config(
        None, ["optim.momentum=0.9", "optim.nesterov=true", "optim.schedule=cosine", "optim.min_lr_ratio=0.1"]
    )
    assert (config.optim.nesterov, config.optim.min_lr_ratio) == (True, 0.1)
    assert load_config(None, ["optim.name=adamw", "optim.beta1=0.5", "optim.eps=1e-6"]).optim.beta1 == 0.5


def test_a_sweep_base_may_set_what_its_grid_chooses_the_optimiser_to_read(tmp_path):
    """The base and overrides are checked alone, before the grid: Adam's beta2 there is read by every cell the
    grid makes Adam or AdamW, and refused only in a cell that is SGD."""
    from attn.experiment import spec as experiments

    data = {
        "name": "g",
        "base": str(Path(__file__).resolve().parents[1] / "configs" / "default.yaml"),
        "overrides": {"optim.beta2": 0.99},
        "grid": {"optim.name": ["adam", "adamw"]},
        "seeds": [0],
    }
    experiment = experiments.build_experiment(data, tmp_path / "g.yaml", str(tmp_path / "runs"))
    assert {c.config.optim.beta2 for c in experiment.cells} == {0.99}
    with pytest.raises(ConfigError, match=r"grid cell \{optim.name: sgd\}: optim.beta2: got 0.99; not read"):
        experiments.build_experiment(
            {**data, "grid": {"optim.name": ["adam", "sgd"]}}, tmp_path / "g.yaml", str(tmp_path / "runs")
        )


def test_a_stored_run_config_with_a_setting_nothing_read_reads_with_it_at_its_default(tmp_path):
    """An older attn wrote Adam runs with momentum 0.9 (never read): resume, fork and reports still read them."""
    from attn.config.loading import config_from_mapping, load_run_config

    stored = to_dict(load_config(None, ["optim.name=adam"]))
    stored["optim"]["momentum"] = 0.9
    stored["optim"]["nesterov"] = True
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(stored))
    for config in (load_run_config(tmp_path / "config.yaml"), config_from_mapping(stored, "config.yaml")):
        assert (config.optim.name, config.optim.momentum, config.optim.nesterov) == ("adam", 0.0, False)
    assert load_run_config(tmp_path / "config.yaml", ["train.steps=9"]).train.steps == 9


def test_d_v_does_not_follow_d_k():
    """Issue 44: a wide d_k alone keeps the value circuit at its default width (the published experiments set 32)."""
    config = load_config(None, ["model.d_k=1024"])
    assert config.model.d_v == 32
    assert build_spec(config, build_task(config)).d_v == 32


def test_a_null_d_v_as_older_runs_recorded_it_still_means_d_k():
    """Runs made before d_v had a default wrote `d_v: null`; they resume, fork and report as they ran."""
    config = load_config(None, ["model.d_k=1024", "model.d_v=null"])
    assert config.model.d_v is None and build_spec(config, build_task(config)).d_v == 1024


def test_a_value_yaml_cannot_write_is_shown_by_its_repr_on_one_line():
    value = {"runs_dir": Path("runs")}  # what a library caller may pass where a config holds text
    assert yamlio.show_value(value) == " ".join(repr(value).split())
