/* The pooling kernels (and the strided row helpers they share with im2col), one copy per ISA level:
 * included by kernels_impl.h (baseline, AVX2, NEON) and by kernels.c at the AVX-512 level, where the
 * stride-2 max pool takes 16 lanes.  FN / MRT_TARGET / MRT_VL are the including level's (kernels.c). */

/* ---------------------------------------------------------------- strided row helpers (pooling, im2col) */

/* Output columns [lo, hi) for which input column ox*s + off is inside [0, w). */
static inline MRT_TARGET void FN(valid_cols)(int off, int s, int w, int ow, int *lo, int *hi) {
    int l = off >= 0 ? 0 : (-off + s - 1) / s;
    int last = w - 1 - off; /* ox*s <= last */
    int h = last < 0 ? 0 : last / s + 1;
    *lo = l < ow ? l : ow;
    *hi = h < ow ? h : ow;
    if (*hi < *lo) *hi = *lo;
}

/* acc[lo:hi] += wv * row[ox*s + off] */
static inline MRT_TARGET void FN(axpy_strided)(float *restrict acc, const float *restrict row, float wv, int off, int s,
                                                int lo, int hi) {
    int ox;
    if (s == 1) {
        const float *r = row + off;
        for (ox = lo; ox < hi; ++ox) acc[ox] += wv * r[ox];
    } else if (s == 2) {
        const float *r = row + off;
        for (ox = lo; ox < hi; ++ox) acc[ox] += wv * r[2 * ox];
    } else {
        for (ox = lo; ox < hi; ++ox) acc[ox] += wv * row[ox * s + off];
    }
}

/* ---------------------------------------------------------------- pooling */

typedef struct {
    const float *x;
    float *y;
    int h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, ch0, ch1, cw0, cw1;
    float scale;
    long nc;    /* planes (FN(maxpool_s2_task)'s items are bands x planes) */
    int nbands; /* bands of output rows per plane (FN(maxpool_s2_task)), 1: whole planes */
} FN(pool_args);

/* acc[lo:hi] = max(acc, row[ox*s + off]).  ((v > m) | (v != v)) ? v : m is
 * the maximum with NaN sticking, as in numpy.maximum; the non-short-circuit |
 * and the restrict pointers keep the loop branch-free and vectorised. */
static inline MRT_TARGET void FN(max_strided)(float *restrict acc, const float *restrict row, int off, int s, int lo,
                                               int hi) {
    int ox;
    const float *r = row + off;
    if (s == 1) {
        for (ox = lo; ox < hi; ++ox) {
            float v = r[ox], m = acc[ox];
            acc[ox] = ((v > m) | (v != v)) ? v : m;
        }
    } else if (s == 2) {
        for (ox = lo; ox < hi; ++ox) {
            float v = r[2 * ox], m = acc[ox];
            acc[ox] = ((v > m) | (v != v)) ? v : m;
        }
    } else {
        for (ox = lo; ox < hi; ++ox) {
            float v = row[ox * s + off], m = acc[ox];
            acc[ox] = ((v > m) | (v != v)) ? v : m;
        }
    }
}

static MRT_TARGET void FN(maxpool_task)(void *ctx, long begin, long end) {
    const FN(pool_args) *a = (const FN(pool_args) *)ctx;
    const int ow = a->ow;
    for (long p = begin; p < end; ++p) {
        const float *xp = a->x + p * (long)a->h * a->wd;
        float *yp = a->y + p * (long)a->oh * ow;
        for (int oy = 0; oy < a->oh; ++oy) {
            float *acc = yp + (long)oy * ow;
            for (int ox = 0; ox < ow; ++ox) acc[ox] = -INFINITY;
            for (int ky = 0; ky < a->kh; ++ky) {
                int iy = oy * a->sh - a->pt + ky * a->dh;
                if (iy < 0 || iy >= a->h) continue;
                const float *row = xp + (long)iy * a->wd;
                for (int kx = 0; kx < a->kw; ++kx) {
                    int off = kx * a->dw - a->pl, lo, hi;
                    FN(valid_cols)(off, a->sw, a->wd, ow, &lo, &hi);
                    FN(max_strided)(acc, row, off, a->sw, lo, hi);
                }
            }
        }
    }
}

