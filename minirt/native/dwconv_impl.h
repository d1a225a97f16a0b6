/* Depthwise 2-D convolution (group == channels, one KHxKW filter per
 * channel), compiled once per instruction set by kernels.c (baseline, AVX2,
 * AVX-512; which one runs: dwconv2d_avx512_dispatch there).  It is included
 * after kernels_impl.h (act_row) and gemm_impl.h, whose vector type FN(vf)
 * (MRT_VL floats), FN(vi), FN(vload) / FN(vstore) and FN(vsel) it uses.
 *
 * The layout stays NCHW and vectors run along the output columns of a row.
 * One work item is a band of output rows of one plane (channel of one image):
 *
 *  1. The input rows the band reads are copied into a zero-padded band
 *     (per-thread scratch, row stride ps, sized to stay in L1), so that the
 *     compute loops have no border logic whatever the padding.  Every padded
 *     row is long enough for whole-vector reads at the last output column.
 *     The margins are zeroed once per task; a plane only rewrites the input
 *     columns (and whole rows of vertical padding).  Two bands alternate:
 *     the next plane is copied while the previous one is computed.
 *  2. Output rows are computed DW_R at a time straight from the band: each
 *     input row's tap vectors are loaded once and multiplied into every
 *     output row of the block that uses them (3x3 stride 1: 6 rows x 3 loads
 *     for 4 output vectors instead of 4 x 9).
 *     Kernels of 3x3, 5x5 and 7x7 with stride 1 or 2 and no dilation get
 *     this unrolled code (weights in registers); any other shape takes a
 *     generic row loop over the same band.  Stride 2 loads two vectors and
 *     de-interleaves their even and odd columns with one in-lane shuffle
 *     each (see DW_EVEN_LANES), so its accumulators hold the output columns
 *     in a permuted order that one shuffle puts right before the store.
 *  3. Bias is the accumulators' start; the activation runs over the work
 *     item's rows once stored (act_row; calling the vector epilogue per
 *     stored vector measured slower: it is not inlined).
 *
 * The int8 depthwise conv (FN(qdwconv2d), QConv with group == channels) is the
 * same code on integer values: the band holds q - x_zero[c] (q the uint8
 * input, or the float input quantized while it is copied in), the weights are
 * the int8 values as floats, and the accumulators start at 0.  Every product
 * is an integer of magnitude <= 255 * 128 and every partial sum stays below
 * 2^24 (taps <= DW_EXACT_TAPS), so float32 sums them exactly in any order:
 * the accumulator is the exact int32 sum, computed at float speed.  The
 * epilogue then runs over the item's rows (FN(dw_q_epilogue)).
 *
 * Column vectors: a row of ow >= MRT_VL outputs is covered by whole vectors,
 * the last one moved back to end at ow (it recomputes a few columns rather
 * than storing a partial vector).  A row narrower than a vector is stored
 * whole as well, spilling into the rows after it, which are written later
 * (rows go in order); only where the spill would leave the work item (its
 * last rows) are the lanes copied one by one.
 */

/* Lane indices.  DW_EVEN_LANES / DW_ODD_LANES pick the even / odd floats of
 * two vectors lo:hi (indices into their 2*MRT_VL lanes) the way one in-lane
 * shuffle (vshufps) does: within each 128-bit block, so the output columns
 * come out as 0 1 4 5 2 3 6 7 with 8 lanes and 0 1 8 9 2 3 10 11 ... with 16
 * (in order with 4); DW_UNPERM_LANES puts them back in order. */
#if MRT_VL == 4
#define DW_LANES 0, 1, 2, 3
#define DW_EVEN_LANES 0, 2, 4, 6
#define DW_ODD_LANES 1, 3, 5, 7
#define DW_UNPERM_LANES 0, 1, 2, 3
#elif MRT_VL == 8
#define DW_LANES 0, 1, 2, 3, 4, 5, 6, 7
#define DW_EVEN_LANES 0, 2, 8, 10, 4, 6, 12, 14
#define DW_ODD_LANES 1, 3, 9, 11, 5, 7, 13, 15
#define DW_UNPERM_LANES 0, 1, 4, 5, 2, 3, 6, 7
#elif MRT_VL == 16
#define DW_LANES 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
#define DW_EVEN_LANES 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30
#define DW_ODD_LANES 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31
#define DW_UNPERM_LANES 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15
#else
#error "dwconv_impl.h: unsupported MRT_VL"
#endif

