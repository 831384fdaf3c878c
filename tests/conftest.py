"""Suite-wide settings: one BLAS thread, here and in the subprocesses tests start;
subnormal floats kept at the start of every test; fsync a check of its file
descriptor in the test processes (below); the board tests' Chromium (chromium.py).

The models under test are small; multi-threaded BLAS only adds contention
(several times slower on a loaded 2-core machine) and changes no result a
test checks. OPENBLAS_CORETYPE is left as the environment sets it.
"""

import errno
import os
import stat

import pytest
from chromium import browser, chromium_session  # noqa: F401  (the board's browser tests' fixtures)
from threadpoolctl import threadpool_limits

from attn.train import denormals

for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = "1"

import numpy as np  # noqa: E402  (after the thread variables, which BLAS reads as numpy loads it)


def fsync_checked(fd) -> None:
    """os.fsync in the test processes: what it checks (a descriptor, or an object with fileno(), open on a
    regular file or a directory: a closed one raises EBADF, a pipe EINVAL, as fsync would), without the
    wait for the disk. What fsync adds, a file on the disk after a power cut, no test can observe (a kill
    leaves the page cache as written), and its waits were the suite's largest idle time. The calls are
    still made, and counted where a test counts them; the processes tests start fsync as attn does."""
    mode = os.fstat(fd if isinstance(fd, int) else fd.fileno()).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))


os.fsync = fsync_checked

# numpy's float limits computed now, with subnormals kept: a test module importing attn.cli flushes them
# for the rest of the collection (attn.train.denormals), and np.finfo computed then warns.
for dtype in (np.float32, np.float64):
    np.finfo(dtype)


@pytest.fixture(autouse=True, scope="session")
def one_blas_thread():
    with threadpool_limits(limits=1):
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """IEEE gradual underflow at the start of every test, before its fixtures
    (a module's too): importing attn.cli flushes subnormals on the importing
    thread (attn.train.denormals), which would make a test's arithmetic depend
    on which tests ran before it in its worker."""
    denormals.set_flushing(False)


def pytest_configure(config):
    config.addinivalue_line("markers", "faults: slow fault-injection tests with real processes (make test-faults)")
    config.addinivalue_line(
        "markers",
        "slow: whole commands end to end (sweeps signalled or killed, publish killed, the demo, the benches, "
        "the MLflow export): make test-slow, which CI runs",
    )
