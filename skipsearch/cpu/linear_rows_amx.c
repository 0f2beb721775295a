/* The product of a few float32 rows with a bf16 weight matrix on AMX tiles, for CPUs with AMX-BF16
 * (skipsearch/cpu/bf16_weights.py builds and loads it, skipsearch/cpu/products_choice.py
 * weighs it against linear_rows.c per model; docs/cpu-backend.md).
 *
 * Why it exists: linear_rows.c widens each bf16 weight to float32 and does one FMA per weight and
 * row, so on a CPU with AMX a verify's extra rows are arithmetic that no longer hides under the
 * weight stream: a pass of every product of a decode step costs 1.29-1.34x one row at 5 rows
 * (docs/cpu-backend.md, "Products on AMX tiles"). A tile product multiplies up to 16 rows by a 32 x 16 block
 * of weights in one instruction, so here 5 rows cost 1.06x one row, and on Qwen2.5's matrices one
 * row streams as fast as the vector kernel's. The price is the inputs: AMX multiplies bf16 pairs,
 * so each row is rounded to bf16 (nearest even) before the product, and the sums are float32.
 *
 * Layout: x is rows x in (float32, row r at x + r * x_stride); w is bf16 bits in the layout of
 * bf16_weights.pack_tiles: units of UNIT tile columns (UNIT x TILE_OUT outputs, zeros past out),
 * each unit one contiguous stream of chunks of K_CHUNK inputs (zeros past in), each chunk its
 * columns' tiles, a tile 16 input pairs x 16 outputs x 2 (the VNNI pairs the tile product reads);
 * y is rows x out (float32, row r at y + r * y_stride); bias is out floats or NULL.
 *
 * Every output y[r][j] is one element of a float32 tile accumulated over the chunks in order, then
 * the bias added: the same operations whatever the row count, the row's place in the block and the
 * thread, so a verify pass's products are bit for bit the decode steps' (tested), as with
 * linear_rows.c. Work is split over OpenMP threads by units (UNIT = 2 columns: every model's
 * matrices split evenly over two threads); a unit's chunks are staged through an L1 buffer with
 * vector loads (which the memory system runs many at a time; tile loads straight from memory
 * streamed ~10% slower in the prototype, experiments/amx_products.c) and prefetched AHEAD bytes
 * into L2.
 */
#define _GNU_SOURCE /* shared_core.h pins threads (sched.h's CPU sets, pthread affinity) */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_tiles.h"

#define TILE_OUT 16 /* outputs of one tile column */
#define K_CHUNK 32  /* inputs of one tile product */
#define UNIT 2      /* tile columns a thread takes at a time */
#define MAX_ROWS 16 /* a tile's rows */
#define AHEAD 8192  /* bytes prefetched into L2 ahead of the staged chunk */
#define TILE_BYTES 1024

/* Whether Linux lends this process the tile state (bf16_weights.load_tile_kernel asks first). */
int linear_rows_amx_ready(void) { return amx_ready(); }

/* Tiles 0-1: a unit's outputs (rows x 16 floats); 2: the rows' inputs (rows x 32 bf16); 3-4: weights. */
static void configure(int64_t rows) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 3; t++) c.rows[t] = (uint8_t)rows, c.colsb[t] = 64;
    for (int t = 3; t < 5; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* The rows rounded to bf16 (nearest even), each padded with zeros to `padded` inputs. */
static void round_rows(const float *x, int64_t x_stride, int64_t rows, int64_t in, int64_t padded,
                       uint16_t *inputs) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < padded; k += K_CHUNK) {
            int64_t n = in - k < K_CHUNK ? (in - k > 0 ? in - k : 0) : K_CHUNK;
            __mmask16 low = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1);
            __mmask16 high = n >= 32 ? 0xFFFF : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
            const float *xr = x + r * x_stride + k;
            __m512bh pairs = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(high, xr + 16), _mm512_maskz_loadu_ps(low, xr));
            _mm512_store_si512((void *)(inputs + r * padded + k), (__m512i)pairs);
        }
}

/* Column `b` of a unit's outputs (tile 0 or 1, in `c`) plus bias into y, the columns past `out` dropped. */
static void store_column(const float *c, int64_t rows, int64_t o0, int64_t out, const float *bias, float *y,
                         int64_t y_stride) {
    int64_t n = out - o0 < TILE_OUT ? out - o0 : TILE_OUT;
    if (n <= 0) return;
    __mmask16 m = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1);
    for (int64_t r = 0; r < rows; r++) {
        __m512 v = _mm512_load_ps(c + r * TILE_OUT);
        if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + o0));
        _mm512_mask_storeu_ps(y + r * y_stride + o0, m, v);
    }
}

/* One unit's two tile columns of outputs into c[0], c[1] (rows x TILE_OUT floats each), the tiles
 * configured for the rows. */
