/* 4-bit block-quantized products: mrt_qnbits_matmul (kernels.h), the native form of
 * com.microsoft::MatMulNBits at accuracy_level 4 (minirt/kernels/decoder.py, _matmul_int8), the
 * product of onnxruntime-genai's int4 decoders.
 *
 * A is quantized per call, per row and per block of bs values, to int8 symmetrically
 * (nb_quantize_rows: the same float32 operations as _matmul_int8, so the same integers).  The
 * weights are repacked once (minirt/kernels/decoder.py, _pack_nibbles) so that one vector of the
 * widest ISA holds 16 columns side by side: per group of 16 columns and per chunk of 32 K values,
 * four 64-byte rows j = 0..3, byte 4 * l + t of row j holding in its low nibble q[column l, k = 4j + t]
 * and in its high nibble q[column l, k = 16 + 4j + t] (columns past N are zero).  Each 32-bit lane is
 * then one column's four consecutive K values, against which four consecutive activations,
 * broadcast, make one dot-product instruction (vpdpbusd / vpmaddubsw + vpmaddwd / SDOT) per 16 (or 8
 * or 4) columns.
 *
 *   y[m, n] = sum_blk (ws[n, blk] * as[m, blk] * (q[n, blk] . qa[m, blk]) - zs[n, blk] * asa[m, blk])
 *             + bias[n]
 *
 * with q the unsigned nibbles (0..15), zs = scale * zero point (packed like the scales; NULL: the
 * zero point 8 of a model without zero points, zs = 8 x the scales, not stored: a quarter less to read)
 * and asa = as * sum(qa over the block): (q - zp) . qa = q . qa - zp * sum(qa), the dot products
 * exact in int32 (|q . qa| <= 15 * 127 * bs).  Only the float sums' order differs from
 * onnxruntime's (a few ulps of the partial sums).  Threads split the column groups; rows go up to
 * four (eight on AVX-512 VNNI) at a time so that a group's unpacked weights serve them all (prefill). */

#define NB_ROWS 4  /* rows sharing one group's unpacked weights */
#define NB_VNNI_ROWS 8 /* ... on AVX-512 VNNI (32 vector registers: 8 int32 sums + 8 float accumulators) */
#define NB_GROUP 16 /* columns per group (one 512-bit vector of int32 lanes) */

typedef struct {
    const mrt_qnbits_weights *w;
    const int8_t *qa; /* [M, kb * bs]: the quantized rows (zeros past K) */
    const float *as;  /* [M, kb]: each block's activation scale */
    const float *asa; /* [M, kb]: activation scale * sum of the block's qa */
    float *y;         /* [M, N] */
    int M;
    long kc, kb;      /* chunks (32 values) and blocks per row */
} nb_job;

/* Quantize rows [m0, m1) of a (M, K) into qa / as / asa. */
static void nb_quantize_rows(const float *a, int K, int bs, long kb, int8_t *qa, float *as, float *asa, int m0,
                             int m1) {
    const long kp = kb * bs;
    for (int m = m0; m < m1; m++) {
        const float *row = a + (long)m * K;
        int8_t *q = qa + (long)m * kp;
        for (long blk = 0; blk < kb; blk++) {
            const long k0 = blk * bs;
            const long n = K - k0 < bs ? K - k0 : bs; /* (the last block may be short: zeros after K) */
            float amax = 0.0f;
            for (long i = 0; i < n; i++) {
                const float v = fabsf(row[k0 + i]);
                amax = v > amax ? v : amax;
            }
            const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (long i = 0; i < bs; i++) {
                const int v = i < n ? (int)nearbyintf(row[k0 + i] * inv) : 0; /* half to even, as np.rint */
                sum += v;
                q[k0 + i] = (int8_t)v;
            }
            as[(long)m * kb + blk] = amax / 127.0f;
            asa[(long)m * kb + blk] = amax / 127.0f * (float)sum;
        }
    }
}

