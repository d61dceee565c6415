#!/usr/bin/env bash
# gpu_dryrun.sh: what prepares a GPU call, without a GPU.
#
# - tests/gpu/run.sh --dry-run gathers the bundle (.deb: jansson's Debian
#   packages, the carried programs' shared libraries), builds run.sh's
#   programs the way the GPU machine will (gcc; the .cu objects of the
#   Makefile build instead of nvcc) and checks every carried and built
#   program's libraries and the size of what travels: it passes on this
#   checkout without compiling anything with nvcc (a wrapper records every
#   nvcc call: only --version and --dryrun are allowed), with BUILD relative
#   and absolute, and names the carry list.
# - It fails, one line per problem, on a planted glibc / gcc runtime library
#   in the bundle (libstdc++, and librt with its GLIBC_PRIVATE symbols), on
#   a bundle over the device tool's 64 MiB, on a library missing from the
#   bundle, and on programs that would load a Debian library from the
#   system (libuuid) or carry a DT_RPATH; without network (apt-get failing, no
#   packages in the bundle) it says SKIP and exits 77.
# - run.sh exports no LD_LIBRARY_PATH (only our programs get one).
# - With $OUT, run.sh leaves its results there after every step, as at most
#   8 files (one archive of the logs): a run killed with SIGKILL mid-way
#   still left the records and logs of the steps it finished.
# - GPU_BENCH_DRYRUN with an absolute BUILD finds the Makefile build.
source "$(dirname "$0")/../lib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
RUN=$ROOT/tests/gpu/run.sh
BUNDLE_SH=$ROOT/tests/gpu/bundle.sh
D=$(t_tmpdir)
cd "$ROOT"

t_check "bundle.sh parses (bash -n)" bash -n "$BUNDLE_SH"
t_check "run.sh parses (bash -n)" bash -n "$RUN"
if grep -nE '^[^#]*export +LD_LIBRARY_PATH' "$RUN" "$ROOT/tests/gpu/bench_lib.sh" "$ROOT/tests/gpu/ranks.sh" > "$D/export.txt"; then
    t_fail "run.sh, bench_lib.sh and ranks.sh export no LD_LIBRARY_PATH (it is set per command, for our programs)" "$(cat "$D/export.txt")"
else
    t_ok "run.sh, bench_lib.sh and ranks.sh export no LD_LIBRARY_PATH (it is set per command, for our programs)"
fi
if [ ! -x "$BIN/ballast-worker" ] || [ ! -x "$BIN/ballastd" ]; then
    t_fail "binaries built" "missing $BIN/ballast-worker or ballastd"; t_done; exit 1
fi
if [ -n "${BALLAST_SAN:-}" ]; then
    # make asan / make tsan build with CUDA=0: there are no CUDA objects of
    # the Makefile build for the dry run to link, and a GPU call carries the
    # plain build, not this one
    t_skip "the dry run of a GPU call" "sanitizer build ($BALLAST_SAN, CUDA=0): no CUDA objects to link; make test runs it"
    t_done; exit 0
fi

# ---- without network: SKIP, exit 77 ----
mkdir -p "$D/noapt/bin"
printf '#!/bin/sh\necho "E: Failed to fetch http://deb.debian.org/ (no network)" >&2\nexit 100\n' > "$D/noapt/bin/apt-get"
chmod +x "$D/noapt/bin/apt-get"
out=$(PATH="$D/noapt/bin:$PATH" "$BUNDLE_SH" --dir "$D/noapt/bundle" 2>&1); rc=$?
if [ $rc -eq 77 ] && echo "$out" | grep -q '^SKIP: apt-get download libjansson-dev failed (no network'; then
    t_ok "no network: bundle.sh says SKIP and exits 77"
else t_fail "no network: bundle.sh says SKIP and exits 77" "exit $rc: $out"; fi

