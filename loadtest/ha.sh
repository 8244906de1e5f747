#!/usr/bin/env bash
# A highly available PostgreSQL of local processes, for the tests, the benchmark, CI and the
# workshop: one etcd, N PostgreSQL 15 nodes each run by its own Patroni, and HAProxy in front,
# routing writes to whichever node Patroni's REST API says is the leader (GET /primary → 200).
# The same topology as `docker-compose --profile ha up` (docs/ha.md), without Docker.
#
#   loadtest/ha.sh up [--nodes N] [--async | --strict]    then: eval "$(loadtest/ha.sh env)"
#   loadtest/ha.sh --help                                 every command
#
# Everything lives under one state folder, ${HA_DIR:-/tmp/payonce-ha} (nothing in /etc, no
# service installed), on free loopback ports. PostgreSQL refuses to run as root: run as root, the
# script runs every process as the `postgres` user and gives it the folder. Progress goes to
# stderr; stdout carries only NAME=value lines a caller can eval (`up`, `env`, `backup`, `restore`,
# and the measured recovery of `kill-primary`, `kill-node`, `switchover`, `failover`).
set -euo pipefail

HA_DIR=${HA_DIR:-/tmp/payonce-ha}
HA_DIR=${HA_DIR%/}
HA_TIMEOUT=${HA_TIMEOUT:-180}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
scope=payonce
namespace=/service/
marker=.payonce-ha
started_at=$(date +%s.%N)

say() { printf 'ha: %s\n' "$*" >&2; }
die() { printf 'ha: error: %s\n' "$*" >&2; exit 1; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
step() { printf 'ha: [%5ss] %s\n' "$(since "$started_at")" "$*" >&2; }

usage() {
    cat <<EOF
usage: loadtest/ha.sh COMMAND [ARGS]     (state folder: \$HA_DIR, now $HA_DIR)

A local PostgreSQL 15 HA cluster: etcd + N × (Patroni + PostgreSQL) + HAProxy, on free
loopback ports. Commands that print NAME=value lines on stdout are meant for eval.

cluster
  up [--nodes N] [--async|--strict]   install what is missing (apt), start everything, wait for a
                                      leader (and a synchronous standby), print the env lines.
                                      Default: 3 nodes, synchronous_mode: true. --async: Patroni's
                                      asynchronous replication (the "forgetting" demo); --strict:
                                      synchronous_mode_strict. A running cluster with the same
                                      settings is reused; anything else there is replaced.
  down                                stop every process, remove the state folder
  status                              patronictl list, replication per standby, HAProxy's routing
  env [--export]                      print the env lines of the running cluster again
  wait                                until every node runs, every standby streams, a leader takes
                                      writes through HAProxy and (sync modes) a synchronous standby
                                      is named

failures and planned changes (each waits until a write through HA_URL commits again and prints
HA_RECOVERY_SECS, HA_ROUTED_SECS and HA_LEADER; --no-wait returns at once)
  kill-primary                        kill -9 the leader's postmaster (Patroni fails over:
                                      primary_start_timeout 0)
  kill-node [NODE]                    kill -9 a node's Patroni and PostgreSQL (default: the
                                      leader's): a lost node. It stays down until restart-node
  switchover [--candidate NODE]       patronictl switchover --force (to the sync standby by default)
  failover NODE                       patronictl failover --candidate NODE --force: promote NODE
                                      even if it lags (with or without a live leader)
  restart-node NODE                   start a node's Patroni again (after kill-node), or restart it;
                                      waits until it has rejoined (pg_rewind when it must)

a standby that falls behind
  lag --pause [NODE] [--replay-only]  cut NODE's WAL stream (the leader's pg_hba.conf rejects its
                                      replication role, its walsender is terminated) and pause its
                                      replay: what it has not received is lost if it is promoted.
                                      --replay-only pauses replay only
                                      (pg_wal_replay_pause): received WAL is still applied at
                                      promotion, nothing is lost. Default NODE: a standby
  lag --resume [NODE]                 undo both
  lag --status                        received and replayed positions per standby

backup and point-in-time restore (WAL is archived to \$HA_DIR/archive by every primary)
  backup [NAME]                       pg_basebackup from the leader (with its WAL), verified, plus
                                      a restore point named NAME
  restore NAME [--target-time T | --target-name N | --target-lsn L | --latest] [--timeline TL]
                                      replace the cluster's data by the backup, recovered to the
                                      end of the backup (default) or the target, behind the same
                                      ports and URLs: node1 is bootstrapped from it by Patroni
                                      (bootstrap.method), the other nodes clone from node1.
                                      --timeline (recovery_target_timeline, default latest): the
                                      history to follow after the backup; an earlier restore made
                                      a newer one, so name the backup's (HA_BACKUP_TIMELINE) to
                                      reach a target on the original history
tools
  ctl ARGS…                           patronictl with the cluster's configuration
  psql [NODE|primary|replica] ARGS…   psql to a node, or through HAProxy

environment: HA_DIR (state folder), HA_TIMEOUT (seconds to wait for a cluster, $HA_TIMEOUT),
PG_BIN ($PG_BIN). Needs: bash, python3, curl, psql; installs patroni, etcd-server, etcd-client
and haproxy from Debian when they are missing (root). docs/ha.md explains every setting.
EOF
}

# ---------------------------------------------------------------------------------------------
# Tools and users

# The user the cluster's processes run as: postgres when run as root (PostgreSQL refuses root),
# the caller otherwise.
if [ "$(id -u)" -eq 0 ]; then
    run_user=postgres
else
    run_user=$(id -un)
fi

run_as=()
[ "$(id -u)" -ne 0 ] || run_as=(setpriv --reuid=postgres --regid=postgres --init-groups -- env HOME="$HA_DIR")
as_run_user() { "${run_as[@]}" "$@"; }

