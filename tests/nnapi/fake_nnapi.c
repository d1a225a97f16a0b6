/* A fake libneuralnetworks.so for the tests: it exports the NNAPI entry points
 * minirt's provider calls and validates every call against the NNAPI spec
 * (NeuralNetworks.h): operand types and counts per operation, the order of
 * create / finish calls, operand and handle lifetimes.  Misuse returns the
 * NNAPI error code, prints "fake_nnapi: MISUSE: ..." on stderr and is counted
 * (fake_nnapi_error_count / fake_nnapi_last_error) so the tests fail loudly.
 * Executions "compute" by filling outputs with zeros: numerics are checked
 * elsewhere (the TFLite translation).
 *
 * Build:  gcc -shared -fPIC -O1 -o libfake_nnapi.so fake_nnapi.c
 *         add -DFAKE_NO_COMPUTE for an API 27-28 library without
 *         ANeuralNetworksExecution_compute (start-and-wait only).
 * Env:    FAKE_NNAPI_REFUSE_COMPILE=1  the "driver" refuses every compilation
 *         (ANEURALNETWORKS_OP_FAILED, not counted as misuse).
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NO_ERROR = 0, OUT_OF_MEMORY = 1, UNEXPECTED_NULL = 3, BAD_DATA = 4, OP_FAILED = 5, BAD_STATE = 6 };
enum { FLOAT32 = 0, INT32 = 1, UINT32 = 2, TENSOR_FLOAT32 = 3, TENSOR_INT32 = 4, TENSOR_QUANT8_ASYMM = 5, BOOL = 6,
       TENSOR_QUANT16_SYMM = 7, TENSOR_FLOAT16 = 8, TENSOR_BOOL8 = 9, FLOAT16 = 10, TENSOR_QUANT8_SYMM_PER_CHANNEL = 11,
       TENSOR_QUANT16_ASYMM = 12, TENSOR_QUANT8_SYMM = 13, TENSOR_QUANT8_ASYMM_SIGNED = 14 };

typedef struct ANeuralNetworksOperandType {
    int32_t type; uint32_t dimensionCount; const uint32_t* dimensions; float scale; int32_t zeroPoint;
} ANeuralNetworksOperandType;
typedef struct ANeuralNetworksSymmPerChannelQuantParams {
    uint32_t channelDim; uint32_t scaleCount; const float* scales;
} ANeuralNetworksSymmPerChannelQuantParams;

#define MAXDIM 8
typedef struct {
    int32_t type; uint32_t rank; uint32_t dims[MAXDIM]; float scale; int32_t zp;
    int has_value; const void* ref; size_t ref_len; uint64_t ref_sum;  /* referenced (> 128 bytes) values */
    int32_t ival; int32_t small[32];  /* the value of an INT32 / BOOL scalar; of a copied (<= 128 bytes) TENSOR_INT32 */
    int produced; int is_input; int is_output; int has_channel_quant;
} Operand;

typedef struct ANeuralNetworksModel {
    uint32_t magic; int finished; int live_compilations;
    Operand* ops; uint32_t n, cap;
    uint32_t *inputs, n_inputs, *outputs, n_outputs; int io_set;
    uint32_t n_operations;
} ANeuralNetworksModel;
typedef struct ANeuralNetworksCompilation {
    uint32_t magic; ANeuralNetworksModel* model; int finished; int live_executions;
} ANeuralNetworksCompilation;
typedef struct ANeuralNetworksExecution {
    uint32_t magic; ANeuralNetworksCompilation* comp; int started;
    void** out_bufs; size_t* out_lens; int* in_set; int* out_set;
} ANeuralNetworksExecution;
typedef struct ANeuralNetworksEvent { uint32_t magic; ANeuralNetworksExecution* exec; } ANeuralNetworksEvent;

#define M_MODEL 0x4d4f444cu
#define M_COMP 0x434f4d50u
#define M_EXEC 0x45584543u
#define M_EVENT 0x45564e54u
#define M_DEAD 0xdeadbeefu

static int g_errors = 0, g_live = 0;
static char g_last[512] = "";
static long g_calls = 0, g_computes = 0;

static int misuse(int code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last, sizeof g_last, fmt, ap);
    va_end(ap);
    g_errors++;
    fprintf(stderr, "fake_nnapi: MISUSE: %s\n", g_last);
    return code;
}

int fake_nnapi_error_count(void) { return g_errors; }
const char* fake_nnapi_last_error(void) { return g_last; }
int fake_nnapi_live_handles(void) { return g_live; }
long fake_nnapi_calls(void) { return g_calls; }
long fake_nnapi_computes(void) { return g_computes; }
void fake_nnapi_reset(void) { g_errors = 0; g_last[0] = 0; g_calls = 0; g_computes = 0; }

static uint64_t checksum(const void* p, size_t n) {
    const unsigned char* b = p; uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ull; }
    return h;
}
static int is_scalar(int32_t t) { return t == FLOAT32 || t == INT32 || t == UINT32 || t == BOOL || t == FLOAT16; }
static int known_type(int32_t t) { return t >= 0 && t <= 14; }
static size_t elem_size(int32_t t) {
    switch (t) {
        case FLOAT32: case INT32: case UINT32: case TENSOR_FLOAT32: case TENSOR_INT32: return 4;
        case TENSOR_QUANT16_SYMM: case TENSOR_FLOAT16: case FLOAT16: case TENSOR_QUANT16_ASYMM: return 2;
        default: return 1;
    }
}
static size_t operand_bytes(const Operand* o) {
    size_t n = elem_size(o->type);
    for (uint32_t i = 0; i < o->rank; i++) n *= o->dims[i];
    return n;
}
static int is_quant(int32_t t) {
    return t == TENSOR_QUANT8_ASYMM || t == TENSOR_QUANT8_ASYMM_SIGNED || t == TENSOR_QUANT8_SYMM ||
           t == TENSOR_QUANT16_SYMM || t == TENSOR_QUANT16_ASYMM;
}

static int check_model(ANeuralNetworksModel* m, const char* fn) {
    if (!m) return misuse(UNEXPECTED_NULL, "%s: model is NULL", fn);
    if (m->magic != M_MODEL) return misuse(BAD_DATA, "%s: not a live model (freed or garbage)", fn);
    return NO_ERROR;
}

