#!/usr/bin/env bash
# Step time and bytes per link class of tiny-sp4 on 2 hosts × 2 ranks (scripts/netns-cluster.sh,
# links shaped to RATE), for every schedule with overlap_comm on and off, beside plan's
# prediction for the same cluster (--cluster 2x2xcpu). Needs root and Open MPI.
#
#   bench/netns_overlap.sh [RATE [STEPS [BATCH]]]     defaults: 100mbit 12 8
#
# REPS (default 2) runs of each row, overlap on and off alternating; the row keeps the run
# with the shortest step time (the machine is shared: the others were slowed by other jobs).
# SCHEDULES limits the schedules (default: all).
#
# Per row: the mean step time of steps 5..STEPS-1 (metrics.jsonl's elapsed_s); the bytes per
# step that crossed between the hosts (both hosts' eth0 tx counters over the same steps, less
# 66 bytes of Ethernet/IP/TCP header per packet); the bytes per step the communicator counted
# (all ranks, every call site: DISTFLASH_TRAFFIC), of which the rest stayed inside a host
# (shared memory); and plan's step time, with the compute speed measured here: for each
# schedule, a run just before on the same cluster with unshaped links (overlap off) gives the
# FLOP/s of one rank as plan counts FLOPs (--flops): its step time less plan's communication
# time at 1 GB/s. That rate includes what 4 MPI processes cost on this machine besides the
# wire (on 2 shared cores that is most of the step), and measuring it beside each row keeps
# the load of other jobs on a shared machine out of the comparison. The link rate gives
# --inter-bw (per rank: the host's rate shared by its 2 ranks).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-100mbit}
steps=${2:-12}
batch=${3:-8}
out=$(mktemp -d)
export DFC_NAME=dfbench DFC_SUBNET=10.213.9 DFC_RATE=
cleanup() { scripts/netns-cluster.sh down || true; rm -rf "$out"; }
trap cleanup EXIT
go build -tags mpi -o "$out/distflash" .
scripts/netns-cluster.sh up 2 >&2
bps=$(python3 -c "
import re,sys
m=re.fullmatch(r'([0-9.]+)([kmg]?)bit','$rate'.lower())
if not m: sys.exit('RATE $rate: want e.g. 100mbit or 1gbit')
print(float(m[1])*{'':1,'k':1e3,'m':1e6,'g':1e9}[m[2]]/8)")
args=(train --config configs/tiny-sp4.toml --progress=false --set training.steps="$steps"
	--set data.max_bytes=1048576 --set data.batch_size="$batch" --set run.log_interval=0
	--set checkpoint.interval=0)
lo=4 hi=$((steps - 1)) # measure from the end of step lo to the end of step hi

# counters: both hosts' eth0 tx bytes and packets, summed.
counters() {
	local b=0 p=0 i
	for i in 0 1; do
		b=$((b + $(ip netns exec "$DFC_NAME-h$i" cat /sys/class/net/eth0/statistics/tx_bytes)))
		p=$((p + $(ip netns exec "$DFC_NAME-h$i" cat /sys/class/net/eth0/statistics/tx_packets)))
	done
	echo "$b $p"
}

# lines FILE: the number of lines of FILE (0 when absent).
lines() { [[ -e $1 ]] && wc -l <"$1" || echo 0; }

# measure SCHEDULE OVERLAP: one cluster run, a row of $out/rows.
measure() {
	local s=$1 ov=$2 run=$out/c-$1-$2-$DFC_RATE-$3 pid m c0 c1
	scripts/netns-cluster.sh run mpirun --allow-run-as-root --bind-to none -np 4 -x DISTFLASH_TRAFFIC="$run.traffic" \
		"$out/distflash" "${args[@]}" --set parallelism.attention="$s" \
		--set run.output_dir="$run" --set parallelism.overlap_comm="${ov/unshaped/false}" >"$run.log" 2>&1 &
	pid=$!
	m=$run/tiny-sp4/metrics.jsonl
	while (($(lines "$m") < lo)) && kill -0 $pid 2>/dev/null; do sleep 0.05; done
	c0=$(counters)
	while (($(lines "$m") < hi)) && kill -0 $pid 2>/dev/null; do sleep 0.05; done
	c1=$(counters)
	wait $pid || { cat "$run.log" >&2; exit 1; }
	python3 - "$m" "$lo" "$hi" "$c0" "$c1" "$run.traffic" "$steps" "$s" "$ov" <<'PY'
import glob, json, sys
m, lo, hi, c0, c1, tr, steps, s, ov = sys.argv[1:]
lo, hi, steps = int(lo), int(hi), int(steps)
ms = [json.loads(l) for l in open(m)]
t = (ms[hi - 1]["elapsed_s"] - ms[lo - 1]["elapsed_s"]) / (hi - lo)
(b0, p0), (b1, p1) = map(int, c0.split()), map(int, c1.split())
cross = ((b1 - b0) - 66 * (p1 - p0)) / (hi - lo)
sites = {}
for f in glob.glob(tr + ".rank*"):
    for k, v in json.load(open(f)).items():
        sites[k] = sites.get(k, 0) + v
step = {k: v for k, v in sites.items() if not k.startswith("ckpt")}  # per-step sites
comm = sum(step.values()) / steps
print(s, ov, f"{t:.4f}", f"{cross:.0f}", f"{comm:.0f}",
      ",".join(f"{k}={v / steps / 1e6:.2f}MB" for k, v in sorted(step.items())))
PY
}

reps=${REPS:-2}
echo "schedule overlap step_s cross_bytes comm_bytes comm_sites" >"$out/rows"
for s in ${SCHEDULES:-distflash ring zigzag burst attn2d ulysses}; do
	p=$("$out/distflash" plan --config configs/tiny-sp4.toml --cluster 2x2xcpu --flops 1e9 --attention "$s" \
		--set data.batch_size="$batch")
	if [[ $p != *"step time"* ]]; then
		echo "$s: refused by this config (plan says why), skipped" >&2
		continue
	fi
	for ((r = 0; r < reps; r++)); do
		# Calibration on unshaped links: the compute speed of a rank, for plan.
		DFC_RATE=none
		scripts/netns-cluster.sh shape none
		measure "$s" unshaped "$r" >>"$out/runs"
		DFC_RATE=$rate
		scripts/netns-cluster.sh shape "$rate"
		measure "$s" true "$r" >>"$out/runs"
		measure "$s" false "$r" >>"$out/runs"
	done
	for ov in unshaped true false; do
		grep "^$s $ov " "$out/runs" | sort -k3,3g | head -1 >>"$out/rows"
	done
done
python3 - "$out" "$bps" "$batch" "$steps" "$rate" "$reps" <<'PY'
import json, subprocess, sys
out, bps, batch, steps, rate, reps = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
def plan(s, ov, flops, bw=bps):
    cmd = [f"{out}/distflash", "plan", "--config", "configs/tiny-sp4.toml", "--cluster", "2x2xcpu",
           "--flops", repr(flops), "--inter-bw", repr(bw / 2), "--attention", s, "--format", "json",
           "--set", f"data.batch_size={batch}", "--set", f"parallelism.overlap_comm={ov}"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["plans"][0]
print(f"tiny-sp4, batch {batch}, 2 hosts x 2 ranks, links {rate} (tbf, both ways), steps 5..{steps - 1}, best of {reps}")
print(f"{'schedule':10} {'overlap':8} {'step ms':>8} {'plan ms':>8} {'plan/meas':>9} {'between hosts MB':>16} "
      f"{'plan MB':>8} {'comm MB':>8} {'inside MB':>9}")
rows = [l.split() for l in open(f"{out}/rows")][1:]
for s, ov, t, cross, comm, sites in rows:
    t, cross, comm = float(t), float(cross), float(comm)
    if ov == "unshaped":
        # The FLOP/s at which plan's compute time is this step time less its communication
        # time at 1 GB/s per host (veth carries several).
        p1 = plan(s, "false", 1.0, 1e9)["time"]
        flops = p1["compute_s"] / (t - p1["comm_s"])
        print(f"{s:10} {'unshaped':8} {t * 1e3:8.0f}   -> --flops {flops:.3g} per rank; {cross / 1e6:.2f} MB between hosts")
        continue
    p = plan(s, ov, flops)
    # plan's attention bytes between nodes are per rank: 4 ranks send them.
    # plan's bytes are per rank (attention: the busiest rank's); all ranks together: the
    # attention sum over ranks (attn_total_layer, 4 layers) times the fraction that crosses,
    # plus the world collectives' crossing bytes (per rank, the same on every rank).
    c = p["comm"]
    frac = c["attn_inter_node"] / c["attention"]
    pc = frac * 4 * c["attn_total_layer"] + 4 * (c["inter_node"] - c["attn_inter_node"])
    ps = p["time"]["step_s"]
    print(f"{s:10} {ov:8} {t * 1e3:8.0f} {ps * 1e3:8.0f} {ps / t:9.2f} {cross / 1e6:16.2f} "
          f"{pc / 1e6:8.2f} {comm / 1e6:8.2f} {(comm - cross) / 1e6:9.2f}")
print("\nevery run (schedule, overlap, step s):", " ".join(f"{l.split()[0]}/{l.split()[1]}/{float(l.split()[2]):.2f}" for l in open(f"{out}/runs")))
print("\ncommunicator bytes per step, all ranks, by call site:")
for s, ov, t, cross, comm, sites in rows:
    print(f"  {s} overlap={ov}: {sites}")
PY
