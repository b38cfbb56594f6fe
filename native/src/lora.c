/* LoRA adapters applied per sequence: a weight's rows for a batch are W x once, then each adapter a
 * adds scale * B_a (A_a x) to the rows of the slots that use it (gathered, as S-LoRA / Punica do), so
 * requests with different adapters share one batch. The adapter keeps float32 copies: A as given
 * (its rank rows are long dots), B transposed (its update is rank-many axpys over the output). */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "runtime.h"

typedef struct {
    const ei_weight *target;   /* the base weight this pair adapts */
    ei_weight a;               /* A: [rank][ne0 of target], float32 */
    float *bt;                 /* B transposed: [rank][ne1 of target] */
    int rank;
} lora_pair;

struct ei_lora {
    const ei_model *m;
    lora_pair *pairs;
    int n, cap;
    int64_t max_rank, max_in, max_out;
};

ei_status ei_lora_create(const ei_model *m, ei_lora **out) {
    if (!m || !out) return ei_fail(EI_ERR_INVALID_ARG, "lora_create: null argument");
    if (!m->finalized) return ei_fail(EI_ERR_STATE, "lora_create: the model is not finalized");
    ei_lora *a = calloc(1, sizeof *a);
    if (!a) return ei_fail(EI_ERR_OUT_OF_MEMORY, "lora_create: out of memory");
    a->m = m;
    *out = a;
    return EI_OK;
}

void ei_lora_free(ei_lora *a) {
    if (!a) return;
    for (int i = 0; i < a->n; i++) {
        free((void *)a->pairs[i].a.data);
        free(a->pairs[i].bt);
    }
    free(a->pairs);
    free(a);
}

static const lora_pair *find_pair(const ei_lora *a, const ei_weight *w) {
    for (int i = 0; i < a->n; i++)
        if (a->pairs[i].target == w) return &a->pairs[i];
    return NULL;
}

ei_status ei_lora_set(ei_lora *a, int layer, int role, int32_t rank, const float *A, const float *B) {
    if (!a || !A || !B) return ei_fail(EI_ERR_INVALID_ARG, "lora_set: null argument");
    ei_model *m = (ei_model *)a->m;
    const ei_weight *w = ei_weight_slot(&m->globals, m->layers, m->cfg.n_layer, layer, role);
    if (!w || !w->data) return ei_fail(EI_ERR_INVALID_ARG, "lora_set: the model has no tensor role %d at layer %d", role, layer);
    if (role == EI_T_TOKEN_EMBD) return ei_fail(EI_ERR_UNSUPPORTED, "lora_set: the token embedding is a lookup, not a matmul");
    if (ei_role_find(role)->vector || w->ne1 < 2) return ei_fail(EI_ERR_INVALID_ARG, "lora_set: role %d is not a matrix", role);
    if (rank < 1 || rank > 4096) return ei_fail(EI_ERR_INVALID_ARG, "lora_set: rank %d outside [1, 4096]", rank);
    if (find_pair(a, w)) return ei_fail(EI_ERR_INVALID_ARG, "lora_set: role %d at layer %d set twice", role, layer);
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 64;
        lora_pair *p = realloc(a->pairs, (size_t)cap * sizeof *p);
        if (!p) return ei_fail(EI_ERR_OUT_OF_MEMORY, "lora_set: out of memory");
        a->pairs = p;
        a->cap = cap;
    }
    float *ac = malloc((size_t)rank * (size_t)w->ne0 * sizeof(float));
    float *bt = malloc((size_t)rank * (size_t)w->ne1 * sizeof(float));
    if (!ac || !bt) {
        free(ac);
        free(bt);
        return ei_fail(EI_ERR_OUT_OF_MEMORY, "lora_set: out of memory");
    }
    memcpy(ac, A, (size_t)rank * (size_t)w->ne0 * sizeof(float));
    for (int64_t o = 0; o < w->ne1; o++)
        for (int k = 0; k < rank; k++) bt[(int64_t)k * w->ne1 + o] = B[o * rank + k];
    a->pairs[a->n++] = (lora_pair){w, {.data = ac, .type = EI_TYPE_F32, .ne0 = w->ne0, .ne1 = rank}, bt, rank};
    a->max_rank = EI_MAX(a->max_rank, rank);
    a->max_in = EI_MAX(a->max_in, w->ne0);
    a->max_out = EI_MAX(a->max_out, w->ne1);
    return EI_OK;
}

