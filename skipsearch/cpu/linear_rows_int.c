/* The product of a few float32 rows with an int8 or int4 weight matrix, in float32 arithmetic, for
 * CPUs with AVX2 and FMA (skipsearch/cpu/int_linear.py builds and loads it; the quantization is
 * skipsearch/cpu/int_weights.py's; a lower-precision fused layer's driver, decoder_layer.c, calls it
 * through a function pointer).
 *
 * Why it exists: a draft that keeps every layer but reads its weights at int8 (half the bytes of
 * bf16) or int4 (a quarter) agrees with the full model 96-100% of the time, and a decode step is
 * bound by the bytes of weights it reads; torch's weight-only kernels (aten._weight_int8pack_mm,
 * _weight_int4pack_mm_for_cpu) stream them at 20-28 GB/s on a 2-core AVX-512 CPU where linear_rows.c
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
 * int4 (linear_rows_int4): each value q (0..15) is a nibble of int_linear.pack_int4's layout, per
 * block [in / SUPER, OUT_BLOCK, LANES] uint32 (SUPER = 8 LANES inputs; a last half super-chunk in
 * uint16, int4_words): lane i of an output's word holds in nibble j the input k0 + j LANES + i, so one
 * load serves 8 chunks. params is bf16
 * [blocks, in / group, OUT_BLOCK, 2] (each group's scale s and zero z, bf16 values by
 * int_weights.quantize_int4, widened exactly); group (32, 64 or 128) divides in. A value stands for
 * (q - 8) s + z.
 * - AVX-512: the 16 values a group can take are one vector, the table (q - 8) s + z computed as
 *   int_weights.dequantize_int4 does (a float32 product, then a sum: the same bits), built once per
 *   group and output; a chunk's weights are vpermps of the table by the shifted word (vpermps reads
 *   the low 4 bits of each lane): two operations per 16 weights, and the weights exactly the
 *   dequantized ones.
 * - AVX2 (8-entry permutes only): q x is summed per group (q 16^j by a mask and a conversion, times
 *   x 16^-j: exactly q x, unless |x| < 2^-102 falls to a subnormal), then the group enters the
 *   lane totals as s (sum q x) + (z - 8 s) (sum x), z - 8 s rounded once: the dequantized product
 *   reassociated (block4's comment; the tests' tolerance counts |z| in each weight's magnitude).
 *
 * Every output y[r][o] is one LANES-lane float32 accumulator (per group, on AVX2 int4) summed over k
 * in order, then its lanes summed in a fixed order (avx2_lanes.h) and scaled and biased: the same
 * operations whatever the row count, the row's place in its block and the thread, so a verify
 * pass's products are bit for bit the draft steps'. Work is split over OpenMP threads (torch's
 * runtime) by blocks of outputs, or, where the decoding thread engaged helpers on busy cores
 * (shared_core.h, cpu/shared_core.py), into pieces of PIECE_BLOCKS blocks that the free core and the
 * helpers claim, as linear_rows.c's: the same operations for each output, so the same bits.
 */
#define _GNU_SOURCE /* shared_core.h pins threads (sched.h's CPU sets, pthread affinity) */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx2_lanes.h"

/* Weight rows streamed together: 4, so that one row's sums are 4 independent FMA chains (with 2, as
 * linear_rows.c, a one-row step waited on the FMAs' latency: 1.4-1.7x slower in cache) and each chunk
 * of x is loaded once for 4 outputs. */
#define OUT_BLOCK 4
#define NIBBLES 8   /* int4 values a 32-bit lane holds: a SUPER of inputs is 8 chunks */
#ifndef PREFETCH_BYTES /* -D for experiments */
#define PREFETCH_BYTES 8192 /* linear_rows.c's distance: 8 KB ahead in the block's stream, into L2 */
#endif