int ANeuralNetworksModel_create(ANeuralNetworksModel** model) {
    g_calls++;
    if (!model) return misuse(UNEXPECTED_NULL, "ANeuralNetworksModel_create: NULL out pointer");
    ANeuralNetworksModel* m = calloc(1, sizeof *m);
    m->magic = M_MODEL;
    *model = m;
    g_live++;
    return NO_ERROR;
}

void ANeuralNetworksModel_free(ANeuralNetworksModel* m) {
    g_calls++;
    if (!m) return;
    if (m->magic != M_MODEL) { misuse(BAD_DATA, "ANeuralNetworksModel_free: not a live model (double free?)"); return; }
    if (m->live_compilations)
        misuse(BAD_STATE, "ANeuralNetworksModel_free: %d compilation(s) of this model are still alive",
               m->live_compilations);
    m->magic = M_DEAD;
    free(m->ops); free(m->inputs); free(m->outputs);
    /* the struct itself is leaked on purpose so later misuse is detected, not a crash */
    g_live--;
}

int ANeuralNetworksModel_addOperand(ANeuralNetworksModel* m, const ANeuralNetworksOperandType* t) {
    g_calls++;
    int rc = check_model(m, "addOperand");
    if (rc) return rc;
    if (m->finished) return misuse(BAD_STATE, "addOperand after ANeuralNetworksModel_finish");
    if (!t) return misuse(UNEXPECTED_NULL, "addOperand: type is NULL");
    if (!known_type(t->type)) return misuse(BAD_DATA, "addOperand %u: unknown operand type %d", m->n, t->type);
    if (is_scalar(t->type) && t->dimensionCount)
        return misuse(BAD_DATA, "addOperand %u: scalar type %d with %u dimensions", m->n, t->type, t->dimensionCount);
    if (!is_scalar(t->type)) {
        if (t->dimensionCount == 0 || t->dimensionCount > 4)
            return misuse(BAD_DATA, "addOperand %u: tensor rank %u (this fake requires 1..4)", m->n, t->dimensionCount);
        if (!t->dimensions) return misuse(UNEXPECTED_NULL, "addOperand %u: dimensions is NULL", m->n);
        for (uint32_t i = 0; i < t->dimensionCount; i++)
            if (t->dimensions[i] == 0)
                return misuse(BAD_DATA, "addOperand %u: dimension %u is unspecified (0)", m->n, i);
    }
    if (is_quant(t->type) && !(t->scale > 0))
        return misuse(BAD_DATA, "addOperand %u: quantized type %d needs scale > 0", m->n, t->type);
    if (!is_quant(t->type) && t->type != TENSOR_INT32 && (t->scale != 0 || t->zeroPoint != 0))
        return misuse(BAD_DATA, "addOperand %u: type %d must have scale 0 and zeroPoint 0", m->n, t->type);
    if (t->type == TENSOR_QUANT8_ASYMM && (t->zeroPoint < 0 || t->zeroPoint > 255))
        return misuse(BAD_DATA, "addOperand %u: zeroPoint %d out of [0, 255]", m->n, t->zeroPoint);
    if (m->n == m->cap) { m->cap = m->cap ? 2 * m->cap : 64; m->ops = realloc(m->ops, m->cap * sizeof(Operand)); }
    Operand* o = &m->ops[m->n++];
    memset(o, 0, sizeof *o);
    o->type = t->type; o->rank = t->dimensionCount; o->scale = t->scale; o->zp = t->zeroPoint;
    for (uint32_t i = 0; i < o->rank; i++) o->dims[i] = t->dimensions[i];
    return NO_ERROR;
}

int ANeuralNetworksModel_setOperandValue(ANeuralNetworksModel* m, int32_t index, const void* buffer, size_t length) {
    g_calls++;
    int rc = check_model(m, "setOperandValue");
    if (rc) return rc;
    if (m->finished) return misuse(BAD_STATE, "setOperandValue after finish");
    if (index < 0 || (uint32_t)index >= m->n) return misuse(BAD_DATA, "setOperandValue: operand %d out of range", index);
    Operand* o = &m->ops[index];
    if (!buffer) return misuse(UNEXPECTED_NULL, "setOperandValue %d: NULL buffer", index);
    if (length != operand_bytes(o))
        return misuse(BAD_DATA, "setOperandValue %d: length %zu, operand needs %zu", index, length, operand_bytes(o));
    if (o->has_value) return misuse(BAD_DATA, "setOperandValue %d: value set twice", index);
    o->has_value = 1;
    if (length > 128) { o->ref = buffer; o->ref_len = length; o->ref_sum = checksum(buffer, length); }
    else if (o->type == TENSOR_INT32) memcpy(o->small, buffer, length);
    if (o->type == INT32) memcpy(&o->ival, buffer, 4);
    if (o->type == BOOL) o->ival = *(const uint8_t*)buffer != 0;
    return NO_ERROR;
}

int ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(ANeuralNetworksModel* m, int32_t index,
                                                             const ANeuralNetworksSymmPerChannelQuantParams* p) {
    g_calls++;
    int rc = check_model(m, "setOperandSymmPerChannelQuantParams");
    if (rc) return rc;
    if (index < 0 || (uint32_t)index >= m->n) return misuse(BAD_DATA, "per-channel params: operand %d out of range", index);
    Operand* o = &m->ops[index];
    if (o->type != TENSOR_QUANT8_SYMM_PER_CHANNEL)
        return misuse(BAD_DATA, "per-channel params on operand %d of type %d", index, o->type);
    if (!p || !p->scales) return misuse(UNEXPECTED_NULL, "per-channel params: NULL");
    if (p->channelDim >= o->rank || p->scaleCount != o->dims[p->channelDim])
        return misuse(BAD_DATA, "per-channel params of operand %d: channelDim %u / scaleCount %u do not match dims",
                      index, p->channelDim, p->scaleCount);
    for (uint32_t i = 0; i < p->scaleCount; i++)
        if (!(p->scales[i] > 0)) return misuse(BAD_DATA, "per-channel scale %u of operand %d is not > 0", i, index);
    o->has_channel_quant = 1;
    return NO_ERROR;
}

