"""CPU kernel emitters; importing this package fills the lowering table."""
from ggmlpy.codegen_cpu.kernels import (  # noqa: F401
    add_id, concat, delta_net, elementwise, matmul, matmul_id, norm, rope, rows, softmax, sort, ssm,
)
