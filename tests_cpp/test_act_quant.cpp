// Every row of the activation-quantizer table this machine can run (act_quant_kernels at each
// available level, the reference row included) gives the bits of formats' scalar rules
// (quantize.h: amax_row, fp8_quantize_row_mul / _div, int8_quantize_row, nvfp4_quantize_row with
// nvfp4_code_values_row) on: random fp32 bit patterns and the special values (NaN of both signs,
// ±inf, ±0, subnormals, values beyond ±448) under several multipliers; every E4M3, E2M1 and int8
// rounding boundary and its neighbours one ulp away, NVFP4 block scales on E4M3 ties included;
// and every length 1–300 (NVFP4: every whole block count up to 20), each segment ending at an
// inaccessible page so that a row reading past n faults, with sentinels before it.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "moecore/formats/fp8.h"
#include "moecore/formats/quantize.h"
#include "moecore/isa/isa.h"
#include "moecore/kernels/act_quant.h"

namespace moecore {
namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The first index where a and b differ in bits, or -1.
int64_t first_difference(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (float_to_bits(a[i]) != float_to_bits(b[i])) return i;
  return -1;
}

// ---------------------------------------------------------------------------------------------
// The scalar rules, straight from formats (codes, then their values).

// The E4M3 codes that `quantize_row(x, n, param, codes)` writes, as their values.
template <typename QuantizeRow>
std::vector<float> fp8_rule_values(const float* x, int64_t n, float param,
                                   QuantizeRow quantize_row) {
  std::vector<uint8_t> q(static_cast<size_t>(n));
  quantize_row(x, n, param, q.data());
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = fp8_e4m3_table()[q[i]];
  return out;
}

std::vector<float> fp8_mul_rule(const float* x, int64_t n, float inv) {
  return fp8_rule_values(x, n, inv, fp8_quantize_row_mul);
}

std::vector<float> fp8_div_rule(const float* x, int64_t n, float s) {
  return fp8_rule_values(x, n, s, fp8_quantize_row_div);
}

std::vector<float> int8_rule(const float* x, int64_t n, float amax) {
  std::vector<int8_t> q(static_cast<size_t>(n));
  int8_quantize_row(x, n, amax, q.data());
  return std::vector<float>(q.begin(), q.end());
}

std::vector<float> nvfp4_rule(const float* x, int64_t n, float gs) {
  std::vector<uint8_t> q(static_cast<size_t>(n / 2)), sf(static_cast<size_t>(n / 16));
  nvfp4_quantize_row(x, n, gs, q.data(), sf.data());
  std::vector<float> out(static_cast<size_t>(n));
  nvfp4_code_values_row(q.data(), sf.data(), n, out.data());
  return out;
}

// The four in-place operations of a row, each with its rule and the parameter values the tests
// run it under (multipliers, divisors, amaxes and global scales, typical and extreme).
enum class Op { kFp8Mul, kFp8Div, kInt8, kNvfp4 };
const char* op_name(Op op) {
  const char* names[] = {"fp8_mul", "fp8_div", "int8", "nvfp4"};
  return names[static_cast<int>(op)];
}

std::vector<float> rule(Op op, const float* x, int64_t n, float p) {
  switch (op) {
    case Op::kFp8Mul:
      return fp8_mul_rule(x, n, p);
    case Op::kFp8Div:
      return fp8_div_rule(x, n, p);
    case Op::kInt8:
      return int8_rule(x, n, p);
    case Op::kNvfp4:
      return nvfp4_rule(x, n, p);
  }
  return {};
}

void run(const ActQuantKernels& k, Op op, float* x, int64_t n, float p) {
  switch (op) {
    case Op::kFp8Mul:
      return k.fp8_mul(x, n, p);
    case Op::kFp8Div:
      return k.fp8_div(x, n, p);
    case Op::kInt8:
      return k.int8(x, n, p);
    case Op::kNvfp4:
      return k.nvfp4(x, n, p);
  }
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kDenormMin = std::numeric_limits<float>::denorm_min();

std::vector<float> parameters(Op op) {
  switch (op) {
    case Op::kFp8Mul:  // 1/0 = inf (a zero static scale) and 0 (a zero dynamic scale) included
      return {1.0f, 0.37f, 3.0e4f, 0x1p-100f, 3.0e30f, 0.0f, kInf, std::nanf("")};
    case Op::kFp8Div:
      return {1.0f, 0.37f, 1.0e-10f / 448.0f, 0x1p-130f, 1.0e30f, 0.0f, kInf};
    case Op::kInt8:  // amax: 127 makes the multiplier 1; 0 and denorm_min make it inf
      return {127.0f, 1.0f, 3.7e-3f, 1.0e-10f, 1.0e38f, 0.0f, kDenormMin};
    case Op::kNvfp4:  // finite global scales > 0, as the backends check them
      return {1.0f, 150.0f, 0.0123f, 2688.0f / 3.5f, 1.0e-20f, 1.0e20f};
  }
  return {};
}

constexpr Op kOps[] = {Op::kFp8Mul, Op::kFp8Div, Op::kInt8, Op::kNvfp4};

// Every special value once (both NaN signs, quiet and signalling payloads), then the rest.
std::vector<float> special_values() {
  std::vector<float> out;
  for (uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fffffffu})
    out.push_back(bits_to_float(u));
  for (float v : {kInf,    0.0f,    kDenormMin, 0x1p-140f, std::numeric_limits<float>::min(),
                  0x1p-6f, 0x1p-9f, 0x1p-10f,   0.5f,      1.0f,
                  127.5f,  126.5f,  128.0f,     447.0f,    448.0f,
                  449.0f,  464.0f,  480.0f,     1.0e6f,    std::numeric_limits<float>::max()}) {
    out.push_back(v);
    out.push_back(-v);
  }
  return out;
}

class ActQuantTest : public ::testing::TestWithParam<IsaLevel> {
 protected:
  const ActQuantKernels& row() const { return act_quant_kernels(GetParam()); }

