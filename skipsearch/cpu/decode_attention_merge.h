/* The last step of the float32-output decode-attention kernels, decode_attention_fp32.c and
 * decode_attention_amx.c: each K/V head's chunks leave, per row, a running maximum, a softmax
 * denominator and an unnormalised output ([m: rows][l: rows][acc: rows x dim], `stride` floats a
 * unit and head), merged here in the chunks' order, so which thread ran a chunk changes nothing
 * (skipsearch/cpu/native.py hashes this header into both builds). */
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The chunks' partial results of row r merged in order and normalised into `o`. */
static void merge_row(const float *partial, int64_t chunks, int64_t stride, int64_t rows, int64_t dim,
                      int64_t r, float *o) {
    float top = -INFINITY, total = 0.0f;
    for (int64_t c = 0; c < chunks; c++) top = partial[c * stride + r] > top ? partial[c * stride + r] : top;
    memset(o, 0, sizeof(float) * dim);
    for (int64_t c = 0; c < chunks; c++) {
        const float *base = partial + c * stride;
        if (base[r] == -INFINITY) continue;
        float w = expf(base[r] - top);
        total += w * base[rows + r];
        for (int64_t j = 0; j < dim; j++) o[j] += w * base[2 * rows + r * dim + j];
    }
    for (int64_t j = 0; j < dim; j++) o[j] /= total;
}

/* Every row of every K/V head merged into `out` [queries][heads][dim]: row r of head h is query
 * r % queries of query head h * (heads / kv_heads) + r / queries. */
static void merge_rows(const float *partial, int64_t units, int64_t kv_heads, int64_t stride, int64_t rows,
                       int64_t queries, int64_t heads, int64_t dim, float *out) {
    int64_t group = heads / kv_heads;
    for (int64_t h = 0; h < kv_heads; h++)
        for (int64_t r = 0; r < rows; r++)
            merge_row(partial + h * stride, units, kv_heads * stride, rows, dim, r,
                      out + ((r % queries) * heads + h * group + r / queries) * dim);
}
