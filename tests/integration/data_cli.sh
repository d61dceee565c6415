#!/usr/bin/env bash
# data_cli.sh: `ballast data synth | pack | info` end to end, byte-level
# checks of what they write, and their error messages for bad input.
source "$(dirname "$0")/../lib.sh"
B=$BIN/ballast
D=$(t_tmpdir)
PY=/usr/bin/python3

[ -x "$B" ] || { t_fail "ballast binary" "missing $B; run make"; t_done; exit 1; }

# ---- synth ----
out=$("$B" data synth --out "$D/c.bin" --tokens 300000 --vocab 128 --seed 7 --branching 5 2>&1)
if [ $? -eq 0 ] && echo "$out" | grep -Eq 'entropy: [0-9.]+ nats/token \([0-9.]+ bits/token\)'; then
    t_ok "synth prints the entropy in nats and bits"
else
    t_fail "synth prints the entropy in nats and bits" "$out"
fi
if [ -f "$D/c.bin.json" ] && grep -q '"entropy_nats"' "$D/c.bin.json"; then t_ok "synth writes FILE.json"
else t_fail "synth writes FILE.json" "missing or lacks entropy_nats"; fi
size=$(stat -c %s "$D/c.bin")
if [ "$size" -eq $((1024 + 2 * 300000)) ]; then t_ok "synth shard size (v1)"; else t_fail "synth shard size (v1)" "$size bytes"; fi

# Header words and the printed vs sidecar entropy, read independently.
hdr=$(od -An -t d4 -N 12 "$D/c.bin" | tr -s ' ' | sed 's/^ //')
if [ "$hdr" = "20240520 1 300000" ]; then t_ok "synth header"; else t_fail "synth header" "got '$hdr'"; fi
printed=$(echo "$out" | sed -nE 's/.*entropy: ([0-9.]+) nats.*/\1/p')
side=$(sed -nE 's/.*"entropy_nats": ([0-9.e+-]+).*/\1/p' "$D/c.bin.json")
if awk -v a="$printed" -v b="$side" 'BEGIN { exit !(a > 0 && (a - b < 1e-6) && (b - a < 1e-6)) }'; then
    t_ok "printed entropy equals the sidecar's"
else
    t_fail "printed entropy equals the sidecar's" "$printed vs $side"
fi
# Same seed, same bytes; another seed, other bytes.
"$B" data synth --out "$D/c2.bin" --tokens 300000 --vocab 128 --seed 7 --branching 5 >/dev/null 2>&1
"$B" data synth --out "$D/c3.bin" --tokens 300000 --vocab 128 --seed 8 --branching 5 >/dev/null 2>&1
t_check "synth is deterministic" cmp -s "$D/c.bin" "$D/c2.bin"
if cmp -s "$D/c.bin" "$D/c3.bin"; then t_fail "seed changes the corpus" "identical"; else t_ok "seed changes the corpus"; fi

# ---- info ----
out=$("$B" data info "$D/c.bin" 2>&1)
if echo "$out" | grep -q "version 1" && echo "$out" | grep -q "300000 tokens" && echo "$out" | grep -Eq "ids 0\.\.127"; then
    t_ok "info text"
else
    t_fail "info text" "$out"
fi
js=$("$B" data info --json "$D/c.bin" 2>&1)
if [ -x "$PY" ]; then
    if echo "$js" | "$PY" -c '
