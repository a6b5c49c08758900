#!/usr/bin/env bash
# Stop the cluster .ci/slurm_up.sh started in DIR: cancel its jobs, then TERM each daemon by its pid file (never by
# name), waiting for each; munged only when slurm_up started it.   usage: .ci/slurm_down.sh DIR
set -uo pipefail
D=${1:?usage: slurm_down.sh DIR}
export SLURM_CONF=$D/slurm.conf
if [ -f "$D/slurmctld.pid" ] && kill -0 "$(cat "$D/slurmctld.pid")" 2>/dev/null; then
  scancel --quiet --full -u "$(id -un)" 2>/dev/null || true
  for i in $(seq 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
fi
for f in slurmd slurmctld slurmdbd mariadbd munged; do
  [ -f "$D/$f.pid" ] || continue
  p=$(cat "$D/$f.pid")
  kill -0 "$p" 2>/dev/null || continue
  kill -TERM "$p"
  for i in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && { echo "slurm_down: $f ($p) ignored TERM, killing"; kill -KILL "$p"; }
done
exit 0
