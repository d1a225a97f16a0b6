/* int8 GEMM (u8 activations x s8 weights -> s32) with a float epilogue;
 * included once by kernels.c after the thread pool.
 *
 *   C[m, n] = act(scale[m] * (sum_k W[m, k] * X[k, n] - x_zero * rowsum[m]) + bias[m] + res[m, n])
 *
 * i.e. the weights are symmetric (zero point 0, any per-row scale) and the
 * activations are uint8 with one zero point: exactly (X - x_zero) @ W^T in
 * integers, then dequantized.  Every product is exact in int32 (no int16
 * intermediate, so no saturation for any u8/s8 values); K up to 2^16 cannot
 * overflow int32 (255 * 128 * 65536 < 2^31).
 *
 * Weights are packed once (mrt_qgemm_pack_w): per row the K int8 values
 * padded to a multiple of 4 with zeros, preceded by the int32 row sums.
 * Activations are packed per block into panels of 32 columns where each
 * column holds 4 consecutive k ([k/4][32][4] bytes), the layout of the
 * x86 VNNI instruction vpdpbusd (u8 x s8, 4-way dot product into s32,
 * no intermediate saturation).  Implementations:
 *   - AVX512-VNNI (runtime-detected): 6 x 32 tile, 12 zmm accumulators;
 *   - aarch64 dot product (SDOT, ARMv8.2: Pi 5; runtime-detected from
 *     HWCAP_ASIMDDP): SDOT is s8 x s8, so the activations are packed as
 *     x - 128 (an XOR with 0x80 in the NEON packing) and the 128 * rowsum[m]
 *     this removes is put back in the epilogue's zero-point correction
 *     (exact: it only changes the effective zero point to x_zero - 128);
 *     6 x 16 half-tiles, 24 NEON accumulators, SDOT by lane;
 *   - baseline: the same tiling in plain C (int32), any CPU (on aarch64 the
 *     activations are packed with NEON ld1/st4 unless the baseline is forced).
 *   - AVX2 without VNNI: vpmaddubsw where no pair of products can saturate
 *     int16 (pairs of weights with |w0| + |w1| <= 128, as the builder makes
 *     them for AVX2 targets: q_avx2_bytes_tile); else, weights in
 *     [-127, 127], centred activations |x - 128| times the weights given
 *     the sign of x - 128 (q_avx2_bytes_tile, centred); else both operands widened
 *     to int16 for vpmaddwd (q_avx2_tile, the float FMA rate).
 * Convolutions with a window larger than 1x1 over wide planes skip the
 * im2col matrix and the activation packing: their B panels are read in place
 * from channel-quad planes (q_conv_implicit, 8 x 32 tiles); small images
 * (planes of at most 64 pixels, VNNI), side by side or one at a time, are
 * im2col'ed straight into the packed panels (q_im2col_panels_task,
 * q_im2col_panels1_task).  X may also be stored by columns (a
 * QMatMul's rows of activations: q_pack_xt); see q_x_layout.
 */
#include <stdint.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MRT_HAVE_VNNI_BUILD 1
#endif
/* AMX tiles (Sapphire Rapids and later): the compiler must know the tile instructions (GCC 11, clang 12) */
#if defined(MRT_HAVE_VNNI_BUILD) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define MRT_HAVE_AMX_BUILD 1
#endif
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_neon.h>
#define MRT_HAVE_NEON_BUILD 1
/* GCC 12's arm_neon.h declares the dot-product intrinsics under
 * "arch=armv8.2-a+dotprod": the function using them needs that target. */
#if defined(__clang__)
#define MRT_TARGET_DOTPROD __attribute__((target("dotprod")))
#else
#define MRT_TARGET_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#endif

#define Q_MR 6
#define Q_NR 32
#define Q_NC 256 /* columns per block (multiple of Q_NR) */
#define Q_CONV_BATCH_COLS 256 /* conv: images side by side up to about this many GEMM columns (D22) */
/* ... except a 1x1 / stride 1 / unpadded kernel over planes of at least this many pixels: one GEMM per image,
 * as the float conv does (MRT_CONV_DIRECT_MIN_PIXELS in kernels.c): PP-OCR cls int8, 6 images of 2 x 96
 * pixels, 1.3-1.7 % faster on AVX2 (its 1x1 layers' copies in and out of the side-by-side block gone). */
#define Q_CONV_DIRECT_MIN_PIXELS 16
#define Q_PACK_QUANT_BYTES (512 * 1024) /* 1x1 conv: float images up to this size are quantized while packed */

int q_use_vnni;    /* set by mrt_select_isa */
int q_use_neon;    /* aarch64: NEON activation packing (set by mrt_select_isa) */
int q_use_dotprod; /* aarch64: SDOT microkernel (set by mrt_select_isa) */
int q_use_avx2;    /* x86-64 with AVX2: its quantize loop, activations, and the int8 microkernels below
                    * when there is no VNNI (set by mrt_select_isa) */
int q_use_amx;     /* x86-64 with AMX-INT8 whose tiles the OS lets this process use: the tile
                    * microkernel q_ukr_amx for the GEMMs q_amx_step takes (set by mrt_select_isa) */
/* the activation pass of the epilogue, for the selected ISA */
static void (*q_act_row)(float *, long, int, float, float) = act_row_base;

#ifdef MRT_HAVE_VNNI_BUILD
/* AVX512BW (masked byte loads/stores of the matrix-vector path and the narrow im2col); every
 * AVX512-VNNI CPU has it, checked anyway */
static int q_bw(void) {
    static int v = -1;
    if (v < 0) v = __builtin_cpu_supports("avx512bw") ? 1 : 0;
    return v;
}
#endif

static inline long q_k4(int K) { return ((long)K + 3) / 4 * 4; }

#ifdef MRT_HAVE_VNNI_BUILD
/* q_pairs16's first n / 32 * 32 weights on AVX2: |w| as unsigned bytes (|-128| = 128), pairs added by
 * vpmaddubsw against ones (at most 256: no saturation); returns how many it checked, or -1 on a pair over 128 */
__attribute__((target("avx2"))) static long q_pairs16_avx2(const int8_t *w, long n) {
    const __m256i ones = _mm256_set1_epi8(1), limit = _mm256_set1_epi16(128);
    __m256i over = _mm256_setzero_si256();
    long j = 0;
    for (; j + 32 <= n; j += 32) {
        const __m256i mag = _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)(w + j)));
        over = _mm256_or_si256(over, _mm256_cmpgt_epi16(_mm256_maddubs_epi16(mag, ones), limit));
    }
    return _mm256_testz_si256(over, over) ? j : -1;
}
#endif

/* 1 when every pair w[2j], w[2j + 1] of the n (even) weights has |w[2j]| + |w[2j + 1]| <= 128: a u8 x s8
 * pair of products then fits int16 (Q_W_PAIRS16). */
static int q_pairs16(const int8_t *w, long n) {
    long j = 0;
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_use_avx2 && (j = q_pairs16_avx2(w, n)) < 0) return 0;
#endif
    for (; j + 1 < n; j += 2) {
        const int a = w[j] < 0 ? -w[j] : w[j], b = w[j + 1] < 0 ? -w[j + 1] : w[j + 1];
        if (a + b > 128) return 0;
    }
    return 1;
}

/* Packed weights: M int32 row sums, M rows of k4 int8, then one int32 of Q_W_* flags (q_packed_flags). */
long mrt_qgemm_packed_size(int M, int K) { return (long)M * 4 + (long)M * q_k4(K) + 4; }

/* What mrt_qgemm_pack_w found in the weights, for AVX2 without VNNI (whose vpmaddubsw adds two u8 x s8
 * products into a saturating int16):
 *   Q_W_PAIRS16: every pair the kernels multiply side by side (k = 2j and 2j + 1 of a packed row) has
 *     |w0| + |w1| <= 128, so the pair of products fits int16 (255 x 128 = 32640 < 32767) and
 *     q_avx2_bytes_tile is exact.  The builder limits the pairs so for AVX2 targets (limit_pair_sums,
 *     D172): 8-bit weights of which only the pairs of two large values lose a step or two.
 *   Q_W_SYMMETRIC: no weight is -128 (every quantizer here, and onnxruntime's, stores [-127, 127]), which
 *     q_avx2_bytes_tile, centred needs (it negates weights).
 * Weights with neither take the int16 widening tile (q_avx2_tile, D80). */
#define Q_W_PAIRS16 1
#define Q_W_SYMMETRIC 2
static inline int q_packed_flags(const void *packed, int M, int K) {
    int32_t flags;
    memcpy(&flags, (const char *)packed + (long)M * 4 + (long)M * q_k4(K), 4);
    return flags;
}

int mrt_qgemm_packed_pairs16(const void *packed, int M, int K) { return q_packed_flags(packed, M, K) & Q_W_PAIRS16; }

void mrt_qgemm_pack_w(const int8_t *w, int M, int K, void *packed) {
    int32_t *sums = (int32_t *)packed;
    int8_t *dst = (int8_t *)packed + (long)M * 4;
    long k4 = q_k4(K);
    for (int m = 0; m < M; ++m) {
        int32_t s = 0;
        for (int k = 0; k < K; ++k) {
            dst[m * k4 + k] = w[(long)m * K + k];
            s += w[(long)m * K + k];
        }
        for (long k = K; k < k4; ++k) dst[m * k4 + k] = 0;
        sums[m] = s;
    }
    int32_t flags = q_pairs16(dst, (long)M * k4) ? Q_W_PAIRS16 : 0;
    if (memchr(dst, 0x80, (size_t)M * k4) == NULL) flags |= Q_W_SYMMETRIC; /* (no byte is -128) */
    memcpy((char *)packed + (long)M * 4 + (long)M * k4, &flags, 4);
}

/* How a GEMM's uint8 X (K x N) is stored. */
enum q_x_layout {
    Q_X_ROWS,   /* row k at X + k * ldx (q_pack_x packs each block) */
    Q_X_COLS,   /* column n's k4 bytes at X + n * ldx (q_pack_xt packs each block) */
    Q_X_PANELS, /* already packed for the whole of N: the panels q_pack_x would make, q_panel_width(N)
                 * columns each, one after the other (the block at column n0 at X + n0 * k4); the
                 * columns past N of the last panel hold any bytes (computed, never stored) */
};

/* The panel width of an N-column GEMM: Q_NR, or 16 for narrow GEMMs on VNNI (q_ukr_vnni16). */
static inline int q_panel_width(int N) { return q_use_vnni && N <= 16 ? 16 : Q_NR; }

typedef struct {
    const int32_t *sums;
    const int8_t *W;
    const uint8_t *X;
    float *C;
    const float *scale, *bias, *res;
    long k4, ldx, ldc, ldr;
    int M, N, K, x_zero, act;
    float a0, a1;
    int nc, mc, nblocks;
    int nr; /* panel width: Q_NR, or 16 for narrow GEMMs on VNNI (N <= 16); see q_panel_width */
    uint8_t *Cq; /* u8 output (requantized: clamp(rint(c / yscale[m]) + yzp[m])) instead of C, or NULL */
    long ldcq;
    const float *yscale; /* per row m (output channel) */
    const int32_t *yzp;
    float post_a, post_b; /* c = post_a * act(c) + post_b (QConv's post_scale / post_shift), before Cq */
    int neon, dot; /* this call's choices (read once from q_use_neon / q_use_dotprod) */
    int store_act;  /* the activation q_store_row applies itself (q_set_store_epilogue), or 0 */
    int store_post; /* 1: q_store_row applies post_a / post_b too (after store_act), q_post_row skips */
    int store_q;    /* 1: the tile store also requantizes into the u8 output itself (no float stage) */
    const float *Xf; /* float activations quantized while packed (q_pack_xf, VNNI) instead of X, or NULL */
    float xscale;    /* their scale (zero point x_zero) */
    int x_layout;    /* how X is stored (q_x_layout) */
    long img_cols;   /* > 0: C's columns are images of img_cols pixels side by side, stored image-major:
                      * column n of row m at C + (n / img_cols) * img_stride + m * ldc + n % img_cols
                      * (only when nothing runs after q_store_row: no activation / post pass, no Cq) */
    long img_stride;
    int wflags; /* Q_W_* (q_packed_flags): which AVX2 tile is exact for these weights */
    const float *fold; /* with store_q: per row m, fold[5 m ..] = S, B, L, H, E of the folded
                        * requantization (q_fold_rows), or NULL: the step-by-step arithmetic */
    int amx; /* > 0: groups of 32 (then 16) weight rows of 32-column panels take the AMX tile microkernel,
              * amx quads of K a step (q_amx_step) */
} q_args;

/* dst[4 j + t] = r_t[j] for j < n, t = 0..3: four byte rows interleaved into quads (the
 * [..][4] layout of 4 consecutive k per column); SSE2 unpacks 16 columns at a time. */
static inline void q_interleave4(uint8_t *restrict dst, const uint8_t *r0, const uint8_t *r1, const uint8_t *r2,
                                 const uint8_t *r3, long n) {
    long j = 0;
#if defined(__SSE2__)
    for (; j + 16 <= n; j += 16) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)(r0 + j));
        __m128i x1 = _mm_loadu_si128((const __m128i *)(r1 + j));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(r2 + j));
        __m128i x3 = _mm_loadu_si128((const __m128i *)(r3 + j));
        __m128i a = _mm_unpacklo_epi8(x0, x1), b = _mm_unpackhi_epi8(x0, x1);
        __m128i c = _mm_unpacklo_epi8(x2, x3), d = _mm_unpackhi_epi8(x2, x3);
        _mm_storeu_si128((__m128i *)(dst + 4 * j), _mm_unpacklo_epi16(a, c));
        _mm_storeu_si128((__m128i *)(dst + 4 * j + 16), _mm_unpackhi_epi16(a, c));
        _mm_storeu_si128((__m128i *)(dst + 4 * j + 32), _mm_unpacklo_epi16(b, d));
        _mm_storeu_si128((__m128i *)(dst + 4 * j + 48), _mm_unpackhi_epi16(b, d));
    }
#endif
    for (; j < n; ++j) {
        dst[4 * j] = r0[j];
        dst[4 * j + 1] = r1[j];
        dst[4 * j + 2] = r2[j];
        dst[4 * j + 3] = r3[j];
    }
}

/* The width of the panel of a block that starts with `left` columns to go: g->nr, but on VNNI a
 * last panel of at most 16 columns is 16 wide (q_ukr_vnni16), so a block of N = 100 (10 x 10
 * planes) computes 112 columns instead of 128.  Panel j0 starts at byte j0 * k4 either way.  X
 * already in panels (Q_X_PANELS) keeps the one width it was packed with (q_panel_width(N)). */
static inline int q_block_panel_width(const q_args *g, int left) {
    return q_use_vnni && left <= 16 && g->x_layout != Q_X_PANELS ? 16 : g->nr;
}

/* q_pack_x for X stored by columns (Q_X_COLS: a QMatMul's rows of activations): the quad of
 * column n at k is the 4 bytes at X + n * ldx + k, copied whole.  Each column holds k4 bytes (the
 * bytes past K meet zero weights); columns past nb read as 0 (never stored), XORed with 0x80 on
 * SDOT as in q_pack_x. */
static void q_pack_xt(const q_args *g, int k0, int kb, int n0, int nb, uint8_t *out) {
    const int kq = (kb + 3) / 4;
    const uint32_t flip = g->dot ? 0x80808080u : 0;
    for (int j0 = 0, NR; j0 < nb; j0 += NR) {
        NR = q_block_panel_width(g, nb - j0);
        uint8_t *panel = out + (long)j0 * kq * 4;
        const int w = nb - j0 < NR ? nb - j0 : NR;
        for (int j = 0; j < NR; ++j) {
            const uint8_t *src = g->X + (long)(n0 + j0 + j) * g->ldx + k0;
            uint8_t *dst = panel + 4 * j;
            for (int q = 0; q < kq; ++q, dst += 4 * NR) {
                uint32_t v = 0;
                if (j < w) memcpy(&v, src + 4 * q, 4);
                v ^= flip;
                memcpy(dst, &v, 4);
            }
        }
    }
}

/* Pack X[k0:k0+kb, n0:n0+nb] into quad panels ([kq][width][4], q_block_panel_width); rows past K and
 * columns past N read as 0 (the matching weights are 0 / the columns are not stored). */
static void q_pack_x(const q_args *g, int k0, int kb, int n0, int nb, uint8_t *out) {
    if (g->x_layout == Q_X_COLS) {
        q_pack_xt(g, k0, kb, n0, nb, out);
        return;
    }
    int kq = (kb + 3) / 4;
    for (int j0 = 0, NR; j0 < nb; j0 += NR) {
        NR = q_block_panel_width(g, nb - j0);
        uint8_t *panel = out + (long)j0 * kq * 4;
        int w = nb - j0 < NR ? nb - j0 : NR;
        for (int q = 0; q < kq; ++q) {
            uint8_t *dst = panel + (long)q * NR * 4;
            int k = k0 + 4 * q;
            const uint8_t *r[4];
            int full = w == NR;
            for (int t = 0; t < 4; ++t) {
                r[t] = (k + t < g->K && 4 * q + t < kb) ? g->X + (long)(k + t) * g->ldx + n0 + j0 : NULL;
                full = full && r[t] != NULL;
            }
#if defined(__SSE2__)
            if (full) {
                q_interleave4(dst, r[0], r[1], r[2], r[3], NR);
                continue;
            }
#endif
#ifdef MRT_HAVE_NEON_BUILD
            if (full && g->neon) { /* st4 interleaves 4 rows of 16 bytes into 16 quads */
                const uint8x16_t flip = vdupq_n_u8(g->dot ? 0x80 : 0);
                for (int h = 0; h < Q_NR; h += 16) {
                    uint8x16x4_t v;
                    v.val[0] = veorq_u8(vld1q_u8(r[0] + h), flip);
                    v.val[1] = veorq_u8(vld1q_u8(r[1] + h), flip);
                    v.val[2] = veorq_u8(vld1q_u8(r[2] + h), flip);
                    v.val[3] = veorq_u8(vld1q_u8(r[3] + h), flip);
                    vst4q_u8(dst + 4 * h, v);
                }
                continue;
            }
#endif
            /* with SDOT the activations are stored as x - 128 (s8); the padding
             * then reads -128, against zero weights (rows past K) or in columns
             * that are never stored (past N) */
            const uint8_t flip = g->dot ? 0x80 : 0;
            for (int j = 0; j < NR; ++j)
                for (int t = 0; t < 4; ++t) dst[j * 4 + t] = (uint8_t)(((r[t] && j < w) ? r[t][j] : 0) ^ flip);
        }
    }
}

/* c[0:n] = post_a * c + post_b, when that is not the identity and q_store_row did not apply it. */
static void q_post_row(const q_args *g, float *c, long n) {
    if (g->store_post || (g->post_a == 1.0f && g->post_b == 0.0f)) return;
    const float pa = g->post_a, pb = g->post_b;
    for (long j = 0; j < n; ++j) c[j] = pa * c[j] + pb;
}

/* The activation q_store_row applies on the values it stores (saving a pass over the rows): Relu
 * and HardSwish on AVX-512 VNNI, Relu and Clip on AVX2 (q_store_tile_avx2: its store has no FMA,
 * which HardSwish's rounding needs), written as act_row_avx2 computes them (so the results are
 * the same whichever applies it); 0 when the caller runs q_act_row. */
static int q_act_in_store(int act) {
    if (q_use_vnni) return act == MRT_ACT_RELU || act == MRT_ACT_CLIP || act == MRT_ACT_HARDSWISH ? act : 0;
    return q_use_avx2 && (act == MRT_ACT_RELU || act == MRT_ACT_CLIP) ? act : 0;
}

/* g->store_act and g->store_post for activation act and g's post_a / post_b: the post affine
 * goes into the store too when nothing runs between them (no activation, or one applied in the
 * store), which saves its pass over the rows (+30% on a 24 -> 96 1x1 conv at 80 x 80). */
static void q_set_store_epilogue(q_args *g, int act, int u8_out) {
    g->store_act = q_act_in_store(act);
    g->store_post = (q_use_vnni || q_use_avx2) && (act == 0 || g->store_act) && (g->post_a != 1.0f || g->post_b != 0.0f);
    /* the whole epilogue in the store: the u8 output is requantized from registers (q_store_tile_avx512) */
    g->store_q = u8_out && q_use_vnni && (act == 0 || g->store_act);
}

/* A uint8 output's requantization folded into one multiply-add, where it gives the same bytes
 * (D181).  The step-by-step arithmetic (q_store_row, q_quant16: s v + b, the activation, post_a x +
 * post_b, / y_scale, rint, + y_zero, clamped) costs ~20 vector operations per 16 outputs, on AMD
 * Zen 4 (512-bit operations issue one per cycle) most of an int8 depthwise conv's time, and made a
 * pointwise conv writing uint8 slower than one writing floats.  For an activation that is a clamp
 * (none, Relu, Clip) and post_a > 0 the same value, T = (post_a act(s v + b) + post_b) / y_scale +
 * y_zero clamped to [0, 255], is
 *   t = clamp(S v + B, L, H),  S = post_a s / y_scale,  B = (post_a b + post_b) / y_scale + y_zero,
 *   L, H = (post_a lo|hi + post_b) / y_scale + y_zero cut to [0, 255]  (lo, hi: the activation's bounds)
 * in one rounding instead of five.  Error: each float operation of either form is off by at most
 * 2^-24 of its result, whose magnitude (in units of y_scale) is at most |S v| <= |T| + |B| or |T| +
 * |y_zero| + |post_b / y_scale|; a lane that clamps does so in both forms (to the same bound, up to
 * the same error), so only |T| <= 258 matters, and the two values differ by less than
 *   E = 2^-23 (1806 + 3 |B| + 4 |y_zero| + 2 |post_b / y_scale|)   (twice the sum of those bounds).
 * Where t lies more than E from a half-integer both round to the same byte: the callers take the
 * folded byte there and the step-by-step arithmetic for a vector with any lane closer (a fraction of
 * about 2E, ~5e-4, of the lanes).  Writes S, B, L, H, E of each of the n rows into fold[5 i ..] (s, b
 * per row, b NULL: 0; ys, yz per row, or with y_per_row 0 ys[0], yz[0] for all) and returns 1, or 0
 * when the activation or post_a does not fold; a row whose E is not small (or whose scale or bias is
 * not finite) gets E = 1: all of its vectors take the step-by-step arithmetic. */
static int q_fold_rows(int n, const float *s, const float *b, const float *ys, const int32_t *yz, int y_per_row,
                       int act, float a0, float a1, float post_a, float post_b, float *fold) {
    double lo = -HUGE_VAL, hi = HUGE_VAL;
    if (act == MRT_ACT_RELU)
        lo = 0.0;
    else if (act == MRT_ACT_CLIP)
        lo = a0, hi = a1;
    else if (act != MRT_ACT_NONE)
        return 0;
    if (!(post_a > 0.0f) || !(lo <= hi)) return 0;
    for (int i = 0; i < n; ++i) {
        const int iy = y_per_row ? i : 0;
        const double inv = 1.0 / ys[iy], z = yz[iy], bi = b ? b[i] : 0.0f;
        const double l = (post_a * lo + post_b) * inv + z, h = (post_a * hi + post_b) * inv + z;
        const double B = (post_a * bi + post_b) * inv + z, S = post_a * s[i] * inv;
        const double E = (1806.0 + 3.0 * fabs(B) + 4.0 * fabs(z) + 2.0 * fabs(post_b * inv)) / 8388608.0;
        fold[5 * i] = (float)S;
        fold[5 * i + 1] = (float)B;
        fold[5 * i + 2] = (float)(l > 0.0 ? (l < 255.0 ? l : 255.0) : 0.0);
        fold[5 * i + 3] = (float)(h < 255.0 ? (h > 0.0 ? h : 0.0) : 255.0);
        fold[5 * i + 4] = ys[iy] > 0.0f && E < 0.0625 && fabs(S) < 1e30 ? (float)E : 1.0f; /* (NaN: 1) */
    }
    return 1;
}

