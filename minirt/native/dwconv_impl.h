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
 * epilogue then runs over the item's rows (FN(dw_q_epilogue)).  It runs the plane
 * path only (FN(dw_run)): the channel-blocked path below is float only.
 *
 * Two other layouts follow the plane path: channel blocks (dw_cb_*, a vector
 * per pixel of MRT_VL channels) and, for 3x3 stride 2 with 8 or 16 lanes,
 * the direct stride-2 path (dw_s2_*, planes read in place); dw_run picks.
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

/* The MRT_VL x MRT_VL transpose of the channel-blocked path (dw_transpose):
 * interleave single floats within 128-bit blocks (unpcklps / unpckhps), then
 * float pairs (unpcklpd / unpckhpd), then whole 128-bit blocks (even blocks of
 * a then of b, odd blocks of a then of b: vperm2f128 / vshuff32x4), once per
 * doubling of the vector beyond 4 floats. */
#if MRT_VL == 4
#define DW_ZIP1_LO 0, 4, 1, 5
#define DW_ZIP1_HI 2, 6, 3, 7
#define DW_ZIP2_LO 0, 1, 4, 5
#define DW_ZIP2_HI 2, 3, 6, 7
#define DW_ZIP4_LO DW_LANES /* unused: no 128-bit stage with 4 lanes */
#define DW_ZIP4_HI DW_LANES
#elif MRT_VL == 8
#define DW_ZIP1_LO 0, 8, 1, 9, 4, 12, 5, 13
#define DW_ZIP1_HI 2, 10, 3, 11, 6, 14, 7, 15
#define DW_ZIP2_LO 0, 1, 8, 9, 4, 5, 12, 13
#define DW_ZIP2_HI 2, 3, 10, 11, 6, 7, 14, 15
#define DW_ZIP4_LO 0, 1, 2, 3, 8, 9, 10, 11
#define DW_ZIP4_HI 4, 5, 6, 7, 12, 13, 14, 15
#else
#define DW_ZIP1_LO 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29
#define DW_ZIP1_HI 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31
#define DW_ZIP2_LO 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define DW_ZIP2_HI 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define DW_ZIP4_LO 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define DW_ZIP4_HI 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#endif

/* Output rows computed together (neighbouring output rows share kh - 1 of
 * their kh input rows at stride 1, kh - 2 at stride 2; 2 rows at stride 2
 * measured ~5% slower). */
#define DW_R 4
/* Output planes of at least this many pixels are split into bands of rows between threads, smaller ones
 * by channels (FN(dw_run)): between 28 x 28 and 56 x 56 */
#define DW_BAND_SPLIT_PIXELS 2048
/* Floats of padded input per band: a band stays in L1 while it is used. */
#define DW_BAND_FLOATS 8192
/* int8: the most taps whose integer sums stay exact in float32 (255 * 128 * 514 < 2^24);
 * mirrored by minirt/kernels/qlinear.py, which sends larger kernels to numpy. */
#define DW_EXACT_TAPS 514

#define DW_INLINE inline __attribute__((always_inline))

typedef struct {
    const float *x, *w, *bias;
    const float *z; /* residual like y, added before the activation (int8: to scale * acc + bias), or NULL */
    float *y;
    const float *x_end; /* one past the input: whole-vector reads of short rows stay below it */
    int c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act;
    float a0, a1;
    int fixed;      /* 3x3, 5x5 or 7x7, stride 1 or 2 in both directions, no dilation: unrolled code */
    long ps;        /* row stride of the band (a multiple of MRT_VL) */
    int band_rows;  /* output rows per work item (the last band of a plane may have fewer) */
    int nbands;     /* bands per plane (per channel block on the channel-blocked path) */
    long nitems;    /* planes (channel blocks on the channel-blocked path) per band: work item p is
                     * band p / nitems of plane (block) p % nitems, band-major so that the threads'
                     * contiguous shares of the items are bands of rows (kernels.c, pool_range) */
    int blocked;    /* the channel-blocked path (dw_cb_*) rather than planes */
    int nblocks;    /* channel blocks of MRT_VL per image (the last may be partial) */
    long cb_wp;     /* pixels per row of the channel-blocked band (input and padding) */
    int cb_span;    /* rows of that band */
    int cb_ring;    /* the band is a ring of rows refilled as output rows advance (see dw_cb_item) */
    int cb_ring_rows; /* rows transposed together into the ring (a multiple of sh when the windows overlap or
                       * touch, else 1) */
    int cb_chunks;  /* ring fills load 4-float chunks (dw_load_transposed): 16 lanes, rows not whole vectors */
    int cb_out_rows; /* ring: output rows transposed into the planes together (their pixels are contiguous there) */
    int cb_act;     /* the activation applied to the accumulators, no act_row pass (without a residual; see
                     * dw_cb_act; channel-blocked and direct stride-2 paths): DW_ACT_CLAMP (Relu / Clip),
                     * DW_ACT_HARDSWISH (kernels up to 5x5), else 0 */
    int direct_s2;  /* the direct stride-2 path (dw_s2_*) */
    /* int8 (FN(qdwconv2d), plane path only); scale == NULL for the float conv */
    const uint8_t *xq;        /* uint8 input (x == NULL), or NULL: x is float, quantized while copied */
    const float *xs, *xz;     /* per channel input scale and zero point (integer valued) */
    const float *scale;       /* per channel x_scale * w_scale: y = scale * acc + bias (+ z) */
    float post_a, post_b;     /* y = post_a * act(y) + post_b */
    uint8_t *yq;              /* uint8 output clamp(rint(y / y_scale) + y_zero) instead of y, or NULL */
    float y_scale, y_zero;
} FN(dw_args);

/* Lanes of the 2*MRT_VL floats a:b picked by the constant indices. */
#if defined(__clang__)
#define DW_SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define DW_SHUFFLE2(a, b, ...) __builtin_shuffle(a, b, (FN(vi)){__VA_ARGS__})
#endif

/* Even / odd floats of lo:hi, in the lane order of DW_EVEN_LANES. */
static inline MRT_TARGET FN(vf) FN(dw_even)(FN(vf) lo, FN(vf) hi) { return DW_SHUFFLE2(lo, hi, DW_EVEN_LANES); }

static inline MRT_TARGET FN(vf) FN(dw_odd)(FN(vf) lo, FN(vf) hi) { return DW_SHUFFLE2(lo, hi, DW_ODD_LANES); }

/* Output columns in order again after stride-2 taps. */
static inline MRT_TARGET FN(vf) FN(dw_unperm)(FN(vf) v) { return DW_SHUFFLE2(v, v, DW_UNPERM_LANES); }

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

static inline MRT_TARGET void FN(dw_act_rows)(float *y, long n, int act, float a0, float a1);

/* y[i] = act(y[i] + z[i]) for i < len: the residual and activation of n
 * stored outputs (still in L1). */
static MRT_TARGET void FN(dw_residual_act)(const FN(dw_args) *a, float *y, const float *z, long len) {
    long i = 0;
    for (; i + MRT_VL <= len; i += MRT_VL) FN(vstore)(y + i, FN(vload)(y + i) + FN(vload)(z + i));
    for (; i < len; ++i) y[i] += z[i];
    if (a->act) FN(dw_act_rows)(y, len, a->act, a->a0, a->a1);
}

/* Output rows [oy0, oy1) of work item p, from its band; int8 with a uint8 output computes them
 * into out_rows (band_rows * ow floats of per-thread scratch) before requantizing. */
static MRT_TARGET void FN(dw_item)(const FN(dw_args) *a, long p, const float *band, FN(vf) *wv, float *out_rows) {
    const int kh = a->kh, kw = a->kw, oh = a->oh, ow = a->ow;
    const long plane = p % a->nitems;
    const int ch = (int)(plane % a->c);
    const int oy0 = (int)(p / a->nitems) * a->band_rows;
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
    const long len = (long)(oy1 - oy0) * ow;
    if (a->scale)
        FN(dw_q_epilogue)(a, ch, yp, len, a->z ? a->z + first : NULL, a->yq ? a->yq + first : NULL);
    else if (a->z)
        FN(dw_residual_act)(a, yp, a->z + first, len);
    else if (a->act)
        FN(dw_act_rows)(yp, len, a->act, a->a0, a->a1);
}

