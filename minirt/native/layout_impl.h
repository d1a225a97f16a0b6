/* Data-movement kernels, compiled once per instruction set by kernels.c (as
 * kernels_impl.h: MRT_TARGET, FN(name)).  They are memory-bound: the point is
 * one pass over the data with unit-stride inner loops the compiler vectorises,
 * instead of numpy's several passes and temporaries.
 *
 *   upsample_nearest  nearest upsampling by integer factors of the last two axes
 *                     (Resize when the index is exactly i // factor)
 *   plane_means       the mean of every plane (GlobalAveragePool)
 *   maxpool_s1        max pooling with stride 1 (rows, then columns)
 *   convt_tiles       ConvTranspose with stride == kernel (no overlapping taps):
 *                     a GEMM per band of input rows into scratch, then the taps
 *                     interleaved into the output rows while the band is in cache
 */

/* ---------------------------------------------------------------- nearest upsampling */

typedef struct {
    const float *x;
    float *y;
    int h, wd, fh, fw;
} FN(upsample_args);

static MRT_TARGET void FN(upsample_task)(void *ctx, long begin, long end) {
    const FN(upsample_args) *a = (const FN(upsample_args) *)ctx;
    const int wd = a->wd, fw = a->fw;
    const long ow = (long)wd * fw;
    for (long p = begin; p < end; ++p) {
        const float *xp = a->x + p * (long)a->h * wd;
        float *yp = a->y + p * (long)a->h * a->fh * ow;
        for (int i = 0; i < a->h; ++i) {
            const float *restrict src = xp + (long)i * wd;
            float *restrict row = yp + (long)i * a->fh * ow;
            /* the first output row of input row i, then fh - 1 copies of it */
            if (fw == 1) {
                memcpy(row, src, sizeof(float) * wd);
            } else if (fw == 2) {
                for (int j = 0; j < wd; ++j) {
                    row[2 * j] = src[j];
                    row[2 * j + 1] = src[j];
                }
            } else {
                for (int j = 0; j < wd; ++j)
                    for (int t = 0; t < fw; ++t) row[(long)j * fw + t] = src[j];
            }
            for (int t = 1; t < a->fh; ++t) memcpy(row + t * ow, row, sizeof(float) * ow);
        }
    }
}

static void FN(upsample_nearest)(const float *x, float *y, long planes, int h, int wd, int fh, int fw, int nthreads) {
    FN(upsample_args) a = {x, y, h, wd, fh, fw};
    mrt_parallel_for(planes, (long)h * wd * fh * fw, nthreads, FN(upsample_task), &a);
}

/* ---------------------------------------------------------------- plane means */

typedef struct {
    const float *x;
    float *y;
    long plane;
} FN(means_args);

/* 16 independent float partial sums (one or two vectors, so the loop vectorises
 * without reassociation flags), combined in double; the summation error is that
 * of plane/16-long float sums, as in onnxruntime's vectorised reduction. */
#define MRT_MEAN_LANES 16

static MRT_TARGET void FN(means_task)(void *ctx, long begin, long end) {
    const FN(means_args) *a = (const FN(means_args) *)ctx;
    const long n = a->plane;
    for (long p = begin; p < end; ++p) {
        const float *restrict xp = a->x + p * n;
        float acc[MRT_MEAN_LANES] = {0};
        long i = 0;
        for (; i + MRT_MEAN_LANES <= n; i += MRT_MEAN_LANES)
            for (int l = 0; l < MRT_MEAN_LANES; ++l) acc[l] += xp[i + l];
        double s = 0.0;
        for (int l = 0; l < MRT_MEAN_LANES; ++l) s += acc[l];
        for (; i < n; ++i) s += xp[i];
        a->y[p] = (float)(s / (double)n);
    }
}

static void FN(plane_means)(const float *x, float *y, long planes, long plane, int nthreads) {
    FN(means_args) a = {x, y, plane};
    mrt_parallel_for(planes, plane, nthreads, FN(means_task), &a);
}

