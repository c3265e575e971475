package train

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"distflash/ckpt"
	"distflash/config"
	"distflash/data"
	"distflash/kernels"
	"distflash/model"
	"distflash/optim"
	"distflash/plan"
	"distflash/sysmem"
)

// trainState is the part of a checkpoint that is not a tensor (ckpt.Manifest.State): with
// the weights and AdamW moments it is everything a resumed run needs to continue exactly as
// the uninterrupted one would have.
type trainState struct {
	Step    int              `json:"step"`      // optimizer steps done (the LR schedule's position)
	Tokens  int64            `json:"tokens"`    // tokens trained on so far
	Elapsed float64          `json:"elapsed_s"` // training time so far
	Loader  data.LoaderState `json:"loader"`    // the data order's position (one source)
	// Mixture is the data order's position of a mixture of [[data.sources]], in Loader's place.
	Mixture  *data.MixtureState `json:"mixture,omitempty"`
	AdamStep int64              `json:"adam_step"` // updates applied (skipped fp16 steps are not)
	Scaler   *optim.LossScaler  `json:"loss_scaler,omitempty"`
	Spikes   *spikeWatch        `json:"spikes,omitempty"` // the recent steps spike detection compares with
	// Recompute is the checkpoint policy, MLP tile and loss chunk the run ran: its choice of
	// what the config left to the device (plan.Choose), which a resumed run keeps where it
	// still fits (resumeChoice). Absent in checkpoints of older versions.
	Recompute *plan.Candidate `json:"recompute,omitempty"`
}

// StateTensors are the checkpointed flat tensors: the weights and AdamW's two moments, in model Layout order.
var StateTensors = []string{"params", "adam.m", "adam.v"}

// stateBufs are the buffers behind stateTensors on rank r (all parameters or its FSDP chunks).
func (r *rank) stateBufs() []kernels.Buf { return []kernels.Buf{r.Params, r.opt.M, r.opt.V} }

// isLeader reports whether this process runs rank 0, which writes the run's shared files.
func (t *trainer) isLeader() bool { return t.ranks[0].ID == 0 }

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
	// hostOf is b's values in host memory: b itself on the CPU backend (the state does not
	// change while it is saved, so the save needs no copy of it), else a copy downloaded
	hostOf := func(b kernels.Buf) []float32 {
		if kernels.IsHost(b) {
			return kernels.Host(b)
		}
		host := make([]float32, b.Len())
		r.Backend.Download(host, b)
		return host
	}
	var out []ckpt.Piece
	for i, b := range r.stateBufs() {
		name := StateTensors[i]
		if r.FSDP == nil { // replicated: only this rank's share leaves the device
			lo, hi := ckpt.Chunk(int64(b.Len()), t.size(), r.ID)
			out = append(out, ckpt.Piece{Tensor: name, Off: lo, Data: hostOf(r.Backend.Slice(b, int(lo), int(hi-lo)))})
			continue
		}
		host := hostOf(b)
		for _, g := range r.FSDP.Owned() {
			out = append(out, ckpt.Piece{Tensor: name, Off: int64(g.Off), Data: host[g.Local : g.Local+g.N]})
		}
	}
	return out
}

