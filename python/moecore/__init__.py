"""moecore: sglang's MoE runner architecture as an executable C++ core, on CPUs.

The names mirror sglang's (``MoeRunner``, ``MoeRunnerConfig``, ``StandardDispatchOutput``,
``TopKConfig``, ``select_experts``, ``register_fused_func``, the QuantInfo classes and the
enums), so a harness written against sglang's MoE runner ports with small edits. Arrays are
numpy arrays and cross into C++ without copies.
"""

from __future__ import annotations

import contextlib

from . import errors  # first: the extension maps its exceptions to these classes
from .errors import (
    ContractAssertionError,
    DTypeError,
    InternalError,
    InvalidArgumentError,
    MoecoreError,
    OutOfRangeError,
    UnsupportedError,
)
from . import _moecore
from .enums import (
    Activation,
    CombineInputFormat,
    DeepEPMode,
    DispatchOutputFormat,
    MoeA2ABackend,
    MoeRunnerBackend,
    ScoringFunc,
    TopKOutputFormat,
)
from .dtypes import Tagged, tagged
from . import formats
from ._moecore import (
    BypassedTopKOutput,
    CapturedForward,
    CombineInput,
    CuteDslFp4MoeQuantInfo,
    DeepEPLLCombineInput,
    DeepEPLLDispatchOutput,
    DeepEPNormalCombineInput,
    DeepEPNormalDispatchOutput,
    DeepGemmMoeQuantInfo,
    FlashinferCombineInput,
    FlashinferDispatchOutput,
    FlashInferCutlassMoeQuantInfo,
    FlashInferMxfp4CutlassMoeQuantInfo,
    Fp8MoEMethod,
    ModelOptFp8MoEMethod,
    ModelOptNvFp4FusedMoEMethod,
    Mxfp4FlashinferCutlassMoEMethod,
    Mxfp4MoEMethod,
    W8A16Int8MoEMethod,
    W8A8Int8MoEMethod,
    cutedsl_quant_scale_to_scalar,
    cutlass_fused_moe_mxfp4,
    resolve_cutedsl_standard_scales,
    DeepEPDispatcher,
    DispatchOutput,
    ExpertParallelGroup,
    FlashinferDispatcher,
    FusedMoE,
    FusedMoEMethodBase,
    LoopbackGroup,
    MoeQuantInfo,
    MoeRunner,
    MoeRunnerConfig,
    PreparedRun,
    StandardCombineInput,
    StandardDispatchOutput,
    StandardDispatcher,
    StandardTopKOutput,
    TopKConfig,
    TorchNativeMoeQuantInfo,
    Transport,
    TritonMoeQuantInfo,
    UnquantizedFusedMoEMethod,
    available_isa_levels,
    cpu_features,
    detected_isa_level,
    get_deepep_mode,
    get_fused_func,
    get_isa_level,
    get_moe_a2a_backend,
    get_moe_runner_backend,
    get_num_threads,
    register_fused_func,
    register_post_permute,
    register_pre_permute,
    register_runner_core,
    registered_fused_funcs,
    registered_post_permutes,
    registered_pre_permutes,
    registered_runner_cores,
    select_experts,
    set_deepep_mode,
    set_isa_level,
    set_moe_a2a_backend,
    set_moe_runner_backend,
    set_num_threads,
    unregister_fused_func,
    unregister_post_permute,
    unregister_pre_permute,
    unregister_runner_core,
)

from .graph import MoeGraphRunner

__version__ = "0.1.0"


@contextlib.contextmanager
def moe_backend_context(a2a_backend=None, runner_backend=None, deepep_mode=None):
    """Sets the process-wide a2a backend, runner backend and/or DeepEP mode for a block and
    restores the previous values on exit (like sglang's speculative-decoding backend swap).
    Runners read them when they are built, so a runner keeps what it was built with."""
    previous = (get_moe_a2a_backend(), get_moe_runner_backend(), get_deepep_mode())
    try:
        if a2a_backend is not None:
            set_moe_a2a_backend(a2a_backend)
        if runner_backend is not None:
            set_moe_runner_backend(runner_backend)
        if deepep_mode is not None:
            set_deepep_mode(deepep_mode)
        yield
    finally:
        set_moe_a2a_backend(previous[0])
        set_moe_runner_backend(previous[1])
        set_deepep_mode(previous[2])


@contextlib.contextmanager
def isa_level(level: str):
    """Forces an ISA level for runners built inside the block; restores the previous one."""
    previous = get_isa_level()
    set_isa_level(level)
    try:
        yield
    finally:
        set_isa_level(previous)


__all__ = [
    # errors
    "MoecoreError", "InvalidArgumentError", "DTypeError", "UnsupportedError", "OutOfRangeError",
    "ContractAssertionError", "InternalError", "errors",
    # enums
    "MoeRunnerBackend", "MoeA2ABackend", "DeepEPMode", "DispatchOutputFormat",
    "CombineInputFormat", "TopKOutputFormat", "ScoringFunc", "Activation",
    # routing
    "TopKConfig", "StandardTopKOutput", "BypassedTopKOutput", "select_experts",
    # dispatch
    "DispatchOutput", "CombineInput", "StandardDispatchOutput", "StandardCombineInput",
    "StandardDispatcher",
    "DeepEPNormalDispatchOutput", "DeepEPLLDispatchOutput", "FlashinferDispatchOutput",
    "DeepEPNormalCombineInput", "DeepEPLLCombineInput", "FlashinferCombineInput",
    "Transport", "LoopbackGroup", "DeepEPDispatcher", "FlashinferDispatcher",
    # runner and registries
    "MoeRunnerConfig", "MoeRunner", "register_fused_func", "register_pre_permute",
    "register_post_permute", "register_runner_core", "unregister_fused_func",
    "unregister_pre_permute", "unregister_post_permute", "unregister_runner_core", "get_fused_func",
    "registered_fused_funcs", "registered_pre_permutes", "registered_post_permutes",
    "registered_runner_cores",
    # quant payloads and methods
    "MoeQuantInfo", "TritonMoeQuantInfo", "TorchNativeMoeQuantInfo", "DeepGemmMoeQuantInfo",
    "CuteDslFp4MoeQuantInfo", "FlashInferCutlassMoeQuantInfo",
    "FlashInferMxfp4CutlassMoeQuantInfo", "FusedMoEMethodBase", "UnquantizedFusedMoEMethod",
    "Fp8MoEMethod", "ModelOptFp8MoEMethod", "ModelOptNvFp4FusedMoEMethod", "Mxfp4MoEMethod",
    "Mxfp4FlashinferCutlassMoEMethod", "W8A8Int8MoEMethod", "W8A16Int8MoEMethod",
    "cutedsl_quant_scale_to_scalar", "resolve_cutedsl_standard_scales", "cutlass_fused_moe_mxfp4",
    # layer
    "FusedMoE", "ExpertParallelGroup",
    # capture and replay
    "PreparedRun", "CapturedForward", "MoeGraphRunner",
    # process-wide state
    "get_moe_a2a_backend", "get_moe_runner_backend", "get_deepep_mode", "set_moe_a2a_backend",
    "set_moe_runner_backend", "set_deepep_mode", "moe_backend_context",
    # machine
    "set_num_threads", "get_num_threads", "detected_isa_level", "get_isa_level",
    "set_isa_level", "available_isa_levels", "cpu_features", "isa_level",
    # dtypes and formats
    "Tagged", "tagged", "formats",
]
