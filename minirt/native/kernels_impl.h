/* Kernel bodies, compiled once per instruction set by kernels.c.
 *
 * kernels.c includes this file several times, each time with
 *   MRT_TARGET   a function attribute (empty for the baseline, or e.g.
 *                __attribute__((target("avx2,fma"))))
 *   FN(name)     the name with the ISA suffix (name_base, name_avx2, ...)
 * The code is plain C written so that the compiler vectorises it (unit or
 * constant strides, branch-free selects, no libm calls in hot loops); the
 * same source then becomes SSE2, AVX2+FMA or NEON code.
 *
 * Every function that is called from a target-specific function must carry
 * the same MRT_TARGET (GCC refuses to inline across target options).
 */

/* ---------------------------------------------------------------- activations */

/* exp(x) for x in float range: x = n*ln2 + r, |r| <= ln2/2, exp(r) by its
 * degree-7 Taylor polynomial (truncation error < 1e-8 relative), scaled by
 * 2^n built directly in the exponent bits.  Inputs are clamped so that the
 * result stays a normal float (the sigmoid family saturates long before). */
static inline MRT_TARGET float FN(expf_approx)(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float t = x * 1.44269504088896341f;
    float n = (t + 12582912.0f) - 12582912.0f; /* round to nearest integer (|t| < 2^22) */
    float r = x - n * 0.693145751953125f;      /* ln2 split in a high part exact in float ... */
    r = r - n * 1.42860682030941723e-06f;      /* ... and the remainder */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static MRT_TARGET void FN(act_row)(float *restrict y, long n, int act, float a0, float a1) {
    long i;
    switch (act) {
    case MRT_ACT_RELU:
        /* y < 0 ? 0 : y keeps NaN, like numpy.maximum(y, 0) */
        for (i = 0; i < n; ++i) y[i] = y[i] < 0.0f ? 0.0f : y[i];
        break;
    case MRT_ACT_CLIP:
        for (i = 0; i < n; ++i) {
            float v = y[i] < a0 ? a0 : y[i];
            y[i] = v > a1 ? a1 : v;
        }
        break;
    case MRT_ACT_LEAKY:
        for (i = 0; i < n; ++i) y[i] = y[i] < 0.0f ? a0 * y[i] : y[i];
        break;
    case MRT_ACT_SIGMOID:
        for (i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + FN(expf_approx)(-y[i]));
        break;
    case MRT_ACT_SILU:
        for (i = 0; i < n; ++i) {
            float x = y[i];
            float s = 1.0f / (1.0f + FN(expf_approx)(-x));
            y[i] = x * s;
        }
        break;
    case MRT_ACT_HARDSIGMOID:
        for (i = 0; i < n; ++i) {
            float v = a0 * y[i] + a1;
            v = v < 0.0f ? 0.0f : v;
            y[i] = v > 1.0f ? 1.0f : v;
        }
        break;
    case MRT_ACT_HARDSWISH:
        for (i = 0; i < n; ++i) {
            float v = y[i] * (1.0f / 6.0f) + 0.5f;
            v = v < 0.0f ? 0.0f : v;
            v = v > 1.0f ? 1.0f : v;
            y[i] = y[i] * v;
        }
        break;
    case MRT_ACT_GELU:
        /* 0.5 x erfc(-x / sqrt 2), erfc from its Chebyshev-fitted form
         * t exp(-z^2 + P(t)), t = 1 / (1 + |z| / 2): relative error < 1.2e-7
         * over the whole range (Numerical Recipes' erfcc). */
        for (i = 0; i < n; ++i) {
            float x = y[i];
            float z = x * -0.70710678118654752f;
            float az = z < 0.0f ? -z : z;
            float t = 1.0f / (1.0f + 0.5f * az);
            float p = 0.17087277f;
            p = p * t - 0.82215223f;
            p = p * t + 1.48851587f;
            p = p * t - 1.13520398f;
            p = p * t + 0.27886807f;
            p = p * t - 0.18628806f;
            p = p * t + 0.09678418f;
            p = p * t + 0.37409196f;
            p = p * t + 1.00002368f;
            p = p * t - 1.26551223f;
            float e = t * FN(expf_approx)(p - az * az);
            float erfc = z >= 0.0f ? e : 2.0f - e;
            y[i] = 0.5f * x * erfc;
        }
        break;
    case MRT_ACT_GELU_TANH:
        /* 0.5 x (1 + tanh u) = x / (1 + exp(-2u)) */
        for (i = 0; i < n; ++i) {
            float x = y[i];
            float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            float s = 1.0f / (1.0f + FN(expf_approx)(-2.0f * u));
            y[i] = x * s;
        }
        break;
    default:
        break;
    }
}

/* ---------------------------------------------------------------- epilogue */

typedef struct {
    float *y;
    const float *bias, *res;
    int c;
    long plane;
    int act;
    float a0, a1;
} FN(bias_act_args);

#define MRT_CHUNK 2048

static MRT_TARGET void FN(bias_act_task)(void *ctx, long begin, long end) {
    const FN(bias_act_args) *a = (const FN(bias_act_args) *)ctx;
    for (long p = begin; p < end; ++p) {
        float *y = a->y + p * a->plane;
        const float *r = a->res ? a->res + p * a->plane : NULL;
        float b = a->bias ? a->bias[p % a->c] : 0.0f;
        for (long i0 = 0; i0 < a->plane; i0 += MRT_CHUNK) {
            long m = a->plane - i0 < MRT_CHUNK ? a->plane - i0 : MRT_CHUNK;
            float *yc = y + i0;
            if (r) {
                const float *rc = r + i0;
                for (long i = 0; i < m; ++i) yc[i] = yc[i] + b + rc[i];
            } else if (a->bias) {
                for (long i = 0; i < m; ++i) yc[i] += b;
            }
            FN(act_row)(yc, m, a->act, a->a0, a->a1);
        }
    }
}

static void FN(bias_act)(float *y, const float *bias, const float *residual, int n, int c, long plane, int act,
                         float a0, float a1, int nthreads) {
    FN(bias_act_args) a = {y, bias, residual, c, plane, act, a0, a1};
    mrt_parallel_for((long)n * c, plane, nthreads, FN(bias_act_task), &a);
}

/* ---------------------------------------------------------------- depthwise conv */

typedef struct {
    const float *x, *w, *bias;
    float *y;
    int c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act;
    float a0, a1;
} FN(dw_args);

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

/* Three horizontally adjacent taps at once over their common valid range:
 * one pass over the accumulator row instead of three. */
static inline MRT_TARGET void FN(axpy3_strided)(float *restrict acc, const float *restrict row, float w0, float w1,
                                                 float w2, int off, int d, int s, int lo, int hi) {
    int ox;
    const float *r = row + off;
    if (s == 1 && d == 1) {
        for (ox = lo; ox < hi; ++ox) acc[ox] += w0 * r[ox] + w1 * r[ox + 1] + w2 * r[ox + 2];
    } else if (s == 2 && d == 1) {
        for (ox = lo; ox < hi; ++ox) acc[ox] += w0 * r[2 * ox] + w1 * r[2 * ox + 1] + w2 * r[2 * ox + 2];
    } else {
        for (ox = lo; ox < hi; ++ox) {
            const float *q = r + ox * s;
            acc[ox] += w0 * q[0] + w1 * q[d] + w2 * q[2 * d];
        }
    }
}

static MRT_TARGET void FN(dw_task)(void *ctx, long begin, long end) {
    const FN(dw_args) *a = (const FN(dw_args) *)ctx;
    const int kw = a->kw, ow = a->ow;
    for (long p = begin; p < end; ++p) {
        int ch = (int)(p % a->c);
        const float *xp = a->x + p * (long)a->h * a->wd;
        const float *wk = a->w + (long)ch * a->kh * kw;
        float *yp = a->y + p * (long)a->oh * ow;
        float b = a->bias ? a->bias[ch] : 0.0f;
        for (int oy = 0; oy < a->oh; ++oy) {
            float *acc = yp + (long)oy * ow;
            for (int ox = 0; ox < ow; ++ox) acc[ox] = b;
            int iy0 = oy * a->sh - a->pt;
            for (int ky = 0; ky < a->kh; ++ky) {
                int iy = iy0 + ky * a->dh;
                if (iy < 0 || iy >= a->h) continue;
                const float *row = xp + (long)iy * a->wd;
                const float *wr = wk + ky * kw;
                int kx = 0;
                for (; kx + 3 <= kw; kx += 3) {
                    /* the middle range where all three taps are inside the row */
                    int off0 = kx * a->dw - a->pl, off2 = (kx + 2) * a->dw - a->pl;
                    int lo0, hi0, lo2, hi2;
                    FN(valid_cols)(off0, a->sw, a->wd, ow, &lo0, &hi0);
                    FN(valid_cols)(off2, a->sw, a->wd, ow, &lo2, &hi2);
                    int lo = lo0 > lo2 ? lo0 : lo2, hi = hi0 < hi2 ? hi0 : hi2;
                    if (hi <= lo) {
                        for (int t = 0; t < 3; ++t) {
                            int off = (kx + t) * a->dw - a->pl, l, hh;
                            FN(valid_cols)(off, a->sw, a->wd, ow, &l, &hh);
                            FN(axpy_strided)(acc, row, wr[kx + t], off, a->sw, l, hh);
                        }
                        continue;
                    }
                    FN(axpy3_strided)(acc, row, wr[kx], wr[kx + 1], wr[kx + 2], off0, a->dw, a->sw, lo, hi);
                    /* the borders: each tap on its own */
                    for (int t = 0; t < 3; ++t) {
                        int off = (kx + t) * a->dw - a->pl, l, hh;
                        FN(valid_cols)(off, a->sw, a->wd, ow, &l, &hh);
                        if (l < lo) FN(axpy_strided)(acc, row, wr[kx + t], off, a->sw, l, hh < lo ? hh : lo);
                        if (hh > hi) FN(axpy_strided)(acc, row, wr[kx + t], off, a->sw, l > hi ? l : hi, hh);
                    }
                }
                for (; kx < kw; ++kx) {
                    int off = kx * a->dw - a->pl, l, hh;
                    FN(valid_cols)(off, a->sw, a->wd, ow, &l, &hh);
                    FN(axpy_strided)(acc, row, wr[kx], off, a->sw, l, hh);
                }
            }
            if (a->act) FN(act_row)(acc, ow, a->act, a->a0, a->a1);
        }
    }
}

/* Depthwise stride 2 (dilation 1): the padded plane split by row and column
 * parity into four planes q[ry][rx][i][j] = padded[2i + ry][2j + rx], each
 * pe = ow - 1 + (kw + 1) / 2 wide.  Tap (ky, kx) of output (oy, ox) is then
 * q[ky & 1][kx & 1][oy + ky / 2][ox + kx / 2]: unit stride, so the plane is one
 * long loop over oh * pe outputs as in the stride-1 path (the extra columns are
 * computed and dropped) instead of per-row loops with stride-2 loads. */
static MRT_TARGET void FN(dws2_plane)(const FN(dw_args) *a, const float *xp, const float *wk, float b, float *yp,
                                      float *buf) {
    const int kh = a->kh, kw = a->kw, oh = a->oh, ow = a->ow;
    const int pw = 2 * (ow - 1) + kw, ph = 2 * (oh - 1) + kh;
    const long pe = ow - 1 + (kw + 1) / 2, rh = oh - 1 + (kh + 1) / 2;
    const long qs = rh * pe + pe + 8; /* one parity plane, with slack for the dropped columns */
    const long n = (long)oh * pe;
    float *q = buf, *line = buf + 4 * qs, *t = line + 2 * pe + 8;
    for (long i = 0; i < 4 * qs; ++i) q[i] = 0.0f;
    for (int py = 0; py < ph; ++py) {
        int iy = py - a->pt;
        if (iy < 0 || iy >= a->h) continue; /* rows of zeros */
        const float *src = xp + (long)iy * a->wd;
        for (long j = 0; j < 2 * pe; ++j) {
            long ix = j - a->pl;
            line[j] = (ix >= 0 && ix < a->wd && j < pw) ? src[ix] : 0.0f;
        }
        float *qe = q + (long)(py & 1) * 2 * qs + (long)(py >> 1) * pe, *qo = qe + qs;
        for (long j = 0; j < pe; ++j) {
            qe[j] = line[2 * j];
            qo[j] = line[2 * j + 1];
        }
    }
    const float *ee = q, *eo = q + qs, *oe = q + 2 * qs, *oo = q + 3 * qs; /* [row parity][col parity] */
    float *restrict tt = t;
    if (kh == 3 && kw == 3) {
        const float w0 = wk[0], w1 = wk[1], w2 = wk[2], w3 = wk[3], w4 = wk[4], w5 = wk[5], w6 = wk[6], w7 = wk[7],
                    w8 = wk[8];
        for (long i = 0; i < n; ++i)
            tt[i] = b + w0 * ee[i] + w1 * eo[i] + w2 * ee[i + 1] + w3 * oe[i] + w4 * oo[i] + w5 * oe[i + 1] +
                    w6 * ee[i + pe] + w7 * eo[i + pe] + w8 * ee[i + pe + 1];
    } else {
        for (long i = 0; i < n; ++i) tt[i] = b;
        for (int ky = 0; ky < kh; ++ky)
            for (int kx = 0; kx < kw; ++kx) {
                const float *r = q + (long)((ky & 1) * 2 + (kx & 1)) * qs + (long)(ky >> 1) * pe + (kx >> 1);
                const float wv = wk[ky * kw + kx];
                for (long i = 0; i < n; ++i) tt[i] += wv * r[i];
            }
    }
    if (a->act) FN(act_row)(tt, n, a->act, a->a0, a->a1);
    for (int oy = 0; oy < oh; ++oy) memcpy(yp + (long)oy * ow, tt + (long)oy * pe, sizeof(float) * ow);
}

/* Depthwise through a zero-padded copy of each plane (per thread scratch, in
 * L1/L2 for the planes of real models): the inner loops then need no bounds
 * logic, and 3x3 dilation-1 kernels compute each output row in a single pass
 * with all nine taps in registers.  Small planes (14x14, 7x7) were dominated
 * by the per-row border handling of dw_task. */
static MRT_TARGET void FN(dwp_task)(void *ctx, long begin, long end) {
    const FN(dw_args) *a = (const FN(dw_args) *)ctx;
    const int kh = a->kh, kw = a->kw, sh = a->sh, sw = a->sw, dh = a->dh, dw = a->dw, oh = a->oh, ow = a->ow;
    const int ph = (oh - 1) * sh + (kh - 1) * dh + 1, pw = (ow - 1) * sw + (kw - 1) * dw + 1;
    const int flat = sh == 1 && sw == 1; /* stride 1: one long loop over the padded plane */
    const long nflat = (long)oh * pw;
    if (sh == 2 && sw == 2 && dh == 1 && dw == 1 && kh * kw > 9) { /* 3x3: the row loops below are faster */
        const long pe = ow - 1 + (kw + 1) / 2, rh = oh - 1 + (kh + 1) / 2;
        float *b2 = (float *)mrt_pack_buffer(sizeof(float) * (4 * (rh * pe + pe + 8) + 2 * pe + 8 + (long)oh * pe + 16));
        if (!b2) return;
        for (long p = begin; p < end; ++p) {
            int ch = (int)(p % a->c);
            FN(dws2_plane)(a, a->x + p * (long)a->h * a->wd, a->w + (long)ch * kh * kw, a->bias ? a->bias[ch] : 0.0f,
                           a->y + p * (long)oh * ow, b2);
        }
        return;
    }
    float *buf = (float *)mrt_pack_buffer(sizeof(float) * ((size_t)ph * pw + (size_t)kw * dw + (flat ? nflat : 0) + 16));
    if (!buf) return;
    float *tmp = buf + (long)ph * pw + (long)kw * dw + 8;
    for (long p = begin; p < end; ++p) {
        int ch = (int)(p % a->c);
        const float *xp = a->x + p * (long)a->h * a->wd;
        const float *wk = a->w + (long)ch * kh * kw;
        float *yp = a->y + p * (long)oh * ow;
        float b = a->bias ? a->bias[ch] : 0.0f;
        /* the padded plane: buf[py][px] = x[py - pt][px - pl] or 0 */
        int lo = a->pl, hi = a->pl + a->wd; /* columns of buf that hold input */
        if (lo > pw) lo = pw;
        if (hi > pw) hi = pw;
        for (int py = 0; py < ph; ++py) {
            float *dst = buf + (long)py * pw;
            int iy = py - a->pt;
            if (iy < 0 || iy >= a->h || hi <= lo) {
                memset(dst, 0, sizeof(float) * pw);
                continue;
            }
            if (lo > 0) memset(dst, 0, sizeof(float) * lo);
            memcpy(dst + lo, xp + (long)iy * a->wd, sizeof(float) * (hi - lo));
            if (hi < pw) memset(dst + hi, 0, sizeof(float) * (pw - hi));
        }
        if (flat) {
            /* tmp[i] = b + sum_taps w * buf[i + ky*dh*pw + kx*dw] over i < oh*pw: outputs in padded
             * coordinates (the columns past ow are computed and dropped), so a 14-wide plane is one
             * 224-long vector loop instead of 14 short ones. */
            for (int i = 0; i < kw * dw + 8; ++i) buf[(long)ph * pw + i] = 0.0f; /* tail read by the last row */
            float *restrict t = tmp;
            if (kh == 3 && kw == 3) {
                const float *r0 = buf, *r1 = buf + (long)dh * pw, *r2 = buf + 2L * dh * pw;
                const float w0 = wk[0], w1 = wk[1], w2 = wk[2], w3 = wk[3], w4 = wk[4], w5 = wk[5], w6 = wk[6],
                            w7 = wk[7], w8 = wk[8];
                const int d1 = dw, d2 = 2 * dw;
                for (long i = 0; i < nflat; ++i)
                    t[i] = b + w0 * r0[i] + w1 * r0[i + d1] + w2 * r0[i + d2] + w3 * r1[i] + w4 * r1[i + d1] +
                           w5 * r1[i + d2] + w6 * r2[i] + w7 * r2[i + d1] + w8 * r2[i + d2];
            } else {
                for (long i = 0; i < nflat; ++i) t[i] = b;
                for (int ky = 0; ky < kh; ++ky)
                    for (int kx = 0; kx < kw; ++kx) {
                        const float *r = buf + (long)ky * dh * pw + kx * dw;
                        float wv = wk[ky * kw + kx];
                        for (long i = 0; i < nflat; ++i) t[i] += wv * r[i];
                    }
            }
            if (a->act) FN(act_row)(t, nflat, a->act, a->a0, a->a1);
            for (int oy = 0; oy < oh; ++oy) memcpy(yp + (long)oy * ow, t + (long)oy * pw, sizeof(float) * ow);
            continue;
        }
        for (int oy = 0; oy < oh; ++oy) {
            float *restrict acc = yp + (long)oy * ow;
            const float *r0 = buf + (long)oy * sh * pw;
            if (kh == 3 && kw == 3 && dh == 1 && dw == 1 && (sw == 1 || sw == 2)) {
                const float *r1 = r0 + pw, *r2 = r1 + pw;
                const float w0 = wk[0], w1 = wk[1], w2 = wk[2], w3 = wk[3], w4 = wk[4], w5 = wk[5], w6 = wk[6],
                            w7 = wk[7], w8 = wk[8];
                if (sw == 1) {
                    for (int ox = 0; ox < ow; ++ox)
                        acc[ox] = b + w0 * r0[ox] + w1 * r0[ox + 1] + w2 * r0[ox + 2] + w3 * r1[ox] +
                                  w4 * r1[ox + 1] + w5 * r1[ox + 2] + w6 * r2[ox] + w7 * r2[ox + 1] + w8 * r2[ox + 2];
                } else {
                    for (int ox = 0; ox < ow; ++ox)
                        acc[ox] = b + w0 * r0[2 * ox] + w1 * r0[2 * ox + 1] + w2 * r0[2 * ox + 2] +
                                  w3 * r1[2 * ox] + w4 * r1[2 * ox + 1] + w5 * r1[2 * ox + 2] + w6 * r2[2 * ox] +
                                  w7 * r2[2 * ox + 1] + w8 * r2[2 * ox + 2];
                }
            } else {
                for (int ox = 0; ox < ow; ++ox) acc[ox] = b;
                for (int ky = 0; ky < kh; ++ky) {
                    const float *row = r0 + (long)ky * dh * pw;
                    for (int kx = 0; kx < kw; ++kx) {
                        float wv = wk[ky * kw + kx];
                        const float *r = row + kx * dw;
                        if (sw == 1) {
                            for (int ox = 0; ox < ow; ++ox) acc[ox] += wv * r[ox];
                        } else if (sw == 2) {
                            for (int ox = 0; ox < ow; ++ox) acc[ox] += wv * r[2 * ox];
                        } else {
                            for (int ox = 0; ox < ow; ++ox) acc[ox] += wv * r[ox * sw];
                        }
                    }
                }
            }
            if (a->act) FN(act_row)(acc, ow, a->act, a->a0, a->a1);
        }
    }
}

static void FN(dwconv2d)(const float *x, const float *w, const float *bias, float *y, int n, int c, int h, int wd,
                         int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int oh, int ow, int act,
                         float a0, float a1, int nthreads) {
    FN(dw_args) a = {x, w, bias, y, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act, a0, a1};
    long padded = ((long)(oh - 1) * sh + (long)(kh - 1) * dh + 1) * ((long)(ow - 1) * sw + (long)(kw - 1) * dw + 1);
    /* the padded path whenever its plane fits comfortably in L2 (it always does in practice) */
    mrt_parallel_for((long)n * c, (long)oh * ow * kh * kw, nthreads,
                     padded <= (1L << 18) ? FN(dwp_task) : FN(dw_task), &a);
}

/* ---------------------------------------------------------------- pooling */

typedef struct {
    const float *x;
    float *y;
    int h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, ch0, ch1, cw0, cw1;
    float scale;
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
        colcnt = (float *)malloc(sizeof(float) * (ow > 0 ? ow : 1));
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

static void FN(pool2d)(int is_max, const float *x, float *y, int nc, int h, int wd, int kh, int kw, int sh, int sw,
                       int dh, int dw, int pt, int pl, int oh, int ow, int ch0, int ch1, int cw0, int cw1, float scale,
                       int nthreads) {
    FN(pool_args) a = {x, y, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, ch0, ch1, cw0, cw1, scale};
    mrt_parallel_for(nc, (long)oh * ow * kh * kw, nthreads, is_max ? FN(maxpool_task) : FN(avgpool_task), &a);
}

/* ---------------------------------------------------------------- im2col */

typedef struct {
    const float *x;
    float *cols;
    long ld; /* row stride of cols (oh*ow for one image; more when several images share the rows) */
    int h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
} FN(im2col_args);

static MRT_TARGET void FN(im2col_task)(void *ctx, long begin, long end) {
    const FN(im2col_args) *a = (const FN(im2col_args) *)ctx;
    const int ow = a->ow, kk = a->kh * a->kw;
    for (long r = begin; r < end; ++r) {
        int ch = (int)(r / kk), t = (int)(r % kk), ky = t / a->kw, kx = t % a->kw;
        const float *xp = a->x + (long)ch * a->h * a->wd;
        float *dst = a->cols + r * a->ld;
        int off = kx * a->dw - a->pl, lo, hi;
        FN(valid_cols)(off, a->sw, a->wd, ow, &lo, &hi);
        for (int oy = 0; oy < a->oh; ++oy, dst += ow) {
            int iy = oy * a->sh - a->pt + ky * a->dh;
            if (iy < 0 || iy >= a->h) {
                memset(dst, 0, sizeof(float) * ow);
                continue;
            }
            const float *src = xp + (long)iy * a->wd + off;
            int ox;
            for (ox = 0; ox < lo; ++ox) dst[ox] = 0.0f;
            if (a->sw == 1) {
                memcpy(dst + lo, src + lo, sizeof(float) * (hi - lo));
            } else if (a->sw == 2) {
                for (ox = lo; ox < hi; ++ox) dst[ox] = src[2 * ox];
            } else {
                for (ox = lo; ox < hi; ++ox) dst[ox] = src[ox * a->sw];
            }
            for (ox = hi; ox < ow; ++ox) dst[ox] = 0.0f;
        }
    }
}

static void FN(im2col)(const float *x, float *cols, long ld, int c, int h, int wd, int kh, int kw, int sh, int sw,
                       int dh, int dw, int pt, int pl, int oh, int ow, int nthreads) {
    FN(im2col_args) a = {x, cols, ld, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow};
    mrt_parallel_for((long)c * kh * kw, (long)oh * ow, nthreads, FN(im2col_task), &a);
}
