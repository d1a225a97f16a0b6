/* minirt native kernels: the C interface seen by cffi (minirt/native/build_native.py).
 *
 * Tensors are NCHW and contiguous, float32 unless a kernel says uint8 / int8.  Every kernel takes the
 * number of threads to use (<= 1: run on the calling thread); work is split
 * over a small pthread pool owned by this library (see kernels.c).
 *
 * One binary runs on any CPU of its architecture: hot loops are compiled
 * once for the baseline ISA and once per extension (x86-64: AVX2+FMA;
 * aarch64: the int8 GEMM with the ARMv8.2 dot product), and
 * the implementation is chosen at run time from the CPU's features.
 */
#ifndef MINIRT_KERNELS_H
#define MINIRT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* CPU feature bits reported by mrt_cpu_features(). */
#define MRT_FEAT_AVX2 1
#define MRT_FEAT_FMA 2
#define MRT_FEAT_NEON 4
#define MRT_FEAT_ASIMDDP 8
#define MRT_FEAT_AVX512F 16
#define MRT_FEAT_AVX512VNNI 32
#define MRT_FEAT_AMX 64 /* AMX-TILE and AMX-INT8 (CPUID), whatever the OS allows */

/* Implementations selectable with mrt_select_isa(). */
#define MRT_ISA_BEST -1
#define MRT_ISA_BASELINE 0
#define MRT_ISA_AVX2 1
#define MRT_ISA_AVX512 2
#define MRT_ISA_NEON 3    /* aarch64: NEON (the float kernels are the baseline code, which is NEON there) */
#define MRT_ISA_DOTPROD 4 /* aarch64 + ARMv8.2 dot product (HWCAP_ASIMDDP): NEON + SDOT int8 GEMM */
/* x86-64: AVX512 is the AVX-512 kernels with the best int8 GEMM microkernel the CPU has (the AMX tiles for
 * the GEMMs they take where the CPU has AMX-INT8 and the OS grants the tiles, Linux 5.16; else VNNI);
 * AVX512_VNNI the same without AMX (the VNNI microkernels alone).  Both report MRT_ISA_AVX512. */
#define MRT_ISA_AVX512_VNNI 5

/* The version of this interface: minirt/native/__init__.py reads it from this file and refuses a
 * compiled module whose mrt_abi_version() (the same macro, compiled in) differs: a stale build. */
#define MRT_ABI_VERSION 39

/* ------------------------------------------------------------------ parameter structs
 *
 * The kernels take their parameters grouped by concept, one struct per concept shared by every
 * kernel that needs it (no entry point takes more than 8 parameters):
 *
 *   mrt_conv_geometry  the window of a convolution, pooling, im2col or tile operation over NCHW
 *   mrt_gemm_shape     the sizes and strides of a (batched) matrix product
 *   mrt_epilogue       what the output stage applies: bias, activation, affine post map
 *   mrt_quant          the int8 side: input / output quantization, int8 weights
 *
 * A struct holds what stays the same over the runs of one prepared call (Python builds it once, in
 * the *_prepare functions of minirt/native/__init__.py); the buffers a run reads and writes (input,
 * residual, output) are parameters of their own.  Every size is validated by the caller (cffi
 * refuses a value that does not fit the field's type). */

/* Activations of the fused epilogues (parameters a0, a1); the names are listed once more, by name
 * only, in minirt/vocabulary.py (ACTIVATIONS[...].native), which reads the values from here. */
typedef enum {
    MRT_ACT_NONE = 0,
    MRT_ACT_RELU = 1,
    MRT_ACT_CLIP = 2,        /* min(max(x, a0), a1) */
    MRT_ACT_LEAKY = 3,       /* x >= 0 ? x : a0 * x */
    MRT_ACT_SIGMOID = 4,
    MRT_ACT_SILU = 5,        /* x * sigmoid(x) */
    MRT_ACT_HARDSIGMOID = 6, /* max(0, min(1, a0 * x + a1)) */
    MRT_ACT_HARDSWISH = 7,   /* x * hardsigmoid(x, 1/6, 1/2) */
    MRT_ACT_GELU = 8,        /* 0.5 x (1 + erf(x / sqrt 2)) */
    MRT_ACT_GELU_TANH = 9,   /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    MRT_ACT_TANH = 10        /* tanh(x) */
} mrt_act;

/* A 2-D window operation over NCHW: input (n, c, h, w), output (n, m, oh, ow).  Padding is
 * implicit: pt / pl are the top / left pads, the bottom / right ones follow from oh / ow.
 * Pooling and im2col read n, c, h, w, the window and oh, ow (n * c planes); m and group are the
 * convolutions'.  The nearest upsampling and the stride == kernel tiles use kh x kw as the tile
 * (factor) and sh = kh, sw = kw. */
typedef struct {
    int n, c, h, w;
    int m, group;
    int kh, kw; /* window */
    int sh, sw; /* strides */
    int dh, dw; /* dilations */
    int pt, pl; /* top / left pads */
    int oh, ow; /* output size */
} mrt_conv_geometry;

/* batch products, all row-major: matrix i is C_i (M x N) = A_i (M x K) B_i (K x N) with
 * A_i = A + i * sa, B_i = B + i * sb, C_i = C + i * sc, res_i = res + i * sr (batch strides in
 * elements, 0 to broadcast); ld* the row strides in elements.  transb: B is stored transposed,
 * (N x K) with row stride ldb, i.e. B[k, n] = B_stored[n * ldb + k].  bias_mode 1: the epilogue's
 * bias is per row (bias[m], conv channels), 2: per column (bias[n], MatMul / Gemm). */
typedef struct {
    int batch, M, N, K;
    long lda, ldb, ldc, ldr;
    long sa, sb, sc, sr;
    int transb;
    int bias_mode;
} mrt_gemm_shape;

/* The output stage: y = post_a * act(acc + bias + residual) + post_b.  bias may be NULL (where it
 * is indexed: the kernel's comment; per output channel for the convolutions); post_a / post_b are
 * read by the int8 convolutions only (1 and 0: no post map). */
typedef struct {
    const float *bias;
    mrt_act act;
    float a0, a1;
    float post_a, post_b;
} mrt_epilogue;

/* The int8 side of a kernel.  Input: float (quantized inside with x_scale / x_zero, or per channel
 * with x_scales / x_zeros) or, with x_u8, uint8 already quantized with that zero point.  Weights:
 * packed_w (mrt_qgemm_pack_w) for the GEMM-based kernels, w (the int8 values held as floats) for the
 * depthwise one; scale per output channel = x_scale * w_scale.  Output: float or, with y_u8, uint8
 * clamp(rint(y / y_scale) + y_zero, 0, 255), per tensor (y_scale, y_zero) or per output channel
 * (y_scales, y_zeros) as each kernel says. */
