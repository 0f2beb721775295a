/* The product of a few float32 rows with a bf16 weight matrix, in float32 arithmetic, for CPUs
 * with AVX2 and FMA (skipsearch/cpu/bf16_weights.py builds and loads it; docs/theory.md,
 * "The kernel plan").
 *
 * Why it exists: a decode step, a draft step and a verify pass multiply 1 to ~16 rows by every
 * weight matrix, so a step is a stream over the weights and should run at the memory's bandwidth,
 * with a verify of a few rows costing what one row costs. On a CPU without native bf16 (AVX2
 * only) torch's fp32 products do neither: MKL streams the weights at 4-11 GB/s at one row and
 * pays about one more product per extra row, oneDNN half that (docs/cpu-backend.md, "bf16 weights
 * in float32 arithmetic"). This kernel reads each weight once per call whatever the row count, from a bf16
 * copy (half the bytes of fp32), widens it to float32 (a bf16 value is the top half of a float32,
 * so the widening is exact) and multiplies in float32: the bf16 plan's weights with fp32
 * activations, at the memory's speed.
 *
 * One source, two builds: with -mavx512f its vectors are 16 floats wide (LANES), else 8 (AVX2).
 * The wide build exists because a verify's extra rows are arithmetic on weights already loaded:
 * at 4-6 rows the AVX2 build is compute-bound (on two cores of an AVX2-only CPU, and at 4 rows
 * 1.15x one row on a CPU with AVX-512), and 512-bit FMAs do twice the work per instruction.
 *
 * Layout: x is rows x in (float32, row r at x + r * x_stride); w is bf16 bits in the blocked
 * layout of bf16_weights.pack_weight: blocks of OUT_BLOCK = 2 output rows (zeros past out), each
 * block in / LANES chunks, each chunk the two rows' values at LANES inputs in pairs (row 0's,
 * row 1's), so one 32-bit lane holds both rows' weights at one input and a shift and a mask widen
 * them (one load and two operations per 2 x LANES weights: the widening competes with the FMAs for
 * the vector pipes); y is rows x out (float32, row r at y + r * y_stride); bias is out floats or
 * NULL; in must be a multiple of 8. In the wide build a block's stream is padded with zeros to a
 * multiple of LANES inputs, and the last chunk of x is read under a mask where in is not one.
 *
 * Every output y[r][j] is one LANES-lane float32 accumulator summed over k in order, then its
 * lanes summed in a fixed order and the bias added: the same operations whatever the row count, the
 * row's place in its block and the thread, so a verify pass's products are bit for bit the decode
 * steps' (what makes greedy SSD equal autoregressive decoding on this plan). Work is split over
 * OpenMP threads by blocks of OUT_BLOCK outputs; each block's weight rows are read from memory
 * once and from cache by every block of ROW_BLOCK rows. The OpenMP runtime is torch's own (the
 * library is loaded after torch), so the threads torch was given apply here too.
 */
#define _GNU_SOURCE /* shared_core.h pins threads (sched.h's CPU sets, pthread affinity) */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "avx2_lanes.h"

#define OUT_BLOCK 2 /* weight rows streamed together, in pairs: the two halves of a 32-bit lane */

#ifdef __AVX512F__
#define LANES 16
#define ROW_BLOCK 12 /* rows summed in registers together: 12 x 2 accumulators + 2 weights + x < 32 */
typedef __m512 vec;
#define vec_zero _mm512_setzero_ps
#define vec_load _mm512_loadu_ps
/* The first n < 16 floats at p, zeros after: a row's last chunk where in is not a multiple of 16. */
static inline __m512 vec_load_first(const float *p, int64_t n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}
#define vec_fmadd _mm512_fmadd_ps
/* The 16 lanes' sum: lane i + lane i + 8, then avx2_lanes.h's fixed order over the 8 sums. */
static inline float vec_sum(__m512 v) {
    __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return lanes_sum(_mm256_add_ps(_mm512_castps512_ps256(v), high));
}
/* Both rows' weights of one chunk, widened exactly (a bf16 value is the top half of a float32):
 * the low halves (row 0) shifted up and the high halves (row 1) masked. */
