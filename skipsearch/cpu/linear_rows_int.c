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
 * block of OUT_BLOCK4 = OUT_VECTORS4 LANES outputs (an output a vector lane) [in / 8, OUT_BLOCK4]
 * uint32: lane i of word w holds in nibble j the block's output i's value of input 8 w + j, so one
 * load serves 8 inputs of LANES outputs. params is [blocks, in / group, OUT_BLOCK4] uint32, each lane
 * its output's group's bf16 pair, scale s in the low half and zero z in the high (bf16 values by
 * int_weights.quantize_int4, widened exactly by a shift and a mask); group (32, 64 or 128) divides in.
 * A value stands for (q - 8) s + z; the kernel sums q x per group and enters the group once as
 *   s (sum q x) + (z - 8 s) (sum x),
 * z - 8 s rounded once and sum x the row's (int4_rows): the dequantized product reassociated (the
 * tests' tolerance counts |z| in each weight's magnitude; a column read back alone is
 * q s + (z - 8 s), one rounding from dequantize_int4's). Nibble j is converted where it lies, q 16^j
 * (a mask and a conversion, exact; the top one shifted down), and multiplied by x 16^-j, the rows
 * scaled once per call (exact unless |x| < 2^-102 falls to a subnormal): one FMA a weight and row.
 *
 * Why this layout (the issue "Drafts at lower precision"): a one-row step must stream int4 at the
 * memory's rate, half a byte a weight, so its arithmetic must cost under about 2 cycles per 16
 * weights a core; 512-bit vector work issues on 2 ports. The earlier layout (lanes = inputs, a
 * 16-entry table (q - 8) s + z per group and output, read by vpermps) paid per 16 weights a shift,
 * a permute and an FMA, plus the table (a broadcast, a shift, a mask, a product and a sum) per group
 * and output: 3 + 5 x 16 / group uops, 5.5 at groups of 32, about 2.8 cycles, and each output's lanes
 * summed at the end: arithmetic-bound, well under the memory's rate. With lanes = outputs the group's scale and
 * zero apply to a whole vector of outputs at once (4 uops a group for OUT_BLOCK4 outputs, 2 FMAs and
 * an add per row), no lanes are summed, and 16 weights cost a mask, a conversion and an FMA: 3 uops
 * (vpermps of an iota table for nibble 0 saves one in 24: not measurable), about 1.5 cycles: the
 * floor of float32 products, one FMA per 16 weights and row. Past one row each row adds an FMA
 * per 16 weights whatever the layout, so a few rows' products in float32 cost what bf16's do: what
 * would stream int4 for token trees is integer products (vpdpbusd: 64 weights an instruction), which
 * needs the activations quantized (docs/cpu-backend.md).
 *
 * Every int8 output y[r][o] is one LANES-lane float32 accumulator summed over k in order, then its
 * lanes summed in a fixed order (avx2_lanes.h) and scaled and biased; every int4 one a lane of its
 * block's totals, each group's even and odd nibbles summed in two accumulators over k in order: the
 * same operations whatever the row count, the row's place in its block and the thread, so a verify
 * pass's products are bit for bit the draft steps'. Work is split over OpenMP threads (torch's
 * runtime) by blocks of outputs, or, where the decoding thread engaged helpers on busy cores
 * (shared_core.h, cpu/shared_core.py), into pieces of PIECE_OUTPUTS outputs that the free core and
 * the helpers claim, as linear_rows.c's: the same operations for each output, so the same bits.
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
#define NIBBLES 8 /* int4 values a 32-bit word holds: inputs k0 .. k0 + 7 of one output */
#ifndef OUT_VECTORS4 /* -D for experiments */
#define OUT_VECTORS4 2 /* int4: vectors of outputs streamed together (a block of 2 LANES outputs) */
#endif
#ifndef PREFETCH_BYTES /* -D for experiments */
#define PREFETCH_BYTES 8192 /* linear_rows.c's distance: 8 KB ahead in the block's stream, into L2 */
#endif

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
#define ROW_BLOCK4_WIDE 4 /* 4 x 2 x 3 accumulators and totals, 2 words, 2 weights, x: 31 of 32 */
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
#define vec_set1 _mm512_set1_ps
#define vec_add _mm512_add_ps
#define vec_mul _mm512_mul_ps
#define vec_sub _mm512_sub_ps
#define vec_store _mm512_storeu_ps
#define vec_cvt _mm512_cvtepi32_ps
#define vec_cast _mm512_castsi512_ps
#define ivec_and _mm512_and_si512
#define ivec_srli _mm512_srli_epi32
#define ivec_slli _mm512_slli_epi32
#define ivec_set1 _mm512_set1_epi32
#else
#define LANES 8
/* As the wide build's, of 1-3 (int8) and 1-4 (int4) on the same CPU (the AVX2 build); -D for
 * experiments. */