ensure_tools() {
    local missing=() tool
    command -v patroni >/dev/null || missing+=(patroni)
    command -v etcd >/dev/null || missing+=(etcd-server)
    command -v etcdctl >/dev/null || missing+=(etcd-client)
    command -v haproxy >/dev/null || missing+=(haproxy)
    [ -x "$PG_BIN/postgres" ] || missing+=(postgresql-15)
    command -v psql >/dev/null || missing+=(postgresql-client-15)
    command -v curl >/dev/null || missing+=(curl)
    command -v python3 >/dev/null || missing+=(python3)
    if [ ${#missing[@]} -gt 0 ]; then
        [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}"
        step "installing ${missing[*]} (Debian's packages)"
        export DEBIAN_FRONTEND=noninteractive
        # Other scripts use apt at the same time: one at a time. The packages' services are not
        # started inside containers (policy-rc.d) and nothing here uses them where they are.
        flock /var/lock/payonce-apt.lock apt-get update -qq ||
            die "apt-get update failed"
        flock /var/lock/payonce-apt.lock apt-get install -y -qq --no-install-recommends "${missing[@]}" \
            >"${TMPDIR:-/tmp}/payonce-ha-apt.log" 2>&1 ||
            { tail -n 20 "${TMPDIR:-/tmp}/payonce-ha-apt.log" >&2; die "apt-get install ${missing[*]} failed"; }
    fi
    for tool in patroni patronictl etcd etcdctl haproxy psql pg_basebackup curl python3 setpriv; do
        command -v "$tool" >/dev/null || die "$tool is still missing"
    done
    [ "$(id -u)" -ne 0 ] || id postgres >/dev/null 2>&1 || die "there is no postgres user to run PostgreSQL as"
}

# ---------------------------------------------------------------------------------------------
# The state folder

# The folder must be ours before anything in it is killed or removed: it holds the marker file,
# or does not exist. Refuses the obviously shared places.
check_dir() {
    case "$HA_DIR" in
        "" | / | /tmp | /var | /var/tmp | /root | /home | "$HOME") die "HA_DIR=$HA_DIR is not a folder of its own" ;;
        /*) ;;
        *) die "HA_DIR must be an absolute path (it is $HA_DIR)" ;;
    esac
    if [ -e "$HA_DIR" ] && [ ! -e "$HA_DIR/$marker" ] && [ -n "$(ls -A "$HA_DIR" 2>/dev/null)" ]; then
        die "$HA_DIR exists and is not a state folder of this script (no $marker in it): choose another HA_DIR"
    fi
    [ ${#HA_DIR} -le 60 ] || die "HA_DIR is too long for PostgreSQL's socket paths (max 60 characters)"
}

# One command at a time changes a cluster (a second `up` waits for the first). The lock's file
# sits beside the folder, and is never inherited by the daemons (9>&- where they start).
lock_dir() {
    exec 9>"$HA_DIR.lock"
    flock -w "$HA_TIMEOUT" 9 || die "another ha.sh holds $HA_DIR.lock"
}

load_env() {
    [ -f "$HA_DIR/ha.env" ] || die "no cluster in $HA_DIR (run: loadtest/ha.sh up)"
    # shellcheck source=/dev/null
    . "$HA_DIR/ha.env"
    read -r -a pg_ports <<<"$HA_PG_PORTS"
    read -r -a rest_ports <<<"$HA_REST_PORTS"
    nodes=()
    local i
    for i in $(seq "$HA_NODE_COUNT"); do nodes+=("node$i"); done
}

node_index() { # node_index NAME → 0-based index, or dies
    local i
    for i in "${!nodes[@]}"; do [ "${nodes[$i]}" = "$1" ] && { echo "$i"; return; }; done
    die "no node named '$1' (nodes: ${nodes[*]})"
}

pg_url() { echo "postgres://postgres@127.0.0.1:$1/postgres"; }

# Free ports outside the kernel's ephemeral range (a port picked from that range may be taken by
# an outgoing connection by the time a node restarts on it), checked by binding them.
pick_ports() {
    python3 - "$1" <<'EOF'
import random, socket, sys
count = int(sys.argv[1])
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except OSError:
    low = 32768
held, ports = [], []
candidates = list(range(20000, low)) if low > 21000 else []
random.shuffle(candidates)
for port in candidates:
    if len(ports) == count:
        break
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        continue
    held.append(s)
    ports.append(port)
while len(ports) < count:  # no room below the ephemeral range: the kernel's pick
    s = socket.socket(); s.bind(("127.0.0.1", 0)); held.append(s); ports.append(s.getsockname()[1])
print(" ".join(map(str, ports)))
EOF
}

# ---------------------------------------------------------------------------------------------
# Processes. Each daemon's pid is in $HA_DIR/pids/NAME.pid; a pid counts only while its command
# line still names this state folder (a recycled pid is never signalled).

pid_of() { # pid_of NAME → the live pid, or fails
    local file=$HA_DIR/pids/$1.pid pid
    [ -s "$file" ] || return 1
    pid=$(cat "$file")
    ours "$pid" || return 1
    echo "$pid"
}

ours() { # ours PID: alive, and its command line names the state folder
    # No `tr | grep -q` pipe: under pipefail, grep leaving at its first match can fail the pipe
    # (tr's write after it, SIGPIPE/EPIPE), and a live node read as gone. That is what made
    # `ha.sh up` say "node1's Patroni gave up bootstrapping" in CI with Patroni running.
    # An empty command line is a process in the middle of an execve (its new memory has no
    # arguments yet; setsid → setpriv → env → python3 is three of them, and on a loaded machine
    # one can last tens of milliseconds): read again rather than call a live node gone. That
    # read made `ha.sh up` fail in CI with "node1's Patroni gave up bootstrapping" once more,
    # with `ps` showing the same process, command line and all, a moment later.
    local cmdline _
    [ -n "$1" ] || return 1
    for _ in $(seq 40); do
        cmdline=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
        [ -z "$cmdline" ] && alive "$1" || break
        sleep 0.05
    done
    [[ $cmdline == *"$HA_DIR/"* ]]
}

spawn() { # spawn NAME COMMAND…: a daemon in its own session, logging to $HA_DIR/NAME.log
    local name=$1
    shift
    setsid "${run_as[@]}" "$@" </dev/null >>"$HA_DIR/logs/$name.log" 2>&1 9>&- &
    local pid=$! _
    echo "$pid" >"$HA_DIR/pids/$name.pid"
    # Until the fork has exec'd, its command line is this script's, and `ours` (so `pid_of`)
    # says it is not running: a caller polling "running, or died?" would read "died" and go on.
    # A restore did exactly that, started the other nodes at once, and one of them bootstrapped
    # an empty cluster before node1 restored the backup.
    for _ in $(seq 50); do ours "$pid" || ! alive "$pid" && break; sleep 0.1; done
}

# The postmaster of a node (Patroni starts it in a session of its own: killing Patroni leaves it).
postmaster_of() {
    local file=$HA_DIR/$1/data/postmaster.pid pid
    [ -s "$file" ] || return 1
    pid=$(head -n 1 "$file" 2>/dev/null) || return 1
    ours "$pid" || return 1
    echo "$pid"
}

alive() { # alive PID: running (a zombie that init has not reaped yet is gone)
    local state
    state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) && [ -n "$state" ] && [ "$state" != Z ]
}

wait_gone() { # wait_gone PID SECONDS
    local _
    for _ in $(seq $(($2 * 10))); do alive "$1" || return 0; sleep 0.1; done
    return 1
}

stop_pid() { # stop_pid PID SIGNAL SECONDS: the signal, then SIGKILL after SECONDS
    local pid=$1
    kill "-$2" "$pid" 2>/dev/null || return 0
    wait_gone "$pid" "$3" || { kill -KILL "$pid" 2>/dev/null || true; wait_gone "$pid" 5 || true; }
}

stop_node() { # stop_node NODE: Patroni stops its PostgreSQL (fast), then anything left over
    local pid
    if pid=$(pid_of "$1"); then stop_pid "$pid" TERM 30; fi
    if pid=$(postmaster_of "$1"); then stop_pid "$pid" QUIT 10; fi
}

# stop_nodes NODE…: at once and without ceremony (for down and restore, which discard the data):
# SIGKILL to Patroni, then an immediate shutdown of PostgreSQL. A graceful stop takes each node
# 4 s or more (a synchronous standby waits for the primary to release it).
stop_nodes() {
    local node pid
    for node; do
        if pid=$(pid_of "$node"); then stop_pid "$pid" KILL 5; fi
    done
    for node; do
        if pid=$(postmaster_of "$node"); then kill -QUIT "$pid" 2>/dev/null || true; fi
    done
    for node; do
        if pid=$(postmaster_of "$node"); then stop_pid "$pid" QUIT 10; fi
    done
}

# Everything a previous run may have left: the nodes (all at once: each Patroni takes seconds to
# stop its PostgreSQL), the postmasters by their own pid files, then any process of the kinds
# this script starts whose command line still names this folder.
stop_everything() {
    local pid node names=()
    for node in "$HA_DIR"/node*; do [ -d "$node" ] && names+=("$(basename "$node")"); done
    stop_nodes "${names[@]}"
    for node in haproxy etcd; do
        if pid=$(pid_of "$node"); then stop_pid "$pid" TERM 10; fi
    done
    # Not a shell whose command line merely mentions the folder (a caller's `tail $HA_DIR/…`).
    local dir
    for dir in /proc/[0-9]*; do
        pid=${dir#/proc/}
        case "$(cat "$dir/comm" 2>/dev/null)" in
            patroni | etcd | haproxy | postgres | pg_basebackup | pg_rewind) ;;
            *) continue ;;
        esac
        if ours "$pid"; then stop_pid "$pid" KILL 5; fi
    done
}

# ---------------------------------------------------------------------------------------------
# Reading the cluster: Patroni's GET /cluster, from the first node that answers.

cluster_json() {
    local port
    for port in "${rest_ports[@]}"; do
        curl -fsS --max-time 2 "http://127.0.0.1:$port/cluster" 2>/dev/null && return 0
    done
    return 1
}

# cluster_query EXPR: a python expression over `c` (the /cluster document); prints its value.
cluster_query() {
    local json
    json=$(cluster_json) || return 1
    python3 -c '
import json, sys
c = json.loads(sys.argv[1])
m = c.get("members", [])
def role(r): return [x["name"] for x in m if x.get("role") == r]
leader = (role("leader") or [""])[0]
sync = role("sync_standby")
running = [x["name"] for x in m if x.get("state") in ("running", "streaming")]
standbys = [x["name"] for x in m if x.get("role") in ("replica", "sync_standby")]
v = eval(sys.argv[2])
print(" ".join(v) if isinstance(v, list) else v)' "$json" "$1"
}

leader() { cluster_query 'leader'; }

# probe URL: one committed write (waits for the synchronous standby, as a payment's commit does).
probe() {
    PGCONNECT_TIMEOUT=1 timeout 3 psql "$1" -XAtq -v ON_ERROR_STOP=1 -c \
        "create table if not exists payonce_ha_probe (id int primary key, at timestamptz not null);
         insert into payonce_ha_probe values (1, now()) on conflict (id) do update set at = excluded.at" \
        >/dev/null 2>&1
}

# wait_until SECONDS WHAT COMMAND…: polls COMMAND every 0.2 s.
wait_until() {
    local seconds=$1 what=$2 deadline
    shift 2
    deadline=$(($(date +%s) + seconds))
    while ! "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

cluster_ready() { # a leader, every node running, and (sync modes) a synchronous standby
    local want_sync=0 port
    # Each node answers itself (a dead node's member key outlives it by up to ttl).
    for port in "${rest_ports[@]}"; do curl -fs --max-time 1 -o /dev/null "http://127.0.0.1:$port/health" || return 1; done
    [ "$HA_MODE" = async ] || [ "$HA_NODE_COUNT" -lt 2 ] || want_sync=1
    [ "$(cluster_query "int(bool(leader) and len(running) == $HA_NODE_COUNT and (not $want_sync or bool(sync)))")" = 1 ] ||
        return 1
    # …and every standby streams from it: "running" comes first (a new standby waits for its
    # replication slot, which the leader's Patroni creates in its next cycle).
    [ "$(psql_node "$(leader)" -c "select count(*) from pg_stat_replication where state = 'streaming'" 2>/dev/null)" = \
        $((HA_NODE_COUNT - 1)) ]
}

# ---------------------------------------------------------------------------------------------
# Configuration files

write_env() {
    cat >"$HA_DIR/ha.env" <<EOF
# loadtest/ha.sh's record of this cluster (sourced by its commands)
HA_MODE=$HA_MODE
HA_NODE_COUNT=$HA_NODE_COUNT
HA_ETCD_PORT=$HA_ETCD_PORT
HA_ETCD_PEER_PORT=$HA_ETCD_PEER_PORT
HA_PRIMARY_PORT=$HA_PRIMARY_PORT
HA_REPLICA_PORT=$HA_REPLICA_PORT
HA_STATS_PORT=$HA_STATS_PORT
HA_PG_PORTS="${pg_ports[*]}"
HA_REST_PORTS="${rest_ports[*]}"
EOF
}

# write_node_config NODE [RESTORE-SECTION]: the node's patroni.yml. The bootstrap section is only
# read by the node that initialises the cluster (node1, or whichever wins the race).
write_node_config() {
    local node=$1 restore=${2:-} i sync=true strict=false
    i=$(node_index "$node")
    case "$HA_MODE" in
        async) sync=false ;;
        strict) strict=true ;;
    esac
    local dir=$HA_DIR/$node
    cat >"$dir/patroni.yml" <<EOF
# Written by loadtest/ha.sh; docs/ha.md explains each setting.
scope: $scope
namespace: $namespace
name: $node

log:
  level: INFO
  format: '%(asctime)s $node %(levelname)s: %(message)s'

restapi:
  listen: 127.0.0.1:${rest_ports[$i]}
  connect_address: 127.0.0.1:${rest_ports[$i]}

etcd3:
  hosts: 127.0.0.1:$HA_ETCD_PORT

bootstrap:
  # Written to etcd once, by the node that initialises the cluster; change them later with
  # \`ha.sh ctl edit-config\`.
  dcs:
    ttl: 10                     # the leader key's lifetime: a dead leader is replaced after at most this
    loop_wait: 2                # seconds between two runs of each Patroni's loop
    retry_timeout: 4            # etcd and PostgreSQL operations retried this long; loop_wait + 2 × retry_timeout ≤ ttl
    maximum_lag_on_failover: 1048576   # bytes: a standby further behind the last known leader position is not promoted automatically
    primary_start_timeout: 0    # a crashed primary fails over at once (in sync mode that loses nothing) instead of being restarted in place for up to 300 s
    synchronous_mode: $sync
    synchronous_mode_strict: $strict
    synchronous_node_count: 1
    check_timeline: true
    postgresql:
      use_pg_rewind: true       # a former primary rejoins by rewinding what it had that the new leader has not
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: 'on'
        wal_log_hints: 'on'     # pg_rewind needs it (the data checksums of initdb would do as well)
        max_connections: 200
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        shared_buffers: 64MB
        archive_mode: 'on'
        archive_command: '$HA_DIR/bin/archive-wal %p %f'
        archive_timeout: 60s
        synchronous_commit: 'on'
        wal_retrieve_retry_interval: 1s   # a standby retries streaming every second (5 s by default)
$restore
  initdb:
    - encoding: UTF8
    - locale: C.UTF-8
    - data-checksums
  post_bootstrap: $HA_DIR/bin/post-bootstrap

postgresql:
  listen: 127.0.0.1:${pg_ports[$i]}
  connect_address: 127.0.0.1:${pg_ports[$i]}
  data_dir: $dir/data
  bin_dir: $PG_BIN
  pgpass: $dir/pgpass
  # New standbys clone the leader at once, not after a spread checkpoint (up to minutes).
  basebackup:
    checkpoint: fast
  # Trust on loopback only: a local test cluster. Each node replicates as a role of its own, so
  # that \`ha.sh lag --pause NODE\` can cut one standby's stream.
  authentication:
    superuser:
      username: postgres
    replication:
      username: replicator_$node
    rewind:
      username: postgres
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
  parameters:
    unix_socket_directories: '$HA_DIR/run'
    log_line_prefix: '%m $node [%p] '

watchdog:
  mode: 'off'

tags:
  nofailover: false
  noloadbalance: false
  clonefrom: false
  nosync: false
EOF
}

write_files() {
    local i node
    mkdir -p "$HA_DIR"/{bin,logs,pids,run,archive,backups,etcd}
    : >"$HA_DIR/$marker"

    # WAL archiving, shared by every node (they are on one machine): a segment already archived
    # with the same content is success, a different one an error (PostgreSQL retries it).
    cat >"$HA_DIR/bin/archive-wal" <<EOF
#!/bin/sh
# archive_command: archive-wal %p %f
set -e
dest=$HA_DIR/archive/\$2
if [ -f "\$dest" ]; then cmp -s "\$1" "\$dest"; exit \$?; fi
cp "\$1" "\$dest.tmp.\$\$"
mv "\$dest.tmp.\$\$" "\$dest"
EOF
    # Run by Patroni once the cluster is initialised (connection string as \$1): one replication
    # role per node.
    {
        echo '#!/bin/sh'
        echo '# post_bootstrap: one replication role per node (ha.sh lag --pause cuts one of them)'
        echo 'set -e'
        printf 'psql "$1" -XAtq -v ON_ERROR_STOP=1 <<SQL\n'
        for node in "${nodes[@]}"; do
            printf "select 'create role replicator_%s with replication login' where not exists (select from pg_roles where rolname = 'replicator_%s')\\\\gexec\n" "$node" "$node"
        done
        echo 'SQL'
    } >"$HA_DIR/bin/post-bootstrap"
    # Patroni's custom bootstrap (ha.sh restore): the backup becomes node1's data folder.
    cat >"$HA_DIR/bin/restore-backup" <<'EOF'
#!/bin/sh
# restore-backup BACKUP-FOLDER --scope=S --datadir=D (Patroni's bootstrap.method command)
set -e
backup=$1
for arg; do case "$arg" in --datadir=*) data=${arg#--datadir=} ;; esac; done
[ -n "$data" ] && [ -f "$backup/PG_VERSION" ]
rm -rf "$data"
mkdir -m 0700 "$data"
cp -a "$backup/." "$data/"
rm -f "$data/patroni.dynamic.json" "$data/postmaster.pid"
EOF
    chmod 0755 "$HA_DIR"/bin/*

    for i in "${!nodes[@]}"; do
        node=${nodes[$i]}
        mkdir -p "$HA_DIR/$node"
        write_node_config "$node"
    done

    cat >"$HA_DIR/haproxy.cfg" <<EOF
# Written by loadtest/ha.sh (docker/haproxy-ha.cfg is the same for Compose). TCP proxying to the
# node Patroni's REST API calls the leader; docs/ha.md explains each setting. The checks ask
# Patroni's /primary and /replica with OPTIONS: the same answer as GET, status line only (a GET's
# JSON body, cut short by HAProxy once it has the status, makes Patroni log a traceback).
global
    maxconn 2000
    stats socket $HA_DIR/run/haproxy.sock mode 600 level admin

defaults
    mode tcp
    # A node that refuses the connection is not tried again (HAProxy waits 1 s before a retry):
    # the client sees a closed connection at once, and its pool tries again.
    retries 0
    timeout connect 2s
    timeout check 1s
    timeout client 30m
    timeout server 30m

# Writes: the leader only. A node is marked up after one good check, down after two failed
# ones (1 s apart); its connections are cut when it is marked down, so that clients of a
# demoted node reconnect to the new leader instead of writing into a read-only node.
listen primary
    bind 127.0.0.1:$HA_PRIMARY_PORT
    option httpchk
    http-check send meth OPTIONS uri /primary
    http-check expect status 200
    default-server inter 1s fastinter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
EOF
    for i in "${!nodes[@]}"; do
        echo "    server ${nodes[$i]} 127.0.0.1:${pg_ports[$i]} check port ${rest_ports[$i]}" >>"$HA_DIR/haproxy.cfg"
    done
    cat >>"$HA_DIR/haproxy.cfg" <<EOF

# Reads that may be stale: running standbys less than 16 MB of WAL behind the leader.
listen replicas
    bind 127.0.0.1:$HA_REPLICA_PORT
    balance roundrobin
    option httpchk
    http-check send meth OPTIONS uri /replica?lag=16MB
    http-check expect status 200
    default-server inter 1s fastinter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
EOF
    for i in "${!nodes[@]}"; do
        echo "    server ${nodes[$i]} 127.0.0.1:${pg_ports[$i]} check port ${rest_ports[$i]}" >>"$HA_DIR/haproxy.cfg"
    done
    cat >>"$HA_DIR/haproxy.cfg" <<EOF

listen stats
    mode http
    bind 127.0.0.1:$HA_STATS_PORT
    stats enable
    stats uri /
    stats refresh 2s
EOF
    if [ "$(id -u)" -eq 0 ]; then chown -R postgres:postgres "$HA_DIR"; fi
}

# ---------------------------------------------------------------------------------------------
# Starting

start_etcd() {
    step "starting etcd on 127.0.0.1:$HA_ETCD_PORT"
    spawn etcd etcd --name payonce-ha --data-dir "$HA_DIR/etcd/data" \
        --listen-client-urls "http://127.0.0.1:$HA_ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$HA_ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$HA_ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$HA_ETCD_PEER_PORT" \
        --initial-cluster "payonce-ha=http://127.0.0.1:$HA_ETCD_PEER_PORT" \
        --initial-cluster-state new --initial-cluster-token "payonce-ha-$HA_ETCD_PORT" --logger zap --log-level warn
    wait_until 30 etcd curl -fsS --max-time 1 "http://127.0.0.1:$HA_ETCD_PORT/health" ||
        fail_with_log etcd "etcd did not answer on 127.0.0.1:$HA_ETCD_PORT within 30 s"
}

start_node() {
    node_index "$1" >/dev/null
    spawn "$1" patroni "$HA_DIR/$1/patroni.yml"
}

start_haproxy() {
    step "starting HAProxy: writes on 127.0.0.1:$HA_PRIMARY_PORT, reads on 127.0.0.1:$HA_REPLICA_PORT"
    haproxy -c -q -f "$HA_DIR/haproxy.cfg" >&2 || die "HAProxy refuses $HA_DIR/haproxy.cfg"
    spawn haproxy haproxy -db -f "$HA_DIR/haproxy.cfg"
    wait_until 10 haproxy curl -fsS --max-time 1 -o /dev/null "http://127.0.0.1:$HA_STATS_PORT/" ||
        fail_with_log haproxy "HAProxy did not start"
}

fail_with_log() { # fail_with_log LOG MESSAGE
    if [ -f "$HA_DIR/logs/$1.log" ]; then
        printf 'ha: --- last lines of %s ---\n' "$HA_DIR/logs/$1.log" >&2
        tail -n 25 "$HA_DIR/logs/$1.log" >&2
    fi
    die "$2"
}

wait_leader_then_others() { # starts node1, waits for it to lead, then the others
    local node
    step "starting node1 (Patroni on 127.0.0.1:${rest_ports[0]}, PostgreSQL on 127.0.0.1:${pg_ports[0]})"
    start_node node1
    wait_until "$HA_TIMEOUT" leader node1_leads_or_died ||
        fail_with_log node1 "node1 did not become the leader within $HA_TIMEOUT s"
    # The whole tail, not only its error lines: a Patroni that stops before it logs anything
    # leaves a Python traceback, or a line of setpriv's, and nothing else to go on.
    if ! pid_of node1 >/dev/null; then
        local pid
        pid=$(cat "$HA_DIR/pids/node1.pid" 2>/dev/null)
        printf 'ha: node1 pid file: %s; that process: %s; patroni processes of this folder: %s\n' "${pid:-none}" \
            "$(ps -o stat=,args= -p "${pid:-0}" 2>/dev/null || echo gone)" \
            "$(pgrep -af "$HA_DIR/node1/patroni.yml" | tr '\n' ';' || true)" >&2
        fail_with_log node1 "node1's Patroni gave up bootstrapping (the lines above; the whole log: $HA_DIR/logs/node1.log)"
    fi
    step "node1 leads; starting the other nodes, which clone it (pg_basebackup)"
    for node in "${nodes[@]:1}"; do start_node "$node"; done
    wait_until "$HA_TIMEOUT" ready cluster_ready ||
        { ha_status >&2 || true; die "the cluster was not ready within $HA_TIMEOUT s (logs: $HA_DIR/logs)"; }
}

node1_leads_or_died() {
    pid_of node1 >/dev/null || return 0
    # Not a write: in strict mode none commits before a synchronous standby is there.
    [ "$(leader)" = node1 ] &&
        [ "$(PGCONNECT_TIMEOUT=2 psql "$(pg_url "${pg_ports[0]}")" -XAtqc "select not pg_is_in_recovery()" 2>/dev/null)" = t ]
}

print_env() { # print_env [export]
    local prefix=${1:+export } i urls=() rest=()
    for i in "${!nodes[@]}"; do
        urls+=("$(pg_url "${pg_ports[$i]}")")
        rest+=("http://127.0.0.1:${rest_ports[$i]}")
    done
    printf '%sHA_URL=%s\n' "$prefix" "$(pg_url "$HA_PRIMARY_PORT")"
    printf '%sHA_REPLICA_URL=%s\n' "$prefix" "$(pg_url "$HA_REPLICA_PORT")"
    printf '%sHA_MODE=%s\n' "$prefix" "$HA_MODE"
    printf '%sHA_NODES=%s\n' "$prefix" "$(IFS=,; echo "${nodes[*]}")"
    printf '%sHA_NODE_URLS=%s\n' "$prefix" "$(IFS=,; echo "${urls[*]}")"
    printf '%sHA_PATRONI_URLS=%s\n' "$prefix" "$(IFS=,; echo "${rest[*]}")"
    printf '%sHA_ETCD_URL=%s\n' "$prefix" "http://127.0.0.1:$HA_ETCD_PORT"
    printf '%sHA_HAPROXY_STATS_URL=%s\n' "$prefix" "http://127.0.0.1:$HA_STATS_PORT/"
    printf '%sHA_PATRONICTL_CONFIG=%s\n' "$prefix" "$HA_DIR/node1/patroni.yml"
    printf '%sHA_DIR=%s\n' "$prefix" "$HA_DIR"
}

# ---------------------------------------------------------------------------------------------
# Commands

cmd_up() {
    local count=3 mode=sync
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) count=${2:-}; shift 2 || die "--nodes needs a number" ;;
            --nodes=*) count=${1#--nodes=}; shift ;;
            --async) mode=async; shift ;;
            --strict) mode=strict; shift ;;
            -h | --help) usage; exit 0 ;;
            *) die "up: unknown argument '$1' (see --help)" ;;
        esac
    done
    [[ "$count" =~ ^[1-9]$ ]] || die "--nodes takes 1 to 9 (got '$count')"
    check_dir
    lock_dir
    ensure_tools

    if [ -f "$HA_DIR/ha.env" ]; then
        load_env
        if pid_of etcd >/dev/null && pid_of haproxy >/dev/null && cluster_ready 2>/dev/null &&
            probe "$(pg_url "$HA_PRIMARY_PORT")"; then
            if [ "$HA_MODE" = "$mode" ] && [ "$HA_NODE_COUNT" = "$count" ]; then
                step "a $mode cluster of $count nodes already runs in $HA_DIR: reusing it"
                print_env
                return
            fi
            step "replacing the $HA_MODE cluster of $HA_NODE_COUNT nodes in $HA_DIR by a $mode one of $count"
        else
            step "replacing what $HA_DIR holds (a $HA_MODE cluster of $HA_NODE_COUNT nodes, not all of it running)"
        fi
    elif [ -e "$HA_DIR/$marker" ]; then
        step "removing the leftovers of an earlier run in $HA_DIR"
    fi
    stop_everything
    rm -rf "$HA_DIR"

    HA_MODE=$mode
    HA_NODE_COUNT=$count
    nodes=()
    local i ports
    for i in $(seq "$count"); do nodes+=("node$i"); done
    read -r -a ports <<<"$(pick_ports $((2 * count + 5)))"
    HA_ETCD_PORT=${ports[0]} HA_ETCD_PEER_PORT=${ports[1]}
    HA_PRIMARY_PORT=${ports[2]} HA_REPLICA_PORT=${ports[3]} HA_STATS_PORT=${ports[4]}
    pg_ports=("${ports[@]:5:$count}")
    rest_ports=("${ports[@]:$((5 + count)):$count}")

    step "creating $HA_DIR: $count nodes, ${mode} replication, processes run as $run_user"
    mkdir -p "$HA_DIR"
    write_files
    write_env
    start_etcd
    start_haproxy
    wait_leader_then_others
    wait_until 30 write probe "$(pg_url "$HA_PRIMARY_PORT")" || die "no write went through HAProxy"
    step "ready: leader $(leader), synchronous standby: $(cluster_query 'sync or "none"'); writes through HAProxy on 127.0.0.1:$HA_PRIMARY_PORT"
    print_env
}

cmd_down() {
    check_dir
    lock_dir
    if [ ! -e "$HA_DIR" ]; then
        say "nothing to stop: $HA_DIR does not exist"
        return
    fi
    step "stopping the cluster in $HA_DIR"
    stop_everything
    rm -rf "$HA_DIR"
    step "stopped; $HA_DIR removed"
}

cmd_env() {
    local export=
    case "${1:-}" in --export) export=1 ;; "") ;; *) die "env: unknown argument '$1'" ;; esac
    load_env
    print_env $export
}

ha_status() {
    load_env
    echo "== patronictl list"
    patronictl -c "$HA_DIR/node1/patroni.yml" list 2>&1 || true
    echo
    echo "== replication (on each running standby)"
    lag_status || true
    echo
    echo "== HAProxy (127.0.0.1:$HA_PRIMARY_PORT writes, 127.0.0.1:$HA_REPLICA_PORT reads)"
    local proxy up
    for proxy in primary replicas; do
        up=$(haproxy_up "$proxy") || { echo "HAProxy does not answer"; break; }
        printf '%-8s -> %s\n' "$proxy" "${up:-no node (connections are closed at once)}"
    done
}

cmd_status() { ha_status; }

# After a failure or a planned change: a new write attempt through HAProxy every 100 ms (each on
# a new connection, none waiting for another), until one commits. Prints the time from START to
# that commit, and what the failed attempts saw (SQLSTATE or connection error), as a client pool
# would see it.
# report_recovery START OLD-LEADER [PORT [STOP-FILE]]: PORT's writes do not count (the old
# leader's); gives up (status 2) as soon as STOP-FILE exists.
report_recovery() {
    local start=$1 old=$2 out status=0
    # Debian's python3, which has psycopg2 (Patroni's dependency); PATH may name another one.
    out=$(/usr/bin/python3 - "$start" "$(pg_url "$HA_PRIMARY_PORT")" "$HA_TIMEOUT" "${3:-0}" "${4:-}" <<'PY'
import collections, os, sys, threading, time
import psycopg2
start, url, limit, old_port = float(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
stop_file = sys.argv[5]
done, seen, lock = threading.Event(), collections.Counter(), threading.Lock()
first = []
def attempt():
    try:
        conn = psycopg2.connect(url, connect_timeout=2, application_name="ha.sh probe")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("create table if not exists payonce_ha_probe (id int primary key, at timestamptz not null);"
                        "insert into payonce_ha_probe values (1, now()) on conflict (id) do update set at = excluded.at;"
                        "select inet_server_port()")
            port = cur.fetchone()[0]
        conn.close()
        with lock:
            if port == old_port:
                seen["committed on the old leader"] += 1
                return
            first.append(time.time())
        done.set()
    except psycopg2.Error as e:
        what = e.pgcode or (str(e).strip().splitlines() or ["?"])[0]
        for long, short in (("Connection refused", "connection refused"), ("closed the connection unexpectedly",
                            "connection closed by the server"), ("timeout expired", "connect timeout"),
                            ("is shutting down", "57P03 the database system is shutting down"),
                            ("is starting up", "57P03 the database system is starting up"),
                            ("not yet accepting connections", "57P03 not yet accepting connections")):
            if long in what:
                what = short
                break
        with lock:
            seen[what] += 1
while not done.is_set() and time.time() - start < limit:
    if stop_file and os.path.exists(stop_file):
        sys.exit(2)
    threading.Thread(target=attempt, daemon=True).start()
    done.wait(0.1)
if not first:
    sys.exit(1)
print("%.1f" % (min(first) - start))
print("; ".join("%s x %d" % kv for kv in sorted(seen.items(), key=lambda kv: -kv[1])) or "none")
PY
) || status=$?
    [ "$status" != 2 ] || return 2
    [ "$status" = 0 ] || { ha_status >&2 || true; die "no write went through HAProxy within $HA_TIMEOUT s"; }
    local secs errors new routed
    secs=$(sed -n 1p <<<"$out")
    errors=$(sed -n 2p <<<"$out")
    new=$(leader || true)
    step "a write through HAProxy commits again $secs s after; leader: ${new:-?} (was $old)"
    step "failed attempts meanwhile (one every 100 ms): $errors"
    # For a moment HAProxy may still count the old leader up (two failed checks take it out):
    # a new connection may land there until then.
    wait_until 30 routing only_routed_to "$new" || true
    routed=$(since "$start")
    step "HAProxy routes writes to $new only after $routed s"
    echo "HA_RECOVERY_SECS=$secs"
    echo "HA_ROUTED_SECS=$routed"
    echo "HA_LEADER=$new"
}

haproxy_up() { # haproxy_up PROXY: the servers HAProxy has up in PROXY (primary, replicas)
    curl -fsS --max-time 2 "http://127.0.0.1:$HA_STATS_PORT/;csv" 2>/dev/null | python3 -c '
import csv, sys
rows = csv.DictReader(l.lstrip("# ") for l in sys.stdin)
print(" ".join(r["svname"] for r in rows if r["pxname"] == sys.argv[1] and r["svname"] not in ("FRONTEND", "BACKEND")
               and r["status"].startswith("UP")))' "$1"
}

only_routed_to() { [ "$(haproxy_up primary)" = "$1" ]; }

parse_wait() { wait=1; [ "${1:-}" != --no-wait ] || wait=0; }

cmd_kill_primary() {
    local wait
    parse_wait "${1:-}"
    load_env
    local old pid start
    old=$(leader) && [ -n "$old" ] || die "the cluster has no leader now"
    pid=$(postmaster_of "$old") || die "$old's postmaster is not running"
    start=$(date +%s.%N)
    kill -KILL "$pid"
    step "killed -9 the postmaster of $old (pid $pid), the leader"
    [ "$wait" = 0 ] || report_recovery "$start" "$old"
}

cmd_kill_node() {
    local node='' wait=1
    while [ $# -gt 0 ]; do
        case "$1" in --no-wait) wait=0 ;; -*) die "kill-node: unknown argument '$1'" ;; *) node=$1 ;; esac
        shift
    done
    load_env
    local old pid start children
    old=$(leader || true)
    [ -n "$node" ] || node=$old
    [ -n "$node" ] || die "the cluster has no leader now: name the node to kill"
    node_index "$node" >/dev/null
    start=$(date +%s.%N)
    if pid=$(pid_of "$node"); then kill -KILL "$pid"; fi
    if pid=$(postmaster_of "$node"); then
        children=$(ps -o pid= --ppid "$pid" || true)
        kill -KILL "$pid" $children 2>/dev/null || true
    fi
    step "killed -9 $node's Patroni and PostgreSQL$([ "$node" = "$old" ] && echo ' (the leader)'); it stays down until: ha.sh restart-node $node"
    [ "$wait" = 0 ] || report_recovery "$start" "$old"
}

cmd_switchover() {
    local candidate=() wait=1
    while [ $# -gt 0 ]; do
        case "$1" in
            --candidate) candidate=(--candidate "${2:-}"); shift ;;
            --no-wait) wait=0 ;;
            *) die "switchover: unknown argument '$1'" ;;
        esac
        shift
    done
    load_env
    local old start
    old=$(leader) && [ -n "$old" ] || die "the cluster has no leader now"
    step "patronictl switchover --force ${candidate[*]} (leader: $old)"
    change_leader "$old" switchover --force "${candidate[@]}"
}

# change_leader OLD PATRONICTL-ARGS…: runs patronictl while writes are attempted through HAProxy,
# and reports when one commits on another node than OLD. patronictl exits 0 when Patroni refuses
# ("Switchover failed, details: 503, …"): its output tells.
change_leader() {
    local old=$1 port=0 start work status=0
    shift
    [ -z "$old" ] || port=${pg_ports[$(node_index "$old")]}
    work=$(mktemp -d)
    start=$(date +%s.%N)
    {
        if ! patronictl -c "$HA_DIR/node1/patroni.yml" "$@" >"$work/out" 2>&1 ||
            grep -q "failed, details" "$work/out"; then
            touch "$work/failed"
        fi
        touch "$work/done"
    } &
    if [ "$wait" = 1 ]; then report_recovery "$start" "${old:-none}" "$port" "$work/failed" || status=$?; fi
    wait
    grep -v '^[+|]' "$work/out" | grep -v '^Current cluster topology' >&2 || true
    if [ -e "$work/failed" ]; then
        rm -rf "$work"
        die "patronictl $* did not succeed (above)"
    fi
    rm -rf "$work"
    [ "$status" = 0 ] || die "no write went through HAProxy"
}

cmd_failover() {
    local node='' wait=1
    while [ $# -gt 0 ]; do
        case "$1" in --no-wait) wait=0 ;; -*) die "failover: unknown argument '$1'" ;; *) node=$1 ;; esac
        shift
    done
    load_env
    [ -n "$node" ] || die "failover: name the node to promote"
    node_index "$node" >/dev/null
    local old
    old=$(leader || true)
    [ "$node" != "$old" ] || die "$node is the leader already"
    # In the synchronous modes Patroni promotes only the synchronous standby. Asked for another
    # node, a live leader drops the request; with the leader dead, every node waits for the named
    # candidate, which may not take over, and the cluster stays leaderless until the request is
    # replaced (seen with Patroni 3.0.2). Neither is what the caller wants.
    local sync
    sync=$(cluster_query 'sync' || true)
    if [ "$HA_MODE" != async ] && [ -n "$sync" ] && ! grep -qw "$node" <<<"$sync"; then
        die "$node is not the synchronous standby ($sync): in $HA_MODE mode Patroni promotes only that one. Fail over to $sync"
    fi
    step "patronictl failover --candidate $node --force (leader: ${old:-none})"
    change_leader "$old" failover --candidate "$node" --force
}

# The node runs and, unless it leads, streams WAL from the leader.
member_rejoined() {
    [ "$(cluster_query "int('$1' in running)")" = 1 ] || return 1
    [ "$(leader)" = "$1" ] ||
        [ "$(psql_node "$1" -c "select count(*) from pg_stat_wal_receiver where status = 'streaming'" 2>/dev/null)" = 1 ]
}

cmd_restart_node() {
    local node=${1:-}
    [ -n "$node" ] || die "restart-node: name the node"
    load_env
    node_index "$node" >/dev/null
    local start pid lines
    start=$(date +%s.%N)
    if pid=$(pid_of "$node"); then
        step "stopping $node (Patroni stops its PostgreSQL)"
        stop_node "$node"
    elif pid=$(postmaster_of "$node"); then
        step "$node's PostgreSQL runs without its Patroni: stopping it first"
        stop_pid "$pid" QUIT 10
    fi
    lines=$(wc -l <"$HA_DIR/logs/$node.log" 2>/dev/null || echo 0)
    step "starting $node's Patroni"
    start_node "$node"
    wait_until "$HA_TIMEOUT" rejoin member_rejoined "$node" ||
        fail_with_log "$node" "$node did not rejoin within $HA_TIMEOUT s"
    step "$node has rejoined after $(since "$start") s, as $(cluster_query "[x['role'] for x in m if x['name'] == '$node'][0]")"
    tail -n +"$((lines + 1))" "$HA_DIR/logs/$node.log" | grep -E "pg_rewind: (servers diverged|Done)|reinitializ" |
        sed 's/^.*INFO: *//; s/^/ha:   /' >&2 || true
}

# psql_node NODE ARGS…
psql_node() {
    local i
    i=$(node_index "$1")
    shift
    PGCONNECT_TIMEOUT=2 psql "$(pg_url "${pg_ports[$i]}")" -XAtq -v ON_ERROR_STOP=1 "$@"
}

lag_status() {
    local i node
    for i in "${!nodes[@]}"; do
        node=${nodes[$i]}
        PGCONNECT_TIMEOUT=1 psql "$(pg_url "${pg_ports[$i]}")" -XAtq -F ' ' -c "
            select '$node', case when pg_is_in_recovery() then 'standby' else 'primary' end,
                   case when pg_is_in_recovery() then 'received ' || coalesce(pg_last_wal_receive_lsn()::text, 'nothing')
                        else 'current ' || pg_current_wal_lsn()::text end,
                   case when pg_is_in_recovery() then 'replayed ' || pg_last_wal_replay_lsn()::text else '' end,
                   case when pg_is_in_recovery() and pg_get_wal_replay_pause_state() <> 'not paused'
                        then 'replay ' || pg_get_wal_replay_pause_state() else '' end,
                   case when pg_is_in_recovery() then coalesce((select 'streaming from ' || sender_host || ':' || sender_port
                        from pg_stat_wal_receiver where status = 'streaming'), 'NOT streaming') else '' end,
                   ''" 2>/dev/null ||
            echo "$node down"
    done
}

cmd_lag() {
    local action='' node='' replay_only=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --pause | --resume | --status) action=${1#--} ;;
            --replay-only) replay_only=1 ;;
            -*) die "lag: unknown argument '$1'" ;;
            *) node=$1 ;;
        esac
        shift
    done
    [ -n "$action" ] || die "lag: say --pause, --resume or --status"
    load_env
    if [ "$action" = status ]; then lag_status; return; fi
    local lead
    lead=$(leader) && [ -n "$lead" ] || die "the cluster has no leader now"
    if [ -z "$node" ]; then
        node=$(cluster_query '(sorted(x for x in standbys if x not in sync) or sorted(standbys) or [""])[0]')
        [ -n "$node" ] || die "there is no standby"
    fi
    node_index "$node" >/dev/null
    case "$action" in
        pause)
            [ "$node" != "$lead" ] || die "$node is the leader: pause a standby"
            psql_node "$node" -c "select pg_wal_replay_pause()" >/dev/null
            if [ "$replay_only" = 1 ]; then
                step "$node: WAL replay paused; it still receives WAL (no commit is lost if it is promoted)"
            else
                cut_stream "$lead" "$node"
                step "$node: replay paused and its WAL stream cut ($lead's pg_hba.conf rejects replicator_$node): commits from now on are not on $node"
            fi
            ;;
        resume)
            local other
            for other in "${nodes[@]}"; do hba_reject "$other" "$node" remove; done
            if [ "$node" != "$lead" ]; then
                psql_node "$node" -c "select pg_wal_replay_resume() where pg_is_in_recovery()" >/dev/null 2>&1 || true
            fi
            step "$node: stream and replay resumed"
            ;;
    esac
}

