/* The channel-lanes conv's register tile (hmct-quant/src/ops/channel_lanes.rs) in
 * other shapes, alone: P output positions x V vectors of 16 output channels, one
 * broadcast input value per position and weight row, P*V FMAs per row, GFLOP/s of
 * the sums. `l1`: weights and inputs in L1; `spread`: 288 weight rows of 64 floats
 * (72 KB) and input rows spread as a 3x3 conv's band of 32 channels reads them.
 * docs/performance.md, session 41, quotes it against `cargo xtask peak`.
 *
 *   gcc -O3 -march=native -o target/tile_shapes tools/tile_shapes.c && target/tile_shapes
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define K 288
static float W[K * 64] __attribute__((aligned(64)));
static float X[1 << 16] __attribute__((aligned(64)));
static float OUT[64 * 64] __attribute__((aligned(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Offset of weight row r's inputs: the same 32 floats for `l1`, else channel r / 9,
 * tap row r % 9 / 3 and tap column r % 3 of rows 150 floats wide, moving by a tile
 * of 12 each repetition. */
static inline const float *row_input(int spread, int r, int rep) {
    if (!spread) return X + (r & 31) * 32;
    return X + (r / 9) * 1800 + (r % 9 / 3) * 150 + (r % 3) + (rep % 12) * 12;
}

#define TILE(P, V)                                                                   \
    static void tile_##P##_##V(int spread, int reps) {                               \
        for (int rep = 0; rep < reps; rep++) {                                       \
            __m512 acc[P][V];                                                        \
            for (int p = 0; p < P; p++)                                              \
                for (int v = 0; v < V; v++) acc[p][v] = _mm512_setzero_ps();         \
            _Pragma("GCC unroll 2") for (int r = 0; r < K; r++) {                    \
                __m512 w[V];                                                         \
                for (int v = 0; v < V; v++) w[v] = _mm512_load_ps(W + r * 64 + 16 * v); \
                const float *xr = row_input(spread, r, rep);                         \
                _Pragma("GCC unroll 32") for (int p = 0; p < P; p++) {               \
                    __m512 x = _mm512_set1_ps(xr[p]);                                \
                    for (int v = 0; v < V; v++)                                      \
                        acc[p][v] = _mm512_fmadd_ps(w[v], x, acc[p][v]);             \
                }                                                                    \
            }                                                                        \
            for (int p = 0; p < P; p++)                                              \
                for (int v = 0; v < V; v++)                                          \
                    _mm512_store_ps(OUT + (p * V + v) * 16, acc[p][v]);              \
        }                                                                            \
    }
TILE(12, 2)
TILE(6, 4)
TILE(8, 3)
TILE(4, 6)
TILE(24, 1)

#define RUN(P, V, spread)                                                            \
    {                                                                                \
        double best = 1e9;                                                           \
        for (int t = 0; t < 5; t++) {                                                \
            double s = now();                                                        \
            tile_##P##_##V(spread, reps);                                            \
            s = now() - s;                                                           \
            if (s < best) best = s;                                                  \
        }                                                                            \
        printf("%-6s %2d positions x %d vectors: %6.1f GFLOP/s\n",                   \
               spread ? "spread" : "l1", P, V, 2.0 * 16 * P * V * K * reps / best / 1e9); \
    }

int main(void) {
    for (int i = 0; i < K * 64; i++) W[i] = i * 1e-6f;
    for (int i = 0; i < (1 << 16); i++) X[i] = i * 1e-6f;
    int reps = 200000;
    for (int spread = 0; spread < 2; spread++) {
        RUN(12, 2, spread) RUN(6, 4, spread) RUN(8, 3, spread) RUN(4, 6, spread)
        RUN(24, 1, spread)
    }
    return 0;
}