/* Output rows computed together (neighbouring output rows share kh - 1 of
 * their kh input rows at stride 1, kh - 2 at stride 2; 2 rows at stride 2
 * measured ~5% slower). */
#define DW_R 4
/* Floats of padded input per band: a band stays in L1 while it is used. */
#define DW_BAND_FLOATS 8192
/* int8: the most taps whose integer sums stay exact in float32 (255 * 128 * 514 < 2^24);
 * mirrored by minirt/kernels/qlinear.py, which sends larger kernels to numpy. */
#define DW_EXACT_TAPS 514

#define DW_INLINE inline __attribute__((always_inline))

typedef struct {
    const float *x, *w, *bias;
    float *y;
    const float *x_end; /* one past the input: whole-vector reads of short rows stay below it */
    int c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act;
    float a0, a1;
    int fixed;      /* 3x3, 5x5 or 7x7, stride 1 or 2 in both directions, no dilation: unrolled code */
    long ps;        /* row stride of the band (a multiple of MRT_VL) */
    int band_rows;  /* output rows per work item (the last band of a plane may have fewer) */
    int nbands;     /* bands per plane */
    /* int8 (FN(qdwconv2d)); scale == NULL for the float conv */
    const uint8_t *xq;        /* uint8 input (x == NULL), or NULL: x is float, quantized while copied */
    const float *xs, *xz;     /* per channel input scale and zero point (integer valued) */
    const float *scale;       /* per channel x_scale * w_scale: y = scale * acc + bias (+ res) */
    const float *res;         /* residual like the output, or NULL */
    float post_a, post_b;     /* y = post_a * act(y) + post_b */
    uint8_t *yq;              /* uint8 output clamp(rint(y / y_scale) + y_zero) instead of y, or NULL */
    float y_scale, y_zero;
} FN(dw_args);

/* Even / odd floats of lo:hi, in the lane order of DW_EVEN_LANES. */
static inline MRT_TARGET FN(vf) FN(dw_even)(FN(vf) lo, FN(vf) hi) {
#if defined(__clang__)
    return __builtin_shufflevector(lo, hi, DW_EVEN_LANES);
#else
    return __builtin_shuffle(lo, hi, (FN(vi)){DW_EVEN_LANES});
#endif
}

static inline MRT_TARGET FN(vf) FN(dw_odd)(FN(vf) lo, FN(vf) hi) {
#if defined(__clang__)
    return __builtin_shufflevector(lo, hi, DW_ODD_LANES);
#else
    return __builtin_shuffle(lo, hi, (FN(vi)){DW_ODD_LANES});
#endif
}

/* Output columns in order again after stride-2 taps. */
static inline MRT_TARGET FN(vf) FN(dw_unperm)(FN(vf) v) {
#if defined(__clang__)
    return __builtin_shufflevector(v, v, DW_UNPERM_LANES);
#else
    return __builtin_shuffle(v, (FN(vi)){DW_UNPERM_LANES});
#endif
}

/* The tap at padded column offset off for output columns ox.. of one band
 * row: lanes l < MRT_VL of row[s * (ox + l) + off].  Stride 2 returns them in
 * the permuted order (dw_unperm restores it); constant s and off (the unrolled
 * kernels) fold the branches away and share the loads of neighbouring taps. */
static inline MRT_TARGET FN(vf) FN(dw_taps)(const float *row, int ox, int off, int s) {
    if (s == 1) return FN(vload)(row + ox + off);
    if (s == 2) {
        const float *p = row + 2 * ox + (off & ~1);
        FN(vf) lo = FN(vload)(p), hi = FN(vload)(p + MRT_VL);
        return (off & 1) ? FN(dw_odd)(lo, hi) : FN(dw_even)(lo, hi);
    }
    float g[MRT_VL];
    for (int l = 0; l < MRT_VL; ++l) g[l] = row[(long)s * (ox + l) + off];
    return FN(vload)(g);
}

