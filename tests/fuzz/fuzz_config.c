/* fuzz_config.c: a Hugging Face config.json (workers/model/config.c):
 * llama_config_load_json on any bytes returns 0 with a config that passes
 * llama_config_validate, or -1 with a message; never a crash. */
#include <assert.h>

#include "tests/fuzz/fuzz_util.h"
#include "workers/model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64], err[1024];
    int fd = fuzz_memfd(data, size, path, sizeof path);
    if (fd < 0) return 0;
    llama_config_t c;
    err[0] = 0;
    if (llama_config_load_json(path, &c, err, sizeof err) == 0) {
        char why[256];
        assert(llama_config_validate(&c, why, sizeof why) == 0);
        (void)llama_total_params(&c);
        (void)llama_flops_per_token(&c, 16);
    } else {
        assert(err[0]); /* a refusal always says why */
    }
    close(fd);
    return 0;
}
