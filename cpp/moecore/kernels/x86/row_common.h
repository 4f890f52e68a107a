// What every x86 row of the scaled GEMM shares, whatever its vector width: a call's operands, the
// weight streams' row pointers (fp4's block-scale rows too), and the switch from a weight coding
// to its stream. Each row's own streams (x86/weight_streams.h, quant_gemm_avx2.cpp, bf16_streams.h)
// add the decode. Internal linkage, as for everything compiled with per-file ISA flags: each row
// keeps its own copy, so no inline function built for a wider ISA can stand in for another's.
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <cstdint>

#include "moecore/core/error.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/kernels/weight_tiles.h"

namespace moecore {
namespace {

// Weight channels (rows of W) in a tile at most.
constexpr int kMaxChannels = 4;

// One call's operands.
struct Call {
  ActivationCodes a;  // a copy, so that rows_from's calls own theirs
  int64_t m;
  const WeightOperand& w;
  int64_t e, n0, n;
  float* out;
  int64_t ldo;
  int64_t nb, kb;
  float* w_scales;  // [nb, kMaxChannels]: the K-block scales of a tile's channels

  /// Activation rows [r0, r0 + rows) as a call of their own.
  Call rows_from(int64_t r0, int64_t rows) const {
    return {activation_rows_from(a, r0), rows, w, e, n0, n, out + r0 * ldo, ldo, nb, kb, w_scales};
  }
  /// Weight rows [n0 + c0, n0 + c0 + cols) as a call of their own.
  Call columns_from(int64_t c0, int64_t cols) const {
    return {a, m, w, e, n0 + c0, cols, out + c0, ldo, nb, kb, w_scales};
  }
};

/// The K-block scales of a walk's tile channels in call.w_scales (kMaxChannels apart), read only
/// when a tile's rows leave the rows whose scales every channel already holds: an fp8 block row
/// (block_n rows share one row of block scales), or every row where the coding has no row scales
/// (bf16, fp4). fp8 blocks at M = 1 read them for every channel before, with a division each: 11 %
/// of a Qwen3-30B-A3B layer's samples (Zen 4, bench/RESULTS.md).
class TileScales {
 public:
  explicit TileScales(const Call& call) : call_(call) {}

  /// Channels c < kMaxChannels bound to rows min(first + c, last).
  void bind(int64_t first, int64_t last) {
    if (first >= held_begin_ && last < held_end_) return;
    const WeightOperand& w = call_.w;
    for (int c = 0; c < kMaxChannels; ++c)
      weight_row_scales(w, call_.e, std::min(first + c, last), call_.w_scales + c, kMaxChannels);
    held_begin_ = held_end_ = 0;
    if (w.coding != WeightCoding::kFp8 && w.coding != WeightCoding::kInt8) {
      held_end_ = INT64_MAX;  // every row's scale is 1
    } else if (w.block_n > 0 && first / w.block_n == last / w.block_n) {
      held_begin_ = first / w.block_n * w.block_n;
      held_end_ = held_begin_ + w.block_n;
    }
  }

