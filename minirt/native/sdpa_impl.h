/* Scaled dot-product attention with its scores kept in cache: com.minirt::ScaledDotProductAttention
 * (minirt/kernels/fused.py) of float32 operands, compiled once per instruction set by kernels.c after
 * gemm_impl.h and rowops_impl.h (it is made of their products and row softmax):
 *
 *   out[b, i, :] = softmax_j(scale * (q[b, i, :] . k[b, j, :]) + mask[b, i, j]) . v[b, j, :]
 *
 * for b < bh (batch x heads), i < sq queries, j < sk keys.  The kernels composed one after the other
 * (MatMul, Mul, Add, Softmax, MatMul) wrote the bh x sq x sk scores to memory and read them back three
 * times: Whisper-tiny's encoder, 6 heads over 1500 positions, 54 MB per layer.  Here a work item is
 * one b and a block of `rows` queries (their rows x sk scores, at most ~128 KB, stay in L2 between
 * the products): the scores of the block (a product against k, packed once per b), scaled, the mask
 * added, the softmax of each row in place, then the block's output rows (a product against v, packed
 * once per b).  Every step is the same float operation as in the composed kernels (the same products,
 * K blocked by FN(sgemm_kc); one multiply by the scale, one add of the mask; the native row softmax):
 * the results are identical to theirs, whatever the threads.
 *
 * Layouts (C-contiguous): q [bh, sq, d]; k [bh, sk, d] (transpose_k) or [bh, d, sk]; v [bh, sk, dv];
 * out [bh, sq, dv]; the mask (or NULL) element (b, i, j) at mask[b * mask_b + i * mask_r + j] (a
 * stride of 0 shares it). */

typedef struct {
    const mrt_sdpa_shape *s;
    const float *q, *k, *v, *mask;
    float *out;
    int rows;    /* queries per work item */
    long blocks; /* work items per b */
    int failed;  /* a thread found no scratch */
} FN(sdpa_args);

/* row[j] = row[j] * scale (+ m[j]) for j < n, in vectors: one float multiply, then one float add, as the
 * composed kernels' Mul and Add (scale 1: no multiply) */
static inline MRT_TARGET void FN(sdpa_scale_mask)(float *row, int n, float scale, const float *m) {
    const FN(vf) vs = (FN(vf)){0} + scale;
    int j = 0;
    for (; j + MRT_VL <= n; j += MRT_VL) {
        FN(vf) x = FN(vload)(row + j);
        if (scale != 1.0f) x *= vs;
        if (m) x += FN(vload)(m + j);
        FN(vstore)(row + j, x);
    }
    for (; j < n; ++j) {
        float x = row[j];
        if (scale != 1.0f) x *= scale;
        if (m) x += m[j];
        row[j] = x;
    }
}

static MRT_TARGET void FN(sdpa_task)(void *ctx, long begin, long end) {
    FN(sdpa_args) *a = (FN(sdpa_args) *)ctx;
    const mrt_sdpa_shape *s = a->s;
    const int sq = s->sq, sk = s->sk, d = s->d, dv = s->dv;
    /* this thread's k and v of the current b, packed as the products' B, and its block of scores */
    const long kfl = (FN(sgemm_packed_b_floats)(d, sk) + 15) / 16 * 16;
    const long vfl = (FN(sgemm_packed_b_floats)(sk, dv) + 15) / 16 * 16;
    /* (64-byte aligned, as mrt_scratch_buffer's blocks are; kfl and vfl keep the next ones so) */
    float *kp = (float *)mrt_scratch_buffer(((size_t)kfl + vfl + (size_t)a->rows * sk) * sizeof(float));
    if (!kp) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *vp = kp + kfl, *scores = vp + vfl;
    long packed = -1;
    for (long item = begin; item < end; ++item) {
        const long b = item / a->blocks;
        const int r0 = (int)(item % a->blocks) * a->rows;
        const int rows = sq - r0 < a->rows ? sq - r0 : a->rows;
        if (b != packed) {
            const float *kb = a->k + b * (long)sk * d;
            if (s->transpose_k) /* q . k^T: B is k, stored N x K (transb) */
                FN(sgemm_pack_b_all)(kb, d, 1, d, sk, kp);
            else
                FN(sgemm_pack_b_all)(kb, sk, 0, d, sk, kp);
            FN(sgemm_pack_b_all)(a->v + b * (long)sk * dv, dv, 0, sk, dv, vp);
            packed = b;
        }
        FN(sgemm_pb)(rows, sk, d, a->q + (b * sq + r0) * (long)d, d, kp, scores, sk, NULL, 0, NULL, 0, MRT_ACT_NONE,
                     0.0f, 0.0f, 1);
        if (s->scale != 1.0f || a->mask)
            for (int i = 0; i < rows; ++i)
                FN(sdpa_scale_mask)(scores + (long)i * sk, sk, s->scale,
                                    a->mask ? a->mask + b * s->mask_b + (long)(r0 + i) * s->mask_r : NULL);
        FN(softmax_args) sa = {scores, scores, sk, 0};
        FN(softmax_task)(&sa, 0, rows);
        FN(sgemm_pb)(rows, dv, sk, scores, sk, vp, a->out + (b * sq + r0) * (long)dv, dv, NULL, 0, NULL, 0,
                     MRT_ACT_NONE, 0.0f, 0.0f, 1);
    }
}

/* Scores per work item: a block of queries whose scores fit ~128 KB, in whole microkernel tiles
 * (FN(sgemm_tile_rows): 8 rows on AVX-512, 6 on AVX2 / SSE2 / NEON, where blocks of 8n rows left a tile
 * of 2 or 4), from one tile to about 128 queries (BERT-mini's 128 x 128 heads: one item each on AVX-512). */
#define G_SDPA_SCORE_FLOATS 32768
#define G_SDPA_MAX_ROWS (128 / FN(sgemm_tile_rows) * FN(sgemm_tile_rows))

static int FN(sdpa)(const mrt_sdpa_shape *s, const float *q, const float *k, const float *v, const float *mask,
                    float *out, int nthreads) {
    if (s->bh <= 0 || s->sq <= 0 || s->dv <= 0) return 0;
    FN(sdpa_args) a = {s, q, k, v, mask, out, 0, 0, 0};
    const int mr = FN(sgemm_tile_rows);
    int rows = G_SDPA_SCORE_FLOATS / (s->sk > 0 ? s->sk : 1) / mr * mr;
    a.rows = rows < mr ? mr : rows > G_SDPA_MAX_ROWS ? G_SDPA_MAX_ROWS : rows;
    a.blocks = (s->sq + a.rows - 1) / a.rows;
    const long unit = (long)a.rows * s->sk * (s->d + s->dv) / 16; /* (GEMM units: multiply-adds / 16) */
    mrt_parallel_for((long)s->bh * a.blocks, unit, nthreads, FN(sdpa_task), &a);
    return a.failed ? -1 : 0;
}

#undef G_SDPA_SCORE_FLOATS
#undef G_SDPA_MAX_ROWS
