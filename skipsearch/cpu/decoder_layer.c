/* A decoder layer's sub-layers for a short block, each in one call: the C driver of the fused
 * layers (skipsearch/cpu/fused_layers.py builds the Layer and loads this; docs/cpu-backend.md).
 *
 * Why it exists: a fused layer's attention sub-layer is seven kernel calls and its MLP four, and
 * driving them from Python cost ~130 us a layer on a CPU with AMX, in torch's dispatch of the
 * small operations between them (allocations, the value rows' copy, the activation's slices, the
 * residual sums) and ctypes' argument conversion: 4 ms of SmolLM2's 21 ms decode step, whose
 * kernels read the weights in the rest. Here the same kernels run in the same order on the same
 * buffers, called through the function pointers the Python side loaded (each keeps its own build
 * and flags), and what lay between them is plain C: so every output is the bits the Python driver
 * computed (tested against the modules' path).
 *
 * Layout: hidden and out are rows x hidden floats; the K/V buffers are [kv_heads][capacity][dim]
 * (float32, or bf16 where `Attend.bf16`: rounded as torch rounds) and the block's rows go to
 * positions [start, start + rows); cos and sin are rows x dim; the
 * pillars [kv_heads][extra][dim]; scores, where given, [heads][start + rows] (decode_attention_fp32.c).
 * Returns 0, or the first nonzero status of a kernel (or -1 when memory runs out), the cache rows
 * then partly written.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*linear_rows_fn)(const float *x, int64_t x_stride, int64_t rows, int64_t in, const uint16_t *w,
                              int64_t out, const float *bias, float *y, int64_t y_stride);
typedef int (*rms_norm_fn)(const float *x, int64_t rows, int64_t n, const float *weight, float eps, float *y);
typedef int (*rotary_fn)(const float *q, int64_t q_heads, int64_t q_head_stride, int64_t q_row_stride,
                         float *q_out, int64_t q_out_head_stride, int64_t q_out_row_stride, const float *k,
                         int64_t k_heads, int64_t k_head_stride, int64_t k_row_stride, float *k_out,
                         int64_t k_out_head_stride, int64_t k_out_row_stride, int64_t rows, int64_t dim,
                         const float *cos, const float *sin);
/* k, v and the extra keys are float32, or bf16 where the cache is (decode_attention_amx.c). */
typedef int (*attention_fn)(const float *q, int64_t q_head_stride, int64_t q_row_stride, const void *k,
                            const void *v, int64_t kv_stride, float *out, int64_t heads, int64_t kv_heads,
                            int64_t queries, int64_t dim, int64_t length, int64_t sink, int64_t window,
                            float scale, const void *extra_k, const void *extra_v, int64_t extra,
                            float *scores, const uint32_t *tree, int64_t tree_base);
typedef int (*silu_fn)(const float *x, int64_t rows, int64_t n, int64_t x_stride, float *y, int64_t y_stride);
/* linear_rows_int.c's products: int8 with a float32 scale per output, int4 with bf16 (scale, zero) pairs per group. */
typedef int (*linear_int8_fn)(const float *x, int64_t x_stride, int64_t rows, int64_t in, const int8_t *w,
                              const float *scale, int64_t out, const float *bias, float *y, int64_t y_stride);
typedef int (*linear_int4_fn)(const float *x, int64_t x_stride, int64_t rows, int64_t in, const uint32_t *w,
                              const uint32_t *params, int64_t group, int64_t out, const float *bias, float *y,
                              int64_t y_stride);

/* The kernels and one layer's shapes and weights, fixed for the layer's life. The products' weights are
 * in linear_rows.c's packed layout (bits 0: `linear` multiplies), or at lower precision in
 * linear_rows_int.c's (bits 8 or 4: `linear_int` multiplies, each product's `aux` its int8 scales or its
 * int4 groups' pairs, in groups of `group`); a bias may be NULL. A sub-layer a lower-precision layer does
 * not hold has NULL weights and is never called (fused_layers.py). */
typedef struct {
    linear_rows_fn linear;
    rms_norm_fn norm;
    rotary_fn rotary;
    attention_fn attention;
    silu_fn silu;
    int64_t hidden, heads, kv_heads, dim, intermediate;
    float scale, input_eps, mlp_eps;
    const float *input_norm, *mlp_norm;
    const void *qkv, *o, *gate_up, *down;
    const float *qkv_bias, *o_bias, *gate_up_bias, *down_bias;
    double *product_seconds; /* NULL, or where the products' wall time is added (experiments/step_anatomy.py) */
    int64_t bits, group;
    void *linear_int; /* linear_int8_fn or linear_int4_fn, as `bits` says */
    const void *qkv_aux, *o_aux, *gate_up_aux, *down_aux;
} Layer;

/* One attention call's cache and keys: float32, or bf16 where `bf16` (the AMX kernel's cache, whose
 * keys and values it would round to bf16 anyway; the pillars then bf16 too). */
typedef struct {
    void *keys, *values;
    int64_t capacity, start, sink, window, extra, bf16;
    const float *cos, *sin;
    const void *extra_keys, *extra_values;
    float *scores;
    const uint32_t *tree; /* NULL, or a token tree's bits a row from key tree_base (decode_attention_keys.h) */
    int64_t tree_base;
} Attend;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The layer's product of `rows` rows of x (`in` floats each) with `w` (and its `aux`): linear_rows, or
 * the int8 or int4 kernel, timed where asked. */
