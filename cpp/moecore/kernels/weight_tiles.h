// Weight tiles: the kernels' prepacked copy of a weight operand's codes (DESIGN.md §4, Weights),
// made once when the weights are processed and kept beside the backend-contract layout, which
// tests inspect and every other kernel row reads.
//
// The rows of each expert go in groups of kWeightTileRows (the channels of a decode tile), and
// the rows of a group are interleaved in 64-byte pieces: piece p of every row of group t, then
// piece p + 1, … So a tile's channels, which the contract layout keeps a whole row apart (several
// short streams that the hardware prefetcher picks up late), become one sequential stream, and
// consecutive tiles follow each other. A piece holds the stored codes of its 64 bytes (fp8 and
// int8 one byte, bf16 two), or for packed fp4 its 128 codes in another order (TileLayout): a
// kernel reads the same values from either layout, so results never depend on which one it was
// given. For data [E, N, L] with rows of B = L · element-size bytes, the tiles are
// u8 [E, ⌈N/4⌉, ⌈B/64⌉, 4, 64]; byte j of row r of expert e (as stored, kBytes) sits at
// [e, r / 4, j / 64, r % 4, j % 64]. Bytes past a row's end, and the rows past N of the last
// group, are zero.
#pragma once

#include <cstdint>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/kernels/quant_gemm.h"

namespace moecore {

constexpr int64_t kWeightTileRows = 4;
constexpr int64_t kWeightTilePieceBytes = 64;

/// How a piece holds its codes. kBytes: as stored. kFp4Nibbles, for packed fp4 (element 2i in the
/// low nibble of byte i): the piece's 128 codes transposed, so that its 16-bit word j holds
/// elements j, 32 + j, 64 + j and 96 + j of the piece from its low nibble up. Shifting the piece
/// right by 4s then puts elements 32s to 32s + 31 in order in the words' low nibbles, which a
/// table permute decodes (x86/bf16_streams.h, Fp4TileStream) with no widening of each 16 bytes.
enum class TileLayout { kBytes, kFp4Nibbles };
/// The layout the kernels read weights of `coding` in.
TileLayout tile_layout(WeightCoding coding);

/// The tile shape of `data` ([E, N, L], its last dimension contiguous).
std::vector<int64_t> weight_tiles_shape(const TensorView& data);
/// `data` in the tile layout (all threads of the pool copy experts at once); kFp4Nibbles takes
/// 1-byte elements (two fp4 codes each).
Tensor pack_weight_tiles(const TensorView& data, TileLayout layout);

/// The weight tiles of a layer's weights, each beside the tensor it was packed from (which it
/// keeps alive), so that an operand gets tiles only of the very codes it views.
class WeightTileSet {
 public:
  /// Packs `weights` in `layout` (an undefined tensor, or one already packed in it, adds nothing).
  void pack(const Tensor& weights, TileLayout layout);
  /// The tiles packed in `layout` from the tensor `data` views (same data, element size, shape and
  /// strides: the same bytes, whatever dtype tag a backend views them with, as the MXFP4 one
  /// retags packed fp4 as u8), or a view with data == nullptr.
  TensorView find(const TensorView& data, TileLayout layout) const;
  /// Every tiles tensor, in packing order.
  std::vector<Tensor> tiles() const;

 private:
  struct Entry {
    Tensor source, tiles;
    TileLayout layout;
  };
  std::vector<Entry> entries_;
};

/// w.tiles = the tiles of w's codes in `set`, in the layout of w's coding (nullptr, or none of
/// w's: w reads its data only).
void attach_weight_tiles(const WeightTileSet* set, WeightOperand& w);

/// The first byte of row r of expert e in `tiles`; its piece p is p · 4 · 64 bytes on. Inline: a
/// decode walk binds a tile's channels every 4 × K outputs.
inline const uint8_t* weight_tile_row(const TensorView& tiles, int64_t e, int64_t r) {
  return static_cast<const uint8_t*>(tiles.data) + e * tiles.strides[0] +
         r / kWeightTileRows * tiles.strides[1] + r % kWeightTileRows * tiles.strides[3];
}

}  // namespace moecore
