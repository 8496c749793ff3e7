"""Backends for the CUDA tests: the host emulator (always, given g++) and the GPU (when one is
present; otherwise tests using it skip with the reason).

GGMLPY_CUDA_PREBUILD=1 makes a DryRunDriver the "GPU" of the whole session (the gpu tests and
the SmolLM2 ones): every kernel module they load is compiled for sm_90 into the cache
($GGMLPY_CACHE/cuda), nothing runs, and their results are meaningless (they fail). It fills the
cache that travels to a GPU session:
    GGMLPY_CUDA_PREBUILD=1 GGMLPY_CACHE=.device/cache python -m pytest -q tests/ggmlpy/codegen_cuda -k gpu
"""
from __future__ import annotations

import os

import pytest

if os.environ.get("GGMLPY_CUDA_PREBUILD") == "1":
    import ggmlpy.codegen_cuda.driver as _driver

    _dry = _driver.DryRunDriver()
    _driver._probe = lambda: (_dry, "")

from ggmlpy.codegen_cuda.backend import CudaBackend


@pytest.fixture(scope="session")
def emu_driver():
    from ggmlpy.codegen_cuda.emulator import EmuDriver, find_cxx

    if find_cxx() is None:
        pytest.skip("no C++ compiler for the CUDA host emulator")
    return EmuDriver()


@pytest.fixture(scope="session")
def gpu_driver():
    from ggmlpy.codegen_cuda.driver import cuda_available, get_driver

    ok, reason = cuda_available()
    if not ok:
        pytest.skip(f"no CUDA device: {reason}")
    return get_driver()


@pytest.fixture(scope="session", params=["emu", "gpu"])
def device(request):
    """(kind, driver) for each device the session has."""
    if request.param == "emu":
        return "emu", request.getfixturevalue("emu_driver")
    return "gpu", request.getfixturevalue("gpu_driver")


@pytest.fixture(scope="session")
def warm_backends(device):
    """One backend per option set, with every case's kernels compiled in one module each."""
    from .cases import OPTION_SETS, case_specs

    kind, driver = device
    out = {}
    for name, opts in OPTION_SETS.items():
        be = CudaBackend(driver=driver, **opts)
        be.ensure_kernels(case_specs(name).values())
        out[name] = be
    return kind, out


