/* Gate passes of the recurrent layers (mrt_rnn_f32, kernels.c), compiled once per instruction set
 * by kernels.c after gemm_impl.h (they use its vector type FN(vf), FN(vexp), FN(vload_n) ...).
 *
 * One call handles one batch row of one time step: it reads the row's input projection (x W^T and
 * the folded biases, made by one GEMM for the whole sequence) and its recurrent product (h R^T,
 * one product per step for all rows), and applies the gates' activations, the clip and the state
 * update in one pass over the hidden units, writing the new state in place and the output row.
 * Only the default activations are here (f = Sigmoid, g = h = Tanh): the Python side sends other
 * activation lists to the numpy kernel.
 *
 * Invariants: the sigmoid and tanh never overflow (FN(vexp) clamps its argument to [-87, 88]:
 * 1 / (1 + exp(-x)) is then finite and tends to 0 or 1); tanh near 0 keeps its relative accuracy
 * (a polynomial below |x| = 1/16, where (1 - e) / (1 + e) would cancel). */

#define RNN_INLINE __attribute__((always_inline))

/* 1 / (1 + exp(-v)) */
static inline MRT_TARGET RNN_INLINE FN(vf) FN(rnn_sigmoid)(FN(vf) v) {
    const FN(vf) one = ((FN(vf)){0}) + 1.0f;
    return one / (one + FN(vexp)(-v));
}

/* tanh(v) = sign(v) (1 - e) / (1 + e), e = exp(-2 |v|); |v| < 1/16: its Taylor polynomial to
 * degree 9 (truncation < 1e-12 relative there). */
static inline MRT_TARGET RNN_INLINE FN(vf) FN(rnn_tanh)(FN(vf) v) {
    const FN(vf) zero = {0}, one = zero + 1.0f;
    const FN(vf) a = FN(vsel)(v < zero, -v, v);
    const FN(vf) e = FN(vexp)(-2.0f * a);
    const FN(vf) big = (one - e) / (one + e);
    const FN(vf) v2 = v * v;
    FN(vf) p = zero + 62.0f / 2835.0f;
    p = p * v2 - 17.0f / 315.0f;
    p = p * v2 + 2.0f / 15.0f;
    p = p * v2 - 1.0f / 3.0f;
    const FN(vf) small = v + v * v2 * p;
    const FN(vf) t = FN(vsel)(v < zero, -big, big);
    return FN(vsel)(a < zero + 0.0625f, small, t);
}

static inline MRT_TARGET RNN_INLINE FN(vf) FN(rnn_clip)(FN(vf) v, float lim) {
    const FN(vf) z = {0};
    return FN(vclamp_hi)(FN(vclamp_lo)(v, z - lim), z + lim);
}

/* LSTM, gates in ONNX order i, o, f, c (xp and rec: 4H floats each; p: peepholes i, o, f, 3H floats,
 * or NULL).  c (H) updated in place, h (H) written; y (H) written when not NULL. */
static MRT_TARGET void FN(rnn_lstm_row)(int H, const float *xp, const float *rec, const float *p, float lim,
                                         int input_forget, float *c, float *h, float *y) {
    const FN(vf) zero = {0}, one = zero + 1.0f;
    for (int j = 0; j < H; j += MRT_VL) {
        const int n = H - j < MRT_VL ? H - j : MRT_VL;
        const FN(vf) cv = FN(vload_n)(c + j, n);
        FN(vf) gi = FN(vload_n)(xp + j, n) + FN(vload_n)(rec + j, n);
        FN(vf) go = FN(vload_n)(xp + H + j, n) + FN(vload_n)(rec + H + j, n);
        FN(vf) gf = FN(vload_n)(xp + 2 * H + j, n) + FN(vload_n)(rec + 2 * H + j, n);
        FN(vf) gc = FN(vload_n)(xp + 3 * H + j, n) + FN(vload_n)(rec + 3 * H + j, n);
        if (p) {
            gi += FN(vload_n)(p + j, n) * cv;
            gf += FN(vload_n)(p + 2 * H + j, n) * cv;
        }
        const FN(vf) i = FN(rnn_sigmoid)(FN(rnn_clip)(gi, lim));
        const FN(vf) f = input_forget ? one - i : FN(rnn_sigmoid)(FN(rnn_clip)(gf, lim));
        const FN(vf) cc = FN(rnn_tanh)(FN(rnn_clip)(gc, lim));
        const FN(vf) c1 = f * cv + i * cc;
        if (p) go += FN(vload_n)(p + H + j, n) * c1;
        const FN(vf) o = FN(rnn_sigmoid)(FN(rnn_clip)(go, lim));
        const FN(vf) h1 = o * FN(rnn_tanh)(c1);
        FN(vstore_n)(c + j, c1, n);
        FN(vstore_n)(h + j, h1, n);
        if (y) FN(vstore_n)(y + j, h1, n);
    }
}

/* GRU, gates in ONNX order z, r, h.  linear_before_reset: rec holds h R^T for all three gates (3H)
 * and rbh the h gate's recurrent bias (H floats, or NULL); h updated in place, y written when not
 * NULL.  Otherwise two passes around the second product: pass 0 (rec: the z and r gates, 2H) writes
 * z into zbuf and r * h into rh; pass 1 (rec: (r * h) Rh^T, H) finishes h. */
static MRT_TARGET void FN(rnn_gru_row)(int H, int pass, const float *xp, const float *rec, const float *rbh,
                                        float lim, float *zbuf, float *rh, float *h, float *y) {
    const FN(vf) zero = {0}, one = zero + 1.0f;
    for (int j = 0; j < H; j += MRT_VL) {
        const int n = H - j < MRT_VL ? H - j : MRT_VL;
        const FN(vf) hv = FN(vload_n)(h + j, n);
        FN(vf) z, hh;
        if (pass == 0) {
            z = FN(rnn_sigmoid)(FN(rnn_clip)(FN(vload_n)(xp + j, n) + FN(vload_n)(rec + j, n), lim));
            const FN(vf) r = FN(rnn_sigmoid)(FN(rnn_clip)(FN(vload_n)(xp + H + j, n) + FN(vload_n)(rec + H + j, n),
                                                          lim));
            if (rh) { /* linear_before_reset 0: the product of r * h comes next */
                FN(vstore_n)(zbuf + j, z, n);
                FN(vstore_n)(rh + j, r * hv, n);
                continue;
            }
            FN(vf) lin = FN(vload_n)(rec + 2 * H + j, n);
            if (rbh) lin += FN(vload_n)(rbh + j, n);
            hh = FN(rnn_tanh)(FN(rnn_clip)(FN(vload_n)(xp + 2 * H + j, n) + r * lin, lim));
        } else {
            z = FN(vload_n)(zbuf + j, n);
            hh = FN(rnn_tanh)(FN(rnn_clip)(FN(vload_n)(xp + 2 * H + j, n) + FN(vload_n)(rec + j, n), lim));
        }
        const FN(vf) h1 = (one - z) * hh + z * hv;
        FN(vstore_n)(h + j, h1, n);
        if (y) FN(vstore_n)(y + j, h1, n);
    }
}

#undef RNN_INLINE
