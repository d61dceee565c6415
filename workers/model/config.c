/* config.c: presets, Hugging Face config.json I/O (jansson), counts. */
#include "workers/model/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* ---- presets ---- */

static const llama_config_t presets[] = {
    /* name          D     L   H   KV  Dh   FFN    V       seq    eps   theta    tie */
    { "llama2-7b",   4096, 32, 32, 32, 128, 11008, 32000,  4096,  1e-5f, 10000.f, false },
    { "llama2-13b",  5120, 40, 40, 40, 128, 13824, 32000,  4096,  1e-5f, 10000.f, false },
    { "llama2-70b",  8192, 80, 64, 8,  128, 28672, 32000,  4096,  1e-5f, 10000.f, false },
    { "llama3-8b",   4096, 32, 32, 8,  128, 14336, 128256, 8192,  1e-5f, 500000.f, false },
    /* Llama 3.2: rope_scaling llama3, factor 32, low 1, high 4, original 8192 */
    { "llama3.2-1b", 2048, 16, 32, 8,  64,  8192,  128256, 131072, 1e-5f, 500000.f, true, BE_ROPE_LLAMA3, 32.f, 1.f, 4.f, 8192 },
    { "llama3.2-3b", 3072, 28, 24, 8,  128, 8192,  128256, 131072, 1e-5f, 500000.f, true, BE_ROPE_LLAMA3, 32.f, 1.f, 4.f, 8192 },
    /* small shapes for tests and the demo */
    { "tiny",        64,   2,  4,  2,  16,  176,   256,    256,   1e-5f, 10000.f, false },
    { "small",       256,  4,  8,  4,  32,  688,   512,    1024,  1e-5f, 10000.f, false },
    { "demo",        384,  6,  6,  2,  64,  1024,  512,    1024,  1e-5f, 10000.f, false },
};

const llama_config_t *llama_preset(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) return &presets[i];
    return NULL;
}

const char *llama_preset_names(void) {
    return "llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3.2-1b, llama3.2-3b, tiny, small, demo";
}

be_rope_t llama_rope(const llama_config_t *c) {
    be_rope_t r = { .theta = c->rope_theta, .type = c->rope_type, .factor = c->rope_factor,
                    .low_freq_factor = c->rope_low_freq_factor, .high_freq_factor = c->rope_high_freq_factor,
                    .original_max_pos = c->rope_orig_max_pos };
    return r;
}

/* ---- validation and counts ---- */

int llama_config_validate(const llama_config_t *c, char *err, size_t errlen) {
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)
    if (c->dim <= 0) BAD("hidden_size must be positive (got %d)", c->dim);
    if (c->n_layers <= 0) BAD("num_hidden_layers must be positive (got %d)", c->n_layers);
    if (c->n_heads <= 0) BAD("num_attention_heads must be positive (got %d)", c->n_heads);
    if (c->n_kv_heads <= 0) BAD("num_key_value_heads must be positive (got %d)", c->n_kv_heads);
    if (c->n_heads % c->n_kv_heads)
        BAD("num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", c->n_heads, c->n_kv_heads);
    if (c->head_dim <= 0 || c->head_dim % 2)
        BAD("head_dim must be positive and even for rotary embeddings (got %d)", c->head_dim);
    if (c->ffn_dim <= 0) BAD("intermediate_size must be positive (got %d)", c->ffn_dim);
    if (c->vocab <= 1) BAD("vocab_size must be at least 2 (got %d)", c->vocab);
    if (c->max_seq <= 0) BAD("max_position_embeddings must be positive (got %d)", c->max_seq);
    if (!(c->rms_eps > 0)) BAD("rms_norm_eps must be positive (got %g)", c->rms_eps);
    if (!(c->rope_theta > 0)) BAD("rope_theta must be positive (got %g)", c->rope_theta);
    if (c->rope_type == BE_ROPE_LINEAR || c->rope_type == BE_ROPE_LLAMA3) {
        if (!(c->rope_factor >= 1) || !isfinite(c->rope_factor))
            BAD("rope_scaling.factor must be a number >= 1 (got %g)", c->rope_factor);
    } else if (c->rope_type != BE_ROPE_DEFAULT) {
        BAD("unknown rope type %d", (int)c->rope_type);
    }
    if (c->rope_type == BE_ROPE_LLAMA3) {
        if (!(c->rope_low_freq_factor > 0) || !isfinite(c->rope_low_freq_factor))
            BAD("rope_scaling.low_freq_factor must be positive (got %g)", c->rope_low_freq_factor);
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor) || !isfinite(c->rope_high_freq_factor))
            BAD("rope_scaling.high_freq_factor (%g) must be greater than low_freq_factor (%g)",
                c->rope_high_freq_factor, c->rope_low_freq_factor);
        if (c->rope_orig_max_pos <= 0)
            BAD("rope_scaling.original_max_position_embeddings must be positive (got %d)", c->rope_orig_max_pos);
    }
    return 0;
