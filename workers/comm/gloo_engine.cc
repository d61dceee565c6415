/* gloo_engine.cc: the Gloo adapter behind gloo_engine.h. Relies on Debian's
 * libgloo (TCP transport, the new-style collective API: allreduce,
 * allgather, broadcast, barrier) and on our rendezvous client, which it
 * wraps as a gloo::rendezvous::Store so that Gloo's full-mesh connection
 * set-up publishes and finds addresses in our store.
 *
 * The only C++ in workers/: everything here is a thin translation, and no
 * exception crosses the extern "C" boundary. */
#include "workers/comm/gloo_engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

/* ---- the store: our rendezvous client as gloo::rendezvous::Store ---- */

namespace {

/* A store failure, with our message (Gloo rethrows nothing of its own). */
struct store_error : std::runtime_error {
    int rc;
    store_error(int r, const std::string &m) : std::runtime_error(m), rc(r) {}
};

class rdzv_store : public gloo::rendezvous::Store {
  public:
    rdzv_store(const gloo_engine_opts_t *o) : o_(o), prefix_(o->prefix) {}

    void set(const std::string &key, const std::vector<char> &data) override {
        char err[RDZV_ERR_LEN];
        std::string k = prefix_ + key;
        int rc = rdzv_set(o_->rdzv, k.c_str(), data.data(), data.size(), true, o_->setup_timeout_s, err, sizeof err);
        if (rc) throw store_error(rc, std::string("publishing ") + k + ": " + err);
    }

    std::vector<char> get(const std::string &key) override {
        char err[RDZV_ERR_LEN];
        std::string k = prefix_ + key;
        void *v = NULL;
        size_t len = 0;
        int rc = rdzv_wait(o_->rdzv, k.c_str(), &v, &len, o_->setup_timeout_s, err, sizeof err);
        if (rc) throw store_error(rc, missing(key, rc, err));
        std::vector<char> out((char *)v, (char *)v + len);
        free(v);
        return out;
    }

    void wait(const std::vector<std::string> &keys) override {
        wait(keys, std::chrono::milliseconds((long long)(o_->setup_timeout_s * 1000)));
    }

    void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) override {
        auto end = std::chrono::steady_clock::now() + timeout;
        for (const std::string &key : keys) {
            double left = std::chrono::duration<double>(end - std::chrono::steady_clock::now()).count();
            if (left < 0.001) left = 0.001;
            char err[RDZV_ERR_LEN];
            void *v = NULL;
            size_t len = 0;
            std::string k = prefix_ + key;
            int rc = rdzv_wait(o_->rdzv, k.c_str(), &v, &len, left, err, sizeof err);
            free(v);
            if (rc) throw store_error(rc, missing(key, rc, err));
        }
    }

  private:
    /* Gloo's full-mesh keys are the peer's index ("<i>"; "rank_<i>" in
     * other versions): name the peer behind a missing one. */
    std::string missing(const std::string &key, int rc, const char *err) {
        int i = -1;
        char msg[COMM_MSG], tail = 0;
        const char *k = key.c_str();
        if (!strncmp(k, "rank_", 5)) k += 5;
        if (sscanf(k, "%d%c", &i, &tail) == 1 && i >= 0 && i < o_->n && rc == -ETIMEDOUT) {
            snprintf(msg, sizeof msg, "rank %d (index %d of group %s) did not publish its Gloo address within "
                     "%.1f s (--rdzv-timeout): is it running, and does it reach the rendezvous store?",
                     o_->ranks ? o_->ranks[i] : i, i, o_->name, o_->setup_timeout_s);
            return msg;
        }
        return std::string("waiting for ") + prefix_ + key + ": " + err;
    }
    static const int COMM_MSG = 512;
    const gloo_engine_opts_t *o_;
    std::string prefix_;
};

} // namespace

/* ---- the engine ---- */

struct gloo_engine {
    std::shared_ptr<gloo::transport::Device> dev;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    std::chrono::milliseconds timeout;
    std::string name;
};

/* Map an exception to -errno and a message. */
static int report(const char *name, const char *what, const std::exception &e, char *err, size_t errlen) {
    int rc = -EIO;
    std::string m = e.what();
    if (const store_error *s = dynamic_cast<const store_error *>(&e)) rc = s->rc;
    else if (dynamic_cast<const gloo::IoException *>(&e)) {
        rc = m.find("imeout") != std::string::npos || m.find("imed out") != std::string::npos ? -ETIMEDOUT : -EPIPE;
    }
    /* Gloo prefixes its messages with a source location in brackets */
    const char *msg = m.c_str();
    if (msg[0] == '[') {
        const char *close = strchr(msg, ']');
        if (close && close[1] == ' ') msg = close + 2;
    }
    snprintf(err, errlen, "comm %s: %s (gloo): %s", name, what, msg);
    return rc;
}

