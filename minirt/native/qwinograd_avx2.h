/* int8 3x3 convolutions as Winograd F(2x2, 3x3) in exact integers, on AVX2 without VNNI (mrt_qconv2d
 * on the geometries of q_winograd_fits, with the transformed weights of mrt_qconv_winograd_pack_w).
 * Included by kernels.c after qgemm.h (q_conv_args, the int8 epilogue q_store_row, q_act_row,
 * q_post_row, q_quant_task).
 *
 * The arithmetic is winograd_impl.h's (the float version: tiles of 2 x 2 outputs, 16 products per
 * tile and channel pair instead of 36), in integers:
 *   V = B^T d B   from the tile's 4 x 4 patch of centred inputs d = x - x_zero (in [-255, 255]; the
 *                 padding is x_zero, so 0): sums of at most 4 of them, |V| <= 1020, an int16;
 *   U = (2G) g (2G)^T = 4 G g G^T   from the 3 x 3 int8 weights g (2G has the entries 2, 1, 1, 2 where G
 *                 has 1, 1/2, 1/2, 1): sums of at most 9 weights, |U| <= 9 x 127 = 1143, an int16;
 *   M_xi = sum_c U_xi(m, c) V_xi(c, tile)   by vpmaddwd (two channels' int16 products summed into an int32)
 *                 and vpaddd, in int32 arithmetic modulo 2^32;
 *   4 S = A^T M A (sums and differences), S = (4 S) >> 2.
 * Every step is a ring operation, so 4 S is exact modulo 2^32; and |4 S| <= 4 x 9 x C x 255 x 127 < 2^31
 * for C <= Q_WINO_MAX_C, so it is exact, a multiple of 4, and S is exactly sum_k w (x - x_zero): the
 * direct kernels' integer sum minus their zero-point correction.  The epilogue is theirs (q_store_row,
 * then the activation, post map and requantization of q_implicit_task, in that order, with x_zero 0: no
 * correction left), so the results are the direct conv's, bit for bit.
 *
 * Why: AVX2 has no 4-way u8 x s8 dot product (VNNI); the direct kernels spend two multiply instructions
 * (vpmaddubsw, vpmaddwd) per 32 multiply-adds, and vpmaddwd alone does 16 int16 ones, so the 2.25x
 * fewer multiply-adds of the transformed products are about that much less multiply work.
 *
 * Layout (as winograd_impl.h, in int16 pairs): V of a band of tile rows is [16][panel][C2 / 2][16 tiles]
 * [2 channels] int16 (C2: C rounded up to even), so that one 32-byte load is 8 tiles x a channel pair;
 * U is [16][M][C2] int16 (mrt_qconv_winograd_pack_w), a channel pair broadcast as one int32.  A work
 * item is a band of tile rows of one image and a block of output channels: its V (the input transform
 * of every channel), then its 16 products, then the output transform and epilogue of its channels. */

long mrt_qconv_winograd_packed_size(int m, int c) { return 16L * m * (c + (c & 1)); }

/* u[(xi m + o) c2 + ch] (xi < 16, c2 = c rounded up to even, the odd channel's pair partner 0) = U_xi of
 * output channel o and input channel ch, from w (m, c, 3, 3) int8.  (2G) g, then that times (2G)^T, as
 * sums and doubles (2G's entries are 2, 1, -1 and 0; every value within int16), 32 channels at a time:
 * their taps gathered into rows, the arithmetic in loops over the channels (vectorised), the block then
 * written as 16 runs of 64 bytes.  (The 16 positions are m c2 int16 apart, a power of two for most layers:
 * storing each value where it goes took 15 ms for a 512 -> 512 layer, its rows all on one L1 set; 100 ms
 * of an int8 ResNet-18's session with a table-driven loop.) */