/* --- operation signatures --------------------------------------------------------------
 * One string per accepted input count.  T: a data tensor, I: constant TENSOR_INT32,
 * C: constant tensor (weights / bias), i: constant INT32, f: constant FLOAT32, b: constant BOOL,
 * X: TENSOR_INT32 (constant or not: GATHER's indices), B: TENSOR_BOOL8 (SELECT's condition),
 * '*': one or more data tensors (CONCATENATION). */
typedef struct { int code; const char* name; const char* sigs[4]; } OpSpec;
static const OpSpec SPECS[] = {
    {0, "ADD", {"TTi"}}, {1, "AVERAGE_POOL_2D", {"Tiiiiiiiii", "Tiiiiiiiiib"}}, {2, "CONCATENATION", {"*i"}},
    {3, "CONV_2D", {"TCCiiiiiii", "TCCiiiiiiib", "TCCiiiiiiibii"}},
    {4, "DEPTHWISE_CONV_2D", {"TCCiiiiiiii", "TCCiiiiiiiib", "TCCiiiiiiiibii"}},
    {5, "DEPTH_TO_SPACE", {"Ti", "Tib"}}, {6, "DEQUANTIZE", {"T"}}, {8, "FLOOR", {"T"}},
    {9, "FULLY_CONNECTED", {"TCCi"}}, {14, "LOGISTIC", {"T"}}, {17, "MAX_POOL_2D", {"Tiiiiiiiii", "Tiiiiiiiiib"}},
    {18, "MUL", {"TTi"}}, {19, "RELU", {"T"}}, {20, "RELU1", {"T"}}, {21, "RELU6", {"T"}}, {22, "RESHAPE", {"TI"}},
    {23, "RESIZE_BILINEAR", {"Tii", "Tiib", "Tiibbb"}}, {25, "SOFTMAX", {"Tf", "Tfi"}}, {26, "SPACE_TO_DEPTH", {"Ti", "Tib"}},
    {28, "TANH", {"T"}}, {30, "DIV", {"TTi"}}, {31, "MEAN", {"TIi"}}, {32, "PAD", {"TI"}}, {36, "SUB", {"TTi"}},
    {37, "TRANSPOSE", {"TI"}}, {38, "ABS", {"T"}}, {49, "EXP", {"T"}}, {60, "LOG", {"T"}}, {65, "MAXIMUM", {"TT"}},
    {66, "MINIMUM", {"TT"}}, {67, "NEG", {"T"}}, {69, "PAD_V2", {"TIf"}}, {71, "PRELU", {"TT"}}, {72, "QUANTIZE", {"T"}},
    {83, "RSQRT", {"T"}}, {88, "SQRT", {"T"}}, {91, "TRANSPOSE_CONV_2D", {"TCCiiiiiiib"}},
    {35, "STRIDED_SLICE", {"TIIIiii"}}, {51, "GATHER", {"TiX"}}, {86, "SLICE", {"TII"}}, {87, "SPLIT", {"Tii"}},
    {94, "RESIZE_NEAREST_NEIGHBOR", {"Tiib", "Tiibbb"}}, {99, "HARD_SWISH", {"T"}}, {102, "BATCH_MATMUL", {"TT", "TTbb"}},
    {104, "MIRROR_PAD", {"TIi"}}, {55, "GROUPED_CONV_2D", {"TCCiiiiiiiib"}},
    {64, "LOG_SOFTMAX", {"Tfi"}}, {70, "POW", {"TT"}}, {77, "REDUCE_MAX", {"TIb"}}, {80, "REDUCE_SUM", {"TIb"}},
    {53, "GREATER", {"TT"}}, {58, "LESS", {"TT"}}, {84, "SELECT", {"BTT"}},
    {13, "LOCAL_RESPONSE_NORMALIZATION", {"Tifff", "Tifffi"}},
};

static int data_type(int32_t t) {
    return t == TENSOR_FLOAT32 || t == TENSOR_FLOAT16 || t == TENSOR_QUANT8_ASYMM || t == TENSOR_QUANT8_ASYMM_SIGNED ||
           t == TENSOR_QUANT8_SYMM || t == TENSOR_QUANT8_SYMM_PER_CHANNEL || t == TENSOR_INT32;
}

static int check_sig(ANeuralNetworksModel* m, const OpSpec* s, const char* sig, uint32_t n, const uint32_t* in) {
    size_t len = strlen(sig);
    if (sig[0] == '*') { if (n < 2) return 0; }
    else if (len != n) return 0;
    for (uint32_t k = 0; k < n; k++) {
        char c = sig[0] == '*' ? (k == n - 1 ? sig[1] : 'T') : sig[k];
        Operand* o = &m->ops[in[k]];
        switch (c) {
            case 'T': if (!data_type(o->type)) return misuse(BAD_DATA, "%s input %u: type %d is not a data tensor", s->name, k, o->type), -1; break;
            case 'C': if (!data_type(o->type) || !o->has_value) return misuse(BAD_DATA, "%s input %u: must be a constant tensor", s->name, k), -1; break;
            case 'I': if (o->type != TENSOR_INT32 || !o->has_value) return misuse(BAD_DATA, "%s input %u: must be a constant TENSOR_INT32", s->name, k), -1; break;
            case 'i': if (o->type != INT32 || !o->has_value) return misuse(BAD_DATA, "%s input %u: must be a constant INT32 scalar (type %d)", s->name, k, o->type), -1; break;
            case 'f': if (o->type != FLOAT32 || !o->has_value) return misuse(BAD_DATA, "%s input %u: must be a constant FLOAT32 scalar", s->name, k), -1; break;
            case 'b': if (o->type != BOOL || !o->has_value) return misuse(BAD_DATA, "%s input %u: must be a constant BOOL scalar", s->name, k), -1; break;
            case 'X': if (o->type != TENSOR_INT32) return misuse(BAD_DATA, "%s input %u: must be a TENSOR_INT32", s->name, k), -1; break;
            case 'B': if (o->type != TENSOR_BOOL8) return misuse(BAD_DATA, "%s input %u: must be a TENSOR_BOOL8", s->name, k), -1; break;
        }
    }
    return 1;
}