  // The row's in-place result on a copy of x against the rule's, for op under p.
  void expect_rule(Op op, const std::vector<float>& x, float p, const char* what) const {
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<float> got = x;
    run(row(), op, got.data(), n, p);
    const std::vector<float> want = rule(op, x.data(), n, p);
    const int64_t i = first_difference(got.data(), want.data(), n);
    ASSERT_EQ(i, -1) << what << ": " << op_name(op) << "(p=" << p << ") at " << i << ": x=" << x[i]
                     << " (0x" << std::hex << float_to_bits(x[i]) << std::dec << ") gives "
                     << got[i] << ", the rule " << want[i];
  }
};

// (a) Random fp32 bit patterns with every special value, elementwise and in 16-value blocks (the
// patterns span every exponent, so blocks mostly saturate); amax over windows of every length up
// to 40 slid through them. Then NVFP4 blocks of normal values at scales from 2^-30 to 2^30 with
// specials mixed in, where the block scales vary.
TEST_P(ActQuantTest, RandomBitPatternsAndSpecialValues) {
  std::mt19937 rng(123);
  std::vector<float> x = special_values();
  x.resize(1 << 20);
  for (size_t i = special_values().size(); i < x.size(); ++i) x[i] = bits_to_float(rng());
  for (Op op : kOps)
    for (float p : parameters(op)) expect_rule(op, x, p, "random bits");

  const std::vector<float> specials = special_values();
  for (int64_t len = 1; len <= 40; ++len)
    for (int64_t i0 = 0; i0 + len <= 4096; i0 += 7) {
      const float got = row().amax(x.data() + i0, len), want = amax_row(x.data() + i0, len);
      ASSERT_EQ(float_to_bits(got), float_to_bits(want))
          << "amax of [" << i0 << ", +" << len << "): " << got << " vs " << want;
    }
  EXPECT_EQ(float_to_bits(row().amax(x.data(), 0)), 0u);
  EXPECT_EQ(row().amax(x.data(), static_cast<int64_t>(x.size())),
            amax_row(x.data(), static_cast<int64_t>(x.size())));

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30), pick(0, 15);
  std::vector<float> blocks(16 * 4096);
  for (size_t b = 0; b < blocks.size(); b += 16) {
    const float scale = std::ldexp(1.0f, exponent(rng));
    for (size_t i = 0; i < 16; ++i) blocks[b + i] = normal(rng) * scale;
    if (b % 64 == 0) blocks[b + pick(rng)] = specials[rng() % specials.size()];
    if (b % 96 == 0) std::fill(blocks.begin() + b, blocks.begin() + b + 16, 0.0f);
    if (b % 80 == 0) blocks[b + pick(rng)] = -0.0f;
  }
  for (Op op : kOps)
    for (float p : parameters(op)) expect_rule(op, blocks, p, "scaled normal blocks");
}