/* Fill the band of work item p (its input rows) into band. */
static inline MRT_TARGET void FN(dw_fill_item)(const FN(dw_args) *a, long p, float *band) {
    const long plane = p % a->nitems;
    const int oy0 = (int)(p / a->nitems) * a->band_rows;
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

/* ------------------------------------------------------------------ channel-blocked path
 *
 * Where it measured faster than the plane path (dw_use_blocked), MRT_VL
 * channels of one image are computed together in a channel-interleaved
 * layout where one vector is one pixel of MRT_VL channels:
 *
 *  1. The input rows of a band of output rows are transposed (MRT_VL planes x
 *     MRT_VL pixels at a time, dw_load_transposed) into a zero-padded band
 *     [row][column][lane] of cb_wp pixels per row (all rows at once, or a
 *     ring of rows for large planes: dw_cb_item); margins are zeroed once
 *     per task as on the plane path.
 *  2. Every tap is one whole-vector FMA with per-lane weights: no shuffles,
 *     no partial vectors at the end of narrow rows, no per-plane or per-row
 *     set-up; the stride is only the step between the input pixels read.
 *     Output pixels go to a second buffer [pixel][lane].
 *  3. Relu / Clip, and HardSwish up to 5x5, are applied to the accumulators
 *     before they are stored (cb_act); other activations run over that
 *     buffer (they commute with the transpose); with a residual, which must
 *     come first, the activation
 *     runs after it, on the planes.  The buffer is then transposed into the
 *     MRT_VL output planes.
 *
 * A last block of fewer than MRT_VL channels reads its last channel again
 * in the missing lanes and stores only the real ones.  The sums are taken in
 * the plane path's order (bias, then taps by row and column), so both paths
 * give the same floats.
 */

/* Activations on the accumulators (FN(dw_args).cb_act). */
#define DW_ACT_CLAMP 1
#define DW_ACT_HARDSWISH 2
/* Output pixels per register block of dw_cb_pixels. */
#define DW_CB_RB 4
/* Floats of channel-blocked input and output rows per work item (they stay in L1). */
#define DW_CB_FLOATS 8192

static DW_INLINE MRT_TARGET void FN(dw_zip_blocks)(FN(vf) *v, const int step) {
#pragma GCC unroll 16
    for (int g = 0; g < MRT_VL; g += 2 * step)
#pragma GCC unroll 8
        for (int k = 0; k < step; ++k) {
            const FN(vf) lo = v[g + k], hi = v[g + step + k];
            v[g + k] = DW_SHUFFLE2(lo, hi, DW_ZIP4_LO);
            v[g + step + k] = DW_SHUFFLE2(lo, hi, DW_ZIP4_HI);
        }
}

/* In place, within each 128-bit block: float e of block q of v[4g + i]
 * becomes float i of block q of v[4g + e] (a 4x4 transpose per block and
 * group of four vectors). */
static DW_INLINE MRT_TARGET void FN(dw_zip_lanes)(FN(vf) *v) {
    FN(vf) t[MRT_VL];
#pragma GCC unroll 16
    for (int i = 0; i < MRT_VL; i += 2) {
        t[i] = DW_SHUFFLE2(v[i], v[i + 1], DW_ZIP1_LO);
        t[i + 1] = DW_SHUFFLE2(v[i], v[i + 1], DW_ZIP1_HI);
    }
#pragma GCC unroll 16
    for (int g = 0; g < MRT_VL; g += 4) {
        v[g] = DW_SHUFFLE2(t[g], t[g + 2], DW_ZIP2_LO);
        v[g + 1] = DW_SHUFFLE2(t[g], t[g + 2], DW_ZIP2_HI);
        v[g + 2] = DW_SHUFFLE2(t[g + 1], t[g + 3], DW_ZIP2_LO);
        v[g + 3] = DW_SHUFFLE2(t[g + 1], t[g + 3], DW_ZIP2_HI);
    }
}

/* In place: lane j of v[i] becomes lane i of v[j] (see DW_ZIP1_LO). */
static DW_INLINE MRT_TARGET void FN(dw_transpose)(FN(vf) *v) {
    FN(dw_zip_lanes)(v);
    if (MRT_VL >= 8) FN(dw_zip_blocks)(v, 4);
    if (MRT_VL >= 16) FN(dw_zip_blocks)(v, 8);
}

/* v[j] = lane j of rows[0..MRT_VL)[q..q + MRT_VL): the transpose of the
 * block.  Whole-vector loads, then the shuffle stages of dw_transpose; or,
 * with `chunks` (16 lanes only, see cb_chunks), the 128-bit stages are done
 * by the loads instead: v[4g + i] is assembled from the 4-float chunks g of
 * rows i, 4 + i, 8 + i and 12 + i (one per 128-bit block), which leaves the
 * 4x4 transposes within blocks (dw_zip_lanes). */
static DW_INLINE MRT_TARGET void FN(dw_load_transposed)(const float *const *rows, long q, FN(vf) *v,
                                                        const int chunks) {
#if MRT_VL == 16
    if (chunks) {
        typedef float chunk __attribute__((vector_size(16), aligned(4)));
        typedef float half __attribute__((vector_size(32)));
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g)
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                const long at = q + 4 * g;
                const half lo = __builtin_shufflevector(*(const chunk *)(rows[i] + at), *(const chunk *)(rows[4 + i] + at),
                                                        0, 1, 2, 3, 4, 5, 6, 7);
                const half hi = __builtin_shufflevector(*(const chunk *)(rows[8 + i] + at),
                                                        *(const chunk *)(rows[12 + i] + at), 0, 1, 2, 3, 4, 5, 6, 7);
                v[4 * g + i] = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            }
        FN(dw_zip_lanes)(v);
        return;
    }
#else
    (void)chunks;
#endif
#pragma GCC unroll 16
    for (int l = 0; l < MRT_VL; ++l) v[l] = FN(vload)(rows[l] + q);
    FN(dw_transpose)(v);
}

/* Input rows [iy0, iy1) of the planes xl[0..MRT_VL) into the band: lane l of
 * pixel (iy, ix) goes to dst[((iy - iy0) * wp + ix) * MRT_VL + l], where dst
 * is the band row of iy0 at the first input column.  The pixels of those rows
 * are contiguous in each plane, so they go MRT_VL at a time whatever the
 * width, the last group moved back to end at the last pixel. */
static DW_INLINE MRT_TARGET void FN(dw_cb_fill_rows)(const float *const *xl, int wd, long wp, int iy0, int iy1,
                                                      float *dst, const int chunks) {
    const long p0 = (long)iy0 * wd, p1 = (long)iy1 * wd;
    if (p1 - p0 < MRT_VL) { /* fewer pixels than lanes */
        for (long p = p0; p < p1; ++p) {
            float *d = dst + ((p / wd - iy0) * wp + p % wd) * MRT_VL;
            for (int l = 0; l < MRT_VL; ++l) d[l] = xl[l][p];
        }
        return;
    }
    long ix = 0; /* the column of pixel p; d: its place in the band (both carried from group to group) */
    float *d = dst;
    for (long p = p0; p < p1; p += MRT_VL) {
        const long q = p + MRT_VL <= p1 ? p : p1 - MRT_VL;
        FN(vf) v[MRT_VL];
        FN(dw_load_transposed)(xl, q, v, chunks);
        if (q != p) { /* the last group, moved back: its own place (the one division per call) */
            ix = q % wd;
            d = dst + ((q / wd - iy0) * wp + ix) * MRT_VL;
        }
#pragma GCC unroll 16
        for (int j = 0; j < MRT_VL; ++j) {
            FN(vstore)(d, v[j]);
            d += MRT_VL;
            if (++ix == wd) { /* next input row */
                ix = 0;
                d += (wp - wd) * MRT_VL;
            }
        }
    }
}

/* Output pixels [p0, p1) of the MRT_VL planes: lane l of out[p - p0] goes to
 * yl[l][p] for l < nch (the real channels of the block). */
