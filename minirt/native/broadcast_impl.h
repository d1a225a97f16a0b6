/* Elementwise operations with numpy broadcasting over any operand shapes, for the types real graphs
 * compute masks, indices and shapes in (float32 / float64 / int32 / int64 / bool), compiled once.
 * Included by kernels.c after index_copy_impl.h (whose CAST_* type codes it uses).
 *
 * mrt_broadcast: y[i] = op(a[i], b[i][, c[i]]) over y's shape (the map's), each operand read through
 *   its own element strides per axis (0 along an axis it is broadcast over).  Python builds the map
 *   once per operand shapes (minirt/kernels/_native_broadcast.py), axes merged where every operand
 *   allows it.  The float comparisons are IEEE's (NaN unequal to everything, as numpy); Div is for
 *   float types only (integer division by zero would trap: the caller keeps it in numpy); Max / Min
 *   propagate NaN (numpy's maximum / minimum).  The unary float functions (Sqrt, Reciprocal, Neg,
 *   Abs, Exp, Log, Floor, Ceil) read a only; Sqrt, Reciprocal, Neg, Abs, Floor and Ceil are exact
 *   (numpy's results), Exp and Log the C library's (within an ulp or two of numpy's); Pow (float
 *   types) is the C library's pow, as numpy's float power (x ** 2 exact: Silero VAD's STFT power). */

#define EW_LOOP(EXPR)                                                                              \
    for (long i = 0; i < n; ++i) {                                                                 \
        const long ia = i * sa, ib = i * sb, ic = i * sc;                                          \
        (void)ia, (void)ib, (void)ic;                                                              \
        EXPR;                                                                                      \
    }

/* one row of n output elements of operand type T; the arithmetic in U (T itself for floats, the
 * unsigned type of T's size for integers: they wrap around as numpy's do, with no signed overflow) */
#define EW_ROW(T, U)                                                                               \
    do {                                                                                           \
        const T *A = (const T *)pa, *B = (const T *)pb, *Cc = (const T *)pc;                       \
        T *Y = (T *)py;                                                                            \
        uint8_t *Yb = (uint8_t *)py;                                                               \
        const uint8_t *Ab = (const uint8_t *)pa;                                                   \
        (void)Cc, (void)Ab, (void)Y, (void)Yb, (void)B;                                            \
        switch (m->op) {                                                                           \
        case MRT_EW_ADD: EW_LOOP(Y[i] = (T)((U)A[ia] + (U)B[ib])) break;                           \
        case MRT_EW_SUB: EW_LOOP(Y[i] = (T)((U)A[ia] - (U)B[ib])) break;                           \
        case MRT_EW_MUL: EW_LOOP(Y[i] = (T)((U)A[ia] * (U)B[ib])) break;                           \
        case MRT_EW_DIV: EW_LOOP(Y[i] = A[ia] / B[ib]) break;                                      \
        case MRT_EW_EQUAL: EW_LOOP(Yb[i] = A[ia] == B[ib]) break;                                  \
        case MRT_EW_LESS: EW_LOOP(Yb[i] = A[ia] < B[ib]) break;                                    \
        case MRT_EW_LESS_EQUAL: EW_LOOP(Yb[i] = A[ia] <= B[ib]) break;                             \
        case MRT_EW_GREATER: EW_LOOP(Yb[i] = A[ia] > B[ib]) break;                                 \
        case MRT_EW_GREATER_EQUAL: EW_LOOP(Yb[i] = A[ia] >= B[ib]) break;                          \
        case MRT_EW_MAX: EW_LOOP(Y[i] = (A[ia] != A[ia] || A[ia] > B[ib]) ? A[ia] : B[ib]) break;  \
        case MRT_EW_MIN: EW_LOOP(Y[i] = (A[ia] != A[ia] || A[ia] < B[ib]) ? A[ia] : B[ib]) break;  \
        case MRT_EW_WHERE: {                                                                       \
            const T *Bv = (const T *)pb, *Cv = (const T *)pc;                                      \
            EW_LOOP(Y[i] = Ab[ia] ? Bv[ib] : Cv[ic]) break;                                        \
        }                                                                                          \
        default: break;                                                                            \
        }                                                                                          \
    } while (0)

