#!/usr/bin/env bash
# Mutation testing of obmesh's core packages with gremlins (go-gremlins v0.6.0).
#
#   scripts/mutate.sh [-o DIR] [-f EFFICACY:COVERAGE] [-b SECONDS] [-u] [-r] [PKG...]
#
# Each package is mutated on its own and only its own package tests run
# against each mutant (gremlins' default, not --integration), with -short
# (through GOFLAGS), so no test starts processes or forms a Raft group.
# Subpackages and generated code are excluded per package below.
#
#   -o DIR   where the JSON results and the table (table.md) go (default bin/mutate)
#   -f E:C   floor: fail when a package's efficacy or mutator coverage is below
#            E or C percent (CI uses this so the score cannot silently fall)
#   -b SEC   time budget: fail when the whole run takes longer (CI)
#   -u       also run the mutants gremlins reports NOT COVERED (switch case
#            expressions, which Go's coverage blocks leave out) with
#            scripts/mutate-uncovered.py, and report both measures
#   -r       recheck: no gremlins run; re-run the surviving mutants of the
#            last run in DIR against the package's tests as they are now
#            (tests written since), and count the ones they kill. Refused
#            when the package's own source changed since that run.
#
# Environment: GREMLINS (the binary; installed into bin/tools when unset),
# MUTATE_WORKERS (parallel mutants, default 2: the machine is shared; for
# the by-hand runs of -u and -r, default 1: each worker copies the tree),
# MUTATE_TIMEOUT_COEFFICIENT (a mutant's test timeout in coverage-run
# times, default 10), MUTATE_EXCLUDE (more gremlins -E file patterns, to
# measure part of a package).
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_PKGS=(coordinator/state coordinator/store coordinator/ops coordinator/agentsvc
  coordinator/cluster coordinator/seal coordinator/events coordinator/jobs hilproxy
  agent agent/pluginhost agent/relay agent/consoles agent/powersync)

out=bin/mutate floor="" budget=0 uncovered=0 recheck=0
while getopts "o:f:b:ur" opt; do
  case $opt in
    o) out=$OPTARG ;;
    f) floor=$OPTARG ;;
    b) budget=$OPTARG ;;
    u) uncovered=1 ;;
    r) recheck=1 ;;
    *) sed -n '2,28p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
pkgs=("$@")
[ ${#pkgs[@]} -gt 0 ] || pkgs=("${ALL_PKGS[@]}")

if [ -z "${GREMLINS:-}" ]; then
  GREMLINS=$PWD/bin/tools/gremlins
  if ! [ -x "$GREMLINS" ]; then
    GOBIN=$PWD/bin/tools go install github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0
  fi
fi
mkdir -p "$out"
abs_out=$(cd "$out" && pwd)

# Files of each package that are not the package itself: its subpackages
# (mutated, and scored, on their own) and generated code. Paths are relative
# to the package directory.
excludes() {
  case $1 in
    coordinator/store) echo '^rafttest/' ;;
    coordinator/cluster) echo '^clusterpb/' ;;
    agent) echo '^pluginhost/ ^relay/ ^consoles/ ^powersync/' ;;
  esac
}

start=$SECONDS
status=0
for p in "${pkgs[@]}"; do
  name=${p//\//_}
  echo "== mutate $p"
  t0=$SECONDS
  # gremlins and the by-hand run both work on a copy of the module taken
  # now: others may edit the checkout meanwhile.
  snap=$(mktemp -d)
  tar --exclude=./.git --exclude=./bin -cf - . | tar -xf - -C "$snap"
  # gremlins runs the tests of ./PKG/..., subpackages included: their
  # tests would run against every mutant of PKG (and a failure of theirs
  # would kill it). They are scored on their own, so the copy leaves
  # their tests out.
  for e in $(excludes "$p"); do
    case $e in
      ^*/) if [ -d "$snap/$p/${e#^}" ]; then find "$snap/$p/${e#^}" -name '*_test.go' -delete; fi ;;
    esac
  done
  if [ "$recheck" = 1 ]; then
    MUTATE_RECHECK=1 python3 scripts/mutate-uncovered.py "$abs_out/$name.json" "$p" "$snap" >"$out/$name.recheck.log" 2>&1 || {
      echo "recheck failed on $p:"; tail -5 "$out/$name.recheck.log"; status=1; }
    tail -1 "$out/$name.recheck.log"
    rm -rf "$snap"
    continue
  fi
  python3 scripts/mutate-uncovered.py --srcsum "$p" "$snap" >"$abs_out/$name.srcsum"
  rm -f "$abs_out/$name.recheck.json"
  # The timeout is the coverage run's time times the coefficient; the
  # coverage run of a small package is quick and cached, so on a busy
  # machine a mutant's own build alone could pass gremlins' default of 3.
  args=(unleash "./$p" --workers "${MUTATE_WORKERS:-2}" --timeout-coefficient "${MUTATE_TIMEOUT_COEFFICIENT:-10}" -o "$abs_out/$name.json")
  for e in $(excludes "$p") ${MUTATE_EXCLUDE:-}; do args+=(-E "$e"); done
  (cd "$snap" && GOFLAGS="${GOFLAGS:-} -short" "$GREMLINS" "${args[@]}") >"$out/$name.log" 2>&1 || {
    echo "gremlins failed on $p:"; tail -20 "$out/$name.log"; status=1; rm -rf "$snap"; continue; }
  grep -E '^(Killed|Timed out|Test efficacy|Mutator coverage)' "$out/$name.log" || true
  if [ "$uncovered" = 1 ]; then
    python3 scripts/mutate-uncovered.py "$abs_out/$name.json" "$p" "$snap" >"$out/$name.uncovered.log" 2>&1 || {
      echo "mutate-uncovered failed on $p:"; tail -5 "$out/$name.uncovered.log"; status=1; }
    tail -1 "$out/$name.uncovered.log"
  fi
  rm -rf "$snap"
  echo "$((SECONDS - t0))" >"$out/$name.seconds"