/* ---------------------------------------------------------------- ConvTranspose, stride == kernel */

typedef struct {
    const float *x, *wt, *bias;
    float *y;
    int c, h, wd, m, kh, kw, band, act;
    float a0, a1;
    long bands_per_image;
    int failed;
} FN(convt_args);

/* Place one band of GEMM rows: cols[(mi*kh + t)*kw + tw][i*wd + j] is output
 * (mi, (r0 + i)*kh + t, j*kw + tw). */
static MRT_TARGET void FN(convt_scatter)(const float *cols, long ldc, float *y, int m, int kh, int kw, int r0,
                                          int rows, int h, int wd) {
    const long ow = (long)wd * kw, oplane = (long)h * kh * ow;
    for (int mi = 0; mi < m; ++mi)
        for (int t = 0; t < kh; ++t) {
            const float *tap = cols + (long)(mi * kh + t) * kw * ldc;
            for (int i = 0; i < rows; ++i) {
                float *restrict row = y + mi * oplane + ((long)(r0 + i) * kh + t) * ow;
                const float *restrict s0 = tap + (long)i * wd;
                if (kw == 2) {
                    const float *restrict s1 = s0 + ldc;
                    for (int j = 0; j < wd; ++j) {
                        row[2 * j] = s0[j];
                        row[2 * j + 1] = s1[j];
                    }
                } else {
                    for (int tw = 0; tw < kw; ++tw) {
                        const float *restrict s = s0 + tw * ldc;
                        for (int j = 0; j < wd; ++j) row[(long)j * kw + tw] = s[j];
                    }
                }
            }
        }
}

static MRT_TARGET void FN(convt_task)(void *ctx, long begin, long end) {
    FN(convt_args) *a = (FN(convt_args) *)ctx;
    const long plane = (long)a->h * a->wd;
    const int rows_out = a->m * a->kh * a->kw;
    float *cols = (float *)mrt_scratch_buffer(sizeof(float) * (size_t)rows_out * a->band * a->wd);
    if (!cols) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (long u = begin; u < end; ++u) {
        const long img = u / a->bands_per_image;
        const int r0 = (int)(u % a->bands_per_image) * a->band;
        const int rows = a->h - r0 < a->band ? a->h - r0 : a->band;
        const long ldc = (long)rows * a->wd;
        /* B = the band's input rows, one row of B per input channel (row stride: the plane) */
        sgemm_one(rows_out, (int)ldc, a->c, a->wt, a->c, a->x + img * a->c * plane + (long)r0 * a->wd, plane, cols,
                  ldc, a->bias, 1, NULL, 0, a->act, a->a0, a->a1, 1);
        FN(convt_scatter)(cols, ldc, a->y + img * (long)a->m * plane * a->kh * a->kw, a->m, a->kh, a->kw, r0, rows,
                          a->h, a->wd);
    }
}

/* Scratch per band: about this many floats (the GEMM output of the band stays in L2). */
#define MRT_CONVT_BAND_FLOATS 65536

static int FN(convt_tiles)(const float *x, int n, int c, int h, int wd, const float *wt, int m, int kh, int kw,
                           const float *bias, float *y, int act, float a0, float a1, int nthreads) {
    const long row_floats = (long)m * kh * kw * wd;
    long band = MRT_CONVT_BAND_FLOATS / (row_floats > 0 ? row_floats : 1);
    if (band < 1) band = 1;
    if (band > h) band = h;
    FN(convt_args) a = {x, wt, bias, y, c, h, wd, m, kh, kw, (int)band, act, a0, a1, (h + band - 1) / band, 0};
    mrt_parallel_for((long)n * a.bands_per_image, row_floats * band * c, nthreads, FN(convt_task), &a);
    return a.failed ? -1 : 0;
}

/* ---------------------------------------------------------------- max pooling, stride 1 */

