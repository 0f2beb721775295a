/* Reductions of an AVX2 vector's 8 float lanes in one fixed order, shared by linear_rows.c and
 * decode_attention_fp32.c: the kernels' promise that an output is the same bits whatever the rows
 * beside it rests on every sum running in the same order (skipsearch/cpu/native.py hashes this
 * header into both builds). */
#include <immintrin.h>

/* The 8 lanes' sum, always ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)). */
static inline float lanes_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
