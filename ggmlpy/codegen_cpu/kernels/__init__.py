"""CPU kernel emitters; importing this package fills the lowering table."""
from ggmlpy.codegen_cpu.kernels import elementwise, matmul, norm, rope, rows, softmax  # noqa: F401
