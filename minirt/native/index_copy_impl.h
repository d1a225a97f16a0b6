/* Data movement by per-axis offset tables, compiled once (no ISA-specific code: memcpy and plain
 * loops; the copies are bound by memory).  Included by kernels.c after mrt_parallel_for.
 *
 * mrt_index_copy:  y[i_0, ..., i_{r-1}] = x[off_0[i_0] + ... + off_{r-1}[i_{r-1}]]
 *   One kernel for the ops whose source positions depend on shapes and attributes only (Transpose,
 *   Slice, Pad, Split, Expand, Tile, DepthToSpace, ...): Python turns each into one table of element
 *   offsets per output axis (minirt/kernels/index_maps.py).  An offset < 0 on any axis makes the
 *   element the fill value (constant Pad).  y is C-contiguous; x is read only at the offsets.
 *   Rows (all axes but the last) are split over the threads; a row whose last-axis offsets are one
 *   contiguous run (inner_run) is one memcpy, any other row a loop over its elements.
 *
 * mrt_gather_rows:  y[o, j, :] = x[o, idx[j], :]  (x: outer x axis x inner bytes; idx: count int64)
 *   Gather along one axis with indices known at run time (embedding lookups).  ONNX allows negative
 *   indices (counted from the end); every index is checked before anything is written.
 *
 * mrt_lookup_rows:  y[j, :] = table[ids[j] in range ? ids[j] : last row, :]  (int32 or int64 ids)
 *   com.minirt::RowLookup: a one-hot encoding times a matrix (jax's one_hot before a Dense layer), as one
 *   row copy per id instead of a product over every class; an id outside the classes reads the table's
 *   last row, the builder's row for "no class" (a one-hot row of zeros).
 *
 * mrt_cast:  y[i] = (to) x[i]  between float32 / float64 / int8 / uint8 / int32 / int64 / bool, named by
 *   their ONNX data type codes; numpy's astype results for every value a model computes with (a
 *   float to an integer type truncates toward zero; to bool: x != 0; NaN and values past the target's
 *   range give the type's minimum, numpy's result on x86-64, where C leaves them undefined). */

/* Rows of an r-axis output (every axis but the last): the outer indices of row `row`, and of the row
 * after the one in idx (an odometer over the outer axes).  Shared by mrt_index_copy and mrt_broadcast. */
static inline void rows_odometer_start(const long *shape, int r, long row, long *idx) {
    for (int a = r - 2; a >= 0; --a) {
        idx[a] = row % shape[a];
        row /= shape[a];
    }
}

static inline void rows_odometer_next(const long *shape, int r, long *idx) {
    for (int a = r - 2; a >= 0; --a) {
        if (++idx[a] < shape[a]) return;
        idx[a] = 0;
    }
}

typedef struct {
    const mrt_index_map *m;
    const char *x;
    char *y;
} index_copy_args;

static void index_fill_row(char *y, long n, int elem, uint64_t fill) {
    if (fill == 0) {
        memset(y, 0, (size_t)n * elem);
        return;
    }
    for (long i = 0; i < n; ++i) memcpy(y + i * elem, &fill, (size_t)elem); /* (little-endian: low bytes) */
}

/* The source offset of the row at outer indices idx (the sum of the outer axes' offsets); *fill set when
 * one of them is negative (the row is the fill value: constant Pad). */
static inline long index_row_base(const mrt_index_map *m, const long *idx, int *fill) {
    long base = 0;
    int f = 0;
    for (int a = 0; a < m->rank - 1; ++a) {
        const long o = m->offsets[a][idx[a]];
        f |= o < 0;
        base += o;
    }
    *fill = f;
    return base;
}

/* COPY(T) with T the unsigned integer type of the map's element size */
#define INDEX_BY_ELEM(elem, COPY)                                                             \
    do {                                                                                      \
        if ((elem) == 4)                                                                      \
            COPY(uint32_t);                                                                   \
        else if ((elem) == 8)                                                                 \
            COPY(uint64_t);                                                                   \
        else if ((elem) == 2)                                                                 \
            COPY(uint16_t);                                                                   \
        else                                                                                  \
            COPY(uint8_t);                                                                    \
    } while (0)

#define INDEX_GATHER_ROW(T)                                                                   \
    do {                                                                                      \
        const T *xs = (const T *)t->x + base;                                                 \
        T *yr = (T *)y, f;                                                                    \
        memcpy(&f, &m->fill, sizeof(T));                                                      \
        for (long i = 0; i < n; ++i) {                                                        \
            const long o = inner[i];                                                          \
            yr[i] = o < 0 ? f : xs[o];                                                        \
        }                                                                                     \
    } while (0)