#ifdef MRT_HAVE_VNNI_BUILD
__attribute__((target("avx512f"))) static inline __m512 q_div16(__m512 x, __m512 vs) {
    /* x / s exactly where it decides the rounding, without a division per vector (vdivps: the quantize
     * passes' cost, D145): t = x * (1 / s) is within 2^-23 |t| + 2^-24 |t| of x / s, and the correctly
     * rounded quotient q within 2^-24 |t|, so for |t| < 512 (beyond, both clip to the same end)
     * |t - q| < 2^-13.  A lane whose t lies more than 2^-11 from a half-integer therefore rounds as q
     * does; the others (and NaN, inf: t - rint(t) is NaN) take the division.  (1 / s is hoisted out of
     * the callers' loops: s is loop-invariant there.) */
    const __m512 t = _mm512_mul_ps(x, _mm512_div_ps(_mm512_set1_ps(1.0f), vs));
    const __m512 f = _mm512_sub_ps(t, _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __mmask16 near = _mm512_cmp_ps_mask(_mm512_abs_ps(f), _mm512_set1_ps(0.5f - 1.0f / 2048.0f), _CMP_NLE_UQ);
    return near ? _mm512_mask_div_ps(t, near, x, vs) : t;
}

/* quantize_u8 of 16 floats into 16 int32 lanes in [0, 255] (every operation as in the AVX2 loop
 * of q_quant_task, so the bytes are the same) */
__attribute__((target("avx512f"))) static inline __m512i q_quant16(__m512 x, __m512 vs, __m512 vlo, __m512 vhi,
                                                                     __m512 vzp) {
    __m512 t = q_div16(x, vs);
    t = _mm512_max_ps(t, vlo); /* NaN -> lo */
    t = _mm512_min_ps(t, vhi);
    t = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_cvtps_epi32(_mm512_add_ps(t, vzp));
}


/* The folded bytes (q_fold_rows) of the integer sums v of 16 outputs into *out; 0 (and *out unset)
 * when a lane of mask k lies within E of a rounding boundary: the caller computes that vector step by
 * step. */
__attribute__((target("avx512f"))) static inline int q_fold16(__m512i v, __mmask16 k, __m512 fs, __m512 fb,
                                                              __m512 flo, __m512 fhi, __m512 fnear, __m512i *out) {
    __m512 t = _mm512_fmadd_ps(fs, _mm512_cvtepi32_ps(v), fb);
    t = _mm512_min_ps(_mm512_max_ps(t, flo), fhi);
    const __m512 r = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* fnear = 0.5 - E: |t - r| > 0.5 - E means t within E of a half-integer */
    if (_mm512_mask_cmp_ps_mask(k, _mm512_abs_ps(_mm512_sub_ps(t, r)), fnear, _CMP_GT_OQ)) return 0;
    *out = _mm512_cvtps_epi32(r);
    return 1;
}

/* The dequantize store of a tile's rows on AVX-512 (q_store_row's arithmetic 16 columns at a time,
 * masked tail): rows i < mr of acc (row stride Q_NR), columns j0 .. j0 + n - 1, are output rows
 * m + i from output column n_out on (float c + i * ldc; the residual at g->res + (m + i) * ldr +
 * n_out), then g->store_act, then with g->store_post: pa * x + pb (q_post_row's), then with cq
 * (g->store_q) the requantization of quantize_u8 (q_quant16, per output row's y scale / zero point)
 * into cq + i * ldcq instead of c.  One call per tile (constants set up once) rather than per row.
 * The explicitly rounded (round-to-nearest) multiplies and adds are builtins GCC never contracts
 * into an FMA, so every value is the one the plain C loops give: the results do not depend on
 * which runs.  The activations keep NaN as act_row does (max/min return their second operand
 * then); HardSwish's y / 6 + 1/2 is the FMA GCC makes of act_row's expression on AVX2 + FMA. */
__attribute__((target("avx512f,fma"))) static void q_store_tile_avx512(const q_args *g, const int32_t *acc, int mr,
                                                                         int j0, int n, int m, long n_out, float *c,
                                                                         long ldc, uint8_t *cq, long ldcq) {
    const int act = g->store_act, post = g->store_post;
    const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
    const __m512 sixth = _mm512_set1_ps(1.0f / 6.0f), half = _mm512_set1_ps(0.5f);
    const __m512 vpa = _mm512_set1_ps(g->post_a), vpb = _mm512_set1_ps(g->post_b);
    const __m512 clo = _mm512_set1_ps(g->a0), chi = _mm512_set1_ps(g->a1);
    for (int i = 0; i < mr; ++i) {
        const int row = m + i;
        const __m512 vs = _mm512_set1_ps(g->scale[row]), vb = _mm512_set1_ps(g->bias ? g->bias[row] : 0.0f);
        const __m512i vcorr = _mm512_set1_epi32(g->x_zero * g->sums[row]);
        const float *r = g->res ? g->res + (long)row * g->ldr + n_out : NULL;
        const int32_t *a = acc + (long)i * Q_NR + j0;
        __m512 ys = zero, ylo = zero, yhi = zero, yzp = zero;
        if (cq) {
            const int yz = g->yzp[row];
            ys = _mm512_set1_ps(g->yscale[row]);
            ylo = _mm512_set1_ps((float)(0 - yz));
            yhi = _mm512_set1_ps((float)(255 - yz));
            yzp = _mm512_set1_ps((float)yz);
        }
        for (int j = 0; j < n; j += 16) {
            const __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
            __m512 x = _mm512_cvt_roundepi32_ps(_mm512_sub_epi32(_mm512_maskz_loadu_epi32(k, a + j), vcorr),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            x = _mm512_mul_round_ps(vs, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            x = _mm512_add_round_ps(x, vb, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            if (r)
                x = _mm512_add_round_ps(x, _mm512_maskz_loadu_ps(k, r + j),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            if (act == MRT_ACT_RELU) {
                x = _mm512_max_ps(zero, x); /* x < 0 ? 0 : x */
            } else if (act == MRT_ACT_CLIP) { /* act_row's Clip (ReLU6 of MobileNets): a NaN x is kept */
                x = _mm512_min_ps(chi, _mm512_max_ps(clo, x));
            } else if (act == MRT_ACT_HARDSWISH) {
                __m512 v = _mm512_fmadd_ps(x, sixth, half);
                v = _mm512_max_ps(zero, v);
                v = _mm512_min_ps(one, v);
                x = _mm512_mul_ps(x, v);
            }
            if (post)
                x = _mm512_add_round_ps(_mm512_mul_round_ps(vpa, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                        vpb, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            if (cq) { /* lanes in [0, 255]: truncated to their bytes exactly (full vectors through a
                       * register: vpmovdb's store-to-memory form is several times slower on AMD Zen 4) */
                const __m512i v = q_quant16(x, ys, ylo, yhi, yzp);
                if (k == 0xffff)
                    _mm_storeu_si128((__m128i *)(cq + (long)i * ldcq + j), _mm512_cvtepi32_epi8(v));
                else
                    _mm512_mask_cvtepi32_storeu_epi8(cq + (long)i * ldcq + j, k, v);
            } else
                _mm512_mask_storeu_ps(c + (long)i * ldc + j, k, x);
        }
    }
}
#endif

#ifdef MRT_HAVE_VNNI_BUILD
/* The uint8 tile store where the requantization folds (g->fold; never with a residual): per row only
 * the fold's constants are set up, and a vector with a lane within E of a rounding boundary is handed
 * to q_store_tile_avx512 alone, which computes it step by step (that store never folds itself).  Same bytes as
 * q_store_tile_avx512; a tile row is only two vectors (Q_NR 32), so its general setup of a dozen
 * per-row constants cost as much as the vectors themselves (MobileNetV2's 16 -> 96 at 112 x 112, D182). */
__attribute__((target("avx512f,fma"))) static void q_store_tile_fold_avx512(const q_args *g, const int32_t *acc,
                                                                              int mr, int j0, int n, int m,
                                                                              long n_out, uint8_t *cq, long ldcq) {
    for (int i = 0; i < mr; ++i) {
        const int row = m + i;
        const float *f = g->fold + 5L * row;
        const __m512i vcorr = _mm512_set1_epi32(g->x_zero * g->sums[row]);
        const __m512 fs = _mm512_set1_ps(f[0]), fb = _mm512_set1_ps(f[1]);
        const __m512 flo = _mm512_set1_ps(f[2]), fhi = _mm512_set1_ps(f[3]), fnear = _mm512_set1_ps(0.5f - f[4]);
        const int32_t *a = acc + (long)i * Q_NR + j0;
        uint8_t *o = cq + (long)i * ldcq;
        for (int j = 0; j < n; j += 16) {
            const int w = n - j >= 16 ? 16 : n - j;
            const __mmask16 k = w == 16 ? (__mmask16)0xffff : (__mmask16)((1u << w) - 1);
            __m512i v;
            if (!q_fold16(_mm512_sub_epi32(_mm512_maskz_loadu_epi32(k, a + j), vcorr), k, fs, fb, flo, fhi, fnear,
                          &v))
                q_store_tile_avx512(g, acc + (long)i * Q_NR, 1, j0 + j, w, row, n_out + j, NULL, 0, o + j, ldcq);
            else if (w == 16)
                _mm_storeu_si128((__m128i *)(o + j), _mm512_cvtepi32_epi8(v));
            else
                _mm512_mask_cvtepi32_storeu_epi8(o + j, k, v);
        }
    }
}
#endif

#ifdef MRT_HAVE_VNNI_BUILD
/* q_store_row's arithmetic 8 columns at a time on AVX2 (the tail a column at a time): rows i < mr
 * of acc (row stride Q_NR), columns j0 .. j0 + n - 1, into output rows m + i from column n_out on
 * (c + i * ldc), then g->store_act (Relu, Clip: act_row's max / min, NaN kept), then with
 * g->store_post pa * x + pb.  Compiled without FMA, so nothing is contracted: every value rounds
 * as in the plain C loops (q_store_row, act_row, q_post_row). */
__attribute__((target("avx2"))) static void q_store_tile_avx2(const q_args *g, const int32_t *acc, int mr, int j0,
                                                              int n, int m, long n_out, float *c, long ldc) {
    const int act = g->store_act, post = g->store_post;
    const float lo = act == MRT_ACT_CLIP ? g->a0 : 0.0f, hi = g->a1, pa = g->post_a, pb = g->post_b;
    const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi), vpa = _mm256_set1_ps(pa),
                 vpb = _mm256_set1_ps(pb);
    for (int i = 0; i < mr; ++i) {
        const int row = m + i;
        const float s = g->scale[row], b = g->bias ? g->bias[row] : 0.0f;
        const int32_t corr = g->x_zero * g->sums[row];
        const __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
        const __m256i vcorr = _mm256_set1_epi32(corr);
        const float *r = g->res ? g->res + (long)row * g->ldr + n_out : NULL;
        const int32_t *a = acc + (long)i * Q_NR + j0;
        float *o = c + (long)i * ldc;
        int j = 0;
        for (; j + 8 <= n; j += 8) {
            __m256 x = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(a + j)), vcorr));
            x = _mm256_add_ps(_mm256_mul_ps(vs, x), vb);
            if (r) x = _mm256_add_ps(x, _mm256_loadu_ps(r + j));
            if (act) x = _mm256_max_ps(vlo, x); /* x < lo ? lo : x (a NaN x is kept) */
            if (act == MRT_ACT_CLIP) x = _mm256_min_ps(vhi, x);
            if (post) x = _mm256_add_ps(_mm256_mul_ps(vpa, x), vpb);
            _mm256_storeu_ps(o + j, x);
        }
        for (; j < n; ++j) {
            float x = s * (float)(a[j] - corr) + b;
            if (r) x = x + r[j];
            if (act) x = x < lo ? lo : x;
            if (act == MRT_ACT_CLIP) x = x > hi ? hi : x;
            if (post) x = pa * x + pb;
            o[j] = x;
        }
    }
}
#endif

/* Dequantize + epilogue for one row of a tile: c[0:nr] from int32 acc. */
static void q_store_row(const q_args *g, const int32_t *acc, float *c, int nr, int m, int n0) {
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_use_vnni) { /* (every AVX512-VNNI CPU has AVX512F) */
        q_store_tile_avx512(g, acc, 1, 0, nr, m, n0, c, 0, NULL, 0);
        return;
    }
    if (q_use_avx2) {
        q_store_tile_avx2(g, acc, 1, 0, nr, m, n0, c, 0);
        return;
    }
#endif
    float s = g->scale[m];
    int32_t corr = g->x_zero * g->sums[m];
    float b = g->bias ? g->bias[m] : 0.0f;
    const float *r = g->res ? g->res + (long)m * g->ldr + n0 : NULL;
    if (r) {
        for (int j = 0; j < nr; ++j) c[j] = s * (float)(acc[j] - corr) + b + r[j];
    } else {
        for (int j = 0; j < nr; ++j) c[j] = s * (float)(acc[j] - corr) + b;
    }
}

/* q_store_row for rows i < mr of a tile (acc rows of Q_NR int32): columns j0 .. j0 + n - 1 of row i
 * are output row m + i at column n_out, stored at c + i * ldc; with g->store_q, requantized into
 * cq + i * ldcq instead (q_store_tile_avx512: only on VNNI, where store_q can be set). */
static void q_store_tile(const q_args *g, const int32_t *acc, int mr, int j0, int n, int m, long n_out, float *c,
                         long ldc, uint8_t *cq, long ldcq) {
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_use_vnni) {
        if (g->store_q && cq && g->fold && !g->res)
            q_store_tile_fold_avx512(g, acc, mr, j0, n, m, n_out, cq, ldcq);
        else
            q_store_tile_avx512(g, acc, mr, j0, n, m, n_out, c, ldc, g->store_q ? cq : NULL, ldcq);
        return;
    }
    if (q_use_avx2) {
        q_store_tile_avx2(g, acc, mr, j0, n, m, n_out, c, ldc);
        return;
    }
#endif
    (void)cq, (void)ldcq;
    for (int i = 0; i < mr; ++i) q_store_row(g, acc + (long)i * Q_NR + j0, c + (long)i * ldc, n, m + i, n_out);
}

/* q_store_tile into image-major C (g->img_cols): the tile's columns n .. n + nr - 1 split where an
 * image ends, each run stored to its image's rows (never with a residual: see q_gemm_run_q). */
static void q_store_tile_images(const q_args *g, const int32_t *acc, int mr, int nr, int m, long n) {
    for (int j = 0; j < nr;) {
        const long img = (n + j) / g->img_cols, pix = (n + j) % g->img_cols;
        const int len = g->img_cols - pix < nr - j ? (int)(g->img_cols - pix) : nr - j;
        q_store_tile(g, acc, mr, j, len, m, 0, g->C + img * g->img_stride + (long)m * g->ldc + pix, g->ldc, NULL, 0);
        j += len;
    }
}

static void q_ukr_base(const q_args *g, const int8_t *w, int kq, const uint8_t *panel, int32_t acc[Q_MR][Q_NR], int mr,
                       int accumulate) {
    if (!accumulate) memset(acc, 0, sizeof(int32_t) * Q_MR * Q_NR);
    for (int i = 0; i < mr; ++i) {
        const int8_t *a = w + i * g->k4;
        int32_t *o = acc[i];
        for (int q = 0; q < kq; ++q) {
            const uint8_t *b = panel + (long)q * Q_NR * 4;
            int32_t w0 = a[4 * q], w1 = a[4 * q + 1], w2 = a[4 * q + 2], w3 = a[4 * q + 3];
            for (int j = 0; j < Q_NR; ++j)
                o[j] += b[4 * j] * w0 + b[4 * j + 1] * w1 + b[4 * j + 2] * w2 + b[4 * j + 3] * w3;
        }
    }
}

#ifdef MRT_HAVE_VNNI_BUILD
/* One row of a VNNI tile (q_ukr_vnni, q_ukr_conv_vnni): the 4 activation bytes at src broadcast,
 * dot the panel vectors b0 / b1 into x0 / x1 (s, a, b0, b1 are the caller's locals). */
#define Q_VNNI_ROW(src, x0, x1)              \
    memcpy(&s, (src), 4);                    \
    a = _mm512_set1_epi32(s);                \
    x0 = _mm512_dpbusd_epi32(x0, b0, a);     \
    x1 = _mm512_dpbusd_epi32(x1, b1, a);

/* rows (2, 4 or 6, at least mr): the tile rows computed, a constant in each of q_ukr_vnni's three
 * copies, so a partial tile (e.g. the last 2 rows of 32) skips the unused rows' broadcasts and dot
 * products (rows from mr to rows alias row 0: computed, never stored; acc rows past rows untouched) */
__attribute__((target("avx512f,avx512vnni"), always_inline)) static inline void
q_ukr_vnni_rows(const q_args *g, const int8_t *w, int kq, const uint8_t *panel, int32_t acc[Q_MR][Q_NR], int mr,
                int accumulate, const int rows) {
    const long k4 = g->k4;
    const int8_t *a0 = w, *a1 = mr > 1 ? w + k4 : w, *a2 = mr > 2 ? w + 2 * k4 : w;
    const int8_t *a3 = mr > 3 ? w + 3 * k4 : w, *a4 = mr > 4 ? w + 4 * k4 : w, *a5 = mr > 5 ? w + 5 * k4 : w;
    __m512i c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (accumulate) {
        c00 = _mm512_loadu_si512(acc[0]); c01 = _mm512_loadu_si512(acc[0] + 16);
        c10 = _mm512_loadu_si512(acc[1]); c11 = _mm512_loadu_si512(acc[1] + 16);
        c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm512_setzero_si512();
        if (rows > 2) {
            c20 = _mm512_loadu_si512(acc[2]); c21 = _mm512_loadu_si512(acc[2] + 16);
            c30 = _mm512_loadu_si512(acc[3]); c31 = _mm512_loadu_si512(acc[3] + 16);
        }
        if (rows > 4) {
            c40 = _mm512_loadu_si512(acc[4]); c41 = _mm512_loadu_si512(acc[4] + 16);
            c50 = _mm512_loadu_si512(acc[5]); c51 = _mm512_loadu_si512(acc[5] + 16);
        }
    } else {
        c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm512_setzero_si512();
    }
    for (int q = 0; q < kq; ++q) {
        __m512i b0 = _mm512_loadu_si512(panel), b1 = _mm512_loadu_si512(panel + 64);
        panel += Q_NR * 4;
        int32_t s;
        __m512i a;
        Q_VNNI_ROW(a0 + 4 * q, c00, c01)
        Q_VNNI_ROW(a1 + 4 * q, c10, c11)
        if (rows > 2) {
            Q_VNNI_ROW(a2 + 4 * q, c20, c21)
            Q_VNNI_ROW(a3 + 4 * q, c30, c31)
        }
        if (rows > 4) {
            Q_VNNI_ROW(a4 + 4 * q, c40, c41)
            Q_VNNI_ROW(a5 + 4 * q, c50, c51)
        }
    }
    _mm512_storeu_si512(acc[0], c00); _mm512_storeu_si512(acc[0] + 16, c01);
    _mm512_storeu_si512(acc[1], c10); _mm512_storeu_si512(acc[1] + 16, c11);
    if (rows > 2) {
        _mm512_storeu_si512(acc[2], c20); _mm512_storeu_si512(acc[2] + 16, c21);
        _mm512_storeu_si512(acc[3], c30); _mm512_storeu_si512(acc[3] + 16, c31);
    }
    if (rows > 4) {
        _mm512_storeu_si512(acc[4], c40); _mm512_storeu_si512(acc[4] + 16, c41);
        _mm512_storeu_si512(acc[5], c50); _mm512_storeu_si512(acc[5] + 16, c51);
    }
}

__attribute__((target("avx512f,avx512vnni"))) static void q_ukr_vnni(const q_args *g, const int8_t *w, int kq,
                                                                        const uint8_t *panel,
                                                                        int32_t acc[Q_MR][Q_NR], int mr,
                                                                        int accumulate) {
    if (mr > 4)
        q_ukr_vnni_rows(g, w, kq, panel, acc, mr, accumulate, 6);
    else if (mr > 2)
        q_ukr_vnni_rows(g, w, kq, panel, acc, mr, accumulate, 4);
    else
        q_ukr_vnni_rows(g, w, kq, panel, acc, mr, accumulate, 2);
}

/* The same for 16-column panels ([k/4][16][4]): narrow GEMMs (N <= 16, e.g. the last convs of a
 * small batch-1 model) would leave half of each 32-column tile empty. acc[i][0:16] only. */
__attribute__((target("avx512f,avx512vnni"), always_inline)) static inline void
q_ukr_vnni16_rows(const q_args *g, const int8_t *w, int kq, const uint8_t *panel, int32_t acc[Q_MR][Q_NR], int mr,
                  const int rows) { /* (rows as in q_ukr_vnni_rows) */
    const long k4 = g->k4;
    const int8_t *a0 = w, *a1 = mr > 1 ? w + k4 : w, *a2 = mr > 2 ? w + 2 * k4 : w;
    const int8_t *a3 = mr > 3 ? w + 3 * k4 : w, *a4 = mr > 4 ? w + 4 * k4 : w, *a5 = mr > 5 ? w + 5 * k4 : w;
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    for (int q = 0; q < kq; ++q) {
        __m512i b0 = _mm512_loadu_si512(panel);
        panel += 16 * 4;
        int32_t s;
#define Q_ROW(p, x)           \
    memcpy(&s, p + 4 * q, 4); \
    x = _mm512_dpbusd_epi32(x, b0, _mm512_set1_epi32(s));
        Q_ROW(a0, c0) Q_ROW(a1, c1)
        if (rows > 2) { Q_ROW(a2, c2) Q_ROW(a3, c3) }
        if (rows > 4) { Q_ROW(a4, c4) Q_ROW(a5, c5) }
#undef Q_ROW
    }
    _mm512_storeu_si512(acc[0], c0); _mm512_storeu_si512(acc[1], c1);
    if (rows > 2) { _mm512_storeu_si512(acc[2], c2); _mm512_storeu_si512(acc[3], c3); }
    if (rows > 4) { _mm512_storeu_si512(acc[4], c4); _mm512_storeu_si512(acc[5], c5); }
}

__attribute__((target("avx512f,avx512vnni"))) static void q_ukr_vnni16(const q_args *g, const int8_t *w, int kq,
                                                                          const uint8_t *panel,
                                                                          int32_t acc[Q_MR][Q_NR], int mr) {
    if (mr > 4)
        q_ukr_vnni16_rows(g, w, kq, panel, acc, mr, 6);
    else if (mr > 2)
        q_ukr_vnni16_rows(g, w, kq, panel, acc, mr, 4);
    else
        q_ukr_vnni16_rows(g, w, kq, panel, acc, mr, 2);
}

/* N == 1 (a matrix-vector product, e.g. a batch-1 QMatMul): out[m] = sum_k W[m, k] * x[k] for rows
 * m0..m1, 64 k per vpdpbusd, four rows per pass over x; the tails are masked loads (nothing is read
 * past K in x or past k4 in a weight row). */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void q_gemv_vnni(const q_args *g, int m0, int m1,
                                                                                  int32_t *out) {
    const long k4 = g->k4, K = g->K;
    const uint8_t *x = g->X;
    int m = m0;
    for (; m + 4 <= m1; m += 4) {
        const int8_t *w0 = g->W + (long)m * k4, *w1 = w0 + k4, *w2 = w1 + k4, *w3 = w2 + k4;
        __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0;
        for (long k = 0; k < K; k += 64) {
            __mmask64 mk = K - k >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (K - k)) - 1);
            __m512i xv = _mm512_maskz_loadu_epi8(mk, x + k);
            c0 = _mm512_dpbusd_epi32(c0, xv, _mm512_maskz_loadu_epi8(mk, w0 + k));
            c1 = _mm512_dpbusd_epi32(c1, xv, _mm512_maskz_loadu_epi8(mk, w1 + k));
            c2 = _mm512_dpbusd_epi32(c2, xv, _mm512_maskz_loadu_epi8(mk, w2 + k));
            c3 = _mm512_dpbusd_epi32(c3, xv, _mm512_maskz_loadu_epi8(mk, w3 + k));
        }
        out[m - m0] = _mm512_reduce_add_epi32(c0);
        out[m - m0 + 1] = _mm512_reduce_add_epi32(c1);
        out[m - m0 + 2] = _mm512_reduce_add_epi32(c2);
        out[m - m0 + 3] = _mm512_reduce_add_epi32(c3);
    }
    for (; m < m1; ++m) {
        const int8_t *w0 = g->W + (long)m * k4;
        __m512i c0 = _mm512_setzero_si512();
        for (long k = 0; k < K; k += 64) {
            __mmask64 mk = K - k >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (K - k)) - 1);
            c0 = _mm512_dpbusd_epi32(c0, _mm512_maskz_loadu_epi8(mk, x + k), _mm512_maskz_loadu_epi8(mk, w0 + k));
        }
        out[m - m0] = _mm512_reduce_add_epi32(c0);
    }
}
#endif

#ifdef MRT_HAVE_VNNI_BUILD
/* ---------------------------------------------------------------- AVX2 int8 microkernels (no VNNI)
 *
 * The same panels and sums as q_ukr_vnni / q_ukr_conv_vnni, exact: AVX2 has no u8 x s8 dot product
 * that cannot saturate (vpmaddubsw adds two products into a saturating int16: 2 x 255 x 127 does
 * not fit), so both operands are widened to int16 and vpmaddwd adds pairs of products into int32,
 * which no u8 x s8 pair can overflow.  Per quad of k, a 128-byte panel row is 4 groups of 8
 * columns x 4 k; a group's 32 bytes widen into two vectors (columns 0-3 and 4-7, 4 k each), and a
 * weight quad widened to 4 int16 is broadcast to every 64-bit lane, so one vpmaddwd gives, per
 * column, the sums of k0 k1 and of k2 k3 side by side: the two halves are added (vphaddd) once
 * per tile.  Integer sums are exact in any order: the results are the portable kernel's, bit for
 * bit. */

#define Q_AVX2_CHUNK 32 /* quads per pass: their weights widened once for the 4 column groups */

/* wq[r][j] = quad j of row rows[r] (4 s8 at rows[r] + 4 j) widened to 4 int16, j < nq (4 quads at
 * a time while 4 are left: nothing past rows[r] + 4 nq is read) */
__attribute__((target("avx2"), always_inline)) static inline void q_avx2_widen(const int8_t *const *rows, int nrows,
                                                                                int nq,
                                                                                int64_t wq[][Q_AVX2_CHUNK]) {
    for (int r = 0; r < nrows; ++r) {
        int j = 0;
        for (; j + 4 <= nq; j += 4)
            _mm256_storeu_si256((__m256i *)&wq[r][j],
                                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rows[r] + 4 * j))));
        for (; j < nq; ++j) {
            const int8_t *a = rows[r] + 4 * j;
            wq[r][j] = (int64_t)((uint64_t)(uint16_t)a[0] | (uint64_t)(uint16_t)a[1] << 16 |
                                 (uint64_t)(uint16_t)a[2] << 32 | (uint64_t)(uint16_t)a[3] << 48);
        }
    }
}