/* Stride 1, dilation 1 (SPPF's 5x5 pools): separable, max over the kw columns of every row, then
 * over the kh rows.  Each plane is first copied into a -inf-bordered (oh + kh - 1) x (ow + kw - 1)
 * scratch plane, so both passes are single flat loops over the padded plane (the columns past ow
 * are computed and dropped), which keeps 10x10 planes from being dominated by per-row overhead. */
typedef struct {
    const float *x;
    float *y;
    int h, wd, kh, kw, pt, pl, oh, ow;
    int failed;
} FN(maxpool_s1_args);

/* acc[i] = max(acc[i], v[i]) with NaN sticking, as max_strided (kernels_impl.h) */
static inline MRT_TARGET void FN(max_into)(float *restrict acc, const float *restrict v, long n) {
    for (long i = 0; i < n; ++i) {
        float a = v[i], m = acc[i];
        acc[i] = ((a > m) | (a != a)) ? a : m;
    }
}

static MRT_TARGET void FN(maxpool_s1_task)(void *ctx, long begin, long end) {
    FN(maxpool_s1_args) *a = (FN(maxpool_s1_args) *)ctx;
    const long hp = (long)a->oh + a->kh - 1, wp = (long)a->ow + a->kw - 1, np_ = hp * wp;
    const long nc = (long)a->oh * wp;
    float *pad = (float *)mrt_scratch_buffer(sizeof(float) * (2 * (size_t)np_ + (size_t)nc));
    if (!pad) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *rows = pad + np_; /* rows[i] = max over the kw columns starting at padded position i */
    float *acc = rows + np_; /* acc[oy*wp + ox] = max over the kh rows of `rows` from row oy */
    /* input rows/columns that land inside the padded plane */
    const int r0 = a->pt > 0 ? 0 : -a->pt, r1 = a->h < hp - a->pt ? a->h : (int)(hp - a->pt);
    const int c0 = a->pl > 0 ? 0 : -a->pl, c1 = a->wd < wp - a->pl ? a->wd : (int)(wp - a->pl);
    for (long i = 0; i < np_; ++i) pad[i] = -INFINITY;
    for (long p = begin; p < end; ++p) {
        const float *xp = a->x + p * (long)a->h * a->wd;
        float *yp = a->y + p * (long)a->oh * a->ow;
        /* the borders stay -inf from the first fill: only the interior is rewritten per plane */
        for (int r = r0; r < r1; ++r)
            memcpy(pad + (long)(r + a->pt) * wp + a->pl + c0, xp + (long)r * a->wd + c0, sizeof(float) * (c1 - c0));
        const long nr = np_ - (a->kw - 1); /* row maxima for every start that stays inside the buffer */
        memcpy(rows, pad, sizeof(float) * nr);
        for (int kx = 1; kx < a->kw; ++kx) FN(max_into)(rows, pad + kx, nr);
        /* column pass; only the first nc - (kw - 1) entries are needed (the last ow of them ends there) */
        const long ncv = nc - (a->kw - 1);
        memcpy(acc, rows, sizeof(float) * ncv);
        for (int ky = 1; ky < a->kh; ++ky) FN(max_into)(acc, rows + ky * wp, ncv);
        for (int oy = 0; oy < a->oh; ++oy) memcpy(yp + (long)oy * a->ow, acc + oy * wp, sizeof(float) * a->ow);
    }
}

static int FN(maxpool_s1)(const float *x, float *y, long planes, int h, int wd, int kh, int kw, int pt, int pl, int oh,
                          int ow, int nthreads) {
    FN(maxpool_s1_args) a = {x, y, h, wd, kh, kw, pt, pl, oh, ow, 0};
    mrt_parallel_for(planes, (long)(oh + kh) * (ow + kw) * 3, nthreads, FN(maxpool_s1_task), &a);
    return a.failed ? -1 : 0;
}