static void index_copy_task(void *ctx, long begin, long end) {
    const index_copy_args *t = (const index_copy_args *)ctx;
    const mrt_index_map *m = t->m;
    const int r = m->rank, elem = m->elem;
    const long n = m->shape[r - 1];
    const long *inner = m->offsets[r - 1];
    long idx[MRT_INDEX_MAX_RANK] = {0};
    rows_odometer_start(m->shape, r, begin, idx);
    for (long row = begin; row < end; ++row) {
        int fill;
        const long base = index_row_base(m, idx, &fill);
        char *y = t->y + row * n * elem;
        if (fill)
            index_fill_row(y, n, elem, m->fill);
        else if (m->inner_run)
            memcpy(y, t->x + (base + inner[0]) * elem, (size_t)n * elem);
        else
            INDEX_BY_ELEM(elem, INDEX_GATHER_ROW);
        rows_odometer_next(m->shape, r, idx);
    }
}

#undef INDEX_GATHER_ROW

/* A transposing copy: the last axis reads x at a fixed step s > 1 and the axis before it at step 1
 * (Transpose of the last two axes of the source, NHWC <-> NCHW, ...).  Row by row, every element of an
 * output row came from another cache line of x (magika's 2048 x 256 transpose: 145 us against
 * onnxruntime's 38).  Here tiles of INDEX_TILE rows x INDEX_TILE columns: for each column, the tile's
 * rows read INDEX_TILE consecutive elements of x, and the tile's output lines stay in L1. */
#define INDEX_TILE 16

typedef struct {
    const mrt_index_map *m;
    const char *x;
    char *y;
    long step; /* the last axis' step through x, in elements */
} index_transpose_args;

/* Whether o[0..n) are o[0], o[0] + step, o[0] + 2 step, ..., none negative. */
static int index_offsets_step(const long *o, long n, long step) {
    if (o[0] < 0) return 0;
    for (long j = 1; j < n; ++j)
        if (o[j] != o[0] + j * step) return 0;
    return 1;
}

/* One band of g rows: per tile of columns, its g x w elements read column by column (each column g
 * consecutive elements of x) into a local block, then written row by row (w consecutive elements of each
 * output row): every cache line of the output is written whole, at once.  (Storing each element straight
 * into its output row kept 16 rows' lines open at a stride that is often a power of two, which mapped
 * them to the same L1 set.) */
#define INDEX_TILE_COPY(T)                                                                    \
    do {                                                                                      \
        const T *xs = (const T *)t->x + base + inner0;                                        \
        T *yr = (T *)y, block[INDEX_TILE][INDEX_TILE];                                        \
        for (long i0 = 0; i0 < n; i0 += INDEX_TILE) {                                         \
            const long w = n - i0 < INDEX_TILE ? n - i0 : INDEX_TILE;                         \
            for (long v = 0; v < w; ++v) {                                                    \
                const T *src = xs + (i0 + v) * step;                                          \
                for (long u = 0; u < g; ++u) block[u][v] = src[u];                            \
            }                                                                                 \
            for (long u = 0; u < g; ++u) memcpy(yr + u * n + i0, block[u], (size_t)w * sizeof(T)); \
        }                                                                                     \
    } while (0)

static void index_transpose_task(void *ctx, long begin, long end) {
    const index_transpose_args *t = (const index_transpose_args *)ctx;
    const mrt_index_map *m = t->m;
    const int r = m->rank, elem = m->elem;
    const long n = m->shape[r - 1], step = t->step, inner0 = m->offsets[r - 1][0];
    long idx[MRT_INDEX_MAX_RANK] = {0};
    rows_odometer_start(m->shape, r, begin, idx);
    for (long row = begin; row < end;) {
        int fill;
        const long base = index_row_base(m, idx, &fill);
        /* the rows after this one along axis r - 2 (in this task's range) read x at base + 1, + 2, ... */
        long g = m->shape[r - 2] - idx[r - 2];
        if (g > INDEX_TILE) g = INDEX_TILE;
        if (g > end - row) g = end - row;
        char *y = t->y + row * n * elem;
        if (fill)
            for (long u = 0; u < g; ++u) index_fill_row(y + u * n * elem, n, elem, m->fill);
        else
            INDEX_BY_ELEM(elem, INDEX_TILE_COPY);
        for (long u = 0; u < g; ++u) rows_odometer_next(m->shape, r, idx);
        row += g;
    }
}

#undef INDEX_TILE_COPY
#undef INDEX_BY_ELEM

