/*
 * tokenizer.h - Hugging Face tokenizers (tokenizer.json, optionally with
 * tokenizer_config.json beside it) in C: the byte-level BPE of GPT-2,
 * Llama 3 and Qwen, and the SentencePiece-style BPE of Llama 2 and Mistral
 * (byte fallback). Encoding and decoding; the supported normalizers,
 * pre-tokenizers and decoders, and what is refused, are in docs/data.md
 * ("Tokenizers").
 *
 * A tokenizer_t is immutable after tokenizer_load: any number of threads may
 * encode and decode with one tokenizer at once (each thread keeps its own
 * word cache and regex scratch, freed when the thread exits or the
 * tokenizer is freed from that thread).
 */
#ifndef BALLAST_TOKENIZER_H
#define BALLAST_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer_t;

/* Loads a Hugging Face tokenizer: PATH is a tokenizer.json file or a
 * directory holding tokenizer.json (and optionally tokenizer_config.json,
 * read from the same directory as tokenizer.json). NULL on failure with a
 * message in err naming the problem and the fix. Unknown model, normalizer,
 * pre-tokenizer or decoder types are refused by name. */
tokenizer_t *tokenizer_load(const char *path, char *err, size_t errlen);
void tokenizer_free(tokenizer_t *t);
/* Largest id + 1, added tokens included. */
uint32_t tokenizer_vocab_size(const tokenizer_t *t);
/* The BOS / EOS token ids, -1 when none. */
int64_t tokenizer_bos_id(const tokenizer_t *t);
int64_t tokenizer_eos_id(const tokenizer_t *t);
/* Whether encoding a sequence for a model adds BOS / EOS: add_bos_token /
 * add_eos_token of tokenizer_config.json, else the post-processor's template. */
bool tokenizer_adds_bos(const tokenizer_t *t);
bool tokenizer_adds_eos(const tokenizer_t *t);
/* Encodes len bytes of text (any bytes, invalid UTF-8 included) without
 * BOS/EOS. Appends to *ids (realloc'd, capacity in *cap) from index *n on;
 * returns 0, or -1 with err set. */
int tokenizer_encode(const tokenizer_t *t, const char *text, size_t len,
                     uint32_t **ids, size_t *n, size_t *cap, char *err, size_t errlen);
/* Decodes n ids to bytes into a malloc'd buffer (*out, *out_len, also
 * NUL-terminated); special tokens included unless skip_special. Returns 0,
 * or -1 with err set (an id out of range is an error). */
int tokenizer_decode(const tokenizer_t *t, const uint32_t *ids, size_t n, bool skip_special,
                     char **out, size_t *out_len, char *err, size_t errlen);
/* The id of a token string (e.g. "<|eot_id|>"), -1 when absent. */
int64_t tokenizer_token_id(const tokenizer_t *t, const char *token);

/* ---- beyond the shared API ---- */

/* The token string of an id as the vocabulary spells it (e.g. "Ġthe",
 * "▁the", "<0x0A>"), NULL when id is out of range or unassigned. */
const char *tokenizer_id_token(const tokenizer_t *t, uint32_t id);
/* Whether id is a special added token (skipped by skip_special). */
bool tokenizer_is_special(const tokenizer_t *t, uint32_t id);
/* "byte-level BPE" or "SentencePiece BPE": for messages and `ballast data`. */
const char *tokenizer_kind(const tokenizer_t *t);

#endif
