/* SiLU of float32 rows, for CPUs with AVX2 and FMA (skipsearch/cpu/silu.py builds, loads and
 * installs it; docs/cpu-backend.md).
 *
 * Why it exists: the fused decoder layers (decoder_layer.c) run a layer's MLP in one C call, and
 * its activation must be the same bits as the modules' path, which prefills and teacher-forced
 * passes take: torch's SiLU cannot be called from C, so both paths call this kernel. It computes
 *
 *     silu(x) = x * s,   s = 1 / (1 + e) for x >= 0, e / (1 + e) otherwise,   e = e^-|x|
 *
 * with avx2_exp.h's exponential (~1 ulp; e^-|x| never overflows), every element on its own: a
 * value's SiLU is the same bits wherever it sits (the last elements of a row past a multiple of 8
 * go through the same vector code, padded). Within a few ulp of torch's SiLU, not its bits.
 *
 * Layout: rows of n floats, row r of x at x + r * x_stride, of y at y + r * y_stride. Returns 0.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "avx2_exp.h"

static inline __m256 silu8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = exp_nonpositive(_mm256_or_ps(x, _mm256_set1_ps(-0.0f))); /* e^-|x| */
    __m256 positive = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ);
    __m256 s = _mm256_div_ps(_mm256_blendv_ps(e, one, positive), _mm256_add_ps(one, e));
    return _mm256_mul_ps(x, s);
}

int silu(const float *x, int64_t rows, int64_t n, int64_t x_stride, float *y, int64_t y_stride) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        float *yr = y + r * y_stride;
        int64_t k = 0;
        for (; k + 8 <= n; k += 8) _mm256_storeu_ps(yr + k, silu8(_mm256_loadu_ps(xr + k)));
        if (k < n) {
            float tail[8] = {0};
            memcpy(tail, xr + k, sizeof(float) * (n - k));
            _mm256_storeu_ps(tail, silu8(_mm256_loadu_ps(tail)));
            memcpy(yr + k, tail, sizeof(float) * (n - k));
        }
    }
    return 0;
}