#undef BAD
}

int64_t llama_block_params(const llama_config_t *c) {
    int64_t D = c->dim, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    return D * q + 2 * D * kv + q * D + 3 * D * (int64_t)c->ffn_dim + 2 * D;
}

int64_t llama_embedding_params(const llama_config_t *c) {
    return (int64_t)c->vocab * c->dim * (c->tie_embeddings ? 1 : 2);
}

int64_t llama_total_params(const llama_config_t *c) {
    return llama_block_params(c) * c->n_layers + llama_embedding_params(c) + c->dim;
}

double llama_flops_per_token(const llama_config_t *c, int T) {
    /* Matmul parameters: every block's weights and the output projection; the
     * embedding lookup does no matmul. */
    double n = (double)llama_block_params(c) * c->n_layers + (double)c->vocab * c->dim;
    double attn = 12.0 * c->n_layers * (double)c->n_heads * c->head_dim * T;
    return 6.0 * n + attn;
}

/* ---- config.json ---- */

static int get_int(json_t *root, const char *key, int *out, bool required, const char *path, char *err, size_t errlen) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) { snprintf(err, errlen, "%s: missing \"%s\"", path, key); return -1; }
        return 1;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1 << 30) {
        snprintf(err, errlen, "%s: \"%s\" must be a non-negative integer", path, key);
        return -1;
    }
    *out = (int)json_integer_value(v);
    return 0;
}

static int get_num(json_t *root, const char *key, float *out, const char *path, char *err, size_t errlen) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 1;
    if (!json_is_number(v)) { snprintf(err, errlen, "%s: \"%s\" must be a number", path, key); return -1; }
    *out = (float)json_number_value(v);
    return 0;
}

/* rope_scaling as transformers reads it: the type under "rope_type" (or the
 * older "type"); "default" is none; "linear" needs factor, "llama3" also
 * low_freq_factor, high_freq_factor and original_max_position_embeddings.
 * Every other type is refused by name. */
static int load_rope_scaling(json_t *rs, llama_config_t *c, const char *path, char *err, size_t errlen) {
    if (!rs || json_is_null(rs)) return 0;
    if (!json_is_object(rs)) {
        snprintf(err, errlen, "%s: rope_scaling must be an object or null", path);
        return -1;
    }
    json_t *t = json_object_get(rs, "rope_type");
    if (!t || json_is_null(t)) t = json_object_get(rs, "type");
    if (!t || !json_is_string(t)) {
        snprintf(err, errlen, "%s: rope_scaling needs a string \"rope_type\" (llama3, linear or default)", path);
        return -1;
    }
    const char *ty = json_string_value(t);
    if (strcmp(ty, "default") == 0) return 0;
    if (strcmp(ty, "linear") == 0) c->rope_type = BE_ROPE_LINEAR;
    else if (strcmp(ty, "llama3") == 0) c->rope_type = BE_ROPE_LLAMA3;
    else {
        snprintf(err, errlen, "%s: rope_scaling type \"%s\" is not supported (supported: llama3, linear, default)",
                 path, ty);
        return -1;
    }
    char key[64];
    snprintf(key, sizeof key, "factor");
    int rc = get_num(rs, "factor", &c->rope_factor, path, err, errlen);
    if (rc == 0 && c->rope_type == BE_ROPE_LLAMA3) {
        snprintf(key, sizeof key, "low_freq_factor");
        rc = get_num(rs, key, &c->rope_low_freq_factor, path, err, errlen);
        if (rc == 0) {
            snprintf(key, sizeof key, "high_freq_factor");
            rc = get_num(rs, key, &c->rope_high_freq_factor, path, err, errlen);
        }
        if (rc == 0) {
            snprintf(key, sizeof key, "original_max_position_embeddings");
            rc = get_int(rs, key, &c->rope_orig_max_pos, false, path, err, errlen);
        }
    }
    if (rc < 0) return -1;
    if (rc > 0) {
        snprintf(err, errlen, "%s: rope_scaling of type %s needs \"%s\"", path, ty, key);
        return -1;
    }
    return 0;
}

