/* A slot's state for positions [0, n) as one flat buffer, out of the runtime and back (the prompt
 * cache that outlives the process: edgeinfer/engine/prompt_cache.py).
 *
 * Layout, which depends only on the model, the KV type and n (not on n_ctx, slots or max_batch):
 * for each layer that stores KV, for each KV head, the K rows then the V rows of the positions it
 * keeps, as rows of f16 or q8_0 (the arena keeps f16 K in tiles, attention.h): [0, n) for a
 * global layer, the last min(n, swa_window) for a sliding-window layer, which is all a later token
 * of the slot can see; then, with recurrent layers, the recurrent state after n positions
 * (state_floats floats). */
#include <string.h>

#include "common.h"
#include "runtime.h"
#include "state.h"

static ei_status check_args(const ei_runtime *rt, int slot, int32_t n) {
    if (!rt) return ei_fail(EI_ERR_INVALID_ARG, "null runtime");
    if (slot < 0 || slot >= rt->p.n_slots) return ei_fail(EI_ERR_RANGE, "slot %d out of [0, %d)", slot, rt->p.n_slots);
    if (n < 1 || n > rt->p.n_ctx) return ei_fail(EI_ERR_RANGE, "%d positions out of [1, %d]", n, rt->p.n_ctx);
    return EI_OK;
}

size_t ei_runtime_slot_state_size(const ei_runtime *rt, int32_t n) {
    if (!rt || n < 0) return 0;
    const ei_model_config *c = &rt->m->cfg;
    size_t bytes = (size_t)rt->state_floats * sizeof(float);
    for (int l = 0; l < c->n_layer; l++)
        if (ei_layer_stores_kv(c, l))
            bytes += 2 * (size_t)c->n_head_kv * (size_t)(n - ei_first_kept(rt, l, n)) * ei_layer_kv_row_bytes(rt, l);
    return bytes;
}

/* Copies every kept row between the arena and buf (save: arena -> buf); returns the bytes walked. */
static size_t walk_rows(ei_runtime *rt, int slot, int32_t n, uint8_t *buf, int save) {
    const ei_model_config *c = &rt->m->cfg;
    size_t at = 0;
    for (int l = 0; l < c->n_layer; l++) {
        if (!ei_layer_stores_kv(c, l)) continue;
        const size_t row = ei_layer_kv_row_bytes(rt, l);
        const int32_t cells = (int32_t)ei_layer_cells(rt, l);
        for (int h = 0; h < c->n_head_kv; h++)
            for (int kv = 0; kv < 2; kv++) {
                uint8_t *base = (kv ? rt->v : rt->k) + ei_kv_offset(rt, slot, l, h);
                for (int32_t p = ei_first_kept(rt, l, n); p < n; p++, at += row) {
                    const size_t cell = ei_cell_of(rt, l, p);
                    if (!kv) {   /* K in the arena's layout (F16: tiles), rows in buf */
                        ei_k_cell_io(rt->p.kv_type, base, (int32_t)cell, cells, ei_layer_head_dim(c, l), buf + at, save);
                        continue;
                    }
                    memcpy(save ? buf + at : base + cell * row, save ? base + cell * row : buf + at, row);
                }
            }
    }
    return at;
}

ei_status ei_runtime_save_slot(ei_runtime *rt, int slot, int32_t n, void *buf, size_t size) {
    ei_status st = check_args(rt, slot, n);
    if (st != EI_OK) return st;
    if (!buf || size != ei_runtime_slot_state_size(rt, n))
        return ei_fail(EI_ERR_INVALID_ARG, "save_slot: buffer of %zu bytes, %zu wanted", size,
                       ei_runtime_slot_state_size(rt, n));
    if ((st = ei_check_prefix(rt, slot, n)) != EI_OK) return st;
    const float *state = NULL;
    if (rt->state && !(state = ei_state_at(rt, slot, n)))
        return ei_fail(EI_ERR_STATE, "slot %d kept no recurrent state after %d positions", slot, n);
    const size_t at = walk_rows(rt, slot, n, buf, 1);
    if (state) memcpy((uint8_t *)buf + at, state, (size_t)rt->state_floats * sizeof(float));
    return EI_OK;
}

ei_status ei_runtime_load_slot(ei_runtime *rt, int slot, int32_t n, const void *buf, size_t size) {
    ei_status st = check_args(rt, slot, n);
    if (st != EI_OK) return st;
    if (!buf || size != ei_runtime_slot_state_size(rt, n))
        return ei_fail(EI_ERR_INVALID_ARG, "load_slot: buffer of %zu bytes, %zu wanted", size,
                       ei_runtime_slot_state_size(rt, n));
    if ((st = ei_runtime_clear_slot(rt, slot)) != EI_OK) return st;
    const size_t at = walk_rows(rt, slot, n, (uint8_t *)buf, 0);
    int32_t *cp = rt->cell_pos + (size_t)slot * rt->p.n_ctx;
    for (int32_t p = 0; p < n; p++) cp[p] = p;
    rt->n_used[slot] = n;
    if (rt->local_cells) {
        int32_t *lp = rt->local_cell_pos + (size_t)slot * rt->local_cells;
        for (int32_t p = ei_window_first(&rt->m->cfg, n); p < n; p++) lp[p % rt->local_cells] = p;
        rt->local_used[slot] = EI_MIN(n, rt->local_cells);
    }
    if (rt->state) ei_state_put(rt, slot, n, (const float *)((const uint8_t *)buf + at));
    return EI_OK;
}
