"""The tensor IR: types, symbolic dims, tensors, graphs, the op registry and the builder."""
from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.symbolic import N_KV, N_OUTPUTS, N_TOKENS, Dim, SymExpr
from ggmlpy.ir.tensor import Flag, Tensor
from ggmlpy.ir.types import GGMLType

__all__ = ["Dim", "Flag", "GGMLType", "Graph", "GraphBuilder", "N_KV", "N_OUTPUTS", "N_TOKENS",
           "SymExpr", "Tensor"]
