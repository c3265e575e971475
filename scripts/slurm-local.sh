#!/usr/bin/env bash
# slurm-local.sh: a Slurm cluster on this machine, from Debian's slurm-wlm, for running
# `srun --mpi=pmix distflash train` as a Slurm site would (needs root).
#
#   scripts/slurm-local.sh up            munged, slurmctld and one slurmd: the node is this machine
#   scripts/slurm-local.sh up N          N nodes, the hosts of scripts/netns-cluster.sh (N ≥ 2)
#   scripts/slurm-local.sh run CMD...    run CMD as a client of this cluster (e.g. srun ...)
#   scripts/slurm-local.sh session [N] -- CMD...   up [N], run CMD, down (also when CMD fails)
#   scripts/slurm-local.sh status        the daemons' pids, and sinfo
#   scripts/slurm-local.sh down          stop the daemons (and the hosts), remove the state
#
# Everything lives in one state directory ($DFS_DIR): a generated munge key and munged's
# socket, slurm.conf, the daemons' spool, state, pid and log files. Nothing under /etc is
# read or written: the clients find this cluster through SLURM_CONF, which `run` sets, and
# the daemons reach munged through AuthInfo=socket=... . `up` waits until sinfo shows every
# node idle; a failed `up`, and `down`, stop what it started and remove the directory.
#
# One node: the node is this machine (its short hostname, address 127.0.0.1).
# N nodes: scripts/netns-cluster.sh makes hosts $DFC_NAME-h0..h(N-1) (network namespaces,
# addresses $DFC_SUBNET.1..N, each with its own hostname); slurmctld and slurmd 0 run on
# host 0, slurmd i on host i (slurmd -N $DFC_NAME-hi), and `run` runs CMD on host 0 with
# netns-cluster's Open MPI settings (its subnet for btl_tcp and oob_tcp), which srun passes
# on to the tasks. One munged (a Unix socket, which every namespace reaches) serves all.
#
# Each node gets its own PMIx temporary directory (TmpFS=$DFS_DIR/tmp-%n): namespace hosts
# share one /tmp, where the PMIx plugin's /tmp/spmix_appdir_<uid>_<job>.<step> would collide.
#
# Each node has DFS_CPUS CPUs (default 8: more than the 2 cores here, so 4 ranks fit on one
# node; SlurmdParameters=config_overrides makes slurmd believe the configuration). No
# cgroups: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none (no CPU binding).
# MpiDefault=none, as Slurm ships it: srun needs --mpi=pmix for Open MPI.
#
# Settings (environment): DFS_DIR (/run/slurm-local), DFS_CPUS (8), DFS_CTLD_PORT (6817),
# DFS_SLURMD_PORT (6818), DFS_TIMEOUT (seconds up waits for the nodes, 30); for N nodes also
# netns-cluster.sh's DFC_NAME (dfs), DFC_SUBNET (10.213.9), DFC_SLOTS, DFC_RATE, DFC_DELAY.
set -euo pipefail

dir=${DFS_DIR:-/run/slurm-local}
cpus=${DFS_CPUS:-8}
ctld_port=${DFS_CTLD_PORT:-6817}
slurmd_port=${DFS_SLURMD_PORT:-6818}
timeout=${DFS_TIMEOUT:-30}
export DFC_NAME=${DFC_NAME:-dfs} DFC_SUBNET=${DFC_SUBNET:-10.213.9}
netns=$(dirname "$0")/netns-cluster.sh

die() { echo "slurm-local: $*" >&2; exit 1; }

export SLURM_CONF=$dir/slurm.conf

# nodes: the number of namespace hosts of the cluster that is up (0: this machine).
nodes() { cat "$dir/nodes" 2>/dev/null || echo 0; }

