/* Attention of a short query block over a bf16 K/V cache, in float32 arithmetic, for CPUs with
 * AVX-512 (skipsearch/models/native.py builds and loads it; docs/theory.md, "The kernel plan").
 *
 * Why it exists: a decode step, a draft step and a verify pass attend with 1 to ~16 queries to
 * the whole cache, which makes attention a stream over the K/V: it should run at the memory's
 * bandwidth. torch's CPU SDPA reads an fp32 cache at 10-16 GB/s against the 39 GB/s a copy reaches
 * on the project's EPYC, and its bf16 path is 8x slower still (results/kernels/attention_rows.md).
 * K and V come out of bf16 projections, so a bf16 cache holds them exactly; this kernel reads it
 * (half the bytes of the fp32 cache) and widens each value in registers, so the arithmetic is that
 * of float32 attention.
 *
 * Layout: `rows` queries per K/V head, stored [kv_heads][rows][dim] in float32, row r being query
 * r % queries of the head's group (transformers' head-major grouping). K/V head h, position n
 * lies at `h * head_stride + n * dim` (bf16 bits). Query i sits at position length - queries + i
 * and sees the keys n <= its position with n < sink or n > position - window (window <= 0: every
 * key): a causal verify block, a decode step, or a draft step's sink + window pattern.
 *
 * Work is split over OpenMP threads by key chunks (flash-decoding): each chunk keeps, per row, the
 * running maximum, the softmax denominator and the weighted sum of values (an online softmax over
 * tiles of TILE keys), and the chunks are merged at the end. The OpenMP runtime is torch's own
 * (the library is loaded after torch, whose libgomp.so.1 then answers for this one), so the
 * threads and wait policy torch was given apply here too.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TILE 64        /* keys scored, weighted and summed together: 64 x dim bf16 stays in L1 */
#define ROW_BLOCK 4    /* rows sharing one read of a tile's keys and values */
#define MAX_DIM 256    /* 16 vectors of 16 floats */
#define MIN_CHUNK 256  /* the fewest keys worth a thread */

static inline __m512 widen(const uint16_t *bits) {
    __m256i half = _mm256_loadu_si256((const __m256i *)bits);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

/* e^x for x <= 0 (x - max of the tile), ~1 ulp: range reduction by ln 2, degree-7 polynomial. */
static inline __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-103.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

typedef struct {
    int64_t length, queries, sink, window;
} Visibility;

/* The 16 horizontal sums of a[0..15], in order: a transposing tree of shuffles and adds (15 adds,
 * 30 shuffles and one permute for 16 keys, where one reduction per key costs about 8 operations). */
static inline __m512 sums16(__m512 a[16]) {
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
    __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
    /* e holds the sum of a[4j + k] at lane 4k + j */
    return _mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), e);
}

/* Scaled scores of query row `row` (bf16, `pairs` vectors of 32) against keys [start, start +
 * width), -inf where the row's query does not see the key. bf16 products are exact in float32 and
 * VDPBF16PS accumulates them in float32, so this is float32 attention's dot product. */
static void score_row(const __m512bh *query, const uint16_t *k, int64_t pairs, int64_t start,
                      int64_t width, int64_t position, const Visibility *vis, float scale, float *scores) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int64_t t = 0; t < width; t += 16) {
        __m512 a[16];
        for (int64_t u = 0; u < 16; u++) {
            a[u] = _mm512_setzero_ps();
            if (t + u >= width) continue;
            const __m512bh *key = (const __m512bh *)(k + (start + t + u) * pairs * 32);
            for (int64_t j = 0; j < pairs; j++) a[u] = _mm512_dpbf16_ps(a[u], query[j], (__m512bh)_mm512_loadu_si512(key + j));
        }
        __m512i index = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(start + t)), lane);
        __mmask16 seen = _mm512_cmple_epi32_mask(index, _mm512_set1_epi32((int32_t)position));
        if (vis->window > 0)
            seen &= _mm512_cmplt_epi32_mask(index, _mm512_set1_epi32((int32_t)vis->sink)) |
                    _mm512_cmpgt_epi32_mask(index, _mm512_set1_epi32((int32_t)(position - vis->window)));
        seen &= width - t >= 16 ? 0xFFFF : (__mmask16)((1u << (width - t)) - 1);
        __m512 s = _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), seen, sums16(a), _mm512_set1_ps(scale));
        _mm512_storeu_ps(scores + t, s);
    }
}