typedef struct {
    int x_u8;
    float x_scale;
    int x_zero;
    const float *x_scales, *x_zeros; /* per channel; x_zeros integer valued in [0, 255] */
    const void *packed_w;
    const float *w;
    const float *scale;
    int y_u8;
    float y_scale;
    int y_zero;
    const float *y_scales;
    const int32_t *y_zeros;
    /* mrt_qconv2d: the Winograd weights (mrt_qconv_winograd_pack_w), for the convs mrt_qconv_uses_winograd
     * takes, or NULL (the direct kernels) */
    const int16_t *wino_w;
} mrt_quant;

int mrt_abi_version(void);
unsigned mrt_cpu_features(void);
/* CRC-32 of n bytes with zlib's polynomial and conventions, continuing crc: mrt_crc32(d, n, c) ==
 * zlib.crc32(d, c) (crc32_impl.h).  mrt_crc32_hw() is 1 when the CPU has the instructions it uses
 * (PCLMULQDQ, ARMv8 CRC32); without them it is a bitwise loop, slower than zlib. */
uint32_t mrt_crc32(const uint8_t *data, long n, uint32_t crc);
int mrt_crc32_hw(void);
/* Select an implementation; returns the one in use (BEST -> the best supported,
 * an unsupported request falls back to the baseline). */
int mrt_select_isa(int isa);
int mrt_current_isa(void);
int mrt_max_threads(void);
/* Start the thread pool's workers for jobs of up to nthreads participants (the caller included), as the
 * first parallel job would; returns the participants available (1 when threads cannot be started).  A
 * session calls it when it is created, so that its first run finds its workers started (and asleep)
 * instead of creating them during its first layers. */
int mrt_start_threads(int nthreads);
/* Back the n bytes at p with memory now (the pages a run would fault in one by one): one
 * madvise(MADV_POPULATE_WRITE) on Linux 5.14+, else a write to each page of the byte it holds (the
 * contents are kept either way).  Returns 1 when the kernel populated them, 0 when they were touched. */
int mrt_prefault(void *p, long n);
/* Cancellation of a run (issue 22): a thread that watches c (NULL: nothing) has the kernels it calls
 * stop between their work items, and a replayed program between its calls (returning MRT_CANCELLED as
 * the failed call's code), once c->terminate is nonzero (set from any thread) or CLOCK_MONOTONIC has
 * passed c->deadline_ns (0: no deadline).  A kernel stopped so leaves its output incomplete: the caller
 * checks c after the call and discards the run. */
typedef struct {
    int terminate;
    int64_t deadline_ns;
} mrt_cancel;
#define MRT_CANCELLED -101 /* (-100: a program call of an unknown entry) */
void mrt_watch_cancel(mrt_cancel *c);

/* The bound over the kernels' scratch memory: a kernel whose scratch block would exceed ``bytes``
 * fails as on running out of memory (its usual error return); mrt_scratch_refused() returns the size
 * of the last block refused so (0: none) and clears it. */
void mrt_set_scratch_limit(size_t bytes);
size_t mrt_scratch_refused(void);

/* Depthwise 2-D convolution (g->m == g->c == g->group): x (n, c, h, w), w (c, kh, kw), e->bias (c) or
 * NULL, res (n, c, oh, ow) or NULL, y (n, c, oh, ow) = act(conv + bias + res). */
void mrt_dwconv2d_f32(const mrt_conv_geometry *g, const float *w, const mrt_epilogue *e, const float *x,
                      const float *res, float *y, int nthreads);

/* int8 depthwise 2-D convolution (QConv with group == c): per channel ch,
 *   acc = sum over the taps of (xq - x_zeros[ch]) * q->w[ch, ky, kx]   (exact integers; padding is xq == x_zero)
 *   y   = post_a * act(scale[ch] * acc + bias[ch] + res) + post_b
 * with xq the uint8 input (q->x_u8) or quantize_u8(x / x_scales[ch] + x_zeros[ch]) of the float input;
 * res may be NULL.  The output y is float or, with q->y_u8, uint8 requantized per tensor (q->y_scale,
 * q->y_zero).  kh * kw <= 514 (integer sums exact in float32). */
void mrt_qdwconv2d(const mrt_conv_geometry *g, const mrt_quant *q, const mrt_epilogue *e, const void *x,
                   const float *res, void *y, int nthreads);

/* Max pooling over the n * c planes of x (h, w) -> y (oh, ow); taps outside the input are ignored
 * (as if padded with -inf).  NaN propagates. */
void mrt_maxpool2d_f32(const mrt_conv_geometry *g, const float *x, float *y, int nthreads);

/* Average pooling: sum of the taps inside the input, divided by the number of taps inside the
 * counting box [count_box[0], count_box[1]) x [count_box[2], count_box[3]) (input coordinates:
 * rows, then columns), or multiplied by `scale` when scale > 0. */
void mrt_avgpool2d_f32(const mrt_conv_geometry *g, const int *count_box, float scale, const float *x, float *y,
                       int nthreads);

/* Fused epilogue, in place: y (n, c, plane) = act(y + e->bias[c] + res).  bias and res (same shape as
 * y) may be NULL; e->post_* unused. */
void mrt_bias_act_f32(const mrt_epilogue *e, float *y, const float *res, int n, int c, long plane, int nthreads);

/* im2col of one image: x (c, h, w) -> cols (c*kh*kw, oh*ow), zeros for padding (g->n unused). */
void mrt_im2col_f32(const mrt_conv_geometry *g, const float *x, float *cols, int nthreads);

/* A whole float32 convolution (NCHW, any batch): y (n, m, oh, ow) = act(conv(x, w) + bias[m] + res),
 * w (m, c/group, kh, kw), e->bias and res (same shape as y) may be NULL.  The GEMM of mrt_sgemm_f32
 * with the epilogue fused; images with wide enough output rows as an implicit GEMM (B read from
 * padded, stride-phase-split planes of the input, built band by band, no im2col matrix), small
 * images through im2col in per-thread scratch with the columns of several in one GEMM; threads
 * over images, bands of output rows, or the GEMM.  Returns 0, or -1 without scratch memory.
 *
 * packed_w: the weights also pre-packed (from mrt_conv2d_pack_w under the same ISA,
 * mrt_conv2d_packed_w_floats(m, group, c/group*kh*kw) floats), or NULL, for the channel-vector
 * kernel, which images with a GEMM of their own then take (output channels as vector lanes: no
 * output column computed and dropped; the same sums as the GEMM's, bit for bit; strided layers read
 * the input in place, without planes, see mrt_conv2d_in_place_mode).  It pays where
 * mrt_conv2d_uses_packed_w says so (depends on the geometry alone, not on the batch or the
 * threads): pack for those layers. */
int mrt_conv2d_f32(const mrt_conv_geometry *g, const float *w, const float *packed_w, const mrt_epilogue *e,
                   const float *x, const float *res, float *y, int nthreads);
int mrt_conv2d_uses_packed_w(const mrt_conv_geometry *g);
/* Test hook: whether mrt_conv2d_f32 reads the input in place on the channel-vector kernel
 * (kernels larger than 1x1 or strided; the output's borders from small padded windows) instead of
 * building planes: -1 (the default) where that pays, 0 never, 1 always.  Returns the previous mode. */