/* Store the vector v at y; rows narrower than a vector (ow < MRT_VL) store
 * only their ow lanes where a whole vector would run past the end of the
 * work item (room < MRT_VL floats left). */
static inline MRT_TARGET void FN(dw_store)(float *y, FN(vf) v, long room, int ow) {
    if (room >= MRT_VL) {
        FN(vstore)(y, v);
        return;
    }
    float t[MRT_VL];
    FN(vstore)(t, v);
    for (int l = 0; l < ow; ++l) y[l] = t[l];
}

/* R output rows y[r * ow + ...] (r < R) from the band rows starting at `in`
 * (the row of the top tap of output row 0), unrolled for constant K (= KH =
 * KW), S (stride in both directions) and R; no dilation.  wv holds the K*K
 * weights broadcast to vectors, bv the bias; rows_left is the number of rows
 * from y to the end of the work item. */
static DW_INLINE MRT_TARGET void FN(dw_block)(const float *in, long ps, const FN(vf) *wv, FN(vf) bv, float *y,
                                              int ow, int rows_left, const int K, const int S, const int R) {
    for (int ox0 = 0; ox0 < ow; ox0 += MRT_VL) {
        const int ox = (ox0 + MRT_VL > ow && ow >= MRT_VL) ? ow - MRT_VL : ox0;
        FN(vf) acc[DW_R]; /* R <= DW_R */
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r] = bv;
        /* input row j feeds output row r through kernel row j - r*S */
#pragma GCC unroll 16
        for (int j = 0; j < (R - 1) * S + K; ++j) {
            const float *row = in + (long)j * ps;
            FN(vf) v[7]; /* K <= 7 */
#pragma GCC unroll 8
            for (int kx = 0; kx < K; ++kx) v[kx] = FN(dw_taps)(row, ox, kx, S);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const int ky = j - r * S;
                if (ky < 0 || ky >= K) continue;
#pragma GCC unroll 8
                for (int kx = 0; kx < K; ++kx) acc[r] += wv[ky * K + kx] * v[kx];
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
            FN(dw_store)(y + (long)r * ow + ox, S == 2 ? FN(dw_unperm)(acc[r]) : acc[r], (long)(rows_left - r) * ow - ox,
                         ow);
    }
}

/* Output rows [oy0, oy1) of one plane from its band (which starts at padded
 * row oy0 * S), DW_R rows at a time, then the remainder (2 and 1). */
static DW_INLINE MRT_TARGET void FN(dw_band_fixed)(const FN(dw_args) *a, const float *band, const FN(vf) *wv,
                                                   FN(vf) bv, float *yp, int oy0, int oy1, const int K, const int S) {
    /* yp: output row oy0 */
    const int R = DW_R;
    const long ps = a->ps;
    const int ow = a->ow;
    int oy = oy0;
    for (; oy + R <= oy1; oy += R)
        FN(dw_block)(band + (long)(oy - oy0) * S * ps, ps, wv, bv, yp + (long)(oy - oy0) * ow, ow, oy1 - oy, K, S, R);
    if (R > 2 && oy + 2 <= oy1) {
        FN(dw_block)(band + (long)(oy - oy0) * S * ps, ps, wv, bv, yp + (long)(oy - oy0) * ow, ow, oy1 - oy, K, S,
                     2);
        oy += 2;
    }
    for (; oy < oy1; ++oy)
        FN(dw_block)(band + (long)(oy - oy0) * S * ps, ps, wv, bv, yp + (long)(oy - oy0) * ow, ow, oy1 - oy, K, S,
                     1);
}

