#!/usr/bin/env bash
# The failover proofs (issue 20): real processes, a real HA database broken under real load, and
# the gateway's ledger audited afterwards. Nothing is simulated but Stripe.
#
#   loadtest/failover.sh [OPTIONS] [SCENARIO…]          (default: every scenario, in this order)
#
#   kill-primary   a storm of keys (each sent --duplicates times at once over two servers, each
#                  client retrying until a 201), and the leader's PostgreSQL kill -9'd mid-storm
#   kill-node      the same, the leader's Patroni and PostgreSQL kill -9'd (a lost node)
#   switchover     the same, `patronictl switchover` under load
#   async-forget   asynchronous replication: a standby cut off, payments acknowledged, the
#                  cluster failed over onto that standby (they are gone from the database), then
#                  every payment retried: the same payment id and PaymentIntent, no new charge
#   restore        a base backup, payments and refunds, a point-in-time restore to the backup
#                  (they are gone), then every payment and refund retried: the same ids, one
#                  charge and one refund per key in the ledger
#
# What runs: loadtest/ha.sh's cluster (etcd, three Patroni + PostgreSQL 15 nodes, HAProxy; sync
# mode, or async for async-forget) in its own state folder, one `payonce stripe-sim`, two
# `payonce serve` on a database of the cluster (through HAProxy: HA_URL), a customer. Each storm
# is `payonce-loadtest failover` (see loadtest/README.md) with a timeline of every answer, from
# which this script measures the unavailability window (the kill instant → the first
# "201 created" after the longest stretch without one), the answers during it, and p99 latency
# before the kill and after recovery. Every check that fails makes the exit status 1; the summary
# table at the end lists each run. Everything started is stopped on exit (trap), the cluster too.
#
# Options:
#   --runs N            runs of each scenario (default 1)
#   --json FILE         write every run's figures as JSON (for docs/performance.md)
#   --duration D        storm length in seconds (default 40)
#   --concurrency N     storm workers (default 24; each keeps one key of --duplicates clients)
#   --duplicates N      requests per key, sent at once (default 4)
#   --kill-at S         seconds into the storm when the database is broken (default 10)
#   --min-keys N        a storm must acknowledge at least N keys (default 200)
#   --max-window S      the unavailability window must not exceed S seconds (default 15)
#   --forget-keys N     async-forget: payments lost and retried (default 20)
#   --forget-by HOW     async-forget: `failover` (patronictl failover onto the cut standby, the
#                       leader alive; default) or `kill-node` (the leader's node killed first)
#   --restore-keys N    restore: payments, each with a refund, lost and retried (default 10)
#   --keep              keep the cluster, the servers' logs and the timelines afterwards
#
# Environment: PAYONCE_BIN, PAYONCE_LOADTEST_BIN (default ${CARGO_TARGET_DIR:-target}/debug/…;
# build them with `cargo build -p payonce --bin payonce && cargo build -p payonce-loadtest`),
# FAILOVER_DIR (state folder, default /tmp/payonce-failover: the cluster in $FAILOVER_DIR/ha, the
# logs in $FAILOVER_DIR/logs). Needs what loadtest/ha.sh needs (it installs Patroni, etcd and
# HAProxy from Debian when missing, as root), plus curl, psql and python3.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
repo=$PWD

usage() { sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

target_dir=${CARGO_TARGET_DIR:-target}
payonce=${PAYONCE_BIN:-$target_dir/debug/payonce}
loadtest=${PAYONCE_LOADTEST_BIN:-$target_dir/debug/payonce-loadtest}
state=${FAILOVER_DIR:-/tmp/payonce-failover}
state=${state%/}
runs=1 json_out='' duration=40 concurrency=24 duplicates=4 kill_at=10 min_keys=200 max_window=15
forget_keys=20 forget_by=failover restore_keys=10 keep=${KEEP:-}
scenarios=()
all_scenarios=(kill-primary kill-node switchover async-forget restore)

die() { printf 'failover: %s\n' "$*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs=${2:?}; shift ;;
        --json) json_out=${2:?}; shift ;;
        --duration) duration=${2:?}; duration=${duration%s}; shift ;;
        --concurrency) concurrency=${2:?}; shift ;;
        --duplicates) duplicates=${2:?}; shift ;;
        --kill-at) kill_at=${2:?}; kill_at=${kill_at%s}; shift ;;
        --min-keys) min_keys=${2:?}; shift ;;
        --max-window) max_window=${2:?}; shift ;;
        --forget-keys) forget_keys=${2:?}; shift ;;
        --forget-by) forget_by=${2:?}; shift ;;
        --restore-keys) restore_keys=${2:?}; shift ;;
        --keep) keep=1 ;;
        -h | --help) usage; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *)
            case " ${all_scenarios[*]} " in *" $1 "*) scenarios+=("$1") ;; *) die "unknown scenario $1 (${all_scenarios[*]})" ;; esac
            ;;
    esac
    shift
