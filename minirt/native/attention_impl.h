/* Attention over a KV cache with grouped heads: mrt_gqa_attention_f32 (kernels.h), the step of
 * com.microsoft::GroupQueryAttention after its inputs are checked (minirt/kernels/decoder.py): the new
 * tokens' keys rotated (RoPE) and written with their values into the cache at each sequence's past
 * length, the queries rotated into a scratch copy, then the attention below.
 *
 * Work item: one (sequence b, kv head). Its query heads h = kvh * group + g read the cache rows
 * [b, kvh, 0:total_b].  Rows of one call: a decode step (S == 1) takes the group's heads together
 * (their queries are contiguous: lda = D); a longer step takes one head's S positions (lda = H * D).
 * For those rows: scores = rows . K^T (the float matrix-vector product of the selected ISA for up to 8
 * rows, K read in place as the transposed operand; the GEMM for more), scaled (softcap: c * tanh(x / c)), softmax over each row's allowed keys only
 * (the native row softmax; the keys outside are 0), out rows = P . V, written straight into
 * out[b, s, h, :] (the [B, S, H * D] output, no transposes).  Row r at position s may see keys
 * lo <= j < hi with hi = min(past_b + s + 1, total_b) (causal, and a right-padded prompt sees its
 * real tokens only) and lo = max(0, hi' - window) with hi' = past_b + s + 1 when a local window is
 * set.  Scratch (rows x total scores) is allocated per work item. */

typedef struct {
    const mrt_attention_shape *s;
    const float *q, *k, *v; /* q [B, S, H, D] (rotated), the caches */
    const int64_t *pasts, *totals;
    float *out;
    int failed;
} att_job;

/* RoPE of one head vector x (D values) at cache row ``row`` (cos / sin [*, half]) into y: the first
 * 2 * half features rotate (pairs (i, i + half), or (2i, 2i + 1) interleaved), the rest are copied.
 * y may not be x. */
static void att_rotate(const mrt_attention_shape *s, const float *x, const float *cos, const float *sin, float *y) {
    const int half = s->rotary_half, D = s->head_size;
    if (s->rotary_interleaved) {
        for (int i = 0; i < half; i++) {
            const float a = x[2 * i], b = x[2 * i + 1];
            y[2 * i] = a * cos[i] - b * sin[i];
            y[2 * i + 1] = a * sin[i] + b * cos[i];
        }
    } else {
        for (int i = 0; i < half; i++) {
            const float a = x[i], b = x[i + half];
            y[i] = a * cos[i] - b * sin[i];
            y[i + half] = a * sin[i] + b * cos[i];
        }
    }
    memcpy(y + 2 * half, x + 2 * half, (size_t)(D - 2 * half) * sizeof(float));
}

/* C (M x N, row stride ldc) = A (M x K, lda) . B, B (K x N, ldb) or with transb stored N x K: the
 * matrix-vector product for a few rows (B read in place), the GEMM (B packed per call) for more. */
#define ATT_GEMV_ROWS 8
static void att_product(int M, int N, int K, const float *A, long lda, const float *B, long ldb, int transb, float *C,
                        long ldc) {
    if (M <= ATT_GEMV_ROWS) {
        const mrt_gemm_shape g = {1, M, N, K, lda, ldb, ldc, 0, 0, 0, 0, 0, transb, 0};
        const mrt_epilogue e = {NULL, MRT_ACT_NONE, 0.0f, 0.0f, 1.0f, 0.0f};
        mrt_sgemv_f32(&g, &e, A, B, C, 1);
    } else {
        impl->sgemm(1, M, N, K, A, lda, 0, B, ldb, 0, transb, C, ldc, 0, NULL, 0, NULL, 0, 0, MRT_ACT_NONE, 0.0f, 0.0f,
                    1, 1);
    }
}

