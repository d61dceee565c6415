#!/usr/bin/env python3
"""compose_local.py: run docker/docker-compose.yml's services as plain local
processes, from the config that `docker-compose config` renders, and check
that training progresses. Driven by tests/integration/compose_smoke.sh.

What is taken from the rendered config (nothing is restated here):
  entrypoint/command (or the image's ENTRYPOINT/CMD from the Dockerfile that
  builds the image), environment, volumes, healthcheck timing and test (or
  the image's HEALTHCHECK CMD), depends_on with its conditions, profiles.
How it is mapped:
  a named volume or bind mount  -> a directory under --workdir
  a container path in an argument or environment value -> the mapped path
  /usr/local/bin/NAME (or a bare NAME) -> BIN/NAME (the tree's build/bin)
A worker's BALLAST_<OPTION> variables must be flags of `ballast-worker
--help`; the offload ones (--activation-offload, --optimizer-offload,
--offload-socket, ...) are reported as skipped and left out while the
worker does not have them yet, anything else unknown fails. With offload
on, ballastd must have opened a session per worker (ballast status).
Services are started in dependency order: service_completed_successfully
means run to the end and require exit 0, service_healthy means start in the
background and run the healthcheck test until it passes.

Output: one line per check, "OK|name", "FAIL|name|why" or "SKIP|name|why",
which the shell wrapper turns into TAP. Exit status 0 unless a check failed.
"""
import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import jsonlog  # tests/jsonlog.py: the reader of --log-json files

RESULTS = []


def report(kind, name, why=""):
    RESULTS.append(kind)
    print(f"{kind}|{name}|{why}".rstrip("|"), flush=True)


def parse_duration(s, default):
    """compose durations: 5s, 1m30s, 500ms, 1h."""
    if s is None:
        return default
    total = 0.0
    for num, unit in re.findall(r"([0-9.]+)(ms|us|s|m|h)", str(s)):
        total += float(num) * {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}[unit]
    return total or default


def dockerfile_exec(path, instr):
    """The exec-form (JSON array) value of the last INSTR in a Dockerfile."""
    val = None
    text = open(path).read().replace("\\\n", " ")
    for line in text.splitlines():
        m = re.match(rf"\s*{instr}\s+(\[.*\])\s*$", line, re.I)
        if m:
            val = json.loads(m.group(1))
    return val


class Mapper:
    """Container paths -> local paths, image binaries -> the tree's binaries."""

    def __init__(self, mounts, bindir):
        # longest container path first so /run/ballast/x beats /run
        self.mounts = sorted(mounts.items(), key=lambda kv: -len(kv[0]))
        self.bindir = bindir

    def path(self, s):
        for target, local in self.mounts:
            s = re.sub(rf"(?<![\w/.-]){re.escape(target)}(?=/|$|:|\s)", local, s)
        return s

    def binary(self, s):
        name = os.path.basename(s)
        if s.startswith("/usr/local/bin/") or "/" not in s:
            local = os.path.join(self.bindir, name)
            if os.access(local, os.X_OK):
                return local
        raise LookupError(f"{s}: not a program this tree builds (looked for {self.bindir}/{name})")

    def argv(self, argv):
        return [self.binary(argv[0])] + [self.path(a) for a in argv[1:]]


def vol_pairs(svc):
    """(source, container target) for each of a service's volumes."""
    out = []
    for v in svc.get("volumes", []) or []:
        if isinstance(v, dict):
            out.append((v.get("source") or "anon", v["target"]))
        else:
            parts = v.split(":")
            out.append((parts[0], parts[1]) if len(parts) >= 2 else ("anon", parts[0]))
    return out


def volume_mounts(svc, workdir):
    """{container target: local dir} for a service's volumes."""
    out = {}
    for src, target in vol_pairs(svc):
        local = os.path.join(workdir, "vol-" + re.sub(r"[^\w.-]", "_", src.strip("/")))
        os.makedirs(local, exist_ok=True)
        out[target] = local
    return out


