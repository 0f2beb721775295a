/* Attention of a short query block over a float32 K/V cache, for CPUs with AVX2 and FMA: the
 * decode-attention kernel of the fp32 fallback plan (skipsearch/cpu/decode_attention.py builds
 * and loads it; docs/cpu-backend.md). decode_attention.c is its AVX-512 sibling,
 * which reads a bf16 cache.
 *
 * Why it exists: a decode step, a draft step and a verify pass attend with 1 to ~16 queries to
 * the whole cache, which makes attention a stream over the K/V: it should run at the memory's
 * bandwidth. On a CPU without AVX-512, torch's fp32 SDPA reads a long cache at a third of
 * it: SmolLM2 at 8k positions spends 38.9 ms a step in SDPA reading 369 MB of K/V, 12 ms at the
 * copy bandwidth (docs/cpu-backend.md, "Decode attention"). The cache stays
 * float32 here (the plan's activations are float32, so its K/V are not bf16 values): this kernel
 * reads each key and value once, in place, and computes float32 attention; only the summation
 * order differs from SDPA's.
 *
 * Layout: query head `head`, position i at `q + head * q_head_stride + i * q_row_stride`; K/V head
 * h, position n at `h * kv_stride + n * dim`; the output [queries][heads][dim] (what the output
 * projection reads); all float32. The `heads / kv_heads` query heads of a K/V head share its
 * reads: their queries are the head's rows, row r being query r % queries. Query i sits at
 * position length - queries + i and sees the keys n <= its position with n < sink or
 * n > position - window (window <= 0: every key): a decode step, a causal verify block, or a draft
 * step's sink + window pattern.
 *
 * Work is split over OpenMP threads by key chunks (flash-decoding): each chunk keeps, per row, the
 * running maximum, the softmax denominator and the weighted sum of values (an online softmax over
 * tiles of TILE keys), and the chunks are merged at the end, in order. Chunks and tiles start at
 * fixed key positions whatever the cache length, a key a query does not see is left out of its
 * sums, and every sum runs in a fixed order, so a query's output does not depend on how many
 * queries share the call: a verify pass's attention is bit for bit what single decode steps
 * compute. A tile's keys and values are read from memory once and from L1 by its other rows. The
 * OpenMP runtime is torch's own (the library is loaded after torch), so the threads torch was
 * given apply here too.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "avx2_exp.h"
#include "avx2_lanes.h"
#include "decode_attention_keys.h"
#include "decode_attention_merge.h"

#define TILE 32      /* keys scored, weighted and summed together: 32 keys and values of 64 are 16 KB */
#define MAX_DIM 256  /* 32 vectors of 8 floats */


static inline float lanes_max(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 8 lanes' sums of 8 accumulators, lane j of the result being acc[j]'s: each key's lanes are
 * summed as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) whichever keys share the call. */
static inline __m256 lanes_sums8(const __m256 acc[8]) {
    __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]), h23 = _mm256_hadd_ps(acc[2], acc[3]);
    __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]), h67 = _mm256_hadd_ps(acc[6], acc[7]);
    __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);
    /* lo: keys 0-3 of lanes 0-3 | keys 0-3 of lanes 4-7; hi: the same for keys 4-7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

/* Dot products of one row with `n` <= 8 consecutive keys (rows of `dim` floats from `keys`; 0 for
 * the missing ones), each an 8-lane accumulator summed over the row in order. */
static inline __attribute__((always_inline)) __m256 dot8(const float *row, const float *keys, int64_t dim, int n) {
    __m256 acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; d += 8) {
        __m256 q = _mm256_loadu_ps(row + d);
        for (int j = 0; j < n; j++) acc[j] = _mm256_fmadd_ps(q, _mm256_loadu_ps(keys + j * dim + d), acc[j]);
    }
    return lanes_sums8(acc);
}

/* Scaled scores of one row against the tile's `width` keys from `start` (-inf before `first`, where
 * the row's query, at `position` with tree bits `bits`, does not see the key, and past `width`);
 * whether it sees any. */