/* A group's (scale, zero) bf16 pair, one 32-bit word: scale in the low half, zero in the high. */
static inline uint32_t int4_pair(const uint16_t *pair) {
    uint32_t word;
    memcpy(&word, pair, sizeof word);
    return word;
}

#ifdef __AVX512F__
#define LANES 16
/* Rows summed together (one pass over a block's weights): the fastest of 4-12 (int8) and 4-8 (int4) in
 * cache on a CPU with AVX-512 BF16, one thread, 1-16 rows of a 2048 x 1024 matrix (a few accumulators
 * spilled cost less than another pass's widening); -D for experiments. */
#ifndef ROW_BLOCK_WIDE
#define ROW_BLOCK_WIDE 8
#endif
#define ROW_BLOCK ROW_BLOCK_WIDE
#ifndef ROW_BLOCK4_WIDE
#define ROW_BLOCK4_WIDE 8 /* 5 rows 0.77 of 4's time, 16 rows 0.87 */
#endif
#define ROW_BLOCK4 ROW_BLOCK4_WIDE
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
static inline Int4Group int4_group(const uint16_t *pair) {
    const __m512 ramp = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    /* the pair broadcast, each half widened exactly in every lane (a shift, a mask): no scalar work */
    __m512i both = _mm512_set1_epi32((int)int4_pair(pair));
    __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(both, 16));
    __m512 zero = _mm512_castsi512_ps(_mm512_and_si512(both, _mm512_set1_epi32((int)0xFFFF0000u)));
    return _mm512_add_ps(_mm512_mul_ps(ramp, scale), zero);
}
#define INT4_WIDEN(words, j, group) _mm512_permutexvar_ps(_mm512_srli_epi32((words), 4 * (j)), (group))
#else
#define LANES 8
/* As the wide build's, of 1-3 (int8) and 1-4 (int4) on the same CPU (the AVX2 build); -D for
 * experiments. */
#ifndef ROW_BLOCK_NARROW
#define ROW_BLOCK_NARROW 2 /* 2 x 4 accumulators + 4 weights + x < 16 */
#endif
#ifndef ROW_BLOCK4_NARROW
#define ROW_BLOCK4_NARROW 3 /* 3 x 4 group accumulators, the words, a weight, x: some from L1 */
#endif
#define ROW_BLOCK ROW_BLOCK_NARROW
#define ROW_BLOCK4 ROW_BLOCK4_NARROW
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

/* int4: the words of one output's super-chunk starting at input k0, at `units` (16-bit units, the
 * layout's type): 32-bit words, except a last super-chunk of at most 4 chunks (in not a multiple of
 * SUPER, e.g. 576 = 4.5 x 128 in the wide build), stored as 16-bit words (its 4 nibbles) so that no
 * padding is streamed: zero-extended here. */
static inline ivec int4_words(const uint16_t *units, int64_t k0, int64_t in) {
    if (in - k0 > SUPER / 2) return ivec_load(units);
#ifdef __AVX512F__
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)units));
#else
    return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)units));
#endif
}

/* The 16-bit units of one block of outputs' int4 words: whole super-chunks of 32-bit words, then a
 * last one of 16-bit words where it holds at most half a super-chunk. */
static inline int64_t int4_block_units(int64_t in) {
    int64_t whole = in / SUPER, tail = in % SUPER;
    return OUT_BLOCK * LANES * (2 * whole + (tail == 0 ? 0 : tail <= SUPER / 2 ? 1 : 2));
}

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
            __asm__("" : "+v"(xr)); /* one load of x for the block's FMAs (linear_rows.c) */
            for (int j = 0; j < OUT_BLOCK; j++) acc[r][j] = vec_fmadd(xr, weights[j], acc[r][j]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < OUT_BLOCK; j++) sums[r * OUT_BLOCK + j] = acc[r][j];
}

#define ROWS_CASE8(n) case n: block8(xr, x_stride, n, in, w_block, sums); break;

