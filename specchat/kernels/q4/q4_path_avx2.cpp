// The w4a8 product with AVX2 (`maddubs`/`madd`): q4_path_256.h under the AVX2 target. (The activations' int8
// levels, which every x86 path uses: quantize_avx2.cpp.)
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <cstdint>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include "q4_path_256.h"

void q4::tile_avx2(const Tiles& w, const Rows& x, const Job& job) { tile_256<false>(w, x, job); }

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
