/* Which keys a block of queries sees, and how the decode-attention kernels split them into chunks
 * and hand the chunks to their threads: shared by decode_attention.c (bf16 cache, AVX-512) and
 * decode_attention_fp32.c (float32 cache, AVX2), so both read the same keys in the same chunks
 * (skipsearch/cpu/native.py hashes this header into both builds).
 *
 * Query i of a block of `queries` sits at position length - queries + i and sees the keys
 * n <= its position with n < sink or n > position - window (window <= 0: every key). A token
 * tree's block (`tree`, the float32 kernel only) replaces causality past `tree_base`: row i sees
 * the keys before `tree_base` (its prefix, under the sink and window) and key tree_base + j where
 * bit j of tree[i] is set (its ancestors and itself, at most 32 slots); its position, for the
 * window, is tree_base + its depth (the bits set, less one). The keys are
 * split into chunks at fixed positions whatever the cache length, so a query's chunks are the same
 * alone or in a block: SMALL_CHUNK keys each up to SPLIT, LARGE_CHUNK keys each after. A chunk of
 * one K/V head is a unit of work, which the kernels hand to the threads as they finish. With 512
 * keys a chunk and a static split, a decode step at a 512-token context (513 keys) was one chunk of
 * work and one of a single key: its attention ran on one of two threads. The small chunks make it
 * two of work per head, and they stop early: each chunk is another short stream to read and one
 * more partial result to merge, and with 256 keys a chunk everywhere 8,000 keys took 1.04-1.12x
 * longer on a CPU with AMX (experiments/kernel_builds.py --kernel attention). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t length, queries, sink, window;
    const uint32_t *tree; /* NULL: causal; else one bit pattern a query (the header's comment) */
    int64_t tree_base;    /* the first key the bits cover (`length` where there is no tree) */
} Visibility;

/* The position query `row` of the block stands at: its slot, or in a tree its root's plus its depth. */
static inline int64_t query_position(const Visibility *vis, int64_t row) {
    if (vis->tree) return vis->tree_base + __builtin_popcount(vis->tree[row]) - 1;
    return vis->length - vis->queries + row;
}

/* The keys some query sees, as at most two ranges: the sink and the span from the first query's
 * window start to the end. Returns how many ranges. */
static int visible_ranges(const Visibility *vis, int64_t ranges[2][2]) {
    int64_t lowest = vis->tree ? vis->tree_base : vis->length - vis->queries; /* the lowest query position */
    int64_t window_start = lowest + 1 - vis->window;
    if (vis->window <= 0 || window_start <= vis->sink) {
        ranges[0][0] = 0, ranges[0][1] = vis->length;
        return 1;
    }
    int count = 0;
    if (vis->sink > 0) ranges[count][0] = 0, ranges[count++][1] = vis->sink;
    ranges[count][0] = window_start, ranges[count++][1] = vis->length;
    return count;
}

#define SMALL_CHUNK 256  /* keys per chunk before SPLIT */
#define LARGE_CHUNK 512  /* keys per chunk from SPLIT on */
#define SPLIT 512        /* a multiple of both */

/* The chunk that holds key n. */
static inline int64_t chunk_of(int64_t n) {
    return n < SPLIT ? n / SMALL_CHUNK : SPLIT / SMALL_CHUNK + (n - SPLIT) / LARGE_CHUNK;
}

/* The first key of chunk c. */
static inline int64_t chunk_start(int64_t c) {
    return c < SPLIT / SMALL_CHUNK ? c * SMALL_CHUNK : SPLIT + (c - SPLIT / SMALL_CHUNK) * LARGE_CHUNK;
}

/* The chunks that hold a key of the `count` ranges, in order (malloc'd, `*chunks` of them), or NULL
 * when memory runs out. */
static int64_t *visible_chunks(const Visibility *vis, int64_t ranges[2][2], int count, int64_t *chunks) {
    int64_t *chunk = malloc(sizeof(int64_t) * (chunk_of(vis->length > 0 ? vis->length - 1 : 0) + 2));
    *chunks = 0;
    for (int range = 0; chunk && range < count; range++)
        for (int64_t c = chunk_of(ranges[range][0]); chunk_start(c) < ranges[range][1]; c++)
            if (*chunks == 0 || chunk[*chunks - 1] != c) chunk[(*chunks)++] = c;
    return chunk;
}

/* The keys of chunk `c` inside `range`, as [*begin, *end); whether there are any. */
static inline int chunk_in_range(int64_t c, const int64_t range[2], int64_t *begin, int64_t *end) {
    *begin = chunk_start(c) > range[0] ? chunk_start(c) : range[0];
    *end = chunk_start(c + 1) < range[1] ? chunk_start(c + 1) : range[1];
    return *begin < *end;
}

/* A call's keys: what its block sees (`vis`), as ranges and the chunks that hold them, and the
 * extra keys (a draft's pillars, seen by every row: `everything`), one more unit of work after the
 * chunks where there are any. */
typedef struct {
    Visibility vis, everything;
    int64_t ranges[2][2];
    int count;                     /* ranges */
    int64_t chunks, *chunk, units; /* `chunk` malloc'd: the caller frees it */
} Keys;

/* The keys of a block of `queries` over `length` cached positions, with `sink` + `window` and `extra`
 * keys, and a token tree's bits from `tree_base` (`tree` NULL: causal); 0, or -1 when memory runs out
 * or a tree does not fit its 32 bits. */
static int plan_keys(Keys *keys, int64_t length, int64_t queries, int64_t sink, int64_t window, int64_t extra,
                     const uint32_t *tree, int64_t tree_base) {
    if (tree && (tree_base < 0 || tree_base > length - queries || length - tree_base > 32)) {
        keys->chunk = NULL;
        return -1;
    }
    keys->vis = (Visibility){length, queries, sink, window, tree, tree ? tree_base : length};
    keys->everything = (Visibility){extra + queries, queries, 0, 0, NULL, extra + queries};
    keys->count = visible_ranges(&keys->vis, keys->ranges);
    keys->chunk = visible_chunks(&keys->vis, keys->ranges, keys->count, &keys->chunks);
    keys->units = keys->chunks + (extra > 0);
    return keys->chunk ? 0 : -1;
}

/* Unit `unit`'s partial results, emptied: per row a running maximum of -inf, a softmax denominator of
 * 0 and an unnormalised output of zeros ([m: rows][l: rows][acc: rows x dim], `stride` floats a unit,
 * the units in order in `partial`, as the kernels' merges read them); returns where they start. */
static float *empty_unit(float *partial, int64_t unit, int64_t stride, int64_t rows, int64_t dim) {
    float *base = partial + unit * stride;
    for (int64_t r = 0; r < rows; r++) base[r] = -INFINITY, base[rows + r] = 0.0f;
    memset(base + 2 * rows, 0, sizeof(float) * rows * dim);
    return base;
}

#define MANY_UNITS 16 /* units per thread from which they are split statically */

typedef struct {
    omp_sched_t kind;
    int chunk;
} Schedule;

/* Sets the schedule of the kernel's next `schedule(runtime)` loop over `units` units and returns
 * the caller's, to restore after it. Few units (a short cache) go to the threads as they finish,
 * since they differ in size; many go in contiguous parts, which read faster (handing out every
 * unit took 1.11x as long at 8,000 keys). */
static inline Schedule schedule_units(int64_t units) {
    Schedule caller;
    omp_get_schedule(&caller.kind, &caller.chunk);
    omp_set_schedule(units >= MANY_UNITS * omp_get_max_threads() ? omp_sched_static : omp_sched_dynamic, 0);
    return caller;
}
