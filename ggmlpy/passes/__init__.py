"""Graph passes (docs/architecture.md, decisions 4 and 5): small pure functions Graph -> Graph, run as a
declared pipeline per backend (pipeline.py), each dumpable after it runs."""
from ggmlpy.passes.buffers import BufferPlan, plan_buffers
from ggmlpy.passes.cse import eliminate_common_subexpressions
from ggmlpy.passes.dce import eliminate_dead_code
from ggmlpy.passes.fusion import FusionGroup, fusion_groups, mark_fusion_groups
from ggmlpy.passes.pipeline import PIPELINES, PipelineResult, run_pipeline
from ggmlpy.passes.views import fold_views

__all__ = ["BufferPlan", "FusionGroup", "PIPELINES", "PipelineResult", "eliminate_common_subexpressions",
           "eliminate_dead_code", "fold_views", "fusion_groups", "mark_fusion_groups", "plan_buffers",
           "run_pipeline"]