/* Any kernel size, stride and dilation, one output row at a time (yp: output row oy0). */
static MRT_TARGET void FN(dw_band_generic)(const FN(dw_args) *a, const float *band, const float *wk, float b,
                                           float *yp, int oy0, int oy1) {
    const long ps = a->ps;
    const int ow = a->ow, kh = a->kh, kw = a->kw, sw = a->sw;
    const FN(vf) zero = {0};
    for (int oy = oy0; oy < oy1; ++oy) {
        const float *in = band + (long)(oy - oy0) * a->sh * ps;
        float *y = yp + (long)(oy - oy0) * ow;
        for (int ox0 = 0; ox0 < ow; ox0 += MRT_VL) {
            const int ox = (ox0 + MRT_VL > ow && ow >= MRT_VL) ? ow - MRT_VL : ox0;
            FN(vf) acc = zero + b;
            for (int ky = 0; ky < kh; ++ky) {
                const float *row = in + (long)ky * a->dh * ps;
                for (int kx = 0; kx < kw; ++kx) acc += wk[ky * kw + kx] * FN(dw_taps)(row, ox, kx * a->dw, sw);
            }
            FN(dw_store)(y + ox, sw == 2 ? FN(dw_unperm)(acc) : acc, (long)(oy1 - oy) * ow - ox, ow);
        }
    }
}

/* The first n lanes of v, zeros in the others (n < MRT_VL). */
static inline MRT_TARGET FN(vf) FN(dw_first)(FN(vf) v, int n) {
    const FN(vi) lane = {DW_LANES}, zi = {0};
    const FN(vf) zero = {0};
    return FN(vsel)(lane < zi + n, v, zero);
}

/* A band is zero outside the input columns [pl, pl + wd) of its rows: the
 * margins are zeroed once per task, and the copies store input columns and
 * zeros only (whole vectors, lanes past the input masked to zero; such a
 * store may run into the next row, which is written after it, or into the
 * slack after the band). */
static MRT_TARGET void FN(dw_zero_margins)(const FN(dw_args) *a, float *band, int rows) {
    const FN(vf) zero = {0};
    const long ps = a->ps;
    for (int i = 0; i < rows; ++i) {
        float *dst = band + (long)i * ps;
        for (long j = 0; j < a->pl; j += MRT_VL) FN(vstore)(dst + j, zero);
        for (long j = (long)a->pl + a->wd; j < ps; j += MRT_VL) FN(vstore)(dst + j, zero);
    }
}

/* dst[pl + ix] = src[ix], ix < wd. */
static inline MRT_TARGET void FN(dw_copy_row)(const FN(dw_args) *a, float *dst, const float *src) {
    const int wd = a->wd;
    float *d = dst + a->pl;
    if (wd >= MRT_VL) {
        int j = 0;
        for (; j + MRT_VL <= wd; j += MRT_VL) FN(vstore)(d + j, FN(vload)(src + j));
        if (j < wd) FN(vstore)(d + wd - MRT_VL, FN(vload)(src + wd - MRT_VL)); /* overlaps the previous store */
    } else if (src + MRT_VL <= a->x_end) {
        FN(vstore)(d, FN(dw_first)(FN(vload)(src), wd));
    } else { /* the last row of the input: do not read past it */
        for (int j = 0; j < wd; ++j) d[j] = src[j];
    }
}

/* int8, uint8 input: dst[pl + ix] = src[ix] - zp, ix < wd (exact small integers).  A plain loop:
 * GCC vectorises it (zero-extend + convert); __builtin_convertvector of a byte vector was slower. */
static inline MRT_TARGET void FN(dw_copy_row_u8)(const FN(dw_args) *a, float *restrict dst, const uint8_t *restrict src,
                                                 float zp) {
    float *restrict d = dst + a->pl;
    const int wd = a->wd;
    for (int j = 0; j < wd; ++j) d[j] = (float)src[j] - zp;
}

/* int8, float input: dst[pl + ix] = clamp(rint(src[ix] / xs), -zp, 255 - zp), i.e. quantize_u8(x) - zp
 * (NaN -> -zp, as the GEMM path's quantization). */
