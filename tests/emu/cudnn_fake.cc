// cudnn_fake.cc (emulation tier): a stand-in libcudnn.so.9 for the part of
// cuDNN's backend API that workers/backend/cuda/attention_cudnn.cu uses, so
// that the plan-building and execution path runs before any GPU does. Built
// as $BUILD/emu/lib/cudnn-fake/libcudnn.so.9, outside the emulated programs'
// run path: a program sees it only through BALLAST_CUDNN_LIB.
//
// It checks what real cuDNN would refuse, at the call that would refuse it
// (the reason in cudnnGetLastErrorString): attributes of the wrong type or
// count, a descriptor set after finalize or used before, tensors without
// type, dims, strides, uid or alignment, by-value tensors that are not
// scalars; pointwise arity (GEN_INDEX with an axis, BINARY_SELECT with a
// boolean mask, comparisons writing booleans), operands that do not
// broadcast to the output; matmuls whose m, n, k or batch dims disagree;
// reductions to dims that do not divide; reshapes that change the element
// count or the memory they span; graphs where a uid names two different
// tensors, a virtual tensor is not produced exactly once or never read, or
// the ops form a cycle; a variant pack that misses a tensor of the graph or
// a workspace the plan asked for.
//
// Then it executes the graph on the emulated device: one queued grid on the
// handle's stream interprets the ops in dependency order (fp32, bf16 tensors
// rounded to nearest even where they are stored; matmuls and reductions in
// double), with cuDNN's broadcasting (a dim of 1, or a batch dim that
// divides the output's: query head h reads key/value head h / (H / Hkv)).
// So the attention graphs compute attention if, and only if, they say it.
//
// BALLAST_FAKE_CUDNN_LOG=FILE appends one line per finalized graph, plan
// and execution (what tests/integration/gpu_emu_cudnn.sh reads).
#include <cudnn_backend.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tests/emu/emu.h"

namespace {

std::mutex g_mu;
char g_last[1024];

cudnnStatus_t fail(cudnnStatus_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last, sizeof g_last, fmt, ap);
    va_end(ap);
    return st;
}