static DW_INLINE MRT_TARGET void FN(dw_cb_store)(const float *out, long p0, long p1, float *const *yl, int nch) {
    if (p1 - p0 < MRT_VL) {
        for (long p = p0; p < p1; ++p)
            for (int l = 0; l < nch; ++l) yl[l][p] = out[(p - p0) * MRT_VL + l];
        return;
    }
    for (long p = p0; p < p1; p += MRT_VL) {
        const long q = p + MRT_VL <= p1 ? p : p1 - MRT_VL;
        FN(vf) v[MRT_VL];
#pragma GCC unroll 16
        for (int j = 0; j < MRT_VL; ++j) v[j] = FN(vload)(out + (q - p0 + j) * MRT_VL);
        FN(dw_transpose)(v);
        if (nch == MRT_VL) {
#pragma GCC unroll 16
            for (int l = 0; l < MRT_VL; ++l) FN(vstore)(yl[l] + q, v[l]);
        } else {
            for (int l = 0; l < nch; ++l) FN(vstore)(yl[l] + q, v[l]);
        }
    }
}

/* Relu or Clip on accumulators, the formulas of act_row and vact_cheap (so
 * NaN and the bounds give the same floats): v < lo ? lo : v, then
 * v > hi ? hi : v (Relu: lo = 0, hi = +inf).  On x86 that is maxps(lo, v)
 * then minps(hi, v), which return their second operand v unless the first
 * compares greater / less (so for NaN, and for equal zeros of either sign):
 * one instruction each where GCC makes a compare and two masked moves of
 * the select (~10 % of a direct stride-2 layer, D60). */
static DW_INLINE MRT_TARGET FN(vf) FN(dw_cb_clamp)(FN(vf) v, FN(vf) lo, FN(vf) hi) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && MRT_VL == 16
    return (FN(vf))_mm512_min_ps((__m512)hi, _mm512_max_ps((__m512)lo, (__m512)v));
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && MRT_VL == 8
    return (FN(vf))_mm256_min_ps((__m256)hi, _mm256_max_ps((__m256)lo, (__m256)v));
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && MRT_VL == 4
    return (FN(vf))_mm_min_ps((__m128)hi, _mm_max_ps((__m128)lo, (__m128)v));
#else
    v = FN(vsel)(v < lo, lo, v);
    return FN(vsel)(v > hi, hi, v);
#endif
}

/* The bounds of dw_cb_clamp for a->act (HardSwish: those of its factor). */
static inline MRT_TARGET void FN(dw_cb_clamp_bounds)(const FN(dw_args) *a, FN(vf) *lo, FN(vf) *hi) {
    const FN(vf) zero = {0};
    *lo = zero + (a->act == MRT_ACT_CLIP ? a->a0 : 0.0f);
    *hi = zero + (a->act == MRT_ACT_CLIP ? a->a1 : a->act == MRT_ACT_HARDSWISH ? 1.0f : __builtin_inff());
}

/* The activation on accumulators (a->cb_act, constant here): DW_ACT_CLAMP v clamped to [lo, hi];
 * DW_ACT_HARDSWISH v * h with h = v / 6 + 0.5 clamped to [lo, hi] = [0, 1], the formula of act_row and
 * vact_cheap (the act_row pass it replaces cost 35-40 % of PP-OCR det's 3x3 stride-1 layers). */
static DW_INLINE MRT_TARGET FN(vf) FN(dw_cb_act)(FN(vf) v, FN(vf) lo, FN(vf) hi, const int ACT) {
    if (ACT == DW_ACT_CLAMP) return FN(dw_cb_clamp)(v, lo, hi);
    if (ACT == DW_ACT_HARDSWISH) return v * FN(dw_cb_clamp)(v * (1.0f / 6.0f) + 0.5f, lo, hi);
    return v;
}

/* act_row(y, n, ...) over stored outputs: Relu / Clip / HardSwish as whole vectors of dw_cb_act (the
 * same formulas; act_row's loop took 52 us of PP-OCR det's 16@160 plane-path layer, 105 us without an
 * activation), SiLU / Sigmoid 4 vectors at a time with their exponentials side by side (FN(vact_group),
 * the GEMM epilogue's, on every float: EfficientNet's 32@112x112 SiLU layer 1.0-1.1 -> 0.65 ms on AVX2),
 * the last floats of the others and other activations by act_row. */
static inline MRT_TARGET void FN(dw_act_rows)(float *y, long n, int act, float a0, float a1) {
    const FN(vf) zero = {0};
    long i = 0;
#if MRT_VL == 8 && defined(MRT_HAVE_AVX2_BUILD)
    if ((act == MRT_ACT_SILU || act == MRT_ACT_SIGMOID) && dw_act_rows_wide) { /* (AVX-512: 16 lanes, see kernels.c) */
        dw_act_rows_wide(y, n, act, a0, a1);
        return;
    }
#endif
    if (act == MRT_ACT_SILU || act == MRT_ACT_SIGMOID) {
        for (; i + 4 * MRT_VL <= n; i += 4 * MRT_VL) {
            FN(vf) v[4];
            for (int j = 0; j < 4; ++j) v[j] = FN(vload)(y + i + j * MRT_VL);
            FN(vact_group)(v, 4, act, a0, a1);
            for (int j = 0; j < 4; ++j) FN(vstore)(y + i + j * MRT_VL, v[j]);
        }
        for (; i < n; i += MRT_VL) { /* (the last floats too: every output the same formula, wherever
                                       * a work item's rows end) */
            const int len = n - i < MRT_VL ? (int)(n - i) : MRT_VL;
            FN(vf) v = FN(vload_n)(y + i, len);
            FN(vact_group)(&v, 1, act, a0, a1);
            FN(vstore_n)(y + i, v, len);
        }
        return;
    } else if (act == MRT_ACT_HARDSWISH) {
        for (; i + MRT_VL <= n; i += MRT_VL)
            FN(vstore)(y + i, FN(dw_cb_act)(FN(vload)(y + i), zero, zero + 1.0f, DW_ACT_HARDSWISH));
    } else if (act == MRT_ACT_RELU || act == MRT_ACT_CLIP) {
        const FN(vf) lo = zero + (act == MRT_ACT_CLIP ? a0 : 0.0f);
        const FN(vf) hi = zero + (act == MRT_ACT_CLIP ? a1 : __builtin_inff());
        for (; i + MRT_VL <= n; i += MRT_VL) FN(vstore)(y + i, FN(dw_cb_clamp)(FN(vload)(y + i), lo, hi));
    }
    if (i < n) FN(act_row)(y + i, n - i, act, a0, a1);
}

/* RB output pixels ox.. of one row from the band rows in[ky] of its kernel
 * rows: constant K x K kernel, stride S, no dilation, activation ACT
 * (dw_cb_act).  Each kernel row loads its (RB - 1) * S + K input pixels once
 * for all RB outputs. */
static DW_INLINE MRT_TARGET void FN(dw_cb_pixels)(const float *const *in, const FN(vf) *wv, FN(vf) bv, FN(vf) lo,
                                                  FN(vf) hi, float *out, int ox, const int K, const int S,
                                                  const int RB, const int ACT) {
    FN(vf) acc[DW_CB_RB];
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) acc[r] = bv;
#pragma GCC unroll 8
    for (int ky = 0; ky < K; ++ky) {
        const float *row = in[ky] + (long)ox * S * MRT_VL;
        FN(vf) v[(DW_CB_RB - 1) * 2 + 7]; /* S <= 2, K <= 7 */
#pragma GCC unroll 16
        for (int i = 0; i < (RB - 1) * S + K; ++i) v[i] = FN(vload)(row + (long)i * MRT_VL);
#pragma GCC unroll 8
        for (int kx = 0; kx < K; ++kx)
#pragma GCC unroll 8
            for (int r = 0; r < RB; ++r) acc[r] += wv[ky * K + kx] * v[r * S + kx];
    }
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) FN(vstore)(out + (long)(ox + r) * MRT_VL, FN(dw_cb_act)(acc[r], lo, hi, ACT));
}

/* One output row into out[ox * MRT_VL]: unrolled K x K kernel, stride S.
 * DW_CB_RB pixels at a time, then a last block of the 1-3 pixels left.
 * (Moving a last whole block back to end at ow instead recomputed up to 3
 * pixels of 4: 14 % of the multiply-adds of 14-pixel rows, 12 % of 7-pixel
 * rows, where the FMAs bound the layer; docs/decisions.md, D59.) */