static inline MRT_TARGET void FN(dw_copy_row_quant)(const FN(dw_args) *a, float *dst, const float *src, float xs,
                                                    float zp) {
    const int wd = a->wd;
    float *d = dst + a->pl;
    const FN(vf) zero = {0}, lo = zero - zp, hi = zero + (255.0f - zp), vs = zero + xs;
    int j = 0;
    if (wd >= MRT_VL) {
        for (;; j += MRT_VL) {
            if (j + MRT_VL > wd) j = wd - MRT_VL;
            FN(vf) t = FN(vload)(src + j) / vs;
            t = FN(vsel)(t > lo, t, lo);
            t = FN(vsel)(t < hi, t, hi);
            FN(vstore)(d + j, (t + 12582912.0f) - 12582912.0f); /* round half to even, |t| <= 255 */
            if (j + MRT_VL == wd) break;
        }
        return;
    }
    for (; j < wd; ++j) {
        float t = src[j] / xs;
        t = t > -zp ? t : -zp;
        t = t < 255.0f - zp ? t : 255.0f - zp;
        d[j] = (t + 12582912.0f) - 12582912.0f;
    }
}

/* Padded rows [r0, r1) of plane xp into the band: band[i][pl + ix] =
 * x[r0 + i - pt][ix] (int8: the quantized value minus the zero point of channel ch). */
static MRT_TARGET void FN(dw_fill_band)(const FN(dw_args) *a, long plane, int ch, int r0, int r1, float *band) {
    const float *xp = a->x ? a->x + plane * a->h * a->wd : NULL;
    const uint8_t *xqp = a->xq ? a->xq + plane * a->h * a->wd : NULL;
    const float zp = a->scale ? a->xz[ch] : 0.0f;
    const FN(vf) zero = {0};
    for (int i = 0; i < r1 - r0; ++i) {
        float *dst = band + (long)i * a->ps;
        const int iy = r0 + i - a->pt;
        if (iy < 0 || iy >= a->h) { /* a row of vertical padding */
            for (long j = a->pl; j < (long)a->pl + a->wd; j += MRT_VL) FN(vstore)(dst + j, zero);
            continue;
        }
        if (xqp)
            FN(dw_copy_row_u8)(a, dst, xqp + (long)iy * a->wd, zp);
        else if (a->scale)
            FN(dw_copy_row_quant)(a, dst, xp + (long)iy * a->wd, a->xs[ch], zp);
        else
            FN(dw_copy_row)(a, dst, xp + (long)iy * a->wd);
    }
}

/* The parameters of the int8 epilogue, copied out of FN(dw_args) so that they stay in registers
 * (stores to the output could alias the struct). */
typedef struct {
    float s, b, a0, a1, post_a, post_b;
    int act;
} FN(dw_q_consts);

/* One vector of the int8 epilogue for the activations it inlines (none, Relu, Clip, HardSwish:
 * the formulas of act_row): post_a * act(s * acc + b + r) + post_b. */
static inline MRT_TARGET FN(vf) FN(dw_q_vec)(const FN(dw_q_consts) k, FN(vf) acc, FN(vf) r) {
    const FN(vf) zero = {0};
    FN(vf) v = k.s * acc + k.b + r;
    if (k.act == MRT_ACT_RELU) {
        v = FN(vsel)(v < zero, zero, v);
    } else if (k.act == MRT_ACT_CLIP) {
        const FN(vf) lo = zero + k.a0, hi = zero + k.a1;
        v = FN(vsel)(v < lo, lo, v);
        v = FN(vsel)(v > hi, hi, v);
    } else if (k.act == MRT_ACT_HARDSWISH) {
        FN(vf) t = v * (1.0f / 6.0f) + 0.5f;
        const FN(vf) one = zero + 1.0f;
        t = FN(vsel)(t < zero, zero, t);
        t = FN(vsel)(t > one, one, t);
        v = v * t;
    }
    return k.post_a * v + k.post_b;
}

/* int8 epilogue over n outputs of channel ch (acc: the exact integer sums, in place):
 * y = post_a * act(scale * acc + bias (+ res)) + post_b, stored as float in place or, with
 * a->yq, requantized to uint8 into yq (clamp(rint(y / y_scale) + y_zero), NaN -> 0, as the
 * GEMM's requantization).  Common activations run in one vector pass; others through act_row. */
