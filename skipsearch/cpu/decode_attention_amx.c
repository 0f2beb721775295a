/* Attention of a short query block of float32 activations over a bf16 K/V cache on AMX tiles, for
 * CPUs with AMX-BF16: the decode-attention kernel of the fp32 plan where it measures faster than
 * decode_attention_fp32.c (skipsearch/cpu/decode_attention.py builds and loads it,
 * skipsearch/cpu/attention_choice.py weighs it; docs/cpu-backend.md).
 *
 * Why it exists: decode_attention_fp32.c pays one FMA per key, dimension and row, so each query a
 * verify adds costs nearly what the first did: on a CPU with AMX SmolLM2's attention over 512
 * keys took 2.3x one query's time at five (docs/cpu-backend.md), 0.13 of a decode
 * step in f(4). A tile product scores 16 keys against up to 16 rows in one instruction, and weighs
 * 32 keys' values for them in another, so the rows of a verify (a K/V head's query heads times its
 * positions) cost about what one row costs. The price is precision: AMX multiplies bf16 pairs, so
 * the queries, keys, values and softmax weights are rounded to bf16 (nearest even) before their
 * products; the sums, the softmax and the output are float32, and the denominator sums the rounded
 * weights, the ones the values are weighed by. Since the keys and values would be rounded anyway,
 * the plan keeps them in bf16 (the C driver and the cache round them as torch does): the same
 * values in half the bytes, which is what a one-query step streams. Over a float32 cache, rounding
 * as it read, this kernel streamed a step's caches at 18-20 GB/s, slower than the AVX2 kernel's
 * 20-24 (one query at 2k-8k keys, SmolLM2's heads); over the bf16 cache it takes 0.74x the AVX2
 * kernel's time at 8k keys.
 *
 * Layout, visibility and the result are decode_attention_fp32.c's but for the cache's dtype (the
 * same signature otherwise, so the fused layers' C driver calls either): query head `head`,
 * position i at `q + head * q_head_stride + i * q_row_stride` (float32); K/V head h, position n at
 * `h * kv_stride + n * dim` (bf16); the output [queries][heads][dim] (float32); the
 * `heads / kv_heads` query heads of a K/V head are its rows, row r being query r % queries at
 * position length - queries + r % queries, which sees the keys n <= its position with n < sink or
 * n > position - window (window <= 0: every key).
 *
 * Work is split over OpenMP threads by the key chunks of decode_attention_keys.h, merged in order by
 * decode_attention_merge.h. Within a chunk, a block of up to 16 rows is scored against every key
 * first (S^T = K Q^T: the keys are the tile's rows, read as they lie in the cache; each row's scores
 * are one lane of a vector, so the softmax needs no horizontal sums), then weighs the values
 * (O = P V). Every score and output element is one tile element, accumulated over its own products
 * in a fixed order; a key a row does not see weighs exactly 0; tiles start at fixed key positions.
 * So a row's output does not depend on which rows share its block or the call, and a verify's
 * attention is bit for bit what single decode steps compute on this kernel (tested).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_tiles.h"
#include "avx512_exp.h"
#include "avx512_transpose.h"
#include "decode_attention_keys.h"
#include "decode_attention_merge.h"

#define BLOCK 16                  /* rows of one block: a scores tile's columns, an output tile's rows */
#define KEYS 16                   /* keys of one scores tile (its rows) */
#define PAIRS 16                  /* key pairs of one weights tile: 32 keys */
#define GROUP (2 * PAIRS)         /* keys weighed by one tile product */
#define SPAN LARGE_CHUNK          /* most keys scored before they are weighed: one chunk */
#define MAX_DIM 256
#define OUT_TILES 4               /* output tiles at a time: 64 dimensions */
/* Tiles 0-3: the block's outputs (64 dimensions); the scores; the left and right operands (the
 * tile intrinsics take the register's number as written). */
#define SCORES 4
#define LEFT 5
#define RIGHT 6

/* Every tile 16 rows of 64 bytes; operands shorter than that are zero-padded in memory. */
static void configure(void) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* 32 floats rounded to bf16 (nearest even), in order, as 16 32-bit pairs. */
static inline __m512i round_pairs(const float *x) {
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
}

