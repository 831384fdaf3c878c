"""Property-based: generated damaged run files, configs, experiment files
and overrides, each given to the CLI in-process (cli.main). The contract:

    exit code in {0, 2, 3}; no exception escapes (no traceback);
    exit 2 means one `error:` line on stderr and nothing else;
    a refused command creates nothing and changes nothing (nothing lost),
    and never writes through a symbolic link;
    a run it resumes ends completed, with files that read back.

`make test` runs ten examples per property (the default profile; four of the figure-drawing one);
`make test-faults` runs the campaign (HYPOTHESIS_PROFILE=campaign).
"""

import contextlib
import io
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
import yaml
from helpers import TINY, parsed_with_and_without_libyaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from attn import cli
from attn.cli import common
from attn.config.loading import load_config
from attn.config.schema import all_keys
from attn.config.yamlio import dump_yaml
from attn.store import runs
from attn.train import lifecycle

REPO = Path(__file__).resolve().parents[1]
CAMPAIGN = os.environ.get("HYPOTHESIS_PROFILE") == "campaign"
# No example database, and Hypothesis's other files (its Unicode tables, the same every session: computing them
# afresh costs a session seconds) in a cache directory of the user's: nothing written into the source tree.
HYPOTHESIS_HOME = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attn-hypothesis"
set_hypothesis_home_dir(HYPOTHESIS_HOME)
settings.register_profile(
    "default", max_examples=10, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "campaign", max_examples=1500, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("campaign" if CAMPAIGN else "default")

SECTIONS = ["model", "task", "optim", "train", "logging"]
KEYS = all_keys()
LEAVES = sorted({key.rsplit(".", 1)[-1] for key in KEYS})
TRICKY = [
    "12:30:00",
    "0o17",
    "1e400",
    "010",
    ".inf",
    "-.nan",
    "yes",
    "~",
    "!!float abc",
    "!!int x",
    "sqrt",
    "W_q",
    "9" * 120,
    "a\nb",
    "\x1b[31m",
    "../up",
    ".hidden",
    "",
    " ",
    "{W_q:0.1}",
    "*alias",
    "&anchor x",
    "!!python/name:os.system",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(TRICKY),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.one_of(st.sampled_from(LEAVES), st.text(max_size=8)), inner, max_size=4)
    ),
    max_leaves=8,
)
sections = st.dictionaries(st.sampled_from(LEAVES + ["bogus"]), values, max_size=4)
config_data = st.dictionaries(
    st.sampled_from(SECTIONS + ["seed", "name", "dtype", "runs_dir", "provenance", "bogus"]),
    st.one_of(sections, values),
    max_size=5,
)
yaml_syntax = st.text(
    alphabet=st.sampled_from(list("{}[]:,-&*!|>'\"#%@`?~ \n\tab01.e+_") + ["é", "\u2028", "\x00"]), max_size=120
)


def file_bytes(data) -> st.SearchStrategy:
    """The bytes of a file: YAML of generated data, YAML-ish text, or any bytes."""
    return st.one_of(
        data.map(lambda d: yaml.safe_dump(d, allow_unicode=True).encode()),
        yaml_syntax.map(str.encode),
        st.binary(max_size=200),
    )


def call(*args) -> tuple[int, str]:
    """cli.main in-process; (exit code, stderr). Any exception fails the property."""
    stderr, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
        code = cli.main([str(a) for a in args])
    return code, stderr.getvalue()


def tree(root: Path) -> dict:
    """Every entry below root: kind and, for regular files, the bytes (FIFOs are not opened)."""
    found = {}
    for path in sorted(root.rglob("*")):
        mode = os.lstat(path).st_mode
        found[str(path.relative_to(root))] = path.read_bytes() if stat.S_ISREG(mode) else stat.S_IFMT(mode)
    return found


def assert_contract(code: int, err: str) -> None:
    assert code in (common.EXIT_OK, common.EXIT_BAD_INPUT, common.EXIT_DIVERGED), (code, err)
    assert "Traceback" not in err
    if code == common.EXIT_BAD_INPUT:
        assert err.count("\n") == 1 and err.startswith("error: "), err


def call_changing_nothing(root: Path, *args) -> int:
    """call(*args) under the contract, nothing below root created or changed; the exit code."""
    before = tree(root)
    code, err = call(*args)
    assert_contract(code, err)
    assert tree(root) == before
    return code


@contextlib.contextmanager
def scratch():
    with tempfile.TemporaryDirectory(prefix="attn-property-") as directory:
        yield Path(directory)


# ---------------------------------------------------------------------------
# Configs, overrides, experiment files: refused in one line, nothing created
# ---------------------------------------------------------------------------
@given(contents=file_bytes(config_data))
def test_any_config_file_is_read_or_refused_in_one_line(contents):
    with scratch() as root:
        path = root / "config.yaml"
        path.write_bytes(contents)
        call_changing_nothing(root, "config", path)