int mrt_conv2d_in_place_mode(int mode);
long mrt_conv2d_packed_w_floats(int m, int group, int k);
void mrt_conv2d_pack_w(const float *w, int m, int group, int k, float *packed_w);
/* Whether mrt_conv2d_f32 runs this geometry as a Winograd F(2x2, 3x3) convolution (ungrouped 3x3, stride
 * 1, undilated, 16-256 channels in and out, outputs of 49+ pixels, on AVX2: kernels.c has the rule): then
 * its packed_w must be the Winograd pack, mrt_conv2d_winograd_floats(m, c) floats from
 * mrt_conv2d_winograd_pack_w of the (m, c, 3, 3) weights (the same on every ISA); with packed_w NULL the
 * layer takes the other paths.  Depends on the geometry and the ISA in use alone (not on the batch, the
 * pads or the threads); its results differ from the other paths' in the last bits. */
int mrt_conv2d_uses_winograd(const mrt_conv_geometry *g);
/* Test hook: mrt_conv2d_uses_winograd for every ungrouped 3x3 stride-1 undilated geometry: -1 (the default)
 * by the rule, 0 never, 1 always (whatever the ISA: the tests run each copy of the kernel).  Returns the
 * previous mode.  A call prepared under another mode packed its weights for that mode: prepare again. */
int mrt_conv2d_winograd_mode(int mode);
long mrt_conv2d_winograd_floats(int m, int c);
void mrt_conv2d_winograd_pack_w(const float *w, int m, int c, float *u);

/* float32 GEMM with fused epilogue (s->batch products, see mrt_gemm_shape):
 *   C[m, n] = act(sum_k A[m, k] B[k, n] + bias + res[m, n])
 * bias (e->bias, per s->bias_mode) and res (row stride s->ldr) may be NULL. */
void mrt_sgemm_f32(const mrt_gemm_shape *s, const mrt_epilogue *e, const float *A, const float *B, float *C,
                   const float *res, int nthreads);

/* int8 GEMM: u8 activations X (K x N, row stride s->ldb, zero point q->x_zero) times s8 symmetric
 * weights W (M x K, q->packed_w: packed once by mrt_qgemm_pack_w into mrt_qgemm_packed_size(M, K)
 * bytes, 64-byte aligned), float output (row stride s->ldc):
 *   C[m, n] = act(q->scale[m] * sum_k W[m, k] (X[k, n] - x_zero) + e->bias[m] + res[m, n])
 * Exact int32 accumulation.  bias and res (row stride s->ldr) may be NULL; one product (s->batch,
 * the batch strides, transb and bias_mode unused). */
long mrt_qgemm_packed_size(int M, int K);
void mrt_qgemm_pack_w(const int8_t *w, int M, int K, void *packed);
/* 1 when every pair of weights a packed row holds side by side (k = 2j, 2j + 1) has |w0| + |w1| <= 128
 * (the AVX2 route without VNNI then multiplies with vpmaddubsw, exact: such a pair of u8 x s8 products
 * adds up within int16), else 0. */
int mrt_qgemm_packed_pairs16(const void *packed, int M, int K);
void mrt_qgemm_u8s8_f32(const mrt_gemm_shape *s, const mrt_quant *q, const mrt_epilogue *e, const uint8_t *X,
                        const float *res, float *C, int nthreads);
/* A product with a constant right operand, B packed once: mrt_sgemm_pack_b_f32 writes B (K x N, row
 * stride ldb; with transb stored N x K) into mrt_sgemm_packed_b_floats(K, N) floats in the layout of the
 * ISA in use (repack after mrt_select_isa); mrt_sgemm_pb_f32 is mrt_sgemm_f32 on it (one product:
 * s->batch and the batch strides unused, s->ldb and s->transb too; identical results). */
long mrt_sgemm_packed_b_floats(int K, int N);
void mrt_sgemm_pack_b_f32(const float *B, long ldb, int transb, int K, int N, float *out);
void mrt_sgemm_pb_f32(const mrt_gemm_shape *s, const mrt_epilogue *e, const float *A, const float *bpack, float *C,
                      const float *res, int nthreads);
/* Matrix-vector product for a few rows of A (M small), B read in place (not packed), threads over
 * the output columns: C[m, n] = act(sum_k A[m, k] B[k, n] + e->bias[n]) with B K x N (row stride
 * s->ldb) or, with s->transb, stored N x K; bias may be NULL; no residual, one product. */
void mrt_sgemv_f32(const mrt_gemm_shape *s, const mrt_epilogue *e, const float *A, const float *B, float *C,
                   int nthreads);
/* Softmax (log = 0) or LogSoftmax (log = 1) of each of `rows` contiguous rows of n floats; y may be x. */
void mrt_softmax_f32(const float *x, float *y, long rows, long n, int log, int nthreads);
/* Scaled dot-product attention (sdpa_impl.h): out[b, i, :] = softmax_j(scale * q[b, i, :] . k[b, j, :] +
 * mask[b, i, j]) . v[b, j, :] for b < bh, i < sq, j < sk; q [bh, sq, d], k [bh, sk, d] (transpose_k) or
 * [bh, d, sk], v [bh, sk, dv], out [bh, sq, dv], all float32 C-contiguous; the mask (NULL: none) element
 * (b, i, j) at mask[b * mask_b + i * mask_r + j].  The same results as the composed kernels (products,
 * multiply, add, row softmax), the scores of a block of queries kept in cache.  Returns 0, -1 without
 * scratch memory, -2 for bad sizes. */
typedef struct {
    long bh, mask_b, mask_r;
    int sq, sk, d, dv, transpose_k;
    float scale;
} mrt_sdpa_shape;
int mrt_sdpa_f32(const mrt_sdpa_shape *s, const float *q, const float *k, const float *v, const float *mask, float *out,
                 int nthreads);
/* y[r, :] = (x[r, :] - mean_r) / sqrt(var_r + eps) * scale + bias over rows of n floats (LayerNormalization
 * over the trailing axes); bias may be NULL; x and y may be the same buffer. */
void mrt_layernorm_f32(const float *x, const float *scale, const float *bias, float *y, long rows, long n, float eps,
                       int nthreads);
/* The same statistics per row, with one scale / bias value per row, scale[r] (InstanceNormalization of
 * one image (C, ...): C rows of the spatial size); bias may be NULL. */
void mrt_instancenorm_f32(const float *x, const float *scale, const float *bias, float *y, long rows, long n, float eps,
                          int nthreads);
/* RMS normalization (SimplifiedLayerNormalization): y = x / sqrt(mean(x^2) + eps) * scale over rows of n
 * floats, scale of n floats; x and y may be the same buffer. */
void mrt_rmsnorm_f32(const float *x, const float *scale, float *y, long rows, long n, float eps, int nthreads);
/* The int8 GEMM microkernel in use: 1 AVX512-VNNI, 2 aarch64 SDOT (dot product), 3 AVX2 (exact int16
 * products), 4 AMX tiles (with AVX512-VNNI for what they do not take), 0 the portable one. */