/* The values of a constant TENSOR_INT32 operand (copied when small, referenced when large). */
static const int32_t* ints_of(const Operand* o) { return o->ref ? (const int32_t*)o->ref : o->small; }

static uint32_t elements(const Operand* o) {
    uint32_t n = 1;
    for (uint32_t k = 0; k < o->rank; k++) n *= o->dims[k];
    return n;
}

/* One axis of a STRIDED_SLICE (NNAPI / TFLite semantics): the number of elements it selects. */
static int32_t strided_count(int32_t dim, int32_t b, int32_t e, int32_t st, int begin_masked, int end_masked) {
    if (begin_masked) b = st > 0 ? 0 : dim - 1;
    else { if (b < 0) b += dim; b = st > 0 ? (b < 0 ? 0 : b > dim ? dim : b) : (b < 0 ? 0 : b > dim - 1 ? dim - 1 : b); }
    if (end_masked) e = st > 0 ? dim : -1;
    else { if (e < 0) e += dim; e = st > 0 ? (e < 0 ? 0 : e > dim ? dim : e) : (e < -1 ? -1 : e > dim - 1 ? dim - 1 : e); }
    int32_t span = st > 0 ? e - b : b - e, step = st > 0 ? st : -st;
    return span <= 0 ? 0 : (span + step - 1) / step;
}

static int check_data_ops(ANeuralNetworksModel* m, const OpSpec* s, uint32_t n_in, const uint32_t* in, uint32_t n_out,
                          const uint32_t* out) {
    Operand *x = &m->ops[in[0]], *y = &m->ops[out[0]];
    if (s->code == 87) {  /* SPLIT: num_splits outputs, equal parts of the axis */
        int32_t axis = m->ops[in[1]].ival, n = m->ops[in[2]].ival;
        if (axis < 0) axis += (int32_t)x->rank;
        if (axis < 0 || axis >= (int32_t)x->rank) return misuse(BAD_DATA, "SPLIT: axis %d of a rank-%u input", axis, x->rank);
        if (n < 1 || (uint32_t)n != n_out || x->dims[axis] % (uint32_t)n)
            return misuse(BAD_DATA, "SPLIT: %d splits, %u outputs, axis size %u", n, n_out, x->dims[axis]);
        for (uint32_t k = 0; k < n_out; k++) {
            Operand* o = &m->ops[out[k]];
            if (o->rank != x->rank) return misuse(BAD_DATA, "SPLIT: output %u has rank %u", k, o->rank);
            for (uint32_t d = 0; d < x->rank; d++)
                if (o->dims[d] != ((int32_t)d == axis ? x->dims[d] / (uint32_t)n : x->dims[d]))
                    return misuse(BAD_DATA, "SPLIT: output %u dimension %u is %u", k, d, o->dims[d]);
        }
        return NO_ERROR;
    }
    if (n_out != 1) return misuse(BAD_DATA, "%s: %u outputs (1 expected)", s->name, n_out);
    if (s->code == 86) {  /* SLICE: begin + size within the input, output = size (-1: to the end) */
        Operand *b = &m->ops[in[1]], *z = &m->ops[in[2]];
        if (b->rank != 1 || z->rank != 1 || b->dims[0] != x->rank || z->dims[0] != x->rank || y->rank != x->rank)
            return misuse(BAD_DATA, "SLICE: begin / size / output do not have the input's rank %u", x->rank);
        for (uint32_t d = 0; d < x->rank; d++) {
            int32_t bd = ints_of(b)[d], zd = ints_of(z)[d];
            if (zd == -1) zd = (int32_t)x->dims[d] - bd;
            if (bd < 0 || zd < 0 || (uint32_t)(bd + zd) > x->dims[d] || (uint32_t)zd != y->dims[d])
                return misuse(BAD_DATA, "SLICE: axis %u begin %d size %d of %u -> output %u", d, bd, zd, x->dims[d], y->dims[d]);
        }
    }
    if (s->code == 35) {  /* STRIDED_SLICE: the output is what begin / end / strides / masks select */
        Operand *b = &m->ops[in[1]], *e = &m->ops[in[2]], *st = &m->ops[in[3]];
        int32_t bmask = m->ops[in[4]].ival, emask = m->ops[in[5]].ival, shrink = m->ops[in[6]].ival;
        if (b->dims[0] != x->rank || e->dims[0] != x->rank || st->dims[0] != x->rank)
            return misuse(BAD_DATA, "STRIDED_SLICE: begin / end / strides lengths differ from the rank %u", x->rank);
        if (shrink || y->rank != x->rank) return misuse(BAD_DATA, "STRIDED_SLICE: shrink_axis_mask %d (this fake checks 0)", shrink);
        for (uint32_t d = 0; d < x->rank; d++) {
            int32_t sd = ints_of(st)[d];
            if (sd == 0) return misuse(BAD_DATA, "STRIDED_SLICE: stride 0 on axis %u", d);
            int32_t n = strided_count((int32_t)x->dims[d], ints_of(b)[d], ints_of(e)[d], sd, (bmask >> d) & 1, (emask >> d) & 1);
            if (n != (int32_t)y->dims[d])
                return misuse(BAD_DATA, "STRIDED_SLICE: axis %u selects %d elements, output has %u", d, n, y->dims[d]);
        }
    }
    if (s->code == 51) {  /* GATHER: indices within the axis, output = input[:axis] + indices + input[axis+1:] */
        Operand* idx = &m->ops[in[2]];
        int32_t axis = m->ops[in[1]].ival;
        if (axis < 0) axis += (int32_t)x->rank;
        if (axis < 0 || axis >= (int32_t)x->rank) return misuse(BAD_DATA, "GATHER: axis %d of a rank-%u input", axis, x->rank);
        if (y->rank != x->rank + idx->rank - 1) return misuse(BAD_DATA, "GATHER: output rank %u", y->rank);
        for (uint32_t k = 0; idx->has_value && k < elements(idx); k++)  /* run-time indices: checked by the kernel */
            if (ints_of(idx)[k] < 0 || (uint32_t)ints_of(idx)[k] >= x->dims[axis])
                return misuse(BAD_DATA, "GATHER: index %d outside [0, %u)", ints_of(idx)[k], x->dims[axis]);
        for (uint32_t d = 0, o = 0; d < x->rank; d++) {
            if ((int32_t)d == axis) {
                for (uint32_t k = 0; k < idx->rank; k++, o++)
                    if (y->dims[o] != idx->dims[k]) return misuse(BAD_DATA, "GATHER: output dimension %u", o);
            } else if (y->dims[o++] != x->dims[d]) return misuse(BAD_DATA, "GATHER: output dimension %u", o - 1);
        }
    }
    if (s->code == 104) {  /* MIRROR_PAD: paddings [rank, 2], < dim (REFLECT) or <= dim (SYMMETRIC) */
        Operand* p = &m->ops[in[1]];
        int32_t mode = m->ops[in[2]].ival;
        if (p->rank != 2 || p->dims[0] != x->rank || p->dims[1] != 2 || y->rank != x->rank || (mode != 0 && mode != 1))
            return misuse(BAD_DATA, "MIRROR_PAD: paddings shape / output rank / mode %d", mode);
        for (uint32_t d = 0; d < x->rank; d++) {
            int32_t lo = ints_of(p)[2 * d], hi = ints_of(p)[2 * d + 1], limit = (int32_t)x->dims[d] - (mode == 0);
            if (lo < 0 || hi < 0 || lo > limit || hi > limit || y->dims[d] != x->dims[d] + (uint32_t)(lo + hi))
                return misuse(BAD_DATA, "MIRROR_PAD: axis %u pads %d, %d of %u -> %u", d, lo, hi, x->dims[d], y->dims[d]);
        }
    }
    if (s->code == 102) {  /* BATCH_MATMUL: same rank and batch, [.., r, c] x [.., r', c'] */
        Operand* b = &m->ops[in[1]];
        int adj_x = n_in > 2 && m->ops[in[2]].ival, adj_y = n_in > 3 && m->ops[in[3]].ival;
        uint32_t r = x->rank;
        if (b->rank != r || y->rank != r || r < 2)
            return misuse(BAD_DATA, "BATCH_MATMUL: ranks %u, %u -> %u", r, b->rank, y->rank);
        for (uint32_t d = 0; d + 2 < r; d++)
            if (x->dims[d] != b->dims[d] || y->dims[d] != x->dims[d])
                return misuse(BAD_DATA, "BATCH_MATMUL: batch dimension %u: %u, %u -> %u", d, x->dims[d], b->dims[d], y->dims[d]);
        uint32_t rows = x->dims[r - 2 + adj_x], inner_x = x->dims[r - 1 - adj_x];
        uint32_t inner_y = b->dims[r - 2 + adj_y], cols = b->dims[r - 1 - adj_y];
        if (inner_x != inner_y || y->dims[r - 2] != rows || y->dims[r - 1] != cols)
            return misuse(BAD_DATA, "BATCH_MATMUL: [%u x %u] x [%u x %u] -> [%u x %u]", rows, inner_x, inner_y, cols,
                          y->dims[r - 2], y->dims[r - 1]);
    }
    return NO_ERROR;
}

