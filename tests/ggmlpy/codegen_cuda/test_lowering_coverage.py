"""Every computing op of the registry has a CUDA lowering, or is listed here (docs/architecture.md,
decision 2): adding a lowering or losing one fails the test until the list says so."""
from __future__ import annotations

from ggmlpy.codegen_cuda import fusion as _fusion  # noqa: F401  (imports every lower_* module)
from ggmlpy.codegen_cuda.lowering import LOWERINGS
from ggmlpy.ir.ops import OPS, Kind

# ops the CUDA backend leaves to the next backend (the scheduler runs them on the CPU)
NOT_LOWERED: set[str] = set()


def test_every_op_has_a_cuda_lowering():
    missing = {name for name, op in OPS.items() if op.kind != Kind.VIEW and name not in LOWERINGS}
    assert missing == NOT_LOWERED


def test_lowerings_are_for_registry_ops():
    assert sorted(op for op in LOWERINGS if op not in OPS) == []
