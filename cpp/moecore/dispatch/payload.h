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

/// A [T, H] bf16 activation quantized for sending:
///   kBF16  q bf16 [T, H], no scale;
///   kFP8   q e4m3 [T, H], scale f32 [T, H/128] (per-token-group-128, sglang's
///          per_token_group_quant_fp8; with ue8m0 the scales are rounded up to powers
///          of two and packed as DeepEP sends them: int32 [T, ⌈H/512⌉], four E8M0 bytes a word);
///   kNVFP4 q packed e2m1 [T, H/2], scale e4m3 [T, H/16] (linear), with the global scale.
/// A row travels as its q bytes followed by its scale bytes.
struct PayloadRows {
  DispatchPayload payload = DispatchPayload::kBF16;
  Tensor q, scale;
  int64_t q_bytes = 0, scale_bytes = 0;  // per row
  int64_t row_bytes() const { return q_bytes + scale_bytes; }
  void write_row(int64_t row, uint8_t* dst) const;
};
PayloadRows quantize_payload(const Tensor& x, DispatchPayload payload, float global_scale,
                             bool ue8m0);

/// Zeroed receive tensors for `rows` rows (leading shape `lead`, product = rows) of the same
/// payload layout as `like`; read_row fills row `row` from a record written by write_row.
PayloadRows allocate_payload(const PayloadRows& like, const std::vector<int64_t>& lead);
void read_payload_row(const uint8_t* src, int64_t row, PayloadRows& dst);

/// Validates a dispatcher's input: hidden_states bf16 [T, H] with contiguous rows, and a
/// standard top-k output (bypassed ones are materialised) with ids in [−1, num_experts) and f32
/// weights [T, top_k]. Returns the standard top-k with contiguous i32 ids and f32 weights.
StandardTopKOutput check_dispatch_input(const char* api, const Tensor& hidden_states,
                                        const TopKOutput& topk, int64_t hidden, int64_t top_k,
                                        int64_t num_experts);

/// Appends a trivially copyable value to a byte record.
template <typename T>
void append_bytes(std::vector<uint8_t>& out, const T* values, int64_t count) {
  const auto* p = reinterpret_cast<const uint8_t*>(values);
  out.insert(out.end(), p, p + count * static_cast<int64_t>(sizeof(T)));
}

}  // namespace moecore