done
[ ${#scenarios[@]} -gt 0 ] || scenarios=("${all_scenarios[@]}")
for n in "$runs" "$duration" "$concurrency" "$duplicates" "$kill_at" "$min_keys" "$forget_keys" "$restore_keys"; do
    [[ "$n" =~ ^[0-9]+$ ]] || die "'$n' is not a whole number"
done
[[ "$max_window" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--max-window takes seconds"
[ "$kill_at" -lt "$duration" ] || die "--kill-at ($kill_at s) must fall inside the storm (--duration $duration s)"
case "$forget_by" in failover | kill-node) ;; *) die "--forget-by takes failover or kill-node" ;; esac
case $payonce in /*) ;; *) payonce=$repo/$payonce ;; esac
case $loadtest in /*) ;; *) loadtest=$repo/$loadtest ;; esac
for binary in "$payonce" "$loadtest"; do
    [ -x "$binary" ] || die "$binary is not built (cargo build -p payonce --bin payonce; cargo build -p payonce-loadtest), or set PAYONCE_BIN / PAYONCE_LOADTEST_BIN"
done
for tool in curl psql python3 flock; do command -v "$tool" >/dev/null || die "$tool is not installed"; done
case "$state" in /*) ;; *) die "FAILOVER_DIR must be an absolute path" ;; esac
[ ${#state} -le 56 ] || die "FAILOVER_DIR is too long for PostgreSQL's socket paths (at most 56 characters)"

export HA_DIR=$state/ha
logs=$state/logs
database=payonce_failover
started_at=$SECONDS

mkdir -p "$state" || die "cannot create $state"
# One run per state folder. The lock's descriptor (8) is closed for every process started from
# here, so that a leftover of a killed run never holds it.
exec 8>"$state.lock"
flock -n 8 || die "another failover.sh uses $state (its lock: $state.lock)"
ha() { "$repo/loadtest/ha.sh" "$@" 8>&-; }

say() { printf '\n=== %s\n' "$*"; }
note() { printf 'failover: %s\n' "$*" >&2; }
now_ms() { local t=$EPOCHREALTIME; t=${t/,/.}; echo "$((${t%.*} * 1000 + 10#${t#*.} / 1000))"; }

# ---------------------------------------------------------------------------------------------
# Leftovers of a killed run: the servers, simulator and runners it started (each one's pid and a
# piece of its command line are in $state/procs; a pid counts only while its command line still
# holds that piece), then the cluster (ha.sh down finds its processes by their pid files and the
# folder in their command line).

procs=$state/procs
kill_leftovers() {
    local pid marker cmdline
    [ -f "$procs" ] || return 0
    while read -r pid marker; do
        [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || continue
        # A variable, not `tr | grep -q`: under pipefail, grep leaving at its first match can
        # fail the pipe and spare the very process it matched (ha.sh's ours() says more).
        cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
        if [[ $cmdline == *"$marker"* ]]; then
            note "stopping a leftover process of an earlier run: $pid ($marker)"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done <"$procs"
    : >"$procs"
}

pids=()
cleanup() {
    local status=$? pid
    trap - EXIT INT TERM
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    : >"$procs"
    if [ -n "$keep" ]; then
        note "kept: the cluster (HA_DIR=$HA_DIR; loadtest/ha.sh down stops it), the logs in $logs"
    else
        ha down >/dev/null 2>&1 || note "ha.sh down failed: HA_DIR=$HA_DIR loadtest/ha.sh down"
        if [ "$status" -eq 0 ]; then
            rm -rf "$logs" "$procs" "$state.lock" "$HA_DIR.lock"
            rmdir "$state" 2>/dev/null || true
        else
            note "the logs of this run: $logs"
        fi
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

kill_leftovers
rm -rf "$logs"
mkdir -p "$logs"

# ---------------------------------------------------------------------------------------------
# The helper: the payments and refunds clients (with retries), the timeline's analysis, the
# ledger checks. Python's standard library only.

helper=$logs/helper.py
cat >"$helper" <<'PY'
import collections, json, os, socket, sys, time, urllib.error, urllib.request

def http(method, url, body=None, headers=None, timeout=10):
    """(status, headers, body bytes), or (None, None, why) when nothing came back."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
    except (urllib.error.URLError, socket.timeout, ConnectionError, TimeoutError, OSError) as e:
        return None, None, str(e)

def send(args):
    """send SERVERS API_KEY REQUESTS OUT: each request ({key, path, body}) until a final answer,
    retrying 409, 503 and transport errors after their Retry-After (1 s without one), round robin
    over the servers; its first and last answers to OUT."""
    servers, api_key, requests, out = args[0].split(","), args[1], json.load(open(args[2])), args[3]
    results = []
    for n, r in enumerate(requests):
        answers, final = [], None
        deadline = time.time() + 120
        attempt = 0
        while time.time() < deadline:
            server = servers[(n + attempt) % len(servers)]
            attempt += 1
            status, headers, body = http("POST", server + r["path"], r["body"], {
                "Authorization": "Bearer " + api_key, "Idempotency-Key": r["key"],
                "Content-Type": "application/json"})
            if status is None:
                answers.append("transport error")
                time.sleep(1)
                continue
            headers = {k.lower(): v for k, v in headers.items()}
            replayed = headers.get("idempotent-replayed") == "true"
            answers.append("%d%s" % (status, " replayed" if replayed else ""))
            if status in (409, 503):
                try:
                    wait = float(headers.get("retry-after", "1"))
                except ValueError:
                    wait = 1
                time.sleep(min(max(wait, 0.2), 5))
                continue
            final = {"status": status, "replayed": replayed, "body": body.decode(errors="replace")}
            break
        results.append({"key": r["key"], "path": r["path"], "request": r["body"], "answers": answers, "final": final})
    json.dump(results, open(out, "w"), indent=1)
    bad = [r for r in results if not r["final"] or r["final"]["status"] != 201]
    for r in bad:
        print("  %s: no 201 (answers: %s; last: %s)" % (r["key"], " ".join(r["answers"][-6:]),
              (r["final"] or {}).get("body", "")[:200]), file=sys.stderr)
    sys.exit(1 if bad else 0)

def requests(args):
    """requests KIND PREFIX N [PAID]: the request list of N payments (or refunds of PAID's payments)."""
    kind, prefix, n = args[0], args[1], int(args[2])
    out = []
    if kind == "payments":
        for i in range(n):
            out.append({"key": "%s-%d" % (prefix, i), "path": "/v1/payments",
                        "body": {"amount": 1000 + i, "currency": "usd", "payment_method": "pm_card_visa"}})
    else:
        paid = json.load(open(args[3]))
        for i, p in enumerate(paid):
            payment = json.loads(p["final"]["body"])
            out.append({"key": "%s-%d" % (prefix, i), "path": "/v1/refunds",
                        "body": {"payment": payment["id"], "amount": 100 + i}})
    json.dump(out, sys.stdout, indent=1)

def ids(args):
    """ids RESULTS FIELD: one value of each 201 body, one a line (for SQL)."""
    for r in json.load(open(args[0])):
        if r["final"] and r["final"]["status"] == 201:
            print(json.loads(r["final"]["body"])[args[1]])

def leader(args):
    """leader PATRONI_URLS: the leader's name, from the first Patroni that answers."""
    for url in args[0].split(","):
        status, _, body = http("GET", url + "/cluster", timeout=2)
        if status == 200:
            members = json.loads(body).get("members", [])
            print(([m["name"] for m in members if m.get("role") == "leader"] or [""])[0])
            return
    sys.exit(1)

def compare(args):
    """compare KIND FIRST RETRIED REPLAYED SIM_URL OUT: the retries after the database forgot,
    against the first answers and the simulator's ledger. Prints the table, writes the figures."""
    kind, first, retried, replayed, sim, out = args[0], *[json.load(open(a)) for a in args[1:4]], args[4], args[5]
    gateway_field = "payment_intent" if kind == "payments" else "gateway_refund"
    status, _, body = http("GET", sim + ("/_sim/charges" if kind == "payments" else "/_sim/refunds"), timeout=30)
    if status != 200:
        print("cannot read the simulator's ledger: %s" % body); sys.exit(1)
    ledger = json.loads(body)["charges" if kind == "payments" else "refunds"]
    by_key = collections.defaultdict(list)
    for entry in ledger:
        by_key[entry["metadata"].get("payonce_idempotency_key")].append(entry)
    ledger_id = "payment_intent" if kind == "payments" else "refund"
    f = collections.Counter()
    problems = []
    for a, b, c in zip(first, retried, replayed):
        key = a["key"]
        one = json.loads(a["final"]["body"])
        f["keys"] += 1
        bf = b["final"] or {}
        if bf.get("status") != 201:
            problems.append("%s: the retry got %s, not a 201" % (key, bf.get("status")))
            continue
        two = json.loads(bf["body"])
        f["retry 201"] += 1
        f["retry 201 replayed" if bf["replayed"] else "retry 201 created (rebuilt)"] += 1
        if two["id"] == one["id"]:
            f["same id"] += 1
        else:
            problems.append("%s: the retry names %s, the first answer %s" % (key, two["id"], one["id"]))
        if two.get(gateway_field) == one.get(gateway_field):
            f["same " + gateway_field] += 1
        else:
            problems.append("%s: the retry names %s %s, the first answer %s" % (key, gateway_field, two.get(gateway_field), one.get(gateway_field)))
        if bf["body"] == a["final"]["body"]:
            f["byte-identical body"] += 1
        else:
            f["body differs in: " + ", ".join(sorted(k for k in set(one) | set(two) if one.get(k) != two.get(k)))] += 1
        cf = c["final"] or {}
        if cf.get("status") == 201 and cf.get("replayed") and cf.get("body") == bf["body"]:
            f["then replayed byte for byte"] += 1
        else:
            problems.append("%s: the second retry got %s (replayed %s), not the rebuilt answer replayed" % (key, cf.get("status"), cf.get("replayed")))
        entries = by_key.get(key, [])
        f["ledger entries"] += len(entries)
        if len(entries) != 1:
            problems.append("%s: %d %s in the ledger (must be 1)" % (key, len(entries), "charges" if kind == "payments" else "refunds"))
        elif entries[0][ledger_id] != one.get(gateway_field):
            problems.append("%s: the ledger's %s is %s, the answer's %s" % (key, ledger_id, entries[0][ledger_id], one.get(gateway_field)))
    for line, count in sorted(f.items()):
        print("    %-44s %6d" % (line, count))
    for p in problems[:20]:
        print("    PROBLEM " + p)
    json.dump({"figures": dict(f), "problems": problems}, open(out, "w"), indent=1)
    sys.exit(1 if problems else 0)

def pct(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[max(0, min(len(values) - 1, int(-(-p * len(values) // 100)) - 1))]

def analyze(args):
    """analyze SCENARIO RUN DIR START_MS DURATION_S MIN_KEYS MAX_WINDOW OLD NEW RUNNER_STATUS SERVERS_OK"""
    (scenario, run, d, start_ms, duration_s, min_keys, max_window, old, new, runner_status, servers_ok) = args
    start_ms, duration_ms = int(start_ms), int(float(duration_s) * 1000)
    pattern = {"kill-primary": "killed -9 the postmaster", "kill-node": "Patroni and PostgreSQL",
               "switchover": "patronictl switchover"}[scenario]
    kill_ms = None
    for line in open(os.path.join(d, "action.err")):
        stamp, _, text = line.partition(" ")
        if pattern in text and kill_ms is None:
            kill_ms = int(float(stamp) * 1000)
    action = dict(l.strip().split("=", 1) for l in open(os.path.join(d, "action.out")) if "=" in l)
    report = json.load(open(os.path.join(d, "runner.json"))) if os.path.getsize(os.path.join(d, "runner.json")) else None
    timeline = [json.loads(l) for l in open(os.path.join(d, "timeline.jsonl")) if l.strip()] if os.path.exists(os.path.join(d, "timeline.jsonl")) else []
    timeline.sort(key=lambda x: x["at_ms"])
    end_ms = start_ms + duration_ms
    f = {"scenario": scenario, "run": int(run), "old_leader": old, "new_leader": new,
         "kill_at_s": None if kill_ms is None else round((kill_ms - start_ms) / 1000, 2),
         "ha_recovery_s": float(action["HA_RECOVERY_SECS"]) if "HA_RECOVERY_SECS" in action else None,
         "ha_routed_s": float(action["HA_ROUTED_SECS"]) if "HA_ROUTED_SECS" in action else None}
    checks = []
    def check(name, ok, value):
        checks.append({"check": name, "ok": bool(ok), "value": value})
    check("the runner passed (exit 0)", runner_status == "0", int(runner_status))
    if report:
        s, a = report["stats"], report["audit"]
        others = s["answers"]["other"]
        f.update({"run_id": report["run_id"], "keys": a["believed_succeeded"], "duplicates": report["settings"].get("duplicates"),
                  "requests": s["requests"], "answers": dict(created=s["answers"]["created"], replayed=s["answers"]["replayed"],
                  in_flight=s["answers"]["in_flight"], **others),
                  "double_charges": len(a["double_charged"]), "charges": a["charges"],
                  "lost_acknowledgements": sum(n for r, n in s["unexpected_by_reason"].items() if "after the failover" in r),
                  "missing_charges": len(a["missing"]), "other_payment_intent": len(a["mismatched"]),
                  "status_500": sum(n for label, n in others.items() if label[:1] == "5" and label != "503 unavailable"),
                  "unexpected": s["unexpected"], "unexpected_by_reason": s["unexpected_by_reason"],
                  "given_up": (s.get("payments") or {}).get("given_up", 0)})
    else:
        f.update({"keys": 0, "double_charges": None, "lost_acknowledgements": None, "status_500": None})
    check("keys acknowledged >= %s" % min_keys, f["keys"] >= int(min_keys), f["keys"])
    check("double charges = 0", f["double_charges"] == 0, f["double_charges"])
    check("lost acknowledged payments = 0", f["lost_acknowledgements"] == 0, f["lost_acknowledgements"])
    check("500s = 0", f["status_500"] == 0, f["status_500"])
    check("the database was broken mid-storm", kill_ms is not None and start_ms < kill_ms < end_ms, f["kill_at_s"])
    check("the leader changed", bool(new) and new != old, "%s -> %s" % (old, new))
    check("both servers up and ready afterwards, no panic", servers_ok == "1", servers_ok == "1")
    window_end = None
    if kill_ms is not None:
        created = [x["at_ms"] for x in timeline if x["answer"] == "201 created" and x["at_ms"] > kill_ms]
        # The longest stretch without a "201 created" that begins after the kill (or spans it) and
        # before new keys stop: its end is when the service took new payments again.
        points = [kill_ms] + created
        best = None
        for i in range(len(points) - 1):
            if points[i] >= end_ms:
                break
            gap = points[i + 1] - points[i]
            if best is None or gap > best[0]:
                best = (gap, points[i], points[i + 1])
        if best:
            window_end = best[2]
            f["window_s"] = round((window_end - kill_ms) / 1000, 2)
            f["longest_gap_s"] = round(best[0] / 1000, 2)
            f["gap_began_after_kill_s"] = round((best[1] - kill_ms) / 1000, 2)
    f.setdefault("window_s", None)
    check("a 201 created after the kill", window_end is not None, window_end is not None)
    check("window <= %s s" % max_window, f["window_s"] is not None and f["window_s"] <= float(max_window), f["window_s"])
    answered = lambda x: x["answer"] not in ("timeout", "transport error")
    if window_end is not None:
        during = collections.Counter(x["answer"] for x in timeline if kill_ms < x["at_ms"] < window_end)
        f["answers_during_window"] = dict(during.most_common())
        # Before: from 2 s into the storm (the pools' first connections are opened in the first
        # second) to the kill. After: requests sent after the window, until new keys stop.
        before = [x["latency_ms"] for x in timeline if start_ms + 2000 <= x["at_ms"] < kill_ms and answered(x)]
        after = [x["latency_ms"] for x in timeline
                 if x["at_ms"] - x["latency_ms"] >= window_end and x["at_ms"] - x["latency_ms"] < end_ms and answered(x)]
        f["p99_before_ms"], f["n_before"] = pct(before, 99), len(before)
        f["p99_after_ms"], f["n_after"] = pct(after, 99), len(after)
        f["p50_before_ms"], f["p50_after_ms"] = pct(before, 50), pct(after, 50)
        f["max_during_window_ms"] = max([x["latency_ms"] for x in timeline if kill_ms < x["at_ms"] <= window_end] or [0])
        # The last failed answer after the kill: a few 503s may follow the first new payment (a
        # pooled connection still on the old leader, HAProxy's last check of it).
        failures = [x["at_ms"] for x in timeline if x["at_ms"] > kill_ms and x["answer"] not in
                    ("201 created", "201 replayed", "409 in flight")]
        f["last_failure_s"] = round((max(failures) - kill_ms) / 1000, 2) if failures else None
        f["failures_after_window"] = sum(1 for t in failures if t >= window_end)
    f["checks"] = checks
    f["passed"] = all(c["ok"] for c in checks)
    json.dump(f, open(os.path.join(d, "figures.json"), "w"), indent=1)
    r = lambda v, n=1: "-" if v is None else ("%.*f" % (n, v))
    what = {"kill-primary": "kill -9 of the leader's postmaster", "kill-node": "kill -9 of the leader's Patroni and PostgreSQL",
            "switchover": "patronictl switchover"}[scenario]
    print()
    print("  %s, run %s: %s at %s s into a %s s storm; leader %s -> %s" % (scenario, run, what, r(f["kill_at_s"], 2), duration_s, old, new or "?"))
    print("    keys acknowledged                   %8s   x %s duplicates over 2 servers, %s requests" % (f["keys"], f.get("duplicates"), f.get("requests")))
    print("    unavailability window               %8s s (kill -> first 201 created after it; longest stretch without one %s s)" % (r(f["window_s"], 2), r(f.get("longest_gap_s"), 2)))
    print("    last failed answer                  %8s s after the kill (%s after the window)" % (r(f.get("last_failure_s"), 2), f.get("failures_after_window")))
    print("    database back (ha.sh)               %8s s (a write commits through HAProxy; routed %s s)" % (r(f["ha_recovery_s"]), r(f["ha_routed_s"])))
    print("    answers during the window           %s" % (", ".join("%s %d" % kv for kv in (f.get("answers_during_window") or {}).items()) or "-"))
    print("    p99 before the kill / after         %8s ms / %s ms   (p50 %s / %s ms; n %s / %s)" % (
        r(f.get("p99_before_ms")), r(f.get("p99_after_ms")), r(f.get("p50_before_ms")), r(f.get("p50_after_ms")), f.get("n_before"), f.get("n_after")))
    print("    answers in all                      %s" % ", ".join("%s %s" % kv for kv in (f.get("answers") or {}).items()))
    print("    double charges                      %8s   must be 0" % f["double_charges"])
    print("    lost acknowledged payments          %8s   must be 0 (every 201 replayed byte for byte at the end)" % f["lost_acknowledgements"])
    print("    500s                                %8s   must be 0" % f["status_500"])
    for reason, n in (f.get("unexpected_by_reason") or {}).items():
        print("    UNEXPECTED %6d  %s" % (n, reason))
    for c in checks:
        if not c["ok"]:
            print("    FAILED: %s (got %s)" % (c["check"], c["value"]))
    print("    %s" % ("PASS" if f["passed"] else "FAIL"))
    sys.exit(0 if f["passed"] else 1)

def summary(args):
    """summary OUT FIGURES…: the table of every run, and the JSON file."""
    out, files = args[0], args[1:]
    runs = [json.load(open(p)) for p in files if os.path.exists(p)]
    storms = [f for f in runs if f["scenario"] not in ("async-forget", "restore")]
    forgets = [f for f in runs if f["scenario"] in ("async-forget", "restore")]
    fmt = lambda v, u: "-" if v is None else "%.1f %s" % (v, u)
    if storms:
        print("%-13s %3s %5s %7s %7s  %-40s %10s %10s %6s %4s %4s  %s" % (
            "storm", "run", "keys", "window", "db back", "answers during the window", "p99 before", "p99 after",
            "double", "lost", "500", "verdict"))
        for f in storms:
            during = ", ".join("%s %d" % (k.replace(" unavailable", "").replace("transport error", "transport")
                                          .replace(" in flight", "").replace("201 ", ""), v)
                               for k, v in (f.get("answers_during_window") or {}).items())
            print("%-13s %3s %5s %7s %7s  %-40s %10s %10s %6s %4s %4s  %s" % (
                f["scenario"], f["run"], f["keys"], fmt(f.get("window_s"), "s"), fmt(f.get("ha_recovery_s"), "s"),
                during[:40], fmt(f.get("p99_before_ms"), "ms"), fmt(f.get("p99_after_ms"), "ms"), f["double_charges"],
                f["lost_acknowledgements"], f["status_500"], "PASS" if f["passed"] else "FAIL"))
    if forgets:
        if storms:
            print()
        print("%-13s %3s %-72s %11s %6s  %s" % ("forgetting", "run", "what", "new charges", "lost", "verdict"))
        for f in forgets:
            print("%-13s %3s %-72s %11s %6s  %s" % (f["scenario"], f["run"], f.get("what", "")[:72], f.get("new_charges"),
                                                    f.get("lost"), "PASS" if f["passed"] else "FAIL"))
    if out:
        meta = {"machine": {"cpus": os.cpu_count(), "uname": " ".join(os.uname()),
                            "load_average_at_start": os.environ.get("FAILOVER_LOAD_START", ""),
                            "load_average_at_end": " ".join("%.2f" % l for l in os.getloadavg())}, "command": os.environ.get("FAILOVER_COMMAND", ""),
                "binaries": {"payonce": os.environ.get("FAILOVER_PAYONCE", ""), "payonce-loadtest": os.environ.get("FAILOVER_LOADTEST", "")},
                "runs": runs}
        json.dump(meta, open(out, "w"), indent=1)

if __name__ == "__main__":
    {"send": send, "requests": requests, "ids": ids, "leader": leader, "compare": compare,
     "analyze": analyze, "summary": summary}[sys.argv[1]](sys.argv[2:])
PY
py() { python3 "$helper" "$@"; }

# ---------------------------------------------------------------------------------------------
# The cluster, the simulator, the servers

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_ready URL PID NAME: until URL answers 200, or fails with the process's log.
wait_ready() {
    local url=$1 pid=$2 name=$3
    for _ in $(seq 600); do
        curl -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || { tail -n 20 "$logs/$name.log" >&2; note "$name exited before it was ready"; return 1; }
        sleep 0.1
    done
    tail -n 20 "$logs/$name.log" >&2
    note "$name was not ready at $url after 60 s"
    return 1
}

# spawn NAME ADDR COMMAND…: a process of this run, remembered for the cleanup and for the next
# run's leftover check.
spawn() {
    local name=$1 addr=$2
    shift 2
    "$@" >>"$logs/$name.log" 2>&1 8>&- &
    pids+=($!)
    echo "$! --addr $addr" >>"$procs"
    last_pid=$!
}

sim_url=
start_simulator() {
    local port
    port=$(free_port)
    spawn sim "127.0.0.1:$port" "$payonce" stripe-sim --addr "127.0.0.1:$port"
    wait_ready "http://127.0.0.1:$port/_sim/faults" "$last_pid" sim || exit 1
    sim_url=http://127.0.0.1:$port
}

servers=() server_pids=() cluster_mode='' api_key='' db_url=''
stop_servers() {
    local pid
    for pid in "${server_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${server_pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    servers=() server_pids=()
}

# cluster MODE: a cluster of that mode (sync, async; `any` keeps the one running, or starts a
# sync one), its database, the two servers on it and a customer.
cluster() {
    local want=$1 n port pid attempt
    if [ -n "$cluster_mode" ] && { [ "$want" = any ] || [ "$want" = "$cluster_mode" ]; }; then
        ha wait >>"$logs/ha.log" 2>&1 || { tail -n 20 "$logs/ha.log" >&2; note "the cluster is not healthy"; exit 1; }
        return
    fi
    [ "$want" != any ] || want=sync
    stop_servers
    say "an HA cluster in $want mode (loadtest/ha.sh up$([ "$want" = async ] && echo ' --async'), HA_DIR=$HA_DIR)"
    local began=$SECONDS
    local flags=()
    [ "$want" != async ] || flags=(--async)
    ha up "${flags[@]}" >"$logs/ha-env" 2>>"$logs/ha.log" ||
        { tail -n 40 "$logs/ha.log" >&2; note "loadtest/ha.sh up failed (its log: $logs/ha.log)"; exit 1; }
    # shellcheck source=/dev/null
    . "$logs/ha-env"
    cluster_mode=$want
    echo "cluster up in $((SECONDS - began)) s: leader $(py leader "$HA_PATRONI_URLS"), writes through HAProxy at $HA_URL"
    psql "$HA_URL" -XAtq -v ON_ERROR_STOP=1 -c "set client_min_messages = warning" \
        -c "drop database if exists $database with (force)" -c "create database $database" ||
        { note "cannot create the database $database on $HA_URL"; exit 1; }
    db_url=${HA_URL%/*}/$database
    for n in 1 2; do
        for attempt in 1 2 3; do
            port=$(free_port)
            # The first server migrates the database; the second starts once it is ready.
            spawn "server$n" "127.0.0.1:$port" env DATABASE_URL="$db_url" STRIPE_SECRET_KEY=sk_test_failover \
                STRIPE_API_BASE="$sim_url/" PAYONCE_LEASE_SECS=5 PAYONCE_GATEWAY_TIMEOUT_SECS=2 \
                RUST_LOG="${RUST_LOG:-warn}" PAYONCE_LOG_FORMAT=json "$payonce" serve --addr "127.0.0.1:$port"
            pid=$last_pid
            wait_ready "http://127.0.0.1:$port/readyz" "$pid" "server$n" && break
            [ "$attempt" -lt 3 ] || exit 1
        done
        servers+=("http://127.0.0.1:$port")
        server_pids+=("$pid")
    done
    api_key=$(DATABASE_URL=$db_url "$payonce" customers create failover 2>>"$logs/customer.log") ||
        { cat "$logs/customer.log" >&2; note "cannot create a customer"; exit 1; }
    echo "servers ${servers[*]} on $db_url; simulator $sim_url"
}

servers_ok() { # both servers alive and ready, and no panic in their logs
    local pid url
    for pid in "${server_pids[@]}"; do kill -0 "$pid" 2>/dev/null || { note "server $pid died"; return 1; }; done
    for url in "${servers[@]}"; do
        curl -fsS -o /dev/null --max-time 5 --retry 10 --retry-delay 1 --retry-all-errors "$url/readyz" ||
            { note "$url/readyz does not answer 200"; return 1; }
    done
    ! grep -q panicked "$logs"/server*.log || { grep -m3 panicked "$logs"/server*.log >&2; return 1; }
}

# timed LOG COMMAND…: runs COMMAND, its stdout to LOG.out, each line of its stderr to LOG.err
# prefixed with the Unix time it was written at (microseconds), and shown.
timed() {
    local log=$1
    shift
    { "$@" 2>&1 >"$log.out" | while IFS= read -r line; do printf '%s %s\n' "${EPOCHREALTIME/,/.}" "$line"; done >"$log.err"; }
    local status=$?
    # What ha.sh says, and patronictl's verdict (not the tracebacks of its retries: in the log).
    sed 's/^[0-9.]* //' "$log.err" | grep -E '^ha: |Successfully|Could not|failed' | sed 's/^/    /'
    return $status
}

db() { psql "$1" -XAtq -v ON_ERROR_STOP=1 -c "$2"; }
node_url() { # node_url NODE: that node's own PostgreSQL, the payonce database
    local i=0 node url
    IFS=, read -r -a names <<<"$HA_NODES"
    IFS=, read -r -a urls <<<"$HA_NODE_URLS"
    for node in "${names[@]}"; do
        [ "$node" = "$1" ] && { url=${urls[$i]}; echo "${url%/*}/$database"; return; }
        i=$((i + 1))
    done
    return 1
}
sql_list() { sed "s/^\(pay\|re\)_//; s/.*/'&'/" | paste -sd, -; } # ids or keys, quoted, for `in (…)`

figures=()
failed=()

# ---------------------------------------------------------------------------------------------
# Storms: kill-primary, kill-node, switchover

storm() {
    local scenario=$1 run=$2 dir=$logs/$1-$2 old new start_ms runner runner_status action_status servers_state
    mkdir -p "$dir"
    cluster sync
    say "$scenario, run $run: $duration s storm, $concurrency workers x $duplicates duplicates, the database broken at $kill_at s"
    old=$(py leader "$HA_PATRONI_URLS")
    start_ms=$(now_ms)
    local targets=() url
    for url in "${servers[@]}"; do targets+=(--target "$url"); done
    "$loadtest" failover "${targets[@]}" --api-key "$api_key" --sim-url "$sim_url" \
        --duration "${duration}s" --concurrency "$concurrency" --duplicates "$duplicates" --max-attempts 200 \
        --timeline "$dir/timeline.jsonl" --json >"$dir/runner.json" 2>"$dir/runner.err" 8>&- &
    runner=$!
    pids+=("$runner")
    echo "$runner --timeline $dir/timeline.jsonl" >>"$procs"
    sleep "$kill_at"
    case "$scenario" in
        kill-primary) timed "$dir/action" ha kill-primary ;;
        kill-node) timed "$dir/action" ha kill-node ;;
        switchover) timed "$dir/action" ha switchover ;;
    esac
    action_status=$?
    [ "$action_status" = 0 ] || note "loadtest/ha.sh $scenario exited $action_status"
    # A runner that cannot finish (a cluster that never comes back) is stopped 5 minutes after
    # the storm's end (Ctrl-C for it: it stops, and audits what it has).
    for _ in $(seq $((duration + 300))); do kill -0 "$runner" 2>/dev/null || break; sleep 1; done
    if kill -0 "$runner" 2>/dev/null; then
        note "the runner is still running 5 minutes after the storm: stopping it"
        kill -INT "$runner" 2>/dev/null
        for _ in $(seq 60); do kill -0 "$runner" 2>/dev/null || break; sleep 1; done
        kill -KILL "$runner" 2>/dev/null
    fi
    wait "$runner"
    runner_status=$?
    [ "$runner_status" = 0 ] || { note "the runner exited $runner_status"; tail -n 5 "$dir/runner.err" >&2; }
    new=$(py leader "$HA_PATRONI_URLS")
    if servers_ok; then servers_state=1; else servers_state=0; fi
    py analyze "$scenario" "$run" "$dir" "$start_ms" "$duration" "$min_keys" "$max_window" "$old" "$new" \
        "$runner_status" "$servers_state"
    local status=$?
    figures+=("$dir/figures.json")
    [ "$status" = 0 ] || failed+=("$scenario run $run")
    # Back to three healthy nodes for the next run: a lost node is started again (pg_rewind).
    if [ "$scenario" = kill-node ] && [ -n "$old" ]; then
        ha restart-node "$old" >>"$logs/ha.log" 2>&1 || note "restart-node $old failed (see $logs/ha.log)"
    fi
    ha wait >>"$logs/ha.log" 2>&1 || { note "the cluster did not recover after $scenario"; cluster_mode=''; }
}

