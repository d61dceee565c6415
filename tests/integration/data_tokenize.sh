#!/usr/bin/env bash
# data_tokenize.sh: `ballast data tokenize` end to end with a byte-level BPE
# tokenizer trained here on random text (a seeded toy trainer, so no
# download is needed): the shards hold exactly the documents' ids (from
# tok_tool, the tokenizer's own driver) with EOS as tokenizer_config.json
# says, in input order, split into train/val by the documented content hash;
# the bytes do not depend on the thread count; uint16 or uint32 by
# vocabulary size; bad inputs are refused naming the file and line.
source "$(dirname "$0")/../lib.sh"
B=$BIN/ballast
TOOL=$ROOT/$BUILD/tests/integration/tok_tool
D=$(t_tmpdir)
[ -x "$B" ] && [ -x "$TOOL" ] || { t_fail "binaries" "missing $B or $TOOL; run make"; t_done; exit 1; }
SEED=${TOK_SEED:-$(( (RANDOM << 15 | RANDOM) ))}
echo "# seed $SEED"

"$T_PY" - "$D" "$SEED" <<'PY'
import json, os, random, re, struct, sys
d, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
def b2u():
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    m, n = {}, 0
    for b in range(256):
        if b in keep: m[b] = chr(b)
        else: m[b] = chr(256 + n); n += 1
    return m
B2U = b2u()
sylls = ["ka", "lo", "mi", "ne", "ru", "sta", "ver", "qu", "é", "ß", "д", "語", "🙂", "th", "ing", "ion"]
def word(): return "".join(rng.choice(sylls) for _ in range(rng.randint(1, 4)))
def text(n): return "".join(rng.choice([" ", " ", " ", "\n", ", ", ". ", "  ", "\t"]) + word() for _ in range(n))
corpus = text(3000)
# a toy BPE trainer: words by a GPT-2-like split, then the most frequent pair, 300 times
words = {}
for w in re.findall(r" ?[^\s]+|\s+", corpus):
    t = tuple(B2U[b] for b in w.encode())
    words[t] = words.get(t, 0) + 1
vocab = {B2U[b]: b for b in range(256)}
merges = []
for _ in range(300):
    pairs = {}
    for w, c in words.items():
        for a, b in zip(w, w[1:]): pairs[(a, b)] = pairs.get((a, b), 0) + c
    if not pairs: break
    best = max(sorted(pairs), key=lambda p: pairs[p])
    merges.append(list(best)); vocab.setdefault(best[0] + best[1], len(vocab))
    nw = {}
    for w, c in words.items():
        out, i = [], 0
        while i < len(w):
            if i + 1 < len(w) and (w[i], w[i + 1]) == best: out.append(w[i] + w[i + 1]); i += 2
            else: out.append(w[i]); i += 1
        nw[tuple(out)] = nw.get(tuple(out), 0) + c
    words = nw
def write(dirname, eos_id):
    os.makedirs(dirname, exist_ok=True)
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": eos_id, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True}],
          "normalizer": None,
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"}, "behavior": "Isolated", "invert": False},
              {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
          "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
          "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": vocab, "merges": merges}}
    json.dump(tj, open(dirname + "/tokenizer.json", "w"), ensure_ascii=False)
    json.dump({"add_bos_token": False, "add_eos_token": True, "eos_token": "<|endoftext|>", "bos_token": None,
               "model_max_length": 10 ** 30}, open(dirname + "/tokenizer_config.json", "w"))
write(d + "/tok16", len(vocab))
write(d + "/tok32", 70000)
# inputs: text files (one document each) and a JSONL file (one per line, blank lines skipped)
docs = []
for i in range(4):
    t = text(rng.randint(50, 3000))
    open(f"{d}/in{i}.txt", "w").write(t); docs.append(t)
with open(d + "/in.jsonl", "w") as f:
    for i in range(400):
        t = text(rng.randint(1, 60)); docs.append(t)
        f.write(json.dumps({"id": i, "text": t}) + "\n")
        if i % 50 == 0: f.write("\n")
