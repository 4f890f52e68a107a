// The scalar canonical-order GEMM matches the fp64 Eigen product within fp32 rounding for odd
// sizes and every weight dtype (the ISA rows are checked bitwise against it in test_quant_gemm).
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <fstream>
#include <random>
#include <string>

#include "moecore/core/error.h"
#include "moecore/isa/isa.h"
#include "moecore/kernels/gemm.h"
#include "support/moe_problem.h"

namespace moecore {
namespace {

class GemmTest : public ::testing::TestWithParam<DType> {};

TEST_P(GemmTest, ScalarMatchesEigen) {
  const DType wdtype = GetParam();
  std::mt19937 rng(3);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 5, 17}, {7, 33, 100},
                         {16, 64, 256}, {5, 3, 15}}) {
    Tensor a = testing::random_tensor(rng, {m, k}, DType::kF32);
    Tensor w = testing::random_tensor(rng, {n, k}, wdtype);
    std::vector<float> wf = testing::to_floats(w);
    std::vector<float> out(m * n);
    gemm_rows_times_wt_ref(a.ptr<float>(), m, k, w.view().data, wdtype, k, n, k, out.data(), n);
    Eigen::MatrixXd A(m, k), W(n, k);
    for (int64_t i = 0; i < m * k; ++i) A(i / k, i % k) = a.ptr<float>()[i];
    for (int64_t i = 0; i < n * k; ++i) W(i / k, i % k) = wf[i];
    Eigen::MatrixXd C = A * W.transpose();
    for (int64_t i = 0; i < m * n; ++i)
      EXPECT_NEAR(out[i], C(i / n, i % n), 1e-5 * std::sqrt(double(k)) * 4) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GemmTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(IsaTest, ScalarAlwaysAvailableAndScopedLevelRestores) {
  const auto levels = available_isa_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), IsaLevel::kScalar);
  const IsaLevel before = current_isa_level();
  {
    ScopedIsaLevel scoped(IsaLevel::kScalar);
    EXPECT_EQ(current_isa_level(), IsaLevel::kScalar);
  }
  EXPECT_EQ(current_isa_level(), before);
  EXPECT_EQ(parse_isa_level("avx512_bf16"), IsaLevel::kAvx512Bf16);
  EXPECT_THROW(parse_isa_level("sse9"), InvalidArgument);
  for (IsaLevel l : {IsaLevel::kAvx2, IsaLevel::kAvx512, IsaLevel::kAvx512Bf16, IsaLevel::kAmx})
    if (std::find(levels.begin(), levels.end(), l) == levels.end())
      EXPECT_THROW(set_isa_level(l), Unsupported);
}

// The value of the first /proc/cpuinfo line named `field`, after ": " ("" when there is none).
std::string cpuinfo_field(const std::string& field) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    const size_t colon = line.find(':');
    if (line.rfind(field, 0) == 0 && colon != std::string::npos)
      return line.substr(std::min(line.size(), colon + 2));
  }
  return "";
}

// The vendor bit tunes kernels (WeightPrefetch), so it must name the vendor Linux reports.
TEST(IsaTest, VendorBitMatchesProcCpuinfo) {
  const std::string vendor = cpuinfo_field("vendor_id");
  if (vendor.empty()) GTEST_SKIP() << "no vendor_id in /proc/cpuinfo";
  EXPECT_EQ(cpu_features().vendor_amd, vendor == "AuthenticAMD") << vendor;
}

// Levels are chosen by these bits (avx512_bf16 needs VBMI too), so each must say what Linux
// reports; Linux clears a flag whose register state the OS does not save, as detection does.
TEST(IsaTest, FeatureBitsMatchProcCpuinfo) {
  const std::string flags = " " + cpuinfo_field("flags") + " ";
  if (flags.size() == 2) GTEST_SKIP() << "no flags in /proc/cpuinfo";
  const auto has = [&](const std::string& flag) {
    return flags.find(" " + flag + " ") != std::string::npos;
  };
  const CpuFeatures& f = cpu_features();
  const std::pair<const char*, bool> bits[] = {
      {"avx2", f.avx2},         {"fma", f.fma},           {"f16c", f.f16c},
      {"avx512f", f.avx512f},   {"avx512bw", f.avx512bw}, {"avx512vl", f.avx512vl},
      {"avx512dq", f.avx512dq}, {"avx512_bf16", f.avx512_bf16},
      {"avx512_vnni", f.avx512_vnni}, {"avx512vbmi", f.avx512_vbmi},
      {"amx_tile", f.amx_tile}, {"amx_bf16", f.amx_bf16}, {"amx_int8", f.amx_int8}};
  for (const auto& [flag, bit] : bits) EXPECT_EQ(bit, has(flag)) << flag;
}

// The fp8 decode of the avx512_bf16 and amx rows permutes bytes (VPERMT2B), so neither level is
// offered without VBMI.
TEST(IsaTest, Bf16LevelsNeedVbmi) {
  const CpuFeatures& f = cpu_features();
  for (IsaLevel level : available_isa_levels())
    if (level >= IsaLevel::kAvx512Bf16)
      EXPECT_TRUE(f.avx512_bf16 && f.avx512_vnni && f.avx512_vbmi) << isa_level_name(level);
}

}  // namespace
}  // namespace moecore
