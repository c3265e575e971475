package train

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"distflash/config"
	"distflash/kernels"
)

// TestProfileOpsTable runs training steps with --profile's window at steps 2–4 as the session's
// loop drives it (begin, step, end; stop at the end), the per-op clock a fake, and checks:
// nothing is timed before the window or after it, the bracketing is gone afterwards (model,
// optimizer, weights' copy, Comm), the window's three steps are in ops.txt and ops.json with
// the optimizer, the collectives and, under FSDP on 2 ranks, the gathers, and every mark is one
// of the table's ops or a step's first or last.
func TestProfileOpsTable(t *testing.T) {
	for _, sets := range [][]string{
		{"checkpoint.activation=attn_output", "training.mixed_precision=bf16"},
		{"parallelism.world_size=2", "parallelism.sequence_parallel_degree=2", "parallelism.fsdp=true"},
	} {
		t.Run(strings.Join(sets, " "), func(t *testing.T) {
			const steps = 5
			cfg, err := config.Load("../configs/tiny.toml", append([]string{"data.max_bytes=1048576", "data.batch_size=2",
				"training.steps=5", "run.output_dir=" + t.TempDir()}, sets...))
			if err != nil {
				t.Fatal(err)
			}
			tr, err := newTrainer(cfg, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			r0 := tr.ranks[0]
			comm := r0.Comm
			clock := kernels.NewTickTimer(1e-3)
			dir := filepath.Join(t.TempDir(), "prof")
			p := &profiler{dir: dir, from: 2, to: 4, rank: r0, timer: clock, ceil: &kernels.Ceilings{BytesPerSec: 1e9, FLOPsPerSec: 1e12, Source: "test"}}
			marks := map[int]int{} // step → marks by its update
			tr.beforeUpdate = func(step int, r *rank) {
				if r == r0 {
					marks[step+1] = clock.Marked()
				}
			}
			for s := 0; s < steps; s++ {
				if err := p.begin(s+1, io.Discard); err != nil {
					t.Fatal(err)
				}
				if _, err := tr.step(s); err != nil {
					t.Fatal(err)
				}
				p.end(s+1, io.Discard)
			}
			p.stop(io.Discard)
			if marks[1] != 0 || marks[5] != clock.Marked() || marks[2] == 0 {
				t.Errorf("marks by step: %v, %d in all: want none before step 2 and none after step 4", marks, clock.Marked())
			}
			if r0.Model.Ops != nil || r0.opt.Ops != nil || (r0.Cast != nil && r0.Cast.Ops != nil) || r0.Comm != comm {
				t.Errorf("still bracketed after the window")
			}
			for _, f := range []string{"cpu.pprof", "heap.pprof", "ops.txt"} {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					t.Error(err)
				}
			}
			b, err := os.ReadFile(filepath.Join(dir, "ops.json"))
			if err != nil {
				t.Fatal(err)
			}
			var tab kernels.OpTable
			if err := json.Unmarshal(b, &tab); err != nil {
				t.Fatal(err)
			}
			rows := map[string]kernels.OpRow{}
			calls := 0.0
			for _, r := range tab.Rows {
				rows[r.Op+" "+r.Phase] = r
				calls += r.Calls
			}
			if tab.Steps != 3 || clock.Marked() != 3*(2+2*int(calls)) {
				t.Errorf("%d steps, %d marks for %v ops a step", tab.Steps, clock.Marked(), calls)
			}
			params := r0.Params.Len()
			opt := kernels.AdamWCost(params).Bytes
			if r0.Half() != nil { // the update writes the 16-bit copy too (optim.AdamW.UpdateHalf)
				opt += 2 * int64(params)
			}
			if o := rows["optimizer step"]; o.Calls != 1 || o.Bytes != float64(opt) {
				t.Errorf("optimizer: %+v, want one call over %d parameters", o, params)
			}
			// the step's statistics gathered (and, with several ranks, the stop flag's check):
			// on one rank nothing crosses between ranks, so no bytes, no floor and no ratio (in
			// ops.json, no "ratio" at all)
			if c := rows["comm step"]; c.Calls < 1 || (c.Bytes > 0) != (comm.Size() > 1) || (c.Ratio > 0) != (comm.Size() > 1) {
				t.Errorf("collectives on %d ranks: %+v", comm.Size(), c)
			}
			var raw struct{ Ops []map[string]any }
			if err := json.Unmarshal(b, &raw); err != nil {
				t.Fatal(err)
			}
			for _, r := range raw.Ops {
				if _, ok := r["ratio"]; r["op"] == "comm" && r["phase"] == "step" && ok != (comm.Size() > 1) {
					t.Errorf("ops.json's comm row on %d ranks: %v", comm.Size(), r)
				}
			}
			if r0.FSDP != nil {
				if rows["comm fwd"].Calls == 0 || rows["comm bwd"].Calls == 0 {
					t.Errorf("FSDP's gathers and reduce-scatters: %+v, %+v", rows["comm fwd"], rows["comm bwd"])
				}
			} else if rows["cast fwd"].Calls == 0 || (rows["cast step"].Calls == 0) != (r0.Half() != nil) {
				t.Errorf("bf16 weights' copy: widened %+v, refreshed %+v (written by the update: %v)", rows["cast fwd"], rows["cast step"], r0.Half() != nil)
			}
			qkv := "gemm.q fwd"
			if r0.Model.Precision != kernels.FP32 { // the 16-bit step's fused projection
				qkv = "gemm.qkv fwd"
			}
			for _, k := range []string{qkv, "gemm.head bwd", "attention bwd", "loss fwd", "swiglu bwd"} {
				if rows[k].Calls == 0 {
					t.Errorf("no %s", k)
				}
			}
			txt, err := os.ReadFile(filepath.Join(dir, "ops.txt"))
			if err != nil || !strings.HasPrefix(string(txt), "per-op profile of 3 steps on cpu") {
				t.Errorf("ops.txt: %q, %v", txt, err)
			}
		})
	}
}
