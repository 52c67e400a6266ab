// What the CPU can run, asked at run time (cpu_features.cpp); x86-64 only: elsewhere the portable path runs.
#pragma once

namespace cpu {

#if defined(__x86_64__) || defined(_M_X64)
bool has_avx2();         // AVX2 and FMA
bool has_avx_vnni();     // AVX-VNNI (256-bit), with AVX2
bool has_avx512_vnni();  // AVX-512 F/BW/VL/VNNI, with AVX2
bool has_amx();          // AMX-TILE and AMX-INT8, AVX-512 VNNI, and the OS's leave to use the tiles
#endif

}  // namespace cpu
