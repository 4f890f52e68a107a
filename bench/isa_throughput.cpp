// How fast one core issues the 512-bit instructions the avx512_bf16 row's weight decode and dots
// are made of, alone and in the mixes of one fp4 step: the question behind "fp4 decode is bound by
// its instructions, not by memory" (bench/RESULTS.md). Each line times a loop of inline assembly:
// one instruction on twelve registers, or a step's instructions for six channels, each its own
// chain, so the figures are issue rates, not latencies; no memory is touched.
//   ninja -C build moecore_isa_throughput
//   build/moecore_isa_throughput
// Needs AVX512-BF16 and VBMI (exits with a message otherwise); results: bench/RESULTS.md.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "moecore/isa/isa.h"

namespace {

// Twelve registers, one chain each, for one instruction at a time; zmm13–15 hold constants (a
// table, an activation vector).
#define MOECORE_TWELVE(OP) \
  OP(16) OP(17) OP(18) OP(19) OP(20) OP(21) OP(22) OP(23) OP(24) OP(25) OP(26) OP(27)
#define MOECORE_Z(n) "%%zmm" #n
#define VPADDW(r) "vpaddw %%zmm14, " MOECORE_Z(r) ", " MOECORE_Z(r) "\n\t"
#define VPTERNLOGD(r) "vpternlogd $0xea, %%zmm14, %%zmm15, " MOECORE_Z(r) "\n\t"
#define VPERMW(r) "vpermw %%zmm14, " MOECORE_Z(r) ", " MOECORE_Z(r) "\n\t"
#define VPERMT2W(r) "vpermt2w %%zmm14, %%zmm15, " MOECORE_Z(r) "\n\t"
#define VPERMB(r) "vpermb %%zmm14, " MOECORE_Z(r) ", " MOECORE_Z(r) "\n\t"
#define VPSHUFB(r) "vpshufb %%zmm14, " MOECORE_Z(r) ", " MOECORE_Z(r) "\n\t"
#define VPSRLW(r) "vpsrlw $4, " MOECORE_Z(r) ", " MOECORE_Z(r) "\n\t"
#define VDPBF16PS(r) "vdpbf16ps %%zmm14, %%zmm15, " MOECORE_Z(r) "\n\t"
#define VPDPBUSD(r) "vpdpbusd %%zmm14, %%zmm15, " MOECORE_Z(r) "\n\t"

// Six groups over registers no group shares, for the steps: a group's registers are a (the
// piece's nibbles), b (decoded weights), c (an accumulator), d (an index).
// clang-format off
#define MOECORE_SIX_GROUPS(G)                                             \
  G(16, 17, 18, 19) G(20, 21, 22, 23) G(24, 25, 26, 27) G(28, 29, 30, 31) \
  G(0, 1, 2, 3) G(4, 5, 6, 7)

// One mxfp4 step of one channel (bf16_streams.h, fp4_bf16_step and next_step_bf16): the table
// permute of the piece's low nibbles, the shift to the next step's, one dot.
#define MXFP4_STEP(a, b, c, d)                             \
  "vpermw %%zmm14, " MOECORE_Z(a) ", " MOECORE_Z(b) "\n\t" \
  "vpsrlw $4, " MOECORE_Z(a) ", " MOECORE_Z(a) "\n\t"      \
  "vdpbf16ps %%zmm15, " MOECORE_Z(b) ", " MOECORE_Z(c) "\n\t"
// One nvfp4 step as the kernel took it before 2026-11-29: the index (nibble | table bit) in one
// bit operation, the two-table permute (VPERMT2W) of the step's two blocks, the shift, the dot.
#define NVFP4_TWO_TABLE_STEP(a, b, c, d)                              \
  "vpternlogd $0xea, %%zmm14, " MOECORE_Z(a) ", " MOECORE_Z(d) "\n\t" \
  "vpermt2w %%zmm14, " MOECORE_Z(d) ", " MOECORE_Z(b) "\n\t"          \
  "vpsrlw $4, " MOECORE_Z(a) ", " MOECORE_Z(a) "\n\t"                 \
  "vdpbf16ps %%zmm15, " MOECORE_Z(b) ", " MOECORE_Z(c) "\n\t"
// One nvfp4 step as the kernel takes it (fp4_bf16_step): both blocks' entries in one register,
// built by a 256-bit insert, and a one-table permute (VPERMW).
#define NVFP4_STEP(a, b, c, d)                                        \
  "vinserti64x4 $1, %%ymm14, %%zmm13, %%zmm12\n\t"                    \
  "vpternlogd $0xea, %%zmm14, " MOECORE_Z(a) ", " MOECORE_Z(d) "\n\t" \
  "vpermw %%zmm12, " MOECORE_Z(d) ", " MOECORE_Z(b) "\n\t"            \
  "vpsrlw $4, " MOECORE_Z(a) ", " MOECORE_Z(a) "\n\t"                 \
  "vdpbf16ps %%zmm15, " MOECORE_Z(b) ", " MOECORE_Z(c) "\n\t"
// clang-format on

#define MOECORE_CLOBBERS                                                                        \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm12", "xmm13", "xmm14",    \
      "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", \
      "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31"

constexpr long kLoops = 20'000'000;

// Seconds per loop of `Body` (best of three runs).
template <class Body>
double seconds_per_loop(Body body) {
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count() / kLoops);
  }
  return best;
}

// Prints the time of `instructions` (a string of them, `count` in all) as ns per `unit` of
// `per_unit` instructions.
#define MOECORE_TIMED(name, instructions, count, unit, per_unit)                        \
  [] {                                                                                  \
    const double s = seconds_per_loop([]() __attribute__((target("avx512f"))) {         \
      for (long i = 0; i < kLoops; ++i) asm volatile(instructions::: MOECORE_CLOBBERS); \
    });                                                                                 \
    std::printf("%-30s %6.3f ns %s\n", name, s / (count) * (per_unit) * 1e9, unit);     \
  }()
#define MOECORE_ONE(name, OP) MOECORE_TIMED(name, MOECORE_TWELVE(OP), 12, "an instruction", 1)
#define MOECORE_STEP(name, G, size) \
  MOECORE_TIMED(name, MOECORE_SIX_GROUPS(G), 6 * (size), "a step of one channel", size)

}  // namespace

int main() {
  const moecore::CpuFeatures& f = moecore::cpu_features();
  if (!f.avx512_bf16 || !f.avx512_vbmi || !f.avx512_vnni) {
    std::fprintf(stderr, "moecore_isa_throughput needs AVX512-BF16, VNNI and VBMI\n");
    return 1;
  }
  std::printf("one thread, 512-bit registers, best of 3 loops of %ld\n", kLoops);
  MOECORE_ONE("vpaddw", VPADDW);
  MOECORE_ONE("vpternlogd", VPTERNLOGD);
  MOECORE_ONE("vpermw", VPERMW);
  MOECORE_ONE("vpermt2w", VPERMT2W);
  MOECORE_ONE("vpermb", VPERMB);
  MOECORE_ONE("vpshufb", VPSHUFB);
  MOECORE_ONE("vpsrlw (immediate)", VPSRLW);
  MOECORE_ONE("vdpbf16ps", VDPBF16PS);
  MOECORE_ONE("vpdpbusd", VPDPBUSD);
  MOECORE_STEP("mxfp4 step (3 instructions)", MXFP4_STEP, 3);
  MOECORE_STEP("nvfp4 step (5 instructions)", NVFP4_STEP, 5);
  MOECORE_STEP("nvfp4, VPERMT2W as before (4)", NVFP4_TWO_TABLE_STEP, 4);
  return 0;
}