/* y[m, n0:n1] = bias[n] (or 0) for every row, before the block loops add their sums. */
static void nb_init_rows(const nb_job *j, long n0, long n1) {
    const mrt_qnbits_weights *w = j->w;
    for (int m = 0; m < j->M; m++) {
        float *y = j->y + (long)m * w->N;
        for (long n = n0; n < n1; n++) y[n] = w->bias ? w->bias[n] : 0.0f;
    }
}

/* The packed bytes of group g, chunk c (4 rows of 64 bytes); the 16 scales (and scale * zero point) of
 * group g, block b. */
#define NB_CHUNK_AT(w, g, kc, c) ((w)->b + (((long)(g) * (kc) + (c)) * 256))
#define NB_SCALES_AT(w, g, kb, b) ((w)->scales + (((long)(g) * (kb) + (b)) * NB_GROUP))
#define NB_ZS_AT(w, g, kb, b) ((w)->zs + (((long)(g) * (kb) + (b)) * NB_GROUP))

/* ---------------------------------------------------------------- plain C */

static void nb_groups_base(const nb_job *j, long g0, long g1) {
    const mrt_qnbits_weights *w = j->w;
    const long kc = j->kc, kb = j->kb, cpb = w->block_size / 32, kp = kb * w->block_size;
    for (long g = g0; g < g1; g++) {
        const int cols = w->N - g * NB_GROUP < NB_GROUP ? (int)(w->N - g * NB_GROUP) : NB_GROUP;
        for (int m = 0; m < j->M; m++) {
            const int8_t *qa = j->qa + (long)m * kp;
            float acc[NB_GROUP] = {0};
            for (long b = 0; b < kb; b++) {
                int32_t d[NB_GROUP] = {0};
                for (long c = b * cpb; c < (b + 1) * cpb; c++) {
                    const uint8_t *p = NB_CHUNK_AT(w, g, kc, c);
                    const int8_t *q = qa + c * 32;
                    for (int r = 0; r < 4; r++)
                        for (int l = 0; l < NB_GROUP; l++)
                            for (int t = 0; t < 4; t++) {
                                const uint8_t v = p[r * 64 + 4 * l + t];
                                d[l] += (int32_t)(v & 15) * q[4 * r + t] + (int32_t)(v >> 4) * q[16 + 4 * r + t];
                            }
                }
                const float *ws = NB_SCALES_AT(w, g, kb, b), *zs = w->zs ? NB_ZS_AT(w, g, kb, b) : ws;
                const float as = j->as[(long)m * kb + b], asa = j->asa[(long)m * kb + b] * (w->zs ? 1.0f : 8.0f);
                for (int l = 0; l < NB_GROUP; l++) acc[l] += (float)d[l] * (ws[l] * as) - zs[l] * asa;
            }
            float *y = j->y + (long)m * w->N + g * NB_GROUP;
            for (int l = 0; l < cols; l++) y[l] += acc[l];
        }
    }
}

/* ---------------------------------------------------------------- x86-64 */

#ifdef MRT_HAVE_VNNI_BUILD
#define NB_TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

/* Rows [m0, m0 + ROWS) of group g, ROWS a compile-time constant (1 .. NB_VNNI_ROWS: the accumulators stay
 * in registers; a runtime count kept them on the stack).  Per 64-byte row of a chunk: the low nibbles
 * (and 0x0F) and the high ones shifted down, each row's 4 activations broadcast, one vpdpbusd per nibble
 * half into one int32 sum per row (|sum| <= 15 * 127 * block_size: exact), converted and scaled per block. */