/* Block b's outputs of every row into y, output o of row r at y[r * y_stride + o - y_first]. */
static void output_block8(const float *x, int64_t x_stride, int64_t rows, int64_t in, const int8_t *w,
                          const float *scale, int64_t out, int64_t b, const float *bias, float *y,
                          int64_t y_stride, int64_t y_first) {
    const int8_t *w_block = w + b * OUT_BLOCK * ((in + LANES - 1) / LANES * LANES);
    vec sums[ROW_BLOCK * OUT_BLOCK];
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
        int64_t nr = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
        const float *xr = x + r0 * x_stride;
        switch (nr) { /* a case for each count up to ROW_BLOCK (12 at most) */
#if ROW_BLOCK >= 12
        ROWS_CASE8(12)
#endif
#if ROW_BLOCK >= 11
        ROWS_CASE8(11)
#endif
#if ROW_BLOCK >= 10
        ROWS_CASE8(10)
#endif
#if ROW_BLOCK >= 9
        ROWS_CASE8(9)
#endif
#if ROW_BLOCK >= 8
        ROWS_CASE8(8)
#endif
#if ROW_BLOCK >= 7
        ROWS_CASE8(7)
#endif
#if ROW_BLOCK >= 6
        ROWS_CASE8(6)
#endif
#if ROW_BLOCK >= 5
        ROWS_CASE8(5)
#endif
#if ROW_BLOCK >= 4
        ROWS_CASE8(4)
#endif
#if ROW_BLOCK >= 3
        ROWS_CASE8(3)
#endif
        ROWS_CASE8(2)
        default: block8(xr, x_stride, 1, in, w_block, sums);
        }
        for (int64_t r = 0; r < nr; r++)
            for (int64_t j = 0, o = b * OUT_BLOCK; j < OUT_BLOCK && o < out; j++, o++)
                y[(r0 + r) * y_stride + o - y_first] =
                    vec_sum(sums[r * OUT_BLOCK + j]) * scale[o] + (bias ? bias[o] : 0.0f);
    }
}

/* ---- sharing with busy cores (shared_core.h): a piece is PIECE_BLOCKS blocks of outputs (128, as
 * linear_rows.c's), of at most SHARED_ROWS rows (int_linear.MAX_ROWS) ---- */
#define PIECE_BLOCKS 32
#define PIECE_OUTPUTS (PIECE_BLOCKS * OUT_BLOCK)
#define SHARED_ROWS 16
#define SHARED_SCRATCH_BYTES (SHARED_ROWS * PIECE_OUTPUTS * 4)
#include "shared_core.h"

/* One product's arguments, for either kernel (x and, on AVX2 int4, xsums and xscaled in the shared
 * inputs buffer, which a helper late for the piece may still read). */
typedef struct {
    const float *x, *bias, *scale, *xsums, *xscaled;
    const void *w;
    const uint16_t *params;
    float *y;
    int64_t rows, in, out, blocks, y_stride, group;
} Product;

static void piece_range(const Product *p, int64_t piece, int64_t *first, int64_t *last) {
    *first = piece * PIECE_BLOCKS;
    *last = *first + PIECE_BLOCKS < p->blocks ? *first + PIECE_BLOCKS : p->blocks;
}

static void piece_compute8(const void *args, int64_t piece, void *scratch) {
    const Product *p = args;
    int64_t first, last;
    piece_range(p, piece, &first, &last);
    for (int64_t b = first; b < last; b++)
        output_block8(p->x, p->in, p->rows, p->in, p->w, p->scale, p->out, b, p->bias, scratch, PIECE_OUTPUTS,
                      first * OUT_BLOCK);
}

static void piece_store(const void *args, int64_t piece, const void *scratch) {
    const Product *p = args;
    int64_t first = piece * PIECE_OUTPUTS, end = first + PIECE_OUTPUTS;
    int64_t n = (end < p->out ? end : p->out) - first;
    for (int64_t r = 0; r < p->rows; r++)
        memcpy(p->y + r * p->y_stride + first, (const float *)scratch + r * PIECE_OUTPUTS, (size_t)n * sizeof(float));
}