/* one row of the float functions of operand type T (float or double), with T's C library functions */
#define EW_FLOAT_ROW(T, SQRT, FABS, EXP, LOG, FLOOR, CEIL, POW)                                    \
    do {                                                                                           \
        const T *A = (const T *)pa, *B = (const T *)pb; /* (B: Pow's exponents only) */            \
        T *Y = (T *)py;                                                                            \
        switch (m->op) {                                                                           \
        case MRT_EW_POW: EW_LOOP(Y[i] = POW(A[ia], B[ib])) break;                                  \
        case MRT_EW_SQRT: EW_LOOP(Y[i] = SQRT(A[ia])) break;                                       \
        case MRT_EW_RECIPROCAL: EW_LOOP(Y[i] = (T)1 / A[ia]) break;                                \
        case MRT_EW_NEG: EW_LOOP(Y[i] = -A[ia]) break;                                             \
        case MRT_EW_ABS: EW_LOOP(Y[i] = FABS(A[ia])) break;                                        \
        case MRT_EW_EXP: EW_LOOP(Y[i] = EXP(A[ia])) break;                                         \
        case MRT_EW_LOG: EW_LOOP(Y[i] = LOG(A[ia])) break;                                         \
        case MRT_EW_FLOOR: EW_LOOP(Y[i] = FLOOR(A[ia])) break;                                     \
        default: EW_LOOP(Y[i] = CEIL(A[ia])) break;                                                \
        }                                                                                          \
    } while (0)

typedef struct {
    const mrt_broadcast_map *m;
    const char *a, *b, *c;
    char *y;
    int in_size, out_size; /* bytes per element of b / c (and a but for Where), and of y */
} broadcast_args;

static void broadcast_task(void *ctx, long begin, long end) {
    const broadcast_args *t = (const broadcast_args *)ctx;
    const mrt_broadcast_map *m = t->m;
    const int r = m->rank;
    const long n = m->shape[r - 1];
    const long sa = m->strides[0][r - 1], sb = m->strides[1][r - 1], sc = m->strides[2][r - 1];
    const int a_size = m->op == MRT_EW_WHERE ? 1 : t->in_size;
    long idx[MRT_INDEX_MAX_RANK] = {0};
    rows_odometer_start(m->shape, r, begin, idx);
    for (long row = begin; row < end; ++row) {
        long oa = 0, ob = 0, oc = 0;
        for (int a = 0; a < r - 1; ++a) {
            oa += idx[a] * m->strides[0][a];
            ob += idx[a] * m->strides[1][a];
            oc += idx[a] * m->strides[2][a];
        }
        const char *pa = t->a + oa * a_size, *pb = t->b ? t->b + ob * t->in_size : NULL;
        const char *pc = t->c ? t->c + oc * t->in_size : NULL;
        char *py = t->y + row * n * t->out_size;
        if (m->op == MRT_EW_AND || m->op == MRT_EW_OR || m->op == MRT_EW_XOR || m->op == MRT_EW_NOT) {
            const uint8_t *A = (const uint8_t *)pa, *B = (const uint8_t *)pb;
            uint8_t *Y = (uint8_t *)py;
            switch (m->op) {
            case MRT_EW_AND: EW_LOOP(Y[i] = (A[ia] != 0) & (B[ib] != 0)) break;
            case MRT_EW_OR: EW_LOOP(Y[i] = (A[ia] != 0) | (B[ib] != 0)) break;
            case MRT_EW_XOR: EW_LOOP(Y[i] = (A[ia] != 0) ^ (B[ib] != 0)) break;
            default: EW_LOOP(Y[i] = A[ia] == 0) break;
            }
        } else if (m->op >= MRT_EW_SQRT) { /* the float functions, Pow included (float types only) */
            if (m->type == CAST_F32)
                EW_FLOAT_ROW(float, sqrtf, fabsf, expf, logf, floorf, ceilf, powf);
            else
                EW_FLOAT_ROW(double, sqrt, fabs, exp, log, floor, ceil, pow);
        } else {
            switch (m->type) {
            case CAST_F32: EW_ROW(float, float); break;
            case CAST_F64: EW_ROW(double, double); break;
            case CAST_I32: EW_ROW(int32_t, uint32_t); break;
            case CAST_I64: EW_ROW(int64_t, uint64_t); break;
            default: EW_ROW(uint8_t, uint8_t); break; /* uint8 / bool operands (comparisons, Where) */
            }
        }
        rows_odometer_next(m->shape, r, idx);
    }
}