def dockerfile_of(svc, services, root):
    """The Dockerfile that builds the service's image (its own build: or that
    of another service with the same image), or None."""
    for other in [svc] + list(services.values()):
        b = other.get("build")
        if b and other.get("image") == svc.get("image"):
            ctx = b.get("context", root) if isinstance(b, dict) else b
            return os.path.join(ctx, b.get("dockerfile", "Dockerfile") if isinstance(b, dict) else "Dockerfile")
    return None


def healthcheck_test(svc, services, root):
    """The healthcheck test: the service's own, else the image's HEALTHCHECK CMD."""
    hc = svc.get("healthcheck") or {}
    if hc.get("test"):
        return hc["test"]
    df = dockerfile_of(svc, services, root)
    if df:
        text = open(df).read().replace("\\\n", " ")
        m = re.findall(r"^HEALTHCHECK\s.*?\bCMD\s+(\[.*\])\s*$", text, re.M)
        if m:
            return ["CMD"] + json.loads(m[-1])
    return None


def service_argv(name, svc, services, root):
    """entrypoint + command as the container would run them."""
    entry, cmd = svc.get("entrypoint"), svc.get("command")
    dockerfile = dockerfile_of(svc, services, root)
    if entry is None:
        if dockerfile is None:
            raise LookupError(f"{name}: no entrypoint and no Dockerfile builds image {svc.get('image')}")
        entry = dockerfile_exec(dockerfile, "ENTRYPOINT")
        if cmd is None:
            cmd = dockerfile_exec(dockerfile, "CMD")
    if isinstance(entry, str):
        entry = shlex.split(entry)
    if isinstance(cmd, str):
        cmd = shlex.split(cmd)
    return list(entry or []) + list(cmd or [])


SERVICE_NAMES = set()  # filled from the rendered config
HOSTS = {}             # --hosts: service -> {"pid": holder pid, "ip": address}


def in_host(name, argv, workdir):
    """argv as run in the service's namespace host (--hosts), else as is."""
    h = HOSTS.get(name)
    if not h:
        return argv
    return ["nsenter", "-t", str(h["pid"]), "-n", "-m", "-u", "-i", "-p", f"--wd={workdir}", "--"] + argv


def env_of(svc, mapper):
    # a container does not inherit the host's environment: start from PATH
    # (and the sanitizer settings of `make asan`, when set)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS")}
    e = svc.get("environment") or {}
    if isinstance(e, list):
        e = dict(x.split("=", 1) for x in e)
    for k, v in e.items():
        v = "" if v is None else str(v)
        # another service's host name (MASTER_ADDR=worker-0): that service's
        # namespace host's address (--hosts), else this machine
        if v in SERVICE_NAMES:
            env[k] = HOSTS[v]["ip"] if v in HOSTS else "127.0.0.1"
        else:
            env[k] = mapper.path(v)
    return env


def order(services):
    seen, out = set(), []

    def visit(n, stack=()):
        if n in seen:
            return
        if n in stack:
            raise ValueError(f"depends_on cycle through {n}")
        for d in (services[n].get("depends_on") or {}):
            visit(d, stack + (n,))
        seen.add(n)
        out.append(n)

    for n in services:
        visit(n)
    return out


def losses(path):
    """The finite losses of the step records (not the settings record)."""
    return [float(r["loss"]) for r in jsonlog.steps(path) if r.get("loss") is not None]


def wait_done(name, p, timeout, running, status, logs):
    """Wait for a run-to-the-end service and report its exit status."""
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        del running[name]
        report("FAIL", f"{name} finishes", f"still running after {timeout}s")
        status[name] = "timed out"
        return
    del running[name]
    status[name] = f"exited {rc}"
    if rc == 0:
        report("OK", f"{name} exits 0")
    else:
        tail = open(logs[name]).read()[-400:].replace("\n", " / ")
        report("FAIL", f"{name} exits 0", f"exit {rc}: {tail}")


