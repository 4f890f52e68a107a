// The weight-tile layout (kernels/weight_tiles.h): where every byte of every row goes, the zero
// padding, and the checks that reject tiles of other weights.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "moecore/core/error.h"
#include "moecore/kernels/weight_tiles.h"

namespace moecore {
namespace {

// Rows of 2 · 100 = 200 bytes (4 pieces, the last one 8 bytes), 7 rows (two groups, the second
// one short a row), 3 experts.
TEST(WeightTilesTest, EveryByteGoesToItsPieceAndTheRestIsZero) {
  Tensor data = Tensor::empty({3, 7, 100}, DType::kBF16);
  std::mt19937 rng(3);
  auto* bytes = static_cast<uint8_t*>(data.view().data);
  for (int64_t i = 0; i < data.numel() * 2; ++i) bytes[i] = static_cast<uint8_t>(1 + rng() % 255);
  const Tensor tiles = pack_weight_tiles(data.view());
  ASSERT_EQ(tiles.view().shape_vector(), (std::vector<int64_t>{3, 2, 4, 4, 64}));
  const auto* packed = tiles.ptr<uint8_t>();
  int64_t nonzero = 0;
  for (int64_t i = 0; i < tiles.numel(); ++i) nonzero += packed[i] != 0;
  EXPECT_EQ(nonzero, data.numel() * 2);  // every stored byte is nonzero: no byte lost, none extra
  for (int64_t e = 0; e < 3; ++e)
    for (int64_t r = 0; r < 7; ++r)
      for (int64_t j = 0; j < 200; ++j) {
        const int64_t at = (((e * 2 + r / 4) * 4 + j / 64) * 4 + r % 4) * 64 + j % 64;
        ASSERT_EQ(packed[at], bytes[(e * 7 + r) * 200 + j]) << e << " " << r << " " << j;
        ASSERT_EQ(weight_tile_row(tiles.view(), e, r) + (j / 64) * 256 + j % 64, packed + at);
      }
}

// A set finds the tiles of the very tensor they were packed from, nothing else.
TEST(WeightTilesTest, ASetFindsTilesByTheTensorTheyWerePackedFrom) {
  const Tensor a = Tensor::zeros({2, 8, 64}, DType::kF8E4M3);
  const Tensor b = Tensor::zeros({2, 8, 64}, DType::kF8E4M3);
  WeightTileSet set;
  set.pack(a);
  set.pack(a);         // already packed
  set.pack(Tensor());  // None
  ASSERT_EQ(set.tiles().size(), 1u);
  EXPECT_EQ(set.find(a.view()).data, set.tiles()[0].view().data);
  EXPECT_EQ(set.find(b.view()).data, nullptr);  // same shape, other codes
  TensorView same_bytes_retagged = a.view();    // the same bytes under another 1-byte tag
  same_bytes_retagged.dtype = DType::kU8;
  EXPECT_EQ(set.find(same_bytes_retagged).data, set.tiles()[0].view().data);
  TensorView wider_elements = a.view();
  wider_elements.dtype = DType::kBF16;
  EXPECT_EQ(set.find(wider_elements).data, nullptr);
  WeightOperand w;
  w.data = b.view();
  attach_weight_tiles(&set, w);
  EXPECT_EQ(w.tiles.data, nullptr);
  w.data = a.view();
  attach_weight_tiles(&set, w);
  EXPECT_EQ(w.tiles.data, set.tiles()[0].view().data);
  attach_weight_tiles(nullptr, w);
  EXPECT_EQ(w.tiles.data, nullptr);
  EXPECT_THROW(pack_weight_tiles(Tensor::zeros({8, 64}, DType::kU8).view()), InvalidArgument);
}

}  // namespace
}  // namespace moecore
