"""Suite-wide settings: one BLAS thread, here and in the subprocesses tests start.

The models under test are small; multi-threaded BLAS only adds contention
(several times slower on a loaded 2-core machine) and changes no result a
test checks. OPENBLAS_CORETYPE is left as the environment sets it.
"""

import os

import pytest
from threadpoolctl import threadpool_limits

for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = "1"


@pytest.fixture(autouse=True, scope="session")
def one_blas_thread():
    with threadpool_limits(limits=1):
        yield


def pytest_configure(config):
    config.addinivalue_line("markers", "faults: slow fault-injection tests with real processes (make test-faults)")