static int check_shapes(ANeuralNetworksModel* m, const OpSpec* s, const uint32_t* in, const uint32_t* out) {
    Operand *x = &m->ops[in[0]], *y = &m->ops[out[0]];
    if (s->code == 3 || s->code == 4) {  /* CONV_2D / DEPTHWISE_CONV_2D: NHWC, explicit padding */
        Operand *f = &m->ops[in[1]], *b = &m->ops[in[2]];
        if (x->rank != 4 || f->rank != 4 || b->rank != 1 || y->rank != 4)
            return misuse(BAD_DATA, "%s: ranks input %u filter %u bias %u output %u (want 4, 4, 1, 4)", s->name, x->rank, f->rank, b->rank, y->rank);
        uint32_t cout = s->code == 3 ? f->dims[0] : f->dims[3];
        if (b->dims[0] != cout || y->dims[3] != cout)
            return misuse(BAD_DATA, "%s: bias %u / output channels %u do not match the filter's %u", s->name, b->dims[0], y->dims[3], cout);
        if (s->code == 3 && f->dims[3] != x->dims[3])
            return misuse(BAD_DATA, "CONV_2D: filter input channels %u != input channels %u", f->dims[3], x->dims[3]);
    }
    if (s->code == 55) {  /* GROUPED_CONV_2D: filter [out, kh, kw, in / groups], out a multiple of groups */
        Operand *f = &m->ops[in[1]], *b = &m->ops[in[2]];
        int32_t groups = m->ops[in[9]].ival;
        if (x->rank != 4 || f->rank != 4 || b->rank != 1 || y->rank != 4 || groups < 1)
            return misuse(BAD_DATA, "GROUPED_CONV_2D: ranks input %u filter %u bias %u output %u, %d groups", x->rank, f->rank, b->rank, y->rank, groups);
        if (f->dims[3] * (uint32_t)groups != x->dims[3] || f->dims[0] % (uint32_t)groups || b->dims[0] != f->dims[0] || y->dims[3] != f->dims[0])
            return misuse(BAD_DATA, "GROUPED_CONV_2D: %d groups of filter %u x %u for %u input channels", groups, f->dims[0], f->dims[3], x->dims[3]);
    }
    if (s->code == 9) {
        Operand *w = &m->ops[in[1]], *b = &m->ops[in[2]];
        if (w->rank != 2 || b->rank != 1 || b->dims[0] != w->dims[0] || y->dims[y->rank - 1] != w->dims[0])
            return misuse(BAD_DATA, "FULLY_CONNECTED: weights/bias/output shapes disagree");
        if (x->dims[x->rank - 1] != w->dims[1])
            return misuse(BAD_DATA, "FULLY_CONNECTED: input depth %u != weights' %u", x->dims[x->rank - 1], w->dims[1]);
    }
    if (s->code == 53 || s->code == 58) {  /* GREATER / LESS: operands of one type, a TENSOR_BOOL8 result */
        if (m->ops[in[1]].type != x->type || y->type != TENSOR_BOOL8)
            return misuse(BAD_DATA, "%s: operand types %d, %d -> %d", s->name, x->type, m->ops[in[1]].type, y->type);
    }
    if (s->code == 84) {  /* SELECT: condition, true and false values and output of one shape, values of one type */
        Operand *a = &m->ops[in[1]], *b = &m->ops[in[2]];
        if (a->type != b->type || y->type != a->type) return misuse(BAD_DATA, "SELECT: value types %d, %d -> %d", a->type, b->type, y->type);
        const Operand* all[4] = {x, a, b, y};
        for (int k = 1; k < 4; k++) {
            if (all[k]->rank != x->rank) return misuse(BAD_DATA, "SELECT: operand %d has rank %u, not %u", k, all[k]->rank, x->rank);
            for (uint32_t d = 0; d < x->rank; d++)
                if (all[k]->dims[d] != x->dims[d]) return misuse(BAD_DATA, "SELECT: operand %d dimension %u is %u, not %u", k, d, all[k]->dims[d], x->dims[d]);
        }
    }
    if (s->code == 0 || s->code == 18 || s->code == 30 || s->code == 36 || s->code == 53 || s->code == 58) {  /* broadcast compatibility */
        Operand* b = &m->ops[in[1]];
        uint32_t r = x->rank > b->rank ? x->rank : b->rank;
        if (y->rank != r) return misuse(BAD_DATA, "%s: output rank %u != %u", s->name, y->rank, r);
        for (uint32_t k = 0; k < r; k++) {
            uint32_t da = k < r - x->rank ? 1 : x->dims[k - (r - x->rank)];
            uint32_t db = k < r - b->rank ? 1 : b->dims[k - (r - b->rank)];
            uint32_t d = da > db ? da : db;
            if ((da != db && da != 1 && db != 1) || y->dims[k] != d)
                return misuse(BAD_DATA, "%s: shapes do not broadcast at axis %u (%u, %u -> %u)", s->name, k, da, db, y->dims[k]);
        }
    }
    if (s->code == 22) {  /* RESHAPE keeps the element count */
        size_t a = 1, b = 1;
        for (uint32_t k = 0; k < x->rank; k++) a *= x->dims[k];
        for (uint32_t k = 0; k < y->rank; k++) b *= y->dims[k];
        if (a != b) return misuse(BAD_DATA, "RESHAPE: %zu elements -> %zu", a, b);
    }
    return NO_ERROR;
}

