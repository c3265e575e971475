package plan

// The world's collectives in plan: the data-parallel gradient all-reduce and FSDP's
// all-gathers and reduce-scatters, priced as NCCL runs them on GPUs and as Open MPI runs them
// on ranks of the CPU backend (worldCollectives).
//
// NCCL predicts, for every call, the time of each algorithm and protocol as a latency plus
// the call's bytes over an algorithm bandwidth, and runs the fastest (its tuning model,
// src/graph/tuning.cc of NCCL v2.23.4-1: ncclTopoTuneModel fills the tables,
// ncclTopoGetAlgoTime prices a call). plan follows that model for the two algorithms NCCL has
// on every GPU cluster, ring and tree, with its Simple protocol, the one NCCL picks for large
// calls (the gradient all-reduce of a billion-parameter model, FSDP's gathers of its blocks:
// hundreds of megabytes and more). With S the bytes of one call's buffer (the all-gather's
// output, the reduce-scatter's input, the all-reduce's buffer), P ranks, g of them a node, n
// nodes and B the ring's bus bandwidth (min(IntraBW, g·InterBW) on more than one node: each
// crossing edge has its node's whole network; IntraBW on one):
//
//	ring all-gather, reduce-scatter   ℓ + (P−1)/P · S / B
//	  ℓ = 8.4 µs + (P−n)·a + (n−1)·14 µs
//	ring all-reduce                   ℓ + 2(P−1)/P · S / B
//	  ℓ = (8.4 µs + 2(P−n)·a + 2(n−1)·14 µs) × (1.4 on more than one node)
//	tree all-reduce                   ℓ + 2 · S / (0.92 · c(S) · B)
//	  ℓ = 8.4 µs + 2·((g−1)·4 µs + ⌊log2 n⌋·14 µs)
//
// a = 3.4 µs, a ring step over NVLink (NCCL raises it to 3 × its network post overhead once
// the ring leaves the node: 3 µs for the 1 µs it assumes on Intel hosts, so still 3.4 µs; on
// AMD hosts, 2 µs, it would be 6 µs). The ring's latency is its path's: a chunk travels P−1
// hops (2(P−1) for the all-reduce), n−1 of them (2(n−1)) between nodes at the network's
// 14 µs, the rest over NVLink; the 1.4 is NCCL's "plateau effect of ring" for all-reduces
// between nodes on Ampere and later. The tree is NCCL's double binary tree between nodes with
// a chain inside each node: up the chain and the tree and back down, 2·((g−1) NVLink hops of
// 4 µs + ⌊log2 n⌋ network hops). NCCL prices a tree all-reduce at half its bus bandwidth
// (2·S per call: every rank, interior in one of the two trees, sends its half up once and
// down to two children), with the bus bandwidth 0.92 of the ring's and treeCorrection's c(S)
// for calls of 64 B to 512 MB. 8.4 µs is a call's base latency (ring and tree). On one node
// the ring wins every size (lower latency per hop and more bandwidth); between nodes the tree
// wins small calls (its latency grows with log2 n, the ring's with P) and the ring large ones.
//
// Left out: the LL and LL128 protocols (lower latency per hop, 0.5 and 0.92 of the bandwidth
// with per-channel caps: NCCL runs calls up to some tens of megabytes with them, so for such
// calls plan's latency is an upper bound; at the sizes above Simple wins), NVLS and CollNet
// (NVLink SHARP, in-network reduction), PAT (all-gathers and reduce-scatters at one GPU a
// node), the per-channel bandwidth caps (which need the channel count NCCL's topology search
// finds) and the tree's 0.85 for unbalanced NIC placement.
//
// The calls of a step: package train all-reduces the whole gradient in one call after the
// micro-batches (train.go: grad.allreduce), so the data-parallel all-reduce is one call of
// N·e bytes (N parameters, e the bytes of the compute precision, as CommPlan counts them).
// FSDP (parallel/fsdp.go) gathers each unit (model.Layout.Units: the embedding, the L
// blocks, the final norm and head) before it computes, in the forward all L+2 and in the
// backward L+1 (the embedding's backward needs no weights), and reduce-scatters each unit's
// gradient, L+2: 3L+5 ring calls per micro-batch, each paying ℓ.
//
// The bytes CommPlan counts stay the ring's 2(P−1)/P·S per rank when the tree is picked: a
// double binary tree sends 2(P−1)/P·S per rank on average too (every rank but a root sends
// each half up once and every rank but a leaf down to its children); what differs is how
// evenly, which the bus bandwidth above prices.

import (
	"fmt"
	"math"
	"math/bits"
)

