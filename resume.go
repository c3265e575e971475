package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"distflash/ckpt"
	"distflash/data"
	"distflash/kernels"
	"distflash/optim"
)

// trainState is the part of a checkpoint that is not a tensor (ckpt.Manifest.State): with
// the weights and AdamW moments it is everything a resumed run needs to continue exactly as
// the uninterrupted one would have.
type trainState struct {
	Step     int               `json:"step"`      // optimizer steps done (the LR schedule's position)
	Tokens   int64             `json:"tokens"`    // tokens trained on so far
	Elapsed  float64           `json:"elapsed_s"` // training time so far
	Loader   data.LoaderState  `json:"loader"`    // the data order's position
	AdamStep int64             `json:"adam_step"` // updates applied (skipped fp16 steps are not)
	Scaler   *optim.LossScaler `json:"loss_scaler,omitempty"`
}

// Checkpointed flat tensors: the weights and AdamW's two moments, in model Layout order.
var stateTensors = []string{"params", "adam.m", "adam.v"}

// stateBufs are the buffers behind stateTensors on rank r (all parameters or its FSDP chunks).
func (r *rank) stateBufs() []kernels.Buf { return []kernels.Buf{r.params, r.opt.M, r.opt.V} }

// isLeader reports whether this process runs rank 0, which writes the run's shared files.
func (t *trainer) isLeader() bool { return t.ranks[0].id == 0 }

// runDir is where the run's checkpoints and metrics go.
func (t *trainer) runDir() string {
	dir := t.cfg.Checkpoint.Dir
	if dir == "" {
		dir = filepath.Join(t.cfg.Run.OutputDir, t.cfg.Run.Name)
	}
	return dir
}

// pieces returns what rank r saves: its FSDP chunks, or (parameters being replicated) the
// r-th of size equal parts of every tensor, so that each element is written once.
func (t *trainer) pieces(r *rank) []ckpt.Piece {
	var out []ckpt.Piece
	for i, b := range r.stateBufs() {
		name := stateTensors[i]
		if r.fsdp == nil { // replicated: only this rank's share leaves the device
			lo, hi := ckpt.Chunk(int64(b.Len()), t.size, r.id)
			host := make([]float32, hi-lo)
			r.be.Download(host, r.be.Slice(b, int(lo), int(hi-lo)))
			out = append(out, ckpt.Piece{Tensor: name, Off: lo, Data: host})
			continue
		}
		host := make([]float32, b.Len())
		r.be.Download(host, b)
		for _, g := range r.fsdp.Owned() {
			out = append(out, ckpt.Piece{Tensor: name, Off: int64(g.Off), Data: host[g.Local : g.Local+g.N]})
		}
	}
	return out
}

// save writes a checkpoint of the state after step optimizer steps: every rank its shard,
// then rank 0 the manifest, and only then does `latest` move (ckpt.Commit).
func (t *trainer) save(st trainState, stderr io.Writer) (string, error) {
	cfgJSON, err := json.Marshal(t.cfg)
	if err != nil {
		return "", fmt.Errorf("checkpoint: encode config: %w", err)
	}
	st.Loader = t.loader.State()
	st.AdamStep = t.ranks[0].opt.Step
	if t.scaler != nil {
		s := *t.scaler
		st.Scaler = &s
	}
	stateJSON, err := json.Marshal(st)
	if err != nil {
		return "", fmt.Errorf("checkpoint: encode state: %w", err)
	}
	runDir := t.runDir()
	var tmp string
	if t.isLeader() {
		if tmp, err = ckpt.BeginStep(runDir, st.Step); err != nil {
			return "", err
		}
	}
	tmp = filepath.Join(runDir, ckpt.StepDir(st.Step)+".tmp") // what BeginStep made, named alike on every rank
	var final string
	err = t.run(func(r *rank) error {
		r.comm.Barrier() // the directory exists
		if _, err := ckpt.WriteShard(tmp, r.id, t.pieces(r), ckpt.Options{Level: t.cfg.Checkpoint.CompressionLevel}); err != nil {
			return err
		}
		r.comm.Barrier() // every shard is written
		if r.id != 0 {
			return nil
		}
		n := int64(r.model.Layout.Size)
		m := ckpt.Manifest{Step: st.Step, Config: cfgJSON, State: stateJSON,
			World: ckpt.WorldLayout{Size: t.size, SequenceParallel: t.cfg.Parallelism.SequenceParallelDegree,
				DataParallel: t.size / t.cfg.Parallelism.SequenceParallelDegree, FSDP: t.cfg.Parallelism.FSDP}}
		for _, name := range stateTensors {
			m.Tensors = append(m.Tensors, ckpt.TensorInfo{Name: name, Len: n, DType: "f32"})
		}
		p, err := ckpt.Commit(runDir, tmp, m, t.cfg.Checkpoint.Keep)
		final = p
		return err
	})
	if err != nil {
		return "", fmt.Errorf("checkpoint at step %d: %w", st.Step, err)
	}
	return final, nil
}

