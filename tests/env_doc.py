#!/usr/bin/env python3
"""env_doc.py: docs/environment.md against the environment variables the
programs read.

  env_doc.py check    the variables the sources read (below) and the ones the
                      page lists in its tables' first column must be the same
                      set; prints each difference with where it is read.
  env_doc.py write    regenerates the page's option tables (between the
                      "<!-- options: PROGRAM ... -->" and "<!-- end -->"
                      markers) from each program's --help (run `make build`
                      first); the hand-written rows stay.
  --root DIR          (before either) check a copy of the tree instead.

What "read" means, in common/, services/ and workers/ (not tests/):
  - getenv("NAME") / secure_getenv("NAME");
  - env_or(FLAG, "NAME", DEFAULT) (ballast train's flag-or-variable lookups);
  - open_lib("NAME", ...) (a library path from a variable, comm/nccl.c);
  - the string literals of an array whose name has "env" in it
    (topology.c's field_env, nccl.c's nccl_wheel_envs);
  - every option table entry { "name", OPT_... }: PREFIX + NAME with dashes
    as underscores, PREFIX from the file's opt_set_env_prefix("...") or
    BALLAST_ (common/options.h).
Any other getenv(...) with a computed name fails the check, naming the line,
so a new way of reading a variable cannot hide from it. (opt_warn_moved_env's
getenv of the old BALLAST_<NAME> names only draws a warning; the page states
that rule instead of listing them.)"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "environment.md")
DIRS = ("common", "services", "workers")
EXTS = (".c", ".h", ".cu", ".cc")
NAME = r"[A-Z][A-Z0-9_]*"
# computed-name reads the rules above cover: (file, the call's text)
INDIRECT = {
    ("common/options.c", "getenv(env)"),        # option tables
    ("common/options.c", "getenv(old)"),        # opt_warn_moved_env: a warning only
    ("common/topology.c", "getenv(name)"),      # field_env
    ("workers/comm/nccl.c", "getenv(env)"),     # open_lib
    ("workers/comm/nccl.c", "getenv(nccl_wheel_envs[i][0])"),
    ("workers/cli/cmd_train.c", "getenv(env)"), # env_or
    ("workers/cli/cmd_train.c", "getenv(hide[i])"),  # RANK, LOCAL_RANK, WORLD_SIZE set aside (topology.c reads them)
}


def strip_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def sources():
    for d in DIRS:
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for f in sorted(files):
                if f.endswith(EXTS):
                    p = os.path.join(base, f)
                    yield os.path.relpath(p, ROOT), strip_comments(open(p, encoding="utf-8", errors="replace").read())


def read_in_code():
    """{variable: [where, ...]}, [problems]"""
    found, problems = {}, []

    def add(var, where):
        found.setdefault(var, []).append(where)

    for rel, text in sources():
        line_of = lambda pos: text.count("\n", 0, pos) + 1
        for m in re.finditer(r"\b(?:secure_)?getenv\s*\(\s*(\"(%s)\"|[^()]*(?:\([^()]*\))?[^()]*)\s*\)" % NAME, text):
            if m.group(2):
                add(m.group(2), "%s:%d" % (rel, line_of(m.start())))
            else:
                call = re.sub(r"\s+", "", "getenv(%s)" % m.group(1))
                if (rel, call) not in INDIRECT:
                    problems.append("%s:%d: %s reads a variable whose name the check cannot see; read it with a "
                                    "literal or teach tests/env_doc.py its table" % (rel, line_of(m.start()), call))
        for m in re.finditer(r"\benv_or\s*\([^;]*?,\s*\"(%s)\"" % NAME, text):
            add(m.group(1), "%s:%d (env_or)" % (rel, line_of(m.start())))
        for m in re.finditer(r"\bopen_lib\s*\(\s*\"(%s)\"" % NAME, text):
            add(m.group(1), "%s:%d (open_lib)" % (rel, line_of(m.start())))
        for m in re.finditer(r"\b(\w*env\w*)\s*(?:\[[^\]]*\])+\s*=\s*\{(.*?)\};", text, re.S):
            for lit in re.finditer(r"\"(%s)\"" % NAME, m.group(2)):
                add(lit.group(1), "%s:%d (%s)" % (rel, line_of(m.start()), m.group(1)))
        if re.search(r"\bOPT_(BOOL|INT|SIZE|DURATION|DOUBLE|STRING|ENUM)\s*,", text):
            pm = re.search(r"opt_set_env_prefix\s*\(\s*\"([A-Z_]+)\"", text)
            prefix = pm.group(1) if pm else "BALLAST_"
            for m in re.finditer(r"\{\s*\"([a-z0-9][a-z0-9-]*)\"\s*,\s*OPT_[A-Z]+\s*,", text):
                add(prefix + m.group(1).upper().replace("-", "_"),
                    "%s:%d (option --%s)" % (rel, line_of(m.start()), m.group(1)))
    return found, problems


def listed_on_page():
    """{variable: line number} of the first column of the page's table rows"""
    out = {}
    for i, line in enumerate(open(PAGE, encoding="utf-8"), 1):
        m = re.match(r"\|\s*`(%s)`\s*\|" % NAME, line)
        if m:
            out.setdefault(m.group(1), i)
    return out


