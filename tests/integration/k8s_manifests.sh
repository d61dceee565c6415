#!/usr/bin/env bash
# k8s_manifests.sh: docker/k8s renders with `kubectl kustomize` (base and
# every overlay) and passes k8s_check.py (references, selectors, probes,
# socket path, /dev/shm, GPU limits, ranks vs completions). Then breaks a
# rendered manifest in five ways and expects the check to catch each one.
# Offline: no cluster, no OpenAPI schema validation (see docs/deploy.md).
source "$(dirname "$0")/../lib.sh"
K=$ROOT/docker/k8s
CHECK=$ROOT/tests/integration/k8s_check.py
D=$(t_tmpdir)

# kustomize v4+ (kubectl 1.21+) for `patches` with targets; Debian 12's
# kubernetes-client is 1.20 (kustomize v2), too old.
if ! command -v kubectl > /dev/null || ! kubectl version --client 2> /dev/null | grep -Eq 'Kustomize Version: v([4-9]|[1-9][0-9])'; then
    t_skip "kubectl kustomize" "kubectl 1.21+ (kustomize v4+) is not installed"; t_done; exit 0
fi
if ! /usr/bin/python3 -c 'import yaml' 2> /dev/null; then
    t_skip "k8s_check.py" "python3-yaml is not installed (Debian package python3-yaml)"; t_done; exit 0
fi

tap() {
    local line
    while IFS= read -r line; do
        case "$line" in
        OK\|*)   t_ok "${line#OK|}" ;;
        FAIL\|*) line=${line#FAIL|}; t_fail "${line%%|*}" "${line#*|}" ;;
        \#*)     echo "$line" ;;
        *)       echo "# $line" ;;
        esac
    done
}

for dir in "$K/base" "$K"/overlays/*/; do
    name=$(basename "$dir")
    if kubectl kustomize "$dir" > "$D/$name.yaml" 2> "$D/$name.err"; then
        t_ok "kubectl kustomize $name renders $(grep -c '^kind:' "$D/$name.yaml") objects"
        tap < <(/usr/bin/python3 "$CHECK" "$D/$name.yaml" "$name" 2>&1)
    else
        t_fail "kubectl kustomize $name" "$(tail -3 "$D/$name.err")"
    fi
done

# The check must fail on each of these breakages of the base.
broken() {
    local what=$1 pat=$2 sedexpr=$3
    sed -E "$sedexpr" "$D/base.yaml" > "$D/broken.yaml"
    if cmp -s "$D/base.yaml" "$D/broken.yaml"; then t_fail "breakage applies: $what" "sed changed nothing"; return; fi
    t_expect_fail "check catches: $what" "$pat" /usr/bin/python3 "$CHECK" "$D/broken.yaml" broken
}
if [ -f "$D/base.yaml" ]; then
    broken "probe on a port the container does not declare" "FAIL\|.*Probe port 8082" 's/^( +)port: 8081$/\1port: 8082/'
    broken "WORLD_SIZE differs from the Job's completions" "FAIL\|.*completions and parallelism" 's/^(  WORLD_SIZE: )"2"/\1"3"/'
    broken "/dev/shm not mounted" "FAIL\|.*/dev/shm" 's#mountPath: /dev/shm#mountPath: /dev/shm-not#'
    broken "ballastd's socket outside its volume" "FAIL\|.*socket directory" 's#--socket=/run/ballast/#--socket=/run/elsewhere/#'
    broken "GPU backend without GPU limits" "FAIL\|.*GPU limits" '/nvidia.com\/gpu: 1/d'
fi
t_done