static DW_INLINE MRT_TARGET void FN(dw_cb_row_fixed)(const float *const *in, const FN(vf) *wv, FN(vf) bv, FN(vf) lo,
                                                     FN(vf) hi, float *out, int ow, const int K, const int S,
                                                     const int ACT) {
    int ox = 0;
    for (; ox + DW_CB_RB <= ow; ox += DW_CB_RB) FN(dw_cb_pixels)(in, wv, bv, lo, hi, out, ox, K, S, DW_CB_RB, ACT);
    switch (ow - ox) { /* DW_CB_RB is 4 */
    case 3: FN(dw_cb_pixels)(in, wv, bv, lo, hi, out, ox, K, S, 3, ACT); break;
    case 2: FN(dw_cb_pixels)(in, wv, bv, lo, hi, out, ox, K, S, 2, ACT); break;
    case 1: FN(dw_cb_pixels)(in, wv, bv, lo, hi, out, ox, K, S, 1, ACT); break;
    default: break;
    }
}

/* in[ky] = the band row of kernel row ky of an output row whose top row is
 * in slot `slot` (padded row r sits in slot (r - r0) % cb_span). */
static inline MRT_TARGET void FN(dw_cb_kernel_rows)(const FN(dw_args) *a, const float *band, int slot,
                                                    const float **in) {
    const long rs = a->cb_wp * MRT_VL;
    for (int ky = 0; ky < a->kh; ++ky) {
        in[ky] = band + (long)slot * rs;
        slot += a->dh;
        if (slot >= a->cb_span) slot -= a->cb_span; /* dh < cb_span whenever a next kernel row exists */
    }
}

/* The slot of the top row of the output row after the one whose top row is in slot. */
static inline MRT_TARGET int FN(dw_cb_next_slot)(const FN(dw_args) *a, int slot) {
    slot += a->sh;
    return slot < a->cb_span ? slot : slot % a->cb_span;
}

/* Output rows [oy_a, oy_b) into out (row oy at (oy - oy_a) * ow vectors),
 * unrolled K x K kernel and stride S, activation ACT (a->cb_act); the
 * weights stay in registers across the rows. */
static DW_INLINE MRT_TARGET void FN(dw_cb_rows_fixed)(const FN(dw_args) *a, const float *band, int r0, int oy_a,
                                                      int oy_b, const FN(vf) *wv, FN(vf) bv, float *out, const int K,
                                                      const int S, const int ACT) {
    const long rs = a->cb_wp * MRT_VL;
    FN(vf) lo = {0}, hi = {0};
    if (ACT) FN(dw_cb_clamp_bounds)(a, &lo, &hi);
    int slot = (oy_a * S - r0) % a->cb_span;
    for (int oy = oy_a; oy < oy_b; ++oy, slot = FN(dw_cb_next_slot)(a, slot)) {
        const float *in[7]; /* K <= 7; no dilation: consecutive slots */
#pragma GCC unroll 8
        for (int ky = 0; ky < K; ++ky)
            in[ky] = band + (long)(slot + ky < a->cb_span ? slot + ky : slot + ky - a->cb_span) * rs;
        FN(dw_cb_row_fixed)(in, wv, bv, lo, hi, out + (long)(oy - oy_a) * a->ow * MRT_VL, a->ow, K, S, ACT);
    }
}

/* The same for any kernel, stride and dilation, one output pixel at a time
 * (in: kh row pointers of scratch). */
static MRT_TARGET void FN(dw_cb_rows_generic)(const FN(dw_args) *a, const float *band, int r0, int oy_a, int oy_b,
                                              const FN(vf) *wv, FN(vf) bv, float *out, const float **in) {
    const int kh = a->kh, kw = a->kw, ow = a->ow;
    FN(vf) lo, hi;
    FN(dw_cb_clamp_bounds)(a, &lo, &hi);
    int slot = (oy_a * a->sh - r0) % a->cb_span;
    for (int oy = oy_a; oy < oy_b; ++oy, slot = FN(dw_cb_next_slot)(a, slot)) {
        FN(dw_cb_kernel_rows)(a, band, slot, in);
        float *o = out + (long)(oy - oy_a) * ow * MRT_VL;
        for (int ox = 0; ox < ow; ++ox) {
            FN(vf) acc = bv;
            for (int ky = 0; ky < kh; ++ky) {
                const float *row = in[ky] + (long)ox * a->sw * MRT_VL;
                for (int kx = 0; kx < kw; ++kx) acc += wv[ky * kw + kx] * FN(vload)(row + (long)kx * a->dw * MRT_VL);
            }
            FN(vstore)(o + (long)ox * MRT_VL, a->cb_act == DW_ACT_CLAMP      ? FN(dw_cb_act)(acc, lo, hi, DW_ACT_CLAMP)
                                              : a->cb_act == DW_ACT_HARDSWISH ? FN(dw_cb_act)(acc, lo, hi, DW_ACT_HARDSWISH)
                                                                              : acc);
        }
    }
}

/* Output rows [oy_a, oy_b) from the band into out. */
static MRT_TARGET void FN(dw_cb_rows)(const FN(dw_args) *a, const float *band, int r0, int oy_a, int oy_b,
                                      const FN(vf) *wv, FN(vf) bv, float *out, const float **in) {
    if (!a->fixed) {
        FN(dw_cb_rows_generic)(a, band, r0, oy_a, oy_b, wv, bv, out, in);
        return;
    }
    FN(vf) wk[49]; /* a local copy: stores to out cannot alias it, so the weights stay in registers */
    for (int t = 0; t < a->kh * a->kw; ++t) wk[t] = wv[t];
    /* kernel, stride, activation (HardSwish up to 5x5) */
    switch ((a->kh * 10 + a->sh) * 3 + a->cb_act) {
    case 93: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 3, 1, 0); break;
    case 94: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 3, 1, DW_ACT_CLAMP); break;
    case 95: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 3, 1, DW_ACT_HARDSWISH); break;
    case 96: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 3, 2, 0); break;
    case 97: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 3, 2, DW_ACT_CLAMP); break;
    case 98: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 3, 2, DW_ACT_HARDSWISH); break;
    case 153: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 5, 1, 0); break;
    case 154: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 5, 1, DW_ACT_CLAMP); break;
    case 155: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 5, 1, DW_ACT_HARDSWISH); break;
    case 156: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 5, 2, 0); break;
    case 157: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 5, 2, DW_ACT_CLAMP); break;
    case 158: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 5, 2, DW_ACT_HARDSWISH); break;
    case 213: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 7, 1, 0); break;
    case 214: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 7, 1, DW_ACT_CLAMP); break;
    case 216: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 7, 2, 0); break;
    default: FN(dw_cb_rows_fixed)(a, band, r0, oy_a, oy_b, wk, bv, out, 7, 2, DW_ACT_CLAMP); break;
    }
}

/* Padded rows [r, r + count) of the block into consecutive band slots from
 * dst (the slot of row r): zeros for rows of vertical padding, the
 * transposed input otherwise. */
static DW_INLINE MRT_TARGET void FN(dw_cb_fill)(const FN(dw_args) *a, const float *const *xl, int r, int count,
                                                 float *dst, const int chunks) {
    const long rs = a->cb_wp * MRT_VL;
    const FN(vf) zero = {0};
    for (int i = 0; i < count; ++i)
        if (r + i - a->pt < 0 || r + i - a->pt >= a->h)
            for (long j = (long)a->pl * MRT_VL; j < (long)(a->pl + a->wd) * MRT_VL; j += MRT_VL)
                FN(vstore)(dst + i * rs + j, zero);
    const int iy0 = r - a->pt > 0 ? r - a->pt : 0, iy1 = r + count - a->pt < a->h ? r + count - a->pt : a->h;
    if (iy0 < iy1)
        FN(dw_cb_fill_rows)(xl, a->wd, a->cb_wp, iy0, iy1, dst + (iy0 + a->pt - r) * rs + (long)a->pl * MRT_VL, chunks);
}

