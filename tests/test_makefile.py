"""The Makefile's `browser` prerequisite of `make test`: nothing when the
browser is there, apt-get when it is missing and can be installed, else one
line giving the command and exit 2 before any test runs."""

import os
import subprocess
from pathlib import Path

import pytest
from helpers import facts_in

REPO = Path(__file__).resolve().parents[1]


def make(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(["make", "-s", "-C", str(REPO), *args], env=env, capture_output=True, text=True, timeout=60)


def fake_apt_get(tmp_path: Path) -> Path:
    """An apt-get whose `install` puts executables at tmp_path/chromium and tmp_path/chromedriver."""
    script = tmp_path / "apt-get"
    script.write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\n'
        f'[ "$1" = install ] || exit 0\nfor f in chromium chromedriver; do\n'
        f"  printf '#!/bin/sh\\n' > {tmp_path}/$f; chmod +x {tmp_path}/$f\ndone\n"
    )
    script.chmod(0o755)
    return script


def test_browser_present_runs_nothing(tmp_path):
    apt = fake_apt_get(tmp_path)
    for name in ("chromium", "chromedriver"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    done = make(
        "browser", f"CHROMIUM={tmp_path / 'chromium'}", f"CHROMEDRIVER={tmp_path / 'chromedriver'}", f"APT_GET={apt}"
    )
    assert (done.returncode, done.stderr) == (0, "") and not (tmp_path / "calls").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="installs only as root")
def test_a_missing_browser_is_installed_with_apt_get_as_root(tmp_path):
    apt = fake_apt_get(tmp_path)
    done = make(
        "browser", f"CHROMIUM={tmp_path / 'chromium'}", f"CHROMEDRIVER={tmp_path / 'chromedriver'}", f"APT_GET={apt}"
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "calls").read_text().splitlines() == ["update -qq", "install -y -qq chromium chromium-driver"]
    assert os.access(tmp_path / "chromium", os.X_OK) and os.access(tmp_path / "chromedriver", os.X_OK)


def test_a_browser_that_cannot_be_installed_stops_make_test_with_the_command(tmp_path):
    done = make("test", f"CHROMIUM={tmp_path / 'none'}", f"APT_GET={tmp_path / 'no-apt-get'}")
    assert done.returncode == 2
    [line] = [line for line in done.stderr.splitlines() if not line.startswith("make")]
    apt_get = tmp_path / "no-apt-get"
    assert line.startswith("error:") and facts_in(line, str(tmp_path / "none"), "/usr/bin/chromedriver", "as root")
    assert facts_in(line, f"{apt_get} update", f"{apt_get} install -y -qq chromium chromium-driver")
    assert "passed" not in done.stdout and "-m pytest" not in done.stdout, "no test ran"
