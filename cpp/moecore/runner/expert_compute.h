// The expert computation shared by every backend that runs the expert MLP: input validation,
// the moe_align_block_size layout, the expert-sorted layout, the static (expert, column block)
// schedule of the MLP with its reusable workspace, and the top-k combine. Each backend file
// composes these into its own contract.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/dispatch/types.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/convert.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/kernels/weight_tiles.h"
#include "moecore/routing/topk.h"

namespace moecore {

/// The cost of streaming one weight row in a work item, in units of one activation row's dot over
/// it: what the schedules weigh an (expert, columns) item by (split_by_cost), for balancing only.
constexpr int64_t kWeightRowCost = 4;

/// Validated unquantized expert weights: w13 [E, N1, H] (N1 = 2I gated, else I), w2 [E, H, I],
/// optional biases b13 [E, N1], b2 [E, H] (f32, f16 or bf16). All contiguous.
struct ExpertWeights {
  TensorView w13, w2, b13, b2;  // b13/b2 have data == nullptr when absent
  const WeightTileSet* tiles = nullptr;  // the payload's weight tiles (dense_expert_mlp attaches)
  int64_t num_experts = 0, n1 = 0, hidden = 0, inter = 0;
  DType dtype = DType::kF32;
};
ExpertWeights check_expert_weights(const char* api, const Tensor& w13, const Tensor& w2,
                                   const Tensor& b13, const Tensor& b2, bool gated);

/// Validated routed tokens: x [T, H] (rows contiguous), topk ids i32/i64 [T, k] with values in
/// [-1, E), topk weights f32 [T, k]. Checks everything before any output is written.
struct RoutedTokens {
  TensorView x, topk_ids, topk_weights;
  int64_t num_tokens = 0, top_k = 0;
  int32_t id(int64_t t, int64_t j) const;
  float weight(int64_t t, int64_t j) const;
};
RoutedTokens check_routed_tokens(const char* api, const Tensor& x, const StandardTopKOutput& topk,
                                 const ExpertWeights& weights);

/// The standard top-k output a prepared run reads in place; Unsupported for a bypassed one
/// (its routing would run once, at prepare, instead of on every run).
StandardTopKOutput prepared_topk(const TopKOutput& topk);

/// sglang moe_align_block_size: for each expert in order, its (token, slot) indices t·k + j in
/// increasing order, padded to a multiple of block_m with the sentinel T·k. Ids −1 are left out.
struct BlockLayout {
  Tensor sorted_token_ids;  // i32 [num_tokens_post_padded]
  Tensor expert_ids;        // i32 [num_tokens_post_padded / block_m]
  int64_t num_tokens_post_padded = 0;
  int64_t block_m = 0;
};
BlockLayout align_block_size(const RoutedTokens& tokens, int64_t num_experts, int64_t block_m);
/// The same layout into caller buffers: sorted_token_ids needs max_padded_slots(T·k, E, block_m)
/// entries, expert_ids that / block_m, start E + 1 (scratch). Returns num_tokens_post_padded.
int64_t align_block_size_into(const RoutedTokens& tokens, int64_t num_experts, int64_t block_m,
                              int32_t* sorted_token_ids, int32_t* expert_ids, int64_t* start);
/// The largest num_tokens_post_padded of `slots` (token, slot) pairs over num_experts experts.
int64_t max_padded_slots(int64_t slots, int64_t num_experts, int64_t block_m);

/// The valid slot indices t·k + j of block `block` of that layout, in order (entries at or past
/// `sentinel` are padding); returns how many were written to `slots` (at most block_m).
int64_t block_slots(const int32_t* sorted_token_ids, int64_t block, int64_t block_m,
                    int64_t sentinel, int64_t* slots);

/// The torch-native layout: valid slot indices stably sorted by expert, and per-expert counts.
struct SortedLayout {
  Tensor idxs;               // i64 [num_valid]
  Tensor tokens_per_expert;  // i64 [E]
};
SortedLayout sort_by_expert(const RoutedTokens& tokens, int64_t num_experts);

/// Where a per-row scale (the routed weight) multiplies: nowhere, GEMM1's or GEMM2's fp32 result.
enum class RowScaleAt { kNone, kGemm1, kGemm2 };

/// A backend's activation quantizer for one GEMM input: turns m rows of fp32 values (stride ld,
/// width k) into codes in place and writes scales [m, scales_per_row]. It must treat each row
/// on its own (batch invariance).
using ActivationQuantizer =
    std::function<void(float* rows, int64_t m, int64_t k, int64_t ld, float* scales)>;

/// One GEMM of the expert MLP: its weights, optional bias [E, N] (f32/f16/bf16), and how its
/// input is quantized (empty quantizer: used as it is).
struct ExpertGemm {
  WeightOperand weight;
  TensorView bias;  // data == nullptr: none
  ActivationQuantizer quantize;
  int64_t scales_per_row = 1;
  bool integer_codes = false;  // the quantizer emits int8 values (exact int32 dot with kInt8)
  // > 0: the quantizer treats each run of this many columns from column 0 (the last may be
  // shorter) on its own, with one scale per run when scales_per_row > 1 (per-token-group and
  // nvfp4 rules, elementwise static ones with 1). GEMM2's input is then quantized in GEMM1's
  // epilogue, column block by column block. 0: whole rows (per-token rules).
  int64_t quantize_segment = 0;
};

/// Validation a GEMM1 work item runs before its GEMM: expert e, activation columns
/// [col0, col0 + cols) of I. It throws to fail the call, which then writes no output.
using Gemm1ItemCheck = std::function<void(int64_t e, int64_t col0, int64_t cols)>;

/// The whole expert MLP contract: GEMM1 (N1 = 2I gated, else I) → activation → GEMM2 (H).
struct ExpertMlp {
  ExpertGemm gemm1, gemm2;
  ActivationSpec activation;  // its round_dtype is overridden by act_dtype
  /// GPT-OSS clamped SwiGLU with α, β and limit per expert (f32 [E] each, all or none:
  /// FlashInfer MXFP4's swiglu tensors): expert e's replace the activation's alpha, beta and
  /// clamp_limit. data == nullptr: the activation's for every expert.
  TensorView expert_alpha, expert_beta, expert_limit;
  Gemm1ItemCheck check_gemm1_item;  // empty: none
  DType act_dtype = DType::kF32;
  ScaledGemmFn gemm = nullptr;  // the kernel row, picked at construction (config.isa_level)
  int64_t hidden = 0, inter = 0;
};
/// Both GEMMs' weights read the tiles of their codes in `set`, where it has them (a payload's
/// weight_tiles; nullptr: none).
inline void attach_weight_tiles(const WeightTileSet* set, ExpertMlp& mlp) {
  attach_weight_tiles(set, mlp.gemm1.weight);
  attach_weight_tiles(set, mlp.gemm2.weight);
}

/// The dense (unquantized) MLP over validated weights.
ExpertMlp dense_expert_mlp(const ExpertWeights& w, const ActivationSpec& spec, ScaledGemmFn gemm);

/// The rows of one call in compacted expert order: rows [offsets[e], offsets[e + 1]) go to
/// expert e; row r loads GEMM1 input row source[r] and writes output row dest[r]; scale[r] is
/// its routed weight (empty when nothing is scaled). Built by the backend for every call.
struct ExpertRowMap {
  std::vector<int64_t> offsets, source, dest;
  std::vector<float> scale;

