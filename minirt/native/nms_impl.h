/* NonMaxSuppression (ONNX, opsets 10 / 11), float32: mrt_nms_f32 (kernels.h).  Compiled once, at the
 * baseline ISA (not per instruction set): the work is branches and scalar compares, and the result
 * must be the same bits on every CPU.
 *
 * Semantics (the ONNX reference evaluator's and onnxruntime's, checked by tests/kernels/test_nms.py):
 *   - per batch b and class k: the candidates are the boxes whose score is > score_threshold (all of
 *     them without a threshold), taken in descending score order, ties in ascending box index;
 *   - a candidate is selected when no box selected before it in the same (b, k) suppresses it,
 *     until max_output boxes are selected; rows (b, k, box) come out batch-major, then class, then
 *     in selection order;
 *   - box j suppresses box i when nms_suppresses(i, j) below holds: the reference's IoU test
 *     evaluated in float32, operation for operation (corners normalised with its MaxMin, areas and
 *     union in its order, IoU > threshold strictly).
 *
 * Where this code departs from the reference's loop (each candidate against every selected box), it
 * skips only pairs the test provably rejects:
 *   - a box with a non-finite corner (NaN or +-inf after the centre conversion) never suppresses and
 *     is never suppressed: its area is NaN or +-inf, so the union is NaN or infinite (IoU NaN or 0) or
 *     the area is <= 0, and every branch of the test returns false.  Such a candidate is selected
 *     without a test and joins no search structure.
 *   - two boxes whose x ranges do not overlap (max of the x_min >= min of the x_max) fail the test's
 *     first branch.  For a class with many candidates, the selected boxes are also held in x order
 *     (by rank of x_min among the candidates) and a candidate is tested only against selected boxes
 *     whose x_min lies in [x_min - W - margin, x_max), W the widest candidate (computed in double, the
 *     margin covering the double roundings): every box outside that range has x_max <= x_min(cand)
 *     or x_min >= x_max(cand).  A candidate takes the shorter of that window and the list of
 *     selected boxes; both give the same answer.
 * Scores: -0.0 and 0.0 are equal (a tie); NaN scores (possible without a threshold only) come last,
 * in box order (the reference's sort leaves their order unspecified).
 *
 * The IoU expression must not be contracted into fused multiply-adds (the reference rounds every
 * operation; aarch64's baseline has FMA): this file is compiled with fp-contract off. */

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

/* the reference's max / min of two floats (Python's max(a, b) / min(a, b), std::max / std::min):
 * the first argument unless the second compares greater / smaller */
static inline float nms_max(float a, float b) { return b > a ? b : a; }
static inline float nms_min(float a, float b) { return b < a ? b : a; }

/* One box as the test reads it: corners (x0 <= x1, y0 <= y1 after the MaxMin of corner boxes; centre
 * boxes with a negative size keep x0 > x1) and its area (x1 - x0) * (y1 - y0). */
typedef struct {
    float x0, x1, y0, y1, area;
} nms_box;

/* Whether the selected box s suppresses the candidate c: the reference's SuppressByIOU(c, s). */
static inline int nms_suppresses(const nms_box *c, const nms_box *s, float thr) {
    const float ix0 = nms_max(c->x0, s->x0), ix1 = nms_min(c->x1, s->x1);
    if (ix1 <= ix0) return 0;
    const float iy0 = nms_max(c->y0, s->y0), iy1 = nms_min(c->y1, s->y1);
    if (iy1 <= iy0) return 0;
    const float inter = (ix1 - ix0) * (iy1 - iy0);
    if (inter <= 0.0f) return 0;
    const float uni = c->area + s->area - inter;
    if (c->area <= 0.0f || s->area <= 0.0f || uni <= 0.0f) return 0;
    return inter / uni > thr;
}

static void nms_make_box(const float *b, int center, nms_box *o) {
    if (center) { /* [x_centre, y_centre, width, height] */
        const float hw = b[2] / 2, hh = b[3] / 2;
        o->x0 = b[0] - hw;
        o->x1 = b[0] + hw;
        o->y0 = b[1] - hh;
        o->y1 = b[1] + hh;
    } else { /* [y1, x1, y2, x2], any diagonal pair: the reference's MaxMin (lhs >= rhs ? (rhs, lhs) : (lhs, rhs)) */
        if (b[1] >= b[3]) { o->x0 = b[3]; o->x1 = b[1]; } else { o->x0 = b[1]; o->x1 = b[3]; }
        if (b[0] >= b[2]) { o->y0 = b[2]; o->y1 = b[0]; } else { o->y0 = b[0]; o->y1 = b[2]; }
    }
    o->area = (o->x1 - o->x0) * (o->y1 - o->y0);
}

static inline int nms_finite(const nms_box *b) {
    return isfinite(b->x0) && isfinite(b->x1) && isfinite(b->y0) && isfinite(b->y1);
}

