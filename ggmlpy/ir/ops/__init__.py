"""Every op of the IR. Importing this package registers them all (see registry.py)."""
from ggmlpy.ir.ops import (  # noqa: F401  (registration side effects)
    delta_net, elementwise, experts, layout, matmul, norm, out_prod, reduce, rope, rows, softmax, sort, ssm,
)
from ggmlpy.ir.ops.registry import API, OPS, Inferred, Kind, OpCase, OpDef, SrcSpec, get_op, register

__all__ = ["API", "OPS", "Inferred", "Kind", "OpCase", "OpDef", "SrcSpec", "get_op", "register"]
