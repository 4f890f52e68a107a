// The permute math and the runner core of the deep_gemm runner backend (deep_gemm.cpp), exposed
// for the bindings and the tests: sglang's moe_ep_deepgemm_preprocess (standard → masked layout),
// post_reorder (masked layout → standard), and the core on either layout (masked [E, m_max, H] +
// masked_m, or contiguous [M, H] + m_indices). All validate their inputs and return new tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/quant/quant_info.h"
#include "moecore/runner/config.h"
#include "moecore/runner/expert_compute.h"

namespace moecore {

/// sglang's DeepGEMM FP8 recipe: 128 × 128 weight blocks, 1 × 128 activation groups.
constexpr int64_t kDeepGemmBlock = 128;

/// What moe_ep_deepgemm_preprocess returns (sglang ep_moe/kernels.py).
struct DeepGemmPreprocessed {
  Tensor masked_m;             // i32 [E]: rows of expert e, count of (token, slot) with id e
  int64_t expected_m = 0;      // ⌈T·k / E⌉
  Tensor src2dst;              // i32 [T·k]: e·m_max + rank of (t, j) among expert e's slots; −1
                               // for ids −1
  Tensor hidden_states;        // [E, m_max, H]: e4m3 codes (use_fp8) or bf16 rows; rows past
                               // masked_m[e] are zero
  Tensor hidden_states_scale;  // f32 [E, m_max, H/128] per-token-group scales (use_fp8), else
                               // undefined
  int64_t m_max = 0;           // (T // 256 + 1) · 256
};

/// Stable sort of the flattened ids by expert; masked_m, m_max, expected_m and src2dst as
/// above; rows gathered into [E, m_max, H]. With use_fp8 each token is quantized once per 128
/// group before the gather (sglang_per_token_group_quant_fp8: s = max(amax, 1e-10)/448,
/// q = x / s; scale_ue8m0 rounds s up to a power of two first). x: bf16 [T, H] (H % 128 == 0
/// with use_fp8); topk_ids i32/i64 [T, k] in [−1, E).
DeepGemmPreprocessed moe_ep_deepgemm_preprocess(const Tensor& topk_ids, int64_t num_local_experts,
                                                const Tensor& hidden_states, bool use_fp8,
                                                bool scale_ue8m0);

/// sglang's post_reorder_triton_kernel, then routed scaling: for each token,
///   out[t] = Σ_{j: id ≥ 0} bf16(bf16(w_j) · down[src2dst[t·k + j]]), summed in slot order with a
///   bf16 rounding after every add (the kernel accumulates in the bf16 input dtype), then
///   out[t] = bf16(out[t] · rsf) when rsf is set. down: bf16 [E, m_max, H]. Returns bf16 [T, H].
Tensor deepgemm_post_reorder(const Tensor& down_output, const Tensor& src2dst,
                             const Tensor& topk_ids, const Tensor& topk_weights,
                             std::optional<float> routed_scaling_factor);

struct DeepGemmWorkspace;

/// post_reorder's arithmetic over one row per (token, slot) — src2dst the identity: out [T, H]
/// bf16 from slot_rows [T·k, H] bf16, row t·k + j holding slot j of token t. DeepEP's combine
/// applies it for the deep_gemm runner. The working memory is sized at construction, so run()
/// allocates nothing.
class SlotReorder {
 public:
  SlotReorder(int64_t max_slots, int64_t hidden, std::optional<float> routed_scaling_factor);
  ~SlotReorder();
  /// The T = tokens.num_tokens tokens' ids and weights (T·k ≤ max_slots); unchecked.
  void run(const RoutedTokens& tokens, const uint16_t* slot_rows, uint16_t* out);

 private:
  std::unique_ptr<DeepGemmWorkspace> workspace_;
  std::vector<int32_t> identity_;
  int64_t hidden_;
  std::optional<float> rsf_;
};

/// The deep_gemm runner core on the masked layout (what DeepGemmRunnerCore.run does with
/// use_masked_gemm=True): hidden_states [E, m_max, H] (e4m3 codes + f32 hidden_states_scale
/// [E, m_max, H/128], or bf16 with no scale), masked_m i32 [E] in [0, m_max]. Returns bf16
/// [E, m_max, H]; rows past masked_m[e] are zero. `config` gives the activation (R15 guards,
/// swiglu_limit) and the ISA level.
Tensor deep_gemm_masked_core(const MoeRunnerConfig& config, const DeepGemmMoeQuantInfo& info,
                             const Tensor& hidden_states, const Tensor& hidden_states_scale,
                             const Tensor& masked_m);

/// The same per-row contract on the contiguous layout (use_masked_gemm=False; sglang's
/// ep_scatter output): hidden_states [M, H] (+ f32 scales [M, H/128] with FP8), m_indices i32
/// [M] = the expert of each row, −1 for padding rows. Each expert's rows are one run starting on
/// a 128-row boundary and M % 128 == 0. Returns bf16 [M, H]; padding rows are zero (a consumer
/// must never read them). Row r's output equals the masked core's for the same row, bit for bit.
Tensor deep_gemm_contiguous_core(const MoeRunnerConfig& config, const DeepGemmMoeQuantInfo& info,
                                 const Tensor& hidden_states, const Tensor& hidden_states_scale,
                                 const Tensor& m_indices);

}  // namespace moecore
