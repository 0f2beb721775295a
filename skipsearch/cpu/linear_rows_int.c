/* The product of a few float32 rows with an int8 or int4 weight matrix, in float32 arithmetic, for
 * CPUs with AVX2 and FMA (skipsearch/cpu/int_linear.py builds and loads it; the quantization is
 * skipsearch/cpu/int_weights.py's).
 *
 * Why it exists: a draft that keeps every layer but reads its weights at int8 (half the bytes of
 * bf16) or int4 (a quarter) agrees with the full model 96-100% of the time, and a decode step is
 * bound by the bytes of weights it reads; torch's weight-only kernels (aten._weight_int8pack_mm,
 * _weight_int4pack_mm_for_cpu) stream them at 20-28 GB/s on a 2-core EPYC where linear_rows.c
 * streams bf16 at 35-40 GB/s, so their int8 step costs 0.71-0.77 of our bf16 one instead of 0.5.
 * This is linear_rows.c's design on fewer bytes: each weight read once per call whatever the row
 * count (1..16 rows), one sequential stream per block of OUT_BLOCK outputs, each chunk of weights
 * widened to float32 once and multiplied into every row's float32 accumulators. The activations stay
 * float32 (no VNNI: that would quantize them).
 *
 * One source, two builds: with -mavx512f its vectors are 16 floats wide (LANES), else 8 (AVX2).
 * Compiled with -ffp-contract=off: every product and sum written below is the one computed.
 *
 * int8 (linear_rows_int8): w is int8 in int_linear.pack_int8's layout [blocks, in / LANES,
 * OUT_BLOCK, LANES] (zeros past out and past in); the weights are sign-extended and converted to
 * float32 (exact), multiplied into the accumulators, and each output's lane sum is multiplied by its
 * row's scale once: y = sum(q * x) * scale[o] + bias[o]. in must be a multiple of 8; in the wide
 * build the last chunk of x is read under a mask where in is not a multiple of 16.
 *
 * int4 (linear_rows_int4): each value q (0..15) is a nibble of int_linear.pack_int4's layout
 * [blocks, in / SUPER, OUT_BLOCK, LANES] uint32 (SUPER = 8 LANES inputs): lane i of an output's word
 * holds in nibble j the input k0 + j LANES + i, so one load serves 8 chunks. params is float32 [blocks, in / group, OUT_BLOCK, 2] (each
 * group's scale s and zero z); group (32, 64 or 128) divides in. A value stands for (q - 8) s + z.
 * - AVX-512: the 16 values a group can take are one vector, the table (q - 8) s + z computed as
 *   int_weights.dequantize_int4 does (a float32 product, then a sum: the same bits), built once per
 *   group and output; a chunk's weights are vpermps of the table by the shifted word (vpermps reads
 *   the low 4 bits of each lane): two operations per 16 weights, and the weights exactly the
 *   dequantized ones.
 * - AVX2 (8-entry permutes only): q x is summed per group (q 16^j by a mask and a conversion, times
 *   x 16^-j: exactly q x), then the group enters the lane totals as s (sum q x) + (z - 8 s) (sum x),
 *   z - 8 s rounded once: the dequantized product reassociated (block4's comment; the tests'
 *   tolerance counts |z| in each weight's magnitude for it).
 *
 * Every output y[r][o] is one LANES-lane float32 accumulator (per group, on AVX2 int4) summed over k
 * in order, then its lanes summed in a fixed order (avx2_lanes.h) and scaled and biased: the same
 * operations whatever the row count, the row's place in its block and the thread, so a verify
 * pass's products are bit for bit the draft steps'. Work is split over OpenMP threads (torch's runtime) by blocks of outputs.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "avx2_lanes.h"

/* Weight rows streamed together: 4, so that one row's sums are 4 independent FMA chains (with 2, as
 * linear_rows.c, a one-row step waited on the FMAs' latency: 1.4-1.7x slower in cache) and each chunk
 * of x is loaded once for 4 outputs. */