#ifndef ROW_BLOCK_NARROW
#define ROW_BLOCK_NARROW 2 /* 2 x 4 accumulators + 4 weights + x < 16 */
#endif
#ifndef ROW_BLOCK4_NARROW
#define ROW_BLOCK4_NARROW 2 /* 2 x 2 x 3 accumulators and totals: the rest from L1 */
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
#define vec_set1 _mm256_set1_ps
#define vec_add _mm256_add_ps
#define vec_mul _mm256_mul_ps
#define vec_sub _mm256_sub_ps
#define vec_store _mm256_storeu_ps
#define vec_cvt _mm256_cvtepi32_ps
#define vec_cast _mm256_castsi256_ps
#define ivec_and _mm256_and_si256
#define ivec_srli _mm256_srli_epi32
#define ivec_slli _mm256_slli_epi32
#define ivec_set1 _mm256_set1_epi32
#endif

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

/* One product's arguments, for either kernel (x, or int4's scaled rows and group sums, in the shared
 * inputs buffer, which a helper late for the piece may still read). */
typedef struct {
    const float *x, *bias, *scale, *xsums;
    const void *w;
    const uint32_t *params;
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
        Product product = {inputs, bias, scale, NULL, w, NULL, y, rows, in, out, blocks, y_stride, 0};
        shared_run(&product, sizeof product, pieces, piece_compute8, piece_store);
        return 0;
    }
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++)
        output_block8(x, x_stride, rows, in, w, scale, out, b, bias, y, y_stride, 0);
    return 0;
}

/* ---- int4 ---- */

#define OUT_BLOCK4 (OUT_VECTORS4 * LANES)          /* outputs of one int4 block, one per lane */
#define PIECE_BLOCKS4 (PIECE_OUTPUTS / OUT_BLOCK4) /* a shared piece: the int8 kernel's outputs */

/* Nibble j of each lane's word as float32, exactly: q 16^j where it lies (a mask and a conversion), the
 * top one shifted down (its place is the sign bit). */
#define INT4_LEVEL(words, j)                                                                                \
    ((j) == NIBBLES - 1 ? vec_cvt(ivec_srli((words), 4 * (NIBBLES - 1)))                                   \
                        : vec_cvt(ivec_and((words), ivec_set1((int)(0xFu << 4 * (j))))))

/* What the rows' input k is scaled by where k % 8 = j, to match INT4_LEVEL: 16^-j, 1 for the top one. */
static const float int4_factors[NIBBLES] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};

/* One block of OUT_BLOCK4 outputs (a lane each) of rows 0 .. NR - 1: per group, the sums of q x in two
 * accumulators (even and odd nibbles: a one-row step's FMAs in 2 OUT_VECTORS4 chains), then into the
 * totals as total = fma(X, z - 8 s, fma(acc0 + acc1, s, total)), X the group's sum of the row's x.
 * xs: the rows scaled by int4_factors, `in` floats apart; xsums: per row, its groups' sums. */
