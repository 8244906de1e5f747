#!/usr/bin/env python3
"""The cost of one request, measured around a phase of loadtest/bench.sh: PostgreSQL's CPU,
payonce's CPU, rows written and WAL bytes, per request, beside pgbench running the same
statements. docs/performance.md ("Cost per payment") explains the figures.

    cost.py measure --admin-url URL --db NAME --payonce PID --simulator PID --out FILE -- COMMAND…

runs COMMAND (the load generator, or pgbench) and writes what the phase cost to FILE (JSON):

- PostgreSQL's CPU: utime + stime from /proc of every process of the PostgreSQL server, read
  every 50 ms while the phase runs, so that backends that come and go are counted too (a
  backend's last 50 ms before it exits can be missed: pgbench's, when pgbench ends). The
  machine's PostgreSQL may be shared (tests of other branches create their own databases), so
  the processes are split by their title: backends of the scratch database ("ours"), the
  server's own processes (checkpointer, WAL writer, …: "background", counted as the database's
  cost), and backends of other databases ("other": not counted, reported as noise).
- payonce's and the simulator's CPU: /proc/PID/stat before and after; the load generator's (or
  pgbench's) from its rusage when it exits.
- rows written: n_tup_ins + n_tup_upd + n_tup_del of the scratch database's tables
  (pg_stat_user_tables). PostgreSQL 15 publishes an idle backend's counters up to 10 s late, so
  the scratch database's connections are closed (pg_terminate_backend; a backend publishes its
  counters when it exits) before the phase, after its warm-up, and after it. The server's pool
  opens new ones on its next request, within the phase: that costs a few milliseconds of CPU
  per phase, against seconds.
- WAL: pg_current_wal_lsn() before and after, and pg_stat_wal's records and full-page images.
  Both are the whole server's: writes of other databases during the phase are counted too
  (the "other" CPU says whether there were any).

When PostgreSQL is not on this machine (its processes are not in /proc), its CPU is left out.
"""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")
SAMPLE_EVERY = 0.05
# Titles of PostgreSQL's own processes (not a client's backend): the database's overhead.
BACKGROUND = (
    "checkpointer",
    "background writer",
    "walwriter",
    "autovacuum launcher",
    "logical replication launcher",
    "archiver",
    "stats collector",
    "startup",
    "walreceiver",
)


def psql(url, sql):
    return subprocess.run(["psql", url, "-XAtqc", sql], check=True, capture_output=True, text=True).stdout.strip()


def lsn(text):
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def ticks(pid):
    """utime + stime of a process, in clock ticks (None once it is gone)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    # fields[0] is the state (field 3 of stat(5)); utime and stime are fields 14 and 15.
    return int(fields[11]) + int(fields[12])


def machine():
    """Busy and idle (with iowait) ticks of the whole machine."""
    cpu = pathlib.Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, cpu[:8])
    return user + nice + system + irq + softirq + steal, idle + iowait


class Postgres:
    """The processes of one PostgreSQL server, each read at every sample."""

    def __init__(self, admin_url, db):
        self.db = db
        self.postmaster = None
        self.first, self.last, self.kind = {}, {}, {}
        checkpointer = psql(admin_url, "select pid from pg_stat_activity where backend_type = 'checkpointer'")
        try:
            stat = pathlib.Path(f"/proc/{checkpointer}/stat").read_text()
            if "(postgres)" in stat or "(postmaster)" in stat:
                self.postmaster = int(stat.rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ValueError):
            pass

    @property
    def local(self):
        return self.postmaster is not None

    def children(self):
        try:
            return [int(p) for p in pathlib.Path(f"/proc/{self.postmaster}/task/{self.postmaster}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            return []

    def classify(self, pid):
        if pid == self.postmaster:
            return "background"
        try:
            title = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            return None  # it exited between the listing and the read (ESRCH on a vanishing pid)
        if not title.startswith("postgres:"):
            return None  # just forked: still the postmaster's command line; look again next time
        if re.search(rf"\s{re.escape(self.db)}\s", title + " "):
            return "ours"
        leader = re.search(r"parallel worker for PID (\d+)", title)
        if leader:
            return self.kind.get(int(leader.group(1)), "other")
        if any(title.rstrip().endswith(name) for name in BACKGROUND):
            return "background"
        return "other"

    def sample(self, first=False):
        if not self.local:
            return
        for pid in [self.postmaster, *self.children()]:
            now = ticks(pid)
            if now is None:
                continue
            if self.kind.get(pid) is None:
                self.kind[pid] = self.classify(pid)
            # A process first seen after the phase began started within it: all its ticks count.
            self.first.setdefault(pid, now if first else 0)
            self.last[pid] = now

    def totals(self):
        out = {"ours": 0, "background": 0, "other": 0, "unknown": 0}
        for pid, last in self.last.items():
            out[self.kind.get(pid) or "unknown"] += last - self.first[pid]
        return {k: v / HZ for k, v in out.items()}


def flush(admin_url, db, local):
    """Closes the scratch database's connections, so that their statistics are published."""
    # The victims are chosen first (a materialised CTE): in a plain WHERE the planner may call
    # pg_terminate_backend on rows before the database's name has been compared.
    pids = psql(admin_url, f"""
        with victims as materialized (
            select pid from pg_stat_activity where datname = '{db}' and pid <> pg_backend_pid()
        )
        select pid from victims where pg_terminate_backend(pid)""").split()
    deadline = time.monotonic() + 10
    while pids and time.monotonic() < deadline:
        if local:
            pids = [p for p in pids if pathlib.Path(f"/proc/{p}").exists()]
        else:
            alive = set(psql(admin_url, "select pid from pg_stat_activity").split())
            pids = [p for p in pids if p in alive]
        time.sleep(0.02)


