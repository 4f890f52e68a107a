// DeepEPDispatcher. Records on the wire: low-latency, per (token, slot) whose expert the peer
// owns, [i32 local expert][payload row]; normal, per token with any expert on the peer,
// [i32 local ids × k][f32 weights × k][payload row]. Both are sent in token then slot order and
// received in source-rank order, which fixes every layout. Combine sends the expert outputs back
// in the order they arrived, so the home rank knows each row's (token, slot) without metadata.
#include "moecore/dispatch/deepep.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "moecore/core/error.h"
#include "moecore/formats/quantize.h"
#include "moecore/runner/backends/deep_gemm.h"
#include "moecore/runner/expert_compute.h"

namespace moecore {

const char* deepep_stage_name(DeepEPDispatcher::Stage stage) {
  switch (stage) {
    case DeepEPDispatcher::Stage::kInitial:
      return "INITIAL";
    case DeepEPDispatcher::Stage::kAfterDispatchA:
      return "AFTER_DISPATCH_A";
    case DeepEPDispatcher::Stage::kAfterDispatchB:
      return "AFTER_DISPATCH_B";
    case DeepEPDispatcher::Stage::kAfterCombineA:
      return "AFTER_COMBINE_A";
  }
  return "?";
}

namespace {
constexpr const char* kName = "DeepEPDispatcher";
constexpr int64_t kMaxDispatchTokensPerRank = 1024;  // DeepEP's low-latency kernels

void check_r5(const DeepEPConfig& c, DispatchPayload payload) {
  // R5: DeepEP's round_scale/use_ue8m0 make int32-packed UE8M0 scales, meaningful only for FP8.
  MOECORE_CHECK(!(c.round_scale || c.use_ue8m0) || payload == DispatchPayload::kFP8, kName,
                ": round_scale/use_ue8m0 apply only to an FP8 payload, but this dispatch sends ",
                payload_name(payload), " (runner backend ", to_string(c.runner_backend), ")");
}

/// The payload dispatch encodes with, checked against hidden_size.
PayloadCodec payload_codec(const DeepEPDispatcher& d, const char* api) {
  const DeepEPConfig& c = d.config();
  PayloadCodec codec;
  codec.payload = d.resolve_payload();
  check_r5(c, codec.payload);
  MOECORE_CHECK(codec.payload != DispatchPayload::kFP8 || c.hidden_size % kFp8GroupSize == 0, api,
                ": an FP8 payload needs hidden_size % 128 == 0, got ", c.hidden_size);
  MOECORE_CHECK(codec.payload != DispatchPayload::kNVFP4 || c.hidden_size % 16 == 0, api,
                ": an NVFP4 payload needs hidden_size % 16 == 0, got ", c.hidden_size);
  codec.hidden = c.hidden_size;
  codec.global_scale = input_global_scale(d.quant_config(), api).value_or(1.0f);
  codec.ue8m0 = c.round_scale || c.use_ue8m0;
  return codec;
}

/// Low-latency capacity: every expert holds num_max_dispatch_tokens_per_rank rows per source
/// rank. Raised before anything is sent. per_expert: scratch of num_experts counters.
void check_low_latency_capacity(const char* api, const DeepEPConfig& c, const int32_t* ids,
                                int64_t num_tokens, std::vector<int64_t>& per_expert) {
  const int64_t cap = c.num_max_dispatch_tokens_per_rank;
  if (num_tokens > cap)
    MOECORE_THROW(DispatchCapacityError, api, ": low-latency dispatch of ", num_tokens,
                  " tokens exceeds num_max_dispatch_tokens_per_rank = ", cap);
  per_expert.assign(static_cast<size_t>(c.num_experts), 0);
  for (int64_t s = 0; s < num_tokens * c.top_k; ++s)
    if (ids[s] >= 0 && ++per_expert[ids[s]] > cap)
      MOECORE_THROW(DispatchCapacityError, api, ": expert ", ids[s],
                    " gets more than num_max_dispatch_tokens_per_rank = ", cap,
                    " rows from this rank (duplicate ids)");
}

/// One low-latency receive record [i32 local expert][payload row] into row local·m_cap +
/// masked[local] of `rows` (masked counts the rows per local expert); returns that row.
int64_t receive_low_latency_record(const uint8_t* record, int64_t num_local, int64_t m_cap,
                                   int32_t* masked, const PayloadRows& rows) {
  int32_t local;
  std::memcpy(&local, record, 4);
  MOECORE_INTERNAL_CHECK(local >= 0 && local < num_local && masked[local] < m_cap,
                         "DeepEP low-latency receive overflow");
  const int64_t row = local * m_cap + masked[local]++;
  rows.read_row(record + 4, row);
  return row;
}

/// The low-latency dispatch output over received `rows` [L, m_cap] for this rank's
/// `num_tokens` tokens; expected_m is DeepEP's hint (T·R·k + E) / E and changes no result.
std::shared_ptr<DeepEPLLDispatchOutput> low_latency_output(const DeepEPConfig& c, int64_t ranks,
                                                           const PayloadRows& rows,
                                                           const StandardTopKOutput& topk,
                                                           const Tensor& masked_m,
                                                           int64_t num_tokens) {
  auto out = std::make_shared<DeepEPLLDispatchOutput>();
  out->hidden_states = rows.q;
  out->hidden_states_scale = rows.scale;
  out->topk_ids = topk.topk_ids;
  out->topk_weights = topk.topk_weights;
  out->masked_m = masked_m;
  out->expected_m = (num_tokens * ranks * c.top_k + c.num_experts) / c.num_experts;
  return out;
}

/// combine_b's arithmetic over one bf16 row per slot (slots contiguous bf16 [≥ T, k, H]; rows
/// of ids −1 are not read) into the first T rows of out (contiguous bf16 [≥ T, H]),
/// T = num_tokens:
///   deep_gemm: post_reorder's (SlotReorder, which the caller sized);
///   others:    DeepEP's combine, round(Σ_j w_j·o_j) in fp32.
void reduce_slots(const DeepEPConfig& c, const StandardTopKOutput& topk, int64_t num_tokens,
                  const TensorView& slots, const TensorView& out, SlotReorder* reorder) {
  RoutedTokens tokens;
  tokens.topk_ids = topk.topk_ids.view().narrow(0, 0, num_tokens);
  tokens.topk_weights = topk.topk_weights.view().narrow(0, 0, num_tokens);
  tokens.num_tokens = num_tokens;
  tokens.top_k = c.top_k;
  if (c.runner_backend == MoeRunnerBackend::DEEP_GEMM) {
    reorder->run(tokens, slots.ptr<uint16_t>(), out.ptr<uint16_t>());
    return;
  }
  combine_topk(tokens, slots.narrow(0, 0, num_tokens), /*weighted=*/true, 1.0f,
               out.narrow(0, 0, num_tokens));
}

}  // namespace

DeepEPDispatcher::DeepEPDispatcher(TransportPtr transport, DeepEPConfig config)
    : transport_(std::move(transport)), config_(std::move(config)) {
  const DeepEPConfig& c = config_;
  check_expert_parallel_sizes(kName, transport_.get(), c.num_experts, c.num_local_experts,
                              c.hidden_size, c.top_k);
  MOECORE_CHECK(c.expert_alignment >= 1, kName, ": expected expert_alignment >= 1, got ",
                c.expert_alignment);
  if (c.num_max_dispatch_tokens_per_rank < 1 ||
      c.num_max_dispatch_tokens_per_rank > kMaxDispatchTokensPerRank)
    MOECORE_THROW(DispatchCapacityError, kName,
                  ": num_max_dispatch_tokens_per_rank must be in "
                  "[1, ",
                  kMaxDispatchTokensPerRank, "], got ", c.num_max_dispatch_tokens_per_rank);
  check_r5(c, resolve_payload());
}

int64_t DeepEPDispatcher::max_rows_per_expert() const {
  return config_.num_max_dispatch_tokens_per_rank * transport_->size();
}

DispatchPayload DeepEPDispatcher::resolve_payload() const {
  if (input_global_scale(quant_config_, kName)) return DispatchPayload::kNVFP4;
  auto it = quant_config_.find("dispatcher_output_dtype");
  if (it != quant_config_.end() && !std::holds_alternative<std::monostate>(it->second)) {
    const auto* name = std::get_if<std::string>(&it->second);
    MOECORE_CHECK_DTYPE(name != nullptr, kName,
                        ": quant_config['dispatcher_output_dtype'] must be a string");
    const DispatchPayload payload = parse_payload(*name, kName);
    MOECORE_CHECK(payload != DispatchPayload::kNVFP4, kName,
                  ": an NVFP4 payload needs "
                  "quant_config['input_global_scale']");
    return payload;
  }
  const MoeRunnerBackend b = config_.runner_backend;
  if (b == MoeRunnerBackend::FLASHINFER_CUTEDSL || b == MoeRunnerBackend::CUTLASS)
    return DispatchPayload::kBF16;  // the kernel quantizes internally
  return DispatchPayload::kFP8;
}

void DeepEPDispatcher::expect_stage(Stage want, const char* call) const {
  MOECORE_ASSERT(stage_ == want, kName, ".", call, ": called in stage ", deepep_stage_name(stage_),
                 ", expected ", deepep_stage_name(want),
                 " (the order is dispatch_a, dispatch_b, combine_a, combine_b)");
}

DispatchOutputPtr DeepEPDispatcher::dispatch(const Tensor& hidden_states, const TopKOutput& topk) {
  dispatch_a(hidden_states, topk);
  return dispatch_b();
}

Tensor DeepEPDispatcher::combine(const CombineInputPtr& combine_input) {
  combine_a(combine_input);
  return combine_b();
}

void DeepEPDispatcher::dispatch_a(const Tensor& hidden_states, const TopKOutput& topk_in) {
  expect_stage(Stage::kInitial, "dispatch_a");
  const char* api = "DeepEPDispatcher.dispatch_a";
  const DeepEPConfig& c = config_;
  StandardTopKOutput topk =
      check_dispatch_input(api, hidden_states, topk_in, c.hidden_size, c.top_k, c.num_experts);
  const PayloadCodec codec = payload_codec(*this, api);
  const DeepEPMode mode = resolve_deepep_mode(c.mode, is_extend_in_batch_);
  if (mode == DeepEPMode::LOW_LATENCY) {
    std::vector<int64_t> per_expert;
    check_low_latency_capacity(api, c, topk.topk_ids.ptr<int32_t>(), hidden_states.size(0),
                               per_expert);
  }
  PayloadRows rows = quantize_payload(api, hidden_states, codec);
  round_mode_ = mode;
  round_topk_ = topk;
  round_payload_ = rows;
  if (mode == DeepEPMode::LOW_LATENCY) {
    post_low_latency(rows, topk.topk_ids);
  } else {
    post_normal(rows, topk);
  }
  stage_ = Stage::kAfterDispatchA;
}

void DeepEPDispatcher::post_low_latency(const PayloadRows& rows, const Tensor& ids_tensor) {
  const int64_t R = transport_->size(), L = config_.num_local_experts, k = config_.top_k;
  const int64_t T = ids_tensor.size(0);
  const int32_t* ids = ids_tensor.ptr<int32_t>();
  pending_.assign(R, {});
  sent_.assign(R, {});
  std::vector<uint8_t> row(rows.row_bytes());
  for (int64_t s = 0; s < T * k; ++s) {
    if (ids[s] < 0) continue;
    const int64_t dest = ids[s] / L;
    const int32_t local = static_cast<int32_t>(ids[s] % L);
    rows.write_row(s / k, row.data());
    append_bytes(pending_[dest], &local, 1);
    append_bytes(pending_[dest], row.data(), rows.row_bytes());
    sent_[dest].push_back(s);
  }
}

void DeepEPDispatcher::post_normal(const PayloadRows& rows, const StandardTopKOutput& topk) {
  const int64_t R = transport_->size(), L = config_.num_local_experts, k = config_.top_k;
  const int64_t T = topk.topk_ids.size(0);
  const int32_t* ids = topk.topk_ids.ptr<int32_t>();
  const float* weights = topk.topk_weights.ptr<float>();
  pending_.assign(R, {});
  sent_.assign(R, {});
  std::vector<uint8_t> row(rows.row_bytes());
  std::vector<int32_t> local(k);
  for (int64_t t = 0; t < T; ++t) {
    rows.write_row(t, row.data());
    for (int64_t dest = 0; dest < R; ++dest) {
      bool any = false;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids[t * k + j];
        const bool mine = e >= 0 && e / L == dest;
        local[j] = mine ? static_cast<int32_t>(e % L) : -1;
        any = any || mine;
      }
      if (!any) continue;  // each token goes once to each rank owning one of its experts
      append_bytes(pending_[dest], local.data(), k);
      append_bytes(pending_[dest], weights + t * k, k);
      append_bytes(pending_[dest], row.data(), rows.row_bytes());
      sent_[dest].push_back(t);
    }
  }
}

