#!/usr/bin/env bash
# tests/gpu/bundle.sh: what a GPU machine needs beside the working tree, in
# one directory that the device tool carries (`run`'s carry), and the check
# that it will load there. The GPU machine has nvcc, the CUDA libraries,
# PyTorch's pip packages and its own glibc and gcc runtime, and none of our
# Debian packages.
#
#   tests/gpu/bundle.sh [--dir DIR] [--gather-only|--check-only] [--clean] [BINARY...]
#       --dir DIR     the bundle (GPU_BUNDLE, default .deb)
#       --gather-only gather, check nothing
#       --check-only  gather nothing, only check what is there
#       --clean       empty DIR/lib first (gathering only adds to it)
#       BINARY...     more programs to check (run.sh --dry-run passes the
#                     programs it built the way the GPU machine will)
#
# Gathers into DIR:
#   pkgs/   `apt-get download` of the Debian packages the GPU build needs
#           (GPU_BUNDLE_PKGS, default libjansson-dev libjansson4: run.sh
#           links jansson statically from them); kept when already there
#   root/   those packages unpacked (dpkg -x)
#   lib/    the shared libraries that the Makefile build's carried programs
#           ($BUILD/bin/*, $BUILD/tests/gpu/check_pool) load, copied from
#           this machine under their sonames: every one outside glibc, the
#           gcc runtime and CUDA, which the GPU machine has of its own
#           (a Debian librt.so.1 there needs GLIBC_PRIVATE symbols of
#           Debian's glibc)
#   MANIFEST  each file with its Debian package and version, and the carry list
#
# Then checks, printing one "PROBLEM: ..." line per problem:
#   - the bundle holds no glibc, gcc runtime or CUDA library;
#   - no carried library references GLIBC_PRIVATE;
#   - every carried program and library, and every BINARY, resolves each
#     library it needs (ldd, with LD_LIBRARY_PATH set as run.sh sets it for
#     our programs: DIR/lib and the CUDA library directories) from DIR/lib,
#     the CUDA toolkit or pip wheels, or the system's glibc and gcc runtime,
#     and has no DT_RPATH (which would beat LD_LIBRARY_PATH) elsewhere;
#   - the working tree plus the carried paths fit the device tool's limit
#     (GPU_CARRY_LIMIT bytes, default 64 MiB).
# Last it prints the carry list. Exit 0 when nothing is wrong, 1 on any
# problem, 77 when the packages can be neither found in DIR/pkgs nor
# downloaded (no network, no package lists): nothing checked then.
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
DIR=${GPU_BUNDLE:-.deb}
CHECK_ONLY=0 GATHER_ONLY=0 CLEAN=0
EXTRA=()
while [ $# -gt 0 ]; do
    case $1 in
    --dir) [ $# -ge 2 ] || { echo "bundle.sh: --dir needs a directory" >&2; exit 2; }; DIR=$2; shift ;;
    --dir=*) DIR=${1#--dir=} ;;
    --check-only) CHECK_ONLY=1 ;;
    --gather-only) GATHER_ONLY=1 ;;
    --clean) CLEAN=1 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bundle.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    *) EXTRA+=("$1") ;;
    esac
    shift
