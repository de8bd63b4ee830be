/* One core's read bandwidth from buffers of 1 MB to 256 MB (AVX-512 loads, best of
 * several passes): where a kernel's operands come from L2, the L3 or memory, the rate
 * it can read them at. docs/performance.md, session 41, quotes it.
 *
 *   gcc -O2 -mavx512f -o target/mem_bandwidth tools/mem_bandwidth.c && target/mem_bandwidth
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    size_t bytes = 256ull << 20;
    float *a = aligned_alloc(64, bytes);
    for (size_t i = 0; i < bytes / 4; i++) a[i] = (float)i;
    for (int mb = 1; mb <= 256; mb *= 2) {
        size_t count = (size_t)mb << 18; /* floats */
        int passes = 512 / mb < 2 ? 2 : 512 / mb;
        __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        double best = 1e9;
        for (int r = 0; r < passes; r++) {
            double t = now();
            for (size_t i = 0; i < count; i += 64) {
                s0 = _mm512_add_ps(s0, _mm512_load_ps(a + i));
                s1 = _mm512_add_ps(s1, _mm512_load_ps(a + i + 16));
                s2 = _mm512_add_ps(s2, _mm512_load_ps(a + i + 32));
                s3 = _mm512_add_ps(s3, _mm512_load_ps(a + i + 48));
            }
            t = now() - t;
            if (t < best) best = t;
        }
        float o[16];
        _mm512_storeu_ps(o, _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
        printf("%4d MB: %6.1f GB/s  (checksum %g)\n", mb, count * 4 / best / 1e9, o[0]);
    }
    return 0;
}
