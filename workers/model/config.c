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

/* Bounds past every published Llama-class model (theta up to 1e7 for
 * million-token contexts, eps 1e-5 / 1e-6); beyond them a value is a typo
 * or an overflow, not a model. */
#define CFG_MAX_RMS_EPS    1e-1
#define CFG_MIN_ROPE_THETA 1.0
#define CFG_MAX_ROPE_THETA 1e10
#define CFG_MAX_DIM        (1 << 18)
#define CFG_MAX_LAYERS     4096
#define CFG_MAX_HEADS      4096
#define CFG_MAX_VOCAB      (1 << 24)

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
    /* finite and in the range real models use: a float that overflowed to
     * inf, or an eps that swamps the mean square, is a broken config */
    if (!(c->rms_eps > 0) || !isfinite(c->rms_eps) || c->rms_eps > CFG_MAX_RMS_EPS)
        BAD("rms_norm_eps must be finite and in (0, %g] (got %g)", CFG_MAX_RMS_EPS, c->rms_eps);
    if (!(c->rope_theta >= CFG_MIN_ROPE_THETA) || !isfinite(c->rope_theta) || c->rope_theta > CFG_MAX_ROPE_THETA)
        BAD("rope_theta must be finite and in [%g, %g] (got %g)", CFG_MIN_ROPE_THETA, CFG_MAX_ROPE_THETA,
            c->rope_theta);
    if (c->dim > CFG_MAX_DIM || c->ffn_dim > CFG_MAX_DIM || c->head_dim > CFG_MAX_DIM)
        BAD("hidden_size, intermediate_size and head_dim must be at most %d (got %d, %d, %d)", CFG_MAX_DIM, c->dim,
            c->ffn_dim, c->head_dim);
    if (c->n_layers > CFG_MAX_LAYERS) BAD("num_hidden_layers must be at most %d (got %d)", CFG_MAX_LAYERS, c->n_layers);
    if (c->n_heads > CFG_MAX_HEADS) BAD("num_attention_heads must be at most %d (got %d)", CFG_MAX_HEADS, c->n_heads);
    if (c->vocab > CFG_MAX_VOCAB) BAD("vocab_size must be at most %d (got %d)", CFG_MAX_VOCAB, c->vocab);
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
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || !isfinite((float)json_number_value(v))) {
        snprintf(err, errlen, "%s: \"%s\" must be a finite number (a float32)", path, key);
        return -1;
    }
    *out = (float)json_number_value(v);
    return 0;
}

/* Every key a config.json may hold, and what ballast does with it. A key
 * outside this table is refused by name: ballast cannot tell whether it
 * changes the model, and training a different model than the file
 * describes is worse than stopping. */
typedef enum {
    F_READ,     /* read into llama_config_t (or refused by its own check below) */
    F_SILU,     /* hidden_act: "silu" (HF's "swish" is the same function) */
    F_FALSE,    /* a boolean that must be false: a bias ballast's blocks do not have */
    F_ZERO,     /* a number that must be 0 (attention dropout) */
    F_POS_INT,  /* pretraining_tp: HF splits its matmuls that many ways, the same product */
    F_WINDOW,   /* sliding_window: null, or no shorter than max_position_embeddings */
    F_STRING,   /* metadata strings: no effect on the model */
    F_STRINGS,  /* architectures: a list of strings */
    F_BOOL,     /* a boolean with no effect on training (use_cache) */
    F_NUMBER,   /* a number with no effect on a loaded model (initializer_range) */
    F_TOKEN,    /* token ids: an integer, a list of integers or null */
} field_kind_t;

static const struct { const char *key; field_kind_t kind; } config_fields[] = {
    { "model_type", F_READ }, { "hidden_size", F_READ }, { "num_hidden_layers", F_READ },
    { "num_attention_heads", F_READ }, { "num_key_value_heads", F_READ }, { "head_dim", F_READ },
    { "intermediate_size", F_READ }, { "vocab_size", F_READ }, { "max_position_embeddings", F_READ },
    { "rms_norm_eps", F_READ }, { "rope_theta", F_READ }, { "rope_scaling", F_READ },
    { "tie_word_embeddings", F_READ },
    { "hidden_act", F_SILU }, { "attention_bias", F_FALSE }, { "mlp_bias", F_FALSE },
    { "use_sliding_window", F_FALSE }, { "attention_dropout", F_ZERO }, { "pretraining_tp", F_POS_INT },
    { "sliding_window", F_WINDOW },
    { "torch_dtype", F_STRING }, { "transformers_version", F_STRING }, { "tokenizer_class", F_STRING },
    { "architectures", F_STRINGS }, { "use_cache", F_BOOL }, { "initializer_range", F_NUMBER },
    { "bos_token_id", F_TOKEN }, { "eos_token_id", F_TOKEN }, { "pad_token_id", F_TOKEN },
};

