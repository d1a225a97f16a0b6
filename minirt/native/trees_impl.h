/* Tree ensembles: mrt_tree_votes (kernels.h), the native form of minirt/kernels/trees.py's
 * traverse + accumulate.  Compiled once, at the baseline ISA: a tree walk is a chain of dependent
 * loads and compares, not vector code, and the sums must be the same bits on every CPU.
 *
 * The nodes (built once per layout by trees.py, _native_layout) are one array of small structs, so
 * that a step reads one cache line: the threshold, an info word, the two children (false, true).
 * info: bits 0..23 the feature a branch node tests (0 for a leaf: any valid column), bits 24..26 the
 * comparison (trees.LEQ .. trees.NEQ; LEAF 7), bit 27 a NaN feature takes the true branch, bit 30
 * (inline leaves) the leaf has a weight for target 0, bit 31 the node is a leaf.  A leaf's children
 * are itself, so stepping a leaf leaves it in place.  A leaf's threshold slot holds, with one target
 * (inline_leaves), its value; otherwise its row in the leaf table (float nodes: the slot's bits as an
 * int32; double nodes: the row field).  One pad leaf (index n_nodes) fills the last group of roots.
 *
 * The walk: one sample goes down MRT_TREE_GROUP trees at once (independent chains of loads, which the
 * core overlaps), each step branch-free (the child is next[go]), until every walker stands on a leaf
 * (one more step, a no-op, tells).  Then the leaves' votes are added in tree order.  Samples are taken
 * in blocks of TREE_BLOCK: a group of trees is walked by every sample of the block before the next
 * group, so the group's nodes stay in L1 across the block (each sample still adds its trees in tree
 * order).  Threads split the samples (mrt_parallel_for): each sample's trees run on one thread, so the
 * result does not depend on the thread count.
 *
 * This file is a template for itself: the first inclusion (TREE_TEMPLATE undefined) defines the common
 * parts, includes itself once per (node type, accumulation type) and then defines the entry point. */

#ifndef TREE_TEMPLATE

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

#define TREE_FEATURE_MASK 0xFFFFFFu
#define TREE_MISSING_SHIFT 27
#define TREE_HAS_SHIFT 30
#define TREE_LEAF (1u << 31)
#define TREE_BLOCK 32 /* samples per block */
#define TREE_MIXED MRT_TREE_MIXED

typedef struct {
    union {
        float thr;
        int32_t row;
    };
    uint32_t info;
    int32_t next[2]; /* false, true */
} tree_node_f32;

typedef struct {
    double thr;
    uint32_t info;
    int32_t next[2];
    int32_t row;
} tree_node_f64;

_Static_assert(sizeof(tree_node_f32) == 16, "tree_node_f32: 16 bytes (trees.py's _NODE_F32)");
_Static_assert(sizeof(tree_node_f64) == 24, "tree_node_f64: 24 bytes (trees.py's _NODE_F64)");

/* Whether a comparison takes the true branch, by outcome: bit c of tree_go_mask[code], code the
 * info bits 24..27 (comparison | missing-true << 3), c = (v < t) | (v == t) << 1 | (v > t) << 2 |
 * (v is NaN) << 3: 1, 2 or 4 for ordered values, 8 for a NaN feature, 0 for a NaN threshold.  NEQ is
 * true whenever a NaN is involved (numpy's not_equal); the missing flag adds a NaN feature. */
static const uint16_t tree_go_mask[16] = {
    0x006, 0x002, 0x014, 0x010, 0x004, 0x113, 0, 0, /* LEQ LT GTE GT EQ NEQ MEMBER LEAF */
    0x106, 0x102, 0x114, 0x110, 0x104, 0x113, 0, 0, /* the same, missing-true */
};

#define TREE_PASTE(a, b) a##b
#define TREE_EXPAND(a, b) TREE_PASTE(a, b)
#define TFN(name) TREE_EXPAND(name, TREE_SUF)

typedef struct {
    const mrt_tree_ensemble *e;
    const void *x;
    long x_stride; /* floats (or doubles) between samples: n_features, 0 without features */
    void *scores;
    uint8_t *has;
} tree_job;

#define TREE_TEMPLATE 1

#define TREE_SUF _f32_f32
#define TREE_NODE tree_node_f32
#define TREE_X float
#define TREE_ACC float
#include "trees_impl.h"
#undef TREE_SUF
#undef TREE_NODE
#undef TREE_X
#undef TREE_ACC