with open(d + "/docs.docs", "wb") as f:
    for t in docs: b = t.encode(); f.write(struct.pack("<I", len(b)) + b)
PY

for th in 1 4; do
    "$B" data tokenize --tokenizer "$D/tok16" --out "$D/o$th" --val-fraction 0.2 --threads $th \
        "$D"/in0.txt "$D"/in1.txt "$D"/in2.txt "$D"/in3.txt "$D/in.jsonl" > "$D/o$th.log" 2>&1 || { cat "$D/o$th.log"; }
done
if cmp -s "$D/o1/train_000000.bin" "$D/o4/train_000000.bin" && cmp -s "$D/o1/val_000000.bin" "$D/o4/val_000000.bin"; then
    t_ok "the shards are the same bytes with 1 and 4 threads"
else
    t_fail "the shards are the same bytes with 1 and 4 threads" "$(ls -l "$D"/o1 "$D"/o4; tail -3 "$D/o1.log" "$D/o4.log")"
fi

"$TOOL" encode "$D/tok16" "$D/docs.docs" "$D/docs.ids" > /dev/null
check=$("$T_PY" - "$D" <<'PY'
import struct, sys
d = sys.argv[1]
raw = open(d + "/docs.docs", "rb").read(); ids = open(d + "/docs.ids", "rb").read()
docs, seqs, o, q = [], [], 0, 0
while o < len(raw):
    n = struct.unpack_from("<I", raw, o)[0]; docs.append(raw[o + 4:o + 4 + n]); o += 4 + n
    m = struct.unpack_from("<I", ids, q)[0]; seqs.append(list(struct.unpack_from(f"<{m}I", ids, q + 4))); q += 4 + 4 * m
M = (1 << 64) - 1
def val(b):  # docs/data.md: FNV-1a 64, splitmix64's finalizer, top 53 bits as a fraction
    h = 0xcbf29ce484222325
    for c in b: h = ((h ^ c) * 0x100000001b3) & M
    h = ((h ^ (h >> 30)) * 0xbf58476d1ce4e5b9) & M
    h = ((h ^ (h >> 27)) * 0x94d049bb133111eb) & M
    h ^= h >> 31
    return (h >> 11) * 2.0 ** -53 < 0.2
import json
eos = json.load(open(d + "/tok16/tokenizer.json"))["added_tokens"][0]["id"]  # tokenizer_config.json names it
want = {"train": [], "val": []}
for b, s in zip(docs, seqs):
    want["val" if val(b) else "train"] += s + [eos]
bad = []
for split in ("train", "val"):
    f = open(f"{d}/o1/{split}_000000.bin", "rb").read()
    magic, ver, n = struct.unpack_from("<3i", f)
    got = list(struct.unpack_from(f"<{n}H", f, 1024))
    if (magic, ver, len(f)) != (20240520, 1, 1024 + 2 * n) or got != want[split]:
        k = next((i for i, (a, b) in enumerate(zip(got, want[split])) if a != b), min(len(got), len(want[split])))
        bad.append(f"{split}: header {magic} {ver} {n}, {len(got)} tokens vs {len(want[split])} expected, first difference at {k}")
print("; ".join(bad) if bad else f"ok {len(want['train'])} {len(want['val'])}")
PY
)
if [[ "$check" == ok* ]]; then t_ok "train/val shards hold each document's ids + EOS in input order, split by content hash (${check#ok })"
else t_fail "train/val shards hold each document's ids + EOS in input order, split by content hash" "$check"; fi