/* Output rows [oy0, oy1) of the block from out (their pixels, from row oy0):
 * activation, transpose into the planes yl, residual. */
static DW_INLINE MRT_TARGET void FN(dw_cb_finish)(const FN(dw_args) *a, float *out, int oy0, int oy1,
                                                   float *const *yl, const float *const *zl, int nch) {
    const long p0 = (long)oy0 * a->ow, len = (long)(oy1 - oy0) * a->ow;
    if (a->act && !a->z && !a->cb_act) FN(dw_act_rows)(out, len * MRT_VL, a->act, a->a0, a->a1);
    FN(dw_cb_store)(out, p0, p0 + len, yl, nch);
    if (a->z)
        for (int l = 0; l < nch; ++l) FN(dw_residual_act)(a, yl[l] + p0, zl[l] + p0, len);
}

/* Work item p: output rows [oy0, oy1) of one block of MRT_VL channels of one
 * image.  band: cb_span padded input rows; out: output pixels; wv: kh * kw
 * vectors for the per-lane weights; in: kh row pointers.
 *
 * Two ways to walk the rows (dwconv2d picks): when cb_ring is 0, all input
 * rows of the item are transposed into the band first, then every output
 * row is computed into out and all are stored together (small planes: the
 * transposes and stores see as many pixels at once as possible).  With
 * cb_ring, the band is a ring of cb_span rows (slot = (row - r0) % cb_span),
 * each input row is transposed once just before the first output row that
 * needs it, and the output rows are stored a few at a time as they are
 * computed, so the band and out stay in L1 however large the plane.  Input
 * rows are transposed in groups (cb_ring_rows, a multiple of the stride;
 * cb_span a multiple of it, so a group has consecutive slots): the rows of a
 * group are contiguous in the planes, so two 56-pixel rows are 7 groups of
 * MRT_VL pixels where two single rows were 8 (the last group of each moved
 * back), and with stride 2 there is one fill per output row.  For the same
 * reason the output rows go into the planes cb_out_rows at a time (two
 * 56-pixel rows, four of 28). */
static MRT_TARGET void FN(dw_cb_item)(const FN(dw_args) *a, long p, float *band, float *out, FN(vf) *wv,
                                      const float **in) {
    const int c = a->c, kh = a->kh, kw = a->kw, oh = a->oh, ow = a->ow;
    const long block = p % a->nitems; /* image * nblocks + channel block */
    const long img = block / a->nblocks;
    const int ch0 = (int)(block % a->nblocks) * MRT_VL;
    const int nch = c - ch0 < MRT_VL ? c - ch0 : MRT_VL;
    const int oy0 = (int)(p / a->nitems) * a->band_rows;
    const int oy1 = oy0 + a->band_rows < oh ? oy0 + a->band_rows : oh;
    const float *xl[MRT_VL], *zl[MRT_VL];
    float *yl[MRT_VL];
    float wlane[MRT_VL], blane[MRT_VL];
    int chl[MRT_VL];
    for (int l = 0; l < MRT_VL; ++l) {
        chl[l] = ch0 + (l < nch ? l : nch - 1);
        xl[l] = a->x + (img * c + chl[l]) * a->h * a->wd;
        yl[l] = a->y + (img * c + chl[l]) * oh * ow;
        zl[l] = a->z ? a->z + (img * c + chl[l]) * oh * ow : NULL;
        blane[l] = a->bias ? a->bias[chl[l]] : 0.0f;
    }
    for (int t = 0; t < kh * kw; ++t) {
        for (int l = 0; l < MRT_VL; ++l) wlane[l] = a->w[(long)chl[l] * kh * kw + t];
        wv[t] = FN(vload)(wlane);
    }
    const FN(vf) bv = FN(vload)(blane);
    const long rs = a->cb_wp * MRT_VL;
    const int r0 = oy0 * a->sh; /* the first padded input row */
    if (!a->cb_ring) {
        FN(dw_cb_fill)(a, xl, r0, (oy1 - 1) * a->sh + (kh - 1) * a->dh + 1 - r0, band, 0);
        FN(dw_cb_rows)(a, band, r0, oy0, oy1, wv, bv, out, in);
        FN(dw_cb_finish)(a, out, oy0, oy1, yl, zl, nch);
        return;
    }
    const int step = a->cb_ring_rows;
    int next = r0; /* the next padded row to transpose (r0 + a multiple of step) */
    for (int oy = oy0; oy < oy1; ++oy) {
        if (next < oy * a->sh) next = oy * a->sh; /* rows between the windows (stride > kernel; step 1) are not read */
        for (const int last = oy * a->sh + (kh - 1) * a->dh; next <= last; next += step)
            if (a->cb_chunks)
                FN(dw_cb_fill)(a, xl, next, step, band + (long)((next - r0) % a->cb_span) * rs, 1);
            else
                FN(dw_cb_fill)(a, xl, next, step, band + (long)((next - r0) % a->cb_span) * rs, 0);
        const int held = (oy - oy0) % a->cb_out_rows; /* output rows computed before this one, not yet stored */
        FN(dw_cb_rows)(a, band, r0, oy, oy + 1, wv, bv, out + (long)held * ow * MRT_VL, in);
        if (held + 1 == a->cb_out_rows || oy + 1 == oy1) FN(dw_cb_finish)(a, out, oy - held, oy + 1, yl, zl, nch);
    }
}

static MRT_TARGET void FN(dw_cb_task)(void *ctx, long begin, long end) {
    const FN(dw_args) *a = (const FN(dw_args) *)ctx;
    const long rs = a->cb_wp * MRT_VL;
    const long band_floats = (long)a->cb_span * rs;
    const long out_floats = (long)(a->cb_ring ? a->cb_out_rows : a->band_rows) * a->ow * MRT_VL;
    const long kk = (long)a->kh * a->kw;
    /* band, output pixels, weight vectors (each a multiple of MRT_VL floats: all stay vector-aligned), row pointers */
    float *band = (float *)mrt_pack_buffer(sizeof(float) * (size_t)(band_floats + out_floats + kk * MRT_VL) +
                                           sizeof(float *) * (size_t)a->kh);
    if (!band) return;
    float *out = band + band_floats;
    FN(vf) *wv = (FN(vf) *)(out + out_floats);
    const float **in = (const float **)(out + out_floats + kk * MRT_VL);
    const FN(vf) zero = {0};
    for (float *row = band; row < band + band_floats; row += rs) { /* the margins, once */
        for (long j = 0; j < (long)a->pl * MRT_VL; j += MRT_VL) FN(vstore)(row + j, zero);
        for (long j = (long)(a->pl + a->wd) * MRT_VL; j < rs; j += MRT_VL) FN(vstore)(row + j, zero);
    }
    for (long p = begin; p < end; ++p) FN(dw_cb_item)(a, p, band, out, wv, in);
}

/* ------------------------------------------------------------------ direct stride-2 path
 *
 * 3x3, stride 2, no dilation, padded by one column on the left, float, 8 or
 * 16 lanes (dw_use_direct_s2 says where it measured faster): vectors run
 * along the output columns of one plane as on the plane path, but the taps
 * are read straight from x, with no band copy and no transposes.  For output
 * columns ox..ox + MRT_VL - 1 the two vectors of an input row at column
 * c0 = 2 * ox are split into their even and odd floats (dw_even / dw_odd: one
 * in-lane shuffle each; the output columns stay in their permuted order until
 * dw_unperm at the store).  Output column ox + i reads input columns
 * c0 - 1 + 2i, c0 + 2i and c0 + 1 + 2i: the odd floats moved up by one
 * column with column c0 - 1 broadcast into the first (one two-source
 * permute), the even floats, the odd floats.  Per input row and vector: 2
 * loads, 2 shuffles, 1 broadcast and 1 permute, and the FMAs of every output
 * row of the block that uses the row.
 *
 * A block is DW_S2_R output rows x 2 vectors of columns: its 8 sums of 9
 * FMAs each are independent chains, enough to hide the FMA latency (one
 * vector x 4 rows measured 16 cycles per output vector in a loop, 2 x 4
 * 8.5).  A row (ow >= MRT_VL) is covered by vectors in pairs, the last moved
 * back to end at ow (56 columns: 0-31, then 32-47 and 40-55), so every
 * store is a whole vector within its row.
 *
 * Borders: rows of vertical padding read a row of zeros (per-thread
 * scratch); the first vector of a row takes column -1 from zeros; only a
 * vector whose reads pass the end of its row (RIGHT) zeroes the columns
 * >= wd, and then never reads past the end of x.  Sums are taken in the
 * plane path's order (bias, taps by row then column), so every path gives
 * the same floats.
 */
