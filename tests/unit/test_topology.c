/* test_topology.c: rank/world resolution from flags, torchrun, Kubeflow
 * PyTorchJob and Indexed Job variables; precedence between them; and a
 * message naming the culprit for each bad value. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topology.h"
#include "tests/unit/helpers.h"

static const char *all_vars[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR", "PET_MASTER_PORT",
    "JOB_COMPLETION_INDEX",
};

/* The runner may itself live in a job that sets these: start clean. */
static void clear_env(void) {
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++) unsetenv(all_vars[i]);
}

TestSuite(topology, .init = clear_env);

static topo_t resolve_ok(const topo_flags_t *fl) {
    topo_t t;
    char err[TOPO_ERR_LEN];
    int rc = topo_resolve(fl, &t, err, sizeof err);
    cr_assert_eq(rc, 0, "resolve failed: %s", err);
    return t;
}

static void expect(const topo_t *t, int rank, int local, int world, int lws, int node, int nn) {
    cr_assert_eq(t->rank, rank, "rank %d, want %d", t->rank, rank);
    cr_assert_eq(t->local_rank, local, "local_rank %d, want %d", t->local_rank, local);
    cr_assert_eq(t->world_size, world, "world_size %d, want %d", t->world_size, world);
    cr_assert_eq(t->local_world_size, lws, "local_world_size %d, want %d", t->local_world_size, lws);
    cr_assert_eq(t->node_rank, node, "node_rank %d, want %d", t->node_rank, node);
    cr_assert_eq(t->nnodes, nn, "nnodes %d, want %d", t->nnodes, nn);
}

static void setint(const char *name, int v) {
    char b[24];
    snprintf(b, sizeof b, "%d", v);
    setenv(name, b, 1);
}

static uint64_t rng = 0x243F6A8885A308D3ULL;
static int rnd(int n) { return (int)((th_xorshift64s(&rng) >> 33) % (uint64_t)n); } /* 0..n-1 */

/* ---- each source alone ---- */

Test(topology, defaults_are_one_local_process) {
    topo_t t = resolve_ok(NULL);
    expect(&t, 0, 0, 1, 1, 0, 1);
    cr_assert_str_eq(t.master_addr, "127.0.0.1");
    cr_assert_eq(t.master_port, 29500);
    for (int f = 0; f < TOPO_NFIELDS; f++)
        cr_assert_str_eq(t.origin[f], "default", "%s from %s", topo_field_name(f), t.origin[f]);
}

Test(topology, torchrun_variables_alone) {
    for (int i = 0; i < 200; i++) {
        clear_env();
        int nn = 1 + rnd(16), lws = 1 + rnd(8), node = rnd(nn), local = rnd(lws);
        setint("RANK", node * lws + local);
        setint("LOCAL_RANK", local);
        setint("WORLD_SIZE", nn * lws);
        setint("LOCAL_WORLD_SIZE", lws);
        setenv("MASTER_ADDR", "10.1.2.3", 1);
        setint("MASTER_PORT", 20000 + i);
        topo_t t = resolve_ok(NULL);
        expect(&t, node * lws + local, local, nn * lws, lws, node, nn);
        cr_assert_str_eq(t.master_addr, "10.1.2.3");
        cr_assert_eq(t.master_port, 20000 + i);
        cr_assert_str_eq(t.origin[TOPO_RANK], "RANK");
        cr_assert_str_eq(t.origin[TOPO_MASTER_PORT], "MASTER_PORT");
        cr_assert_str_eq(t.origin[TOPO_NODE_RANK], "RANK / LOCAL_WORLD_SIZE");
    }
}

Test(topology, torchrun_rank_and_world_only_means_one_node) {
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "5", 1);
    topo_t t = resolve_ok(NULL);
    expect(&t, 3, 3, 5, 5, 0, 1);
}

Test(topology, pytorchjob_variables_alone) {
    for (int i = 0; i < 200; i++) {
        clear_env();
        int nn = 1 + rnd(16), lws = 1 + rnd(8), node = rnd(nn), local = rnd(lws);
        setint("PET_NNODES", nn);
        setint("PET_NODE_RANK", node);
        setint("PET_NPROC_PER_NODE", lws);
        if (lws > 1 || rnd(2)) setint("LOCAL_RANK", local); /* one process per pod needs none */
        setenv("PET_MASTER_ADDR", "myjob-master-0", 1);
        setenv("PET_MASTER_PORT", "23456", 1);
        topo_t t = resolve_ok(NULL);
        expect(&t, node * lws + local, local, nn * lws, lws, node, nn);
        cr_assert_str_eq(t.master_addr, "myjob-master-0");
        cr_assert_eq(t.master_port, 23456);
        cr_assert_str_eq(t.origin[TOPO_WORLD_SIZE], "PET_NNODES x PET_NPROC_PER_NODE");
        cr_assert_str_eq(t.origin[TOPO_NODE_RANK], "PET_NODE_RANK");
    }
}

