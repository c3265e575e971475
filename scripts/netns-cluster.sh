#!/usr/bin/env bash
# netns-cluster.sh: a cluster of N hosts on this machine, each a Linux network namespace with
# its own address, hostname and link, for running mpirun across "machines" (needs root).
#
#   scripts/netns-cluster.sh up N          make hosts h0..h(N-1) and the switch between them
#   scripts/netns-cluster.sh run CMD...    run CMD on host h0, set up for mpirun (see below)
#   scripts/netns-cluster.sh session N CMD...   up N, run CMD, down (also when CMD fails)
#   scripts/netns-cluster.sh exec HOST CMD...   run CMD on host HOST (0..N-1)
#   scripts/netns-cluster.sh link HOST up|down  plug or cut host HOST's link
#   scripts/netns-cluster.sh shape RATE|none    reshape every link (tbf rate, e.g. 100mbit)
#   scripts/netns-cluster.sh stats         bytes and packets each link carried, both ways
#   scripts/netns-cluster.sh down          kill what runs on the hosts, remove everything
#
# Layout: a switch namespace "$DFC_NAME-sw" holds a bridge; host i is namespace "$DFC_NAME-h$i"
# with interface eth0 = $DFC_SUBNET.(i+1)/24, one end of a veth pair whose other end is port
# h$i of the bridge. Nothing is added to the root namespace: the addresses exist only inside
# these namespaces, so no traffic leaves them. With DFC_RATE set, both directions of every
# host's link are shaped with tbf (the host's eth0 and its switch port), so host-to-host
# traffic crosses two shaped queues of DFC_RATE, like a switch with per-port bandwidth. Ranks
# of one host talk over shared memory (Open MPI's vader), which no link sees.
#
# mpirun: `run` starts CMD in host 0 with a fresh hostname (a UTS namespace: every host has its
# own hostname, so Open MPI cannot mistake two hosts for one) and with
#   DFC_HOSTFILE                      a hostfile, one line per host: "ADDRESS slots=$DFC_SLOTS"
#   OMPI_MCA_orte_default_hostfile    the same, so a plain `mpirun -np 4 prog` uses the hosts
#   OMPI_MCA_plm_rsh_agent            the "ssh" of this cluster: a wrapper that enters the
#                                     namespace of the address it is given (ip netns exec)
#   OMPI_MCA_btl_tcp_if_include, OMPI_MCA_oob_tcp_if_include   this subnet only
# All namespaces share one filesystem: binary, config and data have the same path on every
# host, as on a cluster with a shared filesystem.
#
# Settings (environment): DFC_NAME (dfc), DFC_SUBNET (10.213.0, a /24 that must not exist
# elsewhere on this machine), DFC_SLOTS (2), DFC_RATE (tbf rate, e.g. 1gbit, 200mbit; empty:
# unshaped), DFC_BURST (tbf burst, 64kb), DFC_DELAY (one-way delay per link via netem, e.g.
# 1ms; refused where the kernel has no sch_netem), DFC_TCP_RETRIES2 (the hosts'
# net.ipv4.tcp_retries2, per namespace; empty: the kernel's 15). A cut link stalls a TCP
# connection that has data in flight until the retransmissions give up: about 15 minutes at
# 15, about 13 s at 5. mpirun, which tears the job down through its connections to the other
# hosts' daemons, waits that long after a rank on a cut-off host aborts.
set -euo pipefail

name=${DFC_NAME:-dfc}
subnet=${DFC_SUBNET:-10.213.0}
slots=${DFC_SLOTS:-2}
rate=${DFC_RATE:-}
burst=${DFC_BURST:-64kb}
delay=${DFC_DELAY:-}
retries=${DFC_TCP_RETRIES2:-}
state=/run/netns-cluster/$name
sw=$name-sw

die() { echo "netns-cluster: $*" >&2; exit 1; }

