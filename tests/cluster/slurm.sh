#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for CI and for tests/cluster/test_slurm.py.
#
#   bash tests/cluster/slurm.sh up       # install (if missing), configure, start, wait until idle
#   bash tests/cluster/slurm.sh status   # which daemons run, sinfo, accounting
#   bash tests/cluster/slurm.sh down     # stop the daemons `up` started (packages stay installed)
#
# Needs root (apt-get, /etc/slurm). Debian 12 packages (SLURM 22.05, munge, slurmdbd, MariaDB),
# no systemd, no cgroups: see docs in /work/shared/design/snakemake-practice.md section 3.
# - The config sits at /etc/slurm/slurm.conf (the plugin's jobstep drops SLURM_CONF inside jobs).
# - One node, partitions `cpu` (default) and `gpu`; the node has one fake GPU (gres File=/dev/null),
#   so jobs asking for a GPU get CUDA_VISIBLE_DEVICES=0.
# - Accounting through slurmdbd + MariaDB (bound to 127.0.0.1), so `sacct` works and shows gres/gpu.
#   PAPERFLOW_SLURM_ACCOUNTING=0 skips it (then use `slurm-status-command: squeue`; MinJobAge=300).
# Everything the daemons write (state, logs, pid files) is under $PAPERFLOW_SLURM_STATE.
# Idempotent: `up` on a running cluster only checks it; `down` stops only what has a pid file here.
set -euo pipefail

STATE=${PAPERFLOW_SLURM_STATE:-/var/lib/paperflow-slurm}
ACCOUNTING=${PAPERFLOW_SLURM_ACCOUNTING:-1}
WAIT_S=${PAPERFLOW_SLURM_WAIT_S:-90}
CLUSTER=paperflow
CONF_DIR=/etc/slurm
DB_PASS=paperflow-ci          # local MariaDB bound to 127.0.0.1, test data only
MYSQL_SOCK=/run/mysqld/mysqld.sock

