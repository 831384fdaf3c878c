"""The Makefile's `browser` prerequisite of `make test`: nothing when the
browsers are there, apt-get for what is missing as root, a line naming what
is still missing where the tests can start one, else one line giving the
command and exit 2 before any test runs. The test targets split the suite's
tiers, and CI runs every one, README's command first."""

import itertools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import facts_in

REPO = Path(__file__).resolve().parents[1]


def make(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(["make", "-s", "-C", str(REPO), *args], env=env, capture_output=True, text=True, timeout=60)


PACKAGE_FILES = {
    "chromium": "chromium",
    "chromium-driver": "chromedriver",
    "chromium-headless-shell": "chromium-headless-shell",
}
BROWSER_FILES = tuple(PACKAGE_FILES.values())  # CHROMIUM, CHROMEDRIVER, CHROMIUM_SHELL (make_browser)
INSTALL_REQUIRED, INSTALL_SHELL = "install -y -qq chromium chromium-driver", "install -y -qq chromium-headless-shell"


def fake_apt_get(tmp_path: Path, unavailable: tuple[str, ...] = ()) -> Path:
    """An apt-get that records each call (tmp_path/calls) and whose `install` of packages puts their executables at
    tmp_path/<file>, or, if one of them is `unavailable`, installs none and exits 100 (as apt-get does)."""
    script = tmp_path / "apt-get"
    files = " ".join(f"{package}) f={file} ;;" for package, file in PACKAGE_FILES.items())
    script.write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\n[ "$1" = install ] || exit 0\nshift 3\n'
        f'for p in "$@"; do case " {" ".join(unavailable)} " in *" $p "*) exit 100;; esac; done\n'
        f'for p in "$@"; do case "$p" in {files} esac; printf \'#!/bin/sh\\n\' > {tmp_path}/$f; '
        f"chmod +x {tmp_path}/$f; done\n"
    )
    script.chmod(0o755)
    return script


def make_browser(tmp_path: Path, apt: Path, *present: str) -> subprocess.CompletedProcess:
    """make browser with its files under tmp_path, those named in `present` there already."""
    for name in present:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    paths = dict(zip(("CHROMIUM", "CHROMEDRIVER", "CHROMIUM_SHELL"), (tmp_path / name for name in BROWSER_FILES)))
    return make("browser", *(f"{key}={path}" for key, path in paths.items()), f"APT_GET={apt}")


def said(done: subprocess.CompletedProcess) -> list[str]:
    """What make browser said beyond its installing and apt-get's failing."""
    lines = done.stderr.splitlines()
    return [
        line for line in lines if not line.startswith(("make: installing", "make: ***")) and "could not" not in line
    ]


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="installs only as root")


def test_browser_present_runs_nothing(tmp_path):
    done = make_browser(tmp_path, fake_apt_get(tmp_path), *BROWSER_FILES)
    assert (done.returncode, done.stderr) == (0, "") and calls(tmp_path) == []


@root_only
@pytest.mark.parametrize(
    "present, installs",
    [
        ((), ["update -qq", INSTALL_REQUIRED, INSTALL_SHELL]),
        (("chromium", "chromedriver"), [INSTALL_SHELL]),
        (("chromium-headless-shell",), ["update -qq", INSTALL_REQUIRED]),
    ],
)
def test_what_is_missing_is_installed_with_apt_get_as_root(tmp_path, present, installs):
    done = make_browser(tmp_path, fake_apt_get(tmp_path), *present)
    assert (done.returncode, said(done)) == (0, []), done.stderr
    assert calls(tmp_path) == installs
    assert all(os.access(tmp_path / name, os.X_OK) for name in BROWSER_FILES)


def test_without_the_headless_shell_the_tests_drive_chromium_and_one_line_says_so(tmp_path):
    """The shell missing and not installable here (as root, apt-get has no such package): a note, not a stop."""
    done = make_browser(tmp_path, fake_apt_get(tmp_path, unavailable=("chromium-headless-shell",)), *BROWSER_FILES[:2])
    [line] = said(done)
    assert done.returncode == 0 and not (tmp_path / "chromium-headless-shell").exists()
    assert facts_in(line, f"missing {tmp_path / 'chromium-headless-shell'}:", f"drive {tmp_path / 'chromium'}, at more")


def test_without_chromium_the_tests_drive_the_shell_and_one_line_says_chromium_is_missing(tmp_path):
    done = make_browser(tmp_path, fake_apt_get(tmp_path, unavailable=("chromium",)), *BROWSER_FILES[1:])
    [line] = said(done)
    assert done.returncode == 0
    assert facts_in(line, f"missing {tmp_path / 'chromium'}:", f"drive {tmp_path / 'chromium-headless-shell'};")


