#!/usr/bin/env bash
# model_refuse.sh: the worker trains the model a Hugging Face config.json
# and its safetensors describe, or refuses by name what it would not
# honour (docs/training.md, "What config.json may hold"):
#   - real Llama 3 and Mistral config.json files, with their metadata
#     (architectures, torch_dtype, token ids, ...), train a step;
#   - hidden_act other than silu, attention_bias / mlp_bias true, a
#     non-boolean boolean ("yes"), rms_norm_eps / rope_theta that overflow a
#     float (1e300) or are absurd, an unknown key, Qwen2, a sliding window,
#     dropout, a duplicated key and a string with an embedded NUL are
#     refused, each with a message naming the field;
#   - an --init-from directory with a tensor the model has no place for
#     (q_proj.bias) is refused naming it; rotary inv_freq buffers that match
#     rope_theta and a tied lm_head equal to embed_tokens are accepted, ones
#     that differ refused.
# The shapes and weights are drawn from a seed that changes per run.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1
W=$BIN/ballast-worker
B=$BIN/ballast
D=$(t_tmpdir)
PY=/usr/bin/python3
[ -x "$W" ] || { t_fail "ballast-worker built" "missing $W"; t_done; exit 1; }
SEED=${MODEL_REFUSE_SEED:-$RANDOM}
echo "# seed $SEED"
"$B" data synth --out "$D/c.bin" --tokens 20000 --vocab 256 --seed "$SEED" >/dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
RUN=(--data "$D/c.bin" --micro-batch 2 --seq-len 16 --steps 1 --threads 1)

