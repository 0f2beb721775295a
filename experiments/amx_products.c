/* A prototype of the products on AMX tiles, timed against skipsearch's AVX-512 products kernel
 * (skipsearch/models/linear_rows.c) by experiments/amx_products.py, which builds both and runs this
 * harness. Not part of the package: it answers whether AMX can make a verify's extra rows free
 * without slowing the one-row step, before the kernel plan is changed for it (issue 19).
 *
 * The prototype: y = x w^T (+ bias) for 1-16 rows, x rounded to bf16 (AMX multiplies bf16 pairs
 * and sums in float32), w bf16 in tiles of 16 outputs x 32 inputs, VNNI-paired. Outputs are
 * split over threads in units of UNIT tile columns (32 outputs: small matrices still split
 * evenly over two threads); a unit's weights are one contiguous stream, chunk by chunk of 32
 * inputs, each chunk staged through an L1 buffer with vector loads (which the memory system runs
 * many at a time; tile loads straight from memory streamed ~10% slower) and prefetched AHEAD bytes
 * into L2. Each output is one C tile element summed over the chunks in order: the same
 * operations whatever the row count, so its bits do not depend on the rows beside it (checked).
 *
 * The harness (argv: repeats, then the model's products as `in out` pairs with a count each,
 * `in out count`): every product's weights are distinct copies, so a pass reads them from memory
 * as a decode step does; for rows 1, 3 and 5 it times one pass of all products on both kernels,
 * alternating, `repeats` times, and prints the medians and quartiles in ms; then it checks, at the
 * first shape, that each row's AMX output is the same bits alone and in a block of 5, and the
 * largest difference of the AMX outputs from a float64 product of the same bf16 inputs. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define TILE_OUT 16  /* outputs of one tile column */
#define K_CHUNK 32   /* inputs of one tile product */
#define UNIT 2       /* tile columns a thread takes at a time */
#define MAX_ROWS 16
#define MAX_IN 16384
#define AHEAD 8192   /* bytes prefetched into L2 ahead of the staged chunk */

typedef struct {
    uint8_t palette, start;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) TileConfig;

/* Linux lends a process the AMX tile state only once asked (arch_prctl ARCH_REQ_XCOMP_PERM). */
static int amx_permitted(void) {
    static int state = 0;
    if (!state) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0 ? 1 : -1;
    return state == 1;
}

/* Tiles 0-1: the unit's outputs (rows x 16 floats); 2: the rows' inputs (rows x 32 bf16); 3-4: weights. */
static void configure(int64_t rows) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 3; t++) c.rows[t] = (uint8_t)rows, c.colsb[t] = 64;
    for (int t = 3; t < 5; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* w in the layout `pack` writes; returns 1 where the shape is outside what it reads. */
int amx_rows(const float *x, int64_t x_stride, int64_t rows, int64_t in, const uint16_t *w, int64_t out,
             const float *bias, float *y, int64_t y_stride) {
    int64_t padded = (in + K_CHUNK - 1) / K_CHUNK * K_CHUNK, chunks = padded / K_CHUNK;
    if (rows < 1 || rows > MAX_ROWS || padded > MAX_IN || out < 1 || !amx_permitted()) return 1;
    int64_t columns = (out + TILE_OUT - 1) / TILE_OUT, units = (columns + UNIT - 1) / UNIT;
    /* this thread's buffer, which every thread of the region below reads through the pointer */
    static __thread uint16_t buffer[MAX_ROWS * MAX_IN] __attribute__((aligned(64)));
    uint16_t *inputs = buffer;
    for (int64_t r = 0; r < rows; r++) /* rounded to bf16 (nearest even), zeros past `in` */
        for (int64_t k = 0; k < padded; k += 32) {
            int64_t n = in - k < 32 ? (in - k > 0 ? in - k : 0) : 32;
            __mmask16 low = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1);
            __mmask16 high = n >= 32 ? 0xFFFF : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
            const float *xr = x + r * x_stride + k;
            __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(high, xr + 16), _mm512_maskz_loadu_ps(low, xr));
            _mm512_store_si512((void *)(inputs + r * padded + k), (__m512i)v);
        }