void flog(const char *fmt, ...) {
    const char *path = getenv("BALLAST_FAKE_CUDNN_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

struct Attr {
    cudnnBackendAttributeType_t type;
    int64_t n;
    std::vector<uint8_t> bytes;
};

struct Desc;
struct Graph {
    std::vector<Desc *> ops;             // in dependency order
    std::map<int64_t, Desc *> tensors;   // uid -> tensor
};

struct Desc {
    cudnnBackendDescriptorType_t type;
    std::map<int, Attr> attrs;
    bool final = false;
    // tensors
    cudnnDataType_t dtype{};
    int nd = 0;
    int64_t dims[8]{}, strides[8]{}, uid = 0, span = 0;
    bool virt = false, byval = false;
    // pointwise / reduction / ops
    int64_t mode = 0, axis = -1;
    Desc *x = nullptr, *b = nullptr, *t = nullptr, *y = nullptr, *desc = nullptr;
    // graph, engine config, plan
    std::shared_ptr<Graph> graph;
    int64_t workspace = 0;
    // variant pack
    std::vector<int64_t> uids;
    std::vector<void *> ptrs;
    void *ws = nullptr;
};

std::set<Desc *> g_live;

size_t type_size(cudnnBackendAttributeType_t t) {
    switch (t) {
    case CUDNN_TYPE_HANDLE: case CUDNN_TYPE_VOID_PTR: case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(void *);
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_INT64: return 8;
    case CUDNN_TYPE_FLOAT: return 4;
    case CUDNN_TYPE_DOUBLE: return 8;
    default: return 4; // enums
    }
}

Desc *live(void *p) { return g_live.count((Desc *)p) ? (Desc *)p : nullptr; }

// Attribute a of d as one value of type want (count 1), or nullptr.
const Attr *get(Desc *d, int a, cudnnBackendAttributeType_t want) {
    auto it = d->attrs.find(a);
    if (it == d->attrs.end() || it->second.type != want || it->second.n < 1) return nullptr;
    return &it->second;
}
template <class T> bool get1(Desc *d, int a, cudnnBackendAttributeType_t want, T *out) {
    const Attr *at = get(d, a, want);
    if (!at) return false;
    memcpy(out, at->bytes.data(), sizeof(T));
    return true;
}
Desc *get_desc(Desc *d, int a) {
    void *p = nullptr;
    if (!get1(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, &p)) return nullptr;
    return live(p);
}

struct Handle {
    cudaStream_t stream = 0;
};

const char *tname(cudnnBackendDescriptorType_t t) {
    switch (t) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return "tensor";
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: return "pointwise";
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return "pointwise op";
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: return "matmul";
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return "matmul op";
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: return "reduction";
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: return "reduction op";
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return "reshape op";
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return "operation graph";
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return "heuristics";
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return "engine config";
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return "execution plan";
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return "variant pack";
    default: return "descriptor";
    }
}

bool is_op(Desc *d) {
    return d && (d->type == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR ||
                 d->type == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR ||
                 d->type == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR ||
                 d->type == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
}

int arity(int64_t mode) {
    switch (mode) {
    case CUDNN_POINTWISE_EXP: case CUDNN_POINTWISE_LOG: case CUDNN_POINTWISE_IDENTITY: case CUDNN_POINTWISE_GEN_INDEX:
        return 1;
    case CUDNN_POINTWISE_ADD: case CUDNN_POINTWISE_SUB: case CUDNN_POINTWISE_MUL: case CUDNN_POINTWISE_DIV:
    case CUDNN_POINTWISE_CMP_GE: return 2;
    case CUDNN_POINTWISE_BINARY_SELECT: return 3;
    default: return -1;
    }
}

// Tensor t broadcasts to y: same rank, each dim equal or 1.
bool broadcasts(Desc *t, Desc *y) {
    if (t->nd != y->nd) return false;
    for (int i = 0; i < t->nd; i++)
        if (t->dims[i] != y->dims[i] && t->dims[i] != 1) return false;
    return true;
}

std::string dims_str(Desc *t) {
    std::string s = "[";
    for (int i = 0; i < t->nd; i++) s += (i ? "," : "") + std::to_string(t->dims[i]);
    return s + "]";
}

cudnnStatus_t finalize_tensor(Desc *d) {
    const Attr *dt = get(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE);
    const Attr *dm = get(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64);
    const Attr *st = get(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64);
    if (!dt || !dm || !st || !get(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64) ||
        !get(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64))
        return fail(CUDNN_STATUS_BAD_PARAM, "tensor: data type, dimensions, strides, unique id and byte alignment are required");
    if (dm->n != st->n || dm->n < 1 || dm->n > 8)
        return fail(CUDNN_STATUS_BAD_PARAM, "tensor: %lld dimensions but %lld strides", (long long)dm->n, (long long)st->n);
    memcpy(&d->dtype, dt->bytes.data(), sizeof d->dtype);
    d->nd = (int)dm->n;
    memcpy(d->dims, dm->bytes.data(), 8 * d->nd);
    memcpy(d->strides, st->bytes.data(), 8 * d->nd);
    get1(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &d->uid);
    get1(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &d->virt);
    get1(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &d->byval);
    d->span = 1;
    for (int i = 0; i < d->nd; i++) {
        if (d->dims[i] < 1 || d->strides[i] < 1)
            return fail(CUDNN_STATUS_BAD_PARAM, "tensor uid %lld: dimension %d is %lld, stride %lld", (long long)d->uid, i,
                        (long long)d->dims[i], (long long)d->strides[i]);
        d->span += (d->dims[i] - 1) * d->strides[i];
    }
    if (d->byval && (d->virt || d->span != 1))
        return fail(CUDNN_STATUS_BAD_PARAM, "tensor uid %lld: a by-value tensor must be a non-virtual scalar", (long long)d->uid);
    if (d->dtype != CUDNN_DATA_FLOAT && d->dtype != CUDNN_DATA_BFLOAT16 && d->dtype != CUDNN_DATA_INT32 &&
        d->dtype != CUDNN_DATA_BOOLEAN)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "tensor uid %lld: data type %d is not one this fake knows", (long long)d->uid,
                    (int)d->dtype);
    if (!d->virt && (d->dtype == CUDNN_DATA_INT32 || d->dtype == CUDNN_DATA_BOOLEAN) )
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "tensor uid %lld: only virtual tensors may be int32 or boolean here", (long long)d->uid);
    return CUDNN_STATUS_SUCCESS;
}

bool is_tensor(Desc *t) { return t && t->type == CUDNN_BACKEND_TENSOR_DESCRIPTOR && t->final; }