/* One pass of q_avx2_tile: the quads bq[0..nq) (or, bq NULL, at b0 + j step; 128 bytes each,
 * column group g at byte 32 g) times
 * the rows' widened quads wq[r][0..nq), r < rows (a constant), added to the pair sums sums[r][2 g],
 * sums[r][2 g + 1] (g < 4), or from zero for the first pass; the last pass writes the column sums to
 * out[r] (r < nout) instead, so a K of one pass never keeps its sums in memory.  The loops over r
 * are unrolled: 2 vectors per row stay in registers (12 for 6 rows, + 2 panel vectors and a weight
 * vector: 15 of the 16).  vphaddd gives per 128-bit lane (c0, c1, c4, c5 | c2, c3, c6, c7) of a
 * group; the 64-bit lanes are put back in order. */
__attribute__((target("avx2"), always_inline)) static inline void q_avx2_pass(__m256i sums[][8],
                                                                               const uint8_t *const *bq,
                                                                               const uint8_t *b0, long step, int nq,
                                                                               int64_t wq[][Q_AVX2_CHUNK],
                                                                               const int rows, int first,
                                                                               int32_t (*out)[Q_NR], int nout) {
    for (int g = 0; g < 4; ++g) {
        __m256i lo[6], hi[6];
#pragma GCC unroll 6
        for (int r = 0; r < rows; ++r) {
            lo[r] = first ? _mm256_setzero_si256() : sums[r][2 * g];
            hi[r] = first ? _mm256_setzero_si256() : sums[r][2 * g + 1];
        }
        for (int j = 0; j < nq; ++j) {
            const uint8_t *b = (bq ? bq[j] : b0 + j * step) + 32 * g;
            const __m256i bl = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b));
            const __m256i bh = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(b + 16)));
#pragma GCC unroll 6
            for (int r = 0; r < rows; ++r) {
                const __m256i w = _mm256_set1_epi64x(wq[r][j]);
                lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(bl, w));
                hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(bh, w));
            }
        }
        if (out) {
#pragma GCC unroll 6
            for (int r = 0; r < rows; ++r)
                if (r < nout)
                    _mm256_storeu_si256((__m256i *)(out[r] + 8 * g),
                                        _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[r], hi[r]), 0xD8));
        } else {
#pragma GCC unroll 6
            for (int r = 0; r < rows; ++r) sums[r][2 * g] = lo[r], sums[r][2 * g + 1] = hi[r];
        }
    }
}

/* A tile of `rows` (a constant, at most 6) x 32 columns: out[r][0:32] (r < nout) = sum over the
 * quads of weight row w + r * ldw (rows past nout read row 0: computed, never stored) times the
 * panel rows; quad q = (t, cq) of the ntaps runs of cq4 quads is the 128 bytes at base + tap_off[t]
 * + cq * cq_stride (a GEMM's panel: one run, 128 bytes apart).  Q_AVX2_CHUNK quads per pass: their
 * widened weights (1.5 KB) and panel rows (4 KB) stay in L1 while the 4 column groups read them
 * (widening a row tile's whole K at once, 11 KB for K = 960, next to a 30 KB panel, measured 15%
 * slower on MobileNetV2 int8). */
__attribute__((target("avx2"), always_inline)) static inline void
q_avx2_tile(const int8_t *w, long ldw, const uint8_t *base, const long *tap_off, int ntaps, int cq4, long cq_stride,
            int32_t (*out)[Q_NR], int nout, const int rows) {
    __m256i sums[6][8];
    int64_t wq[6][Q_AVX2_CHUNK];
    const uint8_t *bq[Q_AVX2_CHUNK];
    const int8_t *rq[6];
    const long kq = (long)ntaps * cq4;
    int t = 0, cq = 0; /* the run and quad of the pass's first quad */
    for (long q0 = 0; q0 < kq; q0 += Q_AVX2_CHUNK) {
        const int nq = kq - q0 < Q_AVX2_CHUNK ? (int)(kq - q0) : Q_AVX2_CHUNK;
        for (int r = 0; r < rows; ++r) rq[r] = w + (r < nout ? r : 0) * ldw + 4 * q0;
        q_avx2_widen(rq, rows, nq, wq);
        if (ntaps == 1) { /* one run (a GEMM's panel): no table of quads */
            q_avx2_pass(sums, NULL, base + tap_off[0] + q0 * cq_stride, cq_stride, nq, wq, rows, q0 == 0,
                        q0 + nq >= kq ? out : NULL, nout);
            continue;
        }
        for (int j = 0; j < nq; ++j) {
            bq[j] = base + tap_off[t] + cq * cq_stride;
            if (++cq == cq4) cq = 0, ++t;
        }
        q_avx2_pass(sums, bq, NULL, 0, nq, wq, rows, q0 == 0, q0 + nq >= kq ? out : NULL, nout);
    }
}

/* q_avx2_tile with rows resolved to 2, 4 or 6 (at least nout), for the row count of each call. */
__attribute__((target("avx2"))) static void q_avx2_tile_any(const int8_t *w, long ldw, const uint8_t *base,
                                                            const long *tap_off, int ntaps, int cq4, long cq_stride,
                                                            int32_t (*out)[Q_NR], int nout) {
    if ((long)ntaps * cq4 == 0) { /* K = 0: every sum is 0 */
        memset(out, 0, sizeof(int32_t) * Q_NR * nout);
        return;
    }
    if (nout > 4)
        q_avx2_tile(w, ldw, base, tap_off, ntaps, cq4, cq_stride, out, nout, 6);
    else if (nout > 2)
        q_avx2_tile(w, ldw, base, tap_off, ntaps, cq4, cq_stride, out, nout, 4);
    else
        q_avx2_tile(w, ldw, base, tap_off, ntaps, cq4, cq_stride, out, nout, 2);
}

/* The AVX2 tiles that multiply bytes with vpmaddubsw (an unsigned byte times a signed one, pairs of products
 * added into a saturating int16, then vpmaddwd with ones adds the two pairs of a column into its int32 quad
 * sum, in column order: no vphaddd or permute at the end), exact in the two cases where no pair sum can
 * saturate; the same sums as every other kernel, bit for bit.  Quads as q_avx2_tile's (ntaps runs of cq4
 * quads at base + tap_off[t] + cq * cq_stride); two column groups per pass over K.
 *   - centred 0, pair-limited weights (Q_W_PAIRS16, |w0| + |w1| <= 128 for every pair: 255 x 128 = 32640 <
 *     32767): the panel bytes times the weight quad broadcast to every column.  Up to 6 rows: 12
 *     accumulators, 2 panel vectors, the weights and the ones.
 *   - centred 1, any weights in [-127, 127] (Q_W_SYMMETRIC): the activation is centred (x_s = x ^ 0x80 =
 *     x - 128), the unsigned operand is |x_s| (at most 128) and the signed one the weight given x_s's sign
 *     (vpsignb: w, -w or 0), whose product is w x_s and whose pair sums stay within 2 x 128 x 127 = 32512;
 *     128 rowsum[r] is added back at the end (sum_k w x = sum_k w x_s + 128 sum_k w).  One more
 *     instruction per 32 multiply-adds (the centring and |x_s| are per panel vector, shared by the rows);
 *     up to 4 rows (6 spilled: 10% slower).
 * Measured on Zen 3 (the loops alone, 6 x 32 tiles, K = 256): 58-80 G multiply-adds per second with pair-
 * limited weights, 50-61 centred, where the int16 widening route (q_avx2_tile, D80) runs at the float FMA
 * rate (D172). */
__attribute__((target("avx2"), always_inline)) static inline void
q_avx2_bytes_tile(const int8_t *w, long ldw, const int32_t *rowsum, const uint8_t *base, const long *tap_off,
                  int ntaps, int cq4, long cq_stride, int32_t (*out)[Q_NR], int nout, const int rows,
                  const int centred) {
    const __m256i ones = _mm256_set1_epi16(1), centre = _mm256_set1_epi8((char)0x80);
    const int8_t *rw[6];
    for (int r = 0; r < rows; ++r) rw[r] = w + (r < nout ? r : 0) * ldw; /* (rows past nout: never stored) */
    for (int g = 0; g < 4; g += 2) {
        __m256i a0[6], a1[6];
#pragma GCC unroll 6
        for (int r = 0; r < 6; ++r) a0[r] = a1[r] = _mm256_setzero_si256(); /* (all 6: rows is a constant) */
        long j = 0; /* the quad's index in K */
        for (int t = 0; t < ntaps; ++t) {
            const uint8_t *b = base + tap_off[t] + 32 * g;
            for (int cq = 0; cq < cq4; ++cq, ++j, b += cq_stride) {
                __m256i x0 = _mm256_loadu_si256((const __m256i *)b), x1 = _mm256_loadu_si256((const __m256i *)(b + 32));
                __m256i u0 = x0, u1 = x1; /* the unsigned operands */
                if (centred) {
                    x0 = _mm256_xor_si256(x0, centre), x1 = _mm256_xor_si256(x1, centre);
                    u0 = _mm256_abs_epi8(x0), u1 = _mm256_abs_epi8(x1);
                }
#pragma GCC unroll 6
                for (int r = 0; r < rows; ++r) {
                    int32_t quad;
                    memcpy(&quad, rw[r] + 4 * j, 4);
                    const __m256i wv = _mm256_set1_epi32(quad);
                    const __m256i w0 = centred ? _mm256_sign_epi8(wv, x0) : wv;
                    const __m256i w1 = centred ? _mm256_sign_epi8(wv, x1) : wv;
                    a0[r] = _mm256_add_epi32(a0[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u0, w0), ones));
                    a1[r] = _mm256_add_epi32(a1[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u1, w1), ones));
                }
            }
        }
#pragma GCC unroll 6
        for (int r = 0; r < rows; ++r)
            if (r < nout) {
                const __m256i back = _mm256_set1_epi32(centred ? 128 * rowsum[r] : 0);
                _mm256_storeu_si256((__m256i *)(out[r] + 8 * g), _mm256_add_epi32(a0[r], back));
                _mm256_storeu_si256((__m256i *)(out[r] + 8 * g + 8), _mm256_add_epi32(a1[r], back));
            }
    }
}

/* q_avx2_bytes_tile over nout rows (any number): pair-limited weights 6 rows at a time, centred 4 at a
 * time, then what is left as a tile of 4 or 2 rows; ``rowsum[r]`` (row r's weight sum) is read when
 * centred. */
__attribute__((target("avx2"))) static void q_avx2_bytes_tile_any(const int8_t *w, long ldw, const int32_t *rowsum,
                                                                  const uint8_t *base, const long *tap_off, int ntaps,
                                                                  int cq4, long cq_stride, int32_t (*out)[Q_NR],
                                                                  int nout, int centred) {
    const int step = centred ? 4 : 6;
    for (int r0 = 0; r0 < nout; r0 += step) {
        const int n = nout - r0 < step ? nout - r0 : step;
        const int8_t *wr = w + r0 * ldw;
        const int32_t *sr = rowsum + r0;
        if (centred)
            q_avx2_bytes_tile(wr, ldw, sr, base, tap_off, ntaps, cq4, cq_stride, out + r0, n, n > 2 ? 4 : 2, 1);
        else if (n > 4)
            q_avx2_bytes_tile(wr, ldw, sr, base, tap_off, ntaps, cq4, cq_stride, out + r0, n, 6, 0);
        else
            q_avx2_bytes_tile(wr, ldw, sr, base, tap_off, ntaps, cq4, cq_stride, out + r0, n, n > 2 ? 4 : 2, 0);
    }
}

/* q_gemv_vnni on AVX2 (N == 1): out[m - m0] = sum_k W[m, k] x[k] for rows m0 .. m1, exact: x
 * widened to int16 once (xw, K values), then per 4 rows 16 k per step, weights widened and
 * vpmaddwd-ed against x into int32 lanes, summed across lanes at the end; the K % 16 tail a
 * product at a time (nothing is read past K in x or in a weight row). */
__attribute__((target("avx2"))) static void q_gemv_avx2(const q_args *g, int m0, int m1, const int16_t *xw,
                                                        int32_t *out) {
    const long k4 = g->k4, K = g->K, K16 = K / 16 * 16;
    for (int m = m0; m < m1; m += 4) {
        const int rows = m1 - m < 4 ? m1 - m : 4;
        const int8_t *w[4];
        for (int r = 0; r < 4; ++r) w[r] = g->W + (long)(m + (r < rows ? r : 0)) * k4;
        __m256i c[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                        _mm256_setzero_si256()};
        for (long k = 0; k < K16; k += 16) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xw + k));
            for (int r = 0; r < 4; ++r)
                c[r] = _mm256_add_epi32(
                    c[r], _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w[r] + k))), xv));
        }
        for (int r = 0; r < rows; ++r) {
            __m128i v = _mm_add_epi32(_mm256_castsi256_si128(c[r]), _mm256_extracti128_si256(c[r], 1));
            v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
            v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1));
            int32_t sum = _mm_cvtsi128_si32(v);
            for (long k = K16; k < K; ++k) sum += (int32_t)w[r][k] * xw[k];
            out[m - m0 + r] = sum;
        }
    }
}
#endif

#ifdef MRT_HAVE_NEON_BUILD
/* acc[0:6][0:32] = sum over the kq quads of W (s8, rows of stride k4) x panel (s8: x - 128).
 * Two halves of 16 columns, each a 6 x 16 tile in 24 registers; per quad of k:
 * four 16-byte panel loads, the six rows' 4-byte weight quads, and 4 SDOTs (by lane) per row. */
MRT_TARGET_DOTPROD static void q_ukr_dot(const q_args *g, const int8_t *w, int kq, const uint8_t *panel,
                                         int32_t acc[Q_MR][Q_NR], int mr) {
    const long k4 = g->k4;
    const int8_t *a0 = w, *a1 = mr > 1 ? w + k4 : w, *a2 = mr > 2 ? w + 2 * k4 : w;
    const int8_t *a3 = mr > 3 ? w + 3 * k4 : w, *a4 = mr > 4 ? w + 4 * k4 : w, *a5 = mr > 5 ? w + 5 * k4 : w;
    for (int h = 0; h < Q_NR; h += 16) {
        const int8_t *p = (const int8_t *)panel + 4 * h;
        const int32x4_t z = vdupq_n_s32(0);
        int32x4_t c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z, c20 = z, c21 = z, c22 = z,
                  c23 = z, c30 = z, c31 = z, c32 = z, c33 = z, c40 = z, c41 = z, c42 = z, c43 = z, c50 = z, c51 = z,
                  c52 = z, c53 = z;
        for (int q = 0; q < kq; ++q, p += Q_NR * 4) {
            const int8x16_t b0 = vld1q_s8(p), b1 = vld1q_s8(p + 16), b2 = vld1q_s8(p + 32), b3 = vld1q_s8(p + 48);
            /* the six rows' weight quads in two registers (rows 0-3, rows 4-5), used by lane:
             * 24 accumulators + 4 panel + 2 weight registers fit the 32 without spilling
             * (six broadcast registers did not) */
            int32_t s0, s1, s2, s3, s4, s5;
            memcpy(&s0, a0 + 4 * q, 4); memcpy(&s1, a1 + 4 * q, 4); memcpy(&s2, a2 + 4 * q, 4);
            memcpy(&s3, a3 + 4 * q, 4); memcpy(&s4, a4 + 4 * q, 4); memcpy(&s5, a5 + 4 * q, 4);
            int32x4_t wa = vdupq_n_s32(s0), wb = vdupq_n_s32(s4);
            wa = vsetq_lane_s32(s1, wa, 1); wa = vsetq_lane_s32(s2, wa, 2); wa = vsetq_lane_s32(s3, wa, 3);
            wb = vsetq_lane_s32(s5, wb, 1);
            const int8x16_t va = vreinterpretq_s8_s32(wa), vb = vreinterpretq_s8_s32(wb);
#define Q_ROW(w, lane, x0, x1, x2, x3)             \
    x0 = vdotq_laneq_s32(x0, b0, w, lane);           \
    x1 = vdotq_laneq_s32(x1, b1, w, lane);           \
    x2 = vdotq_laneq_s32(x2, b2, w, lane);           \
    x3 = vdotq_laneq_s32(x3, b3, w, lane);
            Q_ROW(va, 0, c00, c01, c02, c03)
            Q_ROW(va, 1, c10, c11, c12, c13)
            Q_ROW(va, 2, c20, c21, c22, c23)
            Q_ROW(va, 3, c30, c31, c32, c33)
            Q_ROW(vb, 0, c40, c41, c42, c43)
            Q_ROW(vb, 1, c50, c51, c52, c53)
#undef Q_ROW
        }
#define Q_OUT(i, x0, x1, x2, x3)           \
    vst1q_s32(acc[i] + h, x0);              \
    vst1q_s32(acc[i] + h + 4, x1);          \
    vst1q_s32(acc[i] + h + 8, x2);          \
    vst1q_s32(acc[i] + h + 12, x3);
        Q_OUT(0, c00, c01, c02, c03)
        Q_OUT(1, c10, c11, c12, c13)
        Q_OUT(2, c20, c21, c22, c23)
        Q_OUT(3, c30, c31, c32, c33)
        Q_OUT(4, c40, c41, c42, c43)
        Q_OUT(5, c50, c51, c52, c53)
#undef Q_OUT
    }
}
#endif

typedef struct {
    const float *x;
    uint8_t *q;
    float scale, lo, hi, zp;
} q_quant_args;
static void q_quant_task(void *ctx, long begin, long end);

#ifdef MRT_HAVE_VNNI_BUILD
/* q_pack_x from float activations (g->Xf; panels as q_block_panel_width): each 4 rows x 16 columns are
 * quantized into 16 int32 lanes and shifted into the four bytes of each column's quad (no
 * shuffles), so the quantized matrix is never written out.  Rows past K and columns past nb
 * hold x_zero (zero weights / columns never stored). */
__attribute__((target("avx512f"))) static void q_pack_xf(const q_args *g, int n0, int nb, uint8_t *out) {
    const int kq = (int)(g->k4 / 4);
    const __m512 vs = _mm512_set1_ps(g->xscale), vlo = _mm512_set1_ps((float)(0 - g->x_zero)),
                 vhi = _mm512_set1_ps((float)(255 - g->x_zero)), vzp = _mm512_set1_ps((float)g->x_zero);
    const __m512i vpad = _mm512_set1_epi32(g->x_zero);
    for (int j0 = 0, width; j0 < nb; j0 += width) {
        uint8_t *dst = out + (long)j0 * kq * 4;
        width = q_block_panel_width(g, nb - j0);
        for (int q = 0; q < kq; ++q)
            for (int h = 0; h < width; h += 16, dst += 64) {
                const int left = nb - j0 - h; /* columns of this half inside the block */
                const __mmask16 k = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
                __m512i quad = _mm512_setzero_si512();
                for (int t = 0; t < 4; ++t) {
                    const int row = 4 * q + t;
                    __m512i v = vpad;
                    if (row < g->K && k) {
                        const float *src = g->Xf + (long)row * g->ldx + n0 + j0 + h;
                        v = q_quant16(k == 0xffff ? _mm512_loadu_ps(src) : _mm512_maskz_loadu_ps(k, src), vs, vlo,
                                      vhi, vzp);
                        if (k != 0xffff) v = _mm512_mask_mov_epi32(vpad, k, v);
                    }
                    quad = _mm512_or_si512(quad, _mm512_slli_epi32(v, 8 * t));
                }
                _mm512_storeu_si512(dst, quad);
            }
    }
}
#endif

/* A finished tile of q_task (rows m .. m + mr, columns n .. n + nr of C) to its output: c, row
 * stride ldc, or the images of g->img_cols. */
static void q_task_store(const q_args *g, int32_t acc[Q_MR][Q_NR], int mr, int nr, int m, long n, float *c, long ldc) {
    if (g->img_cols)
        q_store_tile_images(g, &acc[0][0], mr, nr, m, n);
    else
        q_store_tile(g, &acc[0][0], mr, 0, nr, m, n, c, ldc, NULL, 0);
}

#ifdef MRT_HAVE_AMX_BUILD
/* AMX (Intel Advanced Matrix Extensions): eight tile registers of up to 16 rows x 64 bytes, and
 * tdpbsud, which adds to an int32 tile C (16 x 16) the products of an int8 tile A (16 rows of 64
 * signed bytes) with a uint8 tile B (16 rows of 16 columns x 4 bytes, the VNNI quad layout): 16K
 * exact multiply-adds an instruction, the sums those of vpdpbusd (the same integers, so the same
 * results bit for bit).  The GEMM's operands are already in those layouts: A is 16 weight rows
 * (row stride k4, 4 s of their bytes a step), B half of a 32-column activation panel ([kq][32][4]:
 * row stride 128 bytes, s rows of its left or right 64 bytes), where a step takes s quads of K:
 * the largest divisor of kq up to 16 (16 where k4 is a multiple of 64; 12 for K = 144, 8 for 96 or
 * 32), so that the steps end exactly at k4 and a tile never reads past a weight row or a panel.
 * Taken for whole groups of 32 weight rows, then one of 16 where that many are left, when s >=
 * Q_AMX_MIN_QUADS; the rows left and the 16-column panels keep the VNNI microkernels.  Tile state is
 * per thread: each task loads the configuration of its s before its first tile and releases it after
 * its last.  Linux hands out the tile registers only on request (arch_prctl: mrt_select_isa). */
typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} q_amx_config;

/* Tiles 0-3: the 32 x 32 int32 accumulators (rows 0-15 / 16-31 x columns 0-15 / 16-31), 16 rows x 64
 * bytes; 4, 5: the two weight tiles, 16 rows x 4 s bytes; 6, 7: the two halves of the panel, s rows x 64
 * bytes.  One configuration per s (Q_AMX_MIN_QUADS..16), made once: initialized data, not a local, because GCC 12
 * does not see that ldtilecfg reads its operand's 64 bytes and drops the stores of a local's fields
 * (the configuration is then invalid: a general protection fault). */
#define Q_AMX_MIN_QUADS 6 /* a smaller step (K = 20, 28, 52...) does too little per instruction */
#define Q_AMX_CONFIG(s)                                                                                      \
    {1, 0, {0}, {64, 64, 64, 64, 4 * (s), 4 * (s), 64, 64}, {16, 16, 16, 16, 16, 16, (s), (s)}}
static const q_amx_config q_amx_tiles[16 - Q_AMX_MIN_QUADS + 1] = { /* (entry s - Q_AMX_MIN_QUADS) */
    Q_AMX_CONFIG(6),  Q_AMX_CONFIG(7),  Q_AMX_CONFIG(8),  Q_AMX_CONFIG(9),  Q_AMX_CONFIG(10), Q_AMX_CONFIG(11),
    Q_AMX_CONFIG(12), Q_AMX_CONFIG(13), Q_AMX_CONFIG(14), Q_AMX_CONFIG(15), Q_AMX_CONFIG(16)};
#undef Q_AMX_CONFIG

__attribute__((target("amx-tile"))) static void q_amx_begin(int s) {
    _tile_loadconfig(&q_amx_tiles[s - Q_AMX_MIN_QUADS]);
}

__attribute__((target("amx-tile"))) static void q_amx_end(void) { _tile_release(); }

/* The accumulators of a group of rows (32: tiles 0-3, 16: tiles 0, 1) set to zero. */
static inline __attribute__((always_inline, target("amx-tile"))) void q_amx_zero(int rows) {
    _tile_zero(0);
    _tile_zero(1);
    if (rows == 32) {
        _tile_zero(2);
        _tile_zero(3);
    }
}

/* One step of a group: tile 4 <- the weight rows from w (lda apart), tile 5 <- the 16 from w1 (rows 32),
 * tiles 6 / 7 <- the left / right 64 bytes of the B rows from b (ldb apart), and their products added to
 * the accumulators. */
static inline __attribute__((always_inline, target("amx-tile,amx-int8"))) void q_amx_step_tiles(
    const int8_t *w, const int8_t *w1, long lda, const uint8_t *b, long ldb, int rows) {
    _tile_loadd(4, w, lda);
    _tile_loadd(6, b, ldb);
    _tile_loadd(7, b + 64, ldb);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 4, 7);
    if (rows == 32) {
        _tile_loadd(5, w1, lda);
        _tile_dpbsud(2, 5, 6);
        _tile_dpbsud(3, 5, 7);
    }
}

/* The accumulators into acc (rows of Q_NR int32). */
static inline __attribute__((always_inline, target("amx-tile"))) void q_amx_store(int32_t *acc, int rows) {
    _tile_stored(0, acc, Q_NR * 4);
    _tile_stored(1, acc + 16, Q_NR * 4);
    if (rows == 32) {
        _tile_stored(2, acc + 16 * Q_NR, Q_NR * 4);
        _tile_stored(3, acc + 16 * Q_NR + 16, Q_NR * 4);
    }
}

/* acc (rows = 32 or 16 rows of Q_NR int32) = W rows w .. w + rows - 1 (row stride k4) times the
 * 32-column panel over kq quads, s at a time (s divides kq; the tiles configured for it by q_amx_begin). */
__attribute__((target("amx-tile,amx-int8"))) static void q_ukr_amx(const int8_t *w, long k4, int kq, int s,
                                                                    const uint8_t *panel, int32_t *acc, int rows) {
    q_amx_zero(rows);
    for (int q = 0; q < kq; q += s)
        q_amx_step_tiles(w + 4 * q, w + 16 * k4 + 4 * q, k4, panel + (long)q * Q_NR * 4, Q_NR * 4, rows);
    q_amx_store(acc, rows);
}
#endif