Test(topology, pytorchjob_needs_local_rank_for_several_processes_per_node) {
    setenv("PET_NNODES", "2", 1);
    setenv("PET_NODE_RANK", "1", 1);
    setenv("PET_NPROC_PER_NODE", "4", 1);
    topo_t t;
    char err[TOPO_ERR_LEN];
    cr_assert_eq(topo_resolve(NULL, &t, err, sizeof err), -1);
    cr_assert(strstr(err, "rank is unknown") && strstr(err, "LOCAL_RANK"), "%s", err);
}

Test(topology, indexed_job_index_is_the_node_rank) {
    setenv("JOB_COMPLETION_INDEX", "3", 1);
    setenv("PET_NNODES", "5", 1);
    topo_t t = resolve_ok(NULL);
    expect(&t, 3, 0, 5, 1, 3, 5);
    cr_assert_str_eq(t.origin[TOPO_NODE_RANK], "JOB_COMPLETION_INDEX");

    clear_env(); /* with torchrun-style sizes and several processes per node */
    setenv("JOB_COMPLETION_INDEX", "2", 1);
    setenv("WORLD_SIZE", "12", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "1", 1);
    t = resolve_ok(NULL);
    expect(&t, 9, 1, 12, 4, 2, 3);

    clear_env(); /* an Indexed Job of one pod: index 0, nothing else */
    setenv("JOB_COMPLETION_INDEX", "0", 1);
    t = resolve_ok(NULL);
    expect(&t, 0, 0, 1, 1, 0, 1);
}

Test(topology, flags_alone) {
    topo_flags_t fl;
    topo_flags_init(&fl);
    fl.rank = 13; fl.local_rank = 5; fl.world_size = 16; fl.local_world_size = 8;
    fl.master_addr = "trainer-0.example.com"; fl.master_port = 4242;
    topo_t t = resolve_ok(&fl);
    expect(&t, 13, 5, 16, 8, 1, 2);
    cr_assert_str_eq(t.master_addr, "trainer-0.example.com");
    cr_assert_eq(t.master_port, 4242);
    cr_assert_str_eq(t.origin[TOPO_RANK], "--rank");
    cr_assert_str_eq(t.origin[TOPO_MASTER_ADDR], "--master-addr");

    topo_flags_init(&fl); /* node form */
    fl.nnodes = 3; fl.node_rank = 2; fl.local_world_size = 2; fl.local_rank = 1;
    t = resolve_ok(&fl);
    expect(&t, 5, 1, 6, 2, 2, 3);
}

/* ---- precedence ---- */

