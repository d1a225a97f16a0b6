/* minirt native kernels: the C interface seen by cffi (minirt/native/build_native.py).
 *
 * Everything here is float32, NCHW, contiguous.  Every kernel takes the
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

#include <stdint.h>

/* CPU feature bits reported by mrt_cpu_features(). */
#define MRT_FEAT_AVX2 1
#define MRT_FEAT_FMA 2
#define MRT_FEAT_NEON 4
#define MRT_FEAT_ASIMDDP 8
#define MRT_FEAT_AVX512F 16
#define MRT_FEAT_AVX512VNNI 32

/* Implementations selectable with mrt_select_isa(). */
#define MRT_ISA_BEST -1
#define MRT_ISA_BASELINE 0
#define MRT_ISA_AVX2 1
#define MRT_ISA_AVX512 2
#define MRT_ISA_NEON 3    /* aarch64: NEON (the float kernels are the baseline code, which is NEON there) */
#define MRT_ISA_DOTPROD 4 /* aarch64 + ARMv8.2 dot product (HWCAP_ASIMDDP): NEON + SDOT int8 GEMM */

/* Activations of the fused epilogues (parameters a0, a1). */
#define MRT_ACT_NONE 0
#define MRT_ACT_RELU 1
#define MRT_ACT_CLIP 2        /* min(max(x, a0), a1) */
#define MRT_ACT_LEAKY 3       /* x >= 0 ? x : a0 * x */
#define MRT_ACT_SIGMOID 4
#define MRT_ACT_SILU 5        /* x * sigmoid(x) */
#define MRT_ACT_HARDSIGMOID 6 /* max(0, min(1, a0 * x + a1)) */
#define MRT_ACT_HARDSWISH 7   /* x * hardsigmoid(x, 1/6, 1/2) */
#define MRT_ACT_GELU 8        /* 0.5 x (1 + erf(x / sqrt 2)) */
#define MRT_ACT_GELU_TANH 9   /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */

int mrt_abi_version(void);
unsigned mrt_cpu_features(void);
/* Select an implementation; returns the one in use (BEST -> the best supported,
 * an unsupported request falls back to the baseline). */
int mrt_select_isa(int isa);
int mrt_current_isa(void);
int mrt_max_threads(void);

/* Depthwise 2-D convolution: x (n, c, h, w), w (c, kh, kw), bias (c) or NULL,
 * residual (n, c, oh, ow) or NULL, y (n, c, oh, ow) = act(conv + bias +
 * residual).  Padding is implicit (zeros): pt/pl are the top/left pads, the
 * bottom/right ones follow from oh/ow. */
void mrt_dwconv2d_f32(const float *x, const float *w, const float *bias, const float *residual, float *y, int n, int c,
                      int h, int wd, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int oh, int ow,
                      int act, float a0, float a1, int nthreads);

/* int8 depthwise 2-D convolution (QConv with group == c): per channel ch,
 *   acc = sum over the taps of (xq - x_zero[ch]) * w[ch, ky, kx]   (exact integers; padding is xq == x_zero)
 *   y   = post_a * act(scale[ch] * acc + bias[ch] + res) + post_b
 * with xq the uint8 input (xq != NULL) or quantize_u8(x / x_scale[ch] + x_zero[ch]) of the float
 * input x; w holds the int8 weights as floats (c, kh, kw); bias and res may be NULL.  The output is
 * the float y, or with yq != NULL the uint8 clamp(rint(y / y_scale) + y_zero, 0, 255).
 * kh * kw <= 514 (integer sums exact in float32). */
typedef struct {
    const float *x;
    const uint8_t *xq;
    const float *x_scale, *x_zero; /* per channel; x_zero integer valued in [0, 255] */
    const float *w, *scale, *bias, *res;
    float *y;
    uint8_t *yq;
    float y_scale;
    int y_zero;
    int act;
    float a0, a1, post_a, post_b;
} mrt_qdw_params;
void mrt_qdwconv2d(const mrt_qdw_params *params, int n, int c, int h, int wd, int kh, int kw, int sh, int sw, int dh,
                   int dw, int pt, int pl, int oh, int ow, int nthreads);

