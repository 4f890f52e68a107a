// CPU feature detection and the ISA level kernels are chosen by. Detection uses cpuid, xgetbv
// (the OS must save ZMM/opmask and AMX tile state) and, for AMX, the Linux permission request.
// The level is chosen once per kernel-using object at construction, never per call.
#pragma once

#include <string>
#include <vector>

namespace moecore {

/// Ordered fallback chain: each level implies the ones before it.
enum class IsaLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmx = 4 };

/// Individual capability bits, kept separate (one macro must never stand for several features).
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_vnni = false, avx512_vbmi = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool os_saves_avx = false, os_saves_avx512 = false, os_saves_amx = false;
  bool amx_permission = false;  // arch_prctl(ARCH_REQ_XCOMP_PERM) succeeded
  bool vendor_amd = false;      // "AuthenticAMD": tunes kernels (WeightPrefetch), never a level
};

/// What this CPU and OS provide (detected once; the AMX permission is requested then).
const CpuFeatures& cpu_features();
/// Highest level the CPU, the OS and this build support.
IsaLevel detected_isa_level();
/// The level in force: MOECORE_ISA or set_isa_level() if given, else detected_isa_level().
IsaLevel current_isa_level();
/// Forces a level; throws Unsupported if the machine or build lacks it.
void set_isa_level(IsaLevel level);
/// Levels usable here, scalar first.
std::vector<IsaLevel> available_isa_levels();

const char* isa_level_name(IsaLevel level);  // "scalar", "avx2", "avx512", "avx512_bf16", "amx"
IsaLevel parse_isa_level(const std::string& name);

/// Sets a level for a scope (tests); restores the previous one on exit.
class ScopedIsaLevel {
 public:
  explicit ScopedIsaLevel(IsaLevel level);
  ~ScopedIsaLevel();
  ScopedIsaLevel(const ScopedIsaLevel&) = delete;
  ScopedIsaLevel& operator=(const ScopedIsaLevel&) = delete;

 private:
  IsaLevel previous_;
};

}  // namespace moecore
