/* The recurrent layers' per-slot state in fixed memory (state.c): each slot's live state and a
 * fixed number of kept copies, named by the positions they have seen, for prefix reuse, n > 1
 * siblings and speculative rollback (ei_runtime_restore_state / copy_prefix). A recurrent layer's
 * forward (recurrent.c) reads and updates ei_state_of() in token order and, after a keep row,
 * calls ei_state_keep_row() so the copy holds every layer as it was after that row. */
#ifndef EI_STATE_H
#define EI_STATE_H
#include "runtime.h"

/* Allocates the states (none when the model has no recurrent layer); bytes into *total. */
ei_status ei_state_create(ei_runtime *rt, size_t *total);
void ei_state_free(ei_runtime *rt);

/* Layer l's live state of a slot. */
static inline float *ei_state_of(const ei_runtime *rt, int slot, int l) {
    return rt->state + (size_t)slot * rt->state_floats + rt->state_off[l];
}

/* Each slot's rows continue its live state in position order (EI_ERR_STATE otherwise); then
 * picks the kept copy each keep row fills. Call before the layers run. */
ei_status ei_state_begin(ei_runtime *rt, int32_t n_tokens, const int32_t *slots, const int32_t *pos, int32_t n_keep,
                         const int32_t *keep_rows);
/* After row `row` (of slot `slot`) of layer l: into its kept copy, if the row is a keep row. */
static inline void ei_state_keep_row(const ei_runtime *rt, int l, int slot, int64_t row) {
    const int32_t k = rt->keep_snap[row];
    if (k < 0) return;
    float *dst = rt->snap + ((size_t)slot * rt->p.n_snapshots + k) * rt->state_floats + rt->state_off[l];
    const float *src = ei_state_of(rt, slot, l);
    for (int64_t i = 0; i < ei_layer_state_floats(&rt->m->cfg, l); i++) dst[i] = src[i];
}
/* After the layers: each slot's live state has seen its last row's position + 1. */
void ei_state_end(ei_runtime *rt, int32_t n_tokens, const int32_t *slots, const int32_t *pos);

/* forget_from's and copy_prefix's part for the states (slots already checked). */
void ei_state_forget(ei_runtime *rt, int slot, int32_t pos);
ei_status ei_state_copy(ei_runtime *rt, int src, int dst, int32_t n);
/* The slot's state after n positions: a kept copy, or the live state when it has seen n; NULL: neither. */
const float *ei_state_at(const ei_runtime *rt, int slot, int32_t n);
/* The slot's live state becomes `from` (state_floats floats) after n positions, and the slot keeps a copy. */
void ei_state_put(ei_runtime *rt, int slot, int32_t n, const float *from);
#endif