int mrt_index_copy(const mrt_index_map *m, const void *x, void *y, int nthreads) {
    if (m->rank < 1 || m->rank > MRT_INDEX_MAX_RANK || (m->elem != 1 && m->elem != 2 && m->elem != 4 && m->elem != 8))
        return -2;
    long rows = 1;
    for (int a = 0; a < m->rank - 1; ++a) rows *= m->shape[a];
    const int r = m->rank;
    const long n = m->shape[r - 1];
    if (rows <= 0 || n <= 0) return 0;
    /* a transposing copy of at least a few tiles (the checks read its two last tables: ~1 us for
     * magika's 2048 + 256 offsets, against a 40-145 us copy) */
    if (r >= 2 && !m->inner_run && n >= INDEX_TILE && m->shape[r - 2] >= INDEX_TILE && rows * n >= 16 * INDEX_TILE * INDEX_TILE) {
        const long step = m->offsets[r - 1][1] - m->offsets[r - 1][0];
        if (step > 1 && index_offsets_step(m->offsets[r - 1], n, step) &&
            index_offsets_step(m->offsets[r - 2], m->shape[r - 2], 1)) {
            index_transpose_args t = {m, (const char *)x, (char *)y, step};
            mrt_parallel_for(rows, n * m->elem / 16, nthreads, index_transpose_task, &t);
            return 0;
        }
    }
    index_copy_args t = {m, (const char *)x, (char *)y};
    /* (work unit: one per 16 bytes of a row; a memory-bound copy pays for threads from ~512 KB) */
    mrt_parallel_for(rows, n * m->elem / 16, nthreads, index_copy_task, &t);
    return 0;
}

typedef struct {
    const mrt_gather_shape *s;
    const char *x;
    const int64_t *idx;
    char *y;
} gather_rows_args;

static void gather_rows_task(void *ctx, long begin, long end) {
    const gather_rows_args *t = (const gather_rows_args *)ctx;
    const mrt_gather_shape *s = t->s;
    for (long row = begin; row < end; ++row) {
        const long o = row / s->count, j = row % s->count;
        long v = (long)t->idx[j];
        if (v < 0) v += s->axis;
        memcpy(t->y + row * s->inner_bytes, t->x + (o * s->axis + v) * s->inner_bytes, (size_t)s->inner_bytes);
    }
}

int mrt_gather_rows(const mrt_gather_shape *s, const void *x, const int64_t *idx, void *y, int nthreads) {
    for (long j = 0; j < s->count; ++j)
        if (idx[j] < -s->axis || idx[j] >= s->axis) return -3;
    const long rows = s->outer * s->count;
    if (rows <= 0 || s->inner_bytes <= 0) return 0;
    gather_rows_args t = {s, (const char *)x, idx, (char *)y};
    mrt_parallel_for(rows, s->inner_bytes / 16, nthreads, gather_rows_task, &t);
    return 0;
}

typedef struct {
    const mrt_gather_shape *s;
    const char *table;
    const void *ids;
    int id_bytes;
    char *y;
} lookup_rows_args;

static void lookup_rows_task(void *ctx, long begin, long end) {
    const lookup_rows_args *t = (const lookup_rows_args *)ctx;
    const long classes = t->s->axis - 1, row_bytes = t->s->inner_bytes; /* (row `classes`: the fill row) */
    for (long j = begin; j < end; ++j) {
        const long v = t->id_bytes == 4 ? (long)((const int32_t *)t->ids)[j] : (long)((const int64_t *)t->ids)[j];
        const long r = v >= 0 && v < classes ? v : classes;
        memcpy(t->y + j * row_bytes, t->table + r * row_bytes, (size_t)row_bytes);
    }
}

int mrt_lookup_rows(const mrt_gather_shape *s, const void *table, const void *ids, int id_bytes, void *y,
                    int nthreads) {
    if ((id_bytes != 4 && id_bytes != 8) || s->outer != 1 || s->axis < 1) return -2;
    if (s->count <= 0 || s->inner_bytes <= 0) return 0;
    lookup_rows_args t = {s, (const char *)table, ids, id_bytes, (char *)y};
    mrt_parallel_for(s->count, s->inner_bytes / 16, nthreads, lookup_rows_task, &t);
    return 0;
}

/* one element of each type, by ONNX code (mrt_cast) */
#define CAST_F32 1
#define CAST_U8 2
#define CAST_I8 3
#define CAST_I32 6
#define CAST_I64 7
#define CAST_BOOL 9
#define CAST_F64 11

static int cast_elem_size(int code) {
    switch (code) {
    case CAST_F32: case CAST_I32: return 4;
    case CAST_U8: case CAST_I8: case CAST_BOOL: return 1;
    case CAST_I64: case CAST_F64: return 8;
    default: return 0;
    }
}