#undef EW_FLOAT_ROW
#undef EW_ROW
#undef EW_LOOP

int mrt_broadcast(const mrt_broadcast_map *m, const void *a, const void *b, const void *c, void *y, int nthreads) {
    const int size = cast_elem_size(m->type);
    if (m->rank < 1 || m->rank > MRT_INDEX_MAX_RANK || !size || m->op < MRT_EW_ADD || m->op > MRT_EW_POW)
        return -2;
    const int unary = m->op == MRT_EW_NOT || (m->op >= MRT_EW_SQRT && m->op <= MRT_EW_CEIL);
    if (m->op >= MRT_EW_SQRT && m->type != CAST_F32 && m->type != CAST_F64) return -2; /* (Pow too) */
    if (m->op == MRT_EW_DIV && m->type != CAST_F32 && m->type != CAST_F64) return -2;
    if ((m->op == MRT_EW_WHERE && (!b || !c)) || (!unary && !b)) return -2;
    const int logical = m->op >= MRT_EW_EQUAL && m->op <= MRT_EW_NOT;
    long rows = 1;
    for (int ax = 0; ax < m->rank - 1; ++ax) rows *= m->shape[ax];
    const long n = m->shape[m->rank - 1];
    if (rows <= 0 || n <= 0) return 0;
    broadcast_args t = {m, (const char *)a, (const char *)b, (const char *)c, (char *)y, size, logical ? 1 : size};
    mrt_parallel_for(rows, n, nthreads, broadcast_task, &t);
    return 0;
}

/* mrt_reduce_f32: y[o, j] = reduce over k of x[o, k, j] for x (outer, n, inner) float32: the ONNX
 * reductions over one block of consecutive axes (outer: the axes before it, inner: after).  Sums are
 * accumulated in double and rounded once (numpy's pairwise float32 sums agree to float32 rounding);
 * Max / Min propagate NaN as numpy does (any NaN in a reduced run makes its result NaN).  Work items:
 * an outer index times a chunk of REDUCE_CHUNK inner positions.  The op is resolved outside the
 * loops (one loop per op, which the compiler vectorizes over j); a reduction over the last axis
 * (inner == 1, e.g. GlobalMaxPool over (N, C, L)) runs a row of n as REDUCE_LANES interleaved
 * partial results combined at the end (the scalar walk was 2.5 ns per value: magika's
 * GlobalMaxPool over 512 x 508 took 1.3 ms against numpy's 0.07). */
#define REDUCE_CHUNK 64L
#define REDUCE_LANES 16L

typedef struct {
    int op;
    const float *x;
    float *y;
    long outer, n, inner, chunks;
} reduce_args;

/* 4-float and 2-double vectors (SSE2 / NEON width; the compiler did not vectorize the plain loops:
 * the NaN flags and the float -> double sums) */
typedef float reduce_v4f __attribute__((vector_size(16)));
typedef float reduce_v4fu __attribute__((vector_size(16), aligned(4)));
typedef int reduce_v4i __attribute__((vector_size(16)));
typedef int reduce_v4iu __attribute__((vector_size(16), aligned(4)));
typedef double reduce_v2d __attribute__((vector_size(16)));

/* Lanes j0 .. j0 + 4 * nv of acc / ext / nan (see reduce_rows) over rows k0 <= k < k1: nv vectors of 4
 * (a constant: 4 or 1), their chains independent so that the compare-select latency overlaps. */