done

/usr/bin/env python3 - "$out" "$floor" "${pkgs[@]}" <<'EOF' || status=1
import json, os, sys
out, floor, pkgs = sys.argv[1], sys.argv[2], sys.argv[3:]
fe, fc = (float(x) for x in floor.split(":")) if floor else (0.0, 0.0)
rows, bad = [], []
any_uncovered = any(os.path.exists(os.path.join(out, p.replace("/", "_") + ".uncovered.json")) for p in pkgs)
any_recheck = any(os.path.exists(os.path.join(out, p.replace("/", "_") + ".recheck.json")) for p in pkgs)
for p in pkgs:
    name = p.replace("/", "_")
    try:
        r = json.load(open(os.path.join(out, name + ".json")))
    except OSError:
        bad.append(f"{p}: no result")
        continue
    secs = open(os.path.join(out, name + ".seconds")).read().strip()
    lived = [f"{f['file_name']}:{m['line']}:{m['column']} {m['type']}"
             for f in r["files"] for m in f["mutations"] if m["status"] == "LIVED"]
    timed = sum(1 for f in r["files"] for m in f["mutations"] if m["status"] == "TIMED OUT")
    eff, cov = r["test_efficacy"], r["mutations_coverage"]
    k, l, nc = r["mutants_killed"], r["mutants_lived"], r["mutants_not_covered"]
    extra = ""
    try:
        u = json.load(open(os.path.join(out, name + ".uncovered.json")))
        uk, ul = u["killed"], u["lived"]
        run = k + l + uk + ul
        eff = 100.0 * (k + uk) / run if run else 0.0
        # replacements that do not compile (+ on strings) are no mutants
        nc -= u.get("not_viable", 0)
        cov = 100.0 * run / (k + l + nc) if k + l + nc else 0.0
        extra = f" {uk}/{uk + ul + u['not_applied']} killed | {r['test_efficacy']:.1f} % / {r['mutations_coverage']:.1f} % |"
        lived += [x["mutant"] + " (not covered by gremlins' measure)" for x in u["mutants"] if x["status"] == "LIVED"]
        ulived = {x["mutant"] for x in u["mutants"] if x["status"] == "LIVED"}
    except OSError:
        uk = ul = 0
        ulived = set()
        extra = " - | - |" if any_uncovered else ""
    try:
        rc = json.load(open(os.path.join(out, name + ".recheck.json")))
        # survivors re-run against later tests: the ones killed now count as killed
        rk = rc["killed"]
        run = k + l + uk + ul
        eff = 100.0 * (k + uk + rk) / run if run else 0.0
        rkg = sum(1 for x in rc["mutants"] if x["status"] == "KILLED" and x["mutant"] not in ulived)
        k, l = k + rkg, l - rkg
        lived = [x["mutant"] + (" (not covered by gremlins' measure)" if x["mutant"] in ulived else "")
                 for x in rc["mutants"] if x["status"] != "KILLED"]
        extra += f" {rk} |"
    except OSError:
        extra += " - |" if any_recheck else ""
    rows.append(f"| {p} | {eff:.1f} % | {cov:.1f} % | {k} | {l} | {timed} | {nc} |{extra} {secs} s |")
    if eff < fe or cov < fc:
        bad.append(f"{p}: efficacy {eff:.1f} %, mutator coverage {cov:.1f} % (floor {fe:g} % / {fc:g} %)")
    with open(os.path.join(out, name + ".lived"), "w") as fh:
        fh.write("".join(l + "\n" for l in lived))
head = "| package | efficacy | mutator coverage | killed | lived | timed out | not covered |"
if any_uncovered:
    head += " of those, run by hand | gremlins alone |"
if any_recheck:
    head += " survivors killed by later tests |"
head += " time |"
table = [head, "|" + "---|" * (head.count("|") - 1)] + rows
open(os.path.join(out, "table.md"), "w").write("\n".join(table) + "\n")
print("\n".join(table))
for b in bad:
    print("mutate: below the floor:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF

elapsed=$((SECONDS - start))
echo "mutate: ${elapsed}s for ${#pkgs[@]} packages; lived mutants in $out/*.lived"
if [ "$budget" -gt 0 ] && [ "$elapsed" -gt "$budget" ]; then
  echo "mutate: over the time budget (${elapsed}s > ${budget}s)" >&2
  status=1
fi
exit $status