done
PKGS=${GPU_BUNDLE_PKGS:-libjansson-dev libjansson4}
LIMIT=${GPU_CARRY_LIMIT:-67108864}
case $LIMIT in ''|*[!0-9]*) echo "bundle.sh: GPU_CARRY_LIMIT='$LIMIT': expected bytes" >&2; exit 2 ;; esac
MK_BUILD=${BUILD:-build}
case $MK_BUILD in /*) ;; *) MK_BUILD=$ROOT/$MK_BUILD ;; esac
case $DIR in /*) ;; *) DIR=$ROOT/$DIR ;; esac
say() { echo "bundle: $*"; }
NPROB=0
problem() { NPROB=$((NPROB + 1)); echo "PROBLEM: $*"; }
rel() { case $1 in "$ROOT"/*) echo "${1#"$ROOT"/}" ;; *) echo "$1" ;; esac; }

# ---- what the GPU machine has of its own ----
# glibc and the gcc runtime: never carried, always the machine's
SYSTEM_LIBS='^(libc|libm|libmvec|librt|libpthread|libdl|libresolv|libutil|libanl|libnsl|libBrokenLocale|libthread_db|libc_malloc_debug|libnss_[a-z0-9_]+|ld-linux-x86-64|ld-linux|libgcc_s|libstdc[+][+]|libgomp|libatomic|libquadmath)[.]so'
# CUDA's libraries: the toolkit's or PyTorch's pip wheels there, matching its driver
CUDA_LIBS='^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvrtc|libnvJitLink|libcudnn[a-z_]*|libcufft|libcurand|libcusparse|libcusolver|libnvidia-[a-z0-9_-]+)[.]so'
is_system() { basename "$1" | grep -Eq "$SYSTEM_LIBS"; }
is_cuda_name() { basename "$1" | grep -Eq "$CUDA_LIBS"; }

# the CUDA library directories, as run.sh finds them
NVCC_BIN=""
for c in "${NVCC:-}" "${CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc "$(command -v nvcc 2>/dev/null)"; do
    [ -n "$c" ] && [ -x "$c" ] && { NVCC_BIN=$c; break; }
done
CUDA_DIRS=()
if [ -n "$NVCC_BIN" ]; then
    cr=$(dirname "$(dirname "$NVCC_BIN")")
    for r in "$cr" "$(readlink -f "$cr")"; do
        for d in "$r/lib64" "$r/targets/x86_64-linux/lib" "$r/lib"; do [ -d "$d" ] && CUDA_DIRS+=("$d"); done
    done
fi
PY=${PYTHON:-python3}
while IFS= read -r d; do [ -n "$d" ] && CUDA_DIRS+=("$d"); done < <("$PY" - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "**", "lib"), recursive=True)):
        print(d)
EOF
)
# each CUDA directory as found and resolved, ':'-separated, for the classifier
CUDA_PREFIXES=""
for d in "${CUDA_DIRS[@]}"; do CUDA_PREFIXES="$CUDA_PREFIXES:$d:$(readlink -f "$d")"; done
in_cuda_dir() {   # PATH: under one of CUDA_DIRS
    local d
    for d in ${CUDA_PREFIXES//:/ }; do case $1 in "$d"/*) return 0 ;; esac; done
    return 1
}

# ldd_all FILE...: ldd of each, its lines after a "== FILE" line, with
# LD_LIBRARY_PATH as run.sh sets it for our programs when $LDP is set
ldd_all() {
    local f
    for f in "$@"; do echo "== $f"; env ${LDP:+LD_LIBRARY_PATH="$LDP"} ldd "$f" 2>&1; done
}
# classify MODE: reads ldd_all's output. MODE gather prints "name path" of
# each library to copy into the bundle; MODE check prints one PROBLEM line
# per library that would not come from the bundle, CUDA or the system's
# glibc / gcc runtime.
classify() {
    awk -v mode="$1" -v bundle="$DIR/lib/" -v cuda="$CUDA_PREFIXES" -v sysre="$SYSTEM_LIBS" -v cudare="$CUDA_LIBS" \
        -v root="$ROOT/" -v rdir="$(rel "$DIR")" '
        BEGIN { n = split(cuda, cd, ":") }
        function incuda(p,   i) { for (i = 1; i <= n; i++) if (cd[i] != "" && index(p, cd[i] "/") == 1) return 1; return 0 }
        function rel(p) { return index(p, root) == 1 ? substr(p, length(root) + 1) : p }
        /^== / { file = substr($0, 4); next }
        $2 != "=>" { next }
        {
            name = $1; path = $3
            if (mode == "gather") {
                if (path ~ /^\// && name !~ sysre && name !~ cudare && !incuda(path)) print name, path
                next
            }
            if (path == "not") {
                if (name ~ cudare) printf "PROBLEM: %s needs %s, not found here (the GPU machine has CUDA; no toolkit or wheel here to check against)\n", rel(file), name
                else printf "PROBLEM: %s needs %s, found nowhere: not in %s/lib, the CUDA toolkit or the system glibc (gather it: tests/gpu/bundle.sh)\n", rel(file), name, rdir
                next
            }
            if (index(path, bundle) == 1 || incuda(path) || name ~ sysre) next
            printf "PROBLEM: %s loads %s from %s: the GPU machine has none of our Debian packages; it must come from %s/lib (tests/gpu/bundle.sh gathers it)\n", rel(file), name, path, rdir
        }'
}
is_elf() { [ -f "$1" ] && [ "$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' \n')" = '177ELF' ]; }

# the Makefile build's programs that travel (tests/gpu/run.sh uses them
# for check_pool_ballastd, GPU ranks and the ballast-worker benchmarks)
CARRY_BUILD=()
[ -d "$MK_BUILD/bin" ] && CARRY_BUILD+=("$MK_BUILD/bin")
[ -x "$MK_BUILD/tests/gpu/check_pool" ] && CARRY_BUILD+=("$MK_BUILD/tests/gpu/check_pool")
carried_programs() {
    local p
    for p in "${CARRY_BUILD[@]}"; do
        if [ -d "$p" ]; then find "$p" -maxdepth 1 -type f -perm -u+x | sort; else echo "$p"; fi
    done
}

# ---- gather ----
if [ "$CHECK_ONLY" = 0 ]; then
    mkdir -p "$DIR/pkgs" "$DIR/root" "$DIR/lib" || { problem "cannot create $(rel "$DIR")"; exit 1; }
    [ "$CLEAN" = 1 ] && rm -f "$DIR"/lib/*
    for p in $PKGS; do
        if ls "$DIR/pkgs/${p}_"*.deb > /dev/null 2>&1; then continue; fi
        if ! command -v apt-get > /dev/null; then
            echo "SKIP: no apt-get here to download $p: gather the bundle on a Debian 12 machine"; exit 77
        fi
        if ! out=$(cd "$DIR/pkgs" && apt-get download "$p" 2>&1); then
            echo "SKIP: apt-get download $p failed (no network, or no package lists: apt-get update): $(echo "$out" | grep -E '^E:' | head -2 | tr '\n' ' ')"
            exit 77
        fi
    done
    if command -v dpkg > /dev/null; then
        for d in "$DIR"/pkgs/*.deb; do dpkg -x "$d" "$DIR/root" || problem "dpkg -x $(rel "$d") failed"; done
    else
        problem "no dpkg here to unpack $(rel "$DIR")/pkgs"
    fi
    # the carried programs' shared libraries, outside glibc, the gcc runtime and CUDA
    n=0
    while read -r name path; do
        cp -L "$path" "$DIR/lib/$name" && n=$((n + 1))
    done < <(mapfile -t progs < <(carried_programs); LDP="" ldd_all "${progs[@]}" | classify gather | sort -u)
    say "gathered $(ls "$DIR"/pkgs/*.deb 2>/dev/null | wc -l) packages into $(rel "$DIR")/pkgs (unpacked in root/), $n libraries of $(carried_programs | wc -l) carried programs into $(rel "$DIR")/lib"
    # MANIFEST: every file, its package and version
    {
        echo "# $(rel "$DIR"): gathered by tests/gpu/bundle.sh on $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        for d in "$DIR"/pkgs/*.deb; do
            echo "pkgs/$(basename "$d")  $(dpkg-deb -f "$d" Package Version 2>/dev/null | awk '{print $2}' | tr '\n' ' ')"
        done
        # one dpkg -S for all (usrmerge: a file may be registered under /lib or /usr/lib)
        owners=$(for f in "$DIR"/lib/*; do [ -f "$f" ] && echo "/lib/x86_64-linux-gnu/$(basename "$f")" "/usr/lib/x86_64-linux-gnu/$(basename "$f")"; done |
                 xargs -r dpkg -S 2>/dev/null | sed 's/:[a-z0-9]*: / /')
        versions=$(echo "$owners" | awk '{print $1}' | sort -u | xargs -r dpkg-query -W -f='${Package} ${Version}\n' 2>/dev/null)
        for f in "$DIR"/lib/*; do
            [ -f "$f" ] || continue
            pkg=$(echo "$owners" | awk -v b="/$(basename "$f")" 'substr($2, length($2) - length(b) + 1) == b { print $1; exit }')
            ver=$(echo "$versions" | awk -v p="$pkg" '$1 == p { print $2; exit }')
            echo "lib/$(basename "$f")  ${pkg:-?} ${ver:-?}"
        done
    } > "$DIR/MANIFEST"
fi

[ "$GATHER_ONLY" = 1 ] && { [ "$NPROB" -gt 0 ] && exit 1; exit 0; }

# ---- check ----
[ -d "$DIR" ] || { problem "no bundle at $(rel "$DIR") (run tests/gpu/bundle.sh without --check-only)"; echo "bundle: $NPROB problem(s)"; exit 1; }
[ -f "$DIR/root/usr/include/jansson.h" ] && [ -f "$DIR/root/usr/lib/x86_64-linux-gnu/libjansson.a" ] ||
    problem "$(rel "$DIR")/root lacks jansson.h and libjansson.a: run.sh could not build gpu_train there (gather libjansson-dev)"

# nothing of glibc, the gcc runtime or CUDA inside the bundle
while IFS= read -r f; do
    b=$(basename "$f")
    if is_system "$b"; then
        problem "$(rel "$f"): glibc / gcc runtime library in the bundle; the GPU machine's own must be used (remove it)"
    elif is_cuda_name "$b"; then
        problem "$(rel "$f"): CUDA library in the bundle; the GPU machine's toolkit or pip wheels must be used (remove it)"
    fi
done < <(find "$DIR" \( -type f -o -type l \) -name '*.so*' | sort)

LDP=$DIR/lib
for d in "${CUDA_DIRS[@]}"; do LDP=$LDP:$d; done
ELFS=()
while IFS= read -r f; do is_elf "$f" && ELFS+=("$f"); done < <({ carried_programs; find "$DIR/lib" -type f 2>/dev/null | sort
                                                                for x in "${EXTRA[@]}"; do echo "$x"; done; })
for x in "${EXTRA[@]}"; do [ -e "$x" ] || problem "$x: no such program"; done
while IFS= read -r line; do problem "${line#PROBLEM: }"; done < <(ldd_all "${ELFS[@]}" | classify check)
readelf_all() {   # OPTION FILE...: readelf OPTION of each, after a "File: FILE" line
    local o=$1 f; shift
    for f in "$@"; do echo "File: $f"; readelf "$o" -W "$f" 2>/dev/null | grep -v '^File: '; done
}
# GLIBC_PRIVATE references, and DT_RPATH (which beats LD_LIBRARY_PATH) outside CUDA
if [ ${#ELFS[@]} -gt 0 ]; then
    while IFS= read -r f; do
        problem "$(rel "$f") references GLIBC_PRIVATE symbols: it is tied to the glibc build it came with and fails on another (it must not travel)"
    done < <(readelf_all -V "${ELFS[@]}" | awk '/^File: / { f = $2 } /Name: GLIBC_PRIVATE/ && f != seen { print f; seen = f }')
    while read -r f rp; do
        case $rp in '$ORIGIN'*) continue ;; esac
        in_cuda_dir "$rp/x" || problem "$(rel "$f") has DT_RPATH $rp, which beats LD_LIBRARY_PATH: link with --enable-new-dtags (RUNPATH)"
    done < <(readelf_all -d "${ELFS[@]}" | awk '/^File: / { f = $2 }
             /\(RPATH\)/ { sub(/.*\[/, ""); sub(/\].*/, ""); n = split($0, r, ":"); for (i = 1; i <= n; i++) print f, r[i] }')