# Texts in the plain subset of YAML that attn parses with libyaml (attn.config.yamlio.FAST_PARSE_REFUSED), from
# the pieces of YAML's syntax and of the core schema's scalars
PLAIN_PIECES = [
    *["a", "key", "x y", ":", ": ", " ", "  ", "\n", "\n", "- ", "-", "[", "]", "{", "}", ",", ", ", "---", "...", "#"],
    *[" # c", '"', "'", "\\", "\\x41", "\\u00e9", "%", "%YAML 1.1\n", "@", "`", "=", "<<", "<<: ", "~", "null"],
    *["010", "0o17", "0x1F", "1e3", "-0.0", "+0", ".nan", "-.inf", ".5", "1.", "12:30:00", "2001-12-14", "true"],
    *["yes", "1_000", "0b101", "1e400", "9" * 40, "9" * 120, "2001-12-14 21:59:43.10 -5", "'a''b'", '"a\\"b"'],
]
plain_yaml = st.lists(st.sampled_from(PLAIN_PIECES), max_size=30).map("".join)


@settings(max_examples=5000 if CAMPAIGN else 300)
@given(text=st.one_of(plain_yaml, config_data.map(dump_yaml)))
def test_libyaml_and_the_pure_parser_read_any_plain_yaml_alike(text):
    """Where libyaml takes a text it gives the pure parser's value, and where it refuses, the pure
    parser's message is shown."""
    with_libyaml, pure = parsed_with_and_without_libyaml(text)
    assert with_libyaml == pure


