/* What the AMX kernels (linear_rows_amx.c, decode_attention_amx.c) share: the tile configuration's
 * layout and Linux's permission to use the tiles (skipsearch/cpu/native.py hashes this header
 * into both builds). Built with -mamx-tile. */
#pragma once
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The 64-byte operand of LDTILECFG (palette 1: up to 8 tiles of up to 16 rows x 64 bytes). */
typedef struct {
    uint8_t palette, start;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) TileConfig;

/* Linux lends a process the AMX tile state only once asked (arch_prctl ARCH_REQ_XCOMP_PERM);
 * whether it did. Asked once per library. */
static int amx_ready(void) {
    static int state = 0;
    if (!state) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0 ? 1 : -1;
    return state == 1;
}
