/* float32 GEMM with a fused epilogue, compiled once per instruction set by
 * kernels.c (after kernels_impl.h, whose activations FN(vact) repeats on
 * vectors).  Extra parameter of the include:
 *   MRT_VL   floats per vector register (4: SSE2/NEON, 8: AVX2, 16: AVX-512)
 *
 *   C[m, n] = act(sum_k A[m, k] * B[k, n] + bias + residual[m, n])
 *
 * All matrices are row-major with leading dimensions (lda, ldb, ldc, ldr).
 * For a convolution in NCHW, A is the weight (M = output channels, K =
 * C_in/group * KH * KW), B the input itself (1x1), its im2col or (implicit
 * GEMM, below) rows of its padded planes, and C the output plane.
 *
 * Structure (BLIS-like, written with GCC vector extensions so the same code
 * becomes SSE2, AVX2+FMA, AVX-512 or NEON):
 *   - B is packed per (KC x NC) block into panels of NR = 2 vectors of
 *     columns ([panel][k][NR], zero-padded), one contiguous stream per panel;
 *   - A is read in place: the microkernel broadcasts A[m, k] for MR rows
 *     (MR = 8 with AVX-512, else 6);
 *   - the MR x NR tile of C lives in 2 MR vector registers over the whole KC
 *     loop (K is cut into equal blocks of about KC); the epilogue (bias,
 *     residual and the compare/multiply activations on the registers, the
 *     exp-based ones on the stored tile) runs when the tile is stored after
 *     the last KC block, while it is still in L1;
 *   - a last panel of at most one vector of columns (N = 196 = 6 x 32 + 4)
 *     takes a one-vector microkernel.
 * Threads split the (column block, row block) grid of the output.
 *
 * Implicit-GEMM convolution (FN(sgemm_conv)): B is never materialised.  Row k
 * of B starts at B + brow[k] (a tap of the padded, stride-phase-split input
 * built by kernels.c); the microkernel reads whole panels of those rows in
 * place (the taps of a 3 x 3 kernel are shifted views of the same plane
 * rows, in cache) and only a partial last panel is packed.  C's columns then
 * form an "extended" output grid of ext_wq columns per output row, of which
 * only the first ext_ow exist: tiles accumulate in a per-thread scratch block
 * and the epilogue copies the existing columns out to C (row stride ldc,
 * ext_ow columns per output row).
 */

typedef float FN(vf) __attribute__((vector_size(MRT_VL * 4)));
/* 4-float vectors (every ISA has them) and their two-input shuffle, for small transposes */
typedef float FN(v4f) __attribute__((vector_size(16)));
typedef float FN(v4fu) __attribute__((vector_size(16), aligned(4)));
typedef int FN(v4i) __attribute__((vector_size(16)));
#if defined(__clang__)
#define G_SHUF4(a, b, i0, i1, i2, i3) __builtin_shufflevector(a, b, i0, i1, i2, i3)
#else
#define G_SHUF4(a, b, i0, i1, i2, i3) __builtin_shuffle(a, b, (FN(v4i)){i0, i1, i2, i3})
#endif
typedef float FN(vfu) __attribute__((vector_size(MRT_VL * 4), aligned(4)));
typedef int FN(vi) __attribute__((vector_size(MRT_VL * 4)));
typedef unsigned FN(vu) __attribute__((vector_size(MRT_VL * 4)));

/* rows per microkernel tile: 8 x 2 accumulators fit AVX-512's 32 registers (and 8 divides
 * most channel counts), 6 x 2 the 16 of SSE2/AVX2 (NEON, with 32, keeps 6: not measured on
 * arm64 yet) */
#if MRT_VL == 16
#define G_MR 8
#else
#define G_MR 6
#endif
#define G_NR (2 * MRT_VL)
#define G_KC 256 /* nominal depth of a packed block; FN(sgemm_run) balances the blocks of K */
#define G_NC 256
/* Packed B of a column block at one thread for a shallow K (FN(sgemm_run)): up to this many floats
 * (128 KB, in L2), i.e. blocks wider than G_NC when K < 128 (16 -> 96 channels over 112 x 112 pixels,
 * K = 16: blocks of 2048 columns) */
#define G_PACK_FLOATS 32768
/* the tile store and its epilogue must be inlined into the microkernel (GCC declines otherwise) */
#define G_INLINE __attribute__((always_inline))

typedef struct {
    const float *A, *B;
    float *C;
    const float *bias, *res;
    const long *brow; /* implicit B: row k at B + brow[k] (NULL: at B + k * ldb) */
    int b_in_place;   /* with brow: the microkernel reads whole panels in place instead of packing them */
    const float *bpack; /* B packed once for every k block (FN(sgemm_pack_b_all)), or NULL: packed per tile */
    long bpack_ld;      /* with bpack: floats per row of B across all its panels (N rounded up to G_NR) */
    long lda, ldb, ldc, ldr;
    long sa, sb, sc, sr; /* batch strides (elements; 0 broadcasts) */
    int M, N, K, bias_mode, act, transb;
    int dot_tail; /* the last N % G_NR <= G_DOT_TAIL columns as dot products (FN(sgemm_dot_tail)): only
                   * when N depends on the shapes alone, not on the threads (whose blocks of columns or
                   * bands would move which columns are the tail, and so their rounding) */
    int ext_ow, ext_wq; /* extended output grid (ext_wq > 0, with brow): see the top of this file */
    float a0, a1;
    int kc, nc, mc, nblocks;
    long tiles; /* column blocks x row blocks per matrix */
} FN(sgemm_args);

static inline MRT_TARGET FN(vf) FN(vload)(const float *p) { return *(const FN(vfu) *)p; }
static inline MRT_TARGET void FN(vstore)(float *p, FN(vf) v) { *(FN(vfu) *)p = v; }
/* lt ? a : b with lt a comparison mask (C has no ?: on vectors) */
static inline MRT_TARGET FN(vf) FN(vsel)(FN(vi) lt, FN(vf) a, FN(vf) b) {
    return (FN(vf))(((FN(vi))a & lt) | ((FN(vi))b & ~lt));
}

/* v < lo ? lo : v and v > hi ? hi : v (NaN v stays v).  On x86 one max / min instruction, whose
 * definition is exactly that (MAXPS(a, b) = a > b ? a : b, MINPS(a, b) = a < b ? a : b, the
 * second operand when either is NaN), so the results are the same bits as the select; GCC makes
 * FN(vsel) a compare and three masked logic operations instead (the clamps were a third of SiLU's
 * cost: 0.18 -> 0.13 ns per value).  Elsewhere the select. */
static inline MRT_TARGET G_INLINE FN(vf) FN(vclamp_lo)(FN(vf) v, FN(vf) lo) {
#if defined(__x86_64__) && MRT_VL == 16
    return (FN(vf))_mm512_max_ps((__m512)lo, (__m512)v);
#elif defined(__x86_64__) && MRT_VL == 8
    return (FN(vf))_mm256_max_ps((__m256)lo, (__m256)v);
#elif defined(__x86_64__) && MRT_VL == 4
    return (FN(vf))_mm_max_ps((__m128)lo, (__m128)v);
#else
    return FN(vsel)(v < lo, lo, v);
#endif
}
static inline MRT_TARGET G_INLINE FN(vf) FN(vclamp_hi)(FN(vf) v, FN(vf) hi) {
#if defined(__x86_64__) && MRT_VL == 16
    return (FN(vf))_mm512_min_ps((__m512)hi, (__m512)v);
#elif defined(__x86_64__) && MRT_VL == 8
    return (FN(vf))_mm256_min_ps((__m256)hi, (__m256)v);
#elif defined(__x86_64__) && MRT_VL == 4
    return (FN(vf))_mm_min_ps((__m128)hi, (__m128)v);
#else
    return FN(vsel)(v > hi, hi, v);
#endif
}

/* x[j] = exp(x[j]) for j < n (a constant): expf_approx's reduction (kernels_impl.h: x = n ln2 + r,
 * |r| <= ln2 / 2, the clamps), exp(r) by a degree-6 polynomial fitted for relative error on that
 * interval (2e-9, against 5e-9 for expf_approx's degree-7 Taylor polynomial: one multiply-add less,
 * SiLU 0.126 -> 0.114 ns per value; largest relative error measured over [-87, 88], in units of
 * 2^-23: 0.74 for exp, 0.66 with degree 7, and the same 1.46 for SiLU).  Each step runs on all n
 * vectors before the next: the steps of one vector depend on each other (~20 in a row), so n
 * independent vectors side by side keep the FP pipes busy (6 vectors: 2.1 against 2.8 ns per vector
 * one at a time, AVX-512).  Every vector gets the same operations whatever n. */
static inline MRT_TARGET G_INLINE void FN(vexp_group)(FN(vf) *x, const int n) {
    FN(vf) z = {0};
    FN(vf) tn[n], r[n], p[n];
    FN(vi) under[n]; /* exp(x) below FLT_MIN (x < -87): 0, see the end */
    for (int j = 0; j < n; ++j) under[j] = x[j] < z - 87.0f;
    for (int j = 0; j < n; ++j) x[j] = FN(vclamp_hi)(FN(vclamp_lo)(x[j], z - 87.0f), z + 88.0f);
    for (int j = 0; j < n; ++j) {
        FN(vf) t = x[j] * 1.44269504088896341f;
        tn[j] = t + 12582912.0f; /* n = round(t) in its low mantissa bits (1.5 * 2^23: a unit per ulp) */
    }
    for (int j = 0; j < n; ++j) {
        FN(vf) m = tn[j] - 12582912.0f;
        r[j] = x[j] - m * 0.693145751953125f;
        r[j] = r[j] - m * 1.42860682030941723e-06f;
    }
    for (int j = 0; j < n; ++j) p[j] = (z + 0.00138368458f) * r[j] + 0.00837481581f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * r[j] + 0.0416682251f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * r[j] + 0.166664198f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * r[j] + 0.499999911f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * r[j] + 1.0f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * r[j] + 1.0f;
    /* 2^n = (n + 127) << 23: the low 9 bits of n, shifted out of tn's bits (n + 2^22 in its
     * mantissa), plus the exponent bias; the same bits as converting n (one operation less) */
    for (int j = 0; j < n; ++j) {
        FN(vu) bits = ((FN(vu))tn[j] << 23) + (127u << 23);
        x[j] = p[j] * (FN(vf))bits;
    }
    /* Below x = -87 the result is 0, not exp(-87) (the clamp's value): exactly what a masked softmax
     * wants (a mask of -3.4e38 gave 1.7e-39 after the division by the sum, subnormals that made
     * BERT's next GEMM 40x slower: ~0.5 ns per multiply-add with a subnormal operand), and closer to
     * exp(x) (< 1.7e-38) than exp(-87) is.  NaN compares false and stays NaN. */
    for (int j = 0; j < n; ++j) x[j] = FN(vsel)(under[j], z, x[j]);
}

/* exp(x) on one vector (FN(vexp_group)). */
static inline MRT_TARGET FN(vf) FN(vexp)(FN(vf) x) {
    FN(vexp_group)(&x, 1);
    return x;
}

/* Gelu as act_row computes it, 0.5 x erfc(-x / sqrt 2), on v[j] for j < n (a constant: 1 for FN(vact), 4 for
 * FN(vact_group)), the vectors side by side, their exponentials by FN(vexp_group): the same operations on every
 * value whatever n, so the same bits (D159). */
static inline MRT_TARGET G_INLINE void FN(vgelu_group)(FN(vf) *v, const int n) {
    FN(vf) z = {0}, one = z + 1.0f, zz[n], az[n], t[n], p[n];
    for (int j = 0; j < n; ++j) {
        zz[j] = v[j] * -0.70710678118654752f;
        az[j] = FN(vsel)(zz[j] < z, -zz[j], zz[j]);
        t[j] = one / (one + 0.5f * az[j]);
        p[j] = z + 0.17087277f;
    }
    for (int j = 0; j < n; ++j) p[j] = p[j] * t[j] - 0.82215223f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * t[j] + 1.48851587f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * t[j] - 1.13520398f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * t[j] + 0.27886807f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * t[j] - 0.18628806f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * t[j] + 0.09678418f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * t[j] + 0.37409196f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * t[j] + 1.00002368f;
    for (int j = 0; j < n; ++j) p[j] = p[j] * t[j] - 1.26551223f;
    for (int j = 0; j < n; ++j) p[j] = p[j] - az[j] * az[j];
    FN(vexp_group)(p, n);
    for (int j = 0; j < n; ++j) {
        FN(vf) e = t[j] * p[j];
        FN(vf) erfc = FN(vsel)(zz[j] < z, 2.0f - e, e);
        v[j] = 0.5f * v[j] * erfc;
    }
}

/* Activations cheap enough (a few compares and multiplies) to run on the accumulators as a
 * tile is stored; the others (exp based) run on the stored tile, FN(sgemm_act_tile). */
static inline int FN(act_in_registers)(int act) {
    return act == MRT_ACT_RELU || act == MRT_ACT_CLIP || act == MRT_ACT_LEAKY || act == MRT_ACT_HARDSIGMOID ||
           act == MRT_ACT_HARDSWISH;
}

/* The cheap epilogue activations on one vector (FN(act_in_registers)); others: v unchanged. */
static inline MRT_TARGET G_INLINE FN(vf) FN(vact_cheap)(FN(vf) v, int act, float a0, float a1) {
    FN(vf) z = {0}, one = z + 1.0f;
    switch (act) {
    case MRT_ACT_RELU:
        return FN(vclamp_lo)(v, z);
    case MRT_ACT_CLIP:
        return FN(vclamp_hi)(FN(vclamp_lo)(v, z + a0), z + a1);
    case MRT_ACT_LEAKY:
        return FN(vsel)(v < z, v * a0, v);
    case MRT_ACT_HARDSIGMOID:
        return FN(vclamp_hi)(FN(vclamp_lo)(v * a0 + a1, z), one);
    case MRT_ACT_HARDSWISH:
        return v * FN(vclamp_hi)(FN(vclamp_lo)(v * (1.0f / 6.0f) + 0.5f, z), one);
    default:
        return v;
    }
}

/* The epilogue activations on one vector, the algorithms of act_row (kernels_impl.h): a call
 * to act_row for the one or two vectors of a tile row does not vectorise well. */