size_t ei_lora_bytes(const ei_lora *a) {
    size_t n = 0;
    for (int i = 0; a && i < a->n; i++)
        n += (size_t)a->pairs[i].rank * (size_t)(a->pairs[i].a.ne0 + a->pairs[i].target->ne1) * sizeof(float);
    return n;
}

/* Scratch sized for every adapter attached so far: x [max_batch][in], t [3][max_batch][rank] and the
 * coefficients scale * t [3][max_batch][rank] floats; the per-slot lists and per-row arrays on first use. */
static ei_status lora_scratch(ei_runtime *rt, const ei_lora *a) {
    const size_t mb = (size_t)rt->p.max_batch;
    if (!rt->slot_lora) {
        rt->slot_lora = calloc((size_t)rt->p.n_slots, sizeof *rt->slot_lora);
        rt->lora_seen = calloc((size_t)rt->p.n_slots, sizeof *rt->lora_seen);
        rt->lora_rows = calloc(mb, sizeof *rt->lora_rows);
        rt->lora_row_scale = calloc(mb, sizeof *rt->lora_row_scale);
        rt->lora_head_slots = calloc(mb, sizeof *rt->lora_head_slots);
        if (!rt->slot_lora || !rt->lora_seen || !rt->lora_rows || !rt->lora_row_scale || !rt->lora_head_slots)
            return ei_fail(EI_ERR_OUT_OF_MEMORY, "lora: out of memory");
    }
    const int64_t in = EI_MAX(rt->lora_max_in, a->max_in), rank = EI_MAX(rt->lora_max_rank, a->max_rank);
    const size_t need = mb * (size_t)(in + 6 * rank);
    if (need > rt->lora_floats) {
        float *s = realloc(rt->lora_buf, need * sizeof(float));
        if (!s) return ei_fail(EI_ERR_OUT_OF_MEMORY, "lora: out of memory for %zu scratch floats", need);
        rt->lora_buf = s;
        rt->lora_floats = need;
    }
    rt->lora_max_in = in;
    rt->lora_max_rank = rank;
    return EI_OK;
}

ei_status ei_runtime_set_slot_loras(ei_runtime *rt, int slot, int n, ei_lora *const *loras, const float *scales) {
    if (!rt) return ei_fail(EI_ERR_INVALID_ARG, "set_slot_loras: null runtime");
    if (slot < 0 || slot >= rt->p.n_slots) return ei_fail(EI_ERR_RANGE, "slot %d outside [0, %d)", slot, rt->p.n_slots);
    if (n < 0 || n > EI_MAX_SLOT_LORAS) return ei_fail(EI_ERR_RANGE, "%d adapters on one slot (at most %d)", n, EI_MAX_SLOT_LORAS);
    if (n && (!loras || !scales)) return ei_fail(EI_ERR_INVALID_ARG, "set_slot_loras: null argument");
    if (n == 0 && !rt->slot_lora) return EI_OK;
    for (int i = 0; i < n; i++) {
        if (!loras[i] || loras[i]->m != rt->m) return ei_fail(EI_ERR_INVALID_ARG, "set_slot_loras: adapter %d is not for this model", i);
        ei_status st = lora_scratch(rt, loras[i]);
        if (st != EI_OK) return st;
    }
    ei_slot_loras *s = &rt->slot_lora[slot];
    s->n = n;
    for (int i = 0; i < n; i++) {
        s->lora[i] = loras[i];
        s->scale[i] = scales[i];
    }
    return EI_OK;
}

enum { UP_COLS = 512 };   /* output columns an item of the up projection: r x 2 KiB of B^T stays in L1 */

typedef struct {
    const ei_mm_job *jobs;
    const lora_pair *const *pair;   /* [3] */
    const float *coef;              /* [3][max_batch][rank]: each gathered row's scale * A x */
    const int64_t *rows;
    int64_t n, mb, max_rank;
    int64_t item_end[3];            /* items of jobs [0, j] */
    ei_lora_up_fn up;
} up_task;