/* rows [0, n) of one call: query row r at q + r * ldq, output at out + r * ldo, position pos0 + r * dpos */
static int att_rows(const att_job *j, int n, const float *q, long ldq, float *out, long ldo, long past, long total,
                    int pos0, int dpos, const float *kc, const float *vc) {
    const mrt_attention_shape *s = j->s;
    const int D = s->head_size;
    /* the keys any row sees: [0, kmax) */
    long kmax = 0;
    for (int r = 0; r < n; r++) {
        long hi = past + pos0 + (long)r * dpos + 1;
        hi = hi < total ? hi : total;
        kmax = hi > kmax ? hi : kmax;
    }
    if (kmax <= 0) {
        for (int r = 0; r < n; r++) memset(out + r * ldo, 0, (size_t)D * sizeof(float));
        return 0;
    }
    float *p = (float *)malloc((size_t)n * (size_t)kmax * sizeof(float));
    if (!p) return -1;
    att_product(n, (int)kmax, D, q, ldq, kc, D, 1, p, kmax);
    for (int r = 0; r < n; r++) {
        float *row = p + (long)r * kmax;
        const long end = past + pos0 + (long)r * dpos + 1;
        const long hi = end < total ? end : total;
        const long lo = s->local_window > 0 && end - s->local_window > 0 ? end - s->local_window : 0;
        for (long c = 0; c < lo; c++) row[c] = 0.0f;
        for (long c = hi > 0 ? hi : 0; c < kmax; c++) row[c] = 0.0f;
        if (hi <= lo) continue; /* (no key: a zero output row) */
        for (long c = lo; c < hi; c++) {
            float x = row[c] * s->scale;
            if (s->softcap > 0.0f) x = s->softcap * tanhf(x / s->softcap);
            row[c] = x;
        }
        mrt_softmax_f32(row + lo, row + lo, 1, hi - lo, 0, 1);
    }
    /* out rows = P . V (ldc = ldo) */
    att_product(n, D, (int)kmax, p, kmax, vc, D, 0, out, ldo);
    free(p);
    return 0;
}

static void att_task(void *ctx, long begin, long end) {
    att_job *j = (att_job *)ctx;
    const mrt_attention_shape *s = j->s;
    const int S = s->seq, H = s->heads, KVH = s->kv_heads, D = s->head_size, group = H / KVH;
    for (long it = begin; it < end; it++) {
        const long b = it / KVH, kvh = it % KVH;
        const float *kc = j->k + (b * KVH + kvh) * s->capacity * D, *vc = j->v + (b * KVH + kvh) * s->capacity * D;
        const long past = (long)j->pasts[b], total = (long)j->totals[b];
        int rc = 0;
        if (S == 1) { /* the group's heads at one position */
            const long h0 = kvh * group;
            rc = att_rows(j, group, j->q + (b * H + h0) * D, D, j->out + (b * H + h0) * D, D, past, total, 0, 0, kc, vc);
        } else {
            for (int g = 0; g < group && rc == 0; g++) {
                const long h = kvh * group + g;
                rc = att_rows(j, S, j->q + (b * S * H + h) * D, (long)H * D, j->out + (b * S * H + h) * D, (long)H * D,
                              past, total, 0, 1, kc, vc);
            }
        }
        if (rc) __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    }
}