DispatchOutputPtr DeepEPDispatcher::dispatch_b() {
  expect_stage(Stage::kAfterDispatchA, "dispatch_b");
  std::vector<int64_t> send_counts(pending_.size());
  for (size_t d = 0; d < pending_.size(); ++d)
    send_counts[d] = static_cast<int64_t>(sent_[d].size());
  const std::vector<int64_t> recv_counts = transport_->exchange_counts(send_counts);
  std::vector<std::vector<uint8_t>> recv = transport_->all_to_all_v(pending_);
  pending_.clear();
  const bool ll = round_mode_ == DeepEPMode::LOW_LATENCY;
  const int64_t record = (ll ? 4 : 8 * config_.top_k) + round_payload_.row_bytes();
  for (size_t s = 0; s < recv.size(); ++s)
    MOECORE_INTERNAL_CHECK(static_cast<int64_t>(recv[s].size()) == recv_counts[s] * record,
                           "DeepEP receive of ", recv[s].size(), " bytes from rank ", s,
                           " does not hold ", recv_counts[s], " records");
  received_.assign(recv.size(), {});
  DispatchOutputPtr out;
  const int64_t R = transport_->size(), L = config_.num_local_experts, k = config_.top_k;
  if (ll) {
    const int64_t m_cap = max_rows_per_expert();
    PayloadRows rows = allocate_payload(round_payload_.codec, {L, m_cap});
    Tensor masked_m = Tensor::zeros({L}, DType::kI32);
    int32_t* masked = masked_m.ptr<int32_t>();
    for (int64_t s = 0; s < R; ++s)
      for (int64_t i = 0; i < recv_counts[s]; ++i)
        received_[s].push_back(
            receive_low_latency_record(recv[s].data() + i * record, L, m_cap, masked, rows));
    out = low_latency_output(config_, R, rows, round_topk_, masked_m,
                             round_topk_.topk_ids.size(0));
  } else {
    int64_t n_recv = 0;
    for (int64_t count : recv_counts) n_recv += count;
    PayloadRows rows = allocate_payload(round_payload_.codec, {n_recv});
    Tensor ids = Tensor::empty({n_recv, k}, DType::kI32);
    Tensor weights = Tensor::empty({n_recv, k}, DType::kF32);
    std::vector<int64_t> per_expert(static_cast<size_t>(L), 0);
    int64_t n = 0;
    for (int64_t s = 0; s < R; ++s)
      for (int64_t i = 0; i < recv_counts[s]; ++i, ++n) {
        const uint8_t* rec = recv[s].data() + i * record;
        std::memcpy(ids.ptr<int32_t>() + n * k, rec, 4 * k);
        std::memcpy(weights.ptr<float>() + n * k, rec + 4 * k, 4 * k);
        rows.read_row(rec + 8 * k, n);
        for (int64_t j = 0; j < k; ++j) {
          const int32_t e = ids.ptr<int32_t>()[n * k + j];
          MOECORE_INTERNAL_CHECK(e >= -1 && e < L, "DeepEP normal receive: bad local id");
          if (e >= 0) ++per_expert[e];
        }
        received_[s].push_back(n);
      }
    const int64_t align = config_.expert_alignment;
    for (int64_t& count : per_expert) count = (count + align - 1) / align * align;
    auto normal = std::make_shared<DeepEPNormalDispatchOutput>();
    normal->hidden_states = rows.q;
    normal->hidden_states_scale = rows.scale;
    normal->topk_ids = ids;
    normal->topk_weights = weights;
    normal->num_recv_tokens_per_expert = per_expert;
    recv_topk_ids_ = ids;
    out = normal;
  }
  stage_ = Stage::kAfterDispatchB;
  return out;
}