static MRT_TARGET void FN(dw_q_epilogue)(const FN(dw_args) *a, int ch, float *restrict acc, long n,
                                         const float *restrict res, uint8_t *restrict yq) {
    const float s = a->scale[ch], b = a->bias ? a->bias[ch] : 0.0f;
    const int inline_act = a->act == MRT_ACT_NONE || a->act == MRT_ACT_RELU || a->act == MRT_ACT_CLIP ||
                           a->act == MRT_ACT_HARDSWISH;
    if (inline_act) {
        const FN(dw_q_consts) k = {s, b, a->a0, a->a1, a->post_a, a->post_b, a->act};
        const FN(vf) zero = {0};
        const float yz = a->y_zero;
        const FN(vf) lo = zero - yz, hi = zero + (255.0f - yz), ys = zero + a->y_scale;
        long i = 0;
        if (!yq) {
            for (; i + MRT_VL <= n; i += MRT_VL)
                FN(vstore)(acc + i, FN(dw_q_vec)(k, FN(vload)(acc + i), res ? FN(vload)(res + i) : zero));
        } else {
            for (; i + MRT_VL <= n; i += MRT_VL) {
                FN(vf) t = FN(dw_q_vec)(k, FN(vload)(acc + i), res ? FN(vload)(res + i) : zero) / ys;
                t = FN(vsel)(t > lo, t, lo); /* NaN -> lo */
                t = FN(vsel)(t < hi, t, hi);
                FN(vstore)(acc + i, (t + 12582912.0f) - 12582912.0f + yz); /* round half to even: 0..255 */
            }
        }
        /* to bytes in a plain loop (GCC vectorises it with packs; a byte vector conversion did not) */
        if (yq)
            for (long j = 0; j < i; ++j) yq[j] = (uint8_t)(int)acc[j];
        if (i == n) return;
        /* the tail: the same formulas lane by lane */
        float tv[MRT_VL] = {0}, tr[MRT_VL] = {0};
        for (long j = i; j < n; ++j) tv[j - i] = acc[j];
        if (res)
            for (long j = i; j < n; ++j) tr[j - i] = res[j];
        FN(vf) v = FN(dw_q_vec)(k, FN(vload)(tv), FN(vload)(tr));
        FN(vstore)(tv, v);
        for (long j = i; j < n; ++j) acc[j] = tv[j - i];
        if (!yq) return;
        acc += i, yq += i, n -= i;
        for (long j = 0; j < n; ++j) {
            float t = acc[j] / a->y_scale;
            t = t > -a->y_zero ? t : -a->y_zero;
            t = t < 255.0f - a->y_zero ? t : 255.0f - a->y_zero;
            t = (t + 12582912.0f) - 12582912.0f;
            yq[j] = (uint8_t)(int)(t + a->y_zero);
        }
        return;
    }
    if (res)
        for (long i = 0; i < n; ++i) acc[i] = s * acc[i] + b + res[i];
    else
        for (long i = 0; i < n; ++i) acc[i] = s * acc[i] + b;
    if (a->act) FN(act_row)(acc, n, a->act, a->a0, a->a1);
    if (a->post_a != 1.0f || a->post_b != 0.0f)
        for (long i = 0; i < n; ++i) acc[i] = a->post_a * acc[i] + a->post_b;
    if (!yq) return;
    const float lo = -a->y_zero, hi = 255.0f - a->y_zero, ys = a->y_scale, zp = a->y_zero;
    for (long i = 0; i < n; ++i) {
        float t = acc[i] / ys;
        t = t > lo ? t : lo; /* NaN -> lo */
        t = t < hi ? t : hi;
        t = (t + 12582912.0f) - 12582912.0f;
        yq[i] = (uint8_t)(int)(t + zp);
    }
}

/* Output rows [oy0, oy1) of work item p, from its band; int8 with a uint8 output computes them
 * into out_rows (band_rows * ow floats of per-thread scratch) before requantizing. */
