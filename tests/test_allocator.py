"""attn.train.allocator: with glibc's thresholds fixed, a loop that creates and
drops large arrays stops page-faulting them in afresh. Each case runs in its
own interpreter: the setting is process-wide."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# ten "steps", each allocating and touching 8, 8, 16 and 4 MiB of float32,
# then dropping them, as a training step does with its temporaries
FAULTS_OF_TEN_STEPS = """
import resource, sys
import numpy as np
from attn.train import allocator
calls = {"default": 0, "keep": 1, "keep-twice": 2}[sys.argv[1]]
applied = all([allocator.keep_freed_memory() for _ in range(calls)]) if calls else None
def step():
    arrays = [np.ones(mib * 2**18, dtype=np.float32) for mib in (8, 8, 16, 4)]
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def minor_faults(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", FAULTS_OF_TEN_STEPS, mode], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    return out[0], int(out[1])


PAGES = 10 * 36 * 2**20 // 4096  # 4 KiB pages touched; transparent huge pages fault 2 MiB at a time


def test_freed_arrays_are_reused_instead_of_faulted_in_again():
    applied, kept = minor_faults("keep")
    if applied != "True":
        pytest.skip("this C library has no glibc mallopt")
    _, default = minor_faults("default")
    assert kept < PAGES // 100, f"with freed memory kept, the steps should barely fault: {kept} faults, {PAGES} pages"
    assert default > 10 * max(kept, 1), f"glibc's defaults fault the arrays in again: {default} faults vs {kept}"


def test_a_second_call_is_taken_too_and_keeps_the_setting():
    if minor_faults("keep")[0] != "True":
        pytest.skip("this C library has no glibc mallopt")
    applied, kept = minor_faults("keep-twice")
    assert applied == "True" and kept < PAGES // 100, (applied, kept)