def multi_rank_available(bindir):
    """True once ballast-worker trains across ranks: it then has --world-size."""
    try:
        out = subprocess.run([os.path.join(bindir, "ballast-worker"), "--help"], capture_output=True,
                             text=True, timeout=30).stdout
    except OSError:
        return False
    return "--world-size" in out


# Worker options that talk to ballastd (workers/train/train.c); their flags come
# with the offload work and may be missing from an older ballast-worker.
OFFLOAD_OPTS = ("activation-offload", "activation-loading-horizon", "optimizer-offload", "offload-socket",
                "offload-remote", "offload-job", "resume-from-service")


def worker_flags(bindir):
    """The long flags `ballast-worker --help` lists."""
    try:
        out = subprocess.run([os.path.join(bindir, "ballast-worker"), "--help"], capture_output=True,
                             text=True, timeout=30).stdout
    except OSError:
        return set()
    return set(re.findall(r"^\s*--([a-z0-9-]+)", out, re.M))


def env_option(key):
    """BALLAST_MICRO_BATCH -> micro-batch; None for other variables."""
    return key[len("BALLAST_"):].lower().replace("_", "-") if key.startswith("BALLAST_") else None


def offload_on(env):
    """Does this environment turn an offload path on?"""
    act = str(env.get("BALLAST_ACTIVATION_OFFLOAD", "false")).lower() in ("1", "true", "yes")
    opt = str(env.get("BALLAST_OPTIMIZER_OFFLOAD", "none")).lower() not in ("", "none")
    return act or opt


def flag(argv, name):
    for i, x in enumerate(argv[:-1]):
        if x == name:
            return argv[i + 1]
    return None


