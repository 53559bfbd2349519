#!/bin/bash
# start.sh - start a private single-node SLURM (munged + slurmctld + slurmd) on loopback, from the
# Debian 12 packages (slurm 22.05, munge 0.5). Run as root. Stop it with stop.sh.
#
#   bash slurm/local/start.sh          # last line on stdout: export SLURM_CONF=...
#   export SLURM_CONF=/tmp/vitdepth-slurm/etc/slurm.conf     # or: source /tmp/vitdepth-slurm/env.sh
#   sinfo; squeue
#   bash slurm/local/stop.sh
#
# Everything (config, state, spool, logs, pids, munge socket and key copy) lives under
# $VITDEPTH_SLURM_DIR; a system munged or slurm.conf is left alone. Daemon output: $DIR/log/.
#
# Settings (environment):
#   VITDEPTH_SLURM_DIR=/tmp/vitdepth-slurm  VITDEPTH_SLURM_NODE=$(hostname -s)
#   VITDEPTH_SLURM_CPUS=4            CPUs the node advertises (may exceed the real cores)
#   VITDEPTH_SLURM_MEM=<MB>          default min(20000, MemTotal-2000); not enforced (CR_Core)
#   VITDEPTH_SLURM_CRED_EXPIRE=5     also the delay before a requeued job may restart (s, min 5)
#   VITDEPTH_SLURM_TASK_PLUGIN=task/none  task/affinity: bind tasks to CPUs (CPUS <= real cores)
#   VITDEPTH_SLURM_CTLD_PORT=6817  VITDEPTH_SLURM_SLURMD_PORT=6818
#   VITDEPTH_SLURM_KEEP_STATE=0      1: keep the job state of the previous start
#   VITDEPTH_SLURM_INSTALL=1         0: fail instead of apt-get installing missing packages
#   VITDEPTH_SLURM_LINK_ETC=0        1: symlink /etc/slurm/slurm.conf to our conf if none exists
set -euo pipefail

DIR=${VITDEPTH_SLURM_DIR:-/tmp/vitdepth-slurm}
CTLD_HOST=$(hostname -s)   # slurmctld only runs where SlurmctldHost == hostname -s
NODE=${VITDEPTH_SLURM_NODE:-$CTLD_HOST}
CPUS=${VITDEPTH_SLURM_CPUS:-4}
MEMTOTAL_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 ))
DEFMEM=$(( MEMTOTAL_MB - 2000 )); [ "$DEFMEM" -gt 20000 ] && DEFMEM=20000; [ "$DEFMEM" -lt 500 ] && DEFMEM=500
MEM=${VITDEPTH_SLURM_MEM:-$DEFMEM}
CRED_EXPIRE=${VITDEPTH_SLURM_CRED_EXPIRE:-5}
TASK_PLUGIN=${VITDEPTH_SLURM_TASK_PLUGIN:-task/none}
CTLD_PORT=${VITDEPTH_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${VITDEPTH_SLURM_SLURMD_PORT:-6818}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TEMPLATE=$HERE/slurm.conf.template
CONF=$DIR/etc/slurm.conf
T_START=$(date +%s.%N)
PACKAGES="slurmctld slurmd slurm-client munge"

STARTED=0
log() { echo "start.sh: $*" >&2; }
die() {
  log "ERROR: $*"
  if [ "$STARTED" = 1 ]; then VITDEPTH_SLURM_DIR=$DIR bash "$HERE/stop.sh" || true; fi   # undo what we started
  exit 1
}
elapsed() { awk -v a="$T_START" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}'; }
# running PID: exists and is not a zombie (our daemons are reparented to PID 1, which may reap late)
running() { local st; st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ -n "$st" ] && [ "$st" != Z ]; }
alive() { [ -f "$1" ] && running "$(cat "$1")"; }
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# wait_for SECONDS DESCRIPTION PIDFILE CMD...: poll CMD every 0.1 s; fail early if the daemon died
wait_for() {
  local secs=$1 desc=$2 pf=$3; shift 3
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -ge "$end" ] && { log "timed out after ${secs}s waiting for: $desc"; return 1; }
    running "$(cat "$pf")" || { log "$(basename "$pf" .pid) exited"; return 1; }
    sleep 0.1
  done
  log "$desc after $(elapsed)s"
}

[ "$(id -u)" = 0 ] || die "must run as root (slurmd launches jobs; munged runs as user munge)"
case "$DIR" in /|""|/tmp|/tmp/) die "refusing VITDEPTH_SLURM_DIR=$DIR (start.sh deletes its subdirectories)";; esac
[ -f "$TEMPLATE" ] || die "template not found: $TEMPLATE"
for p in munged slurmctld slurmd; do
  alive "$DIR/run/$p.pid" && die "$p already running (pid $(cat "$DIR/run/$p.pid")); run slurm/local/stop.sh first"
done
for port in "$CTLD_PORT" "$SLURMD_PORT"; do
  port_busy "$port" && die "port $port is in use (another SLURM?); set VITDEPTH_SLURM_CTLD_PORT/VITDEPTH_SLURM_SLURMD_PORT"
done