void mrt_qconv_winograd_pack_w(const int8_t *w, int m, int c, int16_t *u) {
    enum { QW_PACK_CH = 32 };
    const long c2 = c + (c & 1), xstride = (long)m * c2;
    int16_t k[9][QW_PACK_CH], t[4][3][QW_PACK_CH], blk[16][QW_PACK_CH];
    for (int o = 0; o < m; ++o)
        for (long ch0 = 0; ch0 < c2; ch0 += QW_PACK_CH) {
            const int n = c2 - ch0 < QW_PACK_CH ? (int)(c2 - ch0) : QW_PACK_CH;
            for (int j = 0; j < QW_PACK_CH; ++j)
                for (int q = 0; q < 9; ++q) k[q][j] = j < n && ch0 + j < c ? w[((long)o * c + ch0 + j) * 9 + q] : 0;
            for (int b = 0; b < 3; ++b) /* (2G) g: rows 2 r0, r0 + r1 + r2, r0 - r1 + r2, 2 r2 of the kernel rows r */
                for (int j = 0; j < QW_PACK_CH; ++j) {
                    const int16_t r0 = k[b][j], r1 = k[3 + b][j], r2 = k[6 + b][j];
                    t[0][b][j] = (int16_t)(2 * r0), t[1][b][j] = (int16_t)(r0 + r1 + r2);
                    t[2][b][j] = (int16_t)(r0 - r1 + r2), t[3][b][j] = (int16_t)(2 * r2);
                }
            for (int i = 0; i < 4; ++i) /* row i of that times (2G)^T: positions 4 i .. 4 i + 3 */
                for (int j = 0; j < QW_PACK_CH; ++j) {
                    const int16_t a0 = t[i][0][j], a1 = t[i][1][j], a2 = t[i][2][j];
                    blk[4 * i][j] = (int16_t)(2 * a0), blk[4 * i + 1][j] = (int16_t)(a0 + a1 + a2);
                    blk[4 * i + 2][j] = (int16_t)(a0 - a1 + a2), blk[4 * i + 3][j] = (int16_t)(2 * a2);
                }
            for (int xi = 0; xi < 16; ++xi) memcpy(u + xi * xstride + (long)o * c2 + ch0, blk[xi], sizeof(int16_t) * n);
        }
}

#define Q_WINO_MAX_C 1024 /* input channels: |4 S| stays below 2^31 (see above) */

#ifdef MRT_HAVE_VNNI_BUILD
#define QW_MR 5           /* output channels per product tile (qw_tile_rows) */
#define QW_NR 16          /* tiles per panel of V (two vectors of 8 tile pairs) */
#define QW_KC 128         /* channel pairs per block of the products' sums */
#define QW_BLOCK 262144   /* bytes of V, and of M, per work item at most */

/* Whether mrt_qconv2d takes the Winograd route for this conv: a 3 x 3 window, stride and dilation 1, one
 * group, padding of at most 2 (tiles then read at most 2 columns and rows past the input), at most
 * Q_WINO_MAX_C input channels, on AVX2 without VNNI (where the direct kernels have a dot product, they
 * stay); and enough channels on both sides: per tile, the input transform's work grows with c, the
 * output transform's and the epilogue's with m, the products saved with c x m, so the route pays where
 * a / m + b / c <= 1, i.e. 20 c + 8 m <= c m (a = 20, b = 8 fitted to single layers on Zen 3, 1 thread,
 * Winograd / direct: 64 -> 64 at 56 x 56 0.77, 128 -> 128 at 28 x 28 0.66, 32 -> 128 at 55 x 55 0.82,
 * 16 -> 64 at 56 x 56 0.86, 32 -> 32 at 28 x 28 0.94, 64 -> 256 at 13 x 13 0.94; left out: 16 -> 16 at
 * 112 x 112 1.11, 64 -> 16 at 56 x 56 1.09, 8 -> 32 1.05, 24 -> 24 at 20 x 20 1.65, 8 -> 8 1.54). */
static int q_winograd_fits(int c, int m, int group, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl) {
    return q_use_avx2 && !q_use_vnni && group == 1 && kh == 3 && kw == 3 && sh == 1 && sw == 1 && dh == 1 &&
           dw == 1 && pt >= 0 && pt <= 2 && pl >= 0 && pl <= 2 && c <= Q_WINO_MAX_C && 20L * c + 8L * m <= (long)c * m;
}

typedef struct {
    const q_conv_args *c;
    const uint8_t *x; /* the image, uint8 */
    const int16_t *u;
    float *y;
    uint8_t *yq;
    q_args g;       /* the epilogue's fields (x_zero 0: the sums are already centred) */
    int th, tw;     /* tile rows and columns */
    int band;       /* tile rows per work item */
    int bands;      /* bands per image */
    int panels;     /* panels of QW_NR tiles in a band's V */
    int c2;         /* input channels rounded up to even */
    int kc;         /* channel pairs per block of the sums */
    int mc, mparts; /* output channels per work item, items per band */
    long mstride;   /* int32 per row of M: a band's tiles in whole panels, + 8 for the last vector's over-read */
    int rowlen;     /* bytes of a padded input row */
    int failed;
} qw_args;