#ifndef MRT_COUNT_IN_DEFINED
#define MRT_COUNT_IN_DEFINED
/* How many of the k taps start, start+d, ... lie in [lo, hi). */
static inline int mrt_count_in(int start, int k, int d, int lo, int hi) {
    int cnt = 0;
    for (int t = 0; t < k; ++t) {
        int pos = start + t * d;
        cnt += pos >= lo && pos < hi;
    }
    return cnt;
}
#endif

static MRT_TARGET void FN(avgpool_task)(void *ctx, long begin, long end) {
    const FN(pool_args) *a = (const FN(pool_args) *)ctx;
    const int ow = a->ow;
    float *colcnt = NULL;
    if (a->scale <= 0.0f) {
        colcnt = (float *)mrt_scratch_malloc(sizeof(float) * (ow > 0 ? ow : 1));
        if (!colcnt) return; /* cannot happen for sane sizes; leaves y untouched */
        for (int ox = 0; ox < ow; ++ox)
            colcnt[ox] = (float)mrt_count_in(ox * a->sw - a->pl, a->kw, a->dw, a->cw0, a->cw1);
    }
    for (long p = begin; p < end; ++p) {
        const float *xp = a->x + p * (long)a->h * a->wd;
        float *yp = a->y + p * (long)a->oh * ow;
        for (int oy = 0; oy < a->oh; ++oy) {
            float *acc = yp + (long)oy * ow;
            for (int ox = 0; ox < ow; ++ox) acc[ox] = 0.0f;
            for (int ky = 0; ky < a->kh; ++ky) {
                int iy = oy * a->sh - a->pt + ky * a->dh;
                if (iy < 0 || iy >= a->h) continue;
                const float *row = xp + (long)iy * a->wd;
                for (int kx = 0; kx < a->kw; ++kx) {
                    int off = kx * a->dw - a->pl, lo, hi;
                    FN(valid_cols)(off, a->sw, a->wd, ow, &lo, &hi);
                    FN(axpy_strided)(acc, row, 1.0f, off, a->sw, lo, hi);
                }
            }
            if (colcnt) {
                float rows = (float)mrt_count_in(oy * a->sh - a->pt, a->kh, a->dh, a->ch0, a->ch1);
                for (int ox = 0; ox < ow; ++ox) acc[ox] = acc[ox] / (rows * colcnt[ox]);
            } else {
                for (int ox = 0; ox < ow; ++ox) acc[ox] *= a->scale;
            }
        }
    }
    free(colcnt);
}

/* MaxPool 2x2 / stride 2 without padding over planes of even height and width (the classic
 * downsampling pool): output row r of the whole tensor (plane-major) reads input rows 2r and
 * 2r + 1, which are adjacent in memory because every plane has exactly 2 * oh rows.  So the
 * tensor is one long run of row pairs, taken in blocks: the vertical maxima of a block's row
 * pairs go into a contiguous scratch line, then each output is the maximum of an adjacent pair
 * of it, one long loop over the block.  Both loops are branch-free and vectorise (the select
 * form of max_strided: NaN sticks); the per-plane, per-row loops of maxpool_task cost 4 ns per
 * output on small planes (360 images of 32 x 8 x 8).  Items are output rows. */
