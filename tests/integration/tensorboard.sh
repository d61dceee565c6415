#!/usr/bin/env bash
# tensorboard.sh: --tensorboard-dir of a real ballast-worker run, read back
# independently: Debian's python3-protobuf decodes the events against
# proto/tensorboard/*.proto compiled here with protoc, and a bit-at-a-time
# crc32c written in the test checks both masked checksums of every record.
#   - a finished run: the file-version record, then one event per step whose
#     scalars are the JSON log's fields of that step, as floats;
#   - a run killed with SIGKILL mid-training: every record in the file is
#     whole and valid, one per step the JSON log shows;
#   - a bad --tensorboard-dir names the directory and the fix.
# Skipped (with the reason) without protoc or python3-protobuf.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
W=$BIN/ballast-worker
B=$BIN/ballast
[ -x "$W" ] || { t_fail "ballast-worker built" "missing $W"; t_done; exit 1; }
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
D=$(t_tmpdir)

if ! command -v protoc >/dev/null; then
    t_skip "TensorBoard event files read back" "protoc is not installed (Debian's protobuf-compiler; make deps)"; t_done; exit 0
fi
if ! $PY -c 'import google.protobuf' 2>/dev/null; then
    t_skip "TensorBoard event files read back" "python3-protobuf is not installed (make deps)"; t_done; exit 0
fi
mkdir -p "$D/py"
if ! out=$(protoc -I "$ROOT/proto" --python_out="$D/py" "$ROOT/proto/tensorboard/summary.proto" "$ROOT/proto/tensorboard/event.proto" 2>&1); then
    t_fail "protoc compiles proto/tensorboard" "$out"; t_done; exit 1
fi
"$B" data synth --out "$D/c.bin" --tokens 40000 --vocab 256 --seed 11 >/dev/null 2>&1 ||
    { t_fail "synth corpus" "ballast data synth failed"; t_done; exit 1; }
COMMON=(--model tiny --data "$D/c.bin" --micro-batch 4 --seq-len 32 --lr 3e-3 --threads 2 --log-every 100)

READ=$(cat <<'PYEOF'
# usage: EVENTFILE JSONLOG complete|killed
import json, math, os, struct, sys
sys.path.insert(0, os.environ["TB_PY"])
from tensorboard import event_pb2
path, log, mode = sys.argv[1:4]
def crc32c(data):                                   # bit at a time, from the definition
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF
def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
buf, off, events = open(path, "rb").read(), 0, []
while off < len(buf):
    assert off + 12 <= len(buf), "a record header cut short at byte %d" % off
    n, = struct.unpack_from("<Q", buf, off)
    hcrc, = struct.unpack_from("<I", buf, off + 8)
    assert hcrc == masked(buf[off:off + 8]), "record at %d: length crc 0x%08x, want 0x%08x" % (off, hcrc, masked(buf[off:off + 8]))
    data = buf[off + 12:off + 12 + n]
    assert len(data) == n and off + 16 + n <= len(buf), "record at %d cut short" % off
    dcrc, = struct.unpack_from("<I", buf, off + 12 + n)
    assert dcrc == masked(data), "record at %d: data crc 0x%08x, want 0x%08x" % (off, dcrc, masked(data))
    ev = event_pb2.Event(); ev.ParseFromString(data); events.append(ev)
    off += 16 + n
assert events and events[0].WhichOneof("what") == "file_version" and events[0].file_version == "brain.Event:2", events[:1]
TAGS = {"train/loss": "loss", "val/loss": "val_loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
        "perf/tokens_per_s": "tokens_per_s", "perf/tokens_per_s_per_gpu": "tokens_per_s_per_gpu", "perf/mfu": "mfu",
        "perf/step_s": "step_s", "offload/to_host_bytes": "offload_to_host_bytes",
        "offload/to_device_bytes": "offload_to_device_bytes", "offload/wait_s": "offload_wait_s"}
steps = [json.loads(l) for l in open(log) if l.strip().startswith('{"step"') and l.endswith("\n")]
f32 = lambda v: struct.unpack("<f", struct.pack("<f", v))[0]
summ = events[1:]
if mode == "killed":   # the log and the events are written one after the other: one may be a step ahead
    assert len(steps) - 1 <= len(summ) <= len(steps) + 1, (len(summ), len(steps))
    summ = summ[:len(steps)]; steps = steps[:len(summ)]
assert len(summ) == len(steps), "%d step events for %d logged steps" % (len(summ), len(steps))
nval = 0
t0 = os.stat(log).st_mtime
for ev, r in zip(summ, steps):
    assert ev.WhichOneof("what") == "summary" and ev.step == r["step"], (ev.step, r["step"])
    assert abs(ev.wall_time - t0) < 3600, ev.wall_time
    got = {v.tag: v.simple_value for v in ev.summary.value}
    want = {t: f32(r[f]) for t, f in TAGS.items() if isinstance(r.get(f), (int, float)) and math.isfinite(r[f])}
    assert set(got) == set(want), "step %d: tags %s, want %s" % (r["step"], sorted(got), sorted(want))
    for t in want:
        assert got[t] == want[t], "step %d %s: %r, logged %r" % (r["step"], t, got[t], r[TAGS[t]])
        nval += 1
print("%d records, %d step events, %d scalars equal to the JSON log" % (len(events), len(summ), nval))
PYEOF
)
export TB_PY="$D/py"