static int score_row(const float *row, const float *k, int64_t dim, int64_t start, int64_t first, int64_t width,
                     int64_t position, uint32_t bits, const Visibility *vis, float scale, float *scores) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i low = _mm256_set1_epi32((int32_t)(first - 1)), high = _mm256_set1_epi32((int32_t)(start + width));
    const __m256i at = _mm256_set1_epi32((int32_t)position);
    const __m256i sink = _mm256_set1_epi32((int32_t)vis->sink);
    const __m256i window_start = _mm256_set1_epi32((int32_t)(position - vis->window));
    const __m256i tree_base = _mm256_set1_epi32((int32_t)vis->tree_base), row_bits = _mm256_set1_epi32((int32_t)bits);
    __m256i any = _mm256_setzero_si256();
    for (int64_t t = 0; t < TILE; t += 8) {
        __m256i index = _mm256_add_epi32(_mm256_set1_epi32((int32_t)(start + t)), lane);
        /* first <= index < start + width, index <= position, and inside the sink or the window */
        __m256i seen = _mm256_andnot_si256(_mm256_cmpgt_epi32(index, at),
                                           _mm256_and_si256(_mm256_cmpgt_epi32(index, low),
                                                            _mm256_cmpgt_epi32(high, index)));
        if (vis->window > 0)
            seen = _mm256_and_si256(seen, _mm256_or_si256(_mm256_cmpgt_epi32(sink, index),
                                                          _mm256_cmpgt_epi32(index, window_start)));
        if (vis->tree) { /* past tree_base: the row's bits, not causality (decode_attention_keys.h) */
            __m256i relative = _mm256_sub_epi32(index, tree_base);  /* < 0 or >= 32: shifted out */
            __m256i bit = _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(1), relative), row_bits);
            __m256i in_tree = _mm256_cmpgt_epi32(index, _mm256_sub_epi32(tree_base, _mm256_set1_epi32(1)));
            __m256i in_range = _mm256_and_si256(_mm256_cmpgt_epi32(index, low), _mm256_cmpgt_epi32(high, index));
            __m256i ancestor = _mm256_andnot_si256(_mm256_cmpeq_epi32(bit, _mm256_setzero_si256()), in_tree);
            seen = _mm256_or_si256(_mm256_andnot_si256(in_tree, seen), _mm256_and_si256(in_range, ancestor));
        }
        __m256 sum = _mm256_setzero_ps();
        int n = t < width ? (width - t < 8 ? (int)(width - t) : 8) : 0;
        if (n == 8 && dim == 64)  /* the common head size: a constant unrolls the row */
            sum = dot8(row, k + (start + t) * 64, 64, 8);
        else if (n == 8)
            sum = dot8(row, k + (start + t) * dim, dim, 8);
        else if (n > 0)
            sum = dot8(row, k + (start + t) * dim, dim, n);
        __m256 scaled = _mm256_mul_ps(sum, _mm256_set1_ps(scale));
        _mm256_storeu_ps(scores + t, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), scaled, _mm256_castsi256_ps(seen)));
        any = _mm256_or_si256(any, seen);
    }
    return !_mm256_testz_si256(any, any);
}

/* Softmax weights of one row's tile of scores, in place (0 where unseen): the row's running max
 * `m` and denominator `l` move to the tile's max, and its accumulated output `acc` is rescaled. */
static void weigh_row(float *scores, int64_t dim, float *m, float *l, float *acc) {
    __m256 highest = _mm256_set1_ps(-INFINITY);
    for (int t = 0; t < TILE; t += 8) highest = _mm256_max_ps(highest, _mm256_loadu_ps(scores + t));
    float top = lanes_max(highest), fresh = top > *m ? top : *m;
    float shrink = *m == -INFINITY ? 0.0f : *m == fresh ? 1.0f : expf(*m - fresh);
    *m = fresh;
    if (shrink != 1.0f) {  /* the running max moved: rescale (multiplying by 1 would change nothing) */
        *l *= shrink;
        for (int64_t j = 0; j < dim; j += 8)
            _mm256_storeu_ps(acc + j, _mm256_mul_ps(_mm256_loadu_ps(acc + j), _mm256_set1_ps(shrink)));
    }
    __m256 total = _mm256_setzero_ps();
    for (int t = 0; t < TILE; t += 8) {
        __m256 s = _mm256_loadu_ps(scores + t);
        __m256 seen = _mm256_cmp_ps(s, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        __m256 p = _mm256_and_ps(seen, exp_nonpositive(_mm256_sub_ps(s, _mm256_set1_ps(fresh))));
        _mm256_storeu_ps(scores + t, p);
        total = _mm256_add_ps(total, p);
    }
    *l += lanes_sum(total);
}

/* acc += sum over the tile's keys t of weights[t] * values[t] (`width` values of `dim` floats). */
static inline __attribute__((always_inline)) void accumulate(const float *values, int64_t width, int64_t dim,
                                                           const float *weights, float *acc) {
    for (int64_t j0 = 0; j0 < dim; j0 += 64) {  /* 8 accumulators at a time, in registers */
        int64_t span = dim - j0 < 64 ? dim - j0 : 64;
        __m256 sum[8];
        for (int64_t j = 0; j < span; j += 8) sum[j / 8] = _mm256_loadu_ps(acc + j0 + j);
        for (int64_t t = 0; t < width; t++) {
            __m256 weight = _mm256_set1_ps(weights[t]);
            for (int64_t j = 0; j < span; j += 8)
                sum[j / 8] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(values + t * dim + j0 + j), sum[j / 8]);
        }
        for (int64_t j = 0; j < span; j += 8) _mm256_storeu_ps(acc + j0 + j, sum[j / 8]);
    }
}

