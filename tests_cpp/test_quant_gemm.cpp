// The canonical rows of the scaled GEMM (scalar, avx2 and avx512, whichever this machine has) are
// bitwise equal to scaled_gemm_ref for every weight coding and scale mode, with K tails (not a
// multiple of 16 or 32), odd N, an output column offset and M from 1 to 33; NaN fp8 codes give
// NaN outputs in both. The tail test puts NaN (or, for int8 and fp4 data, large codes) just past
// K in every weight and activation row, then repeats the call on copies that end at an
// inaccessible page: a row that adds a lane past K, or reads past a row's end, fails it.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "moecore/formats/fp8.h"
#include "moecore/isa/isa.h"
#include "moecore/kernels/quant_gemm.h"
#include "support/moe_problem.h"

namespace moecore {
namespace {

enum class Mode {
  kF32, kF16, kBf16,                  // dense, no scales, no alpha (the plain GEMM)
  kBf16Scaled,                        // dense with activation scales and alpha
  kFp8Tensor, kFp8Channel, kFp8Block, kFp8OddBlock,
  kInt8Channel, kInt8Tensor, kInt8Int8,
  kNvfp4, kMxfp4,
};

const char* mode_name(Mode mode) {
  const char* names[] = {"f32",         "f16",          "bf16",        "bf16_scaled",
                         "fp8_tensor",  "fp8_channel",  "fp8_block",   "fp8_odd_block",
                         "int8_channel", "int8_tensor", "int8_int8",   "nvfp4",
                         "mxfp4"};
  return names[static_cast<int>(mode)];
}

struct Case {
  Mode mode;
  Tensor data, scale, alpha;
  WeightOperand w;
};

constexpr int64_t kExperts = 2, kExpert = 1;

// `pad` > 0: each weight row is stored with `pad` more elements (bytes for fp4), not part of the
// operand (w.data's last dim is K), that the caller may fill with poison.
Case make_case(std::mt19937& rng, Mode mode, int64_t n, int64_t k, int64_t pad = 0) {
  std::uniform_real_distribution<float> positive(0.25f, 2.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  Case c;
  c.mode = mode;
  WeightOperand& w = c.w;
  w.num_experts = kExperts;
  w.n = n;
  w.k = k;
  auto random_bytes = [&](Tensor& t, int lo, int hi) {
    std::uniform_int_distribution<int> code(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i)
      static_cast<uint8_t*>(t.view().data)[i] = static_cast<uint8_t>(code(rng));
  };
  auto f32_scales = [&](const std::vector<int64_t>& shape) {
    c.scale = Tensor::empty(shape, DType::kF32);
    for (int64_t i = 0; i < c.scale.numel(); ++i) c.scale.ptr<float>()[i] = positive(rng);
  };
  switch (mode) {
    case Mode::kF32:
      c.data = testing::random_tensor(rng, {kExperts, n, k + pad}, DType::kF32);
      break;
    case Mode::kF16:
      c.data = testing::random_tensor(rng, {kExperts, n, k + pad}, DType::kF16);
      break;
    case Mode::kBf16:
    case Mode::kBf16Scaled:
      c.data = testing::random_tensor(rng, {kExperts, n, k + pad}, DType::kBF16);
      break;
    case Mode::kFp8Tensor:
    case Mode::kFp8Channel:
    case Mode::kFp8Block:
    case Mode::kFp8OddBlock:
      w.coding = WeightCoding::kFp8;
      c.data = Tensor::empty({kExperts, n, k + pad}, DType::kF8E4M3);
      random_bytes(c.data, 0, 255);
      for (int64_t i = 0; i < c.data.numel(); ++i) {  // NaN codes only where the NaN test puts them
        uint8_t& q = static_cast<uint8_t*>(c.data.view().data)[i];
        if ((q & 0x7f) == 0x7f) q ^= 0x01;
      }
      if (mode == Mode::kFp8Tensor) f32_scales({kExperts});
      if (mode == Mode::kFp8Channel) f32_scales({kExperts, n});
      if (mode == Mode::kFp8Block || mode == Mode::kFp8OddBlock) {
        // 16 × 48 blocks (K tails inside the last block) and 3 × 40 (every block has a tail).
        w.block_n = mode == Mode::kFp8Block ? 16 : 3;
        w.block_k = mode == Mode::kFp8Block ? 48 : 40;
        f32_scales({kExperts, (n + w.block_n - 1) / w.block_n, (k + w.block_k - 1) / w.block_k});
      }
      break;
    case Mode::kInt8Channel:
    case Mode::kInt8Tensor:
    case Mode::kInt8Int8:
      w.coding = WeightCoding::kInt8;
      c.data = Tensor::empty({kExperts, n, k + pad}, DType::kI8);
      random_bytes(c.data, 0, 255);
      if (mode == Mode::kInt8Tensor)
        f32_scales({kExperts});
      else
        f32_scales({kExperts, n});
      break;
    case Mode::kNvfp4:
    case Mode::kMxfp4: {
      const bool nv = mode == Mode::kNvfp4;
      w.coding = nv ? WeightCoding::kNvfp4 : WeightCoding::kMxfp4;
      c.data = Tensor::empty({kExperts, n, k / 2 + pad}, DType::kU8);
      random_bytes(c.data, 0, 255);
      c.scale = Tensor::empty({kExperts, n, k / fp4_group_size(w.coding)}, DType::kU8);
      // e4m3 scales 2^-6 .. 448 without NaN; e8m0 scales 2^-20 .. 2^20.
      if (nv)
        random_bytes(c.scale, 0x08, 0x7e);
      else
        random_bytes(c.scale, 107, 147);
      break;
    }
  }
  const bool has_alpha = mode == Mode::kBf16Scaled || mode == Mode::kNvfp4 ||
                         mode == Mode::kMxfp4 || mode == Mode::kFp8Channel;
  if (has_alpha) {
    c.alpha = Tensor::empty({kExperts}, DType::kF32);
    for (int64_t i = 0; i < kExperts; ++i) c.alpha.ptr<float>()[i] = positive(rng);
    w.alpha = c.alpha.view();
  }
  w.data = c.data.view();
  w.data.shape[2] -= pad;
  if (c.scale.numel() > 0) w.scale = c.scale.view();
  return c;
}

// Activation codes [m, K] (row stride K + 5): fp32 values, or int8 values for int8 × int8;
// per-(row, K block) scales for blocked fp8, one per row for the other scaled modes.
struct Activations {
  std::vector<float> codes, scales;
  ActivationCodes view;
};

Activations make_activations(std::mt19937& rng, const Case& c, int64_t m) {
  Activations a;
  const int64_t ld = c.w.k + 5;
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), positive(0.25f, 2.0f);
  std::uniform_int_distribution<int> code(-128, 127);
  const bool integer = c.mode == Mode::kInt8Int8;
  a.codes.resize(static_cast<size_t>(m * ld));
  for (float& v : a.codes) v = integer ? static_cast<float>(code(rng)) : unit(rng);
  a.view.codes = a.codes.data();
  a.view.ld = ld;
  a.view.integer = integer;
  const bool plain = c.mode == Mode::kF32 || c.mode == Mode::kF16 || c.mode == Mode::kBf16;
  if (!plain) {
    a.view.scales_per_row = c.w.block_k > 0 ? c.w.num_k_blocks() : 1;
    a.scales.resize(static_cast<size_t>(m * a.view.scales_per_row));
    for (float& s : a.scales) s = positive(rng);
    a.view.scales = a.scales.data();
  }
  return a;
}

std::vector<IsaLevel> canonical_levels() {
  std::vector<IsaLevel> out;
  for (IsaLevel level : available_isa_levels())
    if (level <= IsaLevel::kAvx512) out.push_back(level);
  return out;
}

bool same_bits(float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; }

class QuantGemmTest : public ::testing::TestWithParam<std::tuple<IsaLevel, Mode>> {};

TEST_P(QuantGemmTest, BitwiseEqualToScalar) {
  const auto [level, mode] = GetParam();
  const ScaledGemmFn kernel = scaled_gemm_kernel(level);
  const bool nv = mode == Mode::kNvfp4, mx = mode == Mode::kMxfp4;
  std::mt19937 rng(11);
  // K tails of 16 and 32 lanes (fp4 K is a whole number of scale groups), odd N; K = 2048 makes
  // rows of 8 KiB in fp32, so a call's rows span several of the vector rows' L1-sized row chunks.
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      nv   ? std::vector<std::pair<int64_t, int64_t>>{{7, 48}, {5, 208}, {3, 2048}}
      : mx ? std::vector<std::pair<int64_t, int64_t>>{{7, 32}, {5, 224}, {3, 2048}}
           : std::vector<std::pair<int64_t, int64_t>>{{7, 37}, {5, 200}, {1, 16}, {3, 2048}};
  for (auto [n, k] : shapes) {
    const Case c = make_case(rng, mode, n, k);
    for (int64_t m : {1, 2, 3, 7, 16, 33}) {
      SCOPED_TRACE(::testing::Message() << isa_level_name(level) << " " << mode_name(mode)
                                        << " m=" << m << " n=" << n << " k=" << k);
      const Activations a = make_activations(rng, c, m);
      // Columns [1, n) of the expert into an output with stride n + 2, as a column block would.
      const int64_t ldo = n + 2, n0 = n > 1 ? 1 : 0, cols = n - n0;
      std::vector<float> out(m * ldo, -1.0f), ref(m * ldo, -1.0f);
      kernel(a.view, m, c.w, kExpert, n0, cols, out.data(), ldo);
      scaled_gemm_ref(a.view, m, c.w, kExpert, n0, cols, ref.data(), ldo);
      for (int64_t i = 0; i < m * ldo; ++i) {
        ASSERT_TRUE(std::isfinite(ref[i])) << i;
        ASSERT_TRUE(same_bits(out[i], ref[i])) << "at " << i << ": " << out[i] << " vs " << ref[i];
      }
    }
  }
}

// Activations that are e4m3 code values (what the fp8 quantizers emit, ActivationCodes::
// bounded_codes) against every fp8 weight layout: the rows that take the flag (avx2 leaves 2^8 out
// of its weights and puts it back into the dot) give the scalar reference's bits. The codes run
// over every finite e4m3 value, subnormals, ±0 and ±448 included.
TEST(QuantGemmBoundedCodesTest, Fp8RowsGiveTheBitsOfScalarAtEveryLevel) {
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> byte(0, 255);
  for (const Mode mode : {Mode::kFp8Tensor, Mode::kFp8Channel, Mode::kFp8Block, Mode::kFp8OddBlock})
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{7, 37}, {5, 200}, {6, 256}}) {
      const Case c = make_case(rng, mode, n, k);
      for (int64_t m : {1, 2, 5}) {
        Activations a = make_activations(rng, c, m);
        for (size_t i = 0; i < a.codes.size(); ++i) {
          int code = i < 256 ? static_cast<int>(i) : byte(rng);  // every code at least once
          if ((code & 0x7f) == 0x7f) code ^= 0x01;               // NaN → ±448
          a.codes[i] = fp8_e4m3_to_f32(static_cast<uint8_t>(code));
        }
        a.view.bounded_codes = true;
        std::vector<float> ref(m * n);
        scaled_gemm_ref(a.view, m, c.w, kExpert, 0, n, ref.data(), n);
        for (IsaLevel level : canonical_levels()) {
          SCOPED_TRACE(::testing::Message() << isa_level_name(level) << " " << mode_name(mode)
                                            << " m=" << m << " n=" << n << " k=" << k);
          std::vector<float> out(m * n, -1.0f);
          scaled_gemm_kernel(level)(a.view, m, c.w, kExpert, 0, n, out.data(), n);
          for (int64_t i = 0; i < m * n; ++i) {
            ASSERT_TRUE(std::isfinite(ref[i])) << i;
            ASSERT_TRUE(same_bits(out[i], ref[i]))
                << "at " << i << ": " << out[i] << " vs " << ref[i];
          }
        }
      }
    }
}