/* The rows of x copied into the shared inputs buffer, with `extra` floats after them; NULL where
 * memory runs out. */
static float *shared_rows(const float *x, int64_t x_stride, int64_t rows, int64_t in, int64_t extra) {
    float *inputs = shared_inputs((size_t)(rows * in + extra) * sizeof(float));
    if (inputs)
        for (int64_t r = 0; r < rows; r++) memcpy(inputs + r * in, x + r * x_stride, (size_t)in * sizeof(float));
    return inputs;
}

/* y = x (q scale)^T + bias, q in pack_int8's layout; 0 on success, 1 where the shape is not one the
 * kernel reads. */
int linear_rows_int8(const float *x, int64_t x_stride, int64_t rows, int64_t in, const int8_t *w,
                     const float *scale, int64_t out, const float *bias, float *y, int64_t y_stride) {
    if (in % 8 != 0 || rows < 1 || out < 1) return 1;
    int64_t blocks = (out + OUT_BLOCK - 1) / OUT_BLOCK, pieces = (blocks + PIECE_BLOCKS - 1) / PIECE_BLOCKS;
    if (rows <= SHARED_ROWS && shared_active(pieces)) {
        float *inputs = shared_rows(x, x_stride, rows, in, 0);
        if (!inputs) return 1;
        Product product = {inputs, bias, scale, NULL, NULL, w, NULL, y, rows, in, out, blocks, y_stride, 0};
        shared_run(&product, sizeof product, pieces, piece_compute8, piece_store);
        return 0;
    }
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++)
        output_block8(x, x_stride, rows, in, w, scale, out, b, bias, y, y_stride, 0);
    return 0;
}

/* ---- int4 ---- */