/* Keys [begin, end) of one K/V head for all its rows: the running max `m`, denominator `l` and
 * unnormalised output `acc` of each row, updated tile by tile. Tiles start at multiples of TILE.
 * With `scores` (the head group's [group][length] floats), query 0's scaled scores are copied out. */
static void attend_chunk(const float *q, const float *k, const float *v, int64_t dim, int64_t rows,
                         int64_t begin, int64_t end, const Visibility *vis, float scale, float *m, float *l,
                         float *acc, float *scores) {
    float weights[TILE] __attribute__((aligned(32)));
    for (int64_t start = begin / TILE * TILE; start < end; start += TILE) {
        int64_t first = start > begin ? start : begin;
        int64_t width = end - start < TILE ? end - start : TILE;
        for (int64_t row = 0; row < rows; row++) {
            int64_t query = row % vis->queries, position = query_position(vis, query);
            uint32_t bits = vis->tree ? vis->tree[query] : 0;
            int seen = score_row(q + row * dim, k, dim, start, first, width, position, bits, vis, scale, weights);
            if (scores && row % vis->queries == 0) /* query 0's scores, for the draft's pillars */
                memcpy(scores + row / vis->queries * vis->length + first, weights + (first - start),
                       sizeof(float) * (width - (first - start)));
            if (!seen) continue;
            weigh_row(weights, dim, m + row, l + row, acc + row * dim);
            if (dim == 64)
                accumulate(v + start * 64, width, 64, weights, acc + row * 64);
            else
                accumulate(v + start * dim, width, dim, weights, acc + row * dim);
        }
    }
}

/* Attention output of `heads` query heads of `queries` positions over a float32 K/V cache of
 * `length` positions (`kv_heads` heads, head h at k + h * kv_stride, rows of `dim`), plus `extra`
 * keys per K/V head that every query sees (`extra_k`/`extra_v`, [kv_heads][extra][dim]: a draft's
 * pillars), written to `out` [queries][heads][dim]. With `scores` ([heads][length] floats, filled
 * with -inf by the caller), query 0's scaled scores of the cache's keys it sees are written there
 * too (a verify's pillar choice). With `tree` (one uint32 a query), a token tree's block: query i
 * sees the keys before `tree_base` and key tree_base + j where bit j of tree[i] is set
 * (decode_attention_keys.h). Returns 0, or -1 when the shape is outside what the kernel
 * handles (dim not a multiple of 8 up to MAX_DIM, heads not a multiple of kv_heads), a tree past
 * its 32 bits, or memory for the partial results runs out. */
int decode_attention_fp32(const float *q, int64_t q_head_stride, int64_t q_row_stride, const float *k,
                          const float *v, int64_t kv_stride, float *out, int64_t heads, int64_t kv_heads,
                          int64_t queries, int64_t dim, int64_t length, int64_t sink, int64_t window, float scale,
                          const float *extra_k, const float *extra_v, int64_t extra, float *scores,
                          const uint32_t *tree, int64_t tree_base) {
    if (dim % 8 != 0 || dim > MAX_DIM || kv_heads < 1 || heads % kv_heads != 0 || queries < 1 || extra < 0)
        return -1;
    int64_t group = heads / kv_heads, rows = group * queries;
    Keys keys;
    int planned = plan_keys(&keys, length, queries, sink, window, extra, tree, tree_base);
    int64_t units = keys.units, chunks = keys.chunks;
    int64_t stride = rows * (dim + 2); /* per unit and head: m, l, acc */
    float *partial = malloc(sizeof(float) * (units ? units : 1) * kv_heads * stride);
    float *query = malloc(sizeof(float) * heads * queries * dim);
    if (planned || !partial || !query) {
        free(keys.chunk), free(partial), free(query);
        return -1;
    }
    /* rows [kv_heads][group * queries][dim], contiguous for every chunk */
    for (int64_t head = 0; head < heads; head++)
        for (int64_t i = 0; i < queries; i++)
            memcpy(query + (head * queries + i) * dim, q + head * q_head_stride + i * q_row_stride, 4 * dim);
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
        float *head_scores = scores ? scores + h * group * length : NULL;
        for (int range = 0; range < keys.count; range++) {
            int64_t begin, end;
            if (chunk_in_range(keys.chunk[c], keys.ranges[range], &begin, &end))
                attend_chunk(query + h * rows * dim, k + h * kv_stride, v + h * kv_stride, dim, rows, begin,
                             end, &keys.vis, scale, m, l, acc, head_scores);
        }
    }
    omp_set_schedule(caller.kind, caller.chunk);
    merge_rows(partial, units, kv_heads, stride, rows, queries, heads, dim, out);
    free(keys.chunk), free(partial), free(query);
    return 0;
}
