// moecore's e^x for the fp32 activation epilogues (σ in silu and the clamped SwiGLU): evaluated in
// double with a relative error near 1e-14 and rounded once to fp32, so it is the correctly rounded
// fp32 result for all but a vanishing share of inputs. Every kernel row of the activation table
// (activation.h) evaluates these same double operations — multiplies and adds only, each rounded
// (the build turns off FMA contraction) — lane by lane, so the rows agree bit for bit, which a
// libm call in the scalar row and a vector polynomial in the others could not.
#pragma once

#include <cstdint>
#include <cstring>

namespace moecore {
namespace exp_f32_constants {

// |x| beyond this gives +inf or 0 in fp32 anyway; the clamp keeps 2^n a normal double.
constexpr double kClamp = 200.0;
// Adding 1.5 · 2^52 rounds a double of magnitude below 2^51 to an integer, held in the low bits.
constexpr double kRoundShift = 0x1.8p52;
constexpr double kLog2e = 0x1.71547652b82fep0;
// ln 2 in two parts (fdlibm's): n · kLn2Hi is exact for |n| < 2^20, so x − n·ln2 loses nothing.
constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
// Taylor coefficients 1/k! of e^r, k = 0 to 11, for |r| ≤ ln2/2: the first omitted term is below
// 7e-15 of the result. Summed in Estrin's tree (exp_in_double), whose chain of dependent
// operations is 7 long where Horner's rule is 22.
constexpr double kTaylor[12] = {1.0,        1.0,         0.5,          1.0 / 6,
                                1.0 / 24,   1.0 / 120,   1.0 / 720,    1.0 / 5040,
                                1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800};
// The exponent bias of a double, added to n before it is shifted into place.
constexpr int64_t kExponentBias = 1023;

}  // namespace exp_f32_constants

/// exp_f32's steps in double, over a lane type L (ScalarDouble below, or a vector row's): min(a,
/// b) = a < b ? a : b and max(a, b) = a > b ? a : b (a NaN in b passes), mul, add, sub, set
/// (a broadcast), and pow2(shifted): 2^n from the bits of shifted = n + kRoundShift.
template <class L>
inline typename L::D exp_in_double(typename L::D d) {
  using namespace exp_f32_constants;
  using D = typename L::D;
  d = L::min(L::set(kClamp), d);
  d = L::max(L::set(-kClamp), d);
  const D shifted = L::add(L::mul(d, L::set(kLog2e)), L::set(kRoundShift));
  const D n = L::sub(shifted, L::set(kRoundShift));  // round(x / ln 2)
  const D r = L::sub(L::sub(d, L::mul(n, L::set(kLn2Hi))), L::mul(n, L::set(kLn2Lo)));
  // Σ kTaylor[k] · r^k in Estrin's tree.
  const auto pair = [&](int k) {
    return L::add(L::set(kTaylor[k]), L::mul(L::set(kTaylor[k + 1]), r));
  };
  const D r2 = L::mul(r, r), r4 = L::mul(r2, r2), r8 = L::mul(r4, r4);
  const D low = L::add(pair(0), L::mul(r2, pair(2)));
  const D mid = L::add(pair(4), L::mul(r2, pair(6)));
  const D high = L::add(pair(8), L::mul(r2, pair(10)));
  const D p = L::add(L::add(low, L::mul(r4, mid)), L::mul(r8, high));
  return L::mul(p, L::pow2(shifted));
}

/// The scalar lane type of exp_in_double.
struct ScalarDouble {
  using D = double;
  static D min(D a, D b) { return a < b ? a : b; }
  static D max(D a, D b) { return a > b ? a : b; }
  static D mul(D a, D b) { return a * b; }
  static D add(D a, D b) { return a + b; }
  static D sub(D a, D b) { return a - b; }
  static D set(double c) { return c; }
  static D pow2(D shifted) {
    uint64_t bits;
    std::memcpy(&bits, &shifted, sizeof(bits));
    bits = (bits + exp_f32_constants::kExponentBias) << 52;  // n + 1023 in the exponent field
    double scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    return scale;
  }
};

/// e^x rounded to fp32 (see above): +inf above ~88.72, +0 below ~−103.97, NaN for NaN.
inline float exp_f32(float x) {
  return static_cast<float>(exp_in_double<ScalarDouble>(static_cast<double>(x)));
}

}  // namespace moecore
