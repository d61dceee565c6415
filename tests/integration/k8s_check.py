#!/usr/bin/env python3
"""k8s_check.py: check rendered Kubernetes manifests (the output of
`kubectl kustomize`) for what parses fine but breaks at run time.

Not a schema validation (tests/k8s-schema/validate.js does that); it
checks what the schemas cannot see:
  - every object: a known apiVersion/kind pair, metadata.name a DNS-1123 name,
    required fields of its kind (selector, template, containers, images);
  - workload selectors match their pod template labels; every Service
    selects some pod template and its targetPorts exist on those containers;
  - probes (grpc/tcpSocket/httpGet) point at a declared containerPort, and
    ballastd's probes at its --health-port;
  - configMapRef/secretRef/volume references resolve (Secrets may be external:
    reported, not failed);
  - ballastd: memory request >= --pool-bytes; --metrics-port (and the
    worker's BALLAST_METRICS_PORT) a declared container port; its --socket directory is the
    mount of a hostPath (DaemonSet) and every worker mounts the same host
    path at the same directory; both run as the same uid (the fd socket's
    peer check);
  - ballastd's DaemonSet updates OnDelete (a rollout never restarts the
    service under a running job) and selects nodes by labels GKE and EKS set
    without extra software (cloud.google.com/gke-accelerator, the well-known
    instance type);
  - workers: /dev/shm is a memory emptyDir; nvidia.com/gpu limits set iff
    BALLAST_BACKEND is cuda, and then equal to PET_NPROC_PER_NODE (one pod
    per node holding all its GPUs); the container runs the launcher
    (`ballast train`); an Indexed Job whose completions and parallelism
    equal PET_NNODES; MASTER_ADDR is index 0 of the Job under a headless
    Service with publishNotReadyAddresses that is the pod template's
    subdomain; --ckpt-dir is a ReadWriteMany PersistentVolumeClaim; restarts
    resume (BALLAST_RESUME or --resume auto, and --max-restarts, a Job
    backoffLimit or a JobSet's maxRestarts); an EFA request equals its limit;
  - NetworkPolicies that guard a pod with a metrics port admit Prometheus
    to it;
  - offload: every worker-image container reading the training options
    (the worker and the `ballast doctor` init step) uses ballastd's --socket
    (BALLAST_OFFLOAD_SOCKET / --offload-socket), or in remote mode
    BALLAST_OFFLOAD_REMOTE names a Service port that reaches a remote
    ballastd's --listen port, whose API is guarded by --token-file or a
    NetworkPolicy; the doctor step skips the rendezvous check and mounts the
    worker's /dev/shm and socket directory.
Prints "OK|name" / "FAIL|name|why" lines; exit 1 if any check failed.
"""
import re
import sys

import yaml

