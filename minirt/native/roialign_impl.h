/* RoiAlign's sampling loops (mrt_roi_align_f32, kernels.c), compiled once per instruction set by
 * kernels.c (as kernels_impl.h: MRT_TARGET, FN(name)).  The RoI geometry and the bilinear taps of
 * each axis are computed once, by the baseline code of kernels.c (roi_geometry, roi_axis_taps: the
 * same floats on every ISA); here only the weighted sums over the channels.
 *
 * Two layouts of the input:
 *   channels-last  (a->xt: the maps transposed to (n, h, w, c) by the caller) each bilinear tap is a
 *                  run of c contiguous floats, summed into c accumulators with vector loops: the path
 *                  of detectors (hundreds of RoIs on small feature maps, every pixel read many times);
 *   planes         (a->x as given) per channel, scalar taps: for a few RoIs on a large map, where the
 *                  transposed copy would cost more than the sampling.
 * Per bin and channel, avg: the sum over the samples of (w1 v1 + w2 v2 + w3 v3 + w4 v4), divided by
 * the sample count; max: the max over the samples of max(w1 v1, w2 v2, w3 v3, w4 v4) (onnxruntime's
 * definitions, in its order of operations). */

typedef struct {
    const mrt_roi_align_shape *s;
    const float *x;  /* (n, c, h, w) */
    const float *xt; /* (n, h, w, c), or NULL: the planes path */
    const float *rois;
    const int64_t *batch;
    float *y;
    long max_ty, max_tx; /* the most taps along y / x of any RoI (oh * gh, ow * gw) */
    int failed;          /* set (atomically) by a task that could not allocate its scratch */
} FN(roi_args);