static inline __attribute__((always_inline)) void reduce_vectors(int op, const float *x, long stride, long k0,
                                                                 long k1, long j0, const int nv, double *acc,
                                                                 float *ext, int *nan) {
    reduce_v4f e[4];
    reduce_v4i bad[4];
    reduce_v2d lo[4], hi[4];
    for (int v = 0; v < nv; ++v) {
        const long j = j0 + 4 * v;
        e[v] = *(const reduce_v4fu *)(ext + j);
        bad[v] = *(const reduce_v4iu *)(nan + j);
        lo[v] = (reduce_v2d){acc[j], acc[j + 1]};
        hi[v] = (reduce_v2d){acc[j + 2], acc[j + 3]};
    }
    for (long k = k0; k < k1; ++k) {
        const float *row = x + k * stride + j0;
        for (int v = 0; v < nv; ++v) {
            const reduce_v4f val = *(const reduce_v4fu *)(row + 4 * v);
            if (op == MRT_REDUCE_MAX || op == MRT_REDUCE_MIN) {
                const reduce_v4i take = op == MRT_REDUCE_MAX ? val > e[v] : val < e[v];
                bad[v] |= val != val;
                e[v] = (reduce_v4f)(((reduce_v4i)val & take) | ((reduce_v4i)e[v] & ~take));
            } else {
                reduce_v2d a = {val[0], val[1]}, b = {val[2], val[3]};
                if (op == MRT_REDUCE_SUM_SQUARE) {
                    a *= a;
                    b *= b;
                }
                lo[v] += a;
                hi[v] += b;
            }
        }
    }
    for (int v = 0; v < nv; ++v) {
        const long j = j0 + 4 * v;
        *(reduce_v4fu *)(ext + j) = e[v];
        for (int i = 0; i < 4; ++i) nan[j + i] = bad[v][i] != 0;
        acc[j] = lo[v][0], acc[j + 1] = lo[v][1], acc[j + 2] = hi[v][0], acc[j + 3] = hi[v][1];
    }
}

/* acc[j] (w lanes) = op of acc[j] and rows k0 <= k < k1 of x (row stride `stride`): Max/Min keep
 * the extreme of the non-NaN values in ext[j] and flag NaN lanes in nan[j]; sums go to acc[j]
 * (double).  Lanes in groups of 16 and 4 (vectors), the last w % 4 one at a time. */
static inline __attribute__((always_inline)) void reduce_rows(int op, const float *x, long stride, long k0, long k1,
                                                              long w, double *acc, float *ext, int *nan) {
    long j = 0;
    for (; j + 16 <= w; j += 16) reduce_vectors(op, x, stride, k0, k1, j, 4, acc, ext, nan);
    for (; j + 4 <= w; j += 4) reduce_vectors(op, x, stride, k0, k1, j, 1, acc, ext, nan);
    for (; j < w; ++j)
        for (long k = k0; k < k1; ++k) {
            const float v = x[k * stride + j];
            if (op == MRT_REDUCE_MAX || op == MRT_REDUCE_MIN) {
                nan[j] |= v != v;
                if (op == MRT_REDUCE_MAX ? v > ext[j] : v < ext[j]) ext[j] = v;
            } else
                acc[j] += op == MRT_REDUCE_SUM_SQUARE ? (double)v * v : (double)v;
        }
}

/* reduce_rows with the op a constant in each copy (the branches leave the loops) */
static void reduce_rows_op(int op, const float *x, long stride, long k0, long k1, long w, double *acc, float *ext,
                           int *nan) {
    switch (op) {
    case MRT_REDUCE_MAX:
        reduce_rows(MRT_REDUCE_MAX, x, stride, k0, k1, w, acc, ext, nan);
        break;
    case MRT_REDUCE_MIN:
        reduce_rows(MRT_REDUCE_MIN, x, stride, k0, k1, w, acc, ext, nan);
        break;
    case MRT_REDUCE_SUM_SQUARE:
        reduce_rows(MRT_REDUCE_SUM_SQUARE, x, stride, k0, k1, w, acc, ext, nan);
        break;
    default:
        reduce_rows(MRT_REDUCE_SUM, x, stride, k0, k1, w, acc, ext, nan);
    }
}

