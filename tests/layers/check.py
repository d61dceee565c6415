#!/usr/bin/env python3
"""tests/layers/check.py: the layering of the tree, checked on its #include
graph and, given a build directory, on the symbols its objects define and use.

  tests/layers/check.py [--root DIR] [--objects BUILD] [--tap]

--root checks another copy of the tree (default: this checkout; a copy that
is no git checkout is read whole).

Folders are layers that only point down (docs/layers.md):
  proto     the wire formats (*.proto, the ring), generated code in build/gen
  common    the shared C library: may use proto
  services  ballastd, the rendezvous store, the probe: common and proto only,
            never workers/; one service never includes another's files
  workers   the folders of WORKER_LAYERS below, bottom up; a folder may use
            the folders below it (and services/rendezvous, the rendezvous
            client, from comm up), never one above or beside it
  tests     anything

Failures: an include (or a symbol use) that points up or sideways, and any
cycle between files. A file's module is its stem (foo.c with foo.h); a
header with no source file of its stem (a table of types, a private header)
is no module of its own: what it includes counts for the files that
include it. The module graph joins modules through #include and, with
--objects, through symbols: an object that calls a function defined in
another depends on it, which is how two .c files behind one header are seen
to need each other.
Exit status 1 on any failure; --tap prints one TAP line per check."""
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))

# workers/ folders, bottom up. Folders on one line are independent of each
# other: neither may use the other.
WORKER_LAYERS = [
    ['backend', 'data'],
    ['comm'],
    ['model'],
    ['plan'],
    ['parallel'],
    ['ckpt', 'offload'],
    ['train'],
    ['cli'],
    ['.'],          # the mains: workers/*_main.c
]
SRC_EXT = ('.c', '.h', '.cu', '.cuh', '.cc', '.cpp')
INC_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def rank_of(path):
    """(group, rank, folder) of a tree path; rank orders the workers layers."""
    parts = path.split('/')
    top = parts[0]
    if top == 'proto':
        return ('proto', 0, 'proto')
    if top == 'common':
        return ('common', 1, 'common')
    if top == 'services':
        return ('services', 2, 'services/' + parts[1])
    if top == 'workers':
        folder = parts[1] if len(parts) > 2 else '.'
        for i, names in enumerate(WORKER_LAYERS):
            if folder in names:
                return ('workers', 10 + i, 'workers/' + folder)
        return ('workers', None, 'workers/' + folder)
    if top == 'tests':
        return ('tests', 100, 'tests')
    if top == 'build':
        return ('proto', 0, 'proto')   # generated from proto/
    return (top, None, top)


def allowed(src, dst):
    """None when file src may include (or call into) dst, else the reason."""
    gs, rs, fs = rank_of(src)
    gd, rd, fd = rank_of(dst)
    if fs == fd or gs == 'tests':
        return None
    if gd == 'tests':
        return '%s uses test code (%s)' % (fs, dst)
    if gs == 'proto':
        return 'proto uses %s' % fd
    if gs == 'common':
        return None if gd == 'proto' else 'common uses %s: common may use only itself and proto' % fd
    if gs == 'services':
        if gd in ('proto', 'common'):
            return None
        if gd == 'workers':
            return 'a service uses worker code (%s)' % fd
        return 'one service uses another (%s)' % fd
    if gs == 'workers':
        if rs is None:
            return '%s is not a known workers layer (add it to WORKER_LAYERS)' % fs
        if gd in ('proto', 'common'):
            return None
        if fd == 'services/rendezvous':
            return None if rs >= rank_of('workers/comm/x.c')[1] else \
                '%s uses the rendezvous store; only comm and above may' % fs
        if gd == 'services':
            return 'worker code uses service internals (%s); speak to it through proto/' % fd
        if rd is None:
            return '%s is not a known workers layer' % fd
        if rd > rs:
            return 'a lower layer uses a higher one: %s -> %s' % (fs, fd)
        if rd == rs:
            return 'independent layers use each other: %s -> %s' % (fs, fd)
        return None
    return None


def tracked_sources():
    git = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard'], cwd=ROOT,
                         capture_output=True, text=True)
    if git.returncode == 0 and os.path.isdir(os.path.join(ROOT, '.git')):
        out = git.stdout.split()
    else:
        out = [os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(ROOT) for f in fs]
    return sorted(p for p in out if p.endswith(SRC_EXT) and p.split('/')[0] in
                  ('proto', 'common', 'services', 'workers', 'tests') and os.path.isfile(os.path.join(ROOT, p)))


def resolve(inc, src, files):
    """The tree path an include names, as the compiler's -I. -Icommon -Ibuild/gen would find it."""
    for base in (os.path.dirname(src), '', 'common'):
        p = os.path.normpath(os.path.join(base, inc))
        if p in files:
            return p
    if inc.endswith('.pb-c.h'):
        proto = 'proto/' + inc[:-len('.pb-c.h')] + '.proto'
        if os.path.isfile(os.path.join(ROOT, proto)):
            return proto
    return None


def module(path):
    stem, _ = os.path.splitext(path)
    return stem


def has_source(header, files):
    stem = module(header)
    return any(stem + ext in files for ext in ('.c', '.cu', '.cc', '.cpp'))