#define MRT_POOL2_LINE 4096 /* floats of vertical maxima per block (16 KB, in L1) */
static MRT_TARGET void FN(maxpool2x2_task)(void *ctx, long begin, long end) {
    const FN(pool_args) *a = (const FN(pool_args) *)ctx;
    const int ow = a->ow, wd = a->wd;
    float line[MRT_POOL2_LINE];
    const long block = wd <= MRT_POOL2_LINE ? MRT_POOL2_LINE / wd : 1;
    if (wd > MRT_POOL2_LINE) { /* rows too wide for the line (never in real models): the general loop */
        FN(pool_args) b = *a;
        b.h = 2, b.oh = 1;
        for (long r = begin; r < end; ++r) {
            b.x = a->x + 2 * r * wd, b.y = a->y + r * ow;
            FN(maxpool_task)(&b, 0, 1);
        }
        return;
    }
    for (long r0 = begin; r0 < end; r0 += block) {
        const long rows = end - r0 < block ? end - r0 : block;
        for (long b = 0; b < rows; ++b) {
            const float *restrict top = a->x + 2 * (r0 + b) * wd, *restrict bottom = top + wd;
            float *restrict t = line + b * wd;
            for (int j = 0; j < wd; ++j) {
                float v = bottom[j], m = top[j];
                t[j] = ((v > m) | (v != v)) ? v : m;
            }
        }
        float *restrict y = a->y + r0 * ow;
        const long n = rows * ow;
        for (long i = 0; i < n; ++i) {
            float m = line[2 * i], v = line[2 * i + 1];
            y[i] = ((v > m) | (v != v)) ? v : m;
        }
    }
}

/* 8-float vectors of the stride-2 max pool below (GCC / clang vector extensions: every ISA level's copy
 * gets its own instructions).  Rows of 8 floats or more end on a vector overlapping the one before it
 * instead of a scalar tail: 128 @55x55 (ceil) 0.30 -> 0.19 ms, 64 @111x111 0.43 -> 0.34. */
typedef float FN(pool_v8) __attribute__((vector_size(32)));
typedef float FN(pool_v8u) __attribute__((vector_size(32), aligned(4)));
typedef int FN(pool_v8i) __attribute__((vector_size(32)));
#ifndef POOL_SHUF8
#if defined(__clang__)
#define POOL_SHUF8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define POOL_SHUF8(a, b, ...) __builtin_shuffle(a, b, (FN(pool_v8i)){__VA_ARGS__})
#endif
#endif
/* m = ((v > m) | (v != v)) ? v : m on 8 lanes (max_strided's select: NaN sticks); a macro, not a
 * function returning a 32-byte vector (the baseline copy has no AVX: -Wpsabi) */
#ifndef POOL_VMAX
#define POOL_VMAX(VI, m, v)                                                                                         \
    do {                                                                                                           \
        const VI take_ = ((v) > (m)) | ((v) != (v));                                                               \
        (m) = (__typeof__(m))(((VI)(v) & take_) | ((VI)(m) & ~take_));                                             \
    } while (0)
#endif
/* out[ox .. ox + 8] = max(line[2 o], line[2 o + 1], line[2 o + 2]) for o = ox .. ox + 7: the line's
 * even and odd floats apart (two vector loads and shuffles), then the maximum of even[o], odd[o] and
 * even[o + 1] on contiguous vectors.  Reads line[2 ox .. 2 ox + 23]. */
static inline MRT_TARGET void FN(pool_s2_k3_8)(const float *line, int ox, float *out) {
    const FN(pool_v8) lo = *(const FN(pool_v8u) *)(line + 2 * ox);
    const FN(pool_v8) hi = *(const FN(pool_v8u) *)(line + 2 * ox + 8);
    const FN(pool_v8) nx = *(const FN(pool_v8u) *)(line + 2 * ox + 16); /* (lane 0: even[ox + 8]) */
    const FN(pool_v8) ev = POOL_SHUF8(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14);
    const FN(pool_v8) od = POOL_SHUF8(lo, hi, 1, 3, 5, 7, 9, 11, 13, 15);
    const FN(pool_v8) e1 = POOL_SHUF8(ev, nx, 1, 2, 3, 4, 5, 6, 7, 8); /* even[ox + 1 ..] */
    FN(pool_v8) m = ev;
    POOL_VMAX(FN(pool_v8i), m, od);
    POOL_VMAX(FN(pool_v8i), m, e1);
    *(FN(pool_v8u) *)(out + ox) = m;
}

