/* Winograd F(2x2, 3x3) convolution of float32 NCHW images (mrt_conv2d_f32 on the geometries of
 * mrt_conv2d_uses_winograd, kernels.c), compiled once per instruction set by float_copy.h after
 * gemm_impl.h (its vector type FN(vf), loads, stores and activations).
 *
 * Each 2 x 2 block of output pixels (a tile) of output channel m is
 *
 *   Y = A^T [ sum_c U(m, c) .* V(c, tile) ] A,   U = G g G^T (4 x 4, from the 3 x 3 weights g),
 *                                                V = B^T d B (4 x 4, from the tile's 4 x 4 input patch d),
 *
 * so the 9 multiply-adds per output and input channel of the direct conv become 16 per 4 outputs:
 * 2.25x fewer.  The sums are 16 matrix products, one per position xi of the 4 x 4 transforms:
 * M_xi (M x tiles) = U_xi (M x C) V_xi (C x tiles).  U is packed once per weight array
 * (mrt_conv2d_winograd_pack_w: [16][M][C] floats, the products' A rows, each value broadcast); V is
 * made per work item into panels of WG_NR tiles ([16][panel][C][WG_NR], the products' B), so that a
 * tile of 6 output channels x WG_NR tiles reads one contiguous stream of B.
 *
 * A work item is a band of tile rows of one image: V of the band (16 x C x tiles floats), the 16
 * products into M, then the output transform with bias, residual and activation, written straight into
 * y.  The bands are sized so that V and M stay within 256 KB each (the L2 of the hosts measured).  Each
 * output depends on its tile's sums alone (every product sums over C in the same blocks of kc channels,
 * a layer's constant, in order, whatever the band, the threads or the batch): the results do not depend
 * on how the work was split.  They differ from the direct conv's in the last bits (other
 * operations), so the geometry rule (mrt_conv2d_uses_winograd) depends on the layer alone.
 *
 * Transforms (F(2, 3), points 0, 1, -1):
 *   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]   G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1]
 *   A^T = [1 1 1 0; 0 1 -1 -1]
 * The input transform runs on MRT_VL tiles of a tile row at a time: their patch columns 2t .. 2t + 3 are
 * the even and odd floats of two consecutive runs of a zero-padded copy of the input row. */

#define WG_INLINE __attribute__((always_inline))
#define WG_MR 6             /* output channels per product tile */
#define WG_NR (2 * MRT_VL)  /* tiles per panel of V */
/* Input channels per block of the products' sums: from WG_KC_ONE channels on, blocks of at most WG_KC (a
 * 512 -> 512 layer's U_xi, 1 MB, was read from L3 for every panel: 1.8x onnxruntime unblocked) */
#define WG_KC 128
#define WG_KC_ONE 256
#define WG_BLOCK_FLOATS 65536 /* at most the floats of V (and of M) per work item: 256 KB each */

#if defined(__clang__)
#define WG_SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define WG_SHUFFLE2(a, b, ...) __builtin_shuffle(a, b, (FN(vi)){__VA_ARGS__})
#endif
/* even / odd floats of a:b in order; the interleave of a and b (lanes a0 b0 a1 b1 ...) as two vectors */
#if MRT_VL == 4
#define WG_EVEN 0, 2, 4, 6
#define WG_ODD 1, 3, 5, 7
#define WG_ZIP_LO 0, 4, 1, 5
#define WG_ZIP_HI 2, 6, 3, 7
#elif MRT_VL == 8
#define WG_EVEN 0, 2, 4, 6, 8, 10, 12, 14
#define WG_ODD 1, 3, 5, 7, 9, 11, 13, 15
#define WG_ZIP_LO 0, 8, 1, 9, 2, 10, 3, 11
#define WG_ZIP_HI 4, 12, 5, 13, 6, 14, 7, 15
#else
#define WG_EVEN 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define WG_ODD 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#define WG_ZIP_LO 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
#define WG_ZIP_HI 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31
#endif