import json, sys, math
o = json.loads(sys.stdin.readline())
raw = open(sys.argv[1], "rb").read()
import struct
toks = struct.unpack("<%dH" % ((len(raw) - 1024) // 2), raw[1024:])
cnt = {}
for t in toks: cnt[t] = cnt.get(t, 0) + 1
h = -sum(c / len(toks) * math.log(c / len(toks)) for c in cnt.values())
assert o["version"] == 1 and o["tokens"] == 300000 == len(toks), o
assert o["min_id"] == min(toks) and o["max_id"] == max(toks), o
assert o["file_bytes"] == len(raw), o
assert abs(o["unigram_entropy_nats"] - h) < 1e-9, (o, h)
' "$D/c.bin" 2>&1; then t_ok "info --json matches an independent count"
    else t_fail "info --json matches an independent count" "$js"; fi
else
    t_skip "info --json matches an independent count" "no /usr/bin/python3"
fi

# ---- pack ----
# Raw u16 and u32 tokens written with printf from known values.
vals="3 1 4 1 5 9 2 6 5 3 5 8 9 7 9 3 2 3 8 4 6 2 6 4 3 3 8 3 2 7 9 5 65535"
: > "$D/raw16"; : > "$D/raw32"
for v in $vals; do
    printf "$(printf '\\x%02x\\x%02x' $((v & 255)) $((v >> 8)))" >> "$D/raw16"
    printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((v & 255)) $(((v >> 8) & 255)) 0 0)" >> "$D/raw32"
done
t_check "pack u16" "$B" data pack --in "$D/raw16" --dtype u16 --out "$D/p16.bin"
t_check "pack u32" "$B" data pack --in "$D/raw32" --dtype u32 --out "$D/p32.bin"
n=$(echo $vals | wc -w)
hdr16=$(od -An -t d4 -N 12 "$D/p16.bin" | tr -s ' ' | sed 's/^ //')
hdr32=$(od -An -t d4 -N 12 "$D/p32.bin" | tr -s ' ' | sed 's/^ //')
body16=$(tail -c +1025 "$D/p16.bin" | od -An -t u2 -v | tr -s ' \n' ' ' | sed 's/^ //;s/ $//')
body32=$(tail -c +1025 "$D/p32.bin" | od -An -t u4 -v | tr -s ' \n' ' ' | sed 's/^ //;s/ $//')
if [ "$hdr16" = "20240520 1 $n" ] && [ "$body16" = "$vals" ]; then t_ok "pack u16 bytes"; else t_fail "pack u16 bytes" "$hdr16 / $body16"; fi
if [ "$hdr32" = "20240520 2 $n" ] && [ "$body32" = "$vals" ]; then t_ok "pack u32 bytes"; else t_fail "pack u32 bytes" "$hdr32 / $body32"; fi
# A glob of both versions reads as one stream.
cp "$D/p16.bin" "$D/mix_a.bin"; cp "$D/p32.bin" "$D/mix_b.bin"
out=$("$B" data info "$D/mix_*.bin" 2>&1)
if [ "$(echo "$out" | grep -c "$n tokens")" -eq 2 ]; then t_ok "info on a glob of v1+v2"; else t_fail "info on a glob of v1+v2" "$out"; fi

# ---- bad input ----
t_expect_fail "pack: odd-sized u16 file" "raw16odd.*not a multiple of the 2-byte" \
    bash -c "head -c 7 '$D/raw16' > '$D/raw16odd'; '$B' data pack --in '$D/raw16odd' --dtype u16 --out '$D/x.bin'"
t_expect_fail "pack: u32 size not multiple of 4" "raw16.*not a multiple of the 4-byte" \
    bash -c "head -c 66 '$D/raw16' > '$D/raw16'.b && mv '$D/raw16'.b '$D/raw16'; '$B' data pack --in '$D/raw16' --dtype u32 --out '$D/x.bin'"
t_expect_fail "pack: id >= --vocab" "token 32 has id 65535.*vocab" "$B" data pack --in "$D/raw32" --dtype u32 --out "$D/x.bin" --vocab 1000
t_expect_fail "pack: bad --dtype" "dtype" "$B" data pack --in "$D/raw32" --dtype u8 --out "$D/x.bin"
t_expect_fail "pack: missing --in" "--in RAW and --out FILE are required" "$B" data pack --out "$D/x.bin"
t_expect_fail "pack: nonexistent input" "nope.raw.*No such file" "$B" data pack --in "$D/nope.raw" --dtype u16 --out "$D/x.bin"
[ -e "$D/x.bin" ] && t_fail "failed pack leaves no output" "x.bin exists" || t_ok "failed pack leaves no output"

head -c 4000 "$D/c.bin" > "$D/trunc.bin"
t_expect_fail "info: truncated shard" "trunc.bin: truncated" "$B" data info "$D/trunc.bin"
{ printf '\x01\x02\x03\x04'; tail -c +5 "$D/p16.bin"; } > "$D/magic.bin"
t_expect_fail "info: wrong magic" "magic.bin: wrong magic" "$B" data info "$D/magic.bin"
{ head -c 4 "$D/p16.bin"; printf '\x07\x00\x00\x00'; tail -c +9 "$D/p16.bin"; } > "$D/ver.bin"
t_expect_fail "info: unknown version" "ver.bin: unknown shard version 7" "$B" data info "$D/ver.bin"
{ cat "$D/p16.bin"; printf 'xx'; } > "$D/trail.bin"
t_expect_fail "info: trailing bytes" "trail.bin: 2 trailing bytes" "$B" data info "$D/trail.bin"
head -c 100 "$D/p16.bin" > "$D/short.bin"
t_expect_fail "info: shorter than header" "short.bin: file is 100 bytes, shorter than" "$B" data info "$D/short.bin"
t_expect_fail "info: no such file" "missing.bin: .*No such file" "$B" data info "$D/missing.bin"
t_expect_fail "info: glob matching nothing" "no file matches" "$B" data info "$D/none_*.bin"
t_expect_fail "info: id >= --vocab" "c.bin: token [0-9]+ has id [0-9]+ >= vocab size 100" "$B" data info --vocab 100 "$D/c.bin"
t_check "info: --vocab large enough" "$B" data info --vocab 128 "$D/c.bin"
t_expect_fail "info: no argument" "name at least one shard" "$B" data info

t_expect_fail "synth: missing --out" "--out FILE is required" "$B" data synth --tokens 10
t_expect_fail "synth: vocab too small" "vocab" "$B" data synth --out "$D/s.bin" --vocab 2
t_expect_fail "synth: branching > vocab" "branching" "$B" data synth --out "$D/s.bin" --vocab 8 --branching 9
t_expect_fail "synth: bad --tokens" "tokens" "$B" data synth --out "$D/s.bin" --tokens abc
t_expect_fail "unknown subcommand" "unknown subcommand 'frob'" "$B" data frob

# ---- help ----
out=$("$B" data --help 2>&1)
miss=""
for f in out tokens vocab seed branching in dtype json; do echo "$out" | grep -q -- "--$f" || miss="$miss --$f"; done
if [ -z "$miss" ]; then t_ok "data --help lists every flag"; else t_fail "data --help lists every flag" "missing$miss"; fi

t_done