// save writes a checkpoint of the state after step optimizer steps: every rank its shard,
// then rank 0 the manifest, and only then does `latest` move (ckpt.Commit). prev is the
// newest earlier checkpoint ("" if none), named when a full disk stops the save.
func (t *trainer) save(st trainState, prev string, stderr io.Writer) (string, error) {
	cfgJSON, err := json.Marshal(t.cfg)
	if err != nil {
		return "", fmt.Errorf("checkpoint: encode config: %w", err)
	}
	if ms := t.loader.State(); len(t.cfg.Data.Sources) > 0 {
		st.Mixture = &ms
	} else {
		st.Loader = ms.Sources[0].Loader
	}
	st.AdamStep = t.ranks[0].opt.Step
	st.Spikes = t.spikes
	st.Recompute = &t.choice.Candidate
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
		r.Comm.Barrier() // the directory exists
		if _, err := ckpt.WriteShard(tmp, r.ID, t.pieces(r), t.shardOptions()); err != nil {
			return err
		}
		r.Comm.Barrier() // every shard is written
		if r.ID != 0 {
			return nil
		}
		n := int64(r.Model.Layout.Size)
		m := ckpt.Manifest{Step: st.Step, Config: cfgJSON, State: stateJSON, Run: t.id,
			World: ckpt.WorldLayout{Size: t.size(), SequenceParallel: t.w.Dims.SP, DataParallel: t.w.Dims.DP(), FSDP: t.cfg.Parallelism.FSDP}}
		for _, name := range StateTensors {
			m.Tensors = append(m.Tensors, ckpt.TensorInfo{Name: name, Len: n, DType: "f32"})
		}
		p, err := ckpt.Commit(runDir, tmp, m, t.cfg.Checkpoint.Keep)
		final = p
		return err
	})
	if err != nil {
		if t.isLeader() && final == "" {
			_ = os.RemoveAll(tmp) // the save did not complete: leave no partial step behind
		}
		if errors.Is(err, syscall.ENOSPC) {
			return "", t.diskFull(st.Step, prev, err)
		}
		return "", fmt.Errorf("checkpoint at step %d: %w", st.Step, err)
	}
	return final, nil
}

// diskFull explains a save that ran out of space: what a checkpoint needs, what is free, and
// what to do. The partial save is already removed.
func (t *trainer) diskFull(step int, prev string, err error) error {
	dir := t.runDir()
	raw, _ := checkpointSize(dir, t.ranks[0].Model.Layout.Size)
	need := fmt.Sprintf("up to %.1f MB (the fp32 weights and AdamW moments before compression)", float64(raw)/1e6)
	if prev != "" {
		if _, stored := checkpointSize(filepath.Join(dir, filepath.Base(prev)), t.ranks[0].Model.Layout.Size); stored > 0 {
			need = fmt.Sprintf("about %.1f MB (the last one took %.1f MB)", float64(stored)/1e6, float64(stored)/1e6)
		}
	}
	free := "an unknown amount is"
	if b, ok := sysmem.DiskFree(dir); ok {
		free = fmt.Sprintf("%.1f MB are", float64(b)/1e6)
	}
	last := "no earlier checkpoint exists"
	if prev != "" {
		last = "the last good checkpoint, " + filepath.Base(prev) + ", is untouched"
	}
	return fmt.Errorf("checkpoint at step %d: disk full in %s: a checkpoint needs %s and %s free; the partial save was removed and %s. "+
		"Free space, or keep fewer checkpoints (checkpoint.keep = %d now), then continue with --resume auto: %w",
		step, dir, need, free, last, t.cfg.Checkpoint.Keep, err)
}

// checkpointSize is the bytes of the state tensors as fp32 and of the shard files in dir.
func checkpointSize(dir string, elems int) (raw, stored int64) {
	raw = int64(len(StateTensors)) * int64(elems) * 4
	files, _ := filepath.Glob(filepath.Join(dir, "rank-*.zst"))
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			stored += fi.Size()
		}
	}
	return raw, stored
}