static void up_item(void *raw, int64_t item) {
    const up_task *u = raw;
    int j = 0;
    while (item >= u->item_end[j]) j++;
    const lora_pair *p = u->pair[j];
    const int64_t out = p->target->ne1, c0 = (item - (j ? u->item_end[j - 1] : 0)) * UP_COLS;
    const int64_t nc = EI_MIN(UP_COLS, out - c0);
    for (int64_t i = 0; i < u->n; i++)
        u->up(nc, p->rank, u->coef + ((int64_t)j * u->mb + i) * u->max_rank, p->bt + c0, out,
              u->jobs[j].y + u->rows[i] * out + c0);
}

/* After the base matmul of `jobs` on rows x: row r belongs to slot rt->lora_slots[r] (forward sets it for
 * the batch's tokens, or the head's output rows); each adapter of those slots adds its update. A row's
 * adapters add up in its slot's list order, whatever else the batch holds: a row's result never
 * depends on its neighbours. */
void ei_lora_apply(ei_runtime *rt, const ei_mm_job *jobs, int n_jobs, const float *x, int64_t n_rows) {
    const int32_t *slot_of = rt->lora_slots;
    const int64_t mb = rt->p.max_batch, R = rt->lora_max_rank;
    float *xg = rt->lora_buf, *tg = xg + mb * rt->lora_max_in, *coef = tg + 3 * mb * R;
    int64_t *rows = rt->lora_rows;
    float *scale = rt->lora_row_scale;
    const int64_t in = jobs[0].w->ne0;
    for (int pos = 0; pos < EI_MAX_SLOT_LORAS; pos++) {
        /* the distinct adapters at this place of the rows' lists */
        const ei_lora **seen = rt->lora_seen;
        int n_seen = 0;
        for (int64_t r = 0; r < n_rows; r++) {
            const ei_slot_loras *s = &rt->slot_lora[slot_of[r]];
            if (pos >= s->n) continue;
            int k = 0;
            while (k < n_seen && seen[k] != s->lora[pos]) k++;
            if (k == n_seen) seen[n_seen++] = s->lora[pos];
        }
        for (int k = 0; k < n_seen; k++) {
            const ei_lora *a = seen[k];
            const lora_pair *pair[3] = {0};
            int n_pair = 0;
            for (int j = 0; j < n_jobs && j < 3; j++)
                if ((pair[j] = find_pair(a, jobs[j].w)) != NULL) n_pair++;
            if (!n_pair) continue;
            int64_t n = 0;
            for (int64_t r = 0; r < n_rows; r++) {
                const ei_slot_loras *s = &rt->slot_lora[slot_of[r]];
                if (pos < s->n && s->lora[pos] == a) rows[n] = r, scale[n++] = s->scale[pos];
            }
            for (int64_t i = 0; i < n; i++) memcpy(xg + i * in, x + rows[i] * in, (size_t)in * sizeof(float));
            /* t_j = A_j x for every adapted job at once (they share x) */
            ei_mm_job down[3];
            int n_down = 0;
            for (int j = 0; j < n_jobs && j < 3; j++)
                if (pair[j]) down[n_down++] = (ei_mm_job){&pair[j]->a, tg + (int64_t)j * mb * R, NULL};
            ei_matmul_base(rt, down, n_down, xg, n);
            /* y += (scale t_j) . B_j^T, the output's columns spread over the pool */
            up_task u = {.jobs = jobs, .pair = pair, .coef = coef, .rows = rows, .n = n, .mb = mb, .max_rank = R,
                         .up = rt->kt->lora_up};
            int64_t items = 0;
            for (int j = 0; j < 3; j++) {
                if (j < n_jobs && pair[j]) {
                    const int r = pair[j]->rank;
                    for (int64_t i = 0; i < n; i++)
                        for (int q = 0; q < r; q++)
                            coef[((int64_t)j * mb + i) * R + q] = scale[i] * tg[(int64_t)j * mb * R + i * r + q];
                    items += (pair[j]->target->ne1 + UP_COLS - 1) / UP_COLS;
                }
                u.item_end[j] = items;
            }
            if (items > 1) ei_pool_for(rt->pool, items, up_item, &u);
            else up_item(&u, 0);
        }
    }
}