/* The even and odd columns of one padded input row, centred: e[k] = row[2 k] - zp, o[k] = row[2 k + 1] - zp
 * for k < n16 (a multiple of 16; row holds 2 n16 bytes). */
__attribute__((target("avx2"))) static void qw_split_row(const uint8_t *row, int n16, int zp, int16_t *e, int16_t *o) {
    const __m256i pick = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12,
                                          14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i z = _mm256_set1_epi16((short)zp);
    for (int k = 0; k < n16; k += 16) {
        /* per 128-bit lane: 8 even bytes then 8 odd ones; then the lanes' evens together and odds together */
        __m256i v = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(row + 2 * k)), pick);
        v = _mm256_permute4x64_epi64(v, 0xD8);
        const __m256i ev = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v));
        const __m256i od = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1));
        _mm256_storeu_si256((__m256i *)(e + k), _mm256_sub_epi16(ev, z));
        _mm256_storeu_si256((__m256i *)(o + k), _mm256_sub_epi16(od, z));
    }
}

/* The padded row of input row iy of plane xc into row (x_zero outside the input), split into e / o. */
static void qw_fill_row(const qw_args *a, const uint8_t *xc, int iy, uint8_t *row, int16_t *e, int16_t *o) {
    const q_conv_args *c = a->c;
    const int zp = c->x_zero, w = c->wd, len = a->rowlen;
    if (iy < 0 || iy >= c->h) {
        memset(row, zp, (size_t)len);
    } else {
        const int lead = c->pl < len ? c->pl : len, count = w < len - lead ? w : len - lead;
        memset(row, zp, (size_t)lead);
        if (count > 0) memcpy(row + lead, xc + (long)iy * w, (size_t)count);
        const int done = lead + (count > 0 ? count : 0);
        memset(row + done, zp, (size_t)(len - done));
    }
    qw_split_row(row, len / 2, zp, e, o);
}

/* B^T d B of 16 tiles (int16 lanes): d[i][q] is column q of patch row i; v[xi], xi = 4 i + j. */
__attribute__((target("avx2"), always_inline)) static inline void qw_transform_in(__m256i d[4][4], __m256i v[16]) {
    __m256i b[4][4];
    for (int q = 0; q < 4; ++q) {
        b[0][q] = _mm256_sub_epi16(d[0][q], d[2][q]);
        b[1][q] = _mm256_add_epi16(d[1][q], d[2][q]);
        b[2][q] = _mm256_sub_epi16(d[2][q], d[1][q]);
        b[3][q] = _mm256_sub_epi16(d[1][q], d[3][q]);
    }
    for (int i = 0; i < 4; ++i) {
        v[4 * i] = _mm256_sub_epi16(b[i][0], b[i][2]);
        v[4 * i + 1] = _mm256_add_epi16(b[i][1], b[i][2]);
        v[4 * i + 2] = _mm256_sub_epi16(b[i][2], b[i][1]);
        v[4 * i + 3] = _mm256_sub_epi16(b[i][1], b[i][3]);
    }
}

/* V of the band's tile rows ty0 .. ty0 + nrows - 1 for channel pair `pair` (channels 2 pair, 2 pair + 1;
 * the second absent when the count is odd: zeros).  buf: scratch for a padded row, 2 x 4 rows of its even /
 * odd columns, and the stage: the pair's 16 rows of the band's tiles in tile order (int32 pairs, 16 more
 * for the last vectors), written 16 tiles at a time whatever the panel boundaries (each group's extra
 * lanes overwritten by the next), then copied into the panels whole (vpmaskmovd, for tiles that start or
 * end inside a panel, is slow on AMD Zen: a quarter of the conv). */