/* Max pooling over planes x (nc, h, w) -> y (nc, oh, ow); taps outside the
 * input are ignored (as if padded with -inf).  NaN propagates. */
void mrt_maxpool2d_f32(const float *x, float *y, int nc, int h, int wd, int kh, int kw, int sh, int sw, int dh, int dw,
                       int pt, int pl, int oh, int ow, int nthreads);

/* Average pooling: sum of the taps inside the input, divided by the number
 * of taps inside the counting box [ch0, ch1) x [cw0, cw1) (input coordinates),
 * or multiplied by `scale` when scale > 0. */
void mrt_avgpool2d_f32(const float *x, float *y, int nc, int h, int wd, int kh, int kw, int sh, int sw, int dh, int dw,
                       int pt, int pl, int oh, int ow, int ch0, int ch1, int cw0, int cw1, float scale, int nthreads);

/* Fused epilogue, in place: y (n, c, plane) = act(y + bias[c] + residual).
 * bias and residual (same shape as y) may be NULL. */
void mrt_bias_act_f32(float *y, const float *bias, const float *residual, int n, int c, long plane, int act, float a0,
                      float a1, int nthreads);

/* im2col of one image: x (c, h, w) -> cols (c*kh*kw, oh*ow), zeros for padding. */
void mrt_im2col_f32(const float *x, float *cols, int c, int h, int wd, int kh, int kw, int sh, int sw, int dh, int dw,
                    int pt, int pl, int oh, int ow, int nthreads);

/* A whole float32 convolution (NCHW, any batch): y (n, m, oh, ow) = act(conv(x, w) + bias[m] + res),
 * w (m, c/group, kh, kw), bias and res (same shape as y) may be NULL.  The GEMM of mrt_sgemm_f32
 * with the epilogue fused; images with wide enough output rows as an implicit GEMM (B read from
 * padded, stride-phase-split planes of the input, built band by band, no im2col matrix), small
 * images through im2col in per-thread scratch with the columns of several in one GEMM; threads
 * over images, bands of output rows, or the GEMM.  Returns 0, or -1 without scratch memory. */
int mrt_conv2d_f32(const float *x, int n, int c, int h, int wd, const float *w, int m, int group, int kh, int kw,
                   int sh, int sw, int dh, int dw, int pt, int pl, int oh, int ow, const float *bias, const float *res,
                   float *y, int act, float a0, float a1, int nthreads);

/* mrt_conv2d_f32 with the weights also pre-packed (packed_w, from mrt_conv2d_pack_w under the same
 * ISA, mrt_conv2d_packed_w_floats(m, group, c/group*kh*kw) floats; NULL: none) for the
 * channel-vector kernel, which images with a GEMM of their own then take (output channels as vector
 * lanes: no output column computed and dropped; the same sums as the GEMM's, bit for bit; strided
 * layers read the input in place, without planes, see mrt_conv2d_in_place_mode).  It pays
 * where mrt_conv2d_uses_packed_w says so (depends on the geometry alone, not on the batch or the
 * threads): pack for those layers. */
int mrt_conv2d_uses_packed_w(int c, int m, int group, int kh, int kw, int sh, int sw, int oh, int ow);
/* Test hook: whether mrt_conv2d_packed_f32 reads the input in place on the channel-vector kernel
 * (kernels larger than 1x1 or strided; the output's borders from small padded windows) instead of
 * building planes: -1 (the default) where that pays, 0 never, 1 always.  Returns the previous mode. */
int mrt_conv2d_in_place_mode(int mode);
long mrt_conv2d_packed_w_floats(int m, int group, int k);
void mrt_conv2d_pack_w(const float *w, int m, int group, int k, float *packed_w);
int mrt_conv2d_packed_f32(const float *x, int n, int c, int h, int wd, const float *w, const float *packed_w, int m,
                          int group, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int oh, int ow,
                          const float *bias, const float *res, float *y, int act, float a0, float a1, int nthreads);