/* 16 bf16 values, each in the low half of a 32-bit lane. */
static inline __m512i widen(const uint16_t *x) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)x));
}

/* Lane r: (even lane r, odd lane r) rounded to bf16, as one 32-bit pair. */
static inline __m512i interleave_pairs(__m512 even, __m512 odd) {
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                           22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(odd, even));
}

/* The block's queries as the right operand of S^T = K Q^T, one tile per 32 dimensions:
 * `qt[c * 256 + p * 16 + r]` is dimension pair p of chunk c of row r (zero past `count` rows). */
static void turn_queries(const float *const *row, int64_t count, int64_t dim, uint32_t *qt) {
    for (int64_t c = 0; c < dim / 32; c++) {
        __m512i pairs[16];
        for (int r = 0; r < 16; r++) pairs[r] = r < count ? round_pairs(row[r] + 32 * c) : _mm512_setzero_si512();
        transpose16(pairs);
        for (int p = 0; p < 16; p++) _mm512_store_si512((void *)(qt + c * 256 + p * 16), pairs[p]);
    }
}

/* A block: its turned queries, its first row in the head's rows, how many. */
typedef struct {
    const uint32_t *qt;
    int64_t first_row, count;
} Block;

/* Scores (S^T, unscaled) of the block's rows against the keys [start, stop) (multiples of KEYS), into
 * `scores[n - start]` (lane r: row r); keys outside [first, end) are zero rows, masked later (the
 * cache past `end` may hold anything). Each tile's keys are copied into an L1 buffer just before
 * their product: staging a whole span first and scoring it after made a one-query step's attention
 * 1.2-1.3x slower (the span falls out of L1). */
static void score_keys(const Block *b, const uint16_t *k, int64_t dim, int64_t start, int64_t stop, int64_t first,
                       int64_t end, float (*scores)[BLOCK]) {
    uint16_t keys[KEYS * MAX_DIM] __attribute__((aligned(64)));
    for (int64_t at = start; at < stop; at += KEYS) {
        for (int64_t n = 0; n < KEYS; n++) {
            uint16_t *row = keys + n * dim;
            if (at + n < first || at + n >= end)
                memset(row, 0, 2 * dim);
            else
                memcpy(row, k + (at + n) * dim, 2 * dim);
        }
        _tile_zero(SCORES);
        for (int64_t c = 0; c < dim / 32; c++) {
            _tile_loadd(LEFT, keys + 32 * c, 2 * dim);
            _tile_loadd(RIGHT, b->qt + c * 256, 64);
            _tile_dpbf16ps(SCORES, LEFT, RIGHT);
        }
        _tile_stored(SCORES, scores[at - start], 64);
    }
}

/* O[r] += sum over the keys [start, stop) (multiples of GROUP) of weight[r][n] * V[n], the weights
 * turned into the left operand (`weights[g]`: group g's rows x 16 pairs), the block's unnormalised
 * outputs in `o` (16 rows of `dim` floats); values outside [first, end) are zeros. Each group's
 * values are paired into an L1 buffer just before their products, as the keys are. */
