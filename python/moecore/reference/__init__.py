"""Pure-numpy golden implementations of moecore's numerics (one module per part).

They never import the compiled extension or torch, so tests can check the core against them
and check them against independent packages. Add each new module's public names below.
"""

from .routing import compute_scores_ref, select_experts_ref, topk_order_ref

__all__ = ["compute_scores_ref", "select_experts_ref", "topk_order_ref"]

from .moe import activation_ref, fused_moe_ref, moe_layer_ref  # noqa: E402

__all__ += ["activation_ref", "fused_moe_ref", "moe_layer_ref"]