static MRT_TARGET void FN(roi_align_task)(void *ctx, long begin, long end) {
    FN(roi_args) *a = (FN(roi_args) *)ctx;
    const mrt_roi_align_shape *s = a->s;
    const int C = s->c, H = s->h, W = s->w, oh = s->oh, ow = s->ow, avg = s->mode == MRT_ROI_AVG;
    const long bins = (long)oh * ow;
    roi_tap *ty = (roi_tap *)mrt_scratch_malloc(sizeof(roi_tap) * (size_t)(a->max_ty + a->max_tx));
    /* channels-last: the RoI's bins (bins, C), written to its (C, bins) output at the end (one bin's C
     * values stored straight to the output would land a whole row of bins apart each: measured 60% of
     * the kernel's time); planes: unused */
    float *acc = (float *)mrt_scratch_malloc(sizeof(float) * (size_t)(a->xt ? C * bins : 1));
    if (!ty || !acc) {
        free(ty);
        free(acc);
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    roi_tap *tx = ty + a->max_ty;
    for (long r = begin; r < end; ++r) {
        float *yr = a->y + r * C * bins;
        roi_geom g;
        roi_geometry(s, a->rois + 4 * r, &g);
        if (g.gh <= 0 || g.gw <= 0) { /* no samples: zeros */
            memset(yr, 0, sizeof(float) * (size_t)(C * bins));
            continue;
        }
        roi_axis_taps(g.start_h, g.bin_h, oh, g.gh, H, ty);
        roi_axis_taps(g.start_w, g.bin_w, ow, g.gw, W, tx);
        const long b = a->batch[r];
        if (a->xt) {
            const float *img = a->xt + b * H * W * C;
            for (int ph = 0; ph < oh; ++ph)
                for (int pw = 0; pw < ow; ++pw) {
                    float *restrict ac = acc + ((long)ph * ow + pw) * C;
                    for (int ch = 0; ch < C; ++ch) ac[ch] = 0.0f;
                    int first = 1;
                    for (int iy = 0; iy < g.gh; ++iy) {
                        const roi_tap *yt = ty + (long)ph * g.gh + iy;
                        for (int ix = 0; ix < g.gw; ++ix) {
                            const roi_tap *xs = tx + (long)pw * g.gw + ix;
                            const float w1 = yt->wl * xs->wl, w2 = yt->wl * xs->wh, w3 = yt->wh * xs->wl,
                                        w4 = yt->wh * xs->wh;
                            const float *restrict p1 = img + ((long)yt->lo * W + xs->lo) * C;
                            const float *restrict p2 = img + ((long)yt->lo * W + xs->hi) * C;
                            const float *restrict p3 = img + ((long)yt->hi * W + xs->lo) * C;
                            const float *restrict p4 = img + ((long)yt->hi * W + xs->hi) * C;
                            if (avg) {
                                for (int ch = 0; ch < C; ++ch)
                                    ac[ch] += w1 * p1[ch] + w2 * p2[ch] + w3 * p3[ch] + w4 * p4[ch];
                            } else {
                                for (int ch = 0; ch < C; ++ch) {
                                    float v = w1 * p1[ch], t = w2 * p2[ch];
                                    v = v < t ? t : v;
                                    t = w3 * p3[ch];
                                    v = v < t ? t : v;
                                    t = w4 * p4[ch];
                                    v = v < t ? t : v;
                                    ac[ch] = first || ac[ch] < v ? v : ac[ch];
                                }
                                first = 0;
                            }
                        }
                    }
                }
            /* (bins, C) -> (C, bins): stores in order, loads from the few lines of `bins` rows */
            for (int ch = 0; ch < C; ++ch) {
                float *restrict out = yr + (long)ch * bins;
                const float *in = acc + ch;
                if (avg)
                    for (long k = 0; k < bins; ++k) out[k] = in[k * C] / g.count;
                else
                    for (long k = 0; k < bins; ++k) out[k] = in[k * C];
            }
        } else {
            for (int ch = 0; ch < C; ++ch) {
                const float *plane = a->x + (b * C + ch) * H * W;
                float *out = yr + ch * bins;
                for (int ph = 0; ph < oh; ++ph)
                    for (int pw = 0; pw < ow; ++pw) {
                        float v = 0.0f;
                        int first = 1;
                        for (int iy = 0; iy < g.gh; ++iy) {
                            const roi_tap *yt = ty + (long)ph * g.gh + iy;
                            const float *r0 = plane + (long)yt->lo * W, *r1 = plane + (long)yt->hi * W;
                            for (int ix = 0; ix < g.gw; ++ix) {
                                const roi_tap *xs = tx + (long)pw * g.gw + ix;
                                const float w1 = yt->wl * xs->wl, w2 = yt->wl * xs->wh, w3 = yt->wh * xs->wl,
                                            w4 = yt->wh * xs->wh;
                                if (avg) {
                                    v += w1 * r0[xs->lo] + w2 * r0[xs->hi] + w3 * r1[xs->lo] + w4 * r1[xs->hi];
                                } else {
                                    float m = w1 * r0[xs->lo], t = w2 * r0[xs->hi];
                                    m = m < t ? t : m;
                                    t = w3 * r1[xs->lo];
                                    m = m < t ? t : m;
                                    t = w4 * r1[xs->hi];
                                    m = m < t ? t : m;
                                    v = first || v < m ? m : v;
                                    first = 0;
                                }
                            }
                        }
                        out[(long)ph * ow + pw] = avg ? v / g.count : v;
                    }
            }
        }
    }
    free(ty);
    free(acc);
}

/* xt (n, h, w, c) = x (n, c, h, w) transposed, over the n * h rows [begin, end) */
typedef struct {
    const float *x;
    float *xt;
    int c, h, w;
} FN(roi_transpose_args);

static MRT_TARGET void FN(roi_transpose_task)(void *ctx, long begin, long end) {
    const FN(roi_transpose_args) *a = (const FN(roi_transpose_args) *)ctx;
    const int C = a->c, H = a->h, W = a->w;
    for (long row = begin; row < end; ++row) {
        const long b = row / H, i = row % H;
        float *restrict dst = a->xt + row * W * C;
        for (int ch = 0; ch < C; ++ch) {
            const float *restrict src = a->x + ((b * C + ch) * H + i) * W;
            for (int j = 0; j < W; ++j) dst[(long)j * C + ch] = src[j];
        }
    }
}

/* the whole kernel for this ISA (sizes checked by mrt_roi_align_f32) */
static int FN(roi_align)(const mrt_roi_align_shape *s, const float *x, const float *rois, const int64_t *batch,
                         long nrois, float *y, int channels_last, long max_ty, long max_tx, long samples,
                         int nthreads) {
    float *xt = NULL;
    if (channels_last) {
        xt = (float *)mrt_scratch_malloc(sizeof(float) * (size_t)s->n * s->h * s->w * s->c);
        if (!xt) return -1;
        FN(roi_transpose_args) t = {x, xt, s->c, s->h, s->w};
        mrt_parallel_for((long)s->n * s->h, (long)s->w * s->c, nthreads, FN(roi_transpose_task), &t);
    }
    FN(roi_args) a = {s, x, xt, rois, batch, y, max_ty, max_tx, 0};
    /* per RoI: its share of the samples, four taps over the channels each */
    mrt_parallel_for(nrois, samples / nrois * 4 * s->c, nthreads, FN(roi_align_task), &a);
    free(xt);
    return a.failed ? -1 : 0;
}