static inline MRT_TARGET G_INLINE FN(vf) FN(vact)(FN(vf) v, int act, float a0, float a1) {
    FN(vf) z = {0}, one = z + 1.0f;
    if (FN(act_in_registers)(act)) return FN(vact_cheap)(v, act, a0, a1);
    switch (act) {
    case MRT_ACT_SIGMOID:
        return one / (one + FN(vexp)(-v));
    case MRT_ACT_SILU:
        return v / (one + FN(vexp)(-v));
    case MRT_ACT_GELU:
        FN(vgelu_group)(&v, 1);
        return v;
    case MRT_ACT_GELU_TANH: { /* (x / (1 + e), not x * (1 / (1 + e)): see act_row) */
        FN(vf) u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        return v / (one + FN(vexp)(-2.0f * u));
    }
    case MRT_ACT_TANH: { /* as in act_row: the exp form from |x| >= 1/4, the odd series below */
        FN(vf) ax = FN(vsel)(v < z, -v, v);
        FN(vf) e = FN(vexp)(-2.0f * ax);
        FN(vf) big = (one - e) / (one + e);
        FN(vf) x2 = v * v;
        FN(vf) p = z + 62.0f / 2835.0f;
        p = p * x2 - 17.0f / 315.0f;
        p = p * x2 + 2.0f / 15.0f;
        p = p * x2 - 1.0f / 3.0f;
        FN(vf) small = v + v * x2 * p;
        return FN(vsel)(ax < z + 0.25f, small, FN(vsel)(v < z, -big, big));
    }
    default:
        return v;
    }
}

/* v[j] = FN(vact)(v[j]) for j < n (a constant): the exp-based Sigmoid and SiLU with their
 * exponentials side by side (FN(vexp_group)), the same operations as FN(vact) on every vector. */
static inline MRT_TARGET G_INLINE void FN(vact_group)(FN(vf) *v, const int n, int act, float a0, float a1) {
    if (act == MRT_ACT_GELU) {
        FN(vgelu_group)(v, n);
        return;
    }
    if (act != MRT_ACT_SIGMOID && act != MRT_ACT_SILU) {
        for (int j = 0; j < n; ++j) v[j] = FN(vact)(v[j], act, a0, a1);
        return;
    }
    FN(vf) one = (FN(vf)){0} + 1.0f, e[n];
    for (int j = 0; j < n; ++j) e[j] = -v[j];
    FN(vexp_group)(e, n);
    for (int j = 0; j < n; ++j) v[j] = (act == MRT_ACT_SILU ? v[j] : one) / (one + e[j]);
}

#define G_PACK_AHEAD 4 /* panels ahead that FN(sgemm_pack_b) prefetches each row of B */

/* Pack B[0:kb, 0:nb] into panels of G_NR columns.  Row k starts at
 * b + brow[k] when brow is not NULL (implicit im2col), else at b + k * ldb. */
static MRT_TARGET void FN(sgemm_pack_b)(const float *restrict b, long ldb, const long *brow, int kb, int nb,
                                        float *restrict out) {
    for (int j0 = 0; j0 < nb; j0 += G_NR) {
        int w = nb - j0 < G_NR ? nb - j0 : G_NR;
        float *dst = out + (long)j0 * kb;
        if (w == G_NR) {
            /* each row's floats a few panels ahead fetched now: the rows (a direct 1x1 conv's input planes,
             * far apart) are read 64 bytes at a time in turn, more streams than the hardware follows */
            const int ahead = j0 + G_PACK_AHEAD * G_NR < nb;
            for (int k = 0; k < kb; ++k) {
                const float *src = (brow ? b + brow[k] : b + k * ldb) + j0;
                if (ahead) __builtin_prefetch(src + G_PACK_AHEAD * G_NR, 0, 3);
                FN(vstore)(dst, FN(vload)(src));
                FN(vstore)(dst + MRT_VL, FN(vload)(src + MRT_VL));
                dst += G_NR;
            }
        } else {
            /* a partial panel: each row zeroed whole by two vector stores, then its w floats written over
             * them (a zeroing loop of 16 - w floats became a `rep stos` per row: 7.7 % of the GEMM's time
             * outside its microkernel on 440 -> 440 1x1 layers over 7 x 7 pixels, 3 x 16 + 1 columns) */
            const FN(vf) zero = {0};
            for (int k = 0; k < kb; ++k) {
                const float *src = (brow ? b + brow[k] : b + k * ldb) + j0;
                FN(vstore)(dst, zero);
                FN(vstore)(dst + MRT_VL, zero);
                for (int j = 0; j < w; ++j) dst[j] = src[j];
                dst += G_NR;
            }
        }
    }
}

/* Pack B^T[0:kb, 0:nb] where B is stored (N x K) with row stride ldb:
 * element (k, j) is b[j * ldb + k] (Gemm transB=1 weights, K^T in attention). */
static MRT_TARGET void FN(sgemm_pack_bt)(const float *restrict b, long ldb, int kb, int nb, float *restrict out) {
    for (int j0 = 0; j0 < nb; j0 += G_NR) {
        int w = nb - j0 < G_NR ? nb - j0 : G_NR;
        float *dst = out + (long)j0 * kb;
        int j = 0;
        for (; j < w; ++j) {
            const float *src = b + (long)(j0 + j) * ldb;
            for (int k = 0; k < kb; ++k) dst[(long)k * G_NR + j] = src[k];
        }
        for (; j < G_NR; ++j)
            for (int k = 0; k < kb; ++k) dst[(long)k * G_NR + j] = 0.0f;
    }
}

/* p[0:n] as a vector, lanes n.. zero (n <= MRT_VL): partial loads never read past p + n (on
 * AVX-512 a masked load, which does not touch the masked-off lanes' memory). */
static inline MRT_TARGET G_INLINE FN(vf) FN(vload_n)(const float *p, int n) {
    if (n == MRT_VL) return FN(vload)(p);
#if defined(__x86_64__) && MRT_VL == 16
    return (FN(vf))_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
#else
    float t[MRT_VL] = {0};
    for (int j = 0; j < n; ++j) t[j] = p[j];
    return FN(vload)(t);
#endif
}

/* c[0:n] = v[0:n] (n <= MRT_VL; on AVX-512 one masked store instead of a temporary and a loop of
 * scalar stores: the extended grid's copy-out stores a partial vector at the edges of many output
 * rows; with its division-free walk, a 3 -> 16 stride-2 stem over 112 x 112 outputs -4 %) */
static inline MRT_TARGET G_INLINE void FN(vstore_n)(float *p, FN(vf) v, int n) {
    if (n == MRT_VL) {
        FN(vstore)(p, v);
        return;
    }
#if defined(__x86_64__) && MRT_VL == 16
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
#else
    float t[MRT_VL];
    FN(vstore)(t, v);
    for (int j = 0; j < n; ++j) p[j] = t[j];
#endif
}

/* y[0:n] = act(y[0:n]) in place with the epilogue's vector code (FN(vact), the exp-based Sigmoid and
 * SiLU four vectors at a time), the last vector partial: see FN(act_row_fast), in place of
 * act_row's scalar loop as the compiler vectorises it at 8 lanes (a standalone Gelu over 260K values,
 * Zen 5: 357 -> 254 us; Tanh 213 -> 187; D83).  Returns 0, touching nothing, for an activation
 * FN(vact) does not compute. */
static MRT_TARGET int FN(act_row_vec)(float *restrict y, long n, int act, float a0, float a1) {
    if (!(FN(act_in_registers)(act) || act == MRT_ACT_SIGMOID || act == MRT_ACT_SILU || act == MRT_ACT_GELU ||
          act == MRT_ACT_GELU_TANH || act == MRT_ACT_TANH))
        return 0;
    long i = 0;
    for (; i + 4 * MRT_VL <= n; i += 4 * MRT_VL) {
        FN(vf) v[4];
        for (int j = 0; j < 4; ++j) v[j] = FN(vload)(y + i + j * MRT_VL);
        FN(vact_group)(v, 4, act, a0, a1);
        for (int j = 0; j < 4; ++j) FN(vstore)(y + i + j * MRT_VL, v[j]);
    }
    for (; i < n; i += MRT_VL) {
        const int len = n - i < MRT_VL ? (int)(n - i) : MRT_VL;
        FN(vstore_n)(y + i, FN(vact)(FN(vload_n)(y + i, len), act, a0, a1), len);
    }
    return 1;
}

/* act_row with the vector code for the activations FN(act_row_vec) computes: the row activation of
 * the int8 epilogues and of mrt_activation_f32 on x86-64 (q_act_row; the same function for both, so
 * a standalone activation computes what a fused one does; unused in the baseline copy) */
__attribute__((unused)) static MRT_TARGET void FN(act_row_fast)(float *restrict y, long n, int act, float a0,
                                                                 float a1) {
    if (!FN(act_row_vec)(y, n, act, a0, a1)) FN(act_row)(y, n, act, a0, a1);
}

/* Store one vector of a tile row: c[0:n] = (accumulate ? c : 0) + v, plus
 * bias, residual and a cheap activation when `last` (n <= MRT_VL).  m, n0: the
 * row and first column in C.  An exp-based activation follows on the whole tile
 * (FN(sgemm_act_tile)): inlined here, its code would be repeated for each of the
 * 16 vectors. */
static inline MRT_TARGET G_INLINE void FN(sgemm_store_vec)(const FN(sgemm_args) *g, float *c, FN(vf) v, int n,
                                                            int accumulate, int last, int m, int n0) {
    if (accumulate) v += FN(vload_n)(c, n);
    if (last) {
        if (g->bias_mode == 1)
            v += g->bias[m];
        else if (g->bias_mode == 2)
            v += FN(vload_n)(g->bias + n0, n);
        if (g->res) v += FN(vload_n)(g->res + (long)m * g->ldr + n0, n);
        v = FN(vact_cheap)(v, g->act, g->a0, g->a1);
    }
    FN(vstore_n)(c, v, n);
}

/* Store one row of a tile (nr <= G_NR columns, vectors v0, v1): see FN(sgemm_store_vec). */
static inline MRT_TARGET G_INLINE void FN(sgemm_store_row)(const FN(sgemm_args) *g, float *c, FN(vf) v0, FN(vf) v1,
                                                            int nr, int accumulate, int last, int m, int n0) {
    if (nr == G_NR) { /* the common case, without the partial-vector branches */
        if (accumulate) {
            v0 += FN(vload)(c);
            v1 += FN(vload)(c + MRT_VL);
        }
        if (last) {
            if (g->bias_mode == 1) {
                float bv = g->bias[m];
                v0 += bv;
                v1 += bv;
            } else if (g->bias_mode == 2) {
                v0 += FN(vload)(g->bias + n0);
                v1 += FN(vload)(g->bias + n0 + MRT_VL);
            }
            if (g->res) {
                const float *r = g->res + (long)m * g->ldr + n0;
                v0 += FN(vload)(r);
                v1 += FN(vload)(r + MRT_VL);
            }
            v0 = FN(vact_cheap)(v0, g->act, g->a0, g->a1);
            v1 = FN(vact_cheap)(v1, g->act, g->a0, g->a1);
        }
        FN(vstore)(c, v0);
        FN(vstore)(c + MRT_VL, v1);
        return;
    }
    if (nr <= MRT_VL) {
        FN(sgemm_store_vec)(g, c, v0, nr, accumulate, last, m, n0);
        return;
    }
    FN(sgemm_store_vec)(g, c, v0, MRT_VL, accumulate, last, m, n0);
    FN(sgemm_store_vec)(g, c + MRT_VL, v1, nr - MRT_VL, accumulate, last, m, n0 + MRT_VL);
}

/* FN(sgemm_act_tile) for one activation: inlined with `act` a constant, the switch of FN(vact)
 * is resolved outside the loop. */
static inline MRT_TARGET G_INLINE void FN(sgemm_act_tile_as)(float *c, long ldc, int rows, int cols, const int act,
                                                              float a0, float a1) {
    /* whole vectors four at a time, across rows (a tile row is often two vectors): FN(vact_group) computes
     * them side by side, the same bits as FN(vact) one by one; a row's partial last vector alone */
    float *at[4];
    FN(vf) v[4];
    int k = 0;
    for (int i = 0; i < rows; ++i, c += ldc) {
        int j = 0;
        for (; j + MRT_VL <= cols; j += MRT_VL) {
            at[k] = c + j;
            v[k] = FN(vload)(c + j);
            if (++k == 4) {
                FN(vact_group)(v, 4, act, a0, a1);
                for (k = 0; k < 4; ++k) FN(vstore)(at[k], v[k]);
                k = 0;
            }
        }
        if (j < cols) FN(vstore_n)(c + j, FN(vact)(FN(vload_n)(c + j, cols - j), act, a0, a1), cols - j);
    }
    for (int r = 0; r < k; ++r) FN(vstore)(at[r], FN(vact)(v[r], act, a0, a1));
}

/* The epilogue's (exp-based) activation, in place, on rows x cols floats of C (row stride ldc), still in L1. */
static MRT_TARGET void FN(sgemm_act_tile)(const FN(sgemm_args) *g, float *c, long ldc, int rows, int cols) {
    switch (g->act) {
    case MRT_ACT_SIGMOID:
        FN(sgemm_act_tile_as)(c, ldc, rows, cols, MRT_ACT_SIGMOID, g->a0, g->a1);
        break;
    case MRT_ACT_SILU:
        FN(sgemm_act_tile_as)(c, ldc, rows, cols, MRT_ACT_SILU, g->a0, g->a1);
        break;
    case MRT_ACT_GELU: /* (a transformer's feed-forward: 64x128x512 + Gelu 103 -> 94 us inlined) */
        FN(sgemm_act_tile_as)(c, ldc, rows, cols, MRT_ACT_GELU, g->a0, g->a1);
        break;
    case MRT_ACT_GELU_TANH:
        FN(sgemm_act_tile_as)(c, ldc, rows, cols, MRT_ACT_GELU_TANH, g->a0, g->a1);
        break;
    default:
        FN(sgemm_act_tile_as)(c, ldc, rows, cols, g->act, g->a0, g->a1);
    }
}

/* One k step of the microkernel: acc0[r] (and acc1[r] when `two`) += b0 (b1) * A[r, k]. */
static inline MRT_TARGET G_INLINE void FN(sgemm_ukr_step)(FN(vf) *acc0, FN(vf) *acc1, const float *const *rows,
                                                           int k, FN(vf) b0, FN(vf) b1, const int two) {
#pragma GCC unroll 8
    for (int r = 0; r < G_MR; ++r) {
        float s = rows[r][k];
        acc0[r] += b0 * s;
        if (two) acc1[r] += b1 * s;
    }
}

/* C tile (mr <= G_MR rows, nr columns: <= G_NR when `two`, else <= MRT_VL) from A rows (row
 * stride lda, kb columns from a) and kb rows of G_NR columns of B: a packed panel bp, or
 * (brow not NULL, implicit convolution, whole panels only) row k read in place at
 * bp + brow[k], which skips packing: the 3 x 3 taps of a channel are shifted views of the same
 * plane rows, in cache.  G_MR x 2 (or x 1) vector accumulators in registers (the loops over r
 * are unrolled, so the arrays never touch memory).  A is read in place: packing it per call
 * cost more than it saved (a convolution's weight block is reused by few panels when N is
 * small).  Inlined into the two variants below with `two` a constant. */