NB_TARGET_VNNI static inline __attribute__((always_inline)) void nb_vnni_rows(const nb_job *j, long g, int m0,
                                                                            const int ROWS) {
    const mrt_qnbits_weights *w = j->w;
    const long kc = j->kc, kb = j->kb, cpb = w->block_size / 32, kp = kb * w->block_size;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const float zmul = w->zs ? 1.0f : 8.0f; /* (no zero points: zs = 8 x the scales, not stored) */
    const int8_t *qa = j->qa + (long)m0 * kp;
    __m512 acc[NB_VNNI_ROWS];
    for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (long b = 0; b < kb; b++) {
        __m512i d[NB_VNNI_ROWS];
        for (int r = 0; r < ROWS; r++) d[r] = _mm512_setzero_si512();
        for (long c = b * cpb; c < (b + 1) * cpb; c++) {
            const uint8_t *p = NB_CHUNK_AT(w, g, kc, c);
            for (int i = 0; i < 4; i++) {
                const __m512i v = _mm512_loadu_si512((const void *)(p + 64 * i));
                const __m512i wl = _mm512_and_si512(v, low4), wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                for (int r = 0; r < ROWS; r++) {
                    const int8_t *q = qa + (long)r * kp + c * 32 + 4 * i;
                    d[r] = _mm512_dpbusd_epi32(d[r], wl, _mm512_set1_epi32(*(const int32_t *)q));
                    d[r] = _mm512_dpbusd_epi32(d[r], wh, _mm512_set1_epi32(*(const int32_t *)(q + 16)));
                }
            }
        }
        const __m512 ws = _mm512_loadu_ps(NB_SCALES_AT(w, g, kb, b));
        const __m512 zs = w->zs ? _mm512_loadu_ps(NB_ZS_AT(w, g, kb, b)) : ws;
        for (int r = 0; r < ROWS; r++) {
            const long mb = (long)(m0 + r) * kb + b;
            const __m512 sc = _mm512_mul_ps(ws, _mm512_set1_ps(j->as[mb]));
            acc[r] = _mm512_fnmadd_ps(zs, _mm512_set1_ps(j->asa[mb] * zmul), _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r]), sc, acc[r]));
        }
    }
    const long n = g * NB_GROUP;
    const __mmask16 keep = w->N - n >= NB_GROUP ? (__mmask16)0xFFFF : (__mmask16)((1u << (w->N - n)) - 1);
    for (int r = 0; r < ROWS; r++) {
        float *y = j->y + (long)(m0 + r) * w->N + n;
        _mm512_mask_storeu_ps(y, keep, _mm512_add_ps(_mm512_maskz_loadu_ps(keep, y), acc[r]));
    }
}

NB_TARGET_VNNI static void nb_groups_vnni(const nb_job *j, long g0, long g1) {
    for (long g = g0; g < g1; g++) {
        int m0 = 0;
        for (; m0 + NB_VNNI_ROWS <= j->M; m0 += NB_VNNI_ROWS) nb_vnni_rows(j, g, m0, NB_VNNI_ROWS);
        switch (j->M - m0) { /* the last rows: one specialized pass */
        case 7: nb_vnni_rows(j, g, m0, 7); break;
        case 6: nb_vnni_rows(j, g, m0, 6); break;
        case 5: nb_vnni_rows(j, g, m0, 5); break;
        case 4: nb_vnni_rows(j, g, m0, 4); break;
        case 3: nb_vnni_rows(j, g, m0, 3); break;
        case 2: nb_vnni_rows(j, g, m0, 2); break;
        case 1: nb_vnni_rows(j, g, m0, 1); break;
        default: break;
        }
    }
}

