#!/usr/bin/env bash
# Start a private Slurm cluster WITH accounting (so sacct works) from Debian's packages:
# munged (reused when one already answers), MariaDB (own datadir, loopback, no grants), slurmdbd, slurmctld, slurmd.
# Everything lives in DIR (keep it short: Slurm and MariaDB put sockets there); ports are picked free.
# Prints the line to eval: `export SLURM_CONF=DIR/slurm.conf`. Stop with .ci/slurm_down.sh DIR (by pid files).
#   usage: .ci/slurm_up.sh DIR [NODES]   needs root and: slurm-wlm munge slurmdbd mariadb-server (.ci/services)
# NODES=1 (default): one node `localhost` (slurmd.pid, slurmd.log, spool/). NODES=N>1: nodes n1..nN on this one
# host under one slurmctld, in one partition, each its own slurmd (`slurmd -N nI`) on its own port, with its own
# spool/nI, slurmd-nI.pid and slurmd-nI.log; each node has all the CPUs (slurmd drains a node configured with more
# than the machine has, not fewer: the nodes share the cores, which sleeping test trials do not use) and 1/N of the
# memory; the script returns once every node is idle.
set -euo pipefail
D=$(mkdir -p "${1:?usage: slurm_up.sh DIR [NODES]}" && cd "$1" && pwd)
N=${2:-1}
[[ "$N" =~ ^[1-9][0-9]?$ ]] || { echo "slurm_up: NODES must be 1..99, not $N" >&2; exit 2; }
for b in slurmctld slurmd slurmdbd munged mariadbd sinfo sacctmgr; do
  command -v $b >/dev/null || [ -x /usr/sbin/$b ] || { echo "slurm_up: $b not installed (run .ci/services)" >&2; exit 3; }
done
[ "$(id -u)" = 0 ] || { echo "slurm_up: must run as root (daemons run as root on this toy cluster)" >&2; exit 3; }
mkdir -p "$D/state" "$D/spool" "$D/mysql"
read -r P_CTLD P_SLURMD P_DBD P_SQL P_NODES < <(python3 -c '
import socket, sys; ss=[socket.socket() for _ in range(4 + int(sys.argv[1]))]
[s.bind(("127.0.0.1", 0)) for s in ss]; print(*[s.getsockname()[1] for s in ss]); [s.close() for s in ss]' "$N")
read -r -a P_NODES <<< "$P_NODES"
CPUS=$(nproc)
MEM=$(awk -v n="$N" '/MemTotal/ {print int($2 / 1024 * 0.8 / n)}' /proc/meminfo)
if [ "$N" = 1 ]; then
  NODES=(localhost)
  SPOOL=$D/spool PIDF=$D/slurmd.pid LOGF=$D/slurmd.log
  NODELINES="NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"
else
  NODES=() NODELINES=""
  for i in $(seq "$N"); do
    NODES+=("n$i")
    NODELINES+="NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=${P_NODES[$((i - 1))]} CPUs=$CPUS"
    NODELINES+=" RealMemory=$MEM State=UNKNOWN"$'\n'
    mkdir -p "$D/spool/n$i"
  done
  NODELINES=${NODELINES%$'\n'}
  SPOOL=$D/spool/%n PIDF=$D/slurmd-%n.pid LOGF=$D/slurmd-%n.log  # %n: the node name
fi
NODELIST=$(IFS=,; echo "${NODES[*]}")
export SLURM_CONF=$D/slurm.conf

# munge: one daemon per machine (its socket path is fixed); reuse a live one, else start ours and remember it
mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged --force
  for i in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  cp /run/munge/munged.pid "$D/munged.pid"
fi

# MariaDB for slurmdbd: private datadir, loopback only, no grant tables (a throwaway CI database)
/usr/sbin/mariadbd --no-defaults --user=root --datadir="$D/mysql" --socket="$D/mysql.sock" --port=$P_SQL \
  --bind-address=127.0.0.1 --skip-grant-tables --innodb-buffer-pool-size=32M --pid-file="$D/mariadbd.pid" \
  --log-error="$D/mariadbd.log" >/dev/null 2>&1 &
for i in $(seq 200); do mariadb --no-defaults -S "$D/mysql.sock" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
mariadb --no-defaults -S "$D/mysql.sock" -e 'CREATE DATABASE IF NOT EXISTS slurm_acct_db'

cat > "$D/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=$P_DBD
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$P_SQL
StorageUser=root
StorageLoc=slurm_acct_db
PidFile=$D/slurmdbd.pid
LogFile=$D/slurmdbd.log
EOF
chmod 600 "$D/slurmdbd.conf"

cat > "$D/slurm.conf" <<EOF
# $N-node toy cluster on one host: root daemons, no cgroups (proctrack/linuxproc), accounting through slurmdbd
ClusterName=dpxci
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits this long before it may start again (default 120 s: too slow for the requeue tests)
AuthInfo=cred_expire=30
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$P_DBD
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
ReturnToService=2
SlurmctldPort=$P_CTLD
SlurmdPort=$P_SLURMD
StateSaveLocation=$D/state
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$PIDF
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$LOGF
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=600
KillWait=10
Waittime=0
MaxArraySize=10001
$NODELINES
PartitionName=debug Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP
EOF

/usr/sbin/slurmdbd
for i in $(seq 100); do sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 0.2; done
sacctmgr -i add cluster dpxci >/dev/null 2>&1 || true
/usr/sbin/slurmctld -i
for i in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
for n in "${NODES[@]}"; do /usr/sbin/slurmd -N "$n"; done
idle() { [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" = "$N" ]; }  # every node idle
for i in $(seq 300); do idle && break; sleep 0.1; done
idle || { echo "slurm_up: not every node became idle ($(sinfo -h -N -o '%N %T' | tr '\n' ' ')); see $D/*.log" >&2
          exit 1; }
echo "export SLURM_CONF=$SLURM_CONF"
