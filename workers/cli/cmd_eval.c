/* cmd_eval.c: `ballast eval --from CKPT_OR_HF_DIR --data SHARDS`: the mean
 * token cross-entropy and perplexity of a model on token shards, forward
 * only on the fp32 CPU backend. The windows are those of the sequential
 * data order (docs/data.md): batch j, row b starts at token (j*B + b)*T and
 * reads T + 1 tokens, so K batches cover K*B*T tokens without wrapping. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "workers/backend/backend.h"
#include "workers/cli/cli.h"
#include "workers/cli/weights.h"
#include "workers/data/data.h"
#include "workers/model/model.h"

static const char USAGE[] =
    "usage: ballast eval --from CKPT_OR_HF_DIR --data FILE|GLOB [--seq-len T] [--micro-batch B] [--batches K] [--threads N]";

int cmd_eval(int argc, char **argv) {
    const char *from = NULL, *data = NULL;
    int64_t T = 0, B = 0, K = 0, threads = 0;
    bool json = false;
    const opt_t opts[] = {
        { "from", OPT_STRING, NULL, 0, 0, NULL, "checkpoint step directory, --ckpt-dir (newest step) or Hugging Face model directory", &from },
        { "data", OPT_STRING, NULL, 0, 0, NULL, "token shard file or glob (llm.c format) to evaluate on", &data },
        { "seq-len", OPT_INT, "0", 0, 1 << 24, NULL, "T: tokens per row (0: the checkpoint's seq-len; 1024 or max_position_embeddings for a model directory)", &T },
        { "micro-batch", OPT_INT, "0", 0, 1 << 20, NULL, "B: rows per forward pass (0: the checkpoint's micro-batch, else 4)", &B },
        { "batches", OPT_INT, "0", 0, 1 << 30, NULL, "K: batches to evaluate from the start of the data (0: every whole batch it holds)", &K },
        { "threads", OPT_INT, "0", 0, 4096, NULL, "compute threads (0: all cores)", &threads },
        { "json", OPT_BOOL, "false", 0, 0, NULL, "print one JSON object instead of text", &json },
    };
    char err[4096];
    const char *pos[1];
    int npos = 0;
    int rc = opt_parse(opts, sizeof opts / sizeof opts[0], argc, argv, pos, 0, &npos, USAGE, err, sizeof err);
    if (rc) { if (rc < 0) fprintf(stderr, "ballast eval: %s\n", err); return rc < 0 ? 2 : 0; }
    if (!from || !data) { fprintf(stderr, "ballast eval: --from and --data are required\n%s\n", USAGE); return 2; }
    cli_weights_t w;
    if (cli_weights_load(from, &w, err, sizeof err)) { fprintf(stderr, "ballast eval: %s\n", err); return 1; }
    const llama_config_t *c = &w.cfg;
    if (!T) T = w.is_ckpt && w.meta.T > 0 ? w.meta.T : (c->max_seq < 1024 ? c->max_seq : 1024);
    if (!B) B = w.is_ckpt && w.meta.B > 0 ? w.meta.B : 4;
    int status = 1;
    data_t *d = NULL;
    model_t m;
    bool have_model = false;
    int32_t *in = NULL, *tg = NULL;
    if (T > c->max_seq) {
        fprintf(stderr, "ballast eval: --seq-len %lld is over the model's max_position_embeddings %d\n", (long long)T,
                c->max_seq);
        status = 2;
        goto out;
    }
    if (data_open(data, c->vocab, &d, err, sizeof err)) { fprintf(stderr, "ballast eval: %s\n", err); goto out; }
    int64_t windows = (data_num_tokens(d) - 1) / T;
    if (windows < 1) {
        fprintf(stderr, "ballast eval: %s: %lld tokens, fewer than seq-len + 1 = %lld; give a smaller --seq-len\n", data,
                (long long)data_num_tokens(d), (long long)T + 1);
        goto out;
    }
    if (B > windows) B = windows;
    int64_t have = windows / B;
    if (K == 0 || K > have) {
        if (K > have) fprintf(stderr, "ballast eval: --batches %lld: the data holds %lld whole batches; evaluating those\n",
                              (long long)K, (long long)have);
        K = have;
    }
    const backend_t *be = backend_cpu((int)threads);
    if (model_create(&m, c, be, (int)B, (int)T, false, err, sizeof err)) {
        fprintf(stderr, "ballast eval: %s\n", err);
        goto out;
    }
    have_model = true;
    model_set_params(&m, w.host);
    size_t N = (size_t)B * T;
    in = malloc(N * sizeof *in);
    tg = malloc(N * sizeof *tg);
    if (!in || !tg) { fprintf(stderr, "ballast eval: out of memory\n"); goto out; }
    double sum = 0;
    for (int64_t j = 0; j < K; j++) {
        if (data_batch(d, DATA_SEQUENTIAL, 0, j, 0, 1, 0, 1, (int)B, (int)T, in, tg, err, sizeof err)) {
            fprintf(stderr, "ballast eval: %s\n", err);
            goto out;
        }
        sum += model_forward(&m, in, tg);
    }
    double tokens = (double)K * N, loss = sum / tokens;
    if (json)
        printf("{\"loss\": %.17g, \"perplexity\": %.17g, \"tokens\": %.0f, \"batches\": %lld, \"micro_batch\": %lld, "
               "\"seq_len\": %lld, \"from\": \"%s\"}\n", loss, exp(loss), tokens, (long long)K, (long long)B,
               (long long)T, w.path);
    else
        printf("%s on %s: loss %.6f, perplexity %.4f (%.0f tokens: %lld batches of %lld x %lld)\n", w.path, data, loss,
               exp(loss), tokens, (long long)K, (long long)B, (long long)T);
    status = isfinite(loss) ? 0 : 1;
out:
    free(in);
    free(tg);
    if (have_model) model_destroy(&m);
    if (d) data_close(d);
    cli_weights_free(&w);
    return status;
}