def test_without_chromedriver_make_stops_naming_only_what_is_missing(tmp_path):
    done = make_browser(
        tmp_path, fake_apt_get(tmp_path, unavailable=("chromium-driver",)), "chromium", BROWSER_FILES[2]
    )
    [line] = said(done)
    assert done.returncode == 2 and line.startswith("error:")
    assert line.split("missing:")[1].split(";")[0].split() == [str(tmp_path / "chromedriver")]


def marker_expressions(target: str) -> list[str | None]:
    """The -m expression of each pytest command `make <target>` runs (make -n prints them, running none)."""
    done = make("-n", target)
    assert done.returncode == 0, done.stderr
    found = []
    for words in (shlex.split(line) for line in done.stdout.splitlines() if " pytest " in line):
        after = words[words.index("pytest") :]
        found.append(after[after.index("-m") + 1] if "-m" in after else None)
    return found


TEST_TARGETS = ("test", "test-slow", "test-faults")


def test_the_test_targets_run_each_tier_once_and_ci_runs_them_all_readmes_first():
    first = {target: marker_expressions(target)[0] for target in TEST_TARGETS}
    for faults, slow in itertools.product((False, True), repeat=2):
        marks = {"faults": faults, "slow": slow}
        runs_it = [target for target, expression in first.items() if eval(expression, {}, marks)]
        assert len(runs_it) == 1, (marks, runs_it)
    assert first["test"] == "not faults and not slow"
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith("make ")]
    assert ci == [f"make {target}" for target in TEST_TARGETS]


def test_a_browser_that_cannot_be_installed_stops_make_test_with_the_command(tmp_path):
    none, shell, apt_get = tmp_path / "none", tmp_path / "no-shell", tmp_path / "no-apt-get"
    done = make("test", f"CHROMIUM={none}", f"CHROMIUM_SHELL={shell}", f"APT_GET={apt_get}")
    assert done.returncode == 2
    [line] = [line for line in done.stderr.splitlines() if not line.startswith("make")]
    assert line.startswith("error:") and line.split("missing:")[1].split(";")[0].split() == [str(shell), str(none)]
    assert facts_in(line, "as root", f"{apt_get} update", f"{apt_get} {INSTALL_REQUIRED}", f"{apt_get} {INSTALL_SHELL}")
    assert "passed" not in done.stdout and "-m pytest" not in done.stdout, "no test ran"


# ---------------------------------------------------------------------------
# A venv made whole or not at all (issue 46.3)
# ---------------------------------------------------------------------------
def fake_python(tmp_path: Path) -> Path:
    """A python whose `-m venv DIR` makes a venv whose python records each call (to tmp_path/calls) and succeeds."""
    script = tmp_path / "python"
    script.write_text(
        '#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = venv ]; then\n'
        f'  mkdir -p "$3/bin"; echo "venv $3" >> {tmp_path}/calls\n'
        f'  printf \'#!/bin/sh\\necho "$*" >> {tmp_path}/calls\\n\' > "$3/bin/python"; chmod +x "$3/bin/python"\n'
        "fi\n"
    )
    script.chmod(0o755)
    return script


def test_a_venv_cut_short_is_removed_and_made_again_and_a_whole_one_kept(tmp_path):
    python, venv = fake_python(tmp_path), tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)  # what a Ctrl-C during ensurepip leaves: a python, pip in part
    (venv / "bin" / "python").write_text("#!/bin/sh\necho \"No module named 'pip._vendor.packaging'\" >&2; exit 1\n")
    (venv / "bin" / "python").chmod(0o755)
    done = make(f"VENV={venv}", f"PYTHON={python}", f"{venv}/.runtime")
    assert done.returncode == 0 and "not made whole" in done.stderr, done.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == f"venv {venv}" and len(calls) == 3 and all(c.startswith("-m pip install") for c in calls[1:])
    assert (venv / ".runtime").exists()
    (tmp_path / "calls").unlink()
    os.utime(venv / ".runtime", (0, 0))  # older than requirements.txt: made whole, but out of date
    done = make(f"VENV={venv}", f"PYTHON={python}", f"{venv}/.runtime")
    calls = (tmp_path / "calls").read_text().splitlines()
    assert done.returncode == 0 and len(calls) == 2 and all(c.startswith("-m pip install") for c in calls), calls


