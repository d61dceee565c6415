#!/usr/bin/env bash
# k8s_manifests.sh: docker/k8s renders with `kubectl kustomize` (base and
# every overlay) and passes k8s_check.py (references, selectors, probes,
# socket path, /dev/shm, GPU limits, nodes vs completions, the launcher per
# pod, the shared checkpoint volume, restarts that resume, ballastd's node
# selection and update strategy, Prometheus through the NetworkPolicy, the
# offload address, the doctor init step). Then breaks a rendered manifest
# in sixteen ways and expects the check to catch each one.
# Every rendered object is validated against the Kubernetes OpenAPI schemas
# offline (tests/k8s-schema/validate.js); that check must fail on broken
# field types too. No cluster is needed (see docs/deploy.md).
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

# Schema validation of every rendered object (tests/k8s-schema/validate.js,
# kubernetes-models installed by `make deps`), offline.
SCHEMA=$ROOT/tests/k8s-schema
to_json() { /usr/bin/python3 -c 'import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d], open(sys.argv[2], "w"))' "$1" "$2"; }
schema_ok=""
if ! command -v node > /dev/null; then
    t_skip "schema validation" "node is not installed (Debian package nodejs)"
elif [ ! -f "$SCHEMA/node_modules/kubernetes-models/package.json" ]; then
    why=$(cat "$SCHEMA/.install-status" 2> /dev/null || echo "run make deps")
    t_skip "schema validation" "kubernetes-models is not installed in tests/k8s-schema: $why"