int ANeuralNetworksModel_addOperation(ANeuralNetworksModel* m, int32_t type, uint32_t inputCount,
                                      const uint32_t* inputs, uint32_t outputCount, const uint32_t* outputs) {
    g_calls++;
    int rc = check_model(m, "addOperation");
    if (rc) return rc;
    if (m->finished) return misuse(BAD_STATE, "addOperation after finish");
    if ((inputCount && !inputs) || (outputCount && !outputs)) return misuse(UNEXPECTED_NULL, "addOperation: NULL index list");
    const OpSpec* s = NULL;
    for (size_t i = 0; i < sizeof SPECS / sizeof SPECS[0]; i++) if (SPECS[i].code == type) s = &SPECS[i];
    if (!s) return misuse(BAD_DATA, "addOperation %u: operation code %d unknown to this fake", m->n_operations, type);
    for (uint32_t k = 0; k < inputCount; k++)
        if (inputs[k] >= m->n) return misuse(BAD_DATA, "%s: input operand %u out of range", s->name, inputs[k]);
    for (uint32_t k = 0; k < outputCount; k++) {
        if (outputs[k] >= m->n) return misuse(BAD_DATA, "%s: output operand %u out of range", s->name, outputs[k]);
        Operand* o = &m->ops[outputs[k]];
        if (o->has_value) return misuse(BAD_DATA, "%s: output operand %u is a constant", s->name, outputs[k]);
        if (o->produced) return misuse(BAD_DATA, "%s: operand %u is written by two operations", s->name, outputs[k]);
        if (is_scalar(o->type)) return misuse(BAD_DATA, "%s: output operand %u is a scalar", s->name, outputs[k]);
    }
    if (outputCount == 0) return misuse(BAD_DATA, "%s: no outputs", s->name);
    int matched = 0;
    for (int v = 0; v < 4 && s->sigs[v]; v++) {
        int r = check_sig(m, s, s->sigs[v], inputCount, inputs);
        if (r < 0) return BAD_DATA;
        if (r > 0) { matched = 1; break; }
    }
    if (!matched) return misuse(BAD_DATA, "%s: %u inputs match no signature of the operation", s->name, inputCount);
    rc = check_data_ops(m, s, inputCount, inputs, outputCount, outputs);  /* also: one output unless SPLIT */
    if (rc) return rc;
    rc = check_shapes(m, s, inputs, outputs);
    if (rc) return rc;
    for (uint32_t k = 0; k < outputCount; k++) m->ops[outputs[k]].produced = 1;
    m->n_operations++;
    return NO_ERROR;
}

int ANeuralNetworksModel_identifyInputsAndOutputs(ANeuralNetworksModel* m, uint32_t inputCount, const uint32_t* inputs,
                                                  uint32_t outputCount, const uint32_t* outputs) {
    g_calls++;
    int rc = check_model(m, "identifyInputsAndOutputs");
    if (rc) return rc;
    if (m->finished) return misuse(BAD_STATE, "identifyInputsAndOutputs after finish");
    if (m->io_set) return misuse(BAD_STATE, "identifyInputsAndOutputs called twice");
    if (outputCount == 0) return misuse(BAD_DATA, "identifyInputsAndOutputs: no outputs");
    for (uint32_t k = 0; k < inputCount; k++) {
        if (inputs[k] >= m->n) return misuse(BAD_DATA, "model input %u out of range", inputs[k]);
        Operand* o = &m->ops[inputs[k]];
        if (o->has_value || o->produced || is_scalar(o->type))
            return misuse(BAD_DATA, "model input operand %u is a constant, a scalar or an operation's result", inputs[k]);
        o->is_input = 1;
    }
    for (uint32_t k = 0; k < outputCount; k++) {
        if (outputs[k] >= m->n) return misuse(BAD_DATA, "model output %u out of range", outputs[k]);
        Operand* o = &m->ops[outputs[k]];
        if (!o->produced) return misuse(BAD_DATA, "model output operand %u is produced by no operation", outputs[k]);
        if (o->is_output) return misuse(BAD_DATA, "model output operand %u listed twice", outputs[k]);
        o->is_output = 1;
    }
    m->inputs = malloc((inputCount + 1) * sizeof(uint32_t)); memcpy(m->inputs, inputs, inputCount * sizeof(uint32_t));
    m->outputs = malloc(outputCount * sizeof(uint32_t)); memcpy(m->outputs, outputs, outputCount * sizeof(uint32_t));
    m->n_inputs = inputCount; m->n_outputs = outputCount; m->io_set = 1;
    return NO_ERROR;
}