#define OUT_BLOCK 4
#define NIBBLES 8   /* int4 values a 32-bit lane holds: a SUPER of inputs is 8 chunks */
#ifndef PREFETCH_BYTES /* -D for experiments */
#define PREFETCH_BYTES 8192 /* linear_rows.c's distance: 8 KB ahead in the block's stream, into L2 */
#endif

#ifdef __AVX512F__
#define LANES 16
#define ROW_BLOCK 6 /* int8: 6 x 4 accumulators + 4 weights + x < 32 */
#define ROW_BLOCK4 4 /* int4: 4 x 4 accumulators + 4 words + 4 tables + 4 weights + x < 32 */
typedef __m512 vec;
typedef __m512i ivec;
#define vec_zero _mm512_setzero_ps
#define vec_load _mm512_loadu_ps
#define ivec_load(p) _mm512_loadu_si512((const void *)(p))
static inline __m512 vec_load_first(const float *p, int64_t n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}
#define vec_fmadd _mm512_fmadd_ps
static inline float vec_sum(__m512 v) {
    __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return lanes_sum(_mm256_add_ps(_mm512_castps512_ps256(v), high));
}
/* 16 int8 weights, exactly as float32. */
static inline vec widen8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
/* int4: the group's table, entry q = the value q stands for: (q - 8) s + z. */
typedef vec Int4Group;
static inline Int4Group int4_group(const float *pair) {
    const __m512 ramp = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    return _mm512_add_ps(_mm512_mul_ps(ramp, _mm512_set1_ps(pair[0])), _mm512_set1_ps(pair[1]));
}
#define INT4_WIDEN(words, j, group) _mm512_permutexvar_ps(_mm512_srli_epi32((words), 4 * (j)), (group))
#else
#define LANES 8
#define ROW_BLOCK 2 /* int8: 2 x 4 accumulators + 4 weights + x < 16 */
#define ROW_BLOCK4 2 /* int4: 2 x 4 group accumulators + 4 words + weights + x; the totals from L1 */
typedef __m256 vec;
typedef __m256i ivec;
#define vec_zero _mm256_setzero_ps
#define vec_load _mm256_loadu_ps
#define ivec_load(p) _mm256_loadu_si256((const __m256i *)(p))
#define vec_load_first(p, n) _mm256_loadu_ps(p) /* never called: in is a multiple of 8 */
#define vec_fmadd _mm256_fmadd_ps
#define vec_sum lanes_sum
static inline vec widen8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
/* Nibble j converted where it lies, q 16^j (exact: 4 significant bits), by a mask and a conversion;
 * the top one shifted down (its place is the sign bit). The rows' x are scaled by 16^-j to match. */
#define INT4_LEVEL(words, j)                                                                                \
    ((j) == NIBBLES - 1 ? _mm256_cvtepi32_ps(_mm256_srli_epi32((words), 4 * (NIBBLES - 1)))                 \
                        : _mm256_cvtepi32_ps(_mm256_and_si256((words), _mm256_set1_epi32(0xF << 4 * (j)))))
#endif
#define SUPER (NIBBLES * LANES)

/* ---- int8 ---- */

