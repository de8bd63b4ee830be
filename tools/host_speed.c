/* How fast this core runs arithmetic that touches no memory, slice by slice, after a
 * pause: ROUNDS times, sleep IDLE_MS, then run SLICES slices of the same register-only
 * FMA loop (eight independent chains, about 5 ms each on a Zen 4 at full speed) and
 * print each slice's time in ms, one round per line. No cache, page or thread is
 * involved, so a slower slice is the host running this virtual CPU slower: a lower
 * clock, or a sibling hyperthread busy with another tenant's work (which of the two
 * cannot be told from inside).
 *
 * On the Zen 4 VM of session 52: back to back (IDLE_MS 0) every slice took
 * 4.94-5.03 ms; after 100 ms of idle four rounds in five ran at 5.3-6.0 ms per slice
 * from their first slice to their last (60 ms), one at 5.0; after 20 ms, two rounds
 * in five. That is why a single run after a pause (`cargo xtask bench-ort`'s single
 * column) can be 10-20% slower than a warm one, on either side and whatever the
 * model: docs/performance.md, session 52, quotes it.
 *
 *   gcc -O2 -o target/host_speed tools/host_speed.c && target/host_speed 100 12 5
 *   target/host_speed 0 12 5
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Eight chains of dependent FMAs on AVX2 vectors, `n` steps each. */
__attribute__((target("avx2,fma"))) static float fma_chains(long n) {
    __m256 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm256_set1_ps(i * 0.001f);
    const __m256 b = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(0.0001f);
    for (long k = 0; k < n; k++)
        for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    float lanes[8], s = 0;
    for (int i = 0; i < 8; i++) {
        _mm256_storeu_ps(lanes, a[i]);
        s += lanes[0];
    }
    return s;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: host_speed IDLE_MS SLICES ROUNDS\n");
        return 2;
    }
    int idle = atoi(argv[1]), slices = atoi(argv[2]), rounds = atoi(argv[3]);
    volatile float sink = 0;
    for (int r = 0; r < rounds; r++) {
        if (idle > 0) usleep(idle * 1000);
        for (int s = 0; s < slices; s++) {
            double t = now_ms();
            sink += fma_chains(1300000);
            printf("%.2f ", now_ms() - t);
        }
        printf("\n");
    }
    return 0;
}