# ---- the dry run on this checkout ----
# a toolkit tree whose nvcc records its calls (run.sh finds the libraries
# beside nvcc, so the rest of the tree links to the real one)
real_nvcc=$(readlink -f "$(command -v "${NVCC:-/usr/local/cuda/bin/nvcc}" 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")
real_cuda=$(dirname "$(dirname "$real_nvcc")")
mkdir -p "$D/cuda/bin"
for e in "$real_cuda"/*; do [ "$(basename "$e")" = bin ] || ln -s "$e" "$D/cuda/"; done
for e in "$real_cuda"/bin/*; do [ "$(basename "$e")" = nvcc ] || ln -s "$e" "$D/cuda/bin/"; done
printf '#!/bin/sh\necho "$*" >> "%s"\nexec "%s" "$@"\n' "$D/nvcc-calls.txt" "$real_nvcc" > "$D/cuda/bin/nvcc"
chmod +x "$D/cuda/bin/nvcc"; : > "$D/nvcc-calls.txt"
t0=$(date +%s)
NVCC="$D/cuda/bin/nvcc" GPU_BUILD="$D/gpu" "$RUN" --dry-run > "$D/dry.out" 2>&1; rc=$?
secs=$(( $(date +%s) - t0 ))
if [ $rc -eq 77 ]; then
    t_skip "run.sh --dry-run" "$(grep -m1 '^SKIP' "$D/dry.out")"
    t_done; exit 0
fi
carry=$(sed -n 's/^bundle: carry: //p' "$D/dry.out")
if [ $rc -eq 0 ] && grep -q '^bundle: ok' "$D/dry.out" && [ "$carry" = '[".deb", "build/bin", "build/tests/gpu/check_pool"]' ] &&
   ! grep -q '^PROBLEM' "$D/dry.out"; then
    t_ok "run.sh --dry-run passes on this checkout in ${secs}s, carry $carry"
else
    t_fail "run.sh --dry-run passes on this checkout" "exit $rc, carry '$carry': $(grep -E '^PROBLEM|FAILED|failed' "$D/dry.out" | head -5; tail -3 "$D/dry.out")"
fi
compiles=$(grep -vE -- '(^| )--version( |$)|(^| )--dryrun( |$)' "$D/nvcc-calls.txt" | head -3)
if [ -s "$D/nvcc-calls.txt" ] && [ -z "$compiles" ]; then
    t_ok "the dry run compiles nothing with nvcc ($(wc -l < "$D/nvcc-calls.txt") calls, --version/--dryrun only)"
else t_fail "the dry run compiles nothing with nvcc" "calls: ${compiles:-none recorded (the wrapper was not used)}"; fi
built=$(sed -n 's/.*built: //p' "$D/dry.out")
missing=""
for src in tests/gpu/check_*.c; do n=$(basename "$src" .c); [ -x "$D/gpu/bin/$n" ] || missing="$missing $n"; done
[ -x "$D/gpu/bin/gpu_train" ] || missing="$missing gpu_train"
if [ -z "$missing" ] && grep -q "jansson: .*\.deb/root/.*libjansson.a (static)" "$D/dry.out"; then
    t_ok "the dry run links every check program and gpu_train, jansson from the bundle"
else t_fail "the dry run links every check program and gpu_train, jansson from the bundle" "missing:$missing; built: $built"; fi
if grep -q 'libjansson.so' <(ldd "$D/gpu/bin/gpu_train" 2>&1); then
    t_fail "gpu_train has no run-time jansson dependency" "$(ldd "$D/gpu/bin/gpu_train" | grep jansson)"
else t_ok "gpu_train has no run-time jansson dependency (static from the bundle)"; fi
if [ -f .deb/MANIFEST ] && grep -q '^pkgs/libjansson-dev_.*libjansson-dev' .deb/MANIFEST && grep -q '^lib/libgrpc.so.29  libgrpc29 ' .deb/MANIFEST; then
    t_ok "the bundle's MANIFEST names each file's Debian package and version"
else t_fail "the bundle's MANIFEST names each file's Debian package and version" "$(head -5 .deb/MANIFEST 2>&1)"; fi
out=$(BUILD="$ROOT/$BUILD" GPU_BUILD="$D/gpu-abs" "$RUN" --dry-run 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -qF "bundle: carry: $carry"; then
    t_ok "run.sh --dry-run with an absolute BUILD: the same carry list"
else t_fail "run.sh --dry-run with an absolute BUILD" "exit $rc: $(echo "$out" | grep -E '^PROBLEM|carry' | head -5)"; fi

# ---- planted problems, each caught with one line ----
cp -a .deb "$D/planted"
STDCXX=$(ldd "$BIN/ballast-worker" | awk '$1 == "libstdc++.so.6" { print $3 }')
LIBRT=$(ldconfig -p | awk '$1 == "librt.so.1" && /x86-64/ { print $NF; exit }')
cp -L "$STDCXX" "$D/planted/lib/"
[ -n "$LIBRT" ] && cp -L "$LIBRT" "$D/planted/lib/"
GPU_BUILD="$D/gpu-planted" GPU_BUNDLE="$D/planted" "$RUN" --dry-run > "$D/planted.out" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "^PROBLEM: .*planted/lib/libstdc++.so.6: glibc / gcc runtime library in the bundle" "$D/planted.out"; then
    t_ok "a planted libstdc++ in the bundle fails the dry run"
else t_fail "a planted libstdc++ in the bundle fails the dry run" "exit $rc: $(grep -E '^PROBLEM|^bundle' "$D/planted.out" | head -5)"; fi
if [ -z "$LIBRT" ]; then t_skip "a planted librt" "no librt.so.1 in ldconfig's cache"
elif grep -q "^PROBLEM: .*planted/lib/librt.so.1 references GLIBC_PRIVATE" "$D/planted.out"; then
    t_ok "a planted librt.so.1 is named for its GLIBC_PRIVATE symbols"
else t_fail "a planted librt.so.1 is named for its GLIBC_PRIVATE symbols" "$(grep -E '^PROBLEM' "$D/planted.out" | head -5)"; fi
rm -f "$D/planted/lib/libstdc++.so.6" "$D/planted/lib/librt.so.1"
t_check "the same bundle without the planted libraries passes bundle.sh --check-only" "$BUNDLE_SH" --dir "$D/planted" --check-only

truncate -s 70M "$D/planted/core.big"
t_expect_fail "a bundle over the device tool's 64 MiB fails" \
    "^PROBLEM: working tree .* over the device tool's limit of 64.0 MiB: carry less \(largest: .*core.big 70.0 MiB" \
    "$BUNDLE_SH" --dir "$D/planted" --check-only
rm -f "$D/planted/core.big"

mv "$D/planted/lib/libgrpc.so.29" "$D/libgrpc.so.29"
t_expect_fail "a library missing from the bundle is named for each program that loads it" \
    "^PROBLEM: .*bin/ballastd loads libgrpc.so.29 from /.*: the GPU machine has none of our Debian packages" \
    "$BUNDLE_SH" --dir "$D/planted" --check-only
mv "$D/libgrpc.so.29" "$D/planted/lib/"

# built programs: one that loads a Debian library the bundle lacks (libuuid), one with DT_RPATH
printf 'int main(void) { return 0; }\n' > "$D/p.c"
gcc -o "$D/needs_uuid" "$D/p.c" -Wl,--no-as-needed -luuid
gcc -o "$D/has_rpath" "$D/p.c" -Wl,--disable-new-dtags -Wl,-rpath,/usr/lib/x86_64-linux-gnu
out=$("$BUNDLE_SH" --dir "$D/planted" --check-only "$D/needs_uuid" "$D/has_rpath" 2>&1); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "^PROBLEM: .*needs_uuid loads libuuid.so.1 from /" &&
   echo "$out" | grep -q "^PROBLEM: .*has_rpath has DT_RPATH /usr/lib/x86_64-linux-gnu, which beats LD_LIBRARY_PATH" &&
   [ "$(echo "$out" | grep -c '^PROBLEM')" = 2 ]; then
    t_ok "a built program loading libuuid from the system, and one with DT_RPATH: one line each"
else t_fail "built programs with a system library and with DT_RPATH" "exit $rc: $(echo "$out" | grep -E '^PROBLEM|^bundle: [0-9]')"; fi

# ---- results in $OUT as they come, and after a SIGKILL ----
H200=(GPU_DEVICE_BYTES=$((143771 * 1048576)) GPU_HOST_BYTES=137438953472 GPU_DISK_BYTES=60000000000)
mkdir -p "$D/out"
env GPU_BENCH_DRYRUN=1 GPU_BUILD="$D/snap" GPU_BENCH_WORK="$D/snap/bench" GPU_BENCH_WARMUP=1 GPU_BENCH_TIMED=1 \
    OUT="$D/out" "${H200[@]}" setsid "$RUN" --bench ours,actoff > "$D/snap.out" 2>&1 &
pid=$!
for _ in $(seq 600); do
    tar tzf "$D/out/gpu-run.tar.gz" 2>/dev/null | grep -q '^log/act-off-7b.log$' && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.2
done
kill -KILL -- -$pid 2>/dev/null
wait $pid 2>/dev/null
# the killed ballastd's socket directory (bench_lib.sh makes one under /tmp
# per run and names it in the run's sockdir file at once: the worker's cmd
# file may not be written yet when the kill comes)
for s in $(cat "$D"/snap/bench/*/sockdir 2>/dev/null | grep -x '/tmp/ballast-gb\.[A-Za-z0-9]*' | sort -u); do rm -rf "$s"; done
files=$(find "$D/out" -type f | wc -l)
if tar tzf "$D/out/gpu-run.tar.gz" 2>/dev/null | grep -q '^log/act-off-7b.log$' &&
   grep -q '"kind": "worker_bench", "name": "act-off-7b"' "$D/out/results.jsonl" 2>/dev/null &&
   grep -q '"what":"ours-1b","ok":true' "$D/out/results.jsonl" && [ "$files" -le 8 ] &&
   ! find "$D/out" | sed "s|^$D/out/\{0,1\}||" | grep -q '[^A-Za-z0-9._/-]'; then
    t_ok "a run killed with SIGKILL after act-off-7b left its records and logs in \$OUT ($files files: $(ls "$D/out" | tr '\n' ' '))"
