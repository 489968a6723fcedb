#!/usr/bin/env python3
"""Run the mutants gremlins reported NOT COVERED against the package's tests.

gremlins v0.6.0 decides coverage from Go's coverage blocks, and Go's
coverage blocks do not include the expressions of a switch's case clauses:
a mutant there ("case len(x) > max:") is reported NOT COVERED however many
tests evaluate it. This script applies each such mutant itself (the same
token replacement gremlins makes), runs the package's own tests under
-short, and reports which are killed, so the table can say how many of
them the tests actually hold.

usage: mutate-uncovered.py RESULT.json PKG_DIR [ROOT]
ROOT is the module tree the result was computed on (default: the current
directory); mutate.sh passes the copy it took when gremlins started, so
edits made meanwhile do not shift the lines. Prints one line per mutant
and a summary; writes RESULT.uncovered.json.

MUTATE_WORKERS (default 1) mutants run at once, each in its own copy of
the tree.

With MUTATE_RECHECK=1 it re-runs instead the mutants that LIVED (in
gremlins' run and in the by-hand run of RESULT.uncovered.json) against the
tests in ROOT now, and writes RESULT.recheck.json: how many of them the
tests written since kill. The package's own source (its non-test .go
files) must be the one gremlins mutated: mutate.sh records its checksum
in RESULT.srcsum, and the recheck refuses to run when it differs.
"""
import concurrent.futures
import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading

BOUNDARY = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
NEGATION = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}
ARITH = {"+": "-", "-": "+", "*": "/", "/": "*", "%": "*"}
INCDEC = {"++": "--", "--": "++"}


def mutate(line, col, kind):
    """Return line with the token at col (1-based) mutated, or None."""
    i = col - 1
    table = {"CONDITIONALS_BOUNDARY": BOUNDARY, "CONDITIONALS_NEGATION": NEGATION,
             "ARITHMETIC_BASE": ARITH, "INCREMENT_DECREMENT": INCDEC}.get(kind)
    if kind == "INVERT_NEGATIVES":
        return line[:i] + "+" + line[i + 1:] if line[i:i + 1] == "-" else None
    if table is None:
        return None
    for tok in sorted(table, key=len, reverse=True):
        if line.startswith(tok, i):
            return line[:i] + table[tok] + line[i + len(tok):]
    return None


def srcsum(root, pkg):
    """SHA-256 of the package's own non-test Go files (not subpackages)."""
    h = hashlib.sha256()
    d = os.path.join(root, pkg)
    for name in sorted(os.listdir(d)):
        if name.endswith(".go") and not name.endswith("_test.go") and os.path.isfile(os.path.join(d, name)):
            h.update(name.encode() + b"\0" + open(os.path.join(d, name), "rb").read() + b"\0")
    return h.hexdigest()


def main():
    if sys.argv[1] == "--srcsum":
        print(srcsum(sys.argv[3] if len(sys.argv) > 3 else os.getcwd(), sys.argv[2].strip("./").rstrip("/")))
        return
    result, pkg = sys.argv[1], sys.argv[2].strip("./").rstrip("/")
    root = sys.argv[3] if len(sys.argv) > 3 else os.getcwd()
    data = json.load(open(result))
    recheck = os.environ.get("MUTATE_RECHECK") == "1"
    want, suffix = "NOT COVERED", ".uncovered.json"
    if recheck:
        want, suffix = "LIVED", ".recheck.json"
        recorded = open(result.replace(".json", ".srcsum")).read().strip()
        if recorded != srcsum(root, pkg):
            sys.exit("mutate-uncovered: %s's source changed since gremlins ran; run gremlins again" % pkg)
        # the by-hand survivors are rechecked too: mark them LIVED in a copy
        try:
            u = json.load(open(result.replace(".json", ".uncovered.json")))
            byhand = {x["mutant"] for x in u["mutants"] if x["status"] == "LIVED"}
        except OSError:
            byhand = set()
        for f in data["files"]:
            for m in f["mutations"]:
                if m["status"] == "NOT COVERED" and "%s:%d:%d %s" % (f["file_name"], m["line"], m["column"], m["type"]) in byhand:
                    m["status"] = "LIVED"
    todo = []
    for f in data["files"]:
        for m in f["mutations"]:
            if m["status"] == want:
                todo.append((f["file_name"], m))
    # Each worker has its own copy of the tree (MUTATE_WORKERS, default 1):
    # a package whose tests mostly wait (the agent's) rechecks in a
    # fraction of the time with several at once.
    nworkers = max(1, min(int(os.environ.get("MUTATE_WORKERS", "1") or 1), len(todo) or 1))
    work = tempfile.mkdtemp(prefix="mutate-uncovered-")
    copies = queue.Queue()
    for i in range(nworkers):
        dst = os.path.join(work, "m%d" % i)
        shutil.copytree(root, dst, ignore=shutil.ignore_patterns(".git", "bin"))
        copies.put(dst)
    env = dict(os.environ, GOFLAGS=(os.environ.get("GOFLAGS", "") + " -short").strip())
    printing = threading.Lock()

    def run(item):
        file_name, m = item
        where = "%s:%d:%d %s" % (file_name, m["line"], m["column"], m["type"])
        dst = copies.get()
        try:
            path = os.path.join(dst, pkg, file_name)
            src = open(path).read().split("\n")
            new = None
            if 0 < m["line"] <= len(src):
                new = mutate(src[m["line"] - 1], m["column"], m["type"])
            if new is None:
                return {"mutant": where, "status": "NOT APPLIED"}
            orig = src[m["line"] - 1]
            src[m["line"] - 1] = new
            open(path, "w").write("\n".join(src))
            try:
                r = subprocess.run(["go", "test", "-count=1", "-failfast", "-timeout", "120s", "./" + pkg],
                                   cwd=dst, env=env, capture_output=True, text=True, timeout=180)
                status = "LIVED" if r.returncode == 0 else "KILLED"
                if r.returncode != 0 and "[build failed]" in r.stdout + r.stderr:
                    # the replacement does not compile (a + on strings): no mutant
                    status = "NOT VIABLE"
            except subprocess.TimeoutExpired:
                status = "TIMED OUT"
            src[m["line"] - 1] = orig
            open(path, "w").write("\n".join(src))
            with printing:
                print("%9s %s" % (status, where), flush=True)
            return {"mutant": where, "status": status}
        finally:
            copies.put(dst)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=nworkers) as pool:
            out = list(pool.map(run, todo))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    killed = sum(1 for x in out if x["status"] == "KILLED")
    lived = sum(1 for x in out if x["status"] == "LIVED")
    skipped = sum(1 for x in out if x["status"] == "NOT APPLIED")
    notviable = sum(1 for x in out if x["status"] == "NOT VIABLE")
    json.dump({"killed": killed, "lived": lived, "not_applied": skipped, "not_viable": notviable, "mutants": out},
              open(result.replace(".json", suffix), "w"), indent=1)
    if recheck:
        print("survivors re-run against the current tests: %d killed, %d lived, %d not applied" % (killed, lived, skipped))
    else:
        print("not covered by gremlins' measure: %d killed, %d lived, %d not applied, %d not viable (do not compile)" % (killed, lived, skipped, notviable))


if __name__ == "__main__":
    main()
