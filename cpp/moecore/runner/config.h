// MoeRunnerConfig (sglang moe_runner/base.py) plus moecore's force_unfused switch, and the
// process-wide backend state sglang keeps in layers/moe/utils.py.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "moecore/core/dtype.h"
#include "moecore/core/enums.h"
#include "moecore/isa/isa.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/quant_gemm.h"

namespace moecore {

struct MoeRunnerConfig {
  std::optional<int64_t> num_experts;       // global, including fused shared experts
  std::optional<int64_t> num_local_experts;
  std::optional<int64_t> hidden_size;
  std::optional<int64_t> intermediate_size_per_partition;
  std::optional<int64_t> layer_id;
  std::optional<int64_t> top_k;
  std::optional<int64_t> num_fused_shared_experts;
  std::optional<DType> params_dtype;
  std::string activation = "silu";
  bool is_gated = true;
  bool apply_router_weight_on_input = false;
  bool inplace = true;
  bool no_combine = false;
  std::optional<float> routed_scaling_factor;
  std::optional<float> gemm1_alpha;
  std::optional<float> gemm1_clamp_limit;
  std::optional<float> gemm1_beta;
  std::optional<float> swiglu_limit;
  bool gate_up_interleaved = false;
  std::optional<int64_t> routing_method_type;  // FlashInfer RoutingMethodType value, or None
  bool use_tp_all_gather_activation = false;
  /// moecore: skip the fused func and run pre-permute → core → post-permute (rule R3). The env
  /// SGLANG_CI_DISABLE_MOE_FUSED_FUNC=1 has the same effect.
  bool force_unfused = false;
  /// moecore: the kernel level, fixed when a MoeRunner is built (nullopt there means the
  /// current level); backends pick their kernel table row from it, never per call.
  std::optional<IsaLevel> isa_level;
  /// moecore: at the amx level, multiply bf16-exact float operands in AMX tiles
  /// (scaled_gemm_amx_tiles; README, Kernels). Fixed when a MoeRunner is built, like isa_level:
  /// nullopt there means MOECORE_AMX_FLOAT_TILES (default off).
  std::optional<bool> amx_float_tiles;
  /// moecore: process_weights_after_loading prepacks the weights the kernels read in weight tiles
  /// (kernels/weight_tiles.h) when the kernel row streams them: decode reads one stream per tile.
  /// They sit beside the contract layout, doubling the weights' memory; false keeps that only.
  bool prepack_weight_tiles = true;

  /// The level backends build at: isa_level, or the current level for a config that a fused
  /// func or runner core receives directly, without a MoeRunner.
  IsaLevel kernel_level() const { return isa_level.value_or(current_isa_level()); }
  /// The scaled-GEMM row backends build with: kernel_level()'s row, with the AMX float tiles when
  /// amx_float_tiles (nullopt: MOECORE_AMX_FLOAT_TILES, read now).
  ScaledGemmFn gemm_kernel() const {
    return amx_float_tiles ? scaled_gemm_kernel(kernel_level(), *amx_float_tiles)
                           : scaled_gemm_kernel(kernel_level());
  }
};

/// Validates the activation fields and returns the epilogue they describe (rule R15):
/// unknown activation → "Unsupported activation: activation='…'"; alpha/limit with gelu; alpha
/// without limit; relu2 gated; no_combine with inplace. `api` prefixes other messages.
ActivationSpec activation_spec(const MoeRunnerConfig& config, const char* api);

/// Process-wide backends, as sglang's get_moe_a2a_backend() etc. Read by MoeRunner and the
/// quant methods at construction.
MoeA2ABackend get_moe_a2a_backend();
MoeRunnerBackend get_moe_runner_backend();
DeepEPMode get_deepep_mode();
void set_moe_a2a_backend(MoeA2ABackend backend);
void set_moe_runner_backend(MoeRunnerBackend backend);
void set_deepep_mode(DeepEPMode mode);

}  // namespace moecore