/* One block of OUT_BLOCK outputs of rows 0 .. NR - 1: lane sums of q * x, unscaled. */
static inline __attribute__((always_inline)) void block8(
    const float *x, int64_t x_stride, int NR, int64_t in, const int8_t *w_block, vec *sums) {
    vec acc[ROW_BLOCK][OUT_BLOCK];
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < OUT_BLOCK; j++) acc[r][j] = vec_zero();
    for (int64_t k = 0; k < in; k += LANES) {
        const int8_t *chunk = w_block + k * OUT_BLOCK;
        _mm_prefetch((const char *)(chunk + PREFETCH_BYTES), _MM_HINT_T1);
        vec weights[OUT_BLOCK];
        for (int j = 0; j < OUT_BLOCK; j++) weights[j] = widen8(chunk + j * LANES);
        for (int r = 0; r < NR; r++) {
            const float *xk = x + r * x_stride + k;
            vec xr = k + LANES <= in ? vec_load(xk) : vec_load_first(xk, in - k);
            __asm__("" : "+v"(xr)); /* one load of x for both FMAs (linear_rows.c) */
            for (int j = 0; j < OUT_BLOCK; j++) acc[r][j] = vec_fmadd(xr, weights[j], acc[r][j]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < OUT_BLOCK; j++) sums[r * OUT_BLOCK + j] = acc[r][j];
}

#define ROWS_CASE8(n) case n: block8(xr, x_stride, n, in, w_block, sums); break;

static void output_block8(const float *x, int64_t x_stride, int64_t rows, int64_t in, const int8_t *w,
                          const float *scale, int64_t out, int64_t b, const float *bias, float *y, int64_t y_stride) {
    const int8_t *w_block = w + b * OUT_BLOCK * ((in + LANES - 1) / LANES * LANES);
    vec sums[ROW_BLOCK * OUT_BLOCK];
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
        int64_t nr = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
        const float *xr = x + r0 * x_stride;
        switch (nr) {
#if ROW_BLOCK > 2
        ROWS_CASE8(6) ROWS_CASE8(5) ROWS_CASE8(4) ROWS_CASE8(3)
#endif
        ROWS_CASE8(2)
        default: block8(xr, x_stride, 1, in, w_block, sums);
        }
        for (int64_t r = 0; r < nr; r++)
            for (int64_t j = 0, o = b * OUT_BLOCK; j < OUT_BLOCK && o < out; j++, o++)
                y[(r0 + r) * y_stride + o] = vec_sum(sums[r * OUT_BLOCK + j]) * scale[o] + (bias ? bias[o] : 0.0f);
    }
}

/* y = x (q scale)^T + bias, q in pack_int8's layout; 0 on success, 1 where the shape is not one the
 * kernel reads. */
int linear_rows_int8(const float *x, int64_t x_stride, int64_t rows, int64_t in, const int8_t *w, const float *scale,
                     int64_t out, const float *bias, float *y, int64_t y_stride) {
    if (in % 8 != 0 || rows < 1 || out < 1) return 1;
    int64_t blocks = (out + OUT_BLOCK - 1) / OUT_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) output_block8(x, x_stride, rows, in, w, scale, out, b, bias, y, y_stride);
    return 0;
}

/* ---- int4 ---- */