static MRT_TARGET void FN(dw_item)(const FN(dw_args) *a, long p, const float *band, FN(vf) *wv, float *out_rows) {
    const int kh = a->kh, kw = a->kw, oh = a->oh, ow = a->ow;
    const long plane = p / a->nbands;
    const int ch = (int)(plane % a->c);
    const int oy0 = (int)(p % a->nbands) * a->band_rows;
    const int oy1 = oy0 + a->band_rows < oh ? oy0 + a->band_rows : oh;
    const float *wk = a->w + (long)ch * kh * kw;
    const long first = plane * oh * ow + (long)oy0 * ow; /* output row oy0 */
    float *yp = a->yq ? out_rows : a->y + first;
    const float b = a->bias && !a->scale ? a->bias[ch] : 0.0f; /* int8: bias in the epilogue */
    const FN(vf) zero = {0};
    if (!a->fixed) {
        FN(dw_band_generic)(a, band, wk, b, yp, oy0, oy1);
    } else {
        for (int i = 0; i < kh * kw; ++i) wv[i] = zero + wk[i];
        const FN(vf) bv = zero + b;
        switch (kh * 10 + a->sh) {
        case 31: FN(dw_band_fixed)(a, band, wv, bv, yp, oy0, oy1, 3, 1); break;
        case 32: FN(dw_band_fixed)(a, band, wv, bv, yp, oy0, oy1, 3, 2); break;
        case 51: FN(dw_band_fixed)(a, band, wv, bv, yp, oy0, oy1, 5, 1); break;
        case 52: FN(dw_band_fixed)(a, band, wv, bv, yp, oy0, oy1, 5, 2); break;
        case 71: FN(dw_band_fixed)(a, band, wv, bv, yp, oy0, oy1, 7, 1); break;
        default: FN(dw_band_fixed)(a, band, wv, bv, yp, oy0, oy1, 7, 2); break;
        }
    }
    if (a->scale)
        FN(dw_q_epilogue)(a, ch, yp, (long)(oy1 - oy0) * ow, a->res ? a->res + first : NULL,
                          a->yq ? a->yq + first : NULL);
    else if (a->act)
        FN(act_row)(yp, (long)(oy1 - oy0) * ow, a->act, a->a0, a->a1);
}

/* Fill the band of work item p (its input rows) into band. */
static inline MRT_TARGET void FN(dw_fill_item)(const FN(dw_args) *a, long p, float *band) {
    const long plane = p / a->nbands;
    const int oy0 = (int)(p % a->nbands) * a->band_rows;
    const int oy1 = oy0 + a->band_rows < a->oh ? oy0 + a->band_rows : a->oh;
    FN(dw_fill_band)(a, plane, (int)(plane % a->c), oy0 * a->sh, (oy1 - 1) * a->sh + (a->kh - 1) * a->dh + 1, band);
}

/* Two bands: item p + 1 is copied in while item p is computed from the band
 * filled one item earlier.  Reading a band right after filling it stalls on
 * small planes: the loads straddle stores still in flight, which cannot be
 * forwarded. */
static MRT_TARGET void FN(dw_task)(void *ctx, long begin, long end) {
    const FN(dw_args) *a = (const FN(dw_args) *)ctx;
    const int band_in_rows = (a->band_rows - 1) * a->sh + (a->kh - 1) * a->dh + 1;
    const long band_floats = (long)band_in_rows * a->ps + 2 * MRT_VL; /* with slack for spilled stores */
    const long out_floats = a->yq ? (long)a->band_rows * a->ow : 0; /* int8 uint8 output: float rows */
    float *bands = (float *)mrt_pack_buffer(sizeof(float) * (2 * (size_t)band_floats + (size_t)out_floats));
    if (!bands) return;
    float *out_rows = bands + 2 * band_floats;
    FN(dw_zero_margins)(a, bands, band_in_rows);
    FN(dw_zero_margins)(a, bands + band_floats, band_in_rows);
    FN(vf) wv[49];
    FN(dw_fill_item)(a, begin, bands);
    for (long p = begin; p < end; ++p) {
        if (p + 1 < end) FN(dw_fill_item)(a, p + 1, bands + ((p + 1 - begin) & 1) * band_floats);
        FN(dw_item)(a, p, bands + ((p - begin) & 1) * band_floats, wv, out_rows);
    }
}