/* An ascending uint32 key of a float: order-preserving for non-NaN values (-0.0 keyed as 0.0), NaN
 * above everything. */
static inline uint32_t nms_float_key(float f) {
    if (f != f) return 0xFFFFFFFFu;
    if (f == 0.0f) f = 0.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Stable LSD radix sort of n (key, value) pairs by ascending key (8 bits a pass; a pass where every key
 * has the same byte is skipped).  Sorted into key / val; tk / tv scratch of n each. */
static void nms_radix_sort(uint32_t *key, int32_t *val, uint32_t *tk, int32_t *tv, long n) {
    for (int shift = 0; shift < 32; shift += 8) {
        long count[257] = {0};
        for (long i = 0; i < n; ++i) ++count[((key[i] >> shift) & 0xFF) + 1];
        int one_bucket = 0;
        for (int d = 1; d <= 256; ++d)
            if (count[d] == n) one_bucket = 1;
        if (one_bucket) continue;
        for (int d = 1; d <= 256; ++d) count[d] += count[d - 1];
        for (long i = 0; i < n; ++i) {
            const long at = count[(key[i] >> shift) & 0xFF]++;
            tk[at] = key[i];
            tv[at] = val[i];
        }
        uint32_t *sk = key;
        int32_t *sv = val;
        memcpy(sk, tk, sizeof(uint32_t) * (size_t)n);
        memcpy(sv, tv, sizeof(int32_t) * (size_t)n);
    }
}

/* Candidates of one class at or above this count get the x-ordered window (below it the list of
 * selected boxes is short enough, and the x sort would cost more than it saves). */
#define NMS_WINDOW_MIN 256

/* Scratch for one (batch, class), n = the number of boxes. */
typedef struct {
    nms_box *all;  /* every box of the batch (n) */
    uint32_t *key; /* sort keys (n), then the sort's scratch (n) */
    int32_t *val;  /* the sort's values (n), then its scratch (n) */
    int32_t *cand; /* candidate box indices in score order (n) */
    nms_box *cb;   /* the candidates' boxes in score order (n) */
    int32_t *rank; /* candidate position -> rank of its x0 among the finite candidates (n) */
    float *rx0;    /* x0 by rank (n) */
    nms_box *rbox; /* boxes by rank (n) */
    uint64_t *rsel; /* selected flags by rank, one bit each (n / 64 + 1 words) */
    nms_box *sel;  /* selected finite boxes in selection order (n) */
} nms_scratch;

/* One (batch, class): appends its selected box indices to out (at most max_output); returns how many. */
static long nms_class(const nms_scratch *w, const float *scores, long n, int has_thr, float score_thr,
                                float iou_thr, long max_output, int32_t *out) {
    long m = 0;
    for (long i = 0; i < n; ++i) {
        const float s = scores[i];
        if (has_thr && !(s > score_thr)) continue;
        /* descending score (inverted key; no score's inverted key is all ones), NaN last */
        w->key[m] = s != s ? 0xFFFFFFFFu : ~nms_float_key(s);
        w->val[m] = (int32_t)i; /* in box order: the stable sort leaves ties in box order */
        ++m;
    }
    if (m == 0 || max_output <= 0) return 0;
    nms_radix_sort(w->key, w->val, w->key + n, w->val + n, m);
    for (long p = 0; p < m; ++p) {
        w->cand[p] = w->val[p];
        w->cb[p] = w->all[w->val[p]];
    }

    /* the x window (see the top of this file), over the candidates with finite corners */
    const int window = m >= NMS_WINDOW_MIN;
    long nr = 0;
    double wmax = 0.0;
    if (window) {
        uint32_t *k = w->key;
        int32_t *v = w->val;
        for (long p = 0; p < m; ++p) {
            w->rank[p] = -1;
            if (!nms_finite(&w->cb[p])) continue;
            k[nr] = nms_float_key(w->cb[p].x0);
            v[nr] = (int32_t)p;
            ++nr;
            const double width = (double)w->cb[p].x1 - (double)w->cb[p].x0;
            if (width > wmax) wmax = width;
        }
        nms_radix_sort(k, v, k + n, v + n, nr);
        for (long r = 0; r < nr; ++r) {
            const int32_t p = v[r];
            w->rank[p] = (int32_t)r;
            w->rx0[r] = w->cb[p].x0;
            w->rbox[r] = w->cb[p];
        }
        memset(w->rsel, 0, sizeof(uint64_t) * (size_t)(nr / 64 + 1));
        wmax += wmax * 0x1p-40; /* >= every width, whatever the rounding of the subtraction */
    }

    long nsel = 0, nfin = 0;
    for (long p = 0; p < m && nsel < max_output; ++p) {
        const nms_box *c = &w->cb[p];
        int suppressed = 0;
        if (nms_finite(c)) {
            long lo = 0, hi = 0;
            if (window) {
                const double x0 = c->x0, bound = x0 - wmax - (fabs(x0) + wmax) * 0x1p-40;
                long a = 0, b = nr; /* lo: first rank with rx0 >= bound */
                while (a < b) {
                    const long mid = a + (b - a) / 2;
                    if ((double)w->rx0[mid] < bound) a = mid + 1; else b = mid;
                }
                lo = a;
                b = nr; /* hi: first rank with rx0 >= x1 */
                while (a < b) {
                    const long mid = a + (b - a) / 2;
                    if (w->rx0[mid] < c->x1) a = mid + 1; else b = mid;
                }
                hi = a;
            }
            if (!window || nfin <= (hi - lo) >> 4) { /* (a window of 64 ranks is one word to scan) */
                for (long j = 0; j < nfin && !suppressed; ++j) suppressed = nms_suppresses(c, &w->sel[j], iou_thr);
            } else {
                /* the selected ranks in [lo, hi): set bits of rsel, a word at a time */
                for (long word = lo >> 6; word <= (hi - 1) >> 6 && !suppressed && lo < hi; ++word) {
                    uint64_t bits = w->rsel[word];
                    if (word == lo >> 6) bits &= ~0ULL << (lo & 63);
                    if (word == (hi - 1) >> 6 && ((hi - 1) & 63) != 63) bits &= (2ULL << ((hi - 1) & 63)) - 1;
                    while (bits && !suppressed) {
                        const long r = (word << 6) + __builtin_ctzll(bits);
                        bits &= bits - 1;
                        suppressed = nms_suppresses(c, &w->rbox[r], iou_thr);
                    }
                }
            }
            if (!suppressed) {
                w->sel[nfin++] = *c;
                if (window) w->rsel[w->rank[p] >> 6] |= 1ULL << (w->rank[p] & 63);
            }
        }
        if (!suppressed) out[nsel++] = w->cand[p];
    }
    return nsel;
}

int64_t mrt_nms_f32(const mrt_nms_params *p, const float *boxes, const float *scores, int64_t *selected,
                    int64_t capacity) {
    const long B = p->batches, K = p->classes, n = p->boxes;
    if (B < 0 || K < 0 || n < 0 || n > INT32_MAX || p->max_output < 0 || !(p->iou_threshold >= 0.0f) ||
        !(p->iou_threshold <= 1.0f) || (p->center_point_box != 0 && p->center_point_box != 1))
        return -2;
    if (B == 0 || K == 0 || n == 0 || p->max_output == 0) return 0;
    const long max_out = p->max_output < n ? (long)p->max_output : n;
    nms_scratch w;
    /* one block: rsel (bits); all, cb, rbox, sel (boxes); key (2n); val (2n); cand; rank; rx0; out */
    const size_t nb = (size_t)n;
    char *buf = (char *)mrt_scratch_malloc(sizeof(uint64_t) * (nb / 64 + 1) +
                               nb * (4 * sizeof(nms_box) + 2 * sizeof(uint32_t) + 2 * sizeof(int32_t) +
                                     3 * sizeof(int32_t) + sizeof(float)));
    if (!buf) return -1;
    char *q = buf;
    w.rsel = (uint64_t *)q; q += sizeof(uint64_t) * (nb / 64 + 1);
    w.all = (nms_box *)q; q += nb * sizeof(nms_box);
    w.cb = (nms_box *)q; q += nb * sizeof(nms_box);
    w.rbox = (nms_box *)q; q += nb * sizeof(nms_box);
    w.sel = (nms_box *)q; q += nb * sizeof(nms_box);
    w.key = (uint32_t *)q; q += 2 * nb * sizeof(uint32_t);
    w.val = (int32_t *)q; q += 2 * nb * sizeof(int32_t);
    w.cand = (int32_t *)q; q += nb * sizeof(int32_t);
    w.rank = (int32_t *)q; q += nb * sizeof(int32_t);
    w.rx0 = (float *)q; q += nb * sizeof(float);
    int32_t *out = (int32_t *)q;
    int64_t rows = 0;
    for (long b = 0; b < B; ++b) {
        for (long i = 0; i < n; ++i) nms_make_box(boxes + (b * n + i) * 4, p->center_point_box, &w.all[i]);
        for (long k = 0; k < K; ++k) {
            const long got = nms_class(&w, scores + (b * K + k) * n, n, p->has_score_threshold, p->score_threshold,
                                       p->iou_threshold, max_out, out);
            if (rows + got > capacity) {
                free(buf);
                return -3;
            }
            for (long i = 0; i < got; ++i) {
                int64_t *row = selected + 3 * (rows + i);
                row[0] = b;
                row[1] = k;
                row[2] = out[i];
            }
            rows += got;
        }
    }
    free(buf);
    return rows;
}

#if defined(__clang__)
#pragma clang fp contract(on)
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