static inline MRT_TARGET G_INLINE void FN(sgemm_ukr_body)(const FN(sgemm_args) *g, int kb, const float *a,
                                                           const float *restrict bp, const long *brow, float *c,
                                                           long ldc, int mr, int nr, int accumulate, int last, int m0,
                                                           int n0, const int two) {
    const float *rows[G_MR];
    FN(vf) acc0[G_MR], acc1[G_MR];
#pragma GCC unroll 8
    for (int r = 0; r < G_MR; ++r) {
        rows[r] = a + (r < mr ? r : 0) * g->lda; /* rows past mr repeat row 0 (computed, never stored) */
        acc0[r] = acc1[r] = (FN(vf)){0};
    }
    if (brow) {
        for (int k = 0; k < kb; ++k) {
            const float *row = bp + brow[k];
            FN(sgemm_ukr_step)(acc0, acc1, rows, k, FN(vload)(row), two ? FN(vload)(row + MRT_VL) : acc0[0], two);
        }
    } else {
        for (int k = 0; k < kb; ++k, bp += G_NR)
            FN(sgemm_ukr_step)(acc0, acc1, rows, k, *(const FN(vf) *)bp, two ? *(const FN(vf) *)(bp + MRT_VL) : acc0[0],
                               two);
    }
#pragma GCC unroll 8
    for (int r = 0; r < G_MR; ++r) {
        if (r >= mr) break;
        if (two)
            FN(sgemm_store_row)(g, c + r * ldc, acc0[r], acc1[r], nr, accumulate, last, m0 + r, n0);
        else
            FN(sgemm_store_vec)(g, c + r * ldc, acc0[r], nr, accumulate, last, m0 + r, n0);
    }
    if (last && g->act != MRT_ACT_NONE && !FN(act_in_registers)(g->act)) FN(sgemm_act_tile)(g, c, ldc, mr, nr);
}

/* The microkernel for panels of more than MRT_VL columns (2 vectors per row). */
static MRT_TARGET void FN(sgemm_ukr)(const FN(sgemm_args) *g, int kb, const float *a, const float *restrict bp,
                                     const long *brow, float *c, long ldc, int mr, int nr, int accumulate, int last,
                                     int m0, int n0) {
    FN(sgemm_ukr_body)(g, kb, a, bp, brow, c, ldc, mr, nr, accumulate, last, m0, n0, 1);
}

/* The microkernel for a last panel of at most MRT_VL columns (N = 196 = 6 x 32 + 4): one vector
 * per row, half the multiply-adds of the full one. */
static MRT_TARGET void FN(sgemm_ukr_narrow)(const FN(sgemm_args) *g, int kb, const float *a, const float *restrict bp,
                                            const long *brow, float *c, long ldc, int mr, int nr, int accumulate,
                                            int last, int m0, int n0) {
    FN(sgemm_ukr_body)(g, kb, a, bp, brow, c, ldc, mr, nr, accumulate, last, m0, n0, 0);
}

/* Epilogue of an extended-grid block (implicit-GEMM convolution): the existing columns
 * (ox < ext_ow) of rows m0 .. m0 + mb of the scratch block cb (row stride ldcb, extended
 * columns n0 .. n0 + nb) go to C with bias, residual and activation, computed on whole
 * vectors.  cb rows must be readable MRT_VL floats past nb. */
static inline MRT_TARGET G_INLINE void FN(sgemm_ext_store_as)(const FN(sgemm_args) *g, const float *cb, long ldcb,
                                                               int m0, int mb, int n0, int nb, const int act) {
    const int wq = g->ext_wq, ow = g->ext_ow;
    const int oy0 = n0 / wq, ox0 = n0 % wq; /* where the block starts in the grid (one division) */
    for (int i = 0; i < mb; ++i) {
        const int m = m0 + i;
        const float *src = cb + i * ldcb;
        float *crow = g->C + (long)m * g->ldc;
        const float *rrow = g->res ? g->res + (long)m * g->ldr : NULL;
        /* the block's segments of existing columns, walked from (oy0, ox0): extended column j is
         * (oy, ox), output column col = oy * ow + ox */
        for (int j = n0, oy = oy0, ox = ox0; j < n0 + nb; ++oy, ox = 0) {
            if (ox >= ow) { /* past the row's last output: on to the next row */
                j += wq - ox;
                continue;
            }
            int seg = ow - ox < n0 + nb - j ? ow - ox : n0 + nb - j;
            int col = oy * ow + ox;
            /* A row's last partial vector may be stored whole when the next output row's segment in
             * this block (which starts right after it in C and is written next, by this thread)
             * covers the spilled lanes: one vector store instead of a partial one.  The spilled lanes
             * hold this row's dropped columns, overwritten by that segment. */
            const int next = j + seg + (wq - ow) < n0 + nb ? n0 + nb - (j + seg + (wq - ow)) : 0;
            const int spill_ok = ox + seg == ow && g->res != g->C ? (next < ow ? next : ow) : 0; /* (res may be C) */
            const float *v = src + (j - n0);
            for (int t = 0; t < seg; t += MRT_VL) {
                int n = seg - t < MRT_VL ? seg - t : MRT_VL;
                if (n < MRT_VL && MRT_VL - n <= spill_ok) n = MRT_VL;
                FN(vf) x = FN(vload)(v + t); /* lanes past seg: the next columns (or slack), dropped */
                if (g->bias_mode == 1) x += g->bias[m];
                if (rrow) x += FN(vload_n)(rrow + col + t, n);
                x = FN(vact)(x, act, g->a0, g->a1);
                FN(vstore_n)(crow + col + t, x, n);
            }
            j += seg + (wq - ow); /* the row's dropped columns (past the block's end: the loop ends) */
        }
    }
}

/* FN(sgemm_ext_store_as) with the activation's switch resolved outside its loops. */
static MRT_TARGET void FN(sgemm_ext_store)(const FN(sgemm_args) *g, const float *cb, long ldcb, int m0, int mb, int n0,
                                           int nb) {
    switch (g->act) {
    case MRT_ACT_NONE:
        FN(sgemm_ext_store_as)(g, cb, ldcb, m0, mb, n0, nb, MRT_ACT_NONE);
        break;
    case MRT_ACT_RELU:
        FN(sgemm_ext_store_as)(g, cb, ldcb, m0, mb, n0, nb, MRT_ACT_RELU);
        break;
    case MRT_ACT_SILU:
        FN(sgemm_ext_store_as)(g, cb, ldcb, m0, mb, n0, nb, MRT_ACT_SILU);
        break;
    case MRT_ACT_HARDSWISH:
        FN(sgemm_ext_store_as)(g, cb, ldcb, m0, mb, n0, nb, MRT_ACT_HARDSWISH);
        break;
    default:
        FN(sgemm_ext_store_as)(g, cb, ldcb, m0, mb, n0, nb, g->act);
    }
}

/* A last panel of at most this many columns is summed as dot products (FN(sgemm_dot_tail)). */
#define G_DOT_TAIL 3

/* The lanes of v summed, in lane order. */
static inline MRT_TARGET G_INLINE float FN(hsum)(FN(vf) v) {
    float t = v[0];
#pragma GCC unroll 16
    for (int l = 1; l < MRT_VL; ++l) t += v[l];
    return t;
}

/* out[i * r + j] = sum over k < kb of a[i * lda + k] * bt[j * kb + k], i < rows (<= 12 / r), j < r:
 * dot products with the vector lanes over k, 12 accumulators at most. */
static inline MRT_TARGET G_INLINE void FN(sgemm_dot_rows)(const float *a, long lda, const float *bt, int kb, int rows,
                                                          float *out, const int r) {
    enum { R = 12 };
    FN(vf) acc[R];
#pragma GCC unroll 12
    for (int i = 0; i < R; ++i) acc[i] = (FN(vf)){0};
    int k = 0;
    for (; k + MRT_VL <= kb; k += MRT_VL) {
        FN(vf) b[G_DOT_TAIL];
#pragma GCC unroll 4
        for (int j = 0; j < r; ++j) b[j] = FN(vload)(bt + (long)j * kb + k);
#pragma GCC unroll 12
        for (int i = 0; i < R / r; ++i) {
            if (i >= rows) break;
            const FN(vf) av = FN(vload)(a + i * lda + k);
#pragma GCC unroll 4
            for (int j = 0; j < r; ++j) acc[i * r + j] += av * b[j];
        }
    }
    if (k < kb) {
        FN(vf) b[G_DOT_TAIL];
#pragma GCC unroll 4
        for (int j = 0; j < r; ++j) b[j] = FN(vload_n)(bt + (long)j * kb + k, kb - k);
#pragma GCC unroll 12
        for (int i = 0; i < R / r; ++i) {
            if (i >= rows) break;
            const FN(vf) av = FN(vload_n)(a + i * lda + k, kb - k);
#pragma GCC unroll 4
            for (int j = 0; j < r; ++j) acc[i * r + j] += av * b[j];
        }
    }
    /* (bounds known at compile time: the accumulators stay in registers) */
#pragma GCC unroll 12
    for (int i = 0; i < R / r; ++i) {
        if (i >= rows) break;
#pragma GCC unroll 4
        for (int j = 0; j < r; ++j) out[i * r + j] = FN(hsum)(acc[i * r + j]);
    }
}

/* FN(sgemm_dot_rows) for one group of rows of FN(sgemm_dot_tail): a whole row tile (G_MR rows; 4 for 3
 * columns) with its row count a constant, so that the loop over rows has no test per row and k (it had
 * one each, in the hottest loop of the tail); other counts through the general loop. */
static inline MRT_TARGET G_INLINE void FN(sgemm_dot_group)(const float *a, long lda, const float *bt, int kb, int rows,
                                                           float *out, const int r) {
    const int whole = r == 3 ? 4 : G_MR;
    if (rows == whole)
        FN(sgemm_dot_rows)(a, lda, bt, kb, whole, out, r);
    else
        FN(sgemm_dot_rows)(a, lda, bt, kb, rows, out, r);
}

/* The last panel of a tile, nr <= G_DOT_TAIL columns, as dot products: each row of A against each
 * column of B (bt: those columns transposed, kb floats each), stored with the tile's epilogue
 * (FN(sgemm_store_vec)).  The microkernel would spend one broadcast and multiply-add per row and k
 * on a vector of which nr lanes count (a 7 x 7 output is 3 x 16 + 1 columns: its last one cost 20 %
 * of the layer).  Measured on AVX2, 960 -> 160 over N columns: 48 0.205 ms, 49 0.246 -> 0.225, 50
 * 0.248 -> 0.228, 51 -> 0.234; 4 columns were slower than the microkernel (0.249 against 0.244).
 * The sums are in another order than the microkernel's (k in MRT_VL interleaved partial sums),
 * hence FN(sgemm_args).dot_tail. */
static MRT_TARGET void FN(sgemm_dot_tail)(const FN(sgemm_args) *g, int kb, const float *a, const float *bt, float *c,
                                          long ldc, int mr, int nr, int accumulate, int last, int m0, int n0) {
    const int per = 12 / nr;
    for (int i0 = 0; i0 < mr; i0 += per) {
        const int rows = mr - i0 < per ? mr - i0 : per;
        float sums[12];
        switch (nr) {
        case 1: FN(sgemm_dot_group)(a + i0 * g->lda, g->lda, bt, kb, rows, sums, 1); break;
        case 2: FN(sgemm_dot_group)(a + i0 * g->lda, g->lda, bt, kb, rows, sums, 2); break;
        default: FN(sgemm_dot_group)(a + i0 * g->lda, g->lda, bt, kb, rows, sums, 3); break;
        }
        for (int i = 0; i < rows; ++i) {
            FN(vf) v = {0};
            for (int j = 0; j < nr; ++j) v[j] = sums[i * nr + j];
            FN(sgemm_store_vec)(g, c + (long)(i0 + i) * ldc, v, nr, accumulate, last, m0 + i0 + i, n0);
        }
    }
    if (last && g->act != MRT_ACT_NONE && !FN(act_in_registers)(g->act)) FN(sgemm_act_tile)(g, c, ldc, mr, nr);
}

/* Prefetch part `part` of `parts` of A's rows (rows x kb floats from a, row stride lda) into L2.
 * A (a layer's weights) is read in place, G_MR rows side by side, each only kb floats long (K = 160:
 * 10 cache lines): too short for the hardware's stream prefetchers to follow, so with the weights
 * cold (every layer of a model reads its own from DRAM) the microkernel waited on each line.
 * Fetching the next row tile while the block's panels run over this one (its lines spread over
 * the panels) hides that.  Measured on AVX2, 1x1 layers over 7 x 7 pixels with their weights cold
 * (one of many weight arrays in turn, as in a model): 160 -> 960 0.35 -> 0.25 ms, 320 -> 1280 0.73 ->
 * 0.64, 440 -> 440 0.40 -> 0.36; 960 -> 320 unchanged, 960 -> 160 3 % slower (K blocks of 240). */
static inline MRT_TARGET void FN(sgemm_prefetch_a)(const float *a, long lda, int rows, int kb, int part, int parts) {
    const int lines = (kb + 15) / 16, total = rows * lines;
    const int lo = (int)((long)total * part / parts), hi = (int)((long)total * (part + 1) / parts);
    if (lo >= hi) return;
    /* line i of the tile is line i % lines of row i / lines: one division for the first, then counters
     * (not a division per line) */
    int row = lo / lines, line = lo % lines;
    const float *r = a + (long)row * lda;
    for (int i = lo; i < hi; ++i) {
        __builtin_prefetch(r + line * 16, 0, 2);
        if (++line == lines) {
            line = 0;
            r += lda;
        }
    }
}