def database(admin_url, db):
    base, sep, params = admin_url.partition("?")  # keep e.g. ?sslmode=disable
    url = base.rsplit("/", 1)[0] + "/" + db + sep + params
    tables = json.loads(psql(url, """
        select coalesce(json_object_agg(relname, json_build_array(n_tup_ins, n_tup_upd, n_tup_del, n_tup_hot_upd)), '{}')
        from pg_stat_user_tables"""))
    commits, rollbacks = map(int, psql(url, """
        select xact_commit || ' ' || xact_rollback from pg_stat_database where datname = current_database()""").split())
    return {"tables": tables, "commits": commits, "rollbacks": rollbacks}


def wal(admin_url):
    current, records, fpi = psql(admin_url, "select pg_current_wal_lsn() || ' ' || wal_records || ' ' || wal_fpi from pg_stat_wal").split()
    return {"lsn": lsn(current), "records": int(records), "fpi": int(fpi)}


def measure(args):
    if not re.fullmatch(r"[a-z0-9_]+", args.db):
        sys.exit(f"cost.py: {args.db!r} is not a scratch database's name (it is written into SQL)")
    postgres = Postgres(args.admin_url, args.db)
    flush(args.admin_url, args.db, postgres.local)
    db0, wal0 = database(args.admin_url, args.db), wal(args.admin_url)
    payonce0, sim0, machine0 = ticks(args.payonce), ticks(args.simulator), machine()
    postgres.sample(first=True)
    started = time.monotonic()
    child = subprocess.Popen(args.command)
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        postgres.sample()
        time.sleep(SAMPLE_EVERY)
    child.returncode = os.waitstatus_to_exitcode(status)
    postgres.sample()
    elapsed = time.monotonic() - started
    payonce1, sim1, machine1 = ticks(args.payonce), ticks(args.simulator), machine()
    wal1 = wal(args.admin_url)
    flush(args.admin_url, args.db, postgres.local)
    db1 = database(args.admin_url, args.db)

    rows = {}
    for table, after in db1["tables"].items():
        before = db0["tables"].get(table, [0, 0, 0, 0])
        delta = [a - b for a, b in zip(after, before)]
        if any(delta):
            rows[table] = dict(zip(["inserted", "updated", "deleted", "hot_updated"], delta))
    report = {
        "elapsed_secs": elapsed,
        "postgres_local": postgres.local,
        "postgres_cpu_secs": postgres.totals() if postgres.local else None,
        "payonce_cpu_secs": (payonce1 - payonce0) / HZ,
        "simulator_cpu_secs": (sim1 - sim0) / HZ,
        "client_cpu_secs": usage.ru_utime + usage.ru_stime,
        "machine_busy_secs": (machine1[0] - machine0[0]) / HZ,
        "machine_idle_secs": (machine1[1] - machine0[1]) / HZ,
        "cores": os.cpu_count(),
        "rows": rows,
        "commits": db1["commits"] - db0["commits"],
        "rollbacks": db1["rollbacks"] - db0["rollbacks"],
        "wal_bytes": wal1["lsn"] - wal0["lsn"],
        "wal_records": wal1["records"] - wal0["records"],
        "wal_fpi": wal1["fpi"] - wal0["fpi"],
    }
    pathlib.Path(args.out).write_text(json.dumps(report, indent=2))
    return child.returncode


