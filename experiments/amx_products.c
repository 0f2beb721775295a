/* The harness of experiments/amx_products.py: skipsearch's two products kernels, the AVX-512 build
 * of skipsearch/cpu/linear_rows.c and the AMX kernel skipsearch/cpu/linear_rows_amx.c (each
 * compiled under another name and linked here), timed on a model's decode-step products. It
 * answers whether AMX makes a verify's extra rows free without slowing the one-row step, which is
 * what models/products_choice.py weighs per model (issue 19).
 *
 * argv: repeats, then the model's products as `in out count` triples. Every product's weights are
 * distinct copies, so a pass reads them from memory as a decode step does; for rows 1, 3 and 5 it
 * times one pass of all products on both kernels, alternating, `repeats` times, and prints the
 * medians and quartiles in ms; then it checks, at the first shape, that each row's AMX output is
 * the same bits alone and in a block of 5, and the largest difference of the AMX outputs from a
 * float64 product of the same bf16 inputs. The packers below write each kernel's layout
 * (bf16_weights.pack_tiles and pack_weight's, in C). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TILE_OUT 16 /* outputs of one tile column (skipsearch/cpu/linear_rows_amx.c) */
#define K_CHUNK 32  /* inputs of one tile product */
#define UNIT 2      /* tile columns of one unit */
#define MAX_ROWS 16
#define MAX_IN 16384

/* skipsearch's AMX kernel (linear_rows_amx.c, built with the name amx_rows). */
int amx_rows(const float *, int64_t, int64_t, int64_t, const uint16_t *, int64_t, const float *, float *,
             int64_t);

/* `w` [out][in] bf16 bits into amx_rows' layout (bf16_weights.pack_tiles): units of UNIT tile
 * columns, each a stream of chunks of 32 inputs, each chunk its columns' tiles (16 input pairs x 16
 * outputs x 2), zeros past `out` and `in`. */
static uint16_t *pack(const uint16_t *w, int64_t out, int64_t in) {
    int64_t padded = (in + K_CHUNK - 1) / K_CHUNK * K_CHUNK, units = (out + UNIT * TILE_OUT - 1) / (UNIT * TILE_OUT);
    size_t bytes = (size_t)units * UNIT * TILE_OUT * padded * 2;
    uint16_t *p = aligned_alloc(64, bytes);
    memset(p, 0, bytes);
    for (int64_t u = 0; u < units; u++)
        for (int64_t ch = 0; ch < padded / K_CHUNK; ch++)
            for (int64_t b = 0; b < UNIT; b++)
                for (int64_t pair = 0; pair < 16; pair++)
                    for (int64_t j = 0; j < TILE_OUT; j++)
                        for (int64_t h = 0; h < 2; h++) {
                            int64_t o = (u * UNIT + b) * TILE_OUT + j, k = ch * K_CHUNK + 2 * pair + h;
                            p[((((u * (padded / K_CHUNK) + ch) * UNIT + b) * 16 + pair) * TILE_OUT + j) * 2 + h] =
                                o < out && k < in ? w[o * in + k] : 0;
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
