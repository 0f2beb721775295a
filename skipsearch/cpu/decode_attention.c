/* Attention of a short query block over a bf16 K/V cache, in float32 arithmetic, for CPUs with
 * AVX-512 and AVX-512 BF16 (skipsearch/cpu/decode_attention.py builds and loads it;
 * docs/cpu-backend.md).
 *
 * Why it exists: a decode step, a draft step and a verify pass attend with 1 to ~16 queries to
 * the whole cache, which makes attention a stream over the K/V: it should run at the memory's
 * bandwidth. torch's CPU SDPA reads an fp32 cache at 10-16 GB/s against the 39 GB/s a copy reaches
 * on a CPU with AVX-512 BF16, and its bf16 path is 8x slower still (docs/cpu-backend.md).
 * K and V come out of bf16 projections, so a bf16 cache holds them exactly; this kernel reads it,
 * half the bytes of an fp32 cache, and computes as float32 attention does: query-key products of
 * bf16 values are exact in float32 and VDPBF16PS sums them in float32; the softmax and the
 * weighted sum of values (widened to float32) are float32. Only the summation order differs.
 *
 * Layout: query head `head`, position i at `q + head * q_head_stride + i * q_row_stride` (bf16);
 * K/V head h, position n at `h * kv_stride + n * dim` (bf16); the output [queries][heads][dim]
 * (bf16, what the output projection reads). The `heads / kv_heads` query heads of a K/V head
 * share its reads: their queries are the head's rows, row r being query r % queries. Query i sits
 * at position length - queries + i and sees the keys n <= its position with n < sink or
 * n > position - window (window <= 0: every key): a decode step, a causal verify block, or a
 * draft step's sink + window pattern.
 *
 * Work is split over OpenMP threads by key chunks (flash-decoding): each chunk keeps, per row, the
 * running maximum, the softmax denominator and the weighted sum of values (an online softmax over
 * tiles of TILE keys), and the chunks are merged at the end, in order. Chunks and tiles start at
 * fixed key positions whatever the cache length, and a key a query does not see adds exact zeros,
 * so a query's output does not depend on how many queries share the call: a verify pass's
 * attention is bit for bit what single decode steps compute (oneDNN's products are not always so:
 * the lossless check's tolerance covers them). Each tile is read from memory once:
 * its keys turned so that one vector holds 16 keys' products with a query (no horizontal sums),
 * its values widened to float32, both then read from L1 by every block of rows. The OpenMP runtime
 * is torch's own (the library is loaded after torch, whose libgomp.so.1 then answers for this
 * one), so the threads torch was given apply here too.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx512_exp.h"
#include "avx512_transpose.h"
#include "decode_attention_keys.h"

#define TILE 64        /* keys scored, weighted and summed together: 64 x dim bf16 stays in L1 */
#define ROW_BLOCK 6    /* rows whose outputs are summed in registers together (6 x 4 vectors at 64) */
#define MAX_DIM 256    /* 16 vectors of 16 floats */

static inline __m512 widen(const uint16_t *bits) {
    __m256i half = _mm256_loadu_si256((const __m256i *)bits);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* A tile's keys [start, start + width) turned so that a query scores 16 keys in one vector:
 * `turned[g * words + w]` holds, in lane j, the w-th pair of bf16 elements of key 16 g + j (keys
 * past `width` are zero). Done once per tile for every row of the head. */
static void turn_tile(const uint16_t *k, int64_t words, int64_t start, int64_t width, __m512i *turned) {
    const uint32_t *keys = (const uint32_t *)k;
    for (int64_t g = 0; g * 16 < width; g++)
        for (int64_t w0 = 0; w0 < words; w0 += 16) {
            __m512i r[16];
            for (int64_t j = 0; j < 16; j++)
                r[j] = 16 * g + j < width ? _mm512_loadu_si512(keys + (start + 16 * g + j) * words + w0)
                                          : _mm512_setzero_si512();
            transpose16(r);
            for (int64_t w = 0; w < 16; w++) turned[g * words + w0 + w] = r[w];
        }
}

/* Scaled scores of one query row (`words` pairs of bf16) against a turned tile of `width` keys
 * from `start`, -inf where the row's query does not see the key. bf16 products are exact in
 * float32 and VDPBF16PS accumulates them in float32, so this is float32 attention's dot product. */
static void score_row(const uint32_t *query, const __m512i *turned, int64_t words, int64_t start,
                      int64_t width, int64_t position, const Visibility *vis, float scale, float *scores) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int64_t t = 0; t < width; t += 16) {
        const __m512i *group = turned + (t / 16) * words;
        __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();
        for (int64_t w = 0; w < words; w += 2) {
            even = _mm512_dpbf16_ps(even, (__m512bh)_mm512_set1_epi32((int32_t)query[w]), (__m512bh)group[w]);
            odd = _mm512_dpbf16_ps(odd, (__m512bh)_mm512_set1_epi32((int32_t)query[w + 1]), (__m512bh)group[w + 1]);
        }
        __m512i index = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(start + t)), lane);
        __mmask16 seen = _mm512_cmple_epi32_mask(index, _mm512_set1_epi32((int32_t)position));
        if (vis->window > 0)
            seen &= _mm512_cmplt_epi32_mask(index, _mm512_set1_epi32((int32_t)vis->sink)) |
                    _mm512_cmpgt_epi32_mask(index, _mm512_set1_epi32((int32_t)(position - vis->window)));
        seen &= width - t >= 16 ? 0xFFFF : (__mmask16)((1u << (width - t)) - 1);
        __m512 sum = _mm512_add_ps(even, odd);
        _mm512_storeu_ps(scores + t, _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), seen, sum, _mm512_set1_ps(scale)));
    }
    for (int64_t t = (width + 15) / 16 * 16; t < TILE; t += 16) _mm512_storeu_ps(scores + t, _mm512_set1_ps(-INFINITY));
}