#pragma omp parallel
    {
        configure(rows);
        float c[MAX_ROWS * TILE_OUT] __attribute__((aligned(64)));
        char stage[UNIT * 1024] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            int64_t first = u * UNIT, count = columns - first < UNIT ? columns - first : UNIT;
            const char *stream = (const char *)w + first * padded * TILE_OUT * 2;
            _tile_zero(0);
            _tile_zero(1);
            for (int64_t ch = 0; ch < chunks; ch++) {
                const char *chunk = stream + ch * count * 1024;
                for (int64_t at = 0; at < count * 1024; at += 64) {
                    _mm_prefetch(chunk + AHEAD + at, _MM_HINT_T1);
                    _mm512_store_si512((void *)(stage + at), _mm512_loadu_si512((const void *)(chunk + at)));
                }
                _tile_loadd(2, inputs + ch * K_CHUNK, padded * 2);
                _tile_loadd(3, stage, 64);
                _tile_dpbf16ps(0, 2, 3);
                if (count > 1) {
                    _tile_loadd(4, stage + 1024, 64);
                    _tile_dpbf16ps(1, 2, 4);
                }
            }
            for (int64_t b = 0; b < count; b++) {
                if (b == 0)
                    _tile_stored(0, c, 64);
                else
                    _tile_stored(1, c, 64);
                int64_t o0 = (first + b) * TILE_OUT, n = out - o0 < TILE_OUT ? out - o0 : TILE_OUT;
                __mmask16 m = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1);
                for (int64_t r = 0; r < rows; r++) {
                    __m512 v = _mm512_load_ps(c + r * TILE_OUT);
                    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + o0));
                    _mm512_mask_storeu_ps(y + r * y_stride + o0, m, v);
                }
            }
        }
        _tile_release();
    }
    return 0;
}

/* `w` [out][in] bf16 bits into amx_rows' layout: units of UNIT tile columns, each a stream of
 * chunks of 32 inputs, each chunk its columns' tiles (16 input pairs x 16 outputs x 2), zeros past
 * `out` and `in`. */
static uint16_t *pack(const uint16_t *w, int64_t out, int64_t in) {
    int64_t padded = (in + K_CHUNK - 1) / K_CHUNK * K_CHUNK, columns = (out + TILE_OUT - 1) / TILE_OUT;
    uint16_t *p = aligned_alloc(64, (size_t)columns * TILE_OUT * padded * 2 + AHEAD + 4096);
    memset(p, 0, (size_t)columns * TILE_OUT * padded * 2 + AHEAD + 4096);
    for (int64_t first = 0; first < columns; first += UNIT) {
        int64_t count = columns - first < UNIT ? columns - first : UNIT;
        uint16_t *stream = p + first * padded * TILE_OUT;
        for (int64_t ch = 0; ch < padded / K_CHUNK; ch++)
            for (int64_t b = 0; b < count; b++)
                for (int64_t pair = 0; pair < 16; pair++)
                    for (int64_t j = 0; j < TILE_OUT; j++)
                        for (int64_t h = 0; h < 2; h++) {
                            int64_t o = (first + b) * TILE_OUT + j, k = ch * K_CHUNK + 2 * pair + h;
                            stream[((ch * count + b) * 16 + pair) * 32 + j * 2 + h] =
                                o < out && k < in ? w[o * in + k] : 0;
                        }
    }
    return p;
}

/* skipsearch's kernel (linear_rows.c, built with the name avx512_rows) and its packing: blocks of 2
 * outputs, chunks of 16 inputs, the two outputs' values paired. */
int avx512_rows(const float *, int64_t, int64_t, int64_t, const uint16_t *, int64_t, const float *, float *,
                int64_t);
