/* weights.c: see weights.h. */
#include "workers/cli/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "workers/ckpt/hf.h"
#include "workers/model/model.h"

int cli_weights_load(const char *from, cli_weights_t *w, char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    struct stat st;
    if (!from || stat(from, &st) != 0 || !S_ISDIR(st.st_mode))
        return errbuf_set(err, errlen, "%s: not a directory (give a checkpoint step directory, a --ckpt-dir or a "
                          "Hugging Face model directory)", from ? from : "");
    char p[4400];
    snprintf(p, sizeof p, "%s/manifest.json", from);
    bool manifest = access(p, R_OK) == 0;
    snprintf(p, sizeof p, "%s/config.json", from);
    bool config = access(p, R_OK) == 0;
    if (manifest || !config) {
        /* a checkpoint, or a --ckpt-dir holding step directories */
        if (manifest) snprintf(w->path, sizeof w->path, "%s", from);
        else {
            int r = ckpt_find_latest(from, w->path, sizeof w->path, err, errlen);
            if (r < 0) return -1;
            if (r == 0)
                return errbuf_set(err, errlen, "%s: no manifest.json, no config.json and no step-NNNNNNNN checkpoint "
                                  "inside (give a checkpoint or a Hugging Face model directory)", from);
        }
        w->is_ckpt = true;
        if (ckpt_read_meta(w->path, &w->meta, err, errlen)) return -1;
        w->cfg = w->meta.cfg;
    } else {
        snprintf(w->path, sizeof w->path, "%s", from);
        if (llama_config_resolve(from, &w->cfg, err, errlen)) return -1;
    }
    model_t m;
    char e[1024];
    if (model_layout(&m, &w->cfg, e, sizeof e)) return errbuf_set(err, errlen, "%s: %s", w->path, e);
    w->n_params = m.n_params;
    w->host = malloc(m.n_params * sizeof(float));
    int rc = -1;
    if (!w->host) errbuf_set(err, errlen, "out of memory for %zu parameters", m.n_params);
    else if (w->is_ckpt) rc = ckpt_read_weights(w->path, &m, w->host, err, errlen);
    else rc = ckpt_read_hf_host(w->path, &m, w->host, err, errlen);
    model_destroy(&m);
    if (rc) cli_weights_free(w);
    return rc;
}

void cli_weights_free(cli_weights_t *w) {
    free(w->host);
    w->host = NULL;
}