#if MRT_VL >= 8
/* On vectors whose lanes hold output columns in the order of dw_even, the lanes of a:b (b a broadcast)
 * for the output column before each lane's, b for column 0. */
#if MRT_VL == 8
#define DW_S2_BEHIND 8, 0, 5, 2, 1, 4, 3, 6
#else
#define DW_S2_BEHIND 16, 0, 13, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14
#endif
/* Output rows per block of the direct stride-2 path (a plane's last 1-3 rows go one at a time). */
#define DW_S2_R 4

/* row[c0 .. c0 + MRT_VL) as a vector with the columns >= wd zero, reading nothing past end. */
static inline MRT_TARGET FN(vf) FN(dw_s2_load_edge)(const float *row, long c0, int wd, const float *end) {
    const FN(vf) zero = {0};
    const long n = wd - c0;
    if (n <= 0) return zero;
    if (n >= MRT_VL) return FN(vload)(row + c0);
    if ((uintptr_t)(row + c0 + MRT_VL) <= (uintptr_t)end) return FN(dw_first)(FN(vload)(row + c0), (int)n);
    return FN(vload_n)(row + c0, (int)n);
}

/* t[kx], the taps of one input row for output columns ox.. (c0 = 2 * ox), in dw_even's lane order:
 * the lane of column i holds row[c0 + kx - 1 + 2 * i].  before: where column c0 - 1 is read from
 * (before[-1]: row + c0, or zeros for the first vector of a row).  RIGHT: the reads (columns
 * c0 .. c0 + 2 * MRT_VL) may pass wd, so those columns are zeroed. */
static DW_INLINE MRT_TARGET void FN(dw_s2_taps)(const float *row, long c0, const float *before, int wd,
                                                const float *end, FN(vf) *t, const int RIGHT) {
    const FN(vf) zero = {0};
    const FN(vf) lo = RIGHT ? FN(dw_s2_load_edge)(row, c0, wd, end) : FN(vload)(row + c0);
    const FN(vf) hi = RIGHT ? FN(dw_s2_load_edge)(row, c0 + MRT_VL, wd, end) : FN(vload)(row + c0 + MRT_VL);
    const FN(vf) odd = FN(dw_odd)(lo, hi);
    /* (s - zero: a broadcast; zero + s is not folded, -0 + 0 being +0) */
    t[0] = DW_SHUFFLE2(odd, before[-1] - zero, DW_S2_BEHIND);
    t[1] = FN(dw_even)(lo, hi);
    t[2] = odd;
}

/* Output columns ox[c].. (c < NC, NC <= 2) of R output rows y[r * ow + ...] from the input rows
 * rows[0 .. 2 * R + 1) (rows[j]: the row of kernel row j - 2 * r of output row r), unrolled for
 * constant R, NC, ACT (the activation on the accumulators, dw_cb_act) and RIGHT (the last vector's
 * reads may pass the row's end); zeros: 2 floats of zeros, column -1 for the first vector of a row. */
static DW_INLINE MRT_TARGET void FN(dw_s2_vectors)(const FN(dw_args) *a, const float *const *rows, const float *zeros,
                                                   const FN(vf) *wv, FN(vf) bv, FN(vf) lo, FN(vf) hi, float *y,
                                                   const int *ox, const int R, const int NC, const int ACT,
                                                   const int RIGHT) {
    FN(vf) acc[2][DW_S2_R]; /* NC <= 2, R <= DW_S2_R */
#pragma GCC unroll 2
    for (int c = 0; c < NC; ++c)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[c][r] = bv;
#pragma GCC unroll 16
    for (int j = 0; j < 2 * R + 1; ++j) {
#pragma GCC unroll 2
        for (int c = 0; c < NC; ++c) {
            const long c0 = 2L * ox[c];
            FN(vf) t[3];
            FN(dw_s2_taps)(rows[j], c0, ox[c] ? rows[j] + c0 : zeros + 1, a->wd, a->x_end, t, RIGHT && c == NC - 1);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const int ky = j - 2 * r;
                if (ky < 0 || ky >= 3) continue;
#pragma GCC unroll 4
                for (int kx = 0; kx < 3; ++kx) acc[c][r] += wv[ky * 3 + kx] * t[kx];
            }
        }
    }
#pragma GCC unroll 2
    for (int c = 0; c < NC; ++c)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
            FN(vstore)(y + (long)r * a->ow + ox[c], FN(dw_unperm)(FN(dw_cb_act)(acc[c][r], lo, hi, ACT)));
}

/* dw_s2_vectors over R whole output rows, for constant R and ACT, each its own function: inlined
 * into one, the unrolled variants kept the loaded rows on the stack (GCC's register allocation over
 * the whole function; 32@112 1.5x the time). */
#define DW_S2_BLOCK_FN(R, ACT)                                                                              \
    static __attribute__((noinline)) MRT_TARGET void FN(dw_s2_block_##R##_##ACT)(                            \
        const FN(dw_args) *a, const float *const *rows, const float *zeros, const FN(vf) *wv, FN(vf) bv,           \
        FN(vf) lo, FN(vf) hi, float *y) {                                                                      \
        const int ow = a->ow;                                                                                   \
        for (int ox0 = 0; ox0 < ow; ox0 += 2 * MRT_VL) {                                                        \
            int ox[2]; /* vectors of MRT_VL columns in pairs, the last moved back to end at ow */              \
            ox[0] = ox0 + MRT_VL > ow ? ow - MRT_VL : ox0;                                                      \
            ox[1] = ox0 + 2 * MRT_VL > ow ? ow - MRT_VL : ox0 + MRT_VL; /* when ox0 + MRT_VL < ow */           \
            const int pair = ox0 + MRT_VL < ow, right = 2L * ox[pair] + 2 * MRT_VL > a->wd;                     \
            if (pair && right)                                                                                  \
                FN(dw_s2_vectors)(a, rows, zeros, wv, bv, lo, hi, y, ox, R, 2, ACT, 1);                       \
            else if (pair)                                                                                      \
                FN(dw_s2_vectors)(a, rows, zeros, wv, bv, lo, hi, y, ox, R, 2, ACT, 0);                       \
            else if (right)                                                                                     \
                FN(dw_s2_vectors)(a, rows, zeros, wv, bv, lo, hi, y, ox, R, 1, ACT, 1);                       \
            else                                                                                                \
                FN(dw_s2_vectors)(a, rows, zeros, wv, bv, lo, hi, y, ox, R, 1, ACT, 0);                       \
        }                                                                                                       \
    }