void DeepEPDispatcher::combine_a(const CombineInputPtr& combine_input) {
  expect_stage(Stage::kAfterDispatchB, "combine_a");
  const char* api = "DeepEPDispatcher.combine_a";
  const int64_t R = transport_->size(), H = config_.hidden_size, k = config_.top_k;
  const int64_t row_bytes = H * 2;
  MOECORE_CHECK(combine_input != nullptr, api, ": combine_input is required");
  const bool ll = round_mode_ == DeepEPMode::LOW_LATENCY;
  const Tensor* hidden = nullptr;
  std::vector<int64_t> want;
  if (ll) {
    auto* in = dynamic_cast<const DeepEPLLCombineInput*>(combine_input.get());
    MOECORE_CHECK_DTYPE(in != nullptr, api,
                        ": this round ran low_latency, so expected a "
                        "DeepEPLLCombineInput, got format ",
                        to_string(combine_input->format()));
    hidden = &in->hidden_states;
    want = {config_.num_local_experts, max_rows_per_expert(), H};
  } else {
    auto* in = dynamic_cast<const DeepEPNormalCombineInput*>(combine_input.get());
    MOECORE_CHECK_DTYPE(in != nullptr, api,
                        ": this round ran normal, so expected a "
                        "DeepEPNormalCombineInput, got format ",
                        to_string(combine_input->format()));
    hidden = &in->hidden_states;
    want = {recv_topk_ids_.size(0), k, H};
  }
  check_combine_rows(api, "expert outputs", *hidden, want);
  const uint8_t* base = static_cast<const uint8_t*>(hidden->view().data);
  std::vector<std::vector<uint8_t>> send(R);
  for (int64_t s = 0; s < R; ++s)
    for (int64_t row : received_[s]) {
      if (ll) {
        append_bytes(send[s], base + row * row_bytes, row_bytes);
        continue;
      }
      for (int64_t j = 0; j < k; ++j)  // the valid slots of a received token, in slot order
        if (recv_topk_ids_.ptr<int32_t>()[row * k + j] >= 0)
          append_bytes(send[s], base + (row * k + j) * row_bytes, row_bytes);
    }
  pending_ = std::move(send);
  stage_ = Stage::kAfterCombineA;
}

