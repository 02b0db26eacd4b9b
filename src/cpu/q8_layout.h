/* q8_layout.h: the sizes of FM_LAYOUT_Q8_VNNI4 (matmul.h) shared by the repacking and the VNNI kernel. */
#ifndef FM_CPU_Q8_LAYOUT_H
#define FM_CPU_Q8_LAYOUT_H

#include "cpu/matmul.h"

enum {
    FM_VNNI4_BLOCKS = 16,                     /* Q8_0 blocks per group */
    FM_VNNI4_COLS = FM_VNNI4_BLOCKS * 32,     /* columns per group */
    FM_VNNI4_QUANTS = FM_VNNI4_COLS,          /* bytes of one row's quants in a group */
    FM_VNNI4_GROUP = 4 * FM_VNNI4_BLOCKS * 34 /* bytes of a unit-group: 4 rows' quants, then their scales */
};

/* Whether w can be repacked: Q8_0 in rows, rows % 4 == 0, cols % 512 == 0. */
int fm_q8_vnni4_shape_ok(const fm_matrix *w);

#endif