# 1. packages. Without systemd the postinst starts no daemons; it creates user munge and /etc/munge/munge.key.
if [ ! -x /usr/sbin/slurmctld ] || [ ! -x /usr/sbin/slurmd ] || [ ! -x /usr/bin/sbatch ] || [ ! -x /usr/sbin/munged ]; then
  [ "${VITDEPTH_SLURM_INSTALL:-1}" = 1 ] || die "slurm/munge not installed (apt-get install $PACKAGES)"
  command -v apt-get >/dev/null || die "slurm/munge not installed and no apt-get: install $PACKAGES yourself"
  export DEBIAN_FRONTEND=noninteractive
  # shellcheck disable=SC2086
  apt_install() { timeout 600 apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null; }
  apt_update() { log "apt-get update"; timeout 300 apt-get update -qq >&2 || die "apt-get update failed"; }
  # no package lists yet, or stale ones (404 on download): update first / once more
  apt-cache show slurmctld >/dev/null 2>&1 || apt_update
  log "apt-get install $PACKAGES"
  apt_install || { apt_update; apt_install; } || die "apt-get install $PACKAGES failed"
fi

# 2. directories: fresh state unless asked to keep it (job ids then restart at 1)
if [ "${VITDEPTH_SLURM_KEEP_STATE:-0}" != 1 ]; then
  rm -rf "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/run" "$DIR/munge" "$DIR/etc"
fi
mkdir -p "$DIR" "$DIR/etc" "$DIR/state" "$DIR/spool/slurmd-$NODE" "$DIR/log" "$DIR/run" "$DIR/munge"
chmod 0755 "$DIR"
# munged: "Socket is inaccessible: execute permissions for all required" unless the socket dir is
# 0755, owned by munge, and not writable by group or others
chown munge:munge "$DIR/munge"; chmod 0755 "$DIR/munge"

# 3. munge key: a private copy (munged refuses a key readable by others or not owned by munge)
KEY=$DIR/munge/munge.key
if [ ! -s "$KEY" ]; then
  if [ -s /etc/munge/munge.key ]; then cp /etc/munge/munge.key "$KEY"
  else dd if=/dev/urandom of="$KEY" bs=1024 count=1 status=none; fi
fi
chown munge:munge "$KEY"; chmod 0400 "$KEY"

# 4. slurm.conf from the template
sed -e "s|@DIR@|$DIR|g" -e "s|@NODE@|$NODE|g" -e "s|@CTLD_HOST@|$CTLD_HOST|g" -e "s|@CPUS@|$CPUS|g" \
    -e "s|@MEM@|$MEM|g" -e "s|@CRED_EXPIRE@|$CRED_EXPIRE|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
    -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" -e "s|@TASK_PLUGIN@|$TASK_PLUGIN|g" "$TEMPLATE" > "$CONF"
export SLURM_CONF=$CONF
echo "export SLURM_CONF=$CONF" > "$DIR/env.sh"
if [ "${VITDEPTH_SLURM_LINK_ETC:-0}" = 1 ] && [ ! -e /etc/slurm/slurm.conf ] && [ ! -L /etc/slurm/slurm.conf ]; then
  mkdir -p /etc/slurm; ln -s "$CONF" /etc/slurm/slurm.conf; echo 1 > "$DIR/run/etc_link"
  log "linked /etc/slurm/slurm.conf -> $CONF"
fi

STARTED=1
# 5. munged as user munge. setpriv execs, so $! is munged itself; setsid keeps it out of our
# process group (a Ctrl-C in this shell must not reach the daemons).
MSOCK=$DIR/munge/munge.socket
setsid setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F \
  --socket="$MSOCK" --key-file="$KEY" --pid-file="$DIR/munge/munged.pidfile" \
  --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" \
  </dev/null >"$DIR/log/munged.out" 2>&1 &
echo $! > "$DIR/run/munged.pid"
munge_ok() { timeout 5 munge -n -S "$MSOCK" | timeout 5 unmunge -S "$MSOCK"; }
wait_for 15 "munged up (pid $(cat "$DIR/run/munged.pid"))" "$DIR/run/munged.pid" munge_ok \
  || { cat "$DIR/log/munged.out" "$DIR/munge/munged.log" >&2 2>/dev/null; die "munged did not start"; }

# 6. slurmctld in the foreground (-D), backgrounded here so that $! is the daemon
setsid /usr/sbin/slurmctld -D -f "$CONF" </dev/null >"$DIR/log/slurmctld.out" 2>&1 &
echo $! > "$DIR/run/slurmctld.pid"
ctld_up() { timeout 5 scontrol ping | grep -q 'is UP'; }
wait_for 30 "slurmctld up (pid $(cat "$DIR/run/slurmctld.pid"))" "$DIR/run/slurmctld.pid" ctld_up \
  || { tail -n 30 "$DIR/log/slurmctld.out" >&2; die "slurmctld did not come up"; }

# 7. slurmd. -N: the node name need not be the hostname nor resolve (NodeAddr=127.0.0.1)
setsid /usr/sbin/slurmd -D -f "$CONF" -N "$NODE" </dev/null >"$DIR/log/slurmd.out" 2>&1 &
echo $! > "$DIR/run/slurmd.pid"
node_idle() { [ "$(timeout 5 sinfo -h -n "$NODE" -o '%T')" = idle ]; }
wait_for 30 "node $NODE idle (slurmd pid $(cat "$DIR/run/slurmd.pid"))" "$DIR/run/slurmd.pid" node_idle \
  || { tail -n 30 "$DIR/log/slurmd.out" >&2; timeout 5 sinfo -R >&2 || true; die "node did not become idle"; }

log "cluster ready in $(elapsed)s: node $NODE, $CPUS CPUs, ports $CTLD_PORT/$SLURMD_PORT, logs in $DIR/log"
echo "export SLURM_CONF=$CONF"