def static_checks(cfg, root):
    """What breaks at run time but parses fine: the socket directory shared,
    memlock, the start order, GPU reservations, ranks against the world size."""
    svcs = cfg["services"]
    d_argv = service_argv("ballastd", svcs["ballastd"], svcs, root)
    sock = flag(d_argv, "--socket") or "/run/ballast/ballastd.sock"
    sockdir = os.path.dirname(sock)
    d_vols = {t: src for src, t in vol_pairs(svcs["ballastd"])}
    workers = [n for n, s in svcs.items()
               if os.path.basename(service_argv(n, s, svcs, root)[0]) == "ballast-worker"]
    if sockdir in d_vols:
        report("OK", f"ballastd's socket directory {sockdir} is the volume {d_vols[sockdir]}")
    else:
        report("FAIL", "ballastd's socket directory is a volume", f"{sockdir} is not mounted")
    for n in ["ballastd"] + workers:
        ml = (svcs[n].get("ulimits") or {}).get("memlock")
        ok = ml == -1 or (isinstance(ml, dict) and ml.get("soft") == -1 and ml.get("hard") == -1)
        (report("OK", f"{n}: memlock unlimited") if ok else
         report("FAIL", f"{n}: memlock unlimited", f"ulimits.memlock is {ml!r}"))
    waited = {d for s in svcs.values() for d, c in (s.get("depends_on") or {}).items()
              if (c or {}).get("condition") == "service_healthy"}
    for n in sorted(waited):
        t = healthcheck_test(svcs[n], svcs, root)
        (report("OK", f"{n}: healthcheck {' '.join(t[1:])}") if t else
         report("FAIL", f"{n} has a healthcheck", "others wait for service_healthy; neither compose nor its image has a test"))
    by_profile = {}
    ckpt_vols = {}
    for n in workers:
        s = svcs[n]
        vols = {t: src for src, t in vol_pairs(s)}
        if vols.get(sockdir) != d_vols.get(sockdir):
            report("FAIL", f"{n} mounts ballastd's socket volume at {sockdir}", f"has {vols.get(sockdir)!r}")
        dep = s.get("depends_on") or {}
        if (dep.get("ballastd") or {}).get("condition") != "service_healthy":
            report("FAIL", f"{n} waits for ballastd to be healthy", f"depends_on: {dep}")
        argv = service_argv(n, s, svcs, root)
        data = flag(argv, "--data")
        producers = [m for m, t in svcs.items() if m not in workers and
                     flag(service_argv(m, t, svcs, root), "--out") == data]
        if not producers or any((dep.get(m) or {}).get("condition") != "service_completed_successfully" for m in producers):
            report("FAIL", f"{n} waits for the service that writes {data}", f"producers {producers}, depends_on {dep}")
        env = s.get("environment") or {}
        want = "unix:" + sock
        got = flag(argv, "--offload-socket") or env.get("BALLAST_OFFLOAD_SOCKET")
        if env.get("BALLAST_OFFLOAD_REMOTE") or flag(argv, "--offload-remote"):
            report("FAIL", f"{n}: offload through the shared socket", "BALLAST_OFFLOAD_REMOTE is set: compose has no remote ballastd")
        elif offload_on(env) or got:
            if (got or "unix:/run/ballast/ballastd.sock") in (want, sock):
                report("OK", f"{n}: offload socket {got or '(default)'} is ballastd's --socket")
            else:
                report("FAIL", f"{n}: offload socket is ballastd's --socket", f"worker uses {got!r}, ballastd serves {want!r}")
        backend = flag(argv, "--backend") or "cpu"
        gpus = [d for d in (((s.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []
                if d.get("driver") == "nvidia" and "gpu" in (d.get("capabilities") or [])]
        if (backend == "cuda") != bool(gpus):
            report("FAIL", f"{n}: GPU reservation matches --backend {backend}", f"nvidia devices: {gpus}")
        ck = env.get("BALLAST_CKPT_DIR") or flag(argv, "--ckpt-dir")
        for p in s.get("profiles") or [""]:
            by_profile.setdefault(p, []).append((n, int(env.get("RANK", -1)), int(env.get("WORLD_SIZE", 1)),
                                                 env.get("MASTER_ADDR")))
            ckpt_vols.setdefault(p, {})[n] = (ck, vols.get(ck) if ck else None)
    for p, cv in sorted(ckpt_vols.items()):
        # the ranks write one checkpoint together: one named volume for all
        got = set(cv.values())
        if len(cv) > 1 and len(got) == 1 and None not in next(iter(got)):
            report("OK", f"profile {p}: the workers share the checkpoint volume {next(iter(got))[1]} at {next(iter(got))[0]}")
        elif len(cv) > 1 and any(c for c, _ in cv.values()):
            report("FAIL", f"profile {p}: the workers share a checkpoint volume", f"(dir, volume) per worker: {cv}")
    for p, ws in sorted(by_profile.items()):
        ranks = sorted(r for _, r, _, _ in ws)
        worlds = {w for _, _, w, _ in ws}
        masters = {m for _, _, _, m in ws}
        rank0 = [n for n, r, _, _ in ws if r == 0]
        if worlds == {len(ws)} and ranks == list(range(len(ws))) and len(masters) == 1 and rank0 and masters == set(rank0):
            report("OK", f"profile {p}: {len(ws)} workers, ranks {ranks} of WORLD_SIZE {len(ws)}, MASTER_ADDR is rank 0 ({rank0[0]})")
        else:
            report("FAIL", f"profile {p}: ranks and world size agree",
                   f"ranks {ranks}, WORLD_SIZE {worlds}, MASTER_ADDR {masters}, rank 0 service {rank0}")
        has_gpu = any(flag(service_argv(n, svcs[n], svcs, root), "--backend") == "cuda" for n, *_ in ws)
        if p == "gpu" and not has_gpu:
            report("FAIL", "profile gpu uses --backend cuda", "no worker of the gpu profile does")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="output of docker-compose config")
    ap.add_argument("--root", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--static-only", action="store_true", help="only check the rendered config")
    ap.add_argument("--no-static", action="store_true", help="skip the checks of the rendered config")
    ap.add_argument("--list-services", action="store_true",
                    help="print the profile's services in start order, each with its volumes' local directories")
    ap.add_argument("--hosts", help="JSON {service: {pid, ip}}: run each service in that namespace host")
    a = ap.parse_args()
    if a.hosts:
        HOSTS.update(json.load(open(a.hosts)))

    cfg = yaml.safe_load(open(a.config))
    if not a.no_static:
        static_checks(cfg, a.root)
    if a.static_only:
        return 1 if "FAIL" in RESULTS else 0
    SERVICE_NAMES.update(cfg["services"].keys())
    services = {n: s for n, s in cfg["services"].items()
                if not s.get("profiles") or a.profile in s["profiles"]}
    names = order(services)
    if a.list_services:
        for n in names:
            print(n, *sorted(set(volume_mounts(services[n], a.workdir).values())))
        return 0
    missing = [n for n in names if a.hosts and n not in HOSTS]
    if missing:
        report("FAIL", "every service has a namespace host", f"--hosts has none for {' '.join(missing)}")
        return 1
    report("OK", f"services in dependency order for profile {a.profile}: {' '.join(names)}")
    multi = multi_rank_available(a.bin)
    running = {}
    offloaded = []   # workers run with an offload path on
    ranks = []
    logs = {}
    status = {}
    try:
        for name in names:
            svc = services[name]
            mapper = Mapper(volume_mounts(svc, a.workdir), a.bin)
            # the dependencies' conditions
            deps_ok = True
            for dep, cond in (svc.get("depends_on") or {}).items():
                c = (cond or {}).get("condition", "service_started")
                if status.get(dep) not in ({"service_healthy": ("healthy",),
                                            "service_completed_successfully": ("exited 0",)}
                                           .get(c, ("started", "healthy", "exited 0"))):
                    report("FAIL", f"{name}: dependency {dep} ({c})", f"{dep} is {status.get(dep, 'not run')}")
                    deps_ok = False
            if not deps_ok:
                status[name] = "not started"
                continue
            env = env_of(svc, mapper)
            argv0 = os.path.basename(service_argv(name, svc, cfg["services"], a.root)[0])
            if argv0 == "ballast-worker":
                known = worker_flags(a.bin)
                unknown = sorted(k for k in env if env_option(k) and env_option(k) not in known)
                pending = [k for k in unknown if env_option(k) in OFFLOAD_OPTS]
                typos = [k for k in unknown if k not in pending]
                if typos:
                    report("FAIL", f"{name}: every BALLAST_ variable is a ballast-worker option",
                           f"{', '.join(typos)} match no flag of `ballast-worker --help` (the worker ignores them)")
                if pending:
                    report("SKIP", f"{name}: offload through ballastd ({', '.join(pending)})",
                           f"ballast-worker has no --{env_option(pending[0])} yet (the offload work adds it); "
                           "this run trains without offload")
                    for k in pending:
                        del env[k]
                elif offload_on(env):
                    offloaded.append(name)
            world = int(env.get("WORLD_SIZE", "1") or 1)
            rank = int(env.get("RANK", "0") or 0)
            if world > 1 and not multi:
                if rank != 0:
                    report("SKIP", f"{name} (rank {rank} of {world})",
                           "ballast-worker has no multi-rank training yet ([parallel]); rank 0 trains alone")
                    status[name] = "skipped"
                    continue
            try:
                argv = mapper.argv(service_argv(name, svc, cfg["services"], a.root))
            except LookupError as e:
                report("FAIL", f"{name}: command maps to a local program", str(e))
                status[name] = "not started"
                continue
            logs[name] = os.path.join(a.workdir, f"{name}.log")
            print(f"# {name}: {' '.join(shlex.quote(x) for x in argv)}", flush=True)
            lf = open(logs[name], "w")
            p = subprocess.Popen(in_host(name, argv, a.workdir), env=env, stdout=lf, stderr=subprocess.STDOUT, cwd=a.workdir,
                                 start_new_session=True)
            running[name] = p
            status[name] = "started"
            hc = svc.get("healthcheck")
            # how others wait for this service decides how it runs here
            conds = {(c or {}).get("condition", "service_started") for s2 in services.values()
                     for d, c in (s2.get("depends_on") or {}).items() if d == name}
            background = bool(conds & {"service_healthy", "service_started"})
            if not background and world > 1 and multi:
                ranks.append(name)   # the ranks of one job run together; waited for below
            elif not background:
                # a step (init) or a leaf (worker): run it to the end
                wait_done(name, p, a.timeout, running, status, logs)
            elif "service_healthy" in conds:
                test = healthcheck_test(svc, cfg["services"], a.root)
                hc = hc or {}
                if not test or test[0] not in ("CMD", "CMD-SHELL"):
                    report("FAIL", f"{name} has a healthcheck", "others wait for service_healthy but it has no CMD test")
                    status[name] = "unhealthy"
                    continue
                interval = parse_duration(hc.get("interval"), 30)
                retries = int(hc.get("retries", 3))
                start = parse_duration(hc.get("start_period"), 0)
                # locally the first probe can come sooner than the interval
                deadline = time.time() + start + interval * retries
                probe = mapper.argv(test[1:]) if test[0] == "CMD" else ["sh", "-c", mapper.path(test[1])]
                healthy, last = False, ""
                while time.time() < deadline and p.poll() is None:
                    r = subprocess.run(in_host(name, probe, a.workdir), env=env, capture_output=True, text=True,
                                       timeout=parse_duration(hc.get("timeout"), 30) + 5)
                    if r.returncode == 0:
                        healthy = True
                        break
                    last = (r.stdout + r.stderr).strip()[-200:]
                    time.sleep(min(interval, 0.5))
                if healthy:
                    status[name] = "healthy"
                    report("OK", f"{name} passes its healthcheck ({' '.join(test[1:])})")
                else:
                    tail = open(logs[name]).read()[-400:].replace("\n", " / ")
                    report("FAIL", f"{name} passes its healthcheck",
                           f"exit {p.poll()}; probe said: {last}; log: {tail}")
                    status[name] = "unhealthy"

        for name in ranks:
            wait_done(name, running[name], a.timeout, running, status, logs)

        # training progress of every worker that ran
        trained = 0
        for name in names:
            svc = services[name]
            if status.get(name) != "exited 0":
                continue
            mapper = Mapper(volume_mounts(svc, a.workdir), a.bin)
            argv = service_argv(name, svc, cfg["services"], a.root)
            if not os.path.basename(argv[0]) == "ballast-worker":
                continue
            env = env_of(svc, mapper)
            rank = int(env.get("RANK", "0") or 0)
            world = int(env.get("WORLD_SIZE", "1") or 1)
            if world > 1:
                # the line naming the backend that joined the ranks (dist.c)
                text = open(logs[name]).read()
                line = re.search(r"rank \d+: \S+ group \(\d+ ranks\): (shm|gloo)\b.*", text)
                if line:
                    report("OK", f"{name}: ranks joined by {line.group(1)} ({line.group(0).strip()})")
                else:
                    report("FAIL", f"{name} logs the backend that joined the ranks",
                           "no 'rank R: ... group (N ranks): shm|gloo' line in: " + text[:600].replace("\n", " / "))
            if rank != 0:
                # only rank 0 logs the job's steps; the others trained with it
                report("OK", f"{name}: rank {rank} trained alongside rank 0 and exited 0")
                trained += 1
                continue
            log_json = None
            for i, x in enumerate(argv[:-1]):
                if x == "--log-json":
                    log_json = mapper.path(argv[i + 1])
            if not log_json or not os.path.exists(log_json):
                report("FAIL", f"{name} writes its step log", f"no --log-json file ({log_json})")
                continue
            ls = losses(log_json)
            bad = [x for x in ls if x != x or x in (float("inf"), float("-inf"))]
            if bad:
                report("FAIL", f"{name}: losses are finite", f"{len(bad)} of {len(ls)} are not")
            steps = int(env.get("BALLAST_STEPS", "0") or 0)
            if steps and len(ls) != steps:
                report("FAIL", f"{name} logs one line per step", f"{len(ls)} lines, BALLAST_STEPS={steps}")
            else:
                report("OK", f"{name} logs {len(ls)} steps")
            if len(ls) < 8:
                report("FAIL", f"{name}: loss falls", f"only {len(ls)} steps logged")
                continue
            q = max(2, len(ls) // 4)
            head, tail = sum(ls[:q]) / q, sum(ls[-q:]) / q
            print(f"# {name}: loss {ls[0]:.4f} -> {ls[-1]:.4f}; mean of the first {q} steps {head:.4f}, "
                  f"of the last {q} {tail:.4f}", flush=True)
            trained += 1
            ckpt = env.get("BALLAST_CKPT_DIR")
            if ckpt:
                # every rank's shards in the one checkpoint volume
                r = subprocess.run([os.path.join(a.bin, "ballast"), "ckpt", "info", ckpt], capture_output=True,
                                   text=True, timeout=60)
                m = re.search(r"^step\s+(\d+)", r.stdout, re.M)
                if r.returncode == 0 and m:
                    report("OK", f"{name}: a complete checkpoint of step {m.group(1)} in the checkpoint volume")
                else:
                    report("FAIL", f"{name} leaves a complete checkpoint in {ckpt}",
                           f"ballast ckpt info: exit {r.returncode}: {r.stderr.strip()[-300:]}")
            if tail < 0.85 * head:
                report("OK", f"{name}: loss falls (mean {head:.3f} over the first {q} steps -> {tail:.3f} over the last {q})")
            else:
                report("FAIL", f"{name}: loss falls", f"mean {head:.4f} -> {tail:.4f} (needs < 0.85x)")
        if trained == 0:
            report("FAIL", "a worker trained", "no ballast-worker service ran to the end with a step log")
        if offloaded and "ballastd" in running and running["ballastd"].poll() is None:
            d_argv = Mapper(volume_mounts(services["ballastd"], a.workdir), a.bin).argv(
                service_argv("ballastd", services["ballastd"], cfg["services"], a.root))
            sock = flag(d_argv, "--socket")
            r = subprocess.run(in_host("ballastd", [os.path.join(a.bin, "ballast"), "status", "--socket", sock, "--json"],
                                       a.workdir),
                               capture_output=True, text=True, timeout=30)
            try:
                opened = json.loads(r.stdout)["sessions_opened"]
            except (ValueError, KeyError):
                opened = None
            done = [n for n in offloaded if status.get(n) == "exited 0"]
            if opened is not None and opened >= len(done) > 0:
                report("OK", f"ballastd served the workers' offload: {opened} session(s) opened for {len(done)} worker(s)")
            else:
                report("FAIL", "the workers offloaded through ballastd",
                       f"ballast status: sessions_opened {opened} for {len(done)} finished worker(s) with offload on; {r.stderr.strip()[-200:]}")
    finally:
        # stop what is still running (ballastd) the way docker stops it: SIGTERM
        for name, p in list(running.items()):
            if p.poll() is not None:
                report("FAIL", f"{name} keeps running until the others are done", f"it exited {p.poll()} early")
                continue
            if name in HOSTS:
                # nsenter forwards no signal: SIGTERM every process of the
                # host but its holder (one service per host), as docker stop
                subprocess.run(in_host(name, ["bash", "-c", "kill -TERM -1 2> /dev/null; exit 0"], a.workdir),
                               timeout=30)
            else:
                p.send_signal(signal.SIGTERM)
            try:
                rc = p.wait(timeout=parse_duration(services[name].get("stop_grace_period"), 10))
                if rc == 0:
                    report("OK", f"{name} stops cleanly on SIGTERM")
                else:
                    report("FAIL", f"{name} stops cleanly on SIGTERM", f"exit {rc}")
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                report("FAIL", f"{name} stops on SIGTERM", "killed after the stop grace period")
    return 1 if "FAIL" in RESULTS else 0


if __name__ == "__main__":
    sys.exit(main())