else
    schema_ok=1
    args=()
    for f in "$D"/*.yaml; do
        n=$(basename "$f" .yaml)
        case "$n" in broken*) continue ;; esac
        to_json "$f" "$D/$n.json" && args+=("$n" "$D/$n.json") || t_fail "$n.yaml converts to JSON" "python3-yaml failed"
    done
    tap < <(node "$SCHEMA/validate.js" "${args[@]}" 2>&1)
fi
# The schema check must fail on a field of the wrong type and on a JobSet
# field that does not exist.
schema_broken() {
    local what=$1 pat=$2 src=$3 sedexpr=$4
    sed -E "$sedexpr" "$D/$src.yaml" > "$D/broken-schema.yaml"
    if cmp -s "$D/$src.yaml" "$D/broken-schema.yaml"; then t_fail "breakage applies: $what" "sed changed nothing"; return; fi
    to_json "$D/broken-schema.yaml" "$D/broken-schema.json"
    t_expect_fail "schema check catches: $what" "$pat" node "$SCHEMA/validate.js" broken "$D/broken-schema.json"
}
if [ -n "$schema_ok" ] && [ -f "$D/base.yaml" ] && [ -f "$D/jobset.yaml" ]; then
    schema_broken "Job completions as a string" "FAIL\|schema broken: batch/v1 Job/ballast-train\|.*completions must be integer" \
        base 's/^  completions: 2$/  completions: two/'
    schema_broken "a memory request that is not a quantity" "FAIL\|schema broken: apps/v1 DaemonSet/ballastd\|.*memory must match format \"quantity\"" \
        base 's/^( +)memory: 33Gi$/\1memory: 33 gigs/'
    schema_broken "JobSet maxRestarts as a string" "FAIL\|schema broken: jobset.x-k8s.io/v1alpha2 JobSet/ballast-train \(structural\)\|.*maxRestarts must be an integer" \
        jobset 's/maxRestarts: 3$/maxRestarts: three/'
    schema_broken "a misspelt JobSet field" "FAIL\|.*JobSet.*network/enableDnsHostnames is not a field" \
        jobset 's/enableDNSHostnames: true/enableDnsHostnames: true/'
    schema_broken "the JobSet's Job template with parallelism as a string" "FAIL\|.*JobSet.*JobTemplateSpec schema.*parallelism must be integer" \
        jobset 's/^( +)parallelism: 2$/\1parallelism: "2"/'
fi

# The check must fail on each of these breakages of the base.
broken() {
    local what=$1 pat=$2 sedexpr=$3
    sed -E "$sedexpr" "$D/base.yaml" > "$D/broken.yaml"
    if cmp -s "$D/base.yaml" "$D/broken.yaml"; then t_fail "breakage applies: $what" "sed changed nothing"; return; fi
    t_expect_fail "check catches: $what" "$pat" /usr/bin/python3 "$CHECK" "$D/broken.yaml" broken
}
if [ -f "$D/base.yaml" ]; then
    broken "probe on a port the container does not declare" "FAIL\|.*Probe port 8082" 's/^( +)port: 8081$/\1port: 8082/'
    broken "PET_NNODES differs from the Job's completions" "FAIL\|.*completions and parallelism equal PET_NNODES" 's/^(  PET_NNODES: )"2"/\1"3"/'
    broken "a pod with another GPU count than PET_NPROC_PER_NODE" "FAIL\|.*holds PET_NPROC_PER_NODE 2 GPUs" \
        's/^(  PET_NPROC_PER_NODE: )"1"/\1"2"/'
    broken "the worker container without the launcher" "FAIL\|.*runs the launcher" '/^        - train$/d'
    broken "checkpoints on a ReadWriteOnce claim" "FAIL\|.*ReadWriteMany volume shared" 's/ReadWriteMany/ReadWriteOnce/'
    broken "restarts that begin at step 0" "FAIL\|.*restarts resume" 's/^(  BALLAST_RESUME: )auto/\1"false"/'
    broken "ballastd updated by a rolling update" "FAIL\|.*updateStrategy OnDelete" 's/type: OnDelete/type: RollingUpdate/'
    broken "ballastd only on GPU feature discovery's label" "FAIL\|.*labels GKE and EKS set" \
        's/key: cloud.google.com\/gke-accelerator/key: example.com\/gpu/'
    broken "/dev/shm not mounted" "FAIL\|.*/dev/shm" 's#mountPath: /dev/shm#mountPath: /dev/shm-not#'
    broken "ballastd's socket outside its volume" "FAIL\|.*socket directory" 's#--socket=/run/ballast/#--socket=/run/elsewhere/#'
    broken "GPU backend without GPU limits" "FAIL\|.*GPU limits" '/nvidia.com\/gpu: 1/d'
    broken "workers offloading to another socket than ballastd's" "FAIL\|.*offload socket .*is ballastd's --socket" \
        's#BALLAST_OFFLOAD_SOCKET: unix:/run/ballast/ballastd.sock#BALLAST_OFFLOAD_SOCKET: unix:/run/ballast/other.sock#'
    broken "a doctor init step that waits for the rendezvous" "FAIL\|.*doctor init step skips the rendezvous" \
        's/--skip=rendezvous,/--skip=/'
fi
if [ -f "$D/remote-offload.yaml" ]; then
    sed -E 's/BALLAST_OFFLOAD_REMOTE: ballastd:7070/BALLAST_OFFLOAD_REMOTE: ballastd:7071/' "$D/remote-offload.yaml" > "$D/broken.yaml"
    t_expect_fail "check catches: BALLAST_OFFLOAD_REMOTE on a port no Service has" "FAIL\|.*BALLAST_OFFLOAD_REMOTE ballastd:7071" \
        /usr/bin/python3 "$CHECK" "$D/broken.yaml" broken
    sed -E 's/- port: 7070$/- port: 7071/' "$D/remote-offload.yaml" > "$D/broken.yaml"
    t_expect_fail "check catches: a NetworkPolicy that does not admit the workers to ballastd's API" "FAIL\|.*remote mode's API is guarded" \
        /usr/bin/python3 "$CHECK" "$D/broken.yaml" broken
    sed -E 's/- port: 9464$/- port: 9465/' "$D/remote-offload.yaml" > "$D/broken.yaml"
    t_expect_fail "check catches: a NetworkPolicy that keeps Prometheus from /metrics" "FAIL\|.*lets Prometheus scrape" \
        /usr/bin/python3 "$CHECK" "$D/broken.yaml" broken
fi
t_done
