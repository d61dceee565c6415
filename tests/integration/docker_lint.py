#!/usr/bin/env python3
"""docker_lint.py: check that docker/Dockerfile.* agree with the repository.

  docker_lint.py ROOT DOCKERFILE BINS DEPS_PKGS

BINS and DEPS_PKGS are the Makefile's variables (space separated), as
`make -pq` prints them. Checks, one "OK|..." / "FAIL|..." / "SKIP|..." line each:
  - multi-stage: a named build stage, and every COPY --from names a stage;
  - each COPY source (build context = ROOT) exists and is not excluded by
    .dockerignore;
  - the `make` targets in RUN are programs the Makefile builds (BINS), and
    each program the build stage copies out is one of those targets;
  - the packages the build stage installs are DEPS_PKGS names (so `make
    deps` and the image agree), NVIDIA's libnccl* excepted;
  - ENTRYPOINT (and HEALTHCHECK CMD) use exec form, and run a program the
    image holds (/usr/local/bin/NAME copied from the build stage);
  - the final stage runs as a non-root numeric USER.
Exit 1 when a check failed.
"""
import fnmatch
import json
import os
import re
import shlex
import sys

FAILED = []


def out(kind, name, why=""):
    if kind == "FAIL":
        FAILED.append(name)
    print(f"{kind}|{name}|{why}".rstrip("|"), flush=True)


def instructions(text):
    """(INSTRUCTION, argument text) with line continuations joined, comments dropped."""
    lines, cur = [], ""
    for raw in text.splitlines():
        s = raw.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if s.startswith("#"):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        m = re.match(r"(\w+)\s+(.*)", cur)
        if m:
            lines.append((m.group(1).upper(), m.group(2).strip()))
        cur = ""
    return lines


def dockerignore(root):
    p = os.path.join(root, ".dockerignore")
    if not os.path.exists(p):
        return []
    return [l.strip() for l in open(p) if l.strip() and not l.startswith("#")]


def main(root, path, bins, deps):
    name = os.path.basename(path)
    ins = instructions(open(path).read())
    bins = {b.split("/")[-1] for b in bins.split()}
    deps = set(deps.split())
    ignore = dockerignore(root)

    stages, final_user, in_final = [], None, False
    froms = [i for i, (k, _) in enumerate(ins) if k == "FROM"]
    if len(froms) < 2:
        out("FAIL", f"{name}: multi-stage", f"{len(froms)} FROM line(s)")
    else:
        out("OK", f"{name}: multi-stage ({len(froms)} stages)")
    made, copied_out, image_bins = set(), set(), set()
    for idx, (k, arg) in enumerate(ins):
        if k == "FROM":
            m = re.search(r"\s+AS\s+(\S+)", arg, re.I)
            stages.append(m.group(1) if m else None)
            in_final = idx == froms[-1]
        elif k == "COPY":
            words = shlex.split(arg)
            opts = [w for w in words if w.startswith("--")]
            rest = [w for w in words if not w.startswith("--")]
            srcs, dest = rest[:-1], rest[-1]
            frm = [o.split("=", 1)[1] for o in opts if o.startswith("--from=")]
            if frm:
                if frm[0] in stages:
                    out("OK", f"{name}: COPY --from={frm[0]} names a stage")
                else:
                    out("FAIL", f"{name}: COPY --from={frm[0]} names a stage", f"stages {stages}")
                if in_final and any(s.rstrip("/").endswith("/bin") for s in srcs) and dest.startswith("/usr/local/bin"):
                    image_bins |= {f"/usr/local/bin/{b}" for b in copied_out}
                continue
            for s in srcs:
                p = os.path.join(root, s)
                if not os.path.exists(p):
                    out("FAIL", f"{name}: COPY source {s} exists", f"no {p}")
                elif any(fnmatch.fnmatch(s.rstrip("/"), pat.rstrip("/")) or s.startswith(pat.rstrip("/") + "/")
                         for pat in ignore):
                    out("FAIL", f"{name}: COPY source {s} is in the build context", ".dockerignore excludes it")
                else:
                    out("OK", f"{name}: COPY source {s} exists")
        elif k == "RUN":
            for seg in re.split(r"&&|;", arg):
                w = shlex.split(seg)
                if w and w[0] == "make":
                    targets = [x for x in w[1:] if "=" not in x and not x.startswith("-")]
                    for t in targets:
                        b = t.split("/")[-1]
                        if not t.startswith("build/bin/"):
                            out("FAIL", f"{name}: make target {t} is a program", "expected build/bin/NAME")
                        elif b in bins:
                            out("OK", f"{name}: the Makefile builds {t}")
                            made.add(b)
                        elif b == "ballastd" and not os.path.exists(os.path.join(root, "services/offload/main.c")):
                            out("SKIP", f"{name}: the Makefile builds {t}",
                                "services/offload/main.c is not in this tree yet (ballastd lands with the offload service)")
                            made.add(b)
                        else:
                            out("FAIL", f"{name}: the Makefile builds {t}", f"not in BINS: {sorted(bins)}")
                if w and w[0] == "cp" and any(x.startswith("build/bin/") for x in w):
                    for x in w[1:-1]:
                        b = x.split("/")[-1]
                        copied_out.add(b)
                        if b not in made:
                            out("FAIL", f"{name}: copies {x} after building it", f"make targets {sorted(made)}")
                if w and w[:2] == ["apt-get", "install"] and idx < froms[-1]:
                    pk = [x for x in w[2:] if not x.startswith("-")]
                    bad = [x for x in pk if x not in deps and not x.startswith("libnccl")]
                    if bad:
                        out("FAIL", f"{name}: build packages are DEPS_PKGS names", f"not in DEPS_PKGS: {bad}")
                    else:
                        out("OK", f"{name}: build packages ({len(pk)}) are DEPS_PKGS names")
        elif k == "USER" and in_final:
            final_user = arg
        elif k in ("ENTRYPOINT", "HEALTHCHECK"):
            a = arg
            if k == "HEALTHCHECK":
                m = re.search(r"\bCMD\s+(.*)$", arg)
                a = m.group(1) if m else ""
            try:
                v = json.loads(a)
                assert isinstance(v, list) and v
            except (ValueError, AssertionError):
                out("FAIL", f"{name}: {k} uses exec form", f"{a!r} is not a JSON array (shell form: signals go to sh)")
                continue
            out("OK", f"{name}: {k} uses exec form")
            if v[0] in image_bins:
                out("OK", f"{name}: {k} runs {v[0]}, built by the Makefile")
            else:
                out("FAIL", f"{name}: {k} runs a program of the image", f"{v[0]} not among {sorted(image_bins)}")
    if final_user and re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", final_user):
        out("OK", f"{name}: runs as uid {final_user}")
    else:
        out("FAIL", f"{name}: non-root numeric USER in the final stage", f"USER {final_user}")
    if not any(k == "ENTRYPOINT" for k, _ in ins):
        out("FAIL", f"{name}: has an ENTRYPOINT", "none")
    print(f"UID|{(final_user or '').split(':')[0]}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