BACKEND = '''"""A PEP 517 backend of one editable wheel (a .pth naming this directory): pip downloads nothing."""

import base64
import hashlib
import os
import zipfile


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {"tiny.pth": os.path.abspath(".") + "\\n"})


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {"tiny.py": ""})


def _wheel(directory, files):
    dist = "tiny-0.dist-info"
    files = {
        **files,
        f"{dist}/METADATA": "Metadata-Version: 2.1\\nName: tiny\\nVersion: 0\\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\\nGenerator: tests\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    with zipfile.ZipFile(os.path.join(directory, "tiny-0-py3-none-any.whl"), "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
        wheel.writestr(f"{dist}/RECORD", "\\n".join([*record, f"{dist}/RECORD,,"]) + "\\n")
    return "tiny-0-py3-none-any.whl"
'''
PYPROJECT = (
    '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
    '[project]\nname = "tiny"\nversion = "0"\n'
)
OLD_RULE = (  # a published commit's Makefile may hold the rule before issue 46, which trusts any .venv with a python
    "PYTHON ?= python3\n.venv/.runtime: requirements.txt pyproject.toml\n"
    "\t@test -x .venv/bin/python || $(PYTHON) -m venv .venv\n"
    "\t.venv/bin/python -m pip install --quiet -r requirements.txt\n"
    "\t.venv/bin/python -m pip install --quiet --no-deps -e .\n\t@touch $@\n"
)


def tiny_project(directory: Path, makefile: str) -> Path:
    """A project whose `make .venv/.runtime` makes a real venv (python -m venv, pip) and downloads nothing."""
    directory.mkdir(parents=True)
    (directory / "Makefile").write_text(makefile)
    (directory / "requirements.txt").write_text("# nothing to install: the venv and pip are what is tested\n")
    (directory / "pyproject.toml").write_text(PYPROJECT)
    (directory / "backend.py").write_text(BACKEND)
    (directory / "tinymod.py").write_text("WHOLE = True\n")
    return directory


def venv_works(project: Path) -> bool:
    """Whether project/.venv runs pip and imports the project through its editable install."""
    check = [str(project / ".venv" / "bin" / "python"), "-c", "import pip._vendor.packaging, tinymod"]
    return subprocess.run(check, cwd="/", capture_output=True, timeout=60).returncode == 0


def with_default_sigint() -> None:
    """A shell's background job starts with SIGINT ignored, which exec keeps: the command must see a Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_trials(project: Path, command: list[str], trials: int) -> tuple[int, list[tuple[float, int, str]]]:
    """`command` (in its own session) stopped by SIGINT at `trials` moments spread over the length of a whole
    run (the last whole one: the machine's load changes), each from no .venv; after each, the same command
    again: (how many of the trials the SIGINT cut short, and (moment, its exit, what failed) for every trial
    whose second run failed or left a venv that does not work)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    started = time.monotonic()
    assert subprocess.run(command, cwd=project, env=env, capture_output=True, timeout=600).returncode == 0
    length = time.monotonic() - started
    failed, cut_short = [], 0
    for trial in range(trials):
        shutil.rmtree(project / ".venv")
        moment = length * (trial + 0.5) / trials
        cut = subprocess.Popen(
            command,
            cwd=project,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=with_default_sigint,
        )
        time.sleep(moment)
        if cut.poll() is None:
            os.killpg(cut.pid, signal.SIGINT)
        stopped = cut.wait(timeout=600) != 0
        cut_short += stopped
        started = time.monotonic()
        again = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=600)
        if stopped and again.returncode == 0:  # a whole run from no venv: the length of the next trials' runs
            length = time.monotonic() - started
        if again.returncode != 0 or not venv_works(project):
            failed.append((round(moment, 2), again.returncode, again.stderr.strip()[-200:]))
    return cut_short, failed


@pytest.mark.faults
def test_make_stopped_by_ctrl_c_anywhere_in_making_the_venv_then_make_again_makes_it_whole(tmp_path):
    makefile = (REPO / "Makefile").read_text()
    project = tiny_project(tmp_path / "project", makefile)
    cut_short, failed = interrupt_trials(project, ["make", "-s", ".venv/.runtime"], trials=20)
    assert failed == [] and cut_short >= 10, (cut_short, failed)


@pytest.mark.faults
def test_verify_published_stopped_anywhere_in_making_its_worktrees_venv_then_again_makes_it_whole(tmp_path):
    """The worktree is of a commit whose Makefile trusts any .venv with a python (OLD_RULE): verify removes
    one cut short before it runs that make (attn.report.published.whole_venv)."""
    project = tiny_project(tmp_path / "project", OLD_RULE)
    code = "import sys; from pathlib import Path; from attn.report.published import whole_venv; "
    code += "whole_venv(Path(sys.argv[1]), lambda message: None)"
    command = [sys.executable, "-c", code, str(project)]
    cut_short, failed = interrupt_trials(project, command, trials=20)
    assert failed == [] and cut_short >= 10, (cut_short, failed)
