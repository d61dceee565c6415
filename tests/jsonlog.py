#!/usr/bin/env python3
"""jsonlog.py: read the JSON log of ballast-worker --log-json (one object per
line: the "settings" record, a "layout" record on sharded runs, then one
record per optimizer step, with "step", "loss", "lr", ...; see
docs/observability.md) for the shell tests.

  jsonlog.py FILE [SELECT...] FIELD...   the fields of each selected record,
                                         space-separated, one line a record
  jsonlog.py FILE [SELECT...] --count    how many records are selected
  jsonlog.py FILE [SELECT...] --raw      the selected records' lines as logged

SELECT (applied in this order):
  --kind K     records of kind K ("settings", "layout"); default: the step
               records (those with a "step" field)
  --step N     only the record(s) of step N      --from N   steps >= N
  --first N    the first N of those              --last N   the last N
  --upto N     instead: every record, of any kind, through the first record
               of step N (the log cut there, as a run that stopped after it)

Values print as logged: numbers with the digits the worker wrote (so two
runs compare bit for bit as text), strings without quotes, null as "null",
objects and lists as JSON. A record without a requested field is an error.

Reading: every line must be a JSON object, except a last line cut short
(no newline and not valid JSON: a record being written, or a run killed
mid-write), which is ignored, as `ballast report` does. Any other bad line
stops with the file and line number. Exit status 0, 1 on an error.

As a module (tests/lib.sh puts tests/ on PYTHONPATH): records(path),
steps(path), first(path, kind), by_step(path, field), values(path, field).
"""
import json
import sys


class Logged(float):
    """A number that remembers the text it was logged as."""

    def __new__(cls, text):
        v = float.__new__(cls, text)
        v.text = text
        return v


def records(path, raw=False):
    """Every record of the log, in order. raw=True: numbers are Logged
    (floats that print as written) and each record gets "_line", its text."""
    out = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    last = len(lines) - 1  # after the final newline: "" (or a line cut short)
    for i, line in enumerate(lines):
        if i == last and not line:
            break
        try:
            r = json.loads(line, parse_float=Logged, parse_int=Logged) if raw else json.loads(line)
        except ValueError as e:
            if i == last:
                break  # cut short: being written, or the run was killed mid-write
            raise ValueError("%s:%d: not a JSON record (%s)" % (path, i + 1, e)) from None
        if not isinstance(r, dict):
            raise ValueError("%s:%d: not a JSON object" % (path, i + 1))
        if raw:
            r["_line"] = line
        out.append(r)
    return out


def is_step(r):
    return "step" in r


def steps(path):
    """The step records (those with a "step" field), in order."""
    return [r for r in records(path) if is_step(r)]


def first(path, kind):
    """The first record of this kind ("settings", "layout"), or None."""
    return next((r for r in records(path) if r.get("kind") == kind), None)


def by_step(path, field):
    """{step: value of field} over the step records that have it; a step
    logged again (a resumed run appending) keeps its last record."""
    return {r["step"]: r[field] for r in steps(path) if field in r}


def values(path, field):
    """The field of every step record that has it, in order."""
    return [r[field] for r in steps(path) if field in r]


def text(v):
    """How a value prints: as logged."""
    if isinstance(v, Logged):
        return v.text
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    return json.dumps(v)


def select(recs, kind=None, step=None, frm=None, nfirst=None, nlast=None, upto=None):
    if upto is not None:
        n = next((i for i, r in enumerate(recs) if is_step(r) and r["step"] == upto), len(recs) - 1)
        return recs[:n + 1]
    recs = [r for r in recs if (r.get("kind") == kind if kind else is_step(r))]
    if step is not None:
        recs = [r for r in recs if r.get("step") == step]
    if frm is not None:
        recs = [r for r in recs if r.get("step", frm) >= frm]
    if nfirst is not None:
        recs = recs[:nfirst]
    if nlast is not None:
        recs = recs[len(recs) - nlast:] if nlast else []
    return recs


def main(argv):
    usage = ("usage: jsonlog.py FILE [--kind K] [--step N] [--from N] [--first N] [--last N] [--upto N] "
             "(--count | --raw | FIELD...)")
    if len(argv) > 1 and argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(argv) < 2:
        print(usage, file=sys.stderr)
        return 1
    path, args = argv[1], argv[2:]
    opt = {"kind": None, "step": None, "frm": None, "nfirst": None, "nlast": None, "upto": None}
    names = {"--kind": "kind", "--step": "step", "--from": "frm", "--first": "nfirst", "--last": "nlast",
             "--upto": "upto"}
    mode, fields, i = None, [], 0
    while i < len(args):
        a = args[i]
        if a in names:
            if i + 1 == len(args):
                print("jsonlog.py: %s needs a value; %s" % (a, usage), file=sys.stderr)
                return 1
            v = args[i + 1]
            if a != "--kind":
                try:
                    v = int(v)
                except ValueError:
                    print("jsonlog.py: %s %s: not a whole number" % (a, v), file=sys.stderr)
                    return 1
            opt[names[a]] = v
            i += 2
            continue
        if a in ("--count", "--raw"):
            mode = a
        elif a.startswith("--"):
            print("jsonlog.py: unknown option %s; %s" % (a, usage), file=sys.stderr)
            return 1
        else:
            fields.append(a)
        i += 1
    if (mode is None) == (not fields):
        print("jsonlog.py: name the fields to print, or --count, or --raw (not both); %s" % usage, file=sys.stderr)
        return 1
    try:
        recs = select(records(path, raw=True), **opt)
    except (OSError, ValueError) as e:
        print("jsonlog.py: %s" % e, file=sys.stderr)
        return 1
    if mode == "--count":
        print(len(recs))
        return 0
    out = []
    for r in recs:
        if mode == "--raw":
            out.append(r["_line"])
            continue
        missing = [f for f in fields if f not in r]
        if missing:
            what = "step %s" % text(r["step"]) if is_step(r) else "the %s record" % r.get("kind")
            print("jsonlog.py: %s: %s has no field %s" % (path, what, ", ".join(missing)), file=sys.stderr)
            return 1
        out.append(" ".join(text(r[f]) for f in fields))
    if out:
        print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