// restore loads the checkpoint spec names ("auto": the newest intact one of run, or a path)
// into every rank and returns the saved state; ok is false when auto finds none. Any world
// size can load any checkpoint: each rank reads the element ranges it needs. Every config key
// that differs from the checkpoint's is printed; those that cannot continue the same
// training are refused (resumeChanges).
func (t *trainer) restore(spec string, run ckpt.RunID, stderr io.Writer) (st trainState, ok bool, err error) {
	start := time.Now()
	if spec != "auto" && !filepath.IsAbs(spec) {
		// a step directory of this run may be named by its name alone (one that does not exist
		// is then refused with this run's checkpoints)
		if _, err := os.Stat(spec); err != nil {
			if _, err := os.Stat(filepath.Join(t.runDir(), spec)); err == nil || filepath.Dir(spec) == "." {
				spec = filepath.Join(t.runDir(), spec)
			}
		}
	}
	c, skipped, err := ckpt.ResolveOpenRun(t.runDir(), spec, run)
	var foreign []string
	for _, s := range skipped {
		var fe *ckpt.ForeignError
		if errors.As(s, &fe) {
			foreign = append(foreign, fe.Error())
			continue
		}
		fmt.Fprintf(stderr, "resume: skipping damaged checkpoint: %v\n", s)
	}
	if err != nil {
		return st, false, fmt.Errorf("resume: %w", err)
	}
	if c == nil {
		if len(foreign) > 0 {
			return st, false, fmt.Errorf("resume: %s holds no checkpoint of this %s:\n  %s",
				t.runDir(), run, strings.Join(foreign, "\n  "))
		}
		if moved := movedAside(t.runDir(), run); moved != "" && run.ID != "" {
			return st, false, fmt.Errorf("resume: %s holds no checkpoint of this %s: a --fresh run moved its checkpoints aside, the newest to %s; continue there with --set checkpoint.dir=%s --resume auto",
				t.runDir(), run, moved, filepath.Dir(moved))
		}
		fmt.Fprintf(stderr, "resume: no checkpoint in %s; starting from scratch\n", t.runDir())
		return st, false, nil
	}
	defer c.Close()
	cfgJSON, err := json.Marshal(t.cfg)
	if err != nil {
		return st, false, err
	}
	if err := resumeChanges(c.Dir(), c.Manifest().Config, cfgJSON, stderr); err != nil {
		return st, false, err
	}
	if err := c.CheckConfig(cfgJSON); err != nil {
		return st, false, fmt.Errorf("resume from %s: %w", c.Dir(), err)
	}
	if o := c.Manifest().Run; o.ID != "" && run.ID != "" && o.ID != run.ID {
		fmt.Fprintf(stderr, "resume: %s was saved by %s; this run continues from it as %s\n", c.Dir(), o, run)
	}
	m := c.Manifest()
	if err := json.Unmarshal(m.State, &st); err != nil {
		return st, false, fmt.Errorf("resume from %s: training state: %w", c.Dir(), err)
	}
	if err := t.restoreData(st); err != nil {
		return st, false, fmt.Errorf("resume from %s: %w", c.Dir(), err)
	}
	if t.scaler != nil && st.Scaler != nil {
		*t.scaler = *st.Scaler
	}
	if st.Spikes != nil { // a checkpoint of an older version has none: the window fills again
		t.spikes = st.Spikes
	}
	if err := t.resumeChoice(st.Recompute, stderr); err != nil {
		return st, false, fmt.Errorf("resume from %s: %w", c.Dir(), err)
	}
	// Replicated ranks all need every element: read (decompress) them once for this process.
	var whole [][]float32
	if t.ranks[0].FSDP == nil {
		for _, name := range StateTensors {
			host, err := c.ReadTensor(name)
			if err != nil {
				return st, false, fmt.Errorf("resume from %s: %w", c.Dir(), err)
			}
			whole = append(whole, host)
		}
	}
	err = t.run(func(r *rank) error {
		for i, buf := range r.stateBufs() {
			if r.FSDP == nil {
				r.Backend.Upload(buf, whole[i])
				continue
			}
			host := make([]float32, buf.Len())
			for _, g := range r.FSDP.Owned() {
				if err := c.Read(StateTensors[i], int64(g.Off), host[g.Local:g.Local+g.N]); err != nil {
					return err
				}
			}
			r.Backend.Upload(buf, host)
		}
		r.opt.Step = st.AdamStep
		r.Refresh()
		return nil
	})
	if err != nil {
		return st, false, fmt.Errorf("resume from %s: %w", c.Dir(), err)
	}
	raw, stored := checkpointSize(c.Dir(), t.ranks[0].Model.Layout.Size)
	fmt.Fprintf(stderr, "resume: step %d from %s (saved by %d ranks, now %d; %.1f MB read, %.1f MB of fp32 state, %.0f MB/s)\n",
		st.Step, c.Dir(), m.World.Size, t.size(), float64(stored)/1e6, float64(raw)/1e6, float64(raw)/1e6/time.Since(start).Seconds())
	return st, true, nil
}