int llama_config_load_json(const char *path, llama_config_t *c, char *err, size_t errlen) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        snprintf(err, errlen, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
        return -1;
    }
    int rc = -1;
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) { snprintf(err, errlen, "%s: expected a JSON object", path); goto out; }
    json_t *mt = json_object_get(root, "model_type");
    if (mt && json_is_string(mt) && strcmp(json_string_value(mt), "llama") != 0) {
        snprintf(err, errlen, "%s: model_type is \"%s\", only \"llama\" is supported", path, json_string_value(mt));
        goto out;
    }
    if (get_int(root, "hidden_size", &c->dim, true, path, err, errlen) < 0) goto out;
    if (get_int(root, "num_hidden_layers", &c->n_layers, true, path, err, errlen) < 0) goto out;
    if (get_int(root, "num_attention_heads", &c->n_heads, true, path, err, errlen) < 0) goto out;
    if (get_int(root, "intermediate_size", &c->ffn_dim, true, path, err, errlen) < 0) goto out;
    if (get_int(root, "vocab_size", &c->vocab, true, path, err, errlen) < 0) goto out;
    c->n_kv_heads = c->n_heads;
    if (get_int(root, "num_key_value_heads", &c->n_kv_heads, false, path, err, errlen) < 0) goto out;
    if (c->n_heads <= 0 || c->dim % c->n_heads) {
        if (!json_object_get(root, "head_dim")) {
            snprintf(err, errlen, "%s: hidden_size (%d) is not a multiple of num_attention_heads (%d)", path, c->dim, c->n_heads);
            goto out;
        }
    } else {
        c->head_dim = c->dim / c->n_heads;
    }
    if (get_int(root, "head_dim", &c->head_dim, false, path, err, errlen) < 0) goto out;
    c->max_seq = 4096;
    if (get_int(root, "max_position_embeddings", &c->max_seq, false, path, err, errlen) < 0) goto out;
    c->rms_eps = 1e-6f;
    if (get_num(root, "rms_norm_eps", &c->rms_eps, path, err, errlen) < 0) goto out;
    c->rope_theta = 10000.f;
    if (get_num(root, "rope_theta", &c->rope_theta, path, err, errlen) < 0) goto out;
    if (load_rope_scaling(json_object_get(root, "rope_scaling"), c, path, err, errlen) < 0) goto out;
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    c->tie_embeddings = tie && json_is_true(tie);
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    snprintf(c->name, sizeof c->name, "%s", base);
    char why[256];
    if (llama_config_validate(c, why, sizeof why)) { snprintf(err, errlen, "%s: %s", path, why); goto out; }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int llama_config_save_json(const llama_config_t *c, const char *path, const char *torch_dtype, char *err,
                           size_t errlen) {
    json_t *o = json_object();
    json_object_set_new(o, "architectures", json_pack("[s]", "LlamaForCausalLM"));
    json_object_set_new(o, "model_type", json_string("llama"));
    json_object_set_new(o, "hidden_size", json_integer(c->dim));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(c->n_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->n_kv_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "intermediate_size", json_integer(c->ffn_dim));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_seq));
    json_object_set_new(o, "rms_norm_eps", json_real(c->rms_eps));
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_embeddings));
    if (c->rope_type == BE_ROPE_LINEAR)
        json_object_set_new(o, "rope_scaling", json_pack("{s:s,s:f}", "rope_type", "linear", "factor", (double)c->rope_factor));
    else if (c->rope_type == BE_ROPE_LLAMA3)
        json_object_set_new(o, "rope_scaling",
                            json_pack("{s:s,s:f,s:f,s:f,s:i}", "rope_type", "llama3", "factor", (double)c->rope_factor,
                                      "low_freq_factor", (double)c->rope_low_freq_factor, "high_freq_factor",
                                      (double)c->rope_high_freq_factor, "original_max_position_embeddings",
                                      c->rope_orig_max_pos));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "attention_bias", json_false());
    json_object_set_new(o, "mlp_bias", json_false());
    json_object_set_new(o, "torch_dtype", json_string(torch_dtype ? torch_dtype : "float32"));
    json_object_set_new(o, "bos_token_id", json_integer(1));
    json_object_set_new(o, "eos_token_id", json_integer(2));
    int rc = json_dump_file(o, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    if (rc) { snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno)); return -1; }
    return 0;
}

int llama_config_resolve(const char *s, llama_config_t *c, char *err, size_t errlen) {
    const llama_config_t *p = llama_preset(s);
    if (p) { *c = *p; return 0; }
    struct stat st;
    if (!s || stat(s, &st) != 0) {
        snprintf(err, errlen, "model '%s' is neither a preset (%s) nor an existing config.json or model directory",
                 s ? s : "", llama_preset_names());
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", s);
        return llama_config_load_json(path, c, err, errlen);
    }
    return llama_config_load_json(s, c, err, errlen);
}
