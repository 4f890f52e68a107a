// The QuantInfo vtables, and what every QuantInfo does alike.
#include "moecore/quant/quant_info.h"

namespace moecore {

void MoeQuantInfo::pack_weight_tiles() {
  auto set = std::make_shared<WeightTileSet>();
  for (const Tensor& w : kernel_weights()) set->pack(w, kernel_weights_layout());
  weight_tiles = std::move(set);
}

}  // namespace moecore