std::vector<std::tuple<IsaLevel, Mode>> params() {
  std::vector<std::tuple<IsaLevel, Mode>> out;
  for (IsaLevel level : canonical_levels())
    for (int mode = 0; mode <= static_cast<int>(Mode::kMxfp4); ++mode)
      out.emplace_back(level, static_cast<Mode>(mode));
  return out;
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<IsaLevel, Mode>>& info) {
  return std::string(isa_level_name(std::get<0>(info.param))) + "_" +
         mode_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Levels, QuantGemmTest, ::testing::ValuesIn(params()), param_name);

// Rows read through ActivationCodes::row_index (the k slots of a token share its stored row) give
// the bits of the same rows copied out in call order, at every level this machine has, for every
// coding: each row reads codes and scales of its own stored row, repeats and chunks included.
TEST(QuantGemmRowIndexTest, IndexedRowsGiveTheBitsOfACopyAtEveryLevel) {
  std::mt19937 rng(17);
  constexpr int64_t kStored = 5;
  for (int mode_index = 0; mode_index <= static_cast<int>(Mode::kMxfp4); ++mode_index) {
    const Mode mode = static_cast<Mode>(mode_index);
    const int64_t n = 6, k = mode == Mode::kMxfp4 ? 96 : 80;
    const Case c = make_case(rng, mode, n, k);
    const Activations stored = make_activations(rng, c, kStored);
    for (int64_t m : {1, 3, 40}) {  // 40 rows: more than one row chunk of every row
      std::vector<int64_t> index(static_cast<size_t>(m));
      for (int64_t r = 0; r < m; ++r) index[r] = (3 * r + 2) % kStored;
      Activations copy = stored;  // rows in call order, every stored row's scales with it
      const int64_t ld = stored.view.ld, spr = stored.view.scales_per_row;
      copy.codes.resize(static_cast<size_t>(m * ld));
      if (stored.view.scales != nullptr) copy.scales.resize(static_cast<size_t>(m * spr));
      for (int64_t r = 0; r < m; ++r) {
        std::copy_n(stored.codes.begin() + index[r] * ld, ld, copy.codes.begin() + r * ld);
        if (stored.view.scales != nullptr)
          std::copy_n(stored.scales.begin() + index[r] * spr, spr, copy.scales.begin() + r * spr);
      }
      copy.view.codes = copy.codes.data();
      if (stored.view.scales != nullptr) copy.view.scales = copy.scales.data();
      ActivationCodes indexed = stored.view;
      indexed.row_index = index.data();
      for (const bool bf16_exact : {false, true}) {
        indexed.bf16_exact = copy.view.bf16_exact = bf16_exact;
        for (IsaLevel level : available_isa_levels()) {
          SCOPED_TRACE(::testing::Message() << isa_level_name(level) << " " << mode_name(mode)
                                            << " m=" << m << " bf16_exact=" << bf16_exact);
          const ScaledGemmFn kernel = scaled_gemm_kernel(level);
          std::vector<float> out(m * n, -1.0f), expected(m * n, -2.0f);
          kernel(indexed, m, c.w, kExpert, 0, n, out.data(), n);
          kernel(copy.view, m, c.w, kExpert, 0, n, expected.data(), n);
          for (int64_t i = 0; i < m * n; ++i)
            ASSERT_TRUE(same_bits(out[i], expected[i]))
                << "at " << i << ": " << out[i] << " vs " << expected[i];
        }
      }
    }
  }
}