/* Softmax weights of one row's tile of scores, in place (0 past `width`): the row's running max
 * `m` and denominator `l` move to the tile's max, and its accumulated output `acc` is rescaled. */
static void weigh_row(float *scores, int64_t width, int64_t dim, float *m, float *l, float *acc) {
    __m512 highest = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < width; t += 16) highest = _mm512_max_ps(highest, _mm512_loadu_ps(scores + t));
    float top = _mm512_reduce_max_ps(highest); /* past `width` the scores are -inf */
    if (top == -INFINITY) {  /* the row sees no key of this tile */
        memset(scores, 0, sizeof(float) * TILE);
        return;
    }
    float fresh = top > *m ? top : *m;
    float shrink = *m == -INFINITY ? 0.0f : expf(*m - fresh);
    *m = fresh;
    *l *= shrink;
    for (int64_t j = 0; j < dim; j += 16)
        _mm512_storeu_ps(acc + j, _mm512_mul_ps(_mm512_loadu_ps(acc + j), _mm512_set1_ps(shrink)));
    __m512 total = _mm512_setzero_ps();
    for (int64_t t = 0; t < TILE; t += 16) {
        __m512 s = _mm512_loadu_ps(scores + t);
        __mmask16 seen = _mm512_cmp_ps_mask(s, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        seen &= t < width ? (width - t >= 16 ? 0xFFFF : (__mmask16)((1u << (width - t)) - 1)) : 0;
        __m512 p = _mm512_maskz_mov_ps(seen, exp_nonpositive(_mm512_sub_ps(s, _mm512_set1_ps(fresh))));
        _mm512_storeu_ps(scores + t, p);
        total = _mm512_add_ps(total, p);
    }
    *l += _mm512_reduce_add_ps(total);
}

/* acc[r] += sum over the tile's keys t of weights[r][t] * values[t], for `count` rows of `dim`
 * floats: the generic form, for any head size. */
static void accumulate(const float *values, int64_t width, int64_t dim, float weights[][TILE], int64_t count,
                       float *acc) {
    for (int64_t r = 0; r < count; r++)
        for (int64_t j = 0; j < dim; j += 16) {
            __m512 sum = _mm512_loadu_ps(acc + r * dim + j);
            for (int64_t t = 0; t < width; t++)
                sum = _mm512_fmadd_ps(_mm512_set1_ps(weights[r][t]), _mm512_load_ps(values + t * dim + j), sum);
            _mm512_storeu_ps(acc + r * dim + j, sum);
        }
}

/* The same for heads of 64 and ROWS rows, the accumulators held in registers (ROWS x 4 vectors):
 * the weighted sum of values is most of a multi-row pass's arithmetic. */
#define ACCUMULATE_64(ROWS)                                                                              \
    static void accumulate_64x##ROWS(const float *values, int64_t width, float weights[][TILE], float *acc) { \
        __m512 sum[ROWS][4];                                                                             \
        for (int r = 0; r < ROWS; r++)                                                                   \
            for (int j = 0; j < 4; j++) sum[r][j] = _mm512_loadu_ps(acc + r * 64 + 16 * j);               \
        for (int64_t t = 0; t < width; t++) {                                                            \
            __m512 value[4];                                                                             \
            for (int j = 0; j < 4; j++) value[j] = _mm512_load_ps(values + t * 64 + 16 * j);             \
            for (int r = 0; r < ROWS; r++) {                                                             \
                __m512 weight = _mm512_set1_ps(weights[r][t]);                                           \
                for (int j = 0; j < 4; j++) sum[r][j] = _mm512_fmadd_ps(weight, value[j], sum[r][j]);    \
            }                                                                                            \
        }                                                                                                \
        for (int r = 0; r < ROWS; r++)                                                                   \
            for (int j = 0; j < 4; j++) _mm512_storeu_ps(acc + r * 64 + 16 * j, sum[r][j]);               \
    }
