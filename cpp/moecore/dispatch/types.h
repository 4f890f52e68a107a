// Dispatch outputs and combine inputs (sglang token_dispatcher/base.py, standard.py). A
// dispatcher produces a DispatchOutput; the runner turns it into a CombineInput; the dispatcher's
// combine turns that into the layer output. Objects are shared so Python can hold them.
#pragma once

#include <memory>
#include <optional>
#include <variant>

#include "moecore/core/enums.h"
#include "moecore/core/tensor.h"
#include "moecore/routing/topk.h"

namespace moecore {

/// sglang's BypassedTopKOutput: routing deferred to the consumer; to_standard() runs it.
struct BypassedTopKOutput {
  Tensor hidden_states;
  Tensor router_logits;
  TopKConfig topk_config;
  std::optional<int64_t> num_token_non_padded;
  StandardTopKOutput to_standard() const {
    return select_experts(hidden_states, router_logits, topk_config, num_token_non_padded);
  }
};

using TopKOutput = std::variant<StandardTopKOutput, BypassedTopKOutput>;
TopKOutputFormat topk_output_format(const TopKOutput& topk);
/// The standard form: itself, or a bypassed output materialised with to_standard() (rule R8).
StandardTopKOutput to_standard(const TopKOutput& topk);

class DispatchOutput {
 public:
  virtual ~DispatchOutput() = default;
  virtual DispatchOutputFormat format() const = 0;
};
using DispatchOutputPtr = std::shared_ptr<DispatchOutput>;

class CombineInput {
 public:
  virtual ~CombineInput() = default;
  virtual CombineInputFormat format() const = 0;
};
using CombineInputPtr = std::shared_ptr<CombineInput>;

/// StandardDispatchOutput(hidden_states [T, H], hidden_states_scale (None unless the dispatcher
/// quantized), topk_output, hidden_states_pre_quant).
struct StandardDispatchOutput : DispatchOutput {
  Tensor hidden_states;
  Tensor hidden_states_scale;
  TopKOutput topk_output;
  Tensor hidden_states_pre_quant;
  DispatchOutputFormat format() const override { return DispatchOutputFormat::STANDARD; }
};

/// StandardCombineInput(hidden_states [T, H], or [T, k, H] with no_combine).
struct StandardCombineInput : CombineInput {
  Tensor hidden_states;
  explicit StandardCombineInput(Tensor h = {}) : hidden_states(std::move(h)) {}
  CombineInputFormat format() const override { return CombineInputFormat::STANDARD; }
};

}  // namespace moecore