static inline void widen(const uint16_t *chunk, vec weights[OUT_BLOCK]) {
    __m512i pairs = _mm512_loadu_si512((const void *)chunk);
    weights[0] = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
    weights[1] = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32((int)0xFFFF0000u)));
}
#else
#define LANES 8
#define ROW_BLOCK 6 /* rows summed in registers together: 6 x 2 accumulators + 2 weights + x < 16 */
typedef __m256 vec;
#define vec_zero _mm256_setzero_ps
#define vec_load _mm256_loadu_ps
#define vec_load_first(p, n) _mm256_loadu_ps(p) /* never called: in is a multiple of 8 */
#define vec_fmadd _mm256_fmadd_ps
#define vec_sum lanes_sum
static inline void widen(const uint16_t *chunk, vec weights[OUT_BLOCK]) {
    __m256i pairs = _mm256_loadu_si256((const __m256i *)chunk);
    weights[0] = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
    weights[1] = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32((int)0xFFFF0000u)));
}
#endif
/* The weights are prefetched 8 KB ahead in the block's stream (PREFETCH bf16 values: best of 512-8192
 * on an AVX2-only CPU) into L2, not L1: every weight line is read once, and in L1 the prefetched
 * lines evicted the rows of x that every chunk reads. On a CPU with AVX-512 (cold weights, 1-8 rows,
 * the models' shapes) L2 made the AVX-512 build 1.2-1.5x faster and the AVX2 build 1.0-1.4x, the
 * distance (8-32 KB) then changing nothing; the AVX2-only CPU was not measured again. */
#define PREFETCH 4096

/* One block of OUT_BLOCK outputs of rows 0 .. NR - 1 (NR a constant where inlined): the block's
 * weights are one contiguous stream, k chunk by k chunk, each chunk its two rows' LANES values paired. */
static inline __attribute__((always_inline)) void block(
    const float *x, int64_t x_stride, int NR, int64_t in, const uint16_t *w_block, vec *sums) {
    vec acc[ROW_BLOCK][OUT_BLOCK];
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < OUT_BLOCK; j++) acc[r][j] = vec_zero();
    for (int64_t k = 0; k < in; k += LANES) {
        const uint16_t *chunk = w_block + k * OUT_BLOCK;
        _mm_prefetch((const char *)(chunk + PREFETCH), _MM_HINT_T1);
        vec weights[OUT_BLOCK];
        widen(chunk, weights);
        for (int r = 0; r < NR; r++) {
            const float *xk = x + r * x_stride + k;
            vec xr = k + LANES <= in ? vec_load(xk) : vec_load_first(xk, in - k);
            /* Held in a register for both FMAs: folded into each as a memory operand (what GCC
             * does unasked), 5 rows make 12 loads a chunk, and on a core with two 256-bit loads
             * a cycle and two FMA pipes the loads set the pace (4-5 rows 18-20% slower in
             * cache). */
            __asm__("" : "+v"(xr));
            for (int j = 0; j < OUT_BLOCK; j++) acc[r][j] = vec_fmadd(xr, weights[j], acc[r][j]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < OUT_BLOCK; j++) sums[r * OUT_BLOCK + j] = acc[r][j];
}

#define ROWS_CASE(n) case n: block(xr, x_stride, n, in, w_block, sums); break;

/* Block b's outputs of every row into y, output o of row r at y[r * y_stride + o - y_first]. */
static void output_block(const float *x, int64_t x_stride, int64_t rows, int64_t in, const uint16_t *w,
                         int64_t out, int64_t b, const float *bias, float *y, int64_t y_stride, int64_t y_first) {
    const uint16_t *w_block = w + b * OUT_BLOCK * ((in + LANES - 1) / LANES * LANES);
    vec sums[ROW_BLOCK * OUT_BLOCK];
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
        int64_t nr = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
        const float *xr = x + r0 * x_stride;
        switch (nr) {
#if ROW_BLOCK > 6
        ROWS_CASE(12) ROWS_CASE(11) ROWS_CASE(10) ROWS_CASE(9) ROWS_CASE(8) ROWS_CASE(7)
#endif
        ROWS_CASE(6) ROWS_CASE(5) ROWS_CASE(4) ROWS_CASE(3) ROWS_CASE(2)
        default: block(xr, x_stride, 1, in, w_block, sums);
        }
        for (int64_t r = 0; r < nr; r++)
            for (int64_t j = 0, o = b * OUT_BLOCK; j < OUT_BLOCK && o < out; j++, o++)
                y[(r0 + r) * y_stride + o - y_first] = vec_sum(sums[r * OUT_BLOCK + j]) + (bias ? bias[o] : 0.0f);
    }
}

