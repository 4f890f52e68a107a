// DeepEPDispatcher. Records on the wire: low-latency, per (token, slot) whose expert the peer
// owns, [i32 local expert][payload row]; normal, per token with any expert on the peer,
// [i32 local ids × k][f32 weights × k][payload row]. Both are sent in token then slot order and
// received in source-rank order, which fixes every layout. Combine sends the expert outputs back
// in the order they arrived, so the home rank knows each row's (token, slot) without metadata.
#include "moecore/dispatch/deepep.h"

#include <cstring>

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
  const DispatchPayload payload = resolve_payload();
  check_r5(c, payload);
  MOECORE_CHECK(payload != DispatchPayload::kFP8 || c.hidden_size % kFp8GroupSize == 0, api,
                ": an FP8 payload needs hidden_size % 128 == 0, got ", c.hidden_size);
  MOECORE_CHECK(payload != DispatchPayload::kNVFP4 || c.hidden_size % 16 == 0, api,
                ": an NVFP4 payload needs hidden_size % 16 == 0, got ", c.hidden_size);
  const float gs = input_global_scale(quant_config_, api).value_or(1.0f);
  const DeepEPMode mode = resolve_deepep_mode(c.mode, is_extend_in_batch_);
  const int64_t T = hidden_states.size(0), k = c.top_k;
  const int32_t* ids = topk.topk_ids.ptr<int32_t>();
  if (mode == DeepEPMode::LOW_LATENCY) {
    // Each expert holds num_max_dispatch_tokens_per_rank rows per source rank.
    const int64_t cap = c.num_max_dispatch_tokens_per_rank;
    if (T > cap)
      MOECORE_THROW(DispatchCapacityError, api, ": low-latency dispatch of ", T,
                    " tokens exceeds "
                    "num_max_dispatch_tokens_per_rank = ",
                    cap);
    std::vector<int64_t> per_expert(static_cast<size_t>(c.num_experts), 0);
    for (int64_t s = 0; s < T * k; ++s)
      if (ids[s] >= 0 && ++per_expert[ids[s]] > cap)
        MOECORE_THROW(DispatchCapacityError, api, ": expert ", ids[s],
                      " gets more than "
                      "num_max_dispatch_tokens_per_rank = ",
                      cap,
                      " rows from this rank "
                      "(duplicate ids)");
  }
  PayloadRows rows = quantize_payload(hidden_states, payload, gs, c.round_scale || c.use_ue8m0);
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
    PayloadRows rows = allocate_payload(round_payload_, {L, m_cap});
    Tensor masked_m = Tensor::zeros({L}, DType::kI32);
    int32_t* masked = masked_m.ptr<int32_t>();
    for (int64_t s = 0; s < R; ++s)
      for (int64_t i = 0; i < recv_counts[s]; ++i) {
        const uint8_t* rec = recv[s].data() + i * record;
        int32_t local;
        std::memcpy(&local, rec, 4);
        MOECORE_INTERNAL_CHECK(local >= 0 && local < L && masked[local] < m_cap,
                               "DeepEP low-latency receive overflow");
        const int64_t dst = local * m_cap + masked[local]++;
        read_payload_row(rec + 4, dst, rows);
        received_[s].push_back(dst);
      }
    auto ll_out = std::make_shared<DeepEPLLDispatchOutput>();
    ll_out->hidden_states = rows.q;
    ll_out->hidden_states_scale = rows.scale;
    ll_out->topk_ids = round_topk_.topk_ids;
    ll_out->topk_weights = round_topk_.topk_weights;
    ll_out->masked_m = masked_m;
    const int64_t T = round_topk_.topk_ids.size(0);
    ll_out->expected_m = (T * R * k + config_.num_experts) / config_.num_experts;
    out = ll_out;
  } else {
    int64_t n_recv = 0;
    for (int64_t count : recv_counts) n_recv += count;
    PayloadRows rows = allocate_payload(round_payload_, {n_recv});
    Tensor ids = Tensor::empty({n_recv, k}, DType::kI32);
    Tensor weights = Tensor::empty({n_recv, k}, DType::kF32);
    std::vector<int64_t> per_expert(static_cast<size_t>(L), 0);
    int64_t n = 0;
    for (int64_t s = 0; s < R; ++s)
      for (int64_t i = 0; i < recv_counts[s]; ++i, ++n) {
        const uint8_t* rec = recv[s].data() + i * record;
        std::memcpy(ids.ptr<int32_t>() + n * k, rec, 4 * k);
        std::memcpy(weights.ptr<float>() + n * k, rec + 4 * k, 4 * k);
        read_payload_row(rec + 8 * k, n, rows);
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
  MOECORE_CHECK_DTYPE(hidden->defined() && hidden->dtype() == DType::kBF16, api,
                      ": expected bf16 expert outputs, got ", hidden->describe());
  MOECORE_CHECK(hidden->view().shape_vector() == want && hidden->view().is_contiguous(), api,
                ": expected contiguous hidden_states ", shape_string(want), ", got ",
                hidden->describe());
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
  // One bf16 row per slot t·k + j, padded to whole [E, rows, H] slabs for post_reorder.
  const int64_t E = config_.num_experts;
  Tensor slot_out = Tensor::zeros({E * ((T * k + E - 1) / E), H}, DType::kBF16);
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
  Tensor out = reduce_slots(slot_out);
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

Tensor DeepEPDispatcher::reduce_slots(const Tensor& slot_out) const {
  const Tensor& ids = round_topk_.topk_ids;
  const Tensor& weights = round_topk_.topk_weights;
  const int64_t T = ids.size(0), k = ids.size(1), H = config_.hidden_size;
  const int64_t E = config_.num_experts;
  if (config_.runner_backend == MoeRunnerBackend::DEEP_GEMM) {
    // The slot rows as post_reorder's [E, m, H] buffer (it checks ids against E); src2dst is
    // the identity.
    Tensor down(make_view(slot_out.view().data, DType::kBF16, {E, slot_out.size(0) / E, H}),
                slot_out.owner());
    Tensor src2dst = Tensor::empty({T * k}, DType::kI32);
    for (int64_t s = 0; s < T * k; ++s) src2dst.ptr<int32_t>()[s] = static_cast<int32_t>(s);
    return deepgemm_post_reorder(down, src2dst, ids, weights, config_.routed_scaling_factor);
  }
  RoutedTokens tokens;
  tokens.topk_ids = ids.view();
  tokens.topk_weights = weights.view();
  tokens.num_tokens = T;
  tokens.top_k = k;
  Tensor out = Tensor::empty({T, H}, DType::kBF16);
  combine_topk(tokens, make_view(slot_out.view().data, DType::kBF16, {T, k, H}),
               /*weighted=*/true, 1.0f, out.view());
  return out;
}

}  // namespace moecore
