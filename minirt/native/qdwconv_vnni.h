/* int8 depthwise conv on AVX512-VNNI (vpdpbusd: u8 x s8, 4-way dot product into s32), for the
 * common case of mrt_qdwconv2d: stride 1 or 2, no dilation, kh, kw <= 8, no residual, an
 * activation the epilogue inlines; the input uint8, or float quantized per row as it is
 * copied in (the same arithmetic as dwconv_impl.h's copy); the output uint8 or float.  Included by kernels.c after qgemm.h
 * (q_use_vnni, q_bw); every other case takes the float-lane code of dwconv_impl.h.
 *
 * Each plane is copied into a uint8 band padded with the input zero point (so padding
 * contributes x - x_zero = 0) whose row stride is exactly the padded width ps = ow + kw - 1.
 * Read as one flat row, output (oy, ox) is then flat output f = oy * ps + ox with taps at
 * band[f + ky * ps + kx]: the plane is computed as flat outputs f in blocks of 64 (the kw - 1
 * columns per row past ow are junk, dropped when the rows are copied out), so narrow planes
 * (20 columns at the end of PP-OCR's backbone) fill whole vectors.  Per block f0..f0+63:
 *
 *   acc_s (16 int32 lanes, s = 0..3): lane i is flat output f0 + 4 i + s.
 *   For kernel row ky and tap quad q (taps 4q..4q+3, zero weights past kw), one 64-byte load
 *   at f0 + ky * ps + s + 4q gives, in dword lane i, the 4 input bytes that output
 *   f0 + 4 i + s multiplies with that quad: acc_s = vpdpbusd(acc_s, load, quad weights).
 *
 * so a 3x3 kernel is 3 rows x 1 quad x 4 shifts = 12 vpdpbusd per 64 outputs (the float code:
 * 9 FMAs per 16).
 *
 * Stride 2: the padded plane is split into four parity planes P[row parity][column parity]
 * (row stride pe = ow + (kw - 1) / 2), so that tap (ky, kx) of output (oy, ox) is
 * P[ky & 1][kx & 1] at row oy + ky / 2, column ox + kx / 2: the flat scheme above again,
 * with per kernel row one quad of the even taps (kx = 0, 2, 4, 6) and one of the odd ones.
 * Rows are split into even and odd bytes 32 at a time (16-bit lanes truncated: vpmovwb).  The exact integer sum is acc - x_zero * sum(w).  The epilogue is the one of
 * dwconv_impl.h (same operations, in the same order), a uint8 output's requantization folded into one
 * multiply-add where that gives the same bytes (q_fold_rows, D181); the uint8 results of the four
 * interleaved vectors are merged into bytes in column order with shifts: byte 4 i + s of the
 * 64 is lane i of vector s; float results are put in column order by a 4 x 4 transpose
 * (unpacks, then 128-bit lane shuffles). */

#ifdef MRT_HAVE_VNNI_BUILD
#define Q_DW_MAX_TERMS 16 /* (kernel row, quad) pairs: kh <= 8, two quads per row */
typedef struct {
    const q_dw_params *q;
    int c, h, wd, kh, kw, sh, pt, pl, oh, ow;
    long ps;          /* row stride of the band (s1) or of each parity plane (s2), in bytes */
    long plane_bytes; /* s2: bytes of one parity plane */
    long band_bytes;  /* the band (s1) or the four parity planes (s2), with slack for whole-vector reads */
    long flat_bytes;  /* the flat outputs oh * ps, rounded up to whole 64-byte blocks */
    long row_bytes;   /* float input: one quantized input row */
    const float *fold; /* uint8 output: q_fold_rows's S, B, L, H, E of each channel, or NULL */
} q_dw_args;