/* The product split over a free core and helpers on busy cores (shared_core.h): a piece is
 * PIECE_BLOCKS blocks of outputs (128, as the tile kernel's), of at most SHARED_ROWS rows
 * (bf16_weights.MAX_ROWS). */
#define PIECE_BLOCKS 64
#define SHARED_ROWS 16
#define SHARED_SCRATCH_BYTES (SHARED_ROWS * PIECE_BLOCKS * OUT_BLOCK * 4)
#include "shared_core.h"

typedef struct {
    const float *x, *bias;
    const uint16_t *w;
    float *y;
    int64_t rows, in, out, blocks, y_stride;
} Product;

static void piece_compute(const void *args, int64_t piece, void *scratch) {
    const Product *p = args;
    int64_t first = piece * PIECE_BLOCKS, last = first + PIECE_BLOCKS < p->blocks ? first + PIECE_BLOCKS : p->blocks;
    for (int64_t b = first; b < last; b++)
        output_block(p->x, p->in, p->rows, p->in, p->w, p->out, b, p->bias, scratch, PIECE_BLOCKS * OUT_BLOCK,
                     first * OUT_BLOCK);
}

static void piece_store(const void *args, int64_t piece, const void *scratch) {
    const Product *p = args;
    int64_t first = piece * PIECE_BLOCKS * OUT_BLOCK, end = first + PIECE_BLOCKS * OUT_BLOCK;
    int64_t n = (end < p->out ? end : p->out) - first;
    for (int64_t r = 0; r < p->rows; r++)
        memcpy(p->y + r * p->y_stride + first, (const float *)scratch + r * PIECE_BLOCKS * OUT_BLOCK,
               (size_t)n * sizeof(float));
}

/* y = x w^T + bias, w in the blocked layout (bf16_weights.pack_weight); 0 on success, 1 where the shape is not
 * one the kernel reads. */
int linear_rows(const float *x, int64_t x_stride, int64_t rows, int64_t in, const uint16_t *w, int64_t out,
                const float *bias, float *y, int64_t y_stride) {
    if (in % 8 != 0 || rows < 1 || out < 1) return 1;
    int64_t blocks = (out + OUT_BLOCK - 1) / OUT_BLOCK;
    int64_t pieces = (blocks + PIECE_BLOCKS - 1) / PIECE_BLOCKS;
    if (rows <= SHARED_ROWS && shared_active(pieces)) {
        float *inputs = shared_inputs((size_t)(rows * in) * sizeof(float)); /* a late helper reads this copy */
        if (!inputs) return 1;
        for (int64_t r = 0; r < rows; r++) memcpy(inputs + r * in, x + r * x_stride, (size_t)in * sizeof(float));
        Product product = {inputs, bias, w, y, rows, in, out, blocks, y_stride};
        shared_run(&product, sizeof product, pieces, piece_compute, piece_store);
        return 0;
    }
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) output_block(x, x_stride, rows, in, w, out, b, bias, y, y_stride, 0);
    return 0;
}

/* The inputs of one chunk (pack_weight's layout depends on the build). */
int linear_rows_lanes(void) { return LANES; }