# cut_stream LEADER NODE: the leader refuses NODE's replication connection (a pg_hba.conf line of
# its own, first), and NODE's walsender is terminated. Not a NOLOGIN role: that would replicate to
# NODE itself, whose Patroni then cannot open the replication connection to its own PostgreSQL it
# reads its timeline with, and never takes part in a failover. Patroni writes pg_hba.conf anew when
# it starts PostgreSQL, so the line goes with the next restart of that node (its demotion).
cut_stream() {
    local lead=$1 node=$2 _
    hba_reject "$lead" "$node" add
    for _ in 1 2 3 4 5; do
        psql_node "$lead" -c "select pg_terminate_backend(pid) from pg_stat_replication where application_name = '$node'" >/dev/null
        sleep 1.5 # the standby retries every wal_retrieve_retry_interval (1 s)
        [ "$(psql_node "$lead" -c "select count(*) from pg_stat_replication where application_name = '$node'")" = 0 ] && return
    done
    die "$node still streams from $lead"
}

# hba_reject NODE STANDBY add|remove: the line in NODE's pg_hba.conf that refuses STANDBY's
# replication role, then a reload. Nothing when NODE does not run.
hba_reject() {
    local node=$1 standby=$2 action=$3 file
    file=$(psql_node "$node" -c "show hba_file" 2>/dev/null) || return 0
    as_run_user python3 - "$file" "$standby" "$action" <<'PY'
import sys
path, standby, action = sys.argv[1:]
line = "host replication replicator_%s all reject  # ha.sh lag --pause %s\n" % (standby, standby)
with open(path) as f:
    lines = [l for l in f if l != line]
if action == "add":
    lines.insert(0, line)
with open(path, "w") as f:
    f.writelines(lines)
PY
    # A node on its way down (a demoted leader restarting to follow, pg_rewind) may refuse the
    # reload: nothing is lost, since Patroni writes pg_hba.conf anew when it starts PostgreSQL.
    psql_node "$node" -c "select pg_reload_conf()" >/dev/null 2>&1 ||
        step "$node: not reloaded (it is restarting; Patroni rewrites its pg_hba.conf as it starts)"
}