static void unit_tiles(const uint16_t *inputs, int64_t padded, int64_t chunks, const uint16_t *w, int64_t u,
                       float c[2][MAX_ROWS * TILE_OUT]) {
    char stage[UNIT * TILE_BYTES] __attribute__((aligned(64)));
    const char *stream = (const char *)w + u * chunks * UNIT * TILE_BYTES;
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t ch = 0; ch < chunks; ch++) {
        const char *chunk = stream + ch * UNIT * TILE_BYTES;
        for (int64_t at = 0; at < UNIT * TILE_BYTES; at += 64) {
            _mm_prefetch(chunk + AHEAD + at, _MM_HINT_T1);
            _mm512_store_si512((void *)(stage + at), _mm512_loadu_si512((const void *)(chunk + at)));
        }
        _tile_loadd(2, inputs + ch * K_CHUNK, padded * 2);
        _tile_loadd(3, stage, 64);
        _tile_loadd(4, stage + TILE_BYTES, 64);
        _tile_dpbf16ps(0, 2, 3);
        _tile_dpbf16ps(1, 2, 4);
    }
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
}

/* Unit u's outputs (c, from unit_tiles) plus bias into y. */
static void store_unit(float c[2][MAX_ROWS * TILE_OUT], int64_t rows, int64_t u, int64_t out, const float *bias,
                       float *y, int64_t y_stride) {
    int64_t o0 = u * UNIT * TILE_OUT;
    store_column(c[0], rows, o0, out, bias, y, y_stride);
    store_column(c[1], rows, o0 + TILE_OUT, out, bias, y, y_stride);
}

/* The product split over a free core and helpers on busy cores (shared_core.h): a piece is
 * PIECE_UNITS units of outputs: 1, 2 and 4 measured alike beside a busy core (18.0-19.8 ms a SmolLM2
 * step, 4 by a hair). */
#define PIECE_UNITS 4
#define SHARED_SCRATCH_BYTES (PIECE_UNITS * 2 * MAX_ROWS * TILE_OUT * 4)
#include "shared_core.h"

typedef struct {
    const uint16_t *inputs, *w;
    const float *bias;
    float *y;
    int64_t rows, padded, chunks, units, out, y_stride;
} Product;

static __thread int64_t configured_rows = -1; /* the rows this thread's tiles are configured for */

static void piece_compute(const void *args, int64_t piece, void *scratch) {
    const Product *p = args;
    float(*c)[2][MAX_ROWS * TILE_OUT] = scratch;
    if (configured_rows != p->rows) configure(p->rows), configured_rows = p->rows;
    for (int64_t u = piece * PIECE_UNITS, i = 0; u < p->units && i < PIECE_UNITS; u++, i++)
        unit_tiles(p->inputs, p->padded, p->chunks, p->w, u, c[i]);
}

static void piece_store(const void *args, int64_t piece, const void *scratch) {
    const Product *p = args;
    float(*c)[2][MAX_ROWS * TILE_OUT] = (void *)scratch;
    for (int64_t u = piece * PIECE_UNITS, i = 0; u < p->units && i < PIECE_UNITS; u++, i++)
        store_unit(c[i], p->rows, u, p->out, p->bias, p->y, p->y_stride);
}

/* y = x w^T + bias, w in pack_tiles' layout; 0 on success, 1 where the rows are not 1-16 or the
 * process may not use the tiles. The signature is linear_rows.c's: the fused layers call either. */
int linear_rows(const float *x, int64_t x_stride, int64_t rows, int64_t in, const uint16_t *w, int64_t out,
                const float *bias, float *y, int64_t y_stride) {
    if (rows < 1 || rows > MAX_ROWS || in < 1 || out < 1 || !amx_ready()) return 1;
    int64_t padded = (in + K_CHUNK - 1) / K_CHUNK * K_CHUNK, chunks = padded / K_CHUNK;
    int64_t units = (out + UNIT * TILE_OUT - 1) / (UNIT * TILE_OUT);
    size_t input_bytes = (size_t)(rows * padded * 2 + 63) / 64 * 64;
    int64_t pieces = (units + PIECE_UNITS - 1) / PIECE_UNITS;
    if (shared_active(pieces)) {
        uint16_t *inputs = shared_inputs(input_bytes);
        if (!inputs) return 1;
        round_rows(x, x_stride, rows, in, padded, inputs);
        Product product = {inputs, w, bias, y, rows, padded, chunks, units, out, y_stride};
        configure(rows), configured_rows = rows; /* other kernels on this thread configure their own */
        shared_run(&product, sizeof product, pieces, piece_compute, piece_store);
        _tile_release(), configured_rows = -1;
        return 0;
    }
    uint16_t *inputs = aligned_alloc(64, input_bytes);
    if (!inputs) return 1;
    round_rows(x, x_stride, rows, in, padded, inputs);
#pragma omp parallel
    {
        configure(rows);
        float c[2][MAX_ROWS * TILE_OUT] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            unit_tiles(inputs, padded, chunks, w, u, c);
            store_unit(c, rows, u, out, bias, y, y_stride);
        }
        _tile_release();
        configured_rows = -1;
    }
    free(inputs);
    return 0;
}