# A Llama 3 style config.json (every field the Hugging Face file has) with
# a shape drawn from the seed: D = 16 * kv * r, H = 2 * kv.
$PY - "$SEED" "$D" <<'PYEOF'
import json, random, sys
rnd = random.Random(int(sys.argv[1])); d = sys.argv[2]
kv = rnd.choice([1, 2]); H = 2 * kv; Dh = 16; D = H * Dh
cfg = {"_name_or_path": "meta-llama/Llama-3.2-1B", "architectures": ["LlamaForCausalLM"], "attention_bias": False,
       "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": Dh,
       "hidden_act": "silu", "hidden_size": D, "initializer_range": 0.02, "intermediate_size": rnd.choice([48, 80, 96]),
       "max_position_embeddings": 128, "mlp_bias": False, "model_type": "llama", "num_attention_heads": H,
       "num_hidden_layers": rnd.choice([1, 2]), "num_key_value_heads": kv, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
       "rope_scaling": None, "rope_theta": rnd.choice([10000.0, 500000.0]), "tie_word_embeddings": False,
       "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 256}
json.dump(cfg, open(f"{d}/llama.json", "w"), indent=2)
mis = {k: v for k, v in cfg.items() if k not in ("attention_bias", "mlp_bias", "pretraining_tp", "rope_scaling", "head_dim")}
mis.update({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": None, "bos_token_id": 1,
            "eos_token_id": 2, "_name_or_path": "mistralai/Mistral-7B-v0.3"})
json.dump(mis, open(f"{d}/mistral.json", "w"), indent=2)
PYEOF
t_check "a Llama 3 config.json with all its metadata fields trains a step" "$W" --model "$D/llama.json" "${RUN[@]}"
t_check "a Mistral config.json without a sliding window trains a step" "$W" --model "$D/mistral.json" "${RUN[@]}"

# one changed field each, all written by one python run: NAME | edit (a
# python statement on c, the config as a dict) | expected message
CASES=(
 "hidden_act gelu"                         'c["hidden_act"] = "gelu"'          'hidden_act must be "silu"'
 "attention_bias true"                     'c["attention_bias"] = True'        '"attention_bias" is true'
 "mlp_bias true"                           'c["mlp_bias"] = True'              '"mlp_bias" is true'
 "tie_word_embeddings \"yes\""             'c["tie_word_embeddings"] = "yes"'  '"tie_word_embeddings" must be true or false'
 "attention_bias \"no\""                   'c["attention_bias"] = "no"'        '"attention_bias" must be true or false'
 "rms_norm_eps 1e300 (inf as a float)"     'c["rms_norm_eps"] = 1e300'         '"rms_norm_eps" must be a finite number'
 "rope_theta 1e300 (inf as a float)"       'c["rope_theta"] = 1e300'           '"rope_theta" must be a finite number'
 "rope_theta 1e30 (absurd)"                'c["rope_theta"] = 1e30'            'rope_theta must be finite and in'
 "rms_norm_eps 0.5 (absurd)"               'c["rms_norm_eps"] = 0.5'           'rms_norm_eps must be finite and in'
 "rope_scaling of a type not implemented"  'c["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}' 'rope_scaling'
 "an unknown key"                          'c["qk_layernorm"] = True'          'unknown key "qk_layernorm"'
 "model_type qwen2"                        'c["model_type"] = "qwen2"'         'model_type is "qwen2"'
 "a sliding window"                        'c["model_type"] = "mistral"; c["sliding_window"] = 64' 'sliding_window is shorter'
 "attention dropout"                       'c["attention_dropout"] = 0.1'      '"attention_dropout" must be 0'
 "a duplicated key"                        'c = json.dumps(c)[:-1] + ", \"hidden_act\": \"gelu\"}"' 'duplicate object key'
 "a string with an embedded NUL"           'c["hidden_act"] = "silu\u0000gelu"' 'NUL'
)
$PY - "$D/llama.json" "$D" "${CASES[@]}" <<'PYEOF'
import json, sys
src, d, cases = sys.argv[1], sys.argv[2], sys.argv[3:]
for i in range(0, len(cases), 3):
    c = json.load(open(src))
    exec(cases[i + 1])
    open(f"{d}/bad{i // 3}.json", "w").write(c if isinstance(c, str) else json.dumps(c))
PYEOF
for ((i = 0; i < ${#CASES[@]}; i += 3)); do
    t_expect_fail "refused: ${CASES[i]}" "bad$((i / 3)).json: .*${CASES[i + 2]}" \
        "$W" --model "$D/bad$((i / 3)).json" "${RUN[@]}"
done

# ---- --init-from: the tensors of the directory ----
if ! $PY -c 'import numpy' 2>/dev/null; then
    t_skip "--init-from tensor checks" "no numpy for /usr/bin/python3 (apt-get install python3-numpy)"; t_done; exit
fi
# DIR EXTRA pairs: DIR/config.json (llama.json, tied when EXTRA says so)
# and DIR/model.safetensors with random weights of its shapes plus EXTRA
$PY - "$D/llama.json" "$D" "$SEED" good "" bias "bias" freq "inv_freq" badfreq "inv_freq badfreq" tied "tied lm_head" \
        tieddiff "tied lm_head lm_head_differs" <<'PYEOF' || { t_fail "Hugging Face directories written" "python failed"; t_done; exit 1; }
import json, os, struct, sys
import numpy as np
rng = np.random.default_rng(int(sys.argv[3]))

def write(cfg, out, extra):
    D, L, H, KV, F, V = (cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                           "num_key_value_heads", "intermediate_size", "vocab_size"))
    Dh = cfg["head_dim"]
    if "tied" in extra: cfg["tie_word_embeddings"] = True
    t = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    if not cfg["tie_word_embeddings"] or "lm_head" in extra: t["lm_head.weight"] = (V, D)
    for l in range(L):
        p = f"model.layers.{l}."
        t.update({p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
                  p + "self_attn.q_proj.weight": (H * Dh, D), p + "self_attn.k_proj.weight": (KV * Dh, D),
                  p + "self_attn.v_proj.weight": (KV * Dh, D), p + "self_attn.o_proj.weight": (D, H * Dh),
                  p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D), p + "mlp.down_proj.weight": (D, F)})
        if "bias" in extra: t[p + "self_attn.q_proj.bias"] = (H * Dh,)
        if "inv_freq" in extra: t[p + "self_attn.rotary_emb.inv_freq"] = (Dh // 2,)
    data = {k: (rng.standard_normal(s) * 0.02).astype(np.float32) for k, s in t.items()}
    for k in data:
        if k.endswith("inv_freq"):
            data[k] = (1.0 / cfg["rope_theta"] ** (np.arange(0, Dh, 2) / Dh)).astype(np.float32)
            if "badfreq" in extra: data[k] = data[k] * 1.5
    if "lm_head" in extra:
        data["lm_head.weight"] = data["model.embed_tokens.weight"].copy()
        if "lm_head_differs" in extra: data["lm_head.weight"][rng.integers(V), rng.integers(D)] += 1.0
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    hdr, off, blobs = {}, 0, []
    for k, a in data.items():
        b = a.tobytes(); hdr[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b); blobs.append(b)
    h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

for j in range(4, len(sys.argv), 2):
    write(json.load(open(sys.argv[1])), os.path.join(sys.argv[2], sys.argv[j]), sys.argv[j + 1])
PYEOF
t_check "--init-from a directory of exactly the model's tensors trains a step" "$W" --init-from "$D/good" "${RUN[@]}"
t_expect_fail "--init-from refuses a q_proj.bias tensor by name" \
    "model.safetensors: tensor model.layers.0.self_attn.q_proj.bias is not part of a Llama block" \
    "$W" --init-from "$D/bias" "${RUN[@]}"
t_check "--init-from accepts rotary inv_freq buffers that rope_theta gives" "$W" --init-from "$D/freq" "${RUN[@]}"
t_expect_fail "--init-from refuses inv_freq buffers of another rope_theta" \
    "rotary_emb.inv_freq holds other rotary frequencies" "$W" --init-from "$D/badfreq" "${RUN[@]}"
t_check "--init-from accepts a tied model's lm_head equal to embed_tokens" "$W" --init-from "$D/tied" "${RUN[@]}"
t_expect_fail "--init-from refuses a tied model's lm_head that differs from embed_tokens" \
    "lm_head.weight differs from model.embed_tokens.weight" "$W" --init-from "$D/tieddiff" "${RUN[@]}"
t_done