/* AVX2: a 64-byte row is two vectors of 8 columns; vpmaddubsw's int16 pair sums need the nibbles
 * themselves (2 x 15 x 127 fits, 2 x 240 x 127 would saturate), so the high ones are shifted down. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void nb_avx2_rows(
    const nb_job *j, long g, int half, int m0, const int rows) { /* (rows: a constant, see nb_vnni_rows) */
    const mrt_qnbits_weights *w = j->w;
    const long kc = j->kc, kb = j->kb, cpb = w->block_size / 32, kp = kb * w->block_size;
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const float zmul = w->zs ? 1.0f : 8.0f; /* (no zero points: zs = 8 x the scales, not stored) */
    __m256 acc[NB_ROWS];
    for (int r = 0; r < NB_ROWS; r++) acc[r] = _mm256_setzero_ps();
    for (long b = 0; b < kb; b++) {
        __m256i d[NB_ROWS];
        for (int r = 0; r < NB_ROWS; r++) d[r] = _mm256_setzero_si256();
        for (long c = b * cpb; c < (b + 1) * cpb; c++) {
            const uint8_t *p = NB_CHUNK_AT(w, g, kc, c) + 32 * half;
            for (int i = 0; i < 4; i++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 64 * i));
                const __m256i wl = _mm256_and_si256(v, low4), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                for (int r = 0; r < rows; r++) {
                    const int8_t *q = j->qa + (long)(m0 + r) * kp + c * 32 + 4 * i;
                    const __m256i pl = _mm256_maddubs_epi16(wl, _mm256_set1_epi32(*(const int32_t *)q));
                    const __m256i ph = _mm256_maddubs_epi16(wh, _mm256_set1_epi32(*(const int32_t *)(q + 16)));
                    /* (|pl + ph| <= 4 x 15 x 127: int16) */
                    d[r] = _mm256_add_epi32(d[r], _mm256_madd_epi16(_mm256_add_epi16(pl, ph), ones));
                }
            }
        }
        const __m256 ws = _mm256_loadu_ps(NB_SCALES_AT(w, g, kb, b) + 8 * half);
        const __m256 zs = w->zs ? _mm256_loadu_ps(NB_ZS_AT(w, g, kb, b) + 8 * half) : ws;
        for (int r = 0; r < rows; r++) {
            const long mb = (long)(m0 + r) * kb + b;
            const __m256 sc = _mm256_mul_ps(ws, _mm256_set1_ps(j->as[mb]));
            acc[r] = _mm256_fnmadd_ps(zs, _mm256_set1_ps(j->asa[mb] * zmul), _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[r]), sc, acc[r]));
        }
    }
    const long n = g * NB_GROUP + 8 * half;
    const int cols = w->N - n < 8 ? (int)(w->N - n) : 8;
    for (int r = 0; r < rows; r++) {
        float *y = j->y + (long)(m0 + r) * w->N + n;
        if (cols == 8) {
            _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y), acc[r]));
        } else {
            float t[8];
            _mm256_storeu_ps(t, acc[r]);
            for (int l = 0; l < cols; l++) y[l] += t[l];
        }
    }
}

__attribute__((target("avx2,fma"))) static void nb_groups_avx2(const nb_job *j, long g0, long g1) {
    for (long g = g0; g < g1; g++)
        for (int half = 0; half < 2 && g * NB_GROUP + 8 * half < j->w->N; half++)
            for (int m0 = 0; m0 < j->M; m0 += NB_ROWS)
                switch (j->M - m0 < NB_ROWS ? j->M - m0 : NB_ROWS) {
                case 4: nb_avx2_rows(j, g, half, m0, 4); break;
                case 3: nb_avx2_rows(j, g, half, m0, 3); break;
                case 2: nb_avx2_rows(j, g, half, m0, 2); break;
                default: nb_avx2_rows(j, g, half, m0, 1); break;
                }
}
#endif

/* ---------------------------------------------------------------- aarch64 */

#ifdef MRT_HAVE_NEON_BUILD
/* A 64-byte row is four vectors of 4 columns.  Without the dot product: the 16 products of a vector
 * and the broadcast activations are widened in two halves, added pairwise to (column, k pair) int16
 * sums (|2 x 15 x 127| fits) and accumulated pairwise into the 4 column lanes. */
static inline int32x4_t nb_neon_dot4(int32x4_t acc, int8x16_t w, int8x16_t q) {
    const int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(q)), hi = vmull_s8(vget_high_s8(w), vget_high_s8(q));
    return vpadalq_s16(acc, vpaddq_s16(lo, hi));
}