/* The quads of K an AMX step takes in a GEMM of M weight rows over K (see above), or 0 where the
 * GEMM keeps the VNNI microkernels: fewer than 16 rows, or no divisor of K's quads from Q_AMX_MIN_QUADS
 * to 16. */
static int q_amx_step(int M, int K) {
#ifdef MRT_HAVE_AMX_BUILD
    if (!q_use_amx || M < 16 || K <= 0) return 0;
    const long kq = q_k4(K) / 4;
    for (int s = 16; s >= Q_AMX_MIN_QUADS; --s)
        if (kq % s == 0) return s;
#else
    (void)M, (void)K;
#endif
    return 0;
}

/* The weight rows a work item's share of m rows is rounded to: whole 32-row AMX groups while there are two
 * of them (amx: q_amx_step's result), else the VNNI tile's `rows`. */
static inline int q_item_rows(int amx, long m, int rows) { return amx && m >= 64 ? 32 : rows; }

#ifdef MRT_HAVE_VNNI_BUILD
/* Whether a GEMM takes the matrix-vector route (q_gemv_vnni / q_gemv_avx2): one column of X stored
 * contiguously, a float output in place. */
static int q_gemv_route(int N, long ldx, int x_layout, const uint8_t *Cq, long img_cols) {
    return N == 1 && ldx == 1 && x_layout != Q_X_PANELS && !Cq && !img_cols && (q_use_vnni ? q_bw() : q_use_avx2);
}
#endif

static void q_task(void *ctx, long begin, long end) {
    const q_args *g = (const q_args *)ctx;
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_gemv_route(g->N, g->ldx, g->x_layout, g->Cq, g->img_cols)) { /* GEMV: items are blocks of mc rows */
        int32_t acc[64];
        int16_t *xw = NULL; /* AVX2: x widened to int16 once */
        if (!q_use_vnni) {
            if (!(xw = (int16_t *)mrt_pack_buffer(sizeof(int16_t) * (size_t)(g->K > 0 ? g->K : 1)))) return;
            for (long k = 0; k < g->K; ++k) xw[k] = g->X[k];
        }
        for (long item = begin; item < end; ++item) {
            int m0 = (int)item * g->mc, m1 = g->M - m0 < g->mc ? g->M : m0 + g->mc;
            for (int b0 = m0; b0 < m1; b0 += 64) {
                int b1 = m1 - b0 < 64 ? m1 : b0 + 64;
                if (xw)
                    q_gemv_avx2(g, b0, b1, xw, acc);
                else
                    q_gemv_vnni(g, b0, b1, acc);
                for (int m = b0; m < b1; ++m) q_store_row(g, acc + (m - b0), g->C + (long)m * g->ldc, 1, m, 0);
            }
            if (g->act && !g->store_act) {
                if (g->ldc == 1)
                    q_act_row(g->C + m0, m1 - m0, g->act, g->a0, g->a1);
                else
                    for (int m = m0; m < m1; ++m) q_act_row(g->C + (long)m * g->ldc, 1, g->act, g->a0, g->a1);
            }
            if (g->ldc == 1)
                q_post_row(g, g->C + m0, m1 - m0);
            else
                for (int m = m0; m < m1; ++m) q_post_row(g, g->C + (long)m * g->ldc, 1);
        }
        return;
    }
#endif
    /* No K blocking: a column block is packed over all of K (k4 * nc bytes),
     * so each 6 x 32 tile is finished in registers in one microkernel call;
     * the panel being used (k4 * 32 bytes) stays in cache over the row loop. */
    /* with a u8 output, the float rows of a block are staged after the panels and requantized
     * from there (still in cache): exactly quantize_u8 of the float output (requantizing in the
     * tile store instead measured 5% slower on PP-OCR det's 16 -> 32 1x1 conv at 160 x 160) */
    /* ... unless the requantization folds (g->fold, AVX-512 VNNI): then the tile store writes the
     * bytes itself, with no float stage (D181) */
    const int staged = g->Cq && !g->fold;
    const size_t pack_bytes = ((size_t)g->k4 * g->nc + 63) / 64 * 64;
    uint8_t *pack = (uint8_t *)mrt_pack_buffer(pack_bytes + (staged ? sizeof(float) * (size_t)g->mc * g->nc : 0));
    if (!pack) return;
    float *stage = (float *)(pack + pack_bytes);
    int kq = (int)(g->k4 / 4);
#ifdef MRT_HAVE_AMX_BUILD
    if (g->amx) q_amx_begin(g->amx);
#endif
    for (long item = begin; item < end; ++item) {
        int jb = (int)(item % g->nblocks), ib = (int)(item / g->nblocks);
        int n0 = jb * g->nc, nb = g->N - n0 < g->nc ? g->N - n0 : g->nc;
        int m0 = ib * g->mc, mb = g->M - m0 < g->mc ? g->M - m0 : g->mc;
        /* this block's float rows: the output itself, or the staging area (row stride nb) */
        float *cb = staged ? stage : g->Cq ? NULL : g->C + (long)m0 * g->ldc + n0;
        const long ldb = staged ? nb : g->ldc;
        uint8_t *qb = g->fold ? g->Cq + (long)m0 * g->ldcq + n0 : NULL; /* (the direct uint8 store) */
        const uint8_t *panels = pack;
        if (g->x_layout == Q_X_PANELS)
            panels = g->X + (long)n0 * g->k4;
#ifdef MRT_HAVE_VNNI_BUILD
        else if (g->Xf)
            q_pack_xf(g, n0, nb, pack);
#endif
        else
            q_pack_x(g, 0, (int)g->k4, n0, nb, pack);
        for (int j0 = 0, width; j0 < nb; j0 += width) {
            width = q_block_panel_width(g, nb - j0);
            int nr = nb - j0 < width ? nb - j0 : width;
            const uint8_t *panel = panels + (long)j0 * g->k4;
            int i0 = 0;
#ifdef MRT_HAVE_AMX_BUILD
            if (g->amx && width == Q_NR)
                for (int rows; i0 + 16 <= mb; i0 += rows) { /* groups of 32 rows, then one of 16 */
                    int32_t acc[32][Q_NR] __attribute__((aligned(64)));
                    const int m = m0 + i0;
                    rows = mb - i0 >= 32 ? 32 : 16;
                    q_ukr_amx(g->W + (long)m * g->k4, g->k4, kq, g->amx, panel, &acc[0][0], rows);
                    if (g->img_cols)
                        q_store_tile_images(g, &acc[0][0], rows, nr, m, n0 + j0);
                    else if (qb)
                        q_store_tile(g, &acc[0][0], rows, 0, nr, m, n0 + j0, NULL, 0, qb + (long)i0 * g->ldcq + j0,
                                     g->ldcq);
                    else
                        q_store_tile(g, &acc[0][0], rows, 0, nr, m, n0 + j0, cb + (long)i0 * ldb + j0, ldb, NULL, 0);
                }
#endif
            for (; i0 < mb; i0 += Q_MR) {
                int mr = mb - i0 < Q_MR ? mb - i0 : Q_MR;
                int m = m0 + i0;
                int32_t acc[Q_MR][Q_NR] __attribute__((aligned(64)));
                const int8_t *w = g->W + (long)m * g->k4;
#ifdef MRT_HAVE_VNNI_BUILD
                static const long one_run = 0; /* (a panel: one run of kq quads, 128 bytes apart) */
                if (q_use_vnni && width == 16)
                    q_ukr_vnni16(g, w, kq, panel, acc, mr);
                else if (q_use_vnni)
                    q_ukr_vnni(g, w, kq, panel, acc, mr, 0);
                else if (q_use_avx2 && (g->wflags & (Q_W_PAIRS16 | Q_W_SYMMETRIC)))
                    q_avx2_bytes_tile_any(w, g->k4, g->sums + m, panel, &one_run, 1, kq, Q_NR * 4, acc, mr,
                                          !(g->wflags & Q_W_PAIRS16));
                else if (q_use_avx2)
                    q_avx2_tile_any(w, g->k4, panel, &one_run, 1, kq, Q_NR * 4, acc, mr);
                else
#endif
#ifdef MRT_HAVE_NEON_BUILD
                if (g->dot)
                    q_ukr_dot(g, w, kq, panel, acc, mr);
                else
#endif
                    q_ukr_base(g, w, kq, panel, acc, mr, 0);
                if (qb)
                    q_store_tile(g, &acc[0][0], mr, 0, nr, m, n0 + j0, NULL, 0, qb + (long)i0 * g->ldcq + j0, g->ldcq);
                else
                    q_task_store(g, acc, mr, nr, m, n0 + j0, cb + (long)i0 * ldb + j0, ldb);
            }
        }
        if (g->img_cols || qb) continue; /* (its store did everything) */
        /* activation over whole rows of the block (still in L2): long vector loops */
        if (g->act && !g->store_act)
            for (int i = 0; i < mb; ++i) q_act_row(cb + (long)i * ldb, nb, g->act, g->a0, g->a1);
        for (int i = 0; i < mb; ++i) q_post_row(g, cb + (long)i * ldb, nb);
        if (g->Cq)
            for (int i = 0; i < mb; ++i) {
                const float ys = g->yscale[m0 + i];
                const int yz = g->yzp[m0 + i];
                q_quant_args qa = {cb + (long)i * ldb, g->Cq + (long)(m0 + i) * g->ldcq + n0, ys, (float)(0 - yz),
                                   (float)(255 - yz), (float)yz};
                q_quant_task(&qa, 0, nb);
            }
    }
#ifdef MRT_HAVE_AMX_BUILD
    if (g->amx) q_amx_end();
#endif
}

static void q_gemm_run_q(int M, int N, int K, const int32_t *sums, const int8_t *W, const uint8_t *X, long ldx,
                         int x_layout, int x_zero, const float *scale, const float *bias, float *C, long ldc,
                         const float *res, long ldr, int act, float a0, float a1, float post_a, float post_b,
                         uint8_t *Cq, long ldcq, const float *yscale, const int32_t *yzp, const float *Xf, float xscale,
                         long img_cols, long img_stride, int wflags, int nthreads) {
    if (M <= 0 || N <= 0) return;
    q_args g;
    g.fold = NULL;
    g.wflags = wflags;
    g.Xf = Xf; g.xscale = xscale;
    g.x_layout = x_layout;
    g.img_cols = img_cols;
    g.img_stride = img_stride;
    g.Cq = Cq; g.ldcq = ldcq; g.yscale = yscale; g.yzp = yzp;
    g.post_a = post_a; g.post_b = post_b;
    g.sums = sums;
    g.W = W;
    g.X = X; g.C = C; g.scale = scale; g.bias = bias; g.res = res;
    g.k4 = q_k4(K); g.ldx = ldx; g.ldc = ldc; g.ldr = ldr;
    g.M = M; g.N = N; g.K = K; g.x_zero = x_zero; g.act = act; g.a0 = a0; g.a1 = a1;
    g.neon = q_use_neon;
    g.dot = q_use_dotprod;
    g.amx = q_amx_step(M, K); /* (0 where wflags matter: AVX2 without VNNI has no AMX) */
    q_set_store_epilogue(&g, act, 0); /* (a u8 output is staged: see q_task) */
    float *fold = NULL; /* ... or, where the requantization folds, stored by the tiles (D181) */
#ifdef MRT_HAVE_VNNI_BUILD
    if (Cq && q_use_vnni && !img_cols && !res && (act == 0 || g.store_act) &&
        !q_gemv_route(N, ldx, x_layout, Cq, img_cols)) {
        fold = (float *)malloc(sizeof(float) * 5 * (size_t)M);
        if (fold && q_fold_rows(M, scale, bias, yscale, yzp, 1, g.store_act, a0, a1,
                                g.store_post ? post_a : 1.0f, g.store_post ? post_b : 0.0f, fold)) {
            g.fold = fold;
            g.store_q = 1;
        }
    }
#endif
    /* SDOT sees x - 128: sum_k w (x - x_zero) = sum_k w (x - 128) - (x_zero - 128) rowsum */
    if (g.dot) g.x_zero = x_zero - 128;
    if (nthreads < 1) nthreads = 1;
    int nc = Q_NC;
    if (nthreads > 1) {
        int per = (N + nthreads - 1) / nthreads;
        per = (per + Q_NR - 1) / Q_NR * Q_NR;
        if (per < nc) nc = per < Q_NR ? Q_NR : per;
    }
    int nblocks = (N + nc - 1) / nc;
    int mc = M;
    if (nthreads > 1 && nblocks < nthreads && M >= 2 * Q_MR) {
        int parts = (nthreads + nblocks - 1) / nblocks;
        mc = (M + parts - 1) / parts;
        const int group = q_item_rows(g.amx, M, Q_MR);
        mc = (mc + group - 1) / group * group;
    }
    g.nr = q_panel_width(N);
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_gemv_route(N, ldx, x_layout, Cq, img_cols)) { /* GEMV (q_task): no packing, split over rows */
        g.store_act = g.store_post = 0; /* one value per row: the plain store, then the act / post passes */
        mc = M;
        if (nthreads > 1 && M >= 128) mc = ((M + nthreads - 1) / nthreads + 15) / 16 * 16;
        nblocks = 1;
    }
#endif
    int mblocks = (M + mc - 1) / mc;
    g.nc = nc; g.mc = mc; g.nblocks = nblocks;
    /* a thread must get ~1M int8 multiply-adds (a few microseconds) to pay for waking it */
    mrt_parallel_for((long)nblocks * mblocks, (long)mc * nc * (K > 0 ? K : 1) / 32, nthreads, q_task, &g);
    free(fold);
}

void mrt_qgemm_u8s8_f32(const mrt_gemm_shape *s, const mrt_quant *q, const mrt_epilogue *e, const uint8_t *X,
                        const float *res, float *C, int nthreads) {
    const int M = s->M;
    q_gemm_run_q(M, s->N, s->K, (const int32_t *)q->packed_w, (const int8_t *)q->packed_w + (long)M * 4, X, s->ldb,
                 Q_X_ROWS, q->x_zero, q->scale, e->bias, C, s->ldc, res, s->ldr, e->act, e->a0, e->a1, 1.0f, 0.0f,
                 NULL, 0, NULL, NULL, NULL, 0.0f, 0, 0, q_packed_flags(q->packed_w, M, s->K), nthreads);
}

/* ---------------------------------------------------------------- quantize / im2col for uint8 */

#ifdef MRT_HAVE_VNNI_BUILD
__attribute__((target("avx2,fma"))) static long q_quant_avx2(const q_quant_args *a, long begin, long end) {
    const __m256 vs = _mm256_set1_ps(a->scale), vlo = _mm256_set1_ps(a->lo), vhi = _mm256_set1_ps(a->hi),
                 vzp = _mm256_set1_ps(a->zp);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    long i = begin;
    for (; i + 32 <= end; i += 32) {
        __m256i v[4];
        for (int j = 0; j < 4; ++j) {
            __m256 t = _mm256_div_ps(_mm256_loadu_ps(a->x + i + 8 * j), vs);
            t = _mm256_max_ps(t, vlo); /* NaN -> lo, as in the scalar loop */
            t = _mm256_min_ps(t, vhi);
            t = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v[j] = _mm256_cvtps_epi32(_mm256_add_ps(t, vzp));
        }
        __m256i u = _mm256_packus_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256((__m256i *)(a->q + i), _mm256_permutevar8x32_epi32(u, perm));
    }
    return i;
}
#endif

#ifdef MRT_HAVE_VNNI_BUILD
/* The same 64 values at a time on AVX-512. */
__attribute__((target("avx512f"))) static long q_quant_avx512(const q_quant_args *a, long begin, long end) {
    const __m512 vs = _mm512_set1_ps(a->scale), vlo = _mm512_set1_ps(a->lo), vhi = _mm512_set1_ps(a->hi),
                 vzp = _mm512_set1_ps(a->zp);
    long i = begin;
    for (; i + 64 <= end; i += 64)
        for (int j = 0; j < 4; ++j) /* lanes in [0, 255]: truncated to their bytes exactly */
            _mm_storeu_si128((__m128i *)(a->q + i + 16 * j),
                             _mm512_cvtepi32_epi8(q_quant16(_mm512_loadu_ps(a->x + i + 16 * j), vs, vlo, vhi, vzp)));
    return i;
}
#endif

static void q_quant_task(void *ctx, long begin, long end) {
    const q_quant_args *a = (const q_quant_args *)ctx;
    const float *x = a->x;
    uint8_t *q = a->q;
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_use_vnni) begin = q_quant_avx512(a, begin, end);
    if (q_use_avx2) begin = q_quant_avx2(a, begin, end);
#endif
    for (long i = begin; i < end; ++i) {
        float t = x[i] / a->scale;
        t = t > a->lo ? t : a->lo; /* NaN -> lo */
        t = t < a->hi ? t : a->hi;
        t = (t + 12582912.0f) - 12582912.0f; /* round half to even, |t| <= 255 */
        q[i] = (uint8_t)(int)(t + a->zp);
    }
}

void mrt_quantize_u8_f32(const float *x, uint8_t *q, long n, float scale, int zp, int nthreads) {
    q_quant_args a = {x, q, scale, (float)(0 - zp), (float)(255 - zp), (float)zp};
    /* split in multiples of 32 elements so every part but the last runs fully vectorised */
    (void)a;
    mrt_parallel_for(n, 4, nthreads, q_quant_task, &a);
}

typedef struct {
    const float *x, *xm, *xu, *um; /* xm / um: one multiplier of x / xu per plane, or NULL */
    uint8_t *q;
    int h, w, f;
    float scale;
    int zp, failed;
} q_quant_add_up_args;

#ifdef MRT_HAVE_VNNI_BUILD
/* Planes [begin, end) on AVX-512 for a factor f dividing 16, row by row: 16 values of x (none when
 * x is NULL) plus 16 / f of xu each taken f times (vpermps), quantized as q_quant16 does, 16 bytes
 * stored (masked row tails); no sum or upsampled row is written anywhere. */
__attribute__((target("avx512f"))) static void q_quant_add_up_avx512(const q_quant_add_up_args *a, long begin,
                                                                        long end) {
    /* the arguments in locals: the uint8 stores may alias *a, which would reload them every step */
    const int f = a->f;
    const long w = a->w, plane = (long)a->h * w, wu = w / f, plane_u = (long)(a->h / f) * wu;
    const float *const x0 = a->x, *const xm = a->xm, *const xu0 = a->xu, *const um = a->um;
    uint8_t *const q0 = a->q;
    const __m512 vs = _mm512_set1_ps(a->scale), lo = _mm512_set1_ps((float)-a->zp),
                 hi = _mm512_set1_ps(255.0f - a->zp), vz = _mm512_set1_ps((float)a->zp);
    const __m512i repeat = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             (unsigned)__builtin_ctz((unsigned)f)); /* lane k reads k / f */
    const __mmask16 full_u = (__mmask16)((1u << (16 / f)) - 1);
    for (long p = begin; p < end; ++p) {
        /* x * xm[p], xu * um[p]: explicitly rounded multiplies, never contracted with the add into an FMA */
        const __m512 vm = _mm512_set1_ps(xm ? xm[p] : 1.0f), vum = _mm512_set1_ps(um ? um[p] : 1.0f);
        for (int i = 0; i < a->h; ++i) {
            const float *x = x0 ? x0 + p * plane + (long)i * w : NULL;
            const float *xu = xu0 + p * plane_u + (long)(i / f) * wu;
            uint8_t *q = q0 + p * plane + (long)i * w;
            long j = 0;
            for (; j + 16 <= w; j += 16) { /* whole vectors: 16 / f values of xu */
                __m512 v = _mm512_permutexvar_ps(repeat, _mm512_maskz_loadu_ps(full_u, xu + j / f));
                if (um) v = _mm512_mul_round_ps(v, vum, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                if (x) {
                    __m512 xv = _mm512_loadu_ps(x + j);
                    if (xm) xv = _mm512_mul_round_ps(xv, vm, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    v = _mm512_add_ps(xv, v);
                }
                /* (through a register: vpmovdb's store form is slow on AMD Zen 4) */
                _mm_storeu_si128((__m128i *)(q + j), _mm512_cvtepi32_epi8(q_quant16(v, vs, lo, hi, vz)));
            }
            if (j < w) { /* w - j, a multiple of f */
                const __mmask16 m = (__mmask16)((1u << (w - j)) - 1), mu = (__mmask16)((1u << ((w - j) / f)) - 1);
                __m512 v = _mm512_permutexvar_ps(repeat, _mm512_maskz_loadu_ps(mu, xu + j / f));
                if (um) v = _mm512_mul_round_ps(v, vum, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                if (x) {
                    __m512 xv = _mm512_maskz_loadu_ps(m, x + j);
                    if (xm) xv = _mm512_mul_round_ps(xv, vm, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    v = _mm512_add_ps(xv, v);
                }
                _mm512_mask_cvtepi32_storeu_epi8(q + j, m, q_quant16(v, vs, lo, hi, vz));
            }
        }
    }
}
#endif

/* sum[j] = (x[j] * xm, or x[j], when x) + xu[j] * um, j < n: q_quant_add_up_task's row loops for
 * f == 1 in the same order (products stored before the add: never contracted into an FMA), with
 * AVX2 vectors when the CPU has them. */
static inline void q_add_scaled_plane_body(float *restrict sum, const float *restrict xu, float um,
                                           const float *restrict x, float xm, int with_xm, long n) {
    for (long j = 0; j < n; ++j) sum[j] = xu[j] * um;
    if (x && with_xm) {
        for (long j = 0; j < n; ++j) {
            const float t = x[j] * xm;
            sum[j] = t + sum[j];
        }
    } else if (x) {
        for (long j = 0; j < n; ++j) sum[j] = x[j] + sum[j];
    }
}
#ifdef MRT_HAVE_VNNI_BUILD
__attribute__((target("avx2"))) static void q_add_scaled_plane_avx2(float *restrict sum, const float *restrict xu,
                                                                    float um, const float *restrict x, float xm,
                                                                    int with_xm, long n) {
    q_add_scaled_plane_body(sum, xu, um, x, xm, with_xm, n);
}
#endif
static void q_add_scaled_plane(float *restrict sum, const float *restrict xu, float um, const float *restrict x,
                               float xm, int with_xm, long n) {
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_use_avx2) {
        q_add_scaled_plane_avx2(sum, xu, um, x, xm, with_xm, n);
        return;
    }
#endif
    q_add_scaled_plane_body(sum, xu, um, x, xm, with_xm, n);
}

/* Planes [begin, end): on VNNI with f dividing 16 from registers (q_quant_add_up_avx512);
 * otherwise the sum of each plane (or the upsampled xu plane alone) into per-thread scratch (in
 * cache), then quantized in one q_quant_task pass. */
static void q_quant_add_up_task(void *ctx, long begin, long end) {
    q_quant_add_up_args *a = (q_quant_add_up_args *)ctx;
    const long plane = (long)a->h * a->w, wu = a->w / a->f, plane_u = (long)(a->h / a->f) * wu;
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_use_vnni && 16 % a->f == 0) {
        q_quant_add_up_avx512(a, begin, end);
        return;
    }
#endif
    float *sum = (float *)mrt_pack_buffer(sizeof(float) * ((size_t)plane + a->w)); /* (+ one row for x * xm) */
    if (!sum) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (long p = begin; p < end; ++p) {
        const float *x = a->x ? a->x + p * plane : NULL, *xu = a->xu + p * plane_u;
        if (a->f == 1) { /* (a per-channel scale alone, SE's x * s: no upsampling, no index division) */
            q_add_scaled_plane(sum, xu, a->um ? a->um[p] : 1.0f, x, a->xm ? a->xm[p] : 1.0f, a->xm != NULL, plane);
            q_quant_args qa = {sum, a->q + p * plane, a->scale, (float)(0 - a->zp), (float)(255 - a->zp),
                               (float)a->zp};
            q_quant_task(&qa, 0, plane);
            continue;
        }
        for (int i = 0; i < a->h; ++i) {
            const float *restrict ur = xu + (long)(i / a->f) * wu;
            float *restrict sr = sum + (long)i * a->w;
            /* the products are stored before any add: never contracted with it into an FMA */
            const float um = a->um ? a->um[p] : 1.0f;
            for (int j = 0; j < a->w; ++j) sr[j] = ur[j / a->f] * um;
            if (x && a->xm) {
                float *restrict t = sum + plane; /* the row's x * xm */
                for (int j = 0; j < a->w; ++j) t[j] = x[(long)i * a->w + j] * a->xm[p];
                for (int j = 0; j < a->w; ++j) sr[j] = t[j] + sr[j];
            } else if (x) {
                for (int j = 0; j < a->w; ++j) sr[j] = x[(long)i * a->w + j] + sr[j];
            }
        }
        q_quant_args qa = {sum, a->q + p * plane, a->scale, (float)(0 - a->zp), (float)(255 - a->zp), (float)a->zp};
        q_quant_task(&qa, 0, plane);
    }
}

int mrt_quantize_add_up_u8_f32(const mrt_conv_geometry *g, const mrt_quant *qp, const float *x, const float *xm,
                               const float *xu, const float *um, uint8_t *q, int nthreads) {
    const long planes = (long)g->n * g->c;
    const int h = g->oh, w = g->ow, f = g->sh;
    const float scale = qp->y_scale;
    const int zp = qp->y_zero;
    if (f < 1 || h % f || w % f) return -2;
    q_quant_add_up_args a = {x, xm, xu, um, q, h, w, f, scale, zp, 0};
    mrt_parallel_for(planes, (long)h * w, nthreads, q_quant_add_up_task, &a);
    return a.failed ? -1 : 0;
}

typedef struct {
    const uint8_t *x;
    uint8_t *cols;
    long ld; /* row stride of cols (oh*ow, or more for images side by side) */
    int h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
    uint8_t pad;
    /* q_im2col_plane64 only (the other routes take one image per call): images at x + i * img_stride,
     * their columns at cols + i * col_step */
    int nimg;
    long img_stride, col_step;
} q_im2col_args;

/* dst[i] = src[2 i] for i < n (the stride-2 im2col row), reading no byte past src[2 (n - 1)].
 * Little-endian: 16 pairs of bytes loaded as 16-bit lanes and truncated to their low (even)
 * bytes, which GCC turns into and+pack (x86 SSE2) or xtn (NEON); a plain loop is not
 * vectorized (a byte gather at stride 2). */
typedef uint16_t q_v16u16 __attribute__((vector_size(32), aligned(1)));
typedef uint8_t q_v16u8 __attribute__((vector_size(16), aligned(1)));

static inline void q_gather_even(uint8_t *restrict dst, const uint8_t *restrict src, int n) {
    int i = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (; i + 16 < n; i += 16) /* reads src[2i .. 2i + 31] <= src[2 (n - 1) - 1] */
        *(q_v16u8 *)(dst + i) = __builtin_convertvector(*(const q_v16u16 *)(src + 2 * i), q_v16u8);
#endif
    for (; i < n; ++i) dst[i] = src[2 * i];
}

/* The geometry is read into locals first: the byte stores below may alias anything, and through the
 * struct every one of them made the compiler load the stride, the pad byte and the bounds again (an
 * imul per byte): ResNet-18's stride-2 convs on AVX2 (28 x 28 outputs and less: the byte loop below)
 * spent 6.9 % of the int8 model in this function, 59 % of that in the store of that loop; 5.1 % after. */
static void q_im2col_task(void *ctx, long begin, long end) {
    const q_im2col_args *a = (const q_im2col_args *)ctx;
    const int ow = a->ow, oh = a->oh, kh = a->kh, kw = a->kw, kk = kh * kw, h = a->h, wd = a->wd;
    const int sh = a->sh, sw = a->sw, dh = a->dh, dw = a->dw, pt = a->pt, pl = a->pl;
    const uint8_t pad = a->pad, *const x = a->x;
    uint8_t *const cols = a->cols;
    const long ld = a->ld;
    /* (channel, ky, kx) of row r, stepped without divisions (small layers are per-row overhead) */
    int ch = (int)(begin / kk), t = (int)(begin % kk), ky = t / kw, kx = t % kw;
    for (long r = begin; r < end; ++r) {
        const uint8_t *xp = x + (long)ch * h * wd;
        uint8_t *dst = cols + r * ld;
        int off = kx * dw - pl, lo, hi;
        if (sw == 1) {
            lo = off >= 0 ? 0 : (-off < ow ? -off : ow);
            hi = wd - off < ow ? wd - off : ow;
            if (hi < lo) hi = lo;
        } else {
            valid_cols_base(off, sw, wd, ow, &lo, &hi);
        }
        for (int oy = 0; oy < oh; ++oy, dst += ow) {
            int iy = oy * sh - pt + ky * dh;
            if (iy < 0 || iy >= h) {
                memset(dst, pad, ow);
                continue;
            }
            const uint8_t *src = xp + (long)iy * wd + off;
            if (ow <= 32) { /* small images: byte loops beat three libc calls per row */
                for (int ox = 0; ox < lo; ++ox) dst[ox] = pad;
                if (sw == 1)
                    for (int ox = lo; ox < hi; ++ox) dst[ox] = src[ox];
                else if (sw == 2)
                    for (int ox = lo; ox < hi; ++ox) dst[ox] = src[2 * ox];
                else
                    for (int ox = lo; ox < hi; ++ox) dst[ox] = src[ox * sw];
                for (int ox = hi; ox < ow; ++ox) dst[ox] = pad;
                continue;
            }
            if (lo > 0) memset(dst, pad, lo);
            if (sw == 1) {
                memcpy(dst + lo, src + lo, hi - lo);
            } else if (sw == 2) {
                q_gather_even(dst + lo, src + 2 * lo, hi - lo);
            } else {
                for (int ox = lo; ox < hi; ++ox) dst[ox] = src[ox * sw];
            }
            if (hi < ow) memset(dst + hi, pad, ow - hi);
        }
        if (++kx == kw) {
            kx = 0;
            if (++ky == kh) { ky = 0; ++ch; }
        }
    }
}

#ifdef MRT_HAVE_VNNI_BUILD
/* Rows of at most 64 output columns at stride 1, or 32 at stride 2 (small images): one masked load
 * of the row's input span (padding where the window is outside the image; masked-off bytes are never
 * read), at stride 2 its even bytes kept (16-bit lanes truncated: vpmovwb), and one masked store per
 * output row.  At stride 2 the byte loop of q_im2col_task took 55 % of a grouped 3 x 3 conv (RegNetY's
 * 208 channels in groups of 8, 28 x 28 -> 14 x 14: 2.4x its float time, D147).  Used with VNNI (every
 * such CPU has AVX512BW). */
__attribute__((target("avx512f,avx512bw"))) static void q_im2col_narrow(void *ctx, long begin, long end) {
    const q_im2col_args *a = (const q_im2col_args *)ctx;
    const int ow = a->ow, kk = a->kh * a->kw, sw = a->sw, span = sw * ow; /* (span <= 64: the route's rule) */
    const __m512i padv = _mm512_set1_epi8((char)a->pad);
    const __mmask64 mow = ow >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << ow) - 1);
    const __mmask64 mspan = span >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << span) - 1);
    int ch = (int)(begin / kk), t = (int)(begin % kk), ky = t / a->kw, kx = t % a->kw;
    for (long r = begin; r < end; ++r) {
        const uint8_t *xp = a->x + (long)ch * a->h * a->wd;
        uint8_t *dst = a->cols + r * a->ld;
        int off = kx * a->dw - a->pl;
        /* the span's bytes [lo, hi) that are inside the image row */
        int lo = off >= 0 ? 0 : (-off < span ? -off : span);
        int hi = a->wd - off < span ? a->wd - off : span;
        if (hi < lo) hi = lo;
        const __mmask64 mv = mspan & ~((((__mmask64)1 << lo) - 1)) & (hi >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << hi) - 1));
        for (int oy = 0; oy < a->oh; ++oy, dst += ow) {
            int iy = oy * a->sh - a->pt + ky * a->dh;
            __m512i v = padv;
            if (iy >= 0 && iy < a->h) v = _mm512_mask_loadu_epi8(padv, mv, xp + (long)iy * a->wd + off);
            if (sw == 2) /* output column ox is the span's byte 2 ox */
                _mm512_mask_storeu_epi8(dst, mow, _mm512_castsi256_si512(_mm512_cvtepi16_epi8(v))); /* (ow <= 32) */
            else
                _mm512_mask_storeu_epi8(dst, mow, v);
        }
        if (++kx == a->kw) {
            kx = 0;
            if (++ky == a->kh) { ky = 0; ++ch; }
        }
    }
}
#endif