int ANeuralNetworksModel_relaxComputationFloat32toFloat16(ANeuralNetworksModel* m, bool allow) {
    g_calls++;
    int rc = check_model(m, "relaxComputationFloat32toFloat16");
    if (rc) return rc;
    (void)allow;
    if (m->finished) return misuse(BAD_STATE, "relaxComputationFloat32toFloat16 after finish");
    return NO_ERROR;
}

static int check_refs(ANeuralNetworksModel* m, const char* when) {
    for (uint32_t i = 0; i < m->n; i++)
        if (m->ops[i].ref && checksum(m->ops[i].ref, m->ops[i].ref_len) != m->ops[i].ref_sum)
            return misuse(BAD_STATE, "%s: the memory of operand %u's value (%zu bytes, passed by reference) changed "
                          "or was freed", when, i, m->ops[i].ref_len);
    return NO_ERROR;
}

int ANeuralNetworksModel_finish(ANeuralNetworksModel* m) {
    g_calls++;
    int rc = check_model(m, "finish");
    if (rc) return rc;
    if (m->finished) return misuse(BAD_STATE, "ANeuralNetworksModel_finish called twice");
    if (!m->io_set) return misuse(BAD_STATE, "finish before identifyInputsAndOutputs");
    if (m->n_operations == 0) return misuse(BAD_DATA, "finish: the model has no operation");
    for (uint32_t i = 0; i < m->n; i++) {
        Operand* o = &m->ops[i];
        if (!o->has_value && !o->produced && !o->is_input)
            return misuse(BAD_DATA, "finish: operand %u has no value, is no model input and no operation's result", i);
        if (o->type == TENSOR_QUANT8_SYMM_PER_CHANNEL && !o->has_channel_quant)
            return misuse(BAD_DATA, "finish: per-channel operand %u has no channel quantization parameters", i);
    }
    rc = check_refs(m, "Model_finish");
    if (rc) return rc;
    m->finished = 1;
    return NO_ERROR;
}

/* --- compilation ------------------------------------------------------------------------ */
int ANeuralNetworksCompilation_create(ANeuralNetworksModel* m, ANeuralNetworksCompilation** out) {
    g_calls++;
    int rc = check_model(m, "Compilation_create");
    if (rc) return rc;
    if (!out) return misuse(UNEXPECTED_NULL, "Compilation_create: NULL out pointer");
    if (!m->finished) return misuse(BAD_STATE, "Compilation_create on an unfinished model");
    ANeuralNetworksCompilation* c = calloc(1, sizeof *c);
    c->magic = M_COMP; c->model = m;
    m->live_compilations++;
    g_live++;
    *out = c;
    return NO_ERROR;
}

static int check_comp(ANeuralNetworksCompilation* c, const char* fn) {
    if (!c) return misuse(UNEXPECTED_NULL, "%s: compilation is NULL", fn);
    if (c->magic != M_COMP) return misuse(BAD_DATA, "%s: not a live compilation", fn);
    if (c->model->magic != M_MODEL) return misuse(BAD_STATE, "%s: the model was freed before the compilation", fn);
    return NO_ERROR;
}

int ANeuralNetworksCompilation_setPreference(ANeuralNetworksCompilation* c, int32_t pref) {
    g_calls++;
    int rc = check_comp(c, "setPreference");
    if (rc) return rc;
    if (c->finished) return misuse(BAD_STATE, "setPreference after Compilation_finish");
    if (pref < 0 || pref > 2) return misuse(BAD_DATA, "setPreference: %d is not a preference (0..2)", pref);
    return NO_ERROR;
}

int ANeuralNetworksCompilation_finish(ANeuralNetworksCompilation* c) {
    g_calls++;
    int rc = check_comp(c, "Compilation_finish");
    if (rc) return rc;
    if (c->finished) return misuse(BAD_STATE, "Compilation_finish called twice");
    rc = check_refs(c->model, "Compilation_finish");
    if (rc) return rc;
    const char* refuse = getenv("FAKE_NNAPI_REFUSE_COMPILE");
    if (refuse && refuse[0] == '1') return OP_FAILED;  /* a driver refusing the model: not a misuse */
    c->finished = 1;
    return NO_ERROR;
}

void ANeuralNetworksCompilation_free(ANeuralNetworksCompilation* c) {
    g_calls++;
    if (!c) return;
    if (c->magic != M_COMP) { misuse(BAD_DATA, "Compilation_free: not a live compilation (double free?)"); return; }
    if (c->live_executions) misuse(BAD_STATE, "Compilation_free: %d execution(s) still alive", c->live_executions);
    if (c->model->magic != M_MODEL) misuse(BAD_STATE, "Compilation_free: its model was freed first");
    else c->model->live_compilations--;
    c->magic = M_DEAD;
    g_live--;
}

/* --- execution -------------------------------------------------------------------------- */
int ANeuralNetworksExecution_create(ANeuralNetworksCompilation* c, ANeuralNetworksExecution** out) {
    g_calls++;
    int rc = check_comp(c, "Execution_create");
    if (rc) return rc;
    if (!out) return misuse(UNEXPECTED_NULL, "Execution_create: NULL out pointer");
    if (!c->finished) return misuse(BAD_STATE, "Execution_create on an unfinished compilation");
    ANeuralNetworksExecution* e = calloc(1, sizeof *e);
    ANeuralNetworksModel* m = c->model;
    e->magic = M_EXEC; e->comp = c;
    e->in_set = calloc(m->n_inputs + 1, sizeof(int));
    e->out_set = calloc(m->n_outputs, sizeof(int));
    e->out_bufs = calloc(m->n_outputs, sizeof(void*));
    e->out_lens = calloc(m->n_outputs, sizeof(size_t));
    c->live_executions++;
    g_live++;
    *out = e;
    return NO_ERROR;
}