/* post_a * act(s * v + b) + post_b for 16 integer sums v (as floats). */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static inline __m512 q_dw_epilogue(const q_dw_params *q,
                                                                                           __m512 v, __m512 vs,
                                                                                           __m512 vb) {
    v = _mm512_fmadd_ps(vs, v, vb);
    const __m512 zero = _mm512_setzero_ps();
    if (q->act == MRT_ACT_RELU) {
        v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), v, zero);
    } else if (q->act == MRT_ACT_CLIP) {
        const __m512 lo = _mm512_set1_ps(q->a0), hi = _mm512_set1_ps(q->a1);
        v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, lo, _CMP_LT_OQ), v, lo);
        v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, hi, _CMP_GT_OQ), v, hi);
    } else if (q->act == MRT_ACT_HARDSWISH) {
        __m512 t = _mm512_fmadd_ps(v, _mm512_set1_ps(1.0f / 6.0f), _mm512_set1_ps(0.5f));
        t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(t, zero, _CMP_LT_OQ), t, zero);
        t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(t, _mm512_set1_ps(1.0f), _CMP_GT_OQ), t, _mm512_set1_ps(1.0f));
        v = _mm512_mul_ps(v, t);
    }
    return _mm512_fmadd_ps(_mm512_set1_ps(q->post_a), v, _mm512_set1_ps(q->post_b));
}

/* q_dw_epilogue requantized to 16 dwords 0..255. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static inline __m512i q_dw_requant(const q_dw_params *q,
                                                                                           __m512 v, __m512 vs,
                                                                                           __m512 vb) {
    v = q_dw_epilogue(q, v, vs, vb);
    const float yz = (float)q->y_zero;
    __m512 t = q_div16(v, _mm512_set1_ps(q->y_scale)); /* (v / y_scale, exactly where it matters) */
    t = _mm512_max_ps(t, _mm512_set1_ps(-yz)); /* NaN -> lo: max returns the second operand */
    t = _mm512_min_ps(t, _mm512_set1_ps(255.0f - yz));
    t = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_cvtps_epi32(_mm512_add_ps(t, _mm512_set1_ps(yz)));
}

/* dst[0:n] = src[0:n], inline: the planes' rows are short (7-56 bytes on MobileNets' small planes),
 * where a libc memcpy call per row cost as much as the plane's arithmetic (D181). */
__attribute__((target("avx512f,avx512bw"))) static inline void q_dw_copy_bytes(uint8_t *dst, const uint8_t *src,
                                                                              long n) {
    for (; n >= 64; n -= 64, src += 64, dst += 64) _mm512_storeu_si512(dst, _mm512_loadu_si512(src));
    if (n > 0) {
        const __mmask64 m = ((__mmask64)1 << n) - 1;
        _mm512_mask_storeu_epi8(dst, m, _mm512_maskz_loadu_epi8(m, src));
    }
}

/* dst[0:n] = src[0:n] for floats, inline (as q_dw_copy_bytes). */
__attribute__((target("avx512f"))) static inline void q_dw_copy_floats(float *dst, const float *src, long n) {
    for (; n >= 16; n -= 16, src += 16, dst += 16) _mm512_storeu_ps(dst, _mm512_loadu_ps(src));
    if (n > 0) {
        const __mmask16 m = (__mmask16)((1u << n) - 1);
        _mm512_mask_storeu_ps(dst, m, _mm512_maskz_loadu_ps(m, src));
    }
}

/* The oh rows of ow bytes at stride ps of flat, into the plane y (stride ow).  A row whose whole
 * 16- or 32-byte vector stays inside the plane is stored unmasked: the bytes it writes past the row
 * belong to later rows, which are stored after it (masked byte stores cost several times more). */