else
    t_fail "a run killed with SIGKILL left its records and logs in \$OUT" "$files files: $(ls "$D/out"); $(tar tzf "$D/out/gpu-run.tar.gz" 2>&1 | tr '\n' ' '); $(tail -3 "$D/snap.out")"
fi

# ---- GPU_BENCH_DRYRUN with an absolute BUILD ----
if [ -x "$ROOT/$BUILD/tests/gpu/gpu_train" ]; then
    env GPU_BENCH_DRYRUN=1 BUILD="$ROOT/$BUILD" GPU_BUILD="$D/abs" "$RUN" --bench ours > "$D/abs.out" 2>&1; rc=$?
    n=$(grep -c '"kind":"dryrun","what":"ours-[17]b","ok":true' "$D/abs/results.jsonl")
    if [ $rc -eq 0 ] && [ "$n" = 2 ]; then t_ok "GPU_BENCH_DRYRUN with an absolute BUILD finds the Makefile build's gpu_train"
    else t_fail "GPU_BENCH_DRYRUN with an absolute BUILD" "exit $rc, $n of 2: $(tail -3 "$D/abs.out")"; fi
else
    t_skip "GPU_BENCH_DRYRUN with an absolute BUILD" "no $BUILD/tests/gpu/gpu_train (CUDA parts not built)"
fi
t_done