Test(topology, flags_override_the_environment) {
    setenv("RANK", "5", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("MASTER_ADDR", "10.0.0.1", 1);
    setenv("MASTER_PORT", "1111", 1);
    topo_flags_t fl;
    topo_flags_init(&fl);
    fl.rank = 6; fl.local_rank = 2; fl.master_addr = "10.0.0.2"; fl.master_port = 2222;
    topo_t t = resolve_ok(&fl);
    expect(&t, 6, 2, 8, 4, 1, 2);
    cr_assert_str_eq(t.master_addr, "10.0.0.2");
    cr_assert_eq(t.master_port, 2222);
    cr_assert_str_eq(t.origin[TOPO_RANK], "--rank");
    cr_assert_str_eq(t.origin[TOPO_WORLD_SIZE], "WORLD_SIZE");

    /* a flag also settles two variables that disagree */
    clear_env();
    setenv("PET_NODE_RANK", "1", 1);
    setenv("JOB_COMPLETION_INDEX", "2", 1);
    setenv("PET_NNODES", "4", 1);
    topo_flags_init(&fl);
    fl.node_rank = 3;
    t = resolve_ok(&fl);
    expect(&t, 3, 0, 4, 1, 3, 4);
}

Test(topology, torchrun_over_pytorchjob_over_indexed_job) {
    /* consistent sources: the higher one is named as the origin */
    setenv("RANK", "6", 1);
    setenv("LOCAL_RANK", "2", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("PET_NNODES", "2", 1);
    setenv("PET_NODE_RANK", "1", 1);
    setenv("PET_NPROC_PER_NODE", "4", 1);
    setenv("JOB_COMPLETION_INDEX", "1", 1);
    /* the launcher's rendezvous address beats the job's */
    setenv("MASTER_ADDR", "10.9.8.7", 1);
    setenv("MASTER_PORT", "41000", 1);
    setenv("PET_MASTER_ADDR", "job-master-0", 1);
    setenv("PET_MASTER_PORT", "23456", 1);
    topo_t t = resolve_ok(NULL);
    expect(&t, 6, 2, 8, 4, 1, 2);
    cr_assert_str_eq(t.origin[TOPO_LOCAL_WORLD_SIZE], "LOCAL_WORLD_SIZE");
    cr_assert_str_eq(t.origin[TOPO_NODE_RANK], "PET_NODE_RANK");
    cr_assert_str_eq(t.master_addr, "10.9.8.7");
    cr_assert_eq(t.master_port, 41000);
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    t = resolve_ok(NULL);
    cr_assert_str_eq(t.master_addr, "job-master-0");
    cr_assert_eq(t.master_port, 23456);
    cr_assert_str_eq(t.origin[TOPO_MASTER_ADDR], "PET_MASTER_ADDR");
}

/* ---- bad values: each fails with a message naming it ---- */

typedef struct {
    const char *env[6][2];   /* name, value */
    int flag_rank, flag_world; /* TOPO_UNSET = not given */
    const char *needles[4];  /* all must appear in the message */
} bad_t;

#define U TOPO_UNSET
static const bad_t bads[] = {
    { { { "RANK", "abc" }, { "WORLD_SIZE", "4" } }, U, U, { "RANK=abc", "not a whole number" } },
    { { { "RANK", "1x" }, { "WORLD_SIZE", "4" } }, U, U, { "RANK=1x", "not a whole number" } },
    { { { "RANK", "" } }, U, U, { "RANK", "empty" } },
    { { { "RANK", "-1" }, { "WORLD_SIZE", "4" } }, U, U, { "RANK=-1", "negative" } },
    { { { "LOCAL_RANK", "-2" } }, U, U, { "LOCAL_RANK=-2", "negative" } },
    { { { "WORLD_SIZE", "0" } }, U, U, { "WORLD_SIZE=0", "at least 1" } },
    { { { "WORLD_SIZE", "99999999999" } }, U, U, { "WORLD_SIZE=99999999999", "too large" } },
    { { { "RANK", "4" }, { "WORLD_SIZE", "4" } }, U, U, { "RANK=4", "WORLD_SIZE=4", "less than" } },
    { { { "RANK", "7" }, { "WORLD_SIZE", "8" }, { "LOCAL_RANK", "4" }, { "LOCAL_WORLD_SIZE", "4" } }, U, U,
      { "LOCAL_RANK=4", "LOCAL_WORLD_SIZE=4", "less than" } },
    { { { "RANK", "1" }, { "WORLD_SIZE", "6" }, { "LOCAL_WORLD_SIZE", "4" } }, U, U,
      { "WORLD_SIZE=6", "LOCAL_WORLD_SIZE=4", "multiple" } },
    { { { "PET_NNODES", "1:4" }, { "PET_NODE_RANK", "0" }, { "PET_NPROC_PER_NODE", "1" } }, U, U,
      { "PET_NNODES=1:4", "elastic", "fixed" } },
    { { { "PET_NPROC_PER_NODE", "auto" }, { "PET_NNODES", "2" } }, U, U, { "PET_NPROC_PER_NODE=auto", "number" } },
    { { { "PET_NODE_RANK", "x1" }, { "PET_NNODES", "2" } }, U, U, { "PET_NODE_RANK=x1", "not a whole number" } },
    { { { "JOB_COMPLETION_INDEX", "-3" } }, U, U, { "JOB_COMPLETION_INDEX=-3", "negative" } },
    { { { "RANK", "5" }, { "LOCAL_RANK", "2" }, { "PET_NNODES", "2" }, { "PET_NODE_RANK", "1" }, { "PET_NPROC_PER_NODE", "4" } },
      U, U, { "RANK=5", "PET_NODE_RANK=1", "PET_NPROC_PER_NODE=4", "LOCAL_RANK=2" } },
    { { { "RANK", "0" }, { "WORLD_SIZE", "8" }, { "PET_NNODES", "3" }, { "PET_NPROC_PER_NODE", "2" } }, U, U,
      { "WORLD_SIZE=8", "PET_NNODES=3", "PET_NPROC_PER_NODE=2", "disagrees" } },
    { { { "LOCAL_WORLD_SIZE", "4" }, { "PET_NPROC_PER_NODE", "8" } }, U, U,
      { "LOCAL_WORLD_SIZE=4", "PET_NPROC_PER_NODE=8", "disagrees" } },
    { { { "PET_NODE_RANK", "1" }, { "JOB_COMPLETION_INDEX", "2" }, { "PET_NNODES", "4" } }, U, U,
      { "PET_NODE_RANK=1", "JOB_COMPLETION_INDEX=2", "disagrees" } },
    { { { "JOB_COMPLETION_INDEX", "2" } }, U, U, { "JOB_COMPLETION_INDEX=2", "nnodes", "PET_NNODES" } },
    { { { "RANK", "3" } }, U, U, { "RANK=3", "world size", "WORLD_SIZE" } },
    { { { "WORLD_SIZE", "4" } }, U, U, { "WORLD_SIZE=4", "rank is unknown", "RANK" } },
    { { { "MASTER_PORT", "70000" } }, U, U, { "MASTER_PORT=70000", "1..65535" } },
    { { { "MASTER_PORT", "0" } }, U, U, { "MASTER_PORT=0", "1..65535" } },
    { { { "PET_MASTER_PORT", "http" } }, U, U, { "PET_MASTER_PORT=http", "not a whole number" } },
    { { { "MASTER_ADDR", "http://10.0.0.1:80" } }, U, U, { "MASTER_ADDR", "http://10.0.0.1:80", "host name" } },
    { { { "PET_MASTER_ADDR", "" } }, U, U, { "PET_MASTER_ADDR", "empty" } },
    { { { "WORLD_SIZE", "8" } }, 9, U, { "--rank=9", "WORLD_SIZE=8", "less than" } },
    { { { "RANK", "1" } }, -5, U, { "--rank=-5", "negative" } },
    { { { "RANK", "0" } }, U, 0, { "--world-size=0", "at least 1" } },
};
#undef U

Test(topology, each_bad_value_is_named) {
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        const bad_t *b = &bads[i];
        clear_env();
        char what[256] = "";
        for (int k = 0; k < 6 && b->env[k][0]; k++) {
            setenv(b->env[k][0], b->env[k][1], 1);
            size_t n = strlen(what);
            snprintf(what + n, sizeof what - n, "%s=%s ", b->env[k][0], b->env[k][1]);
        }
        topo_flags_t fl;
        topo_flags_init(&fl);
        fl.rank = b->flag_rank;
        fl.world_size = b->flag_world;
        topo_t t;
        char err[TOPO_ERR_LEN] = "";
        int rc = topo_resolve(&fl, &t, err, sizeof err);
        cr_assert_eq(rc, -1, "case %zu (%s flags rank %d world %d) was accepted: rank %d of %d", i, what,
                     b->flag_rank, b->flag_world, t.rank, t.world_size);
        for (int k = 0; k < 4 && b->needles[k]; k++)
            cr_assert(strstr(err, b->needles[k]), "case %zu (%s): message lacks \"%s\": %s", i, what,
                      b->needles[k], err);
    }
}

Test(topology, describe_names_every_origin) {
    setenv("PET_NNODES", "2", 1);
    setenv("PET_NODE_RANK", "1", 1);
    setenv("PET_NPROC_PER_NODE", "4", 1);
    setenv("LOCAL_RANK", "3", 1);
    setenv("MASTER_PORT", "29999", 1);
    topo_t t = resolve_ok(NULL);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    topo_describe(&t, f);
    fclose(f);
    cr_assert(strstr(buf, "PET_NODE_RANK x PET_NPROC_PER_NODE + LOCAL_RANK"), "%s", buf);
    cr_assert(strstr(buf, "PET_NNODES x PET_NPROC_PER_NODE"), "%s", buf);
    cr_assert(strstr(buf, "29999"), "%s", buf);
    cr_assert(strstr(buf, "MASTER_PORT"), "%s", buf);
    cr_assert(strstr(buf, "127.0.0.1"), "%s", buf);
    int lines = 0;
    for (char *p = buf; *p; p++) lines += *p == '\n';
    cr_assert_eq(lines, TOPO_NFIELDS);
    for (int i = 0; i < TOPO_NFIELDS; i++)
        cr_assert(strstr(buf, topo_field_name(i)), "missing %s in\n%s", topo_field_name(i), buf);
    cr_assert_eq(t.rank, 7);
    free(buf);
}