# ---------------------------------------------------------------------------------------------
# async-forget: acknowledged payments lost to an asynchronous failover, then retried

forget() {
    local run=$1 dir=$logs/async-forget-$1 lead standby prefix n present_leader present_standby remaining payments_left status=0
    mkdir -p "$dir"
    cluster async
    say "async-forget, run $run: $forget_keys payments acknowledged while a standby is cut off, then a failover onto it (--forget-by $forget_by)"
    lead=$(py leader "$HA_PATRONI_URLS")
    standby=$(IFS=,; for n in $HA_NODES; do [ "$n" != "$lead" ] && echo "$n"; done | head -n 1)
    # The standby has everything so far (the customer, the schema): it is cut off only from the
    # payments that follow.
    for _ in $(seq 100); do
        [ "$(db "$(node_url "$standby")" "select pg_last_wal_replay_lsn() >= '$(db "$db_url" "select pg_current_wal_lsn()")'")" = t ] && break
        sleep 0.2
    done
    echo "leader $lead; cutting $standby off (loadtest/ha.sh lag --pause $standby)"
    ha lag --pause "$standby" 2>&1 | sed 's/^/    /'
    prefix=forget-$(date +%s%N)-$run
    py requests payments "$prefix" "$forget_keys" >"$dir/requests.json"
    py send "$(IFS=,; echo "${servers[*]}")" "$api_key" "$dir/requests.json" "$dir/first.json" ||
        { note "the payments were not all acknowledged"; failed+=("async-forget run $run"); return; }
    py ids "$dir/first.json" id >"$dir/ids"
    present_leader=$(db "$db_url" "select count(*) from payments where id in ($(sql_list <"$dir/ids"))")
    present_standby=$(db "$(node_url "$standby")" "select count(*) from payments where id in ($(sql_list <"$dir/ids"))")
    echo "acknowledged (201): $(wc -l <"$dir/ids"); on the leader $lead: $present_leader; on $standby: $present_standby"
    case "$forget_by" in
        failover)
            echo "loadtest/ha.sh failover $standby"
            timed "$dir/action" ha failover "$standby" || status=1
            ;;
        kill-node)
            echo "loadtest/ha.sh kill-node --no-wait (the leader, $lead), then failover $standby"
            timed "$dir/kill" ha kill-node --no-wait || status=1
            timed "$dir/action" ha failover "$standby" || status=1
            ;;
    esac
    ha lag --resume "$standby" >>"$logs/ha.log" 2>&1
    [ "$forget_by" != kill-node ] || ha restart-node "$lead" >>"$logs/ha.log" 2>&1 || note "restart-node $lead failed"
    ha wait >>"$logs/ha.log" 2>&1 || { note "the cluster did not recover"; cluster_mode=''; status=1; }
    remaining=$(db "$db_url" "select count(*) from idempotency_keys where key like '$prefix-%'")
    payments_left=$(db "$db_url" "select count(*) from payments where id in ($(sql_list <"$dir/ids"))")
    echo "after the failover (leader $(py leader "$HA_PATRONI_URLS")): keys left $remaining, payments left $payments_left of $forget_keys"
    echo "retrying every payment with the same key and body, then once more"
    py send "$(IFS=,; echo "${servers[*]}")" "$api_key" "$dir/requests.json" "$dir/retried.json" || status=1
    py send "$(IFS=,; echo "${servers[*]}")" "$api_key" "$dir/requests.json" "$dir/replayed.json" || status=1
    py compare payments "$dir/first.json" "$dir/retried.json" "$dir/replayed.json" "$sim_url" "$dir/compare.json" || status=1
    python3 - "$dir" "$run" "$forget_keys" "$present_leader" "$present_standby" "$remaining" "$payments_left" "$status" "$forget_by" "$lead" "$standby" <<'PY'
