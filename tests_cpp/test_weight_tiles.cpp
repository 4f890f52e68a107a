// The weight-tile layout (kernels/weight_tiles.h): where every byte of every row goes, the zero
// padding, and the checks that reject tiles of other weights.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "moecore/core/error.h"
#include "moecore/kernels/weight_tiles.h"
#include "moecore/quant/fp8.h"
#include "moecore/quant/modelopt_nvfp4.h"
#include "moecore/quant/mxfp4.h"
#include "moecore/quant/quant_info.h"

namespace moecore {
namespace {

// Rows of 2 · 100 = 200 bytes (4 pieces, the last one 8 bytes), 7 rows (two groups, the second
// one short a row), 3 experts.
TEST(WeightTilesTest, EveryByteGoesToItsPieceAndTheRestIsZero) {
  Tensor data = Tensor::empty({3, 7, 100}, DType::kBF16);
  std::mt19937 rng(3);
  auto* bytes = static_cast<uint8_t*>(data.view().data);
  for (int64_t i = 0; i < data.numel() * 2; ++i) bytes[i] = static_cast<uint8_t>(1 + rng() % 255);
  const Tensor tiles = pack_weight_tiles(data.view(), TileLayout::kBytes);
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

// Packed fp4 pieces hold their 128 codes transposed: word j of a piece holds elements j, 32 + j,
// 64 + j, 96 + j from its low nibble up. Rows of 100 bytes (200 codes: a whole piece, then one of
// 72 codes, whose words take elements j < 32, 32 + j < 64 and 64 + j < 72 only), 5 rows, 2 experts.
TEST(WeightTilesTest, Fp4PiecesHoldTheirCodesTransposed) {
  Tensor data = Tensor::empty({2, 5, 100}, DType::kU8);
  std::mt19937 rng(5);
  auto* bytes = static_cast<uint8_t*>(data.view().data);
  for (int64_t i = 0; i < data.numel(); ++i) bytes[i] = static_cast<uint8_t>(rng());
  const Tensor tiles = pack_weight_tiles(data.view(), TileLayout::kFp4Nibbles);
  ASSERT_EQ(tiles.view().shape_vector(), pack_weight_tiles(data.view(), TileLayout::kBytes)
                                             .view()
                                             .shape_vector());
  const auto code = [&](int64_t e, int64_t r, int64_t i) {  // element i of the stored row
    return bytes[(e * 5 + r) * 100 + i / 2] >> (4 * (i % 2)) & 0xf;
  };
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t p = 0; p < 2; ++p) {
        const uint8_t* piece = weight_tile_row(tiles.view(), e, r) + p * 256;
        for (int64_t j = 0; j < 32; ++j) {
          const int word = piece[2 * j] | piece[2 * j + 1] << 8;
          for (int64_t s = 0; s < 4; ++s) {
            const int64_t i = 128 * p + 32 * s + j;  // the element nibble s of word j holds
            ASSERT_EQ(word >> (4 * s) & 0xf, i < 200 ? code(e, r, i) : 0)
                << e << " " << r << " " << i;
          }
        }
      }
  EXPECT_EQ(tile_layout(WeightCoding::kNvfp4), TileLayout::kFp4Nibbles);
  EXPECT_EQ(tile_layout(WeightCoding::kMxfp4), TileLayout::kFp4Nibbles);
  EXPECT_EQ(tile_layout(WeightCoding::kFp8), TileLayout::kBytes);
  EXPECT_THROW(pack_weight_tiles(Tensor::zeros({1, 4, 64}, DType::kBF16).view(),
                                 TileLayout::kFp4Nibbles),
               InvalidArgument);
}

// A set finds the tiles of the very tensor they were packed from, in the layout asked for,
// nothing else.
TEST(WeightTilesTest, ASetFindsTilesByTheTensorTheyWerePackedFrom) {
  const Tensor a = Tensor::zeros({2, 8, 64}, DType::kF8E4M3);
  const Tensor b = Tensor::zeros({2, 8, 64}, DType::kF8E4M3);
  WeightTileSet set;
  constexpr TileLayout kBytes = TileLayout::kBytes;
  set.pack(a, kBytes);
  set.pack(a, kBytes);         // already packed
  set.pack(Tensor(), kBytes);  // None
  ASSERT_EQ(set.tiles().size(), 1u);
  EXPECT_EQ(set.find(a.view(), kBytes).data, set.tiles()[0].view().data);
  EXPECT_EQ(set.find(a.view(), TileLayout::kFp4Nibbles).data, nullptr);  // packed as bytes only
  EXPECT_EQ(set.find(b.view(), kBytes).data, nullptr);  // same shape, other codes
  TensorView same_bytes_retagged = a.view();            // the same bytes under another 1-byte tag
  same_bytes_retagged.dtype = DType::kU8;
  EXPECT_EQ(set.find(same_bytes_retagged, kBytes).data, set.tiles()[0].view().data);
  TensorView wider_elements = a.view();
  wider_elements.dtype = DType::kBF16;
  EXPECT_EQ(set.find(wider_elements, kBytes).data, nullptr);
  WeightOperand w;
  w.coding = WeightCoding::kFp8;
  w.data = b.view();
  attach_weight_tiles(&set, w);
  EXPECT_EQ(w.tiles.data, nullptr);
  w.data = a.view();
  attach_weight_tiles(&set, w);
  EXPECT_EQ(w.tiles.data, set.tiles()[0].view().data);
  w.coding = WeightCoding::kMxfp4;  // the same bytes read as fp4 need their own layout
  attach_weight_tiles(&set, w);
  EXPECT_EQ(w.tiles.data, nullptr);
  set.pack(a, TileLayout::kFp4Nibbles);
  ASSERT_EQ(set.tiles().size(), 2u);
  attach_weight_tiles(&set, w);
  EXPECT_EQ(w.tiles.data, set.tiles()[1].view().data);
  attach_weight_tiles(nullptr, w);
  EXPECT_EQ(w.tiles.data, nullptr);
  EXPECT_THROW(pack_weight_tiles(Tensor::zeros({8, 64}, DType::kU8).view(), kBytes),
               InvalidArgument);
}

// Every holder of packed fp4 kernel weights packs them in the layout fp4 operands look for (a
// wrong one would only leave the kernels on the contract rows, so nothing else would show it).
TEST(WeightTilesTest, Fp4QuantInfosAndMethodsPackTheLayoutTheirKernelsRead) {
  constexpr TileLayout kFp4 = TileLayout::kFp4Nibbles;
  const auto packs_fp4 = [](MoeQuantInfo& info, const Tensor& w13) {
    info.pack_weight_tiles();
    return info.weight_tiles->find(w13.view(), kFp4).data != nullptr;
  };
  CuteDslFp4MoeQuantInfo cutedsl;
  cutedsl.w13_weight = Tensor::zeros({1, 8, 32}, DType::kU8);
  cutedsl.w2_weight = Tensor::zeros({1, 4, 32}, DType::kU8);
  EXPECT_TRUE(packs_fp4(cutedsl, cutedsl.w13_weight));
  FlashInferMxfp4CutlassMoeQuantInfo mxfp4;
  mxfp4.kernel_layout.w13_weight = Tensor::zeros({1, 8, 32}, DType::kU8);
  mxfp4.kernel_layout.w2_weight = Tensor::zeros({1, 4, 32}, DType::kU8);
  EXPECT_TRUE(packs_fp4(mxfp4, mxfp4.kernel_layout.w13_weight));
  FlashInferCutlassMoeQuantInfo cutlass;
  cutlass.w13_weight = Tensor::zeros({1, 8, 32}, DType::kU8);
  cutlass.w2_weight = Tensor::zeros({1, 4, 32}, DType::kU8);
  cutlass.quant_type = "fp4";
  EXPECT_TRUE(packs_fp4(cutlass, cutlass.w13_weight));
  cutlass.quant_type = "fp8";  // the same runner with fp8 codes reads them as bytes
  EXPECT_EQ(cutlass.kernel_weights_layout(), TileLayout::kBytes);
  EXPECT_EQ(ModelOptNvFp4FusedMoEMethod().kernel_weights_layout(), kFp4);
  EXPECT_EQ(Mxfp4MoEMethod().kernel_weights_layout(), kFp4);
  EXPECT_EQ(Mxfp4FlashinferCutlassMoEMethod().kernel_weights_layout(), kFp4);
  EXPECT_EQ(Fp8MoEMethod().kernel_weights_layout(), TileLayout::kBytes);
}

}  // namespace
}  // namespace moecore
