// AMX row of the peak probe (kernels/probe.h): TDPBF16PS on four 16×16 fp32 accumulator tiles
// fed by two A and two B tiles (the 2×2 register blocking an AMX GEMM uses). Built with AMX
// flags; reach it only through probe_peak, which runs it only where the OS granted AMX.
#include <immintrin.h>

#include <cstring>

#include "moecore/kernels/probe.h"

namespace moecore::probe_detail {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

}  // namespace

float tile_bf16_amx(int64_t iterations) {
  // Tiles 0–3: C (16 rows × 16 fp32); 4–5: A (16 rows × 32 bf16); 6–7: B (16 rows × 32 bf16
  // pairs). All rows are 64 bytes. Zero operands: the instruction's speed does not depend on
  // the values.
  TileConfig config;
  std::memset(&config, 0, sizeof(config));
  config.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  alignas(64) static const uint8_t operand[16 * 64] = {};
  alignas(64) float out[16 * 16];
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  for (int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float total = 0;
  _tile_stored(0, out, 64);
  total += out[0];
  _tile_stored(3, out, 64);
  total += out[255];
  _tile_release();
  return total;
}

}  // namespace moecore::probe_detail