def check():
    if not os.path.exists(PAGE):
        print("docs/environment.md is missing")
        return 1
    code, problems = read_in_code()
    page = listed_on_page()
    for p in problems:
        print(p)
    for v in sorted(set(code) - set(page)):
        print("%s is read (%s) but docs/environment.md does not list it" % (v, ", ".join(code[v][:3])))
    for v in sorted(set(page) - set(code)):
        print("docs/environment.md:%d lists %s, which no program reads" % (page[v], v))
    bad = problems or set(code) ^ set(page)
    if not bad:
        print("%d variables, each read in code and listed on the page" % len(code))
    return 1 if bad else 0


# ---- write: the option tables from --help ----

def help_rows(cmd):
    out = subprocess.run(cmd + ["--help"], capture_output=True, text=True, cwd=ROOT).stdout
    pm = re.search(r"settable as (\w+)<NAME>", out)
    prefix = pm.group(1) if pm else "BALLAST_"
    rows = []
    for line in out.splitlines():
        m = re.match(r"^  --([a-z0-9][a-z0-9-]*)(?: ([A-Z]+|\S*\|\S*))?\s+(.*?)(?: \(default: (.*)\))?$", line)
        if not m or m.group(1) == "help":
            continue
        name, typ, text, default = m.groups()
        default = default if default not in (None, "unset", '""') else "unset"
        rows.append("| `%s%s` | `--%s%s` | %s | %s |" % (prefix, name.upper().replace("-", "_"), name,
                                                     (" " + typ if typ else "").replace("|", "\\|"), default.replace("|", "\\|"),
                                                     text.replace("|", "\\|")))
    return rows


def write():
    text = open(PAGE, encoding="utf-8").read()

    def regen(m):
        cmd = m.group(1).split()
        prog = [os.path.join(ROOT, "build", "bin", cmd[0])] + cmd[1:]
        rows = help_rows(prog)
        return ("<!-- options: %s -->\n| variable | flag | default | meaning |\n|---|---|---|---|\n%s\n<!-- end -->"
                % (m.group(1), "\n".join(rows)))

    text = re.sub(r"<!-- options: (.*?) -->.*?<!-- end -->", regen, text, flags=re.S)
    open(PAGE, "w", encoding="utf-8").write(text)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "--root":  # a copy of the tree (the test plants mistakes in one)
        ROOT = os.path.abspath(args[1])
        PAGE = os.path.join(ROOT, "docs", "environment.md")
        args = args[2:]
    what = args[0] if args else "check"
    if what not in ("check", "write"):
        sys.exit("usage: env_doc.py [--root DIR] check|write")
    sys.exit(write() if what == "write" else check())
