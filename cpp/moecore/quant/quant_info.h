// The QuantInfo payloads a quant method hands to MoeRunner.run (sglang moe_runner/*.py). Field
// names, shapes and dtypes follow sglang's dataclasses; undefined Tensors mean None.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moecore/core/tensor.h"

namespace moecore {

class MoeQuantInfo {
 public:
  virtual ~MoeQuantInfo() = default;
  /// The Python class name, for messages: "TritonMoeQuantInfo".
  virtual const char* name() const = 0;
};
using QuantInfoPtr = std::shared_ptr<MoeQuantInfo>;

/// TritonMoeQuantInfo (sglang moe_runner/triton.py).
struct TritonMoeQuantInfo : MoeQuantInfo {
  Tensor w13_weight;  // [E, 2I, H] (gated) or [E, I, H]
  Tensor w2_weight;   // [E, H, I]
  Tensor b13;         // [E, 2I] or None
  Tensor b2;          // [E, H] or None
  bool use_fp8_w8a8 = false;
  bool use_int8_w8a8 = false;
  bool use_int8_w8a16 = false;
  bool use_int4_w4a16 = false;
  bool per_channel_quant = false;
  Tensor w13_scale, w2_scale, w13_zp, w2_zp, a13_scale, a2_scale;
  std::vector<int64_t> block_shape;  // empty: None
  const char* name() const override { return "TritonMoeQuantInfo"; }
  bool is_quantized() const {
    return use_fp8_w8a8 || use_int8_w8a8 || use_int8_w8a16 || use_int4_w4a16;
  }
};

/// TorchNativeMoeQuantInfo: plain weights for the reference loop (biases are moecore's addition).
struct TorchNativeMoeQuantInfo : MoeQuantInfo {
  Tensor w13_weight;  // [E, 2I, H] or [E, I, H]
  Tensor w2_weight;   // [E, H, I]
  Tensor b13;         // [E, 2I] or None
  Tensor b2;          // [E, H] or None
  const char* name() const override { return "TorchNativeMoeQuantInfo"; }
};

}  // namespace moecore
