#!/usr/bin/env bash
# compose_smoke.sh: docker/docker-compose.yml is valid for Debian's
# docker-compose, its rendered config is consistent (shared socket volume,
# memlock, start order, GPU reservations, ranks, one checkpoint volume),
# and its services, run as local processes from the rendered config
# (compose_local.py: volumes -> temp dirs, image binaries -> build/bin),
# bring ballastd up healthy and train two ranks: both exit 0, each logs the
# backend that joined them (shm through the socket volume, or gloo), rank
# 0's losses are finite and fall, and a complete checkpoint is left in the
# checkpoint volume. Each service runs in its own namespace host
# (tests/multihost/hosts.lib) as Docker isolates containers: own network
# (service names -> the hosts' addresses), PIDs, /tmp, /dev/shm, /run, and
# only the volume directories it mounts. Without namespaces (not root) the
# services run as plain local processes, and a skip line says so. No Docker
# engine is needed.
source "$(dirname "$0")/../lib.sh"
export OMP_WAIT_POLICY=passive
F=$ROOT/docker/docker-compose.yml
D=$(t_tmpdir)

if ! command -v docker-compose > /dev/null; then
    t_skip "docker-compose config" "docker-compose is not installed (Debian package docker-compose, in DEPS_PKGS)"
    t_done; exit 0
fi
if ! /usr/bin/python3 -c 'import yaml' 2> /dev/null; then
    t_skip "compose services run locally" "python3-yaml is not installed (Debian package python3-yaml, in DEPS_PKGS)"
    t_done; exit 0
fi
t_check "docker-compose config -q" docker-compose -f "$F" config -q

# A short run: the knobs the compose file exposes as ${VAR:-default}.
render() {   # VAR=VALUE arguments override these
    env -i PATH="$PATH" HOME="$D" \
        BALLAST_STEPS=60 BALLAST_SYNTH_TOKENS=400000 BALLAST_SYNTH_SEED=3 BALLAST_THREADS=2 \
        BALLAST_MICRO_BATCH=8 BALLAST_LOG_EVERY=20 \
        BALLASTD_POOL_BYTES=64M BALLASTD_SPILL_BYTES=64M BALLASTD_STATS_INTERVAL=0 \
        "$@" docker-compose -f "$F" config
}
if ! render > "$D/config.yml" 2> "$D/config.err"; then
    t_fail "docker-compose config renders" "$(tail -3 "$D/config.err")"; t_done; exit 1
fi
grep -q 'BALLAST_STEPS: .60' "$D/config.yml" &&
    t_ok "the rendered config carries the test's knobs" ||
    t_fail "the rendered config carries the test's knobs" "BALLAST_STEPS=60 not in the rendered environment"

missing=""
for p in ballast ballast-worker ballastd ballast-probe; do [ -x "$BIN/$p" ] || missing="$missing $p"; done

run_local() {
    /usr/bin/python3 "$ROOT/tests/integration/compose_local.py" --config "$D/config.yml" --root "$ROOT" \
        --bin "$BIN" --workdir "$D/run" "$@" 2>&1
}
tap() {
    local line kind name why
    while IFS= read -r line; do
        case "$line" in
        OK\|*)   t_ok "${line#OK|}" ;;
        SKIP\|*) line=${line#SKIP|}; t_skip "${line%%|*}" "${line#*|}" ;;
        FAIL\|*) line=${line#FAIL|}; t_fail "${line%%|*}" "${line#*|}" ;;
        \#*)     echo "$line" ;;
        *)       echo "# $line" ;;
        esac
    done
}
mkdir -p "$D/run"
# The static checks must catch a broken config: rank 1 renumbered to 0,
# worker-0's offload socket elsewhere, and ballastd's memlock limit dropped.
/usr/bin/python3 - "$D/config.yml" "$D/broken.yml" <<'PY'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
c["services"]["worker-1"]["environment"]["RANK"] = "0"
c["services"]["worker-0"]["environment"]["BALLAST_OFFLOAD_SOCKET"] = "unix:/run/elsewhere/ballastd.sock"
del c["services"]["ballastd"]["ulimits"]
yaml.safe_dump(c, open(sys.argv[2], "w"))
PY
out=$(/usr/bin/python3 "$ROOT/tests/integration/compose_local.py" --config "$D/broken.yml" --root "$ROOT" \
      --bin "$BIN" --workdir "$D/run" --static-only 2>&1)