#if MRT_VL == 16
/* AVX-512: the same on 16 lanes, half the instructions (these pools are bound by them, not by memory:
 * 64 @111x111 -> 55x55 took 2.9 us a plane whether the input was 0.4 or 3.2 MB). */
typedef float FN(pool_v16) __attribute__((vector_size(64)));
typedef float FN(pool_v16u) __attribute__((vector_size(64), aligned(4)));
typedef int FN(pool_v16i) __attribute__((vector_size(64)));
#ifndef POOL_SHUF16
#if defined(__clang__)
#define POOL_SHUF16(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define POOL_SHUF16(a, b, ...) __builtin_shuffle(a, b, (FN(pool_v16i)){__VA_ARGS__})
#endif
#endif
/* FN(pool_s2_k3_8) for out[ox .. ox + 16]: reads line[2 ox .. 2 ox + 47]. */
static inline MRT_TARGET void FN(pool_s2_k3_16)(const float *line, int ox, float *out) {
    const FN(pool_v16) lo = *(const FN(pool_v16u) *)(line + 2 * ox);
    const FN(pool_v16) hi = *(const FN(pool_v16u) *)(line + 2 * ox + 16);
    const FN(pool_v16) nx = *(const FN(pool_v16u) *)(line + 2 * ox + 32); /* (lane 0: even[ox + 16]) */
    const FN(pool_v16) ev = POOL_SHUF16(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const FN(pool_v16) od = POOL_SHUF16(lo, hi, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const FN(pool_v16) e1 = POOL_SHUF16(ev, nx, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
    FN(pool_v16) m = ev;
    POOL_VMAX(FN(pool_v16i), m, od);
    POOL_VMAX(FN(pool_v16i), m, e1);
    *(FN(pool_v16u) *)(out + ox) = m;
}
#define POOL_LINE_PAD 16 /* floats past a line's span that the column pass's loads may read */
#else
#define POOL_LINE_PAD 8
#endif

#ifndef POOL_ROWS_BY
/* FN(pool_s2_rows)'s vector loop in vectors of W lanes (types V, unaligned VU, lane integers VI) */
#define POOL_ROWS_BY(W, V, VU, VI)                                                                                 \
    for (int j = 0;; j += (W)) {                                                                                   \
        if (j > cols - (W)) j = cols - (W);                                                                        \
        V m = *(const VU *)(rows[0] + j);                                                                          \
        for (int r = 1; r < nrows; ++r) {                                                                          \
            const V v = *(const VU *)(rows[r] + j);                                                                \
            POOL_VMAX(VI, m, v);                                                                                   \
        }                                                                                                          \
        *(VU *)(mid + j) = m;                                                                                      \
        if (j == cols - (W)) break;                                                                                \
    }
/* FN(pool_s2_cols)'s loop over groups of W outputs, the last group overlapping the one before it */
#define POOL_COLS_BY(W, K3)                                                                                        \
    for (int ox = 0;; ox += (W)) {                                                                                 \
        if (ox > ow - (W)) ox = ow - (W);                                                                          \
        K3(line, ox, out);                                                                                         \
        if (ox == ow - (W)) break;                                                                                 \
    }
#endif

/* line[pl + j] = the maximum of input column j over the nrows rows (nrows >= 1), for j < cols: whole
 * vectors, the last one overlapping the one before it (taking the maximum twice changes nothing), each
 * position stored once with every row's maximum taken in registers (a row's stores are not read back by
 * the next row's loads: no store-to-load forwarding stalls) */
static inline MRT_TARGET void FN(pool_s2_rows)(const float *const *rows, int nrows, int cols, float *restrict mid) {
    if (cols < 8) {
        for (int j = 0; j < cols; ++j) {
            float m = rows[0][j];
            for (int r = 1; r < nrows; ++r) {
                const float v = rows[r][j];
                m = ((v > m) | (v != v)) ? v : m;
            }
            mid[j] = m;
        }
        return;
    }
#if MRT_VL == 16
    if (cols >= 16) {
        POOL_ROWS_BY(16, FN(pool_v16), FN(pool_v16u), FN(pool_v16i));
        return;
    }
#endif
    POOL_ROWS_BY(8, FN(pool_v8), FN(pool_v8u), FN(pool_v8i));
}

/* out[ox] = the maximum of line[2 ox .. 2 ox + kw - 1], ox < ow */
static inline MRT_TARGET void FN(pool_s2_cols)(const float *line, int ow, int kw, float *restrict out) {
#if MRT_VL == 16
    if (kw == 3 && ow >= 16) { /* (16 at a time, as below: loads end at line[2 ow + 15] < span + 16) */
        POOL_COLS_BY(16, FN(pool_s2_k3_16));
        return;
    }
#endif
    if (kw == 3 && ow >= 8) {
        /* 8 outputs at a time (FN(pool_s2_k3_8)); the last 8 overlap the ones before them (the same
         * outputs written twice) instead of a scalar tail.  Its loads end at line[2 ow + 7] < span + 8. */
        POOL_COLS_BY(8, FN(pool_s2_k3_8));
        return;
    }
    for (int ox = 0; ox < ow; ++ox) {
        float m = line[2 * ox];
        for (int kx = 1; kx < kw; ++kx) {
            const float v = line[2 * ox + kx];
            m = ((v > m) | (v != v)) ? v : m;
        }
        out[ox] = m;
    }
}

/* MaxPool with stride 2 in width and no dilation (3x3 / stride 2: ResNet's and SqueezeNet's pools), one
 * output row at a time: the maximum of its kh input rows (those inside the image) into a line with -inf
 * margins of the padding (and past the right edge: ceil_mode windows), FN(pool_s2_rows), then each output
 * the maximum of its kw neighbours on that line, FN(pool_s2_cols).  maxpool_task's kh x kw strided passes
 * per output row: SqueezeNet's three 3x3 / 2 pools (64@111, 128@55, 256@27, ceil_mode) 1.76 + 1.13 + 0.63
 * -> 0.65 + 0.37 + 0.24 ms at one thread on AVX2, ResNet's (64@112, pads 1) 1.7 -> 0.45.  The same select
 * as max_strided (NaN sticks).  Items are planes.
 *
 * Two lines, the columns pass one row behind the rows pass: the columns pass reads the line at 2 ox
 * (unaligned to the rows pass's stores, which start at the padding's offset and overlap at the end), and
 * reading a line just written stalled every load on a store it only partly covers (no forwarding):
 * 256@27x27 -> 13x13 took 199 us (60 ns per output row) against onnxruntime's 64.  A row later the stores
 * have reached the cache. */
#define MRT_POOL_S2_LINE 4096 /* floats of a line (the row plus margins), on the stack */
/* Output planes of at least this many pixels are split between threads by bands of rows, smaller ones by
 * planes (as depthwise layers, dwconv_impl.h DW_BAND_SPLIT_PIXELS): on smaller planes the layers before
 * may have split by channels (GEMM row blocks), and SqueezeNet's last pool (256@27x27 -> 13x13) took
 * 64 us at 2 threads in bands against 52 by planes. */
#define MRT_POOL_BAND_PIXELS 2048

/* Items: band-major (band, plane) pairs, a band being a range of output rows of every plane: with
 * threads, participant p of mrt_parallel_for gets band p of every plane, the rows of the image that the
 * convolution before the pool (its GEMM splits the pixels in order, kernels.c, pool_range) wrote on
 * p's core.  Split by planes, half of each thread's input came from the other core's cache: SqueezeNet's
 * first pool (64@111x111 -> 55x55 after its first conv) took 164-169 us at 2 threads (229 at 1), in
 * bands 137-141.  Small planes stay whole (MRT_POOL_BAND_PIXELS). */
static MRT_TARGET void FN(maxpool_s2_task)(void *ctx, long begin, long end) {
    const FN(pool_args) *a = (const FN(pool_args) *)ctx;
    const int ow = a->ow, wd = a->wd, kw = a->kw, kh = a->kh, pl = a->pl;
    /* (+ POOL_LINE_PAD: the vector loops' last load reads up to 7, or 15 with 16 lanes, floats past span) */
    float lines[2][MRT_POOL_S2_LINE + POOL_LINE_PAD];
    const int span = 2 * (ow - 1) + kw; /* line floats the outputs read, from column -pl */
    for (int j = 0; j < span + POOL_LINE_PAD; ++j) lines[0][j] = lines[1][j] = -INFINITY;
    const int cols = wd < span - pl ? wd : span - pl; /* input columns any window reads */
    const float *rows[64]; /* (kh <= 64: FN(pool2d) sends larger windows to maxpool_task) */
    for (long item = begin; item < end; ++item) {
        const long p = item % a->nc, band = item / a->nc;
        const int oy0 = (int)(band * a->oh / a->nbands), oy1 = (int)((band + 1) * a->oh / a->nbands);
        const float *xp = a->x + p * (long)a->h * wd;
        float *yp = a->y + p * (long)a->oh * ow;
        int pending = 0; /* the previous row's line holds its rows' maximum, its outputs not yet written */
        for (int oy = oy0; oy <= oy1; ++oy) {
            int nrows = 0;
            if (oy < oy1) {
                for (int ky = 0; ky < kh; ++ky) {
                    const int iy = oy * a->sh - a->pt + ky;
                    if (iy >= 0 && iy < a->h) rows[nrows++] = xp + (long)iy * wd;
                }
                if (nrows > 0) FN(pool_s2_rows)(rows, nrows, cols, lines[oy & 1] + pl);
            }
            if (pending) FN(pool_s2_cols)(lines[(oy - 1) & 1], ow, kw, yp + (long)(oy - 1) * ow);
            pending = nrows > 0;
            if (oy < oy1 && nrows == 0) { /* no input row (cannot happen for valid pads): -inf as maxpool_task */
                float *out = yp + (long)oy * ow;
                for (int ox = 0; ox < ow; ++ox) out[ox] = -INFINITY;
            }
        }
    }
}

static void FN(pool2d)(int is_max, const float *x, float *y, int nc, int h, int wd, int kh, int kw, int sh, int sw,
                       int dh, int dw, int pt, int pl, int oh, int ow, int ch0, int ch1, int cw0, int cw1, float scale,
                       int nthreads) {
    FN(pool_args) a = {x, y, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, ch0, ch1, cw0, cw1, scale, nc, 1};
    if (is_max && kh == 2 && kw == 2 && sh == 2 && sw == 2 && pt == 0 && pl == 0 && h == 2 * oh && wd == 2 * ow) {
        mrt_parallel_for((long)nc * oh, (long)ow * 4, nthreads, FN(maxpool2x2_task), &a);
        return;
    }
    if (is_max && sw == 2 && dh == 1 && dw == 1 && kh <= 64 && pl >= 0 && pl < kw && 2 * (ow - 1) + kw <= MRT_POOL_S2_LINE &&
        wd + pl <= MRT_POOL_S2_LINE && ow > 0) {
        /* one band per thread (items in the order of FN(maxpool_s2_task)) on outputs of
         * MRT_POOL_BAND_PIXELS or more, else whole planes */
        const int parts = nthreads < MRT_MAX_THREADS ? nthreads : MRT_MAX_THREADS;
        a.nbands = (long)oh * ow < MRT_POOL_BAND_PIXELS ? 1 : parts < oh ? parts : oh;
        if (a.nbands < 1) a.nbands = 1;
        mrt_parallel_for((long)nc * a.nbands, (long)(oh / a.nbands) * ow * kh * kw, nthreads, FN(maxpool_s2_task),
                         &a);
        return;
    }
    mrt_parallel_for(nc, (long)oh * ow * kh * kw, nthreads, is_max ? FN(maxpool_task) : FN(avgpool_task), &a);
}

#undef POOL_LINE_PAD