#define TREE_SUF _f64_f32
#define TREE_NODE tree_node_f64
#define TREE_X double
#define TREE_ACC float
#include "trees_impl.h"
#undef TREE_SUF
#undef TREE_NODE
#undef TREE_X
#undef TREE_ACC

#define TREE_SUF _f64_f64
#define TREE_NODE tree_node_f64
#define TREE_X double
#define TREE_ACC double
#include "trees_impl.h"
#undef TREE_SUF
#undef TREE_NODE
#undef TREE_X
#undef TREE_ACC

#undef TREE_TEMPLATE

int mrt_tree_votes(const mrt_tree_ensemble *e, const void *x, long n, long n_features, void *scores, uint8_t *has,
                   int nthreads) {
    if (!e || n < 0 || n_features < 0 || e->n_trees < 0 || e->n_targets < 1 || e->n_nodes < 0 ||
        e->max_feature >= n_features || e->max_feature > (long)TREE_FEATURE_MASK || e->mode < 0 ||
        e->mode > TREE_MIXED || e->aggregate < MRT_TREE_AVERAGE || e->aggregate > MRT_TREE_MAX ||
        (e->node_double != 0 && e->node_double != 1) || (e->acc_double != 0 && e->acc_double != 1) ||
        (e->acc_double && !e->node_double) || (e->inline_leaves && e->n_targets != 1))
        return -2;
    if (n == 0) return 0;
    const long k = (long)e->n_targets;
    if (e->n_trees == 0) { /* (numpy's accumulate: zeros, no weights) */
        memset(scores, 0, (size_t)(n * k) * (e->acc_double ? sizeof(double) : sizeof(float)));
        memset(has, 0, (size_t)(n * k));
        return 0;
    }
    /* no features: every tree is a leaf (max_feature -1), whose step reads column 0 of a zero row */
    static const double zero_row[1] = {0.0};
    tree_job job = {e, n_features ? x : (const void *)zero_row, n_features, scores, has};
    mrt_task_fn fn = e->acc_double ? tree_task_f64_f64 : e->node_double ? tree_task_f64_f32 : tree_task_f32_f32;
    /* a unit: one tree's walk for one sample, ~ a few dozen cycles */
    /* (bounded to 2^30: a C long may have 32 bits, as on 32-bit ARM) */
    mrt_parallel_for(n, (long)(e->n_trees < ((int64_t)1 << 26) ? e->n_trees * 16 : (int64_t)1 << 30), nthreads, fn,
                     &job);
    return 0;
}

/* One sample's scores finished (mrt_tree_finish), in the accumulation type T. */
#define TREE_FINISH_ROW(T)                                                                                     \
    do {                                                                                                       \
        T *s = (T *)scores + i * k;                                                                            \
        uint8_t *h = has + i * k;                                                                              \
        if (p->labels) {                                                                                       \
            for (int c = 0; c < p->n_base && c < k; c++) {                                                     \
                s[c] = (T)(s[c] + (T)p->base[c]);                                                              \
                h[c] = 1;                                                                                      \
            }                                                                                                  \
            /* numpy's argmax of (has ? score : -inf): the first maximum, the first NaN if any */          \
            long best = 0, any = 0;                                                                            \
            T top = h[0] ? s[0] : (T)-INFINITY;                                                                \
            for (long c = 0; c < k; c++) {                                                                     \
                any |= h[c];                                                                                   \
                const T v = h[c] ? s[c] : (T)-INFINITY;                                                        \
                if (top == top && (v != v || v > top)) {                                                       \
                    top = v;                                                                                   \
                    best = c;                                                                                  \
                }                                                                                              \
            }                                                                                                  \
            label[i] = p->labels[any ? best : 0];                                                              \
        } else if (p->n_base == k) {                                                                           \
            for (long c = 0; c < k; c++) s[c] = (T)(s[c] + (T)p->base[c]);                                     \
        }                                                                                                      \
        for (long c = 0; c < k; c++) out[i * k + c] = (float)s[c];                                             \
    } while (0)