__attribute__((target("avx2"))) static void qw_input(const qw_args *a, int pair, int ty0, int nrows, int16_t *v,
                                                     uint8_t *buf) {
    const q_conv_args *c = a->c;
    const int tw = a->tw, half = a->rowlen / 2, pairs = a->c2 / 2;
    const long plane = (long)c->h * c->wd, vxi = (long)a->panels * pairs * 2 * QW_NR; /* int16 of one V_xi */
    const int chans = 2 * pair + 1 < c->c ? 2 : 1;
    const long srow = (long)a->panels * QW_NR + QW_NR; /* int32 of a stage row */
    uint8_t *row = buf;
    int16_t *eo = (int16_t *)(buf + a->rowlen); /* [channel][row i][even | odd][half] */
    int32_t *stage = (int32_t *)(eo + 16L * half);
    int16_t *rp[2][4][2];
    for (int k = 0; k < 2; ++k)
        for (int i = 0; i < 4; ++i)
            for (int s = 0; s < 2; ++s) rp[k][i][s] = eo + ((long)(k * 4 + i) * 2 + s) * half;
    for (int r = 0; r < nrows; ++r) {
        const int ty = ty0 + r;
        for (int k = 0; k < chans; ++k) {
            if (r > 0) /* rows 2 ty - pt + 0, 1 were the previous tile row's rows 2, 3 */
                for (int s = 0; s < 2; ++s) {
                    int16_t *t0 = rp[k][0][s], *t1 = rp[k][1][s];
                    rp[k][0][s] = rp[k][2][s], rp[k][1][s] = rp[k][3][s], rp[k][2][s] = t0, rp[k][3][s] = t1;
                }
            for (int i = r > 0 ? 2 : 0; i < 4; ++i)
                qw_fill_row(a, a->x + (2L * pair + k) * plane, 2 * ty - c->pt + i, row, rp[k][i][0], rp[k][i][1]);
        }
        for (int tx0 = 0; tx0 < tw; tx0 += 16) {
            __m256i vc[2][16];
            for (int k = 0; k < chans; ++k) {
                __m256i d[4][4];
                for (int i = 0; i < 4; ++i) { /* patch columns 2 t .. 2 t + 3: even t, odd t, even t + 1, odd t + 1 */
                    d[i][0] = _mm256_loadu_si256((const __m256i *)(rp[k][i][0] + tx0));
                    d[i][1] = _mm256_loadu_si256((const __m256i *)(rp[k][i][1] + tx0));
                    d[i][2] = _mm256_loadu_si256((const __m256i *)(rp[k][i][0] + tx0 + 1));
                    d[i][3] = _mm256_loadu_si256((const __m256i *)(rp[k][i][1] + tx0 + 1));
                }
                qw_transform_in(d, vc[k]);
            }
            if (chans == 1)
                for (int xi = 0; xi < 16; ++xi) vc[1][xi] = _mm256_setzero_si256();
            int32_t *st = stage + r * tw + tx0;
            /* pairs (c, c + 1) per tile: unpacks give the tiles 0-3 | 8-11 and 4-7 | 12-15, put in order */
            for (int xi = 0; xi < 16; ++xi, st += srow) {
                const __m256i lo = _mm256_unpacklo_epi16(vc[0][xi], vc[1][xi]);
                const __m256i hi = _mm256_unpackhi_epi16(vc[0][xi], vc[1][xi]);
                _mm256_storeu_si256((__m256i *)st, _mm256_permute2x128_si256(lo, hi, 0x20));
                _mm256_storeu_si256((__m256i *)(st + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
            }
        }
    }
    /* the stage into the panels (the last panel's tiles past the band: whatever the stage holds there,
     * computed and never stored) */
    const int panels = (nrows * tw + QW_NR - 1) / QW_NR;
    for (int xi = 0; xi < 16; ++xi) {
        const int32_t *st = stage + xi * srow;
        int16_t *dst = v + xi * vxi + (long)pair * 2 * QW_NR;
        for (int q = 0; q < panels; ++q, st += QW_NR, dst += (long)pairs * 2 * QW_NR) {
            _mm256_storeu_si256((__m256i *)dst, _mm256_loadu_si256((const __m256i *)st));
            _mm256_storeu_si256((__m256i *)(dst + 16), _mm256_loadu_si256((const __m256i *)(st + 8)));
        }
    }
}

/* c (mr rows of 16 int32, row stride ldc; mr <= QW_MR) = (add ? c : 0) + u (mr rows of k2 channel pairs,
 * row stride ldu int16) . b (k2 rows of 16 tile pairs, 32 int16 each).  Always QW_MR rows (rows past mr
 * read row 0: computed, never stored), in named registers: 10 accumulators, the two panel vectors, the
 * pair of weights and a product, 15 of the 16 (an array of six rows' accumulators, or of a variable row
 * count, was kept partly on the stack by GCC, stored every step). */
__attribute__((target("avx2"))) static void qw_tile(const int16_t *u, long ldu, const int16_t *b, int k2, int32_t *c,
                                                    long ldc, int add, int mr) {
    const int32_t *u0 = (const int32_t *)u, *u1 = (const int32_t *)(u + (mr > 1 ? ldu : 0));
    const int32_t *u2 = (const int32_t *)(u + (mr > 2 ? 2 * ldu : 0));
    const int32_t *u3 = (const int32_t *)(u + (mr > 3 ? 3 * ldu : 0));
    const int32_t *u4 = (const int32_t *)(u + (mr > 4 ? 4 * ldu : 0));
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00,
            a40 = a00, a41 = a00;
    for (int k = 0; k < k2; ++k, b += 2 * QW_NR) {
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)b), b1 = _mm256_loadu_si256((const __m256i *)(b + 16));
#define QW_ROW(ur, x0, x1)                                     \
    {                                                          \
        int32_t pairw;                                         \
        memcpy(&pairw, ur + k, 4);                             \
        const __m256i w = _mm256_set1_epi32(pairw);            \
        x0 = _mm256_add_epi32(x0, _mm256_madd_epi16(b0, w));   \
        x1 = _mm256_add_epi32(x1, _mm256_madd_epi16(b1, w));   \
    }
        QW_ROW(u0, a00, a01)
        QW_ROW(u1, a10, a11)
        QW_ROW(u2, a20, a21)
        QW_ROW(u3, a30, a31)
        QW_ROW(u4, a40, a41)
#undef QW_ROW
    }
    const __m256i acc[QW_MR][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}, {a40, a41}};
    for (int i = 0; i < mr; ++i) {
        __m256i *o = (__m256i *)(c + i * ldc);
        __m256i x0 = acc[i][0], x1 = acc[i][1];
        if (add) { /* (a later block of the sum: added to the blocks before it, modulo 2^32) */
            x0 = _mm256_add_epi32(x0, _mm256_loadu_si256(o));
            x1 = _mm256_add_epi32(x1, _mm256_loadu_si256(o + 1));
        }
        _mm256_storeu_si256(o, x0);
        _mm256_storeu_si256(o + 1, x1);
    }
}