static void weigh_values(const uint16_t *v, int64_t dim, int64_t start, int64_t stop, int64_t first, int64_t end,
                         const uint32_t (*weights)[BLOCK * PAIRS], float *o) {
    uint32_t values[OUT_TILES][PAIRS * 16] __attribute__((aligned(64)));
    for (int64_t d0 = 0; d0 < dim; d0 += 16 * OUT_TILES) {
        int tiles = (int)((dim - d0) / 16 < OUT_TILES ? (dim - d0) / 16 : OUT_TILES);
        if (tiles > 0) _tile_loadd(0, o + d0, 4 * dim);
        if (tiles > 1) _tile_loadd(1, o + d0 + 16, 4 * dim);
        if (tiles > 2) _tile_loadd(2, o + d0 + 32, 4 * dim);
        if (tiles > 3) _tile_loadd(3, o + d0 + 48, 4 * dim);
        for (int64_t at = start; at < stop; at += GROUP) {
            for (int j = 0; j < PAIRS; j++) {
                int64_t even = at + 2 * j, odd = even + 1;
                int see_even = even >= first && even < end, see_odd = odd >= first && odd < end;
                for (int t = 0; t < tiles; t++) {
                    __m512i a = see_even ? widen(v + even * dim + d0 + 16 * t) : _mm512_setzero_si512();
                    __m512i b = see_odd ? widen(v + odd * dim + d0 + 16 * t) : _mm512_setzero_si512();
                    _mm512_store_si512((void *)(values[t] + j * 16), _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
                }
            }
            _tile_loadd(LEFT, weights[(at - start) / GROUP], 64);
            if (tiles > 0) { _tile_loadd(RIGHT, values[0], 64); _tile_dpbf16ps(0, LEFT, RIGHT); }
            if (tiles > 1) { _tile_loadd(RIGHT, values[1], 64); _tile_dpbf16ps(1, LEFT, RIGHT); }
            if (tiles > 2) { _tile_loadd(RIGHT, values[2], 64); _tile_dpbf16ps(2, LEFT, RIGHT); }
            if (tiles > 3) { _tile_loadd(RIGHT, values[3], 64); _tile_dpbf16ps(3, LEFT, RIGHT); }
        }
        if (tiles > 0) _tile_stored(0, o + d0, 4 * dim);
        if (tiles > 1) _tile_stored(1, o + d0 + 16, 4 * dim);
        if (tiles > 2) _tile_stored(2, o + d0 + 32, 4 * dim);
        if (tiles > 3) _tile_stored(3, o + d0 + 48, 4 * dim);
    }
}

/* The block's rows attend to the keys [begin, end) (within one SPAN-aligned span): their running
 * max `m`, denominator `l` and unnormalised outputs `acc` (the block's, from its first row) are
 * updated. With `scores` (the head group's [group][length] floats), query 0's scaled scores are
 * copied out (a verify's pillar choice). */
static void attend_block(const Block *b, const uint16_t *k, const uint16_t *v, int64_t dim, int64_t begin, int64_t end,
                         const Visibility *vis, float scale, float *m, float *l, float *acc, float *scores) {
    float s[SPAN][BLOCK] __attribute__((aligned(64)));
    uint32_t weights[SPAN / GROUP][BLOCK * PAIRS] __attribute__((aligned(64)));
    float o[BLOCK * MAX_DIM] __attribute__((aligned(64)));
    int64_t start = begin / GROUP * GROUP, stop = (end + GROUP - 1) / GROUP * GROUP;
    score_keys(b, k, dim, start, stop, begin, end, s);

    /* which keys each lane sees (lanes past the block's rows see none), and the scores scaled; a key
     * every row sees, as most are, skips the per-lane tests */
    const __mmask16 block_rows = (__mmask16)((1u << b->count) - 1);
    int32_t position[BLOCK], nearest = INT32_MAX, farthest = -1;
    for (int r = 0; r < BLOCK; r++) {
        position[r] = r < b->count ? (int32_t)(vis->length - vis->queries + (b->first_row + r) % vis->queries) : -1;
        if (r < b->count) nearest = position[r] < nearest ? position[r] : nearest, farthest = position[r] > farthest ? position[r] : farthest;
    }
    const __m512i at = _mm512_loadu_si512(position);
    const __m512i window_start = _mm512_sub_epi32(at, _mm512_set1_epi32((int32_t)vis->window));
    __m512 highest = _mm512_set1_ps(-INFINITY);
    __mmask16 seen[SPAN];
    for (int64_t n = start; n < stop; n++) {
        __mmask16 sees;
        int windowed = vis->window > 0 && n >= vis->sink;
        if (n < begin || n >= end)
            sees = 0;
        else if (n <= nearest && (!windowed || n > farthest - vis->window))
            sees = block_rows;
        else {
            __m512i key = _mm512_set1_epi32((int32_t)n);
            sees = _mm512_cmple_epi32_mask(key, at);
            if (windowed) sees &= _mm512_cmpgt_epi32_mask(key, window_start);
        }
        seen[n - start] = sees;
        __m512 scaled = _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), sees, _mm512_load_ps(s[n - start]), _mm512_set1_ps(scale));
        _mm512_store_ps(s[n - start], scaled);
        highest = _mm512_max_ps(highest, scaled);
    }
    if (scores)
        for (int r = 0; r < b->count; r++)
            if ((b->first_row + r) % vis->queries == 0)
                for (int64_t n = begin; n < end; n++)
                    scores[(b->first_row + r) / vis->queries * vis->length + n] = s[n - start][r];

    /* the running max moves to the span's: rescale what earlier spans left (a row seeing nothing keeps -inf) */
    __m512 before = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), block_rows, m);
    __m512 fresh = _mm512_max_ps(before, highest);
    __mmask16 moved = _mm512_cmp_ps_mask(before, fresh, _CMP_NEQ_OQ) & _mm512_cmp_ps_mask(before, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    __m512 shrink = _mm512_mask_blend_ps(moved, _mm512_set1_ps(1.0f), exp_nonpositive(_mm512_sub_ps(before, fresh)));
    float factor[BLOCK] __attribute__((aligned(64)));
    _mm512_store_ps(factor, shrink);
    __m512 total = _mm512_mul_ps(_mm512_maskz_loadu_ps(block_rows, l), shrink);
    memset(o, 0, sizeof(float) * BLOCK * dim);
    for (int r = 0; r < b->count; r++)
        for (int64_t d = 0; d < dim; d++) o[r * dim + d] = acc[r * dim + d] * factor[r];
    _mm512_mask_storeu_ps(m, block_rows, fresh);

    /* the weights, rounded to bf16 as they are multiplied and summed so, turned into tile rows */
    for (int64_t g = start; g < stop; g += GROUP) {
        __m512i pairs[PAIRS];
        for (int j = 0; j < PAIRS; j++) {
            int64_t even = g + 2 * j - start;
            __m512 pe = _mm512_maskz_mov_ps(seen[even], exp_nonpositive(_mm512_sub_ps(_mm512_load_ps(s[even]), fresh)));
            __m512 po = _mm512_maskz_mov_ps(seen[even + 1], exp_nonpositive(_mm512_sub_ps(_mm512_load_ps(s[even + 1]), fresh)));
            pairs[j] = interleave_pairs(pe, po);
            total = _mm512_add_ps(total, _mm512_castsi512_ps(_mm512_slli_epi32(pairs[j], 16)));
            total = _mm512_add_ps(total, _mm512_castsi512_ps(_mm512_and_si512(pairs[j], _mm512_set1_epi32((int32_t)0xFFFF0000))));
        }
        transpose16(pairs);
        for (int r = 0; r < BLOCK; r++) _mm512_store_si512((void *)(weights[(g - start) / GROUP] + r * PAIRS), pairs[r]);
    }
    _mm512_mask_storeu_ps(l, block_rows, total);
    weigh_values(v, dim, start, stop, begin, end, (const uint32_t(*)[BLOCK * PAIRS])weights, o);
    memcpy(acc, o, sizeof(float) * b->count * dim);
}