import json, os, sys
d, run, n, leader, standby, keys_left, payments_left, status, by, old, new = sys.argv[1:]
c = json.load(open(os.path.join(d, "compare.json")))
fig = c["figures"]
n = int(n)
checks = [
    ("the payments were on the leader", int(leader) == n, leader),
    ("the cut standby never received them", int(standby) == 0, standby),
    ("the failover forgot every key and payment", int(keys_left) == 0 and int(payments_left) == 0, "%s keys, %s payments left" % (keys_left, payments_left)),
    ("every retry: a 201 with the same payment id", fig.get("same id", 0) == n, fig.get("same id", 0)),
    ("... and the same PaymentIntent", fig.get("same payment_intent", 0) == n, fig.get("same payment_intent", 0)),
    ("one charge per key in the ledger (no new charge)", fig.get("ledger entries", 0) == n and not c["problems"], fig.get("ledger entries", 0)),
    ("the steps ran (failover, retries)", status == "0", status),
]
action = {}
if os.path.exists(os.path.join(d, "action.out")):
    action = dict(l.strip().split("=", 1) for l in open(os.path.join(d, "action.out")) if "=" in l)
f = {"scenario": "async-forget", "run": int(run), "keys": n, "forget_by": by, "old_leader": old, "new_leader": new,
     "ha_recovery_s": float(action["HA_RECOVERY_SECS"]) if "HA_RECOVERY_SECS" in action else None,
     "on_leader_before": int(leader), "on_standby_before": int(standby), "keys_left_after": int(keys_left),
     "payments_left_after": int(payments_left), "figures": fig, "problems": c["problems"],
     "new_charges": fig.get("ledger entries", 0) - n, "lost": n - fig.get("same id", 0),
     "what": "%d payments: %s forgotten, %s rebuilt (same id and PaymentIntent)" % (n, n - int(payments_left), min(fig.get("same id", 0), fig.get("same payment_intent", 0))),
     "checks": [{"check": a, "ok": b, "value": v} for a, b, v in checks]}