// The e4m3 values 0 < v ≤ 448 (codes 0x01–0x7e).
std::vector<float> e4m3_values() {
  std::vector<float> out;
  for (int c = 1; c <= 0x7e; ++c) out.push_back(fp8_e4m3_to_f32(static_cast<uint8_t>(c)));
  return out;
}

// v and its fp32 neighbours, with both signs.
void push_around(std::vector<float>& out, float v) {
  for (float w : {std::nextafter(v, 0.0f), v, std::nextafter(v, kInf)}) {
    out.push_back(w);
    out.push_back(-w);
  }
}

// (b) Every rounding boundary and its fp32 neighbours: E4M3 midpoints (subnormal, normal and
// the top binade, 448 and past it) under the multiply and the divide at exact powers of two;
// int8's k + 1/2 for every k under multipliers 1 and 2; E2M1's bounds inside NVFP4 blocks whose
// scale makes the multiplier an exact power of two; and NVFP4 block scales that land on an E4M3
// midpoint or one fp32 ulp beside it.
TEST_P(ActQuantTest, EveryRoundingBoundaryAndItsNeighbours) {
  const std::vector<float> v = e4m3_values();
  std::vector<float> e4m3 = {0.0f, -0.0f};
  push_around(e4m3, v[0] / 2);  // between 0 and the smallest subnormal
  for (size_t i = 0; i < v.size(); ++i) {
    push_around(e4m3, v[i]);
    push_around(e4m3, i + 1 < v.size() ? (v[i] + v[i + 1]) / 2 : 464.0f);  // 464: past 448
  }
  for (int e : {0, -20, 7, 40}) {
    const float up = std::ldexp(1.0f, e);
    std::vector<float> x(e4m3);
    for (float& f : x) f *= up;  // exact: the products stay normal fp32
    expect_rule(Op::kFp8Mul, x, 1.0f / up, "e4m3 boundaries");
    expect_rule(Op::kFp8Div, x, up, "e4m3 boundaries");
  }

  std::vector<float> halves;
  for (int k = -130; k <= 130; ++k) push_around(halves, static_cast<float>(k) + 0.5f);
  push_around(halves, 0.49999997f);
  expect_rule(Op::kInt8, halves, 127.0f, "int8 halves");  // multiplier 127/127 = 1
  for (float& f : halves) f /= 2;
  expect_rule(Op::kInt8, halves, 63.5f, "int8 halves");  // multiplier 2

  // A block led by 6·2^j has the scale code of 2^j (gs = 1: 6·fp32(1/6) rounds to 1), so its
  // multiplier is 2^-j and x = bound·2^j lands on the bound.
  std::vector<float> bounds;
  for (float b : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 0.5f, 1.0f, 3.0f, 4.0f})
    push_around(bounds, b);
  bounds.push_back(0.0f);
  bounds.push_back(-0.0f);
  for (int j : {-9, -6, 0, 3, 8}) {
    const float up = std::ldexp(1.0f, j);
    std::vector<float> x;
    for (size_t i = 0; i < bounds.size(); i += 15) {
      x.push_back(6.0f * up);
      for (size_t t = i; t < i + 15; ++t) x.push_back(t < bounds.size() ? bounds[t] * up : 0.0f);
    }
    std::vector<uint8_t> q(x.size() / 2), sf(x.size() / 16);
    nvfp4_quantize_row(x.data(), static_cast<int64_t>(x.size()), 1.0f, q.data(), sf.data());
    ASSERT_EQ(fp8_e4m3_to_f32(sf[0]), up) << "the block scale is not 2^" << j;
    expect_rule(Op::kNvfp4, x, 1.0f, "e2m1 boundaries");
  }

  // NVFP4 block scales on E4M3 ties: the amaxes vmax whose s = gs · (vmax · fp32(1/6)) is an
  // E4M3 midpoint (every one of them is reached) or an fp32 ulp beside one, found by walking the
  // fp32 values around 6·m / gs; 448 and its neighbours for the clamp.
  std::vector<float> midpoints;
  for (size_t i = 0; i + 1 < v.size(); ++i) midpoints.push_back((v[i] + v[i + 1]) / 2);
  midpoints.push_back(448.0f);
  const float inv6 = 1.0f / 6.0f;
  for (float gs : {1.0f, 3.0f}) {
    std::vector<float> blocks;
    int64_t exact = 0;
    for (float m : midpoints) {
      bool reached = false;
      for (float target : {std::nextafter(m, 0.0f), m, std::nextafter(m, kInf)}) {
        float vmax = 6.0f * target / gs;
        for (int step = 0; step < 48; ++step) vmax = std::nextafter(vmax, 0.0f);
        for (int step = 0; step < 96; ++step, vmax = std::nextafter(vmax, kInf)) {
          if (gs * (vmax * inv6) != target) continue;
          reached |= target == m;
          const float block[16] = {vmax,         -vmax * 0.3f, vmax * 0.11f, -vmax * 0.5f,
                                   vmax * 0.25f, vmax * 0.75f, -vmax,        vmax * 0.9f,
                                   vmax * 0.01f, 0.0f,         -0.0f,        vmax * 0.42f,
                                   vmax * 0.6f,  -vmax * 0.8f, vmax * 0.2f,  vmax * 0.99f};
          blocks.insert(blocks.end(), block, block + 16);
        }
      }
      exact += reached ? 1 : 0;
    }
    ASSERT_EQ(exact, static_cast<int64_t>(midpoints.size())) << "gs=" << gs;
    expect_rule(Op::kNvfp4, blocks, gs, "e4m3 block-scale ties");
  }
}