static void reduce_task(void *ctx, long begin, long end) {
    const reduce_args *t = (const reduce_args *)ctx;
    const int op = t->op, extreme = op == MRT_REDUCE_MAX || op == MRT_REDUCE_MIN;
    double acc[REDUCE_CHUNK];
    float ext[REDUCE_CHUNK];
    int nan[REDUCE_CHUNK];
    for (long item = begin; item < end; ++item) {
        const long o = item / t->chunks, j0 = (item % t->chunks) * REDUCE_CHUNK;
        const float *x = t->x + o * t->n * t->inner + j0;
        float *y = t->y + o * t->inner + j0;
        if (t->inner == 1) { /* one contiguous row of n: REDUCE_LANES interleaved partials */
            const long n = t->n, body = n / REDUCE_LANES * REDUCE_LANES;
            for (long j = 0; j < REDUCE_LANES; ++j) {
                acc[j] = 0.0;
                ext[j] = x[0];
                nan[j] = 0;
            }
            if (body) reduce_rows_op(op, x, REDUCE_LANES, 0, body / REDUCE_LANES, REDUCE_LANES, acc, ext, nan);
            reduce_rows_op(op, x + body, 1, 0, n - body, 1, acc, ext, nan); /* the tail in lane 0 */
            double s = 0.0;
            float e = ext[0];
            int any_nan = 0;
            for (long j = 0; j < REDUCE_LANES; ++j) {
                s += acc[j];
                any_nan |= nan[j];
                if (op == MRT_REDUCE_MAX ? ext[j] > e : ext[j] < e) e = ext[j];
            }
            *y = extreme ? (any_nan ? __builtin_nanf("") : e) : (float)(op == MRT_REDUCE_MEAN ? s / (double)n : s);
            continue;
        }
        const long w = t->inner - j0 < REDUCE_CHUNK ? t->inner - j0 : REDUCE_CHUNK;
        for (long j = 0; j < w; ++j) {
            acc[j] = 0.0;
            ext[j] = x[j];
            nan[j] = 0;
        }
        reduce_rows_op(op, x, t->inner, 0, t->n, w, acc, ext, nan);
        for (long j = 0; j < w; ++j)
            y[j] = extreme ? (nan[j] ? __builtin_nanf("") : ext[j])
                           : (float)(op == MRT_REDUCE_MEAN ? acc[j] / (double)t->n : acc[j]);
    }
}

int mrt_reduce_f32(int op, const float *x, float *y, long outer, long n, long inner, int nthreads) {
    if (op < MRT_REDUCE_SUM || op > MRT_REDUCE_SUM_SQUARE || n <= 0 || inner <= 0) return -2;
    if (outer <= 0) return 0;
    const long chunks = (inner + REDUCE_CHUNK - 1) / REDUCE_CHUNK;
    reduce_args t = {op, x, y, outer, n, inner, chunks};
    mrt_parallel_for(outer * chunks, n * (inner < REDUCE_CHUNK ? inner : REDUCE_CHUNK) / 4, nthreads, reduce_task, &t);
    return 0;
}

/* mrt_reduce_int (kernels.h): one loop per type and op; small inputs (attention masks), one thread. */
#define REDUCE_INT_LOOP(T)                                                                             \
    do {                                                                                               \
        const T *xt = (const T *)x;                                                                    \
        T *yt = (T *)y;                                                                                \
        for (long o = 0; o < outer; o++)                                                               \
            for (long j = 0; j < inner; j++) {                                                         \
                const T *p = xt + o * n * inner + j;                                                   \
                T acc = p[0];                                                                          \
                for (long k = 1; k < n; k++) {                                                         \
                    const T v = p[k * inner];                                                          \
                    if (op == MRT_REDUCE_SUM)                                                          \
                        acc = (T)((unsigned long long)acc + (unsigned long long)v); /* wraps */        \
                    else if (op == MRT_REDUCE_MAX ? v > acc : v < acc)                                 \
                        acc = v;                                                                       \
                }                                                                                      \
                yt[o * inner + j] = acc;                                                               \
            }                                                                                          \
    } while (0)

int mrt_reduce_int(int op, int type, const void *x, void *y, long outer, long n, long inner, int nthreads) {
    (void)nthreads;
    if ((op != MRT_REDUCE_SUM && op != MRT_REDUCE_MAX && op != MRT_REDUCE_MIN) || n <= 0 || inner <= 0 ||
        (type != 6 && type != 7))
        return -2;
    if (type == 6)
        REDUCE_INT_LOOP(int32_t);
    else
        REDUCE_INT_LOOP(int64_t);
    return 0;
}
#undef REDUCE_INT_LOOP