static inline __attribute__((always_inline)) void block4(
    const float *xs, const float *xsums, int NR, int64_t in, int group_shift, const uint32_t *w_block,
    const uint32_t *p_block, vec *sums) {
    const int64_t groups = in >> group_shift, group_words = ((int64_t)1 << group_shift) / NIBBLES;
    vec total[ROW_BLOCK4][OUT_VECTORS4];
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < OUT_VECTORS4; v++) total[r][v] = vec_zero();
    for (int64_t g = 0; g < groups; g++) {
        vec acc[ROW_BLOCK4][2][OUT_VECTORS4];
        for (int r = 0; r < NR; r++)
            for (int v = 0; v < OUT_VECTORS4; v++) acc[r][0][v] = acc[r][1][v] = vec_zero();
        for (int64_t w = g * group_words; w < (g + 1) * group_words; w++) {
            const uint32_t *chunk = w_block + w * OUT_BLOCK4;
            for (int line = 0; line < OUT_BLOCK4 * 4; line += 64)
                _mm_prefetch((const char *)chunk + line + PREFETCH_BYTES, _MM_HINT_T1);
            ivec words[OUT_VECTORS4];
            for (int v = 0; v < OUT_VECTORS4; v++) words[v] = ivec_load(chunk + v * LANES);
            const float *xk = xs + w * NIBBLES;
#pragma GCC unroll 8
            for (int j = 0; j < NIBBLES; j++) {
                vec weights[OUT_VECTORS4];
                for (int v = 0; v < OUT_VECTORS4; v++) weights[v] = INT4_LEVEL(words[v], j);
                for (int r = 0; r < NR; r++) {
                    vec xr = vec_set1(xk[r * in + j]);
                    for (int v = 0; v < OUT_VECTORS4; v++)
                        acc[r][j & 1][v] = vec_fmadd(xr, weights[v], acc[r][j & 1][v]);
                }
            }
        }
        const uint32_t *pairs = p_block + g * OUT_BLOCK4; /* each lane's (scale, zero) bf16 pair */
        for (int v = 0; v < OUT_VECTORS4; v++) {
            ivec pair = ivec_load(pairs + v * LANES);
            vec scale = vec_cast(ivec_slli(pair, 16));
            vec zero = vec_cast(ivec_and(pair, ivec_set1((int)0xFFFF0000u)));
            zero = vec_sub(zero, vec_mul(vec_set1(8.0f), scale)); /* z - 8 s, one rounding */
            for (int r = 0; r < NR; r++) {
                vec xsum = vec_set1(xsums[r * groups + g]);
                vec qx = vec_add(acc[r][0][v], acc[r][1][v]);
                total[r][v] = vec_fmadd(xsum, zero, vec_fmadd(qx, scale, total[r][v]));
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < OUT_VECTORS4; v++) sums[r * OUT_VECTORS4 + v] = total[r][v];
}

#define ROWS_CASE4(n) case n: block4(xr, sr, n, in, group_shift, w_block, p_block, sums); break;

/* Block b's outputs of every row into y, output o of row r at y[r * y_stride + o - y_first]. */
static void output_block4(const float *xs, const float *xsums, int64_t rows, int64_t in, const uint32_t *w,
                          const uint32_t *params, int64_t group, int64_t out, int64_t b, const float *bias,
                          float *y, int64_t y_stride, int64_t y_first) {
    const uint32_t *w_block = w + b * OUT_BLOCK4 * (in / NIBBLES);
    const uint32_t *p_block = params + b * OUT_BLOCK4 * (in / group);
    int group_shift = group == 32 ? 5 : group == 64 ? 6 : 7;
    int64_t first = b * OUT_BLOCK4, n = out - first < OUT_BLOCK4 ? out - first : OUT_BLOCK4;
    vec sums[ROW_BLOCK4 * OUT_VECTORS4];
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK4) {
        int64_t nr = rows - r0 < ROW_BLOCK4 ? rows - r0 : ROW_BLOCK4;
        const float *xr = xs + r0 * in, *sr = xsums + r0 * (in / group);
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
#if ROW_BLOCK4 >= 2
        ROWS_CASE4(2)
#endif
        default: block4(xr, sr, 1, in, group_shift, w_block, p_block, sums);
        }
        for (int64_t r = 0; r < nr; r++) {
            float *yr = y + (r0 + r) * y_stride + first - y_first;
            if (n == OUT_BLOCK4) {
                for (int v = 0; v < OUT_VECTORS4; v++) {
                    vec s = sums[r * OUT_VECTORS4 + v];
                    vec_store(yr + v * LANES, bias ? vec_add(s, vec_load(bias + first + v * LANES)) : s);
                }
            } else { /* the last block, past out */
                float lanes[OUT_BLOCK4];
                for (int v = 0; v < OUT_VECTORS4; v++) vec_store(lanes + v * LANES, sums[r * OUT_VECTORS4 + v]);
                for (int64_t i = 0; i < n; i++) yr[i] = bias ? lanes[i] + bias[first + i] : lanes[i];
            }
        }
    }
}