/* Output row oy of channel o from its exact sums s (ow int32): q_implicit_task's epilogue, in its order. */
static void qw_store_row(const qw_args *a, int o, int oy, const int32_t *s, float *stage) {
    const q_conv_args *c = a->c;
    const long p = (long)c->oh * c->ow, at = (long)oy * c->ow;
    float *t = a->yq ? stage : a->y + (long)o * p + at;
    q_store_row(&a->g, s, t, c->ow, o, at);
    if (c->act && !a->g.store_act) q_act_row(t, c->ow, c->act, c->a0, c->a1);
    q_post_row(&a->g, t, c->ow);
    if (a->yq) {
        const int yz = c->y_zero[o];
        q_quant_args qa = {t, a->yq + (long)o * p + at, c->y_scale[o], (float)(0 - yz), (float)(255 - yz), (float)yz};
        q_quant_task(&qa, 0, c->ow);
    }
}

/* The output transform of the band's tile rows ty0 .. ty0 + nrows - 1 for channels m0 .. m0 + mb - 1 from
 * their M ([16][mc][mstride] int32), then the epilogue; rows: scratch of 2 rows of int32 and a float row. */
__attribute__((target("avx2"))) static void qw_output(const qw_args *a, const int32_t *mm, int m0, int mb, int ty0,
                                                      int nrows, int32_t *rows) {
    const q_conv_args *c = a->c;
    const int tw = a->tw, oh = c->oh, ow16 = (c->ow + 15) / 16 * 16;
    const long mxi = (long)a->mc * a->mstride; /* int32 of one M_xi */
    int32_t *out[2] = {rows, rows + ow16};
    float *stage = (float *)(rows + 2L * ow16);
    for (int o = 0; o < mb; ++o) {
        const int32_t *mrow = mm + (long)o * a->mstride;
        for (int r = 0; r < nrows; ++r) {
            const int ty = ty0 + r;
            for (int tx0 = 0; tx0 < tw; tx0 += 8) {
                const int32_t *q = mrow + (long)r * tw + tx0;
                __m256i s[4][4], t[2][4];
                for (int i = 0; i < 4; ++i)
                    for (int j = 0; j < 4; ++j) s[i][j] = _mm256_loadu_si256((const __m256i *)(q + (4 * i + j) * mxi));
                for (int j = 0; j < 4; ++j) { /* A^T s */
                    t[0][j] = _mm256_add_epi32(_mm256_add_epi32(s[0][j], s[1][j]), s[2][j]);
                    t[1][j] = _mm256_sub_epi32(_mm256_sub_epi32(s[1][j], s[2][j]), s[3][j]);
                }
                for (int i = 0; i < 2; ++i) { /* (A^T s) A: output row 2 ty + i, columns 2 tx0 .. 2 tx0 + 15 */
                    const __m256i e4 = _mm256_add_epi32(_mm256_add_epi32(t[i][0], t[i][1]), t[i][2]);
                    const __m256i o4 = _mm256_sub_epi32(_mm256_sub_epi32(t[i][1], t[i][2]), t[i][3]);
                    const __m256i even = _mm256_srai_epi32(e4, 2), odd = _mm256_srai_epi32(o4, 2);
                    const __m256i lo = _mm256_unpacklo_epi32(even, odd), hi = _mm256_unpackhi_epi32(even, odd);
                    _mm256_storeu_si256((__m256i *)(out[i] + 2 * tx0), _mm256_permute2x128_si256(lo, hi, 0x20));
                    _mm256_storeu_si256((__m256i *)(out[i] + 2 * tx0 + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
                }
            }
            for (int i = 0; i < 2 && 2 * ty + i < oh; ++i) qw_store_row(a, m0 + o, 2 * ty + i, out[i], stage);
        }
    }
}

/* Items: (band of tile rows, block of output channels). */
__attribute__((target("avx2"))) static void qw_task(void *ctx, long begin, long end) {
    qw_args *a = (qw_args *)ctx;
    const q_conv_args *c = a->c;
    const int pairs = a->c2 / 2, M = c->m, ow16 = (c->ow + 15) / 16 * 16;
    const long vbytes = 32L * a->panels * pairs * 2 * QW_NR, mbytes = 64L * a->mc * a->mstride;
    const long rowbytes = (long)a->rowlen + 32L * (a->rowlen / 2) + 64L * (a->panels * QW_NR + QW_NR);
    const long outbytes = 2L * ow16 * 4 + (long)ow16 * 4;
    uint8_t *buf = (uint8_t *)mrt_pack_buffer((size_t)(vbytes + mbytes + rowbytes + outbytes + 128));
    if (!buf) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    int16_t *v = (int16_t *)buf;
    int32_t *mm = (int32_t *)(buf + vbytes);
    uint8_t *rowbuf = buf + vbytes + mbytes;
    int32_t *outrows = (int32_t *)(rowbuf + (rowbytes + 63) / 64 * 64);
    const long vxi = (long)a->panels * pairs * 2 * QW_NR;
    int cached = -1; /* the band whose V is in v (items of one band are consecutive) */
    for (long item = begin; item < end; ++item) {
        const int band = (int)(item / a->mparts), m0 = (int)(item % a->mparts) * a->mc;
        const int mb = M - m0 < a->mc ? M - m0 : a->mc;
        const int ty0 = band * a->band, nrows = a->th - ty0 < a->band ? a->th - ty0 : a->band;
        const int tiles = nrows * a->tw, panels = (tiles + QW_NR - 1) / QW_NR;
        if (band != cached) {
            cached = band;
            for (int pr = 0; pr < pairs; ++pr) qw_input(a, pr, ty0, nrows, v, rowbuf);
        }
        for (int xi = 0; xi < 16; ++xi)
            for (int k0 = 0; k0 < pairs; k0 += a->kc) {
                const int kb = pairs - k0 < a->kc ? pairs - k0 : a->kc;
                const int16_t *u = a->u + ((long)xi * M + m0) * a->c2 + 2L * k0;
                for (int q = 0; q < panels; ++q) {
                    const int16_t *b = v + xi * vxi + ((long)q * pairs + k0) * 2 * QW_NR;
                    int32_t *out = mm + (long)xi * a->mc * a->mstride + (long)q * QW_NR;
                    for (int i = 0; i < mb; i += QW_MR)
                        qw_tile(u + (long)i * a->c2, a->c2, b, kb, out + (long)i * a->mstride, a->mstride, k0 > 0,
                                mb - i < QW_MR ? mb - i : QW_MR);
                }
            }
        qw_output(a, mm, m0, mb, ty0, nrows, outrows);
    }
}

/* One image: img (c, h, wd) uint8 -> y or yq (m, oh, ow), res (m, oh, ow) or NULL, by the transformed
 * weights u (mrt_qconv_winograd_pack_w).  Returns 0, or -1 when a thread found no scratch. */
static int q_conv_winograd(const q_conv_args *c, const uint8_t *img, const float *res, float *y, uint8_t *yq, int nt) {
    qw_args a;
    memset(&a, 0, sizeof a);
    a.c = c; a.x = img; a.u = c->wino; a.y = y; a.yq = yq;
    a.g.sums = c->sums; a.g.scale = c->scale; a.g.bias = c->bias; a.g.x_zero = 0; /* (centred sums) */
    a.g.res = res; a.g.ldr = (long)c->oh * c->ow;
    a.g.post_a = c->post_a; a.g.post_b = c->post_b;
    a.g.a0 = c->a0; a.g.a1 = c->a1;
    a.g.yscale = c->y_scale; a.g.yzp = c->y_zero;
    q_set_store_epilogue(&a.g, c->act, yq != NULL);
    a.g.store_q = 0; /* (the u8 output is requantized from the float row: qw_store_row) */
    a.th = (c->oh + 1) / 2;
    a.tw = (c->ow + 1) / 2;
    a.c2 = c->c + (c->c & 1);
    const int pairs = a.c2 / 2;
    /* tile rows per band: V (32 bytes per tile and channel) and M (64 per tile and output channel of an item)
     * within QW_BLOCK each, at least one row */
    a.mc = c->m < 128 ? c->m : 128;
    const long per_row = (long)a.tw * (32L * a.c2 > 64L * a.mc ? 32L * a.c2 : 64L * a.mc);
    int band = (int)(QW_BLOCK / per_row);
    if (band < 1) band = 1;
    if (band > a.th) band = a.th;
    a.band = band;
    a.bands = (a.th + band - 1) / band;
    /* few bands for the threads: the output channels split too (each item transforms its band's input) */
    long mparts = (c->m + a.mc - 1) / a.mc;
    if (nt > 1 && a.bands * mparts < 2L * nt) {
        const long want = (2L * nt + a.bands - 1) / a.bands, most = (c->m + QW_MR - 1) / QW_MR;
        mparts = want < most ? want : most;
    }
    a.mc = (int)((c->m + mparts - 1) / mparts);
    a.mc = (a.mc + QW_MR - 1) / QW_MR * QW_MR;
    a.mparts = (c->m + a.mc - 1) / a.mc;
    a.panels = (band * a.tw + QW_NR - 1) / QW_NR;
    const int kblocks = pairs > QW_KC ? (pairs + QW_KC - 1) / QW_KC : 1;
    a.kc = (pairs + kblocks - 1) / kblocks;
    a.mstride = (long)a.panels * QW_NR + 8;
    /* a padded row: the columns the last 16 tiles read (2 (tw rounded up to 16) + 2), whole 32-byte steps */
    a.rowlen = ((a.tw + 15) / 16 * 16 + 16) * 2;
    const long unit = (long)a.mc * a.c2 * band * a.tw; /* multiply-adds / 16 of an item's 16 products */
    mrt_parallel_for((long)a.bands * a.mparts, unit > 0 ? unit : 1, nt, qw_task, &a);
    return a.failed ? -1 : 0;
}

#undef QW_MR
#undef QW_NR
#undef QW_KC
#undef QW_BLOCK
#endif

int mrt_qconv_uses_winograd(const mrt_conv_geometry *g) {
#ifdef MRT_HAVE_VNNI_BUILD
    return q_winograd_fits(g->c, g->m, g->group, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw, g->pt, g->pl);
#else
    (void)g;
    return 0;
#endif
}
