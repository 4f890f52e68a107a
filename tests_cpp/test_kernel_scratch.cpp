// Working memory of the kernel rows and the activation quantizers (what a prepared run replays
// on): every scaled-GEMM row this machine has, given a GemmScratch reserved to
// gemm_scratch_bytes, allocates nothing for any M (1 to 300, past every row's activation chunk)
// and gives the bits of a call without scratch, whatever the scratch held before; each output
// equals its row computed alone; a scratch too small grows. The quantizer of every ActQuant rule
// allocates nothing when made, copied or called and matches quantize_activation bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moecore/formats/fp8.h"
#include "moecore/isa/isa.h"
#include "moecore/kernels/convert.h"
#include "moecore/kernels/quant_gemm.h"
#include "moecore/runner/quant_compute.h"
#include "support/counting_allocator.h"

namespace moecore {
namespace {

using testing::count_allocations;

bool same_bits(const float* x, const float* y, int64_t n) {
  return std::memcmp(x, y, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// ---------------------------------------------------------------------------------------------
// Kernel rows.

enum class Coding {
  kF32,
  kF16,
  kBf16,
  kFp8Tensor,
  kFp8Channel,
  kFp8Block,
  kInt8,
  kInt8Int8,
  kNvfp4,
  kMxfp4
};

const char* coding_name(Coding c) {
  const char* names[] = {"f32",       "f16",  "bf16",      "fp8_tensor", "fp8_channel",
                         "fp8_block", "int8", "int8_int8", "nvfp4",      "mxfp4"};
  return names[static_cast<int>(c)];
}

bool is_fp4(Coding c) { return c == Coding::kNvfp4 || c == Coding::kMxfp4; }
// Plain dense GEMM: no activation scales, no alpha (the reference row's own fast path).
bool is_plain(Coding c) { return c == Coding::kF32 || c == Coding::kF16 || c == Coding::kBf16; }

constexpr int64_t kExperts = 2, kExpert = 1;

// One expert-batched weight operand with the tensors it views.
struct Operand {
  Tensor data, scale, alpha;
  WeightOperand w;
};

Operand make_operand(std::mt19937& rng, Coding c, int64_t n, int64_t k) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), positive(0.5f, 2.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  Operand op;
  WeightOperand& w = op.w;
  w.num_experts = kExperts;
  w.n = n;
  w.k = k;
  auto f32_tensor = [&](const std::vector<int64_t>& shape) {
    Tensor t = Tensor::empty(shape, DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = positive(rng);
    return t;
  };
  auto byte_tensor = [&](const std::vector<int64_t>& shape, DType dtype, int lo, int hi) {
    std::uniform_int_distribution<int> code(lo, hi);
    Tensor t = Tensor::empty(shape, dtype);
    for (int64_t i = 0; i < t.numel(); ++i)
      static_cast<uint8_t*>(t.view().data)[i] = static_cast<uint8_t>(code(rng));
    return t;
  };
  switch (c) {
    case Coding::kF32:
    case Coding::kF16:
    case Coding::kBf16: {
      const DType dtype = c == Coding::kF32   ? DType::kF32
                          : c == Coding::kF16 ? DType::kF16
                                              : DType::kBF16;
      std::vector<float> values(static_cast<size_t>(kExperts * n * k));
      for (float& v : values) v = unit(rng);
      op.data = Tensor::empty({kExperts, n, k}, dtype);
      store_f32(values.data(), op.data.numel(), dtype, op.data.view().data);
      break;
    }
    case Coding::kFp8Tensor:
    case Coding::kFp8Channel:
    case Coding::kFp8Block:
      w.coding = WeightCoding::kFp8;
      op.data = byte_tensor({kExperts, n, k}, DType::kF8E4M3, 0, 255);
      for (int64_t i = 0; i < op.data.numel(); ++i) {  // no NaN codes
        uint8_t& q = static_cast<uint8_t*>(op.data.view().data)[i];
        if ((q & 0x7f) == 0x7f) q ^= 0x01;
      }
      if (c == Coding::kFp8Tensor) op.scale = f32_tensor({kExperts});
      if (c == Coding::kFp8Channel) op.scale = f32_tensor({kExperts, n});
      if (c == Coding::kFp8Block) {  // 16 × 48 blocks: K tails inside the last block
        w.block_n = 16;
        w.block_k = 48;
        op.scale = f32_tensor({kExperts, (n + 15) / 16, (k + 47) / 48});
      }
      break;
    case Coding::kInt8:
    case Coding::kInt8Int8:
      w.coding = WeightCoding::kInt8;
      op.data = byte_tensor({kExperts, n, k}, DType::kI8, 0, 255);
      op.scale = f32_tensor({kExperts, n});
      break;
    case Coding::kNvfp4:
    case Coding::kMxfp4: {
      w.coding = c == Coding::kNvfp4 ? WeightCoding::kNvfp4 : WeightCoding::kMxfp4;
      op.data = byte_tensor({kExperts, n, k / 2}, DType::kU8, 0, 255);
      // e4m3 scales 0.25 .. 1.875; e8m0 scales 2^-3 .. 2^0.
      op.scale = c == Coding::kNvfp4 ? byte_tensor({kExperts, n, k / 16}, DType::kU8, 0x28, 0x3f)
                                     : byte_tensor({kExperts, n, k / 32}, DType::kU8, 124, 127);
      break;
    }
  }
  if (!is_plain(c)) op.alpha = f32_tensor({kExperts});
  w.data = op.data.view();
  if (op.scale.numel() > 0) w.scale = op.scale.view();
  if (op.alpha.numel() > 0) w.alpha = op.alpha.view();
  return op;
}

// Activation codes [m, K] (row stride K + 3): bf16 values (so the avx512_bf16 and amx rows take
// their own paths), or int8 values for int8 × int8; per-(row, K block) scales unless plain.
struct Activations {
  std::vector<float> codes, scales;
  ActivationCodes view;
};

Activations make_activations(std::mt19937& rng, Coding c, int64_t m, const WeightOperand& w) {
  Activations a;
  const int64_t ld = w.k + 3, nb = w.num_k_blocks();
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), positive(0.5f, 2.0f);
  std::uniform_int_distribution<int> code(-128, 127);
  a.codes.resize(static_cast<size_t>(m * ld));
  for (float& v : a.codes)
    v = c == Coding::kInt8Int8 ? static_cast<float>(code(rng)) : round_to(DType::kBF16, unit(rng));
  a.view.codes = a.codes.data();
  a.view.ld = ld;
  a.view.integer = c == Coding::kInt8Int8;
  a.view.bf16_exact = true;
  if (!is_plain(c)) {
    a.scales.resize(static_cast<size_t>(m * nb));
    for (float& s : a.scales) s = positive(rng);
    a.view.scales = a.scales.data();
    a.view.scales_per_row = nb;
  }
  return a;
}

// The rows whose results are bitwise those of scaled_gemm_ref: the canonical levels, operands the
// bf16 levels hand to the avx512 row (f32/f16 weights), and exact int8 × int8 dots.
bool bitwise_to_reference(IsaLevel level, Coding c) {
  return level <= IsaLevel::kAvx512 || c == Coding::kF32 || c == Coding::kF16 ||
         c == Coding::kInt8Int8;
}

class KernelScratchTest : public ::testing::TestWithParam<std::tuple<IsaLevel, Coding>> {};

TEST_P(KernelScratchTest, ReservedScratchAllocatesNothingAndKeepsTheBits) {
  const auto [level, coding] = GetParam();
  const ScaledGemmFn kernel = scaled_gemm_kernel(level);
  std::mt19937 rng(3);
  // N past one 64-row column block with a partial one; K with 16/32-lane tails (fp4: whole
  // scale groups), and one shape that the amx row reads as stored (bf16, K and N in whole tiles).
  const int64_t k_tail = is_fp4(coding) ? 224 : 200;
  for (auto [n, k] : {std::pair<int64_t, int64_t>{70, k_tail}, {64, 256}}) {
    const Operand op = make_operand(rng, coding, n, k);
    GemmScratch scratch;
    // Garbage bytes: a row must never rely on what the scratch held.
    scratch.bytes.assign(gemm_scratch_bytes(kernel, op.w), 0xff);
    const size_t reserved = scratch.bytes.size();
    for (int64_t m : {1, 7, 64, 300}) {
      SCOPED_TRACE(::testing::Message() << isa_level_name(level) << " " << coding_name(coding)
                                        << " m=" << m << " n=" << n << " k=" << k);
      const Activations a = make_activations(rng, coding, m, op.w);
      // Columns [1, n) into an output with stride n + 2, as a column block would.
      const int64_t ldo = n + 2, n0 = 1, cols = n - 1;
      std::vector<float> out(m * ldo, -1.0f), own(m * ldo, -1.0f);
      ActivationCodes with_scratch = a.view;
      with_scratch.scratch = &scratch;
      EXPECT_EQ(count_allocations(
                    [&] { kernel(with_scratch, m, op.w, kExpert, n0, cols, out.data(), ldo); }),
                0);
      ASSERT_EQ(scratch.bytes.size(), reserved) << "gemm_scratch_bytes was too small";
      kernel(a.view, m, op.w, kExpert, n0, cols, own.data(), ldo);
      ASSERT_TRUE(same_bits(out.data(), own.data(), m * ldo));
      // Rows at the edges of every row's activation chunks give the bits they give alone.
      for (int64_t r : {int64_t{0}, int64_t{63}, int64_t{64}, int64_t{127}, int64_t{128}, m - 1}) {
        if (r >= m) continue;
        std::vector<float> alone(cols);
        kernel(activation_rows_from(with_scratch, r), 1, op.w, kExpert, n0, cols, alone.data(),
               cols);
        ASSERT_TRUE(same_bits(alone.data(), out.data() + r * ldo, cols)) << "row " << r;
      }
      if (bitwise_to_reference(level, coding)) {
        std::vector<float> ref(m * ldo, -1.0f);
        scaled_gemm_ref(a.view, m, op.w, kExpert, n0, cols, ref.data(), ldo);
        ASSERT_TRUE(same_bits(out.data(), ref.data(), m * ldo));
      }
    }
    // A scratch with too little memory grows to what the row needs (an eager caller's first call).
    const int64_t m = 300;
    const Activations a = make_activations(rng, coding, m, op.w);
    std::vector<float> grown_out(m * n), own(m * n);
    GemmScratch empty;
    ActivationCodes with_empty = a.view;
    with_empty.scratch = &empty;
    kernel(with_empty, m, op.w, kExpert, 0, n, grown_out.data(), n);
    kernel(a.view, m, op.w, kExpert, 0, n, own.data(), n);
    EXPECT_GT(empty.bytes.size(), 0u);
    EXPECT_LE(empty.bytes.size(), reserved);
    EXPECT_TRUE(same_bits(grown_out.data(), own.data(), m * n));
  }
}

// One call of `kernel` on m rows of `codes` × weight columns [n0, n0 + cols) of expert kExpert:
// tagged on `scratch`, or (tag 0) untagged on the thread's own memory.
std::vector<float> tagged_call(ScaledGemmFn kernel, const ActivationCodes& codes, int64_t m,
                               const WeightOperand& w, GemmScratch& scratch, uint64_t tag,
                               int64_t n0, int64_t cols) {
  ActivationCodes call = codes;
  call.tag = tag;
  call.scratch = tag != 0 ? &scratch : nullptr;
  std::vector<float> out(m * cols);
  kernel(call, m, w, kExpert, n0, cols, out.data(), cols);
  return out;
}

// The kept rows' room (kept_row_bytes) set for the life of one test, and restored after it.
class KeptRowRoom {
 public:
  explicit KeptRowRoom(int64_t bytes) : previous_(kept_row_bytes()) { set_kept_row_bytes(bytes); }
  ~KeptRowRoom() { set_kept_row_bytes(previous_); }
  KeptRowRoom(const KeptRowRoom&) = delete;
  KeptRowRoom& operator=(const KeptRowRoom&) = delete;

 private:
  int64_t previous_;
};

// The room the test below gives the rows: 4 MiB, so that a call beyond it stays small.
constexpr int64_t kTestKeptRowBytes = 4 << 20;

// More rows than kTestKeptRowBytes of converted rows hold at K = 200 or 224 in any layout (≥ 256
// bytes a row), which the avx512_bf16 paths keep; every other m below takes far less.
constexpr int64_t kBeyondKeptRows = kTestKeptRowBytes / 256 + 64;  // one chunk of 64 rows more

// Whether a row keeps a call's converted activation rows in the scratch for the next call with
// the same tag (KeptRows): the avx512_bf16 row's streamed path (bf16-exact float operands) and
// its int8 × int8 path when the rows take at most 4 MiB, amx's int8 tiles (from 16 rows) when
// they are one chunk of 128 rows.
bool keeps_rows(IsaLevel level, Coding c, int64_t m) {
  if (level < IsaLevel::kAvx512Bf16 || c == Coding::kF32 || c == Coding::kF16) return false;
  if (c == Coding::kInt8Int8 && level == IsaLevel::kAmx && m >= 16) return m <= 128;
  return m < kBeyondKeptRows;
}

// A tagged call may find its rows converted by the previous call on the scratch (ActivationCodes
// ::tag): each call below gives the bits of an untagged call on the codes it is handed, also when
// the codes behind the same rows changed under a new tag, when the call has fewer rows, and when
// the scratch's memory was replaced. Handing other codes under the same tag (which callers must
// not do) shows where rows are reused: the result is the kept rows'.
TEST_P(KernelScratchTest, TaggedRowsAreReusedOnlyForTheSameTagAndRows) {
  const auto [level, coding] = GetParam();
  const KeptRowRoom room(kTestKeptRowBytes);
  const ScaledGemmFn kernel = scaled_gemm_kernel(level, /*amx_float_tiles=*/false);
  std::mt19937 rng(5);
  const int64_t n = 70, k = is_fp4(coding) ? 224 : 200, half = n / 2;
  const Operand op = make_operand(rng, coding, n, k);
  std::vector<int64_t> rows = {7, 20, 64, 100, 300};
  if (level >= IsaLevel::kAvx512Bf16) rows.push_back(kBeyondKeptRows);  // only they keep so many
  for (int64_t m : rows) {
    SCOPED_TRACE(::testing::Message() << isa_level_name(level) << " " << coding_name(coding)
                                      << " m=" << m);
    GemmScratch scratch;
    scratch.bytes.assign(gemm_scratch_bytes(kernel, op.w), 0xff);
    Activations a = make_activations(rng, coding, m, op.w);
    const Activations other = make_activations(rng, coding, m, op.w);
    const auto run = [&](const ActivationCodes& codes, uint64_t tag, int64_t rows, int64_t n0) {
      return tagged_call(kernel, codes, rows, op.w, scratch, tag, n0, half);
    };
    const auto expect_bits = [&](const std::vector<float>& got, const std::vector<float>& want,
                                 const char* what) {
      ASSERT_EQ(got.size(), want.size());
      EXPECT_TRUE(same_bits(got.data(), want.data(), static_cast<int64_t>(got.size()))) << what;
    };
    const Activations original = a;  // its codes and scales
    const auto replace_codes = [&](const Activations& from) {  // same buffers, other values
      a.codes = from.codes;
      a.scales = from.scales;
    };

    // Two column blocks of one expert under one tag.
    const uint64_t first = new_activation_tag(), second = new_activation_tag();
    const std::vector<float> whole = run(a.view, 0, m, 0);
    expect_bits(run(a.view, first, m, 0), whole, "first block");
    if (m == kBeyondKeptRows)  // chunks that overwrite each other give each row its own bits
      for (int64_t r : {int64_t{0}, int64_t{64}, int64_t{8191}, m - 1}) {
        const std::vector<float> alone = run(activation_rows_from(a.view, r), 0, 1, 0);
        EXPECT_TRUE(same_bits(alone.data(), whole.data() + r * half, half)) << "row " << r;
      }
    expect_bits(run(a.view, first, m, half), run(a.view, 0, m, half), "second block");
    // New codes behind the same rows under a new tag, then fewer of those rows.
    replace_codes(other);
    ASSERT_EQ(a.view.codes, a.codes.data()) << "the rows must stay where they were";
    expect_bits(run(a.view, second, m, 0), run(a.view, 0, m, 0), "new tag");
    expect_bits(run(a.view, second, m - 1, 0), run(a.view, 0, m - 1, 0), "fewer rows");
    expect_bits(run(a.view, second, m, 0), run(a.view, 0, m, 0), "all rows again");
    // The scratch's memory replaced: nothing kept survives it.
    const uint8_t* was = scratch.bytes.data();
    scratch.bytes = decltype(scratch.bytes)(scratch.bytes.size(), 0xff);
    ASSERT_NE(scratch.bytes.data(), was);
    expect_bits(run(a.view, second, m, half), run(a.view, 0, m, half), "replaced memory");
    // Other codes (the same scales) under the same tag: the kept rows' result where a row keeps.
    // (The two column blocks above check that kept rows come back with their scales: the bf16
    // row keeps them laid out by K block beside the rows, the integer rows read them again.)
    a.codes = original.codes;
    const std::vector<float> stale = run(a.view, second, m, half);
    const std::vector<float> fresh = run(a.view, 0, m, half);
    a.codes = other.codes;
    const std::vector<float> kept = run(a.view, 0, m, half);
    expect_bits(stale, keeps_rows(level, coding, m) ? kept : fresh, "reuse");
    EXPECT_FALSE(same_bits(kept.data(), fresh.data(), m * half)) << "the codes must differ";
  }
}

// With the default room, the rows of a call far beyond 4 MiB (320 rows of K = 14336 in bf16, about
// 9 MiB, as a prefill expert of Mixtral-8x7B's GEMM2 has them) stay kept for the expert's next
// column block: handed other codes under the same tag (which callers must not do), the second
// block gives the first codes' result. Weights decoded once per block take them chunk by chunk
// (so many rows are not walked whole for every block), each chunk from where it was kept.
TEST(KernelScratch, TheDefaultRoomKeepsTheRowsOfALargePrefillCall) {
  ASSERT_GE(kept_row_bytes(), int64_t{64} << 20);
  std::mt19937 rng(11);
  const int64_t m = 320, n = 8, k = 14336, half = n / 2;
  for (IsaLevel level : available_isa_levels()) {
    if (level < IsaLevel::kAvx512Bf16) continue;
    for (Coding coding : {Coding::kBf16, Coding::kFp8Block, Coding::kMxfp4}) {
      SCOPED_TRACE(::testing::Message() << isa_level_name(level) << " " << coding_name(coding));
      const Operand op = make_operand(rng, coding, n, k);
      const Activations first = make_activations(rng, coding, m, op.w);
      const Activations other = make_activations(rng, coding, m, op.w);
      const ScaledGemmFn kernel = scaled_gemm_kernel(level, /*amx_float_tiles=*/false);
      GemmScratch scratch;
      scratch.bytes.assign(gemm_scratch_bytes(kernel, op.w), 0xff);
      Activations a = first;
      a.view.codes = a.codes.data();
      const auto run = [&](uint64_t tag, int64_t n0) {
        return tagged_call(kernel, a.view, m, op.w, scratch, tag, n0, half);
      };
      const uint64_t tag = new_activation_tag();
      run(tag, 0);
      const std::vector<float> kept_first = run(0, half);
      // Each row has the bits it has alone, in whichever chunk it lies (no M dependence).
      for (int64_t r : {int64_t{0}, int64_t{64}, int64_t{200}, m - 1}) {
        const std::vector<float> alone =
            tagged_call(kernel, activation_rows_from(a.view, r), 1, op.w, scratch, 0, half, half);
        EXPECT_TRUE(same_bits(alone.data(), kept_first.data() + r * half, half)) << "row " << r;
      }
      a.codes = other.codes;  // same buffer, other values
      ASSERT_EQ(a.view.codes, a.codes.data());
      const std::vector<float> second_block = run(tag, half);
      EXPECT_TRUE(same_bits(second_block.data(), kept_first.data(), m * half));
      EXPECT_FALSE(same_bits(run(0, half).data(), kept_first.data(), m * half))
          << "the codes must differ";
    }
  }
}

std::vector<std::tuple<IsaLevel, Coding>> kernel_params() {
  std::vector<std::tuple<IsaLevel, Coding>> out;
  for (IsaLevel level : available_isa_levels())
    for (int c = 0; c <= static_cast<int>(Coding::kMxfp4); ++c)
      out.emplace_back(level, static_cast<Coding>(c));
  return out;
}

// Rows a call kept in one decoder's order never serve the other: the bf16 rows' fp8 byte tables
// take the activation rows in paired order, the word arithmetic in element order, and
// set_fp8_byte_tables may switch between two column blocks of one tag. Each call gives the bits of
// an untagged call under the same decoder.
TEST(KernelScratchDecoderTest, KeptFp8RowsFollowTheDecoderSwitch) {
  const bool default_tables = fp8_byte_tables();
  std::mt19937 rng(6);
  const int64_t n = 70, k = 200, m = 20, half = n / 2;
  const Operand op = make_operand(rng, Coding::kFp8Channel, n, k);
  const Activations a = make_activations(rng, Coding::kFp8Channel, m, op.w);
  for (IsaLevel level : available_isa_levels()) {
    if (level < IsaLevel::kAvx512Bf16) continue;
    SCOPED_TRACE(isa_level_name(level));
    const ScaledGemmFn kernel = scaled_gemm_kernel(level, /*amx_float_tiles=*/false);
    GemmScratch scratch;
    scratch.bytes.assign(gemm_scratch_bytes(kernel, op.w), 0xff);
    const auto run = [&](bool byte_tables, uint64_t tag, int64_t n0) {
      set_fp8_byte_tables(byte_tables);
      return tagged_call(kernel, a.view, m, op.w, scratch, tag, n0, half);
    };
    const uint64_t tag = new_activation_tag();
    for (const bool byte_tables : {true, false, true}) {
      for (const int64_t n0 : {int64_t{0}, half}) {
        SCOPED_TRACE(::testing::Message() << "byte tables " << byte_tables << " n0 " << n0);
        const std::vector<float> tagged = run(byte_tables, tag, n0);
        const std::vector<float> untagged = run(byte_tables, 0, n0);
        EXPECT_TRUE(same_bits(tagged.data(), untagged.data(), m * half));
      }
    }
  }
  set_fp8_byte_tables(default_tables);
}

INSTANTIATE_TEST_SUITE_P(Levels, KernelScratchTest, ::testing::ValuesIn(kernel_params()),
                         [](const auto& info) {
                           return std::string(isa_level_name(std::get<0>(info.param))) + "_" +
                                  coding_name(std::get<1>(info.param));
                         });

// ---------------------------------------------------------------------------------------------
// Activation quantizers.

struct QuantCase {
  ActQuant rule;
  bool ue8m0;
};

std::string quant_case_name(const QuantCase& c) {
  return std::string(act_quant_name(c.rule)) + (c.ue8m0 ? "_ue8m0" : "");
}

class ActQuantizerScratchTest : public ::testing::TestWithParam<QuantCase> {};

TEST_P(ActQuantizerScratchTest, AllocatesNothingAndMatchesQuantizeActivation) {
  const auto [rule, ue8m0] = GetParam();
  // K: several code chunks with a partial one, a whole number of groups; rows stride K + 3.
  constexpr int64_t kRows = 6, kK = 1152, kGroup = 128, kLd = kK + 3;
  constexpr float kStaticScale = 0.05f;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 8.0f);
  Tensor x = Tensor::empty({kRows, kK}, DType::kF32);
  float* xs = x.ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) xs[i] = normal(rng);
  for (int64_t i = 0; i < kK; ++i) xs[2 * kK + i] = 0.0f;  // all zero: dynamic scales hit eps / 0
  xs[3 * kK + 17] = 1e6f;                                  // clamps under a static scale
  xs[4 * kK + 700] = std::nanf("");                        // amax ignores it; codes clamp it
  const ActQuantResult ref = quantize_activation(x.view(), rule, kStaticScale, kGroup, ue8m0);
  const bool per_tensor = rule == ActQuant::kFp8Static || rule == ActQuant::kFp8PerTensorDynamic;
  // The dynamic per-tensor scale comes from the caller, as the batch's amax gives it.
  const float static_scale = per_tensor ? ref.scale.ptr<float>()[0] : 0.0f;

