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

/// The payload dispatch encodes with, checked against hidden_size.
PayloadCodec payload_codec(const FlashinferDispatcher& d, int64_t hidden, const char* api) {
  PayloadCodec codec;
  codec.payload = d.resolve_payload();
  MOECORE_CHECK(codec.payload != DispatchPayload::kNVFP4 || hidden % 16 == 0, api,
                ": an NVFP4 payload needs hidden_size % 16 == 0, got ", hidden);
  codec.hidden = hidden;
  codec.global_scale = input_global_scale(d.quant_config(), api).value_or(1.0f);
  return codec;
}

/// Whether token t has an expert on rank d.
bool routes_to(const int32_t* ids, int64_t t, int64_t k, int64_t L, int64_t d) {
  for (int64_t j = 0; j < k; ++j)
    if (ids[t * k + j] >= 0 && ids[t * k + j] / L == d) return true;
  return false;
}
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
  const PayloadRows rows =
      quantize_payload(api, hidden_states, payload_codec(*this, c.hidden_size, api));

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
      if (!routes_to(ids, t, k, L, d)) continue;
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
  PayloadRows out_rows = allocate_payload(rows.codec, {R * m});
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
      out_rows.read_row(rec + 8 * k, n);
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
  check_combine_rows(api, "partial outputs", h, {R * rows_per_rank_, H});
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

namespace {

/// MoeAlltoAll over fixed buffers: rows_per_rank is the capacity (MoeAlltoAll's
/// max_num_tokens) instead of the batch's largest T_local, which changes no row's result. Wire
/// record and layouts as in the eager dispatch.
class FlashinferRound : public PreparedRound {
 public:
  FlashinferRound(const FlashinferDispatcher& d, const FlashinferDispatchConfig& config,
                  const Tensor& hidden_states, const StandardTopKOutput& topk,
                  const PayloadCodec& codec)
      : transport_(d.transport()),
        config_(config),
        R_(transport_->size()),
        cap_(hidden_states.size(0)),
        invalid_id_(d.invalid_expert_id()),
        hidden_states_(hidden_states),
        topk_(topk),
        staged_(allocate_payload(codec, {cap_})),
        rows_(allocate_payload(codec, {R_ * cap_})),
        ids_(Tensor::empty({R_ * cap_, config.top_k}, DType::kI32)),
        weights_(Tensor::zeros({R_ * cap_, config.top_k}, DType::kF32)),
        record_(8 * config.top_k + codec.row_bytes()),
        exchange_(transport_, cap_ * std::max(record_, 2 * config.hidden_size)),
        sent_(static_cast<size_t>(R_ * cap_)),
        sent_count_(static_cast<size_t>(R_)),
        received_count_(static_cast<size_t>(R_), 0),
        acc_(static_cast<size_t>(cap_ * config.hidden_size)),
        row_(static_cast<size_t>(config.hidden_size)) {
    std::fill(ids_.ptr<int32_t>(), ids_.ptr<int32_t>() + ids_.numel(), invalid_id_);
    auto out = std::make_shared<FlashinferDispatchOutput>();
    out->hidden_states = rows_.q;
    out->hidden_states_scale = rows_.scale;
    out->topk_output = StandardTopKOutput{weights_, ids_, {}};
    out->output_dtype = DType::kBF16;
    dispatch_output_ = out;
  }

  Tensor bind_combine(const CombineInputPtr& combine_input) override {
    const char* api = "FlashinferDispatcher.combine";
    auto* in = dynamic_cast<const FlashinferCombineInput*>(combine_input.get());
    MOECORE_CHECK_DTYPE(in != nullptr, api, ": expected a FlashinferCombineInput");
    check_combine_rows(api, "partial outputs", in->hidden_states, {R_ * cap_, config_.hidden_size});
    partials_ = in->hidden_states;
    output_ = Tensor::zeros({cap_, config_.hidden_size}, DType::kBF16);
    return output_;
  }