static MRT_TARGET void FN(sgemm_task)(void *ctx, long begin, long end) {
    const FN(sgemm_args) *g0 = (const FN(sgemm_args) *)ctx;
    FN(sgemm_args) gb = *g0;
    const FN(sgemm_args) *g = &gb;
    long cur = -1;
    const long ldcb = g->nc + G_NR;
    const int ext = g->ext_wq > 0;
    /* packed B block, then (extended grid only) the C scratch block: mc rows of nc + G_NR floats
     * (the slack of each row lets the epilogue work in whole vectors) */
    float *pack = mrt_pack_buffer(((size_t)g->kc * g->nc + (ext ? (size_t)g->mc * ldcb + G_NR : 0)) * sizeof(float));
    if (!pack) return;
    float *cblock = pack + (size_t)g->kc * g->nc;
    const long mblocks = g0->tiles / g->nblocks; /* (row blocks per matrix) */
    for (long item = begin; item < end; ++item) {
        long bi = item / g0->tiles, t = item % g0->tiles;
        if (bi != cur) { /* this matrix of the batch */
            cur = bi;
            gb.A = g0->A + bi * g0->sa;
            gb.B = g0->B + bi * g0->sb;
            gb.C = g0->C + bi * g0->sc;
            gb.res = g0->res ? g0->res + bi * g0->sr : NULL;
        }
        /* column (pixel) block major: the threads' contiguous shares of the tiles are then columns, for a
         * convolution the pixels that the layers around it split the same way (kernels.c, pool_range) */
        int jb = (int)(t / mblocks), ib = (int)(t % mblocks);
        int n0 = jb * g->nc, nb = g->N - n0 < g->nc ? g->N - n0 : g->nc;
        int m0 = ib * g->mc, mb = g->M - m0 < g->mc ? g->M - m0 : g->mc;
        for (int p0 = 0; p0 < g->K; p0 += g->kc) {
            int kb = g->K - p0 < g->kc ? g->K - p0 : g->kc;
            int last = p0 + kb >= g->K;
            /* implicit convolution: whole panels read B in place, and a last panel of exactly one
             * vector (the one-vector microkernel reads no further); only a partial last one is packed */
            const int packed_from = !g->b_in_place ? 0 : nb % G_NR == MRT_VL ? nb : nb / G_NR * G_NR;
            /* B packed once (a constant weight): the panels of this block at their place in it */
            const float *bpanels = g->bpack ? g->bpack + (long)p0 * g->bpack_ld + (long)n0 * kb : NULL;
            if (!bpanels) {
                if (g->transb)
                    FN(sgemm_pack_bt)(g->B + (long)n0 * g->ldb + p0, g->ldb, kb, nb, pack);
                else if (g->brow)
                    FN(sgemm_pack_b)(g->B + n0 + packed_from, 0, g->brow + p0, kb, nb - packed_from, pack);
                else
                    FN(sgemm_pack_b)(g->B + (long)p0 * g->ldb + n0, g->ldb, NULL, kb, nb, pack);
            }
            /* Each row tile sweeps the block's panels: C is written row after row, G_MR streams,
             * instead of a panel's column of tiles down all mb rows (mb streams of 64 bytes each,
             * far apart), and the A tile (G_MR x kb) stays in L1 while the packed block streams from
             * L2 (the other order read all mb x kb of A once per panel).  Measured on a shared AVX2
             * host, 1x1 layers over 112 x 112 pixels (K = 16-32): 16 -> 96 3.26 -> 1.40 ms, 16 -> 64
             * 1.43 -> 0.67, 32 -> 48 1.95 -> 1.27; 3 -> 64 stride-2 stem over 111 x 111 outputs 2.90
             * -> 1.53; 1x1 layers of K = 96-1152 over 7 x 7 - 56 x 56 pixels 2-10 % faster; plain
             * products of K = 512-1536 10-24 % (512 x 512 x 784 25.5 -> 29.5 GMAC/s, OpenBLAS 32);
             * 3x3 layers unchanged.  The same sums either way. */
            const int npanels = (nb + G_NR - 1) / G_NR;
            /* a last panel of a few columns summed as dot products: its columns transposed */
            const int tail = nb % G_NR, tail_j0 = nb - tail;
            /* (not for one row: FN(sgemv_pb_task) sums in the microkernel's order, sgemm_pb = sgemm) */
            const int dot =
                g->dot_tail && !ext && g->M > 1 && tail > 0 && tail <= G_DOT_TAIL && tail_j0 >= packed_from;
            float bt[G_DOT_TAIL * (G_KC * 5 / 4 + 1)];
            if (dot) {
                const float *tp = (bpanels ? bpanels : pack) + (long)(tail_j0 - packed_from) * kb;
                for (int j = 0; j < tail; ++j)
                    for (int k = 0; k < kb; ++k) bt[j * kb + k] = tp[(long)k * G_NR + j];
            }
            for (int i0 = 0; i0 < mb; i0 += G_MR) {
                int mr = mb - i0 < G_MR ? mb - i0 : G_MR;
                int m = m0 + i0;
                const float *arows = g->A + (long)m * g->lda + p0;
                /* the next row tile's A, fetched while this one runs (see FN(sgemm_prefetch_a)) */
                const int next_rows = mb - i0 - G_MR < G_MR ? mb - i0 - G_MR : G_MR;
                for (int j0 = 0, pi = 0; j0 < nb; j0 += G_NR, ++pi) {
                    int nr = nb - j0 < G_NR ? nb - j0 : G_NR;
                    if (next_rows > 0)
                        FN(sgemm_prefetch_a)(arows + G_MR * g->lda, g->lda, next_rows, kb, pi, npanels);
                    const int direct = j0 < packed_from;
                    const float *panel = direct ? g->B + n0 + j0
                                         : (bpanels ? bpanels : pack) + (long)(j0 - packed_from) * kb;
                    const long *brow = direct ? g->brow + p0 : NULL;
                    float *c = ext ? cblock + i0 * ldcb + j0 : g->C + m * g->ldc + n0 + j0;
                    long ldc = ext ? ldcb : g->ldc;
                    if (dot && j0 == tail_j0)
                        FN(sgemm_dot_tail)(g, kb, arows, bt, c, ldc, mr, nr, p0 > 0, last, m, n0 + j0);
                    else if (nr > MRT_VL)
                        FN(sgemm_ukr)(g, kb, arows, panel, brow, c, ldc, mr, nr, p0 > 0, last && !ext, m, n0 + j0);
                    else
                        FN(sgemm_ukr_narrow)(g, kb, arows, panel, brow, c, ldc, mr, nr, p0 > 0, last && !ext, m,
                                             n0 + j0);
                }
            }
        }
        if (ext && g->K > 0) FN(sgemm_ext_store)(g, cblock, ldcb, m0, mb, n0, nb);
        if (g->K == 0) { /* empty sum: C = epilogue(0) (never with an extended grid: a convolution has K > 0) */
            for (int i = 0; i < mb; ++i) {
                float *c = g->C + (long)(m0 + i) * g->ldc + n0;
                for (int j = 0; j < nb; ++j) c[j] = 0.0f;
                for (int j0 = 0; j0 < nb; j0 += G_NR) {
                    FN(vf) zz = {0};
                    int nr = nb - j0 < G_NR ? nb - j0 : G_NR;
                    FN(sgemm_store_row)(g, c + j0, zz, zz, nr, 1, 1, m0 + i, n0 + j0);
                }
                if (g->act != MRT_ACT_NONE && !FN(act_in_registers)(g->act)) FN(sgemm_act_tile)(g, c, 0, 1, nb);
            }
        }
    }
}

/* Depth of the K blocks for a sum over K: equal blocks of about G_KC (288 = 256 + 32 would store
 * and reload every tile of C for a 32-deep remainder); up to 5/4 G_KC stays one block (its B panel
 * still fits L1).  Each block is summed from zero and added to the previous blocks' total, so this
 * rule fixes every output's rounding: FN(conv_cv) follows it too. */
static int FN(sgemm_kc)(int K) {
    int kblocks = K > G_KC * 5 / 4 ? (K + G_KC - 1) / G_KC : 1;
    int kc = (K + kblocks - 1) / kblocks;
    return kc > 0 ? kc : 1;
}

/* The longest a thread works when `parts` threads claim the items of a grid of nblocks x mblocks
 * tiles (panels_per x rows_per units of work each, the last column and row of tiles smaller) the
 * way mrt_parallel_for hands them out: chunks of items, in item order, each to the thread that is
 * free first.  `pack` is the work of packing a tile's B (once per tile, whatever its rows). */
static long FN(sgemm_makespan)(int panels, int rowtiles, int panels_per, int rows_per, int parts, long pack) {
    const int nblocks = (panels + panels_per - 1) / panels_per, mblocks = (rowtiles + rows_per - 1) / rows_per;
    const long n = (long)nblocks * mblocks, chunks = mrt_chunks(n, parts);
    long load[MRT_MAX_THREADS] = {0};
    for (long c = 0; c < chunks; ++c) {
        long w = 0;
        for (long t = mrt_chunk_begin(n, chunks, c); t < mrt_chunk_begin(n, chunks, c + 1); ++t) {
            const int jb = (int)(t % nblocks), ib = (int)(t / nblocks);
            const int np = panels - jb * panels_per < panels_per ? panels - jb * panels_per : panels_per;
            const int nr = rowtiles - ib * rows_per < rows_per ? rowtiles - ib * rows_per : rows_per;
            w += (long)np * nr + np * pack;
        }
        int best = 0;
        for (int p = 1; p < parts; ++p)
            if (load[p] < load[best]) best = p;
        load[best] += w;
    }
    long most = 0;
    for (int p = 0; p < parts; ++p)
        if (load[p] > most) most = load[p];
    return most;
}

#define G_SEEN 32 /* geometries whose blocking FN(sgemm_run) remembers, per thread */

/* Choose the blocking of g (M, N, K set) for `batch` matrices and run it on up to nthreads threads. */
static void FN(sgemm_run)(FN(sgemm_args) *g, int batch, int nthreads) {
    const int M = g->M, N = g->N, K = g->K;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > MRT_MAX_THREADS) nthreads = MRT_MAX_THREADS;
    /* Threads per matrix: a batch of at least `nthreads` matrices is split by matrix alone, in
     * column blocks of G_NC (a multiple of G_NR) and whole matrices of rows. */
    const int per_mat = (nthreads + batch - 1) / batch;
    int nc = G_NC, mc = M > 0 ? M : 1;
    /* at one thread, column blocks of up to G_PACK_FLOATS packed floats (wider than G_NC when K < 128;
     * FN(sgemm_task) sweeps a block's panels with each row tile) */
    if (K > 0 && per_mat <= 1) {
        int want = G_PACK_FLOATS / K / G_NR * G_NR;
        const int ncol = (N + G_NR - 1) / G_NR * G_NR;
        if (want > ncol) want = ncol;
        if (want > nc) nc = want;
    }
    if (per_mat > 1 && M > 0 && N > 0) {
        /* the choice below takes about a microsecond (measured 1.5% of MobileNet at 2 threads);
         * a model's layers ask for the same few geometries every run, so it is remembered */
        static __thread struct { int M, N, parts, pack, nc, mc; } seen[G_SEEN];
        static __thread int seen_next;
        const int pack_key = g->bpack ? 0 : 1;
        int hit = -1;
        for (int i = 0; i < G_SEEN; ++i)
            if (seen[i].M == M && seen[i].N == N && seen[i].parts == per_mat && seen[i].pack == pack_key) hit = i;
        if (hit >= 0) {
            nc = seen[hit].nc;
            mc = seen[hit].mc;
        } else {
            /* Several threads on one matrix: the grid of (column block, row block) tiles, in whole
             * panels of G_NR columns and microkernel tiles of G_MR rows, whose claimed chunks keep
             * the busiest thread shortest (an uneven split cost 64 -> 128 channels over 28 x 28
             * pixels 1.5x instead of 1.9x of its 1-thread time: blocks of 256, 256, 256 and 16
             * columns).  Packing a block of B costs about one row tile per panel; blocks of more
             * than G_NC columns are never made. */
            const int panels = (N + G_NR - 1) / G_NR, rowtiles = (M + G_MR - 1) / G_MR;
            const long pack = g->bpack ? 0 : 1;
            const int min_blocks = (N + G_NC - 1) / G_NC;
            long best = -1;
            /* (a few dozen candidates at 2 threads; at most 8 x 8) */
            const int spread = per_mat < 4 ? 2 * per_mat : 8;
            for (int nbk = min_blocks; nbk <= panels && nbk < min_blocks + spread; ++nbk) {
                const int panels_per = (panels + nbk - 1) / nbk;
                for (int mbk = 1; mbk <= rowtiles && mbk <= spread; ++mbk) {
                    const int rows_per = (rowtiles + mbk - 1) / mbk;
                    const long span = FN(sgemm_makespan)(panels, rowtiles, panels_per, rows_per, per_mat, pack);
                    if (best < 0 || span < best) {
                        best = span;
                        nc = panels_per * G_NR;
                        mc = rows_per * G_MR;
                    }
                }
            }
            const int slot = seen_next++ % G_SEEN;
            seen[slot].M = M; seen[slot].N = N; seen[slot].parts = per_mat; seen[slot].pack = pack_key;
            seen[slot].nc = nc; seen[slot].mc = mc;
        }
        if (mc > M) mc = M;
    }
    const int nblocks = (N + nc - 1) / nc;
    const int mblocks = (M + mc - 1) / mc;
    g->kc = FN(sgemm_kc)(K);
    g->nc = nc; g->mc = mc; g->nblocks = nblocks;
    g->tiles = (long)nblocks * mblocks;
    /* a thread must get at least ~0.5M multiply-adds (~5 us) to pay for waking it */
    mrt_parallel_for(g->tiles * batch, (long)mc * nc * (K > 0 ? K : 1) / 16, nthreads, FN(sgemm_task), g);
}

/* The GEMMs of FN(sgemm) and FN(sgemm_pb): B (row stride ldb, batch stride sb, transposed with
 * transb) packed per tile, or bpack (FN(sgemm_pack_b_all), one matrix) when not NULL. */
static void FN(sgemm_with)(int batch, int M, int N, int K, const float *A, long lda, long sa, const float *B, long ldb,
                           long sb, int transb, const float *bpack, float *C, long ldc, long sc, const float *bias,
                           int bias_mode, const float *res, long ldr, long sr, int act, float a0, float a1,
                           int nthreads, int dot_tail) {
    if (M <= 0 || N <= 0 || batch <= 0) return;
    FN(sgemm_args) g;
    g.A = A; g.B = B; g.C = C; g.bias = bias; g.res = res; g.brow = NULL; g.b_in_place = 0;
    g.bpack = K > 0 ? bpack : NULL; g.bpack_ld = (N + G_NR - 1) / G_NR * G_NR;
    g.lda = lda; g.ldb = ldb; g.ldc = ldc; g.ldr = ldr;
    g.sa = sa; g.sb = sb; g.sc = sc; g.sr = sr; g.transb = transb;
    g.M = M; g.N = N; g.K = K; g.bias_mode = bias ? bias_mode : 0; g.act = act; g.a0 = a0; g.a1 = a1;
    g.ext_ow = 0; g.ext_wq = 0;
    g.dot_tail = dot_tail;
    FN(sgemm_run)(&g, batch, nthreads);
}

