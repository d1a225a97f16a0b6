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
    if (x < -87.0f) return 0.0f; /* below FLT_MIN: 0, as FN(vexp_group) (gemm_impl.h) */
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
        /* 0.5 x (1 + tanh u) = x / (1 + exp(-2u)), one division: below x = -10 exp(-2u) reaches its clamp
         * (exp(88)) and 1 / (1 + e) would be a subnormal 6e-39, whose multiplication by x cost a
         * microcode assist per value (magika's Gelu after its conv, 260K values: 485 -> 145 us) */
        for (i = 0; i < n; ++i) {
            float x = y[i];
            float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            y[i] = x / (1.0f + FN(expf_approx)(-2.0f * u));
        }
        break;
    case MRT_ACT_TANH:
        /* |x| >= 1/4: sign(x) (1 - e) / (1 + e), e = exp(-2|x|) (1 - e >= 0.39: no cancellation worth
         * a bit; saturates to +-1 with e); below, the odd Taylor series to x^9 (the next term is under
         * 2e-8 of tanh x there), which keeps tanh's relative precision near 0.  NaN stays NaN. */
        for (i = 0; i < n; ++i) {
            float x = y[i];
            float ax = x < 0.0f ? -x : x;
            float e = FN(expf_approx)(-2.0f * ax);
            float big = (1.0f - e) / (1.0f + e);
            float x2 = x * x;
            float p = 62.0f / 2835.0f;
            p = p * x2 - 17.0f / 315.0f;
            p = p * x2 + 2.0f / 15.0f;
            p = p * x2 - 1.0f / 3.0f;
            float small = x + x * x2 * p;
            y[i] = ax < 0.25f ? small : (x < 0.0f ? -big : big);
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

/* strided row helpers (pooling, im2col) and the pooling kernels: pool_impl.h, which kernels.c also
 * compiles at the AVX-512 level (its stride-2 max pool on 16 lanes) */
#include "pool_impl.h"

/* ---------------------------------------------------------------- im2col */

typedef struct {
    const float *x;
    float *cols;
    long ld; /* row stride of cols (oh*ow for one image; more when several images share the rows) */
    int h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
} FN(im2col_args);

static MRT_TARGET void FN(im2col_task)(void *ctx, long begin, long end) {
    const FN(im2col_args) *a = (const FN(im2col_args) *)ctx;
    /* the geometry in locals: the loops below run per output row, 8 floats long in small images,
     * where reloading it from *a after every store cost more than the copies */
    const int ow = a->ow, oh = a->oh, kh = a->kh, kw = a->kw, kk = kh * kw, h = a->h, wd = a->wd;
    const int sh = a->sh, sw = a->sw, dh = a->dh, dw = a->dw, pt = a->pt, pl = a->pl;
    const long ld = a->ld;
    const float *x = a->x;
    float *cols = a->cols;
    /* (short rows, as in small images: inline loops; a memcpy / memset call per 8-float row
     * cost more than the copy itself) */
    const int short_rows = ow <= 32;
    for (long r = begin; r < end; ++r) {
        const int ch = (int)(r / kk), t = (int)(r % kk), ky = t / kw, kx = t % kw;
        const float *xp = x + (long)ch * h * wd;
        float *dst = cols + r * ld;
        int off = kx * dw - pl, lo, hi;
        FN(valid_cols)(off, sw, wd, ow, &lo, &hi);
        for (int oy = 0; oy < oh; ++oy, dst += ow) {
            const int iy = oy * sh - pt + ky * dh;
            if (iy < 0 || iy >= h) {
                if (short_rows) {
                    for (int ox = 0; ox < ow; ++ox) dst[ox] = 0.0f;
                } else {
                    memset(dst, 0, sizeof(float) * ow);
                }
                continue;
            }
            const float *src = xp + (long)iy * wd + off;
            int ox;
            for (ox = 0; ox < lo; ++ox) dst[ox] = 0.0f;
            if (sw == 1 && short_rows) {
                float *restrict d = dst;
                const float *restrict q = src;
                for (ox = lo; ox < hi; ++ox) d[ox] = q[ox];
            } else if (sw == 1) {
                memcpy(dst + lo, src + lo, sizeof(float) * (hi - lo));
            } else if (sw == 2) {
                for (ox = lo; ox < hi; ++ox) dst[ox] = src[2 * ox];
            } else {
                for (ox = lo; ox < hi; ++ox) dst[ox] = src[ox * sw];
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
