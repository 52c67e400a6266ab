// The w4a8 product with AVX-VNNI (256-bit `vpdpbusd`): q4_path_256.h under the AVX-VNNI target.
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <cstdint>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif

#include "q4_path_256.h"

void q4::tile_avx_vnni(const Tiles& w, const Rows& x, const Job& job) { tile_256<true>(w, x, job); }

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