typedef struct {
    const float *x, *u, *bias, *res;
    float *y;
    int n, c, h, w, m, pt, pl, oh, ow;
    int th, tw;   /* tile rows and columns: ceil(oh / 2), ceil(ow / 2) */
    int band;     /* tile rows per work item */
    int bands;    /* work items per image */
    int panels;   /* panels of WG_NR tiles in a band's V */
    int kc;       /* input channels per block of the products' sums */
    long mstride; /* floats per row of M (a band's tiles, rounded up, + MRT_VL for the last vector's over-read) */
    int rowlen;   /* floats of a padded input row */
    int act;
    float a0, a1;
    int failed;   /* a thread found no scratch */
} FN(wg_args);

/* v[0:cnt] into the tiles t0 .. t0 + cnt - 1 of row c of V_xi (vxi: its first panel): they may end
 * in the next panel. */
static inline MRT_TARGET WG_INLINE void FN(wg_put)(float *vxi, int c_count, int c, int t0, int cnt, FN(vf) v) {
    const int p = t0 / WG_NR, l = t0 % WG_NR;
    float *dst = vxi + ((long)p * c_count + c) * WG_NR + l;
    const int first = WG_NR - l < cnt ? WG_NR - l : cnt;
    if (first == cnt) {
        FN(vstore_n)(dst, v, cnt);
        return;
    }
    float t[MRT_VL];
    FN(vstore)(t, v);
    for (int j = 0; j < first; ++j) dst[j] = t[j];
    float *next = vxi + ((long)(p + 1) * c_count + c) * WG_NR;
    for (int j = first; j < cnt; ++j) next[j - first] = t[j];
}

/* V of the tile rows ty0 .. ty0 + nrows - 1 for input channel c (plane xc of the image); rows: scratch
 * for 4 padded input rows. */
static MRT_TARGET void FN(wg_input)(const FN(wg_args) *a, const float *xc, int c, int ty0, int nrows, float *v,
                                    float *rows) {
    const int w = a->w, pl = a->pl, rowlen = a->rowlen, tw = a->tw;
    const long vxi = (long)a->panels * a->c * WG_NR; /* floats of one V_xi */
    float *rp[4]; /* the 4 padded input rows of the current tile row (the last 2 are the next one's first 2) */
    for (int i = 0; i < 4; ++i) rp[i] = rows + (long)i * rowlen;
    for (int r = 0; r < nrows; ++r) {
        const int ty = ty0 + r;
        if (r > 0) { /* rows 2 ty - pt + 0, 1 were the previous tile row's rows 2, 3 */
            float *t0 = rp[0], *t1 = rp[1];
            rp[0] = rp[2], rp[1] = rp[3], rp[2] = t0, rp[3] = t1;
        }
        for (int i = r > 0 ? 2 : 0; i < 4; ++i) { /* row[j] = input column j - pl of row 2 ty - pt + i, zero outside */
            float *row = rp[i];
            const int iy = 2 * ty - a->pt + i;
            if (iy < 0 || iy >= a->h) {
                memset(row, 0, sizeof(float) * (size_t)rowlen);
                continue;
            }
            const int lead = pl < rowlen ? pl : rowlen;
            const int count = w < rowlen - lead ? w : rowlen - lead;
            memset(row, 0, sizeof(float) * (size_t)lead);
            memcpy(row + lead, xc + (long)iy * w, sizeof(float) * (size_t)(count > 0 ? count : 0));
            const int done = lead + (count > 0 ? count : 0);
            memset(row + done, 0, sizeof(float) * (size_t)(rowlen - done));
        }
        for (int tx0 = 0; tx0 < tw; tx0 += MRT_VL) {
            const int cnt = tw - tx0 < MRT_VL ? tw - tx0 : MRT_VL;
            FN(vf) d[4][4], b[4][4];
            for (int i = 0; i < 4; ++i) { /* d[i][q]: patch row i, column q, of the MRT_VL tiles */
                const float *p = rp[i] + 2 * tx0;
                const FN(vf) lo = FN(vload)(p), hi = FN(vload)(p + MRT_VL);
                const FN(vf) lo2 = FN(vload)(p + 2), hi2 = FN(vload)(p + 2 + MRT_VL);
                d[i][0] = WG_SHUFFLE2(lo, hi, WG_EVEN);
                d[i][1] = WG_SHUFFLE2(lo, hi, WG_ODD);
                d[i][2] = WG_SHUFFLE2(lo2, hi2, WG_EVEN);
                d[i][3] = WG_SHUFFLE2(lo2, hi2, WG_ODD);
            }
            for (int q = 0; q < 4; ++q) { /* B^T d */
                b[0][q] = d[0][q] - d[2][q];
                b[1][q] = d[1][q] + d[2][q];
                b[2][q] = d[2][q] - d[1][q];
                b[3][q] = d[1][q] - d[3][q];
            }
            const int t0 = r * tw + tx0;
            for (int i = 0; i < 4; ++i) { /* (B^T d) B, row i: positions xi = 4 i .. 4 i + 3 */
                FN(wg_put)(v + (long)(4 * i) * vxi, a->c, c, t0, cnt, b[i][0] - b[i][2]);
                FN(wg_put)(v + (long)(4 * i + 1) * vxi, a->c, c, t0, cnt, b[i][1] + b[i][2]);
                FN(wg_put)(v + (long)(4 * i + 2) * vxi, a->c, c, t0, cnt, b[i][2] - b[i][1]);
                FN(wg_put)(v + (long)(4 * i + 3) * vxi, a->c, c, t0, cnt, b[i][1] - b[i][3]);
            }
        }
    }
}

