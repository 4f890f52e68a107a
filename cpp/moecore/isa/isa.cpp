// CPU feature detection (cpuid, xgetbv, the AMX arch_prctl permission) and the level override.
// Compiled with baseline flags; xgetbv is issued as raw bytes so no ISA flag is needed here.
#include "moecore/isa/isa.h"

#include <atomic>
#include <cstdint>

#include "moecore/core/env.h"
#include "moecore/core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define MOECORE_X86 1
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace moecore {
namespace {

#ifdef MOECORE_X86
uint64_t read_xcr0() {
  uint32_t eax, edx;
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

bool request_amx_permission() {
#if defined(__linux__)
  constexpr int kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023, kXfeatureTileData = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureTileData) != 0) return false;
  unsigned long bitmask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &bitmask) != 0) return false;
  return (bitmask & (1UL << kXfeatureTileData)) != 0;
#else
  return false;
#endif
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#ifdef MOECORE_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  f.vendor_amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;  // "Auth" "enti" "cAMD"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  const bool avx = (c >> 28) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = read_xcr0();
  f.os_saves_avx = (xcr0 & 0x6) == 0x6;
  f.os_saves_avx512 = (xcr0 & 0xE6) == 0xE6;
  f.os_saves_amx = (xcr0 & 0x60000) == 0x60000;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = ((b >> 5) & 1) && f.os_saves_avx;
  f.avx512f = ((b >> 16) & 1) && f.os_saves_avx512;
  f.avx512dq = ((b >> 17) & 1) && f.os_saves_avx512;
  f.avx512bw = ((b >> 30) & 1) && f.os_saves_avx512;
  f.avx512vl = ((b >> 31) & 1) && f.os_saves_avx512;
  f.avx512_vbmi = ((c >> 1) & 1) && f.os_saves_avx512;
  f.avx512_vnni = ((c >> 11) & 1) && f.os_saves_avx512;
  f.amx_bf16 = (d >> 22) & 1;
  f.amx_tile = (d >> 24) & 1;
  f.amx_int8 = (d >> 25) & 1;
  __cpuid_count(7, 1, a, b, c, d);
  f.avx512_bf16 = ((a >> 5) & 1) && f.os_saves_avx512;
  if (f.amx_tile && f.os_saves_amx) f.amx_permission = request_amx_permission();
#endif
  return f;
}

// Which levels this build compiled kernels for (CMake defines MOECORE_COMPILED_<LEVEL>).
bool compiled(IsaLevel level) {
  switch (level) {
    case IsaLevel::kScalar:
      return true;
    case IsaLevel::kAvx2:
#ifdef MOECORE_COMPILED_AVX2
      return true;
#else
      return false;
#endif
    case IsaLevel::kAvx512:
#ifdef MOECORE_COMPILED_AVX512
      return true;
#else
      return false;
#endif
    case IsaLevel::kAvx512Bf16:
#ifdef MOECORE_COMPILED_AVX512BF16
      return true;
#else
      return false;
#endif
    case IsaLevel::kAmx:
#ifdef MOECORE_COMPILED_AMX
      return true;
#else
      return false;
#endif
  }
  return false;
}

bool cpu_supports(IsaLevel level) {
  const CpuFeatures& f = cpu_features();
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c;
  switch (level) {
    case IsaLevel::kScalar:
      return true;
    case IsaLevel::kAvx2:
      return f.avx2 && f.fma && f.f16c;
    case IsaLevel::kAvx512:
      return avx512;
    case IsaLevel::kAvx512Bf16:
      // These rows are compiled with VBMI (the byte-table fp8 decode, bf16_streams.h);
      // of the CPUs with AVX512-BF16 only Cooper Lake lacks it, and runs the avx512 row.
      return avx512 && f.avx512_bf16 && f.avx512_vnni && f.avx512_vbmi;
    case IsaLevel::kAmx:
      return cpu_supports(IsaLevel::kAvx512Bf16) && f.amx_tile && f.amx_bf16 && f.amx_int8 &&
             f.amx_permission;
  }
  return false;
}

const IsaLevel kAllLevels[] = {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512,
                               IsaLevel::kAvx512Bf16, IsaLevel::kAmx};

// -1: no override; otherwise the forced level.
std::atomic<int> g_forced_level{-2};  // -2: MOECORE_ISA not read yet

bool usable(IsaLevel level) { return compiled(level) && cpu_supports(level); }

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

IsaLevel detected_isa_level() {
  IsaLevel best = IsaLevel::kScalar;
  for (IsaLevel level : kAllLevels)
    if (usable(level)) best = level;
  return best;
}

std::vector<IsaLevel> available_isa_levels() {
  std::vector<IsaLevel> out;
  for (IsaLevel level : kAllLevels)
    if (usable(level)) out.push_back(level);
  return out;
}

const char* isa_level_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::kScalar:
      return "scalar";
    case IsaLevel::kAvx2:
      return "avx2";
    case IsaLevel::kAvx512:
      return "avx512";
    case IsaLevel::kAvx512Bf16:
      return "avx512_bf16";
    case IsaLevel::kAmx:
      return "amx";
  }
  return "?";
}

IsaLevel parse_isa_level(const std::string& name) {
  for (IsaLevel level : kAllLevels)
    if (name == isa_level_name(level)) return level;
  MOECORE_THROW(InvalidArgument, "unknown ISA level '", name,
                "' (valid: scalar, avx2, avx512, avx512_bf16, amx)");
}

void set_isa_level(IsaLevel level) {
  if (!usable(level)) {
    std::string have;
    for (IsaLevel l : available_isa_levels()) have += std::string(have.empty() ? "" : ", ") + isa_level_name(l);
    MOECORE_UNSUPPORTED("set_isa_level: level '", isa_level_name(level),
                        "' is not available on this machine and build (available: ", have, ")");
  }
  g_forced_level.store(static_cast<int>(level));
}

IsaLevel current_isa_level() {
  int forced = g_forced_level.load();
  if (forced == -2) {
    const std::string env = env_string("MOECORE_ISA", "");
    if (env.empty()) {
      g_forced_level.compare_exchange_strong(forced, -1);
    } else {
      set_isa_level(parse_isa_level(env));  // throws on a bad or unavailable value
    }
    forced = g_forced_level.load();
  }
  return forced < 0 ? detected_isa_level() : static_cast<IsaLevel>(forced);
}

ScopedIsaLevel::ScopedIsaLevel(IsaLevel level) : previous_(current_isa_level()) {
  set_isa_level(level);
}
ScopedIsaLevel::~ScopedIsaLevel() { g_forced_level.store(static_cast<int>(previous_)); }

}  // namespace moecore
