#!/usr/bin/env bash
# jsonlog.sh: tests/jsonlog.py, the reader of --log-json files the other
# scripts use (jl_get, jl_count, jl_raw in tests/lib.sh), on a log written
# here: a settings and a layout record, then steps with random losses
# printed with 17 digits as the worker does (and one step logged again, as
# a resumed run appends it). Values come back as written; the selections
# pick what they say; a last line cut short is ignored; a bad line in the
# middle, a missing field and a bad option fail naming the problem; the
# module's by_step keeps a re-logged step's last record.
source "$(dirname "$0")/../lib.sh"
D=$(t_tmpdir)
L=$D/run.jsonl
SEED=$(( $$ % 100000 + 1 ))
"$T_PY" - "$L" "$SEED" <<'EOF'
import random, sys
r = random.Random(int(sys.argv[2]))
with open(sys.argv[1], "w") as f:
    f.write('{"kind": "settings", "settings": {"steps": "6", "lr": "0.003"}, "model": "tiny", "params": 125248, "mfu_peak": null}\n')
    f.write('{"kind": "layout", "world": 2, "replicas": 1, "shard_degree": 2, "state_bytes_per_rank": 1001088}\n')
    for s in [1, 2, 3, 4, 3, 4, 5, 6]:  # steps 3 and 4 logged again (a resume from step 2)
        f.write('{"step": %d, "loss": %.17g, "lr": %.17g, "grad_norm": %.17g, "mfu": null, "skipped": %s}\n'
                % (s, r.uniform(2, 6), 3e-3 / s, r.uniform(0.1, 9), "true" if s == 5 else "false"))
EOF
# same NAME GOT WANT: passes when the two texts are equal
same() { if [ "$2" = "$3" ]; then t_ok "$1"; else t_fail "$1" "got '$2', want '$3'"; fi; }
line() { tr '\n' ' ' | sed 's/ $//'; }  # the lines of stdin on one line
# what grep and sed read off the lines, to compare against
want_fields=$(grep '^{"step"' "$L" | sed -E 's/.*"step": ([0-9]+), "loss": ([^,]+), "lr": ([^,]+), "grad_norm": ([^,]+),.*/\1 \2 \3 \4/')
same "step fields print as logged (17 digits, seed $SEED)" "$(jl_get "$L" step loss lr grad_norm)" "$want_fields"
same "--count: 8 step records, 1 settings record" "$(jl_count "$L") $(jl_count "$L" --kind settings)" "8 1"
same "--kind settings: strings bare, integers and null as written" \
    "$(jl_get "$L" --kind settings model params mfu_peak)" "tiny 125248 null"
same "--kind layout: a field of the layout record" "$(jl_get "$L" --kind layout state_bytes_per_rank)" 1001088
same "--step 4: both records of a re-logged step" "$(jl_get "$L" --step 4 loss | line)" \
    "$(grep '"step": 4,' "$L" | sed -E 's/.*"loss": ([^,]+),.*/\1/' | line)"
same "--from 5, --first 2, --last 3 select those step records" \
    "$(jl_get "$L" --from 5 step | line)|$(jl_get "$L" --first 2 step | line)|$(jl_get "$L" --last 3 step | line)" "5 6|1 2|4 5 6"
same "booleans print as true/false" "$(jl_get "$L" --step 5 skipped)|$(jl_get "$L" --step 6 skipped)" "true|false"
if cmp -s <(head -4 "$L") <(jl_raw "$L" --upto 2); then t_ok "--raw --upto 2: the log's first 4 lines, byte for byte"
else t_fail "--raw --upto 2" "$(diff <(head -4 "$L") <(jl_raw "$L" --upto 2) | head -4)"; fi
if cmp -s <(tail -2 "$L") <(jl_raw "$L" --last 2); then t_ok "--raw --last 2: the last 2 lines, byte for byte"
else t_fail "--raw --last 2" "$(diff <(tail -2 "$L") <(jl_raw "$L" --last 2) | head -4)"; fi
# a record being written (no newline, not JSON yet) is ignored
cp "$L" "$D/live.jsonl"
printf '{"step": 7, "loss": 2.1' >> "$D/live.jsonl"
same "a last line cut short is ignored (a record being written)" \
    "$(jl_count "$D/live.jsonl") $(jl_get "$D/live.jsonl" --last 1 step)" "8 6"
# a bad line elsewhere is an error naming the file and the line
{ head -3 "$L"; echo 'step 3 loss 2.5'; tail -n +4 "$L"; } > "$D/bad.jsonl"
t_expect_fail "a bad line in the middle fails with the file and line number" "bad.jsonl:4: not a JSON record" \
    jl_count "$D/bad.jsonl"
t_expect_fail "a missing field fails naming the step and the field" "step 1 has no field tokens" \
    jl_get "$L" loss tokens
t_expect_fail "a bad option fails with the usage" "unknown option --steps.*usage" jl_get "$L" --steps 3 loss
t_check "module: by_step keeps a re-logged step's last record; values, steps, first" "$T_PY" - "$L" <<'EOF'
import sys
import jsonlog
p = sys.argv[1]
st = jsonlog.steps(p)
assert [r["step"] for r in st] == [1, 2, 3, 4, 3, 4, 5, 6], [r["step"] for r in st]
d = jsonlog.by_step(p, "loss")
assert sorted(d) == [1, 2, 3, 4, 5, 6] and d[3] == st[4]["loss"] and d[4] == st[5]["loss"], d
assert jsonlog.values(p, "loss") == [r["loss"] for r in st]
assert jsonlog.first(p, "layout")["world"] == 2 and jsonlog.first(p, "nothing") is None
assert jsonlog.records(p)[0]["kind"] == "settings" and len(jsonlog.records(p)) == 10
EOF
t_done