// resumeChoice keeps, of what the config leaves to the device (checkpoint.activation =
// "auto", training.mlp_tile and loss_chunk -1), what the resumed run ran (prev, from its
// checkpoint; nil in older ones), where that still fits this world's memory by plan's
// estimate: the ranks' models take it (before their first forward, when they size their
// buffers) and it is said. Where it does not fit, or the memory is not known here, the new
// choice stands and it is said why. Either way the training is the same, equal up to
// floating-point rounding: what a block recomputes is what it computed (bit for bit), and
// tiles and chunks only sum the weight gradients in another order.
func (t *trainer) resumeChoice(prev *plan.Candidate, w io.Writer) error {
	ch := t.choice
	if prev == nil || len(ch.Auto) == 0 {
		return nil
	}
	want := ch.Candidate // the new choice, with the previous run's values of the keys left to the device
	for _, k := range ch.Auto {
		switch k {
		case "checkpoint.activation":
			want.Policy = prev.Policy
		case "training.mlp_tile":
			want.MLPTile = prev.MLPTile
		case "training.loss_chunk":
			want.LossChunk = prev.LossChunk
		}
	}
	if want.Policy == ch.Policy && want.MLPTile == ch.MLPTile && want.LossChunk == ch.LossChunk {
		return nil
	}
	was := fmt.Sprintf("checkpoint.activation %s, training.mlp_tile %s, training.loss_chunk %s", want.Policy, tokensOr(want.MLPTile, "whole"), tokensOr(want.LossChunk, "at once"))
	if t.memory <= 0 {
		fmt.Fprintf(w, "resume: the resumed run ran %s; this world's memory is not known, so %s (%s); the same training, equal up to floating-point rounding\n",
			was, t.choice.Policy, t.choiceLine())
		return nil
	}
	est := ch.Estimate(t.cfg, want)
	if !est.Fits {
		fmt.Fprintf(w, "resume: the resumed run ran %s, which needs %.1f GB of the %.1f GB here; so %s; the same training, equal up to floating-point rounding\n",
			was, est.Peak/1e9, ch.Budget/1e9, t.choiceLine())
		return nil
	}
	policy, err := model.ParseCheckpoint(want.Policy)
	if err != nil {
		return fmt.Errorf("the checkpoint's recompute policy: %w", err)
	}
	for _, r := range t.ranks {
		r.Model.Policy, r.Model.MLPTile, r.Model.LossChunk = policy, want.MLPTile, want.LossChunk
	}
	t.choice.Candidate = est
	fmt.Fprintf(w, "resume: %s, as the resumed run ran (%.1f GB of %.1f GB; on this memory alone the choice would be %s, %s, %s)\n",
		was, est.Peak/1e9, ch.Budget/1e9, ch.Policy, tokensOr(ch.MLPTile, "whole"), tokensOr(ch.LossChunk, "at once"))
	return nil
}

// restoreData moves the data order to the checkpoint's position: its mixture's, or its one
// source's. A source that had run out before the checkpoint is not said to run out again.
func (t *trainer) restoreData(st trainState) error {
	if st.Mixture == nil {
		return t.loader.RestoreLoader(st.Loader)
	}
	if err := t.loader.Restore(*st.Mixture); err != nil {
		return err
	}
	t.ranOut = make([]bool, len(t.loader.Names()))
	for i, e := range t.loader.Epochs() {
		t.ranOut[i] = e > 0
	}
	return nil
}