/* Softmax weights of one row's tile of scores, in place (0 past `width`): the row's running max
 * `m` and denominator `l` move to the tile's max, and its accumulated output `out` is rescaled. */
static void weigh_row(float *scores, int64_t width, int64_t vectors, float *m, float *l, __m512 *out) {
    float top = -INFINITY;
    for (int64_t t = 0; t < width; t++) top = scores[t] > top ? scores[t] : top;
    if (top == -INFINITY) {  /* the row sees no key of this tile */
        memset(scores, 0, sizeof(float) * TILE);
        return;
    }
    float fresh = top > *m ? top : *m;
    float shrink = *m == -INFINITY ? 0.0f : expf(*m - fresh);
    *m = fresh;
    *l *= shrink;
    for (int64_t j = 0; j < vectors; j++) out[j] = _mm512_mul_ps(out[j], _mm512_set1_ps(shrink));
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

/* Keys [begin, end) of one K/V head for all its rows: the running max `m`, denominator `l` and
 * unnormalised output `acc` of each row, updated tile by tile; a tile's keys and values are read
 * from memory once, then from L1 for every row. */
static void attend_chunk(const uint16_t *q, const uint16_t *k, const uint16_t *v, int64_t dim,
                         int64_t rows, int64_t begin, int64_t end, const Visibility *vis, float scale,
                         float *m, float *l, float *acc) {
    const int64_t vectors = dim / 16, pairs = dim / 32;
    float scores[ROW_BLOCK][TILE] __attribute__((aligned(64)));
    __m512 out[ROW_BLOCK][MAX_DIM / 16];
    __m512bh query[MAX_DIM / 32];
    for (int64_t start = begin; start < end; start += TILE) {
        int64_t width = end - start < TILE ? end - start : TILE;
        for (int64_t row0 = 0; row0 < rows; row0 += ROW_BLOCK) {
            int64_t count = rows - row0 < ROW_BLOCK ? rows - row0 : ROW_BLOCK;
            for (int64_t r = 0; r < count; r++) {
                int64_t row = row0 + r, position = vis->length - vis->queries + row % vis->queries;
                for (int64_t j = 0; j < pairs; j++)
                    query[j] = (__m512bh)_mm512_loadu_si512(q + row * dim + 32 * j);
                for (int64_t j = 0; j < vectors; j++) out[r][j] = _mm512_loadu_ps(acc + row * dim + 16 * j);
                score_row(query, k, pairs, start, width, position, vis, scale, scores[r]);
                weigh_row(scores[r], width, vectors, m + row, l + row, out[r]);
            }
            for (int64_t t = 0; t < width; t++) {
                const uint16_t *value = v + (start + t) * dim;
                __m512 vv[MAX_DIM / 16];
                for (int64_t j = 0; j < vectors; j++) vv[j] = widen(value + 16 * j);
                for (int64_t r = 0; r < count; r++) {
                    __m512 weight = _mm512_set1_ps(scores[r][t]);
                    for (int64_t j = 0; j < vectors; j++) out[r][j] = _mm512_fmadd_ps(weight, vv[j], out[r][j]);
                }
            }
            for (int64_t r = 0; r < count; r++)
                for (int64_t j = 0; j < vectors; j++) _mm512_storeu_ps(acc + (row0 + r) * dim + 16 * j, out[r][j]);
        }
    }
}

/* The keys some query sees, as at most two ranges: the sink and the span from the first query's
 * window start to the end. Returns how many ranges. */
static int visible_ranges(const Visibility *vis, int64_t ranges[2][2]) {
    int64_t window_start = vis->length - vis->queries + 1 - vis->window;
    if (vis->window <= 0 || window_start <= vis->sink) {
        ranges[0][0] = 0, ranges[0][1] = vis->length;
        return 1;
    }
    int count = 0;
    if (vis->sink > 0) ranges[count][0] = 0, ranges[count++][1] = vis->sink;
    ranges[count][0] = window_start, ranges[count++][1] = vis->length;
    return count;
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
 * positions (`kv_heads` heads, head h at k + h * kv_stride, rows of `dim`), written bf16 to `out`
 * [queries][heads][dim] (the layout the output projection reads). Returns 0, or -1 when the shape
 * is outside what the kernel handles (dim not a multiple of 32 up to MAX_DIM, heads not a multiple
 * of kv_heads) or memory for the partial results runs out. */
int decode_attention(const uint16_t *q, int64_t q_head_stride, int64_t q_row_stride, const uint16_t *k,
                     const uint16_t *v, int64_t kv_stride, uint16_t *out, int64_t heads, int64_t kv_heads,
                     int64_t queries, int64_t dim, int64_t length, int64_t sink, int64_t window, float scale) {
    if (dim % 32 != 0 || dim > MAX_DIM || kv_heads < 1 || heads % kv_heads != 0 || queries < 1) return -1;
    int64_t rows = heads / kv_heads * queries;
    Visibility vis = {length, queries, sink, window};
    int64_t ranges[2][2];
    int count = visible_ranges(&vis, ranges);
    int64_t visible = 0;
    for (int c = 0; c < count; c++) visible += ranges[c][1] - ranges[c][0];
    int64_t threads = omp_get_max_threads();
    int64_t chunks = visible / MIN_CHUNK < threads ? visible / MIN_CHUNK : threads;
    chunks = chunks < 1 ? 1 : chunks;
    int64_t per_chunk = (visible + chunks - 1) / chunks;
    int64_t stride = rows * (dim + 2); /* per chunk and head: m, l and acc of every row */
    float *partial = malloc(sizeof(float) * chunks * kv_heads * stride);
    uint16_t *query = malloc(2 * heads * queries * dim);
    if (!partial || !query) {
        free(partial), free(query);
        return -1;
    }
    gather_rows(q, q_head_stride, q_row_stride, heads, queries, dim, query);
#pragma omp parallel for collapse(2) schedule(static) if (chunks * kv_heads > 1)
    for (int64_t c = 0; c < chunks; c++) {
        for (int64_t h = 0; h < kv_heads; h++) {
            float *base = partial + (c * kv_heads + h) * stride;
            float *m = base, *l = base + rows, *acc = base + 2 * rows;
            for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0.0f;
            memset(acc, 0, sizeof(float) * rows * dim);
            /* the chunk's keys: [c * per_chunk, (c + 1) * per_chunk) of the visible ones */
            int64_t skip = c * per_chunk, take = per_chunk;
            for (int range = 0; range < count && take > 0; range++) {
                int64_t size = ranges[range][1] - ranges[range][0];
                if (skip >= size) {
                    skip -= size;
                    continue;
                }
                int64_t begin = ranges[range][0] + skip, end = begin + take;
                end = end < ranges[range][1] ? end : ranges[range][1];
                attend_chunk(query + h * rows * dim, k + h * kv_stride, v + h * kv_stride, dim, rows, begin,
                             end, &vis, scale, m, l, acc);
                take -= end - begin;
                skip = 0;
            }
        }
    }
    int64_t group = heads / kv_heads;
    for (int64_t h = 0; h < kv_heads; h++)
        for (int64_t r = 0; r < rows; r++) {
            uint16_t *o = out + ((r % queries) * heads + h * group + r / queries) * dim;
            merge_row(partial + h * stride, chunks, kv_heads * stride, rows, dim, r, o);
        }
    free(partial), free(query);
    return 0;
}