#ifdef __AVX512F__
/* One block of OUT_BLOCK outputs of rows 0 .. NR - 1: lane sums of the dequantized weights times x. */
static inline __attribute__((always_inline)) void block4(
    const float *x, int64_t x_stride, int NR, int64_t in, const uint16_t *w_block, const uint16_t *p_block,
    int group_shift, const float *xsums, const float *xscaled, vec *sums) {
    (void)xsums, (void)xscaled;
    const int64_t group_mask = ((int64_t)1 << group_shift) - 1; /* no division in the loop */
    vec acc[ROW_BLOCK4][OUT_BLOCK];
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < OUT_BLOCK; j++) acc[r][j] = vec_zero();
    Int4Group groups[OUT_BLOCK];
    for (int64_t k0 = 0; k0 < in; k0 += SUPER) {
        const uint16_t *super = w_block + k0 / SUPER * OUT_BLOCK * LANES * 2;
        int64_t word_units = in - k0 > SUPER / 2 ? 2 : 1; /* a half last super-chunk: 16-bit words */
        _mm_prefetch((const char *)super + PREFETCH_BYTES, _MM_HINT_T1);
        _mm_prefetch((const char *)(p_block + (k0 >> group_shift) * OUT_BLOCK * 2) + 512, _MM_HINT_T1);
        ivec words[OUT_BLOCK];
        for (int o = 0; o < OUT_BLOCK; o++) words[o] = int4_words(super + o * LANES * word_units, k0, in);
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
    const float *x, int64_t x_stride, int NR, int64_t in, const uint16_t *w_block, const uint16_t *p_block,
    int group_shift, const float *xsums, const float *xs, vec *sums) {
    const int64_t group_mask = ((int64_t)1 << group_shift) - 1, groups = in >> group_shift;
    (void)x, (void)x_stride;
    vec acc[ROW_BLOCK4][OUT_BLOCK], total[ROW_BLOCK4][OUT_BLOCK];
    for (int r = 0; r < NR; r++)
        for (int o = 0; o < OUT_BLOCK; o++) acc[r][o] = total[r][o] = vec_zero();
    for (int64_t k0 = 0; k0 < in; k0 += SUPER) {
        const uint16_t *super = w_block + k0 / SUPER * OUT_BLOCK * LANES * 2;
        int64_t word_units = in - k0 > SUPER / 2 ? 2 : 1; /* a half last super-chunk: 16-bit words */
        _mm_prefetch((const char *)super + PREFETCH_BYTES, _MM_HINT_T1);
        _mm_prefetch((const char *)(p_block + (k0 >> group_shift) * OUT_BLOCK * 2) + 512, _MM_HINT_T1);
        ivec words[OUT_BLOCK];
        for (int o = 0; o < OUT_BLOCK; o++) words[o] = int4_words(super + o * LANES * word_units, k0, in);
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
                    const uint16_t *pair = p_block + (g * OUT_BLOCK + o) * 2;
                    __m256i both = _mm256_set1_epi32((int)int4_pair(pair));
                    vec scale = _mm256_castsi256_ps(_mm256_slli_epi32(both, 16));
                    vec zero = _mm256_castsi256_ps(_mm256_and_si256(both, _mm256_set1_epi32((int)0xFFFF0000u)));
                    zero = _mm256_sub_ps(zero, _mm256_mul_ps(_mm256_set1_ps(8.0f), scale)); /* z - 8 s */
                    for (int r = 0; r < NR; r++) {
                        vec xsum = vec_load(xsums + (r * groups + g) * LANES);
                        total[r][o] = vec_fmadd(xsum, zero, vec_fmadd(acc[r][o], scale, total[r][o]));
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

static void output_block4(const float *x, int64_t x_stride, int64_t rows, int64_t in, const uint16_t *w,
                          const uint16_t *params, int64_t group, const float *xsums, const float *xscaled,
                          int64_t out, int64_t b, const float *bias, float *y, int64_t y_stride,
                          int64_t y_first) {
    const uint16_t *w_block = w + b * int4_block_units(in);
    const uint16_t *p_block = params + b * OUT_BLOCK * 2 * (in / group);
    int group_shift = group == 32 ? 5 : group == 64 ? 6 : 7;
    vec sums[ROW_BLOCK4 * OUT_BLOCK];
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK4) {
        int64_t nr = rows - r0 < ROW_BLOCK4 ? rows - r0 : ROW_BLOCK4;
        const float *xr = x + r0 * x_stride;
        /* AVX2: this row block's group sums and scaled rows (linear_rows_int4); NULL on AVX-512 */
        const float *xs = xsums ? xsums + r0 * (in / group) * LANES : NULL;
        const float *xc = xscaled ? xscaled + r0 * in : NULL;
        switch (nr) { /* a case for each count up to ROW_BLOCK4 (8 at most) */
#if ROW_BLOCK4 >= 8
        ROWS_CASE4(8)
#endif
#if ROW_BLOCK4 >= 7
        ROWS_CASE4(7)
#endif
#if ROW_BLOCK4 >= 6
        ROWS_CASE4(6)
#endif
#if ROW_BLOCK4 >= 5
        ROWS_CASE4(5)
#endif
#if ROW_BLOCK4 >= 4
        ROWS_CASE4(4)
#endif
#if ROW_BLOCK4 >= 3
        ROWS_CASE4(3)
#endif
        ROWS_CASE4(2)
        default: block4(xr, x_stride, 1, in, w_block, p_block, group_shift, xs, xc, sums);
        }
        for (int64_t r = 0; r < nr; r++)
            for (int64_t j = 0, o = b * OUT_BLOCK; j < OUT_BLOCK && o < out; j++, o++)
                y[(r0 + r) * y_stride + o - y_first] = vec_sum(sums[r * OUT_BLOCK + j]) + (bias ? bias[o] : 0.0f);
    }
}

static void piece_compute4(const void *args, int64_t piece, void *scratch) {
    const Product *p = args;
    int64_t first, last;
    piece_range(p, piece, &first, &last);
    for (int64_t b = first; b < last; b++)
        output_block4(p->x, p->in, p->rows, p->in, p->w, p->params, p->group, p->xsums, p->xscaled, p->out, b,
                      p->bias, scratch, PIECE_OUTPUTS, first * OUT_BLOCK);
}

/* AVX2: each row's lane sums of x over each group, in chunk order, and the row with chunk j of each
 * super-chunk scaled by 16^-j (exact), into `xsums` (rows x groups x LANES floats) and `xscaled`
 * (rows x in): both the same whatever the rows beside it. */
static void int4_row_sums(const float *x, int64_t x_stride, int64_t rows, int64_t in, int64_t group, float *xsums,
                          float *xscaled) {
#ifdef __AVX512F__
    (void)x, (void)x_stride, (void)rows, (void)in, (void)group, (void)xsums, (void)xscaled;
#else
    int64_t groups = in / group;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * x_stride;
        for (int64_t g = 0; g < groups; g++) {
            vec sum = vec_zero();
            for (int64_t k = g * group; k < (g + 1) * group; k += LANES) sum = _mm256_add_ps(sum, vec_load(row + k));
            _mm256_storeu_ps(xsums + (r * groups + g) * LANES, sum);
        }
        for (int64_t k = 0; k < in; k += LANES) {
            int64_t j = k % SUPER / LANES;
            float factor = j == NIBBLES - 1 ? 1.0f : 1.0f / (float)(1 << 4 * j);
            _mm256_storeu_ps(xscaled + r * in + k, _mm256_mul_ps(vec_load(row + k), _mm256_set1_ps(factor)));
        }
    }
#endif
}

/* y = x w^T + bias, w the int4 values of pack_int4's layout with their groups' params; 0 on success, 1
 * where the shape is not one the kernel reads (group not 32, 64 or 128, or not dividing in). */
int linear_rows_int4(const float *x, int64_t x_stride, int64_t rows, int64_t in, const uint16_t *w,
                     const uint16_t *params, int64_t group, int64_t out, const float *bias, float *y,
                     int64_t y_stride) {
    if ((group != 32 && group != 64 && group != 128) || in % group != 0 || rows < 1 || out < 1) return 1;
    int64_t blocks = (out + OUT_BLOCK - 1) / OUT_BLOCK, pieces = (blocks + PIECE_BLOCKS - 1) / PIECE_BLOCKS;
#ifdef __AVX512F__
    const int64_t sums_floats = 0; /* the table kernel reads x itself */
#else
    const int64_t sums_floats = rows * ((in / group) * LANES + in);
#endif
    if (rows <= SHARED_ROWS && shared_active(pieces)) {
        float *inputs = shared_rows(x, x_stride, rows, in, sums_floats);
        if (!inputs) return 1;
        float *xsums = sums_floats ? inputs + rows * in : NULL;
        float *xscaled = sums_floats ? xsums + rows * (in / group) * LANES : NULL;
        int4_row_sums(inputs, in, rows, in, group, xsums, xscaled);
        Product product = {inputs, bias, NULL, xsums, xscaled, w, params, y, rows, in, out, blocks, y_stride, group};
        shared_run(&product, sizeof product, pieces, piece_compute4, piece_store);
        return 0;
    }
    float *xsums = NULL, *xscaled = NULL;
    if (sums_floats) {
        xsums = malloc((size_t)sums_floats * sizeof(float));
        if (!xsums) return 1;
        xscaled = xsums + rows * (in / group) * LANES;
        int4_row_sums(x, x_stride, rows, in, group, xsums, xscaled);
    }
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++)
        output_block4(x, x_stride, rows, in, w, params, group, xsums, xscaled, out, b, bias, y, y_stride, 0);
    free(xsums);
    return 0;
}

/* The inputs of one chunk (both layouts depend on the build). */
int linear_rows_int_lanes(void) { return LANES; }
