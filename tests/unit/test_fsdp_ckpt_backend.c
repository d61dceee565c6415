/* test_fsdp_ckpt_backend.c: sharded checkpoints (workers/ckpt/sharded.c) of
 * state that lives in backend memory which is not host memory.
 *
 * The backend is tests/lib/backend_scrambled.h: the CPU backend with every
 * byte of its memory XOR 0x5A, so code that reads or writes the state as if
 * it were host memory (as on a GPU) gets wrong bits. 3 forked ranks (shard
 * degree 3, the units padded) each build the same seeded random full state
 * (weights, both AdamW moments, never zero) twice: on the scrambled backend
 * with shm collectives behind host staging (the GPU ranks' set-up), and on
 * the plain CPU backend with direct shm collectives. Each saves it; then
 *   - the two checkpoints are the same bytes, file by file;
 *   - ckpt_read_full gives back the full random tensors bit for bit;
 *   - a fresh scrambled fsdp_t of the same layout, holding other random
 *     state, loads it: its state read through to_host is the saved one's;
 *   - one process (shard degree 1, the resharding path) loads it on the
 *     scrambled backend: its state equals a plain-CPU fsdp_t given the same
 *     full tensors;
 *   - a save whose moments are not in memory fails naming them.
 * Also: the streaming safetensors writer gives the bytes of st_writer_save
 * for the same tensors fed in random pieces, and the ranged reader reads
 * them back. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/comm_check.h"
#include "workers/backend/backend.h"
#include "tests/lib/backend_scrambled.h"
#include "workers/comm/stage.h"
#include "workers/ckpt/sharded.h"
#include "workers/parallel/fsdp.h"
#include "workers/model/model.h"
#include "workers/ckpt/safetensors.h"
#include "tests/unit/helpers.h"

#define SLOT 4096
#define NR 3
#define STEP 7

typedef struct {
    int fd_scr, fd_cpu;   /* shard-group segments */
    char dir[256];        /* scratch directory */
    int *done;            /* shared: checks passed per rank */
} arg_t;

static llama_config_t tiny_cfg(void) {
    /* block: 3136 + 96 * 40 = 6976 floats, not a multiple of 3: padded chunks */
    llama_config_t c = { .dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8, .ffn_dim = 40,
                         .vocab = 67, .max_seq = 16, .rms_eps = 1e-5f, .rope_theta = 10000.f, .tie_embeddings = false };
    snprintf(c.name, sizeof c.name, "ckpt-tiny");
    return c;
}

static optim_config_t tiny_ocfg(void) {
    return (optim_config_t){ .lr = 1e-3, .min_lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                             .weight_decay = 0.1, .total_steps = 10 };
}

static comm_t *open_shm(const char *name, int fd, int n, int rank) { return cc_open_shm(name, fd, n, rank, SLOT); }

/* A communicator of one rank (its own segment). */
static comm_t *open_solo(const char *name) {
    char err[COMM_ERR_LEN];
    int fd = comm_shm_segment_create(1, SLOT, err, sizeof err);
    if (fd < 0) { fprintf(stderr, "%s: %s\n", name, err); return NULL; }
    comm_t *c = open_shm(name, fd, 1, 0);
    close(fd);
    return c;
}

static comm_t *staged(comm_t *inner, const backend_t *be) {
    char err[COMM_ERR_LEN];
    comm_t *w = NULL;
    if (!inner || comm_stage_wrap(&w, inner, be, err, sizeof err)) {
        fprintf(stderr, "staging: %s\n", inner ? err : "no inner communicator");
        return NULL;
    }
    return w;
}

/* One rank's model and sharded state on be with the full random state. */
typedef struct {
    model_t m;
    fsdp_t f;
} rank_state_t;

static int build(rank_state_t *s, const backend_t *be, comm_t *shard, comm_t *replica, const float *p,
                 const float *mo, const float *v, int64_t step) {
    llama_config_t cfg = tiny_cfg();
    optim_config_t oc = tiny_ocfg();
    char err[512];
    memset(s, 0, sizeof *s);
    if (!shard || !replica) return -1;
    if (model_create_tp(&s->m, &cfg, be, 1, 8, false, 1, 0, NULL, err, sizeof err) ||
        fsdp_create(&s->f, &s->m, p, shard, replica, &oc, err, sizeof err)) {
        fprintf(stderr, "build on %s: %s\n", be->name, err);
        return -1;
    }
    fsdp_set_full_state(&s->f, p, mo, v, step);
    return 0;
}

static void teardown(rank_state_t *s) {
    fsdp_destroy(&s->f);
    model_destroy(&s->m);
}

