/* Runtime: the thread pool, scratch buffers and the fixed KV ring, all
 * allocated once at creation; nothing here allocates while generating. */
#include "runtime.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "packed.h"
#include "state.h"

enum { MAX_THREADS = 256, MAX_SLOTS = 4096, MAX_CTX = 1 << 20, MAX_BATCH = 1 << 16 };

static void *alloc_zeroed(size_t bytes, size_t *total) {
    *total += bytes;
    /* 64-byte alignment keeps SIMD loads on cache lines. */
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}

/* Big arenas (packed weights, KV) on 2 MiB pages where the kernel allows it: a decode
 * step reads every byte of them, and on 4 KiB pages that is one TLB miss per page.
 * Arenas under 4 MiB keep small pages (rounding them up would cost more than it saves). */
static void *alloc_huge(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (bytes < 2 * huge) return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
    const size_t size = (bytes + huge - 1) / huge * huge;
    if (posix_memalign(&p, huge, size) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE);   /* advice only: 4 KiB pages if refused */
#endif
    return p;
}

/* A zeroed big arena (the KV), counted in *total like alloc_zeroed's buffers. */
static void *alloc_huge_zeroed(size_t bytes, size_t *total) {
    *total += bytes;
    void *p = alloc_huge(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

static const ei_weight *packable_ffn(const ei_layer *L, int k) {
    return k == EI_PK_GATE ? &L->w_gate : k == EI_PK_UP ? &L->w_up : &L->w_down;
}

static const ei_weight *packable(const ei_model *m, int i) {
    const int n = m->cfg.n_layer * EI_PACKED_PER_LAYER;
    if (i == n) return ei_model_output(m);
    const ei_layer *L = &m->layers[i / EI_PACKED_PER_LAYER];
    static const ei_weight none = {0};
    const int k = i % EI_PACKED_PER_LAYER;
    switch (ei_layer_kind_of(&m->cfg, i / EI_PACKED_PER_LAYER)) {
    case EI_LAYER_SHORTCONV:   /* q's and o's places */
        return k == EI_PK_Q ? &L->shortconv_in : k == EI_PK_O ? &L->shortconv_out : k >= EI_PK_GATE ? packable_ffn(L, k) : &none;
    case EI_LAYER_DELTANET:    /* q, k and o's places: in_proj's qkv and z parts, out_proj (alpha, beta: a few rows) */
        return k == EI_PK_Q ? &L->ssm_qkv : k == EI_PK_K ? &L->ssm_gate : k == EI_PK_O ? &L->ssm_out
             : k >= EI_PK_GATE ? packable_ffn(L, k) : &none;
    default: break;
    }
    switch (i % EI_PACKED_PER_LAYER) {
    case EI_PK_Q: return &L->wq;
    case EI_PK_K: return &L->wk;
    case EI_PK_V: return &L->wv;
    case EI_PK_O: return &L->wo;
    case EI_PK_GATE: return &L->w_gate;
    case EI_PK_UP: return &L->w_up;
    default: return &L->w_down;
    }
}

/* Unmaps the whole pages inside [p, p + n) of a read-only file mapping: the
 * process stops counting them, the file keeps them (they fault back if read). */
static void drop_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + n) & ~(page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

enum { PACK_SLICE = 256 };
_Static_assert(PACK_SLICE % (2 * EI_PACK_ROWS) == 0, "a slice holds whole row pairs (ei_unpack_row reads them so)");
typedef struct {
    int i;        /* the packable weight */
    int64_t r0;   /* its first row in the slice */
} pack_slice;
typedef struct {
    ei_runtime *rt;
    pack_slice *slices;
} pack_task;

static void pack_one_slice(void *ctx, int64_t k) {
    const pack_task *t = ctx;
    const ei_runtime *rt = t->rt;
    const pack_slice sl = t->slices[k];
    const ei_weight *w = packable(rt->m, sl.i);
    const int64_t n = EI_MIN(PACK_SLICE, w->ne1 - sl.r0), row_bytes = ei_row_bytes(w->type, w->ne0);
    const size_t packed_row_bytes = ei_packed_bytes(rt->kt, w->type, EI_PACK_ROWS, w->ne0) / EI_PACK_ROWS;
    const uint8_t *src = (const uint8_t *)w->data + sl.r0 * row_bytes;
    ei_pack(rt->kt, w->type, src, n, w->ne0, (uint8_t *)rt->packed[sl.i] + (size_t)sl.r0 * packed_row_bytes);
    if (rt->p.drop_packed_source) drop_pages(src, (size_t)(n * row_bytes));
}

/* Packs every weight matrix the table's packed kernels support into one arena. */
static ei_status pack_weights(ei_runtime *rt) {
    const int n = rt->m->cfg.n_layer * EI_PACKED_PER_LAYER + 1;
    size_t sizes_total = 0;
    rt->packed = calloc((size_t)n, sizeof(void *));
    size_t *bytes = calloc((size_t)n, sizeof(size_t));
    if (!rt->packed || !bytes) {
        free(bytes);
        return EI_ERR_OUT_OF_MEMORY;
    }
    const ei_runtime *head_rt = rt->m->head_rt;
    if (head_rt) {   /* the trunk's packed head: the same tensor (checked), no second copy */
        const ei_weight *mine = ei_model_output(rt->m), *theirs = ei_model_output(head_rt->m);
        if (mine->type != theirs->type || mine->ne0 != theirs->ne0 || mine->ne1 != theirs->ne1 ||
            rt->kt != head_rt->kt) {   /* the packed layout is the kernel table's */
            free(bytes);
            return ei_fail(EI_ERR_INVALID_ARG, "runtime_create: the shared output head differs from this model's");
        }
    }
    for (int i = 0; i < n; i++) {
        const ei_weight *w = packable(rt->m, i);
        if (head_rt && i == n - 1) continue;
        bytes[i] = (ei_packed_bytes(rt->kt, w->type, w->ne1, w->ne0) + 63) & ~(size_t)63;
        sizes_total += bytes[i];
    }
    if (sizes_total && !(rt->pack_arena = alloc_huge(sizes_total))) {
        free(bytes);
        return EI_ERR_OUT_OF_MEMORY;
    }
    /* Slices of PACK_SLICE rows, packed by the pool's threads, each source slice dropped once
     * packed, so that at most one slice a thread of the file is resident on top of the packed
     * copy (peak RSS). A slice holds an even number of row groups, so row pairs fall as in one
     * call over all rows. */
    int64_t n_slices = 0;
    uint8_t *at = rt->pack_arena;
    for (int i = 0; i < n; i++) {
        if (!bytes[i]) continue;
        rt->packed[i] = at;
        at += bytes[i];
        n_slices += (packable(rt->m, i)->ne1 + PACK_SLICE - 1) / PACK_SLICE;
    }
    pack_task task = {rt, malloc((size_t)n_slices * sizeof *task.slices)};
    if (n_slices && !task.slices) {
        free(bytes);
        return EI_ERR_OUT_OF_MEMORY;
    }
    int64_t s = 0;
    for (int i = 0; i < n; i++) {
        if (!bytes[i]) continue;
        for (int64_t r0 = 0; r0 < packable(rt->m, i)->ne1; r0 += PACK_SLICE) task.slices[s++] = (pack_slice){i, r0};
    }
    ei_pool_for(rt->pool, n_slices, pack_one_slice, &task);
    free(task.slices);
    if (head_rt) rt->packed[n - 1] = head_rt->packed[(size_t)head_rt->m->cfg.n_layer * EI_PACKED_PER_LAYER];
    /* A head tied to this model's token table (its own, or the trunk's it shares) serves the lookups too */
    const ei_weight *e = &rt->m->globals.tok_embd, *head = ei_model_output(head_rt ? head_rt->m : rt->m);
    if (rt->packed[n - 1] && e->data && head->data == e->data &&
        !(rt->embd_row = malloc((size_t)ei_row_bytes(e->type, e->ne0)))) {
        free(bytes);
        return EI_ERR_OUT_OF_MEMORY;
    }
    rt->pack_bytes = sizes_total;
    free(bytes);
    return EI_OK;
}

ei_status ei_runtime_create(const ei_model *m, const ei_runtime_params *p, ei_runtime **out) {
    if (!m || !p || !out) return ei_fail(EI_ERR_INVALID_ARG, "runtime_create: null argument");
    *out = NULL;
    if (!m->finalized) return ei_fail(EI_ERR_STATE, "runtime_create: model not finalized");
    ei_runtime_params prm = *p;
    if (prm.n_threads <= 0) prm.n_threads = ei_physical_cores();
    if (prm.n_threads > MAX_THREADS) return ei_fail(EI_ERR_INVALID_ARG, "n_threads=%d > %d", prm.n_threads, MAX_THREADS);
    if (prm.n_slots < 1 || prm.n_slots > MAX_SLOTS) return ei_fail(EI_ERR_INVALID_ARG, "n_slots=%d out of range", prm.n_slots);
    if (prm.n_ctx < 1 || prm.n_ctx > MAX_CTX) return ei_fail(EI_ERR_INVALID_ARG, "n_ctx=%d out of range", prm.n_ctx);
    if (prm.n_sink < 0 || prm.n_sink >= prm.n_ctx)
        return ei_fail(EI_ERR_INVALID_ARG, "n_sink=%d must be in [0, n_ctx=%d)", prm.n_sink, prm.n_ctx);
    if (prm.slide_window < 0 || prm.slide_window > prm.n_ctx - prm.n_sink)
        return ei_fail(EI_ERR_INVALID_ARG, "slide_window=%d must be in [0, n_ctx - n_sink = %d]", prm.slide_window,
                       prm.n_ctx - prm.n_sink);
    if (prm.max_batch < 1 || prm.max_batch > MAX_BATCH) return ei_fail(EI_ERR_INVALID_ARG, "max_batch=%d out of range", prm.max_batch);
    if (prm.kv_type != EI_TYPE_F16 && prm.kv_type != EI_TYPE_Q8_0)
        return ei_fail(EI_ERR_UNSUPPORTED, "kv_type %d: the KV arena holds F16 or Q8_0", prm.kv_type);
    if (prm.kv_type == EI_TYPE_Q8_0 && (m->cfg.head_dim % 32 || m->cfg.head_dim_swa % 32))
        return ei_fail(EI_ERR_UNSUPPORTED, "a Q8_0 KV arena needs head sizes that are multiples of 32 (got %d, %d)",
                       m->cfg.head_dim, m->cfg.head_dim_swa);
    const ei_kernels *kt = ei_kernels_get(prm.isa);
    if (!kt) return ei_fail(EI_ERR_UNSUPPORTED, "ISA %d is not supported on this CPU", prm.isa);

    const ei_model_config *c = &m->cfg;
    ei_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return ei_fail(EI_ERR_OUT_OF_MEMORY, "runtime_create: out of memory");
    rt->m = m;
    rt->p = prm;
    rt->kt = kt;
    const int hd_swa = c->head_dim_swa > 0 ? c->head_dim_swa : c->head_dim;
    rt->attn = ei_attn_pick(kt, prm.kv_type, c->head_dim);
    rt->attn_swa = ei_attn_pick(kt, prm.kv_type, hd_swa);

    rt->kv_row_bytes = (size_t)ei_row_bytes(prm.kv_type, c->head_dim);
    rt->kv_row_bytes_swa = (size_t)ei_row_bytes(prm.kv_type, hd_swa);
    size_t kv_total = 0, scratch = 0;
    int swa_fail = 0;
    /* Sliding-window layers: their own ring of window + max_batch - 1 cells when that is smaller. */
    if (c->swa_window > 0 && (int64_t)c->swa_window + prm.max_batch - 1 < prm.n_ctx)
        rt->local_cells = c->swa_window + prm.max_batch - 1;
    rt->layer_off = alloc_zeroed((size_t)c->n_layer * sizeof(size_t), &scratch);
    size_t kv_arena = 0;   /* none for recurrent and KV-shared layers */
    for (int l = 0; rt->layer_off && l < c->n_layer; l++) {
        rt->layer_off[l] = kv_arena;
        kv_arena += (size_t)prm.n_slots * c->n_head_kv * ei_layer_cells(rt, l) * ei_layer_kv_row_bytes(rt, l);
    }
    if (rt->local_cells) {
        rt->local_cell_pos = alloc_zeroed((size_t)prm.n_slots * rt->local_cells * sizeof(int32_t), &scratch);
        rt->local_used = alloc_zeroed((size_t)prm.n_slots * sizeof(int32_t), &scratch);
        swa_fail |= !rt->local_cell_pos || !rt->local_used;
        for (size_t i = 0; rt->local_cell_pos && i < (size_t)prm.n_slots * rt->local_cells; i++)
            rt->local_cell_pos[i] = -1;
    }
    rt->k = alloc_huge_zeroed(kv_arena, &kv_total);
    rt->v = alloc_huge_zeroed(kv_arena, &kv_total);
    rt->cell_pos = alloc_zeroed((size_t)prm.n_slots * prm.n_ctx * sizeof(int32_t), &scratch);
    rt->n_used = alloc_zeroed((size_t)prm.n_slots * sizeof(int32_t), &scratch);

    size_t B = (size_t)prm.max_batch, d = (size_t)c->n_embd, qd = (size_t)c->n_head * c->head_dim;
    size_t kvd = (size_t)c->n_head_kv * c->head_dim, ff = (size_t)c->n_ff;
    const int nextn = m->nextn_eh_proj.data != NULL;   /* an MTP block: eh_proj reads 2 n_embd wide rows */
    size_t widest = EI_MAX(EI_MAX(EI_MAX(d, ff), qd), EI_MAX((size_t)ei_deltanet_inner(c), nextn ? 2 * d : 0));
    rt->x = alloc_zeroed(B * d * sizeof(float), &scratch);
    rt->xn = alloc_zeroed(B * d * sizeof(float), &scratch);
    rt->q = alloc_zeroed(B * qd * (c->has_attn_gate ? 2 : 1) * sizeof(float), &scratch);   /* gated: query, gate */
    rt->attn_gate = c->has_attn_gate ? alloc_zeroed(B * qd * sizeof(float), &scratch) : NULL;
    rt->kc = alloc_zeroed(B * kvd * sizeof(float), &scratch);
    rt->vc = alloc_zeroed(B * kvd * sizeof(float), &scratch);
    rt->att = alloc_zeroed(B * qd * sizeof(float), &scratch);
    rt->gate = alloc_zeroed(B * ff * sizeof(float), &scratch);
    rt->up = alloc_zeroed(B * ff * sizeof(float), &scratch);
    rt->act = alloc_zeroed(B * (size_t)ei_act_row_bytes(widest + EI_QA_BLOCK - 1), &scratch);
    size_t group = (size_t)(c->n_head / c->n_head_kv);
    rt->scores = alloc_zeroed((size_t)prm.n_threads * 2 * group * EI_ATTN_CHUNK * sizeof(float), &scratch);   /* two tokens */
    /* Attention partials for as many tokens as fit in ~4 MiB (at least one). */
    size_t part_per_tok = (size_t)c->n_head * ((prm.n_ctx + EI_ATTN_CHUNK - 1) / EI_ATTN_CHUNK) *
                          EI_ATTN_PART_FLOATS(c->head_dim);
    size_t fit = ((size_t)1 << 20) / part_per_tok;
    rt->attn_tokens = (int32_t)EI_MAX(1, EI_MIN(fit, B));
    rt->attn_part = alloc_zeroed((size_t)rt->attn_tokens * part_per_tok * sizeof(float), &scratch);
    rt->attn_done = alloc_zeroed((size_t)rt->attn_tokens * c->n_head_kv * sizeof(atomic_int), &scratch);
    size_t half = (size_t)EI_MAX(EI_MAX(c->rope_dim, c->rope_dim_swa) / 2, 1);
    rt->rope_cos = alloc_zeroed(B * half * sizeof(float), &scratch);
    rt->rope_sin = alloc_zeroed(B * half * sizeof(float), &scratch);
    rt->rope_freq = alloc_zeroed(half * sizeof(double), &scratch);
    rt->out_rows = alloc_zeroed(B * d * sizeof(float), &scratch);
    rt->nextn_in = nextn ? alloc_zeroed(B * 2 * d * sizeof(float), &scratch) : NULL;
    swa_fail |= nextn && !rt->nextn_in;
    /* A window on attention (sliding-window layers, or a ring with slack): per-thread cell
     * positions masked to it. */
    if (c->swa_window > 0 || prm.slide_window > 0) {
        rt->swa_cell_pos = alloc_zeroed((size_t)prm.n_threads * prm.n_ctx * sizeof(int32_t), &scratch);
        swa_fail |= !rt->swa_cell_pos;
    }
    /* Sliding-window layers: a second RoPE table when their base differs. */
    if (c->swa_window > 0) {
        /* local layers: their own base and no scaling, so their own tables unless both match */
        if ((c->rope_theta_local > 0 && c->rope_theta_local != c->rope_theta) || c->rope_freq_scale != 1.0f ||
            m->globals.rope_freqs.data || (c->rope_dim_swa > 0 && c->rope_dim_swa != c->rope_dim)) {
            rt->rope_cos_l = alloc_zeroed(B * half * sizeof(float), &scratch);
            rt->rope_sin_l = alloc_zeroed(B * half * sizeof(float), &scratch);
            rt->rope_freq_local = alloc_zeroed(half * sizeof(double), &scratch);
            swa_fail |= !rt->rope_cos_l || !rt->rope_sin_l || !rt->rope_freq_local;
        }
    }
    swa_fail |= ei_per_layer_alloc(rt, &scratch);
    rt->kv_bytes = kv_total;
    rt->scratch_bytes = scratch;
    const ei_status st_state = ei_state_create(rt, &rt->state_bytes);
    if (st_state != EI_OK) {
        ei_runtime_free(rt);
        return st_state == EI_ERR_OUT_OF_MEMORY ? ei_fail(st_state, "runtime_create: cannot allocate the recurrent states")
                                                : st_state;
    }

    if ((c->has_attn_gate && !rt->attn_gate) || !rt->k || !rt->v || !rt->cell_pos || !rt->n_used || !rt->x || !rt->xn || !rt->q || !rt->kc ||
        !rt->vc || !rt->att || !rt->gate || !rt->up || !rt->act || !rt->scores || !rt->attn_part || !rt->attn_done || !rt->rope_cos ||
        !rt->rope_sin || !rt->rope_freq || !rt->out_rows || !rt->layer_off || swa_fail) {
        ei_runtime_free(rt);
        return ei_fail(EI_ERR_OUT_OF_MEMORY, "runtime_create: cannot allocate %zu bytes of KV + %zu of scratch",
                       kv_total, scratch);
    }
    for (size_t i = 0; i < (size_t)prm.n_slots * prm.n_ctx; i++) rt->cell_pos[i] = -1;
    const float *factors = m->globals.rope_freqs.data;
    for (int i = 0; i < c->rope_dim / 2; i++) {
        double f = pow((double)c->rope_theta, -2.0 * i / (double)c->rope_dim) * c->rope_freq_scale;
        rt->rope_freq[i] = factors ? f / factors[i] : f;
    }
    /* local layers: their own base and rotated dimensions, no scaling (llama.cpp's rope_freq_{base,scale}_train_swa) */
    const int rope_dim_l = c->rope_dim_swa > 0 ? c->rope_dim_swa : c->rope_dim;
    const double base_l = c->rope_theta_local > 0 ? c->rope_theta_local : c->rope_theta;
    for (int i = 0; rt->rope_freq_local && i < rope_dim_l / 2; i++)
        rt->rope_freq_local[i] = pow(base_l, -2.0 * i / (double)rope_dim_l);
    rt->pool = ei_pool_create(prm.n_threads);
    if (!rt->pool) {
        ei_runtime_free(rt);
        return ei_fail(EI_ERR_OUT_OF_MEMORY, "runtime_create: cannot start %d threads", prm.n_threads);
    }
    const ei_status st_pack = pack_weights(rt);   /* on the pool's threads */
    if (st_pack != EI_OK) {
        ei_runtime_free(rt);
        return st_pack == EI_ERR_OUT_OF_MEMORY ? ei_fail(st_pack, "runtime_create: cannot allocate packed weights") : st_pack;
    }
    *out = rt;
    return EI_OK;
}

void ei_runtime_free(ei_runtime *rt) {
    if (!rt) return;
    ei_pool_free(rt->pool);
    free(rt->packed);
    free(rt->pack_arena);
    free(rt->embd_row);
    void *bufs[] = {rt->k, rt->v, rt->cell_pos, rt->n_used, rt->x, rt->xn, rt->q, rt->kc, rt->vc, rt->att,
                    rt->gate, rt->up, rt->act, rt->scores, rt->attn_part, (void *)rt->attn_done, rt->rope_cos, rt->rope_sin, rt->rope_freq, rt->out_rows,
                    rt->swa_cell_pos, rt->rope_cos_l, rt->rope_sin_l, rt->rope_freq_local,
                    rt->layer_off, rt->local_cell_pos, rt->local_used, rt->ple, rt->ple_gate, rt->ple_in, rt->attn_gate,
                    rt->slot_lora, (void *)rt->lora_seen, rt->lora_rows, rt->lora_row_scale, rt->lora_head_slots, rt->lora_buf, rt->nextn_in};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    ei_state_free(rt);
    free(rt);
}

size_t ei_runtime_kv_bytes(const ei_runtime *rt) { return rt ? rt->kv_bytes : 0; }
size_t ei_runtime_scratch_bytes(const ei_runtime *rt) { return rt ? rt->scratch_bytes : 0; }
size_t ei_runtime_packed_bytes(const ei_runtime *rt) { return rt ? rt->pack_bytes : 0; }

int ei_runtime_profile(ei_runtime *rt, double *out, int n, int reset) {
    if (!rt || (n > 0 && !out)) return 0;
    int k = EI_MIN(n, EI_PROF_COUNT);
    for (int i = 0; i < k; i++) out[i] = rt->prof[i];
    if (reset) memset(rt->prof, 0, sizeof rt->prof);
    return k;
}

ei_status ei_runtime_clear_slot(ei_runtime *rt, int slot) {
    return ei_runtime_forget_from(rt, slot, 0);
}

ei_status ei_runtime_forget_from(ei_runtime *rt, int slot, int32_t pos) {
    if (!rt) return ei_fail(EI_ERR_INVALID_ARG, "null runtime");
    if (slot < 0 || slot >= rt->p.n_slots) return ei_fail(EI_ERR_RANGE, "slot %d out of [0, %d)", slot, rt->p.n_slots);
    if (pos < 0) return ei_fail(EI_ERR_RANGE, "position %d is negative", pos);
    int32_t *cp = rt->cell_pos + (size_t)slot * rt->p.n_ctx;
    int32_t used = 0;
    for (int32_t c = 0; c < rt->n_used[slot]; c++) {
        if (cp[c] >= pos) cp[c] = -1;
        if (cp[c] >= 0) used = c + 1;
    }
    rt->n_used[slot] = used;
    if (rt->local_cells) {   /* the sliding-window layers' ring */
        int32_t *lp = rt->local_cell_pos + (size_t)slot * rt->local_cells;
        used = 0;
        for (int32_t c = 0; c < rt->local_used[slot]; c++) {
            if (lp[c] >= pos) lp[c] = -1;
            if (lp[c] >= 0) used = c + 1;
        }
        rt->local_used[slot] = used;
    }
    ei_state_forget(rt, slot, pos);
    return EI_OK;
}

ei_status ei_check_prefix(const ei_runtime *rt, int slot, int32_t n) {
    const int32_t *cp = rt->cell_pos + (size_t)slot * rt->p.n_ctx;
    for (int32_t p = 0; p < n; p++)   /* position p in cell p: the prefix never wrapped */
        if (p >= rt->n_used[slot] || cp[p] != p)
            return ei_fail(EI_ERR_STATE, "slot %d does not hold position %d in cell %d", slot, p, p);
    if (rt->local_cells) {
        const int32_t *lp = rt->local_cell_pos + (size_t)slot * rt->local_cells;
        for (int32_t p = ei_window_first(&rt->m->cfg, n); p < n; p++)
            if (lp[p % rt->local_cells] != p)
                return ei_fail(EI_ERR_STATE, "slot %d: its sliding-window ring lost position %d", slot, p);
    }
    return EI_OK;
}

ei_status ei_runtime_copy_prefix(ei_runtime *rt, int src, int dst, int32_t n) {
    if (!rt) return ei_fail(EI_ERR_INVALID_ARG, "null runtime");
    int ns = rt->p.n_slots, nc = rt->p.n_ctx;
    if (src < 0 || src >= ns || dst < 0 || dst >= ns)
        return ei_fail(EI_ERR_RANGE, "slots %d, %d out of [0, %d)", src, dst, ns);
    if (n < 0 || n > nc) return ei_fail(EI_ERR_RANGE, "%d positions out of [0, %d]", n, nc);
    ei_status st = ei_check_prefix(rt, src, n);
    if (st != EI_OK) return st;
    if (src == dst) {
        st = ei_runtime_forget_from(rt, dst, n);
        return st == EI_OK ? ei_runtime_restore_state(rt, dst, n) : st;
    }
    if ((st = ei_state_copy(rt, src, dst, n)) != EI_OK) return st;
    const ei_model_config *cfg = &rt->m->cfg;
    for (int l = 0; l < cfg->n_layer; l++) {
        if (!ei_layer_stores_kv(cfg, l)) continue;
        const size_t row = ei_layer_kv_row_bytes(rt, l);
        const int32_t cells = (int32_t)ei_layer_cells(rt, l), hd = ei_layer_head_dim(cfg, l);
        uint8_t k_row[1024 * 2];
        for (int h = 0; h < cfg->n_head_kv; h++) {
            const size_t from = ei_kv_offset(rt, src, l, h), to = ei_kv_offset(rt, dst, l, h);
            if (!ei_layer_in_local_ring(rt, l)) {
                memcpy(rt->k + to, rt->k + from, ei_k_prefix_cells(rt->p.kv_type, n, cells) * row);
                memcpy(rt->v + to, rt->v + from, (size_t)n * row);
                continue;
            }
            for (int32_t p = ei_window_first(&rt->m->cfg, n); p < n; p++) {   /* the window, where the ring holds it */
                const int32_t cell = (int32_t)ei_cell_of(rt, l, p);
                ei_k_cell_io(rt->p.kv_type, rt->k + from, cell, cells, hd, k_row, 1);
                ei_k_cell_io(rt->p.kv_type, rt->k + to, cell, cells, hd, k_row, 0);
                memcpy(rt->v + to + cell * row, rt->v + from + cell * row, row);
            }
        }
    }
    int32_t *dp = rt->cell_pos + (size_t)dst * nc;
    for (int32_t c = 0; c < rt->n_used[dst] || c < n; c++) dp[c] = c < n ? c : -1;
    rt->n_used[dst] = n;
    if (rt->local_cells) {
        int32_t *lp = rt->local_cell_pos + (size_t)dst * rt->local_cells;
        for (int32_t c = 0; c < rt->local_cells; c++) lp[c] = -1;
        for (int32_t p = ei_window_first(&rt->m->cfg, n); p < n; p++) lp[p % rt->local_cells] = p;
        rt->local_used[dst] = EI_MIN(n, rt->local_cells);
    }
    return EI_OK;
}

/* ---- parallel matmul ---- */

enum { ROWS_PER_CHUNK = 32 };   /* a multiple of the packed row group (8) */

/* Chunks of rows are split into one contiguous range per thread, each with
 * its own cursor on its own cache line: a thread streams through its range
 * (what the hardware prefetchers like) and then steals from the others, so a
 * descheduled thread's rows still get done. */
typedef struct {
    atomic_llong next;
    char pad[64 - sizeof(atomic_llong)];
} padded_cursor;

typedef struct {
    const ei_mm_job *jobs;
    int n_jobs;
    const ei_kernels *kt;
    const float *x;
    const void *qx;
    int64_t n_cols, n_tok;
    int64_t chunk_end[4];   /* cumulative chunk counts per job */
    int nth;
    int far;   /* one token, every job packed and of one type with a far kernel: chunks in pairs */
    padded_cursor cursor[MAX_THREADS];   /* cursor[i] walks [range_start(i), range_start(i + 1)) */
} mm_task;

static int64_t range_start(const mm_task *t, int i) {
    return t->chunk_end[t->n_jobs - 1] * i / t->nth;
}

/* The job of a chunk and its rows [*r0, *r1). */
static int chunk_rows(const mm_task *t, int64_t chunk, int64_t *r0, int64_t *r1) {
    int j = 0;
    while (chunk >= t->chunk_end[j]) j++;
    const int64_t first = j ? t->chunk_end[j - 1] : 0;
    *r0 = (chunk - first) * ROWS_PER_CHUNK;
    *r1 = EI_MIN(*r0 + ROWS_PER_CHUNK, t->jobs[j].w->ne1);
    return j;
}

static void mm_chunk(const mm_task *t, int64_t chunk) {
    int64_t r0, r1;
    const int j = chunk_rows(t, chunk, &r0, &r1);
    const ei_weight *w = t->jobs[j].w;
    int q8 = ei_type_uses_q8a(w->type);
    const void *act = q8 ? (const void *)t->qx : (const void *)t->x;
    int64_t stride = q8 ? ei_act_row_bytes(t->n_cols)
                        : t->n_cols * (int64_t)sizeof(float);
    if (t->jobs[j].packed)
        ei_matmul_packed(t->kt, w->type, t->jobs[j].packed, t->n_cols, r0, r1, act, stride, t->n_tok,
                         t->jobs[j].y, w->ne1);
    else
        ei_matmul_rows(t->kt, w->type, w->data, t->n_cols, r0, r1, act, stride, t->n_tok, t->jobs[j].y, w->ne1);
}

/* One token, two chunks of t->far's type read side by side by its far kernel (two read streams;
 * each row's result is mm_chunk's); the rows it leaves at either chunk's end by the one-token kernel. */
static void mm_chunk_pair(const mm_task *t, int64_t ca, int64_t cb) {
    int64_t ra0, ra1, rb0, rb1;
    const ei_mm_job *a = &t->jobs[chunk_rows(t, ca, &ra0, &ra1)], *b = &t->jobs[chunk_rows(t, cb, &rb0, &rb1)];
    const int type = a->w->type;
    const int64_t act_bytes = ei_act_row_bytes(t->n_cols);
    const int64_t n = ei_matmul_packed_far(t->kt, type, t->n_cols, a->packed, ra0, a->y, b->packed, rb0, b->y,
                                           EI_MIN(ra1 - ra0, rb1 - rb0), t->qx);
    if (ra0 + n < ra1) ei_matmul_packed(t->kt, type, a->packed, t->n_cols, ra0 + n, ra1, t->qx, act_bytes, 1, a->y, a->w->ne1);
    if (rb0 + n < rb1) ei_matmul_packed(t->kt, type, b->packed, t->n_cols, rb0 + n, rb1, t->qx, act_bytes, 1, b->y, b->w->ne1);
}

/* With t->far, a thread takes its range's chunks in pairs, the first half's chunk i beside the
 * second half's chunk i: two read streams, far apart, which one thread reads faster than one
 * (docs/performance.md; two neighbouring row groups side by side streamed slower than one, and
 * whole chunks taken alternately gained nothing). */
static void mm_worker(void *raw, int ith, int nth) {
    (void)nth;
    mm_task *t = raw;
    for (int k = 0; k < t->nth; k++) {
        const int r = (ith + k) % t->nth;   /* own range first, then steal */
        const int64_t start = range_start(t, r), end = range_start(t, r + 1);
        const int64_t half = t->far ? (end - start + 1) / 2 : end - start;
        for (;;) {
            const int64_t i = atomic_fetch_add_explicit(&t->cursor[r].next, 1, memory_order_relaxed);
            if (i >= half) break;
            if (t->far && start + half + i < end) mm_chunk_pair(t, start + i, start + half + i);
            else mm_chunk(t, start + i);
        }
    }
}

/* Activation quantization of a batch, QUANT_ROWS tokens an item on the pool: serial, it
 * took 2% of a 1B-shape pp256 (a row of 8192 is 2-3 us) while the other thread waited. */
enum { QUANT_ROWS = 8 };
typedef struct {
    const ei_kernels *kt;
    const float *x;
    void *out;
    int64_t n_tok, n_cols;
    int half_sums;
} quant_task;

static void quant_rows(void *raw, int64_t i) {
    const quant_task *q = raw;
    const int64_t t0 = i * QUANT_ROWS, n = EI_MIN(QUANT_ROWS, q->n_tok - t0);
    ei_quantize_act_rows(q->kt, q->x + t0 * q->n_cols, n, q->n_cols,
                         (uint8_t *)q->out + t0 * ei_act_row_bytes(q->n_cols), q->half_sums);
}

void ei_parallel_matmul(ei_runtime *rt, const ei_mm_job *jobs, int n_jobs, const float *x, int64_t n_tok) {
    ei_matmul_base(rt, jobs, n_jobs, x, n_tok);
    if (rt->lora_slots) ei_lora_apply(rt, jobs, n_jobs, x, n_tok);
}

void ei_matmul_base(ei_runtime *rt, const ei_mm_job *jobs, int n_jobs, const float *x, int64_t n_tok) {
    mm_task t = {.jobs = jobs, .n_jobs = n_jobs, .kt = rt->kt, .x = x, .qx = rt->act,
                 .n_cols = jobs[0].w->ne0, .n_tok = n_tok};
    int need_q8 = 0, need_half_sums = 0;
    int64_t acc = 0;
    const int type0 = jobs[0].w->type;
    t.far = n_tok == 1 && type0 >= 0 && type0 < EI_TYPE_IDS && rt->kt->packed[type0].x1_far;
    for (int j = 0; j < n_jobs; j++) {
        t.far &= jobs[j].packed && jobs[j].w->type == type0;
        need_q8 |= ei_type_uses_q8a(jobs[j].w->type);
        need_half_sums |= ei_packed_reads_half_sums(jobs[j].w->type);
        acc += (jobs[j].w->ne1 + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
        t.chunk_end[j] = acc;
    }
    if (need_q8) {
        quant_task q = {.kt = rt->kt, .x = x, .out = rt->act, .n_tok = n_tok, .n_cols = t.n_cols,
                        .half_sums = need_half_sums};
        const int64_t items = (n_tok + QUANT_ROWS - 1) / QUANT_ROWS;
        if (items > 1) ei_pool_for(rt->pool, items, quant_rows, &q);
        else quant_rows(&q, 0);
    }
    t.nth = ei_pool_size(rt->pool);
    for (int i = 0; i < t.nth; i++) atomic_init(&t.cursor[i].next, 0);
    ei_pool_run(rt->pool, mm_worker, &t);
}

ei_status ei_kernel_matmul(int type, int isa, const void *w, int64_t n_rows, int64_t n_cols,
                           const float *x, int64_t n_tok, float *y, int n_threads) {
    if (!w || !x || !y || n_rows < 1 || n_cols < 1 || n_tok < 1 || n_threads < 1 || n_threads > MAX_THREADS)
        return ei_fail(EI_ERR_INVALID_ARG, "kernel_matmul: bad arguments");
    const ei_kernels *kt = ei_kernels_get(isa);
    if (!kt) return ei_fail(EI_ERR_UNSUPPORTED, "ISA %d not supported here", isa);
    if (ei_row_bytes(type, n_cols) <= 0)
        return ei_fail(EI_ERR_UNSUPPORTED, "type %d cannot hold rows of %lld", type, (long long)n_cols);
    if (ei_type_uses_q8a(type) && n_cols % EI_QA_BLOCK)
        return ei_fail(EI_ERR_INVALID_ARG, "n_cols=%lld not a multiple of %d", (long long)n_cols, EI_QA_BLOCK);
    ei_weight wt = {.data = w, .type = type, .ne0 = n_cols, .ne1 = n_rows};
    ei_mm_job job = {.w = &wt, .y = y};
    ei_runtime rt = {.kt = kt};
    size_t dummy = 0;
    void *packed = NULL;
    size_t pb = ei_packed_bytes(kt, type, n_rows, n_cols);
    if (pb) {
        packed = malloc(pb);
        if (!packed) return ei_fail(EI_ERR_OUT_OF_MEMORY, "kernel_matmul: out of memory");
        ei_pack(kt, type, w, n_rows, n_cols, packed);
        job.packed = packed;
    }
    rt.act = alloc_zeroed((size_t)n_tok * (size_t)ei_act_row_bytes(n_cols + EI_QA_BLOCK), &dummy);
    rt.pool = ei_pool_create(n_threads);
    if (!rt.act || !rt.pool) {
        free(rt.act);
        free(packed);
        ei_pool_free(rt.pool);
        return ei_fail(EI_ERR_OUT_OF_MEMORY, "kernel_matmul: out of memory");
    }
    ei_parallel_matmul(&rt, &job, 1, x, n_tok);
    free(rt.act);
    free(packed);
    ei_pool_free(rt.pool);
    return EI_OK;
}
