#!/usr/bin/env bash
# Stop the cluster .ci/slurm_up.sh started in DIR: cancel its jobs, then TERM each daemon by its pid file (never by
# name), waiting for each: every node's slurmd (slurmd.pid, or slurmd-nI.pid of a cluster of several nodes) first;
# munged only when slurm_up started it. A pid file whose process is gone, or is no longer that daemon (a node a test
# killed, its pid reused), is skipped.   usage: .ci/slurm_down.sh DIR
set -uo pipefail
D=${1:?usage: slurm_down.sh DIR}
export SLURM_CONF=$D/slurm.conf
if [ -f "$D/slurmctld.pid" ] && kill -0 "$(cat "$D/slurmctld.pid")" 2>/dev/null; then
  scancel --quiet --full -u "$(id -un)" 2>/dev/null || true
  for i in $(seq 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
fi
for pf in "$D"/slurmd.pid "$D"/slurmd-*.pid "$D"/{slurmctld,slurmdbd,mariadbd,munged}.pid; do
  [ -f "$pf" ] || continue
  f=$(basename "$pf" .pid) && f=${f%%-*}
  p=$(cat "$pf")
  kill -0 "$p" 2>/dev/null || continue
  tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "$f" || continue
  kill -TERM "$p"
  for i in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && { echo "slurm_down: $f ($p) ignored TERM, killing"; kill -KILL "$p"; }
done
# job processes the daemons left behind (a node killed mid-job: its job steps, reparented to init, wait forever for
# a controller that is gone): every process that carries this cluster's SLURM_CONF
# (never this script or the shells above it, which may have been started with that SLURM_CONF exported)
keep=" $$ " && a=$$
while [ "$a" -gt 1 ] 2>/dev/null; do a=$(awk '{print $4}' "/proc/$a/stat" 2>/dev/null || echo 1); keep+="$a "; done
for e in /proc/[0-9]*/environ; do
  p=${e#/proc/} && p=${p%/environ}
  case "$keep" in *" $p "*) continue ;; esac
  { tr '\0' '\n' < "$e"; } 2>/dev/null | grep -qxF "SLURM_CONF=$D/slurm.conf" || continue  # gone: skipped
  kill -KILL "$p" 2>/dev/null
done
exit 0