// Writes poison into the `pad` elements past K of every weight row: NaN where the coding has one
// (a lane past K then makes the output NaN even against a zero activation), else the largest code.
void poison_row_padding(Case& c, int64_t pad) {
  const TensorView& d = c.data.view();
  const int64_t rows = d.shape[0] * d.shape[1], stored = d.shape[2], k = stored - pad;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = k; i < stored; ++i) {
      void* at = static_cast<char*>(d.data) + (row * stored + i) * dtype_size(d.dtype);
      switch (c.mode) {
        case Mode::kF32:
          *static_cast<float*>(at) = std::nanf("");
          break;
        case Mode::kF16:
          *static_cast<uint16_t*>(at) = 0x7e00;
          break;
        case Mode::kBf16:
        case Mode::kBf16Scaled:
          *static_cast<uint16_t*>(at) = 0x7fc0;
          break;
        case Mode::kNvfp4:
        case Mode::kMxfp4:
          *static_cast<uint8_t*>(at) = 0x77;
          break;  // e2m1 6, 6
        case Mode::kInt8Channel:
        case Mode::kInt8Tensor:
        case Mode::kInt8Int8:
          *static_cast<int8_t*>(at) = 127;
          break;
        default:
          *static_cast<uint8_t*>(at) = 0x7f;
          break;  // fp8 NaN
      }
    }
  }
}