/* Pixel p = oy * ow + ox of a plane of at most 64 output pixels (ow == wd, stride 1) reads input
 * (oy + dy, ox + dx) for the tap shifted by (dy, dx): bit p of the result is set when that is inside
 * the h x wd image (rows oy with 0 <= oy + dy < h, columns ox with 0 <= ox + dx < wd).  Shared by the
 * int8 and float whole-plane im2col (q_im2col_plane64, im2col_plane64_f32 in kernels.c). */
static inline uint64_t plane64_tap_mask(int h, int wd, int oh, int ow, int dy, int dx) {
    int xlo = dx < 0 ? -dx : 0, xhi = wd - dx < ow ? wd - dx : ow;
    int ylo = dy < 0 ? -dy : 0, yhi = h - dy < oh ? h - dy : oh;
    if (xlo >= xhi || ylo >= yhi) return 0;
    const uint64_t row = (xhi >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << xhi) - 1)) & ~(((uint64_t)1 << xlo) - 1);
    /* bit oy * ow for each row oy in [ylo, yhi) (every ow-th bit by doubling, then the rows' range) */
    uint64_t starts = 1;
    for (int sh = ow; sh < 64; sh *= 2) starts |= starts << sh;
    starts &= (yhi * ow >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << (yhi * ow)) - 1)) & ~(((uint64_t)1 << (ylo * ow)) - 1);
    return row * starts; /* row << (oy * ow) for each start: disjoint bits (row < 2^ow), no carries */
}

#ifdef MRT_HAVE_VNNI_BUILD
/* Whole planes of at most 64 pixels (oh * ow <= 64, stride 1, ow == wd: "same" convolutions on
 * small images such as the digits model's 8x8 and 4x4): an im2col row (channel, ky, kx) is the
 * input plane shifted by dy = ky*dh - pt rows and dx = kx*dw - pl columns, so it is one masked
 * 64-byte load at offset dy*wd + dx and one store, instead of one per output row.  The load mask
 * keeps the output pixels whose window tap falls inside the image (rows oy with 0 <= oy+dy < h,
 * columns ox with 0 <= ox+dx < wd); the others take the pad value, and masked-off bytes are never
 * read (AVX-512 masked loads do not fault on them). */
__attribute__((target("avx512f,avx512bw"))) static __mmask64 q_plane64_mask(const q_im2col_args *a, int ky, int kx) {
    return plane64_tap_mask(a->h, a->wd, a->oh, a->ow, ky * a->dh - a->pt, kx * a->dw - a->pl);
}

/* Where tap (ky, kx)'s shifted plane starts, in elements from the plane's start (lanes outside the
 * plane are masked off by q_plane64_mask). */
static inline long q_plane64_offset(const q_im2col_args *a, int ky, int kx) {
    return (long)(ky * a->dh - a->pt) * a->wd + kx * a->dw - a->pl;
}

/* The plane64 im2col tasks keep the mask and offset of up to this many taps (7 x 7), computed once
 * per call by q_plane64_taps: the same for every channel and image. */
#define Q_PLANE64_KEPT_TAPS 49

/* masks[t], offs[t] of taps t = ky * kw + kx < min(kh * kw, Q_PLANE64_KEPT_TAPS). */
__attribute__((target("avx512f,avx512bw"))) static void q_plane64_taps(const q_im2col_args *a, __mmask64 *masks,
                                                                         long *offs) {
    for (int t = 0; t < a->kh * a->kw && t < Q_PLANE64_KEPT_TAPS; ++t) {
        masks[t] = q_plane64_mask(a, t / a->kw, t % a->kw);
        offs[t] = q_plane64_offset(a, t / a->kw, t % a->kw);
    }
}

__attribute__((target("avx512f,avx512bw"))) static void q_im2col_plane64(void *ctx, long begin, long end) {
    const q_im2col_args *a = (const q_im2col_args *)ctx;
    const int kk = a->kh * a->kw;
    const __m512i padv = _mm512_set1_epi8((char)a->pad);
    const int npix = a->oh * a->ow;
    const __mmask64 all = npix >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << npix) - 1);
    /* the load mask and offset of each tap, the same for every channel */
    __mmask64 masks[Q_PLANE64_KEPT_TAPS];
    long offs[Q_PLANE64_KEPT_TAPS];
    q_plane64_taps(a, masks, offs);
    const int nimg = a->nimg;
    for (int i = 0; i < nimg; ++i) { /* (the masks above serve every image) */
        const uint8_t *x = a->x + i * a->img_stride;
        uint8_t *cols = a->cols + i * a->col_step;
        int ch = (int)(begin / kk), t = (int)(begin % kk);
        for (long r = begin; r < end; ++r) {
            const __mmask64 m = t < Q_PLANE64_KEPT_TAPS ? masks[t] : q_plane64_mask(a, t / a->kw, t % a->kw);
            const long off = t < Q_PLANE64_KEPT_TAPS ? offs[t] : q_plane64_offset(a, t / a->kw, t % a->kw);
            /* lanes in m address xp[(oy+dy)*wd + ox+dx] = xp[dy*wd + dx + p]: inside the plane */
            const uint8_t *xp = x + (long)ch * a->h * a->wd;
            __m512i v = _mm512_mask_loadu_epi8(padv, m, xp + off);
            _mm512_mask_storeu_epi8(cols + r * a->ld, all, v);
            if (++t == kk) {
                t = 0;
                ++ch;
            }
        }
    }
}
#endif

#ifdef MRT_HAVE_VNNI_BUILD
typedef struct {
    q_im2col_args im;  /* the images' geometry, pad, nimg and img_stride (cols, ld, col_step unused) */
    uint8_t *panels;   /* group g's panels at panels + g * group_bytes */
    long group_bytes;  /* k4 * (the GEMM's N rounded up to whole panels) */
    long k4;           /* bytes per column of a group's K rows (q_k4(cg * kh * kw)) */
    int cg, nr;        /* input channels per group, panel width (q_panel_width of the GEMM's N) */
} q_panels_args;

/* The 4-byte quads of 64 columns from four K rows (64 bytes each, column j at byte j): in column
 * order, 16 per register.  Bytes, then 16-bit pairs interleave within 128-bit lanes (lane L of q0
 * holds columns 16L + 0..3, of q1 16L + 4..7, of q2 16L + 8..11, of q3 16L + 12..15), then a 4 x 4
 * transpose of the lanes puts them in order. */
__attribute__((target("avx512f,avx512bw"))) static inline void q_quads64(__m512i v0, __m512i v1, __m512i v2,
                                                                           __m512i v3, __m512i *o0, __m512i *o1,
                                                                           __m512i *o2, __m512i *o3) {
    const __m512i ab_lo = _mm512_unpacklo_epi8(v0, v1), ab_hi = _mm512_unpackhi_epi8(v0, v1);
    const __m512i cd_lo = _mm512_unpacklo_epi8(v2, v3), cd_hi = _mm512_unpackhi_epi8(v2, v3);
    const __m512i q0 = _mm512_unpacklo_epi16(ab_lo, cd_lo), q1 = _mm512_unpackhi_epi16(ab_lo, cd_lo);
    const __m512i q2 = _mm512_unpacklo_epi16(ab_hi, cd_hi), q3 = _mm512_unpackhi_epi16(ab_hi, cd_hi);
    const __m512i t0 = _mm512_shuffle_i64x2(q0, q1, 0x44), t1 = _mm512_shuffle_i64x2(q2, q3, 0x44);
    const __m512i t2 = _mm512_shuffle_i64x2(q0, q1, 0xee), t3 = _mm512_shuffle_i64x2(q2, q3, 0xee);
    *o0 = _mm512_shuffle_i64x2(t0, t1, 0x88);
    *o1 = _mm512_shuffle_i64x2(t0, t1, 0xdd);
    *o2 = _mm512_shuffle_i64x2(t2, t3, 0x88);
    *o3 = _mm512_shuffle_i64x2(t2, t3, 0xdd);
}

/* One K row of `count` images side by side in 64 bytes: image l's tap-shifted plane (load mask m,
 * at x + l * img_stride) at byte l * npix, the pad elsewhere.  The loads are independent (ORed). */
__attribute__((target("avx512f,avx512bw"))) static inline __m512i q_images_row(const uint8_t *x, long img_stride,
                                                                                 int count, int npix, __mmask64 m,
                                                                                 __m512i padv) {
    if (count == 1) return _mm512_mask_loadu_epi8(padv, m, x);
    __m512i v = _mm512_setzero_si512();
    __mmask64 loaded = 0;
    for (int l = 0; l < count; ++l) {
        const __mmask64 ml = m << (l * npix); /* (lane j + l npix reads x + l img_stride + j) */
        v = _mm512_or_si512(v, _mm512_maskz_loadu_epi8(ml, x + l * img_stride - l * npix));
        loaded |= ml;
    }
    return _mm512_mask_blend_epi8(loaded, padv, v);
}

/* q_im2col_plane64's columns written straight in the packed layout of the GEMM (Q_X_PANELS: q_task
 * then packs nothing): column n = i * npix + pixel of image i, each group's K rows (channel, ky, kx)
 * in quads.  Items are (group, quad of K rows).  A quad's four rows are masked plane loads (pad where
 * the tap is outside the image, and for rows past the group's K, which meet zero weights) turned
 * into the columns' quads by q_quads64.  When npix divides 64 (planes of 64, 32, 16 ... pixels), the
 * images of each 64 columns share the four loads (image L's plane at byte L * npix: the masks
 * shifted there) and the quads are stored whole into the 64 / nr panels they fill; otherwise each
 * image's quads go through a line buffer, copied in runs of columns that end at panel boundaries. */
__attribute__((target("avx512f,avx512bw"))) static void q_im2col_panels_task(void *ctx, long begin, long end) {
    const q_panels_args *pa = (const q_panels_args *)ctx;
    const q_im2col_args *a = &pa->im;
    const int kk = a->kh * a->kw, kg = pa->cg * kk, npix = a->oh * a->ow, nr = pa->nr, nimg = a->nimg;
    const long kq = pa->k4 / 4, panel_bytes = (long)nr * pa->k4;
    const __m512i padv = _mm512_set1_epi8((char)a->pad);
    __mmask64 masks[Q_PLANE64_KEPT_TAPS];
    long offs[Q_PLANE64_KEPT_TAPS];
    q_plane64_taps(a, masks, offs);
    const int per64 = 64 % npix == 0 ? 64 / npix : 0; /* images per 64 columns, or 0: the line route */
    const long chunk_step = 64 / nr * panel_bytes;     /* bytes from the panels of 64 columns to the next */
    uint8_t line[256] __attribute__((aligned(64)));
    /* the item's (group, quad) and its first row's (channel, tap), advanced without divisions (one
     * integer division costs about as much as a quad's loads and shuffles on a small image) */
    int grp = (int)(begin / kq), q = (int)(begin % kq), ch0 = 4 * q / kk, tap0 = 4 * q % kk;
    for (long item = begin; item < end; ++item) {
        __mmask64 m[4];
        long src[4]; /* byte offset of each row's tap-shifted plane in an image */
        for (int t = 0, ch = ch0, tap = tap0; t < 4; ++t) { /* row 4 q + t is (channel ch, tap) */
            if (4 * q + t >= kg) {
                m[t] = 0;
                src[t] = 0;
                continue;
            }
            m[t] = tap < Q_PLANE64_KEPT_TAPS ? masks[tap] : q_plane64_mask(a, tap / a->kw, tap % a->kw);
            src[t] = (long)(grp * pa->cg + ch) * a->h * a->wd +
                     (tap < Q_PLANE64_KEPT_TAPS ? offs[tap] : q_plane64_offset(a, tap / a->kw, tap % a->kw));
            if (++tap == kk) tap = 0, ++ch;
        }
        /* quad q's rows in the group's first panel */
        uint8_t *panel = pa->panels + grp * pa->group_bytes + (long)q * nr * 4;
        if (++q == kq) {
            q = ch0 = tap0 = 0;
            ++grp;
        } else {
            for (tap0 += 4; tap0 >= kk; tap0 -= kk) ++ch0;
        }
        __m512i o0, o1, o2, o3;
        if (per64) {
            for (int i = 0; i < nimg; i += per64, panel += chunk_step) {
                const int count = nimg - i < per64 ? nimg - i : per64; /* (lanes past the last image: pad) */
                const uint8_t *x = a->x + i * a->img_stride;
                const long is = a->img_stride;
                q_quads64(q_images_row(x + src[0], is, count, npix, m[0], padv),
                          q_images_row(x + src[1], is, count, npix, m[1], padv),
                          q_images_row(x + src[2], is, count, npix, m[2], padv),
                          q_images_row(x + src[3], is, count, npix, m[3], padv), &o0, &o1, &o2, &o3);
                /* the panels holding these columns (the last chunk's may end sooner) */
                const int ncols = count * npix;
                if (nr == Q_NR) {
                    _mm512_storeu_si512(panel, o0);
                    _mm512_storeu_si512(panel + 64, o1);
                    if (ncols > Q_NR) {
                        _mm512_storeu_si512(panel + panel_bytes, o2);
                        _mm512_storeu_si512(panel + panel_bytes + 64, o3);
                    }
                } else { /* 16-column panels */
                    _mm512_storeu_si512(panel, o0);
                    if (ncols > 16) _mm512_storeu_si512(panel + panel_bytes, o1);
                    if (ncols > 32) _mm512_storeu_si512(panel + 2 * panel_bytes, o2);
                    if (ncols > 48) _mm512_storeu_si512(panel + 3 * panel_bytes, o3);
                }
            }
            continue;
        }
        int col = 0; /* the next column in the current panel */
        for (int i = 0; i < nimg; ++i) {
            const uint8_t *x = a->x + i * a->img_stride;
            q_quads64(_mm512_mask_loadu_epi8(padv, m[0], x + src[0]), _mm512_mask_loadu_epi8(padv, m[1], x + src[1]),
                      _mm512_mask_loadu_epi8(padv, m[2], x + src[2]), _mm512_mask_loadu_epi8(padv, m[3], x + src[3]),
                      &o0, &o1, &o2, &o3);
            _mm512_store_si512(line, o0);
            _mm512_store_si512(line + 64, o1);
            _mm512_store_si512(line + 128, o2);
            _mm512_store_si512(line + 192, o3);
            for (int pix = 0; pix < npix;) { /* runs of columns inside one panel */
                const int len = nr - col < npix - pix ? nr - col : npix - pix;
                for (int b = 0; b < 4 * len; b += 64) {
                    const int left = 4 * len - b;
                    const __mmask64 mk = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
                    _mm512_mask_storeu_epi8(panel + 4 * col + b, mk,
                                            _mm512_maskz_loadu_epi8(mk, line + 4 * pix + b));
                }
                pix += len;
                if ((col += len) == nr) {
                    col = 0;
                    panel += panel_bytes;
                }
            }
        }
    }
}
#endif

#ifdef MRT_HAVE_VNNI_BUILD
#define Q_PANEL1_TAPS Q_PLANE64_KEPT_TAPS /* q_im2col_panels1_task keeps every tap's mask and offset */

/* q_im2col_panels_task for one image (a batch-1 conv of a plane of at most 64 pixels, e.g. a small
 * CNN at batch 1): each K row is one masked load of the image's tap-shifted plane
 * (q_im2col_plane64's) and the rows' (channel, tap) advance without divisions (the general task's
 * per-quad index arithmetic cost about half the GEMM on a 32-channel 4 x 4 image); four rows make
 * the quads of the image's columns: planes of at most 16 pixels (one 16-column panel) with 128-bit
 * unpacks, larger ones with q_quads64, whose 16-column blocks are stored into the panels that
 * exist.  Items are (group, quad of K rows), as in q_im2col_panels_task; needs kh * kw <=
 * Q_PANEL1_TAPS and nimg == 1. */
__attribute__((target("avx512f,avx512bw"))) static void q_im2col_panels1_task(void *ctx, long begin, long end) {
    const q_panels_args *pa = (const q_panels_args *)ctx;
    const q_im2col_args *a = &pa->im;
    const int kk = a->kh * a->kw, kg = pa->cg * kk, npix = a->oh * a->ow, nr = pa->nr;
    const long kq = pa->k4 / 4, plane = (long)a->h * a->wd, panel_bytes = (long)nr * pa->k4;
    const __m512i padv = _mm512_set1_epi8((char)a->pad);
    __mmask64 masks[Q_PANEL1_TAPS];
    long offs[Q_PANEL1_TAPS];
    q_plane64_taps(a, masks, offs);
    /* q_quads64's block b (columns 16 b .. 16 b + 15) goes to block_off[b] from quad q's bytes in
     * the first panel; blocks past the last panel are not stored (nblocks) */
    long block_off[4];
    int nblocks = 0;
    for (int b = 0; b < 4 && 16 * b / nr * nr < npix; ++b, ++nblocks)
        block_off[b] = 16 * b / nr * panel_bytes + 16 * b % nr * 4;
    /* the item's group and quad, and its first row's tap and channel plane */
    int grp = (int)(begin / kq), q = (int)(begin % kq), tap = 4 * q % kk;
    const uint8_t *chp = a->x + ((long)grp * pa->cg + 4 * q / kk) * plane;
    for (long item = begin; item < end; ++item) {
        __m512i v[4];
        for (int t = 0; t < 4; ++t) {
            if (4 * q + t >= kg) { /* rows past the group's K: pad (they meet zero weights) */
                v[t] = padv;
                continue;
            }
            v[t] = _mm512_mask_loadu_epi8(padv, masks[tap], chp + offs[tap]);
            if (++tap == kk) tap = 0, chp += plane;
        }
        uint8_t *panel = pa->panels + grp * pa->group_bytes + (long)q * nr * 4; /* quad q in the first panel */
        if (npix <= 16) { /* nr == 16: the panel's 16 quads from the low 16 bytes of the rows */
            const __m128i r0 = _mm512_castsi512_si128(v[0]), r1 = _mm512_castsi512_si128(v[1]);
            const __m128i r2 = _mm512_castsi512_si128(v[2]), r3 = _mm512_castsi512_si128(v[3]);
            const __m128i lo01 = _mm_unpacklo_epi8(r0, r1), hi01 = _mm_unpackhi_epi8(r0, r1);
            const __m128i lo23 = _mm_unpacklo_epi8(r2, r3), hi23 = _mm_unpackhi_epi8(r2, r3);
            _mm_storeu_si128((__m128i *)panel, _mm_unpacklo_epi16(lo01, lo23));
            _mm_storeu_si128((__m128i *)(panel + 16), _mm_unpackhi_epi16(lo01, lo23));
            _mm_storeu_si128((__m128i *)(panel + 32), _mm_unpacklo_epi16(hi01, hi23));
            _mm_storeu_si128((__m128i *)(panel + 48), _mm_unpackhi_epi16(hi01, hi23));
        } else {
            __m512i o[4];
            q_quads64(v[0], v[1], v[2], v[3], &o[0], &o[1], &o[2], &o[3]);
            for (int b = 0; b < nblocks; ++b) _mm512_storeu_si512(panel + block_off[b], o[b]);
        }
        if (++q == kq) { /* the next group's first channel */
            q = tap = 0;
            chp = a->x + (long)++grp * pa->cg * plane;
        }
    }
}
#endif

