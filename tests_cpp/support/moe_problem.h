// Test support: seeded random tensors and an Eigen fp64 reference of the unquantized MoE
// (spec §7.1 without intermediate rounding) that the runner paths are compared against.
#pragma once

#include <Eigen/Dense>
#include <cmath>
#include <random>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/kernels/convert.h"
#include "moecore/routing/topk.h"

namespace moecore::testing {

inline Tensor random_tensor(std::mt19937& rng, const std::vector<int64_t>& shape, DType dtype,
                            float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, dtype);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> values(static_cast<size_t>(t.numel()));
  for (float& v : values) v = dist(rng);
  store_f32(values.data(), t.numel(), dtype, t.view().data);
  return t;
}

inline std::vector<float> to_floats(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  Tensor c = t.view().is_contiguous() ? t : Tensor::copy_of(t.view());
  load_f32(c.view().data, c.dtype(), c.numel(), out.data());
  return out;
}

struct MoeProblem {
  int64_t T, E, H, I, k;
  Tensor x, w13, w2, topk_weights, topk_ids;
};

/// Random problem with distinct random experts per token (ids in [0, E)).
inline MoeProblem make_problem(std::mt19937& rng, int64_t T, int64_t E, int64_t H, int64_t I,
                               int64_t k, DType dtype) {
  MoeProblem p{T, E, H, I, k};
  p.x = random_tensor(rng, {T, H}, dtype);
  p.w13 = random_tensor(rng, {E, 2 * I, H}, dtype, 1.0f / std::sqrt(static_cast<float>(H)));
  p.w2 = random_tensor(rng, {E, H, I}, dtype, 1.0f / std::sqrt(static_cast<float>(I)));
  p.topk_weights = Tensor::empty({T, k}, DType::kF32);
  p.topk_ids = Tensor::empty({T, k}, DType::kI32);
  std::uniform_real_distribution<float> u(0.1f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> perm(E);
    for (int32_t e = 0; e < E; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < k; ++j) {
      p.topk_ids.ptr<int32_t>()[t * k + j] = perm[j];
      p.topk_weights.ptr<float>()[t * k + j] = u(rng);
    }
  }
  return p;
}

/// fp64 SwiGLU MoE with no intermediate rounding: Σ_j w_j · W2 (silu(gate) · up).
inline std::vector<double> reference_moe(const MoeProblem& p, double rsf = 1.0) {
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const std::vector<float> x = to_floats(p.x), w13 = to_floats(p.w13), w2 = to_floats(p.w2);
  std::vector<double> out(static_cast<size_t>(p.T * p.H), 0.0);
  for (int64_t t = 0; t < p.T; ++t) {
    Eigen::VectorXd xt(p.H);
    for (int64_t h = 0; h < p.H; ++h) xt[h] = x[t * p.H + h];
    for (int64_t j = 0; j < p.k; ++j) {
      const int32_t e = p.topk_ids.ptr<int32_t>()[t * p.k + j];
      if (e < 0) continue;
      Mat a(2 * p.I, p.H), b(p.H, p.I);
      for (int64_t i = 0; i < 2 * p.I * p.H; ++i) a.data()[i] = w13[e * 2 * p.I * p.H + i];
      for (int64_t i = 0; i < p.H * p.I; ++i) b.data()[i] = w2[e * p.H * p.I + i];
      Eigen::VectorXd h1 = a * xt, act(p.I);
      for (int64_t i = 0; i < p.I; ++i) {
        const double g = h1[i];
        act[i] = g / (1.0 + std::exp(-g)) * h1[p.I + i];
      }
      Eigen::VectorXd y = b * act;
      const double w = p.topk_weights.ptr<float>()[t * p.k + j];
      for (int64_t h = 0; h < p.H; ++h) out[t * p.H + h] += rsf * w * y[h];
    }
  }
  return out;
}

}  // namespace moecore::testing