int mrt_qgemm_isa(void);
/* q[i] = clamp(rint(x[i] / scale) + zp, 0, 255) */
void mrt_quantize_u8_f32(const float *x, uint8_t *q, long n, float scale, int zp, int nthreads);
/* The same of x + nearest-upsampled xu, into out: the n * c planes of g->oh x g->ow floats in x, of
 * (oh / f) x (ow / f) in xu, f = g->sh (oh, ow multiples of f >= 1);
 * out[p][i][j] = quantize(x[p][i][j] * xm[p] + xu[p][i / f][j / f] * um[p]) (xm, um NULL: no
 * multiplier; products rounded to float before the add), or of the upsampled xu * um alone when x is
 * NULL; quantized with q->y_scale, q->y_zero.  Returns -1 when its per-thread scratch cannot be
 * allocated, -2 for sizes that are not multiples of f. */
int mrt_quantize_add_up_u8_f32(const mrt_conv_geometry *g, const mrt_quant *q, const float *x, const float *xm,
                               const float *xu, const float *um, uint8_t *out, int nthreads);
/* im2col of one uint8 image, padding with `pad` (the zero point). */
void mrt_im2col_u8(const mrt_conv_geometry *g, const uint8_t *x, uint8_t *cols, int pad, int nthreads);

/* A whole int8 convolution (NCHW): x float (quantized with q->x_scale, q->x_zero into per-thread
 * scratch) or uint8 (q->x_u8), im2col (u8), and the int8 GEMM per group; q->packed_w from
 * mrt_qgemm_pack_w of the (m, c/group*kh*kw) weights, q->scale per output channel.
 * y = post_a * act(...) + post_b, float or, with q->y_u8, uint8 requantized per output channel
 * o: clamp(rint(y / y_scales[o]) + y_zeros[o], 0, 255) (see qgemm.h).  A float input with q->x_scale 0
 * is quantized dynamically, as DynamicQuantizeLinear (uint8 over [min(x, 0), max(x, 0)], its scale and
 * zero point computed from x by this call), and q->scale then holds the weights' scales (the channels'
 * are that x_scale * q->scale[o]); the same in mrt_qconv2d_pool_f32.  Returns 0, or -1 when the
 * scratch could not be allocated. */
int mrt_qconv2d(const mrt_conv_geometry *g, const mrt_quant *q, const mrt_epilogue *e, const void *x,
                const float *res, void *y, int nthreads);
/* mrt_qconv2d with a float output max-pooled in the output stage (q->y_u8 and e->post_* unused):
 * y (n, m, poh, pow) = MaxPool of the (n, m, oh, ow) conv result over (pool->kh, pool->kw) windows
 * at strides (pool->sh, pool->sw), no padding, NaN propagating: poh = (oh - kh) / sh + 1, pow
 * likewise (the rest of *pool unused).  Returns 0, -1 without scratch memory, -2 for a window that
 * does not fit. */
int mrt_qconv2d_pool_f32(const mrt_conv_geometry *g, const mrt_conv_geometry *pool, const mrt_quant *q,
                         const mrt_epilogue *e, const void *x, const float *res, float *y, int nthreads);
/* Whether mrt_qconv2d computes this conv as Winograd F(2x2, 3x3) in exact integers when q->wino_w is
 * given (qwinograd_avx2.h, q_winograd_fits: 3 x 3, stride and dilation 1, one group, padding <= 2, at
 * most 1024 input channels and enough channels on both sides, on x86-64 AVX2 without VNNI); the results
 * are the direct kernels', bit for bit.  The weights: mrt_qconv_winograd_pack_w of the (m, c, 3, 3) int8
 * weights into mrt_qconv_winograd_packed_size(m, c) int16 (any CPU). */
int mrt_qconv_uses_winograd(const mrt_conv_geometry *g);
long mrt_qconv_winograd_packed_size(int m, int c);
void mrt_qconv_winograd_pack_w(const int8_t *w, int m, int c, int16_t *u);
/* ConvTranspose with stride == kernel (g->kh x g->kw), no padding, one group, int8: y (n, m, h*kh, w*kw)
 * float (or, with q->y_u8, uint8: requantized as mrt_qconv2d's per GEMM row) from x (n, c, h, w) uint8
 * with zero point q->x_zero, q->packed_w from mrt_qgemm_pack_w of the (m*kh*kw, c) int8 weights (row
 * (mi*kh + t)*kw + u = W[:, mi, t, u]); q->scale, e->bias, q->y_scales, q->y_zeros per GEMM row (bias
 * may be NULL).  Returns 0, -1 without scratch memory, -2 for bad arguments. */
int mrt_qconvtranspose_tiles(const mrt_conv_geometry *g, const mrt_quant *q, const mrt_epilogue *e, const uint8_t *x,
                             void *y, int nthreads);
/* y (rows = s->M, n = s->N) = act(scale[j] * sum_k (quant(a[r, k]) - x_zero) W[j, k] + bias[j]), a float
 * (rows, K = s->K) quantized with q->x_scale, q->x_zero, W the (n, K) int8 weights packed by
 * mrt_qgemm_pack_w (q->packed_w).  q->x_scale 0: dynamic quantization, as DynamicQuantizeLinear
 * (over [min(a, 0), max(a, 0)] into 256 levels, scale and zero point
 * computed from a by this call), and q->scale holds the weights' scales (scale[j] = that x_scale *
 * q->scale[j]).  Returns 0, or -1 without scratch memory. */
int mrt_qmatmul_f32(const mrt_gemm_shape *s, const mrt_quant *q, const mrt_epilogue *e, const float *a, float *y,
                    int nthreads);

/* Data-movement kernels (layout_impl.h). */
/* Nearest upsampling of planes x (planes, h, wd) by integer factors: y (planes, h*fh, wd*fw),
 * y[p, i, j] = x[p, i / fh, j / fw]. */
void mrt_upsample_nearest_f32(const float *x, float *y, long planes, int h, int wd, int fh, int fw, int nthreads);
/* y[p] = mean of plane p of x (planes, plane). */
void mrt_plane_means_f32(const float *x, float *y, long planes, long plane, int nthreads);
/* dst[r * dst_ld + c] = src[r * src_ld + c] for r < rows, c < cols (float32; Concat of C-contiguous
 * inputs: one call per input, its rows of prod(shape[axis:]) values placed side by side). */
void mrt_copy_rows_f32(const float *src, long src_ld, float *dst, long dst_ld, long rows, long cols, int nthreads);
/* y[i] = a[i] op b[i] for i < n (float32, same shape; y may be a or b): op 0 add, 1 sub, 2 mul, 3 div. */
#define MRT_BINARY_ADD 0
#define MRT_BINARY_SUB 1
#define MRT_BINARY_MUL 2
#define MRT_BINARY_DIV 3
void mrt_binary_f32(int op, const float *a, const float *b, float *y, long n, int nthreads);
/* The same with one operand broadcast over rows: y and a are (rows, len), contiguous; b holds bmod
 * values (a tensor whose trailing axes are 1: per channel, per image and channel, a scalar with
 * rows 1 and bmod 1) and y[r, i] = a[r, i] op b[r % bmod].  With op | MRT_BINARY_COLUMNS b holds len
 * values instead, y[r, i] = a[r, i] op b[i] (a trailing-axes operand, e.g. a bias over the last
 * axis; bmod unused).  With op | MRT_BINARY_REVERSED the broadcast operand is the left one:
 * y = b op a (Sub, Div).  y may be a, never b. */