KINDS = {
    ("v1", "ConfigMap"), ("v1", "Service"), ("v1", "Secret"), ("v1", "ServiceAccount"),
    ("apps/v1", "DaemonSet"), ("apps/v1", "Deployment"), ("apps/v1", "StatefulSet"),
    ("batch/v1", "Job"), ("policy/v1", "PodDisruptionBudget"), ("networking.k8s.io/v1", "NetworkPolicy"),
    ("v1", "PersistentVolumeClaim"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"),
}
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
FAILED = []


def ok(name):
    print(f"OK|{name}", flush=True)


def fail(name, why):
    FAILED.append(name)
    print(f"FAIL|{name}|{why}", flush=True)


def check(cond, name, why):
    ok(name) if cond else fail(name, why)
    return cond


SIZE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
        "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 1000}


def quantity(s):
    """Kubernetes quantity or ballast size (64M, 1.5G: powers of 1024) -> bytes."""
    m = re.fullmatch(r"([0-9.]+)\s*([KMGT]i?|k)?", str(s))
    if not m:
        raise ValueError(f"bad quantity {s!r}")
    return float(m.group(1)) * SIZE[m.group(2) or ""]


def flag(args, name):
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def pod_spec(o):
    spec = o.get("spec") or {}
    return ((spec.get("template") or {}).get("spec")) if o["kind"] != "Pod" else spec


def containers(o):
    ps = pod_spec(o) or {}
    return (ps.get("initContainers") or []) + (ps.get("containers") or [])


def env_of(c, configmaps):
    env = {}
    for ef in c.get("envFrom") or []:
        ref = (ef.get("configMapRef") or {}).get("name")
        if ref in configmaps:
            env.update(configmaps[ref].get("data") or {})
    for e in c.get("env") or []:
        if "value" in e:
            env[e["name"]] = str(e["value"])
    return env


def expand_jobsets(docs):
    """A JobSet as what its controller creates: per replicated job (one
    replica) an Indexed Job named <jobset>-<rjob>-0, and with
    network.enableDNSHostnames a headless Service named network.subdomain
    (default: the JobSet's name) that the pods use as their subdomain."""
    extra = []
    for js in [d for d in docs if d.get("kind") == "JobSet"]:
        spec = js.get("spec") or {}
        net = spec.get("network") or {}
        sub = net.get("subdomain") or js["metadata"]["name"]
        for rj in spec.get("replicatedJobs") or []:
            if rj.get("replicas", 1) != 1:
                fail(f"JobSet/{js['metadata']['name']}: {rj.get('name')} has one replica",
                     "ranks from JOB_COMPLETION_INDEX need replicas: 1")
            job = {"apiVersion": "batch/v1", "kind": "Job",
                   "metadata": {"name": f"{js['metadata']['name']}-{rj['name']}-0"},
                   "spec": (rj.get("template") or {}).get("spec") or {},
                   "_jobset_max_restarts": (spec.get("failurePolicy") or {}).get("maxRestarts", 0)}
            job["spec"].setdefault("template", {}).setdefault("spec", {})
            if net.get("enableDNSHostnames"):
                job["spec"]["template"]["spec"]["subdomain"] = sub
            extra.append(job)
        if net.get("enableDNSHostnames"):
            extra.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": sub},
                          "spec": {"clusterIP": "None",
                                   "publishNotReadyAddresses": net.get("publishNotReadyAddresses", True),
                                   "selector": {"jobset.sigs.k8s.io/jobset-name": js["metadata"]["name"]},
                                   "ports": []}})
            for j in extra:
                if j["kind"] == "Job":
                    md = j["spec"]["template"].setdefault("metadata", {})
                    md.setdefault("labels", {})["jobset.sigs.k8s.io/jobset-name"] = js["metadata"]["name"]
    return extra


