// The activation payload of the expert-parallel dispatchers (sglang's DeepEPOutputDtype): how a
// token's hidden row is quantized before it is sent, and the byte record it travels as. Reuses
// formats/quantize.h's quantizers; nothing here talks to a Transport.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/dispatch/dispatcher.h"

namespace moecore {

/// sglang's DeepEPOutputDtype, less INT8 (which moecore's dispatchers do not send).
enum class DispatchPayload { kBF16, kFP8, kNVFP4 };
const char* payload_name(DispatchPayload payload);
/// "bf16" | "fp8" | "nvfp4"; "int8" and anything else raise.
DispatchPayload parse_payload(const std::string& name, const char* api);
/// quant_config["input_global_scale"] as one positive finite float (a Tensor of one f32 value or
/// a number), or nullopt when absent or None.
std::optional<float> input_global_scale(const QuantConfig& config, const char* api);

/// How one bf16 hidden row of H values is quantized for sending:
///   kBF16  q bf16 [H], no scale;
///   kFP8   q e4m3 [H], scale f32 [H/128] (per-token-group-128, sglang's
///          per_token_group_quant_fp8; with ue8m0 the scales are rounded up to powers
///          of two and packed as DeepEP sends them: int32 [⌈H/512⌉], four E8M0 bytes a word);
///   kNVFP4 q packed e2m1 [H/2], scale e4m3 [H/16] (linear), with the global scale.
/// A row travels as its q bytes followed by its scale bytes. Eager dispatch (quantize_payload)
/// and captured rounds both encode through encode_row, so their bits agree.
struct PayloadCodec {
  DispatchPayload payload = DispatchPayload::kBF16;
  int64_t hidden = 0;
  float global_scale = 1.0f;  // kNVFP4
  bool ue8m0 = false;         // kFP8
  DType q_dtype() const;
  /// The scale's last dim and dtype (kBF16 has none: 0 columns).
  int64_t scale_cols() const;
  DType scale_dtype() const;
  int64_t q_bytes() const;
  int64_t scale_bytes() const;
  int64_t row_bytes() const { return q_bytes() + scale_bytes(); }
  /// Encodes one row with no allocation. Returns false, with q and scale unspecified, when a
  /// quantized payload meets a non-finite value.
  bool encode_row(const uint16_t* bf16_row, uint8_t* q, uint8_t* scale) const;
  /// The InvalidArgument encode_row's false turns into; `api` names the caller.
  [[noreturn]] void throw_non_finite(const char* api, int64_t row) const;
};

/// Rows of a payload: q [lead..., q cols] and scale [lead..., scale cols] (undefined for kBF16).
struct PayloadRows {
  PayloadCodec codec;
  Tensor q, scale;
  int64_t q_bytes() const { return codec.q_bytes(); }
  int64_t scale_bytes() const { return codec.scale_bytes(); }
  int64_t row_bytes() const { return codec.row_bytes(); }
  uint8_t* q_row(int64_t row) const {
    return static_cast<uint8_t*>(q.view().data) + row * q_bytes();
  }
  uint8_t* scale_row(int64_t row) const {
    return scale_bytes() ? static_cast<uint8_t*>(scale.view().data) + row * scale_bytes() : nullptr;
  }
  /// The wire record of a row: its q bytes, then its scale bytes.
  void write_row(int64_t row, uint8_t* dst) const;
  void read_row(const uint8_t* src, int64_t row) const;
};

/// Zeroed rows (leading shape `lead`) of the codec's layout.
PayloadRows allocate_payload(const PayloadCodec& codec, const std::vector<int64_t>& lead);
/// The [T, H] bf16 activation (contiguous rows) encoded row by row; a non-finite value in a
/// quantized payload raises InvalidArgument naming `api` and the row.
PayloadRows quantize_payload(const char* api, const Tensor& x, const PayloadCodec& codec);

/// Validates a dispatcher's input: hidden_states bf16 [T, H] with contiguous rows, and a
/// standard top-k output (bypassed ones are materialised) with ids in [−1, num_experts) and f32
/// weights [T, top_k]. Returns the standard top-k with contiguous i32 ids and f32 weights.
StandardTopKOutput check_dispatch_input(const char* api, const Tensor& hidden_states,
                                        const TopKOutput& topk, int64_t hidden, int64_t top_k,
                                        int64_t num_experts);

/// check_dispatch_input for the static buffers of a prepared round, which it reads in place:
/// also requires contiguous i32 ids and f32 weights.
void check_round_buffers(const char* api, const Tensor& hidden_states,
                         const StandardTopKOutput& topk, int64_t hidden, int64_t top_k,
                         int64_t num_experts);

/// The rows a combine reads: defined, bf16 and contiguous `shape` (`what`: "expert outputs" or
/// "partial outputs").
void check_combine_rows(const char* api, const char* what, const Tensor& hidden,
                        const std::vector<int64_t>& shape);

/// A prepared round's outgoing side for its first num_tokens tokens, allocation-free: checks
/// their ids (−1 or in [0, num_experts)) and encodes their hidden rows into `staged`, refusing a
/// row a quantized payload cannot carry, as eager dispatch does.
void stage_round_tokens(const char* api, const Tensor& hidden_states,
                        const StandardTopKOutput& topk, int64_t num_tokens, int64_t num_experts,
                        PayloadRows& staged);

/// Appends a trivially copyable value to a byte record.
template <typename T>
void append_bytes(std::vector<uint8_t>& out, const T* values, int64_t count) {
  const auto* p = reinterpret_cast<const uint8_t*>(values);
  out.insert(out.end(), p, p + count * static_cast<int64_t>(sizeof(T)));
}

}  // namespace moecore
