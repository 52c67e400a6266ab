// The read bandwidth two threads get from memory here: each sums its half of a 4 GiB buffer with AVX-512 loads.
// gcc -O2 -mavx512f -pthread read_bandwidth.c -o read_bandwidth && ./read_bandwidth 2
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define N (4UL << 30)
static unsigned char* buf;
typedef struct { size_t lo, hi; long long out; } Arg;
static void* run(void* p) {
  Arg* a = p; __m512i acc = _mm512_setzero_si512(), acc2 = _mm512_setzero_si512();
  for (size_t i = a->lo; i < a->hi; i += 128) {
    acc = _mm512_add_epi64(acc, _mm512_load_si512(buf + i));
    acc2 = _mm512_add_epi64(acc2, _mm512_load_si512(buf + i + 64));
  }
  a->out = _mm512_reduce_add_epi64(_mm512_add_epi64(acc, acc2)); return 0;
}
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char** argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2;
  buf = aligned_alloc(2 << 20, N); memset(buf, 1, N);
  for (int rep = 0; rep < 5; ++rep) {
    pthread_t t[16]; Arg a[16]; double s = now();
    for (int i = 0; i < threads; ++i) { a[i].lo = N / threads * i; a[i].hi = N / threads * (i + 1); pthread_create(&t[i], 0, run, &a[i]); }
    long long tot = 0; for (int i = 0; i < threads; ++i) { pthread_join(t[i], 0); tot += a[i].out; }
    double e = now() - s; printf("%d threads: %.1f GB/s (%lld)\n", threads, N / e / 1e9, tot & 1);
  }
}
