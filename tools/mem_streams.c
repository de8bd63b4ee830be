/* One core's bandwidth from memory over 1 to 64 concurrent streams: reading 8 MB that
 * is not in any cache split into N equal streams read side by side (as a kernel that
 * reads N planes at once), and writing 3.2 MB (ResNet-50's stem output) as N streams
 * then reading it back (is a value just written in cache?). docs/performance.md,
 * session 48, quotes it.
 *
 *   gcc -O2 -mavx512f -o target/mem_streams tools/mem_streams.c && target/mem_streams
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
    size_t total = 1024ull << 20; /* bytes: regions far apart, so none is cached */
    float *a = aligned_alloc(64, total);
    for (size_t i = 0; i < total / 4; i++) a[i] = (float)i;
    size_t floats = total / 4;
    __m512 s = _mm512_setzero_ps();
    __m512 one = _mm512_set1_ps(1.5f);
    printf("streams  read 8 MB from memory  write 3.2 MB  read it back\n");
    for (int streams = 1; streams <= 64; streams *= 2) {
        size_t n = (8u << 20) / 4 / 1024 * 1024, w = (size_t)(3.2 * (1 << 18)) / 1024 * 1024;
        double read = 1e9, write = 1e9, back = 1e9;
        for (int r = 0; r < 6; r++) {
            /* Each round uses fresh regions, 96 MB apart, and reads 64 MB elsewhere
             * first so that nothing of them stays in the 32 MB L3. */
            size_t base = ((size_t)(streams * 7 + r) * (24u << 20)) % (floats - (n + w + (16u << 20)));
            base &= ~(size_t)15;
            float *evict = a + (base + (total / 8)) % (floats - (16u << 20));
            evict = (float *)((size_t)evict & ~(size_t)63);
            for (size_t i = 0; i < (16u << 20); i += 16) s = _mm512_add_ps(s, _mm512_load_ps(evict + i));
            float *p = a + base, *q = a + base + n;
            size_t per = n / streams, wper = w / streams;
            double t0 = now();
            for (size_t i = 0; i < per; i += 16)
                for (int k = 0; k < streams; k++) s = _mm512_add_ps(s, _mm512_loadu_ps(p + k * per + i));
            double t1 = now();
            for (size_t i = 0; i < wper; i += 16)
                for (int k = 0; k < streams; k++) _mm512_storeu_ps(q + k * wper + i, one);
            double t2 = now();
            for (size_t i = 0; i < w; i += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(q + i));
            double t3 = now();
            if (t1 - t0 < read) read = t1 - t0;
            if (t2 - t1 < write) write = t2 - t1;
            if (t3 - t2 < back) back = t3 - t2;
        }
        printf("%7d  %14.1f GB/s  %7.1f GB/s  %8.1f GB/s\n", streams, n * 4 / read / 1e9,
               w * 4 / write / 1e9, w * 4 / back / 1e9);
    }
    float o[16];
    _mm512_storeu_ps(o, s);
    printf("(checksum %g)\n", o[0]);
    return 0;
}
