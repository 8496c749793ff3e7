"""CPU kernel emitters; importing this package fills the lowering table."""
from ggmlpy.codegen_cpu.kernels import (  # noqa: F401
    add_id, concat, delta_net, elementwise, kv_quant, matmul, matmul_id, norm, rope, rows, softmax, sort, ssm,
)