out=$("$B" data tokenize --tokenizer "$D/tok32" --out "$D/o32" "$D/in0.txt" 2>&1)
hdr=$(od -An -t d4 -N 8 "$D/o32/train_000000.bin" 2>/dev/null | tr -s ' ' | sed 's/^ //')
if [ "$hdr" = "20240520 2" ]; then t_ok "a vocabulary over 65536 writes uint32 shards (version 2)"
else t_fail "a vocabulary over 65536 writes uint32 shards (version 2)" "header '$hdr': $out"; fi
hdr=$(od -An -t d4 -N 8 "$D/o1/train_000000.bin" | tr -s ' ' | sed 's/^ //')
if [ "$hdr" = "20240520 1" ]; then t_ok "a small vocabulary writes uint16 shards (version 1)"; else t_fail "uint16 shards" "header '$hdr'"; fi
t_check "ballast data info reads the shards" "$B" data info "$D/o1/train_000000.bin" "$D/o32/train_000000.bin"

# ---- an added token over a vocabulary entry ----
# An added token may reuse the id of a model token with other text (it
# decodes as the added text); the model's string must still encode to that
# id. Loading once freed that string while the vocabulary map pointed at
# it (the allocator then handed its bytes to the added text): the id of a
# token used in the text is given an added token of the same length.
words="kalo mistaver quing thion rune kaka loth"
base=$("$TOOL" ids "$D/tok16" "$words" | head -1)
over=$("$T_PY" - "$D" "$base" <<'PY'
import json, random, sys
d, ids = sys.argv[1], [int(x) for x in sys.argv[2].split()]
tj = json.load(open(d + "/tok16/tokenizer.json"))
inv = {v: k for k, v in tj["model"]["vocab"].items()}
pick = [i for i in ids if len(inv[i]) >= 2 and inv[i].isascii() and inv[i].isalpha()]
k = random.Random(sorted(ids)[0]).choice(pick)
content = "Q" * len(inv[k])
tj["added_tokens"].append({"id": k, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                           "normalized": False, "special": False})
import os; os.makedirs(d + "/tok16o", exist_ok=True)
json.dump(tj, open(d + "/tok16o/tokenizer.json", "w"), ensure_ascii=False)
print(k, inv[k], content)
PY
)
read -r oid ostr ocontent <<< "$over"
got=$("$TOOL" ids "$D/tok16o" "$words" 2>&1)
if [ -n "$oid" ] && [ "$(echo "$got" | head -1)" = "$base" ] && echo "$got" | sed -n 2p | grep -q "$ocontent"; then
    t_ok "an added token over id $oid (\"$ostr\" -> \"$ocontent\") leaves its encoding as it was and decodes as the added text"
else
    t_fail "an added token over a vocabulary entry leaves its encoding as it was" "id $oid \"$ostr\": ids '$base' before, now: $got"
fi

# ---- bad input ----
printf '{"text": "fine"}\n{"body": "no text field"}\n' > "$D/bad.jsonl"
printf '{"text": "fine"}\n{"text": "unterminated\n' > "$D/bad2.jsonl"
t_expect_fail "a JSONL line without the field names the file and line" "bad.jsonl:2: no field \"text\".*--jsonl-field" \
    "$B" data tokenize --tokenizer "$D/tok16" --out "$D/e1" "$D/bad.jsonl"
t_expect_fail "a JSONL line that is not JSON names the file and line" "bad2.jsonl:2: not valid JSON" \
    "$B" data tokenize --tokenizer "$D/tok16" --out "$D/e2" "$D/bad2.jsonl"
if [ -z "$(ls "$D/e1" 2>/dev/null)" ]; then t_ok "a failed run leaves no shard"; else t_fail "a failed run leaves no shard" "$(ls "$D/e1")"; fi
t_expect_fail "a missing input is named" "nothere.txt: No such file" "$B" data tokenize --tokenizer "$D/tok16" --out "$D/e3" "$D/nothere.txt"
t_expect_fail "a missing tokenizer is named" "nope/tokenizer.json|nope: No such file" "$B" data tokenize --tokenizer "$D/nope" --out "$D/e4" "$D/in0.txt"
t_expect_fail "--val-fraction out of range" "val-fraction" "$B" data tokenize --tokenizer "$D/tok16" --out "$D/e5" --val-fraction 0.9 "$D/in0.txt"
t_expect_fail "no input file" "at least one input file" "$B" data tokenize --tokenizer "$D/tok16" --out "$D/e6"
t_done