ACCUMULATE_64(1)
ACCUMULATE_64(2)
ACCUMULATE_64(3)
ACCUMULATE_64(4)
ACCUMULATE_64(5)
ACCUMULATE_64(6)
static void (*const accumulate_64[ROW_BLOCK + 1])(const float *, int64_t, float[][TILE], float *) = {
    NULL, accumulate_64x1, accumulate_64x2, accumulate_64x3, accumulate_64x4, accumulate_64x5, accumulate_64x6,
};

/* A tile's values [start, start + width) widened to float32 once, for every block of rows. */
static void widen_tile(const uint16_t *v, int64_t dim, int64_t start, int64_t width, float *values) {
    for (int64_t t = 0; t < width; t++)
        for (int64_t j = 0; j < dim; j += 16) _mm512_store_ps(values + t * dim + j, widen(v + (start + t) * dim + j));
}

/* Keys [begin, end) of one K/V head for all its rows: the running max `m`, denominator `l` and
 * unnormalised output `acc` of each row, updated tile by tile; a tile's keys and values are read
 * from memory once (turned and widened), then from L1 for every block of rows. With `scores`
 * (the head group's [group][length] floats), query 0's scaled scores are copied out as well. */
static void attend_chunk(const uint16_t *q, const uint16_t *k, const uint16_t *v, int64_t dim,
                         int64_t rows, int64_t begin, int64_t end, const Visibility *vis, float scale,
                         float *m, float *l, float *acc, float *scores) {
    const int64_t words = dim / 2;
    float weights[ROW_BLOCK][TILE] __attribute__((aligned(64)));
    float values[TILE * MAX_DIM] __attribute__((aligned(64)));
    __m512i turned[TILE / 16 * MAX_DIM / 2];
    for (int64_t start = begin; start < end; start += TILE) {
        int64_t width = end - start < TILE ? end - start : TILE;
        turn_tile(k, words, start, width, turned);
        widen_tile(v, dim, start, width, values);
        for (int64_t row0 = 0; row0 < rows; row0 += ROW_BLOCK) {
            int64_t count = rows - row0 < ROW_BLOCK ? rows - row0 : ROW_BLOCK;
            for (int64_t r = 0; r < count; r++) {
                int64_t row = row0 + r, position = vis->length - vis->queries + row % vis->queries;
                score_row((const uint32_t *)(q + row * dim), turned, words, start, width, position, vis, scale,
                          weights[r]);
                if (scores && row % vis->queries == 0) /* query 0's scores, for the draft's pillars */
                    memcpy(scores + row / vis->queries * vis->length + start, weights[r], sizeof(float) * width);
                weigh_row(weights[r], width, dim, m + row, l + row, acc + row * dim);
            }
            if (dim == 64)
                accumulate_64[count](values, width, weights, acc + row0 * dim);
            else
                accumulate(values, width, dim, weights, count, acc + row0 * dim);
        }
    }
}

/* Rows [kv_heads][rows][dim] of the query (bf16, element (head, i, d) at head * head_stride +
 * i * row_stride + d), a small copy that lets every chunk read its rows contiguously. */
static void gather_rows(const uint16_t *q, int64_t head_stride, int64_t row_stride, int64_t heads,
                        int64_t queries, int64_t dim, uint16_t *rows) {
    for (int64_t head = 0; head < heads; head++)
        for (int64_t i = 0; i < queries; i++)
            memcpy(rows + (head * queries + i) * dim, q + head * head_stride + i * row_stride, 2 * dim);
}

/* The chunks' partial results of row r of K/V head h merged, normalised and rounded to bf16
 * (round to nearest even, as torch rounds) into `o`. */
