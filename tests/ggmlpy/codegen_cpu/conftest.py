"""Fixtures the CPU kernel tests share."""
from __future__ import annotations

import pytest

from ggmlpy.codegen_cpu.kernels import qvec


@pytest.fixture
def flavour(request):
    """The dot flavour named by the parameter (indirect parametrisation), for one test."""
    qvec.set_flavour(request.param)
    yield request.param
    qvec.set_flavour(None)