/* The block's int32 sums d (4 x 4 columns) scaled into acc, the zero-point term subtracted (both NEON levels). */
static inline void nb_neon_block(const nb_job *j, long g, int m, long b, const int32x4_t d[4], float32x4_t acc[4]) {
    const mrt_qnbits_weights *w = j->w;
    const float *ws = NB_SCALES_AT(w, g, j->kb, b), *zs = w->zs ? NB_ZS_AT(w, g, j->kb, b) : ws;
    const float as = j->as[(long)m * j->kb + b], asa = j->asa[(long)m * j->kb + b] * (w->zs ? 1.0f : 8.0f);
    for (int v = 0; v < 4; v++)
        acc[v] = vmlsq_n_f32(vfmaq_f32(acc[v], vcvtq_f32_s32(d[v]), vmulq_n_f32(vld1q_f32(ws + 4 * v), as)),
                             vld1q_f32(zs + 4 * v), asa);
}

/* acc (16 columns of row m) added to y, the columns past N left out. */
static inline void nb_neon_store(const nb_job *j, long g, int m, const float32x4_t acc[4]) {
    const long n = g * NB_GROUP;
    const int cols = j->w->N - n < NB_GROUP ? (int)(j->w->N - n) : NB_GROUP;
    float t[NB_GROUP], *y = j->y + (long)m * j->w->N + n;
    for (int v = 0; v < 4; v++) vst1q_f32(t + 4 * v, acc[v]);
    for (int l = 0; l < cols; l++) y[l] += t[l];
}