  int64_t num_experts() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
  /// The valid slots s = t·k + j of `tokens`, by expert, increasing s within an expert (the
  /// moe_align_block_size order): source t, dest s, scale w[t, j] when with_scale.
  void group_slots(const RoutedTokens& tokens, int64_t num_experts, bool with_scale);
  /// The same rows read from a moe_align_block_size layout (blocks in expert order).
  void from_block_layout(const int32_t* sorted_token_ids, const int32_t* expert_ids,
                         int64_t num_blocks, int64_t block_m, const RoutedTokens& tokens,
                         int64_t num_experts, bool with_scale);
  /// Rows already sorted by expert, counts[e] of expert e: source = dest = the row.
  void sorted_rows(const int64_t* counts, int64_t num_experts);
  /// Capacity for calls of up to max_rows rows over num_experts experts (no later allocation).
  void reserve(int64_t max_rows, int64_t num_experts);

 private:
  // dest holds slots t·k + j: source = t, scale = w[t, j] when with_scale.
  void slots_to_sources(const RoutedTokens& tokens, bool with_scale);
};

/// A non-owning reference to `void(int64_t source_row, float* dst)` that writes one GEMM1 input
/// row (H fp32 values holding act-dtype values or codes); no allocation.
class SourceRowFn {
 public:
  template <typename F>
  SourceRowFn(const F& f)  // NOLINT: implicit on purpose, like RangeFn
      : object_(static_cast<const void*>(&f)), call_([](const void* o, int64_t row, float* dst) {
          (*static_cast<const F*>(o))(row, dst);
        }) {}
  void operator()(int64_t row, float* dst) const { call_(object_, row, dst); }

