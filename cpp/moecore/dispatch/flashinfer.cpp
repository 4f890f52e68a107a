// FlashinferDispatcher. Wire record per (token, dest): [i32 global ids × k][f32 weights × k]
// [payload row]; combine returns one bf16 row per received token, in arrival order.
#include "moecore/dispatch/flashinfer.h"

#include <algorithm>
#include <cstring>

#include "moecore/core/error.h"
#include "moecore/formats/half.h"
#include "moecore/kernels/convert.h"

namespace moecore {
namespace {
constexpr const char* kName = "FlashinferDispatcher";
}  // namespace

FlashinferDispatcher::FlashinferDispatcher(TransportPtr transport, FlashinferDispatchConfig config)
    : transport_(std::move(transport)), config_(config) {
  const FlashinferDispatchConfig& c = config_;
  check_expert_parallel_sizes(kName, transport_.get(), c.num_experts, c.num_local_experts,
                              c.hidden_size, c.top_k);
}

int32_t FlashinferDispatcher::invalid_expert_id() const {
  const MoeRunnerBackend b = config_.runner_backend;
  const bool minus_one = b == MoeRunnerBackend::DEEP_GEMM ||
                         b == MoeRunnerBackend::FLASHINFER_TRTLLM ||
                         b == MoeRunnerBackend::FLASHINFER_TRTLLM_ROUTED;
  return minus_one ? -1 : static_cast<int32_t>(config_.num_experts);
}

DispatchPayload FlashinferDispatcher::resolve_payload() const {
  return input_global_scale(quant_config_, kName) ? DispatchPayload::kNVFP4
                                                  : DispatchPayload::kBF16;
}

DispatchOutputPtr FlashinferDispatcher::dispatch(const Tensor& hidden_states,
                                                 const TopKOutput& topk_in) {
  const char* api = "FlashinferDispatcher.dispatch";
  const FlashinferDispatchConfig& c = config_;
  MOECORE_ASSERT(!dispatched_, api, ": the previous dispatch was not combined yet");
  StandardTopKOutput topk =
      check_dispatch_input(api, hidden_states, topk_in, c.hidden_size, c.top_k, c.num_experts);
  const DispatchPayload payload = resolve_payload();
  MOECORE_CHECK(payload != DispatchPayload::kNVFP4 || c.hidden_size % 16 == 0, api,
                ": an NVFP4 payload needs hidden_size % 16 == 0, got ", c.hidden_size);
  const float gs = input_global_scale(quant_config_, api).value_or(1.0f);
  const PayloadRows rows = quantize_payload(hidden_states, payload, gs, false);

  const int64_t R = transport_->size(), L = c.num_local_experts, k = c.top_k;
  const int64_t T = hidden_states.size(0);
  const int32_t* ids = topk.topk_ids.ptr<int32_t>();
  const float* weights = topk.topk_weights.ptr<float>();
  std::vector<std::vector<uint8_t>> send(R);
  sent_.assign(R, {});
  std::vector<uint8_t> row(rows.row_bytes());
  for (int64_t t = 0; t < T; ++t) {
    rows.write_row(t, row.data());
    for (int64_t d = 0; d < R; ++d) {
      bool any = false;
      for (int64_t j = 0; j < k; ++j) any = any || (ids[t * k + j] >= 0 && ids[t * k + j] / L == d);
      if (!any) continue;
      append_bytes(send[d], ids + t * k, k);
      append_bytes(send[d], weights + t * k, k);
      append_bytes(send[d], row.data(), rows.row_bytes());
      sent_[d].push_back(t);
    }
  }
  // runtime_max_tokens_per_rank: every rank learns every rank's T_local.
  const std::vector<int64_t> token_counts = transport_->exchange_counts(std::vector<int64_t>(R, T));
  const int64_t m = *std::max_element(token_counts.begin(), token_counts.end());
  std::vector<int64_t> send_counts(R);
  for (int64_t d = 0; d < R; ++d) send_counts[d] = static_cast<int64_t>(sent_[d].size());
  const std::vector<int64_t> recv_counts = transport_->exchange_counts(send_counts);
  std::vector<std::vector<uint8_t>> recv = transport_->all_to_all_v(send);

  const int64_t record = 8 * k + rows.row_bytes();
  PayloadRows out_rows = allocate_payload(rows, {R * m});
  Tensor out_ids = Tensor::empty({R * m, k}, DType::kI32);
  Tensor out_weights = Tensor::zeros({R * m, k}, DType::kF32);
  std::fill(out_ids.ptr<int32_t>(), out_ids.ptr<int32_t>() + R * m * k, invalid_expert_id());
  received_.assign(R, 0);
  for (int64_t s = 0; s < R; ++s) {
    MOECORE_INTERNAL_CHECK(
        static_cast<int64_t>(recv[s].size()) == recv_counts[s] * record && recv_counts[s] <= m,
        "FlashInfer receive from rank ", s, " is malformed");
    for (int64_t i = 0; i < recv_counts[s]; ++i) {
      const uint8_t* rec = recv[s].data() + i * record;
      const int64_t n = s * m + i;
      std::memcpy(out_ids.ptr<int32_t>() + n * k, rec, 4 * k);
      std::memcpy(out_weights.ptr<float>() + n * k, rec + 4 * k, 4 * k);
      read_payload_row(rec + 8 * k, n, out_rows);
    }
    received_[s] = recv_counts[s];
  }
  auto out = std::make_shared<FlashinferDispatchOutput>();
  out->hidden_states = out_rows.q;
  out->hidden_states_scale = out_rows.scale;
  out->topk_output = StandardTopKOutput{out_weights, out_ids, {}};
  out->output_dtype = DType::kBF16;
  num_tokens_ = T;
  rows_per_rank_ = m;
  dispatched_ = true;
  return out;
}

Tensor FlashinferDispatcher::combine(const CombineInputPtr& combine_input) {
  const char* api = "FlashinferDispatcher.combine";
  MOECORE_ASSERT(dispatched_, api, ": called before dispatch");
  auto* in = dynamic_cast<const FlashinferCombineInput*>(combine_input.get());
  MOECORE_CHECK_DTYPE(in != nullptr, api, ": expected a FlashinferCombineInput");
  const int64_t R = transport_->size(), H = config_.hidden_size, row_bytes = H * 2;
  const Tensor& h = in->hidden_states;
  const std::vector<int64_t> want = {R * rows_per_rank_, H};
  MOECORE_CHECK_DTYPE(h.defined() && h.dtype() == DType::kBF16, api,
                      ": expected bf16 partial outputs, got ", h.describe());
  MOECORE_CHECK(h.view().shape_vector() == want && h.view().is_contiguous(), api,
                ": expected contiguous hidden_states ", shape_string(want), ", got ", h.describe());
  const uint8_t* base = static_cast<const uint8_t*>(h.view().data);
  std::vector<std::vector<uint8_t>> send(R);
  for (int64_t s = 0; s < R; ++s)
    append_bytes(send[s], base + s * rows_per_rank_ * row_bytes, received_[s] * row_bytes);
  std::vector<std::vector<uint8_t>> recv = transport_->all_to_all_v(send);

  std::vector<float> acc(static_cast<size_t>(num_tokens_ * H), 0.0f), row(H);
  for (int64_t d = 0; d < R; ++d) {
    MOECORE_INTERNAL_CHECK(
        static_cast<int64_t>(recv[d].size()) == static_cast<int64_t>(sent_[d].size()) * row_bytes,
        "FlashInfer combine: rank ", d, " returned ", recv[d].size(), " bytes");
    for (size_t i = 0; i < sent_[d].size(); ++i) {
      load_f32(recv[d].data() + i * row_bytes, DType::kBF16, H, row.data());
      float* a = acc.data() + sent_[d][i] * H;
      for (int64_t x = 0; x < H; ++x) a[x] += row[x];
    }
  }
  Tensor out = Tensor::empty({num_tokens_, H}, DType::kBF16);
  store_f32(acc.data(), num_tokens_ * H, DType::kBF16, out.view().data);
  dispatched_ = false;
  sent_.clear();
  received_.clear();
  return out;
}

}  // namespace moecore
