/* Which keys a block of queries sees, and how the decode-attention kernels split them into chunks:
 * shared by decode_attention.c (bf16 cache, AVX-512) and decode_attention_fp32.c (float32 cache,
 * AVX2), so both read the same keys in the same chunks (skipsearch/models/native.py hashes this
 * header into both builds).
 *
 * Query i of a block of `queries` sits at position length - queries + i and sees the keys
 * n <= its position with n < sink or n > position - window (window <= 0: every key). Chunks of
 * `chunk_keys` keys start at fixed multiples of it whatever the cache length, so a query's chunks
 * are the same alone or in a block. */
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    int64_t length, queries, sink, window;
} Visibility;

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

/* The chunks [chunk_keys c, chunk_keys (c + 1)) that hold a key of the `count` ranges, in order
 * (malloc'd, `*chunks` of them), or NULL when memory runs out. */
static int64_t *visible_chunks(const Visibility *vis, int64_t ranges[2][2], int count, int64_t chunk_keys,
                               int64_t *chunks) {
    int64_t *chunk = malloc(sizeof(int64_t) * ((vis->length + chunk_keys - 1) / chunk_keys + 1));
    *chunks = 0;
    for (int range = 0; chunk && range < count; range++)
        for (int64_t c = ranges[range][0] / chunk_keys; c * chunk_keys < ranges[range][1]; c++)
            if (*chunks == 0 || chunk[*chunks - 1] != c) chunk[(*chunks)++] = c;
    return chunk;
}

/* The keys of chunk `c` inside `range`, as [*begin, *end); whether there are any. */
static inline int chunk_in_range(int64_t c, int64_t chunk_keys, const int64_t range[2], int64_t *begin,
                                 int64_t *end) {
    *begin = c * chunk_keys > range[0] ? c * chunk_keys : range[0];
    *end = (c + 1) * chunk_keys < range[1] ? (c + 1) * chunk_keys : range[1];
    return *begin < *end;
}