// tokensOr writes a number of tokens, or what 0 means.
func tokensOr(n int, zero string) string {
	if n == 0 {
		return zero
	}
	return fmt.Sprintf("%d tokens", n)
}

// How a config key that differs from a resumed checkpoint's affects the training.
const (
	changeExact    = iota // the continuation is the run that never stopped, bit for bit
	changeRounding        // the same training, computed in another order: equal up to fp rounding
	changeTraining        // accepted, but the continuation is not the same run (warned)
	changeRefused         // the checkpoint cannot continue: its data position or weights mean something else
)

// resumeKeys sorts config keys (a section, or section.key; the longest match wins) by what a
// change of them does to a resumed run. Keys not listed are changeTraining.
var resumeKeys = map[string]int{
	"model":                                changeRefused, // the weights' shapes and what they compute
	"model.init":                           changeExact,   // draws a fresh model's weights; a checkpoint's replace them
	"data.tokenizer":                       changeRefused, // what the token ids mean
	"data.seq_len":                         changeRefused, // the saved data position counts windows of seq_len
	"data.train":                           changeRefused,
	"data.format":                          changeRefused,
	"data.include":                         changeRefused,
	"data.max_bytes":                       changeRefused,
	"data.text_key":                        changeRefused,
	"data.sources":                         changeRefused, // each source's position counts its windows; the draws, its weight
	"data.sources.eval":                    changeExact,
	"data.sources.eval_format":             changeExact,
	"run.seed":                             changeRefused, // the data order
	"run.name":                             changeExact,
	"run.output_dir":                       changeExact,
	"run.log_interval":                     changeExact,
	"run.tensorboard":                      changeExact,
	"device.peak_tflops":                   changeExact,
	"path":                                 changeExact, // the config file's own path
	"checkpoint.interval":                  changeExact,
	"checkpoint.keep":                      changeExact,
	"checkpoint.dir":                       changeExact,
	"checkpoint.compression_level":         changeExact,
	"checkpoint.activation":                changeExact, // recomputation gives bit-identical gradients
	"parallelism.overlap_comm":             changeExact,
	"eval":                                 changeExact,
	"data.eval":                            changeExact,
	"training.loss_chunk":                  changeRounding, // the head's weight gradient summed in chunks
	"training.mlp_tile":                    changeRounding, // the MLP's weight gradients summed in tiles
	"parallelism.sequence_parallel_degree": changeRounding,
	"parallelism.attention":                changeRounding,
	"parallelism.ulysses_degree":           changeRounding,
	"parallelism.fsdp":                     changeRounding,
	"parallelism.backend":                  changeRounding,
	"device":                               changeRounding,
}

// changeOf returns how a change of key affects a resumed run.
func changeOf(key string) int {
	// An array's element ("data.sources.1.weight") is judged as the array's key.
	parts := strings.Split(key, ".")
	parts = slices.DeleteFunc(parts, func(p string) bool {
		_, err := strconv.Atoi(p)
		return err == nil
	})
	for k := strings.Join(parts, "."); ; {
		if c, ok := resumeKeys[k]; ok {
			return c
		}
		i := strings.LastIndexByte(k, '.')
		if i < 0 {
			return changeTraining
		}
		k = k[:i]
	}
}

