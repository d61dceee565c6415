/* config.h: the shape of a Llama-architecture model.
 *
 * Field meanings follow Hugging Face's LlamaConfig so that a config.json
 * loads one to one. Presets carry the published shapes of Llama-2 7B/13B/70B
 * and Llama-3 8B, plus small shapes for tests and the demo. */
#ifndef BALLAST_LLAMA_CONFIG_H
#define BALLAST_LLAMA_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "workers/backend/backend.h"

typedef struct {
    char name[64];       /* preset name or the config.json path's stem */
    int dim;             /* D: hidden_size */
    int n_layers;        /* L: num_hidden_layers */
    int n_heads;         /* H: num_attention_heads */
    int n_kv_heads;      /* num_key_value_heads (== H without grouped-query attention) */
    int head_dim;        /* Dh: head_dim, D / H unless the config says otherwise */
    int ffn_dim;         /* intermediate_size of the SwiGLU MLP */
    int vocab;           /* V: vocab_size */
    int max_seq;         /* max_position_embeddings */
    float rms_eps;       /* rms_norm_eps */
    float rope_theta;    /* rope_theta */
    bool tie_embeddings; /* tie_word_embeddings: lm_head shares embed_tokens */
    /* rope_scaling (absent: BE_ROPE_DEFAULT, the rest 0) */
    be_rope_type_t rope_type;    /* rope_type (or type): default, linear, llama3 */
    float rope_factor;           /* factor */
    float rope_low_freq_factor;  /* low_freq_factor (llama3) */
    float rope_high_freq_factor; /* high_freq_factor (llama3) */
    int rope_orig_max_pos;       /* original_max_position_embeddings (llama3) */
} llama_config_t;

/* The rotary settings of cfg as the backend ops take them. */
be_rope_t llama_rope(const llama_config_t *cfg);

/* Look up a preset by name ("llama2-7b", "llama2-13b", "llama2-70b",
 * "llama3-8b", "llama3.2-1b", "llama3.2-3b", "tiny", "small", "demo").
 * Returns NULL when unknown. */
const llama_config_t *llama_preset(const char *name);

/* Comma-separated list of preset names, for help texts. */
const char *llama_preset_names(void);

/* Fill cfg from a preset name or a Hugging Face config.json path (a file, or
 * a directory holding config.json). Returns 0, or -1 with a message naming
 * the file and the field. */
int llama_config_resolve(const char *name_or_path, llama_config_t *cfg, char *err, size_t errlen);

/* Parse a Hugging Face config.json. */
int llama_config_load_json(const char *path, llama_config_t *cfg, char *err, size_t errlen);

/* Write cfg as a Hugging Face config.json (architectures LlamaForCausalLM)
 * whose torch_dtype is the given one ("float32", "bfloat16", "float16": the
 * dtype of the weights beside it). */
int llama_config_save_json(const llama_config_t *cfg, const char *path, const char *torch_dtype, char *err,
                           size_t errlen);

/* Check internal consistency (positive sizes, H % n_kv_heads == 0, ...). */
int llama_config_validate(const llama_config_t *cfg, char *err, size_t errlen);

/* Parameter counts. */
int64_t llama_block_params(const llama_config_t *cfg);   /* one transformer block */
int64_t llama_total_params(const llama_config_t *cfg);   /* everything, tied output counted once */
int64_t llama_embedding_params(const llama_config_t *cfg); /* embed (+ lm_head if untied) */

/* Training FLOPs per token, the counting used in the seed figures:
 * 6 * N (non-embedding matmul params plus lm_head) + attention
 * 12 * L * D_attn * T (causal half not subtracted, as Megatron/SMP count). */
double llama_flops_per_token(const llama_config_t *cfg, int seq_len);

#endif