cmd_backup() {
    local name=${1:-backup-$(date -u +%Y%m%dT%H%M%SZ)}
    [[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]] || die "backup: a name of letters, digits, '.', '_' and '-' only"
    load_env
    local lead i dir=$HA_DIR/backups/$name start
    [ ! -e "$dir" ] || die "backup $name exists already ($dir)"
    lead=$(leader) && [ -n "$lead" ] || die "the cluster has no leader now"
    i=$(node_index "$lead")
    start=$(date +%s.%N)
    step "pg_basebackup from $lead (127.0.0.1:${pg_ports[$i]}), WAL streamed alongside"
    as_run_user mkdir -p "$dir"
    as_run_user pg_basebackup -h 127.0.0.1 -p "${pg_ports[$i]}" -U postgres -D "$dir/data" -X stream \
        -c fast -l "payonce-ha $name" --no-password >&2 || die "pg_basebackup failed"
    as_run_user "$PG_BIN/pg_verifybackup" -q "$dir/data" >&2 || die "pg_verifybackup refuses $dir/data"
    local info
    # A restore point named after the backup, just after it, and its WAL segment closed so that it
    # is archived at once.
    info=$(psql_node "$lead" -F ' ' -c "select now(), pg_create_restore_point('$name'), timeline_id
                                          from pg_control_checkpoint()" -c "select pg_switch_wal()")
    read -r d t lsn tli _ <<<"$(sed -n 1p <<<"$info")"
    as_run_user tee "$dir/backup.env" >/dev/null <<EOF
HA_BACKUP=$name
HA_BACKUP_TIME='$d $t'
HA_BACKUP_RESTORE_POINT_LSN=$lsn
HA_BACKUP_TIMELINE=$tli
HA_BACKUP_FROM=$lead
EOF
    step "backup $name: $(du -sh "$dir/data" | cut -f1) in $(since "$start") s, restore point '$name' at $lsn"
    cat "$dir/backup.env"
    echo "HA_BACKUP_DIR=$dir"
}

# WAL up to now into the archive, so that a target after the backup can be reached.
flush_archive() {
    local lead seg
    lead=$(leader 2>/dev/null) && [ -n "$lead" ] || return 0
    seg=$(psql_node "$lead" -c "select pg_walfile_name(pg_switch_wal())" 2>/dev/null) || return 0
    wait_until 30 archive test -f "$HA_DIR/archive/$seg" ||
        say "warning: $seg was not archived within 30 s; a target after it cannot be reached"
}

cmd_restore() {
    local name=${1:-}
    [ -n "$name" ] && [ "${name#-}" = "$name" ] || die "restore: name the backup (ls $HA_DIR/backups)"
    shift
    local target="recovery_target: immediate" what="the end of the backup" timeline=latest
    while [ $# -gt 0 ]; do
        case "$1" in
            --timeline) timeline=${2:?--timeline needs latest, current or a number}; shift ;;
            --target-time) target="recovery_target_time: '${2:?--target-time needs a time}'"; what="time ${2}"; shift ;;
            --target-name) target="recovery_target_name: '${2:?--target-name needs a name}'"; what="restore point ${2}"; shift ;;
            --target-lsn) target="recovery_target_lsn: '${2:?--target-lsn needs an LSN}'"; what="LSN ${2}"; shift ;;
            --latest) target=""; what="the end of the archived WAL" ;;
            *) die "restore: unknown argument '$1'" ;;
        esac
        shift
    done
    check_dir
    lock_dir
    load_env
    local dir=$HA_DIR/backups/$name start node
    [ -f "$dir/data/PG_VERSION" ] || die "no backup named $name in $HA_DIR/backups"
    start=$(date +%s.%N)
    step "restoring backup $name to $target"
    flush_archive
    step "stopping every node; etcd and HAProxy stay (clients see refused connections until node1 leads)"
    stop_nodes "${nodes[@]}"
    ETCDCTL_API=3 etcdctl --endpoints="http://127.0.0.1:$HA_ETCD_PORT" del --prefix "$namespace$scope/" >/dev/null ||
        die "cannot clear the cluster's keys in etcd"
    for node in "${nodes[@]}"; do rm -rf "$HA_DIR/$node/data" "$HA_DIR/$node/data".*; done

    # node1 is bootstrapped by Patroni from the backup (bootstrap.method: restore), recovers to
    # the target with the archived WAL, promotes, and runs post_bootstrap.
    write_node_config node1 "$(cat <<EOF
  method: restore
  restore:
    command: $HA_DIR/bin/restore-backup $dir/data
    keep_existing_recovery_conf: false
    recovery_conf:
      restore_command: cp $HA_DIR/archive/%f %p
      recovery_target_action: promote
      recovery_target_timeline: '$timeline'
      ${target}