/* Whether the im2col of these images takes whole planes of at most 64 pixels (q_im2col_plane64, or
 * q_im2col_panels_task): VNNI with AVX512BW, stride 1, output as wide as the input. */
static int q_plane64_route(int sh, int sw, int wd, int oh, int ow) {
#ifdef MRT_HAVE_VNNI_BUILD
    return q_use_vnni && sh == 1 && sw == 1 && ow == wd && (long)oh * ow <= 64 && q_bw();
#else
    (void)sh, (void)sw, (void)wd, (void)oh, (void)ow;
    return 0;
#endif
}

/* im2col of nimg images (x + i * img_stride) into columns at cols + i * col_step (row stride ld).
 * Whole planes of at most 64 pixels take q_im2col_plane64 once for all the images (its tap masks
 * serve them all); the other routes run image by image. */
static void q_im2col_images(const uint8_t *x, int nimg, long img_stride, uint8_t *cols, long col_step, long ld, int c,
                            int h, int wd, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int oh,
                            int ow, int pad, int nthreads) {
    q_im2col_args a = {x, cols, ld, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, (uint8_t)pad, nimg, img_stride,
                       col_step};
    void (*route)(void *, long, long) = q_im2col_task;
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_plane64_route(sh, sw, wd, oh, ow)) {
        mrt_parallel_for((long)c * kh * kw, (long)nimg * oh * ow, nthreads, q_im2col_plane64, &a);
        return;
    }
    if (q_use_vnni && ((sw == 1 && ow <= 63) || (sw == 2 && ow <= 32)) && q_bw()) route = q_im2col_narrow;
#endif
    for (int i = 0; i < nimg; ++i) {
        a.x = x + i * img_stride;
        a.cols = cols + i * col_step;
        mrt_parallel_for((long)c * kh * kw, (long)oh * ow, nthreads, route, &a);
    }
}

static void q_im2col(const uint8_t *x, uint8_t *cols, long ld, int c, int h, int wd, int kh, int kw, int sh, int sw,
                     int dh, int dw, int pt, int pl, int oh, int ow, int pad, int nthreads) {
    q_im2col_images(x, 1, 0, cols, 0, ld, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, pad, nthreads);
}

void mrt_im2col_u8(const mrt_conv_geometry *g, const uint8_t *x, uint8_t *cols, int pad, int nthreads) {
    q_im2col(x, cols, (long)g->oh * g->ow, g->c, g->h, g->w, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw, g->pt, g->pl,
             g->oh, g->ow, pad, nthreads);
}

/* ---------------------------------------------------------------- a whole int8 convolution */

/* y (n, m, oh, ow) = act(scale[m] * conv(quant(x) - x_zero, W) + bias[m] + res): the input is
 * quantized into per-thread scratch, im2col'ed (unless 1x1 / stride 1 / no padding), and each
 * group's GEMM runs on the packed weights of all m rows (mrt_qgemm_pack_w of the
 * (m, c/group*kh*kw) matrix).  One call per layer instead of one per step and image. */
/* mrt_qconv2d: the same with x already uint8 (x_u8: no quantize pass; x_scale unused) and/or a
 * uint8 output yq = clamp(rint(y / y_scale[m]) + y_zero[m], 0, 255) of that float y (yq != NULL: y unused),
 * requantized per block in the GEMM epilogue: int8 layers chained without a float tensor between.
 *
 * The batch runs in chunks of nb images, as mrt_conv2d_f32 (D22): planes under
 * Q_CONV_BATCH_COLS columns put a chunk's images side by side in one u8 column matrix
 * (row stride nb*p; on VNNI, planes of at most 64 pixels at stride 1 go straight into the GEMM's
 * packed panels instead, q_im2col_panels_task, as do a single image's: q_im2col_panels1_task),
 * one GEMM per group writes scale * acc + bias (+ act, or the u8 output, without a residual) into
 * a scratch whose rows are scattered into y's (n, m, p) layout, then residual + activation
 * (+ requantization) per scattered row.  Integer sums are exact and the
 * float epilogue is elementwise with the same operation order, so the results are
 * bit-identical to one GEMM per image.  With at least as many chunks as threads, threads take
 * whole chunks (single-threaded inside); otherwise (batch 1) chunks run in turn, threaded inside. */
/* Max pooling of one conv output plane x (h, w) into y (oh, ow), no padding, floor rounding,
 * dilation 1 (QConv's fused MaxPool); NaN propagates as in MaxPool.  2x2 stride 2, the common
 * CNN downsampling, has its own loop over row pairs, written without branches (selects the
 * compiler turns into max/blend instructions: random data mispredicts a branchy max). */
static inline float q_max_nan(float m, float v) { return (v > m) | (v != v) ? v : m; }

static void q_maxpool_plane(const float *x, float *y, int wd, int kh, int kw, int sh, int sw, int oh, int ow) {
    if (kh == 2 && kw == 2 && sh == 2 && sw == 2 && wd <= 256) {
        /* 2x2 / stride 2 in two branch-free passes the compiler vectorizes (the QConv + MaxPool of small
         * images, batched: one call per image and channel, 11,520 of them per digits batch of 360): the
         * vertical maxima of each row pair, then the maxima of column pairs.  `v > m | v != v ? v : m`
         * turns NaN whenever a tap is NaN, as the scalar loop below. */
        float line[256];
        for (int oy = 0; oy < oh; ++oy) {
            const float *restrict top = x + (long)2 * oy * wd, *restrict bottom = top + wd;
            float *restrict t = line;
            for (int j = 0; j < 2 * ow; ++j) {
                const float v = bottom[j], m = top[j];
                t[j] = ((v > m) | (v != v)) ? v : m;
            }
            float *restrict yr = y + (long)oy * ow;
            for (int i = 0; i < ow; ++i) {
                const float m = line[2 * i], v = line[2 * i + 1];
                yr[i] = ((v > m) | (v != v)) ? v : m;
            }
        }
        return;
    }
    for (int oy = 0; oy < oh; ++oy) {
        const float *r0 = x + (long)oy * sh * wd;
        float *yr = y + (long)oy * ow;
        if (kh == 2 && kw == 2 && sw == 2) {
            const float *r1 = r0 + wd;
            for (int ox = 0; ox < ow; ++ox) {
                float a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];
                float m = a > b ? a : b;
                m = c > m ? c : m;
                m = d > m ? d : m;
                int nan = (a != a) | (b != b) | (c != c) | (d != d);
                yr[ox] = nan ? a + b + c + d : m; /* the sum is NaN when a tap is */
            }
            continue;
        }
        for (int ox = 0; ox < ow; ++ox) {
            const float *t = r0 + (long)ox * sw;
            float m = t[0];
            for (int ky = 0; ky < kh; ++ky)
                for (int kx = 0; kx < kw; ++kx) m = q_max_nan(m, t[(long)ky * wd + kx]);
            yr[ox] = m;
        }
    }
}

#ifdef MRT_HAVE_VNNI_BUILD
/* max(m, v) as q_max_nan: v when v > m or v is NaN, else m */
__attribute__((target("avx512f"))) static inline __m512 q_max_nan16(__m512 m, __m512 v) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), m, v);
}

/* One 16-lane tap of the 64-float plane z0..z3 (floats 0-15, 16-31, 32-47, 48-63): lane o takes
 * float idx[o] (in [0, 64); hi: the lanes with idx >= 32). */
__attribute__((target("avx512f"))) static inline __m512 q_plane_tap(__m512 z0, __m512 z1, __m512 z2, __m512 z3,
                                                                      __m512i idx, __mmask16 hi) {
    return _mm512_mask_blend_ps(hi, _mm512_permutex2var_ps(z0, idx, z1), _mm512_permutex2var_ps(z2, idx, z3));
}

/* 2x2 / stride 2 max pooling of nch x nimg planes of at most 64 floats (oh x ow, plane (r, i) at
 * x + r * x_row + i * x_step) into planes of at most 16 (poh x pow, at y + r * y_row + i * y_step):
 * each plane is four registers, and the four taps of the 16 outputs are picked from them by index
 * vectors made once per call, then folded in q_maxpool_plane's order (the two rows, then the two
 * columns; NaN wins), so the results are its own. */
__attribute__((target("avx512f"))) static void q_maxpool2x2_planes64(const float *x, long x_row, long x_step,
                                                                       float *y, long y_row, long y_step, int nch,
                                                                       int nimg, int oh, int ow, int poh, int pow) {
    int32_t tl[16];
    for (int o = 0; o < 16; ++o) tl[o] = o < poh * pow ? 2 * (o / pow) * ow + 2 * (o % pow) : 0;
    const __m512i top_left = _mm512_loadu_si512(tl), one = _mm512_set1_epi32(1), row = _mm512_set1_epi32(ow);
    const __m512i top_right = _mm512_add_epi32(top_left, one), bottom_left = _mm512_add_epi32(top_left, row);
    const __m512i bottom_right = _mm512_add_epi32(bottom_left, one), half = _mm512_set1_epi32(31);
    const __mmask16 hi_tl = _mm512_cmpgt_epi32_mask(top_left, half), hi_tr = _mm512_cmpgt_epi32_mask(top_right, half);
    const __mmask16 hi_bl = _mm512_cmpgt_epi32_mask(bottom_left, half);
    const __mmask16 hi_br = _mm512_cmpgt_epi32_mask(bottom_right, half);
    const int npix = oh * ow;
    const __mmask16 k0 = npix >= 16 ? 0xffff : (__mmask16)((1u << npix) - 1);
    const __mmask16 k1 = npix >= 32 ? 0xffff : npix <= 16 ? 0 : (__mmask16)((1u << (npix - 16)) - 1);
    const __mmask16 k2 = npix >= 48 ? 0xffff : npix <= 32 ? 0 : (__mmask16)((1u << (npix - 32)) - 1);
    const __mmask16 k3 = npix >= 64 ? 0xffff : npix <= 48 ? 0 : (__mmask16)((1u << (npix - 48)) - 1);
    const __mmask16 out = (__mmask16)((1u << (poh * pow)) - 1);
    for (int r = 0; r < nch; ++r)
        for (int i = 0; i < nimg; ++i) {
            const float *xp = x + r * x_row + i * x_step;
            /* (floats past the plane are not read: masked loads) */
            const __m512 z0 = _mm512_maskz_loadu_ps(k0, xp), z1 = _mm512_maskz_loadu_ps(k1, xp + 16);
            const __m512 z2 = _mm512_maskz_loadu_ps(k2, xp + 32), z3 = _mm512_maskz_loadu_ps(k3, xp + 48);
            const __m512 left = q_max_nan16(q_plane_tap(z0, z1, z2, z3, top_left, hi_tl),
                                            q_plane_tap(z0, z1, z2, z3, bottom_left, hi_bl));
            const __m512 right = q_max_nan16(q_plane_tap(z0, z1, z2, z3, top_right, hi_tr),
                                             q_plane_tap(z0, z1, z2, z3, bottom_right, hi_br));
            _mm512_mask_storeu_ps(y + r * y_row + i * y_step, out, q_max_nan16(left, right));
        }
}
#endif

/* q_maxpool_plane of nch x nimg planes (oh x ow, plane (r, i) at x + r * x_row + i * x_step, pooled
 * into y + r * y_row + i * y_step); 2x2 / stride 2 pooling of planes of at most 64 floats takes
 * q_maxpool2x2_planes64 on AVX-512. */
static void q_maxpool_planes(const float *x, long x_row, long x_step, float *y, long y_row, long y_step, int nch,
                             int nimg, int oh, int ow, int kh, int kw, int sh, int sw, int poh, int pow) {
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_use_vnni && kh == 2 && kw == 2 && sh == 2 && sw == 2 && oh * ow <= 64) {
        q_maxpool2x2_planes64(x, x_row, x_step, y, y_row, y_step, nch, nimg, oh, ow, poh, pow);
        return;
    }
#endif
    (void)oh;
    for (int r = 0; r < nch; ++r)
        for (int i = 0; i < nimg; ++i)
            q_maxpool_plane(x + r * x_row + i * x_step, y + r * y_row + i * y_step, ow, kh, kw, sh, sw, poh, pow);
}

/* Geometry of the implicit route of a conv (see q_conv_implicit). */
typedef struct {
    int hq, wq, cq4, kk; /* plane rows and columns (the extended grid's row), channel quads, taps */
    size_t planes_bytes, weights_bytes, table_bytes;
} q_implicit_geom;

typedef struct {
    const void *x;
    int x_u8, n, c, h, wd, x_zero, m, group, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, act;
    float x_scale, a0, a1, post_a, post_b;
    const float *y_scale; /* per output channel (uint8 output) */
    const int32_t *y_zero;
    const int32_t *sums;
    const int8_t *W;
    const float *scale, *bias, *res;
    float *y;
    uint8_t *yq;
    int nb, direct;
    int wflags;   /* Q_W_* of the packed weights (q_packed_flags): which AVX2 tile is exact */
    int implicit; /* nb == 1 images without im2col (q_conv_implicit) */
    int panels;   /* the im2col goes straight into packed panels (q_im2col_panels_task): planes of <= 64 pixels */
    const int16_t *wino; /* the Winograd weights (mrt_qconv_winograd_pack_w) or NULL */
    int winograd;        /* nb == 1 images as Winograd F(2x2, 3x3) (q_conv_winograd, qwinograd_avx2.h) */
    q_implicit_geom geo;
    int pkh, pkw, psh, psw, poh, pow; /* fused MaxPool (pkh > 0): y is (n, m, poh, pow), float */
    size_t scratch_bytes;
    int failed;
} q_conv_args;

static inline size_t q_align64(size_t b) { return (b + 63) / 64 * 64; }

/* ---------------------------------------------------------------- implicit int8 convolution */

/* One image whose output plane is wide (q_qconv2d's nb == 1 route), group 1, not on SDOT, runs
 * without an im2col matrix and without packing activations (the float conv's D45,
 * in the VNNI layout):
 *   - The quantized image is written once, padded with x_zero and split by stride phase, in
 *     channel quads: planes[cq][phase][hq][wq][4] holds channels 4cq .. 4cq+3 of a plane
 *     position side by side (channels past c read x_zero against zero weights).
 *   - The GEMM runs over the "extended" grid of oh x wq columns (column n = oy * wq + ox; the
 *     columns ox >= ow are computed and dropped) with K ordered (tap, channel quad, 4): for tap
 *     (ky, kx) and quad cq, the 32 columns n0 .. n0+31 in the [32][4] panel layout of
 *     vpdpbusd are the 128 contiguous bytes at planes + tap_off[tap] + cq * cq_stride + 4 n0,
 *     read in place (the nine taps of a 3x3 window are shifted views of the same plane rows).
 *   - The weights are reordered to that K order per call (q_conv_tap_weights; a 1x1 kernel's
 *     packed rows already are).
 *   - Tiles of 8 rows x 32 columns go through q_store_row (scale, zero point, bias, residual,
 *     Relu / HardSwish) once per output row they cover, kept columns only, straight into y (a
 *     uint8 output: into a per-thread float stage; with the post affine when no other
 *     activation comes between); per block of output rows, any other activation, then the post
 *     affine run over the contiguous outputs and a uint8 output is requantized per output
 *     channel as quantize_u8 does.  The operations per element are q_gemm_run_q's, in the same order, so
 *     the results are bit-identical to the im2col route (integer sums are exact in any order).
 * Reads past a plane's last used byte (the dropped columns of the last panels) stay inside the
 * planes buffer: it has Q_IMPLICIT_SLACK bytes after the last plane. */
#define Q_CONV_MR 8
#define Q_IMPLICIT_COLS 512 /* about this many extended-grid columns per block of output rows */
#define Q_IMPLICIT_MC 128   /* weight rows per block (bounds the uint8 output's stage; split further for threads) */
#define Q_IMPLICIT_SLACK (4 * Q_NR + 64)

typedef struct {
    const uint8_t *planes;
    const long *tap_off; /* byte offset of each tap's (phase, row, column) shift */
    int ntaps, cq4;      /* K = ntaps * cq4 quads */
    long cq_stride;      /* bytes from one channel quad's planes to the next */
    const int8_t *W;     /* M rows of kt = ntaps * cq4 * 4 bytes, K order (tap, quad, 4) */
    long kt;
    int wflags; /* Q_W_* of W in this order (Q_W_PAIRS16: channels 2i, 2i + 1 of a tap have |w0| + |w1| <=
                 * 128): which AVX2 tile is exact */
} q_conv_b;

static void q_ukr_conv_base(const q_conv_b *b, const int8_t *w, int mr, long col, int32_t acc[Q_CONV_MR][Q_NR]) {
    memset(acc, 0, sizeof(int32_t) * Q_CONV_MR * Q_NR);
    for (int i = 0; i < mr; ++i) {
        const int8_t *a = w + i * b->kt;
        int32_t *o = acc[i];
        for (int t = 0; t < b->ntaps; ++t) {
            const uint8_t *p = b->planes + b->tap_off[t] + 4 * col;
            for (int cq = 0; cq < b->cq4; ++cq, p += b->cq_stride, a += 4) {
                const int32_t w0 = a[0], w1 = a[1], w2 = a[2], w3 = a[3];
                for (int j = 0; j < Q_NR; ++j)
                    o[j] += p[4 * j] * w0 + p[4 * j + 1] * w1 + p[4 * j + 2] * w2 + p[4 * j + 3] * w3;
            }
        }
    }
}

#ifdef MRT_HAVE_AMX_BUILD
/* q_ukr_amx for the implicit route: acc (rows = 32 or 16 rows of Q_NR int32) = weight rows w .. w + rows
 * - 1 (row stride kt, K order (tap, quad, 4)) times the 32 extended-grid columns from col, s channel quads
 * a step (s divides cq4; tiles configured by q_amx_begin(s)).  Per tap, the B tile's rows are s consecutive
 * channel quads of the same shifted plane row (cq_stride apart), 64 bytes each: the bytes
 * q_ukr_conv_vnni reads, in the same places. */
__attribute__((target("amx-tile,amx-int8"))) static void q_ukr_conv_amx(const q_conv_b *b, const int8_t *w, int s,
                                                                         long col, int32_t *acc, int rows) {
    const long kt = b->kt, stride = b->cq_stride;
    long q4 = 0; /* byte offset of the step's first quad in a weight row */
    q_amx_zero(rows);
    for (int t = 0; t < b->ntaps; ++t) {
        const uint8_t *p = b->planes + b->tap_off[t] + 4 * col;
        for (int cq = 0; cq < b->cq4; cq += s, p += s * stride, q4 += 4 * s)
            q_amx_step_tiles(w + q4, w + 16 * kt + q4, kt, p, stride, rows);
    }
    q_amx_store(acc, rows);
}
#endif

#ifdef MRT_HAVE_VNNI_BUILD
/* 8 x 32 tile, 16 zmm accumulators; per quad two 64-byte plane loads and eight broadcast
 * weight quads.  Rows past mr alias row 0 (computed, not stored). */
__attribute__((target("avx512f,avx512vnni"))) static void q_ukr_conv_vnni(const q_conv_b *b, const int8_t *w,
                                                                             int mr, long col,
                                                                             int32_t acc[Q_CONV_MR][Q_NR]) {
    const long kt = b->kt;
    const int8_t *a0 = w, *a1 = mr > 1 ? w + kt : w, *a2 = mr > 2 ? w + 2 * kt : w, *a3 = mr > 3 ? w + 3 * kt : w;
    const int8_t *a4 = mr > 4 ? w + 4 * kt : w, *a5 = mr > 5 ? w + 5 * kt : w, *a6 = mr > 6 ? w + 6 * kt : w;
    const int8_t *a7 = mr > 7 ? w + 7 * kt : w;
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    long q4 = 0; /* byte offset of the current quad in a weight row */
    for (int t = 0; t < b->ntaps; ++t) {
        const uint8_t *p = b->planes + b->tap_off[t] + 4 * col;
        for (int cq = 0; cq < b->cq4; ++cq, p += b->cq_stride, q4 += 4) {
            const __m512i b0 = _mm512_loadu_si512(p), b1 = _mm512_loadu_si512(p + 64);
            int32_t s;
            __m512i a;
            Q_VNNI_ROW(a0 + q4, c00, c01)
            Q_VNNI_ROW(a1 + q4, c10, c11)
            Q_VNNI_ROW(a2 + q4, c20, c21)
            Q_VNNI_ROW(a3 + q4, c30, c31)
            Q_VNNI_ROW(a4 + q4, c40, c41)
            Q_VNNI_ROW(a5 + q4, c50, c51)
            Q_VNNI_ROW(a6 + q4, c60, c61)
            Q_VNNI_ROW(a7 + q4, c70, c71)
        }
    }
    _mm512_storeu_si512(acc[0], c00); _mm512_storeu_si512(acc[0] + 16, c01);
    _mm512_storeu_si512(acc[1], c10); _mm512_storeu_si512(acc[1] + 16, c11);
    _mm512_storeu_si512(acc[2], c20); _mm512_storeu_si512(acc[2] + 16, c21);
    _mm512_storeu_si512(acc[3], c30); _mm512_storeu_si512(acc[3] + 16, c31);
    _mm512_storeu_si512(acc[4], c40); _mm512_storeu_si512(acc[4] + 16, c41);
    _mm512_storeu_si512(acc[5], c50); _mm512_storeu_si512(acc[5] + 16, c51);
    _mm512_storeu_si512(acc[6], c60); _mm512_storeu_si512(acc[6] + 16, c61);
    _mm512_storeu_si512(acc[7], c70); _mm512_storeu_si512(acc[7] + 16, c71);
}
#endif

/* wt[m][(tap * cq4 + cq) * 4 + t] = weight of channel 4 cq + t at tap (0 past cg), from the
 * packed rows (stride k4) in (channel, ky, kx) order, read in that order (per call: 6 us for a
 * 96 -> 24 3x3 layer; 13 us written in wt's order, reading with stride kk). */
static void q_conv_tap_weights(const int8_t *W, long k4, int m, int cg, int kk, int cq4, int8_t *wt) {
    const long kt = (long)kk * cq4 * 4, tap_step = 4L * cq4;
    for (int r = 0; r < m; ++r) {
        const int8_t *src = W + r * k4;
        int8_t *dst = wt + r * kt;
        if (cg < 4 * cq4) memset(dst, 0, kt); /* the channels of the last quad past cg */
        for (int ch = 0; ch < cg; ++ch, src += kk)
            for (int tap = 0; tap < kk; ++tap) dst[tap * tap_step + ch] = src[tap];
    }
}

typedef struct {
    const uint8_t *x; /* the quantized image (c, h, wd) */
    uint8_t *planes;
    int c, h, wd, sh, sw, pt, pl, hq, wq, pad;
    const char *phase_used; /* [sh * sw] */
    int failed;
} q_planes_args;

/* Channel quads [begin, end) of the planes (see above). */
static void q_planes_task(void *ctx, long begin, long end) {
    q_planes_args *a = (q_planes_args *)ctx;
    const int wq = a->wq, phases = a->sh * a->sw;
    uint8_t *rows = (uint8_t *)mrt_pack_buffer(4 * (size_t)wq); /* one plane row of each of 4 channels */
    if (!rows) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (long cq = begin; cq < end; ++cq)
        for (int ph = 0; ph < phases; ++ph) {
            if (!a->phase_used[ph]) continue;
            const int py = ph / a->sw, px = ph % a->sw;
            int lo, hi; /* plane columns j with 0 <= j * sw + px - pl < wd */
            valid_cols_base(px - a->pl, a->sw, a->wd, wq, &lo, &hi);
            uint8_t *dst = a->planes + ((cq * phases + ph) * (long)a->hq) * wq * 4;
            for (int r = 0; r < a->hq; ++r, dst += 4L * wq) {
                const int iy = r * a->sh + py - a->pt;
                for (int t = 0; t < 4; ++t) {
                    uint8_t *row = rows + (long)t * wq;
                    const int ch = (int)cq * 4 + t;
                    if (ch >= a->c || iy < 0 || iy >= a->h) {
                        memset(row, a->pad, wq);
                        continue;
                    }
                    const uint8_t *src = a->x + ((long)ch * a->h + iy) * a->wd + px - a->pl; /* src[j sw]: column j */
                    memset(row, a->pad, lo);
                    if (a->sw == 1)
                        memcpy(row + lo, src + lo, hi - lo);
                    else if (a->sw == 2)
                        q_gather_even(row + lo, src + 2L * lo, hi - lo);
                    else
                        for (int j = lo; j < hi; ++j) row[j] = src[(long)j * a->sw];
                    memset(row + hi, a->pad, wq - hi);
                }
                q_interleave4(dst, rows, rows + wq, rows + 2L * wq, rows + 3L * wq, wq);
            }
        }
}