f["passed"] = all(b for _, b, _ in checks)
json.dump(f, open(os.path.join(d, "figures.json"), "w"), indent=1)
for a, b, v in checks:
    print("    %-50s %s  (%s)" % (a, "ok" if b else "FAILED", v))
print("    %s" % ("PASS" if f["passed"] else "FAIL"))
sys.exit(0 if f["passed"] else 1)
PY
    [ $? = 0 ] || failed+=("async-forget run $run")
    figures+=("$dir/figures.json")
}

# ---------------------------------------------------------------------------------------------
# restore: payments and refunds after a base backup, a point-in-time restore to the backup, then
# retried

restore() {
    local run=$1 dir=$logs/restore-$1 name prefix status=0 p_before r_before p_after r_after k_after
    mkdir -p "$dir"
    cluster any
    name=failover-$(date +%Y%m%dT%H%M%S)-$run
    say "restore, run $run: backup $name, then $restore_keys payments and a refund of each, then the restore"
    ha backup "$name" >"$dir/backup.env" 2>>"$logs/ha.log" || { note "ha.sh backup failed"; failed+=("restore run $run"); return; }
    sed 's/^/    /' "$dir/backup.env"
    prefix=restore-$(date +%s%N)-$run
    py requests payments "$prefix" "$restore_keys" >"$dir/pay-requests.json"
    py send "$(IFS=,; echo "${servers[*]}")" "$api_key" "$dir/pay-requests.json" "$dir/pay-first.json" ||
        { failed+=("restore run $run"); return; }
    py requests refunds "$prefix-refund" "$restore_keys" "$dir/pay-first.json" >"$dir/refund-requests.json"
    py send "$(IFS=,; echo "${servers[*]}")" "$api_key" "$dir/refund-requests.json" "$dir/refund-first.json" ||
        { failed+=("restore run $run"); return; }
    py ids "$dir/pay-first.json" id >"$dir/pay-ids"
    py ids "$dir/refund-first.json" id >"$dir/refund-ids"
    p_before=$(db "$db_url" "select count(*) from payments where id in ($(sql_list <"$dir/pay-ids"))")
    r_before=$(db "$db_url" "select count(*) from refunds where id in ($(sql_list <"$dir/refund-ids"))")
    echo "acknowledged: $p_before payments, $r_before refunds in the database"
    echo "loadtest/ha.sh restore $name (to the end of the backup)"
    local began=$SECONDS
    ha restore "$name" >"$dir/restore.env" 2>"$dir/restore.err" || { tail -n 20 "$dir/restore.err" >&2; status=1; }
    grep -E 'restored|error' "$dir/restore.err" | sed 's/^/    /'
    local restore_secs=$((SECONDS - began))
    p_after=$(db "$db_url" "select count(*) from payments where id in ($(sql_list <"$dir/pay-ids"))")
    r_after=$(db "$db_url" "select count(*) from refunds where id in ($(sql_list <"$dir/refund-ids"))")
    k_after=$(db "$db_url" "select count(*) from idempotency_keys where key like '$prefix-%'")
    # A restore that lost the database itself (not only the rows after the backup) is a failed
    # restore, not a count: say so, and let the checks below fail on it.
    if [ -z "$p_after$r_after$k_after" ]; then
        note "the restored cluster has no database $database: the backup was not what came back"
        p_after=-1 r_after=-1 k_after=-1 status=1
    fi
    echo "after the restore: payments left $p_after, refunds left $r_after, keys left $k_after"
    echo "retrying every payment, then every refund, with the same key and body, then once more"
    py send "$(IFS=,; echo "${servers[*]}")" "$api_key" "$dir/pay-requests.json" "$dir/pay-retried.json" || status=1
    py send "$(IFS=,; echo "${servers[*]}")" "$api_key" "$dir/refund-requests.json" "$dir/refund-retried.json" || status=1
    py send "$(IFS=,; echo "${servers[*]}")" "$api_key" "$dir/pay-requests.json" "$dir/pay-replayed.json" || status=1
    py send "$(IFS=,; echo "${servers[*]}")" "$api_key" "$dir/refund-requests.json" "$dir/refund-replayed.json" || status=1
    echo "  payments:"
    py compare payments "$dir/pay-first.json" "$dir/pay-retried.json" "$dir/pay-replayed.json" "$sim_url" "$dir/pay-compare.json" || status=1
    echo "  refunds:"
    py compare refunds "$dir/refund-first.json" "$dir/refund-retried.json" "$dir/refund-replayed.json" "$sim_url" "$dir/refund-compare.json" || status=1
    python3 - "$dir" "$run" "$restore_keys" "$p_before" "$r_before" "$p_after" "$r_after" "$k_after" "$status" "$name" "$restore_secs" "$cluster_mode" <<'PY'
import json, os, sys
d, run, n, pb, rb, pa, ra, ka, status, name, secs, mode = sys.argv[1:]
n = int(n)
p = json.load(open(os.path.join(d, "pay-compare.json")))
r = json.load(open(os.path.join(d, "refund-compare.json")))
pf, rf = p["figures"], r["figures"]
checks = [
    ("payments and refunds acknowledged", int(pb) == n and int(rb) == n, "%s, %s" % (pb, rb)),
    ("the restore forgot them (payments, refunds, keys)", int(pa) == 0 and int(ra) == 0 and int(ka) == 0, "%s, %s, %s left" % (pa, ra, ka)),
    ("every payment retried: the same id and PaymentIntent", pf.get("same id", 0) == n and pf.get("same payment_intent", 0) == n, pf.get("same id", 0)),
    ("every refund retried: the same id and gateway refund", rf.get("same id", 0) == n and rf.get("same gateway_refund", 0) == n, rf.get("same id", 0)),
    ("one charge per payment key in the ledger", pf.get("ledger entries", 0) == n and not p["problems"], pf.get("ledger entries", 0)),
    ("one refund per refund key in the ledger", rf.get("ledger entries", 0) == n and not r["problems"], rf.get("ledger entries", 0)),
    ("the steps ran (restore, retries)", status == "0", status),
]
f = {"scenario": "restore", "run": int(run), "keys": n, "backup": name, "restore_s": int(secs), "cluster_mode": mode,
     "payments_before": int(pb), "refunds_before": int(rb), "payments_left_after": int(pa), "refunds_left_after": int(ra),
     "keys_left_after": int(ka), "payments": pf, "refunds": rf, "problems": p["problems"] + r["problems"],
     "new_charges": pf.get("ledger entries", 0) - n + rf.get("ledger entries", 0) - n,
     "lost": 2 * n - pf.get("same id", 0) - rf.get("same id", 0),
     "what": "%d payments + %d refunds: %s + %s forgotten, %s + %s rebuilt" % (n, n, int(pb) - int(pa), int(rb) - int(ra), pf.get("same id", 0), rf.get("same id", 0)),
     "checks": [{"check": a, "ok": b, "value": v} for a, b, v in checks]}
f["passed"] = all(b for _, b, _ in checks)
json.dump(f, open(os.path.join(d, "figures.json"), "w"), indent=1)
for a, b, v in checks:
    print("    %-55s %s  (%s)" % (a, "ok" if b else "FAILED", v))
print("    %s" % ("PASS" if f["passed"] else "FAIL"))
sys.exit(0 if f["passed"] else 1)
PY
    [ $? = 0 ] || failed+=("restore run $run")
    figures+=("$dir/figures.json")
}

