// The quant-method calls every method shares: apply and its prepared (capturable) form.
#include "moecore/quant/method.h"

#include "moecore/core/error.h"

namespace moecore {

CombineInputPtr FusedMoEMethod::apply(FusedMoE& layer, const DispatchOutputPtr& dispatch_output) {
  MOECORE_CHECK(runner_ != nullptr, name(), ": create_moe_runner has not run");
  return runner_->run(dispatch_output, apply_quant_info(layer, dispatch_output));
}

PreparedRunPtr FusedMoEMethod::prepare_apply(FusedMoE& layer,
                                             const DispatchOutputPtr& dispatch_output) {
  MOECORE_CHECK(runner_ != nullptr, name(), ": create_moe_runner has not run");
  return runner_->prepare(dispatch_output, apply_quant_info(layer, dispatch_output));
}

}  // namespace moecore