static void FN(sgemm)(int batch, int M, int N, int K, const float *A, long lda, long sa, const float *B, long ldb,
                      long sb, int transb, float *C, long ldc, long sc, const float *bias, int bias_mode,
                      const float *res, long ldr, long sr, int act, float a0, float a1, int nthreads, int dot_tail) {
    FN(sgemm_with)(batch, M, N, K, A, lda, sa, B, ldb, sb, transb, NULL, C, ldc, sc, bias, bias_mode, res, ldr, sr,
                   act, a0, a1, nthreads, dot_tail);
}

/* B of a product with a constant right operand (MatMul / Gemm weights), packed once: for each k
 * block of FN(sgemm_kc)(K) (the blocks FN(sgemm_run) uses), the panels of G_NR columns of all N
 * columns, exactly as FN(sgemm_task) packs them per tile (last panel zero-padded).  Block p0 starts
 * at p0 * ld floats, ld = N rounded up to G_NR; panel j at + j * kb.  The layout depends on the ISA
 * (G_NR): callers key the packed copy by it. */
static long FN(sgemm_packed_b_floats)(int K, int N) {
    return (long)K * ((N + G_NR - 1) / G_NR * G_NR);
}

static void FN(sgemm_pack_b_all)(const float *B, long ldb, int transb, int K, int N, float *out) {
    const int kc = FN(sgemm_kc)(K);
    const long ld = (N + G_NR - 1) / G_NR * G_NR;
    for (int p0 = 0; p0 < K; p0 += kc) {
        int kb = K - p0 < kc ? K - p0 : kc;
        if (transb)
            FN(sgemm_pack_bt)(B + p0, ldb, kb, N, out + (long)p0 * ld);
        else
            FN(sgemm_pack_b)(B + (long)p0 * ldb, ldb, NULL, kb, N, out + (long)p0 * ld);
    }
}

/* Panels of B a one-row product reads at once (FN(sgemv_pb_task)). */
#define G_GEMV_PANELS 8
/* B of more bytes than this (a core's L2 on the x86 hosts) comes from memory in a model (FN(sgemm_pb)) */
#define G_GEMV_COLD_BYTES (2L * 1024 * 1024)

/* One row of A times B packed by FN(sgemm_pack_b_all), the items [begin, end) of G_GEMV_PANELS
 * panels each: the same sums in the same order as the GEMM's tiles (each k block summed from zero
 * and stored through FN(sgemm_store_row), which adds the previous blocks' total and, after the last,
 * the epilogue), so the results are identical.  With one row a tile makes two chains of multiply-adds
 * that wait on each other's latency; several panels at once make independent chains, and the row
 * then streams B at the memory's pace. */
static MRT_TARGET void FN(sgemv_pb_task)(void *ctx, long begin, long end) {
    const FN(sgemm_args) *g = (const FN(sgemm_args) *)ctx;
    const int K = g->K, N = g->N, kc = g->kc;
    for (long item = begin; item < end; ++item) {
        const int n0 = (int)item * G_GEMV_PANELS * G_NR;
        const int panels = (N - n0 + G_NR - 1) / G_NR < G_GEMV_PANELS ? (N - n0 + G_NR - 1) / G_NR : G_GEMV_PANELS;
        for (int p0 = 0; p0 < K; p0 += kc) {
            const int kb = K - p0 < kc ? K - p0 : kc;
            const float *a = g->A + p0;
            const float *bp = g->bpack + (long)p0 * g->bpack_ld + (long)n0 * kb; /* panel q at + q * G_NR * kb */
            FN(vf) acc[2 * G_GEMV_PANELS] = {0};
            /* whole groups with a constant panel count (the loop unrolled, acc kept in registers);
             * the last, partial group with a variable one */
            if (panels == G_GEMV_PANELS) {
                for (int k = 0; k < kb; ++k) {
                    const float s = a[k];
#pragma GCC unroll 8
                    for (int q = 0; q < G_GEMV_PANELS; ++q) {
                        const float *b = bp + (long)q * G_NR * kb + (long)k * G_NR;
                        acc[2 * q] += FN(vload)(b) * s; /* (as FN(sgemm_ukr_step): the same rounding) */
                        acc[2 * q + 1] += FN(vload)(b + MRT_VL) * s;
                    }
                }
            } else {
                for (int k = 0; k < kb; ++k) {
                    const float s = a[k];
                    for (int q = 0; q < panels; ++q) {
                        const float *b = bp + (long)q * G_NR * kb + (long)k * G_NR;
                        acc[2 * q] += FN(vload)(b) * s;
                        acc[2 * q + 1] += FN(vload)(b + MRT_VL) * s;
                    }
                }
            }
            const int last = p0 + kb >= K;
            for (int q = 0; q < panels; ++q) {
                const int n = n0 + q * G_NR, nr = N - n < G_NR ? N - n : G_NR;
                FN(sgemm_store_row)(g, g->C + n, acc[2 * q], acc[2 * q + 1], nr, p0 > 0, last, 0, n);
            }
        }
        if (g->act != MRT_ACT_NONE && !FN(act_in_registers)(g->act)) {
            const int cols = N - n0 < panels * G_NR ? N - n0 : panels * G_NR;
            FN(sgemm_act_tile)(g, g->C + n0, 0, 1, cols);
        }
    }
}

/* FN(sgemm) of one matrix with B packed by FN(sgemm_pack_b_all): the same sums in the same order
 * (identical results), without packing B per call.  One row of A goes to FN(sgemv_pb_task). */
static void FN(sgemm_pb)(int M, int N, int K, const float *A, long lda, const float *bpack, float *C, long ldc,
                         const float *bias, int bias_mode, const float *res, long ldr, int act, float a0, float a1,
                         int nthreads) {
    if (M == 1 && N > 0 && K > 0) {
        FN(sgemm_args) g;
        g.A = A; g.B = NULL; g.C = C; g.bias = bias; g.res = res; g.brow = NULL; g.b_in_place = 0;
        g.bpack = bpack; g.bpack_ld = (N + G_NR - 1) / G_NR * G_NR;
        g.lda = lda; g.ldb = 0; g.ldc = ldc; g.ldr = ldr; g.sa = g.sb = g.sc = g.sr = 0; g.transb = 0;
        g.M = 1; g.N = N; g.K = K; g.bias_mode = bias ? bias_mode : 0; g.act = act; g.a0 = a0; g.a1 = a1;
        g.ext_ow = 0; g.ext_wq = 0; g.dot_tail = 0;
        g.kc = FN(sgemm_kc)(K);
        const long items = (N + G_GEMV_PANELS * G_NR - 1) / (G_GEMV_PANELS * G_NR);
        /* Each multiply-add streams one float of B (a GEMM's reuse it from registers): counted as 4
         * GEMM units while B may be in cache, so a 512 x 1000 classifier (2 MB of B, 20 us warm) takes
         * 2 threads (20 -> 11 us); as 16 when B is larger than G_GEMV_COLD_BYTES and comes from memory
         * (MobileNetV2's 1280 x 1000, 5 MB, ~0.45 ms at 1 thread in a model): worth waking a sleeping
         * worker for, which its 1.3 M multiply-adds at 4 units were not (MRT_WAKE_MIN_WORK: run node by
         * node, the classifier ran on one thread after the pooling had let the worker sleep, 462 ->
         * 449 us at 2 threads).  (A thread pays from ~0.5M GEMM multiply-adds, as in FN(sgemm_run).) */
        const long unit_div = (long)K * N * (long)sizeof(float) > G_GEMV_COLD_BYTES ? 1 : 4;
        mrt_parallel_for(items, (long)G_GEMV_PANELS * G_NR * K / unit_div, nthreads, FN(sgemv_pb_task), &g);
        return;
    }
    FN(sgemm_with)(1, M, N, K, A, lda, 0, NULL, 0, 0, 0, bpack, C, ldc, 0, bias, bias_mode, res, ldr, 0, act, a0, a1,
                   nthreads, 1);
}

/* Exp-based activations (SiLU, Sigmoid, ...) of an output larger than this go through the
 * scratch block (FN(sgemm_ext_store)) instead of FN(sgemm_act_tile) on C, measured: 1x1 32 -> 32
 * channels over 80 x 80 pixels with SiLU (800 KB) -7.5 %, 16 -> 32 over 160 x 160 -21 %, but
 * outputs of 400 KB (64 channels over 40 x 40) 2-3 % slower.  Presumably C's lines are not in
 * cache when a large output's tile is stored, and writing each once, activated, beats writing the
 * sums and rewriting them. */
#define G_CONV_ACT_SCRATCH_BYTES (512L * 1024)
/* Depth up to which an extended grid whose rows end in a part-filled panel still runs as one GEMM
 * per output row (below): the rows' last panels take the one-vector microkernel, whose
 * broadcasts per multiply-add cost more as K grows (3 -> 16 stems, K = 27, 112 x 112 outputs:
 * -20 %; 16 -> 16 3x3 over 80 x 80, K = 144: +2 %). */
#define G_CONV_ROW_GEMM_MAX_K 64

/* Implicit-GEMM convolution of one image and group (see the top of this file):
 *   C[m, oy * ext_ow + ox] = act(sum_k A[m, k] B[brow[k] + oy * ext_wq + ox] + bias[m] + res[m, ...])
 * for ox < ext_ow, oy < rows; A row stride lda = K; C and res rows of ldc floats.  b_in_place:
 * read B in place (rows of a 3 x 3 kernel overlap, in cache) rather than packing it (packing is
 * better for 1x1 kernels of many K rows, far apart: the caller decides, mrt_conv_band).
 * Three ways, the same sums (same K blocks, same k order) whichever runs:
 *   - one GEMM per output row (a batch: B, C and res advance by a row each) when the row's
 *     columns rounded up to whole vectors are no more than the extended grid's and its panels are
 *     whole or K is small (G_CONV_ROW_GEMM_MAX_K): every tile is stored straight into C with its
 *     fused epilogue, with no scratch block and no copy (a 3 -> 16 stem over 112 x 112 outputs:
 *     113 extended columns per row, 112 computed this way; -20 % with Clip);
 *   - the extended grid through the scratch block (dropped columns);
 *   - no dropped columns (1x1 / stride 1): C written directly, or through the scratch block for
 *     an exp-based activation of a large output (G_CONV_ACT_SCRATCH_BYTES). */
static void FN(sgemm_conv)(int M, int rows, int K, const float *A, const float *B, const long *brow, int b_in_place,
                           int ext_ow, int ext_wq, float *C, long ldc, const float *bias, const float *res, int act,
                           float a0, float a1, int nthreads, int dot_tail) {
    if (M <= 0 || rows <= 0 || K <= 0) return;
    FN(sgemm_args) g;
    g.A = A; g.B = B; g.C = C; g.bias = bias; g.res = res; g.brow = brow; g.b_in_place = b_in_place;
    g.bpack = NULL; g.bpack_ld = 0;
    g.lda = K; g.ldb = 0; g.ldc = ldc; g.ldr = ldc;
    g.sa = 0; g.sb = 0; g.sc = 0; g.sr = 0; g.transb = 0;
    g.M = M; g.K = K; g.bias_mode = bias ? 1 : 0;
    g.act = act; g.a0 = a0; g.a1 = a1;
    const int exp_act = act != MRT_ACT_NONE && !FN(act_in_registers)(act);
    const int row_gemms = ext_wq > ext_ow && (ext_ow + MRT_VL - 1) / MRT_VL * MRT_VL <= ext_wq &&
                          (ext_ow % G_NR == 0 || K <= G_CONV_ROW_GEMM_MAX_K);
    int batch = 1;
    if (row_gemms) {
        batch = rows;
        g.N = ext_ow;
        g.sb = ext_wq; g.sc = ext_ow; g.sr = ext_ow;
    } else {
        g.N = (rows - 1) * ext_wq + ext_ow;
    }
    /* the scratch block: an extended grid of ext_wq columns per row, or one row of all N columns */
    g.ext_ow = g.ext_wq = 0;
    g.dot_tail = dot_tail && !row_gemms;
    if (!row_gemms && ext_wq > ext_ow) {
        g.ext_ow = ext_ow;
        g.ext_wq = ext_wq;
    } else if (exp_act && (long)M * rows * ext_ow * (long)sizeof(float) > G_CONV_ACT_SCRATCH_BYTES) {
        g.ext_ow = g.ext_wq = g.N;
    }
    FN(sgemm_run)(&g, batch, nthreads);
}

/* ------------------------------------------------------------------ channel-vector convolution
 *
 * FN(conv_cv): an implicit-GEMM convolution with the vector lanes over output channels instead of
 * output columns.  A tile is G_CV_NP output pixels x G_NR output channels: every multiply-add
 * broadcasts one input element (input value of one pixel and tap) against a vector of weights.
 * Why: with pixels as lanes, a small output wastes lanes (a 10 x 10 output is an extended grid of
 * 9 x 12 + 10 = 118 columns, computed as 4 panels of 32 = 128 for 100 outputs); with channels as
 * lanes no column is dropped or padded (the channel counts are multiples of G_NR or close), the
 * pixels of a tile are any G_CV_NP consecutive pixels of a rectangle, and the weights are one
 * contiguous stream.
 *
 * The output is given as rectangles of pixels (mrt_cv_region, kernels.c), each with its own
 * implicit B: pixel (r, j) of a region reads row k of B at B + brow[k] + r * in_row + j * in_col
 * and is written at out + r * out_row + j of each channel's row of C.  kernels.c passes the stride-
 * phase planes of FN(sgemm_conv) as one region (in_row = the plane width, in_col = 1), or the image
 * itself for the pixels whose taps are all inside it (in_row = stride * width, in_col = stride)
 * plus small zero-padded windows of the input for the border pixels (D58).
 *
 * The weights come pre-packed once per weight array (FN(conv_cv_pack_w)): per group, panels of
 * G_NR output channels, each K rows of G_NR contiguous floats (channels past the group's count
 * zero).  Every output is the same float sum as in FN(sgemm_conv) / FN(sgemm): K cut into the
 * blocks of FN(sgemm_kc), each summed from zero in k order (one multiply-add per k) and added to
 * the previous blocks' total, then + bias, + residual, activation; so results do not depend on
 * which path, which region or how many threads computed them.  The tile is transposed into C's
 * channel rows after the epilogue.
 */

/* pixels per tile: 12 x 2 accumulators of AVX-512's 32 registers (+ 2 weight vectors and a
 * broadcast); 6 x 2 of the 16 of SSE2/AVX2 (NEON keeps 6: not measured on arm64) */
#if MRT_VL == 16
#define G_CV_NP 12
/* pixels of a run's last tile when one pixel would be left after it (49 = 3 x 12 + 13 instead of
 * 4 x 12 + 1 computed as 4): 26 accumulators + 2 weight vectors + a broadcast, 29 of the 32 registers;
 * SSE2/AVX2 have no room for it (G_CV_NP) */
