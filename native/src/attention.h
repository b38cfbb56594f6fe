/* Attention over a slot's KV ring: f16 K/V, f32 query and accumulation. */
#ifndef EI_ATTENTION_H
#define EI_ATTENTION_H
#include <stdint.h>

/* out[0..hd) = sum_c softmax(scale * q.K[c])_c * V[c] over the cells c < n_cells
 * with 0 <= cell_pos[c] <= pos. scores needs n_cells floats. Cells are visited
 * in index order whatever the batch, so results are batch-invariant. */
void ei_attend_head(int isa, const float *q, const uint16_t *k, const uint16_t *v, const int32_t *cell_pos,
                    int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *out);
#endif