# ---------------------------------------------------------------------------------------------

say "failover proofs: ${scenarios[*]} (payonce: $payonce; loadtest: $loadtest)"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
echo "machine: $(nproc) CPUs, load average $load_start; state folder $state"
# A fresh cluster, whatever an earlier run left behind.
ha down >>"$logs/ha.log" 2>&1 || true
start_simulator
for scenario in "${scenarios[@]}"; do
    case "$scenario" in
        kill-primary | kill-node | switchover)
            for run in $(seq "$runs"); do storm "$scenario" "$run"; done
            ;;
        async-forget)
            for run in $(seq "$runs"); do forget "$run"; done
            ;;
        restore)
            for run in $(seq "$runs"); do restore "$run"; done
            ;;
    esac
done

say "summary ($((SECONDS - started_at)) s)"
FAILOVER_COMMAND="loadtest/failover.sh --runs $runs --duration $duration --concurrency $concurrency --duplicates $duplicates --kill-at $kill_at --forget-keys $forget_keys --forget-by $forget_by --restore-keys $restore_keys ${scenarios[*]}" \
    FAILOVER_PAYONCE=$payonce FAILOVER_LOADTEST=$loadtest FAILOVER_LOAD_START=$load_start py summary "${json_out:+$(realpath -m "$json_out")}" "${figures[@]}"
[ -z "$json_out" ] || echo "figures: $json_out"
if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "PASS: every check of every run"