__attribute__((target("avx512f,avx512bw"))) static inline void q_dw_rows_out(uint8_t *y, const uint8_t *flat, int oh,
                                                                            int ow, long ps) {
    const long plane = (long)oh * ow;
    int oy = 0;
    if (ow <= 16)
        for (; oy < oh && (long)oy * ow + 16 <= plane; ++oy)
            _mm_storeu_si128((__m128i *)(y + (long)oy * ow), _mm_loadu_si128((const __m128i *)(flat + oy * ps)));
    else if (ow <= 32)
        for (; oy < oh && (long)oy * ow + 32 <= plane; ++oy)
            _mm256_storeu_si256((__m256i *)(y + (long)oy * ow), _mm256_loadu_si256((const __m256i *)(flat + oy * ps)));
    for (; oy < oh; ++oy) q_dw_copy_bytes(y + (long)oy * ow, flat + oy * ps, ow);
}

/* ev[j] = src[2j], od[j] = src[2j + 1] for the n bytes of src, by whole 32-byte stores (a masked byte
 * store costs several times more on AMD Zen 4: with them this split was ~60 % of a stride-2 layer from
 * 56 x 56, D182).  Past the row, up to 32 bytes of ev and od are written with the zero point zb: a band
 * row's right padding, the next row's left padding, then bytes of the next row, which its own split
 * writes later.  So the rows of a plane must be split in increasing order and the plane must have 32
 * bytes of slack after its last row (q_dw_fill; no byte of src is read past n). */
__attribute__((target("avx512f,avx512bw"))) static void q_dw_split(const uint8_t *src, long n, uint8_t *ev,
                                                                   uint8_t *od, __m512i zb) {
    /* in each 16-byte lane the 8 even bytes, then the 8 odd ones; then the lanes' even quadwords first */
    const __m512i pairs = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    const __m512i quads = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    for (long i = 0; i < n; i += 64) {
        const __m512i v = n - i >= 64 ? _mm512_loadu_si512(src + i)
                                      : _mm512_mask_loadu_epi8(zb, ((__mmask64)1 << (n - i)) - 1, src + i);
        const __m512i t = _mm512_permutexvar_epi64(quads, _mm512_shuffle_epi8(v, pairs));
        _mm256_storeu_si256((__m256i *)(ev + i / 2), _mm512_castsi512_si256(t));
        _mm256_storeu_si256((__m256i *)(od + i / 2), _mm512_extracti64x4_epi64(t, 1));
    }
}

/* dst[i] = clamp(rint(x[i] / xs) + zp, 0, 255), NaN -> 0: quantize_u8 as everywhere here. */
__attribute__((target("avx512f,avx512bw"))) static void q_dw_quant_row(const float *x, long n, float xs, int zp,
                                                                       uint8_t *dst) {
    const __m512 vs = _mm512_set1_ps(xs), lo = _mm512_set1_ps((float)-zp), hi = _mm512_set1_ps(255.0f - zp);
    const __m512 vz = _mm512_set1_ps((float)zp);
    for (long i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 t = q_div16(_mm512_maskz_loadu_ps(m, x + i), vs); /* (x / xs, exactly where it matters) */
        t = _mm512_max_ps(t, lo); /* NaN -> lo: max returns the second operand */
        t = _mm512_min_ps(t, hi);
        t = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm512_mask_cvtepi32_storeu_epi8(dst + i, m, _mm512_cvtps_epi32(_mm512_add_ps(t, vz)));
    }
}

/* The band of plane p (zero point where there is no input): s1 one band of stride ps,
 * s2 the four parity planes.  A float input is quantized a row at a time into row. */