#define MRT_BINARY_REVERSED 4
#define MRT_BINARY_COLUMNS 8
void mrt_binary_rows_f32(int op, const float *a, const float *b, float *y, long rows, long len, long bmod,
                         int nthreads);
/* y[i] = act(x[i]) for i < n (e->act, e->a0, e->a1: the fused epilogues' activation code, bit for bit;
 * e->bias and e->post_* unused); y may be x (in place), no other overlap. */
void mrt_activation_f32(const mrt_epilogue *e, const float *x, float *y, long n, int nthreads);
/* ConvTranspose with stride == kernel (g->kh x g->kw), no padding, dilation 1, one group: x (n, c, h, w),
 * wt (m*kh*kw, c) the weight (c, m, kh, kw) transposed, e->bias (m*kh*kw) per GEMM row or NULL,
 * y (n, m, h*kh, w*kw) = act(conv_transpose(x) + bias).  Returns 0, or -1 without scratch memory. */
int mrt_convtranspose_tiles_f32(const mrt_conv_geometry *g, const float *wt, const mrt_epilogue *e, const float *x,
                                float *y, int nthreads);
/* Max pooling with stride 1 and dilation 1 (g->sh, sw, dh, dw unused) over the n * c planes of x (h, w)
 * -> y (oh, ow), top/left pads pt/pl (taps outside the input ignored), separable: rows, then columns.
 * NaN propagates.  Returns 0, or -1 without scratch memory. */
int mrt_maxpool2d_s1_f32(const mrt_conv_geometry *g, const float *x, float *y, int nthreads);

/* ------------------------------------------------------------------ recurrent layers (rnn_impl.h)
 *
 * ONNX LSTM and GRU, float32, default activations (f = Sigmoid, g = h = Tanh).  Sizes: S = seq,
 * B = batch, I = input, H = hidden, D = dirs, G = 4 (LSTM) or 3 (GRU).  layout 0: x (S, B, I),
 * y (S, D, B, H), states (D, B, H); layout 1: x (B, S, I), y (B, S, D, H), states (B, D, H).
 * Direction d of a bidirectional layer runs forward for d = 0 and backwards for d = 1; one direction
 * runs backwards when `reverse`.  Weights (constants of the prepared call): w (D, G*H, I),
 * r (D, G*H, H); bias (D, G*H) the input and recurrent biases added once (for a GRU with
 * linear_before_reset, the h gate's input bias only: its recurrent bias is rbh (D, H), applied
 * inside r * (h Rh^T + rbh)), or NULL; p the LSTM peepholes (D, 3*H: i, o, f) or NULL.  clip > 0:
 * every gate pre-activation is clamped to [-clip, clip]; 0: none. */
#define MRT_RNN_LSTM 0
#define MRT_RNN_GRU 1
typedef struct {
    int kind; /* MRT_RNN_LSTM or MRT_RNN_GRU */
    int seq, batch, input, hidden, dirs;
    int reverse, layout;
    int linear_before_reset; /* GRU */
    int input_forget;        /* LSTM: the forget gate is 1 - i */
    float clip;
    const float *w, *r, *bias, *rbh, *p;
    const float *wpack; /* w packed once for the input projection (mrt_sgemm_pack_b_f32 of w, transb 1,
                         * K = input, N = dirs * G * H; under the ISA in use), or NULL: packed per call */
    const float *rpack; /* per direction, r packed as the recurrent product's B (transb 1, K = H, N = G * H;
                         * mrt_sgemm_packed_b_floats(H, G * H) floats each), or NULL; rnn_prepare packs it
                         * for a batch of several rows (one row: the matrix-vector product reads r in place) */
} mrt_rnn_shape;

/* The whole layer: y (see above, always written; steps at or past a sequence's length are zeros),
 * state = Y_h (D*B*H floats, in the states' layout) followed, for an LSTM, by Y_c (as many).
 * lens (B) the sequence lengths, 0 <= lens[b] <= S, or NULL (all S); h0 / c0 the initial states
 * (states' layout) or NULL (zeros).  The input projection of all steps is one GEMM; per step, one
 * recurrent product (two for a GRU without linear_before_reset) and one fused gate pass.  Returns 0,
 * -1 without scratch memory, -2 for bad sizes or lengths. */
int mrt_rnn_f32(const mrt_rnn_shape *s, const float *x, const int32_t *lens, const float *h0, const float *c0,
                float *y, float *state, int nthreads);

/* ------------------------------------------------------------------ data movement (index_copy_impl.h)
 *
 * mrt_index_copy: y[i_0, ..., i_{r-1}] = x[offsets[0][i_0] + ... + offsets[r-1][i_{r-1}]] for the
 * C-contiguous y of the map's shape, in elements of `elem` bytes; an offset < 0 on any axis makes
 * the element `fill` (its low `elem` bytes).  The ops whose source positions follow from shapes and
 * attributes alone (Transpose, Slice, Pad, Split, Expand, Tile, ...) are each one map, built once
 * per input shape by minirt/kernels/index_maps.py; the tables live as long as the map.  inner_run:
 * the last axis's offsets are offsets[r-1][0] + i, all >= 0 (each row is one block copy).
 * Returns 0, or -2 for a bad rank or element size. */
#define MRT_INDEX_MAX_RANK 8
typedef struct {
    int rank; /* 1 .. MRT_INDEX_MAX_RANK */
    int elem; /* bytes per element: 1, 2, 4 or 8 */
    int inner_run;
    uint64_t fill;
    long shape[MRT_INDEX_MAX_RANK];
    const long *offsets[MRT_INDEX_MAX_RANK];
} mrt_index_map;
int mrt_index_copy(const mrt_index_map *m, const void *x, void *y, int nthreads);

/* mrt_gather_rows: Gather along one axis with run-time int64 indices: x is outer x axis blocks of
 * inner_bytes, idx holds count indices in [-axis, axis) (negative: from the end), y is outer x
 * count blocks.  Returns 0, or -3 (nothing written) when an index is out of range. */
typedef struct {
    long outer, axis, count, inner_bytes;
} mrt_gather_shape;
int mrt_gather_rows(const mrt_gather_shape *s, const void *x, const int64_t *idx, void *y, int nthreads);

/* mrt_lookup_rows: com.minirt::RowLookup (docs/fused_ops.md): y[j, :] = table[ids[j], :] for the s->count
 * ids (int32 when id_bytes is 4, int64 when 8), each row s->inner_bytes; an id outside [0, s->axis - 1)
 * reads the table's last row (row s->axis - 1: what a one-hot encoding of it times the matrix gives).
 * s->outer must be 1.  Returns 0, or -2 (nothing written) for another id size or outer. */