/* host copy of one of the rank's state arrays (0 master, 1 exp_avg, 2 exp_avg_sq) */
static float *state_host(const fsdp_t *f, int which) {
    const float *src = which == 0 ? f->master : which == 1 ? f->opt.m : f->opt.v;
    float *h = malloc(f->shard_total * sizeof(float));
    f->be->to_host(h, src, f->shard_total * sizeof(float));
    return h;
}

/* How many of the three state arrays differ between a and b (read through
 * to_host, bit for bit); with what, the first difference is printed. */
static int state_diffs(const char *what, const fsdp_t *a, const fsdp_t *b) {
    static const char *names[3] = { "master", "exp_avg", "exp_avg_sq" };
    if (a->shard_total != b->shard_total) {
        if (what) fprintf(stderr, "%s: %zu vs %zu floats\n", what, a->shard_total, b->shard_total);
        return 3;
    }
    int bad = 0;
    for (int k = 0; k < 3; k++) {
        float *x = state_host(a, k), *y = state_host(b, k);
        for (size_t i = 0; i < a->shard_total; i++)
            if (memcmp(&x[i], &y[i], 4)) {
                if (what) fprintf(stderr, "%s: %s[%zu] = %.9g, want %.9g\n", what, names[k], i, y[i], x[i]);
                bad++;
                break;
            }
        free(x);
        free(y);
    }
    return bad;
}

/* 0 when a and b hold the same state bits and step, else -1 with a line */
static int same_state(const char *what, const fsdp_t *a, const fsdp_t *b) {
    if (a->opt.step != b->opt.step) {
        fprintf(stderr, "%s: step %lld, want %lld\n", what, (long long)b->opt.step, (long long)a->opt.step);
        return -1;
    }
    return state_diffs(what, a, b) ? -1 : 0;
}

/* The full random tensors of this test: p, m, v (n floats each) from seed. */
static void fill_state(float *p, float *mo, float *v, size_t n, uint64_t seed) {
    cc_fill(p, n, COMM_F32, seed);
    cc_fill(mo, n, COMM_F32, seed + 1);
    cc_fill(v, n, COMM_F32, seed + 2);
}

static int files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) eq = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

static ckpt_meta_t meta_of(void) {
    ckpt_meta_t meta = { .step = STEP, .cfg = tiny_cfg(), .ocfg = tiny_ocfg(), .B = 1, .T = 8, .accum = 1, .dp = NR };
    snprintf(meta.data, sizeof meta.data, "synthetic");
    return meta;
}