/* The blocks of a K/V head's rows attend to the keys [begin, end), in spans that do not cross a
 * multiple of SPAN (a chunk is one span). */
static void attend(const Block *blocks, int64_t count, const uint16_t *k, const uint16_t *v, int64_t dim, int64_t begin,
                   int64_t end, const Visibility *vis, float scale, float *m, float *l, float *acc, float *scores) {
    for (int64_t from = begin; from < end;) {
        int64_t to = (from / SPAN + 1) * SPAN < end ? (from / SPAN + 1) * SPAN : end;
        for (int64_t b = 0; b < count; b++) {
            int64_t r = blocks[b].first_row;
            attend_block(blocks + b, k, v, dim, from, to, vis, scale, m + r, l + r, acc + r * dim, scores);
        }
        from = to;
    }
}

/* Whether Linux lends this process the tile state (native_attention.load_amx_kernel asks first). */
int decode_attention_amx_ready(void) { return amx_ready(); }

/* Attention output of `heads` query heads of `queries` positions over a bf16 K/V cache of
 * `length` positions (`kv_heads` heads, head h at k + h * kv_stride, rows of `dim`), plus `extra`
 * keys per K/V head that every query sees (`extra_k`/`extra_v`, [kv_heads][extra][dim]: a draft's
 * pillars, bf16 too), written to `out` [queries][heads][dim]. With `scores` ([heads][length] floats,
 * filled with -inf by the caller), query 0's scaled scores of the cache's keys it sees are written
 * there too. Returns 0, or -1 when the shape is outside what the kernel handles (dim not a multiple
 * of 32 up to MAX_DIM, heads not a multiple of kv_heads), memory runs out, or the process may not
 * use the tiles, or a token tree's bits are given (`tree`: the float32 kernel reads them).
 * decode_attention_fp32.c's results, to bf16 rounding. */