int mrt_lookup_rows(const mrt_gather_shape *s, const void *table, const void *ids, int id_bytes, void *y,
                    int nthreads);

/* mrt_cast: y[i] = x[i] converted from type `from` to type `to` (ONNX data type codes: 1 float32,
 * 2 uint8, 3 int8, 6 int32, 7 int64, 9 bool, 11 float64) for n elements, as numpy's astype: floats to
 * integers truncate toward zero (NaN and out-of-range values: the type's minimum), integers wrap,
 * bool is x != 0.  Returns 0, or -2 for another type. */
int mrt_cast(int from, int to, const void *x, void *y, long n, int nthreads);

/* mrt_broadcast (broadcast_impl.h): y = op(a, b[, c]) with numpy broadcasting, for operands of the
 * type `type` (the ONNX codes of mrt_cast: float32, float64, int32, int64, uint8; bool as uint8):
 * y has the map's C-contiguous shape, and each operand is read through its element strides per axis
 * (strides[k], 0 along an axis operand k is broadcast over).  Arithmetic gives y of the operands'
 * type, comparisons and And / Or / Xor / Not a bool (uint8 0 / 1) y; Where reads a as the bool
 * condition, b and c as the values.  Div only for float types.  Returns 0, or -2 for a bad map. */
typedef enum {
    MRT_EW_ADD = 0,
    MRT_EW_SUB = 1,
    MRT_EW_MUL = 2,
    MRT_EW_DIV = 3,
    MRT_EW_EQUAL = 4,
    MRT_EW_LESS = 5,
    MRT_EW_LESS_EQUAL = 6,
    MRT_EW_GREATER = 7,
    MRT_EW_GREATER_EQUAL = 8,
    MRT_EW_AND = 9,
    MRT_EW_OR = 10,
    MRT_EW_XOR = 11,
    MRT_EW_NOT = 12,
    MRT_EW_WHERE = 13,
    MRT_EW_MAX = 14, /* NaN-propagating, as numpy's maximum */
    MRT_EW_MIN = 15,
    MRT_EW_SQRT = 16, /* unary, float types: a only */
    MRT_EW_RECIPROCAL = 17,
    MRT_EW_NEG = 18,
    MRT_EW_ABS = 19,
    MRT_EW_EXP = 20,
    MRT_EW_LOG = 21,
    MRT_EW_FLOOR = 22,
    MRT_EW_CEIL = 23,
    MRT_EW_POW = 24 /* binary, float types: the C library's pow (numpy's float power: within an ulp) */
} mrt_ew_op;
typedef struct {
    int op, type, rank;
    long shape[MRT_INDEX_MAX_RANK];
    long strides[3][MRT_INDEX_MAX_RANK];
} mrt_broadcast_map;
int mrt_broadcast(const mrt_broadcast_map *m, const void *a, const void *b, const void *c, void *y, int nthreads);

/* mrt_reduce_f32 (broadcast_impl.h): y (outer, inner) = op over the middle axis of x (outer, n, inner),
 * float32, n > 0: the ONNX reductions over one block of consecutive axes.  Sums in double, rounded
 * once; Max / Min propagate NaN.  Returns 0, or -2 for a bad op or size. */
#define MRT_REDUCE_SUM 0
#define MRT_REDUCE_MEAN 1
#define MRT_REDUCE_MAX 2
#define MRT_REDUCE_MIN 3
#define MRT_REDUCE_SUM_SQUARE 4
int mrt_reduce_f32(int op, const float *x, float *y, long outer, long n, long inner, int nthreads);
/* mrt_reduce_int: the same for integers, x and y of the type `type` (6 int32, 7 int64: mrt_cast's
 * codes), op MRT_REDUCE_SUM (in the type itself, wrapping, as the ONNX reference and numpy with
 * dtype=x.dtype), MRT_REDUCE_MAX or MRT_REDUCE_MIN: a decoder's attention mask summed into its sequence
 * lengths, replayed by a native program.  Returns 0, or -2 for another op, type or size. */
int mrt_reduce_int(int op, int type, const void *x, void *y, long outer, long n, long inner, int nthreads);

/* ------------------------------------------------------------------ detection (nms_impl.h, roialign_impl.h)
 *
 * NonMaxSuppression (ONNX opsets 10 / 11), float32, exactly as the ONNX reference evaluator and
 * onnxruntime select: boxes (batches, boxes, 4) [y1, x1, y2, x2] (any diagonal pair) or, with
 * center_point_box, [x_centre, y_centre, width, height]; scores (batches, classes, boxes).  Per batch
 * and class, the boxes scoring > score_threshold (every box without has_score_threshold) in
 * descending score order (ties: lower box index first; NaN scores last), each kept unless a box kept
 * before it overlaps it with IoU > iou_threshold (float32, the reference's arithmetic), at most
 * max_output of them.  The selection is written to `selected` as rows (batch, class, box) of int64,
 * batch-major, then class, then in selection order; capacity is its row count (batches * classes *
 * min(max_output, boxes) always suffices).  Returns the number of rows, -1 without scratch memory, -2
 * for bad parameters (negative sizes, boxes > INT32_MAX, iou_threshold outside [0, 1],
 * center_point_box not 0 / 1), -3 when capacity is too small.  One thread (each class's greedy
 * selection is sequential). */
typedef struct {
    int64_t batches, classes, boxes;
    int64_t max_output; /* per batch and class, >= 0 */
    float iou_threshold;
    float score_threshold; /* read when has_score_threshold */
    int has_score_threshold;
    int center_point_box;
} mrt_nms_params;
int64_t mrt_nms_f32(const mrt_nms_params *p, const float *boxes, const float *scores, int64_t *selected,
                    int64_t capacity);

/* RoiAlign (ONNX opsets 10 / 16 / 22), float32: x (n, c, h, w), rois (nrois, 4) [x1, y1, x2, y2] in
 * input coordinates, times spatial_scale; batch_indices (nrois), each in [0, n); y (nrois, c, oh, ow).
 * Per bin: the mean (MRT_ROI_AVG) or the max (MRT_ROI_MAX, of each sample's largest weighted tap) of
 * gh x gw bilinear samples, gh = sampling_ratio or, when sampling_ratio <= 0, ceil(RoI height / oh)
 * (gw alike); samples more than one pixel outside the map count as 0.  half_pixel: coordinates
 * shifted by -0.5 (coordinate_transformation_mode "half_pixel"); 0: the legacy "output_half_pixel"
 * (no shift, RoIs at least 1 x 1).  The RoI geometry is onnxruntime's float arithmetic.  Returns 0,
 * -1 without scratch memory, -2 for bad sizes or a batch index out of range, -3 for a RoI needing
 * more than 65536 samples per bin along an axis. */