/* float32 GEMM with fused epilogue, all row-major:
 *   C[m, n] = act(sum_k A[m, k] B[k, n] + bias + res[m, n])
 * bias_mode 1: bias[m] (per row, conv channels), 2: bias[n] (per column,
 * MatMul/Gemm), ignored when bias is NULL; res may be NULL. */
void mrt_sgemm_f32(int M, int N, int K, const float *A, long lda, const float *B, long ldb, float *C, long ldc,
                   const float *bias, int bias_mode, const float *res, long ldr, int act, float a0, float a1,
                   int nthreads);

/* Batched form: matrix i uses A + i*sa, B + i*sb, C + i*sc, res + i*sr
 * (strides in elements, 0 to broadcast).  transb: B is stored transposed,
 * (N x K) with row stride ldb, i.e. B[k, n] = B_stored[n * ldb + k]. */
void mrt_sgemm_batch_f32(int batch, int M, int N, int K, const float *A, long lda, long sa, const float *B, long ldb,
                         long sb, int transb, float *C, long ldc, long sc, const float *bias, int bias_mode,
                         const float *res, long ldr, long sr, int act, float a0, float a1, int nthreads);

/* int8 GEMM: u8 activations X (K x N, row stride ldx, zero point x_zero)
 * times s8 symmetric weights W (M x K, packed once by mrt_qgemm_pack_w into
 * mrt_qgemm_packed_size(M, K) bytes, 64-byte aligned), float output:
 *   C[m, n] = act(scale[m] * sum_k W[m, k] (X[k, n] - x_zero) + bias[m] + res[m, n])
 * Exact int32 accumulation.  bias and res may be NULL. */
long mrt_qgemm_packed_size(int M, int K);
void mrt_qgemm_pack_w(const int8_t *w, int M, int K, void *packed);
void mrt_qgemm_u8s8_f32(int M, int N, int K, const void *packed_w, const uint8_t *X, long ldx, int x_zero,
                        const float *scale, const float *bias, float *C, long ldc, const float *res, long ldr, int act,
                        float a0, float a1, int nthreads);
/* The int8 GEMM microkernel in use: 1 AVX512-VNNI, 2 aarch64 SDOT (dot product), 0 the portable one. */
/* Softmax (log = 0) or LogSoftmax (log = 1) of each of `rows` contiguous rows of n floats; y may be x. */
/* A product with a constant right operand, B packed once: mrt_sgemm_pack_b_f32 writes B (K x N, row
 * stride ldb; with transb stored N x K) into mrt_sgemm_packed_b_floats(K, N) floats in the layout of the
 * ISA in use (repack after mrt_select_isa); mrt_sgemm_pb_f32 is mrt_sgemm_f32 on it (identical results). */
long mrt_sgemm_packed_b_floats(int K, int N);
void mrt_sgemm_pack_b_f32(const float *B, long ldb, int transb, int K, int N, float *out);
void mrt_sgemm_pb_f32(int M, int N, int K, const float *A, long lda, const float *bpack, float *C, long ldc,
                      const float *bias, int bias_mode, const float *res, long ldr, int act, float a0, float a1,
                      int nthreads);
/* Matrix-vector product for a few rows of A (M small), B read in place (not packed), threads over
 * the output columns: C[m, n] = act(sum_k A[m, k] B[k, n] + bias[n]) with B K x N (row stride ldb)
 * or, with transb, stored N x K (B[k, n] = B_stored[n * ldb + k]); bias may be NULL. */
void mrt_sgemv_f32(int M, int N, int K, const float *A, long lda, const float *B, long ldb, int transb, float *C,
                   long ldc, const float *bias, int act, float a0, float a1, int nthreads);
