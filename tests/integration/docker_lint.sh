#!/usr/bin/env bash
# docker_lint.sh: docker/Dockerfile.* agree with the repository (COPY
# sources exist, the programs they build are the Makefile's, ENTRYPOINT and
# HEALTHCHECK in exec form running programs of the image, non-root USER, the
# same uid in both images, the bases the images promise), checked by
# docker_lint.py; then four broken copies must each be caught. No Docker
# engine or hadolint is used.
source "$(dirname "$0")/../lib.sh"
LINT=$ROOT/tests/integration/docker_lint.py
D=$(t_tmpdir)
cd "$ROOT"
make --no-print-directory -pq BUILD=build report > "$D/make.db" 2> /dev/null  # one parse of the Makefile for both
BINS=$(sed -n 's/^BINS := //p' "$D/make.db")
DEPS=$(sed -n 's/^DEPS_PKGS := //p' "$D/make.db")
[ -n "$BINS" ] && [ -n "$DEPS" ] || { t_fail "read BINS and DEPS_PKGS from the Makefile" "make -pq printed neither"; t_done; exit 1; }

tap() {
    local line
    while IFS= read -r line; do
        case "$line" in
        OK\|*)   t_ok "${line#OK|}" ;;
        SKIP\|*) line=${line#SKIP|}; t_skip "${line%%|*}" "${line#*|}" ;;
        FAIL\|*) line=${line#FAIL|}; t_fail "${line%%|*}" "${line#*|}" ;;
        UID\|*)  echo "${line#UID|}" >> "$D/uids" ;;
        \#*)     echo "$line" ;;
        *)       echo "# $line" ;;
        esac
    done
}
for f in docker/Dockerfile.worker docker/Dockerfile.offload; do
    if [ -f "$f" ]; then tap < <(/usr/bin/python3 "$LINT" "$ROOT" "$f" "$BINS" "$DEPS" 2>&1)
    else t_fail "$f exists" "missing"; fi
done
[ "$(sort -u "$D/uids" | wc -l)" = 1 ] && t_ok "both images run as the same uid ($(head -1 "$D/uids"))" ||
    t_fail "both images run as the same uid" "uids: $(tr '\n' ' ' < "$D/uids")"

# The bases the images promise.
t_check "worker builds on a CUDA devel image with cuDNN" grep -Eq '^FROM nvidia/cuda:\$\{CUDA_VERSION\}-cudnn-devel-\$\{BASE_OS\} AS build' docker/Dockerfile.worker
t_check "worker runs on the matching CUDA runtime image" grep -Eq '^FROM nvidia/cuda:\$\{CUDA_VERSION\}-runtime-\$\{BASE_OS\}$' docker/Dockerfile.worker
t_check "worker ARG CUDA_VERSION is 13.x" grep -Eq '^ARG CUDA_VERSION=13\.' docker/Dockerfile.worker
t_check "offload runs on Debian 12 slim" grep -Eq '^ARG DEBIAN=bookworm$' docker/Dockerfile.offload
t_check "offload final stage is -slim" grep -Eq '^FROM debian:\$\{DEBIAN\}-slim$' docker/Dockerfile.offload
t_check "runtime-packages.sh resolves this tree's ballast" sh -c "docker/runtime-packages.sh $BUILD/bin/ballast | grep -q '^libc6'"
t_expect_fail "runtime-packages.sh refuses a non-program" "not an executable" docker/runtime-packages.sh docker/docker-compose.yml

# Each breakage must fail the lint with its message.
broken() {
    local what=$1 pat=$2 sedexpr=$3
    sed -E "$sedexpr" docker/Dockerfile.worker > "$D/Dockerfile.broken"
    if cmp -s docker/Dockerfile.worker "$D/Dockerfile.broken"; then t_fail "breakage applies: $what" "sed changed nothing"; return; fi
    t_expect_fail "lint catches: $what" "$pat" /usr/bin/python3 "$LINT" "$ROOT" "$D/Dockerfile.broken" "$BINS" "$DEPS"
}
broken "shell-form ENTRYPOINT" "FAIL\|.*ENTRYPOINT uses exec form" 's#^ENTRYPOINT .*#ENTRYPOINT /usr/local/bin/ballast-worker#'
broken "a COPY source that does not exist" "FAIL\|.*COPY source nosuchdir/ exists" 's#^COPY workers/ workers/#COPY nosuchdir/ workers/#'
broken "a make target the Makefile does not build" "FAIL\|.*builds build/bin/ballast-trainer" 's#build/bin/ballast-worker build/bin/ballast \\#build/bin/ballast-trainer build/bin/ballast \\#'
broken "running as root" "FAIL\|.*non-root numeric USER" 's#^USER 10001:10001#USER root#'
t_done