// NCCL's tuning model (src/graph/tuning.cc, NCCL v2.23.4-1), the Simple protocol, in seconds.
const (
	ncclBaseLatency = 8.4e-6 // baseLat of Tree and Ring: a call's fixed cost
	ncclRingNVLink  = 3.4e-6 // hwLat NVLINK Ring: one ring step inside a node
	ncclTreeNVLink  = 4.0e-6 // hwLat NVLINK Tree: one hop of the chain inside a node
	ncclNetLatency  = 14e-6  // hwLat NET Ring and Tree: one step between nodes (the IB plugin's latencyInter is 0)
	ncclNetOverhead = 3e-6   // getNetOverhead's default 1 µs × 3 under Simple: the floor of a multi-node ring's NVLink step
	ncclRingPlateau = 1.4    // the ring all-reduce's latency factor between nodes (compute capability ≥ 8.0)
	ncclTreeBusBW   = 0.92   // the tree all-reduce's bus bandwidth against the ring's
)

// ncclTreeCorrection is NCCL's treeCorrectionFactor for the Simple protocol: the tree
// all-reduce's bandwidth factor for calls of 64·2^i bytes up to the next power of two, i =
// 0…22 (64 B to 512 MB); outside that range 1.
var ncclTreeCorrection = [23]float64{.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9}

// treeCorrection is ncclTreeCorrection for a call of S bytes.
func treeCorrection(S float64) float64 {
	if S < 64 || S >= 64<<len(ncclTreeCorrection) {
		return 1
	}
	return ncclTreeCorrection[bits.Len64(uint64(S)>>6)-1]
}

// CollectiveTime is the time of one kind of the world's collectives in a step: the algorithm
// that runs them, the calls and the two terms of their time.
type CollectiveTime struct {
	// Algorithm is NCCL's "ring" or "tree" on GPUs ("ring" for every FSDP call), "linear" for
	// Open MPI's direct exchanges on CPU ranks; "" when there are none.
	Algorithm string  `json:"algorithm,omitempty"`
	Calls     int     `json:"calls"`                // calls per step
	CallBytes float64 `json:"call_bytes,omitempty"` // the all-reduce's buffer (the gradient); 0 for FSDP
	Bandwidth float64 `json:"bandwidth_s"`          // seconds of the bytes over the link, all calls
	Latency   float64 `json:"latency_s"`            // seconds of the calls' latency, all calls
	Seconds   float64 `json:"seconds"`              // Bandwidth + Latency
	Ring      float64 `json:"ring_s,omitempty"`     // the all-reduce on GPUs: the ring's predicted seconds
	Tree      float64 `json:"tree_s,omitempty"`     // and the tree's; Algorithm is the faster
}

// worldNet is how the world's collectives run on a cluster: the fraction of a rank's
// collective bytes that crosses between nodes and the seconds one of them takes at the
// collectives' bandwidth (the ring's bus bandwidth on GPUs), with the shape the latency needs.
type worldNet struct {
	cross, secPerByte float64
	cpu               bool
	world, g, nodes   int // ranks, ranks a node, nodes
}

// worldCollectives prices the world's collectives (the gradient all-reduce, FSDP's
// all-gathers and reduce-scatters) on cl with world ranks placed on its nodes in order: the
// fraction of a rank's collective bytes that crosses between nodes, and the seconds one of
// its bytes takes.
//
// On GPUs the collectives are NCCL's (the file comment above; ringLatency, allReduce): a ring
// on more than one node has Nodes of its world edges cross, each the only crossing edge of
// its node in its direction, so it has the node's whole network (GPUsPerNode × InterBW) and
// the ring runs at the slower of that and IntraBW.
//
// On ranks of the CPU backend they are Open MPI's (parallel/transport/mpi.go): AllReduce is
// MPI_Ialltoallv then MPI_Iallgatherv, ReduceScatter MPI_Ialltoall, AllGather
// MPI_Iallgather; non-blocking collectives are served by coll/libnbc, whose schedules for
// these (Open MPI 4.1) are linear: each rank sends its chunk straight to each of the
// world − 1 others (not the tuned component's MPI_Allreduce decision, which distflash does
// not call). So (world − g)/(world − 1) of a rank's bytes cross, g its node's ranks, over
// the node's network shared by its g ranks (InterBW each), and the rest stay inside the
// node at IntraBW; the two classes are priced one after the other, as the attention bytes,
// with no latency. On 2 hosts × 2 ranks that is 2/3 of the 2·(P−1)/P × gradient bytes
// across, where a ring would send 1/2.
func worldCollectives(cl Cluster, world int) worldNet {
	g := max(1, min(cl.GPUsPerNode, world))
	w := worldNet{world: world, g: g, nodes: (world + g - 1) / g}
	if cl.GPU.Name == cpuType.Name {
		w.cpu = true
		if world > g {
			w.cross = float64(world-g) / float64(world-1)
		}
		w.secPerByte = w.cross/cl.GPU.InterBW + (1-w.cross)/cl.GPU.IntraBW
		return w
	}
	if w.nodes == 1 {
		w.secPerByte = 1 / cl.GPU.IntraBW
		return w
	}
	w.cross = float64(w.nodes) / float64(world)
	w.secPerByte = 1 / min(cl.GPU.IntraBW, float64(g)*cl.GPU.InterBW)
	return w
}