static int product(const Layer *l, const float *x, int64_t rows, int64_t in, const void *w, const void *aux,
                   int64_t out, const float *bias, float *y) {
    double began = l->product_seconds ? now() : 0.0;
    int status;
    if (l->bits == 8)
        status = ((linear_int8_fn)l->linear_int)(x, in, rows, in, w, aux, out, bias, y, out);
    else if (l->bits == 4)
        status = ((linear_int4_fn)l->linear_int)(x, in, rows, in, w, aux, l->group, out, bias, y, out);
    else
        status = l->linear(x, in, rows, in, w, out, bias, y, out);
    if (l->product_seconds) *l->product_seconds += now() - began;
    return status;
}

/* x rounded to bf16 as torch rounds it (nearest even; a NaN stays a quiet NaN). */
static uint16_t to_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* `rows` rows of `n` floats (row r at x + r * x_stride) into the bf16 cache rows of K/V head h
 * (`heads` heads of `n / heads` floats each, head h's position p at y + h * head_stride + p * dim). */
static void store_bf16(const float *x, int64_t x_stride, int64_t rows, int64_t heads, int64_t dim, uint16_t *y,
                       int64_t head_stride, int64_t start) {
    for (int64_t h = 0; h < heads; h++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t d = 0; d < dim; d++)
                y[h * head_stride + (start + r) * dim + d] = to_bf16(x[r * x_stride + h * dim + d]);
}

/* out = x + out, element by element (the residual: torch's `hidden + y`, the same IEEE sums). */
static void add_residual(const float *x, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = x[i] + out[i];
}

int layer_attention(const Layer *l, const Attend *a, const float *hidden, int64_t rows, float *out) {
    const int64_t q_width = l->heads * l->dim, kv_width = l->kv_heads * l->dim;
    const int64_t width = q_width + 2 * kv_width, head_stride = a->capacity * l->dim;
    float *normed = malloc(sizeof(float) * rows * l->hidden), *qkv = malloc(sizeof(float) * rows * width);
    float *query = malloc(sizeof(float) * rows * q_width), *attended = malloc(sizeof(float) * rows * q_width);
    float *turned = a->bf16 ? malloc(sizeof(float) * rows * kv_width) : NULL; /* the keys, before rounding */
    int status = -1;
    if (normed && qkv && query && attended && (turned || !a->bf16)) {
        status = l->norm(hidden, rows, l->hidden, l->input_norm, l->input_eps, normed);
        if (!status) status = product(l, normed, rows, l->hidden, l->qkv, l->qkv_aux, width, l->qkv_bias, qkv);
        /* the rotated keys go straight into a float32 cache, or into `turned` to be rounded */
        float *keys = a->bf16 ? turned : (float *)a->keys + a->start * l->dim;
        const int64_t keys_head_stride = a->bf16 ? l->dim : head_stride;
        const int64_t keys_row_stride = a->bf16 ? kv_width : l->dim;
        if (!status)
            status = l->rotary(qkv, l->heads, l->dim, width, query, l->dim, q_width, qkv + q_width, l->kv_heads,
                               l->dim, width, keys, keys_head_stride, keys_row_stride, rows, l->dim, a->cos, a->sin);
        if (!status) {
            if (a->bf16) {
                store_bf16(turned, kv_width, rows, l->kv_heads, l->dim, a->keys, head_stride, a->start);
                store_bf16(qkv + q_width + kv_width, width, rows, l->kv_heads, l->dim, a->values, head_stride,
                           a->start);
            } else
                for (int64_t h = 0; h < l->kv_heads; h++)
                    for (int64_t r = 0; r < rows; r++)
                        memcpy((float *)a->values + h * head_stride + (a->start + r) * l->dim,
                               qkv + r * width + q_width + kv_width + h * l->dim, sizeof(float) * l->dim);
            status = l->attention(query, l->dim, q_width, a->keys, a->values, head_stride, attended, l->heads,
                                  l->kv_heads, rows, l->dim, a->start + rows, a->sink, a->window, l->scale,
                                  a->extra_keys, a->extra_values, a->extra, a->scores, a->tree, a->tree_base);
        }
        if (!status) status = product(l, attended, rows, q_width, l->o, l->o_aux, l->hidden, l->o_bias, out);
        if (!status) add_residual(hidden, rows * l->hidden, out);
    }
    free(normed), free(qkv), free(query), free(attended), free(turned);
    return status;
}

int layer_mlp(const Layer *l, const float *hidden, int64_t rows, float *out) {
    const int64_t inner = l->intermediate;
    float *normed = malloc(sizeof(float) * rows * l->hidden), *gate_up = malloc(sizeof(float) * rows * 2 * inner);
    float *act = malloc(sizeof(float) * rows * inner);
    int status = -1;
    if (normed && gate_up && act) {
        status = l->norm(hidden, rows, l->hidden, l->mlp_norm, l->mlp_eps, normed);
        if (!status)
            status = product(l, normed, rows, l->hidden, l->gate_up, l->gate_up_aux, 2 * inner, l->gate_up_bias,
                             gate_up);
        if (!status) status = l->silu(gate_up, rows, inner, 2 * inner, act, inner);
        if (!status) {
            for (int64_t r = 0; r < rows; r++) /* act_fn(gate) * up: the activation rounded, then the product */
                for (int64_t j = 0; j < inner; j++) act[r * inner + j] *= gate_up[r * 2 * inner + inner + j];
            status = product(l, act, rows, inner, l->down, l->down_aux, l->hidden, l->down_bias, out);
        }
        if (!status) add_residual(hidden, rows * l->hidden, out);
    }
    free(normed), free(gate_up), free(act);
    return status;
}