# ---- a finished run ----
if out=$("$W" "${COMMON[@]}" --steps 8 --val-data "$D/c.bin" --eval-every 4 --log-json "$D/run.jsonl" \
        --tensorboard-dir "$D/tb" 2>&1); then
    t_ok "worker run with --tensorboard-dir"
else
    t_fail "worker run with --tensorboard-dir" "$(echo "$out" | tail -3)"
fi
EV=$(ls "$D"/tb/events.out.tfevents.* 2>/dev/null)
t_check "one event file, named events.out.tfevents.TIME.HOST.PID" test "$(echo "$EV" | grep -c .)" = 1
t_check "the worker names the file" bash -c "echo '$out' | grep -qF 'TensorBoard events: $EV'"
if res=$($PY -c "$READ" "$EV" "$D/run.jsonl" complete 2>&1); then t_ok "every crc valid, scalars = the JSON log ($res)"
else t_fail "every crc valid, scalars = the JSON log" "$res"; fi
t_check "validation loss written at the evaluation steps" $PY - "$EV" <<'PYEOF'
import os, sys
sys.path.insert(0, os.environ["TB_PY"])
from tensorboard import event_pb2
import struct
buf, off, val = open(sys.argv[1], "rb").read(), 0, []
while off < len(buf):
    n, = struct.unpack_from("<Q", buf, off)
    ev = event_pb2.Event(); ev.ParseFromString(buf[off + 12:off + 12 + n]); off += 16 + n
    val += [ev.step for v in ev.summary.value if v.tag == "val/loss"]
assert val == [4, 8], val
PYEOF

# ---- killed mid-run ----
"$W" "${COMMON[@]}" --steps 1000000 --lr-schedule constant --log-json "$D/long.jsonl" --tensorboard-dir "$D/tbk" \
    > "$D/long.out" 2>&1 &
LPID=$!
for _ in $(seq 1 600); do n=$(grep -c '^{"step"' "$D/long.jsonl" 2>/dev/null); [ "${n:-0}" -ge 6 ] && break; sleep 0.1; done
kill -KILL $LPID 2>/dev/null; wait $LPID 2>/dev/null
EVK=$(ls "$D"/tbk/events.out.tfevents.* 2>/dev/null | head -1)
if [ -n "$EVK" ] && res=$($PY -c "$READ" "$EVK" "$D/long.jsonl" killed 2>&1); then
    t_ok "after SIGKILL every record is whole and valid ($res)"
else
    t_fail "after SIGKILL every record is whole and valid" "${res:-no event file} $(tail -3 "$D/long.out")"
fi

# ---- bad directories ----
touch "$D/afile"
t_expect_fail "a file as --tensorboard-dir is refused" "--tensorboard-dir $D/afile: not a directory" \
    "$W" "${COMMON[@]}" --steps 1 --tensorboard-dir "$D/afile"
t_expect_fail "a missing parent is named" "--tensorboard-dir $D/no/such: cannot create it: No such file or directory" \
    "$W" "${COMMON[@]}" --steps 1 --tensorboard-dir "$D/no/such"
t_done
