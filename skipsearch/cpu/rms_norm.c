/* RMSNorm of float32 rows in one call, for CPUs with AVX2 and FMA (skipsearch/cpu/rms_norm.py
 * builds and loads it; docs/cpu-backend.md).
 *
 * Why it exists: transformers' RMSNorm is eight torch operations (a cast, a square, a mean, an add,
 * a reciprocal square root, two products, a cast back) on a vector of a few hundred floats. Each
 * costs a dispatch of 3-8 us on an AVX2-only CPU and computes almost nothing, so SmolLM2's 61
 * norms a step cost 2-3 ms of a ~30 ms step. One call computes the same formula:
 *
 *     y = weight * (x * (1 / sqrt(sum(x * x) / n + eps)))
 *
 * Each row's sum of squares is one 8-lane float32 accumulator over the row in order, its lanes
 * summed in avx2_lanes.h's fixed order: every row comes out the same bits whatever the rows
 * beside it, so a verify pass's norms equal the decode steps' (what greedy SSD's equality with
 * autoregressive decoding rests on). Single-threaded: a row is a few hundred floats, less work
 * than waking a second thread.
 *
 * Layout: x is rows x n float32 (row r at x + r * n), y the same shape; weight is n floats; n must
 * be a multiple of 8. Returns 0, or 1 when n is not.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "avx2_lanes.h"

int rms_norm(const float *x, int64_t rows, int64_t n, const float *weight, float eps, float *y) {
    if (n % 8 != 0) return 1;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t k = 0; k < n; k += 8) {
            __m256 v = _mm256_loadu_ps(xr + k);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        const __m256 scale = _mm256_set1_ps(1.0f / sqrtf(lanes_sum(acc) / (float)n + eps));
        for (int64_t k = 0; k < n; k += 8) {
            __m256 normed = _mm256_mul_ps(_mm256_loadu_ps(xr + k), scale);
            _mm256_storeu_ps(yr + k, _mm256_mul_ps(_mm256_loadu_ps(weight + k), normed));
        }
    }
    return 0;
}