// Bytes that end where an inaccessible page starts: a read past the end faults.
class GuardedBytes {
 public:
  explicit GuardedBytes(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    span_ = (bytes + page - 1) / page * page + page;
    void* base = mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::runtime_error("GuardedBytes: mmap failed");
    base_ = static_cast<uint8_t*>(base);
    if (mprotect(base_ + span_ - page, page, PROT_NONE) != 0)
      throw std::runtime_error("GuardedBytes: mprotect failed");
    data_ = base_ + span_ - page - bytes;
  }
  ~GuardedBytes() { munmap(base_, span_); }
  GuardedBytes(const GuardedBytes&) = delete;
  GuardedBytes& operator=(const GuardedBytes&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t span_ = 0;
};

class QuantGemmTailTest : public ::testing::TestWithParam<std::tuple<IsaLevel, Mode>> {};

// K tails of every length class (1 to 15 past a 16-lane step, past a 32-lane step, inside and at
// the end of fp8 blocks of 48 and 40) × M from 1 to 10 (past every row tile: 1 and 3 rows in the
// avx2 row, 4 and 8 in the avx512 one) × 5 output columns (a padded channel tile). fp4 K is a whole
// number of scale groups (the reference's contract), so fp4 takes one and three groups. Weights
// and activations carry poison just past K, which the reference never reads; then the same call
// on copies that end at an inaccessible page (the last weight row and the last activation row),
// where a read past K faults.
TEST_P(QuantGemmTailTest, KTailsAtEveryRowCountBitwiseEqualToScalar) {
  const auto [level, mode] = GetParam();
  const ScaledGemmFn kernel = scaled_gemm_kernel(level);
  const bool nv = mode == Mode::kNvfp4, mx = mode == Mode::kMxfp4;
  std::mt19937 rng(23);
  constexpr int64_t kPad = 16, kN = 6;
  const std::vector<int64_t> ks = nv   ? std::vector<int64_t>{16, 48}
                                  : mx ? std::vector<int64_t>{32, 96}
                                       : std::vector<int64_t>{1, 7, 15, 17, 33, 47, 81};
  for (const int64_t k : ks) {
    Case c = make_case(rng, mode, kN, k, kPad);
    poison_row_padding(c, kPad);
    for (int64_t m = 1; m <= 10; ++m) {
      SCOPED_TRACE(::testing::Message()
                   << isa_level_name(level) << " " << mode_name(mode) << " m=" << m << " k=" << k);
      Activations a = make_activations(rng, c, m);
      for (int64_t r = 0; r < m; ++r)  // row stride K + 5: NaN past K
        for (int64_t i = k; i < a.view.ld; ++i) a.codes[r * a.view.ld + i] = std::nanf("");
      const int64_t ldo = kN + 2, n0 = 1, cols = kN - 1;
      std::vector<float> out(m * ldo, -1.0f), ref(m * ldo, -1.0f);
      kernel(a.view, m, c.w, kExpert, n0, cols, out.data(), ldo);
      scaled_gemm_ref(a.view, m, c.w, kExpert, n0, cols, ref.data(), ldo);
      for (int64_t i = 0; i < m * ldo; ++i) {
        ASSERT_TRUE(std::isfinite(ref[i])) << i;
        ASSERT_TRUE(same_bits(out[i], ref[i])) << "at " << i << ": " << out[i] << " vs " << ref[i];
      }

      const TensorView& d = c.w.data;
      const int64_t row_bytes = d.shape[2] * dtype_size(d.dtype), rows = kExperts * kN;
      GuardedBytes weights(static_cast<size_t>(rows * row_bytes));
      for (int64_t row = 0; row < rows; ++row)
        std::memcpy(weights.data() + row * row_bytes,
                    static_cast<const uint8_t*>(d.data) + row * d.strides[1] * dtype_size(d.dtype),
                    static_cast<size_t>(row_bytes));
      WeightOperand guarded_w = c.w;
      guarded_w.data = make_view(weights.data(), d.dtype, {kExperts, kN, d.shape[2]});
      GuardedBytes codes(static_cast<size_t>(m * k) * sizeof(float));
      float* guarded_codes = reinterpret_cast<float*>(codes.data());
      for (int64_t r = 0; r < m; ++r)
        std::memcpy(guarded_codes + r * k, &a.codes[r * a.view.ld], k * sizeof(float));
      ActivationCodes guarded_a = a.view;
      guarded_a.codes = guarded_codes;
      guarded_a.ld = k;
      std::vector<float> guarded(m * ldo, -1.0f);
      kernel(guarded_a, m, guarded_w, kExpert, n0, cols, guarded.data(), ldo);
      for (int64_t i = 0; i < m * ldo; ++i)
        ASSERT_TRUE(same_bits(guarded[i], ref[i])) << "guarded, at " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, QuantGemmTailTest, ::testing::ValuesIn(params()), param_name);

// NaN codes in whole 64-code lines (which the avx2 row checks before skipping its NaN fix), in
// whole steps and in K tails, at every tile shape (M = 1, 2, 5).
TEST(QuantGemmNanTest, Fp8NanCodesGiveNanOutputsAtEveryCanonicalLevel) {
  std::mt19937 rng(5);
  for (const int64_t k : {40, 200}) {
    Case c = make_case(rng, Mode::kFp8Channel, 4, k);
    uint8_t* codes = static_cast<uint8_t*>(c.data.view().data);
    codes[(kExpert * 4 + 0) * k + 5] = 0x7f;      // channel 0: +NaN, first line or step
    codes[(kExpert * 4 + 2) * k + k - 7] = 0xff;  // channel 2: −NaN, in the K tail
    for (const int64_t m : {1, 2, 5}) {
      for (IsaLevel level : canonical_levels()) {
        SCOPED_TRACE(::testing::Message() << isa_level_name(level) << " k=" << k << " m=" << m);
        const Activations a = make_activations(rng, c, m);
        std::vector<float> out(m * 4), ref(m * 4);
        scaled_gemm_kernel(level)(a.view, m, c.w, kExpert, 0, 4, out.data(), 4);
        scaled_gemm_ref(a.view, m, c.w, kExpert, 0, 4, ref.data(), 4);
        for (int64_t r = 0; r < m; ++r) {
          EXPECT_TRUE(std::isnan(out[r * 4 + 0]) && std::isnan(ref[r * 4 + 0])) << r;
          EXPECT_TRUE(same_bits(out[r * 4 + 1], ref[r * 4 + 1])) << r;
          EXPECT_TRUE(std::isnan(out[r * 4 + 2]) && std::isnan(ref[r * 4 + 2])) << r;
          EXPECT_TRUE(same_bits(out[r * 4 + 3], ref[r * 4 + 3])) << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace moecore