#define G_CV_NP_TAIL 13
#else
#define G_CV_NP 6
#define G_CV_NP_TAIL 6
#endif
#define G_CV_CHUNK 16 /* at most this many pixel tiles per work item (their totals: 24 KB on AVX-512) */
#define G_CV_CHANNEL_SPLIT_PIXELS 2048 /* threads split smaller planes by channel panels (FN(conv_cv)) */
/* Channel panels whose weights fit this many bytes share each pass over the pixels (FN(conv_cv_task)):
 * a run's input is read by all of them while in cache, instead of one pass over the whole input per
 * panel (8 of 16 channels each for 128 -> 128 on AVX2).  Measured on AVX2, 3x3 layers: 64 -> 64 @56x56
 * 4.16 -> 3.74 ms, 128 -> 128 @28x28 3.59 -> 3.53, 512 -> 512 @7x7 5.03 -> 4.83, others +-1 %. */
#define G_CV_GROUP_BYTES (512L * 1024)

typedef struct {
    const float *wp;   /* the group's packed weights: panels of K x G_NR floats */
    const mrt_cv_region *regions;
    int nregions;
    /* items of region r: first_item[r] .. first_item[r + 1], (channel panel, run of chunk_tiles[r]
     * pixel tiles) with chunks[r] runs per panel */
    long first_item[MRT_CV_MAX_REGIONS + 1];
    int chunks[MRT_CV_MAX_REGIONS], chunk_tiles[MRT_CV_MAX_REGIONS];
    float *C;          /* output rows of ldc floats: channel m, position o at C[m * ldc + o] */
    const float *bias, *res; /* bias[m] or NULL; residual laid out as C, or NULL */
    long ldc;
    int M, K, kc, act;
    int panels, panel_group; /* channel panels, and how many of them share a pass over the pixels */
    float a0, a1;
} FN(conv_cv_args);

/* Pack w (group * mg rows of K floats) into the panels described above; out holds
 * FN(conv_cv_packed_floats)(group, mg, K) floats. */
static long FN(conv_cv_packed_floats)(int group, int mg, int K) {
    return (long)group * ((mg + G_NR - 1) / G_NR) * K * G_NR;
}
static void FN(conv_cv_pack_w)(const float *w, int group, int mg, int K, float *out) {
    for (int g = 0; g < group; ++g)
        for (int q0 = 0; q0 < mg; q0 += G_NR)
            for (int k = 0; k < K; ++k, out += G_NR)
                for (int j = 0; j < G_NR; ++j)
                    out[j] = q0 + j < mg ? w[((long)g * mg + q0 + j) * K + k] : 0.0f;
}

/* C[m0 + j][pos[i]] = t[i * G_NR + j] (j < nch, i < np): the pixel-major tile into C's channel
 * rows, in 4 x 4 blocks transposed in registers (a float at a time cost 6-14% of a layer of depth
 * 288-128) when the block's 4 pixels are consecutive in C (within one output row of the region),
 * the other blocks and the edges a float at a time. */
static inline MRT_TARGET G_INLINE void FN(conv_cv_transpose_out)(const FN(conv_cv_args) *g, const float *t, int m0,
                                                                  int nch, const long *pos, int np) {
    const long ldc = g->ldc;
    const int nch4 = nch & ~3, np4 = np & ~3;
    for (int j = 0; j < nch4; j += 4) {
        float *c = g->C + (long)(m0 + j) * ldc;
        for (int i = 0; i < np4; i += 4) {
            const float *ti = t + i * G_NR + j;
            if (pos[i + 3] - pos[i] != 3) {
                for (int r = 0; r < 4; ++r)
                    for (int e = 0; e < 4; ++e) c[r * ldc + pos[i + e]] = ti[e * G_NR + r];
                continue;
            }
            float *ci = c + pos[i];
            const FN(v4f) a = *(const FN(v4fu) *)ti, b = *(const FN(v4fu) *)(ti + G_NR);
            const FN(v4f) d = *(const FN(v4fu) *)(ti + 2 * G_NR), e = *(const FN(v4fu) *)(ti + 3 * G_NR);
            const FN(v4f) ab01 = G_SHUF4(a, b, 0, 4, 1, 5), ab23 = G_SHUF4(a, b, 2, 6, 3, 7);
            const FN(v4f) de01 = G_SHUF4(d, e, 0, 4, 1, 5), de23 = G_SHUF4(d, e, 2, 6, 3, 7);
            *(FN(v4fu) *)ci = G_SHUF4(ab01, de01, 0, 1, 4, 5);
            *(FN(v4fu) *)(ci + ldc) = G_SHUF4(ab01, de01, 2, 3, 6, 7);
            *(FN(v4fu) *)(ci + 2 * ldc) = G_SHUF4(ab23, de23, 0, 1, 4, 5);
            *(FN(v4fu) *)(ci + 3 * ldc) = G_SHUF4(ab23, de23, 2, 3, 6, 7);
        }
        for (int r = 0; r < 4; ++r)
            for (int i = np4; i < np; ++i) c[r * ldc + pos[i]] = t[i * G_NR + j + r];
    }
    for (int j = nch4; j < nch; ++j) {
        float *crow = g->C + (long)(m0 + j) * ldc;
        for (int i = 0; i < np; ++i) crow[pos[i]] = t[i * G_NR + j];
    }
}

#if MRT_VL == 16
/* 8- and 4-float pieces of a 16-float vector, for stores of 12 floats */
typedef float FN(v8fu) __attribute__((vector_size(32), aligned(4)));
typedef float FN(v8f) __attribute__((vector_size(32)));
#if defined(__clang__)
#define G_SHUF16(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define G_SHUF16(a, b, ...) __builtin_shuffle(a, b, (FN(vi)){__VA_ARGS__})
#endif

/* ch[c] lanes 0..11 = px[i] lane c for i < 12 (lanes 12..15 of ch[c] repeat other values): 12 pixel
 * vectors of 16 channels into 16 channel rows of 12 pixels, in 48 two-vector shuffles (pairs
 * interleaved, then 4 x 4 blocks within each 128-bit lane, then the 128-bit lanes gathered). */