typedef struct {
    q_conv_b b;
    /* q_store_row's and q_post_row's parameters: sums, scale, bias, x_zero, res (row stride
     * ldr = oh * ow), post_a, post_b, store_act, store_post */
    q_args g;
    float *y;
    uint8_t *yq;
    const float *y_scale; /* per output channel (uint8 output) */
    const int32_t *y_zero;
    int m, oh, ow, wq, rows_per_block, mparts, mc, act;
    float a0, a1;
    int amx; /* > 0: groups of 32 (then 16) weight rows take q_ukr_conv_amx, amx channel quads a step
              * (q_amx_step) */
    int failed;
} q_implicit_args;

/* Items are (block of output rows, block of mc weight rows).  Each tile row goes through
 * q_store_row once per output row it covers (its kept columns only), straight into y, or for a
 * uint8 output into the per-thread stage (the block's rows, compact); the activation, the post
 * affine and the requantization then run over the block's contiguous output rows. */
static void q_implicit_task(void *ctx, long begin, long end) {
    q_implicit_args *a = (q_implicit_args *)ctx;
    const long p = (long)a->oh * a->ow, wq = a->wq, ow = a->ow;
    const long len_max = (long)a->rows_per_block * ow;
    const int staged = a->yq && !a->g.store_q; /* (else the store requantizes into yq itself) */
    float *stage = NULL;
    if (staged && !(stage = (float *)mrt_pack_buffer(sizeof(float) * (size_t)a->mc * len_max))) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
#ifdef MRT_HAVE_AMX_BUILD
    if (a->amx) q_amx_begin(a->amx);
#endif
    for (long item = begin; item < end; ++item) {
        const int oy0 = (int)(item / a->mparts) * a->rows_per_block;
        const int rows = a->oh - oy0 < a->rows_per_block ? a->oh - oy0 : a->rows_per_block;
        const int m0 = (int)(item % a->mparts) * a->mc, m1 = a->m - m0 < a->mc ? a->m : m0 + a->mc;
        const long col0 = (long)oy0 * wq, ncols = (rows - 1) * wq + ow; /* the last row's dropped columns: not computed */
        /* output m's float rows of this block start at out + m * out_ld + oy0 * ow (none when the
         * store requantizes: pointers into out are then never formed) */
        float *out = staged ? stage - (long)m0 * len_max - (long)oy0 * ow : a->y;
        const long out_ld = staged ? len_max : p;
        for (long j0 = 0; j0 < ncols; j0 += Q_NR) {
            /* the tile's kept segments: tile column seg_j[s], seg_len[s] values, at output index seg_o[s] */
            int seg_j[Q_NR + 1], seg_len[Q_NR + 1], nseg = 0;
            long seg_o[Q_NR + 1];
            long oy = (col0 + j0) / wq, ox = (col0 + j0) % wq;
            for (long j = 0; j < Q_NR && j0 + j < ncols; oy++, j += wq - ox, ox = 0) {
                if (ox >= ow) continue;
                long n = ow - ox < Q_NR - j ? ow - ox : Q_NR - j;
                seg_j[nseg] = (int)j, seg_len[nseg] = (int)n, seg_o[nseg++] = oy * ow + ox;
            }
            int i0 = m0;
#ifdef MRT_HAVE_AMX_BUILD
            if (a->amx)
                for (int rows; i0 + 16 <= m1; i0 += rows) { /* groups of 32 rows, then one of 16 */
                    int32_t acc[32][Q_NR] __attribute__((aligned(64)));
                    rows = m1 - i0 >= 32 ? 32 : 16;
                    q_ukr_conv_amx(&a->b, a->b.W + (long)i0 * a->b.kt, a->amx, col0 + j0, &acc[0][0], rows);
                    for (int sg = 0; sg < nseg; ++sg)
                        q_store_tile(&a->g, &acc[0][0], rows, seg_j[sg], seg_len[sg], i0, seg_o[sg],
                                     out ? out + (long)i0 * out_ld + seg_o[sg] : NULL, out_ld,
                                     a->g.store_q ? a->yq + (long)i0 * p + seg_o[sg] : NULL, p);
                }
#endif
            for (; i0 < m1; i0 += Q_CONV_MR) {
                const int mr = m1 - i0 < Q_CONV_MR ? m1 - i0 : Q_CONV_MR;
                int32_t acc[Q_CONV_MR][Q_NR] __attribute__((aligned(64)));
                const int8_t *w = a->b.W + (long)i0 * a->b.kt;
#ifdef MRT_HAVE_VNNI_BUILD
                if (q_use_vnni)
                    q_ukr_conv_vnni(&a->b, w, mr, col0 + j0, acc);
                else if (q_use_avx2 && (a->b.wflags & (Q_W_PAIRS16 | Q_W_SYMMETRIC)))
                    q_avx2_bytes_tile_any(w, a->b.kt, a->g.sums + i0, a->b.planes + 4 * (col0 + j0), a->b.tap_off,
                                          a->b.ntaps, a->b.cq4, a->b.cq_stride, acc, mr,
                                          !(a->b.wflags & Q_W_PAIRS16));
                else if (q_use_avx2)
                    for (int r0 = 0; r0 < mr; r0 += 6)
                        q_avx2_tile_any(w + r0 * a->b.kt, a->b.kt, a->b.planes + 4 * (col0 + j0), a->b.tap_off,
                                        a->b.ntaps, a->b.cq4, a->b.cq_stride, acc + r0, mr - r0 < 6 ? mr - r0 : 6);
                else
#endif
                    q_ukr_conv_base(&a->b, w, mr, col0 + j0, acc);
                for (int sg = 0; sg < nseg; ++sg)
                    q_store_tile(&a->g, &acc[0][0], mr, seg_j[sg], seg_len[sg], i0, seg_o[sg],
                                 out ? out + (long)i0 * out_ld + seg_o[sg] : NULL, out_ld,
                                 a->g.store_q ? a->yq + (long)i0 * p + seg_o[sg] : NULL, p);
            }
        }
        if (a->g.store_q) continue; /* the store did the whole epilogue */
        const long len = (long)rows * ow;
        for (int m = m0; m < m1; ++m) {
            float *t = out + (long)m * out_ld + (long)oy0 * ow;
            if (a->act && !a->g.store_act) q_act_row(t, len, a->act, a->a0, a->a1);
            q_post_row(&a->g, t, len); /* after the activation, before the requantization */
            if (a->yq) {
                const int yz = a->y_zero[m];
                q_quant_args qa = {t, a->yq + (long)m * p + (long)oy0 * ow, a->y_scale[m], (float)(0 - yz),
                                   (float)(255 - yz), (float)yz};
                q_quant_task(&qa, 0, len);
            }
        }
    }
#ifdef MRT_HAVE_AMX_BUILD
    if (a->amx) q_amx_end();
#endif
}

/* Geometry of the implicit route for a conv, or 0 when it does not apply (see above). */
static int q_implicit_plan(int c, int m, int group, int kh, int kw, int sh, int sw, int dh, int dw, int oh, int ow,
                           q_implicit_geom *geo) {
    if (group != 1 || q_use_dotprod) return 0; /* SDOT packs x - 128: keeps the im2col route */
    /* 1x1 kernels keep packed panels: read in place, their K rows are whole planes apart (the
     * quads of one panel on as many pages), measured 1.2-1.9x slower on PP-OCR det */
    if (kh * kw == 1) return 0;
    /* fewer than 4 channels (an image's stem) on AVX2 without VNNI: the planes' channel quads would be mostly
     * padding (3 of 4 bytes used), the im2col matrix packs K densely: ResNet-18's 7x7 stride-2 stem 3 -> 64
     * 2.7 -> 2.0 ms, 3 -> 64 5x5 @112 1.5-2.4 -> 1.2, 3 -> 16 3x3 @320 2.3-2.7 -> 2.0, 1 -> 32 3x3 @64 0.16 ->
     * 0.10 (Zen 3, 1 thread, D180) */
    if (c < 4 && q_use_avx2 && !q_use_vnni) return 0;
    const int wq = ow + (kw - 1) * dw / sw;
    if ((long)oh * ow < Q_CONV_BATCH_COLS || 4L * (wq - ow) > wq) return 0; /* small planes; > 1/4 dropped */
    geo->hq = oh + (kh - 1) * dh / sh;
    geo->wq = wq;
    geo->cq4 = (c + 3) / 4;
    geo->kk = kh * kw;
    geo->planes_bytes = q_align64((size_t)geo->cq4 * sh * sw * geo->hq * wq * 4 + Q_IMPLICIT_SLACK);
    geo->weights_bytes = geo->kk == 1 ? 0 : q_align64((size_t)m * geo->kk * geo->cq4 * 4);
    geo->table_bytes = q_align64(sizeof(long) * (size_t)geo->kk + (size_t)sh * sw);
    return 1;
}

/* One image: img (c, h, wd) uint8 -> y or yq (m, oh, ow); res (m, oh, ow) or NULL.  scratch holds
 * the planes, the reordered weights and the tap table (sizes from q_implicit_plan). */
static int q_conv_implicit(const q_conv_args *a, const uint8_t *img, uint8_t *scratch, const float *res, float *y,
                           uint8_t *yq, int nt) {
    const q_implicit_geom *geo = &a->geo;
    const int phases = a->sh * a->sw, kk = geo->kk, cq4 = geo->cq4;
    const long phase_bytes = (long)geo->hq * geo->wq * 4;
    uint8_t *planes = scratch;
    int8_t *wt = (int8_t *)(scratch + geo->planes_bytes);
    long *tap_off = (long *)(scratch + geo->planes_bytes + geo->weights_bytes);
    char *phase_used = (char *)(tap_off + kk);
    memset(phase_used, 0, phases);
    for (int tap = 0; tap < kk; ++tap) { /* tap (ky, kx) reads padded row oy sh + ky dh: phase, then shift */
        const int ry = tap / a->kw * a->dh, rx = tap % a->kw * a->dw;
        const int ph = ry % a->sh * a->sw + rx % a->sw;
        phase_used[ph] = 1;
        tap_off[tap] = ph * phase_bytes + ((long)(ry / a->sh) * geo->wq + rx / a->sw) * 4;
    }
    memset(planes + (size_t)cq4 * phases * phase_bytes, a->x_zero, Q_IMPLICIT_SLACK);
    q_planes_args pa = {img, planes, a->c, a->h, a->wd, a->sh, a->sw, a->pt, a->pl, geo->hq, geo->wq, a->x_zero,
                        phase_used, 0};
    mrt_parallel_for(cq4, phase_bytes * phases, nt, q_planes_task, &pa);
    const long k4 = q_k4(a->c * kk);
    if (kk > 1) q_conv_tap_weights(a->W, k4, a->m, a->c, kk, cq4, wt);
    q_implicit_args ia;
    memset(&ia, 0, sizeof ia);
    ia.b.planes = planes;
    ia.b.tap_off = tap_off;
    ia.b.ntaps = kk;
    ia.b.cq4 = cq4;
    ia.b.cq_stride = phases * phase_bytes;
    ia.b.W = kk > 1 ? wt : a->W; /* a 1x1 kernel's packed rows (k4 = 4 cq4) are already in K order */
    ia.b.kt = kk > 1 ? (long)kk * cq4 * 4 : k4;
    /* (the tap order pairs channels 2i, 2i + 1 of a tap: its own check, for weights whose packed rows are
     * pair-limited, as the builder limits both orders; a 1x1 kernel's order is the packed one) */
    if (kk > 1 && (a->wflags & Q_W_PAIRS16) && !(q_use_avx2 && !q_use_vnni && q_pairs16(wt, (long)a->m * ia.b.kt)))
        ia.b.wflags = a->wflags & ~Q_W_PAIRS16;
    else
        ia.b.wflags = a->wflags;
    ia.g.sums = a->sums; ia.g.scale = a->scale; ia.g.bias = a->bias; ia.g.x_zero = a->x_zero;
    ia.g.res = res; ia.g.ldr = (long)a->oh * a->ow;
    ia.g.post_a = a->post_a; ia.g.post_b = a->post_b;
    ia.g.a0 = a->a0; ia.g.a1 = a->a1; /* (a Clip in the store) */
    ia.g.yscale = a->y_scale; ia.g.yzp = a->y_zero; /* (the store's requantization) */
    q_set_store_epilogue(&ia.g, a->act, yq != NULL);
    ia.y = y; ia.yq = yq;
    float *fold = NULL; /* (the store's folded requantization: AVX-512 VNNI stores without a residual) */
    if (ia.g.store_q && q_use_vnni && !res) {
        fold = (float *)malloc(sizeof(float) * 5 * (size_t)a->m);
        if (!fold) return -1;
        if (q_fold_rows(a->m, a->scale, a->bias, a->y_scale, a->y_zero, 1, ia.g.store_act, a->a0, a->a1,
                        ia.g.store_post ? a->post_a : 1.0f, ia.g.store_post ? a->post_b : 0.0f, fold))
            ia.g.fold = fold;
    }
    ia.m = a->m; ia.oh = a->oh; ia.ow = a->ow; ia.wq = geo->wq;
    ia.act = a->act; ia.a0 = a->a0; ia.a1 = a->a1; ia.y_scale = a->y_scale; ia.y_zero = a->y_zero;
    int rpb = Q_IMPLICIT_COLS / geo->wq;
    if (rpb < 1) rpb = 1;
    if (rpb > a->oh) rpb = a->oh;
    const long row_blocks = (a->oh + rpb - 1) / rpb;
    long mparts = (a->m + Q_IMPLICIT_MC - 1) / Q_IMPLICIT_MC;
    if (nt > 1 && row_blocks * mparts < 2L * nt) { /* few row blocks: threads split the weight rows too */
        long want = (2L * nt + row_blocks - 1) / row_blocks, most = (a->m + Q_CONV_MR - 1) / Q_CONV_MR;
        mparts = want < most ? want : most;
    }
    ia.amx = q_amx_step(a->m, 4 * cq4);
    long mc = (a->m + mparts - 1) / mparts;
    const int group = q_item_rows(ia.amx, a->m, Q_CONV_MR);
    mc = (mc + group - 1) / group * group;
    ia.rows_per_block = rpb;
    ia.mc = (int)mc;
    ia.mparts = (int)((a->m + mc - 1) / mc);
    if (pa.failed) {
        free(fold);
        return -1;
    }
    mrt_parallel_for(row_blocks * ia.mparts, mc * rpb * geo->wq * kk * cq4 * 4 / 32, nt, q_implicit_task, &ia);
    free(fold);
    return ia.failed ? -1 : 0;
}


/* Scratch bytes of a chunk of images side by side for its GEMM input: the column matrix (c kh kw
 * rows of nb oh ow bytes), or each group's panels (whole panels of up to Q_NR columns). */
static size_t q_chunk_cols_bytes(const q_conv_args *a) {
    const long cols = (long)a->nb * a->oh * a->ow, kk = (long)a->kh * a->kw;
    if (a->panels)
        return q_align64((size_t)a->group * q_k4((int)(a->c / a->group * kk)) * ((cols + Q_NR - 1) / Q_NR * Q_NR));
    return q_align64((size_t)a->c * kk * cols);
}

#ifdef MRT_HAVE_VNNI_BUILD /* (qwinograd_avx2.h) */
static int q_winograd_fits(int c, int m, int group, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl);
static int q_conv_winograd(const q_conv_args *c, const uint8_t *img, const float *res, float *y, uint8_t *yq, int nt);
#endif

static void q_conv_chunk(q_conv_args *a, long chunk, uint8_t *scratch, int nt) {
    const long plane = (long)a->h * a->wd, p = (long)a->oh * a->ow, chw = (long)a->c * plane, mp = (long)a->m * p;
    const int c = a->c, cg = c / a->group, mg = a->m / a->group, kk = a->kh * a->kw, kg = cg * kk;
    const long k4 = q_k4(kg);
    const long i0 = chunk * a->nb;
    const int nb = a->n - i0 < a->nb ? (int)(a->n - i0) : a->nb;
    /* the quantized input: one image, or with images side by side (nb > 1 or pooled) the whole chunk */
    const int side_by_side = !(a->nb == 1 && !a->pkh);
    const size_t xq_bytes = q_align64(a->x_u8 ? 0 : (size_t)chw * (side_by_side ? a->nb : 1));
    uint8_t *xq = scratch, *cols = scratch + xq_bytes;
    if (a->nb == 1 && !a->pkh) { /* one image per GEMM, straight into y with the whole epilogue fused */
        /* direct (1x1) float input on VNNI with 32-column panels, an image that stays in L2: quantized
         * as it is packed (larger ones stream better through the separate quantize pass: 48 x 80 x 80
         * was 5% slower packed from floats, 192 x 20 x 20 and 384 x 10 x 10 5-15% faster) */
        const float *xf = !a->x_u8 && a->direct && q_use_vnni && p > 16 && chw * sizeof(float) <= Q_PACK_QUANT_BYTES
                              ? (const float *)a->x + i0 * chw
                              : NULL;
        const uint8_t *img = NULL;
        if (a->x_u8) {
            img = (const uint8_t *)a->x + i0 * chw;
        } else if (!xf) {
            mrt_quantize_u8_f32((const float *)a->x + i0 * chw, xq, chw, a->x_scale, a->x_zero, nt);
            img = xq;
        }
        float *yi = a->yq ? NULL : a->y + i0 * mp;
        uint8_t *yqi = a->yq ? a->yq + i0 * mp : NULL;
        const float *ri = a->res ? a->res + i0 * mp : NULL;
#ifdef MRT_HAVE_VNNI_BUILD
        if (a->winograd) {
            if (q_conv_winograd(a, img, ri, yi, yqi, nt)) __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
            return;
        }
#endif
        if (a->implicit) {
            if (q_conv_implicit(a, img, scratch + xq_bytes, ri, yi, yqi, nt)) __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
            return;
        }
        const uint8_t *src = img;
        long group_bytes = (long)kg * p; /* each group's GEMM input: kg rows of p bytes, or its panels */
        if (a->panels) { /* small plane: im2col'ed straight into the packed panels (nothing left to pack) */
#ifdef MRT_HAVE_VNNI_BUILD
            const int nr = q_panel_width((int)p);
            group_bytes = k4 * ((p + nr - 1) / nr * nr);
            q_panels_args pa = {{img, NULL, 0, a->h, a->wd, a->kh, a->kw, a->sh, a->sw, a->dh, a->dw, a->pt, a->pl,
                                 a->oh, a->ow, (uint8_t)a->x_zero, 1, chw, 0},
                                cols, group_bytes, k4, cg, nr};
            mrt_parallel_for((long)a->group * (k4 / 4), p * 4, nt,
                             kk <= Q_PANEL1_TAPS ? q_im2col_panels1_task : q_im2col_panels_task, &pa);
#endif
            src = cols;
        } else if (!a->direct) {
            q_im2col(img, cols, p, c, a->h, a->wd, a->kh, a->kw, a->sh, a->sw, a->dh, a->dw, a->pt, a->pl, a->oh,
                     a->ow, a->x_zero, nt);
            src = cols;
        }
        for (int g = 0; g < a->group; ++g) {
            long r0 = (long)g * mg;
            q_gemm_run_q(mg, (int)p, kg, a->sums + r0, a->W + r0 * k4, src ? src + g * group_bytes : NULL, p,
                         a->panels ? Q_X_PANELS : Q_X_ROWS, a->x_zero, a->scale + r0, a->bias ? a->bias + r0 : NULL,
                         yi ? yi + r0 * p : NULL, p, ri ? ri + r0 * p : NULL, p, a->act, a->a0, a->a1, a->post_a, a->post_b,
                         yqi ? yqi + r0 * p : NULL, p, yqi ? a->y_scale + r0 : NULL, yqi ? a->y_zero + r0 : NULL,
                         xf ? xf + (long)g * kg * p : NULL, a->x_scale, 0, 0, a->wflags, nt);
        }
        return;
    }
    /* nb images side by side: columns [j*p, (j+1)*p) of every row are image i0 + j */
    const long ldb = (long)nb * p;
    float *tmp = (float *)(cols + q_chunk_cols_bytes(a));
    uint8_t *tmpq = (uint8_t *)tmp;
    const int q_out = a->yq && !a->res; /* the GEMM requantizes into tmpq: bytes are scattered */
    /* the chunk's images quantized in one pass (they are consecutive in x) */
    const uint8_t *imgs = a->x_u8 ? (const uint8_t *)a->x + i0 * chw : xq;
    if (!a->x_u8) mrt_quantize_u8_f32((const float *)a->x + i0 * chw, xq, nb * chw, a->x_scale, a->x_zero, nt);
    /* each group's GEMM input: kg rows of ldb bytes, or (panels) its packed panels */
    const int nr = q_panel_width((int)ldb);
    const long group_bytes = a->panels ? k4 * ((ldb + nr - 1) / nr * nr) : (long)kg * ldb;
    if (a->direct) {
        for (int j = 0; j < nb; ++j)
            for (int ch = 0; ch < c; ++ch) memcpy(cols + ch * ldb + j * p, imgs + j * chw + ch * p, p);
    } else if (a->panels) {
#ifdef MRT_HAVE_VNNI_BUILD
        q_panels_args pa = {{imgs, NULL, 0, a->h, a->wd, a->kh, a->kw, a->sh, a->sw, a->dh, a->dw, a->pt, a->pl,
                             a->oh, a->ow, (uint8_t)a->x_zero, nb, chw, 0},
                            cols, group_bytes, k4, cg, nr};
        mrt_parallel_for((long)a->group * (k4 / 4), (long)nb * p * 4, nt,
                         nb == 1 && kk <= Q_PANEL1_TAPS ? q_im2col_panels1_task : q_im2col_panels_task, &pa);
#endif
    } else {
        q_im2col_images(imgs, nb, chw, cols, p, ldb, c, a->h, a->wd, a->kh, a->kw, a->sh, a->sw, a->dh, a->dw, a->pt,
                        a->pl, a->oh, a->ow, a->x_zero, nt);
    }
    /* The GEMM stores straight into y's (n, m, p) planes (image-major C, no scatter) when nothing runs
     * after its store: float output, no residual or pooling, the activation and the post affine
     * applied in the store (q_set_store_epilogue's rules), planes of at least 16 pixels (runs of
     * whole vectors; smaller planes keep the scratch and the copies). */
    const int post = a->post_a != 1.0f || a->post_b != 0.0f;
    const int store_to_y = p >= 16 && !a->pkh && !a->yq && !a->res && (a->act == 0 || q_act_in_store(a->act)) &&
                           (!post || q_use_vnni || q_use_avx2);
    for (int g = 0; g < a->group; ++g) {
        const long r0 = (long)g * mg;
        float *c = store_to_y ? a->y + i0 * mp + r0 * p : q_out ? NULL : tmp;
        q_gemm_run_q(mg, (int)ldb, kg, a->sums + r0, a->W + r0 * k4, cols + g * group_bytes, ldb,
                     a->panels ? Q_X_PANELS : Q_X_ROWS, a->x_zero, a->scale + r0, a->bias ? a->bias + r0 : NULL, c,
                     store_to_y ? p : ldb, NULL, 0, a->res ? 0 : a->act, a->a0, a->a1, a->res ? 1.0f : a->post_a,
                     a->res ? 0.0f : a->post_b, q_out ? tmpq : NULL, ldb, q_out ? a->y_scale + r0 : NULL,
                     q_out ? a->y_zero + r0 : NULL, NULL, 0.0f, store_to_y ? p : 0, mp, a->wflags, nt);
        if (store_to_y) continue;
        if (a->pkh) { /* y's planes are pooled: (n, m, poh, pow) */
            const long pp = (long)a->poh * a->pow;
            if (a->res) /* as q_store_row: (scale * acc + bias) + res, then the activation */
                for (int j = 0; j < nb; ++j)
                    for (int r = 0; r < mg; ++r) {
                        float *t = tmp + r * ldb + j * p;
                        const float *rr = a->res + (i0 + j) * mp + (r0 + r) * p;
                        for (long k = 0; k < p; ++k) t[k] = t[k] + rr[k];
                        if (a->act) q_act_row(t, p, a->act, a->a0, a->a1);
                    }
            /* plane (r, j): channel r0 + r of image i0 + j */
            q_maxpool_planes(tmp, ldb, p, a->y + (i0 * a->m + r0) * pp, pp, a->m * pp, mg, nb, a->oh, a->ow, a->pkh,
                             a->pkw, a->psh, a->psw, a->poh, a->pow);
            continue;
        }
        for (int j = 0; j < nb; ++j) {
            const long yo = (i0 + j) * mp + r0 * p;
            for (int r = 0; r < mg; ++r) {
                if (q_out) {
                    memcpy(a->yq + yo + r * p, tmpq + r * ldb + j * p, p);
                    continue;
                }
                float *t = tmp + r * ldb + j * p;
                if (a->res) { /* as q_store_row: (scale * acc + bias) + res, then the activation, post */
                    const float *rr = a->res + yo + r * p;
                    for (long k = 0; k < p; ++k) t[k] = t[k] + rr[k];
                    if (a->act) q_act_row(t, p, a->act, a->a0, a->a1);
                    if (a->post_a != 1.0f || a->post_b != 0.0f)
                        for (long k = 0; k < p; ++k) t[k] = a->post_a * t[k] + a->post_b;
                }
                if (a->yq) {
                    const int yz = a->y_zero[r0 + r];
                    q_quant_args qa = {t, a->yq + yo + r * p, a->y_scale[r0 + r], (float)(0 - yz), (float)(255 - yz),
                                       (float)yz};
                    q_quant_task(&qa, 0, p);
                } else {
                    memcpy(a->y + yo + r * p, t, sizeof(float) * p);
                }
            }
        }
    }
}

