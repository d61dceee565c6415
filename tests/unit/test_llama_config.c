/* test_llama_config.c: presets carry the published parameter counts;
 * config.json round-trips and bad configs are named. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "workers/model/config.h"
#include "tests/unit/helpers.h"

Test(llama_config, published_parameter_counts) {
    /* Published sizes: Llama-2 7B 6.74B, 13B 13.02B, 70B 68.98B; Llama-3 8B 8.03B. */
    struct { const char *name; double billions; } want[] = {
        { "llama2-7b", 6.738 }, { "llama2-13b", 13.016 }, { "llama2-70b", 68.977 },
        { "llama3-8b", 8.030 }, { "llama3.2-1b", 1.236 },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const llama_config_t *c = llama_preset(want[i].name);
        cr_assert_not_null(c, "%s", want[i].name);
        double got = (double)llama_total_params(c) / 1e9;
        cr_assert(got > want[i].billions * 0.999 && got < want[i].billions * 1.001,
                  "%s: %.4fB params, published %.3fB", want[i].name, got, want[i].billions);
    }
}

Test(llama_config, json_round_trip_and_errors) {
    char dir[64];
    th_tmpdir(dir, sizeof dir, NULL, "cfg");
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    llama_config_t a = *llama_preset("llama3-8b"), b;
    cr_assert_eq(llama_config_save_json(&a, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(llama_config_resolve(dir, &b, err, sizeof err), 0, "%s", err);
    cr_assert_eq(b.dim, a.dim);
    cr_assert_eq(b.n_kv_heads, a.n_kv_heads);
    cr_assert_eq(b.vocab, a.vocab);
    cr_assert_float_eq(b.rope_theta, a.rope_theta, 1e-3);
    cr_assert_eq(llama_total_params(&b), llama_total_params(&a));

    th_write_str(path, "{\"hidden_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 6,"
                       " \"num_key_value_heads\": 4, \"intermediate_size\": 200, \"vocab_size\": 300}");
    cr_assert_eq(llama_config_load_json(path, &b, err, sizeof err), -1);
    cr_assert(strstr(err, "num_key_value_heads") && strstr(err, path), "%s", err);

    th_write_str(path, "{\"hidden_size\": 96, \"num_hidden_layers\": 2}");
    cr_assert_eq(llama_config_load_json(path, &b, err, sizeof err), -1);
    cr_assert(strstr(err, "num_attention_heads"), "%s", err);
    th_rm_rf(dir);
    cr_assert_eq(llama_config_resolve("no-such-model", &b, err, sizeof err), -1);
    cr_assert(strstr(err, "no-such-model") && strstr(err, "llama2-7b"), "%s", err);
}