log() { echo "slurm.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

pid_file() { [[ $1 == mariadb ]] && echo "$STATE/mysql/mariadb.pid" || echo "$STATE/$1.pid"; }

pid_alive() {  # pid_alive NAME: the daemon with pid file $STATE/NAME.pid runs
    local f; f=$(pid_file "$1")
    [[ -s $f ]] && kill -0 "$(cat "$f")" 2>/dev/null
}

tails() {  # the last lines of every daemon log, for error messages
    local f
    for f in "$STATE"/log/*.log "$STATE"/mysql/*.log; do
        [[ -f $f ]] || continue
        echo "----- $f (last 25 lines)" >&2
        tail -n 25 "$f" >&2 || true
    done
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND once a second
    local limit=$1 what=$2; shift 2
    local t0=$SECONDS
    until "$@" >/dev/null 2>&1; do
        if (( SECONDS - t0 >= limit )); then
            log "timed out after ${limit}s waiting for: $what"
            tails
            return 1
        fi
        sleep 1
    done
}

install_packages() {
    local pkgs=(munge slurmctld slurmd slurm-client)
    [[ $ACCOUNTING == 1 ]] && pkgs+=(slurmdbd mariadb-server mariadb-client)
    local missing=() p
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if (( ${#missing[@]} )); then
        log "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # policy-rc.d in containers stops the packages' own service starts; that is what we want
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

write_if_changed() {  # write_if_changed PATH MODE < content
    local path=$1 mode=$2 tmp
    tmp=$(mktemp)
    cat >"$tmp"
    if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
        return 0
    fi
    install -m "$mode" "$tmp" "$path"
    rm -f "$tmp"
    CONF_CHANGED=1
    log "wrote $path"
}

write_config() {
    local host cpus mem
    host=$(hostname -s)
    cpus=$(nproc)
    # The rules' resource classes ask for up to 16 GB (rules/common.smk). Memory here is neither
    # consumed (CR_Core) nor enforced (no cgroups), so the node advertises at least 16 GB
    # (config_overrides lets slurmd accept more than it sees) and jobs never queue on memory.
    mem=$(awk '/MemTotal/ {m=int($2/1024); r=int(m/10); if (r>2048) r=2048; m=m-r; if (m<16384) m=16384; print m}' /proc/meminfo)
    mkdir -p "$CONF_DIR" "$STATE"/{log,ctld,d}
    local acct
    if [[ $ACCOUNTING == 1 ]]; then
        acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/none"
    else
        acct="AccountingStorageType=accounting_storage/none
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/none"
    fi
    write_if_changed "$CONF_DIR/slurm.conf" 644 <<EOF
# Written by tests/cluster/slurm.sh: a single-node test cluster (host $host, $cpus CPUs).
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
ReturnToService=2
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SchedulerType=sched/backfill
DefMemPerCPU=500
$acct
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:fake:1 State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$host Default=NO MaxTime=INFINITE State=UP
EOF
    write_if_changed "$CONF_DIR/gres.conf" 644 <<EOF
# Written by tests/cluster/slurm.sh: one fake GPU; File= must be a character device.
AutoDetect=off
NodeName=$host Name=gpu Type=fake File=/dev/null
EOF
    # Debian's slurm-wlm ships a cgroup.conf pointing at cgroups; with task/none and
    # proctrack/linuxproc nothing reads it.
    if [[ $ACCOUNTING == 1 ]]; then
        write_if_changed "$CONF_DIR/slurmdbd.conf" 600 <<EOF
# Written by tests/cluster/slurm.sh (mode 600: slurmdbd refuses a readable file).
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StoragePort=3306
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
        chmod 600 "$CONF_DIR/slurmdbd.conf"
    fi
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0  # a munged runs already (ours or the machine's)
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    [[ -s /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
    log "starting munged"
    munged --force --pid-file="$STATE/munged.pid" --log-file="$STATE/log/munged.log"
    wait_for 20 "munge" sh -c 'munge -n | unmunge'
}

start_mariadb() {
    if mariadb-admin --socket="$MYSQL_SOCK" ping >/dev/null 2>&1; then
        :  # runs already
    else
        # mariadbd drops to the mysql user before it writes its pid and log files
        mkdir -p /run/mysqld "$STATE/mysql"
        chown mysql:mysql /run/mysqld "$STATE/mysql"
        if [[ ! -d /var/lib/mysql/mysql ]]; then
            log "initialising MariaDB data directory"
            mariadb-install-db --user=mysql --datadir=/var/lib/mysql >"$STATE/log/mariadb-install.log" 2>&1
        fi
        log "starting mariadbd"
        nohup mariadbd --user=mysql --datadir=/var/lib/mysql --bind-address=127.0.0.1 --port=3306 \
            --socket="$MYSQL_SOCK" --pid-file="$STATE/mysql/mariadb.pid" --skip-name-resolve \
            --log-error="$STATE/mysql/mariadb.log" \
            </dev/null >/dev/null 2>&1 &
        wait_for 60 "mariadbd" mariadb-admin --socket="$MYSQL_SOCK" ping
    fi
    mariadb --socket="$MYSQL_SOCK" -u root <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
EOF
}

start_slurmdbd() {
    if ! pid_alive slurmdbd; then
        log "starting slurmdbd"
        slurmdbd
    fi
    wait_for 60 "slurmdbd (sacctmgr list cluster)" sacctmgr -n list cluster
    sacctmgr -n list cluster format=cluster | grep -qw "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
    sacctmgr -n list account format=account | grep -qw ci || sacctmgr -i add account ci Cluster="$CLUSTER" Description=ci Organization=ci >/dev/null
    sacctmgr -n list user format=user | grep -qw root || sacctmgr -i add user root Account=ci Cluster="$CLUSTER" >/dev/null
    return 0
}

node_idle() {  # the node answers and is idle (or already running jobs: mixed/allocated)
    local s
    s=$(sinfo -h -N -o '%T' 2>/dev/null | sort -u | tr '\n' ' ')
    [[ -n $s ]] && [[ ! $s =~ (down|drain|unknown|fail|not_responding|\*) ]] && [[ $s =~ (idle|mixed|allocated) ]]
}

cmd_up() {
    [[ $(id -u) == 0 ]] || die "run as root (it installs packages and writes /etc/slurm)"
    local t0=$SECONDS
    install_packages
    CONF_CHANGED=0
    write_config
    if (( CONF_CHANGED )) && { pid_alive slurmctld || pid_alive slurmd || pid_alive slurmdbd; }; then
        log "config changed: restarting the SLURM daemons started here"
        stop_one slurmd
        stop_one slurmctld
        stop_one slurmdbd
    fi
    start_munge
    if [[ $ACCOUNTING == 1 ]]; then
        start_mariadb
        start_slurmdbd
    fi
    if ! pid_alive slurmctld; then
        log "starting slurmctld"
        slurmctld -i  # -i: ignore state files that no longer fit the config
    fi
    wait_for 30 "slurmctld (scontrol ping)" sh -c 'scontrol ping | grep -q UP'
    if ! pid_alive slurmd; then
        log "starting slurmd"
        slurmd
    fi
    if ! wait_for "$WAIT_S" "the node to be idle (sinfo)" node_idle; then
        sinfo -N -l >&2 || true
        die "the cluster did not come up"
    fi
    # a node left down/drained by an earlier run comes back
    scontrol update NodeName="$(hostname -s)" State=RESUME >/dev/null 2>&1 || true
    log "up in $((SECONDS - t0))s (accounting: $([[ $ACCOUNTING == 1 ]] && echo sacct || echo none))"
    sinfo
}

stop_one() {  # stop_one NAME: SIGTERM the pid in $STATE/NAME.pid, wait, then SIGKILL
    local name=$1 f pid i
    f=$(pid_file "$1")
    [[ -s $f ]] || return 0
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
        log "stopping $name ($pid)"
        kill "$pid" 2>/dev/null || true
        for i in $(seq 1 30); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.5
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "$name ($pid) did not stop; SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$f"
}

cmd_down() {
    stop_one slurmd
    stop_one slurmctld
    stop_one slurmdbd
    stop_one mariadb
    stop_one munged
    return 0
}

cmd_status() {
    local n
    for n in munged mariadb slurmdbd slurmctld slurmd; do
        if pid_alive "$n"; then echo "$n: running ($(cat "$(pid_file "$n")"))"; else echo "$n: not running (from $STATE)"; fi
    done
    if command -v sinfo >/dev/null; then
        sinfo -N -l 2>&1 || true
        sacct -n -X -S now-1hours --format=JobIdRaw,JobName%30,State,Partition 2>&1 | tail -n 5 || true
    else
        echo "sinfo: not installed"
    fi
    node_idle
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