static void q_conv_task(void *ctx, long begin, long end) {
    q_conv_args *a = (q_conv_args *)ctx;
    uint8_t *scratch = (uint8_t *)mrt_scratch_buffer(a->scratch_bytes);
    if (!scratch) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (long ch = begin; ch < end; ++ch) q_conv_chunk(a, ch, scratch, 1);
}

/* q_qconv2d with its input quantization fixed: the static body (below) */
static int q_qconv2d_static(const void *x, int x_u8, int n, int c, int h, int wd, float x_scale, int x_zero,
                            const void *packed_w, const int16_t *wino, int m, int group, int kh, int kw, int sh,
                            int sw, int dh, int dw, int pt, int pl, int oh, int ow, const float *scale,
                            const float *bias, const float *res, float *y, uint8_t *yq, const float *y_scale,
                            const int32_t *y_zero, int pkh, int pkw, int psh, int psw, int act, float a0, float a1,
                            float post_a, float post_b, int nthreads) {
    if (n <= 0 || m <= 0 || oh <= 0 || ow <= 0) return 0;
    if (group < 1 || c % group || m % group) return -1;
    if (nthreads < 1) nthreads = 1;
    const long plane = (long)h * wd, p = (long)oh * ow, kk = (long)kh * kw;
    q_conv_args a;
    a.x = x; a.x_u8 = x_u8; a.n = n; a.c = c; a.h = h; a.wd = wd; a.x_zero = x_zero; a.m = m; a.group = group;
    a.kh = kh; a.kw = kw; a.sh = sh; a.sw = sw; a.dh = dh; a.dw = dw; a.pt = pt; a.pl = pl; a.oh = oh; a.ow = ow;
    a.act = act; a.y_zero = y_zero; a.x_scale = x_scale; a.y_scale = y_scale; a.a0 = a0; a.a1 = a1;
    a.post_a = post_a; a.post_b = post_b;
    a.sums = (const int32_t *)packed_w;
    a.W = (const int8_t *)packed_w + (long)m * 4;
    a.wflags = q_packed_flags(packed_w, m, c / group * kh * kw);
    a.scale = scale; a.bias = bias; a.res = res; a.y = y; a.yq = yq;
    a.failed = 0;
    a.pkh = pkh; a.pkw = pkw; a.psh = psh; a.psw = psw;
    a.poh = pkh ? (oh - pkh) / psh + 1 : 0;
    a.pow = pkh ? (ow - pkw) / psw + 1 : 0;
    /* images per GEMM: enough for ~Q_CONV_BATCH_COLS columns, but leave a chunk per thread (a direct 1x1
     * kernel over planes of Q_CONV_DIRECT_MIN_PIXELS or more: one) */
    a.direct = kk == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && oh == h && ow == wd;
    long nb = p < Q_CONV_BATCH_COLS ? (Q_CONV_BATCH_COLS + p - 1) / p : 1;
    if (a.direct && !pkh && p >= Q_CONV_DIRECT_MIN_PIXELS) nb = 1;
    long per_thread = (n + nthreads - 1) / nthreads;
    if (nb > per_thread) nb = per_thread;
    if (nb < 1) nb = 1;
    a.nb = (int)nb;
    a.wino = wino;
#ifdef MRT_HAVE_VNNI_BUILD
    a.winograd = wino && nb == 1 && !pkh && q_winograd_fits(c, m, group, kh, kw, sh, sw, dh, dw, pt, pl);
#else
    a.winograd = 0;
#endif
    a.implicit = nb == 1 && !pkh && !a.winograd && q_implicit_plan(c, m, group, kh, kw, sh, sw, dh, dw, oh, ow, &a.geo);
    const int side_by_side = !(nb == 1 && !pkh); /* (as in q_conv_chunk) */
    a.panels = !a.direct && !a.implicit && !a.winograd && q_plane64_route(sh, sw, wd, oh, ow);
    size_t bytes = q_align64(x_u8 ? 0 : (size_t)c * plane * (side_by_side ? nb : 1));
    if (a.implicit) {
        bytes += a.geo.planes_bytes + a.geo.weights_bytes + a.geo.table_bytes;
    } else if (nb == 1 && !pkh) {
        if (!a.direct && !a.winograd) bytes += a.panels ? q_chunk_cols_bytes(&a) : (size_t)c * kk * p;
    } else { /* side by side (or pooled): the GEMM writes a scratch whose planes are then placed */
        bytes += q_chunk_cols_bytes(&a) + sizeof(float) * (size_t)(m / group) * nb * p;
    }
    a.scratch_bytes = bytes + 64;
    const long chunks = (n + nb - 1) / nb;
    if (n > 1 && chunks >= nthreads && nthreads > 1) {
        mrt_parallel_for(chunks, (long)m * (c / group) * kk * nb * p / 32, nthreads, q_conv_task, &a);
    } else {
        uint8_t *scratch = (uint8_t *)mrt_scratch_buffer(a.scratch_bytes);
        if (!scratch) return -1;
        for (long ch = 0; ch < chunks; ++ch) q_conv_chunk(&a, ch, scratch, nthreads);
    }
    return a.failed ? -1 : 0;
}

static void q_dynamic_params(const float *a, long count, int levels, float *x_scale, int *x_zero); /* (below) */

/* mrt_qconv2d, and with pkh > 0 (float output only) the MaxPool of mrt_qconv2d_pool_f32.  A float input with
 * x_scale 0 is quantized dynamically (D146): its own uint8 parameters (q_dynamic_params over the whole input,
 * 255 levels: kernels/qlinear.py's _dynamic_params, bit for bit) and the channels' scales x_scale * scale[o]
 * (the weights' scales there), computed here so that a dynamic conv is one recordable call. */
static int q_qconv2d(const void *x, int x_u8, int n, int c, int h, int wd, float x_scale, int x_zero,
                     const void *packed_w, const int16_t *wino, int m, int group, int kh, int kw, int sh, int sw,
                     int dh, int dw, int pt, int pl, int oh, int ow, const float *scale, const float *bias,
                     const float *res, float *y, uint8_t *yq, const float *y_scale, const int32_t *y_zero, int pkh,
                     int pkw, int psh, int psw, int act, float a0, float a1, float post_a, float post_b, int nthreads) {
    if (x_u8 || x_scale != 0.0f || m <= 0)
        return q_qconv2d_static(x, x_u8, n, c, h, wd, x_scale, x_zero, packed_w, wino, m, group, kh, kw, sh, sw, dh,
                                dw, pt, pl, oh, ow, scale, bias, res, y, yq, y_scale, y_zero, pkh, pkw, psh, psw, act,
                                a0, a1, post_a, post_b, nthreads);
    q_dynamic_params((const float *)x, (long)n * c * h * wd, 255, &x_scale, &x_zero);
    float *dyn = (float *)malloc(sizeof(float) * (size_t)m);
    if (!dyn) return -1;
    for (int o = 0; o < m; ++o) dyn[o] = x_scale * scale[o];
    const int rc = q_qconv2d_static(x, x_u8, n, c, h, wd, x_scale, x_zero, packed_w, wino, m, group, kh, kw, sh, sw,
                                    dh, dw, pt, pl, oh, ow, dyn, bias, res, y, yq, y_scale, y_zero, pkh, pkw, psh, psw,
                                    act, a0, a1, post_a, post_b, nthreads);
    free(dyn);
    return rc;
}

int mrt_qconv2d(const mrt_conv_geometry *g, const mrt_quant *q, const mrt_epilogue *e, const void *x,
                const float *res, void *y, int nthreads) {
    if (geometry_overflows(g)) return -2;
    return q_qconv2d(x, q->x_u8, g->n, g->c, g->h, g->w, q->x_scale, q->x_zero, q->packed_w, q->wino_w, g->m,
                     g->group, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw, g->pt, g->pl, g->oh, g->ow, q->scale, e->bias,
                     res, q->y_u8 ? NULL : (float *)y, q->y_u8 ? (uint8_t *)y : NULL, q->y_u8 ? q->y_scales : NULL,
                     q->y_u8 ? q->y_zeros : NULL, 0, 0, 0, 0, e->act, e->a0, e->a1, e->post_a, e->post_b, nthreads);
}

int mrt_qconv2d_pool_f32(const mrt_conv_geometry *g, const mrt_conv_geometry *pool, const mrt_quant *q,
                         const mrt_epilogue *e, const void *x, const float *res, float *y, int nthreads) {
    const int pkh = pool->kh, pkw = pool->kw, psh = pool->sh, psw = pool->sw;
    if (pkh < 1 || pkw < 1 || psh < 1 || psw < 1 || g->oh < pkh || g->ow < pkw) return -2;
    return q_qconv2d(x, q->x_u8, g->n, g->c, g->h, g->w, q->x_scale, q->x_zero, q->packed_w, q->wino_w, g->m,
                     g->group, g->kh, g->kw, g->sh, g->sw, g->dh, g->dw, g->pt, g->pl, g->oh, g->ow, q->scale, e->bias,
                     res, y, NULL, NULL, NULL, pkh, pkw, psh, psw, e->act, e->a0, e->a1, 1.0f, 0.0f, nthreads);
}

#ifdef MRT_HAVE_VNNI_BUILD
/* y[r][j] = t[j][r] for 8 x 8 blocks (r0, j0) .. (r0 + 8, j0 + 8): 8 rows of t transposed in registers
 * (unpacks within 128-bit lanes, then the lanes exchanged). */
__attribute__((target("avx2"))) static void q_transpose8_avx2(const float *t, long ldt, float *y, long ldy) {
    __m256 a[8], b[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_loadu_ps(t + i * ldt);
    for (int i = 0; i < 8; i += 2) {
        b[i] = _mm256_unpacklo_ps(a[i], a[i + 1]);
        b[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        a[i] = _mm256_shuffle_ps(b[i], b[i + 2], 0x44);
        a[i + 1] = _mm256_shuffle_ps(b[i], b[i + 2], 0xEE);
        a[i + 2] = _mm256_shuffle_ps(b[i + 1], b[i + 3], 0x44);
        a[i + 3] = _mm256_shuffle_ps(b[i + 1], b[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(y + i * ldy, _mm256_permute2f128_ps(a[i], a[i + 4], 0x20));
        _mm256_storeu_ps(y + (i + 4) * ldy, _mm256_permute2f128_ps(a[i], a[i + 4], 0x31));
    }
}
#endif

/* y (rows x n) = the transpose of t (n x rows): 8 x 8 blocks in registers on AVX2 (a QMatMul's
 * result of 128 rows x 1024 took 10% of a BERT layer a float at a time), the edges a float at a time,
 * in blocks of 32 rows. */
static void q_transpose_f32(const float *t, int n, long rows, float *y) {
    long r8 = 0;
    int n8 = 0;
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_use_avx2) {
        r8 = rows / 8 * 8, n8 = n / 8 * 8;
        for (long r0 = 0; r0 < r8; r0 += 8)
            for (int j0 = 0; j0 < n8; j0 += 8) q_transpose8_avx2(t + (long)j0 * rows + r0, rows, y + r0 * n + j0, n);
    }
#endif
    for (long r0 = 0; r0 < rows; r0 += 32) /* the rest: columns n8.. of rows < r8, then rows r8.. */
        for (int j = 0; j < n; ++j)
            for (long r = r0 < r8 && j < n8 ? r8 : r0; r < rows && r < r0 + 32; ++r)
                y[r * n + j] = t[(long)j * rows + r];
}

/* y (rows, n) = act(scale[j] * sum_k (quant(a[r, k]) - zp) W[j, k] + bias[j]) for float a (rows, K):
 * the weights go on the left (C^T = W quant(a)^T), so the packed (n, K) weights serve any number
 * of rows; a is quantized row by row into rows of k4 bytes (contiguous, vectorized), which the
 * GEMM reads as its columns (q_pack_xt), and C^T is transposed into y (rows == 1 writes y directly). */
/* DynamicQuantizeLinear's parameters of a (count floats) for `levels` (255: uint8) over [min(a, 0),
 * max(a, 0)], the scale rounded to float from the double quotient and the zero point rint(-lo / scale)
 * clamped to [0, levels] (kernels/qlinear.py's _quant_params computes the same, bit for bit); a range of
 * 0: scale 1, zero 0. */
#ifdef MRT_HAVE_VNNI_BUILD
/* The range of q_dynamic_params on AVX2, 32 values a step: vminps / vmaxps (x, m) take m when x is NaN,
 * which is the scalar loop's `x < m ? x : m` exactly (a NaN is skipped); the same min and max. */
__attribute__((target("avx2"))) static void q_range_avx2(const float *a, long count, float *lo, float *hi) {
    __m256 l[4], h[4];
    for (int j = 0; j < 4; ++j) l[j] = h[j] = _mm256_setzero_ps();
    long i = 0;
    for (; i + 32 <= count; i += 32)
        for (int j = 0; j < 4; ++j) {
            const __m256 x = _mm256_loadu_ps(a + i + 8 * j);
            l[j] = _mm256_min_ps(x, l[j]);
            h[j] = _mm256_max_ps(x, h[j]);
        }
    float ls[8], hs[8];
    _mm256_storeu_ps(ls, _mm256_min_ps(_mm256_min_ps(l[0], l[1]), _mm256_min_ps(l[2], l[3])));
    _mm256_storeu_ps(hs, _mm256_max_ps(_mm256_max_ps(h[0], h[1]), _mm256_max_ps(h[2], h[3])));
    float lo_ = 0.0f, hi_ = 0.0f;
    for (int j = 0; j < 8; ++j) {
        lo_ = ls[j] < lo_ ? ls[j] : lo_;
        hi_ = hs[j] > hi_ ? hs[j] : hi_;
    }
    for (; i < count; ++i) {
        lo_ = a[i] < lo_ ? a[i] : lo_;
        hi_ = a[i] > hi_ ? a[i] : hi_;
    }
    *lo = lo_, *hi = hi_;
}
#endif

static void q_dynamic_params(const float *a, long count, int levels, float *x_scale, int *x_zero) {
    float lo = 0.0f, hi = 0.0f;
#ifdef MRT_HAVE_VNNI_BUILD
    if (q_use_avx2)
        q_range_avx2(a, count, &lo, &hi);
    else
#endif
        for (long i = 0; i < count; ++i) {
            lo = a[i] < lo ? a[i] : lo;
            hi = a[i] > hi ? a[i] : hi;
        }
    const float s = (float)(((double)hi - (double)lo) / (double)levels);
    if (s == 0.0f) {
        *x_scale = 1.0f;
        *x_zero = 0;
        return;
    }
    const double z = rint(-(double)lo / (double)s);
    *x_scale = s;
    *x_zero = z < 0.0 ? 0 : z > (double)levels ? levels : (int)z;
}

int mrt_qmatmul_f32(const mrt_gemm_shape *s, const mrt_quant *q, const mrt_epilogue *e, const float *a, float *y,
                    int nthreads) {
    const long rows = s->M;
    const int K = s->K, n = s->N, act = e->act;
    const float a0 = e->a0, a1 = e->a1;
    const void *packed_w = q->packed_w;
    const float *scale = q->scale, *bias = e->bias;
    const int dynamic = q->x_scale == 0.0f;
    if (rows <= 0 || n <= 0) return 0;
    const long k4 = q_k4(K);
    const size_t xq_bytes = q_align64((size_t)k4 * rows);
    const size_t ct_bytes = rows == 1 ? 0 : sizeof(float) * (size_t)n * rows;
    const size_t dyn_bytes = dynamic ? q_align64(sizeof(float) * (size_t)n) : 0;
    uint8_t *xq = (uint8_t *)mrt_scratch_buffer(xq_bytes + ct_bytes + dyn_bytes + 64);
    if (!xq) return -1;
    float *ct = rows == 1 ? y : (float *)(xq + xq_bytes);
    float x_scale = q->x_scale;
    int x_zero = q->x_zero;
    /* quantized values clamp to [0, 255], static or dynamic (uint8, as onnxruntime's DynamicQuantizeLinear;
     * AVX2's fast route comes from pair-limited weights, D172, not from fewer input levels) */
    const int levels = 255;
    if (dynamic) { /* the input's own scale and zero point; the columns' scales follow from them */
        float *dyn = (float *)(xq + xq_bytes + ct_bytes);
        q_dynamic_params(a, (long)K * rows, levels, &x_scale, &x_zero);
        for (int j = 0; j < n; ++j) dyn[j] = x_scale * q->scale[j];
        scale = dyn;
    }
    q_quant_args qa = {a, xq, x_scale, (float)(0 - x_zero), (float)(levels - x_zero), (float)x_zero};
    if (k4 == K || rows == 1) {
        mrt_parallel_for((long)K * rows, 4, nthreads, q_quant_task, &qa); /* (as mrt_quantize_u8_f32) */
    } else { /* each row padded to k4 bytes (the pad meets zero weights; written for determinism) */
        for (long r = 0; r < rows; ++r) {
            qa.x = a + r * K;
            qa.q = xq + r * k4;
            q_quant_task(&qa, 0, K);
            memset(xq + r * k4 + K, x_zero, k4 - K);
        }
    }
    /* one row: the (K, 1) column of the matrix-vector route */
    q_gemm_run_q(n, (int)rows, K, (const int32_t *)packed_w, (const int8_t *)packed_w + (long)n * 4, xq,
                 rows == 1 ? 1 : k4, rows == 1 ? Q_X_ROWS : Q_X_COLS, x_zero, scale, bias, ct, rows, NULL, 0, act, a0,
                 a1, 1.0f, 0.0f, NULL, 0, NULL, NULL, NULL, 0.0f, 0, 0, q_packed_flags(packed_w, n, K), nthreads);
    if (rows > 1) q_transpose_f32(ct, n, rows, y);
    return 0;
}

/* ---------------------------------------------------------------- int8 ConvTranspose, stride == kernel */

/* ConvTranspose with stride == kernel (kh x kw), no padding, one group: every input pixel owns its
 * own kh x kw output tile, so the output is the int8 GEMM of the (M*kh*kw, C) weights (row
 * (mi*kh + t)*kw + u holds W[:, mi, t, u]) with the uint8 input, its rows placed as interleaved
 * taps (layout_impl.h's convt_tiles does the same in float).  One task per band of input rows: the
 * GEMM of the band into thread-local scratch (float, or requantized to uint8), then the band is
 * placed into the output while it is still in cache, so the output is written once. */
typedef struct {
    const uint8_t *x;
    const int32_t *sums;
    const int8_t *W;
    const float *scale, *bias, *yscale; /* per GEMM row (M*kh*kw) */
    const int32_t *yzp;
    float *y;    /* float output, or NULL */
    uint8_t *yq; /* uint8 output (requantized with yscale / yzp), or NULL */
    int c, h, wd, m, kh, kw, band, x_zero, act;
    int wflags; /* Q_W_* of the packed weights (q_packed_flags) */
    float a0, a1;
    long bands_per_image;
    int failed;
} q_convt_args;

/* dst[2 j] = a[j], dst[2 j + 1] = b[j] for j < n: two tap rows interleaved (kw == 2), 16 bytes /
 * 4 floats of each at a time with SSE2 unpacks (a scalar loop elsewhere). */
static void q_interleave2_u8(uint8_t *restrict dst, const uint8_t *restrict a, const uint8_t *restrict b, long n) {
    long j = 0;
#if defined(__SSE2__)
    for (; j + 16 <= n; j += 16) {
        const __m128i va = _mm_loadu_si128((const __m128i *)(a + j)), vb = _mm_loadu_si128((const __m128i *)(b + j));
        _mm_storeu_si128((__m128i *)(dst + 2 * j), _mm_unpacklo_epi8(va, vb));
        _mm_storeu_si128((__m128i *)(dst + 2 * j + 16), _mm_unpackhi_epi8(va, vb));
    }
#endif
    for (; j < n; ++j) {
        dst[2 * j] = a[j];
        dst[2 * j + 1] = b[j];
    }
}

static void q_interleave2_f32(float *restrict dst, const float *restrict a, const float *restrict b, long n) {
    long j = 0;
#if defined(__SSE2__)
    for (; j + 4 <= n; j += 4) {
        const __m128 va = _mm_loadu_ps(a + j), vb = _mm_loadu_ps(b + j);
        _mm_storeu_ps(dst + 2 * j, _mm_unpacklo_ps(va, vb));
        _mm_storeu_ps(dst + 2 * j + 4, _mm_unpackhi_ps(va, vb));
    }
#endif
    for (; j < n; ++j) {
        dst[2 * j] = a[j];
        dst[2 * j + 1] = b[j];
    }
}

/* Place the band's GEMM rows (elements of es bytes: 4 float, 1 uint8): row (mi*kh + t)*kw + u of
 * cols (row stride ldc), element i*wd + j, is output (mi, (r0 + i)*kh + t, j*kw + u) of an image y of
 * m planes of (h*kh) x (wd*kw). */
static void q_convt_place(const uint8_t *cols, long ldc, uint8_t *y, int es, int m, int kh, int kw, int r0, int rows,
                          int h, int wd) {
    const long ow = (long)wd * kw, oplane = (long)h * kh * ow;
    for (int mi = 0; mi < m; ++mi)
        for (int t = 0; t < kh; ++t) {
            const uint8_t *tap = cols + (long)(mi * kh + t) * kw * ldc * es;
            for (int i = 0; i < rows; ++i) {
                uint8_t *row = y + (mi * oplane + ((long)(r0 + i) * kh + t) * ow) * es;
                const uint8_t *s0 = tap + (long)i * wd * es;
                if (kw == 2 && es == 1)
                    q_interleave2_u8(row, s0, s0 + ldc, wd);
                else if (kw == 2)
                    q_interleave2_f32((float *)row, (const float *)s0, (const float *)(s0 + ldc * es), wd);
                else
                    for (int u = 0; u < kw; ++u)
                        for (int j = 0; j < wd; ++j)
                            memcpy(row + ((long)j * kw + u) * es, s0 + ((long)u * ldc + j) * es, (size_t)es);
            }
        }
}

static void q_convt_task(void *ctx, long begin, long end) {
    q_convt_args *a = (q_convt_args *)ctx;
    const long plane = (long)a->h * a->wd;
    const int rows_out = a->m * a->kh * a->kw;
    const size_t elem = a->yq ? 1 : sizeof(float);
    uint8_t *cols = (uint8_t *)mrt_scratch_buffer(elem * (size_t)rows_out * a->band * a->wd);
    if (!cols) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (long u = begin; u < end; ++u) {
        const long img = u / a->bands_per_image;
        const int r0 = (int)(u % a->bands_per_image) * a->band;
        const int rows = a->h - r0 < a->band ? a->h - r0 : a->band;
        const long ldc = (long)rows * a->wd;
        /* X = the band's input rows: row k (input channel k) at x + k * plane */
        const uint8_t *xb = a->x + img * a->c * plane + (long)r0 * a->wd;
        q_gemm_run_q(rows_out, (int)ldc, a->c, a->sums, a->W, xb, plane, Q_X_ROWS, a->x_zero, a->scale, a->bias,
                     a->yq ? NULL : (float *)cols, ldc, NULL, 0, a->act, a->a0, a->a1, 1.0f, 0.0f,
                     a->yq ? cols : NULL, ldc, a->yscale, a->yzp, NULL, 0.0f, 0, 0, a->wflags, 1);
        const long out_image = (long)a->m * plane * a->kh * a->kw;
        q_convt_place(cols, ldc, a->yq ? a->yq + img * out_image : (uint8_t *)(a->y + img * out_image), (int)elem,
                      a->m, a->kh, a->kw, r0, rows, a->h, a->wd);
    }
}

/* GEMM rows per band: about this many output values (the band's GEMM output stays in L2) */
#define Q_CONVT_BAND_VALUES 65536

int mrt_qconvtranspose_tiles(const mrt_conv_geometry *g, const mrt_quant *q, const mrt_epilogue *e, const uint8_t *x,
                             void *y_out, int nthreads) {
    const int n = g->n, c = g->c, h = g->h, wd = g->w, m = g->m, kh = g->kh, kw = g->kw, x_zero = q->x_zero;
    const void *packed_w = q->packed_w;
    const float *scale = q->scale, *bias = e->bias, *y_scale = q->y_u8 ? q->y_scales : NULL;
    const int32_t *y_zero = q->y_u8 ? q->y_zeros : NULL;
    float *y = q->y_u8 ? NULL : (float *)y_out;
    uint8_t *yq = q->y_u8 ? (uint8_t *)y_out : NULL;
    const int act = e->act;
    const float a0 = e->a0, a1 = e->a1;
    if (n <= 0 || m <= 0 || h <= 0 || wd <= 0) return 0;
    if (kh < 1 || kw < 1 || c < 1 || (y == NULL) == (yq == NULL)) return -2;
    const int rows_out = m * kh * kw;
    const long row_values = (long)rows_out * wd;
    long band = Q_CONVT_BAND_VALUES / row_values;
    if (band < 1) band = 1;
    if (band > h) band = h;
    q_convt_args a;
    a.x = x;
    a.sums = (const int32_t *)packed_w;
    a.W = (const int8_t *)packed_w + (long)rows_out * 4;
    a.wflags = q_packed_flags(packed_w, rows_out, c);
    a.scale = scale; a.bias = bias; a.yscale = y_scale; a.yzp = y_zero;
    a.y = y; a.yq = yq;
    a.c = c; a.h = h; a.wd = wd; a.m = m; a.kh = kh; a.kw = kw; a.band = (int)band; a.x_zero = x_zero;
    a.act = act; a.a0 = a0; a.a1 = a1;
    a.bands_per_image = (h + band - 1) / band;
    a.failed = 0;
    mrt_parallel_for((long)n * a.bands_per_image, row_values * band * c / 32, nthreads, q_convt_task, &a);
    return a.failed ? -1 : 0;
}