# pidof_file FILE: the pid in FILE when that process is alive.
pidof_file() {
	local pid
	pid=$(cat "$1" 2>/dev/null) || return 1
	[[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# write_conf N: slurm.conf for this machine (N = 0) or N namespace hosts.
write_conf() {
	local n=$1 i ctld names
	if ((n == 0)); then
		ctld=$(hostname -s)
		names=$ctld
	else
		ctld="$DFC_NAME-h0($DFC_SUBNET.1)"
		names="$DFC_NAME-h[0-$((n - 1))]"
	fi
	cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm-local.sh: a cluster of $((n > 0 ? n : 1)) node(s) on one machine.
ClusterName=distflash
SlurmctldHost=$ctld
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/slurmd-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
TmpFS=$dir/tmp-%n
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
EOF
	if ((n == 0)); then
		mkdir -p "$dir/tmp-$names"
		echo "NodeName=$names NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN" >>"$dir/slurm.conf"
	else
		for ((i = 0; i < n; i++)); do
			mkdir -p "$dir/tmp-$DFC_NAME-h$i"
			echo "NodeName=$DFC_NAME-h$i NodeAddr=$DFC_SUBNET.$((i + 1)) CPUs=$cpus State=UNKNOWN" >>"$dir/slurm.conf"
		done
	fi
	echo "PartitionName=local Nodes=$names Default=YES MaxTime=INFINITE State=UP" >>"$dir/slurm.conf"
}

# wait_ctld: wait until slurmctld answers (scontrol ping), failing at once when it exited.
wait_ctld() {
	local deadline=$((SECONDS + timeout))
	until client timeout 2 scontrol ping 2>/dev/null | grep -q 'is UP'; do
		[[ -e $dir/slurmctld.pid ]] && ! pidof_file "$dir/slurmctld.pid" >/dev/null && die "slurmctld exited:
$(logs)"
		((SECONDS < deadline)) || die "slurmctld does not answer after ${timeout}s:
$(logs)"
		sleep 0.1
	done
}

# logs: the ends of the daemons' logs, for a failed up.
logs() {
	local f
	for f in "$dir"/*.log; do
		[[ -e $f ]] || continue
		echo "--- $f:"
		tail -5 "$f"
	done
}

up() {
	local n=${1:-0} i state want
	[[ $n =~ ^[0-9]+$ && $n -ne 1 && $n -le 64 ]] || die "up $n: want nothing (this machine) or 2 to 64 namespace hosts"
	[[ $(id -u) == 0 ]] || die "needs root (slurmd starts the job's processes as their user)"
	for tool in munged slurmctld slurmd sinfo srun; do
		command -v "$tool" >/dev/null || die "$tool is not on PATH (Debian: apt-get install slurmd slurmctld slurm-client munge)"
	done
	[[ -e $dir ]] && die "a cluster is up already ($dir); run down first"
	((n == 0)) || [[ ! -e /run/netns-cluster/$DFC_NAME ]] ||
		die "a netns cluster named $DFC_NAME is up already; set DFC_NAME to another name"
	mkdir -p "$dir/ctld"
	trap 'echo "slurm-local: up failed, stopping what was started" >&2; down' EXIT
	echo "$n" >"$dir/nodes"
	dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
	chmod 400 "$dir/munge.key"
	munged --key-file="$dir/munge.key" --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" \
		--log-file="$dir/munged.log" --seed-file="$dir/munged.seed" --force ||
		die "munged did not start: $(tail -3 "$dir/munged.log" 2>/dev/null)"
	write_conf "$n"
	if ((n == 0)); then
		slurmctld || die "slurmctld did not start:
$(logs)"
		wait_ctld
		slurmd || die "slurmd did not start:
$(logs)"
		want=1
	else
		"$netns" up "$n"
		"$netns" exec 0 slurmctld || die "slurmctld did not start on host 0:
$(logs)"
		wait_ctld
		for ((i = 0; i < n; i++)); do
			# ip netns exec gives the host a fresh /sys without /sys/fs/cgroup's mounts, and
			# slurmd 22.05 loads a cgroup plugin even with proctrack/linuxproc and task/none:
			# a tmpfs there (in the host's own mount namespace) with the named hierarchy
			# systemd mounted again in it, as on this machine, makes it cgroup/v1, which then
			# starts (it only checks that hierarchy's file system type).
			"$netns" exec "$i" sh -c 'if ! mountpoint -q /sys/fs/cgroup; then mount -t tmpfs cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd; fi && exec slurmd -N "$0"' "$DFC_NAME-h$i" || die "slurmd did not start on host $i:
$(logs)"
		done
		want=$n
	fi
	local deadline=$((SECONDS + timeout)) f
	while :; do
		# A daemon that exited (a port in use, a bad setting) fails up at once.
		for f in "$dir"/slurmctld.pid "$dir"/slurmd-*.pid; do
			[[ -e $f ]] && ! pidof_file "$f" >/dev/null && die "${f##*/}: the daemon exited:
$(logs)"
		done
		state=$(client timeout 2 sinfo -h -o '%T %D' 2>/dev/null || true)
		[[ $state == "idle $want" ]] && break
		((SECONDS < deadline)) || die "after ${timeout}s sinfo says '${state:-nothing}', want all $want node(s) idle:
$(client timeout 5 sinfo -N 2>&1 || true)
$(logs)"
		sleep 0.2
	done
	trap - EXIT
	echo "slurm-local: $want node(s) idle, $cpus CPUs each; state in $dir"
}

# client CMD...: run CMD where the controller is reachable (host 0 of namespace hosts).
client() {
	if (($(nodes) > 0)); then
		"$netns" run "$@"
	else
		"$@"
	fi
}

# stop FILE...: SIGTERM to the live processes named by the pid files, SIGKILL to those still
# there after 5 s.
stop() {
	local f pid pids=() left=() i
	for f in "$@"; do
		pid=$(pidof_file "$f") && pids+=("$pid")
	done
	((${#pids[@]})) || return 0
	kill "${pids[@]}" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		left=()
		for pid in "${pids[@]}"; do
			kill -0 "$pid" 2>/dev/null && left+=("$pid")
		done
		((${#left[@]})) || return 0
		sleep 0.1
	done
	echo "slurm-local: ${left[*]} still ran 5 s after SIGTERM: SIGKILL" >&2
	kill -9 "${left[@]}" 2>/dev/null || true
}

# sweep: SIGKILL to every process that still carries this cluster's SLURM_CONF (what a job
# step left: a slurmstepd that outlived slurmd, its tasks, their srun) except this script and
# the processes it runs under.
sweep() {
	local p pid self=" "
	pid=$$
	while [[ $pid =~ ^[0-9]+$ && $pid -gt 1 ]]; do
		self+="$pid "
		pid=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || break
	done
	for p in /proc/[0-9]*; do
		pid=${p#/proc/}
		[[ $self == *" $pid "* ]] && continue
		if grep -qzxF "SLURM_CONF=$dir/slurm.conf" "$p/environ" 2>/dev/null; then
			echo "slurm-local: killing $pid ($(cat "$p/comm" 2>/dev/null)), left by a job" >&2
			kill -9 "$pid" 2>/dev/null || true
		fi
	done
}

down() {
	local jobs i
	# Jobs first: slurmd exits without ending the slurmstepd of a running step.
	if pidof_file "$dir/slurmctld.pid" >/dev/null; then
		jobs=$(client timeout 5 squeue -h -o %i 2>/dev/null || true)
		if [[ -n $jobs ]]; then
			# shellcheck disable=SC2086
			client timeout 5 scancel $jobs 2>/dev/null || true
			for ((i = 0; i < 100; i++)); do # KillWait=5: SIGKILL 5 s after SIGTERM
				[[ -z $(client timeout 2 squeue -h -o %i 2>/dev/null) ]] && break
				sleep 0.1
			done
		fi
	fi
	# Then slurmd (every node), slurmctld and munged.
	stop "$dir"/slurmd-*.pid
	stop "$dir/slurmctld.pid" "$dir/munged.pid"
	sweep
	if (($(nodes) > 0)); then
		"$netns" down
	fi
	rm -rf "$dir"
}

status() {
	local f
	[[ -e $dir/slurm.conf ]] || die "no cluster is up ($dir)"
	for f in "$dir"/munged.pid "$dir"/slurmctld.pid "$dir"/slurmd-*.pid; do
		[[ -e $f ]] || continue
		f=${f##*/}
		echo "${f%.pid}: $(pidof_file "$dir/$f" || echo 'not running')"
	done
	client sinfo -N
}

cmd=${1:-}
shift || true
case $cmd in
up) up "${1:-0}" ;;
down) down ;;
status) status ;;
run)
	[[ -e $dir/slurm.conf ]] || die "no cluster is up ($dir); run up first"
	client "$@"
	;;
session)
	n=0
	if [[ ${1:-} != -- ]]; then
		n=${1:?session [N] -- CMD...}
		shift
	fi
	[[ ${1:-} == -- ]] || die "session [N] -- CMD...: want -- before the command"
	shift
	up "$n"
	trap down EXIT
	client "$@"
	;;
*) die "usage: $0 up [N] | run CMD... | session [N] -- CMD... | status | down" ;;
esac
