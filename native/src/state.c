/* The recurrent layers' per-slot states and their kept copies (state.h). */
#include "state.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "recurrent.h"

static void *alloc_zeroed(size_t bytes, size_t *total) {
    *total += bytes;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}

ei_status ei_state_create(ei_runtime *rt, size_t *total) {
    const ei_model_config *c = &rt->m->cfg;
    int64_t floats = 0;
    size_t scratch = 0;
    rt->state_off = alloc_zeroed((size_t)c->n_layer * sizeof(int64_t), &scratch);
    if (!rt->state_off) return EI_ERR_OUT_OF_MEMORY;
    for (int l = 0; l < c->n_layer; l++) {
        rt->state_off[l] = floats;
        floats += (ei_layer_state_floats(c, l) + 15) & ~(int64_t)15;   /* each block on a cache line */
    }
    rt->state_floats = floats;
    if (!floats) return EI_OK;
    if (rt->p.n_snapshots < 0 || rt->p.n_snapshots > 4096)
        return ei_fail(EI_ERR_INVALID_ARG, "n_snapshots=%d out of [0, 4096]", rt->p.n_snapshots);
    const size_t slots = (size_t)rt->p.n_slots, kept = slots * (size_t)rt->p.n_snapshots;
    rt->state = alloc_zeroed(slots * (size_t)floats * sizeof(float), total);
    rt->snap = alloc_zeroed(kept * (size_t)floats * sizeof(float), total);
    rt->state_seen = alloc_zeroed(slots * sizeof(int32_t), &scratch);
    rt->snap_n = alloc_zeroed(kept * sizeof(int32_t) + 1, &scratch);
    rt->keep_snap = alloc_zeroed((size_t)rt->p.max_batch * sizeof(int32_t), &scratch);
    rt->rec_a = alloc_zeroed((size_t)rt->p.max_batch * 3 * c->n_embd * sizeof(float), &scratch);
    rt->rec_b = alloc_zeroed((size_t)rt->p.max_batch * 2 * c->n_embd * sizeof(float), &scratch);
    /* the conv taps, turned tap-major once so the kernels run across channels */
    int64_t taps = 0;
    for (int l = 0; l < c->n_layer; l++) taps += c->conv_kernel * ei_layer_conv_channels(c, l);
    rt->conv_taps = alloc_zeroed((size_t)c->n_layer * sizeof(float *), &scratch);
    rt->taps_arena = alloc_zeroed((size_t)taps * sizeof(float), &scratch);
    const int64_t dn = ei_deltanet_scratch_floats(rt);
    rt->dn_buf = dn ? alloc_zeroed((size_t)dn * sizeof(float), &scratch) : NULL;
    rt->scratch_bytes += scratch;
    if ((dn && !rt->dn_buf) || !rt->state || !rt->snap || !rt->state_seen || !rt->snap_n || !rt->keep_snap || !rt->rec_a || !rt->rec_b ||
        !rt->conv_taps || !rt->taps_arena)
        return EI_ERR_OUT_OF_MEMORY;
    float *at = rt->taps_arena;
    for (int l = 0; l < c->n_layer; l++) {
        const int64_t ch = ei_layer_conv_channels(c, l), K = c->conv_kernel;
        if (!ch) continue;
        const int kind = ei_layer_kind_of(c, l);
        const ei_weight *w = kind == EI_LAYER_SHORTCONV ? &rt->m->layers[l].shortconv_conv
                             : kind == EI_LAYER_DELTANET ? &rt->m->layers[l].ssm_conv1d : NULL;
        if (!w || !w->data || w->ne0 != K || w->ne1 != ch)
            return ei_fail(EI_ERR_INVALID_ARG, "layer %d: conv taps [%d, %lld] missing", l, (int)K, (long long)ch);
        const float *src = w->data;   /* [channel][k] */
        for (int64_t ci = 0; ci < ch; ci++)
            for (int64_t k = 0; k < K; k++) at[k * ch + ci] = src[ci * K + k];
        rt->conv_taps[l] = at;
        at += K * ch;
    }
    for (size_t i = 0; i < kept; i++) rt->snap_n[i] = -1;
    return EI_OK;
}

