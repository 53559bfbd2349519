#!/bin/bash
# stop.sh - stop the cluster that start.sh started (same VITDEPTH_SLURM_DIR, default /tmp/vitdepth-slurm).
# Cancels all jobs first and waits for them to leave the nodes (job processes and slurmstepd outlive
# slurmd otherwise), then sends SIGTERM to exactly the pids recorded in $DIR/run/*.pid (SIGKILL after
# 10 s). Never kills by name. Leaves $DIR/log in place.
set -uo pipefail
DIR=${VITDEPTH_SLURM_DIR:-/tmp/vitdepth-slurm}
CONF=$DIR/etc/slurm.conf
export SLURM_CONF=$CONF
log() { echo "stop.sh: $*" >&2; }
running() { local st; st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ -n "$st" ] && [ "$st" != Z ]; }
alive() { [ -f "$1" ] && running "$(cat "$1")"; }

# 1. cancel jobs while slurmctld and slurmd are still up; wait (max 15 s) until none is running
if alive "$DIR/run/slurmctld.pid" && [ -f "$CONF" ]; then
  JOBS=$(timeout 10 squeue -h -o '%A' 2>/dev/null | sort -u | tr '\n' ' ')
  if [ -n "${JOBS// /}" ]; then
    log "cancelling jobs: $JOBS"
    # shellcheck disable=SC2086
    timeout 10 scancel $JOBS 2>/dev/null
    for _ in $(seq 150); do
      [ -z "$(timeout 5 squeue -h -t R,CG,S 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
fi

# 2. stop the daemons by recorded pid: slurmd, then slurmctld, then munged
stop_pid() {  # NAME PIDFILE: the pid's /proc/PID/comm must still be NAME
  local name=$1 pf=$2 pid
  [ -f "$pf" ] || return 0
  pid=$(cat "$pf")
  if ! running "$pid"; then rm -f "$pf"; return 0; fi
  if [ "$(cat /proc/"$pid"/comm 2>/dev/null)" != "$name" ]; then
    log "pid $pid is not $name any more; not touching it"; rm -f "$pf"; return 0
  fi
  kill "$pid"
  for _ in $(seq 100); do running "$pid" || break; sleep 0.1; done
  if running "$pid"; then log "$name ($pid) ignored SIGTERM; SIGKILL"; kill -9 "$pid"; fi
  log "stopped $name ($pid)"; rm -f "$pf"
}
stop_pid slurmd "$DIR/run/slurmd.pid"
stop_pid slurmctld "$DIR/run/slurmctld.pid"
stop_pid munged "$DIR/run/munged.pid"

# 3. undo the /etc/slurm/slurm.conf symlink if start.sh made it
if [ -f "$DIR/run/etc_link" ] && [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$CONF" ]; then
  rm -f /etc/slurm/slurm.conf "$DIR/run/etc_link"; log "removed /etc/slurm/slurm.conf symlink"
fi
exit 0