  void dispatch(int64_t num_tokens) override {
    const char* api = "FlashinferDispatcher.dispatch";
    const int64_t L = config_.num_local_experts, k = config_.top_k;
    const int32_t* ids = topk_.topk_ids.ptr<int32_t>();
    const float* weights = topk_.topk_weights.ptr<float>();
    stage_round_tokens(api, hidden_states_, topk_, num_tokens, config_.num_experts, staged_);
    exchange_.clear();
    std::fill(sent_count_.begin(), sent_count_.end(), 0);
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int64_t d = 0; d < R_; ++d) {
        if (!routes_to(ids, t, k, L, d)) continue;
        uint8_t* rec = exchange_.append(d, record_);
        std::memcpy(rec, ids + t * k, static_cast<size_t>(4 * k));
        std::memcpy(rec + 4 * k, weights + t * k, static_cast<size_t>(4 * k));
        staged_.write_row(t, rec + 8 * k);
        sent_[d * cap_ + sent_count_[d]++] = t;
      }
    exchange_.exchange();
    int32_t* out_ids = ids_.ptr<int32_t>();
    float* out_weights = weights_.ptr<float>();
    for (int64_t src = 0; src < R_; ++src) {
      const int64_t n = exchange_.received_bytes(src) / record_;
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* rec = exchange_.received(src) + i * record_;
        const int64_t row = src * cap_ + i;
        std::memcpy(out_ids + row * k, rec, static_cast<size_t>(4 * k));
        std::memcpy(out_weights + row * k, rec + 4 * k, static_cast<size_t>(4 * k));
        rows_.read_row(rec + 8 * k, row);
      }
      // Rows that held tokens last time become invalid tokens again.
      for (int64_t row = src * cap_ + n; row < src * cap_ + received_count_[src]; ++row) {
        std::fill(out_ids + row * k, out_ids + (row + 1) * k, invalid_id_);
        std::fill(out_weights + row * k, out_weights + (row + 1) * k, 0.0f);
        std::memset(rows_.q_row(row), 0, static_cast<size_t>(rows_.q_bytes()));
        if (rows_.scale_bytes())
          std::memset(rows_.scale_row(row), 0, static_cast<size_t>(rows_.scale_bytes()));
      }
      received_count_[src] = n;
    }
  }

  void combine(int64_t num_tokens) override {
    const int64_t H = config_.hidden_size, row_bytes = 2 * H;
    const auto* partials = static_cast<const uint8_t*>(partials_.view().data);
    exchange_.clear();
    for (int64_t src = 0; src < R_; ++src) {
      const int64_t bytes = received_count_[src] * row_bytes;
      std::memcpy(exchange_.append(src, bytes), partials + src * cap_ * row_bytes,
                  static_cast<size_t>(bytes));
    }
    exchange_.exchange();
    std::fill(acc_.begin(), acc_.begin() + num_tokens * H, 0.0f);
    for (int64_t d = 0; d < R_; ++d) {
      MOECORE_INTERNAL_CHECK(exchange_.received_bytes(d) == sent_count_[d] * row_bytes,
                             "FlashInfer combine: rank ", d, " returned ",
                             exchange_.received_bytes(d), " bytes");
      for (int64_t i = 0; i < sent_count_[d]; ++i) {
        load_f32(exchange_.received(d) + i * row_bytes, DType::kBF16, H, row_.data());
        float* a = acc_.data() + sent_[d * cap_ + i] * H;
        for (int64_t x = 0; x < H; ++x) a[x] += row_[x];
      }
    }
    uint16_t* out = output_.ptr<uint16_t>();
    store_f32(acc_.data(), num_tokens * H, DType::kBF16, out);
    std::fill(out + num_tokens * H, out + cap_ * H, uint16_t{0});
  }

 private:
  TransportPtr transport_;
  FlashinferDispatchConfig config_;
  int64_t R_, cap_;
  int32_t invalid_id_;
  Tensor hidden_states_;
  StandardTopKOutput topk_;
  PayloadRows staged_;  // [cap]: this rank's tokens, encoded
  PayloadRows rows_;    // [R·cap]: the dispatch output's rows
  Tensor ids_, weights_;
  int64_t record_;
  FixedExchange exchange_;                  // for dispatch and combine
  std::vector<int64_t> sent_, sent_count_;  // [dest][i]: token sent
  std::vector<int64_t> received_count_;     // [src]: rows it filled last dispatch
  Tensor partials_;                         // the runner's combine input [R·cap, H]
  std::vector<float> acc_, row_;
  Tensor output_;
};

}  // namespace

PreparedRoundPtr FlashinferDispatcher::prepare_round(const Tensor& hidden_states,
                                                     const StandardTopKOutput& topk) {
  const char* api = "FlashinferDispatcher.capture";
  const FlashinferDispatchConfig& c = config_;
  check_round_buffers(api, hidden_states, topk, c.hidden_size, c.top_k, c.num_experts);
  return std::make_unique<FlashinferRound>(*this, c, hidden_states, topk,
                                           payload_codec(*this, c.hidden_size, api));
}

}  // namespace moecore
