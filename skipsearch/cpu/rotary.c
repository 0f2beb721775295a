/* The rotary position embedding of a block's queries and keys in one call, for CPUs with AVX2
 * (skipsearch/cpu/rotary.py builds, loads and installs it; docs/cpu-backend.md).
 *
 * Why it exists: transformers applies it with about fifteen torch operations a layer (two slices,
 * a negation and a concatenation per tensor for `rotate_half`, then products and sums), each a
 * dispatch of a few microseconds on vectors of a few hundred floats: on an AVX2-only CPU it
 * was 4.4 ms of SmolLM2's 36 ms step. One call computes the same formula,
 *
 *     out[d]     = x[d] * cos[d] - x[d + h] * sin[d]          (d < h = dim / 2)
 *     out[d + h] = x[d + h] * cos[d + h] + x[d] * sin[d + h]
 *
 * with the same IEEE operations in the same order as transformers' `q * cos + rotate_half(q) * sin`
 * (a product, a product, a sum; (-a) * b is -(a * b) exactly, and adding it is subtracting a * b),
 * and it is built without contracting them into fused multiply-adds: the outputs are
 * transformers' bits exactly, whatever the rows beside them.
 *
 * Layout: x has `heads` heads of `rows` positions of `dim` floats, element (h, r, d) at
 * x + h * head_stride + r * row_stride + d, and the output its own strides (the fused decoder
 * layers, skipsearch/cpu/fused_layers.py, read the queries and keys out of one q/k/v product and
 * write the keys straight into the K/V cache); cos and sin are rows x dim (contiguous). dim must be
 * a multiple of 16. Returns 0, or 1 when it is not.
 */
#include <immintrin.h>
#include <stdint.h>

static void rotate(const float *x, int64_t heads, int64_t head_stride, int64_t row_stride, float *out,
                   int64_t out_head_stride, int64_t out_row_stride, int64_t rows, int64_t dim,
                   const float *cos, const float *sin) {
    const int64_t half = dim / 2;
    for (int64_t h = 0; h < heads; h++) {
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + h * head_stride + r * row_stride;
            float *yr = out + h * out_head_stride + r * out_row_stride;
            const float *c = cos + r * dim, *s = sin + r * dim;
            for (int64_t d = 0; d < half; d += 8) {
                __m256 low = _mm256_loadu_ps(xr + d), high = _mm256_loadu_ps(xr + half + d);
                __m256 first = _mm256_sub_ps(_mm256_mul_ps(low, _mm256_loadu_ps(c + d)),
                                             _mm256_mul_ps(high, _mm256_loadu_ps(s + d)));
                __m256 second = _mm256_add_ps(_mm256_mul_ps(high, _mm256_loadu_ps(c + half + d)),
                                              _mm256_mul_ps(low, _mm256_loadu_ps(s + half + d)));
                _mm256_storeu_ps(yr + d, first);
                _mm256_storeu_ps(yr + half + d, second);
            }
        }
    }
}

int rotary(const float *q, int64_t q_heads, int64_t q_head_stride, int64_t q_row_stride, float *q_out,
           int64_t q_out_head_stride, int64_t q_out_row_stride,
           const float *k, int64_t k_heads, int64_t k_head_stride, int64_t k_row_stride, float *k_out,
           int64_t k_out_head_stride, int64_t k_out_row_stride,
           int64_t rows, int64_t dim, const float *cos, const float *sin) {
    if (dim % 16 != 0) return 1;
    rotate(q, q_heads, q_head_stride, q_row_stride, q_out, q_out_head_stride, q_out_row_stride, rows, dim, cos, sin);
    rotate(k, k_heads, k_head_stride, k_row_stride, k_out, k_out_head_stride, k_out_row_stride, rows, dim, cos, sin);
    return 0;
}
