/* weights.h: a model's weights for the commands that run one (ballast eval,
 * ballast generate): from a checkpoint (a step directory or a --ckpt-dir,
 * its newest step) or a Hugging Face model directory. */
#ifndef BALLAST_CLI_WEIGHTS_H
#define BALLAST_CLI_WEIGHTS_H

#include <stddef.h>

#include "workers/ckpt/ckpt.h"
#include "workers/model/config.h"

typedef struct {
    char path[4200];      /* the step directory or the model directory read */
    bool is_ckpt;         /* a ballast checkpoint (meta valid), else a Hugging Face directory */
    ckpt_meta_t meta;     /* is_ckpt: its manifest */
    llama_config_t cfg;
    float *host;          /* the full parameters, model layout order (malloc'd) */
    size_t n_params;
} cli_weights_t;

/* Load the weights at from. 0, or -1 with a message naming the path and
 * the problem. */
int cli_weights_load(const char *from, cli_weights_t *w, char *err, size_t errlen);
void cli_weights_free(cli_weights_t *w);

#endif