static int rank_main(int rank, int n, void *argp) {
    arg_t *a = argp;
    const backend_t *scr = backend_scrambled(1), *cpu = backend_cpu(1);
    llama_config_t cfg = tiny_cfg();
    size_t np = (size_t)llama_total_params(&cfg);
    float *p = malloc(np * 4), *mo = malloc(np * 4), *v = malloc(np * 4);
    fill_state(p, mo, v, np, 1234);
    char err[4096], ds[512], dc[512], path[1024], path2[1024];
    snprintf(ds, sizeof ds, "%s/scrambled", a->dir);
    snprintf(dc, sizeof dc, "%s/cpu", a->dir);
    ckpt_meta_t meta = meta_of();

    rank_state_t S, C;
    if (build(&S, scr, staged(open_shm("scr", a->fd_scr, n, rank), scr), open_solo("rep-s"), p, mo, v, STEP) ||
        build(&C, cpu, open_shm("cpu", a->fd_cpu, n, rank), open_solo("rep-c"), p, mo, v, STEP))
        return 1;
    if (S.f.S != NR || S.f.shard_total * NR <= np) {
        fprintf(stderr, "rank %d: layout S %d, %zu floats per rank: expected padded chunks of 3\n", rank, S.f.S,
                S.f.shard_total);
        return 1;
    }
    if (ckpt_save(&S.f, ds, &meta, rank, n, err, sizeof err)) { fprintf(stderr, "rank %d: save (scrambled): %s\n", rank, err); return 1; }
    if (ckpt_save(&C.f, dc, &meta, rank, n, err, sizeof err)) { fprintf(stderr, "rank %d: save (cpu): %s\n", rank, err); return 1; }
    /* every file of the step directory: the same bytes from both backends */
    const char *files[] = { "manifest.json", "config.json", "shard-00000-of-00003.safetensors",
                            "shard-00001-of-00003.safetensors", "shard-00002-of-00003.safetensors" };
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/step-%08d/%s", ds, STEP, files[i]);
        snprintf(path2, sizeof path2, "%s/step-%08d/%s", dc, STEP, files[i]);
        if (!files_equal(path, path2)) {
            fprintf(stderr, "rank %d: %s differs between the scrambled and the CPU backend (or is missing)\n", rank,
                    files[i]);
            return 1;
        }
    }
    a->done[rank]++;

    /* the full tensors read back from the files are the random ones */
    snprintf(path, sizeof path, "%s/step-%08d", ds, STEP);
    float *rp = malloc(np * 4), *rm = malloc(np * 4), *rv = malloc(np * 4);
    int64_t step = -1;
    if (ckpt_read_full(path, &S.m, rp, rm, rv, &step, err, sizeof err)) { fprintf(stderr, "read_full: %s\n", err); return 1; }
    if (step != STEP || memcmp(rp, p, np * 4) || memcmp(rm, mo, np * 4) || memcmp(rv, v, np * 4)) {
        fprintf(stderr, "rank %d: the checkpoint's full tensors are not the saved ones (step %lld)\n", rank,
                (long long)step);
        return 1;
    }
    a->done[rank]++;

    /* a fresh rank of the same layout with other state loads it (the same
     * communicators: loading is local) */
    float *p2 = malloc(np * 4), *m2 = malloc(np * 4), *v2 = malloc(np * 4);
    fill_state(p2, m2, v2, np, 999);
    rank_state_t L;
    if (build(&L, scr, S.f.shard, S.f.replica, p2, m2, v2, 0)) return 1;
    if (state_diffs(NULL, &S.f, &L.f) != 3) {
        fprintf(stderr, "rank %d: the fresh state is partly the saved one before loading\n", rank);
        return 1;
    }
    if (ckpt_load(&L.f, path, err, sizeof err)) { fprintf(stderr, "rank %d: load: %s\n", rank, err); return 1; }
    if (same_state("same-layout load", &S.f, &L.f)) return 1;
    a->done[rank]++;
    teardown(&L);

    if (rank == 0) {
        /* one process, shard degree 1: the resharding reader, on the
         * scrambled backend, against the CPU backend given the full tensors */
        rank_state_t R, Ref;
        if (build(&R, scr, staged(open_solo("one-s"), scr), open_solo("one-r"), p2, m2, v2, 0) ||
            build(&Ref, cpu, open_solo("ref-s"), open_solo("ref-r"), p, mo, v, STEP))
            return 1;
        if (ckpt_load(&R.f, path, err, sizeof err)) { fprintf(stderr, "reshard load: %s\n", err); return 1; }
        if (same_state("resharded load (S 3 -> 1)", &Ref.f, &R.f)) return 1;
        a->done[rank]++;

        /* a save with the moments elsewhere (an offload saver that did not
         * bring them back) names them */
        float *keep = R.f.opt.m;
        R.f.opt.m = NULL;
        char d1[600];
        snprintf(d1, sizeof d1, "%s/nomoments", a->dir);
        int rc = ckpt_save(&R.f, d1, &meta, 0, 1, err, sizeof err);
        R.f.opt.m = keep;
        if (rc == 0 || !strstr(err, "exp_avg are not in memory")) {
            fprintf(stderr, "save without moments: rc %d, message: %s\n", rc, err);
            return 1;
        }
        a->done[rank]++;
        comm_t *cs[4] = { R.f.shard, R.f.replica, Ref.f.shard, Ref.f.replica };
        teardown(&R);
        teardown(&Ref);
        for (int k = 0; k < 4; k++) comm_destroy(cs[k]);
    }
    comm_t *cs[4] = { S.f.shard, S.f.replica, C.f.shard, C.f.replica };
    teardown(&S);
    teardown(&C);
    for (int k = 0; k < 4; k++) comm_destroy(cs[k]);
    size_t live_bytes, live = backend_scrambled_live(&live_bytes);
    if (live) {
        fprintf(stderr, "rank %d: %zu scrambled allocations (%zu bytes) left\n", rank, live, live_bytes);
        return 1;
    }
    free(p); free(mo); free(v); free(p2); free(m2); free(v2); free(rp); free(rm); free(rv);
    return 0;
}

Test(fsdp_ckpt_backend, scrambled_backend_saves_and_loads_the_cpu_bits, .timeout = 120) {
    char err[COMM_ERR_LEN];
    arg_t a = { 0 };
    th_tmpdir(a.dir, sizeof a.dir, NULL, "fsdpck");
    a.fd_scr = comm_shm_segment_create(NR, SLOT, err, sizeof err);
    cr_assert_geq(a.fd_scr, 0, "%s", err);
    a.fd_cpu = comm_shm_segment_create(NR, SLOT, err, sizeof err);
    cr_assert_geq(a.fd_cpu, 0, "%s", err);
    a.done = cc_shared(sizeof(int) * NR);
    int failed = cc_run_ranks(NR, rank_main, &a, 90, NULL);
    close(a.fd_scr);
    close(a.fd_cpu);
    th_tmpdir_remove(a.dir);
    cr_assert_eq(failed, 0, "%d of %d ranks failed (messages above)", failed, NR);
    for (int r = 0; r < NR; r++)
        cr_expect_eq(a.done[r], r == 0 ? 5 : 3, "rank %d passed %d checks", r, a.done[r]);
}

