// The module's sources that use ATen's tensor, compiled as one translation unit: ATen's headers (most of each one's
// compile time) are parsed once. On a Zen 3 (2 vCPUs): 16.1 s against 12.4 + 8.6 + 7.0 s as three files.
// Each keeps its own file; build.py compiles this one in their place and hashes theirs with it.
#if defined(__GNUC__) && !defined(__clang__)
// A class of one file holding a type of that file's anonymous namespace (lean_layers.cpp's LayerStack) is what
// -Wsubobject-linkage warns of in a file included elsewhere; here that file is included once, into this unit alone.
#pragma GCC diagnostic ignored "-Wsubobject-linkage"
#endif

#include "lean_layers.cpp"
#include "q4/q4_kernel.cpp"
#include "sampling.cpp"