fi
nelf=${#ELFS[@]}

# size: the working tree (tracked and untracked files git does not ignore)
# plus every carried path, against the device tool's limit
tree=$(git ls-files -co --exclude-standard -z 2>/dev/null | xargs -0 -r stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
carry=() cbytes=0
for p in "$DIR" "${CARRY_BUILD[@]}"; do
    b=$(du -sb --apparent-size "$p" 2>/dev/null | cut -f1)
    cbytes=$((cbytes + ${b:-0}))
    r=$(rel "$p")
    case $r in /*) say "$r is outside the repository: copy it into the tree (a path .git/info/exclude ignores) before it can be carried" ;; esac
    carry+=("\"$r\"")
done
total=$((tree + cbytes))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
if [ "$total" -gt "$LIMIT" ]; then
    problem "working tree $(mib "$tree") + carried $(mib "$cbytes") = $(mib "$total"), over the device tool's limit of $(mib "$LIMIT"): carry less (largest: $(du -sb --apparent-size "$DIR"/* "${CARRY_BUILD[@]}" 2>/dev/null | sort -rn | head -3 |
        awk -v root="$ROOT/" '{ p = index($2, root) == 1 ? substr($2, length(root) + 1) : $2
                                printf "%s%s %.1f MiB", (NR > 1 ? ", " : ""), p, $1 / 1048576 }'))"
fi
say "checked $nelf programs and libraries; working tree $(mib "$tree") + carried $(mib "$cbytes") = $(mib "$total") of $(mib "$LIMIT")"
carry_list=$(IFS=,; echo "${carry[*]}")
say "carry: [${carry_list//,/, }]"
if [ "$NPROB" -gt 0 ]; then say "$NPROB problem(s)"; exit 1; fi
say "ok"
exit 0