Tensor DeepEPDispatcher::combine_b() {
  expect_stage(Stage::kAfterCombineA, "combine_b");
  std::vector<std::vector<uint8_t>> recv = transport_->all_to_all_v(pending_);
  pending_.clear();
  const int64_t R = transport_->size(), L = config_.num_local_experts, k = config_.top_k;
  const int64_t H = config_.hidden_size, row_bytes = H * 2;
  const int64_t T = round_topk_.topk_ids.size(0);
  const int32_t* ids = round_topk_.topk_ids.ptr<int32_t>();
  Tensor slot_out = Tensor::zeros({T, k, H}, DType::kBF16);  // one row per slot t·k + j
  uint8_t* slots = static_cast<uint8_t*>(slot_out.view().data);
  for (int64_t d = 0; d < R; ++d) {
    std::vector<int64_t> order;  // the slots rank d returns, in the order it returns them
    if (round_mode_ == DeepEPMode::LOW_LATENCY) {
      order = sent_[d];
    } else {
      for (int64_t t : sent_[d])
        for (int64_t j = 0; j < k; ++j)
          if (ids[t * k + j] >= 0 && ids[t * k + j] / L == d) order.push_back(t * k + j);
    }
    MOECORE_INTERNAL_CHECK(
        static_cast<int64_t>(recv[d].size()) == static_cast<int64_t>(order.size()) * row_bytes,
        "DeepEP combine: rank ", d, " returned ", recv[d].size(), " bytes");
    for (size_t i = 0; i < order.size(); ++i)
      std::memcpy(slots + order[i] * row_bytes, recv[d].data() + i * row_bytes, row_bytes);
  }
  Tensor out = Tensor::empty({T, H}, DType::kBF16);
  std::unique_ptr<SlotReorder> reorder;
  if (config_.runner_backend == MoeRunnerBackend::DEEP_GEMM)
    reorder = std::make_unique<SlotReorder>(T * k, H, config_.routed_scaling_factor);
  reduce_slots(config_, round_topk_, T, slot_out.view(), out.view(), reorder.get());
  abort_round();  // the round is complete
  return out;
}