/* Geometry (fixed, ps, bands) of a filled-in FN(dw_args) for n images, and the run. */
static void FN(dw_run)(FN(dw_args) *ap, int n, int nthreads) {
    FN(dw_args) a = *ap;
    const int c = a.c, h = a.h, wd = a.wd, kh = a.kh, kw = a.kw, sh = a.sh, sw = a.sw, dh = a.dh, dw = a.dw;
    const int pl = a.pl, oh = a.oh, ow = a.ow;
    const long planes = (long)n * c;
    (void)h;
    a.fixed = kh == kw && (kh == 3 || kh == 5 || kh == 7) && sh == sw && (sh == 1 || sh == 2) && dh == 1 && dw == 1;
    /* a padded row: the input at column pl, and whole-vector reads at the last output column
     * (stride 2 reads two vectors from 2 * ox + even offset) */
    const long widest = ow > MRT_VL ? ow : MRT_VL;
    long ps = (long)sw * widest + (long)(kw - 1) * dw + 1;
    if (ps < (long)pl + wd) ps = (long)pl + wd;
    ps = (ps + MRT_VL - 1) / MRT_VL * MRT_VL;
    a.ps = ps;
    /* bands of output rows whose padded input fits DW_BAND_FLOATS (at least one block of rows) ... */
    long band = ((long)DW_BAND_FLOATS / ps - (long)(kh - 1) * dh) / sh;
    if (band < DW_R) band = DW_R;
    if (band > oh) band = oh;
    /* ... and, with few planes, enough bands for every thread (the result does not depend on the split) */
    if (nthreads > 1 && planes < 4L * nthreads) {
        long per_plane = (4L * nthreads + planes - 1) / planes;
        long rows = (oh + per_plane - 1) / per_plane;
        if (rows < band) band = rows;
    }
    a.band_rows = (int)band;
    a.nbands = (int)((oh + band - 1) / band);
    mrt_parallel_for(planes * a.nbands, band * ow * kh * kw, nthreads, FN(dw_task), &a);
}

static void FN(dwconv2d)(const float *x, const float *w, const float *bias, float *y, int n, int c, int h, int wd,
                         int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int oh, int ow, int act,
                         float a0, float a1, int nthreads) {
    if (oh <= 0 || ow <= 0 || n <= 0 || c <= 0) return;
    FN(dw_args) a = {0};
    a.x = x; a.w = w; a.bias = bias; a.y = y; a.x_end = x + (long)n * c * h * wd;
    a.c = c; a.h = h; a.wd = wd; a.kh = kh; a.kw = kw; a.sh = sh; a.sw = sw; a.dh = dh; a.dw = dw;
    a.pt = pt; a.pl = pl; a.oh = oh; a.ow = ow; a.act = act; a.a0 = a0; a.a1 = a1;
    FN(dw_run)(&a, n, nthreads);
}

/* int8 depthwise conv (see the top of this file and mrt_qdwconv2d in kernels.h). */
static void FN(qdwconv2d)(const mrt_qdw_params *q, int n, int c, int h, int wd, int kh, int kw, int sh, int sw, int dh,
                          int dw, int pt, int pl, int oh, int ow, int nthreads) {
    if (oh <= 0 || ow <= 0 || n <= 0 || c <= 0) return;
    FN(dw_args) a = {0};
    a.x = q->x; a.xq = q->xq; a.w = q->w; a.bias = q->bias; a.y = q->y;
    a.x_end = q->x ? q->x + (long)n * c * h * wd : NULL;
    a.c = c; a.h = h; a.wd = wd; a.kh = kh; a.kw = kw; a.sh = sh; a.sw = sw; a.dh = dh; a.dw = dw;
    a.pt = pt; a.pl = pl; a.oh = oh; a.ow = ow; a.act = q->act; a.a0 = q->a0; a.a1 = q->a1;
    a.xs = q->x_scale; a.xz = q->x_zero; a.scale = q->scale; a.res = q->res;
    a.post_a = q->post_a; a.post_b = q->post_b;
    a.yq = q->yq; a.y_scale = q->y_scale; a.y_zero = (float)q->y_zero;
    FN(dw_run)(&a, n, nthreads);
}

#undef DW_LANES
#undef DW_EVEN_LANES
#undef DW_ODD_LANES
#undef DW_UNPERM_LANES
#undef DW_R
#undef DW_BAND_FLOATS
#undef DW_EXACT_TAPS
#undef DW_INLINE