static uint16_t *pack_pairs(const uint16_t *w, int64_t out, int64_t in) {
    int64_t padded = (in + 15) / 16 * 16, blocks = (out + 1) / 2;
    uint16_t *p = aligned_alloc(64, (size_t)blocks * 2 * padded * 2 + 8192 + 4096);
    memset(p, 0, (size_t)blocks * 2 * padded * 2 + 8192 + 4096);
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t k = 0; k < padded; k++)
            for (int64_t h = 0; h < 2; h++) {
                int64_t o = 2 * b + h;
                p[(b * padded + k) * 2 + h] = o < out && k < in ? w[o * in + k] : 0;
            }
    return p;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_bf16(float f) { /* nearest even, as the kernels round */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

int main(int argc, char **argv) {
    if (argc < 5 || (argc - 2) % 3) {
        fprintf(stderr, "usage: %s REPEATS IN OUT COUNT [IN OUT COUNT ...]\n", argv[0]);
        return 2;
    }
    int repeats = atoi(argv[1]), shapes = (argc - 2) / 3, total = 0;
    int64_t in[16], out[16], count[16];
    for (int s = 0; s < shapes; s++) {
        in[s] = atoll(argv[2 + 3 * s]), out[s] = atoll(argv[3 + 3 * s]), count[s] = atoll(argv[4 + 3 * s]);
        total += (int)count[s];
    }
    uint16_t **amx = malloc(sizeof(uint16_t *) * total), **pairs = malloc(sizeof(uint16_t *) * total);
    int64_t *call_in = malloc(sizeof(int64_t) * total), *call_out = malloc(sizeof(int64_t) * total);
    srand(7);
    for (int s = 0, i = 0; s < shapes; s++)
        for (int c = 0; c < count[s]; c++, i++) {
            uint16_t *w = malloc(sizeof(uint16_t) * out[s] * in[s]);
            for (int64_t e = 0; e < out[s] * in[s]; e++) w[e] = to_bf16(((float)rand() / RAND_MAX - 0.5f) * 0.1f);
            amx[i] = pack(w, out[s], in[s]), pairs[i] = pack_pairs(w, out[s], in[s]);
            call_in[i] = in[s], call_out[i] = out[s];
            free(w);
        }
    int64_t widest = 0;
    for (int s = 0; s < shapes; s++) widest = out[s] > widest ? out[s] : widest;
    float *x = malloc(sizeof(float) * MAX_ROWS * MAX_IN), *y = malloc(sizeof(float) * MAX_ROWS * widest);
    for (int64_t e = 0; e < MAX_ROWS * MAX_IN; e++) x[e] = (float)rand() / RAND_MAX - 0.5f;
    const int row_counts[3] = {1, 3, 5};
    double *seconds = malloc(sizeof(double) * 2 * 3 * repeats);
    for (int rep = -1; rep < repeats; rep++) /* one round first, untimed: both kernels warm up */
        for (int ri = 0; ri < 3; ri++)
            for (int turn = 0; turn < 2; turn++) {
                int kernel = (rep + turn) % 2 ? 1 : 0; /* the order flips every repeat */
                double began = now();
                for (int i = 0; i < total; i++) {
                    int failed = kernel ? amx_rows(x, call_in[i], row_counts[ri], call_in[i], amx[i], call_out[i],
                                                   NULL, y, call_out[i])
                                        : avx512_rows(x, call_in[i], row_counts[ri], call_in[i], pairs[i],
                                                      call_out[i], NULL, y, call_out[i]);
                    if (failed) {
                        fprintf(stderr, "kernel %d refused a %lld x %lld product\n", kernel, (long long)call_out[i],
                                (long long)call_in[i]);
                        return 1;
                    }
                }
                if (rep >= 0) seconds[(kernel * 3 + ri) * repeats + rep] = now() - began;
            }
    for (int kernel = 0; kernel < 2; kernel++)
        for (int ri = 0; ri < 3; ri++) {
            double *s = seconds + (kernel * 3 + ri) * repeats;
            qsort(s, repeats, sizeof(double), by_value);
            printf("%s rows %d: %.3f ms (%.3f-%.3f)\n", kernel ? "amx" : "avx512", row_counts[ri],
                   1e3 * s[repeats / 2], 1e3 * s[repeats / 4], 1e3 * s[3 * repeats / 4]);
        }
    /* bits alone and in a block, and the distance from a float64 product of the same bf16 values */
    float *block = malloc(sizeof(float) * 5 * out[0]), *alone = malloc(sizeof(float) * out[0]);
    amx_rows(x, in[0], 5, in[0], amx[0], out[0], NULL, block, out[0]);
    int same = 1;
    double largest = 0.0, scale = 0.0;
    uint16_t *w = malloc(sizeof(uint16_t) * out[0] * in[0]);
    srand(7); /* the first matrix again */
    for (int64_t e = 0; e < out[0] * in[0]; e++) w[e] = to_bf16(((float)rand() / RAND_MAX - 0.5f) * 0.1f);
    for (int r = 0; r < 5; r++) {
        amx_rows(x + r * in[0], in[0], 1, in[0], amx[0], out[0], NULL, alone, out[0]);
        same &= memcmp(alone, block + r * out[0], sizeof(float) * out[0]) == 0;
        for (int64_t o = 0; o < out[0]; o++) {
            double exact = 0.0;
            for (int64_t k = 0; k < in[0]; k++)
                exact += (double)from_bf16(to_bf16(x[r * in[0] + k])) * (double)from_bf16(w[o * in[0] + k]);
            double d = exact - block[r * out[0] + o];
            largest = d * d > largest * largest ? (d < 0 ? -d : d) : largest;
            scale = exact * exact > scale * scale ? (exact < 0 ? -exact : exact) : scale;
        }
    }
    printf("same bits alone and in a block of 5: %s\n", same ? "yes" : "no");
    printf("largest difference from float64 on the same bf16 inputs: %.2e of the largest output\n", largest / scale);
    return 0;
}