void mrt_softmax_f32(const float *x, float *y, long rows, long n, int log, int nthreads);
/* y[r, :] = (x[r, :] - mean_r) / sqrt(var_r + eps) * scale + bias over rows of n floats (LayerNormalization
 * over the trailing axes); bias may be NULL; x and y may be the same buffer. */
void mrt_layernorm_f32(const float *x, const float *scale, const float *bias, float *y, long rows, long n, float eps,
                       int nthreads);
int mrt_qgemm_isa(void);
/* q[i] = clamp(rint(x[i] / scale) + zp, 0, 255) */
void mrt_quantize_u8_f32(const float *x, uint8_t *q, long n, float scale, int zp, int nthreads);
/* The same of x + nearest-upsampled xu: planes of h x w floats in x, of (h / f) x (w / f) in xu (h, w
 * multiples of f >= 1); q[p][i][j] = quantize(x[p][i][j] * xm[p] + xu[p][i / f][j / f] * um[p]) (xm,
 * um NULL: no multiplier; products rounded to float before the add), or of the upsampled xu * um
 * alone when x is NULL.  Returns -1 when its per-thread scratch cannot be allocated. */
int mrt_quantize_add_up_u8_f32(const float *x, const float *xm, const float *xu, const float *um, long planes, int h,
                               int w, int f, uint8_t *q, float scale, int zp, int nthreads);
/* im2col of one uint8 image, padding with `pad` (the zero point). */
void mrt_im2col_u8(const uint8_t *x, uint8_t *cols, int c, int h, int wd, int kh, int kw, int sh, int sw, int dh,
                   int dw, int pt, int pl, int oh, int ow, int pad, int nthreads);

/* A whole int8 convolution with float input and output (NCHW): quantizes x with
 * (x_scale, x_zero) into per-thread scratch, im2col (u8), and the int8 GEMM per group;
 * packed_w from mrt_qgemm_pack_w of the (m, c/group*kh*kw) weights.  Returns 0, or -1
 * when the scratch could not be allocated. */
int mrt_qconv2d_f32(const float *x, int n, int c, int h, int wd, float x_scale, int x_zero, const void *packed_w, int m,
                    int group, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int oh, int ow,
                    const float *scale, const float *bias, const float *res, float *y, int act, float a0, float a1,
                    int nthreads);
/* The same with x uint8 when x_u8 (no quantization; x_scale unused), y = post_a * act(...) + post_b
 * and, when yq is not NULL, a uint8 output yq = clamp(rint(y / y_scale[o]) + y_zero[o], 0, 255) per
 * output channel o instead of the float y (see qgemm.h). */
int mrt_qconv2d_q(const void *x, int x_u8, int n, int c, int h, int wd, float x_scale, int x_zero,
                  const void *packed_w, int m, int group, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                  int oh, int ow, const float *scale, const float *bias, const float *res, float *y, uint8_t *yq,
                  const float *y_scale, const int32_t *y_zero, int act, float a0, float a1, float post_a, float post_b,
                  int nthreads);
/* mrt_qconv2d_q with a float output max-pooled in the output stage: y (n, m, poh, pow) = MaxPool of
 * the (n, m, oh, ow) conv result over (pkh, pkw) windows at strides (psh, psw), no padding, NaN
 * propagating: poh = (oh - pkh) / psh + 1, pow likewise.  Returns 0, -1 without scratch memory,
 * -2 for a window that does not fit. */
int mrt_qconv2d_pool_f32(const void *x, int x_u8, int n, int c, int h, int wd, float x_scale, int x_zero,
                         const void *packed_w, int m, int group, int kh, int kw, int sh, int sw, int dh, int dw, int pt,
                         int pl, int oh, int ow, const float *scale, const float *bias, const float *res, int pkh,
                         int pkw, int psh, int psw, float *y, int act, float a0, float a1, int nthreads);