int decode_attention_amx(const float *q, int64_t q_head_stride, int64_t q_row_stride, const uint16_t *k,
                         const uint16_t *v, int64_t kv_stride, float *out, int64_t heads, int64_t kv_heads,
                         int64_t queries, int64_t dim, int64_t length, int64_t sink, int64_t window, float scale,
                         const uint16_t *extra_k, const uint16_t *extra_v, int64_t extra, float *scores,
                         const uint32_t *tree, int64_t tree_base) {
    if (dim % 32 != 0 || dim > MAX_DIM || kv_heads < 1 || heads % kv_heads != 0 || queries < 1 || extra < 0 ||
        !amx_ready())
        return -1;
    int64_t group = heads / kv_heads, rows = group * queries, blocks = (rows + BLOCK - 1) / BLOCK;
    Keys keys;
    if (tree) return -1; /* token trees run on the float32 kernel (decode_attention_keys.h) */
    (void)tree_base;
    int planned = plan_keys(&keys, length, queries, sink, window, extra, NULL, 0);
    int64_t units = keys.units, chunks = keys.chunks;
    int64_t stride = rows * (dim + 2); /* per unit and head: m, l, acc */
    int64_t turned = dim / 32 * 256; /* uint32s of one block's turned queries */
    float *partial = malloc(sizeof(float) * (units ? units : 1) * kv_heads * stride);
    uint32_t *qt = aligned_alloc(64, sizeof(uint32_t) * kv_heads * blocks * turned);
    Block *block = malloc(sizeof(Block) * kv_heads * blocks); /* [kv_heads][blocks] */
    if (planned || !partial || !qt || !block) {
        free(keys.chunk), free(partial), free(qt), free(block);
        return -1;
    }
    for (int64_t h = 0; h < kv_heads; h++)
        for (int64_t b = 0; b < blocks; b++) {
            const float *row[BLOCK];
            int64_t in_block = rows - b * BLOCK < BLOCK ? rows - b * BLOCK : BLOCK;
            for (int64_t r = 0; r < in_block; r++) {
                int64_t at = b * BLOCK + r;
                row[r] = q + (h * group + at / queries) * q_head_stride + at % queries * q_row_stride;
            }
            turn_queries(row, in_block, dim, qt + (h * blocks + b) * turned);
            block[h * blocks + b] = (Block){qt + (h * blocks + b) * turned, b * BLOCK, in_block};
        }
    Schedule caller = schedule_units(units * kv_heads);
#pragma omp parallel if (units * kv_heads > 1)
    {
        configure();
#pragma omp for schedule(runtime)
        for (int64_t unit = 0; unit < units * kv_heads; unit++) {
            int64_t c = unit / kv_heads, h = unit % kv_heads;
            float *base = empty_unit(partial, unit, stride, rows, dim);
            float *m = base, *l = base + rows, *acc = base + 2 * rows;
            const Block *head = block + h * blocks;
            if (c == chunks) {
                attend(head, blocks, extra_k + h * extra * dim, extra_v + h * extra * dim, dim, 0, extra,
                       &keys.everything, scale, m, l, acc, NULL);
                continue;
            }
            float *head_scores = scores ? scores + h * group * length : NULL;
            for (int range = 0; range < keys.count; range++) {
                int64_t begin, end;
                if (chunk_in_range(keys.chunk[c], keys.ranges[range], &begin, &end))
                    attend(head, blocks, k + h * kv_stride, v + h * kv_stride, dim, begin, end, &keys.vis, scale, m, l,
                           acc, head_scores);
            }
        }
        _tile_release();
    }
    omp_set_schedule(caller.kind, caller.chunk);
    merge_rows(partial, units, kv_heads, stride, rows, queries, heads, dim, out);
    free(keys.chunk), free(partial), free(qt), free(block);
    return 0;
}