def cycles(graph):
    """The strongly connected components of graph (dict node -> set of nodes)
    with more than one node, each as a list, smallest node first (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    nodes = sorted(set(graph) | {m for ms in graph.values() for m in ms})
    counter = [0]

    def visit(v):
        # iterative, so a deep graph cannot overflow Python's stack
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            n, it = work[-1]
            for m in it:
                if m not in index:
                    index[m] = low[m] = counter[0]
                    counter[0] += 1
                    stack.append(m)
                    on.add(m)
                    work.append((m, iter(sorted(graph.get(m, ())))))
                    break
                if m in on:
                    low[n] = min(low[n], index[m])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[n])
                if low[n] == index[n]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == n:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return sorted(out)


def describe(comp, edges):
    """One line for a cycle: its files and what ties them."""
    ties = ['%s -> %s (%s)' % (module(a), module(b), why) for (a, b), why in sorted(edges.items())
            if module(a) in comp and module(b) in comp and module(a) != module(b)]
    return 'cycle between %s: %s' % (', '.join(comp), '; '.join(ties[:8]))


def symbol_edges(build):
    """(module -> module, symbol) for every function or object one tree object
    uses and another defines, from nm of the objects under BUILD/obj and
    BUILD/cuobj."""
    defs, uses = {}, {}
    for sub in ('obj', 'cuobj'):
        top = os.path.join(build, sub)
        for d, _, fs in os.walk(top):
            for f in fs:
                if not f.endswith('.o'):
                    continue
                obj = os.path.join(d, f)
                rel = os.path.relpath(obj, top)[:-2]
                if rel.startswith('gen/') or rel.split('/')[0] not in ('common', 'services', 'workers'):
                    continue
                src = None
                for ext in ('.c', '.cu', '.cc'):
                    if os.path.isfile(os.path.join(ROOT, rel + ext)):
                        src = rel + ext
                if not src:
                    continue
                nm = subprocess.run(['nm', '--defined-only', '-g', obj], capture_output=True, text=True).stdout
                for line in nm.splitlines():
                    p = line.split()
                    if len(p) == 3 and p[1] in 'TDBRVW':
                        defs.setdefault(p[2], src)
                nm = subprocess.run(['nm', '-u', obj], capture_output=True, text=True).stdout
                uses[src] = [l.split()[-1] for l in nm.splitlines() if l.strip()]
    edges = {}
    for src, syms in uses.items():
        for s in syms:
            d = defs.get(s)
            if d and d != src:
                edges.setdefault((src, d), s)
    return edges


def main():
    global ROOT
    tap = '--tap' in sys.argv
    if '--root' in sys.argv:
        ROOT = os.path.abspath(sys.argv[sys.argv.index('--root') + 1])
    build = None
    if '--objects' in sys.argv:
        build = sys.argv[sys.argv.index('--objects') + 1]
    files = set(tracked_sources())
    problems = []
    includes = {}
    for src in sorted(files):
        text = open(os.path.join(ROOT, src), errors='replace').read()
        for inc in INC_RE.findall(text):
            dst = resolve(inc, src, files)
            if not dst:
                continue
            why = allowed(src, dst)
            if why:
                problems.append('%s includes "%s": %s' % (src, inc, why))
            includes.setdefault(src, []).append((inc, dst))

    def reached(f, seen):
        """The module headers f includes, through headers that are no module."""
        out = []
        for inc, dst in includes.get(f, ()):
            if dst in seen:
                continue
            seen.add(dst)
            if dst.endswith(('.h', '.cuh')) and not has_source(dst, files) and not dst.startswith('proto/'):
                out += [(inc + ' -> ' + i, d) for i, d in reached(dst, seen)]
            else:
                out.append((inc, dst))
        return out

    graph, why_edge = {}, {}
    for src in sorted(files):
        if rank_of(src)[0] == 'tests':
            continue
        if src.endswith(('.h', '.cuh')) and not has_source(src, files):
            continue
        for inc, dst in reached(src, set()):
            if module(src) != module(dst):
                graph.setdefault(module(src), set()).add(module(dst))
                why_edge.setdefault((src, dst), '#include "%s"' % inc)
    checks = [('the #include graph points only down', problems)]
    checks.append(('no cycle between files through #include', [describe(c, why_edge) for c in cycles(graph)]))
    if build:
        sym_problems = []
        sgraph = {k: set(v) for k, v in graph.items()}
        for (src, dst), sym in sorted(symbol_edges(build).items()):
            why = allowed(src, dst)
            if why:
                sym_problems.append('%s calls %s (%s): %s' % (src, sym, dst, why))
            if module(src) != module(dst):
                sgraph.setdefault(module(src), set()).add(module(dst))
                why_edge.setdefault((src, dst), 'uses ' + sym)
        checks.append(('the symbols objects use point only down', sym_problems))
        checks.append(('no cycle between files through #include and symbols',
                       [describe(c, why_edge) for c in cycles(sgraph)]))
    failed = 0
    for name, probs in checks:
        if tap:
            print(('ok - ' if not probs else 'not ok - ') + name)
            for p in probs[:40]:
                print('#   ' + p)
        else:
            for p in probs:
                print('layers: ' + p)
        failed += bool(probs)
    if not tap and not failed:
        print('layers: %d files, the graph points down and has no cycle' % len(files))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