  const int64_t per_row = act_scales_per_row(rule, kK, kGroup);
  const bool int8 = rule == ActQuant::kInt8PerToken;
  const uint8_t* codes = static_cast<const uint8_t*>(ref.q.view().data);
  const float* table = fp8_e4m3_table();
  for (IsaLevel level : available_isa_levels()) {  // each level's act_quant_kernels row
    SCOPED_TRACE(isa_level_name(level));
    std::vector<float> rows(kRows * kLd, -7.0f), scales(kRows * per_row, -1.0f);
    for (int64_t r = 0; r < kRows; ++r)
      std::memcpy(&rows[r * kLd], xs + r * kK, kK * sizeof(float));
    EXPECT_EQ(count_allocations([&] {
                const ActivationQuantizer made =
                    make_act_quantizer(level, rule, static_scale, kGroup, ue8m0);
                const ActivationQuantizer copy = made;
                copy(rows.data(), kRows, kK, kLd, scales.data());
              }),
              0);
    for (int64_t r = 0; r < kRows; ++r) {
      std::vector<float> expected(kK);
      for (int64_t i = 0; i < kK; ++i) {
        const uint8_t q = codes[r * kK + i];
        expected[i] = int8 ? static_cast<float>(static_cast<int8_t>(q)) : table[q];
      }
      ASSERT_TRUE(same_bits(expected.data(), &rows[r * kLd], kK)) << "codes of row " << r;
      for (int64_t i = kK; i < kLd; ++i) ASSERT_EQ(rows[r * kLd + i], -7.0f) << "past K, row " << r;
      const float* want = ref.scale.ptr<float>() + (per_tensor ? 0 : r * per_row);
      ASSERT_TRUE(same_bits(want, &scales[r * per_row], per_row)) << "scales of row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, ActQuantizerScratchTest,
                         ::testing::Values(QuantCase{ActQuant::kFp8Static, false},
                                           QuantCase{ActQuant::kFp8PerTensorDynamic, false},
                                           QuantCase{ActQuant::kFp8PerToken, false},
                                           QuantCase{ActQuant::kFp8PerTokenGroup, false},
                                           QuantCase{ActQuant::kFp8PerTokenGroup, true},
                                           QuantCase{ActQuant::kFp8SiluPostGroup, false},
                                           QuantCase{ActQuant::kFp8SiluPostGroup, true},
                                           QuantCase{ActQuant::kInt8PerToken, false}),
                         [](const auto& info) { return quant_case_name(info.param); });

}  // namespace
}  // namespace moecore