// A page-aligned region whose next page is inaccessible: segment(n) is n floats ending at that
// page, with kGuard sentinel floats before them.
class GuardedFloats {
 public:
  static constexpr int64_t kGuard = 16;
  GuardedFloats() {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* base =
        mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::runtime_error("GuardedFloats: mmap failed");
    base_ = static_cast<uint8_t*>(base);
    if (mprotect(base_ + page_, page_, PROT_NONE) != 0)
      throw std::runtime_error("GuardedFloats: mprotect failed");
  }
  ~GuardedFloats() { munmap(base_, 2 * page_); }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;
  float* segment(int64_t n) const { return reinterpret_cast<float*>(base_ + page_) - n; }

 private:
  uint8_t* base_ = nullptr;
  size_t page_ = 0;
};

// (c) Every length 1–300 (NVFP4: 16–320 by blocks), on values with specials mixed in: the bits
// of the rule, nothing read past n (the next page faults) and nothing written before x.
TEST_P(ActQuantTest, EveryLengthUpTo300WithoutTouchingPastTheSegment) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 40.0f);
  const std::vector<float> specials = special_values();
  GuardedFloats guarded;
  for (int64_t n = 1; n <= 320; ++n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& f : x) f = normal(rng);
    if (n % 3 == 0) x[rng() % n] = specials[rng() % specials.size()];
    if (n % 5 == 0) x[n - 1] = std::nanf("");  // the last lane: masked tails must keep it
    float* seg = guarded.segment(n);
    const float sentinel = -12345.0f;
    auto load = [&] {
      std::fill(seg - GuardedFloats::kGuard, seg, sentinel);
      std::memcpy(seg, x.data(), static_cast<size_t>(n) * sizeof(float));
    };
    auto check = [&](const std::vector<float>& want, const char* what) {
      const int64_t i = first_difference(seg, want.data(), n);
      ASSERT_EQ(i, -1) << what << " n=" << n << " at " << i << ": x=" << x[i] << " gives " << seg[i]
                       << ", the rule " << want[i];
      for (int64_t g = 1; g <= GuardedFloats::kGuard; ++g)
        ASSERT_EQ(seg[-g], sentinel) << what << " n=" << n << " wrote before x";
    };
    if (n <= 300) {
      load();
      ASSERT_EQ(float_to_bits(row().amax(seg, n)), float_to_bits(amax_row(x.data(), n))) << n;
      load();
      row().fp8_mul(seg, n, 0.37f);
      check(fp8_mul_rule(x.data(), n, 0.37f), "fp8_mul");
      load();
      row().fp8_div(seg, n, 0.0625f);
      check(fp8_div_rule(x.data(), n, 0.0625f), "fp8_div");
      load();
      row().int8(seg, n, 97.0f);
      check(int8_rule(x.data(), n, 97.0f), "int8");
    }
    if (n % 16 == 0) {
      load();
      row().nvfp4(seg, n, 150.0f);
      check(nvfp4_rule(x.data(), n, 150.0f), "nvfp4");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, ActQuantTest, ::testing::ValuesIn(available_isa_levels()),
                         [](const auto& info) { return std::string(isa_level_name(info.param)); });

}  // namespace
}  // namespace moecore