void DeepEPDispatcher::abort_round() {
  pending_.clear();
  sent_.clear();
  received_.clear();
  recv_topk_ids_ = Tensor();
  stage_ = Stage::kInitial;
}

namespace {

/// The low-latency round over fixed buffers, in the eager round's layouts: records
/// [i32 local expert][payload row] per (token, slot) in token then slot order, received in
/// source-rank order into rows local·m_cap + arrival; combine returns the rows in arrival order.
class DeepEPLowLatencyRound : public PreparedRound {
 public:
  DeepEPLowLatencyRound(const DeepEPDispatcher& d, const Tensor& hidden_states,
                        const StandardTopKOutput& topk, const PayloadCodec& codec)
      : transport_(d.transport()),
        config_(d.config()),
        R_(transport_->size()),
        cap_(hidden_states.size(0)),
        m_cap_(d.max_rows_per_expert()),
        hidden_states_(hidden_states),
        topk_(topk),
        staged_(allocate_payload(codec, {cap_})),
        rows_(allocate_payload(codec, {config_.num_local_experts, m_cap_})),
        masked_m_(Tensor::zeros({config_.num_local_experts}, DType::kI32)),
        record_(4 + codec.row_bytes()),
        max_slots_(cap_ * config_.top_k),
        exchange_(transport_, max_slots_ * std::max(record_, 2 * config_.hidden_size)),
        sent_(static_cast<size_t>(R_ * max_slots_)),
        sent_count_(static_cast<size_t>(R_)),
        received_(static_cast<size_t>(R_ * max_slots_)),
        received_count_(static_cast<size_t>(R_)),
        per_expert_(static_cast<size_t>(config_.num_experts)),
        slots_(Tensor::zeros({cap_, config_.top_k, config_.hidden_size}, DType::kBF16)) {
    dispatch_output_ = low_latency_output(config_, R_, rows_, topk, masked_m_, cap_);
    if (config_.runner_backend == MoeRunnerBackend::DEEP_GEMM)
      reorder_ = std::make_unique<SlotReorder>(max_slots_, config_.hidden_size,
                                               config_.routed_scaling_factor);
  }