static inline MRT_TARGET G_INLINE void FN(conv_cv_transpose12)(const FN(vf) *px, FN(vf) *ch) {
    FN(vf) lo[6], hi[6], u[3][4];
    for (int a = 0; a < 6; ++a) { /* lo: px[2a], px[2a + 1] lanes 4q, 4q + 1 interleaved; hi: 4q + 2, 4q + 3 */
        lo[a] = G_SHUF16(px[2 * a], px[2 * a + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
        hi[a] = G_SHUF16(px[2 * a], px[2 * a + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
    }
    for (int b = 0; b < 3; ++b) { /* u[b][j], 128-bit lane q: channel 4q + j of pixels 4b .. 4b + 3 */
        u[b][0] = G_SHUF16(lo[2 * b], lo[2 * b + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
        u[b][1] = G_SHUF16(lo[2 * b], lo[2 * b + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
        u[b][2] = G_SHUF16(hi[2 * b], hi[2 * b + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
        u[b][3] = G_SHUF16(hi[2 * b], hi[2 * b + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
    for (int j = 0; j < 4; ++j) { /* channel 4q + j: lane q of u[0][j], u[1][j], u[2][j] */
        const FN(vf) q01 = G_SHUF16(u[0][j], u[1][j], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
        const FN(vf) q23 = G_SHUF16(u[0][j], u[1][j], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
        ch[j] = G_SHUF16(q01, u[2][j], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 16, 17, 18, 19);
        ch[4 + j] = G_SHUF16(q01, u[2][j], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 20, 21, 22, 23);
        ch[8 + j] = G_SHUF16(q23, u[2][j], 0, 1, 2, 3, 8, 9, 10, 11, 24, 25, 26, 27, 24, 25, 26, 27);
        ch[12 + j] = G_SHUF16(q23, u[2][j], 4, 5, 6, 7, 12, 13, 14, 15, 28, 29, 30, 31, 28, 29, 30, 31);
    }
}
#undef G_SHUF16

/* The epilogue of a whole tile (G_CV_NP = 12 pixels) whose pixels are consecutive in C (from
 * position pos0 of each channel row), 16 channels at a time: + bias and the activation on the
 * pixel vectors (no residual: 12 vectors), the tile transposed in registers
 * (FN(conv_cv_transpose12)), + residual and the activation on the channel rows when there is a
 * residual (it is laid out as C), and 12 floats stored per channel row.  The same operations on
 * every output as FN(conv_cv_store_as): (sum + bias) + residual, then the activation. */
static inline MRT_TARGET G_INLINE void FN(conv_cv_store_rows)(const FN(conv_cv_args) *g, const float *t, int m0,
                                                              int nch, long pos0, const int act) {
    for (int c0 = 0; c0 < nch; c0 += MRT_VL) {
        const int nc = nch - c0 < MRT_VL ? nch - c0 : MRT_VL;
        FN(vf) px[G_CV_NP], ch[MRT_VL];
        const FN(vf) bias = g->bias ? FN(vload_n)(g->bias + m0 + c0, nc) : (FN(vf)){0};
        for (int i = 0; i < G_CV_NP; ++i) {
            px[i] = FN(vload)(t + i * G_NR + c0);
            if (!g->res && g->bias) px[i] += bias;
        }
        if (!g->res) /* in two groups of 6 vectors (12 side by side run out of registers) */
            for (int i = 0; i < G_CV_NP; i += G_CV_NP / 2) FN(vact_group)(px + i, G_CV_NP / 2, act, g->a0, g->a1);
        FN(conv_cv_transpose12)(px, ch);
        if (g->res) {
            for (int c = 0; c < nc; ++c) {
                const float *res = g->res + (long)(m0 + c0 + c) * g->ldc + pos0;
                FN(vf) rv;
                /* 16 floats from res stay inside the residual (the next channel row, or this one's end) */
                if (m0 + c0 + c + 1 < g->M || pos0 + MRT_VL <= g->ldc)
                    rv = FN(vload)(res);
                else
                    rv = FN(vload_n)(res, G_CV_NP);
                if (g->bias) ch[c] += g->bias[m0 + c0 + c];
                ch[c] += rv;
            }
            for (int c = 0; c < MRT_VL; c += MRT_VL / 4) FN(vact_group)(ch + c, MRT_VL / 4, act, g->a0, g->a1);
        }
        for (int c = 0; c < nc; ++c) {
            float *out = g->C + (long)(m0 + c0 + c) * g->ldc + pos0;
            const FN(vf) x = ch[c];
            *(FN(v8fu) *)out = (FN(v8f)){x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]};
            *(FN(v4fu) *)(out + 8) = (FN(v4f)){x[8], x[9], x[10], x[11]};
        }
    }
}
#endif

/* The epilogue of one tile, t[i * G_NR + j] = sum for pixel p0 + i of region r, channel m0 + j
 * (i < np, j < nch): + bias, + residual, activation `act` (a constant when inlined), then
 * transposed into C. */
static inline MRT_TARGET G_INLINE void FN(conv_cv_store_as)(const FN(conv_cv_args) *g, const mrt_cv_region *r,
                                                             float *t, int m0, int nch, int p0, int np,
                                                             const int act) {
    long pos[G_CV_NP]; /* the pixels' positions in a channel's row of C (one division, then steps) */
    int row = p0 / r->cols, col = p0 % r->cols;
    for (int i = 0; i < np; ++i) {
        pos[i] = r->out + (long)row * r->out_row + col;
        if (++col == r->cols) {
            col = 0;
            ++row;
        }
    }
#if MRT_VL == 16
    if (np == G_CV_NP && pos[np - 1] - pos[0] == np - 1) {
        FN(conv_cv_store_rows)(g, t, m0, nch, pos[0], act);
        return;
    }
#endif
    FN(vf) bias[2] = {{0}, {0}};
    if (g->bias) {
        bias[0] = FN(vload_n)(g->bias + m0, nch < MRT_VL ? nch : MRT_VL);
        if (nch > MRT_VL) bias[1] = FN(vload_n)(g->bias + m0 + MRT_VL, nch - MRT_VL);
    }
    const int vecs = nch > MRT_VL ? 2 : 1;
    for (int i = 0; i < np; ++i) {
        float *ti = t + i * G_NR;
        if (g->res) { /* the residual of pixel p0 + i, one float per channel row */
            float res[G_NR] = {0};
            for (int j = 0; j < nch; ++j) res[j] = g->res[(long)(m0 + j) * g->ldc + pos[i]];
            for (int v = 0; v < vecs; ++v) {
                FN(vf) x = FN(vload)(ti + v * MRT_VL);
                if (g->bias) x += bias[v];
                FN(vstore)(ti + v * MRT_VL, FN(vact)(x + FN(vload)(res + v * MRT_VL), act, g->a0, g->a1));
            }
        } else {
            for (int v = 0; v < vecs; ++v) {
                FN(vf) x = FN(vload)(ti + v * MRT_VL);
                if (g->bias) x += bias[v];
                FN(vstore)(ti + v * MRT_VL, FN(vact)(x, act, g->a0, g->a1));
            }
        }
    }
    FN(conv_cv_transpose_out)(g, t, m0, nch, pos, np);
}

/* FN(conv_cv_store_as) with the activation's switch resolved outside its loops. */
static MRT_TARGET void FN(conv_cv_store)(const FN(conv_cv_args) *g, const mrt_cv_region *r, float *t, int m0,
                                         int nch, int p0, int np) {
    switch (g->act) {
    case MRT_ACT_NONE:
        FN(conv_cv_store_as)(g, r, t, m0, nch, p0, np, MRT_ACT_NONE);
        break;
    case MRT_ACT_RELU:
        FN(conv_cv_store_as)(g, r, t, m0, nch, p0, np, MRT_ACT_RELU);
        break;
    case MRT_ACT_CLIP: /* Relu6 */
        FN(conv_cv_store_as)(g, r, t, m0, nch, p0, np, MRT_ACT_CLIP);
        break;
    case MRT_ACT_SILU:
        FN(conv_cv_store_as)(g, r, t, m0, nch, p0, np, MRT_ACT_SILU);
        break;
    case MRT_ACT_HARDSWISH:
        FN(conv_cv_store_as)(g, r, t, m0, nch, p0, np, MRT_ACT_HARDSWISH);
        break;
    default:
        FN(conv_cv_store_as)(g, r, t, m0, nch, p0, np, g->act);
    }
}

/* One K block (k0 .. k0 + kb) of one tile: pixels p0 .. p0 + np of region r, channels of the
 * panel wp (2 vectors when `two`, else 1), computed for `npc` pixels (a constant: G_CV_NP, or
 * fewer for the last tile of a run, np <= npc).  The block's sums go to t (pixel-major, G_NR
 * floats per pixel): stored for the first block, added to the total for the next ones
 * (FN(sgemm_task)'s order).  The loops over i are unrolled, so the accumulators stay in
 * registers.  `step` (a constant) says how the pixels find their input:
 *   0: pixel i at its own offset off[i] (in registers, or spilled: 12 of them and the loop's
 *      pointers are more than x86-64's 15 general registers);
 *   1 or 2: the tile's npc pixels lie in one row of the region (or the region's rows follow each
 *      other in its input) with in_col == step, so pixel i reads the tap's row at i * step: a
 *      fixed displacement from one pointer per k (FN(conv_cv_tile_step) decides). */
static inline MRT_TARGET G_INLINE void FN(conv_cv_block_body)(const mrt_cv_region *r, const float *wp, int k0, int kb,
                                                               int add, int p0, int np, float *t, const float *pf,
                                                               const int npc, const int two, const int step) {
    long off[G_CV_NP_TAIL];
#pragma GCC unroll 16
    for (int i = 0; i < npc; ++i) {
        const int p = p0 + (i < np ? i : 0); /* pixels past np repeat pixel p0 (computed, never stored) */
        off[i] = (long)(p / r->cols) * r->in_row + (long)(p % r->cols) * r->in_col;
    }
    const float *w = wp + (long)k0 * G_NR;
    const long *brow = r->brow + k0;
    const float *B = step ? r->B + off[0] : r->B;
    FN(vf) acc0[G_CV_NP_TAIL], acc1[G_CV_NP_TAIL];
#pragma GCC unroll 16
    for (int i = 0; i < npc; ++i) acc0[i] = acc1[i] = (FN(vf)){0};
    for (int k = 0; k < kb; ++k, w += G_NR) {
        const float *row = B + brow[k];
        if (pf) { /* the next K block's weights, row k (G_NR floats), on their way while this block runs */
            __builtin_prefetch(pf + (long)k * G_NR);
            __builtin_prefetch(pf + (long)k * G_NR + G_NR - 1);
        }
        const FN(vf) w0 = FN(vload)(w), w1 = two ? FN(vload)(w + MRT_VL) : w0;
#pragma GCC unroll 16
        for (int i = 0; i < npc; ++i) {
            const float s = step ? row[i * step] : row[off[i]];
            acc0[i] += w0 * s;
            if (two) acc1[i] += w1 * s;
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < npc; ++i) {
        float *ti = t + i * G_NR;
        if (add) { /* (the block that starts a sum has no total before it) */
            acc0[i] += FN(vload)(ti);
            if (two) acc1[i] += FN(vload)(ti + MRT_VL);
        }
        FN(vstore)(ti, acc0[i]);
        if (two) FN(vstore)(ti + MRT_VL, acc1[i]);
    }
}

/* FN(conv_cv_block_body) for `two` and `step` (constants), with the tile's pixel count rounded up
 * to one of three sizes (G_CV_NP, 2/3 or 1/3 of it): a 10 x 10 output is 8 tiles of 12 and one of 4
 * pixels. */
static inline MRT_TARGET G_INLINE void FN(conv_cv_block_sized)(const mrt_cv_region *r, const float *wp, int k0,
                                                                int kb, int add, int p0, int np, float *t,
                                                                const float *pf, const int two, const int step) {
#if G_CV_NP_TAIL > G_CV_NP
    if (np > G_CV_NP)
        FN(conv_cv_block_body)(r, wp, k0, kb, add, p0, np, t, pf, G_CV_NP_TAIL, two, step);
    else
#endif
    if (np > G_CV_NP * 2 / 3)
        FN(conv_cv_block_body)(r, wp, k0, kb, add, p0, np, t, pf, G_CV_NP, two, step);
    else if (np > G_CV_NP / 3)
        FN(conv_cv_block_body)(r, wp, k0, kb, add, p0, np, t, pf, G_CV_NP * 2 / 3, two, step);
    else
        FN(conv_cv_block_body)(r, wp, k0, kb, add, p0, np, t, pf, G_CV_NP / 3, two, step);
}

/* The `step` of FN(conv_cv_block_body) for the tile p0 .. p0 + np of region r: 1 or 2 when its
 * pixels are in one input row at that column step (or the region's rows are contiguous there) and
 * np is one of the three tile sizes (no repeated pixel past np: those would read past the tile),
 * else 0. */
static inline int FN(conv_cv_tile_step)(const mrt_cv_region *r, int p0, int np) {
    if (np != G_CV_NP_TAIL && np != G_CV_NP && np != G_CV_NP * 2 / 3 && np != G_CV_NP / 3) return 0;
    if (r->in_col != 1 && r->in_col != 2) return 0;
    if (p0 % r->cols + np > r->cols && r->in_row != (long)r->cols * r->in_col) return 0;
    return (int)r->in_col;
}

/* One K block of a tile (FN(conv_cv_block_body)) on a panel of two vectors of channels (`two`) or
 * at most one (16 on AVX-512: half the multiply-adds), with its step resolved. */
static inline MRT_TARGET G_INLINE void FN(conv_cv_block_as)(const mrt_cv_region *r, const float *wp, int k0, int kb,
                                                             int add, int p0, int np, float *t, const float *pf,
                                                             const int two) {
    switch (FN(conv_cv_tile_step)(r, p0, np)) {
    case 1:
        FN(conv_cv_block_sized)(r, wp, k0, kb, add, p0, np, t, pf, two, 1);
        break;
    case 2:
        FN(conv_cv_block_sized)(r, wp, k0, kb, add, p0, np, t, pf, two, 2);
        break;
    default:
        FN(conv_cv_block_sized)(r, wp, k0, kb, add, p0, np, t, pf, two, 0);
    }
}

static MRT_TARGET void FN(conv_cv_block)(const mrt_cv_region *r, const float *wp, int k0, int kb, int add, int p0,
                                         int np, float *t, const float *pf) {
    FN(conv_cv_block_as)(r, wp, k0, kb, add, p0, np, t, pf, 1);
}

static MRT_TARGET void FN(conv_cv_block_narrow)(const mrt_cv_region *r, const float *wp, int k0, int kb, int add,
                                                int p0, int np, float *t, const float *pf) {
    FN(conv_cv_block_as)(r, wp, k0, kb, add, p0, np, t, pf, 0);
}

/* K block [k0, k0 + kb) of panel q (nch channels) over the pixels [pbeg, pend) of region r into t (G_NR
 * floats a pixel, from pbeg), added to the total there when `add`: tiles of G_CV_NP pixels, the last one
 * fewer, or G_CV_NP_TAIL (the one pixel after it included; FN(conv_cv_store_run) takes them as tiles of
 * G_CV_NP).  The first tile prefetches pf (the next block's weights) when not NULL. */
static inline MRT_TARGET void FN(conv_cv_run_block)(const mrt_cv_region *r, const float *wp, int nch, int k0, int kb,
                                                    int add, int pbeg, int pend, float *t, const float *pf) {
    for (int p0 = pbeg, np; p0 < pend; p0 += np, pf = NULL) {
        np = pend - p0 == G_CV_NP_TAIL ? G_CV_NP_TAIL : pend - p0 < G_CV_NP ? pend - p0 : G_CV_NP;
        if (nch > MRT_VL)
            FN(conv_cv_block)(r, wp, k0, kb, add, p0, np, t + (long)(p0 - pbeg) * G_NR, pf);
        else
            FN(conv_cv_block_narrow)(r, wp, k0, kb, add, p0, np, t + (long)(p0 - pbeg) * G_NR, pf);
    }
}

/* The epilogue and store (FN(conv_cv_store)) of the sums t of channels m0 .. m0 + nch over the pixels
 * [pbeg, pend) of region r, by tiles of G_CV_NP. */
static inline MRT_TARGET void FN(conv_cv_store_run)(const FN(conv_cv_args) *g, const mrt_cv_region *r, float *t,
                                                    int m0, int nch, int pbeg, int pend) {
    for (int p0 = pbeg; p0 < pend; p0 += G_CV_NP)
        FN(conv_cv_store)(g, r, t + (long)(p0 - pbeg) * G_NR, m0, nch, p0, pend - p0 < G_CV_NP ? pend - p0 : G_CV_NP);
}

/* Items: per region, (channel panel, run of up to G_CV_CHUNK consecutive pixel tiles),
 * panel-major.  Within an item the K blocks are the outer loop, so a block of the panel's weights
 * (kc x G_NR floats, <= 40 KB) stays in L1 for all the run's tiles; the run's totals wait in
 * `totals`. */
static MRT_TARGET void FN(conv_cv_task)(void *ctx, long begin, long end) {
    const FN(conv_cv_args) *g = (const FN(conv_cv_args) *)ctx;
    float totals[G_CV_CHUNK * G_CV_NP * G_NR];
    int ri = 0;
    for (long item = begin; item < end; ++item) {
        while (item >= g->first_item[ri + 1]) ++ri;
        const mrt_cv_region *r = &g->regions[ri];
        const long local = item - g->first_item[ri];
        /* panels in groups of panel_group: (group, run, panel of the group), so that a run's input
         * is read by every panel of the group while it is in cache, and the group's weights stay in
         * L2 across the runs */
        const int pg = g->panel_group, chunks = g->chunks[ri];
        const int grp = (int)(local / ((long)pg * chunks)), rem = (int)(local % ((long)pg * chunks));
        const int in_grp = g->panels - grp * pg < pg ? g->panels - grp * pg : pg;
        const int q = grp * pg + rem % in_grp, chunk = rem / in_grp;
        const int m0 = q * G_NR, nch = g->M - m0 < G_NR ? g->M - m0 : G_NR;
        const float *wp = g->wp + (long)q * g->K * G_NR;
        const int npix = r->rows * r->cols, run = g->chunk_tiles[ri] * G_CV_NP, pbeg = chunk * run;
        const int pend = npix - pbeg < run ? npix : pbeg + run;
        for (int k0 = 0; k0 < g->K; k0 += g->kc) {
            const int kb = g->K - k0 < g->kc ? g->K - k0 : g->kc;
            /* the first tile of a K block prefetches the next block's weights (when a whole one follows), a
             * row per k: in a model a layer's weights come from memory (CRNN's 512 -> 512 2 x 2 over 31
             * pixels waited for each block of its 4 MB; SqueezeNet's 512 -> 1000 classifier, K = 512 in two
             * blocks, for its 2 MB), D154 */
            const float *pf = k0 + kb + kb <= g->K ? wp + (long)(k0 + kb) * G_NR : NULL;
            FN(conv_cv_run_block)(r, wp, nch, k0, kb, k0 > 0, pbeg, pend, totals, pf);
        }
        FN(conv_cv_store_run)(g, r, totals, m0, nch, pbeg, pend);
    }
}

/* Small planes with threads, their sum split along K (FN(conv_cv_split_k)): the sum of each K block of
 * FN(sgemm_kc), from zero, per panel and pixel, into partials + (block * panels + panel) * npix_pad * G_NR
 * floats; then the combine job adds the blocks' sums in block order and stores as FN(conv_cv_task) does. */
typedef struct {
    const FN(conv_cv_args) *g;
    float *partials;
    long npix_pad;
    int nkb, npix;
} FN(conv_cv_split_args);

/* Items: (K block, panel), block-major: the block's sum over every pixel of the panel (one region). */
static MRT_TARGET void FN(conv_cv_block_task)(void *ctx, long begin, long end) {
    const FN(conv_cv_split_args) *s = (const FN(conv_cv_split_args) *)ctx;
    const FN(conv_cv_args) *g = s->g;
    const mrt_cv_region *r = &g->regions[0];
    for (long item = begin; item < end; ++item) {
        const int q = (int)(item % g->panels), k0 = (int)(item / g->panels) * g->kc;
        const int kb = g->K - k0 < g->kc ? g->K - k0 : g->kc;
        const int nch = g->M - q * G_NR < G_NR ? g->M - q * G_NR : G_NR;
        FN(conv_cv_run_block)(r, g->wp + (long)q * g->K * G_NR, nch, k0, kb, 0, 0, s->npix,
                              s->partials + item * s->npix_pad * G_NR, NULL);
    }
}

/* Items: (run of G_CV_CHUNK pixel tiles, panel), run-major: the blocks' sums added in block order into
 * the first block's (((S0 + S1) + S2) ..., the total FN(conv_cv_task) forms: each block summed from zero
 * and added to the previous total, and IEEE addition commutes), then the epilogue and the store of
 * FN(conv_cv_task). */
static MRT_TARGET void FN(conv_cv_combine_task)(void *ctx, long begin, long end) {
    const FN(conv_cv_split_args) *s = (const FN(conv_cv_split_args) *)ctx;
    const FN(conv_cv_args) *g = s->g;
    const mrt_cv_region *r = &g->regions[0];
    const int run = G_CV_CHUNK * G_CV_NP;
    const long block_floats = (long)g->panels * s->npix_pad * G_NR;
    for (long item = begin; item < end; ++item) {
        const int q = (int)(item % g->panels), pbeg = (int)(item / g->panels) * run;
        const int pend = s->npix - pbeg < run ? s->npix : pbeg + run;
        const int m0 = q * G_NR, nch = g->M - m0 < G_NR ? g->M - m0 : G_NR;
        float *t = s->partials + ((long)q * s->npix_pad + pbeg) * G_NR;
        const long n = (long)(pend - pbeg) * G_NR;
        for (int b = 1; b < s->nkb; ++b) {
            const float *u = t + b * block_floats;
            for (long i = 0; i < n; i += MRT_VL) FN(vstore)(t + i, FN(vload)(t + i) + FN(vload)(u + i));
        }
        FN(conv_cv_store_run)(g, r, t, m0, nch, pbeg, pend);
    }
}

/* FN(conv_cv) of one region below G_CV_CHANNEL_SPLIT_PIXELS pixels with threads, K cut at its blocks
 * (FN(conv_cv_block_task)) instead of the channel panels: for a 1 x 1 conv a block is a range of the
 * input's channels, and the threads' ranges (items block-major, dealt in order) are mostly the
 * channels the depthwise layer before a projection computed on them (it splits small planes by
 * channels), where a split by panels read all of them, half from the other core's cache, and left
 * them shared there, so that the next write to that memory waited for the other core too.  Returns 0
 * when the sums' scratch cannot be had (the caller then splits by panels). */
static int FN(conv_cv_split_k)(FN(conv_cv_args) *g, int nkb, int nthreads) {
    const mrt_cv_region *r = &g->regions[0];
    FN(conv_cv_split_args) s;
    s.g = g; s.nkb = nkb; s.npix = r->rows * r->cols;
    /* (+ G_CV_NP_TAIL: a tile's stores cover its rounded-up pixel count; whole vectors for the combine) */
    s.npix_pad = s.npix + G_CV_NP_TAIL;
    const long sums = (long)nkb * g->panels;
    s.partials = (float *)mrt_partials_buffer((size_t)sums * s.npix_pad * G_NR * sizeof(float)); /* (64-byte aligned) */
    if (!s.partials) return 0;
    mrt_parallel_for(sums, (long)G_NR * s.npix * g->kc / 16, nthreads, FN(conv_cv_block_task), &s);
    const long runs = (s.npix + G_CV_CHUNK * G_CV_NP - 1) / (G_CV_CHUNK * G_CV_NP);
    mrt_parallel_for(runs * g->panels, (long)G_CV_CHUNK * G_CV_NP * G_NR * nkb, nthreads, FN(conv_cv_combine_task), &s);
    return 1;
}

/* act(conv + bias + res) of M output channels (C and res rows of ldc floats) over the pixels of
 * the `nregions` regions (at most MRT_CV_MAX_REGIONS, none empty), one job for them all, on the
 * weights packed by FN(conv_cv_pack_w) (wp: this group's panels). */
static void FN(conv_cv)(int M, int K, const float *wp, const mrt_cv_region *regions, int nregions, float *C, long ldc,
                        const float *bias, const float *res, int act, float a0, float a1, int nthreads, int k_split) {
    if (M <= 0 || K <= 0 || nregions <= 0) return;
    FN(conv_cv_args) g;
    g.wp = wp; g.regions = regions; g.nregions = nregions; g.C = C; g.bias = bias; g.res = res; g.ldc = ldc;
    g.M = M; g.K = K; g.kc = FN(sgemm_kc)(K); g.act = act; g.a0 = a0; g.a1 = a1;
    /* runs of tiles per region: as few as G_CV_CHUNK allows, evened out; with threads, for the
     * first region (the largest: the border regions after it are a few small items), the run
     * count (from that up) whose (panel, run) items keep the busiest thread shortest when claimed
     * as mrt_parallel_for does (FN(sgemm_makespan) on the grid of runs x panels, in this item
     * order): 32 -> 32 channels over 40 x 40 pixels made 9 items of one panel, 5 for one thread
     * and 4 for the other (1.65x its 1-thread speed at 2 threads) */
    const long panels = (M + G_NR - 1) / G_NR;
    g.panels = (int)panels;
    if (k_split && nthreads > 1 && nregions == 1 && (long)regions[0].rows * regions[0].cols < G_CV_CHANNEL_SPLIT_PIXELS) {
        /* a 1 x 1 conv (K = the input's channels) of few panels and a few K blocks: split at its blocks
         * (FN(conv_cv_split_k)); with more panels the split by panels reads no more of the other core's
         * cache (SqueezeNet's 512 -> 1000 classifier: 643 -> 678 us split along K; its 3 x 3 64 -> 256
         * layers 175 -> 233) */
        const int nkb = (K + g.kc - 1) / g.kc;
        const int parts = nthreads < MRT_MAX_THREADS ? nthreads : MRT_MAX_THREADS;
        if (nkb >= parts && nkb <= 2 * parts && panels <= 2 * parts && FN(conv_cv_split_k)(&g, nkb, nthreads)) return;
    }
    {
        long pg = G_CV_GROUP_BYTES / ((long)K * G_NR * (long)sizeof(float));
        if (pg < 1) pg = 1;
        if (pg > panels) pg = panels;
        /* with threads, on a plane below G_CV_CHANNEL_SPLIT_PIXELS each thread's share is a range of panels
         * (output channels) over every pixel: the depthwise layer after such a plane splits by channels
         * (DW_BAND_SPLIT_PIXELS), and reads them on the core that wrote them (MobileNetV2's 14 x 14 and 7 x 7
         * expansions on this kernel, D157: 2 threads 3.95 -> 3.83 ms with it) */
        if (nthreads > 1) {
            long pixels = 0;
            for (int ri = 0; ri < nregions; ++ri) pixels += (long)regions[ri].rows * regions[ri].cols;
            const int parts = nthreads < MRT_MAX_THREADS ? nthreads : MRT_MAX_THREADS;
            const long share = (panels + parts - 1) / parts;
            if (pixels < G_CV_CHANNEL_SPLIT_PIXELS && panels >= parts && share < pg) pg = share;
        }
        g.panel_group = (int)pg;
    }
    long items = 0, max_tiles = 1;
    for (int ri = 0; ri < nregions; ++ri) {
        const int tiles = (regions[ri].rows * regions[ri].cols + G_CV_NP - 1) / G_CV_NP;
        int chunks = (tiles + G_CV_CHUNK - 1) / G_CV_CHUNK;
        if (nthreads > 1 && ri == 0) {
            const int parts = nthreads < MRT_MAX_THREADS ? nthreads : MRT_MAX_THREADS;
            const int first = chunks, spread = parts < 4 ? 2 * parts : 8;
            long best = -1;
            for (int c = first; c <= tiles && c <= first + spread; ++c) {
                const int run = (tiles + c - 1) / c;
                const long span = FN(sgemm_makespan)(tiles, (int)panels, run, 1, parts, 0);
                if (best < 0 || span < best) {
                    best = span;
                    chunks = c;
                }
            }
        }
        g.chunk_tiles[ri] = (tiles + chunks - 1) / chunks;
        g.chunks[ri] = (tiles + g.chunk_tiles[ri] - 1) / g.chunk_tiles[ri];
        if (g.chunk_tiles[ri] > max_tiles) max_tiles = g.chunk_tiles[ri];
        g.first_item[ri] = items;
        items += panels * g.chunks[ri];
    }
    g.first_item[nregions] = items;
    mrt_parallel_for(items, max_tiles * G_CV_NP * G_NR * K / 16, nthreads, FN(conv_cv_task), &g);
}

#undef G_CV_NP
#undef G_CV_NP_TAIL
#undef G_CV_CHUNK
#undef G_CV_CHANNEL_SPLIT_PIXELS
#undef G_CV_GROUP_BYTES

/* ------------------------------------------------------------------ matrix-vector products
 *
 * FN(sgemv): C[m, n] = act(sum_k A[m, k] B[k, n] + bias[n]) for a few rows of A (a classifier at
 * batch 1: 1 x 512 times 512 x 1000).  Such a product reads every element of B once per row of A,
 * so it is bound by reading B: nothing is packed (packing would read B and write it again), B is
 * streamed from where it is, and threads split the output columns (numpy's BLAS gemv ran on one
 * thread, D28).  Every output is summed whole by one work item, so the result does not depend on
 * the thread count.  B stored N x K (transb: Gemm's transB weights): each output is the dot
 * product of two contiguous rows, G_GEMV_DOTS columns at a time (that many streams of B and FMA
 * chains), lanes added at the end.  B stored K x N: every k adds A[m, k] times G_GEMV_VECS vectors
 * of row k of B to the outputs.
 */
#define G_GEMV_DOTS 8 /* transb: output columns per work item (a multiple of 4) */
#define G_GEMV_VECS 8 /* not transb: vectors of output columns per work item */

typedef struct {
    const float *A, *B, *bias;
    float *C;
    long lda, ldb, ldc;
    int M, N, K, act;
    float a0, a1;
} FN(sgemv_args);

/* c[0:n] = act(s[0:n] + bias[0:n]) (n <= MRT_VL; bias may be NULL), through one vector. */
static inline MRT_TARGET G_INLINE void FN(sgemv_store)(const FN(sgemv_args) *g, float *c, FN(vf) s,
                                                        const float *bias, int n) {
    if (bias) s += FN(vload_n)(bias, n);
    FN(vstore_n)(c, FN(vact)(s, g->act, g->a0, g->a1), n);
}

/* The 4 sums of 4 vectors' lanes: each vector's lanes added in 4-float pieces, then the 4 x 4
 * transposed and added (a chain of scalar adds per vector cost as much as the products). */
static inline MRT_TARGET G_INLINE FN(v4f) FN(lane_sums4)(const FN(vf) *v) {
    FN(v4f) part[4];
    for (int j = 0; j < 4; ++j) {
        float lanes[MRT_VL];
        FN(vstore)(lanes, v[j]);
        part[j] = *(const FN(v4fu) *)lanes;
        for (int l = 4; l < MRT_VL; l += 4) part[j] += *(const FN(v4fu) *)(lanes + l);
    }
    const FN(v4f) lo01 = G_SHUF4(part[0], part[1], 0, 4, 1, 5), hi01 = G_SHUF4(part[0], part[1], 2, 6, 3, 7);
    const FN(v4f) lo23 = G_SHUF4(part[2], part[3], 0, 4, 1, 5), hi23 = G_SHUF4(part[2], part[3], 2, 6, 3, 7);
    return G_SHUF4(lo01, lo23, 0, 1, 4, 5) + G_SHUF4(lo01, lo23, 2, 3, 6, 7) + G_SHUF4(hi01, hi23, 0, 1, 4, 5) +
           G_SHUF4(hi01, hi23, 2, 3, 6, 7);
}

/* transb: items are blocks of G_GEMV_DOTS output columns (rows of the stored B). */
static MRT_TARGET void FN(sgemv_dot_task)(void *ctx, long begin, long end) {
    const FN(sgemv_args) *g = (const FN(sgemv_args) *)ctx;
    const int K = g->K, kv = K / MRT_VL * MRT_VL;
    for (long item = begin; item < end; ++item) {
        const int n0 = (int)item * G_GEMV_DOTS;
        const int nc = g->N - n0 < G_GEMV_DOTS ? g->N - n0 : G_GEMV_DOTS;
        const float *b[G_GEMV_DOTS];
        for (int j = 0; j < G_GEMV_DOTS; ++j) b[j] = g->B + (long)(n0 + (j < nc ? j : 0)) * g->ldb;
        for (int m = 0; m < g->M; ++m) {
            const float *a = g->A + (long)m * g->lda;
            FN(vf) acc[G_GEMV_DOTS];
#pragma GCC unroll 8
            for (int j = 0; j < G_GEMV_DOTS; ++j) acc[j] = (FN(vf)){0};
            for (int k = 0; k < kv; k += MRT_VL) {
                const FN(vf) av = FN(vload)(a + k);
#pragma GCC unroll 8
                for (int j = 0; j < G_GEMV_DOTS; ++j) acc[j] += av * FN(vload)(b[j] + k);
            }
            if (kv < K) { /* the last K % MRT_VL: zero lanes past the end on both sides */
                const FN(vf) av = FN(vload_n)(a + kv, K - kv);
#pragma GCC unroll 8
                for (int j = 0; j < G_GEMV_DOTS; ++j) acc[j] += av * FN(vload_n)(b[j] + kv, K - kv);
            }
            float sums[G_GEMV_DOTS];
            for (int q = 0; q < G_GEMV_DOTS; q += 4) *(FN(v4fu) *)(sums + q) = FN(lane_sums4)(acc + q);
            for (int j0 = 0; j0 < nc; j0 += MRT_VL) { /* (one store with 16 lanes, two with 4) */
                const int n = nc - j0 < MRT_VL ? nc - j0 : MRT_VL;
                FN(sgemv_store)(g, g->C + (long)m * g->ldc + n0 + j0, FN(vload_n)(sums + j0, n),
                                g->bias ? g->bias + n0 + j0 : NULL, n);
            }
        }
    }
}

/* not transb: items are blocks of G_GEMV_VECS vectors of output columns.  A last block with fewer
 * whole vectors computes its first vector again in the missing ones' place (never stored), so the
 * accumulators stay in registers; the last N % MRT_VL columns take a one-vector pass. */
static MRT_TARGET void FN(sgemv_axpy_task)(void *ctx, long begin, long end) {
    const FN(sgemv_args) *g = (const FN(sgemv_args) *)ctx;
    enum { W = G_GEMV_VECS * MRT_VL };
    for (long item = begin; item < end; ++item) {
        const int n0 = (int)item * W;
        const int nc = g->N - n0 < W ? g->N - n0 : W;
        const int whole = nc / MRT_VL, rest = nc % MRT_VL;
        long col[G_GEMV_VECS];
        for (int v = 0; v < G_GEMV_VECS; ++v) col[v] = n0 + (v < whole ? v : 0) * MRT_VL;
        for (int m = 0; m < g->M; ++m) {
            const float *a = g->A + (long)m * g->lda;
            float *c = g->C + (long)m * g->ldc;
            if (whole) {
                FN(vf) acc[G_GEMV_VECS];
#pragma GCC unroll 8
                for (int v = 0; v < G_GEMV_VECS; ++v) acc[v] = (FN(vf)){0};
                for (int k = 0; k < g->K; ++k) {
                    const float *brow = g->B + (long)k * g->ldb;
                    const float s = a[k];
#pragma GCC unroll 8
                    for (int v = 0; v < G_GEMV_VECS; ++v) acc[v] += s * FN(vload)(brow + col[v]);
                }
#pragma GCC unroll 8
                for (int v = 0; v < G_GEMV_VECS; ++v)
                    if (v < whole) FN(sgemv_store)(g, c + col[v], acc[v], g->bias ? g->bias + col[v] : NULL, MRT_VL);
            }
            if (rest) { /* partial vectors never read past column N */
                const long c0 = n0 + (long)whole * MRT_VL;
                FN(vf) acc = {0};
                for (int k = 0; k < g->K; ++k) acc += a[k] * FN(vload_n)(g->B + (long)k * g->ldb + c0, rest);
                FN(sgemv_store)(g, c + c0, acc, g->bias ? g->bias + c0 : NULL, rest);
            }
        }
    }
}

static void FN(sgemv)(int M, int N, int K, const float *A, long lda, const float *B, long ldb, int transb, float *C,
                      long ldc, const float *bias, int act, float a0, float a1, int nthreads) {
    if (M <= 0 || N <= 0) return;
    FN(sgemv_args) g = {A, B, bias, C, lda, ldb, ldc, M, N, K, act, a0, a1};
    const long cols = transb ? G_GEMV_DOTS : G_GEMV_VECS * MRT_VL;
    mrt_parallel_for((N + cols - 1) / cols, cols * M * (long)K, nthreads,
                     transb ? FN(sgemv_dot_task) : FN(sgemv_axpy_task), &g);
}

#undef G_GEMV_DOTS
#undef G_GEMV_VECS

/* the microkernel's rows per tile, for the kernels compiled after this file (sdpa_impl.h: its query
 * blocks are whole tiles), which G_MR's #undef below hides from */
enum { FN(sgemm_tile_rows) = G_MR };

#undef G_MR
#undef G_NR
#undef G_KC
#undef G_NC
#undef G_PACK_AHEAD
#undef G_PACK_FLOATS
#undef G_SEEN
#undef G_INLINE
#undef G_SHUF4