int mrt_gqa_attention_f32(const mrt_attention_shape *s, const mrt_attention_step *x, const float *cos,
                          const float *sin, const mrt_kv_cache *c, float *out, int nthreads) {
    if (!s || !x || !c || !x->q || !c->k || !c->v || !c->pasts || !c->totals || !out || s->batch <= 0 ||
        s->seq <= 0 || s->heads <= 0 || s->kv_heads <= 0 || s->heads % s->kv_heads || s->head_size <= 0 ||
        s->capacity <= 0 || s->rotary_half < 0 || 2 * s->rotary_half > s->head_size ||
        (s->rotary_half && (!cos || !sin || !x->positions)) || ((x->k == NULL) != (x->v == NULL)))
        return -2;
    const int B = s->batch, S = s->seq, H = s->heads, KVH = s->kv_heads, D = s->head_size, half = s->rotary_half;
    for (int b = 0; b < B; b++)
        if (c->pasts[b] < 0 || c->totals[b] < 0 || c->totals[b] > s->capacity || c->pasts[b] + S > s->capacity)
            return -2;
    if (half)
        for (long i = 0; i < (long)B * S; i++)
            if (x->positions[i] < 0 || x->positions[i] >= s->max_position) return -3;
    /* the new keys (rotated) and values into the cache rows past_b + s */
    if (x->k)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < S; t++) {
                const long row = (long)b * S + t;
                const float *kin = x->k + row * x->kv_row, *vin = x->v + row * x->kv_row;
                for (int h = 0; h < KVH; h++) {
                    const long at = (((long)b * KVH + h) * s->capacity + c->pasts[b] + t) * D;
                    if (half)
                        att_rotate(s, kin + (long)h * D, cos + x->positions[row] * half, sin + x->positions[row] * half,
                                   c->k + at);
                    else
                        memcpy(c->k + at, kin + (long)h * D, (size_t)D * sizeof(float));
                    memcpy(c->v + at, vin + (long)h * D, (size_t)D * sizeof(float));
                }
            }
    /* the queries, rotated, as [B, S, H, D] */
    float *qr = (float *)malloc((size_t)B * S * H * D * sizeof(float));
    if (!qr) return -1;
    for (long row = 0; row < (long)B * S; row++)
        for (int h = 0; h < H; h++) {
            const float *qin = x->q + row * x->q_row + (long)h * D;
            float *dst = qr + (row * H + h) * D;
            if (half)
                att_rotate(s, qin, cos + x->positions[row] * half, sin + x->positions[row] * half, dst);
            else
                memcpy(dst, qin, (size_t)D * sizeof(float));
        }
    att_job j = {s, qr, c->k, c->v, c->pasts, c->totals, out, 0};
    const long items = (long)B * KVH;
    mrt_parallel_for(items, (long)(H / KVH) * S * s->capacity * D * 2, nthreads, att_task, &j);
    free(qr);
    return j.failed ? -1 : 0;
}

int mrt_gqa_decode_f32(const mrt_gqa_decode *p, const float *qkv, const int32_t *seqlens_k, float *k_cache,
                       float *v_cache, float *out, int nthreads) {
    if (!p || !qkv || !seqlens_k || p->shape.batch != 1 || p->shape.seq != 1) return -2;
    const long H = p->shape.heads, KVH = p->shape.kv_heads, D = p->shape.head_size, row = (H + 2 * KVH) * D;
    if (p->ring) { /* the new key / value to their ring row, then the attention over the filled rows */
        const long pos = seqlens_k[0], cap = p->shape.capacity, half = p->shape.rotary_half;
        if (pos < 0 || p->shape.local_window) return -2;
        if (half && pos >= p->shape.max_position) return -3;
        for (long h = 0; h < KVH; h++) {
            const long at = (h * cap + pos % cap) * D;
            if (half)
                att_rotate(&p->shape, qkv + (H + h) * D, p->cos + pos * half, p->sin + pos * half, k_cache + at);
            else
                memcpy(k_cache + at, qkv + (H + h) * D, (size_t)D * sizeof(float));
            memcpy(v_cache + at, qkv + (H + KVH + h) * D, (size_t)D * sizeof(float));
        }
        int64_t ints[3] = {pos, pos < cap ? pos : cap - 1, pos < cap ? pos + 1 : cap};
        const mrt_attention_step x = {qkv, NULL, NULL, row, row, ints};
        const mrt_kv_cache c = {k_cache, v_cache, ints + 1, ints + 2};
        return mrt_gqa_attention_f32(&p->shape, &x, p->cos, p->sin, &c, out, nthreads);
    }
    /* the new token's position = its row in the caches = seqlens_k[0]; totals: one past it
     * (mrt_gqa_attention_f32 checks both against the capacity and the cos / sin caches) */
    int64_t ints[3] = {seqlens_k[0], seqlens_k[0], (int64_t)seqlens_k[0] + 1};
    const mrt_attention_step x = {qkv, qkv + H * D, qkv + (H + KVH) * D, row, row, ints};
    const mrt_kv_cache c = {k_cache, v_cache, ints + 1, ints + 2};
    return mrt_gqa_attention_f32(&p->shape, &x, p->cos, p->sin, &c, out, nthreads);
}
