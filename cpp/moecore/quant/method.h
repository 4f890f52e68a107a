// The quant-method interface (sglang FusedMoEMethodBase): create_weights registers the layer's
// parameters, process_weights_after_loading changes layouts once, create_moe_runner resolves
// 'auto' and builds the MoeRunner, apply builds the QuantInfo and runs the runner (prepare_apply
// prepares that run once, for capture).
#pragma once

#include <memory>
#include <string>

#include "moecore/dispatch/types.h"
#include "moecore/runner/runner.h"

namespace moecore {

class FusedMoE;

class FusedMoEMethod {
 public:
  virtual ~FusedMoEMethod() = default;
  virtual const char* name() const = 0;
  /// Registers zero-filled parameters on the layer (shapes per spec §6).
  virtual void create_weights(FusedMoE& layer, int64_t num_experts, int64_t hidden_size,
                              int64_t intermediate_size_per_partition, DType params_dtype,
                              bool with_bias) = 0;
  virtual void process_weights_after_loading(FusedMoE& layer) = 0;
  /// Resolves the runner backend (config's, else the process-wide one; 'auto' per method) and
  /// builds the runner. Throws Unsupported for backends this method cannot use.
  virtual void create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) = 0;
  /// sglang's apply: the runner on the dispatch output, with apply_quant_info's QuantInfo.
  CombineInputPtr apply(FusedMoE& layer, const DispatchOutputPtr& dispatch_output);
  /// apply prepared once for the dispatch output's shapes (MoeRunner::prepare): the capture of
  /// a layer's forward uses it.
  PreparedRunPtr prepare_apply(FusedMoE& layer, const DispatchOutputPtr& dispatch_output);
  /// True when w13 is loaded as [Up, Gate] (sglang's load_up_proj_weight_first).
  virtual bool load_up_proj_weight_first() const { return false; }
  /// True when DeepGEMM runs in its UE8M0 mode (power-of-two activation scales): a DeepEP
  /// dispatcher then sends FP8 payload scales as packed UE8M0 (sglang's DEEPGEMM_SCALE_UE8M0).
  virtual bool deep_gemm_scale_ue8m0() const { return false; }

  const std::shared_ptr<MoeRunner>& runner() const { return runner_; }

  /// Prepacks kernel_weights(layer) in weight tiles, which every QuantInfo of apply then carries,
  /// when the runner's kernel row streams tiles and its config's prepack_weight_tiles is set (else
  /// drops any): FusedMoE::process_weights_after_loading calls it after create_moe_runner.
  void pack_weight_tiles(FusedMoE& layer);
  /// The tiles made by pack_weight_tiles (nullptr: none).
  const std::shared_ptr<const WeightTileSet>& weight_tiles() const { return weight_tiles_; }
  /// The processed expert weights the runner's kernels read in place: the layer's w13_weight and
  /// w2_weight unless a method reads a layout of its own.
  virtual std::vector<Tensor> kernel_weights(const FusedMoE& layer) const;
  /// The tile layout the kernels read kernel_weights() in (packed fp4 has its own).
  virtual TileLayout kernel_weights_layout() const { return TileLayout::kBytes; }

 protected:
  /// The QuantInfo apply passes for this dispatch output (after checking what the method
  /// requires of it).
  virtual QuantInfoPtr apply_quant_info(FusedMoE& layer,
                                        const DispatchOutputPtr& dispatch_output) = 0;
  std::shared_ptr<MoeRunner> runner_;

 private:
  std::shared_ptr<const WeightTileSet> weight_tiles_;
};

/// UnquantizedFusedMoEMethod (sglang quantization/unquant.py): w13 [E, 2I, H] (or [E, I, H]
/// non-gated) and w2 [E, H, I] in params_dtype, optional biases "w13_weight_bias" [E, 2I] and
/// "w2_weight_bias" [E, H] (f32). Backends: triton (auto), torch_native and deep_gemm (DeepGEMM
/// BF16: bf16 weights, no biases).
class UnquantizedFusedMoEMethod : public FusedMoEMethod {
 public:
  const char* name() const override { return "UnquantizedFusedMoEMethod"; }
  void create_weights(FusedMoE& layer, int64_t num_experts, int64_t hidden_size,
                      int64_t intermediate_size_per_partition, DType params_dtype,
                      bool with_bias) override;
  void process_weights_after_loading(FusedMoE& layer) override;
  void create_moe_runner(FusedMoE& layer, const MoeRunnerConfig& config) override;
  QuantInfoPtr apply_quant_info(FusedMoE& layer,
                                const DispatchOutputPtr& dispatch_output) override;
  /// The QuantInfo apply() would pass for this layer and backend.
  QuantInfoPtr quant_info(const FusedMoE& layer) const;
};

}  // namespace moecore