extern "C" int gloo_engine_open(gloo_engine_t **out, const gloo_engine_opts_t *o, char *err, size_t errlen) {
    *out = NULL;
    gloo_engine_t *g = new (std::nothrow) gloo_engine_t;
    if (!g) {
        snprintf(err, errlen, "comm %s: out of memory", o->name);
        return -ENOMEM;
    }
    g->name = o->name;
    g->timeout = std::chrono::milliseconds((long long)(o->timeout_s * 1000));
    try {
        gloo::transport::tcp::attr attr;
        if (o->iface && o->iface[0]) attr.iface = o->iface;
        else if (o->hostname && o->hostname[0]) attr.hostname = o->hostname;
        g->dev = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception &e) {
        int rc = report(o->name, o->iface && o->iface[0] ? "opening the network interface" : "listening", e, err, errlen);
        size_t l = strlen(err);
        snprintf(err + l, errlen - l, " (address %s: set GLOO_SOCKET_IFNAME to the interface that reaches the "
                 "other hosts)", o->iface && o->iface[0] ? o->iface : o->hostname ? o->hostname : "?");
        delete g;
        return rc;
    }
    try {
        g->ctx = std::make_shared<gloo::rendezvous::Context>(o->index, o->n);
        g->ctx->setTimeout(std::chrono::milliseconds((long long)(o->setup_timeout_s * 1000)));
        rdzv_store store(o);
        g->ctx->connectFullMesh(store, g->dev);
        g->ctx->setTimeout(g->timeout);
    } catch (const std::exception &e) {
        int rc = report(o->name, "connecting to the group", e, err, errlen);
        delete g;
        return rc;
    }
    *out = g;
    return 0;
}

extern "C" void gloo_engine_close(gloo_engine_t *g) {
    if (!g) return;
    try {
        g->ctx.reset();
        g->dev.reset();
    } catch (...) {
    }
    delete g;
}

static void sum_f32(void *c, const void *a, const void *b, size_t n) {
    float *o = (float *)c;
    const float *x = (const float *)a, *y = (const float *)b;
    for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];
}

extern "C" int gloo_engine_all_reduce_f32(gloo_engine_t *g, float *buf, size_t count, uint32_t tag,
                                          char *err, size_t errlen) {
    try {
        gloo::AllreduceOptions opts(g->ctx);
        opts.setOutput(buf, count);
        opts.setReduceFunction(sum_f32);
        opts.setTag(tag);
        opts.setTimeout(g->timeout);
        gloo::allreduce(opts);
    } catch (const std::exception &e) {
        return report(g->name.c_str(), "all_reduce", e, err, errlen);
    }
    return 0;
}

extern "C" int gloo_engine_all_gather(gloo_engine_t *g, const void *in, void *out, size_t bytes, uint32_t tag,
                                      char *err, size_t errlen) {
    try {
        gloo::AllgatherOptions opts(g->ctx);
        opts.setInput((uint8_t *)in, bytes);
        opts.setOutput((uint8_t *)out, bytes * (size_t)g->ctx->size);
        opts.setTag(tag);
        opts.setTimeout(g->timeout);
        gloo::allgather(opts);
    } catch (const std::exception &e) {
        return report(g->name.c_str(), "all_gather", e, err, errlen);
    }
    return 0;
}

extern "C" int gloo_engine_broadcast(gloo_engine_t *g, void *buf, size_t bytes, int root, uint32_t tag,
                                     char *err, size_t errlen) {
    try {
        gloo::BroadcastOptions opts(g->ctx);
        opts.setOutput((uint8_t *)buf, bytes);
        opts.setRoot(root);
        opts.setTag(tag);
        opts.setTimeout(g->timeout);
        gloo::broadcast(opts);
    } catch (const std::exception &e) {
        return report(g->name.c_str(), "broadcast", e, err, errlen);
    }
    return 0;
}

extern "C" int gloo_engine_barrier(gloo_engine_t *g, uint32_t tag, char *err, size_t errlen) {
    try {
        gloo::BarrierOptions opts(g->ctx);
        opts.setTag(tag);
        opts.setTimeout(g->timeout);
        gloo::barrier(opts);
    } catch (const std::exception &e) {
        return report(g->name.c_str(), "barrier", e, err, errlen);
    }
    return 0;
}