[[ $name =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "DFC_NAME=$name: want 1-8 lower-case letters and digits"
[[ $subnet =~ ^(10|172|192)\.[0-9]+\.[0-9]+$ ]] || die "DFC_SUBNET=$subnet: want the first three bytes of a private /24, e.g. 10.213.0"

hosts() { cat "$state/n" 2>/dev/null || echo 0; }

# shape DEV NS: tbf (and netem) on DEV's egress in namespace NS.
shape() {
	local dev=$1 ns=$2
	if [[ -n $delay ]]; then
		ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$delay" ||
			die "DFC_DELAY=$delay: tc netem failed (this kernel may lack sch_netem, CONFIG_NET_SCH_NETEM)"
		[[ -n $rate ]] && ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" burst "$burst" latency 100ms
	elif [[ -n $rate ]]; then
		ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst "$burst" latency 100ms
	fi
}

up() {
	local n=$1 i
	[[ $n =~ ^[1-9][0-9]?$ && $n -le 64 ]] || die "up $n: want a number of hosts, 1 to 64"
	[[ -e $state ]] && die "a cluster named $name is up already ($state); run down first"
	[[ $(id -u) == 0 ]] || die "needs root (network namespaces)"
	if ip -o addr show | grep -q " inet $subnet\."; then
		die "subnet $subnet.0/24 exists in this namespace already; pick another DFC_SUBNET"
	fi
	mkdir -p "$state"
	printf 'rate=%q\ndelay=%q\n' "$rate" "$delay" >"$state/settings"
	# Whatever ends up early (a failed command, or die) removes what was made.
	trap 'echo "netns-cluster: up failed, removing what was made" >&2; down' EXIT
	ip netns add "$sw"
	ip netns exec "$sw" ip link set lo up
	ip netns exec "$sw" ip link add br0 type bridge
	ip netns exec "$sw" ip link set br0 up
	: >"$state/hostfile"
	for ((i = 0; i < n; i++)); do
		ip netns add "$name-h$i"
		echo $((i + 1)) >"$state/n" # down removes what exists so far
		ip link add eth0 netns "$name-h$i" type veth peer name "h$i" netns "$sw"
		ip netns exec "$sw" ip link set "h$i" master br0 up
		ip netns exec "$name-h$i" ip link set lo up
		ip netns exec "$name-h$i" ip addr add "$subnet.$((i + 1))/24" dev eth0
		ip netns exec "$name-h$i" ip link set eth0 up
		[[ -n $retries ]] && ip netns exec "$name-h$i" sysctl -qw net.ipv4.tcp_retries2="$retries"
		shape eth0 "$name-h$i"
		shape "h$i" "$sw"
		echo "$subnet.$((i + 1)) slots=$slots" >>"$state/hostfile"
	done
	# The rsh agent: mpirun calls it as `agent [options] HOST orted ...` (as it would ssh).
	cat >"$state/agent" <<EOF
#!/usr/bin/env bash
# rsh agent of netns cluster $name: enter the namespace of the host named by address.
while [[ \$1 == -* ]]; do shift; done
host=\$1; shift
i=\$(( \${host##*.} - 1 ))
[[ \$host == $subnet.* && -e /run/netns/$name-h\$i ]] || { echo "netns-cluster agent: no host \$host" >&2; exit 1; }
# Like ssh, start from a clean environment: ranks get only what mpirun passes (-x NAME).
exec env -i PATH="\$PATH" HOME="\${HOME:-/root}" ip netns exec $name-h\$i unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$@"' $name-h\$i "\$*"
EOF
	chmod +x "$state/agent"
	trap - EXIT
	echo "netns-cluster $name: $n hosts $subnet.1-$subnet.$n, ${rate:-unshaped}${delay:+, delay $delay}; hostfile $state/hostfile"
}

# onhost I CMD...: run CMD in host I's namespace with its own hostname.
onhost() {
	local i=$1
	shift
	[[ -e /run/netns/$name-h$i ]] || die "no host $i in cluster $name (is it up?)"
	DFC_HOSTFILE=$state/hostfile \
		OMPI_MCA_orte_default_hostfile=$state/hostfile \
		OMPI_MCA_plm_rsh_agent=$state/agent \
		OMPI_MCA_btl_tcp_if_include=$subnet.0/24 \
		OMPI_MCA_oob_tcp_if_include=$subnet.0/24 \
		ip netns exec "$name-h$i" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name-h$i" "$@"
}

link() {
	local i=$1 how=$2
	[[ $how == up || $how == down ]] || die "link $i $how: want up or down"
	ip netns exec "$name-h$i" ip link set eth0 "$how"
}

# reshape RATE: replace the shaping of every link (both directions); none removes it.
reshape() {
	local i n
	n=$(hosts)
	[[ $n -gt 0 ]] || die "no cluster named $name is up"
	rate=$1
	[[ $rate == none ]] && rate=
	for ((i = 0; i < n; i++)); do
		ip netns exec "$name-h$i" tc qdisc del dev eth0 root 2>/dev/null || true
		ip netns exec "$sw" tc qdisc del dev "h$i" root 2>/dev/null || true
		shape eth0 "$name-h$i"
		shape "h$i" "$sw"
	done
	printf 'rate=%q\ndelay=%q\n' "$rate" "$delay" >"$state/settings"
}

stats() {
	local i n
	# shellcheck disable=SC1091
	[[ -e $state/settings ]] && . "$state/settings"
	n=$(hosts)
	printf '%-6s %16s %12s %16s %12s\n' host tx_bytes tx_packets rx_bytes rx_packets
	for ((i = 0; i < n; i++)); do
		ip netns exec "$name-h$i" cat /sys/class/net/eth0/statistics/{tx_bytes,tx_packets,rx_bytes,rx_packets} |
			xargs printf "%-6s %16s %12s %16s %12s\n" "h$i"
	done
	if [[ -n $rate || -n $delay ]]; then
		for ((i = 0; i < n; i++)); do
			echo "h$i eth0 (host to switch):"
			ip netns exec "$name-h$i" tc -s qdisc show dev eth0 | sed 's/^/  /'
		done
	fi
}

down() {
	local ns pids
	for ns in $(ip netns list | awk '{print $1}'); do
		[[ $ns == "$name-h"* || $ns == "$sw" ]] || continue
		pids=$(ip netns pids "$ns" || true)
		[[ -n $pids ]] && kill -9 $pids 2>/dev/null || true
		ip netns del "$ns" || true
	done
	rm -rf "$state"
	# Open MPI's session directories of these hosts (named by hostname), which a job that
	# was killed or aborted leaves behind.
	rm -rf "${TMPDIR:-/tmp}/ompi.$name-h"[0-9]*
}

cmd=${1:-}
shift || true
case $cmd in
up) up "${1:?up N}" ;;
down) down ;;
run) onhost 0 "$@" ;;
exec)
	i=${1:?exec HOST CMD}
	shift
	onhost "$i" "$@"
	;;
session)
	n=${1:?session N CMD}
	shift
	up "$n"
	trap down EXIT
	onhost 0 "$@"
	;;
link) link "${1:?link HOST up|down}" "${2:?link HOST up|down}" ;;
shape) reshape "${1:?shape RATE|none}" ;;
stats) stats ;;
*) die "usage: $0 up N | run CMD... | session N CMD... | exec HOST CMD... | link HOST up|down | shape RATE|none | stats | down" ;;
esac