static void merge_row(const float *partial, int64_t chunks, int64_t stride, int64_t rows, int64_t dim,
                      int64_t r, uint16_t *o) {
    float top = -INFINITY, total = 0.0f, sum[MAX_DIM] __attribute__((aligned(64)));
    for (int64_t c = 0; c < chunks; c++) top = partial[c * stride + r] > top ? partial[c * stride + r] : top;
    memset(sum, 0, sizeof(float) * dim);
    for (int64_t c = 0; c < chunks; c++) {
        const float *base = partial + c * stride;
        if (base[r] == -INFINITY) continue;
        float w = expf(base[r] - top);
        total += w * base[rows + r];
        for (int64_t j = 0; j < dim; j++) sum[j] += w * base[2 * rows + r * dim + j];
    }
    for (int64_t j = 0; j < dim; j += 16) {
        __m512 x = _mm512_div_ps(_mm512_load_ps(sum + j), _mm512_set1_ps(total));
        _mm256_storeu_si256((__m256i *)(o + j), (__m256i)_mm512_cvtneps_pbh(x));
    }
}

/* Attention output of `heads` query heads of `queries` positions over a bf16 K/V cache of `length`
 * positions (`kv_heads` heads, head h at k + h * kv_stride, rows of `dim`), plus `extra` keys per
 * K/V head that every query sees (`extra_k`/`extra_v`, [kv_heads][extra][dim]: a draft's pillars),
 * written bf16 to `out` [queries][heads][dim] (the layout the output projection reads). With
 * `scores` ([heads][length] floats, filled with -inf by the caller), query 0's scaled scores of
 * the cache's keys it sees are written there too (a verify's pillar choice). Returns 0, or -1 when
 * the shape is outside what the kernel handles (dim not a multiple of 32 up to MAX_DIM, heads not a
 * multiple of kv_heads), memory for the partial results runs out, or a token tree's bits are given
 * (`tree`: the float32 kernel reads them). */
int decode_attention(const uint16_t *q, int64_t q_head_stride, int64_t q_row_stride, const uint16_t *k,
                     const uint16_t *v, int64_t kv_stride, uint16_t *out, int64_t heads, int64_t kv_heads,
                     int64_t queries, int64_t dim, int64_t length, int64_t sink, int64_t window, float scale,
                     const uint16_t *extra_k, const uint16_t *extra_v, int64_t extra, float *scores,
                     const uint32_t *tree, int64_t tree_base) {
    if (dim % 32 != 0 || dim > MAX_DIM || kv_heads < 1 || heads % kv_heads != 0 || queries < 1 || extra < 0)
        return -1;
    int64_t rows = heads / kv_heads * queries;
    Keys keys;
    if (tree) return -1; /* token trees run on the float32 kernel (decode_attention_keys.h) */
    (void)tree_base;
    int planned = plan_keys(&keys, length, queries, sink, window, extra, NULL, 0);
    int64_t units = keys.units, chunks = keys.chunks;
    int64_t stride = rows * (dim + 2); /* per unit and head: m, l, acc */
    float *partial = malloc(sizeof(float) * (units ? units : 1) * kv_heads * stride);
    uint16_t *query = malloc(2 * heads * queries * dim);
    if (planned || !partial || !query) {
        free(keys.chunk), free(partial), free(query);
        return -1;
    }
    gather_rows(q, q_head_stride, q_row_stride, heads, queries, dim, query);
    /* the merge below reads the units in order, so which thread ran one changes nothing */
    Schedule caller = schedule_units(units * kv_heads);
#pragma omp parallel for schedule(runtime) if (units * kv_heads > 1)
    for (int64_t unit = 0; unit < units * kv_heads; unit++) {
        int64_t c = unit / kv_heads, h = unit % kv_heads;
        float *base = empty_unit(partial, unit, stride, rows, dim);
        float *m = base, *l = base + rows, *acc = base + 2 * rows;
        if (c == chunks) {
            attend_chunk(query + h * rows * dim, extra_k + h * extra * dim, extra_v + h * extra * dim, dim,
                         rows, 0, extra, &keys.everything, scale, m, l, acc, NULL);
            continue;
        }
        float *head_scores = scores ? scores + h * (heads / kv_heads) * length : NULL;
        for (int range = 0; range < keys.count; range++) {
            int64_t begin, end;
            if (chunk_in_range(keys.chunk[c], keys.ranges[range], &begin, &end))
                attend_chunk(query + h * rows * dim, k + h * kv_stride, v + h * kv_stride, dim, rows, begin,
                             end, &keys.vis, scale, m, l, acc, head_scores);
        }
    }
    omp_set_schedule(caller.kind, caller.chunk);
    int64_t group = heads / kv_heads;
    for (int64_t h = 0; h < kv_heads; h++)
        for (int64_t r = 0; r < rows; r++) {
            uint16_t *o = out + ((r % queries) * heads + h * group + r / queries) * dim;
            merge_row(partial + h * stride, units, kv_heads * stride, rows, dim, r, o);
        }
    free(keys.chunk), free(partial), free(query);
    return 0;
}