  Tensor bind_combine(const CombineInputPtr& combine_input) override {
    const char* api = "DeepEPDispatcher.combine";
    auto* in = dynamic_cast<const DeepEPLLCombineInput*>(combine_input.get());
    MOECORE_CHECK_DTYPE(in != nullptr, api, ": expected a DeepEPLLCombineInput");
    check_combine_rows(api, "expert outputs", in->hidden_states,
                       {config_.num_local_experts, m_cap_, config_.hidden_size});
    expert_out_ = in->hidden_states;
    output_ = Tensor::zeros({cap_, config_.hidden_size}, DType::kBF16);
    return output_;
  }

  void dispatch(int64_t num_tokens) override {
    const char* api = "DeepEPDispatcher.dispatch";
    const int64_t L = config_.num_local_experts, k = config_.top_k;
    const int32_t* ids = topk_.topk_ids.ptr<int32_t>();
    // Each token is encoded once, then copied into one record per slot.
    stage_round_tokens(api, hidden_states_, topk_, num_tokens, config_.num_experts, staged_);
    check_low_latency_capacity(api, config_, ids, num_tokens, per_expert_);
    exchange_.clear();
    std::fill(sent_count_.begin(), sent_count_.end(), 0);
    for (int64_t s = 0; s < num_tokens * k; ++s) {
      if (ids[s] < 0) continue;
      const int64_t dest = ids[s] / L;
      const int32_t local = static_cast<int32_t>(ids[s] % L);
      uint8_t* rec = exchange_.append(dest, record_);
      std::memcpy(rec, &local, 4);
      staged_.write_row(s / k, rec + 4);
      sent_[dest * max_slots_ + sent_count_[dest]++] = s;
    }
    exchange_.exchange();
    int32_t* masked = masked_m_.ptr<int32_t>();
    std::fill(masked, masked + L, 0);
    for (int64_t src = 0; src < R_; ++src) {
      const int64_t n = exchange_.received_bytes(src) / record_;
      for (int64_t i = 0; i < n; ++i) {
        received_[src * max_slots_ + i] = receive_low_latency_record(
            exchange_.received(src) + i * record_, L, m_cap_, masked, rows_);
      }
      received_count_[src] = n;
    }
  }