/* ConvTranspose with stride == kernel (kh x kw), no padding, one group, int8: y (n, m, h*kh, wd*kw) float
 * (or yq uint8: requantized as mrt_qconv2d_q's per GEMM row) from x (n, c, h, wd) uint8 with zero point
 * x_zero, packed_w from mrt_qgemm_pack_w of the (m*kh*kw, c) int8 weights (row (mi*kh + t)*kw + u =
 * W[:, mi, t, u]); scale, bias, y_scale, y_zero per GEMM row (bias may be NULL).  Returns 0, -1 without
 * scratch memory, -2 for bad arguments (exactly one of y and yq must be given). */
int mrt_qconvtranspose_tiles(const uint8_t *x, int x_zero, int n, int c, int h, int wd, const void *packed_w, int m,
                             int kh, int kw, const float *scale, const float *bias, float *y, uint8_t *yq,
                             const float *y_scale, const int32_t *y_zero, int act, float a0, float a1, int nthreads);
/* y (rows, n) = act(scale[j] * sum_k (quant(a[r, k]) - x_zero) W[j, k] + bias[j]), a float (rows, K),
 * W the (n, K) int8 weights packed by mrt_qgemm_pack_w.  Returns 0, or -1 without scratch memory. */
int mrt_qmatmul_f32(const float *a, long rows, int K, float x_scale, int x_zero, const void *packed_w, int n,
                    const float *scale, const float *bias, float *y, int act, float a0, float a1, int nthreads);

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
/* ConvTranspose with stride == kernel, no padding, dilation 1, one group: x (n, c, h, wd),
 * wt (m*kh*kw, c) the weight (c, m, kh, kw) transposed, bias (m*kh*kw) per GEMM row or NULL,
 * y (n, m, h*kh, wd*kw) = act(conv_transpose(x) + bias).  Returns 0, or -1 without scratch memory. */
int mrt_convtranspose_tiles_f32(const float *x, int n, int c, int h, int wd, const float *wt, int m, int kh, int kw,
                                const float *bias, float *y, int act, float a0, float a1, int nthreads);
/* Max pooling with stride 1 and dilation 1 over planes x (planes, h, wd) -> y (planes, oh, ow),
 * top/left pads pt/pl (taps outside the input ignored), separable: rows, then columns.
 * NaN propagates.  Returns 0, or -1 without scratch memory. */
int mrt_maxpool2d_s1_f32(const float *x, float *y, long planes, int h, int wd, int kh, int kw, int pt, int pl, int oh,
                         int ow, int nthreads);

/* Native programs (program_impl.h): a run of kernel calls recorded once by a session (see
 * minirt/native/program.py) and replayed by one C call, without Python between the calls.
 * A call names its entry point by an MRT_CALL_* code and holds that entry point's arguments in
 * declaration order, one mrt_arg each, in the member of the parameter's type (pointers in p, int
 * in i, long in l, float in f). */
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
#define MRT_CALL_CONV2D_PACKED_F32 2
#define MRT_CALL_DWCONV2D_F32 3
#define MRT_CALL_MAXPOOL2D_F32 4
#define MRT_CALL_MAXPOOL2D_S1_F32 5
#define MRT_CALL_SGEMM_PB_F32 6
#define MRT_CALL_SGEMM_BATCH_F32 7
#define MRT_CALL_QCONV2D_F32 8
#define MRT_CALL_QCONV2D_Q 9
#define MRT_CALL_QCONV2D_POOL_F32 10
#define MRT_CALL_QMATMUL_F32 11
#define MRT_CALL_PLANE_MEANS_F32 12
#define MRT_CALL_COPY_ROWS_F32 13
#define MRT_CALL_BINARY_F32 14
#define MRT_CALL_UPSAMPLE_NEAREST_F32 15
/* Runs calls[0 .. n) in order.  Returns -1 when every call succeeded, else the index of the first
 * call that returned non-zero (the calls after it are not run), its return code in *rc.  An
 * unknown entry code fails with *rc = -100. */
long mrt_program_run(const mrt_call *calls, long n, int *rc);

#endif