void ei_state_free(ei_runtime *rt) {
    void *bufs[] = {rt->state, rt->snap, rt->state_off, rt->state_seen, rt->snap_n, rt->keep_snap, rt->rec_a,
                    rt->rec_b, rt->conv_taps, rt->taps_arena, rt->dn_buf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static float *snap_at(const ei_runtime *rt, int slot, int k) {
    return rt->snap + ((size_t)slot * rt->p.n_snapshots + k) * rt->state_floats;
}

/* The kept copy of slot after n positions, -1 when none. */
static int find_kept(const ei_runtime *rt, int slot, int32_t n) {
    const int32_t *tags = rt->snap_n + (size_t)slot * rt->p.n_snapshots;
    for (int k = 0; k < rt->p.n_snapshots; k++)
        if (tags[k] == n) return k;
    return -1;
}

/* Where a copy after n positions goes: its own, a free one, else the one after the fewest
 * positions when that is fewer than n (so the slot keeps the n_snapshots latest); -1: none. */
static int place_kept(ei_runtime *rt, int slot, int32_t n) {
    int32_t *tags = rt->snap_n + (size_t)slot * rt->p.n_snapshots;
    int k = find_kept(rt, slot, n), oldest = -1;
    for (int j = 0; k < 0 && j < rt->p.n_snapshots; j++) {
        if (tags[j] < 0) k = j;
        else if (oldest < 0 || tags[j] < tags[oldest]) oldest = j;
    }
    if (k < 0 && oldest >= 0 && tags[oldest] < n) k = oldest;
    if (k >= 0) tags[k] = n;
    return k;
}

ei_status ei_state_begin(ei_runtime *rt, int32_t n_tokens, const int32_t *slots, const int32_t *pos, int32_t n_keep,
                         const int32_t *keep_rows) {
    if (n_keep < 0 || (n_keep > 0 && !keep_rows)) return ei_fail(EI_ERR_INVALID_ARG, "forward: bad keep rows (n_keep=%d)", n_keep);
    for (int32_t j = 0; j < n_keep; j++)
        if (keep_rows[j] < 0 || keep_rows[j] >= n_tokens)
            return ei_fail(EI_ERR_RANGE, "keep row %d outside [0, %d)", keep_rows[j], n_tokens);
    if (!rt->state) return EI_OK;
    /* a slot's rows continue its live state: the first at the position it has seen, then +1 */
    for (int32_t i = 0; i < n_tokens; i++) {
        int32_t seen = rt->state_seen[slots[i]];
        for (int32_t j = i - 1; j >= 0; j--)
            if (slots[j] == slots[i]) { seen = pos[j] + 1; break; }
        if (pos[i] != seen)
            return ei_fail(EI_ERR_STATE, seen < 0 ? "slot %d: its recurrent state was forgotten and not restored "
                                                    "(batch row %d at position %d)"
                                                  : "slot %d: batch row %d at position %d does not continue its "
                                                    "recurrent state (%d positions seen)",
                           slots[i], i, pos[i], seen);
    }
    for (int32_t i = 0; i < n_tokens; i++) rt->keep_snap[i] = -1;
    for (int32_t j = 0; j < n_keep; j++) {
        const int32_t r = keep_rows[j];
        rt->keep_snap[r] = place_kept(rt, slots[r], pos[r] + 1);
    }
    return EI_OK;
}

void ei_state_end(ei_runtime *rt, int32_t n_tokens, const int32_t *slots, const int32_t *pos) {
    if (!rt->state) return;
    for (int32_t i = 0; i < n_tokens; i++) rt->state_seen[slots[i]] = pos[i] + 1;
}

void ei_state_forget(ei_runtime *rt, int slot, int32_t pos) {
    if (!rt->state) return;
    int32_t *tags = rt->snap_n + (size_t)slot * rt->p.n_snapshots;
    for (int k = 0; k < rt->p.n_snapshots; k++)
        if (tags[k] > pos) tags[k] = -1;
    if (pos == 0) {   /* the slot starts over from a zero state */
        memset(rt->state + (size_t)slot * rt->state_floats, 0, (size_t)rt->state_floats * sizeof(float));
        rt->state_seen[slot] = 0;
    } else if (rt->state_seen[slot] > pos) {
        rt->state_seen[slot] = -1;   /* cannot be rewound: restore_state brings a kept copy back */
    }
}

ei_status ei_runtime_restore_state(ei_runtime *rt, int slot, int32_t n) {
    if (!rt) return ei_fail(EI_ERR_INVALID_ARG, "null runtime");
    if (slot < 0 || slot >= rt->p.n_slots) return ei_fail(EI_ERR_RANGE, "slot %d out of [0, %d)", slot, rt->p.n_slots);
    if (!rt->state || rt->state_seen[slot] == n) return EI_OK;
    if (n == 0) {
        ei_state_forget(rt, slot, 0);
        return EI_OK;
    }
    const int k = find_kept(rt, slot, n);
    if (k < 0) return ei_fail(EI_ERR_STATE, "slot %d kept no recurrent state after %d positions", slot, n);
    memcpy(rt->state + (size_t)slot * rt->state_floats, snap_at(rt, slot, k), (size_t)rt->state_floats * sizeof(float));
    rt->state_seen[slot] = n;
    return EI_OK;
}

ei_status ei_runtime_drop_state(ei_runtime *rt, int slot, int32_t n) {
    if (!rt) return ei_fail(EI_ERR_INVALID_ARG, "null runtime");
    if (slot < 0 || slot >= rt->p.n_slots) return ei_fail(EI_ERR_RANGE, "slot %d out of [0, %d)", slot, rt->p.n_slots);
    if (!rt->state) return EI_OK;
    const int k = find_kept(rt, slot, n);
    if (k >= 0) rt->snap_n[(size_t)slot * rt->p.n_snapshots + k] = -1;
    return EI_OK;
}

const float *ei_state_at(const ei_runtime *rt, int slot, int32_t n) {
    const int k = find_kept(rt, slot, n);
    return k >= 0 ? snap_at(rt, slot, k) : rt->state_seen[slot] == n ? rt->state + (size_t)slot * rt->state_floats : NULL;
}

void ei_state_put(ei_runtime *rt, int slot, int32_t n, const float *from) {
    const size_t bytes = (size_t)rt->state_floats * sizeof(float);
    ei_state_forget(rt, slot, 0);
    if (n == 0) return;
    memcpy(rt->state + (size_t)slot * rt->state_floats, from, bytes);
    rt->state_seen[slot] = n;
    const int k = place_kept(rt, slot, n);   /* kept too: a rollback of the slot may come back to n */
    if (k >= 0) memcpy(snap_at(rt, slot, k), from, bytes);
}

ei_status ei_state_copy(ei_runtime *rt, int src, int dst, int32_t n) {
    if (!rt->state) return EI_OK;
    const float *from = ei_state_at(rt, src, n);
    if (n > 0 && !from) return ei_fail(EI_ERR_STATE, "slot %d kept no recurrent state after %d positions", src, n);
    ei_state_put(rt, dst, n, from);
    return EI_OK;
}

size_t ei_runtime_state_bytes(const ei_runtime *rt) { return rt ? rt->state_bytes : 0; }