// checkpointSize is the bytes of the state tensors as fp32 and of the shard files in dir.
func checkpointSize(dir string, elems int) (raw, stored int64) {
	raw = int64(len(stateTensors)) * int64(elems) * 4
	files, _ := filepath.Glob(filepath.Join(dir, "rank-*.zst"))
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			stored += fi.Size()
		}
	}
	return raw, stored
}

// restore loads the checkpoint spec names ("auto": the newest intact one of this run, or
// a path) into every rank and returns the saved state; ok is false when auto finds none.
// Any world size can load any checkpoint: each rank reads the element ranges it needs.
func (t *trainer) restore(spec string, stderr io.Writer) (st trainState, ok bool, err error) {
	start := time.Now()
	if spec != "auto" && !filepath.IsAbs(spec) {
		// a step directory of this run may be named by its name alone
		if _, err := os.Stat(spec); err != nil {
			if _, err := os.Stat(filepath.Join(t.runDir(), spec)); err == nil {
				spec = filepath.Join(t.runDir(), spec)
			}
		}
	}
	c, skipped, err := ckpt.ResolveOpen(t.runDir(), spec)
	for _, s := range skipped {
		fmt.Fprintf(stderr, "resume: skipping damaged checkpoint: %v\n", s)
	}
	if err != nil {
		return st, false, fmt.Errorf("resume: %w", err)
	}
	if c == nil {
		fmt.Fprintf(stderr, "resume: no checkpoint in %s; starting from scratch\n", t.runDir())
		return st, false, nil
	}
	defer c.Close()
	cfgJSON, err := json.Marshal(t.cfg)
	if err != nil {
		return st, false, err
	}
	if err := c.CheckConfig(cfgJSON); err != nil {
		return st, false, fmt.Errorf("resume from %s: %w", c.Dir(), err)
	}
	m := c.Manifest()
	if err := json.Unmarshal(m.State, &st); err != nil {
		return st, false, fmt.Errorf("resume from %s: training state: %w", c.Dir(), err)
	}
	if err := t.loader.Restore(st.Loader); err != nil {
		return st, false, fmt.Errorf("resume from %s: %w", c.Dir(), err)
	}
	if t.scaler != nil && st.Scaler != nil {
		*t.scaler = *st.Scaler
	}
	// Replicated ranks all need every element: read (decompress) them once for this process.
	var whole [][]float32
	if t.ranks[0].fsdp == nil {
		for _, name := range stateTensors {
			host, err := c.ReadTensor(name)
			if err != nil {
				return st, false, fmt.Errorf("resume from %s: %w", c.Dir(), err)
			}
			whole = append(whole, host)
		}
	}
	err = t.run(func(r *rank) error {
		for i, buf := range r.stateBufs() {
			if r.fsdp == nil {
				r.be.Upload(buf, whole[i])
				continue
			}
			host := make([]float32, buf.Len())
			for _, g := range r.fsdp.Owned() {
				if err := c.Read(stateTensors[i], int64(g.Off), host[g.Local:g.Local+g.N]); err != nil {
					return err
				}
			}
			r.be.Upload(buf, host)
		}
		r.opt.Step = st.AdamStep
		if r.cast != nil {
			r.cast.Refresh()
		}
		return nil
	})
	if err != nil {
		return st, false, fmt.Errorf("resume from %s: %w", c.Dir(), err)
	}
	raw, stored := checkpointSize(c.Dir(), t.ranks[0].model.Layout.Size)
	fmt.Fprintf(stderr, "resume: step %d from %s (saved by %d ranks, now %d; %.1f MB read, %.1f MB of fp32 state, %.0f MB/s)\n",
		st.Step, c.Dir(), m.World.Size, t.size, float64(stored)/1e6, float64(raw)/1e6, float64(raw)/1e6/time.Since(start).Seconds())
	return st, true, nil
}
