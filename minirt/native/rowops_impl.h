/* Row-wise float32 ops over the last axis, compiled once per instruction set by
 * kernels.c after gemm_impl.h (they use its vector type FN(vf) and FN(vexp)).
 *
 *   softmax:     y[r, :] = exp(x[r, :] - max_r) / sum(exp(x[r, :] - max_r))
 *   log-softmax: y[r, :] = x[r, :] - max_r - log(sum(exp(x[r, :] - max_r)))
 *   layer norm:  y[r, :] = (x[r, :] - mean_r) / sqrt(var_r + eps) * scale + bias
 *
 * Three passes per row (max; exp and sum; scale), all in registers or L1 for
 * the rows of real models, instead of numpy's five full-array passes with
 * temporaries.  Invariants: x and y may be the same buffer (each pass reads an
 * element before writing it); a NaN anywhere in a row makes the whole row NaN,
 * as with numpy's reference (the NaN reaches the sum through x - max). */

typedef struct {
    const float *x;
    float *y;
    long n; /* row length */
    int log;
} FN(softmax_args);

static MRT_TARGET void FN(softmax_task)(void *ctx, long begin, long end) {
    const FN(softmax_args) *a = (const FN(softmax_args) *)ctx;
    const long n = a->n, nv = n / MRT_VL * MRT_VL;
    for (long r = begin; r < end; ++r) {
        const float *x = a->x + r * n;
        float *y = a->y + r * n;
        /* max: vector lanes then scalars; `v > m ? v : m` keeps the first NaN out of the max,
         * but x - max is NaN for it below, so the row still turns NaN */
        float m = x[0];
        long i = 0;
        if (nv) {
            FN(vf) vm = FN(vload)(x);
            for (i = MRT_VL; i < nv; i += MRT_VL) {
                FN(vf) v = FN(vload)(x + i);
                vm = FN(vsel)(v > vm, v, vm);
            }
            for (int l = 0; l < MRT_VL; ++l) m = vm[l] > m ? vm[l] : m;
        }
        for (; i < n; ++i) m = x[i] > m ? x[i] : m;
        /* exp(x - max) and its sum (lanes summed in double): the exponentials of 4 vectors side by side
         * (FN(vexp_group): one vector's ~20 dependent steps left the FP pipes idle; the same operations on
         * every value, so the same bits), added to the sum one vector after the other as before */
        FN(vf) vs = {0};
        for (i = 0; i + 4 * MRT_VL <= nv; i += 4 * MRT_VL) {
            FN(vf) e[4];
            for (int j = 0; j < 4; ++j) e[j] = FN(vload)(x + i + j * MRT_VL) - m;
            FN(vexp_group)(e, 4);
            for (int j = 0; j < 4; ++j) {
                vs += e[j];
                if (!a->log) FN(vstore)(y + i + j * MRT_VL, e[j]);
            }
        }
        for (; i < nv; i += MRT_VL) {
            FN(vf) e = FN(vexp)(FN(vload)(x + i) - m);
            vs += e;
            if (!a->log) FN(vstore)(y + i, e);
        }
        double s = 0.0;
        for (int l = 0; l < MRT_VL; ++l) s += vs[l];
        if (i < n) { /* the tail through one vector, so every element gets the same exp */
            FN(vf) t = {0};
            for (long l = 0; l < n - i; ++l) t[l] = x[i + l] - m;
            FN(vf) e = FN(vexp)(t);
            for (long l = 0; l < n - i; ++l) {
                s += e[l];
                if (!a->log) y[i + l] = e[l];
            }
        }
        if (a->log) {
            /* (x - max) - log(sum), not x - (max + log(sum)): with a large max the sum of the two
             * would round away most of log(sum) (max 1000: float32 steps of 6e-5) */
            const float lse = (float)log(s);
            for (i = 0; i < nv; i += MRT_VL) FN(vstore)(y + i, (FN(vload)(x + i) - m) - lse);
            for (; i < n; ++i) y[i] = (x[i] - m) - lse;
        } else {
            const float inv = (float)(1.0 / s);
            for (i = 0; i < nv; i += MRT_VL) FN(vstore)(y + i, FN(vload)(y + i) * inv);
            for (; i < n; ++i) y[i] *= inv;
        }
    }
}