/* c (mr rows of WG_NR floats, row stride ldc) = a (mr rows of K, row stride lda) . b (K rows of WG_NR,
 * contiguous); mr a constant <= WG_MR, so the accumulators stay in registers. */
static inline MRT_TARGET WG_INLINE void FN(wg_tile_rows)(const float *a, long lda, const float *b, int K, float *c,
                                                        long ldc, int add, const int mr) {
    FN(vf) acc0[WG_MR], acc1[WG_MR];
#pragma GCC unroll 8
    for (int i = 0; i < mr; ++i) acc0[i] = acc1[i] = (FN(vf)){0};
    for (int k = 0; k < K; ++k, b += WG_NR) {
        const FN(vf) b0 = FN(vload)(b), b1 = FN(vload)(b + MRT_VL);
#pragma GCC unroll 8
        for (int i = 0; i < mr; ++i) {
            const float s = a[i * lda + k];
            acc0[i] += b0 * s;
            acc1[i] += b1 * s;
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; ++i) {
        if (add) { /* (a later block of the sum over C: added to the total of the blocks before it) */
            acc0[i] += FN(vload)(c + i * ldc);
            acc1[i] += FN(vload)(c + i * ldc + MRT_VL);
        }
        FN(vstore)(c + i * ldc, acc0[i]);
        FN(vstore)(c + i * ldc + MRT_VL, acc1[i]);
    }
}

static MRT_TARGET void FN(wg_tile)(const float *a, long lda, const float *b, int K, float *c, long ldc, int add,
                                   int mr) {
    switch (mr) {
    case 6: FN(wg_tile_rows)(a, lda, b, K, c, ldc, add, 6); break;
    case 5: FN(wg_tile_rows)(a, lda, b, K, c, ldc, add, 5); break;
    case 4: FN(wg_tile_rows)(a, lda, b, K, c, ldc, add, 4); break;
    case 3: FN(wg_tile_rows)(a, lda, b, K, c, ldc, add, 3); break;
    case 2: FN(wg_tile_rows)(a, lda, b, K, c, ldc, add, 2); break;
    default: FN(wg_tile_rows)(a, lda, b, K, c, ldc, add, 1); break;
    }
}

/* The output transform of the band's tile rows ty0 .. ty0 + nrows - 1 for every output channel, from M
 * ([16][M][mstride]), with (sum + bias) + residual, then the activation, into the image's output yi
 * (and its residual ri, or NULL). */
static MRT_TARGET void FN(wg_output)(const FN(wg_args) *a, const float *mm, int ty0, int nrows, float *yi,
                                     const float *ri) {
    const int tw = a->tw, oh = a->oh, ow = a->ow, act = a->act;
    const long mxi = (long)a->m * a->mstride; /* floats of one M_xi */
    for (int m = 0; m < a->m; ++m) {
        const FN(vf) bias = ((FN(vf)){0}) + (a->bias ? a->bias[m] : 0.0f);
        const float *mrow = mm + (long)m * a->mstride;
        for (int r = 0; r < nrows; ++r) {
            const int ty = ty0 + r;
            for (int tx0 = 0; tx0 < tw; tx0 += MRT_VL) {
                const float *q = mrow + (long)r * tw + tx0;
                FN(vf) s[4][4], t[2][4];
                for (int i = 0; i < 4; ++i)
                    for (int j = 0; j < 4; ++j) s[i][j] = FN(vload)(q + (long)(4 * i + j) * mxi);
                for (int j = 0; j < 4; ++j) { /* A^T s */
                    t[0][j] = s[0][j] + s[1][j] + s[2][j];
                    t[1][j] = s[1][j] - s[2][j] - s[3][j];
                }
                const int ox0 = 2 * tx0, cols = ow - ox0 < 2 * MRT_VL ? ow - ox0 : 2 * MRT_VL;
                const int n0 = cols < MRT_VL ? cols : MRT_VL, n1 = cols - n0;
                for (int i = 0; i < 2 && 2 * ty + i < oh; ++i) { /* (A^T s) A: output row 2 ty + i */
                    const FN(vf) even = t[i][0] + t[i][1] + t[i][2], odd = t[i][1] - t[i][2] - t[i][3];
                    FN(vf) lo = WG_SHUFFLE2(even, odd, WG_ZIP_LO) + bias, hi = WG_SHUFFLE2(even, odd, WG_ZIP_HI) + bias;
                    const long at = ((long)m * oh + 2 * ty + i) * ow + ox0;
                    if (ri) {
                        lo += FN(vload_n)(ri + at, n0);
                        if (n1 > 0) hi += FN(vload_n)(ri + at + MRT_VL, n1);
                    }
                    FN(vstore_n)(yi + at, FN(vact)(lo, act, a->a0, a->a1), n0);
                    if (n1 > 0) FN(vstore_n)(yi + at + MRT_VL, FN(vact)(hi, act, a->a0, a->a1), n1);
                }
            }
        }
    }
}

/* Items: (image, band of tile rows). */
static MRT_TARGET void FN(wg_task)(void *ctx, long begin, long end) {
    FN(wg_args) *a = (FN(wg_args) *)ctx;
    const int C = a->c, M = a->m;
    const long vfloats = 16L * a->panels * C * WG_NR, mfloats = 16L * M * a->mstride;
    float *v = (float *)mrt_scratch_buffer(sizeof(float) * ((size_t)vfloats + (size_t)mfloats + 4 * (size_t)a->rowlen));
    if (!v) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *mm = v + vfloats, *rows = mm + mfloats;
    for (long item = begin; item < end; ++item) {
        const int img = (int)(item / a->bands), ty0 = (int)(item % a->bands) * a->band;
        const int nrows = a->th - ty0 < a->band ? a->th - ty0 : a->band;
        const int tiles = nrows * a->tw, panels = (tiles + WG_NR - 1) / WG_NR;
        const float *xi = a->x + (long)img * C * a->h * a->w;
        /* the last panel's columns past the band's tiles: zeros (computed, never stored) */
        if (tiles % WG_NR) {
            const int used = tiles % WG_NR;
            for (int p = 0; p < 16; ++p) {
                float *row = v + ((long)p * a->panels + panels - 1) * C * WG_NR;
                for (int c = 0; c < C; ++c, row += WG_NR)
                    for (int j = used; j < WG_NR; j += MRT_VL)
                        FN(vstore_n)(row + j, (FN(vf)){0}, WG_NR - j < MRT_VL ? WG_NR - j : MRT_VL);
            }
        }
        for (int c = 0; c < C; ++c) FN(wg_input)(a, xi + (long)c * a->h * a->w, c, ty0, nrows, v, rows);
        /* the 16 products, the sum over C in blocks of a->kc (a block of U_xi, M x kc, stays in L2 for every
         * panel, and a panel's kc rows in L1 for every tile of output channels) */
        for (int p = 0; p < 16; ++p)
            for (int k0 = 0; k0 < C; k0 += a->kc) {
                const int kb = C - k0 < a->kc ? C - k0 : a->kc;
                const float *u = a->u + (long)p * M * C + k0;
                for (int q = 0; q < panels; ++q) {
                    const float *b = v + (((long)p * a->panels + q) * C + k0) * WG_NR;
                    float *out = mm + (long)p * M * a->mstride + (long)q * WG_NR;
                    for (int m0 = 0; m0 < M; m0 += WG_MR)
                        FN(wg_tile)(u + (long)m0 * C, C, b, kb, out + (long)m0 * a->mstride, a->mstride, k0 > 0,
                                    M - m0 < WG_MR ? M - m0 : WG_MR);
                }
            }
        const long plane = (long)a->oh * a->ow;
        FN(wg_output)(a, mm, ty0, nrows, a->y + (long)img * M * plane, a->res ? a->res + (long)img * M * plane : NULL);
    }
}

/* y = act(conv(x, w) + bias + res) for a geometry of mrt_conv2d_uses_winograd, u the packed weights
 * (mrt_conv2d_winograd_pack_w).  Returns 0, or -1 when a thread found no scratch. */
static int FN(conv_winograd)(const mrt_conv_geometry *g, const float *u, const float *bias, const float *res, int act,
                             float a0, float a1, const float *x, float *y, int nthreads) {
    FN(wg_args) a;
    memset(&a, 0, sizeof(a));
    a.x = x; a.u = u; a.bias = bias; a.res = res; a.y = y;
    a.n = g->n; a.c = g->c; a.h = g->h; a.w = g->w; a.m = g->m; a.pt = g->pt; a.pl = g->pl;
    a.oh = g->oh; a.ow = g->ow; a.act = act; a.a0 = a0; a.a1 = a1;
    a.th = (a.oh + 1) / 2;
    a.tw = (a.ow + 1) / 2;
    if (a.n <= 0 || a.m <= 0 || a.oh <= 0 || a.ow <= 0) return 0;
    /* tile rows per band: V and M of at most WG_BLOCK_FLOATS each (16 values per tile and channel; at least
     * one row), and of those the count whose tiles fill the panels best (the products compute whole panels:
     * 7 tiles a row in one band are 16 columns computed for 7) */
    const long per_row = 16L * (a.c > a.m ? a.c : a.m) * a.tw;
    int most = (int)(WG_BLOCK_FLOATS / per_row);
    if (most < 1) most = 1;
    if (most > a.th) most = a.th;
    a.band = 1;
    for (int b = 1; b <= most; ++b) { /* least waste: computed / used columns, b * tw tiles in whole panels */
        const long used = (long)b * a.tw, best = (long)a.band * a.tw;
        const long computed = (used + WG_NR - 1) / WG_NR * WG_NR, best_computed = (best + WG_NR - 1) / WG_NR * WG_NR;
        if (computed * best < best_computed * used) a.band = b;
    }
    a.bands = (a.th + a.band - 1) / a.band;
    const int tiles = a.band * a.tw;
    a.panels = (tiles + WG_NR - 1) / WG_NR;
    /* the sum over C in equal blocks of at most WG_KC channels (one block up to WG_KC_ONE) */
    const int kblocks = a.c > WG_KC_ONE ? (a.c + WG_KC - 1) / WG_KC : 1;
    a.kc = (a.c + kblocks - 1) / kblocks;
    a.mstride = (long)a.panels * WG_NR + MRT_VL;
    /* a padded row: the columns the last vector of tiles reads (2 (tx0 + MRT_VL) + 2 + MRT_VL), whole vectors */
    const int tw_up = (a.tw + MRT_VL - 1) / MRT_VL * MRT_VL;
    a.rowlen = 2 * tw_up + 2 * MRT_VL;
    /* work per item in GEMM units (multiply-adds / 16): the 16 products */
    const long unit = 16L * a.m * a.c * tiles / 16;
    mrt_parallel_for((long)a.n * a.bands, unit > 0 ? unit : 1, nthreads, FN(wg_task), &a);
    return a.failed ? -1 : 0;
}

#undef WG_INLINE
#undef WG_MR
#undef WG_NR
#undef WG_KC
#undef WG_KC_ONE
#undef WG_BLOCK_FLOATS
#undef WG_SHUFFLE2
#undef WG_EVEN
#undef WG_ODD
#undef WG_ZIP_LO
#undef WG_ZIP_HI