EOF
)"
    [ "$(id -u)" -ne 0 ] || chown postgres:postgres "$HA_DIR/node1/patroni.yml"
    step "node1: Patroni's custom bootstrap from $dir/data, recovering to $what"
    wait_leader_then_others
    write_node_config node1
    [ "$(id -u)" -ne 0 ] || chown postgres:postgres "$HA_DIR/node1/patroni.yml"
    wait_until 30 write probe "$(pg_url "$HA_PRIMARY_PORT")" || die "no write went through HAProxy"
    step "restored $name ($what) in $(since "$start") s; the same URLs"
    echo "HA_RESTORED_FROM=$name"
    print_env
}

cmd_wait() {
    load_env
    local start
    start=$(date +%s.%N)
    wait_until "$HA_TIMEOUT" ready cluster_ready || { ha_status >&2 || true; die "not ready within $HA_TIMEOUT s"; }
    wait_until 30 write probe "$(pg_url "$HA_PRIMARY_PORT")" || die "no write went through HAProxy"
    step "ready after $(since "$start") s: leader $(leader), synchronous standby: $(cluster_query 'sync or "none"')"
}

cmd_ctl() {
    load_env
    exec patronictl -c "$HA_DIR/node1/patroni.yml" "$@"
}

cmd_psql() {
    load_env
    local where=${1:-primary} port i
    [ $# -eq 0 ] || shift
    case "$where" in
        primary) port=$HA_PRIMARY_PORT ;;
        replica) port=$HA_REPLICA_PORT ;;
        *) i=$(node_index "$where"); port=${pg_ports[$i]} ;;
    esac
    exec psql "$(pg_url "$port")" "$@"
}

command=${1:-}
[ $# -eq 0 ] || shift
case "$command" in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    env) cmd_env "$@" ;;
    wait) cmd_wait "$@" ;;
    kill-primary) cmd_kill_primary "$@" ;;
    kill-node) cmd_kill_node "$@" ;;
    switchover) cmd_switchover "$@" ;;
    failover) cmd_failover "$@" ;;
    restart-node) cmd_restart_node "$@" ;;
    lag) cmd_lag "$@" ;;
    backup) cmd_backup "$@" ;;
    restore) cmd_restore "$@" ;;
    ctl) cmd_ctl "$@" ;;
    psql) cmd_psql "$@" ;;
    -h | --help | help) usage ;;
    "") usage >&2; exit 2 ;;
    *) printf 'ha: unknown command %s\n\n' "$command" >&2; usage >&2; exit 2 ;;
esac