@given(
    overrides=st.lists(
        st.tuples(
            st.one_of(st.sampled_from(KEYS), st.text(max_size=12)),
            st.one_of(yaml_syntax, values.map(lambda v: json.dumps(v)), st.sampled_from(TRICKY)),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_any_override_is_applied_or_refused_in_one_line(overrides):
    with scratch() as root:
        call_changing_nothing(root, "config", *(f"{key}={value}" for key, value in overrides))


grids = st.one_of(
    values,
    st.dictionaries(st.sampled_from(KEYS + ["seed", "bogus.key"]), st.lists(values, max_size=3), max_size=3),
    st.lists(st.dictionaries(st.sampled_from(KEYS), st.lists(scalars, max_size=3), max_size=2), max_size=2),
)
experiments = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(st.sampled_from(["exp", "ok-name"]), values),
        "base": st.one_of(
            st.just(str(REPO / "configs" / "default.yaml")), st.sampled_from(["nowhere.yaml", "/dev/zero", "."]), values
        ),
        "overrides": st.one_of(st.dictionaries(st.sampled_from(KEYS), values, max_size=2), values),
        "grid": grids,
        "seeds": st.one_of(
            st.lists(st.integers(-1, 3), max_size=3), st.lists(st.integers(2**53 - 1, 10**80), max_size=2), values
        ),
        "report": st.one_of(
            st.dictionaries(st.sampled_from(["x", "arm", "best_of", "bogus"]), values, max_size=2), values
        ),
        "description": values,
    },
)


@given(contents=file_bytes(experiments))
def test_any_experiment_file_is_read_or_refused_in_one_line(contents):
    with scratch() as root:
        path = root / "exp.yaml"
        path.write_bytes(contents)
        code = call_changing_nothing(root, "report", path, "--runs-dir", root / "runs", "--max-cells", "50")
        assert code == common.EXIT_BAD_INPUT  # a valid experiment has no runs yet


# ---------------------------------------------------------------------------
# Paths a user gives that the OS refuses: too long, a file on the way; one line, exit 2, nothing made
# ---------------------------------------------------------------------------
bad_paths = st.one_of(
    st.integers(256, 5000).map(lambda n: ("long", "a" * n)),  # one name longer than NAME_MAX
    st.integers(1100, 1500).map(lambda n: ("long", "/".join(["abc"] * n))),  # the whole path beyond PATH_MAX
    st.sampled_from(["x", "x/y", "x/y/z.yaml"]).map(lambda rest: ("file", rest)),  # through a regular file
)
path_commands = st.sampled_from(
    [
        ("train", str(REPO / "configs" / "default.yaml"), "runs_dir={}"),
        ("config", "{}"),
        ("train", "{}"),
        ("train", "--resume", "{}"),
        ("train", "--fork", "{}"),
        ("runs", "{}"),
        ("compare", "{}"),
        ("report", "{}"),
        ("sweep", str(REPO / "configs" / "default.yaml"), "--grid", "optim.lr=0.1", "runs_dir={}"),
        ("sweep", str(REPO / "experiments" / "sqrt_dk.yaml"), "--runs-dir", "{}"),
    ]
)


@given(path=bad_paths, command=path_commands)
def test_a_path_the_os_refuses_is_one_line(path, command):
    with scratch() as root:
        (root / "afile").write_text("not a directory\n")
        kind, rest = path
        where = str(root / "afile" / rest) if kind == "file" else str(root / rest)
        code = call_changing_nothing(root, *(part.format(where) for part in command))
        assert code == common.EXIT_BAD_INPUT


# ---------------------------------------------------------------------------
# Damaged run directories: resumed exactly, listed, or refused with nothing changed
# ---------------------------------------------------------------------------
RUN_FILES = ["metrics.jsonl", "summary.json", "config.yaml", "checkpoint.npz", "attention.npz"]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A run stopped with a checkpoint at step 8 of 12."""
    root = tmp_path_factory.mktemp("template")
    config = load_config(
        None,
        [
            *TINY,
            f"runs_dir={root}",
            "train.steps=12",
            "logging.log_every=2",
            "logging.checkpoint_every=4",
            "logging.attention_examples=2",
        ],
    )
    run_dir = lifecycle.create(config, name="run")
    stop = lifecycle.StopFlag()
    lifecycle.execute(config, run_dir, stop=stop, progress=lambda step, _: stop.request("test") if step == 7 else None)
    return run_dir


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
damages = st.one_of(
    st.tuples(st.just("replace"), st.sampled_from(RUN_FILES), st.binary(max_size=300)),
    st.tuples(st.just("truncate"), st.sampled_from(RUN_FILES), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.sampled_from(RUN_FILES), st.floats(0, 1), st.integers(1, 255)),
    st.tuples(
        st.just("line"),
        st.integers(0, 8),
        st.one_of(json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=40)),
    ),
    st.tuples(st.just("field"), st.sampled_from(list(runs.SUMMARY_FIELDS) + ["extra"]), json_values),
    st.tuples(
        st.just("kind"), st.sampled_from(RUN_FILES), st.sampled_from(["directory", "fifo", "symlink", "missing"])
    ),
)


def damage(run_dir: Path, victim: Path, what: tuple) -> None:
    kind, name = what[0], what[1] if isinstance(what[1], str) else "metrics.jsonl"
    path = run_dir / name
    if kind == "replace" and (regular(path) or not os.path.lexists(path)):  # never open a FIFO or a link
        path.write_bytes(what[2])
    elif kind == "truncate" and regular(path):
        path.write_bytes(path.read_bytes()[: int(path.stat().st_size * what[2])])
    elif kind == "flip" and regular(path) and path.stat().st_size:
        data = bytearray(path.read_bytes())
        data[int((len(data) - 1) * what[2])] ^= what[3]
        path.write_bytes(bytes(data))
    elif kind == "line" and regular(run_dir / "metrics.jsonl"):
        lines = (run_dir / "metrics.jsonl").read_bytes().splitlines(keepends=True)
        lines.insert(min(what[1], len(lines)), what[2] + b"\n")
        (run_dir / "metrics.jsonl").write_bytes(b"".join(lines))
    elif kind == "field" and regular(run_dir / "summary.json"):
        with contextlib.suppress(ValueError, TypeError):  # an earlier damage left no JSON object to edit
            summary = {**json.loads((run_dir / "summary.json").read_text()), what[1]: what[2]}
            (run_dir / "summary.json").write_text(json.dumps(summary))
    elif kind == "kind":
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        if what[2] == "directory":
            path.mkdir()
        elif what[2] == "fifo":
            os.mkfifo(path)
        elif what[2] == "symlink":
            shutil.copy(victim / name, victim / f"{name}.target") if (victim / name).exists() else None
            path.symlink_to(victim / f"{name}.target")


def regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def check_damaged_run(template: Path, damaged: list, command: str) -> None:
    with scratch() as root:
        run_dir = Path(shutil.copytree(template, root / "runs" / "run"))
        victim = Path(shutil.copytree(template, root / "victim"))
        for what in damaged:
            damage(run_dir, victim, what)
        before, victim_before = tree(run_dir), tree(victim)
        args = {"resume": ["train", "--resume", run_dir], "runs": ["runs", root / "runs"], "plot": ["plot", run_dir]}[
            command
        ]
        code, err = call(*args)
        assert_contract(code, err)
        assert tree(victim) == victim_before, "written through a symbolic link"
        if code == common.EXIT_BAD_INPUT:
            assert tree(run_dir) == before, "a refused command changed the run"
        elif command == "resume":
            assert runs.read_summary(run_dir)["status"] in ("completed", "diverged")
            assert [r["step"] for r in runs.read_metrics(run_dir)] == list(range(0, 13, 2))
        elif command == "runs":
            assert all(line.startswith(("skipped ", "no runs in ")) for line in err.splitlines()), err


@given(damaged=st.lists(damages, min_size=1, max_size=3), command=st.sampled_from(["resume", "runs"]))
def test_a_damaged_run_is_resumed_listed_or_refused_with_nothing_changed(template, damaged, command):
    check_damaged_run(template, damaged, command)


@settings(max_examples=150 if CAMPAIGN else 4)  # drawing figures: ~0.5 s an example
@given(damaged=st.lists(damages, min_size=1, max_size=2))
def test_a_damaged_run_is_plotted_or_refused_with_nothing_changed(template, damaged):
    check_damaged_run(template, damaged, "plot")