#define MRT_ROI_AVG 0
#define MRT_ROI_MAX 1
typedef struct {
    int n, c, h, w;
    int oh, ow;
    int sampling_ratio;
    int mode; /* MRT_ROI_AVG or MRT_ROI_MAX */
    int half_pixel;
    float spatial_scale;
} mrt_roi_align_shape;
int mrt_roi_align_f32(const mrt_roi_align_shape *s, const float *x, const float *rois, const int64_t *batch_indices,
                      long nrois, float *y, int nthreads);

/* ------------------------------------------------------------------ tree ensembles (trees_impl.h)
 *
 * mrt_tree_votes: the votes of a tree ensemble laid out by minirt/kernels/trees.py (TreeLayout), as its
 * traverse + accumulate compute them, bit for bit.  For each of the n samples x (n, n_features),
 * C-contiguous, in double when node_double else float: every tree is walked from its root to its leaf
 * (the comparisons in x's type), and the leaves' weights are aggregated per target into scores (n,
 * n_targets), double when acc_double else float: MRT_TREE_SUM adds them tree after tree in tree order
 * (AVERAGE: that sum divided by n_trees), MIN / MAX keep the extreme weight (NaN propagates) of the
 * trees that have one, 0 where none has; has (n, n_targets) is 1 where some tree gave the target a
 * weight.  The node array (n_nodes + 1 nodes of 16 bytes for float, 24 for double; its format in
 * trees_impl.h) and roots (the trees' root nodes in tree order, padded with the pad leaf n_nodes to a
 * multiple of MRT_TREE_GROUP) are built once per layout by trees.py, which checks every index in
 * them; values / has (n_leaves, n_targets) are the dense leaf table (read when n_targets > 1).
 * mode: MRT_TREE_LEQ .. MRT_TREE_NEQ when every branch node compares so, MRT_TREE_MIXED otherwise
 * (set membership nodes are not native).  Threads split the samples; one sample's trees run on one
 * thread.  Returns 0, or -2 for bad parameters (max_feature >= n_features among them). */
#define MRT_TREE_GROUP 16
#define MRT_TREE_LEQ 0
#define MRT_TREE_LT 1
#define MRT_TREE_GTE 2
#define MRT_TREE_GT 3
#define MRT_TREE_EQ 4
#define MRT_TREE_NEQ 5
#define MRT_TREE_MIXED 6
#define MRT_TREE_AVERAGE 0
#define MRT_TREE_SUM 1
#define MRT_TREE_MIN 2
#define MRT_TREE_MAX 3
typedef struct {
    const void *nodes;
    const int32_t *roots;
    const void *values;
    const uint8_t *has;
    int64_t n_nodes, n_trees, n_leaves, n_targets;
    int64_t max_feature; /* the largest feature a branch node tests, -1 for none */
    int node_double, acc_double;
    int mode;
    int aggregate;
    int inline_leaves; /* n_targets 1: each leaf's value and weight flag are in its node */
} mrt_tree_ensemble;
int mrt_tree_votes(const mrt_tree_ensemble *e, const void *x, long n, long n_features, void *scores, uint8_t *has,
                   int nthreads);
/* mrt_tree_finish: the outputs of a tree ensemble op from its votes, for the post_transform NONE cases
 * (minirt/kernels/trees.py, finish_classifier / finish_regressor; onnxruntime's rules): scores and has (n, k)
 * as mrt_tree_votes wrote them (scores double when acc_double, else float; updated in place).  The
 * n_base values base (NULL when none) are added to the first n_base targets (a classifier: their has set to
 * 1; a regressor adds them only when n_base == k).  out (n, k) float32 = the scores.  A classifier
 * (labels not NULL, k != 2) also writes label[i] = labels[c], c the first target of highest score among those
 * with has (NaN counts highest, as numpy's argmax), 0 when none has one.  Returns 0, or -2 for bad sizes.
 * With mrt_tree_votes it makes the op one pair of recordable calls (a batch-1 forest replayed as a program). */
typedef struct {
    int k, acc_double, n_base;
    const double *base;
    const int64_t *labels; /* k class labels (a classifier), or NULL (a regressor) */
} mrt_tree_outputs;
int mrt_tree_finish(const mrt_tree_outputs *p, void *scores, uint8_t *has, int64_t *label, float *out, long n,
                    int nthreads);

/* ------------------------------------------------------------------ 4-bit block-quantized products (nbits_impl.h)
 *
 * mrt_qnbits_matmul: y (M, N) = a (M, K) . W^T (+ bias) with W as com.microsoft::MatMulNBits stores
 * 4-bit weights, at its accuracy_level 4 (onnxruntime's CompInt8): every block of block_size values of
 * a row of a is quantized to int8 symmetrically (scale max|a| / 127, round half to even), the integer
 * dot products with the unsigned nibbles q are exact, and W[n, k] = (q - zp) * scale.  The weights are
 * repacked by groups of 16 columns (the layout in nbits_impl.h; minirt/kernels/decoder.py builds it):
 * b uint8 (ceil(N / 16), kc, 4, 16, 4) with kc = kb * block_size / 32, kb = ceil(K / block_size)
 * (past K and past N: zeros); scales (ceil(N / 16), kb, 16) likewise, and zs = scale * zero point in
 * the scales' layout, or NULL for the zero point 8 of a model without zero points; bias (N) or NULL.
 * block_size a power of two >= 32.
 * workspace: mrt_qnbits_workspace(M, K, block_size) bytes, or NULL (allocated inside).  Threads split the
 * column groups.  Returns 0, -1 when scratch memory ran out, or -2 for bad parameters. */
typedef struct {
    int N, K, block_size;
    const uint8_t *b;
    const float *scales;
    const float *zs;
    const float *bias;
} mrt_qnbits_weights;
long mrt_qnbits_workspace(int M, int K, int block_size);
int mrt_qnbits_matmul(const mrt_qnbits_weights *w, const float *a, int M, float *y, void *workspace, int nthreads);

/* ------------------------------------------------------------------ attention over a KV cache (attention_impl.h)
 *
 * mrt_gqa_attention_f32: a GroupQueryAttention step, float32.  x: this step's S tokens per sequence,
 * q (row (b, s) at q + (b * S + s) * q_row, head h at + h * head_size), k / v likewise with kv_row (NULL:
 * nothing new, the caches already hold every position), positions [B, S] (their rows of cos / sin
 * [max_position, rotary_half]; rotary_half 0: no rotary embedding, positions unused).  The new keys,
 * rotated (the first 2 * rotary_half features: pairs (i, i + half), or (2i, 2i + 1) with
 * rotary_interleaved), and values are written into the caches c->k / c->v [batch, kv_heads, capacity,
 * head_size] at rows pasts[b] + s; the queries are rotated the same way.  Query position s of sequence
 * b then sees keys j with j <= pasts[b] + s and j < totals[b] and, with local_window W > 0, j >
 * pasts[b] + s - W; head h reads kv head h / (heads / kv_heads).  logits = scale * q.k (softcap c > 0:
 * c * tanh(logits / c)), softmax, times v, into out [batch, seq, heads, head_size].  A row with no key
 * gets zeros.  Threads split the (sequence, kv head) pairs.  Returns 0, -1 when scratch memory ran
 * out, -2 for bad parameters, -3 for a position outside the cos / sin caches. */
