"""Pure-numpy golden implementations of moecore's numerics (one module per part).

They never import the compiled extension or torch, so tests can check the core against them
and check them against independent packages. Add each new module's public names below.
"""

from .routing import compute_scores_ref, select_experts_ref, topk_order_ref

__all__ = ["compute_scores_ref", "select_experts_ref", "topk_order_ref"]

from .moe import activation_ref, fused_moe_ref, moe_layer_ref  # noqa: E402

__all__ += ["activation_ref", "fused_moe_ref", "moe_layer_ref"]

from . import layout, quant  # noqa: E402
from .layout import *  # noqa: E402, F403
from .quant import *  # noqa: E402, F403

__all__ += quant.__all__ + layout.__all__

from . import moe_nvfp4  # noqa: E402
from .moe_nvfp4 import cutedsl_v2_moe_ref, flashinfer_cutlass_moe_ref  # noqa: E402

__all__ += ["moe_nvfp4", "cutedsl_v2_moe_ref", "flashinfer_cutlass_moe_ref"]

from . import moe_mxfp4  # noqa: E402
from .moe_mxfp4 import (  # noqa: E402
    dsv4_sm90_layout_ref,
    flashinfer_mxfp4_moe_ref,
    gpt_oss_sm90_layout_ref,
)

__all__ += ["moe_mxfp4", "flashinfer_mxfp4_moe_ref", "gpt_oss_sm90_layout_ref",
            "dsv4_sm90_layout_ref"]