static void piece_compute4(const void *args, int64_t piece, void *scratch) {
    const Product *p = args;
    int64_t first = piece * PIECE_BLOCKS4;
    int64_t last = first + PIECE_BLOCKS4 < p->blocks ? first + PIECE_BLOCKS4 : p->blocks;
    for (int64_t b = first; b < last; b++)
        output_block4(p->x, p->xsums, p->rows, p->in, p->w, p->params, p->group, p->out, b, p->bias, scratch,
                      PIECE_OUTPUTS, first * OUT_BLOCK4);
}

/* Each row scaled by int4_factors into `xs` (rows x in) and its groups' sums (LANES-lane partial sums
 * in order, then the lanes in a fixed order) into `xsums` (rows x in / group): a row's the same whatever
 * the rows beside it. */
static void int4_rows(const float *x, int64_t x_stride, int64_t rows, int64_t in, int64_t group, float *xs,
                      float *xsums) {
    int64_t groups = in / group;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * x_stride;
        for (int64_t k = 0; k < in; k += NIBBLES)
            for (int j = 0; j < NIBBLES; j++) xs[r * in + k + j] = row[k + j] * int4_factors[j];
        for (int64_t g = 0; g < groups; g++) {
            vec sum = vec_zero();
            for (int64_t k = g * group; k < (g + 1) * group; k += LANES) sum = vec_add(sum, vec_load(row + k));
            xsums[r * groups + g] = vec_sum(sum);
        }
    }
}

/* y = x w^T + bias, w the int4 values of pack_int4's layout with their groups' params; 0 on success, 1
 * where the shape is not one the kernel reads (group not 32, 64 or 128, or not dividing in). */
int linear_rows_int4(const float *x, int64_t x_stride, int64_t rows, int64_t in, const uint32_t *w,
                     const uint32_t *params, int64_t group, int64_t out, const float *bias, float *y,
                     int64_t y_stride) {
    if ((group != 32 && group != 64 && group != 128) || in % group != 0 || rows < 1 || out < 1) return 1;
    int64_t blocks = (out + OUT_BLOCK4 - 1) / OUT_BLOCK4, pieces = (blocks + PIECE_BLOCKS4 - 1) / PIECE_BLOCKS4;
    size_t bytes = (size_t)(rows * (in + in / group)) * sizeof(float);
    if (rows <= SHARED_ROWS && shared_active(pieces)) {
        float *inputs = shared_inputs(bytes);
        if (!inputs) return 1;
        int4_rows(x, x_stride, rows, in, group, inputs, inputs + rows * in);
        const float *sums = inputs + rows * in;
        Product product = {inputs, bias, NULL, sums, w, params, y, rows, in, out, blocks, y_stride, group};
        shared_run(&product, sizeof product, pieces, piece_compute4, piece_store);
        return 0;
    }
    float *xs = malloc(bytes);
    if (!xs) return 1;
    float *xsums = xs + rows * in;
    int4_rows(x, x_stride, rows, in, group, xs, xsums);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++)
        output_block4(xs, xsums, rows, in, w, params, group, out, b, bias, y, y_stride, 0);
    free(xs);
    return 0;
}

/* The lanes of one int8 chunk and of one int4 block's vectors (both layouts depend on the build). */
int linear_rows_int_lanes(void) { return LANES; }
