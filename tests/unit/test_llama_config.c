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
    cr_assert_eq(llama_config_save_json(&a, path, "float32", err, sizeof err), 0, "%s", err);
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

/* rope_scaling as Llama 3.1/3.2 configs write it loads, survives a save,
 * and the Llama 3.2 presets carry it; linear loads under the older "type"
 * key; other types and incomplete settings are refused by name. */
Test(llama_config, rope_scaling) {
    char dir[64];
    th_tmpdir(dir, sizeof dir, NULL, "rope");
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    const char *shape = "\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                        "\"num_key_value_heads\": 2, \"intermediate_size\": 96, \"vocab_size\": 128, "
                        "\"max_position_embeddings\": 131072, \"rope_theta\": 500000.0";
    char buf[1024];
    snprintf(buf, sizeof buf, "{%s, \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, "
             "\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}}", shape);
    th_write_str(path, buf);
    llama_config_t a, b;
    cr_assert_eq(llama_config_load_json(path, &a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(a.rope_type, BE_ROPE_LLAMA3);
    cr_assert_float_eq(a.rope_factor, 32.f, 0);
    cr_assert_float_eq(a.rope_low_freq_factor, 1.f, 0);
    cr_assert_float_eq(a.rope_high_freq_factor, 4.f, 0);
    cr_assert_eq(a.rope_orig_max_pos, 8192);
    cr_assert_eq(llama_config_save_json(&a, path, "bfloat16", err, sizeof err), 0, "%s", err);
    cr_assert_eq(llama_config_load_json(path, &b, err, sizeof err), 0, "%s", err);
    be_rope_t ra = llama_rope(&a), rb = llama_rope(&b);
    cr_assert(ra.type == rb.type && ra.factor == rb.factor && ra.low_freq_factor == rb.low_freq_factor &&
              ra.high_freq_factor == rb.high_freq_factor && ra.original_max_pos == rb.original_max_pos &&
              ra.theta == rb.theta);
    const llama_config_t *p = llama_preset("llama3.2-1b");
    cr_assert(p->rope_type == BE_ROPE_LLAMA3 && p->rope_factor == 32.f && p->rope_orig_max_pos == 8192 &&
              p->tie_embeddings);
    cr_assert_eq(llama_preset("llama3-8b")->rope_type, BE_ROPE_DEFAULT);

    snprintf(buf, sizeof buf, "{%s, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}", shape);
    th_write_str(path, buf);
    cr_assert_eq(llama_config_load_json(path, &a, err, sizeof err), 0, "%s", err);
    cr_assert(a.rope_type == BE_ROPE_LINEAR && a.rope_factor == 2.f);
    snprintf(buf, sizeof buf, "{%s, \"rope_scaling\": {\"rope_type\": \"default\"}}", shape);
    th_write_str(path, buf);
    cr_assert_eq(llama_config_load_json(path, &a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(a.rope_type, BE_ROPE_DEFAULT);

    struct { const char *scaling, *want; } bad[] = {
        { "{\"rope_type\": \"yarn\", \"factor\": 4.0}", "\"yarn\" is not supported" },
        { "{\"type\": \"dynamic\", \"factor\": 4.0}", "\"dynamic\" is not supported" },
        { "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}",
          "original_max_position_embeddings" },
        { "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0, \"high_freq_factor\": 1.0, "
          "\"original_max_position_embeddings\": 8192}", "greater than low_freq_factor" },
        { "{\"rope_type\": \"linear\", \"factor\": 0.5}", "factor must be a number >= 1" },
        { "{\"rope_type\": \"linear\"}", "needs \"factor\"" },
        { "{\"factor\": 2.0}", "rope_type" },
        { "\"llama3\"", "must be an object" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(buf, sizeof buf, "{%s, \"rope_scaling\": %s}", shape, bad[i].scaling);
        th_write_str(path, buf);
        cr_assert_eq(llama_config_load_json(path, &a, err, sizeof err), -1, "%s loaded", bad[i].scaling);
        cr_assert(strstr(err, bad[i].want) && strstr(err, path), "%s: %s", bad[i].scaling, err);
    }
    th_rm_rf(dir);
}