__attribute__((target("avx512f,avx512bw"))) static void q_dw_fill(const q_dw_args *a, long p, int ch, uint8_t *band,
                                                                  uint8_t *row) {
    const q_dw_params *q = a->q;
    const int zp = (int)q->x_zero[ch];
    const long plane_in = (long)a->h * a->wd;
    const uint8_t *xp = q->xq ? q->xq + p * plane_in : NULL;
    const float *xf = q->xq ? NULL : q->x + p * plane_in;
    const __m512i zbytes = _mm512_set1_epi8((char)zp);
    long i = 0;
    for (; i + 64 <= a->band_bytes; i += 64) _mm512_storeu_si512(band + i, zbytes);
    if (i < a->band_bytes) _mm512_mask_storeu_epi8(band + i, ((__mmask64)1 << (a->band_bytes - i)) - 1, zbytes);
    if (a->sh == 1) {
        for (int iy = 0; iy < a->h; ++iy) {
            uint8_t *dst = band + (iy + a->pt) * a->ps + a->pl;
            if (xp)
                q_dw_copy_bytes(dst, xp + (long)iy * a->wd, a->wd);
            else
                q_dw_quant_row(xf + (long)iy * a->wd, a->wd, q->x_scale[ch], zp, dst);
        }
        return;
    }
    /* padded column pc = pl + ix goes to the column-parity plane pc & 1 at column pc / 2; only
     * pc < 2 ps and padded rows r < 2 (rows of a plane) are read */
    const long n = (long)a->wd < 2 * a->ps - a->pl ? (long)a->wd : 2 * a->ps - a->pl;
    /* the rows a valid output reads (oy + ky / 2 < oh + (kh - 1) / 2); the plane holds at least 67 bytes
     * more (q_dw_vnni's plane_bytes), the slack q_dw_split's whole stores need after the last of them */
    const long rows = (long)a->oh + (a->kh - 1) / 2;
    for (int iy = 0; iy < a->h && n > 0; ++iy) {
        const long r = iy + a->pt;
        if ((r >> 1) >= rows) break;
        uint8_t *even_cols = band + (r & 1) * 2 * a->plane_bytes + (r >> 1) * a->ps; /* P[r & 1][0] */
        uint8_t *odd_cols = even_cols + a->plane_bytes;                              /* P[r & 1][1] */
        const uint8_t *src = xp + (long)iy * a->wd;
        if (!xp) {
            q_dw_quant_row(xf + (long)iy * a->wd, n, q->x_scale[ch], zp, row);
            src = row;
        }
        if ((a->pl & 1) == 0) /* input column 2j is padded column pl + 2j: even */
            q_dw_split(src, n, even_cols + a->pl / 2, odd_cols + a->pl / 2, zbytes);
        else
            q_dw_split(src, n, odd_cols + a->pl / 2, even_cols + (a->pl + 1) / 2, zbytes);
    }
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void q_dw_vnni_task(void *ctx, long begin, long end) {
    const q_dw_args *a = (const q_dw_args *)ctx;
    const q_dw_params *q = a->q;
    const long ps = a->ps, plane_out = (long)a->oh * a->ow;
    const long flat_size = q->yq ? a->flat_bytes : 4 * a->flat_bytes; /* uint8 or float flat outputs */
    /* two bands: plane p + 1's is filled before plane p is computed, so that the loads do not wait
     * on the (masked, unforwardable) stores that just filled their band */
    uint8_t *bands = (uint8_t *)mrt_pack_buffer((size_t)(2 * a->band_bytes + flat_size + a->row_bytes));
    if (!bands) return;
    uint8_t *flat = bands + 2 * a->band_bytes, *row = flat + flat_size;
    float *flatf = (float *)flat; /* band_bytes is a multiple of 4 */
    /* the terms, the same for every plane: per kernel row, weight quads (4 int8 taps as one dword)
     * and where their bytes start relative to flat output 0; byte 4 t + b of the quads is tap
     * tap_of[4 t + b] of the channel's kh * kw (64: a zero byte) */
    long offs[Q_DW_MAX_TERMS];
    uint8_t tap_of[4 * Q_DW_MAX_TERMS];
    int nt = 0;
    for (int ky = 0; ky < a->kh; ++ky)
        for (int j = 0; j < (a->sh == 1 ? (a->kw + 3) / 4 : 2); ++j) {
            for (int t = 0; t < 4; ++t) {
                const int kx = a->sh == 1 ? 4 * j + t : 2 * t + j; /* s2: quad 0 even taps, quad 1 odd */
                tap_of[4 * nt + t] = (uint8_t)(kx < a->kw ? ky * a->kw + kx : 64);
            }
            offs[nt] = a->sh == 1 ? (long)ky * ps + 4 * j
                                  : (ky & 1) * 2 * a->plane_bytes + j * a->plane_bytes + (long)(ky >> 1) * ps;
            ++nt;
        }
    const int ntaps = a->kh * a->kw; /* <= 64 */
    if (begin < end) q_dw_fill(a, begin, (int)(begin % a->c), bands, row);
    for (long p = begin; p < end; ++p) {
        const int ch = (int)(p % a->c);
        const int zp = (int)q->x_zero[ch];
        const uint8_t *band = bands + ((p - begin) & 1) * a->band_bytes;
        if (p + 1 < end) q_dw_fill(a, p + 1, (int)((p + 1) % a->c), bands + ((p + 1 - begin) & 1) * a->band_bytes, row);
        /* the channel's weights (floats holding int8 values) as bytes, their sum, then the quads */
        const float *wk = q->w + (long)ch * ntaps;
        uint8_t wb[80];
        int32_t quads[Q_DW_MAX_TERMS];
        __m512i wsum16 = _mm512_setzero_si512();
        for (int j = 0; j < ntaps; j += 16) {
            const __mmask16 m = ntaps - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ntaps - j)) - 1);
            const __m512i wi = _mm512_cvttps_epi32(_mm512_maskz_loadu_ps(m, wk + j));
            wsum16 = _mm512_add_epi32(wsum16, wi);
            _mm_storeu_si128((__m128i *)(wb + j), _mm512_cvtepi32_epi8(wi));
        }
        wb[64] = 0;
        const int32_t wsum = _mm512_reduce_add_epi32(wsum16);
        for (int t = 0; t < nt; ++t) /* (built in a register: byte stores would not forward to the dword loads) */
            quads[t] = (int32_t)((uint32_t)wb[tap_of[4 * t]] | (uint32_t)wb[tap_of[4 * t + 1]] << 8 |
                                 (uint32_t)wb[tap_of[4 * t + 2]] << 16 | (uint32_t)wb[tap_of[4 * t + 3]] << 24);
        const __m512i corr = _mm512_set1_epi32(zp * wsum);
        const __m512 vs = _mm512_set1_ps(q->scale[ch]), vb = _mm512_set1_ps(q->bias ? q->bias[ch] : 0.0f);
        const float *fold = a->fold ? a->fold + 5L * ch : NULL;
        const __m512 fs = _mm512_set1_ps(fold ? fold[0] : 0.0f), fb = _mm512_set1_ps(fold ? fold[1] : 0.0f);
        const __m512 flo = _mm512_set1_ps(fold ? fold[2] : 0.0f), fhi = _mm512_set1_ps(fold ? fold[3] : 0.0f);
        const __m512 fnear = _mm512_set1_ps(fold ? 0.5f - fold[4] : 0.0f);
        for (long f0 = 0; f0 < a->flat_bytes; f0 += 64) {
            __m512i acc0 = _mm512_setzero_si512(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
            for (int t = 0; t < nt; ++t) {
                const __m512i w4 = _mm512_set1_epi32(quads[t]);
                const uint8_t *r = band + offs[t] + f0;
                acc0 = _mm512_dpbusd_epi32(acc0, _mm512_loadu_si512(r), w4);
                acc1 = _mm512_dpbusd_epi32(acc1, _mm512_loadu_si512(r + 1), w4);
                acc2 = _mm512_dpbusd_epi32(acc2, _mm512_loadu_si512(r + 2), w4);
                acc3 = _mm512_dpbusd_epi32(acc3, _mm512_loadu_si512(r + 3), w4);
            }
            __m512i q0, q1, q2, q3; /* (the folded bytes where they are the step-by-step ones, q_fold_rows) */
            const __mmask16 all = 0xffff;
            const int folded = fold && q_fold16(_mm512_sub_epi32(acc0, corr), all, fs, fb, flo, fhi, fnear, &q0) &&
                               q_fold16(_mm512_sub_epi32(acc1, corr), all, fs, fb, flo, fhi, fnear, &q1) &&
                               q_fold16(_mm512_sub_epi32(acc2, corr), all, fs, fb, flo, fhi, fnear, &q2) &&
                               q_fold16(_mm512_sub_epi32(acc3, corr), all, fs, fb, flo, fhi, fnear, &q3);
            const __m512 s0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc0, corr));
            const __m512 s1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc1, corr));
            const __m512 s2 = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc2, corr));
            const __m512 s3 = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc3, corr));
            if (q->yq) {
                if (!folded) {
                    q0 = q_dw_requant(q, s0, vs, vb), q1 = q_dw_requant(q, s1, vs, vb);
                    q2 = q_dw_requant(q, s2, vs, vb), q3 = q_dw_requant(q, s3, vs, vb);
                }
                /* byte 4 i + s of the 64 is lane i of vector s */
                const __m512i bytes = _mm512_or_si512(_mm512_or_si512(q0, _mm512_slli_epi32(q1, 8)),
                                                      _mm512_or_si512(_mm512_slli_epi32(q2, 16), _mm512_slli_epi32(q3, 24)));
                _mm512_storeu_si512(flat + f0, bytes);
                continue;
            }
            /* v_s lane i is output 4 i + s: r_j 128-bit lane k holds outputs 16 k + 4 j .. + 3,
             * then out_m = (r_0, r_1, r_2, r_3) lane m is outputs 16 m .. 16 m + 15 */
            const __m512 v0 = q_dw_epilogue(q, s0, vs, vb), v1 = q_dw_epilogue(q, s1, vs, vb);
            const __m512 v2 = q_dw_epilogue(q, s2, vs, vb), v3 = q_dw_epilogue(q, s3, vs, vb);
            const __m512d ab_lo = _mm512_castps_pd(_mm512_unpacklo_ps(v0, v1));
            const __m512d ab_hi = _mm512_castps_pd(_mm512_unpackhi_ps(v0, v1));
            const __m512d cd_lo = _mm512_castps_pd(_mm512_unpacklo_ps(v2, v3));
            const __m512d cd_hi = _mm512_castps_pd(_mm512_unpackhi_ps(v2, v3));
            const __m512 r0 = _mm512_castpd_ps(_mm512_unpacklo_pd(ab_lo, cd_lo));
            const __m512 r1 = _mm512_castpd_ps(_mm512_unpackhi_pd(ab_lo, cd_lo));
            const __m512 r2 = _mm512_castpd_ps(_mm512_unpacklo_pd(ab_hi, cd_hi));
            const __m512 r3 = _mm512_castpd_ps(_mm512_unpackhi_pd(ab_hi, cd_hi));
            const __m512 t0 = _mm512_shuffle_f32x4(r0, r1, _MM_SHUFFLE(1, 0, 1, 0));
            const __m512 t1 = _mm512_shuffle_f32x4(r0, r1, _MM_SHUFFLE(3, 2, 3, 2));
            const __m512 t2 = _mm512_shuffle_f32x4(r2, r3, _MM_SHUFFLE(1, 0, 1, 0));
            const __m512 t3 = _mm512_shuffle_f32x4(r2, r3, _MM_SHUFFLE(3, 2, 3, 2));
            _mm512_storeu_ps(flatf + f0, _mm512_shuffle_f32x4(t0, t2, _MM_SHUFFLE(2, 0, 2, 0)));
            _mm512_storeu_ps(flatf + f0 + 16, _mm512_shuffle_f32x4(t0, t2, _MM_SHUFFLE(3, 1, 3, 1)));
            _mm512_storeu_ps(flatf + f0 + 32, _mm512_shuffle_f32x4(t1, t3, _MM_SHUFFLE(2, 0, 2, 0)));
            _mm512_storeu_ps(flatf + f0 + 48, _mm512_shuffle_f32x4(t1, t3, _MM_SHUFFLE(3, 1, 3, 1)));
        }
        if (q->yq) {
            uint8_t *yp = q->yq + p * plane_out;
            q_dw_rows_out(yp, flat, a->oh, a->ow, ps);
        } else {
            float *yp = q->y + p * plane_out;
            for (int oy = 0; oy < a->oh; ++oy) q_dw_copy_floats(yp + (long)oy * a->ow, flatf + oy * ps, a->ow);
        }
    }
}