 private:
  const void* object_;
  void (*call_)(const void*, int64_t, float*);
};

struct TopkSum;
struct Gemm2Items;

/// The buffers of the expert schedule, owned by a runner core or a fused func and reused across
/// calls: they grow only when a call needs more, so a steady state allocates nothing. One call
/// at a time: the caller holds `mutex` for the whole call (a runner used from two threads takes
/// turns).
class ExpertWorkspace {
 public:
  /// One work item of a GEMM: output columns [col, col + cols) of expert `expert`'s rows.
  struct Item {
    int64_t expert, col, cols;
  };

  std::mutex mutex;  // held by the caller for a whole call (rows, then the schedule)
  ExpertRowMap rows;

  /// Grows every buffer for calls of `mlp` with up to max_rows rows on the thread pool's current
  /// thread count, so that such calls allocate nothing (a prepared run calls this once).
  void reserve(const ExpertMlp& mlp, int64_t max_rows);

 private:
  friend void expert_gemm1_phase(const ExpertMlp&, ExpertWorkspace&, SourceRowFn, RowScaleAt);
  friend void expert_gemm2_phase(const ExpertMlp&, ExpertWorkspace&, RowScaleAt,
                                 const TensorView&);
  friend void expert_gemm2_summed_phase(const ExpertMlp&, ExpertWorkspace&, RowScaleAt,
                                        const TopkSum&);
  friend const float* expert_activations(const ExpertWorkspace&);
  friend struct Gemm2Items;
  std::vector<float> a_, scales1_, h1_, h2_, scales2_, y_, bias_;
  std::vector<uint8_t> source_used_;
  std::vector<int64_t> slot_row_;  // the row of each slot t·k + j, or −1 (summed phase 2)
  // Summed phase 2: per (token, GEMM2 column block), the token's rows not yet final; an array
  // because atomics do not move (a vector could not grow it).
  std::unique_ptr<std::atomic<int32_t>[]> pending_rows_;
  int64_t pending_rows_size_ = 0;
  std::vector<Item> items_;
  std::vector<int64_t> part_begin_;
  std::vector<GemmScratch> scratch_;  // one per schedule part
};

/// The static schedule of the expert MLP over ws.rows (DESIGN.md §4): every expert's weights are
/// read once per call, in L2-sized column blocks, and every thread has work even when one
/// expert is hit. Each output element is the same dot in the same order whatever the blocks, the
/// thread count or the batch, so results are bitwise batch invariant.
///   phase 1: each source row the call reads loaded and GEMM1-quantized once (the k slots of a
///            token share it: no permuted copy); GEMM1 over (expert, activation column block)
///            items, each computing the GEMM1 columns its block reads (both halves when gated)
///            into the compacted [rows, N1] buffer, + b13 (× scale if kGemm1), rounded; then,
///            in the same item, the activation of its block, rounded to act_dtype, and GEMM2's
///            quantization of it when GEMM2's quantizer works on segments.
///   phase 2: GEMM2-quantized per row (unless phase 1 did it); GEMM2 over (expert, H column
///            block) items, + b2 (× scale if kGemm2), rounded, each row stored to row dest[r]
///            of out ([*, H]; out.data == nullptr: the rows stay in the workspace only).
/// The caller holds ws.mutex. run_expert_mlp runs both phases; a backend whose GEMM2 quantizer
/// needs the whole batch (dynamic per-tensor scale) runs them apart and reads the activations
/// (expert_activations: [rows, I] fp32) in between.
void run_expert_mlp(const ExpertMlp& mlp, ExpertWorkspace& ws, SourceRowFn load,
                    RowScaleAt scale_at, const TensorView& out);
void expert_gemm1_phase(const ExpertMlp& mlp, ExpertWorkspace& ws, SourceRowFn load,
                        RowScaleAt scale_at);
const float* expert_activations(const ExpertWorkspace& ws);
void expert_gemm2_phase(const ExpertMlp& mlp, ExpertWorkspace& ws, RowScaleAt scale_at,
                        const TensorView& out);

/// The top-k sum of combine_topk, read from GEMM2's compacted rows instead of stored per-slot
/// rows: out[t] = round(rsf · Σ_j v[t, j] (× w[t, j] if weighted)) over token t's slots j
/// with id ≥ 0 in increasing j, where v[t, j] is the slot's GEMM2 row as phase 2 would store it
/// (+0 for a slot no row computes). The same bits as expert_gemm2_phase then combine_topk.
/// With `bias` (TRT-LLM's finalize), v[t, j] = the slot's rounded GEMM2 row + bias[e] in fp32,
/// e its expert (GEMM2 then has no bias of its own; a slot no row computes still gives +0).
struct TopkSum {
  const RoutedTokens* tokens = nullptr;
  bool weighted = false;
  float routed_scaling_factor = 1.0f;
  TensorView out;   // [T, W ≤ H], rows contiguous: the first W columns of each token's sum
  TensorView bias;  // [E, H] (f32/f16/bf16, contiguous); data == nullptr: none
};
/// Phase 2 with the top-k sum in GEMM2's epilogue and no per-slot rows: GEMM2's (expert, column
/// block) items leave their rounded rows in the workspace, and the item that finishes a token's
/// last row of a column block sums the token's slots over that block from there (whichever item
/// it is, the same arithmetic in slot order: the same bits). Tokens with no row get their zeros
/// from the items' threads too, so the phase is one parallel step. ws.rows must map rows to slots
/// (dest[r] = t·k + j: group_slots or from_block_layout).
void expert_gemm2_summed_phase(const ExpertMlp& mlp, ExpertWorkspace& ws, RowScaleAt scale_at,
                               const TopkSum& sum);

/// The GEMM1 input of row t: token t's hidden state, in fp32 (a SourceRowFn target; `tokens`
/// must outlive the returned loader).
inline auto token_rows(const RoutedTokens& tokens) {
  return [&tokens](int64_t t, float* dst) {
    load_f32(tokens.x.at({t, 0}), tokens.x.dtype, tokens.x.shape[1], dst);
  };
}

/// Per-slot outputs [T, k, H] (contiguous) seen as rows [T·k, H]: row s = slot s = t·k + j.
TensorView slot_rows(const TensorView& slots);

/// Combine in fp32: out[t] = round(rsf · Σ_j slot_out[t, j] (× w[t, j] if weighted)) over valid
/// slots j in increasing order. slot_out: [T, k, H] of act dtype.
void combine_topk(const RoutedTokens& tokens, const TensorView& slot_out, bool weighted, float rsf,
                  const TensorView& out);

/// In place: slot_out[t, j] = round(w[t, j] · slot_out[t, j]) for valid slots (fp32 product).
void weight_slots(const RoutedTokens& tokens, const TensorView& slot_out);

}  // namespace moecore