static void FN(softmax_rows)(const float *x, float *y, long rows, long n, int log, int nthreads) {
    FN(softmax_args) a = {x, y, n, log};
    mrt_parallel_for(rows, 16 * n, nthreads, FN(softmax_task), &a);
}

/* ---------------------------------------------------------------- layer normalization */

typedef struct {
    const float *x, *scale, *bias; /* bias may be NULL */
    float *y;
    long n;        /* row length (the normalized axes flattened) */
    int per_row;   /* 0: LayerNormalization (scale / bias per row element); 1: InstanceNormalization
                    * (row r is a channel's plane: one scale / bias value per row, scale[r]); 2: RMS
                    * normalization (no centring, no bias: y = x / sqrt(mean(x^2) + eps) * scale) */
    float eps;
} FN(layernorm_args);

/* Two passes over the row for the statistics (mean, then the mean square of x - mean: the
 * centred form, as numpy's reference computes it, so a large mean does not cancel the variance; RMS
 * normalization: the mean square of x alone), one for the result.  Lane sums are combined in double.  x and y may be the same buffer. */
static MRT_TARGET void FN(layernorm_task)(void *ctx, long begin, long end) {
    const FN(layernorm_args) *a = (const FN(layernorm_args) *)ctx;
    const long n = a->n, nv = n / MRT_VL * MRT_VL;
    for (long r = begin; r < end; ++r) {
        const float *x = a->x + r * n;
        float *y = a->y + r * n;
        long i;
        float mean = 0.0f;
        if (a->per_row != 2) {
            FN(vf) vs = {0};
            for (i = 0; i < nv; i += MRT_VL) vs += FN(vload)(x + i);
            double s = 0.0;
            for (int l = 0; l < MRT_VL; ++l) s += vs[l];
            for (; i < n; ++i) s += x[i];
            mean = (float)(s / (double)n);
        }
        FN(vf) vq = {0};
        for (i = 0; i < nv; i += MRT_VL) {
            FN(vf) d = FN(vload)(x + i) - mean;
            vq += d * d;
        }
        double q = 0.0;
        for (int l = 0; l < MRT_VL; ++l) q += vq[l];
        for (; i < n; ++i) q += (double)(x[i] - mean) * (double)(x[i] - mean);
        const float inv = (float)(1.0 / sqrt(q / (double)n + (double)a->eps));
        const float *sc = a->scale, *b = a->bias;
        if (a->per_row == 1) { /* one scale and bias per row (channel): y = (x - mean) * inv * scale + bias */
            const float s1 = sc[r], b1 = b ? b[r] : 0.0f;
            for (i = 0; i < nv; i += MRT_VL) FN(vstore)(y + i, (FN(vload)(x + i) - mean) * inv * s1 + b1);
            for (; i < n; ++i) y[i] = (x[i] - mean) * inv * s1 + b1;
        } else if (b) {
            for (i = 0; i < nv; i += MRT_VL)
                FN(vstore)(y + i, (FN(vload)(x + i) - mean) * inv * FN(vload)(sc + i) + FN(vload)(b + i));
            for (; i < n; ++i) y[i] = (x[i] - mean) * inv * sc[i] + b[i];
        } else {
            for (i = 0; i < nv; i += MRT_VL) FN(vstore)(y + i, (FN(vload)(x + i) - mean) * inv * FN(vload)(sc + i));
            for (; i < n; ++i) y[i] = (x[i] - mean) * inv * sc[i];
        }
    }
}

static void FN(layernorm_rows)(const float *x, const float *scale, const float *bias, float *y, long rows, long n,
                               int per_row, float eps, int nthreads) {
    FN(layernorm_args) a = {x, scale, bias, y, n, per_row, eps};
    mrt_parallel_for(rows, 8 * n, nthreads, FN(layernorm_task), &a);
}