/* The streaming writer: the bytes of st_writer_save for the same tensors
 * (fp32, bf16, f16, a 2-D one and an empty one), fed in random pieces that
 * cross tensor boundaries; st_read_f32_range reads parts back. */
Test(fsdp_ckpt_backend, streaming_writer_matches_st_writer_save) {
    const int nt = 5;
    int64_t shapes[5][2] = { { 1000, 1 }, { 37, 3 }, { 0, 1 }, { 4097, 1 }, { 5, 1 } };
    int ndim[5] = { 1, 2, 1, 1, 1 };
    st_dtype_t dt[5] = { ST_F32, ST_F32, ST_F32, ST_BF16, ST_F16 };
    size_t total = 0, cnt[5];
    for (int i = 0; i < nt; i++) total += (cnt[i] = (size_t)(shapes[i][0] * shapes[i][1]));
    float *data = malloc(total * sizeof(float));
    cc_fill(data, total, COMM_F32, 77);
    char a[256], b[256], err[512], name[16];
    snprintf(a, sizeof a, "/tmp/ballast-stw-%d-a.safetensors", (int)getpid());
    snprintf(b, sizeof b, "/tmp/ballast-stw-%d-b.safetensors", (int)getpid());
    st_writer_t *w1 = st_writer_new(), *w2 = st_writer_new();
    size_t off = 0;
    for (int i = 0; i < nt; i++) {
        snprintf(name, sizeof name, "t%d", i);
        cr_assert_eq(st_writer_add_f32(w1, name, dt[i], shapes[i], ndim[i], data + off), 0);
        cr_assert_eq(st_writer_declare(w2, name, dt[i], shapes[i], ndim[i]), 0);
        off += cnt[i];
    }
    cr_expect_neq(st_writer_add_f32(w2, "x", ST_F32, shapes[0], 1, data), 0, "mixing add and declare is refused");
    st_writer_set_metadata(w1, "k", "v");
    st_writer_set_metadata(w2, "k", "v");
    cr_assert_eq(st_writer_save(w1, a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st_writer_begin(w2, b, err, sizeof err), 0, "%s", err);
    uint64_t r = 5;
    for (off = 0; off < total;) {
        r = cc_mix(r);
        size_t k = 1 + r % 1500;
        if (k > total - off) k = total - off;
        cr_assert_eq(st_writer_append_f32(w2, data + off, k, err, sizeof err), 0, "%s", err);
        off += k;
    }
    cr_expect_neq(st_writer_append_f32(w2, data, 1, err, sizeof err), 0, "an element past the end is refused");
    cr_assert_eq(st_writer_finish(w2, err, sizeof err), 0, "%s", err);
    st_writer_free(w1);
    st_writer_free(w2);
    cr_expect(files_equal(a, b), "streamed file differs from st_writer_save's");

    st_t *st = NULL;
    cr_assert_eq(st_open(b, &st, err, sizeof err), 0, "%s", err);
    float got[300];
    cr_assert_eq(st_read_f32_range(st, "t0", 700, 300, got, err, sizeof err), 0, "%s", err);
    cr_expect_eq(memcmp(got, data + 700, sizeof got), 0, "t0 elements 700..999");
    cr_assert_eq(st_read_f32_range(st, "t1", 100, 11, got, err, sizeof err), 0, "%s", err);
    cr_expect_eq(memcmp(got, data + 1000 + 100, 11 * sizeof(float)), 0, "t1 (2-D) flat elements 100..110");
    cr_assert_eq(st_read_f32_range(st, "t3", 4000, 97, got, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < 97; i++) {
        float want = bf16_to_f32(f32_to_bf16(data[1000 + 111 + 4000 + i]));
        cr_expect(memcmp(&got[i], &want, 4) == 0, "t3 (bf16) element %d: %g vs %g", 4000 + i, got[i], want);
    }
    cr_expect_neq(st_read_f32_range(st, "t0", 900, 101, got, err, sizeof err), 0, "a range past the end is refused");
    cr_expect(strstr(err, "t0") != NULL, "message names the tensor: %s", err);
    st_close(st);

    /* an incomplete stream is refused and leaves no file */
    st_writer_t *w3 = st_writer_new();
    cr_assert_eq(st_writer_declare(w3, "t", ST_F32, shapes[0], 1), 0);
    cr_assert_eq(st_writer_begin(w3, a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st_writer_append_f32(w3, data, 999, err, sizeof err), 0, "%s", err);
    cr_expect_neq(st_writer_finish(w3, err, sizeof err), 0, "999 of 1000 elements: refused");
    cr_expect(strstr(err, "incomplete") != NULL, "message: %s", err);
    st_writer_free(w3);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", a);
    cr_expect_neq(access(tmp, F_OK), 0, "no %s left", tmp);
    unlink(a);
    unlink(b);
    free(data);
}
