// Core types: generated enums, dtype table, TensorView/Tensor, env knobs, error types.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "moecore/core/dtype.h"
#include "moecore/core/enums.h"
#include "moecore/core/env.h"
#include "moecore/core/error.h"
#include "moecore/core/tensor.h"

namespace moecore {
namespace {

TEST(EnumTest, WireValuesAndNamesComeFromOneList) {
  EXPECT_EQ(to_string(MoeRunnerBackend::TRITON_KERNELS), "triton_kernel");
  EXPECT_EQ(qualified_name(MoeRunnerBackend::MARLIN), "MoeRunnerBackend.MARLIN");
  EXPECT_EQ(parse_enum<MoeA2ABackend>("deepep"), MoeA2ABackend::DEEPEP);
  EXPECT_EQ(parse_enum<DispatchOutputFormat>("deepep_ll"), DispatchOutputFormat::DEEPEP_LL);
  EXPECT_EQ(enum_members<DeepEPMode>().size(), 3u);
  EXPECT_EQ(enum_members<DispatchOutputFormat>().size(), kNumDispatchFormats);
  EXPECT_THROW(parse_enum<MoeRunnerBackend>("bogus"), InvalidArgument);
  for (MoeRunnerBackend b : enum_members<MoeRunnerBackend>())
    EXPECT_EQ(parse_enum<MoeRunnerBackend>(to_string(b)), b);
}

TEST(EnumTest, FusedOnlyMirrorsSglang) {
  EXPECT_TRUE(is_fused_only(MoeRunnerBackend::MARLIN));
  EXPECT_TRUE(is_fused_only(MoeRunnerBackend::FLASHINFER_CUTEDSL));
  EXPECT_FALSE(is_fused_only(MoeRunnerBackend::TRITON));
  EXPECT_FALSE(is_fused_only(MoeRunnerBackend::DEEP_GEMM));
}

TEST(EnumTest, DeepEPModeResolve) {
  EXPECT_EQ(resolve_deepep_mode(DeepEPMode::AUTO, true), DeepEPMode::NORMAL);
  EXPECT_EQ(resolve_deepep_mode(DeepEPMode::AUTO, false), DeepEPMode::LOW_LATENCY);
  EXPECT_EQ(resolve_deepep_mode(DeepEPMode::NORMAL, false), DeepEPMode::NORMAL);
  EXPECT_TRUE(enable_low_latency(DeepEPMode::AUTO));
  EXPECT_FALSE(enable_low_latency(DeepEPMode::NORMAL));
}

TEST(DTypeTest, TableAndParsing) {
  EXPECT_EQ(dtype_size(DType::kBF16), 2);
  EXPECT_EQ(dtype_traits(DType::kFp4E2M1x2).values_per_storage, 2);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::kF8E4M3);
  EXPECT_THROW(parse_dtype("float64"), InvalidArgument);
}

TEST(TensorTest, AllocationIsAlignedAndViewsDescribeThemselves) {
  Tensor t = Tensor::zeros({3, 5}, DType::kBF16);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.view().data) % kTensorAlignment, 0u);
  EXPECT_TRUE(t.view().is_contiguous());
  EXPECT_EQ(t.describe(), "[3, 5] bf16");
  EXPECT_EQ(t.numel(), 15);
  EXPECT_THROW(Tensor::empty({-1, 2}, DType::kF32), InvalidArgument);
  EXPECT_THROW(Tensor::empty({int64_t(1) << 40, int64_t(1) << 40}, DType::kF32), InvalidArgument);
}

#ifdef __linux__
// The VmFlags of the mapping that holds `address` (/proc/self/smaps), or "" when none does.
std::string mapping_flags(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find('-') < 17)
      inside = begin <= at && at < end;
    else if (inside && line.rfind("VmFlags:", 0) == 0)
      return line;
  }
  return "";
}

TEST(TensorTest, LargeTensorsAskForHugePages) {
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"))
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  const Tensor weights = Tensor::empty({16, 1 << 20}, DType::kU8);  // 16 MiB
  const std::string flags = mapping_flags(weights.ptr<uint8_t>() + (8 << 20));
  ASSERT_FALSE(flags.empty()) << "no mapping holds the tensor";
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
}
#endif

TEST(TensorTest, RowStridedViewsAndCopies) {
  Tensor big = Tensor::empty({4, 8}, DType::kF32);
  for (int i = 0; i < 32; ++i) big.ptr<float>()[i] = static_cast<float>(i);
  TensorView v = big.view();
  v.shape[1] = 3;  // big[:, :3]
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_TRUE(v.rows_contiguous());
  Tensor c = Tensor::copy_of(v);
  EXPECT_TRUE(c.view().is_contiguous());
  EXPECT_EQ(c.ptr<float>()[3], 8.0f);  // row 1, col 0
  v.strides[1] = 2;                      // big[:, ::2]
  EXPECT_FALSE(v.rows_contiguous());
}

TEST(EnvTest, ParsesAndRejects) {
  setenv("MOECORE_TEST_KNOB", "7", 1);
  EXPECT_EQ(env_int("MOECORE_TEST_KNOB", 1, 1, 10), 7);
  setenv("MOECORE_TEST_KNOB", "70", 1);
  EXPECT_THROW(env_int("MOECORE_TEST_KNOB", 1, 1, 10), InvalidArgument);
  setenv("MOECORE_TEST_KNOB", "yes", 1);
  EXPECT_TRUE(env_flag("MOECORE_TEST_KNOB", false));
  setenv("MOECORE_TEST_KNOB", "maybe", 1);
  EXPECT_THROW(env_flag("MOECORE_TEST_KNOB", false), InvalidArgument);
  unsetenv("MOECORE_TEST_KNOB");
  EXPECT_EQ(env_int("MOECORE_TEST_KNOB", 3, 1, 10), 3);
}

TEST(ErrorTest, MacrosThrowTheirTypes) {
  EXPECT_THROW(MOECORE_CHECK(false, "x"), InvalidArgument);
  EXPECT_THROW(MOECORE_CHECK_DTYPE(false, "x"), DTypeError);
  EXPECT_THROW(MOECORE_CHECK_INDEX(false, "x"), OutOfRange);
  EXPECT_THROW(MOECORE_ASSERT(false, "x"), ContractViolation);
  EXPECT_THROW(MOECORE_UNSUPPORTED("x"), Unsupported);
  EXPECT_THROW(MOECORE_INTERNAL_CHECK(false, "x"), InternalError);
  try {
    MOECORE_CHECK(1 == 2, "api: expected ", 1, ", got ", 2);
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "api: expected 1, got 2");
  }
}

}  // namespace
}  // namespace moecore