 private:
  const Call& call_;
  int64_t held_begin_ = 0, held_end_ = 0;  // every channel holds the scales of these rows
};

/// Where a dot loop prefetches the weights of the next tile: `lead` bytes on along each
/// channel's stream, into L1 on Intel cores. On AMD cores into L2, except one activation row of
/// light lines (kLight: one instruction per line and row, as bf16 codes as stored and int8 bytes
/// take; decoded codes are not light), which runs faster on the hardware prefetcher alone. There a
/// line prefetched into L1 holds one of its few miss buffers until it comes from memory, so those
/// buffers bound how much one core reads at once. Zen 4, one thread, weights from memory
/// (`moecore_gemm_timing --tiles`, alternating builds): into L2, bf16 2 / 4 / 8 × 16384 × 2048
/// took 0.91 / 0.55 / 0.75 of their time into L1, int8 4 / 8 rows 0.87 / 0.78; one row of fp8 and
/// fp4 0.6–0.9× (1 × 8192 × 14336 mxfp4 4.6–4.9 → 2.9–3.3 ms, fp8 blocks 6.9–7.3 → 4.7–5.1 ms,
/// 1 × 28672 × 4096 mxfp4 3.0–4.1 → 2.5–2.8 ms; nvfp4, bound by its decode, and Qwen3-30B-A3B's
/// short rows the same), and one row of bf16 / int8 1.25 / 1.35× the time it takes with none.
/// On the 16-core Xeon bf16 took the same time into L2 and int8 2 to 4 rows 1.06-1.20×, so Intel
/// cores keep L1 (bench/RESULTS.md; bench/prefetch_timing.cpp measures a machine's cores).
struct WeightPrefetch {
  int64_t lead = 0;
  bool amd = false;  // cpu_features().vendor_amd
  /// The prefetch of a walk whose next tile starts `lead` bytes on.
  static WeightPrefetch ahead_by(int64_t lead) { return {lead, cpu_features().vendor_amd}; }
  /// The line at p + lead, for a tile of R activation rows. (In asm: GCC 12 merged the two
  /// intrinsics of a branch into one prefetch with a variable hint, then dropped it, from the
  /// bf16 and fp4 loops.)
  template <int R, bool kLight = false>
  void line(const void* p) const {
    const char* at = static_cast<const char*>(p) + lead;
    if (!amd)
      asm volatile("prefetcht0 %0" : : "m"(*at));
    else if (R > 1 || !kLight)
      asm volatile("prefetcht1 %0" : : "m"(*at));
  }
};

/// bind(c, w, e, r) points tile channel c at row r of expert e's weights (elements of type T):
/// its contract row, or with `tiled` (set by a row that reads w.tiles when w has them) its row in
/// the weight tiles, whose 64-byte pieces lie kWeightTileRows pieces apart.
template <class T>
struct StreamRows {
  const T* row[kMaxChannels] = {};
  bool tiled = false;
  void bind(int c, const WeightOperand& w, int64_t e, int64_t r) {
    row[c] = static_cast<const T*>(tiled ? static_cast<const void*>(weight_tile_row(w.tiles, e, r))
                                         : w.data.at({e, r, 0}));
  }
  /// Byte `byte` of channel c's row, in either layout.
  const uint8_t* at(int c, int64_t byte) const {
    const int piece_shift = tiled ? 8 : 6;  // log2 of the bytes from one piece to the next
    static_assert(kWeightTileRows * kWeightTilePieceBytes == 1 << 8 && kWeightTilePieceBytes == 64);
    return reinterpret_cast<const uint8_t*>(row[c]) + ((byte >> 6) << piece_shift) + (byte & 63);
  }
  /// The prefetch lead of a walk of `channels`-row tiles: in the contract rows, from a byte of a
  /// tile's row to the same byte of the next tile's. Tiles are one stream, groups back to back, so
  /// there it is a distance along that stream, kTiledPrefetchBytes whatever the group: a group of
  /// short rows is too short a lead (int8 at K = 768, groups of 3 KiB: 1 × 65536 × 768 from memory
  /// took 2.97 ms with a group's lead and 2.38 ms with this one; Zen 4, 2026-11-27).
  int64_t lead(const WeightOperand& w, int channels) const {
    return tiled ? kTiledPrefetchBytes : channels * w.data.strides[1] * dtype_size(w.data.dtype);
  }
  /// Lines fetched a whole group ahead of long rows (32 KiB for K = 4096 in bf16, 112 KiB for
  /// 14336) left L1 before they were read: one call from memory, one thread, took 0.88–0.94× the
  /// time with this cap (Zen 4, 2026-11-27: 1 × 28672 × 4096 bf16 16.5 → 14.5 ms, 1 × 4096 × 14336
  /// 6.19 → 5.83 ms, 1 × 16384 × 2048 3.30 → 3.03 ms; 6 and 12 KiB did less, 2 and 4 KiB worse).
  static constexpr int64_t kTiledPrefetchBytes = 8 << 10;
};

/// Packed e2m1 rows (element 2j in the low nibble of byte j) with their rows of block-scale codes,
/// one per kGroup elements (K is a multiple of kGroup).
template <int kGroup>
struct Fp4StreamRows : StreamRows<uint8_t> {
  static_assert(kGroup == 16 || kGroup == 32, "fp4 scale groups are 16 or 32 elements");
  const uint8_t* scale_codes[kMaxChannels] = {};
  void bind(int c, const WeightOperand& w, int64_t e, int64_t r) {
    StreamRows<uint8_t>::bind(c, w, e, r);
    scale_codes[c] = static_cast<const uint8_t*>(w.scale.at({e, r, 0}));
    // The scale rows are a stream of their own, read in short bursts: fetch the row that channel c
    // binds in the next tile (kMaxChannels rows on; weights prefetch in the dots).
    const uint8_t* next = scale_codes[c] + kMaxChannels * w.scale.strides[1];
    for (int64_t b = 0; b < w.k / kGroup; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(next + b), _MM_HINT_T0);
  }
  /// The scale code of channel c's element k.
  uint8_t scale_code(int c, int64_t k) const {
    return scale_codes[c][static_cast<uint64_t>(k) / kGroup];  // unsigned: a shift
  }
};

/// run(stream) with a default-built stream of w's coding, from a row's stream templates: dense
/// rows by their dtype, int8 codes as floats (a row handles int8 × int8 before calling this).
template <template <DType> class Dense, class Fp8, class Int8AsFloat, template <int> class Fp4,
          class Run>
void run_with_weight_stream(const WeightOperand& w, Run&& run) {
  switch (w.coding) {
    case WeightCoding::kDense:
      switch (w.data.dtype) {
        case DType::kBF16:
          return run(Dense<DType::kBF16>{});
        case DType::kF16:
          return run(Dense<DType::kF16>{});
        default:
          return run(Dense<DType::kF32>{});
      }
    case WeightCoding::kFp8:
      return run(Fp8{});
    case WeightCoding::kInt8:
      return run(Int8AsFloat{});
    case WeightCoding::kNvfp4:
    case WeightCoding::kMxfp4:
      MOECORE_INTERNAL_CHECK(w.k % fp4_group_size(w.coding) == 0, "fp4 K (", w.k,
                             ") must be a multiple of its scale group");
      if (w.coding == WeightCoding::kNvfp4) return run(Fp4<16>{});
      return run(Fp4<32>{});
  }
  MOECORE_INTERNAL_CHECK(false, "unknown weight coding");
}

}  // namespace
}  // namespace moecore