  void combine(int64_t num_tokens) override {
    const int64_t H = config_.hidden_size, row_bytes = 2 * H;
    const auto* expert_rows = static_cast<const uint8_t*>(expert_out_.view().data);
    exchange_.clear();
    for (int64_t src = 0; src < R_; ++src)
      for (int64_t i = 0; i < received_count_[src]; ++i)
        std::memcpy(exchange_.append(src, row_bytes),
                    expert_rows + received_[src * max_slots_ + i] * row_bytes,
                    static_cast<size_t>(row_bytes));
    exchange_.exchange();
    auto* slots = static_cast<uint8_t*>(slots_.view().data);
    for (int64_t d = 0; d < R_; ++d) {
      MOECORE_INTERNAL_CHECK(exchange_.received_bytes(d) == sent_count_[d] * row_bytes,
                             "DeepEP combine: rank ", d, " returned ", exchange_.received_bytes(d),
                             " bytes");
      for (int64_t i = 0; i < sent_count_[d]; ++i)
        std::memcpy(slots + sent_[d * max_slots_ + i] * row_bytes,
                    exchange_.received(d) + i * row_bytes, static_cast<size_t>(row_bytes));
    }
    reduce_slots(config_, topk_, num_tokens, slots_.view(), output_.view(), reorder_.get());
    uint16_t* out = output_.ptr<uint16_t>();
    std::fill(out + num_tokens * H, out + cap_ * H, uint16_t{0});
  }

 private:
  TransportPtr transport_;
  DeepEPConfig config_;
  int64_t R_, cap_, m_cap_;
  Tensor hidden_states_;
  StandardTopKOutput topk_;
  PayloadRows staged_;  // [cap]: this rank's routed tokens, encoded
  PayloadRows rows_;    // [L, m_cap]: the dispatch output's received rows
  Tensor masked_m_;
  int64_t record_, max_slots_;
  FixedExchange exchange_;                          // for dispatch and combine
  std::vector<int64_t> sent_, sent_count_;          // [dest][i]: slot t·k + j sent
  std::vector<int64_t> received_, received_count_;  // [src][i]: its receive row
  std::vector<int64_t> per_expert_;
  Tensor expert_out_;  // the runner's combine input [L, m_cap, H]
  Tensor slots_;       // [cap, k, H]: the returned rows, one per slot
  Tensor output_;
  std::unique_ptr<SlotReorder> reorder_;
};

}  // namespace

PreparedRoundPtr DeepEPDispatcher::prepare_round(const Tensor& hidden_states,
                                                 const StandardTopKOutput& topk) {
  const char* api = "DeepEPDispatcher.capture";
  const DeepEPConfig& c = config_;
  if (resolve_deepep_mode(c.mode, /*is_extend_in_batch=*/false) != DeepEPMode::LOW_LATENCY)
    MOECORE_UNSUPPORTED(api,
                        ": DeepEP normal mode cannot be captured: its receive layout follows each "
                        "batch (sglang runs it eagerly); capture with deepep_mode low_latency or "
                        "auto");
  const int64_t capacity = hidden_states.size(0);
  if (capacity > c.num_max_dispatch_tokens_per_rank)
    MOECORE_THROW(
        DispatchCapacityError, api, ": a capacity of ", capacity,
        " tokens exceeds num_max_dispatch_tokens_per_rank = ", c.num_max_dispatch_tokens_per_rank);
  check_round_buffers(api, hidden_states, topk, c.hidden_size, c.top_k, c.num_experts);
  return std::make_unique<DeepEPLowLatencyRound>(*this, hidden_states, topk,
                                                 payload_codec(*this, api));
}

}  // namespace moecore