int mrt_tree_finish(const mrt_tree_outputs *p, void *scores, uint8_t *has, int64_t *label, float *out, long n,
                    int nthreads) {
    (void)nthreads; /* (n x k additions: a thread would cost more) */
    if (!p || p->k < 1 || n < 0 || (p->labels && (p->k == 2 || !label)) || p->n_base < 0 ||
        (p->n_base && !p->base) || (p->acc_double != 0 && p->acc_double != 1))
        return -2;
    const long k = p->k;
    for (long i = 0; i < n; i++) {
        if (p->acc_double)
            TREE_FINISH_ROW(double);
        else
            TREE_FINISH_ROW(float);
    }
    return 0;
}
#undef TREE_FINISH_ROW

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#else /* TREE_TEMPLATE: the kernels for one (TREE_NODE, TREE_X, TREE_ACC) */

/* Walk MRT_TREE_GROUP trees from idx[j] (their roots) to their leaves for one sample (row xr);
 * nan_free: the row has no NaN (the missing-true flags cannot matter: fewer operations per step). */
static inline __attribute__((always_inline)) void TFN(tree_walk)(const TREE_NODE *restrict nodes,
                                                                  const TREE_X *restrict xr, int32_t *idx,
                                                                  const int mode, const int nan_free) {
    for (;;) {
        uint32_t branch = 0;
        for (int j = 0; j < MRT_TREE_GROUP; ++j) {
            const TREE_NODE *nd = nodes + idx[j];
            const uint32_t info = nd->info;
            const TREE_X v = xr[info & TREE_FEATURE_MASK];
            const TREE_X t = (TREE_X)nd->thr;
            int go;
            switch (mode) {
            case MRT_TREE_LEQ: go = v <= t; break;
            case MRT_TREE_LT: go = v < t; break;
            case MRT_TREE_GTE: go = v >= t; break;
            case MRT_TREE_GT: go = v > t; break;
            case MRT_TREE_EQ: go = v == t; break;
            case MRT_TREE_NEQ: go = v != t; break;
            default: {
                unsigned c = (unsigned)(v < t) | (unsigned)(v == t) << 1 | (unsigned)(v > t) << 2;
                if (!nan_free) c |= (unsigned)(v != v) << 3;
                go = (tree_go_mask[(info >> 24) & 15] >> c) & 1;
            }
            }
            if (!nan_free && mode != TREE_MIXED) go |= (v != v) & (int)((info >> TREE_MISSING_SHIFT) & 1);
            idx[j] = nd->next[go];
            branch |= ~info;
        }
        if (!(branch & TREE_LEAF)) return;
    }
}

static inline __attribute__((always_inline)) int32_t TFN(tree_row)(const TREE_NODE *nd) { return nd->row; }

/* Add the leaves idx[0 .. g) (trees in order) to one sample's scores s[K] and weight flags h[K]. */
static inline __attribute__((always_inline)) void TFN(tree_add)(const mrt_tree_ensemble *e,
                                                                 const TREE_NODE *restrict nodes,
                                                                 const int32_t *idx, int g,
                                                                 TREE_ACC *restrict s, uint8_t *restrict h) {
    const int agg = e->aggregate;
    if (e->inline_leaves) {
        TREE_ACC acc = s[0];
        uint32_t any = 0;
        for (int j = 0; j < g; ++j) {
            const TREE_NODE *nd = nodes + idx[j];
            const TREE_ACC v = (TREE_ACC)nd->thr;
            const uint32_t hv = (nd->info >> TREE_HAS_SHIFT) & 1;
            any |= hv;
            if (agg == MRT_TREE_SUM || agg == MRT_TREE_AVERAGE)
                acc = acc + v;
            else if (agg == MRT_TREE_MIN) {
                if (hv && (v < acc || v != v)) acc = v;
            } else if (hv && (v > acc || v != v))
                acc = v;
        }
        s[0] = acc;
        h[0] |= (uint8_t)any;
        return;
    }
    const long k = (long)e->n_targets;
    const TREE_ACC *values = (const TREE_ACC *)e->values;
    for (int j = 0; j < g; ++j) {
        const long row = TFN(tree_row)(nodes + idx[j]);
        const TREE_ACC *vr = values + row * k;
        const uint8_t *hr = e->has + row * k;
        if (agg == MRT_TREE_SUM || agg == MRT_TREE_AVERAGE) {
            for (long t = 0; t < k; ++t) {
                s[t] = s[t] + vr[t];
                h[t] |= hr[t];
            }
        } else if (agg == MRT_TREE_MIN) {
            for (long t = 0; t < k; ++t)
                if (hr[t]) {
                    const TREE_ACC v = vr[t];
                    if (v < s[t] || v != v) s[t] = v;
                    h[t] = 1;
                }
        } else {
            for (long t = 0; t < k; ++t)
                if (hr[t]) {
                    const TREE_ACC v = vr[t];
                    if (v > s[t] || v != v) s[t] = v;
                    h[t] = 1;
                }
        }
    }
}