cudnnStatus_t finalize_op(Desc *d) {
    switch (d->type) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: {
        int m = 0;
        cudnnDataType_t prec;
        if (!get1(d, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &m) ||
            !get1(d, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &prec))
            return fail(CUDNN_STATUS_BAD_PARAM, "pointwise: mode and math precision are required");
        d->mode = m;
        if (arity(m) < 0) return fail(CUDNN_STATUS_NOT_SUPPORTED, "pointwise: mode %d is not one this fake knows", m);
        if (m == CUDNN_POINTWISE_GEN_INDEX && !get1(d, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &d->axis))
            return fail(CUDNN_STATUS_BAD_PARAM, "pointwise GEN_INDEX: the axis is required");
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
        d->desc = get_desc(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
        d->x = get_desc(d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
        d->b = get_desc(d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
        d->t = get_desc(d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
        d->y = get_desc(d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
        if (!d->desc || !d->desc->final || d->desc->type != CUDNN_BACKEND_POINTWISE_DESCRIPTOR)
            return fail(CUDNN_STATUS_BAD_PARAM, "pointwise op: no finalized pointwise descriptor");
        if (!is_tensor(d->x) || !is_tensor(d->y)) return fail(CUDNN_STATUS_BAD_PARAM, "pointwise op: x and y must be finalized tensors");
        int n = arity(d->desc->mode);
        if ((n >= 2) != (d->b != nullptr) || (n == 3) != (d->t != nullptr))
            return fail(CUDNN_STATUS_BAD_PARAM, "pointwise op mode %lld takes %d inputs", (long long)d->desc->mode, n);
        if ((d->b && !is_tensor(d->b)) || (d->t && !is_tensor(d->t)))
            return fail(CUDNN_STATUS_BAD_PARAM, "pointwise op: b and t must be finalized tensors");
        if (!broadcasts(d->x, d->y) || (d->b && !broadcasts(d->b, d->y)) || (d->t && !broadcasts(d->t, d->y)))
            return fail(CUDNN_STATUS_BAD_PARAM, "pointwise op mode %lld: inputs %s%s%s do not broadcast to the output %s",
                        (long long)d->desc->mode, dims_str(d->x).c_str(), d->b ? dims_str(d->b).c_str() : "",
                        d->t ? dims_str(d->t).c_str() : "", dims_str(d->y).c_str());
        int64_t m = d->desc->mode;
        if (m == CUDNN_POINTWISE_GEN_INDEX && (d->desc->axis >= d->y->nd || d->y->dtype != CUDNN_DATA_INT32))
            return fail(CUDNN_STATUS_BAD_PARAM, "GEN_INDEX: axis %lld of a rank-%d int32 output", (long long)d->desc->axis, d->y->nd);
        if (m == CUDNN_POINTWISE_CMP_GE && d->y->dtype != CUDNN_DATA_BOOLEAN)
            return fail(CUDNN_STATUS_BAD_PARAM, "CMP_GE writes a boolean tensor");
        if (m == CUDNN_POINTWISE_BINARY_SELECT && d->t->dtype != CUDNN_DATA_BOOLEAN)
            return fail(CUDNN_STATUS_BAD_PARAM, "BINARY_SELECT's mask (t) must be boolean");
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: {
        bool mm = d->type == CUDNN_BACKEND_MATMUL_DESCRIPTOR;
        cudnnDataType_t prec;
        if (!get1(d, mm ? CUDNN_ATTR_MATMUL_COMP_TYPE : CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &prec))
            return fail(CUDNN_STATUS_BAD_PARAM, "%s: the compute type is required", tname(d->type));
        if (!mm) {
            int op = -1;
            if (!get1(d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &op) ||
                (op != CUDNN_REDUCE_TENSOR_ADD && op != CUDNN_REDUCE_TENSOR_MAX))
                return fail(CUDNN_STATUS_BAD_PARAM, "reduction: operator ADD or MAX required");
            d->mode = op;
        }
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
        d->x = get_desc(d, CUDNN_ATTR_OPERATION_MATMUL_ADESC);
        d->b = get_desc(d, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
        d->y = get_desc(d, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
        d->desc = get_desc(d, CUDNN_ATTR_OPERATION_MATMUL_DESC);
        if (!is_tensor(d->x) || !is_tensor(d->b) || !is_tensor(d->y) || !d->desc || !d->desc->final)
            return fail(CUDNN_STATUS_BAD_PARAM, "matmul op: a, b, c and a finalized matmul descriptor are required");
        Desc *a = d->x, *b = d->b, *c = d->y;
        if (a->nd != 4 || b->nd != 4 || c->nd != 4) return fail(CUDNN_STATUS_NOT_SUPPORTED, "matmul op: rank-4 tensors only here");
        if (a->dims[2] != c->dims[2] || b->dims[3] != c->dims[3] || a->dims[3] != b->dims[2])
            return fail(CUDNN_STATUS_BAD_PARAM, "matmul op: a %s x b %s does not give c %s", dims_str(a).c_str(),
                        dims_str(b).c_str(), dims_str(c).c_str());
        for (int i = 0; i < 2; i++)
            if (c->dims[i] % a->dims[i] || c->dims[i] % b->dims[i])
                return fail(CUDNN_STATUS_BAD_PARAM, "matmul op: batch dim %d of a %s, b %s does not divide c's %s", i,
                            dims_str(a).c_str(), dims_str(b).c_str(), dims_str(c).c_str());
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
        d->x = get_desc(d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
        d->y = get_desc(d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
        d->desc = get_desc(d, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
        if (!is_tensor(d->x) || !is_tensor(d->y) || !d->desc || !d->desc->final)
            return fail(CUDNN_STATUS_BAD_PARAM, "reduction op: x, y and a finalized reduction descriptor are required");
        if (d->x->nd != d->y->nd) return fail(CUDNN_STATUS_BAD_PARAM, "reduction op: ranks differ");
        for (int i = 0; i < d->x->nd; i++)
            if (d->y->dims[i] != 1 && d->x->dims[i] % d->y->dims[i])
                return fail(CUDNN_STATUS_BAD_PARAM, "reduction op: %s does not reduce to %s", dims_str(d->x).c_str(),
                            dims_str(d->y).c_str());
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
        d->x = get_desc(d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
        d->y = get_desc(d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
        if (!is_tensor(d->x) || !is_tensor(d->y)) return fail(CUDNN_STATUS_BAD_PARAM, "reshape op: x and y are required");
        int64_t nx = 1, ny = 1;
        for (int i = 0; i < d->x->nd; i++) nx *= d->x->dims[i];
        for (int i = 0; i < d->y->nd; i++) ny *= d->y->dims[i];
        if (nx != ny || d->x->span != d->y->span)
            return fail(CUDNN_STATUS_BAD_PARAM, "reshape op: %s (span %lld) to %s (span %lld) changes the elements or memory",
                        dims_str(d->x).c_str(), (long long)d->x->span, dims_str(d->y).c_str(), (long long)d->y->span);
        return CUDNN_STATUS_SUCCESS;
    }
    default: return CUDNN_STATUS_SUCCESS;
    }
}

void op_io(Desc *op, std::vector<Desc *> &in, Desc **out) {
    in.clear();
    if (op->x) in.push_back(op->x);
    if (op->b) in.push_back(op->b);
    if (op->t) in.push_back(op->t);
    *out = op->y;
}

bool same_tensor(Desc *a, Desc *b) {
    if (a == b) return true;
    if (a->dtype != b->dtype || a->nd != b->nd || a->virt != b->virt || a->byval != b->byval) return false;
    for (int i = 0; i < a->nd; i++)
        if (a->dims[i] != b->dims[i] || a->strides[i] != b->strides[i]) return false;
    return true;
}

cudnnStatus_t finalize_graph(Desc *d) {
    auto it = d->attrs.find(CUDNN_ATTR_OPERATIONGRAPH_OPS);
    if (it == d->attrs.end() || it->second.type != CUDNN_TYPE_BACKEND_DESCRIPTOR || it->second.n < 1)
        return fail(CUDNN_STATUS_BAD_PARAM, "operation graph: no operations");
    if (!d->attrs.count(800 /* HANDLE */)) return fail(CUDNN_STATUS_BAD_PARAM, "operation graph: no handle");
    std::vector<Desc *> ops;
    for (int64_t i = 0; i < it->second.n; i++) {
        void *p;
        memcpy(&p, it->second.bytes.data() + i * sizeof(void *), sizeof p);
        Desc *op = live(p);
        if (!is_op(op) || !op->final) return fail(CUDNN_STATUS_BAD_PARAM, "operation graph: op %lld is not a finalized operation", (long long)i);
        ops.push_back(op);
    }
    auto g = std::make_shared<Graph>();
    std::map<int64_t, int> producers, readers;
    std::vector<Desc *> in;
    Desc *out;
    for (Desc *op : ops) {
        op_io(op, in, &out);
        std::vector<Desc *> all = in;
        all.push_back(out);
        for (Desc *t : all) {
            auto [pos, fresh] = g->tensors.emplace(t->uid, t);
            if (!fresh && !same_tensor(pos->second, t))
                return fail(CUDNN_STATUS_BAD_PARAM, "operation graph: uid %lld names two different tensors", (long long)t->uid);
        }
        if (out->byval) return fail(CUDNN_STATUS_BAD_PARAM, "operation graph: uid %lld is by value but written", (long long)out->uid);
        producers[out->uid]++;
        for (Desc *t : in) readers[t->uid]++;
    }
    for (auto &[uid, t] : g->tensors) {
        if (producers[uid] > 1) return fail(CUDNN_STATUS_BAD_PARAM, "operation graph: uid %lld is written twice", (long long)uid);
        if (t->virt && producers[uid] != 1)
            return fail(CUDNN_STATUS_BAD_PARAM, "operation graph: virtual uid %lld is read but never written", (long long)uid);
        if (t->virt && readers[uid] < 1)
            return fail(CUDNN_STATUS_BAD_PARAM, "operation graph: virtual uid %lld is written but never read", (long long)uid);
    }
    // dependency order (Kahn): an op runs once every virtual input is written
    std::set<int64_t> ready;
    for (auto &[uid, t] : g->tensors)
        if (!producers[uid]) ready.insert(uid);
    std::vector<bool> done(ops.size());
    for (size_t round = 0; round < ops.size(); round++) {
        bool progressed = false;
        for (size_t i = 0; i < ops.size(); i++) {
            if (done[i]) continue;
            op_io(ops[i], in, &out);
            bool ok = true;
            for (Desc *t : in) ok = ok && ready.count(t->uid);
            if (!ok) continue;
            done[i] = true;
            ready.insert(out->uid);
            g->ops.push_back(ops[i]);
            progressed = true;
        }
        if (!progressed) break;
    }
    if (g->ops.size() != ops.size()) return fail(CUDNN_STATUS_BAD_PARAM, "operation graph: the operations form a cycle");
    d->graph = g;
    int n[4] = { 0, 0, 0, 0 };
    for (Desc *op : ops)
        n[op->type == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR ? 0 : op->type == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR ? 1
          : op->type == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR ? 2 : 3]++;
    flog("graph: %zu ops (%d matmul, %d pointwise, %d reduction, %d reshape), %zu tensors", ops.size(), n[0], n[1], n[2], n[3],
         g->tensors.size());
    return CUDNN_STATUS_SUCCESS;
}

// ---- execution ----

float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

struct Buf {
    Desc *t;
    float *vf = nullptr;         // fp32 storage: virtual (ours), or a device fp32 tensor
    uint16_t *vh = nullptr;      // a device bf16 tensor
    std::vector<float> own;      // virtual storage (span elements)
    float read(int64_t off) const {
        if (vh) { uint32_t u = (uint32_t)vh[off] << 16; float f; memcpy(&f, &u, 4); return f; }
        return vf[off];
    }
    void write(int64_t off, float v) {
        if (t->dtype == CUDNN_DATA_BFLOAT16) v = bf16_round(v);
        if (vh) { uint32_t u; memcpy(&u, &v, 4); vh[off] = (uint16_t)(u >> 16); }
        else vf[off] = v;
    }
};

// offset of element idx of t, broadcasting: a dim of 1 reads index 0, a
// dim that divides the output's reads index / (out / dim)
int64_t offset(Desc *t, const int64_t *idx, const int64_t *odims) {
    int64_t o = 0;
    for (int i = 0; i < t->nd; i++) {
        int64_t j = t->dims[i] == odims[i] ? idx[i] : t->dims[i] == 1 ? 0 : idx[i] / (odims[i] / t->dims[i]);
        o += j * t->strides[i];
    }
    return o;
}

// a matmul operand's batch index i for output index idx (equal, 1, or a divisor: GQA)
int64_t bdim(Desc *t, int i, const int64_t *idx, const int64_t *od) {
    return t->dims[i] == od[i] ? idx[i] : t->dims[i] == 1 ? 0 : idx[i] / (od[i] / t->dims[i]);
}

struct Exec {
    std::shared_ptr<Graph> g;
    std::map<int64_t, void *> ptrs;    // uid -> device pointer
    std::map<int64_t, float> values;   // uid -> by-value scalar
};

void run_graph(const Exec &e) {
    std::map<int64_t, Buf> bufs;
    for (auto &[uid, t] : e.g->tensors) {
        Buf &b = bufs[uid];
        b.t = t;
        if (t->byval) { b.own.assign(1, e.values.at(uid)); b.vf = b.own.data(); }
        else if (t->virt) { b.own.assign(t->span, NAN); b.vf = b.own.data(); }
        else if (t->dtype == CUDNN_DATA_BFLOAT16) b.vh = (uint16_t *)e.ptrs.at(uid);
        else b.vf = (float *)e.ptrs.at(uid);
    }
    for (Desc *op : e.g->ops) {
        Buf &y = bufs[op->y->uid];
        const int64_t *od = op->y->dims;
        int64_t idx[4];
        if (op->type == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR) {
            int64_t m = op->desc->mode;
            Buf *x = &bufs[op->x->uid], *b = op->b ? &bufs[op->b->uid] : nullptr, *t = op->t ? &bufs[op->t->uid] : nullptr;
            for (idx[0] = 0; idx[0] < od[0]; idx[0]++)
                for (idx[1] = 0; idx[1] < od[1]; idx[1]++)
                    for (idx[2] = 0; idx[2] < od[2]; idx[2]++)
                        for (idx[3] = 0; idx[3] < od[3]; idx[3]++) {
                            float xv = x->read(offset(op->x, idx, od));
                            float bv = b ? b->read(offset(op->b, idx, od)) : 0.f;
                            float r;
                            switch (m) {
                            case CUDNN_POINTWISE_ADD: r = xv + bv; break;
                            case CUDNN_POINTWISE_SUB: r = xv - bv; break;
                            case CUDNN_POINTWISE_MUL: r = xv * bv; break;
                            case CUDNN_POINTWISE_DIV: r = xv / bv; break;
                            case CUDNN_POINTWISE_EXP: r = expf(xv); break;
                            case CUDNN_POINTWISE_LOG: r = logf(xv); break;
                            case CUDNN_POINTWISE_IDENTITY: r = xv; break;
                            case CUDNN_POINTWISE_GEN_INDEX: r = (float)idx[op->desc->axis]; break;
                            case CUDNN_POINTWISE_CMP_GE: r = xv >= bv ? 1.f : 0.f; break;
                            default: /* BINARY_SELECT */ r = t->read(offset(op->t, idx, od)) != 0.f ? xv : bv; break;
                            }
                            y.write(offset(op->y, idx, od), r);
                        }
        } else if (op->type == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) {
            Buf &a = bufs[op->x->uid], &b = bufs[op->b->uid];
            int64_t K = op->x->dims[3];
            for (idx[0] = 0; idx[0] < od[0]; idx[0]++)
                for (idx[1] = 0; idx[1] < od[1]; idx[1]++)
                    for (idx[2] = 0; idx[2] < od[2]; idx[2]++)
                        for (idx[3] = 0; idx[3] < od[3]; idx[3]++) {
                            int64_t ao = bdim(op->x, 0, idx, od) * op->x->strides[0] +
                                         bdim(op->x, 1, idx, od) * op->x->strides[1] + idx[2] * op->x->strides[2];
                            int64_t bo = bdim(op->b, 0, idx, od) * op->b->strides[0] +
                                         bdim(op->b, 1, idx, od) * op->b->strides[1] + idx[3] * op->b->strides[3];
                            double s = 0;
                            for (int64_t k = 0; k < K; k++)
                                s += (double)a.read(ao + k * op->x->strides[3]) * b.read(bo + k * op->b->strides[2]);
                            y.write(offset(op->y, idx, od), (float)s);
                        }
        } else if (op->type == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR) {
            Buf &x = bufs[op->x->uid];
            const int64_t *xd = op->x->dims;
            std::vector<double> acc(op->y->span, op->desc->mode == CUDNN_REDUCE_TENSOR_MAX ? -INFINITY : 0.0);
            for (idx[0] = 0; idx[0] < xd[0]; idx[0]++)
                for (idx[1] = 0; idx[1] < xd[1]; idx[1]++)
                    for (idx[2] = 0; idx[2] < xd[2]; idx[2]++)
                        for (idx[3] = 0; idx[3] < xd[3]; idx[3]++) {
                            double v = x.read(offset(op->x, idx, xd));
                            int64_t yo = offset(op->y, idx, xd);
                            if (op->desc->mode == CUDNN_REDUCE_TENSOR_MAX) acc[yo] = v > acc[yo] ? v : acc[yo];
                            else acc[yo] += v;
                        }
            for (idx[0] = 0; idx[0] < od[0]; idx[0]++)
                for (idx[1] = 0; idx[1] < od[1]; idx[1]++)
                    for (idx[2] = 0; idx[2] < od[2]; idx[2]++)
                        for (idx[3] = 0; idx[3] < od[3]; idx[3]++) {
                            int64_t yo = offset(op->y, idx, od);
                            y.write(yo, (float)acc[yo]);
                        }
        } else { // reshape: the same memory seen with other dims and strides
            Buf &x = bufs[op->x->uid];
            for (int64_t o = 0; o < op->y->span; o++) y.write(o, x.read(o));
        }
    }
}

void exec_kernel(int) {}

} // namespace

extern "C" {

size_t cudnnGetVersion(void) {
    const char *v = getenv("BALLAST_FAKE_CUDNN_VERSION");
    return v && *v ? (size_t)atol(v) : 91900;
}
const char *cudnnGetErrorString(cudnnStatus_t st) {
    switch (st) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    default: return "CUDNN_STATUS (fake)";
    }
}
void cudnnGetLastErrorString(char *message, size_t max_size) {
    std::lock_guard<std::mutex> l(g_mu);
    snprintf(message, max_size, "%s", g_last);
    g_last[0] = 0;
}
cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
    if (getenv("BALLAST_FAKE_CUDNN_NO_DEVICE")) return fail(CUDNN_STATUS_NOT_INITIALIZED, "no device (BALLAST_FAKE_CUDNN_NO_DEVICE)");
    *h = (cudnnHandle_t) new Handle();
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) { delete (Handle *)h; return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) { ((Handle *)h)->stream = s; return CUDNN_STATUS_SUCCESS; }

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *out) {
    std::lock_guard<std::mutex> l(g_mu);
    Desc *d = new Desc();
    d->type = type;
    g_live.insert(d);
    *out = (cudnnBackendDescriptor_t)d;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t p) {
    std::lock_guard<std::mutex> l(g_mu);
    Desc *d = live(p);
    if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "destroy: not a live descriptor");
    g_live.erase(d);
    // a plan keeps its graph (shared_ptr); the tensors it points to are
    // kept alive by leaking the descriptor objects themselves
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t p, cudnnBackendAttributeName_t a,
                                       cudnnBackendAttributeType_t type, int64_t n, const void *v) {
    std::lock_guard<std::mutex> l(g_mu);
    Desc *d = live(p);
    if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "set attribute %d: not a live descriptor", (int)a);
    if (d->final) return fail(CUDNN_STATUS_BAD_PARAM, "set attribute %d on a finalized %s", (int)a, tname(d->type));
    if (n < 0 || (n > 0 && !v)) return fail(CUDNN_STATUS_BAD_PARAM, "set attribute %d: %lld elements at %p", (int)a, (long long)n, v);
    if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
        for (int64_t i = 0; i < n; i++) {
            void *q;
            memcpy(&q, (const char *)v + i * sizeof(void *), sizeof q);
            Desc *r = live(q);
            if (!r || !r->final)
                return fail(CUDNN_STATUS_BAD_PARAM, "set attribute %d of a %s: element %lld is not a finalized descriptor", (int)a,
                            tname(d->type), (long long)i);
        }
    Attr at;
    at.type = type;
    at.n = n;
    at.bytes.assign((const uint8_t *)v, (const uint8_t *)v + n * type_size(type));
    d->attrs[a] = at;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t p) {
    std::lock_guard<std::mutex> l(g_mu);
    Desc *d = live(p);
    if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "finalize: not a live descriptor");
    if (d->final) return fail(CUDNN_STATUS_BAD_PARAM, "finalize: %s already finalized", tname(d->type));
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: st = finalize_tensor(d); break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: st = finalize_graph(d); break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
        Desc *g = get_desc(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
        int mode;
        if (!g || !g->graph || !get1(d, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode))
            st = fail(CUDNN_STATUS_BAD_PARAM, "heuristics: a finalized operation graph and a mode are required");
        else d->graph = g->graph;
        break;
    }
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
        Desc *cfg = get_desc(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
        if (!d->attrs.count(400 /* HANDLE */) || !cfg || !cfg->graph)
            st = fail(CUDNN_STATUS_BAD_PARAM, "execution plan: a handle and an engine config from the heuristics are required");
        else {
            d->graph = cfg->graph;
            d->workspace = 4096;
            flog("plan: %zu ops, workspace %lld", d->graph->ops.size(), (long long)d->workspace);
        }
        break;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
        const Attr *u = get(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64);
        const Attr *ptr = get(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR);
        if (!u || !ptr || u->n != ptr->n) { st = fail(CUDNN_STATUS_BAD_PARAM, "variant pack: as many unique ids as data pointers"); break; }
        d->uids.resize(u->n);
        d->ptrs.resize(u->n);
        memcpy(d->uids.data(), u->bytes.data(), 8 * u->n);
        memcpy(d->ptrs.data(), ptr->bytes.data(), sizeof(void *) * u->n);
        get1(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &d->ws);
        break;
    }
    default: st = finalize_op(d); break;
    }
    if (st == CUDNN_STATUS_SUCCESS) d->final = true;
    return st;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const p, cudnnBackendAttributeName_t a,
                                       cudnnBackendAttributeType_t type, int64_t req, int64_t *count, void *out) {
    std::lock_guard<std::mutex> l(g_mu);
    Desc *d = live(p);
    if (!d || !d->final) return fail(CUDNN_STATUS_BAD_PARAM, "get attribute %d: not a finalized descriptor", (int)a);
    if (d->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && a == CUDNN_ATTR_ENGINEHEUR_RESULTS &&
        type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
        if (req < 1) { *count = 1; return CUDNN_STATUS_SUCCESS; }
        void *q;
        memcpy(&q, out, sizeof q);
        Desc *cfg = live(q);
        if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
            return fail(CUDNN_STATUS_BAD_PARAM, "heuristics results: element 0 is not an engine config descriptor");
        cfg->graph = d->graph;
        cfg->final = true;
        *count = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    if (d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && a == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE &&
        type == CUDNN_TYPE_INT64 && req >= 1) {
        memcpy(out, &d->workspace, 8);
        if (count) *count = 1;
        return CUDNN_STATUS_SUCCESS;
    }
    return fail(CUDNN_STATUS_NOT_SUPPORTED, "get attribute %d of a %s: not in this fake", (int)a, tname(d->type));
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
    Exec e;
    cudaStream_t stream;
    {
        std::lock_guard<std::mutex> l(g_mu);
        Desc *pl = live(plan), *vp = live(pack);
        if (!h || !pl || !pl->final || pl->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !vp || !vp->final ||
            vp->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
            return fail(CUDNN_STATUS_BAD_PARAM, "execute: a handle, a finalized plan and a finalized variant pack are required");
        if (pl->workspace > 0 && !vp->ws) return fail(CUDNN_STATUS_BAD_PARAM, "execute: the plan needs %lld bytes of workspace, none given",
                                                      (long long)pl->workspace);
        e.g = pl->graph;
        std::map<int64_t, void *> given;
        for (size_t i = 0; i < vp->uids.size(); i++) given[vp->uids[i]] = vp->ptrs[i];
        for (auto &[uid, t] : e.g->tensors) {
            if (t->virt) continue;
            auto it = given.find(uid);
            if (it == given.end() || !it->second)
                return fail(CUDNN_STATUS_BAD_PARAM, "execute: the variant pack has no pointer for uid %lld", (long long)uid);
            if (t->byval) e.values[uid] = *(const float *)it->second; // read at the call, as cuDNN does
            else e.ptrs[uid] = it->second;
        }
        for (auto &[uid, p] : given)
            if (!e.g->tensors.count(uid))
                return fail(CUDNN_STATUS_BAD_PARAM, "execute: uid %lld is not a tensor of the graph", (long long)uid);
        stream = ((Handle *)h)->stream;
        flog("execute: %zu ops, %zu device tensors, %zu by-value scalars", e.g->ops.size(), e.ptrs.size(), e.values.size());
    }
    dim3 one(1, 1, 1);
    if (!emu::launch_ok((const void *)&exec_kernel, "cudnn_fake_execute", one, one, 0))
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "execute: the emulated launch was refused");
    for (auto &[uid, p] : e.ptrs) emu::check_pointer_arg("cudnn_fake_execute", (int)uid, p);
    emu::enqueue_grid(stream, (const void *)&exec_kernel, "cudnn_fake_execute", one, one, 0, [e]() { run_graph(e); });
    return CUDNN_STATUS_SUCCESS;
}

} // extern "C"