// ringLatency is the latency of one NCCL ring call: an all-reduce's (2(P−1) steps) or an
// all-gather's or reduce-scatter's (P−1 steps).
func (w worldNet) ringLatency(allReduce bool) float64 {
	steps, inter := w.world-1, w.nodes-1
	if allReduce {
		steps, inter = 2*steps, 2*inter
	}
	hop := ncclRingNVLink
	if w.nodes > 1 {
		hop = max(hop, ncclNetOverhead)
	}
	lat := ncclBaseLatency + float64(steps-inter)*hop + float64(inter)*ncclNetLatency
	if allReduce && w.nodes > 1 {
		lat *= ncclRingPlateau
	}
	return lat
}

// treeLatency is the latency of one NCCL tree all-reduce: up and down the chain inside a
// node and the double binary tree between nodes.
func (w worldNet) treeLatency() float64 {
	return ncclBaseLatency + 2*(float64(w.g-1)*ncclTreeNVLink+math.Floor(math.Log2(float64(w.nodes)))*ncclNetLatency)
}

// gatherScatter prices calls all-gathers and reduce-scatters that send bytes per rank in
// all: NCCL's ring on GPUs, Open MPI's linear exchanges (no latency) on CPU ranks.
func (w worldNet) gatherScatter(bytes float64, calls int) CollectiveTime {
	ct := CollectiveTime{Algorithm: "ring", Calls: calls, Bandwidth: bytes * w.secPerByte}
	if w.cpu {
		ct.Algorithm = "linear"
	} else {
		ct.Latency = float64(calls) * w.ringLatency(false)
	}
	ct.Seconds = ct.Bandwidth + ct.Latency
	return ct
}

// allReduce prices one all-reduce of a buffer of S bytes, which sends bytes per rank
// (2(P−1)/P·S): on GPUs NCCL's ring or tree, whichever it predicts faster; on CPU ranks Open
// MPI's linear exchanges (no latency).
func (w worldNet) allReduce(S, bytes float64) CollectiveTime {
	ct := CollectiveTime{Algorithm: "linear", Calls: 1, CallBytes: S, Bandwidth: bytes * w.secPerByte}
	if w.cpu {
		ct.Seconds = ct.Bandwidth
		return ct
	}
	ringLat := w.ringLatency(true)
	ct.Ring = ringLat + ct.Bandwidth
	treeBW := 2 * S * w.secPerByte / (ncclTreeBusBW * treeCorrection(S))
	treeLat := w.treeLatency()
	ct.Tree = treeLat + treeBW
	ct.Algorithm, ct.Latency = "ring", ringLat
	if ct.Tree <= ct.Ring { // NCCL tries the tree first and keeps it at equal times
		ct.Algorithm, ct.Bandwidth, ct.Latency = "tree", treeBW, treeLat
	}
	ct.Seconds = ct.Bandwidth + ct.Latency
	return ct
}

// fsdpCalls is the FSDP collectives of one micro-batch for a model of L blocks: the forward
// gathers the L+2 units, the backward L+1 of them (not the embedding), and every unit's
// gradient is reduce-scattered.
func fsdpCalls(L int) int { return (L + 2) + (L + 1) + (L + 2) }

// describe writes how a kind of collective was priced, for WriteDetail.
func (ct CollectiveTime) describe() string {
	switch {
	case ct.Algorithm == "linear":
		return fmt.Sprintf("Open MPI's linear exchanges, %s", calls(ct.Calls))
	case ct.Ring > 0:
		return fmt.Sprintf("NCCL %s, the faster for one all-reduce of %s: ring %s, tree %s; latency %s",
			ct.Algorithm, size(ct.CallBytes), duration(ct.Ring), duration(ct.Tree), duration(ct.Latency))
	}
	return fmt.Sprintf("NCCL %s, %s, latency %s", ct.Algorithm, calls(ct.Calls), duration(ct.Latency))
}

// calls writes a count of calls.
func calls(n int) string {
	if n == 1 {
		return "1 call"
	}
	return fmt.Sprintf("%d calls", n)
}

// size writes bytes in GB, or MB below a GB (10^9, 10^6).
func size(b float64) string {
	if b < 1e9 {
		return fmt.Sprintf("%.3g MB", b/1e6)
	}
	return gb(b)
}

// duration writes seconds in s, ms or µs, three significant digits.
func duration(s float64) string {
	switch {
	case s >= 1:
		return fmt.Sprintf("%.3g s", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.3g ms", s*1e3)
	}
	return fmt.Sprintf("%.3g µs", s*1e6)
}
