#!/usr/bin/env bash
# slurm-local.sh: a Slurm cluster on this machine, from Debian's slurm-wlm, for running
# `srun --mpi=pmix distflash train` as a Slurm site would (needs root).
#
#   scripts/slurm-local.sh up            munged, slurmctld and one slurmd (node = this machine)
#   scripts/slurm-local.sh run CMD...    run CMD with this cluster's SLURM_CONF (e.g. srun ...)
#   scripts/slurm-local.sh session CMD...   up, run CMD, down (also when CMD fails)
#   scripts/slurm-local.sh status        sinfo, and the daemons' pids
#   scripts/slurm-local.sh down          stop the daemons, remove the state directory
#
# Everything lives in one state directory ($DFS_DIR): a generated munge key and munged's
# socket, slurm.conf, the daemons' spool, state, pid and log files. Nothing under /etc is
# read or written: the clients find this cluster through SLURM_CONF, which `run` sets, and
# the daemons reach munged through AuthInfo=socket=... . `up` waits until sinfo shows the
# node idle; a failed `up`, and `down`, kill the daemons it started and remove the directory.
#
# The node is this machine with DFS_CPUS CPUs (default 8: more than the 2 cores here, so
# 4 ranks fit; SlurmdParameters=config_overrides lets slurmd believe the configuration).
# No cgroups: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none.
#
# Settings (environment): DFS_DIR (/run/slurm-local), DFS_CPUS (8), DFS_CTLD_PORT (6817),
# DFS_SLURMD_PORT (6818), DFS_PMIX_PORT (6819, PMIx's direct-connection port... unused on one
# node), DFS_TIMEOUT (seconds up waits for the node, 30).
set -euo pipefail

dir=${DFS_DIR:-/run/slurm-local}
cpus=${DFS_CPUS:-8}
ctld_port=${DFS_CTLD_PORT:-6817}
slurmd_port=${DFS_SLURMD_PORT:-6818}
timeout=${DFS_TIMEOUT:-30}
node=$(hostname -s)

die() { echo "slurm-local: $*" >&2; exit 1; }

export SLURM_CONF=$dir/slurm.conf

# pidof_file FILE: the pid in FILE when that process is alive.
pidof_file() {
	local pid
	pid=$(cat "$1" 2>/dev/null) || return 1
	[[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

write_conf() {
	cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm-local.sh: a one-node cluster on $node.
ClusterName=distflash
SlurmctldHost=$node
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/slurmd
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=5
InactiveLimit=0
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
}

up() {
	[[ $(id -u) == 0 ]] || die "needs root (slurmd starts the job's processes as their user)"
	for tool in munged slurmctld slurmd sinfo srun; do
		command -v "$tool" >/dev/null || die "$tool is not on PATH (Debian: apt-get install slurmd slurmctld slurm-client munge)"
	done
	[[ -e $dir ]] && die "a cluster is up already ($dir); run down first"
	mkdir -p "$dir"/{ctld,slurmd}
	chmod 700 "$dir"
	trap 'echo "slurm-local: up failed, stopping what was started" >&2; down' EXIT
	dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
	chmod 400 "$dir/munge.key"
	munged --key-file="$dir/munge.key" --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" \
		--log-file="$dir/munged.log" --seed-file="$dir/munged.seed" --force ||
		die "munged did not start: $(tail -3 "$dir/munged.log" 2>/dev/null)"
	write_conf
	slurmctld || die "slurmctld did not start: $(tail -5 "$dir/slurmctld.log" 2>/dev/null)"
	slurmd || die "slurmd did not start: $(tail -5 "$dir/slurmd.log" 2>/dev/null)"
	local i state=
	for ((i = 0; i < timeout * 5; i++)); do
		state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
		[[ $state == idle ]] && break
		sleep 0.2
	done
	[[ $state == idle ]] || die "node $node is '${state:-not known}' after ${timeout}s, not idle; slurmctld.log:
$(tail -5 "$dir/slurmctld.log")
slurmd.log:
$(tail -5 "$dir/slurmd.log")"
	trap - EXIT
	echo "slurm-local: node $node idle ($cpus CPUs); SLURM_CONF=$SLURM_CONF"
}

down() {
	local f pid
	# slurmd first (it ends the job steps it runs), then slurmctld, then munged.
	for f in slurmd slurmctld munged; do
		pid=$(pidof_file "$dir/$f.pid") || continue
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null || true
	done
	rm -rf "$dir"
}

status() {
	local f
	for f in munged slurmctld slurmd; do
		echo "$f: $(pidof_file "$dir/$f.pid" || echo 'not running')"
	done
	sinfo
}

cmd=${1:-}
shift || true
case $cmd in
up) up ;;
down) down ;;
status) status ;;
run) exec "$@" ;;
session)
	up
	trap down EXIT
	"$@"
	;;
*) die "usage: $0 up | run CMD... | session CMD... | status | down" ;;
esac