/* Samples [s0, s1) of the job, every tree, with the comparison `mode` (a constant once inlined). */
static inline __attribute__((always_inline)) void TFN(tree_range)(const tree_job *job, long s0, long s1,
                                                                   const int mode) {
    const mrt_tree_ensemble *e = job->e;
    const TREE_NODE *nodes = (const TREE_NODE *)e->nodes;
    const TREE_X *x = (const TREE_X *)job->x;
    const long k = (long)e->n_targets, trees = (long)e->n_trees;
    TREE_ACC *scores = (TREE_ACC *)job->scores;
    uint8_t *has = job->has;
    const int agg = e->aggregate;
    /* -0.0 + v is v for every v (numpy's running sum starts from the first tree's vote) */
    const TREE_ACC init = agg == MRT_TREE_MIN ? (TREE_ACC)INFINITY : agg == MRT_TREE_MAX ? (TREE_ACC)-INFINITY
                                                                                      : (TREE_ACC)-0.0;
    const long stride = job->x_stride;
    for (long b0 = s0; b0 < s1; b0 += TREE_BLOCK) {
        const long b1 = b0 + TREE_BLOCK < s1 ? b0 + TREE_BLOCK : s1;
        for (long i = b0 * k; i < b1 * k; ++i) {
            scores[i] = init;
            has[i] = 0;
        }
        uint8_t nan_row[TREE_BLOCK];
        for (long s = b0; s < b1; ++s) {
            const TREE_X *xr = x + s * stride;
            int any = 0;
            for (long f = 0; f < stride; ++f) any |= xr[f] != xr[f];
            nan_row[s - b0] = (uint8_t)any;
        }
        for (long t0 = 0; t0 < trees; t0 += MRT_TREE_GROUP) {
            const int g = trees - t0 < MRT_TREE_GROUP ? (int)(trees - t0) : MRT_TREE_GROUP;
            const int32_t *roots = e->roots + t0;
            for (long s = b0; s < b1; ++s) {
                int32_t idx[MRT_TREE_GROUP];
                for (int j = 0; j < MRT_TREE_GROUP; ++j) idx[j] = roots[j];
                if (nan_row[s - b0])
                    TFN(tree_walk)(nodes, x + s * stride, idx, mode, 0);
                else
                    TFN(tree_walk)(nodes, x + s * stride, idx, mode, 1);
                TFN(tree_add)(e, nodes, idx, g, scores + s * k, has + s * k);
            }
        }
        if (agg == MRT_TREE_AVERAGE) {
            const TREE_ACC count = (TREE_ACC)trees;
            for (long i = b0 * k; i < b1 * k; ++i) scores[i] = scores[i] / count;
        } else if (agg == MRT_TREE_MIN || agg == MRT_TREE_MAX) {
            for (long i = b0 * k; i < b1 * k; ++i)
                if (!has[i]) scores[i] = 0;
        }
    }
}

static void TFN(tree_task)(void *ctx, long s0, long s1) {
    const tree_job *job = (const tree_job *)ctx;
    switch (job->e->mode) {
    case MRT_TREE_LEQ: TFN(tree_range)(job, s0, s1, MRT_TREE_LEQ); break;
    case MRT_TREE_LT: TFN(tree_range)(job, s0, s1, MRT_TREE_LT); break;
    case MRT_TREE_GTE: TFN(tree_range)(job, s0, s1, MRT_TREE_GTE); break;
    case MRT_TREE_GT: TFN(tree_range)(job, s0, s1, MRT_TREE_GT); break;
    case MRT_TREE_EQ: TFN(tree_range)(job, s0, s1, MRT_TREE_EQ); break;
    case MRT_TREE_NEQ: TFN(tree_range)(job, s0, s1, MRT_TREE_NEQ); break;
    default: TFN(tree_range)(job, s0, s1, TREE_MIXED); break;
    }
}

#endif /* TREE_TEMPLATE */