typedef struct {
    int batch, seq, heads, kv_heads, head_size;
    long capacity;
    float scale, softcap;
    int local_window;
    int rotary_half, rotary_interleaved;
    long max_position;
} mrt_attention_shape;
typedef struct {
    const float *q, *k, *v;
    long q_row, kv_row;
    const int64_t *positions;
} mrt_attention_step;
typedef struct {
    float *k, *v;
    const int64_t *pasts, *totals;
} mrt_kv_cache;
int mrt_gqa_attention_f32(const mrt_attention_shape *s, const mrt_attention_step *x, const float *cos,
                          const float *sin, const mrt_kv_cache *c, float *out, int nthreads);
/* mrt_gqa_decode_f32: mrt_gqa_attention_f32 for one sequence and one new token (p->shape: batch = seq = 1)
 * with packed QKV, qkv = [q heads | k heads | v heads] of (heads + 2 kv_heads) * head_size floats, at
 * the position seqlens_k[0] (GroupQueryAttention's int32 input: the total length - 1), read when the
 * call runs: the same recorded call serves every token of a replayed decode step.  The past of the
 * caches is the rows before that position; the new key / value go to its row.  p->cos / p->sin: the
 * rotary caches (NULL without rotary), constants of the prepared call.  With p->ring (GroupQueryAttention's
 * sliding_window_cache: a cache of exactly the local window, shape.local_window 0) the caches are a ring:
 * position pos goes to row pos % capacity and the query sees the min(pos + 1, capacity) rows filled, the
 * last `capacity` positions.  Returns as mrt_gqa_attention_f32 (-2 also for a position outside the caches). */
typedef struct {
    mrt_attention_shape shape;
    const float *cos, *sin;
    int ring;
} mrt_gqa_decode;
int mrt_gqa_decode_f32(const mrt_gqa_decode *p, const float *qkv, const int32_t *seqlens_k, float *k_cache,
                       float *v_cache, float *out, int nthreads);

/* ------------------------------------------------------------------ native programs
 *
 * A native program (program_impl.h) is a run of kernel calls recorded once by a session (see
 * minirt/native/program.py) and replayed by one C call, without Python between the calls.
 * A call names its entry point by an MRT_CALL_* code and holds that entry point's arguments in
 * declaration order, one mrt_arg each, in the member of the parameter's type (pointers in p, int
 * in i, long in l, float in f): the struct pointers of its prepared call, the data pointers, the
 * thread count.
 *
 * The record/replay contract (also in docs/runtime.md, "Native programs: the record/replay
 * contract"; checked in one place: _call and RECORDABLE in minirt/native/__init__.py, then the
 * recorder of minirt/native/program.py).  A kernel is recordable when, on the path taken:
 *   1. all of its work is done by native calls made through the recording wrappers of
 *      minirt/native/__init__.py, each listed below with an MRT_CALL_* code: no numpy work before or
 *      after them (a replay runs the calls alone);
 *   2. each call declares the buffers it reads and the ones it writes (argument positions); every
 *      other argument is a constant of the prepared call: the parameter structs (built once, kept
 *      alive by the recording) and the weights they point to, scalars, the thread count;
 *   3. its result is declared with native.final(y), the array the calls wrote, returned untouched;
 *      or, when no call is needed at all, native.constant_result(y) for a read-only array that is the
 *      same on every run;
 *   4. nothing it passes depends on the data: scalars derived from the input (dynamic quantization)
 *      make the path unrecordable (it then does not declare its result final).
 * A replay patches only the data pointers that are model inputs; everything else is the recording's.
 * No call writes into a model input, except through the argument it reads the whole input by (an
 * update in place of a caller's bound buffer: a KV cache, D123). */
typedef union {
    void *p;
    long l;
    int i;
    float f;
} mrt_arg;
typedef struct {
    int entry; /* MRT_CALL_* */
    const mrt_arg *args;
} mrt_call;
#define MRT_CALL_CONV2D_F32 1
#define MRT_CALL_DWCONV2D_F32 3
#define MRT_CALL_MAXPOOL2D_F32 4
#define MRT_CALL_MAXPOOL2D_S1_F32 5
#define MRT_CALL_SGEMM_PB_F32 6
#define MRT_CALL_SGEMM_F32 7
#define MRT_CALL_QCONV2D 9
#define MRT_CALL_QCONV2D_POOL_F32 10
#define MRT_CALL_QMATMUL_F32 11
#define MRT_CALL_PLANE_MEANS_F32 12
#define MRT_CALL_COPY_ROWS_F32 13
#define MRT_CALL_BINARY_F32 14
#define MRT_CALL_UPSAMPLE_NEAREST_F32 15
#define MRT_CALL_RNN_F32 16
#define MRT_CALL_BINARY_ROWS_F32 17
#define MRT_CALL_ACTIVATION_F32 18
#define MRT_CALL_INDEX_COPY 19
#define MRT_CALL_GATHER_ROWS 20
#define MRT_CALL_SOFTMAX_F32 21
#define MRT_CALL_LAYERNORM_F32 22
#define MRT_CALL_AVGPOOL2D_F32 23
#define MRT_CALL_CONVTRANSPOSE_TILES_F32 24
#define MRT_CALL_CAST 25
#define MRT_CALL_BROADCAST 26
#define MRT_CALL_REDUCE_F32 27
#define MRT_CALL_INSTANCENORM_F32 28
#define MRT_CALL_QUANTIZE_ADD_UP_U8_F32 29
#define MRT_CALL_REDUCE_INT 30
#define MRT_CALL_GQA_DECODE_F32 31
#define MRT_CALL_QNBITS_MATMUL 32
#define MRT_CALL_RMSNORM_F32 33
#define MRT_CALL_TREE_VOTES 34
#define MRT_CALL_TREE_FINISH 35
#define MRT_CALL_LOOKUP_ROWS 36
#define MRT_CALL_QDWCONV2D 37
#define MRT_CALL_QUANTIZE_U8_F32 38
#define MRT_CALL_QCONVTRANSPOSE_TILES 39
#define MRT_CALL_SDPA_F32 40
/* Runs calls[0 .. n) in order.  Returns -1 when every call succeeded, else the index of the first
 * call that returned non-zero (the calls after it are not run), its return code in *rc.  An
 * unknown entry code fails with *rc = -100. */
long mrt_program_run(const mrt_call *calls, long n, int *rc);
/* mrt_program_run, adding each call's elapsed nanoseconds (CLOCK_MONOTONIC, the calling thread's wall time)
 * to ns[i], n doubles: a replayed program's time per call (minirt.native.program.Program.run with ns,
 * benchmarks/program_calls.py), which node-by-node profiles misstate at 2 threads. */
long mrt_program_run_timed(const mrt_call *calls, long n, int *rc, double *ns);

#endif