// resumeChanges prints every key of current (the resumed run's config, JSON) whose value
// differs from saved (the checkpoint's), old → new, each with what it does to the
// continuation, and refuses the changes that cannot continue the same training.
// parallelism.world_size is judged by the number of data-parallel replicas it gives: more or
// fewer replicas change the global batch.
func resumeChanges(dir string, saved, current json.RawMessage, w io.Writer) error {
	saved = withDefaults(saved)
	diffs, err := ckpt.DiffConfig(saved, current)
	if err != nil {
		return fmt.Errorf("resume from %s: %w", dir, err)
	}
	// The two configs, decoded once, for the keys judged by what they give together.
	var was, now config.Config
	_ = json.Unmarshal(saved, &was)
	_ = json.Unmarshal(current, &now)
	replicas := func(c config.Config) int {
		d, err := c.Parallelism.Dims()
		if err != nil {
			return 0
		}
		return d.DP()
	}
	var refused []string
	for _, d := range diffs {
		class := changeOf(d.Key)
		dp := d.Key == "parallelism.world_size" || d.Key == "parallelism.sequence_parallel_degree"
		if dp {
			class = changeRounding
			if replicas(was) != replicas(now) {
				class = changeTraining
			}
		}
		if d.Key == "training.steps" && was.Training.LRSchedule == "constant" && now.Training.LRSchedule == "constant" {
			class = changeExact // the learning rate does not depend on the run's length
		}
		var note string
		switch class {
		case changeExact:
			note = "no effect on the training"
		case changeRounding:
			note = "the same training, equal up to floating-point rounding"
		case changeTraining:
			note = "WARNING: the continuation is not the same run as one that never stopped"
			switch {
			case dp:
				note += fmt.Sprintf(" (%d data-parallel replicas, was %d: the global batch changes)", replicas(now), replicas(was))
			case d.Key == "training.steps":
				note += " (the learning-rate schedule is stretched to the new length)"
			}
		case changeRefused:
			note = "refused"
			refused = append(refused, d.Key)
		}
		fmt.Fprintf(w, "resume: %s: %s → %s (%s)\n", d.Key, shown(d.Saved), shown(d.Current), note)
	}
	if len(refused) > 0 {
		return fmt.Errorf("resume from %s: %s changed: the checkpoint's weights or data position mean something else under the new value; "+
			"restore the checkpoint's value, or start a new run from its weights: --init-from %s --set run.name=OTHER", dir, strings.Join(refused, ", "), dir)
	}
	return nil
}

// withDefaults returns saved (a checkpoint's config, JSON) with every key it lacks set to its
// built-in default: a key added to distflash after the checkpoint was written took, for that
// run, the behaviour its default gives, so resuming with the default is no change. saved is
// returned as it is when it is not a JSON object.
func withDefaults(saved json.RawMessage) json.RawMessage {
	var have, def map[string]any
	d, err := json.Marshal(config.Default())
	if err != nil || decodeNumbers(saved, &have) != nil || decodeNumbers(d, &def) != nil || have == nil {
		return saved
	}
	fillAbsent(have, def)
	out, err := json.Marshal(have)
	if err != nil {
		return saved
	}
	return out
}

// decodeNumbers decodes b into v keeping numbers as written (json.Number), so a seed past 2^53
// comes back unchanged.
func decodeNumbers(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return dec.Decode(v)
}

// fillAbsent sets every key of def that have lacks, at any depth of nested objects.
func fillAbsent(have, def map[string]any) {
	for k, dv := range def {
		hv, ok := have[k]
		if !ok {
			have[k] = dv
			continue
		}
		hm, hok := hv.(map[string]any)
		dm, dok := dv.(map[string]any)
		if hok && dok {
			fillAbsent(hm, dm)
		}
	}
}

// shown renders a ckpt.ConfigDiff value for a message.
func shown(v string) string {
	if v == "" {
		return "(absent)"
	}
	return v
}

// shardOptions are how each rank writes its shard: the checkpoint's compression level, and a
// share of ckpt.ProcessWorkers compressing workers (no more than the cores), so that the
// process's ranks, which write at once, hold what plan's memory estimate counts for the
// writer and no more.
func (t *trainer) shardOptions() ckpt.Options {
	workers := max(1, min(runtime.GOMAXPROCS(0), ckpt.ProcessWorkers)/t.w.LocalRanks())
	return ckpt.Options{Level: t.cfg.Checkpoint.CompressionLevel, Workers: workers}
}