/* a float truncated toward zero into [lo, hi], else lo (NaN included) */
static inline int64_t cast_trunc(double v, double lo, double hi) {
    return (v >= lo && v < hi + 1.0) ? (int64_t)v : (int64_t)lo;
}

typedef struct {
    int from, to;
    const void *x;
    void *y;
    long n;
} cast_args;

#define CAST_CHUNK 8192L

/* The loops of one source type S (element i read as LOAD, is_float: S is a float type), the target's
 * switch outside them: a switch per element kept the compiler from vectorizing (a bool -> float Cast of
 * 526K values, magika's one-hot, took 1.6 ms against numpy's 0.08). */
#define CAST_FROM(S, LOAD, is_float)                                                                 \
    do {                                                                                             \
        const S *s = (const S *)t->x;                                                                \
        (void)s;                                                                                     \
        switch (t->to) {                                                                             \
        case CAST_F32: for (long i = lo; i < hi; ++i) ((float *)t->y)[i] = (float)(LOAD); break;     \
        case CAST_F64: for (long i = lo; i < hi; ++i) ((double *)t->y)[i] = (double)(LOAD); break;   \
        case CAST_BOOL: for (long i = lo; i < hi; ++i) ((uint8_t *)t->y)[i] = (LOAD) != 0; break;    \
        default: {                                                                                   \
            /* integer targets: from a float, truncated (out of range: the minimum, see above); from \
             * an integer, the low bytes (two's complement wrap-around, as numpy's astype); to 8 bits \
             * through int64, then the low byte, as numpy on x86-64 */                               \
            const double mn = t->to == CAST_I32 ? -2147483648.0 : -9223372036854775808.0;             \
            const double mx = t->to == CAST_I32 ? 2147483647.0 : 9223372036854775807.0;              \
            (void)mn, (void)mx;                                                                      \
            switch (t->to) {                                                                         \
            case CAST_I64: for (long i = lo; i < hi; ++i) ((int64_t *)t->y)[i] = CAST_INT(LOAD, is_float); break; \
            case CAST_I32:                                                                           \
                for (long i = lo; i < hi; ++i)                                                       \
                    ((int32_t *)t->y)[i] = (int32_t)(uint32_t)(uint64_t)CAST_INT(LOAD, is_float);     \
                break;                                                                               \
            case CAST_I8:                                                                            \
                for (long i = lo; i < hi; ++i)                                                       \
                    ((int8_t *)t->y)[i] = (int8_t)(uint8_t)(uint64_t)CAST_INT(LOAD, is_float);        \
                break;                                                                               \
            default:                                                                                 \
                for (long i = lo; i < hi; ++i)                                                       \
                    ((uint8_t *)t->y)[i] = (uint8_t)(uint64_t)CAST_INT(LOAD, is_float);               \
                break;                                                                               \
            }                                                                                        \
        }                                                                                            \
        }                                                                                            \
    } while (0)
#define CAST_INT(v, is_float) ((is_float) ? cast_trunc((double)(v), mn, mx) : (int64_t)(v))

static void cast_task(void *ctx, long begin, long end) {
    const cast_args *t = (const cast_args *)ctx;
    const long lo = begin * CAST_CHUNK, hi = end * CAST_CHUNK < t->n ? end * CAST_CHUNK : t->n;
    /* (int64 -> float directly, not through a double: values past 2^53 would round twice) */
    switch (t->from) {
    case CAST_F32: CAST_FROM(float, s[i], 1); break;
    case CAST_F64: CAST_FROM(double, s[i], 1); break;
    case CAST_U8: CAST_FROM(uint8_t, s[i], 0); break;
    case CAST_I8: CAST_FROM(int8_t, s[i], 0); break;
    case CAST_I32: CAST_FROM(int32_t, s[i], 0); break;
    case CAST_I64: CAST_FROM(int64_t, s[i], 0); break;
    default: CAST_FROM(uint8_t, (s[i] != 0), 0); break; /* bool: any non-zero byte is true */
    }
}

#undef CAST_INT
#undef CAST_FROM

int mrt_cast(int from, int to, const void *x, void *y, long n, int nthreads) {
    if (!cast_elem_size(from) || !cast_elem_size(to)) return -2;
    if (n <= 0) return 0;
    cast_args t = {from, to, x, y, n};
    mrt_parallel_for((n + CAST_CHUNK - 1) / CAST_CHUNK, CAST_CHUNK / 4, nthreads, cast_task, &t);
    return 0;
}