#ifdef __AVX512F__
/* One block of OUT_BLOCK outputs of rows 0 .. NR - 1: lane sums of the dequantized weights times x. */
static inline __attribute__((always_inline)) void block4(
    const float *x, int64_t x_stride, int NR, int64_t in, const uint32_t *w_block, const float *p_block,
    int group_shift, const float *xsums, const float *xscaled, vec *sums) {
    (void)xsums, (void)xscaled;
    const int64_t group_mask = ((int64_t)1 << group_shift) - 1; /* no division in the loop */
    vec acc[ROW_BLOCK4][OUT_BLOCK];
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < OUT_BLOCK; j++) acc[r][j] = vec_zero();
    Int4Group groups[OUT_BLOCK];
    for (int64_t k0 = 0; k0 < in; k0 += SUPER) {
        const uint32_t *super = w_block + k0 / SUPER * OUT_BLOCK * LANES;
        _mm_prefetch((const char *)super + PREFETCH_BYTES, _MM_HINT_T1);
        _mm_prefetch((const char *)(p_block + (k0 >> group_shift) * OUT_BLOCK * 2) + 512, _MM_HINT_T1);
        ivec words[OUT_BLOCK];
        for (int o = 0; o < OUT_BLOCK; o++) words[o] = ivec_load(super + o * LANES);
#pragma GCC unroll 8
        for (int j = 0; j < NIBBLES; j++) {
            int64_t k = k0 + j * LANES;
            if (k >= in) break;
            if ((k & group_mask) == 0)
                for (int o = 0; o < OUT_BLOCK; o++)
                    groups[o] = int4_group(p_block + ((k >> group_shift) * OUT_BLOCK + o) * 2);
            vec weights[OUT_BLOCK];
            for (int o = 0; o < OUT_BLOCK; o++) weights[o] = INT4_WIDEN(words[o], j, groups[o]);
            for (int r = 0; r < NR; r++) {
                vec xr = vec_load(x + r * x_stride + k);
                __asm__("" : "+v"(xr));
                for (int o = 0; o < OUT_BLOCK; o++) acc[r][o] = vec_fmadd(xr, weights[o], acc[r][o]);
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < OUT_BLOCK; j++) sums[r * OUT_BLOCK + j] = acc[r][j];
}
#else
/* One block of OUT_BLOCK outputs of rows 0 .. NR - 1, without a table (AVX2 permutes 8 floats): each
 * group's sum of q x per lane in its own accumulator, then into the lane totals as
 * total = fma(sum, s, total), total = fma(X, z - 8 s, total), X the group's lane sums of x. Chunk j of
 * a super-chunk multiplies q 16^j (INT4_LEVEL) by x 16^-j (xs, the rows scaled once per call): the
 * same product q x exactly, for a mask and a conversion a weight, then one FMA a weight and row.
 * xsums: per row, per group, LANES floats; xs: the rows scaled, in floats apart. */
static inline __attribute__((always_inline)) void block4(
    const float *x, int64_t x_stride, int NR, int64_t in, const uint32_t *w_block, const float *p_block,
    int group_shift, const float *xsums, const float *xs, vec *sums) {
    const int64_t group_mask = ((int64_t)1 << group_shift) - 1, groups = in >> group_shift;
    (void)x, (void)x_stride;
    vec acc[ROW_BLOCK4][OUT_BLOCK], total[ROW_BLOCK4][OUT_BLOCK];
    for (int r = 0; r < NR; r++)
        for (int o = 0; o < OUT_BLOCK; o++) acc[r][o] = total[r][o] = vec_zero();
    for (int64_t k0 = 0; k0 < in; k0 += SUPER) {
        const uint32_t *super = w_block + k0 / SUPER * OUT_BLOCK * LANES;
        _mm_prefetch((const char *)super + PREFETCH_BYTES, _MM_HINT_T1);
        _mm_prefetch((const char *)(p_block + (k0 >> group_shift) * OUT_BLOCK * 2) + 512, _MM_HINT_T1);
        ivec words[OUT_BLOCK];
        for (int o = 0; o < OUT_BLOCK; o++) words[o] = ivec_load(super + o * LANES);
#pragma GCC unroll 8
        for (int j = 0; j < NIBBLES; j++) {
            int64_t k = k0 + j * LANES;
            if (k >= in) break;
            vec levels[OUT_BLOCK];
            for (int o = 0; o < OUT_BLOCK; o++) levels[o] = INT4_LEVEL(words[o], j);
            for (int r = 0; r < NR; r++) {
                vec xr = vec_load(xs + r * in + k);
                __asm__("" : "+v"(xr));
                for (int o = 0; o < OUT_BLOCK; o++) acc[r][o] = vec_fmadd(xr, levels[o], acc[r][o]);
            }
            if (((k + LANES) & group_mask) == 0) { /* the group's last chunk */
                int64_t g = k >> group_shift;
                for (int o = 0; o < OUT_BLOCK; o++) {
                    const float *pair = p_block + (g * OUT_BLOCK + o) * 2;
                    vec scale = _mm256_set1_ps(pair[0]), zero = _mm256_set1_ps(pair[1] - 8.0f * pair[0]);
                    for (int r = 0; r < NR; r++) {
                        vec xs = vec_load(xsums + (r * groups + g) * LANES);
                        total[r][o] = vec_fmadd(xs, zero, vec_fmadd(acc[r][o], scale, total[r][o]));
                        acc[r][o] = vec_zero();
                    }
                }
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int o = 0; o < OUT_BLOCK; o++) sums[r * OUT_BLOCK + o] = total[r][o];
}
#endif

#define ROWS_CASE4(n) case n: block4(xr, x_stride, n, in, w_block, p_block, group_shift, xs, xc, sums); break;

static void output_block4(const float *x, int64_t x_stride, int64_t rows, int64_t in, const uint32_t *w,
                          const float *params, int64_t group, const float *xsums, const float *xscaled, int64_t out, int64_t b,
                          const float *bias, float *y, int64_t y_stride) {
    const uint32_t *w_block = w + b * OUT_BLOCK * ((in + SUPER - 1) / SUPER * LANES);
    const float *p_block = params + b * OUT_BLOCK * 2 * (in / group);
    int group_shift = group == 32 ? 5 : group == 64 ? 6 : 7;
    vec sums[ROW_BLOCK4 * OUT_BLOCK];
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK4) {
        int64_t nr = rows - r0 < ROW_BLOCK4 ? rows - r0 : ROW_BLOCK4;
        const float *xr = x + r0 * x_stride;
        /* AVX2: this row block's group sums and scaled rows (linear_rows_int4) */
        const float *xs = xsums ? xsums + r0 * (in / group) * LANES : NULL, *xc = xscaled ? xscaled + r0 * in : NULL;
        switch (nr) {
#if ROW_BLOCK4 > 2
        ROWS_CASE4(4) ROWS_CASE4(3)
#endif
        ROWS_CASE4(2)
        default: block4(xr, x_stride, 1, in, w_block, p_block, group_shift, xs, xc, sums);
        }
        for (int64_t r = 0; r < nr; r++)
            for (int64_t j = 0, o = b * OUT_BLOCK; j < OUT_BLOCK && o < out; j++, o++)
                y[(r0 + r) * y_stride + o] = vec_sum(sums[r * OUT_BLOCK + j]) + (bias ? bias[o] : 0.0f);
    }
}

/* y = x w^T + bias, w the int4 values of pack_int4's layout with their groups' params; 0 on success, 1
 * where the shape is not one the kernel reads (group not 32, 64 or 128, or not dividing in). */
int linear_rows_int4(const float *x, int64_t x_stride, int64_t rows, int64_t in, const uint32_t *w,
                     const float *params, int64_t group, int64_t out, const float *bias, float *y, int64_t y_stride) {
    if ((group != 32 && group != 64 && group != 128) || in % group != 0 || rows < 1 || out < 1) return 1;
    int64_t blocks = (out + OUT_BLOCK - 1) / OUT_BLOCK;
    float *xsums = NULL, *xscaled = NULL;
#ifndef __AVX512F__
    /* Each row's lane sums of x over each group, in chunk order, and the row with chunk j of each
     * super-chunk scaled by 16^-j (exact): both the same whatever the rows beside it. */
    int64_t groups = in / group;
    xsums = malloc((size_t)(rows * (groups * LANES + in)) * sizeof(float));
    if (!xsums) return 1;
    xscaled = xsums + rows * groups * LANES;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t g = 0; g < groups; g++) {
            vec sum = vec_zero();
            for (int64_t k = g * group; k < (g + 1) * group; k += LANES) sum = _mm256_add_ps(sum, vec_load(x + r * x_stride + k));
            _mm256_storeu_ps(xsums + (r * groups + g) * LANES, sum);
        }
        for (int64_t k = 0; k < in; k += LANES) {
            int64_t j = k % SUPER / LANES;
            float factor = j == NIBBLES - 1 ? 1.0f : 1.0f / (float)(1 << 4 * j);
            _mm256_storeu_ps(xscaled + r * in + k, _mm256_mul_ps(vec_load(x + r * x_stride + k), _mm256_set1_ps(factor)));
        }
    }
#endif
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++)
        output_block4(x, x_stride, rows, in, w, params, group, xsums, xscaled, out, b, bias, y, y_stride);
    free(xsums);
    return 0;
}

/* The inputs of one chunk (both layouts depend on the build). */
int linear_rows_int_lanes(void) { return LANES; }