def main(path, label):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    for d in docs:
        if not isinstance(d, dict):
            fail(f"{label}: a document is an object", repr(d)[:80])
            return 1
    real = list(docs)
    docs = docs + expand_jobsets(docs)
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    configmaps = {d["metadata"]["name"]: d for d in by_kind.get("ConfigMap", [])}
    secrets = {d["metadata"]["name"] for d in by_kind.get("Secret", [])}
    workloads = [d for d in docs if d.get("kind") in ("DaemonSet", "Deployment", "StatefulSet", "Job")]
    P = label + ": "

    # ---- every object ----
    names = set()
    for d in real:
        kind, av, md = d.get("kind"), d.get("apiVersion"), d.get("metadata") or {}
        n = md.get("name", "")
        tag = f"{P}{kind}/{n}"
        check((av, kind) in KINDS, f"{tag}: apiVersion {av} kind {kind}", "not a known apiVersion/kind pair")
        check(bool(n) and len(n) <= 253 and DNS1123.match(n) is not None, f"{tag}: name is DNS-1123", repr(n))
        check((kind, n) not in names, f"{tag}: unique", "duplicate kind/name")
        names.add((kind, n))

    # ---- workloads ----
    for w in workloads:
        tag = f"{P}{w['kind']}/{w['metadata']['name']}"
        spec = w.get("spec") or {}
        tmpl = spec.get("template") or {}
        labels = (tmpl.get("metadata") or {}).get("labels") or {}
        ps = tmpl.get("spec") or {}
        sel = (spec.get("selector") or {}).get("matchLabels")
        if w["kind"] != "Job" or sel:
            check(bool(sel) and all(labels.get(k) == v for k, v in sel.items()),
                  f"{tag}: selector matches the template labels", f"selector {sel}, labels {labels}")
        cs = ps.get("containers") or []
        check(bool(cs) and all(c.get("name") and c.get("image") for c in cs + (ps.get("initContainers") or [])),
              f"{tag}: containers have names and images", "missing containers, name or image")
        if w["kind"] == "Job":
            check(ps.get("restartPolicy") in ("Never", "OnFailure"), f"{tag}: restartPolicy Never/OnFailure",
                  f"restartPolicy {ps.get('restartPolicy')}")
        vols = {v["name"]: v for v in ps.get("volumes") or []}
        for c in containers(w):
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
            for vm in c.get("volumeMounts") or []:
                check(vm["name"] in vols, f"{tag}/{c['name']}: volume {vm['name']} exists", "no such volume")
            for ef in c.get("envFrom") or []:
                ref = (ef.get("configMapRef") or {}).get("name")
                if ref:
                    check(ref in configmaps, f"{tag}/{c['name']}: ConfigMap {ref} exists", "not rendered")
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                pr = c.get(kind)
                if not pr:
                    continue
                h = pr.get("grpc") or pr.get("tcpSocket") or pr.get("httpGet") or {}
                port = h.get("port")
                good = port in ports.values() or port in ports
                check(good, f"{tag}/{c['name']}: {kind} port {port} is a container port",
                      f"container ports {ports}")
                hp = flag(c.get("args") or [], "--health-port")
                if hp is not None and pr.get("grpc"):
                    check(str(port) == hp, f"{tag}/{c['name']}: {kind} probes --health-port {hp}",
                          f"probes {port}")
        for v in vols.values():
            s = (v.get("secret") or {}).get("secretName")
            if s and s not in secrets:
                ok(f"{tag}: Secret {s} is external (create it before applying)")

    # ---- Services ----
    for s in by_kind.get("Service", []):
        tag = f"{P}Service/{s['metadata']['name']}"
        sel = (s.get("spec") or {}).get("selector") or {}
        matches = [w for w in workloads if all(((w["spec"]["template"].get("metadata") or {}).get("labels") or {})
                                               .get(k) == v for k, v in sel.items())]
        if not check(bool(sel) and bool(matches), f"{tag}: selects a pod template", f"selector {sel} matches nothing"):
            continue
        for p in s["spec"].get("ports") or []:
            tp = p.get("targetPort", p.get("port"))
            cports = [(cp.get("name"), cp["containerPort"]) for w in matches for c in containers(w)
                      for cp in c.get("ports") or []]
            check(any(tp == n or tp == num for n, num in cports), f"{tag}: targetPort {tp} is a container port",
                  f"container ports {cports}")

    # ---- ballastd ----
    ballastd = []
    for w in workloads:
        for c in (pod_spec(w) or {}).get("containers") or []:
            if c.get("image", "").split(":")[0].endswith("ballast-offload") and c.get("args"):
                ballastd.append((w, c))
    check(len(ballastd) > 0, f"{P}a ballastd container exists", "no container runs the ballast-offload image")
    sock_host = None
    sock_path = None      # ballastd's --socket (node-local mode)
    remote_d = []         # (workload, container, --listen port) of remote-mode ballastds
    uid = {}
    for w, c in ballastd:
        tag = f"{P}{w['kind']}/{w['metadata']['name']}"
        args = c["args"]
        pool = quantity(flag(args, "--pool-bytes") or "1G")
        req = ((c.get("resources") or {}).get("requests") or {}).get("memory")
        check(req is not None and quantity(req) >= pool, f"{tag}: memory request >= --pool-bytes",
              f"request {req}, pool {flag(args, '--pool-bytes')}")
        uid["ballastd"] = ((pod_spec(w).get("securityContext") or {}).get("runAsUser"))
        mp = flag(args, "--metrics-port")
        cports = [str(cp["containerPort"]) for cp in c.get("ports") or []]
        check(mp is not None and mp != "0" and mp in cports, f"{tag}: --metrics-port {mp} is a container port",
              f"container ports {cports}")
        sockdir = (flag(args, "--socket") or "/run/ballast/ballastd.sock").rsplit("/", 1)[0]
        vols = {v["name"]: v for v in pod_spec(w).get("volumes") or []}
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
        check(sockdir in mounts, f"{tag}: the socket directory {sockdir} is a volume", f"mounts {list(mounts)}")
        if w["kind"] == "DaemonSet":
            check(((w["spec"].get("updateStrategy") or {}).get("type")) == "OnDelete",
                  f"{tag}: updateStrategy OnDelete (a rollout never drops a running job's optimizer state)",
                  f"updateStrategy {w['spec'].get('updateStrategy')}")
            ps_ = pod_spec(w)
            terms = ((((ps_.get("affinity") or {}).get("nodeAffinity") or {})
                      .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
            keys = {e.get("key") for t in terms for e in t.get("matchExpressions") or []}
            if ps_.get("nodeSelector") or terms:
                check(not ps_.get("nodeSelector") and {"cloud.google.com/gke-accelerator", "node.kubernetes.io/instance-type"} <= keys,
                      f"{tag}: selects GPU nodes by labels GKE and EKS set with the stock device plugin",
                      f"nodeSelector {ps_.get('nodeSelector')}, affinity keys {sorted(k for k in keys if k)}")
        if w["kind"] == "DaemonSet" and sockdir in mounts:
            hp = (vols.get(mounts[sockdir]) or {}).get("hostPath")
            if check(hp is not None, f"{tag}: the socket directory is a hostPath", "node-local ballastd needs one"):
                sock_host = (hp["path"], sockdir)
                sock_path = flag(args, "--socket") or "/run/ballast/ballastd.sock"
        if w["kind"] != "DaemonSet":
            check(flag(args, "--listen") is not None, f"{tag}: a ballastd outside the nodes listens on TCP",
                  "remote mode needs --listen")
            labels = (w["spec"]["template"].get("metadata") or {}).get("labels") or {}
            listen_port = (flag(args, "--listen") or ":").rpartition(":")[2]
            # a NetworkPolicy on ballastd's pods that admits the worker pods to
            # the --listen port and nobody else
            worker_labels = [(pod_spec(j_) and (j_["spec"]["template"].get("metadata") or {}).get("labels")) or {}
                             for j_ in by_kind.get("Job", []) if any(
                                 c_.get("image", "").split(":")[0].endswith("ballast-worker")
                                 for c_ in pod_spec(j_).get("containers") or [])]
            covers = lambda r: not r.get("ports") or any(str(pp.get("port")) == listen_port for pp in r["ports"])
            rules = [r for n in by_kind.get("NetworkPolicy", [])
                     if all(labels.get(k) == v for k, v in
                            (((n.get("spec") or {}).get("podSelector") or {}).get("matchLabels") or {}).items())
                     and "Ingress" in ((n.get("spec") or {}).get("policyTypes") or ["Ingress"])
                     for r in (n["spec"].get("ingress") or [])]
            from_workers = any(covers(r) and any(
                all(wl.get(k) == v for k, v in ((f.get("podSelector") or {}).get("matchLabels") or {}).items())
                for f in r.get("from") or [] for wl in worker_labels) for r in rules)
            open_all = any(covers(r) and not r.get("from") for r in rules)
            check(flag(args, "--token-file") is not None or (from_workers and not open_all),
                  f"{tag}: remote mode's API is guarded (--token-file, or a NetworkPolicy admitting only the workers to port {listen_port})",
                  f"no --token-file; NetworkPolicy admits the workers to {listen_port}: {from_workers}, anyone: {open_all}")
            remote_d.append((w, c, listen_port))
            if mp and mp != "0":
                mp_rules = [r for r in rules if r.get("ports") and any(str(pp.get("port")) == mp for pp in r["ports"])]
                prom = any(any(((f.get("podSelector") or {}).get("matchLabels") or {}).get("app.kubernetes.io/name") == "prometheus"
                               for f in r.get("from") or []) or not r.get("from") for r in mp_rules)
                check(not rules or prom, f"{tag}: the NetworkPolicy lets Prometheus scrape --metrics-port {mp}",
                      f"no ingress rule admits pods app.kubernetes.io/name=prometheus to {mp}")

    # ---- workers ----
    jobs = [w for w in by_kind.get("Job", []) if any(c.get("image", "").split(":")[0].endswith("ballast-worker")
                                                    for c in pod_spec(w).get("containers") or [])]
    check(len(jobs) > 0, f"{P}a worker Job exists", "no Job runs the ballast-worker image")
    for j in jobs:
        tag = f"{P}Job/{j['metadata']['name']}"
        ps = pod_spec(j)
        vols = {v["name"]: v for v in ps.get("volumes") or []}
        uid["workers"] = (ps.get("securityContext") or {}).get("runAsUser")
        for c in ps.get("containers") or []:
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
            shm = vols.get(mounts.get("/dev/shm"), {})
            check((shm.get("emptyDir") or {}).get("medium") == "Memory", f"{tag}/{c['name']}: /dev/shm is a memory emptyDir",
                  f"/dev/shm volume {shm}")
            env = env_of(c, configmaps)
            wmp = flag(c.get("args") or [], "--metrics-port") or env.get("BALLAST_METRICS_PORT", "0")
            if wmp != "0":
                check(wmp in [str(cp["containerPort"]) for cp in c.get("ports") or []],
                      f"{tag}/{c['name']}: the worker's metrics port {wmp} is a container port", f"ports {c.get('ports')}")
            backend = env.get("BALLAST_BACKEND", "cpu")
            res = c.get("resources") or {}
            limits = res.get("limits") or {}
            gpus = int(limits.get("nvidia.com/gpu", 0))
            per_node = int(env.get("PET_NPROC_PER_NODE", "1"))
            check((backend == "cuda") == (gpus > 0), f"{tag}/{c['name']}: GPU limits match BALLAST_BACKEND={backend}",
                  f"nvidia.com/gpu limit {gpus}")
            if gpus:
                check(gpus == per_node, f"{tag}/{c['name']}: the pod holds PET_NPROC_PER_NODE {per_node} GPUs (one worker each)",
                      f"nvidia.com/gpu limit {gpus}")
            efa = limits.get("vpc.amazonaws.com/efa")
            if efa is not None:
                check((res.get("requests") or {}).get("vpc.amazonaws.com/efa") == efa,
                      f"{tag}/{c['name']}: EFA request equals its limit ({efa})", f"requests {res.get('requests')}")
            cmd = c.get("command") or []
            check(cmd[-2:] == ["/usr/local/bin/ballast", "train"] or cmd[-1:] == ["train"] and "ballast" in cmd[0],
                  f"{tag}/{c['name']}: runs the launcher (ballast train), one per pod",
                  f"command {cmd}")
            cargs = c.get("args") or []
            ck = flag(cargs, "--ckpt-dir") or env.get("BALLAST_CKPT_DIR")
            if check(ck is not None, f"{tag}/{c['name']}: has a --ckpt-dir", "no checkpoints: a restart would begin at step 0"):
                mpath = max((m for m in mounts if ck == m or ck.startswith(m.rstrip("/") + "/")), key=len, default=None)
                vol = vols.get(mounts.get(mpath), {})
                claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
                pvc = [x for x in by_kind.get("PersistentVolumeClaim", []) if x["metadata"]["name"] == claim]
                check(bool(pvc) and "ReadWriteMany" in (pvc[0]["spec"].get("accessModes") or []),
                      f"{tag}/{c['name']}: --ckpt-dir {ck} is a ReadWriteMany volume shared by every pod",
                      f"{ck} is on {vol or 'no volume'}" + (f", claim {claim} modes {pvc[0]['spec'].get('accessModes')}" if pvc else ""))
            resume = flag(cargs, "--resume") or env.get("BALLAST_RESUME", "false")
            restarts = int(flag(cargs, "--max-restarts") or 0)
            retry = (j["spec"].get("backoffLimit") or 0) > 0 or j.get("_jobset_max_restarts", 0) > 0
            check(resume == "auto" and (restarts > 0 or retry),
                  f"{tag}/{c['name']}: restarts resume (--resume auto; --max-restarts {restarts}, "
                  f"backoffLimit {j['spec'].get('backoffLimit')})", f"resume {resume!r}")
            if sock_host:
                hp, sockdir = sock_host
                v = vols.get(mounts.get(sockdir), {})
                check((v.get("hostPath") or {}).get("path") == hp,
                      f"{tag}/{c['name']}: mounts ballastd's socket directory (host {hp}) at {sockdir}",
                      f"{sockdir} is {v or 'not mounted'}")
            spec = j["spec"]
            nodes = int(env.get("PET_NNODES", "1"))
            check(spec.get("completionMode") == "Indexed", f"{tag}: Indexed (JOB_COMPLETION_INDEX is the node rank)",
                  f"completionMode {spec.get('completionMode')}")
            check(spec.get("completions") == nodes and spec.get("parallelism") == nodes and "WORLD_SIZE" not in env,
                  f"{tag}: completions and parallelism equal PET_NNODES {nodes} (the launcher sets WORLD_SIZE)",
                  f"completions {spec.get('completions')}, parallelism {spec.get('parallelism')}, "
                  f"WORLD_SIZE {env.get('WORLD_SIZE')}")
            sub = ps.get("subdomain")
            hs = [s for s in by_kind.get("Service", []) if s["metadata"]["name"] == sub]
            check(bool(hs) and hs[0]["spec"].get("clusterIP") == "None" and hs[0]["spec"].get("publishNotReadyAddresses") is True,
                  f"{tag}: subdomain {sub} is a headless Service publishing not-ready addresses", f"services {hs}")
            want = f"{j['metadata']['name']}-0.{sub}"
            ma = env.get("MASTER_ADDR", "")
            check(ma == want or ma.startswith(want + "."), f"{tag}: MASTER_ADDR is index 0 ({want})", f"MASTER_ADDR {ma!r}")
        # every container of the worker pod that reads the training options
        # (the worker, the doctor init container) finds ballastd
        for c in containers(j):
            if not c.get("image", "").split(":")[0].endswith("ballast-worker") or not c.get("envFrom"):
                continue
            ctag = f"{tag}/{c['name']}"
            env = env_of(c, configmaps)
            args = (c.get("command") or [])[1:] + (c.get("args") or [])
            remote = flag(args, "--offload-remote") or env.get("BALLAST_OFFLOAD_REMOTE")
            sock = flag(args, "--offload-socket") or env.get("BALLAST_OFFLOAD_SOCKET") or "unix:/run/ballast/ballastd.sock"
            offload = (env.get("BALLAST_ACTIVATION_OFFLOAD", "false").lower() in ("1", "true", "yes")
                       or env.get("BALLAST_OPTIMIZER_OFFLOAD", "none") not in ("", "none"))
            if remote:
                host, _, port = remote.rpartition(":")
                svc = [s for s in by_kind.get("Service", []) if s["metadata"]["name"] == host]
                hits = []
                for s_ in svc:
                    for p in s_["spec"].get("ports") or []:
                        if str(p.get("port")) != port:
                            continue
                        tp = p.get("targetPort", p.get("port"))
                        sel = s_["spec"].get("selector") or {}
                        for w, dc, lp in remote_d:
                            lab = (w["spec"]["template"].get("metadata") or {}).get("labels") or {}
                            if sel and all(lab.get(k) == v for k, v in sel.items()):
                                cps = {cp.get("name"): cp["containerPort"] for cp in dc.get("ports") or []}
                                num = cps.get(tp, tp)
                                if str(num) == lp:
                                    hits.append(w["metadata"]["name"])
                check(bool(hits), f"{ctag}: BALLAST_OFFLOAD_REMOTE {remote} reaches a remote ballastd's --listen port",
                      f"Services {[x['metadata']['name'] for x in by_kind.get('Service', [])]}, remote ballastds "
                      f"{[(w['metadata']['name'], lp) for w, _, lp in remote_d]}")
            elif sock_path:
                path = sock[5:] if sock.startswith("unix:") else sock
                check(path == sock_path, f"{ctag}: offload socket {sock} is ballastd's --socket",
                      f"ballastd serves {sock_path}")
            elif offload:
                fail(f"{ctag}: offload has a ballastd", "offload is on but no node-local or remote ballastd is rendered")
            if c.get("command") and c["command"][-1:] == ["doctor"] or (c.get("command") or [])[1:2] == ["doctor"]:
                skip = (flag(args, "--skip") or env.get("BALLAST_SKIP") or "").split(",")
                check("rendezvous" in skip, f"{ctag}: the doctor init step skips the rendezvous check",
                      "rank 0 serves the rendezvous only once its worker runs: every pod would wait for it")
                mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
                wmounts = {m["mountPath"]: m["name"] for w_ in ps.get("containers") or [] for m in w_.get("volumeMounts") or []}
                for mp in ("/dev/shm", (sock_host or (None, None))[1]):
                    if mp and mp in wmounts:
                        check(mounts.get(mp) == wmounts[mp], f"{ctag}: the doctor sees the worker's {mp}",
                              f"doctor mounts {mounts.get(mp)!r}, the worker {wmounts[mp]!r}")
    if "ballastd" in uid and "workers" in uid and sock_host:
        check(uid["ballastd"] == uid["workers"] and uid["ballastd"] is not None,
              f"{P}ballastd and the workers run as the same uid (fd socket peer check)", f"uids {uid}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]))