static void nb_groups_neon(const nb_job *j, long g0, long g1) {
    const mrt_qnbits_weights *w = j->w;
    const long kc = j->kc, kb = j->kb, cpb = w->block_size / 32, kp = kb * w->block_size;
    const uint8x16_t low4 = vdupq_n_u8(15);
    for (long g = g0; g < g1; g++) {
        for (int m = 0; m < j->M; m++) {
            float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
            for (long b = 0; b < kb; b++) {
                int32x4_t d[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
                for (long c = b * cpb; c < (b + 1) * cpb; c++) {
                    const uint8_t *p = NB_CHUNK_AT(w, g, kc, c);
                    const int8_t *q = j->qa + (long)m * kp + c * 32;
                    for (int i = 0; i < 4; i++) {
                        const int8x16_t ql = vreinterpretq_s8_s32(vld1q_dup_s32((const int32_t *)(q + 4 * i)));
                        const int8x16_t qh = vreinterpretq_s8_s32(vld1q_dup_s32((const int32_t *)(q + 16 + 4 * i)));
                        for (int v = 0; v < 4; v++) {
                            const uint8x16_t bb = vld1q_u8(p + 64 * i + 16 * v);
                            d[v] = nb_neon_dot4(d[v], vreinterpretq_s8_u8(vandq_u8(bb, low4)), ql);
                            d[v] = nb_neon_dot4(d[v], vreinterpretq_s8_u8(vshrq_n_u8(bb, 4)), qh);
                        }
                    }
                }
                nb_neon_block(j, g, m, b, d, acc);
            }
            nb_neon_store(j, g, m, acc);
        }
    }
}

/* ARMv8.2 dot product: SDOT by lane, the activations' 4-byte group i of the chunk's first / second half. */
MRT_TARGET_DOTPROD static void nb_groups_dotprod(const nb_job *j, long g0, long g1) {
    const mrt_qnbits_weights *w = j->w;
    const long kc = j->kc, kb = j->kb, cpb = w->block_size / 32, kp = kb * w->block_size;
    const uint8x16_t low4 = vdupq_n_u8(15);
    for (long g = g0; g < g1; g++) {
        for (int m = 0; m < j->M; m++) {
            float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
            for (long b = 0; b < kb; b++) {
                int32x4_t d[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
                for (long c = b * cpb; c < (b + 1) * cpb; c++) {
                    const uint8_t *p = NB_CHUNK_AT(w, g, kc, c);
                    const int8_t *q = j->qa + (long)m * kp + c * 32;
                    const int8x16_t ql = vld1q_s8(q), qh = vld1q_s8(q + 16);
#define NB_DOT_ROW(i)                                                                                                \
    for (int v = 0; v < 4; v++) {                                                                                    \
        const uint8x16_t bb = vld1q_u8(p + 64 * (i) + 16 * v);                                                       \
        d[v] = vdotq_laneq_s32(d[v], vreinterpretq_s8_u8(vandq_u8(bb, low4)), ql, (i));                              \
        d[v] = vdotq_laneq_s32(d[v], vreinterpretq_s8_u8(vshrq_n_u8(bb, 4)), qh, (i));                               \
    }
                    NB_DOT_ROW(0)
                    NB_DOT_ROW(1)
                    NB_DOT_ROW(2)
                    NB_DOT_ROW(3)
#undef NB_DOT_ROW
                }
                nb_neon_block(j, g, m, b, d, acc);
            }
            nb_neon_store(j, g, m, acc);
        }
    }
}
#endif

typedef void (*nb_groups_fn)(const nb_job *, long, long);

typedef struct {
    const nb_job *job;
    nb_groups_fn groups;
} nb_task_ctx;

static void nb_task(void *ctx, long begin, long end) {
    const nb_task_ctx *t = (const nb_task_ctx *)ctx;
    const long N = t->job->w->N;
    nb_init_rows(t->job, begin * NB_GROUP, end * NB_GROUP < N ? end * NB_GROUP : N);
    t->groups(t->job, begin, end);
}

/* The implementation for the selected ISA (mrt_select_isa's flags). */
static nb_groups_fn nb_select(void) {
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_use_vnni) return nb_groups_vnni;
    if (q_use_avx2) return nb_groups_avx2;
#endif
#ifdef MRT_HAVE_NEON_BUILD
    if (q_use_dotprod) return nb_groups_dotprod;
    if (q_use_neon) return nb_groups_neon;
#endif
    return nb_groups_base;
}

long mrt_qnbits_workspace(int M, int K, int block_size) {
    if (M <= 0 || K <= 0 || block_size < 32 || (block_size & (block_size - 1))) return -2;
    const long kb = (K + block_size - 1) / block_size;
    return (long)M * kb * block_size + 2L * M * kb * (long)sizeof(float);
}

int mrt_qnbits_matmul(const mrt_qnbits_weights *w, const float *a, int M, float *y, void *workspace, int nthreads) {
    if (!w || !a || !y || M <= 0 || w->N <= 0 || w->K <= 0 || w->block_size < 32 ||
        (w->block_size & (w->block_size - 1)) || !w->b || !w->scales)
        return -2;
    const long kb = (w->K + w->block_size - 1) / w->block_size;
    void *own = NULL;
    if (!workspace) { /* (a few KB per row: the caller may leave it to us) */
        own = workspace = malloc((size_t)mrt_qnbits_workspace(M, w->K, w->block_size));
        if (!own) return -1;
    }
    nb_job job;
    job.w = w;
    job.qa = (const int8_t *)workspace;
    job.as = (const float *)((char *)workspace + (long)M * kb * w->block_size);
    job.asa = job.as + (long)M * kb;
    job.y = y;
    job.M = M;
    job.kc = kb * w->block_size / 32;
    job.kb = kb;
    nb_quantize_rows(a, w->K, w->block_size, kb, (int8_t *)job.qa, (float *)job.as, (float *)job.asa, 0, M);
    nb_task_ctx t = {&job, nb_select()};
    const long groups = (w->N + NB_GROUP - 1) / NB_GROUP;
    mrt_parallel_for(groups, (long)NB_GROUP * job.kc * 32 * M / 4, nthreads, nb_task, &t);
    free(own);
    return 0;
}