/* Output rows [oy0, oy1) of plane xp into yp (output row oy0), DW_S2_R rows at a time, then one. */
#define DW_S2_ROWS_FN(ACT)                                                                                  \
    DW_S2_BLOCK_FN(4, ACT)                                                                                  \
    DW_S2_BLOCK_FN(1, ACT)                                                                                  \
    static MRT_TARGET void FN(dw_s2_rows_##ACT)(const FN(dw_args) *a, const float *xp, const float *zero_row,    \
                                                 const FN(vf) *wv, FN(vf) bv, float *yp, int oy0, int oy1) {    \
        FN(vf) lo = {0}, hi = {0};                                                                              \
        if (ACT) FN(dw_cb_clamp_bounds)(a, &lo, &hi);                                                         \
        const float *rows[2 * DW_S2_R + 1];                                                                     \
        for (int oy = oy0; oy < oy1;) {                                                                         \
            const int R = oy1 - oy >= DW_S2_R ? DW_S2_R : 1;                                                    \
            for (int j = 0; j < 2 * R + 1; ++j) {                                                               \
                const int iy = 2 * oy - a->pt + j;                                                              \
                rows[j] = iy >= 0 && iy < a->h ? xp + (long)iy * a->wd : zero_row;                              \
            }                                                                                                   \
            float *y = yp + (long)(oy - oy0) * a->ow;                                                           \
            if (R == DW_S2_R)                                                                                   \
                FN(dw_s2_block_4_##ACT)(a, rows, zero_row, wv, bv, lo, hi, y);                                \
            else                                                                                                \
                FN(dw_s2_block_1_##ACT)(a, rows, zero_row, wv, bv, lo, hi, y);                                \
            oy += R;                                                                                            \
        }                                                                                                       \
    }
DW_S2_ROWS_FN(0)
DW_S2_ROWS_FN(1)
DW_S2_ROWS_FN(2)
#undef DW_S2_ROWS_FN
#undef DW_S2_BLOCK_FN

/* Work item p (output rows of one plane, as on the plane path) of the direct stride-2 path. */
static MRT_TARGET void FN(dw_s2_item)(const FN(dw_args) *a, long p, const float *zero_row) {
    const int oh = a->oh, ow = a->ow;
    const long plane = p % a->nitems;
    const int ch = (int)(plane % a->c);
    const int oy0 = (int)(p / a->nitems) * a->band_rows;
    const int oy1 = oy0 + a->band_rows < oh ? oy0 + a->band_rows : oh;
    const float *xp = a->x + plane * a->h * a->wd;
    const long first = plane * oh * ow + (long)oy0 * ow; /* output row oy0 */
    float *yp = a->y + first;
    const FN(vf) zero = {0};
    FN(vf) wv[9];
    for (int i = 0; i < 9; ++i) wv[i] = zero + a->w[(long)ch * 9 + i];
    const FN(vf) bv = zero + (a->bias ? a->bias[ch] : 0.0f);
    if (a->cb_act == DW_ACT_CLAMP)
        FN(dw_s2_rows_1)(a, xp, zero_row, wv, bv, yp, oy0, oy1);
    else if (a->cb_act == DW_ACT_HARDSWISH)
        FN(dw_s2_rows_2)(a, xp, zero_row, wv, bv, yp, oy0, oy1);
    else
        FN(dw_s2_rows_0)(a, xp, zero_row, wv, bv, yp, oy0, oy1);
    const long len = (long)(oy1 - oy0) * ow;
    if (a->z)
        FN(dw_residual_act)(a, yp, a->z + first, len);
    else if (a->act && !a->cb_act)
        FN(dw_act_rows)(yp, len, a->act, a->a0, a->a1);
}

static MRT_TARGET void FN(dw_s2_task)(void *ctx, long begin, long end) {
    const FN(dw_args) *a = (const FN(dw_args) *)ctx;
    /* the row of zeros: a row's reads stay below column max(wd, 2 * ow) + MRT_VL (the last vector's) */
    const long n = (a->wd > 2L * a->ow ? a->wd : 2L * a->ow) + 2L * MRT_VL;
    float *zero_row = (float *)mrt_pack_buffer(sizeof(float) * (size_t)n);
    if (!zero_row) return;
    memset(zero_row, 0, sizeof(float) * (size_t)n);
    for (long p = begin; p < end; ++p) FN(dw_s2_item)(a, p, zero_row);
}
#undef DW_S2_BEHIND
#undef DW_S2_R
#endif /* MRT_VL >= 8 */

/* The channel-blocked path for an output plane of oh x ow?  Measured per
 * layer on this x86 host at each vector width (docs/decisions.md, D44):
 * with 16 lanes it is faster than the plane path for every MobileNet and
 * PP-OCR shape, except when the output planes of a block start at the same
 * offset in a 4 KB page (128x128, 160x160: 16 stores to one L1 set, which
 * has 12 ways), so more than 8 planes per offset keep the plane path.  With
 * 8 lanes it pays up to 32x32 outputs, with 4 (SSE2; NEON not measured) only
 * for the 7x7 planes. */
static int FN(dw_use_blocked)(int oh, int ow) {
    const long pixels = (long)oh * ow;
#if MRT_VL >= 16
    const long plane_bytes = pixels * (long)sizeof(float);
    const long align = plane_bytes & -plane_bytes; /* planes l * plane_bytes fall on 4096 / align offsets */
    const long offsets = align >= 4096 ? 1 : 4096 / align;
    const long planes_per_offset = offsets >= MRT_VL ? 1 : MRT_VL / offsets;
    return planes_per_offset <= 8;
#elif MRT_VL == 8
    return pixels <= 32 * 32;
#else
    return pixels <= 8 * 8;
#endif
}

/* The direct stride-2 path for this geometry (float)?  Measured per layer on this x86 host against the
 * channel-blocked and plane paths (docs/decisions.md, D60): faster from one whole vector of
 * output columns per row (16 lanes: MobileNet's 32@112 and 64@56 0.64x and 0.70x, PP-OCR det's
 * 32@160 0.65x, 48@80 0.78x, 96@40 0.9x; 8 lanes: 0.55-0.9x from 14 columns), not below (whole vectors
 * on half-empty rows).  Not with 4 lanes (SSE2 was 0.75x from 14 columns, but NEON, which compiles the
 * same code, was not measured); 5x5 was as fast as the channel blocks or slower (25 weights and 8 sums
 * do not fit the registers). */
static int FN(dw_use_direct_s2)(int kh, int kw, int sh, int sw, int dh, int dw, int pl, int ow) {
    return MRT_VL >= 8 && ow >= MRT_VL && kh == 3 && kw == 3 && sh == 2 && sw == 2 && dh == 1 && dw == 1 && pl == 1;
}

/* Rows of a ring (dw_cb_item) filled `step` rows at a time for windows of `span` rows every `sh` rows.
 * It holds the rows of the current window and those filled ahead of it with the window's last row:
 * groups of step rows start at the band's first row and take consecutive slots (so the ring is a
 * multiple of step), windows start at offsets u = 0, sh, ... in their group, and from there to the end
 * of the group of the window's last row is in use. */
static int FN(dw_cb_ring_span)(int step, int sh, int span) {
    int rows = step;
    for (int u = 0; u < step; u += sh) {
        const int in_use = (u + span + step - 1) / step * step - u;
        if (in_use > rows) rows = (in_use + step - 1) / step * step;
    }
    return rows;
}

/* Geometry (fixed, ps, bands) of a filled-in FN(dw_args) for n images, and the run. */
static void FN(dw_run)(FN(dw_args) *ap, int n, int nthreads) {
    FN(dw_args) a = *ap;
    const int c = a.c, wd = a.wd, kh = a.kh, kw = a.kw, sh = a.sh, sw = a.sw, dh = a.dh, dw = a.dw;
    const int pl = a.pl, oh = a.oh, ow = a.ow;
    const long planes = (long)n * c;
    a.fixed = kh == kw && (kh == 3 || kh == 5 || kh == 7) && sh == sw && (sh == 1 || sh == 2) && dh == 1 && dw == 1;
    /* int8 stays on the plane path: the channel-blocked fill, bias and epilogue are float only
     * (and on VNNI hosts most int8 layers take qdwconv_vnni.h anyway; docs/decisions.md, D46) */
    a.direct_s2 = !a.scale && FN(dw_use_direct_s2)(kh, kw, sh, sw, dh, dw, pl, ow);
    a.blocked = !a.scale && !a.direct_s2 && FN(dw_use_blocked)(oh, ow);
    a.cb_act = (!a.blocked && !a.direct_s2) || a.z                   ? 0
               : a.act == MRT_ACT_RELU || a.act == MRT_ACT_CLIP       ? DW_ACT_CLAMP
               : a.act == MRT_ACT_HARDSWISH && kh <= 5                ? DW_ACT_HARDSWISH
                                                                      : 0;
    long items, band; /* work items (threads split them) and output rows per item */
    if (a.direct_s2) {
        items = planes;
        band = oh;
    } else if (a.blocked) {
        /* a band row: the input at column pl and every pixel the last output reads */
        long wp = (long)(ow - 1) * sw + (long)(kw - 1) * dw + 1;
        if (wp < (long)pl + wd) wp = (long)pl + wd;
        a.cb_wp = wp;
        a.nblocks = (c + MRT_VL - 1) / MRT_VL;
        items = (long)n * a.nblocks;
        /* the whole plane's input and output rows in DW_CB_FLOATS, else a ring of input rows when rows are
         * at least a vector wide (the per-row transposes then have whole vectors), else bands of rows that fit */
        const long rs = wp * MRT_VL, span = (long)(kh - 1) * dh + 1;
        a.cb_ring = ((long)(oh - 1) * sh + span) * rs + (long)oh * ow * MRT_VL > DW_CB_FLOATS && wd >= MRT_VL &&
                    ow >= MRT_VL;
        band = a.cb_ring ? oh : (DW_CB_FLOATS - (span - sh) * rs) / (sh * rs + (long)ow * MRT_VL);
        if (band < 1) band = 1;
    } else {
        /* a padded row: the input at column pl, and whole-vector reads at the last output column
         * (stride 2 reads two vectors from 2 * ox + even offset) */
        const long widest = ow > MRT_VL ? ow : MRT_VL;
        long ps = (long)sw * widest + (long)(kw - 1) * dw + 1;
        if (ps < (long)pl + wd) ps = (long)pl + wd;
        ps = (ps + MRT_VL - 1) / MRT_VL * MRT_VL;
        a.ps = ps;
        /* bands of output rows whose padded input fits DW_BAND_FLOATS (at least one block of rows) */
        band = ((long)DW_BAND_FLOATS / ps - (long)(kh - 1) * dh) / sh;
        items = planes;
    }
    if (!a.blocked && !a.direct_s2 && band < DW_R) band = DW_R;
    if (band > oh) band = oh;
    /* with few items, enough bands for every thread (the result does not depend on the split) */
    if (nthreads > 1 && items < 4L * nthreads) {
        long per_item = (4L * nthreads + items - 1) / items;
        long rows = (oh + per_item - 1) / per_item;
        if (rows < band) band = rows;
    }
    /* with threads, at least one band per thread on planes of DW_BAND_SPLIT_PIXELS or more: each
     * thread's share is then rows of the image, the rows the layers before and after (split by pixels)
     * computed on the same thread (the extra input rows a band reads cost less than reading the other
     * core's cache).  Smaller planes are split by channels (blocks): there the bands' extra input rows
     * and per-item work outweighed it, and the 1x1 layer before (one block of columns, split by rows:
     * output channels) wrote the same channels on the same thread.  MobileNetV2 at 2 threads, this
     * host, per native call: the 14 x 14 depthwise layers 60 -> 35-38 us (32.6 at 1 thread), 7 x 7
     * 49 -> 23-29, 28 x 28 58 -> 39-47; the 56 x 56 and 112 x 112 ones 2-10 % faster with bands. */
    if (nthreads > 1 && oh >= 2 * nthreads && (long)oh * ow >= DW_BAND_SPLIT_PIXELS) {
        long rows = (oh + nthreads - 1) / nthreads;
        if (rows < band) band = rows;
    }
    a.band_rows = (int)band;
    a.nbands = (int)((oh + band - 1) / band);
    a.nitems = items;
    const int span = (kh - 1) * dh + 1; /* padded rows one output row reads */
    /* ring rows transposed together: a multiple of the stride, the fewest whose pixels are whole groups of
     * MRT_VL while they stay within 128 pixels and the ring within DW_CB_FLOATS (one 56-pixel row was 4
     * groups for 3.5, two are 7) */
    a.cb_ring_rows = a.cb_ring && sh <= span ? sh : 1;
    if (a.cb_ring && sh <= span)
        while ((long)a.cb_ring_rows * wd % MRT_VL != 0 && (long)(a.cb_ring_rows + sh) * wd <= 128 &&
               (long)FN(dw_cb_ring_span)(a.cb_ring_rows + sh, sh, span) * a.cb_wp * MRT_VL <= DW_CB_FLOATS)
            a.cb_ring_rows += sh;
    /* 16 lanes: whole-vector loads from rows of a multiple of 16 pixels (every group of a row starts where
     * the row does, modulo 64 bytes), chunks otherwise (whole vectors that straddle cache lines measured
     * 2-5 % slower there, 9-14 % faster on rows of 80-160 pixels; docs/decisions.md, D56).  The
     * plane path's rows and 8 lanes always take whole vectors. */
    a.cb_chunks = MRT_VL == 16 && a.cb_ring && wd % MRT_VL != 0;
    /* ring: output rows stored together, the fewest whose pixels are whole groups of MRT_VL (the transposes
     * out then move no group back) while they stay within 128 pixels (out stays small in L1) */
    a.cb_out_rows = 1;
    while (a.cb_ring && (long)a.cb_out_rows * ow % MRT_VL != 0 && (long)(a.cb_out_rows + 1) * ow <= 128) ++a.cb_out_rows;
    a.cb_span = a.cb_ring ? FN(dw_cb_ring_span)(a.cb_ring_rows, sh, span)
                          : (int)((band - 1) * sh + (long)(kh - 1) * dh + 1);
    const long work = band * ow * kh * kw * (a.blocked ? MRT_VL : 1);
#if MRT_VL >= 8
    if (a.direct_s2) {
        mrt_parallel_for(items * a.nbands, work, nthreads, FN(dw_s2_task), &a);
        return;
    }
#endif
    mrt_parallel_for(items * a.nbands, work, nthreads, a.blocked ? FN(dw_cb_task) : FN(dw_task), &a);
}

static void FN(dwconv2d)(const float *x, const float *w, const float *bias, const float *z, float *y, int n, int c,
                         int h, int wd, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int oh, int ow,
                         int act, float a0, float a1, int nthreads) {
    if (oh <= 0 || ow <= 0 || n <= 0 || c <= 0) return;
    FN(dw_args) a = {0};
    a.x = x; a.w = w; a.bias = bias; a.z = z; a.y = y; a.x_end = x + (long)n * c * h * wd;
    a.c = c; a.h = h; a.wd = wd; a.kh = kh; a.kw = kw; a.sh = sh; a.sw = sw; a.dh = dh; a.dw = dw;
    a.pt = pt; a.pl = pl; a.oh = oh; a.ow = ow; a.act = act; a.a0 = a0; a.a1 = a1;
    FN(dw_run)(&a, n, nthreads);
}

/* int8 depthwise conv (see the top of this file and mrt_qdwconv2d in kernels.h). */
static void FN(qdwconv2d)(const q_dw_params *q, int n, int c, int h, int wd, int kh, int kw, int sh, int sw, int dh,
                          int dw, int pt, int pl, int oh, int ow, int nthreads) {
    if (oh <= 0 || ow <= 0 || n <= 0 || c <= 0) return;
    FN(dw_args) a = {0};
    a.x = q->x; a.xq = q->xq; a.w = q->w; a.bias = q->bias; a.y = q->y;
    a.x_end = q->x ? q->x + (long)n * c * h * wd : NULL;
    a.c = c; a.h = h; a.wd = wd; a.kh = kh; a.kw = kw; a.sh = sh; a.sw = sw; a.dh = dh; a.dw = dw;
    a.pt = pt; a.pl = pl; a.oh = oh; a.ow = ow; a.act = q->act; a.a0 = q->a0; a.a1 = q->a1;
    a.xs = q->x_scale; a.xz = q->x_zero; a.scale = q->scale; a.z = q->res;
    a.post_a = q->post_a; a.post_b = q->post_b;
    a.yq = q->yq; a.y_scale = q->y_scale; a.y_zero = (float)q->y_zero;
    FN(dw_run)(&a, n, nthreads);
}

#undef DW_LANES
#undef DW_EVEN_LANES
#undef DW_ODD_LANES
#undef DW_UNPERM_LANES
#undef DW_ZIP1_LO
#undef DW_ZIP1_HI
#undef DW_ZIP2_LO
#undef DW_ZIP2_HI
#undef DW_ZIP4_LO
#undef DW_ZIP4_HI
#undef DW_SHUFFLE2
#undef DW_R
#undef DW_BAND_FLOATS
#undef DW_EXACT_TAPS
#undef DW_CB_RB
#undef DW_ACT_CLAMP
#undef DW_ACT_HARDSWISH
#undef DW_CB_FLOATS
#undef DW_INLINE
