#!/usr/bin/env bash
# seccomp_profile.sh: docker/seccomp-io_uring.json is a seccomp profile in
# Docker's format (default action deny with EPERM, an archMap, rules of
# names + action), allows io_uring_setup, io_uring_enter and
# io_uring_register unconditionally, and keeps the runtime default's denials
# (mount, ptrace, bpf, ... only with their capability). When ballastd and
# strace are here: every syscall ballastd makes with --io-backend io_uring
# while it starts, answers a probe and drains is allowed by the profile.
source "$(dirname "$0")/../lib.sh"
P=$ROOT/docker/seccomp-io_uring.json
D=$(t_tmpdir)

# Prints OK|/FAIL| lines; $2 (optional) is a file of syscall names that must be allowed.
cat > "$D/check.py" <<'PY'
import json, sys
prof = json.load(open(sys.argv[1]))
def res(ok, name, why=""):
    print(("OK|" if ok else "FAIL|") + name + ("" if ok else "|" + why))
res(prof.get("defaultAction") == "SCMP_ACT_ERRNO" and prof.get("defaultErrnoRet") == 1,
    "default action: deny with EPERM", f"{prof.get('defaultAction')} / {prof.get('defaultErrnoRet')}")
arch = [a.get("architecture") for a in prof.get("archMap") or []]
res("SCMP_ARCH_X86_64" in arch and "SCMP_ARCH_AARCH64" in arch, "archMap covers x86_64 and aarch64", str(arch))
rules = prof.get("syscalls") or []
good = all(isinstance(r.get("names"), list) and r["names"] and
           r.get("action") in ("SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_TRACE", "SCMP_ACT_LOG")
           for r in rules)
res(good and len(rules) > 10, f"{len(rules)} rules, each names + a known action", "a rule without names or with an unknown action")
# unconditional: no args, no includes/excludes (caps, arches, kernel)
uncond = set()
for r in rules:
    if r.get("action") == "SCMP_ACT_ALLOW" and not r.get("args") and not r.get("includes") and not r.get("excludes"):
        uncond |= set(r["names"])
for s in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
    res(s in uncond, f"{s} is allowed unconditionally", "not in an unconditional SCMP_ACT_ALLOW rule")
for s in ("mount", "umount2", "bpf", "ptrace", "unshare", "setns", "kexec_load", "init_module", "reboot", "clone3"):
    res(s not in uncond, f"{s} stays denied without its capability (as in the runtime default)", "allowed unconditionally")
# what ballastd's pool and spill tier need
for s in ("memfd_create", "mlock", "mmap", "fallocate", "pwrite64", "pread64", "fcntl", "sendmsg", "recvmsg", "eventfd2", "fdatasync"):
    res(s in uncond, f"{s} (ballastd) is allowed", "denied")
if len(sys.argv) > 2:
    cond = {n for r in rules if r.get("action") == "SCMP_ACT_ALLOW" for n in r["names"]}
    used = sorted({l.strip() for l in open(sys.argv[2]) if l.strip()})
    special = {"clone": "allowed for thread flags (CLONE_NEWUSER etc. need CAP_SYS_ADMIN)",
               "clone3": "denied with ENOSYS without CAP_SYS_ADMIN: glibc falls back to clone",
               "socket": "allowed except AF_VSOCK", "arch_prctl": "allowed on amd64", "personality": "allowed for the usual values"}
    bad = [s for s in used if s not in uncond and s not in special]
    res(not bad and len(used) > 20, f"the {len(used)} syscalls ballastd made under strace are allowed", f"not allowed: {bad}")
PY
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
if ! /usr/bin/python3 -c "import json; json.load(open('$P'))" 2> "$D/json.err"; then
    t_fail "seccomp-io_uring.json parses as JSON" "$(tail -2 "$D/json.err")"; t_done; exit 1
fi
t_ok "seccomp-io_uring.json parses as JSON"
tap < <(/usr/bin/python3 "$D/check.py" "$P" 2>&1)

# A profile without the io_uring rule must fail the same check.
/usr/bin/python3 -c "
import json, sys
p = json.load(open('$P'))
for r in p['syscalls']:
    r['names'] = [n for n in r['names'] if not n.startswith('io_uring')]
p['syscalls'] = [r for r in p['syscalls'] if r['names']]
json.dump(p, open('$D/no-uring.json', 'w'))"
if /usr/bin/python3 "$D/check.py" "$D/no-uring.json" | grep '^FAIL|io_uring_setup' > /dev/null; then
    t_ok "the check catches a profile without io_uring"
else t_fail "the check catches a profile without io_uring" "it passed"; fi

# The syscalls ballastd really makes.
if [ ! -x "$BIN/ballastd" ] || [ ! -x "$BIN/ballast-probe" ]; then
    t_skip "ballastd's syscalls are allowed" "ballastd is not built in this tree yet"
elif ! command -v strace > /dev/null || ! strace -f -qq -o /dev/null true 2> /dev/null; then
    t_skip "ballastd's syscalls are allowed" "strace is missing or ptrace is not permitted here"
else
    S=$D/s/ballastd.sock; mkdir -p "$D/s" "$D/spill"
    strace -f -qq -o "$D/trace" -- "$BIN/ballastd" --socket "$S" --pool-bytes 16M --spill-dir "$D/spill" \
        --spill-bytes 16M --spill-file-bytes 4M --io-backend auto --mlock=false > "$D/ballastd.log" 2>&1 &
    pid=$!
    ok=0
    for _ in $(seq 1 100); do
        if "$BIN/ballast-probe" --addr "unix:$S" --quiet --timeout 1s > /dev/null 2>&1; then ok=1; break; fi
        sleep 0.1
    done
    kill -TERM "$(pgrep -P $pid -x ballastd || echo $pid)" 2> /dev/null
    wait $pid
    if [ $ok = 1 ]; then
        sed -nE 's/^[0-9]+ +([a-z0-9_]+)\(.*/\1/p; s/^[0-9]+ +<\.\.\. ([a-z0-9_]+) resumed>.*/\1/p' "$D/trace" | sort -u > "$D/used"
        grep -q 'io_uring_setup' "$D/used" && echo "# ballastd called io_uring_setup" || echo "# io_uring was not used ($(grep -o 'io [a-z_]*[^,]*' "$D/ballastd.log" | head -1))"
        tap < <(/usr/bin/python3 "$D/check.py" "$P" "$D/used" 2>&1 | grep 'under strace')
        if grep -q '^io_uring_setup$' "$D/used"; then
            if /usr/bin/python3 "$D/check.py" "$D/no-uring.json" "$D/used" | grep '^FAIL|.*under strace.*io_uring' > /dev/null; then
                t_ok "without the io_uring rule, ballastd's io_uring calls are reported as denied"
            else t_fail "the strace check catches a profile without io_uring" "it passed"; fi
        fi
    else
        t_fail "ballastd starts under strace" "$(tail -3 "$D/ballastd.log")"
    fi
fi
t_done