# What the issue asks of a new payment and a replay on this machine (issue 24).
DB_CPU_RATIO_TARGET = 1.5  # PostgreSQL's CPU per new payment, at most this × pgbench's per payment
PAYONCE_NEW_TARGET_MS = 0.25
PAYONCE_REPLAY_TARGET_MS = 0.05


def report(work, phases):
    """Prints the cost table. phases: (label, cost file name, requests, kind) with kind one of
    "limit" (pgbench flat out), "pgbench" (the reference: pgbench at payonce's rate), "new",
    "replay" or "bare" (the same handler without the idempotency layer)."""
    work = pathlib.Path(work)
    rows_out, figures = [], {}
    for label, name, requests, kind in phases:
        path = work / f"{name}.cost.json"
        if not path.exists() or not requests:
            continue
        c = json.loads(path.read_text())
        per = lambda x: x / requests
        pg = c["postgres_cpu_secs"]
        f = {
            "requests": requests,
            "pg_ms": per(pg["ours"] + pg["background"]) * 1000 if pg else None,
            "payonce_ms": per(c["payonce_cpu_secs"]) * 1000 if kind not in ("pgbench", "limit") else None,
            "client_ms": per(c["client_cpu_secs"]) * 1000,
            "rows": per(sum(r["inserted"] + r["updated"] + r["deleted"] for r in c["rows"].values())),
            "commits": per(c["commits"]),
            "wal": per(c["wal_bytes"]),
            "wal_records": per(c["wal_records"]),
            "other_pg_secs": pg["other"] + pg["unknown"] if pg else 0.0,
            "rest_secs": c["machine_busy_secs"] - (pg["ours"] + pg["background"] + pg["other"] + pg["unknown"] if pg else 0)
            - c["payonce_cpu_secs"] - c["simulator_cpu_secs"] - c["client_cpu_secs"],
            "idle_share": c["machine_idle_secs"] / max(c["machine_busy_secs"] + c["machine_idle_secs"], 1e-9),
            "cost": c,
        }
        figures[name] = (label, kind, f)
        rows_out.append((label, f))

    ms = lambda v: "n/a" if v is None else f"{v:.3f} ms"
    print("\n  cost per request (CPU from /proc; rows from pg_stat_user_tables; WAL from pg_current_wal_lsn)")
    print(f"    {'':<40} {'requests':>9} {'PostgreSQL CPU':>15} {'payonce CPU':>12} {'rows written':>13} "
          f"{'WAL bytes':>10} {'commits':>8}")
    for label, f in rows_out:
        print(f"    {label:<40} {f['requests']:>9} {ms(f['pg_ms']):>15} {ms(f['payonce_ms']):>12} "
              f"{f['rows']:>13.2f} {f['wal']:>10.0f} {f['commits']:>8.2f}")

    print("\n    rows written per request, by table (inserted / updated (HOT) / deleted)")
    for name, (label, kind, f) in figures.items():
        tables = f["cost"]["rows"]
        parts = [f"{t} {r['inserted'] / f['requests']:.2f}/{r['updated'] / f['requests']:.2f}"
                 f"({r['hot_updated'] / f['requests']:.2f})/{r['deleted'] / f['requests']:.2f}"
                 for t, r in sorted(tables.items())]
        print(f"      {label.strip():<40} {', '.join(parts) or 'none'}")

    print("\n    the machine during each phase (CPU-seconds; \"other\" is what this benchmark did not run)")
    for name, (label, kind, f) in figures.items():
        c = f["cost"]
        pg = c["postgres_cpu_secs"]
        pg_text = "PostgreSQL not on this machine" if not pg else (
            f"PostgreSQL {pg['ours']:.1f} + background {pg['background']:.1f}, other databases {f['other_pg_secs']:.1f}")
        print(f"      {label.strip():<40} {c['elapsed_secs']:.1f} s: {pg_text}; payonce {c['payonce_cpu_secs']:.1f}, "
              f"simulator {c['simulator_cpu_secs']:.1f}, client {c['client_cpu_secs']:.1f}, other programs "
              f"{max(f['rest_secs'], 0):.1f}; idle {f['idle_share']:.0%}")
    noisy = [label.strip() for label, kind, f in figures.values()
             if f["other_pg_secs"] > 0.02 * max(f["cost"]["machine_busy_secs"], 1e-9)
             or f["rest_secs"] > 0.1 * max(f["cost"]["machine_busy_secs"], 1e-9)]
    if noisy:
        print(f"    NOTE: the machine was not quiet during: {', '.join(noisy)} (other databases or programs "
              f"used CPU; the WAL figures count other databases' writes too)")

    base = next((f for label, kind, f in figures.values() if kind == "pgbench"), None)
    news = [(label, f) for label, kind, f in figures.values() if kind == "new"]
    replays = [(label, f) for label, kind, f in figures.values() if kind == "replay"]
    bare = next((f for label, kind, f in figures.values() if kind == "bare"), None)
    verdict = lambda ok: "met" if ok else "NOT MET"
    print("\n  cost ratios and targets")
    if base:
        for label, f in news + replays:
            ratio = lambda a, b: f"{a / b:5.2f}×" if a is not None and b else "  n/a"
            print(f"    {label.strip():<40} / pgbench's payment at payonce's rate: PostgreSQL CPU {ratio(f['pg_ms'], base['pg_ms'])}   "
                  f"rows {ratio(f['rows'], base['rows'])}   WAL {ratio(f['wal'], base['wal'])}")
    for label, f in news:
        if base and f["pg_ms"] is not None and base["pg_ms"]:
            r = f["pg_ms"] / base["pg_ms"]
            print(f"    PostgreSQL CPU per new payment           {f['pg_ms']:.3f} ms = {r:.2f}× pgbench's {base['pg_ms']:.3f} ms at the same rate "
                  f"(target ≤ {DB_CPU_RATIO_TARGET}×): {verdict(r <= DB_CPU_RATIO_TARGET)}")
        else:
            print("    PostgreSQL CPU per new payment           not measured (PostgreSQL not on this machine)")
        print(f"    payonce CPU per new payment              {f['payonce_ms']:.3f} ms (target ≤ {PAYONCE_NEW_TARGET_MS} ms): "
              f"{verdict(f['payonce_ms'] <= PAYONCE_NEW_TARGET_MS)}")
        if bare:
            # The target is about what the handler costs without any key (docs/performance.md):
            # what the layer itself adds is the figure the layer's own code can move.
            print(f"      of which the idempotency layer         {f['payonce_ms'] - bare['payonce_ms']:.3f} ms "
                  f"(the same handler without it: {bare['payonce_ms']:.3f} ms)")
    for label, f in replays:
        what = re.sub(r"^[0-9] replays, |^replays ", "", label.strip())
        print(f"    payonce CPU per replay, {what:<16} {f['payonce_ms']:.3f} ms (target ≤ {PAYONCE_REPLAY_TARGET_MS} ms): "
              f"{verdict(f['payonce_ms'] <= PAYONCE_REPLAY_TARGET_MS)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("measure", help="run a command and write what it cost")
    m.add_argument("--admin-url", required=True, help="a PostgreSQL URL of the server (not the scratch database)")
    m.add_argument("--db", required=True, help="the scratch database's name")
    m.add_argument("--payonce", type=int, required=True, help="the payonce server's PID")
    m.add_argument("--simulator", type=int, required=True, help="the simulator's PID")
    m.add_argument("--out", required=True, help="the JSON file to write")
    m.add_argument("command", nargs="+")
    args = parser.parse_args()
    sys.exit(measure(args))


if __name__ == "__main__":
    main()