/* 1 when the VNNI path ran the call (see the top of this file), 0 when the caller must. */
static int q_dw_vnni(const q_dw_params *q, int n, int c, int h, int wd, int kh, int kw, int sh, int sw, int dh,
                     int dw, int pt, int pl, int oh, int ow, int nthreads) {
    if (!q_use_vnni || !q_bw() || q->res) return 0;
    if (sh != sw || (sh != 1 && sh != 2) || dh != 1 || dw != 1 || kw > 8 || kh > 8) return 0;
    if (q->act != MRT_ACT_NONE && q->act != MRT_ACT_RELU && q->act != MRT_ACT_CLIP && q->act != MRT_ACT_HARDSWISH)
        return 0;
    q_dw_args a;
    a.fold = NULL;
    a.q = q; a.c = c; a.h = h; a.wd = wd; a.kh = kh; a.kw = kw; a.sh = sh; a.pt = pt; a.pl = pl; a.oh = oh; a.ow = ow;
    a.row_bytes = q->xq ? 0 : ((long)wd + 63) / 64 * 64;
    if (sh == 1) {
        a.ps = (long)ow + kw - 1; /* pl + wd + right padding */
        if (a.ps < (long)pl + wd || (long)oh + kh - 1 < (long)pt + h) return 0; /* input cut off: not a Conv shape */
        a.plane_bytes = 0;
        a.flat_bytes = ((long)oh * a.ps + 63) / 64 * 64;
        /* the last block reads up to flat_bytes - 1 + (kh - 1) ps + 3 + 4 (nq - 1) + 63 */
        a.band_bytes = (a.flat_bytes + (long)(kh - 1) * a.ps + 3 + 4L * ((kw + 3) / 4 - 1) + 64 + 63) / 64 * 64;
    } else {
        a.ps = (long)ow + (kw - 1) / 2; /* a plane's row: the even (odd) padded columns output ox reads */
        a.flat_bytes = ((long)oh * a.ps + 63) / 64 * 64;
        /* rows oy + ky / 2 of each plane; the last block reads up to flat_bytes - 1 + (kh - 1) / 2 ps + 3 + 63 */
        const long rows = (long)oh + (kh - 1) / 2;
        a.plane_bytes = ((a.flat_bytes + (long)(kh - 1) / 2 * a.ps + 3 + 64 > rows * a.ps
                              ? a.flat_bytes + (long)(kh - 1) / 2 * a.ps + 3 + 64
                              : rows * a.ps) + 63) / 64 * 64;
        a.plane_bytes = (a.plane_bytes + a.ps - 1) / a.ps * a.ps; /* whole rows: q_dw_fill counts them */
        a.band_bytes = 4 * a.plane_bytes;
    }
    float *fold = NULL;
    if (q->yq) {
        fold = (float *)malloc(sizeof(float) * 5 * (size_t)c);
        const int32_t yz = q->y_zero;
        if (fold && q_fold_rows(c, q->scale, q->bias, &q->y_scale, &yz, 0, q->act, q->a0, q->a1, q->post_a,
                                q->post_b, fold))
            a.fold = fold;
    }
    mrt_parallel_for((long)n * c, (long)oh * ow * kh * kw, nthreads, q_dw_vnni_task, &a);
    free(fold);
    return 1;
}
#undef Q_DW_MAX_TERMS
#endif
