#include "moecore/kernels/weight_tiles.h"

#include <algorithm>
#include <cstring>

#include "moecore/core/error.h"
#include "moecore/core/thread_pool.h"

namespace moecore {
namespace {

int64_t row_bytes(const TensorView& data) { return data.shape[2] * dtype_size(data.dtype); }

void check_packable(const TensorView& data) {
  MOECORE_CHECK(data.data != nullptr && data.ndim == 3 && data.strides[2] == 1,
                "pack_weight_tiles: expected weights [E, N, L] with contiguous rows, got ",
                data.describe());
}

// The n ≤ 64 bytes of packed fp4 at src as one kFp4Nibbles piece (dst zeroed).
void transpose_fp4_piece(const uint8_t* src, int64_t n, uint8_t* dst) {
  for (int64_t e = 0; e < 2 * n; ++e) {
    const int code = src[e / 2] >> (4 * (e % 2)) & 0xf;
    const int64_t word = e % 32, nibble = e / 32;  // nibble 0 is the word's lowest
    dst[2 * word + nibble / 2] |= static_cast<uint8_t>(code << (4 * (nibble % 2)));
  }
}

}  // namespace

TileLayout tile_layout(WeightCoding coding) {
  return coding == WeightCoding::kNvfp4 || coding == WeightCoding::kMxfp4 ? TileLayout::kFp4Nibbles
                                                                          : TileLayout::kBytes;
}

std::vector<int64_t> weight_tiles_shape(const TensorView& data) {
  check_packable(data);
  return {data.shape[0], (data.shape[1] + kWeightTileRows - 1) / kWeightTileRows,
          (row_bytes(data) + kWeightTilePieceBytes - 1) / kWeightTilePieceBytes, kWeightTileRows,
          kWeightTilePieceBytes};
}

Tensor pack_weight_tiles(const TensorView& data, TileLayout layout) {
  const std::vector<int64_t> shape = weight_tiles_shape(data);
  MOECORE_CHECK(layout == TileLayout::kBytes || dtype_size(data.dtype) == 1,
                "pack_weight_tiles: fp4 tiles take packed fp4 bytes, got ", data.describe());
  Tensor tiles = Tensor::zeros(shape, DType::kU8);
  const TensorView out = tiles.view();
  const int64_t n = data.shape[1], bytes = row_bytes(data);
  parallel_for(data.shape[0], [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e)
      for (int64_t r = 0; r < n; ++r) {
        const auto* src = static_cast<const uint8_t*>(data.at({e, r, 0}));
        uint8_t* dst = const_cast<uint8_t*>(weight_tile_row(out, e, r));
        for (int64_t j = 0; j < bytes; j += kWeightTilePieceBytes) {
          const int64_t n = std::min(kWeightTilePieceBytes, bytes - j);
          if (layout == TileLayout::kFp4Nibbles)
            transpose_fp4_piece(src + j, n, dst + j * kWeightTileRows);
          else
            std::memcpy(dst + j * kWeightTileRows, src + j, static_cast<size_t>(n));
        }
      }
  });
  return tiles;
}

void WeightTileSet::pack(const Tensor& weights, TileLayout layout) {
  if (!weights.defined() || find(weights.view(), layout).data != nullptr) return;
  entries_.push_back({weights, pack_weight_tiles(weights.view(), layout), layout});
}

TensorView WeightTileSet::find(const TensorView& data, TileLayout layout) const {
  for (const Entry& entry : entries_) {
    const TensorView& s = entry.source.view();
    if (entry.layout == layout && s.data == data.data &&
        dtype_size(s.dtype) == dtype_size(data.dtype) &&
        s.shape_vector() == data.shape_vector() &&
        std::equal(s.strides, s.strides + s.ndim, data.strides))
      return entry.tiles.view();
  }
  return {};
}

std::vector<Tensor> WeightTileSet::tiles() const {
  std::vector<Tensor> out;
  for (const Entry& entry : entries_) out.push_back(entry.tiles);
  return out;
}

void attach_weight_tiles(const WeightTileSet* set, WeightOperand& w) {
  w.tiles = set != nullptr ? set->find(w.data, tile_layout(w.coding)) : TensorView{};
}

}  // namespace moecore