static int check_exec(ANeuralNetworksExecution* e, const char* fn) {
    if (!e) return misuse(UNEXPECTED_NULL, "%s: execution is NULL", fn);
    if (e->magic != M_EXEC) return misuse(BAD_DATA, "%s: not a live execution", fn);
    return NO_ERROR;
}

static int check_io_type(Operand* o, const ANeuralNetworksOperandType* t, const char* what, int32_t index) {
    if (!t) return NO_ERROR;
    if (t->type != o->type || t->dimensionCount != o->rank)
        return misuse(BAD_DATA, "%s %d: type/rank differ from the model's operand", what, index);
    for (uint32_t k = 0; k < o->rank; k++)
        if (t->dimensions[k] != o->dims[k]) return misuse(BAD_DATA, "%s %d: dimension %u differs", what, index, k);
    return NO_ERROR;
}

int ANeuralNetworksExecution_setInput(ANeuralNetworksExecution* e, int32_t index, const ANeuralNetworksOperandType* t,
                                      const void* buffer, size_t length) {
    g_calls++;
    int rc = check_exec(e, "setInput");
    if (rc) return rc;
    ANeuralNetworksModel* m = e->comp->model;
    if (e->started) return misuse(BAD_STATE, "setInput after the execution started");
    if (index < 0 || (uint32_t)index >= m->n_inputs) return misuse(BAD_DATA, "setInput: input %d out of range", index);
    Operand* o = &m->ops[m->inputs[index]];
    if ((rc = check_io_type(o, t, "setInput", index))) return rc;
    if (!buffer) return misuse(UNEXPECTED_NULL, "setInput %d: NULL buffer", index);
    if (length != operand_bytes(o)) return misuse(BAD_DATA, "setInput %d: length %zu, operand needs %zu", index, length, operand_bytes(o));
    e->in_set[index] = 1;
    return NO_ERROR;
}

int ANeuralNetworksExecution_setOutput(ANeuralNetworksExecution* e, int32_t index, const ANeuralNetworksOperandType* t,
                                       void* buffer, size_t length) {
    g_calls++;
    int rc = check_exec(e, "setOutput");
    if (rc) return rc;
    ANeuralNetworksModel* m = e->comp->model;
    if (e->started) return misuse(BAD_STATE, "setOutput after the execution started");
    if (index < 0 || (uint32_t)index >= m->n_outputs) return misuse(BAD_DATA, "setOutput: output %d out of range", index);
    Operand* o = &m->ops[m->outputs[index]];
    if ((rc = check_io_type(o, t, "setOutput", index))) return rc;
    if (!buffer) return misuse(UNEXPECTED_NULL, "setOutput %d: NULL buffer", index);
    if (length != operand_bytes(o)) return misuse(BAD_DATA, "setOutput %d: length %zu, operand needs %zu", index, length, operand_bytes(o));
    e->out_set[index] = 1; e->out_bufs[index] = buffer; e->out_lens[index] = length;
    return NO_ERROR;
}

static int run(ANeuralNetworksExecution* e, const char* fn) {
    ANeuralNetworksModel* m = e->comp->model;
    if (e->started) return misuse(BAD_STATE, "%s: an execution computes once (create a new one)", fn);
    for (uint32_t k = 0; k < m->n_inputs; k++) if (!e->in_set[k]) return misuse(BAD_DATA, "%s: input %u not set", fn, k);
    for (uint32_t k = 0; k < m->n_outputs; k++) if (!e->out_set[k]) return misuse(BAD_DATA, "%s: output %u not set", fn, k);
    int rc = check_refs(m, fn);
    if (rc) return rc;
    for (uint32_t k = 0; k < m->n_outputs; k++) memset(e->out_bufs[k], 0, e->out_lens[k]);
    e->started = 1;
    g_computes++;
    return NO_ERROR;
}

#ifndef FAKE_NO_COMPUTE
int ANeuralNetworksExecution_compute(ANeuralNetworksExecution* e) {
    g_calls++;
    int rc = check_exec(e, "Execution_compute");
    if (rc) return rc;
    return run(e, "Execution_compute");
}
#endif

int ANeuralNetworksExecution_startCompute(ANeuralNetworksExecution* e, ANeuralNetworksEvent** event) {
    g_calls++;
    int rc = check_exec(e, "startCompute");
    if (rc) return rc;
    if (!event) return misuse(UNEXPECTED_NULL, "startCompute: NULL event pointer");
    rc = run(e, "startCompute");
    if (rc) return rc;
    ANeuralNetworksEvent* ev = calloc(1, sizeof *ev);
    ev->magic = M_EVENT; ev->exec = e;
    g_live++;
    *event = ev;
    return NO_ERROR;
}

int ANeuralNetworksEvent_wait(ANeuralNetworksEvent* ev) {
    g_calls++;
    if (!ev) return misuse(UNEXPECTED_NULL, "Event_wait: NULL event");
    if (ev->magic != M_EVENT) return misuse(BAD_DATA, "Event_wait: not a live event");
    if (ev->exec->magic != M_EXEC) return misuse(BAD_STATE, "Event_wait: the execution was freed before the wait");
    return NO_ERROR;
}

void ANeuralNetworksEvent_free(ANeuralNetworksEvent* ev) {
    g_calls++;
    if (!ev) return;
    if (ev->magic != M_EVENT) { misuse(BAD_DATA, "Event_free: not a live event (double free?)"); return; }
    ev->magic = M_DEAD;
    g_live--;
}

void ANeuralNetworksExecution_free(ANeuralNetworksExecution* e) {
    g_calls++;
    if (!e) return;
    if (e->magic != M_EXEC) { misuse(BAD_DATA, "Execution_free: not a live execution (double free?)"); return; }
    if (e->comp->magic != M_COMP) misuse(BAD_STATE, "Execution_free: its compilation was freed first");
    else e->comp->live_executions--;
    e->magic = M_DEAD;
    free(e->in_set); free(e->out_set); free(e->out_bufs); free(e->out_lens);
    g_live--;
}
