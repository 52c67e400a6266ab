// What the CPU can run, asked at run time (the module is compiled for a baseline; each code path is
// compiled for its own instructions and taken only where these say the CPU has them): q4_kernel.cpp's
// table of paths asks here, as ggml-cpu keeps its cpu-feats apart.
#include "cpu_features.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace cpu {

#if defined(__x86_64__) || defined(_M_X64)
bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"); }
bool has_avx_vnni() { return has_avx2() && __builtin_cpu_supports("avxvnni"); }
bool has_avx512_vnni() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") && has_avx2();
}

// AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25), and the OS's leave to use the tiles' state,
// asked once for the whole process (Linux 5.16+); where it is refused the path is simply not there.
static bool os_grants_amx() {
#if defined(__linux__)
  constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  static const bool granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  return granted;
#else
  return false;
#endif
}

bool has_amx() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!has_avx512_vnni() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return ((edx >> 24) & 1) && ((edx >> 25) & 1) && os_grants_amx();
}
#endif

}  // namespace cpu