echo "$out" | grep -q '^FAIL|profile cpu: ranks and world size agree' &&
    t_ok "the check catches two workers with rank 0" || t_fail "the check catches two workers with rank 0" "$out"
echo "$out" | grep -q '^FAIL|worker-0: offload socket is ballastd' &&
    t_ok "the check catches a worker whose offload socket is not ballastd's" ||
    t_fail "the check catches a worker whose offload socket is not ballastd's" "$out"
echo "$out" | grep -q '^FAIL|ballastd: memlock unlimited' &&
    t_ok "the check catches ballastd without memlock" || t_fail "the check catches ballastd without memlock" "$out"
if [ -n "$missing" ]; then
    tap < <(run_local --static-only)
    t_skip "compose services run locally" "not built here:$missing (ballastd lands with the offload service)"
else
    # Each service in its own namespace host (tests/multihost/hosts.lib), as
    # Docker isolates containers: its own network (service names -> the
    # hosts' addresses), PIDs, /tmp, /dev/shm and /run, and of the work
    # directory only the volumes it mounts.
    source "$ROOT/tests/multihost/hosts.lib"
    mapfile -t SVCS < <(run_local --profile cpu --no-static --list-services)
    if [ "${#SVCS[@]}" -gt 0 ] && mh_up "${#SVCS[@]}" "$D/run"; then
        hosts="{"
        for i in "${!SVCS[@]}"; do
            read -r -a sv <<< "${SVCS[$i]}"
            # hide the work directory but this service's volumes: park them
            # in the host's private /run, cover the directory, bind them back
            mh_exec "$i" bash -c 'set -e; w=$1; shift; n=0
                for v; do mkdir -p /run/.vol$n; mount --bind "$v" /run/.vol$n; n=$((n+1)); done
                mount -t tmpfs -o mode=755 compose-none "$w"; n=0
                for v; do mkdir -p "$v"; mount --bind /run/.vol$n "$v"; umount /run/.vol$n; n=$((n+1)); done' \
                vols "$D/run" "${sv[@]:1}" ||
                { t_fail "${sv[0]}: its volumes only, in namespace host $i" "mount failed"; t_done; exit 1; }
            hosts+="$([ "$i" = 0 ] || echo ,)\"${sv[0]}\": {\"pid\": ${MH_HOLDER[$i]}, \"ip\": \"$(mh_ip "$i")\"}"
            echo "# ${sv[0]}: namespace host $i ($(mh_ip "$i")), volumes:${sv[*]:1}"
        done
        echo "$hosts}" > "$D/hosts.json"
        tap < <(run_local --profile cpu --timeout 600 --hosts "$D/hosts.json")
    else
        t_skip "services in namespace hosts" "${MH_WHY:-no services listed}; running them as local processes sharing this machine's network, PIDs and /tmp"
        tap < <(run_local --profile cpu --timeout 600)
    fi
    # With a zero learning rate the same run must fail the loss check.
    if render BALLAST_LR=0 BALLAST_MIN_LR=0 > "$D/lr0.yml" 2> "$D/config.err"; then
        mkdir -p "$D/run-lr0"
        out=$(/usr/bin/python3 "$ROOT/tests/integration/compose_local.py" --config "$D/lr0.yml" --root "$ROOT" \
              --bin "$BIN" --workdir "$D/run-lr0" --profile cpu --no-static --timeout 600 2>&1)
        echo "$out" | grep -q '^FAIL|worker-0: loss falls' &&
            t_ok "the loss check fails a run that does not learn (BALLAST_LR=0)" ||
            t_fail "the loss check fails a run that does not learn" "$(echo "$out" | tail -3)"
    else t_fail "docker-compose config renders with BALLAST_LR=0" "$(tail -3 "$D/config.err")"; fi
    # The gpu profile's commands, where a GPU and the CUDA backend are here.
    if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 && nm "$BIN/ballast-worker" 2> /dev/null | grep -q ' T backend_cuda$'; then
        mkdir -p "$D/run-gpu"
        tap < <(/usr/bin/python3 "$ROOT/tests/integration/compose_local.py" --config "$D/config.yml" --root "$ROOT" \
                    --bin "$BIN" --workdir "$D/run-gpu" --profile gpu --no-static --timeout 600 2>&1)
    else
        t_skip "gpu profile runs locally" "no GPU here (nvidia-smi) or ballast-worker built without the CUDA backend"
    fi
fi
t_done