/* Refuse, by name, every key of root that ballast would not honour. Keys
 * starting with '_' (_name_or_path, _attn_implementation) are Hugging
 * Face's bookkeeping and implementation hints, and are accepted. 0, or -1
 * with a message. */
static int check_fields(json_t *root, const char *path, char *err, size_t errlen) {
#define BADF(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (key[0] == '_') continue;
        size_t i, n = sizeof config_fields / sizeof config_fields[0];
        for (i = 0; i < n && strcmp(config_fields[i].key, key); i++) {}
        if (i == n)
            BADF("%s: unknown key \"%s\": ballast cannot tell whether it changes the model; remove it if it does "
                 "not (docs/training.md lists the keys it reads and accepts)", path, key);
        switch (config_fields[i].kind) {
        case F_READ: break;
        case F_SILU:
            if (!json_is_string(v) || (strcmp(json_string_value(v), "silu") && strcmp(json_string_value(v), "swish")))
                BADF("%s: hidden_act must be \"silu\" (the SwiGLU MLP ballast implements); this config asks for "
                     "another activation", path);
            break;
        case F_FALSE:
            if (json_is_null(v)) break;
            if (!json_is_boolean(v)) BADF("%s: \"%s\" must be true or false (a JSON boolean)", path, key);
            if (json_is_true(v))
                BADF("%s: \"%s\" is true: ballast's blocks have no such bias or option; use a model without it", path,
                     key);
            break;
        case F_ZERO:
            if (!json_is_number(v) || json_number_value(v) != 0)
                BADF("%s: \"%s\" must be 0: ballast trains without dropout", path, key);
            break;
        case F_POS_INT:
            if (!json_is_integer(v) || json_integer_value(v) < 1)
                BADF("%s: \"%s\" must be a positive integer", path, key);
            break;
        case F_WINDOW: break; /* checked against max_position_embeddings once that is read */
        case F_STRING:
            if (!json_is_string(v) && !json_is_null(v)) BADF("%s: \"%s\" must be a string", path, key);
            break;
        case F_STRINGS: {
            size_t k;
            json_t *e;
            if (!json_is_array(v)) BADF("%s: \"%s\" must be a list of strings", path, key);
            json_array_foreach(v, k, e) if (!json_is_string(e)) BADF("%s: \"%s\" must be a list of strings", path, key);
            break;
        }
        case F_BOOL:
            if (!json_is_boolean(v) && !json_is_null(v)) BADF("%s: \"%s\" must be true or false (a JSON boolean)", path, key);
            break;
        case F_NUMBER:
            if (!json_is_number(v) && !json_is_null(v)) BADF("%s: \"%s\" must be a number", path, key);
            break;
        case F_TOKEN: {
            size_t k;
            json_t *e;
            if (json_is_null(v) || json_is_integer(v)) break;
            if (!json_is_array(v)) BADF("%s: \"%s\" must be a token id or a list of them", path, key);
            json_array_foreach(v, k, e) if (!json_is_integer(e))
                BADF("%s: \"%s\" must be a token id or a list of them", path, key);
            break;
        }
        }
    }
    return 0;
#undef BADF
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
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        snprintf(err, errlen, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
        return -1;
    }
    int rc = -1;
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) { snprintf(err, errlen, "%s: expected a JSON object", path); goto out; }
    json_t *mt = json_object_get(root, "model_type");
    if (mt && !json_is_string(mt)) { snprintf(err, errlen, "%s: model_type must be a string", path); goto out; }
    /* Mistral without a sliding window is Llama under another name; Qwen2's
     * attention has q/k/v biases */
    if (mt && strcmp(json_string_value(mt), "llama") && strcmp(json_string_value(mt), "mistral")) {
        snprintf(err, errlen, "%s: model_type is \"%s\", only \"llama\" (and \"mistral\" without a sliding window) "
                 "is supported", path, json_string_value(mt));
        goto out;
    }
    if (check_fields(root, path, err, errlen)) goto out;
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
    if (tie && !json_is_null(tie) && !json_is_boolean(tie)) {
        snprintf(err, errlen, "%s: \"tie_word_embeddings\" must be true or false (a JSON boolean)", path);
        goto out;
    }
    c->tie_embeddings = tie && json_is_true(tie);
    json_t *sw = json_object_get(root, "sliding_window");
    if (sw && !json_is_null(sw) && (!json_is_integer(sw) || json_integer_value(sw) < c->max_seq)) {
        snprintf(err, errlen, "%s: sliding_window is shorter than max_position_embeddings (%d): ballast's attention "
                 "sees the whole sequence; use a model without a sliding window", path, c->max_seq);
        goto out;
    }
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
