/* fuzz_ckpt_manifest.c: a checkpoint's manifest.json (workers/ckpt/ckpt.c).
 * A step directory of a small model (config.json and one real shard file,
 * written once per process) gets the input as its manifest; then the
 * readers resume and `ballast ckpt info` use run on it: ckpt_read_meta,
 * ckpt_read_layout, ckpt_verify and, when that passes, ckpt_read_full.
 * A refusal must say why; nothing may read outside the directory's files.
 * BALLAST_FUZZ_WRITE_SEED=DIR writes the real manifest to DIR/valid.json. */
#include <assert.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz_util.h"
#include "workers/ckpt/ckpt.h"

static model_t model;
static char step_dir[512];
static float *bufs[3];

static const char *const SUFFIX[3] = { "", ".exp_avg", ".exp_avg_sq" };

/* The directory: config.json, shard-00000-of-00001.safetensors and a
 * manifest of layout (1, 1, 1) describing it, written by the real writers. */
static void setup(void) {
    llama_config_t cfg = { .name = "fuzz", .dim = 8, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4,
                           .ffn_dim = 8, .vocab = 8, .max_seq = 16, .rms_eps = 1e-5f, .rope_theta = 10000.f };
    char err[1024], p[768];
    if (model_layout(&model, &cfg, err, sizeof err)) { fprintf(stderr, "%s\n", err); abort(); }
    snprintf(step_dir, sizeof step_dir, "%s/step-00000002", fuzz_dir("ckpt"));
    if (ckpt_mkdirs(step_dir, err, sizeof err)) { fprintf(stderr, "%s\n", err); abort(); }
    for (int s = 0; s < 3; s++) bufs[s] = calloc(model.n_params, sizeof(float));
    st_writer_t *w = st_writer_new();
    ckpt_part_t *parts = calloc((size_t)model.n_tensors, sizeof *parts);
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < model.n_tensors; i++) {
            const model_tensor_t *t = &model.tensors[i];
            char nm[MODEL_NAME_LEN + 16];
            snprintf(nm, sizeof nm, "%s%s", t->name, SUFFIX[s]);
            int64_t n = (int64_t)t->numel;
            float *v = calloc(t->numel, sizeof *v);
            for (size_t k = 0; k < t->numel; k++) v[k] = (float)(k % 7) * 0.125f + (float)s;
            st_writer_add_f32(w, nm, ST_F32, &n, 1, v);
            free(v);
            if (s == 0)
                parts[i] = (ckpt_part_t){ .full = t, .local_shape = { t->shape[0], t->ndim == 2 ? t->shape[1] : 1 },
                                          .tp_rank = 0, .tp_size = 1, .start = 0, .end = t->numel };
        }
    st_writer_set_metadata(w, "format", "ballast-checkpoint-shard");
    st_writer_set_metadata(w, "step", "2");
    st_writer_set_metadata(w, "shard", "0");
    st_writer_set_metadata(w, "tp_rank", "0");
    snprintf(p, sizeof p, "%s/" CKPT_SHARD_FMT, step_dir, 0, 1);
    if (st_writer_save(w, p, err, sizeof err)) { fprintf(stderr, "%s\n", err); abort(); }
    st_writer_free(w);
    ckpt_shard_t sh = { .shard = 0, .tp_rank = 0, .rank = 0, .parts = parts, .n_parts = model.n_tensors };
    ckpt_file_crc32(p, &sh.crc32, &sh.bytes);
    ckpt_meta_t meta = { .step = 2, .cfg = cfg, .ocfg = { .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8 },
                         .data = "corpus.bin", .B = 2, .T = 16, .accum = 1, .dp = 1 };
    if (ckpt_write_manifest(step_dir, &meta, 1, 1, 1, &sh, 1, err, sizeof err)) { fprintf(stderr, "%s\n", err); abort(); }
    free(parts);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    setup();
    const char *seed = getenv("BALLAST_FUZZ_WRITE_SEED");
    if (seed) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "cp '%s/manifest.json' '%s/valid.json'", step_dir, seed);
        exit(system(cmd) == 0 ? 0 : 1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char p[768], err[1024];
    snprintf(p, sizeof p, "%s/manifest.json", step_dir);
    if (fuzz_write_file(p, data, size)) return 0;
    ckpt_meta_t meta;
    ckpt_layout_t lay;
    err[0] = 0;
    (void)ckpt_read_meta(step_dir, &meta, err, sizeof err);
    (void)ckpt_read_layout(step_dir, &lay, err, sizeof err);
    err[0] = 0;
    if (ckpt_verify(step_dir, &model, err, sizeof err) == 0) {
        int64_t step = 0;
        (void)ckpt_read_full(step_dir, &model, bufs[0], bufs[1], bufs[2], &step, err, sizeof err);
    } else {
        assert(err[0]);
    }
    return 0;
}
