// The quant-method calls every method shares: apply and its prepared (capturable) form.
#include "moecore/quant/method.h"

#include "moecore/core/error.h"
#include "moecore/layer/fused_moe.h"

namespace moecore {

CombineInputPtr FusedMoEMethod::apply(FusedMoE& layer, const DispatchOutputPtr& dispatch_output) {
  MOECORE_CHECK(runner_ != nullptr, name(), ": create_moe_runner has not run");
  const QuantInfoPtr info = apply_quant_info(layer, dispatch_output);
  info->weight_tiles = weight_tiles_;
  return runner_->run(dispatch_output, info);
}

PreparedRunPtr FusedMoEMethod::prepare_apply(FusedMoE& layer,
                                             const DispatchOutputPtr& dispatch_output) {
  MOECORE_CHECK(runner_ != nullptr, name(), ": create_moe_runner has not run");
  const QuantInfoPtr info = apply_quant_info(layer, dispatch_output);
  info->weight_tiles = weight_tiles_;
  return runner_->prepare(dispatch_output, info);
}

void FusedMoEMethod::pack_weight_tiles(FusedMoE& layer) {
  weight_tiles_.reset();
  MOECORE_CHECK(runner_ != nullptr, name(), ": create_moe_runner has not run");
  const MoeRunnerConfig& config = runner_->config();
  if (!config.prepack_weight_tiles || !scaled_gemm_reads_weight_tiles(config.gemm_kernel())) return;
  auto tiles = std::make_shared<WeightTileSet>();
  for (const Tensor& w : kernel_weights(layer)) tiles->pack(w, kernel_weights_layout());
  weight_tiles_ = std::move(tiles);
}

std::vector<Tensor> FusedMoEMethod::kernel_weights(const FusedMoE& layer) const {
  return {layer.parameter("w13_weight"), layer.parameter("w2_weight")};
}

}  // namespace moecore
