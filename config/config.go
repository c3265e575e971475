// Package config is a run's configuration: the Config type, one section per concern as
// configs/*.toml write them ([run], [model], [data], [training], [parallelism],
// [checkpoint], [eval], [device]), its defaults (Default), reading a TOML file and --set
// overrides (Load, Read, Config.Set), validation whose errors name the file, the key, the
// value and what is allowed (Config.Validate), and the checks that refuse a config before
// anything is allocated (Config.Requirements, CheckModelMemory).
//
// Layer: config imports kernels, model, parallel and sysmem. Packages plan, evaluate and
// train and the command import it; it imports none of them.
package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/BurntSushi/toml"

	"distflash/data"
	"distflash/kernels"
	"distflash/model"
	"distflash/parallel"
	"distflash/sysmem"
)

// Config is a run's configuration: one TOML file (configs/*.toml) with one section per part of
// the program, every key defaulted by Default. Load reads it; Validate checks it.
type Config struct {
	Run         RunConfig         `toml:"run" json:"run"`
	Model       model.Config      `toml:"model" json:"model"`
	Data        DataConfig        `toml:"data" json:"data"`
	Training    TrainingConfig    `toml:"training" json:"training"`
	Parallelism ParallelismConfig `toml:"parallelism" json:"parallelism"`
	Checkpoint  CheckpointConfig  `toml:"checkpoint" json:"checkpoint"`
	Eval        EvalConfig        `toml:"eval" json:"eval"`
	Device      DeviceConfig      `toml:"device" json:"device"`

	// Path is the file the config was loaded from ("" for a config built in code, "built-in
	// config" for one Read from no file). Errors name it, or the --set that gave the key they
	// are about, or the built-in defaults and the overrides applied to them: Origin.
	Path string `toml:"-" json:"path,omitempty"`

	sets []string // the overrides Set applied, in order, for Origin
}

// RunConfig is the [run] section: what the run is called and where its output goes.
type RunConfig struct {
	Name        string `toml:"name" json:"name"`                 // run name; output goes to <output_dir>/<name>
	OutputDir   string `toml:"output_dir" json:"output_dir"`     // parent directory of run directories
	Seed        uint64 `toml:"seed" json:"seed"`                 // seeds initialisation and data sampling
	LogInterval int    `toml:"log_interval" json:"log_interval"` // steps between log lines without a progress bar; 0 = off
	// TensorBoard writes every step's scalars as TensorBoard event files under <run>/tb/
	// (loss, learning rate, gradient norm, tokens/s, FLOP/s, MFU, memory, eval loss).
	TensorBoard bool `toml:"tensorboard" json:"tensorboard"`
}

// DataConfig is the [data] section: the training text and how it becomes batches.
//
// One optimizer step consumes batch_size × seq_len × grad_accum_steps tokens per data-parallel
// replica; there are world_size / sequence_parallel_degree replicas, and the seq_len tokens of
// a sequence are split over the sequence_parallel_degree ranks of a replica.
type DataConfig struct {
	Train  string `toml:"train" json:"train"`   // file, directory or glob; $VARS are expanded ($GOROOT too)
	Eval   string `toml:"eval" json:"eval"`     // held-out data for the eval command; "" = none
	Format string `toml:"format" json:"format"` // text | jsonl | c4 | parquet | tokens
	// TextKey names the field that holds a document's text: the JSON member of a jsonl or c4
	// line, the column of a Parquet file; a dotted path ("meta.body") reaches a nested one.
	// "" reads as "text".
	TextKey   string   `toml:"text_key" json:"text_key,omitempty"`
	Include   []string `toml:"include" json:"include"`     // file name patterns read when train is a directory; [] = by format (data.DefaultInclude)
	MaxBytes  int64    `toml:"max_bytes" json:"max_bytes"` // bytes of text read at most; 0 = no limit
	Tokenizer string   `toml:"tokenizer" json:"tokenizer"` // tokenizer name ("byte": one token per byte)
	SeqLen    int      `toml:"seq_len" json:"seq_len"`     // tokens per sequence (global, before sequence parallelism)
	BatchSize int      `toml:"batch_size" json:"batch_size"`
	// DocumentMask packs documents into each sequence, a boundary token (the tokenizer's EOS,
	// NUL for the byte tokenizer) starting each, and masks attention to the token's own
	// document. PositionReset (needs DocumentMask) restarts RoPE positions at each document.
	DocumentMask  bool `toml:"document_mask" json:"document_mask,omitempty"`
	PositionReset bool `toml:"position_reset" json:"position_reset,omitempty"`
	// Sources, the [[data.sources]] tables, make the training data a weighted mixture of
	// several sources in place of data.train: each sequence is drawn from one source, chosen
	// by weight with the run's seed.
	Sources []SourceConfig `toml:"sources" json:"sources,omitempty"`
}

// SourceConfig is one [[data.sources]] table: a source of a mixture and its weight.
type SourceConfig struct {
	Name    string   `toml:"name" json:"name"`                   // names the source in logs and metrics; "" = the path's base name
	Path    string   `toml:"path" json:"path"`                   // file, directory or glob, as data.train
	Format  string   `toml:"format" json:"format,omitempty"`     // as data.format; "" = data.format
	TextKey string   `toml:"text_key" json:"text_key,omitempty"` // as data.text_key; "" = data.text_key
	Include []string `toml:"include" json:"include,omitempty"`   // as data.include; [] = data.include
	Weight  float64  `toml:"weight" json:"weight"`               // relative share of the sequences, > 0
	Eval    string   `toml:"eval" json:"eval,omitempty"`         // the source's held-out data; "" = none
	// EvalFormat is how Eval is read, a text format; "" = the source's format (which must then
	// be one: a source of token shards names the format of the text its hold-out is in).
	EvalFormat string `toml:"eval_format" json:"eval_format,omitempty"`
}

// TrainSources returns the training data's sources as the loader reads them: the
// [[data.sources]] tables, each key a table leaves unset taken from [data] (format, text_key,
// include), each unnamed source named after its path (SourceName); or, without them, data.train
// as the one source "train" of weight 1 (whose hold-out is data.eval, not Eval).
func (d DataConfig) TrainSources() []SourceConfig {
	if len(d.Sources) == 0 {
		return []SourceConfig{{Name: "train", Path: d.Train, Format: d.Format, TextKey: d.TextKey, Include: d.Include, Weight: 1}}
	}
	out := make([]SourceConfig, len(d.Sources))
	for i, s := range d.Sources {
		s.Format = cmp.Or(s.Format, d.Format)
		s.TextKey = cmp.Or(s.TextKey, d.TextKey)
		if len(s.Include) == 0 {
			s.Include = d.Include
		}
		s.Name = cmp.Or(s.Name, SourceName(s.Path))
		if s.Eval != "" {
			s.EvalFormat = cmp.Or(s.EvalFormat, s.Format)
		}
		out[i] = s
	}
	return out
}

// SourceName is the name of a [[data.sources]] table that gives none: the last element of its
// path with a name before any glob metacharacter, without its extensions
// ("~/data/fineweb-edu/*.parquet" is "fineweb-edu", "c4-train.*.json.gz" is "c4-train",
// "shards/code" is "code"); the path itself when no element has one.
func SourceName(path string) string {
	parts := strings.FieldsFunc(filepath.ToSlash(path), func(r rune) bool { return r == '/' })
	for i := len(parts) - 1; i >= 0; i-- {
		p := parts[i]
		if j := strings.IndexAny(p, "*?["); j >= 0 {
			p = strings.TrimRight(p[:j], ".-_")
		}
		if p == "." || p == ".." || p == "~" {
			continue
		}
		if j := strings.IndexByte(p[min(1, len(p)):], '.'); j >= 0 {
			p = p[:j+1] // a leading dot is the name's, not an extension's
		}
		if p != "" {
			return p
		}
	}
	return path
}

// HeldOut is the held-out data of the whole run in effect: data.eval, except that with
// [[data.sources]] the built-in default (the Go test suite, the default data.train's hold-out)
// is not used.
func (d DataConfig) HeldOut() string {
	if len(d.Sources) > 0 && d.Eval == Default().Data.Eval {
		return ""
	}
	return d.Eval
}

// HasHeldOut reports whether there is held-out data to evaluate: HeldOut, or a source's eval.
func (d DataConfig) HasHeldOut() bool {
	if d.HeldOut() != "" {
		return true
	}
	for _, s := range d.Sources {
		if s.Eval != "" {
			return true
		}
	}
	return false
}

// TrainingConfig is the [training] section: optimizer, learning-rate schedule and precision.
type TrainingConfig struct {
	Steps          int     `toml:"steps" json:"steps"`                       // optimizer steps
	LR             float64 `toml:"lr" json:"lr"`                             // peak learning rate
	MinLR          float64 `toml:"min_lr" json:"min_lr"`                     // final learning rate of cosine and linear decay
	WarmupSteps    int     `toml:"warmup_steps" json:"warmup_steps"`         // linear warmup steps
	LRSchedule     string  `toml:"lr_schedule" json:"lr_schedule"`           // cosine | linear | constant
	WeightDecay    float64 `toml:"weight_decay" json:"weight_decay"`         // AdamW decoupled weight decay
	Beta1          float64 `toml:"beta1" json:"beta1"`                       // AdamW first-moment decay
	Beta2          float64 `toml:"beta2" json:"beta2"`                       // AdamW second-moment decay
	Eps            float64 `toml:"eps" json:"eps"`                           // AdamW denominator epsilon
	GradClip       float64 `toml:"grad_clip" json:"grad_clip"`               // global gradient norm limit; 0 = off
	MixedPrecision string  `toml:"mixed_precision" json:"mixed_precision"`   // fp32 | bf16 | fp16
	GradAccumSteps int     `toml:"grad_accum_steps" json:"grad_accum_steps"` // micro-batches per optimizer step
	// SkipSpikes skips the update of a step whose loss spikes (train's spike detection, which
	// reports loss and gradient-norm spikes either way), as PaLM-style recipes skip such
	// batches: at most SkipSpikesMaxConsecutive steps in a row (the rest of a longer run of
	// spikes is applied) and SkipSpikesMaxTotal in all (then skipping stops).
	SkipSpikes               bool `toml:"skip_spikes" json:"skip_spikes,omitempty"`
	SkipSpikesMaxConsecutive int  `toml:"skip_spikes_max_consecutive" json:"skip_spikes_max_consecutive"`
	SkipSpikesMaxTotal       int  `toml:"skip_spikes_max_total" json:"skip_spikes_max_total"`
	// LossChunk is how many tokens go through the output head and the loss at a time, so that
	// the [tokens, vocab] logits exist one chunk at a time (model.Model.LossChunk): -1 chooses
	// by the device's memory (package plan's Choose: all at once where the step fits so, else
	// AutoLossChunk's chunks of at most 256 MiB of logits), 0 takes all at once.
	LossChunk int `toml:"loss_chunk" json:"loss_chunk"`
	// MLPTile is how many tokens the SwiGLU MLP runs at a time, in the forward and (recomputing
	// each tile's gate, up and activation) in the backward, so its [tokens, ffn] tensors exist
	// one tile at a time (model.Model.MLPTile): -1 chooses by the device's memory (package
	// plan's Choose: all at once where the step fits so, else AutoMLPTile's tiles of at most
	// 256 MiB of those tensors), 0 takes all at once.
	MLPTile int `toml:"mlp_tile" json:"mlp_tile"`
	// fp16 dynamic loss scaling: the loss is multiplied by the scale before backward; a step
	// whose gradients overflow is skipped and halves it, growth_interval clean steps double it.
	LossScaleInit           float64 `toml:"loss_scale_init" json:"loss_scale_init"`                       // starting scale (fp16)
	LossScaleGrowthInterval int     `toml:"loss_scale_growth_interval" json:"loss_scale_growth_interval"` // clean steps before the scale doubles
}

// ParallelismConfig is the [parallelism] section: how many ranks there are, how they talk and
// how attention is distributed over them.
type ParallelismConfig struct {
	Backend                string `toml:"backend" json:"backend"`                                   // inproc | mpi | nccl
	WorldSize              int    `toml:"world_size" json:"world_size"`                             // ranks in all
	SequenceParallelDegree int    `toml:"sequence_parallel_degree" json:"sequence_parallel_degree"` // ranks sharing one sequence
	Attention              string `toml:"attention" json:"attention"`                               // distflash | ring | zigzag | burst | ulysses | attn2d
	OverlapComm            bool   `toml:"overlap_comm" json:"overlap_comm"`                         // prefetch the next block while computing
	FSDP                   bool   `toml:"fsdp" json:"fsdp"`                                         // shard parameters, gradients and optimizer state
	// BalanceDocuments reorders each sequence's documents (data.document_mask) so the
	// sequence-parallel ranks get even attention work (parallel.BalanceDocuments).
	BalanceDocuments bool `toml:"balance_documents" json:"balance_documents,omitempty"`
	// UlyssesDegree, above 1, splits the sequence-parallel ranks into groups of this many
	// consecutive ranks (one host under mpirun's by-slot mapping) joined by a Ulysses
	// all-to-all, with the attention schedule between the groups (parallel/hybrid.go).
	UlyssesDegree int `toml:"ulysses_degree" json:"ulysses_degree,omitempty"`
}

// Dims are the section's parallel dimensions: world_size ranks as replicas of
// sequence_parallel_degree ranks, ulysses_degree inside them, under the attention schedule.
// A config Validate passes has valid ones; the error names the keys of one that has not.
func (p ParallelismConfig) Dims() (parallel.Dims, error) {
	d, err := parallel.NewDims(p.WorldSize, p.SequenceParallelDegree, p.UlyssesDegree, p.Attention)
	if err != nil {
		return parallel.Dims{}, fmt.Errorf("parallelism.world_size = %d, sequence_parallel_degree = %d, ulysses_degree = %d, attention = %q: %w",
			p.WorldSize, p.SequenceParallelDegree, p.UlyssesDegree, p.Attention, err)
	}
	return d, nil
}

// CheckpointConfig is the [checkpoint] section: activation checkpointing (recomputation in the
// backward pass) and the saving of model checkpoints.
type CheckpointConfig struct {
	Activation       string `toml:"activation" json:"activation"`               // auto | none | layer | attn_output (auto: the least recomputation that fits the device, package plan's Choose)
	Interval         int    `toml:"interval" json:"interval"`                   // steps between saves; 0 = only at the end
	Keep             int    `toml:"keep" json:"keep"`                           // newest checkpoints kept
	Dir              string `toml:"dir" json:"dir"`                             // "" = <output_dir>/<name>
	CompressionLevel int    `toml:"compression_level" json:"compression_level"` // zstd level, 1..22
}

// EvalConfig is the [eval] section: held-out loss.
type EvalConfig struct {
	Samples  int `toml:"samples" json:"samples"`   // sequences evaluated
	SeqLen   int `toml:"seq_len" json:"seq_len"`   // 0 = data.seq_len
	Interval int `toml:"interval" json:"interval"` // steps between evaluations during training; 0 = off
	// SampleInterval is the steps between samples of text during training (rank 0 continues
	// SamplePrompt greedily by SampleTokens tokens, printed and kept in the run's
	// samples.jsonl); 0 = off.
	SampleInterval int    `toml:"sample_interval" json:"sample_interval"`
	SamplePrompt   string `toml:"sample_prompt" json:"sample_prompt"`
	SampleTokens   int    `toml:"sample_tokens" json:"sample_tokens"`
}

// DeviceConfig is the [device] section: where the kernels run.
type DeviceConfig struct {
	Kind string `toml:"kind" json:"kind"` // cpu | cuda | cpu-device (the CPU posing as a GPU: its buffers move only through host copies, for tests of the GPU path's staging)
	// PeakTFLOPS is one device's peak, in TFLOP/s, that MFU divides by. 0: the dense bf16 peak
	// of the GPU a CUDA backend names when plan knows it (A100, H100, H200), else no MFU (a
	// CPU's peak is not known; its FLOP/s are still reported).
	PeakTFLOPS float64 `toml:"peak_tflops" json:"peak_tflops,omitempty"`
	// Attention is the path of a GPU's attention blocks: "auto" (cuDNN's fused attention for
	// each block it can compute in bf16/fp16, the own kernel for the rest, and for all of it
	// without cuDNN, said once), "cudnn" (the same, but a cuDNN that cannot be loaded is an
	// error) or "own" (the own FlashAttention kernel only). The CPU has one path.
	Attention string `toml:"attention" json:"attention,omitempty"`
	// DeterministicAttention asks a GPU's attention backward for the same bits run to run:
	// cuDNN's deterministic backward where its workspace stays within 256 MiB (it grows as
	// s_q·s_kv: 4 GiB for one 8K block of 32 heads on Hopper), the own kernel (deterministic)
	// for the other blocks. False (the default, as PyTorch's and TransformerEngine's) lets
	// cuDNN accumulate dQ with atomics. The CPU is deterministic either way.
	DeterministicAttention bool `toml:"deterministic_attention" json:"deterministic_attention,omitempty"`
}

// The allowed values of the enumerated keys, in the order error messages list them.
var (
	dataFormats        = []string{"text", "jsonl", "c4", "parquet", "tokens"}
	lrSchedules        = []string{"cosine", "linear", "constant"}
	mixedPrecisions    = []string{"fp32", "bf16", "fp16"}
	backends           = []string{"inproc", "mpi", "nccl"}
	attentions         = []string{"distflash", "ring", "zigzag", "burst", "ulysses", "attn2d"}
	deviceAttentions   = []string{"auto", "cudnn", "own"}
	activationPolicies = []string{"auto", "none", "layer", "attn_output"}
	deviceKinds        = []string{"cpu", "cuda", "cpu-device"}
)

// Default is the configuration every key falls back to: the tiny model on a byte-level
// tokenization of the Go source tree, trained on one CPU worker in fp32 (configs/tiny.toml
// writes it out).
func Default() Config {
	return Config{
		Run:   RunConfig{Name: "tiny", OutputDir: "runs", Seed: 1337, LogInterval: 10, TensorBoard: true},
		Model: model.DefaultConfig(),
		Data: DataConfig{Train: "$GOROOT/src", Eval: "$GOROOT/test", Format: "text", TextKey: "text", Include: []string{},
			MaxBytes: 8 << 20, Tokenizer: "byte", SeqLen: 128, BatchSize: 8},
		Training: TrainingConfig{Steps: 600, LR: 3e-3, MinLR: 3e-4, WarmupSteps: 30, LRSchedule: "cosine",
			WeightDecay: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, GradClip: 1.0, MixedPrecision: "fp32",
			LossScaleInit: 65536, LossScaleGrowthInterval: 2000,
			GradAccumSteps: 1, LossChunk: -1, MLPTile: -1, SkipSpikesMaxConsecutive: 4, SkipSpikesMaxTotal: 20},
		Parallelism: ParallelismConfig{Backend: "inproc", WorldSize: 1, SequenceParallelDegree: 1,
			Attention: "distflash", OverlapComm: true, FSDP: false, UlyssesDegree: 1},
		Checkpoint: CheckpointConfig{Activation: "auto", Interval: 0, Keep: 3, Dir: "", CompressionLevel: 3},
		Eval:       EvalConfig{Samples: 100, SeqLen: 0, Interval: 0, SampleInterval: 0, SamplePrompt: "\n", SampleTokens: 64},
		Device:     DeviceConfig{Kind: "cpu", Attention: "auto"},
	}
}

// Load reads the TOML file at path over Default, applies the overrides in order
// (each "section.key=value", see Set) and validates the result. An unknown key in the file is
// an error that names the key and the file and suggests the closest known key.
// A path of "" means no file: the built-in defaults with the overrides.
func Load(path string, overrides []string) (Config, error) {
	cfg, err := Read(path, overrides)
	if err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// builtinConfig is Config.Path of a config read from no file. Errors name the built-in
// defaults instead (Origin).
const builtinConfig = "built-in config"

// maxTOMLDepth is the deepest nesting of arrays and inline tables a config file may have.
const maxTOMLDepth = 32

// tomlNestingOK reports whether the arrays and inline tables of the TOML text nest at most
// maxTOMLDepth deep (brackets inside strings and comments do not count), and else the line
// where they first go deeper. The decoder's cost grows with the square of the depth (a 30 KB
// file of nested inline tables takes seconds and gigabytes), so this is checked first.
func tomlNestingOK(text []byte) (line int, ok bool) {
	depth, line := 0, 1
	for i := 0; i < len(text); i++ {
		switch c := text[i]; c {
		case '\n':
			line++
		case '#':
			for i+1 < len(text) && text[i+1] != '\n' {
				i++
			}
		case '"', '\'':
			q := string(c)
			if bytes.HasPrefix(text[i:], []byte(q+q+q)) { // multi-line string
				end := bytes.Index(text[i+3:], []byte(q+q+q))
				if end < 0 {
					return line, true // unterminated: the decoder reports it
				}
				line += bytes.Count(text[i:i+3+end], []byte("\n"))
				i += 3 + end + 2
				continue
			}
			for i++; i < len(text) && text[i] != c && text[i] != '\n'; i++ {
				if c == '"' && text[i] == '\\' {
					i++
				}
			}
			if i < len(text) && text[i] == '\n' {
				line++
			}
		case '[', '{':
			if depth++; depth > maxTOMLDepth {
				return line, false
			}
		case ']', '}':
			depth = max(depth-1, 0)
		}
	}
	return line, true
}

// Read is Load without the validation.
func Read(path string, overrides []string) (Config, error) {
	cfg := Default()
	cfg.Path = path
	if path == "" {
		cfg.Path = builtinConfig
	} else {
		text, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		if line, ok := tomlNestingOK(text); !ok {
			return Config{}, fmt.Errorf("%s: line %d: arrays or inline tables nested more than %d deep: no distflash key needs that, and the TOML decoder's time and memory grow with the square of the depth", path, line, maxTOMLDepth)
		}
		md, err := decode(string(text), &cfg)
		if err != nil {
			return Config{}, fmt.Errorf("%s%s", path, decodeError(err))
		}
		if err := unknownKeys(md.Undecoded(), path+": "); err != nil {
			return Config{}, err
		}
	}
	for _, o := range overrides {
		if err := cfg.Set(o); err != nil {
			return Config{}, err
		}
	}
	return cfg, nil
}

// Origin names where the value of key (section.key) came from, for an error about it: the
// last --set that gave it ("--set training.steps=x", after the config file's path when there
// is one), else the file's path, or without a file "the built-in defaults". Origin("") names
// the config.
func (c *Config) Origin(key string) string {
	for i := len(c.sets) - 1; i >= 0 && key != ""; i-- {
		if k := setKey(c.sets[i]); k == key || strings.HasPrefix(k, key+".") || strings.HasPrefix(key, k+".") {
			return c.withSets(c.sets[i : i+1])
		}
	}
	return c.withSets(nil)
}

// withSets is the config's path, or "the built-in defaults" without a file, then the --set
// overrides sets.
func (c *Config) withSets(sets []string) string {
	file := c.Path
	if file == builtinConfig {
		file = ""
		if len(sets) == 0 {
			file = "the built-in defaults"
		}
	}
	var b strings.Builder
	b.WriteString(file)
	for i, o := range sets {
		switch {
		case i > 0:
			b.WriteString(" ")
		case file != "":
			b.WriteString(" with ")
		}
		b.WriteString("--set " + o)
	}
	return b.String()
}

// setKey is the key of an override, section.key=value.
func setKey(override string) string {
	k, _, _ := strings.Cut(override, "=")
	return strings.TrimSpace(k)
}

// Where names where the keys msg names came from: the --set overrides of those keys (a
// sub-table's key by its table too), in the order given, after the file's path when there is
// one; else Origin(""). An error message about them starts with it.
func (c *Config) Where(msg string) string {
	named := func(key string) bool {
		for rest := msg; ; {
			i := strings.Index(rest, key)
			if i < 0 {
				return false
			}
			rest = rest[i+len(key):]
			if rest == "" || !strings.ContainsRune("abcdefghijklmnopqrstuvwxyz0123456789_.", rune(rest[0])) {
				return true
			}
		}
	}
	var sets []string
	for i, o := range c.sets {
		k := setKey(o)
		later := slices.ContainsFunc(c.sets[i+1:], func(l string) bool { return setKey(l) == k }) // the last one counts
		table := k[:max(strings.LastIndex(k, "."), 0)]
		if !later && (named(k) || strings.Count(k, ".") > 1 && named(table)) {
			sets = append(sets, o)
		}
	}
	return c.withSets(sets)
}

// prefixOrigin starts msg, a message about config keys, with Where they came from.
func (c *Config) prefixOrigin(msg string) string {
	if where := c.Where(msg); where != "" {
		return where + ": " + msg
	}
	return msg
}

// Set applies one override "section.key=value", as given to --set on the command line. The
// value is read as a TOML value (20, 3e-4, true, "x", ["*.go", "*.md"]); a value that is not
// valid TOML, or a TOML value of the wrong type for a string key, is taken as a bare string,
// so run.name=foo works. Set does not validate the result; Load does after all overrides.
func (c *Config) Set(override string) error {
	key, value, ok := strings.Cut(override, "=")
	if !ok {
		return fmt.Errorf("--set %q: want section.key=value, e.g. training.steps=20", override)
	}
	shown := override // as the error messages show it
	if strings.ContainsFunc(override, unicode.IsControl) {
		shown = strconv.Quote(override)
	}
	key, value = strings.TrimSpace(key), strings.TrimSpace(value)
	// The last dot separates the key from its table: model.rope_scaling.factor is in a sub-table.
	dot := strings.LastIndex(key, ".")
	section, name := key[:max(dot, 0)], key[dot+1:]
	if dot < 0 || !isBareKey(name) || slices.ContainsFunc(strings.Split(section, "."), func(s string) bool { return !isBareKey(s) }) {
		return fmt.Errorf("--set %s: key %q must be section.key, e.g. training.steps", shown, key)
	}
	var doc string
	if isTOMLValue(value) {
		doc = "[" + section + "]\n" + name + " = " + value + "\n"
	} else {
		doc = stringDoc(section, name, value)
	}
	next, err := c.decodeOverride(key, doc)
	if err != nil && doc != stringDoc(section, name, value) {
		// A TOML value of the wrong type (run.name=123): retry it as a string.
		if n, serr := c.decodeOverride(key, stringDoc(section, name, value)); serr == nil {
			next, err = n, nil
		}
	}
	if err != nil {
		return fmt.Errorf("--set %s: %w", shown, err)
	}
	*c = next
	c.sets = append(c.sets[:len(c.sets):len(c.sets)], override) // never into a copy's array
	return nil
}

// decodeOverride decodes doc, a TOML document that sets only key, over a copy of c.
func (c *Config) decodeOverride(key, doc string) (Config, error) {
	next := *c
	next.Data.Include = slices.Clone(c.Data.Include) // the decoder reuses a slice's backing array
	next.Data.Sources = slices.Clone(c.Data.Sources)
	for i := range next.Data.Sources {
		next.Data.Sources[i].Include = slices.Clone(next.Data.Sources[i].Include)
	}
	md, err := decode(doc, &next)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "toml: ")
		if strings.HasPrefix(msg, "line ") { // the line is one of doc's, not the user's
			if _, rest, ok := strings.Cut(msg, ": "); ok {
				msg = rest
			}
		}
		if !strings.HasPrefix(msg, key) {
			msg = key + ": " + msg
		}
		return Config{}, errors.New(msg)
	}
	if err := unknownKeys(md.Undecoded(), ""); err != nil {
		return Config{}, err
	}
	return next, nil
}

// decodeError rewrites an error of the TOML decoder, "toml: line 3 (last key "training.steps"):
// incompatible types: ...", as ":3: training.steps: incompatible types: ...", to follow a file name.
func decodeError(err error) string {
	msg := strings.TrimPrefix(err.Error(), "toml: ")
	var line int
	var rest string
	if n, _ := fmt.Sscanf(msg, "line %d", &line); n != 1 {
		return ": " + msg
	}
	_, rest, _ = strings.Cut(msg, ": ")
	where := fmt.Sprintf(":%d: ", line)
	if _, after, ok := strings.Cut(msg, "(last key "); ok {
		quoted, _, _ := strings.Cut(after, "): ")
		if key, err := strconv.Unquote(quoted); err == nil && !strings.HasPrefix(rest, key) {
			where += key + ": "
		}
	}
	return where + rest
}

// decode decodes the TOML document doc over c. It refuses a negative run.seed, which the
// decoder would otherwise wrap around into the uint64.
func decode(doc string, c *Config) (toml.MetaData, error) {
	md, err := toml.Decode(doc, c)
	if err != nil {
		return md, err
	}
	var raw struct {
		Run struct {
			Seed any `toml:"seed"`
		} `toml:"run"`
	}
	if _, err := toml.Decode(doc, &raw); err == nil {
		if n, ok := raw.Run.Seed.(int64); ok && n < 0 {
			return md, fmt.Errorf("run.seed = %d: must be >= 0", n)
		}
	}
	return md, nil
}

// isTOMLValue reports whether s is one TOML value (and nothing more).
func isTOMLValue(s string) bool {
	var m map[string]any
	if _, err := toml.Decode("v = "+s+"\n", &m); err != nil {
		return false
	}
	_, ok := m["v"]
	return ok && len(m) == 1
}

// stringDoc is the TOML document setting section.name to the string value.
func stringDoc(section, name, value string) string {
	var b bytes.Buffer
	if err := toml.NewEncoder(&b).Encode(map[string]string{name: value}); err != nil {
		panic(err) // a map of strings always encodes
	}
	return "[" + section + "]\n" + b.String()
}

// isBareKey reports whether s is a TOML bare key: ASCII letters, digits, '_' and '-'.
func isBareKey(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// unknownKeys turns the keys the decoder did not use into one error per unknown key (a table
// that is unknown as a whole is reported once), each prefixed by prefix.
func unknownKeys(undecoded []toml.Key, prefix string) error {
	var errs []error
	var reported []toml.Key
	for _, k := range undecoded {
		if slices.ContainsFunc(reported, func(r toml.Key) bool {
			return len(r) < len(k) && slices.Equal(r, k[:len(r)])
		}) {
			continue
		}
		reported = append(reported, k)
		msg := prefix + "unknown key " + k.String()
		if s := suggest(k.String()); s != "" {
			msg += " (did you mean " + s + "?)"
		}
		errs = append(errs, errors.New(msg))
	}
	return errors.Join(errs...)
}

// knownKeys lists every key of the config, dotted ("training.steps"), sections included.
func knownKeys() []string {
	var keys []string
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		f := t.Field(i)
		section := tomlName(f)
		if section == "" || f.Type.Kind() != reflect.Struct {
			continue
		}
		keys = append(keys, section)
		for j := range f.Type.NumField() {
			if name := tomlName(f.Type.Field(j)); name != "" {
				keys = append(keys, section+"."+name)
			}
		}
	}
	return keys
}

// tomlName is the TOML key of a struct field, or "" for a field TOML skips.
func tomlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	if name == "" {
		return f.Name
	}
	return name
}

// suggest returns the known key closest to an unknown one: a near spelling ("training.stepz"
// → "training.steps"), else the same key in another section ("training.seq_len" →
// "data.seq_len or eval.seq_len"), else "".
func suggest(key string) string {
	known := knownKeys()
	best, bestD := "", math.MaxInt
	for _, k := range known {
		if d := editDistance(key, k); d < bestD {
			best, bestD = k, d
		}
	}
	if bestD <= max(2, len(key)/5) {
		return best
	}
	leaf := key[strings.LastIndex(key, ".")+1:]
	var same []string
	for _, k := range known {
		if strings.Contains(k, ".") && k[strings.LastIndex(k, ".")+1:] == leaf {
			same = append(same, k)
		}
	}
	return strings.Join(same, " or ")
}

// closest returns the allowed value nearest to an unknown one, or "" when none is near.
func closest(value string, allowed []string) string {
	best, bestD := "", math.MaxInt
	for _, a := range allowed {
		if d := editDistance(strings.ToLower(value), a); d < bestD {
			best, bestD = a, d
		}
	}
	if bestD <= max(1, len(value)/3) {
		return best
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Validate resolves the model's derived fields (model.Config.Resolve) and checks every value
// and every combination the program relies on. Each problem is reported on its own line, naming
// the key, its value and what is allowed, and starting with the config's path when known.
func (c *Config) Validate() error { return c.validate(false) }

// ValidateEval is Validate for an evaluation, which reads the model's shape from the model it
// evaluates (set c.Model to it first), its tokenizer too when the model brings one, and pads
// each sample for the sequence-parallel layout: the checks that tie data.seq_len and
// data.tokenizer to the model and the layout are the evaluation's own to make.
func (c *Config) ValidateEval() error { return c.validate(true) }

func (c *Config) validate(forEval bool) error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, errors.New(c.prefixOrigin(fmt.Sprintf(format, args...))))
	}
	oneOf := func(key, value string, allowed []string) {
		if slices.Contains(allowed, value) {
			return
		}
		msg := fmt.Sprintf("%s = %q: want one of %s", key, value, strings.Join(allowed, ", "))
		if s := closest(value, allowed); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		fail("%s", msg)
	}
	atLeast := func(key string, value, low int) {
		if value < low {
			fail("%s = %d: must be >= %d", key, value, low)
		}
	}
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

	modelOK := true
	if err := c.Model.Resolve(); err != nil {
		fail("%v", err)
		modelOK = false
	}

	// [run]
	switch r := c.Run; {
	case r.Name == "":
		fail("run.name is empty: it names the run directory <output_dir>/<name>")
	case r.Name == "." || r.Name == ".." || strings.ContainsAny(r.Name, `/\`):
		fail("run.name = %q: must be a single directory name (no path separators, not . or ..)", r.Name)
	}
	if c.Run.OutputDir == "" {
		fail(`run.output_dir is empty: use "." for the current directory`)
	}
	atLeast("run.log_interval", c.Run.LogInterval, 0)

	// [data]
	d := c.Data
	if d.Train == "" {
		fail("data.train is empty: it names the training data (file, directory or glob)")
	}
	patterns := func(what string, ps []string) {
		for _, p := range ps {
			if _, err := filepath.Match(p, ""); err != nil {
				fail("%s pattern %q: %v", what, p, err)
			}
		}
	}
	oneOf("data.format", d.Format, dataFormats)
	patterns("data.include", d.Include)
	if d.MaxBytes < 0 {
		fail("data.max_bytes = %d: must be >= 0 (0 = no limit)", d.MaxBytes)
	}
	if d.Tokenizer == "" {
		fail(`data.tokenizer is empty: use "byte"`)
	}
	if d.Tokenizer == "byte" && modelOK && c.Model.VocabSize < 256 && !forEval {
		fail(`model.vocab_size = %d: data.tokenizer = "byte" needs model.vocab_size >= 256 (one token per byte value)`, c.Model.VocabSize)
	}
	atLeast("data.seq_len", d.SeqLen, 1)
	atLeast("data.batch_size", d.BatchSize, 1)
	if c.Parallelism.BalanceDocuments && !d.DocumentMask {
		fail("parallelism.balance_documents = true needs data.document_mask = true: it reorders the documents the mask separates")
	}
	if d.PositionReset && !d.DocumentMask {
		fail("data.position_reset = true needs data.document_mask = true: positions restart at the documents the mask draws")
	}
	if modelOK && d.SeqLen > c.Model.MaxSeqLen && !forEval {
		fail("data.seq_len = %d exceeds model.max_seq_len = %d", d.SeqLen, c.Model.MaxSeqLen)
	}
	if len(d.Sources) > 0 {
		if d.Train != Default().Data.Train {
			fail("data.train = %q and [[data.sources]] both name the training data: a mixture's sources replace data.train; remove one", d.Train)
		}
		names := map[string]int{}
		for i, s := range d.TrainSources() {
			key := fmt.Sprintf("data.sources[%d] (%q)", i+1, s.Name)
			if s.Path == "" {
				fail("%s: path is empty: it names the source's data (file, directory or glob)", key)
			}
			if !(s.Weight > 0) || math.IsInf(s.Weight, 0) {
				fail("%s: weight = %v: must be a finite number > 0 (weights are relative shares of the sequences)", key, s.Weight)
			}
			oneOf(key+".format", s.Format, dataFormats)
			patterns(key+": include", s.Include)
			if s.Eval != "" && s.EvalFormat == "tokens" {
				fail(`%s: eval = %q is read as format "tokens", but a hold-out is read as text: set eval_format to the format of its text (text, jsonl, c4 or parquet)`, key, s.Eval)
			} else if s.Eval != "" {
				oneOf(key+".eval_format", s.EvalFormat, dataFormats)
			}
			if j, dup := names[s.Name]; dup {
				fail("data.sources[%d] and data.sources[%d] are both named %q: give each a name", j, i+1, s.Name)
			}
			names[s.Name] = i + 1
		}
	}

	// [training]
	t := c.Training
	atLeast("training.steps", t.Steps, 1)
	atLeast("training.warmup_steps", t.WarmupSteps, 0)
	atLeast("training.grad_accum_steps", t.GradAccumSteps, 1)
	if t.LossChunk < -1 {
		fail("training.loss_chunk = %d: want -1 (chosen by the vocabulary's size), 0 (all tokens at once) or a number of tokens", t.LossChunk)
	}
	if t.MLPTile < -1 {
		fail("training.mlp_tile = %d: want -1 (chosen by model.ffn_dim), 0 (all tokens at once) or a number of tokens", t.MLPTile)
	}
	if !(t.LR > 0) || !finite(t.LR) {
		fail("training.lr = %g: must be a positive number", t.LR)
	}
	if !(t.MinLR >= 0) || !(t.MinLR <= t.LR) {
		fail("training.min_lr = %g: must satisfy 0 <= min_lr <= training.lr = %g", t.MinLR, t.LR)
	}
	oneOf("training.lr_schedule", t.LRSchedule, lrSchedules)
	if !(t.WeightDecay >= 0) || !finite(t.WeightDecay) {
		fail("training.weight_decay = %g: must be a finite number >= 0", t.WeightDecay)
	}
	if !(t.Beta1 >= 0 && t.Beta1 < 1) {
		fail("training.beta1 = %g: must satisfy 0 <= beta1 < 1", t.Beta1)
	}
	if !(t.Beta2 >= 0 && t.Beta2 < 1) {
		fail("training.beta2 = %g: must satisfy 0 <= beta2 < 1", t.Beta2)
	}
	if !(t.Eps > 0) || !finite(t.Eps) {
		fail("training.eps = %g: must be a positive number", t.Eps)
	}
	if !(t.GradClip >= 0) || !finite(t.GradClip) {
		fail("training.grad_clip = %g: must be a finite number >= 0 (0 = no clipping)", t.GradClip)
	}
	oneOf("training.mixed_precision", t.MixedPrecision, mixedPrecisions)
	if !(t.LossScaleInit >= 1) || !finite(t.LossScaleInit) {
		fail("training.loss_scale_init = %g: must be a finite number >= 1 (fp16 starts scaling the loss by it; 65536 is usual)", t.LossScaleInit)
	}
	atLeast("training.loss_scale_growth_interval", t.LossScaleGrowthInterval, 1)
	if t.SkipSpikesMaxConsecutive < 1 {
		fail("training.skip_spikes_max_consecutive = %d: want at least 1, the most steps in a row training.skip_spikes skips (to skip none, set skip_spikes = false)", t.SkipSpikesMaxConsecutive)
	}
	if t.SkipSpikesMaxTotal < 1 {
		fail("training.skip_spikes_max_total = %d: want at least 1, the most updates training.skip_spikes skips in a run (to skip none, set skip_spikes = false)", t.SkipSpikesMaxTotal)
	}

	// [parallelism]
	p := c.Parallelism
	oneOf("parallelism.backend", p.Backend, backends)
	oneOf("parallelism.attention", p.Attention, attentions)
	for _, msg := range p.worldErrors(c.Device.Kind) {
		fail("%s", msg)
	}
	if sp := p.SequenceParallelDegree; sp > 1 && modelOK && p.UlyssesDegree >= 1 && sp%p.UlyssesDegree == 0 {
		h := model.Heads{N: c.Model.NHeads, KV: c.Model.NKVHeads, Dim: c.Model.HeadDim}
		if err := parallel.CheckHybrid(p.Attention, h, sp, p.UlyssesDegree); err != nil {
			fail("parallelism.attention = %q on %d sequence-parallel ranks: %v", p.Attention, sp, err)
		}
		if l, err := parallel.LayoutOf(p.Attention); err == nil && c.Data.SeqLen > 0 && c.Data.SeqLen%l.Divisor(sp) != 0 && !forEval {
			fail("data.seq_len = %d: the %s schedule splits each sequence %s over %d ranks, so it must be a multiple of %d",
				c.Data.SeqLen, p.Attention, l, sp, l.Divisor(sp))
		}
	}

	// [checkpoint]
	k := c.Checkpoint
	oneOf("checkpoint.activation", k.Activation, activationPolicies)
	atLeast("checkpoint.interval", k.Interval, 0)
	atLeast("checkpoint.keep", k.Keep, 1)
	if k.CompressionLevel < 1 || k.CompressionLevel > 22 {
		fail("checkpoint.compression_level = %d: must be a zstd level, 1..22", k.CompressionLevel)
	}

	// [eval]
	e := c.Eval
	atLeast("eval.samples", e.Samples, 1)
	atLeast("eval.seq_len", e.SeqLen, 0)
	atLeast("eval.interval", e.Interval, 0)
	if e.Interval > 0 && !c.Data.HasHeldOut() {
		fail("eval.interval = %d: evaluating during training needs held-out data: set data.eval (or a source's eval)", e.Interval)
	}
	if modelOK && e.SeqLen > c.Model.MaxSeqLen && !forEval {
		fail("eval.seq_len = %d exceeds model.max_seq_len = %d", e.SeqLen, c.Model.MaxSeqLen)
	}
	atLeast("eval.sample_interval", e.SampleInterval, 0)
	if e.SampleInterval > 0 {
		atLeast("eval.sample_tokens", e.SampleTokens, 1)
		if modelOK && len(e.SamplePrompt)+e.SampleTokens > c.Model.MaxSeqLen && !forEval {
			fail("eval.sample_prompt (%d bytes) and eval.sample_tokens = %d exceed model.max_seq_len = %d", len(e.SamplePrompt), e.SampleTokens, c.Model.MaxSeqLen)
		}
	}

	// [device]
	oneOf("device.kind", c.Device.Kind, deviceKinds)
	oneOf("device.attention", c.Device.Attention, deviceAttentions)
	if c.Device.Attention == "cudnn" && c.Device.Kind != "cuda" {
		fail("device.attention = \"cudnn\" with device.kind = %q: cuDNN runs on a GPU (device.kind = \"cuda\"); the CPU has one path (\"auto\")", c.Device.Kind)
	}
	if c.Device.Attention == "own" && c.Device.Kind != "cuda" {
		fail("device.attention = \"own\" with device.kind = %q: it chooses among a GPU's attention paths (device.kind = \"cuda\"); the CPU has one path (\"auto\"): leave device.attention out", c.Device.Kind)
	}
	if !(c.Device.PeakTFLOPS >= 0) || !finite(c.Device.PeakTFLOPS) {
		fail("device.peak_tflops = %g: must be a finite number >= 0 (one device's peak in TFLOP/s, e.g. 989 for an H100's dense bf16; 0 = known from the GPU, or no MFU)", c.Device.PeakTFLOPS)
	}

	return errors.Join(errs...)
}

// ValidateWorld is the part of Validate that says whether the config's ranks make a world
// (the sizes of [parallelism], its backend on the device), with Validate's messages: for eval
// and generate, which launch the world before they know the model they run.
func (c *Config) ValidateWorld() error {
	var errs []error
	for _, msg := range c.Parallelism.worldErrors(c.Device.Kind) {
		errs = append(errs, errors.New(c.prefixOrigin(msg)))
	}
	return errors.Join(errs...)
}

// worldErrors are what keeps p's ranks from making a world on devices of kind device.
func (p ParallelismConfig) worldErrors(device string) []string {
	var msgs []string
	fail := func(format string, args ...any) { msgs = append(msgs, fmt.Sprintf(format, args...)) }
	for _, k := range []struct {
		key string
		v   int
	}{{"world_size", p.WorldSize}, {"sequence_parallel_degree", p.SequenceParallelDegree}, {"ulysses_degree", p.UlyssesDegree}} {
		if k.v < 1 {
			fail("parallelism.%s = %d: must be >= 1", k.key, k.v)
		}
	}
	if p.WorldSize >= 1 && p.SequenceParallelDegree >= 1 && p.WorldSize%p.SequenceParallelDegree != 0 {
		fail("parallelism.world_size = %d is not a multiple of parallelism.sequence_parallel_degree = %d: the ranks split into whole sequence-parallel groups",
			p.WorldSize, p.SequenceParallelDegree)
	}
	if sp, u := p.SequenceParallelDegree, p.UlyssesDegree; sp >= 1 && u >= 1 && sp%u != 0 {
		fail("parallelism.ulysses_degree = %d does not divide parallelism.sequence_parallel_degree = %d: the sequence-parallel ranks split into groups of ulysses_degree", u, sp)
	}
	if p.Backend == "nccl" && device != "cuda" {
		fail("parallelism.backend = \"nccl\" with device.kind = %q: NCCL moves GPU memory, so it needs device.kind = \"cuda\" (CPU ranks over MPI: parallelism.backend = \"mpi\")", device)
	}
	return msgs
}

// resolved returns c with the model's derived fields filled in (best effort: an invalid model
// stays as it is).
func (c Config) Resolved() Config {
	_ = c.Model.Resolve()
	return c
}

// lossChunkBytes is the most bytes of float32 logits a loss chunk of LossChunkTokens holds.
const lossChunkBytes = 256 << 20

// LossChunkTokens is the tokens per loss chunk that training.loss_chunk asks for (0: all at
// once), with -1 taken as AutoLossChunk: a small vocabulary takes its tokens at once and
// LLaMA-3's 128K vocabulary 512 at a time. Where the device's memory is known, package plan's
// Choose decides -1 instead (all at once where the step fits so); this is the chunk it falls
// back to.
func (c Config) LossChunkTokens() int {
	if c.Training.LossChunk >= 0 {
		return c.Training.LossChunk
	}
	return AutoLossChunk(c.Model.VocabSize)
}

// AutoLossChunk is the loss chunk of a vocabulary of vocab tokens that keeps the chunk's
// float32 logits within 256 MiB: a multiple of 128 tokens (whole tiles of a GPU's GEMMs: 2048
// at LLaMA-2's 32000, 512 at LLaMA-3's 128256), or fewer than 128 when not even 128 fit (at
// least 1).
func AutoLossChunk(vocab int) int { return round128(lossChunkBytes / (4 * max(vocab, 1))) }

// MLPTileTokens is the tokens per MLP tile that training.mlp_tile asks for (0: all at once),
// with -1 taken as AutoMLPTile of model.ffn_dim. Where the device's memory is known, package
// plan's Choose decides -1 instead (all at once where the step fits so); this is the tile it
// falls back to.
func (c Config) MLPTileTokens() int {
	if c.Training.MLPTile >= 0 {
		return c.Training.MLPTile
	}
	return AutoMLPTile(c.Model.FFNDim)
}

// AutoMLPTile is the MLP tile of an MLP of ffn hidden units that keeps the tile's float32
// gate, up and activation within 256 MiB: a multiple of 128 tokens (tiny's 352 units: 63488
// tokens, all of a laptop batch; the 0.85B's 5632: 3968; LLaMA-3-8B's 14336: 1536), or fewer
// than 128 when not even 128 fit (at least 1).
func AutoMLPTile(ffn int) int { return round128(lossChunkBytes / (3 * 4 * max(ffn, 1))) }

// round128 rounds tokens down to a multiple of 128 when it is at least 128, so that the GEMMs
// of a tile or chunk fill whole 128-row tiles; below 128 it is kept (at least 1).
func round128(tokens int) int {
	if tokens >= 128 {
		return tokens - tokens%128
	}
	return max(1, tokens)
}

// TokensPerStep is the number of tokens one optimizer step trains on, over all ranks:
// batch_size × seq_len × grad_accum_steps × (world_size / sequence_parallel_degree).
func (c Config) TokensPerStep() int64 {
	replicas := 1
	if sp := c.Parallelism.SequenceParallelDegree; sp > 0 && c.Parallelism.WorldSize >= sp {
		replicas = c.Parallelism.WorldSize / sp
	}
	return int64(c.Data.BatchSize) * int64(c.Data.SeqLen) * int64(c.Training.GradAccumSteps) * int64(replicas)
}

// Summary describes the run in one line: the model and its parameter count, the tokens per
// step and the world it runs in.
func (c Config) Summary() string {
	c = c.Resolved()
	m, p := c.Model, c.Parallelism
	heads := fmt.Sprintf("%d heads", m.NHeads)
	if m.NKVHeads != m.NHeads {
		heads += fmt.Sprintf(" (%d kv)", m.NKVHeads)
	}
	if m.SlidingWindow > 0 {
		heads += fmt.Sprintf(", sliding window %d", m.SlidingWindow)
		if len(m.SlidingWindowLayers) > 0 {
			heads += fmt.Sprintf(" on layers %v", m.SlidingWindowLayers)
		}
		if m.SlidingWindowPattern > 0 {
			heads += fmt.Sprintf(", every %d-th layer global", m.SlidingWindowPattern)
		}
	}
	world := fmt.Sprintf("world %d (%s", p.WorldSize, p.Backend)
	if p.WorldSize > 1 {
		world += fmt.Sprintf(", sequence parallel %d, attention %s", p.SequenceParallelDegree, p.Attention)
		if p.UlyssesDegree > 1 {
			world += fmt.Sprintf(" between ulysses groups of %d", p.UlyssesDegree)
		}
		if p.FSDP {
			world += ", fsdp"
		}
	}
	world += ")"
	return fmt.Sprintf("%s: LLaMA %s params (dim %d, %d layers, %s, head_dim %d, ffn %d, vocab %d); "+
		"%s tokens/step (batch %d × seq %d × accum %d); %s; %s %s; activation checkpoint %s",
		c.Run.Name, data.Count(m.NumParams()), m.Dim, m.NLayers, heads, m.HeadDim, m.FFNDim, m.VocabSize,
		data.Count(c.TokensPerStep()), c.Data.BatchSize, c.Data.SeqLen, c.Training.GradAccumSteps, world,
		c.Device.Kind, c.Training.MixedPrecision, c.Checkpoint.Activation)
}

// Bytes per parameter of the model state, in fp32: the weight, its gradient and the two
// AdamW moments. plan's memory model (plan.MemoryFor, which train's check uses),
// CheckModelMemory and the checks before a model is loaded in eval, export and
// train --init-from all count with these.
const (
	WeightBytesPerParam    = 4
	GradBytesPerParam      = 4
	OptimizerBytesPerParam = 8
	// stateBytesPerParam is what training keeps per parameter.
	StateBytesPerParam = WeightBytesPerParam + GradBytesPerParam + OptimizerBytesPerParam
)

// CheckModelMemory refuses, before anything is allocated, a model of shape mc (from a file,
// perhaps a stranger's) whose copies × perParam bytes per parameter do not fit in the memory
// this machine has available. what names where the shape comes from and its keys; the error
// adds the parameters and the bytes needed and available.
func CheckModelMemory(what string, mc model.Config, copies, perParam float64) error {
	n := mc.ParamCount()
	how := fmt.Sprintf("%.4g parameters × %g bytes", n, perParam)
	if copies != 1 {
		how += fmt.Sprintf(" × %g copies", copies)
	}
	return sysmem.Check(fmt.Sprintf("%s: %s", what, how), n*perParam*copies)
}

// memoryNoteBytes is the model-state size above which Notes mentions it.
const memoryNoteBytes = 16 << 30

// Requirements lists, one sentence each, what the config needs that this build or machine does
// not have: a GPU build, NCCL's library (parallelism.backend = "nccl"). It is empty for
// configs/tiny.toml. It reports facts; the caller decides whether to refuse. Whether the
// config fits in memory is the caller's check too (package train: the per-rank estimate of
// package plan against the memory the process has).
func (c Config) Requirements() []string {
	c = c.Resolved()
	var reqs []string
	p := c.Parallelism
	if p.Backend == "nccl" {
		if err := kernels.NCCLAvailable(); err != nil {
			reqs = append(reqs, fmt.Sprintf("parallelism.backend = \"nccl\": %v", err))
		}
	}
	if c.Device.Kind == "cuda" && !kernels.CUDABuilt {
		reqs = append(reqs, fmt.Sprintf("device.kind = %q needs a build with -tags %s (this build runs on the CPU)", c.Device.Kind, c.Device.Kind))
	}
	return reqs
}

// Notes lists, one sentence each, what a user should know of the config before a long run
// that does not stop it: a warmup longer than the run, the size of the model state when it is
// above 16 GiB, and per rank with FSDP; a schedule that gains nothing from the sliding window.
func (c Config) Notes() []string {
	c = c.Resolved()
	p := c.Parallelism
	var notes []string
	if t := c.Training; t.WarmupSteps > t.Steps {
		notes = append(notes, fmt.Sprintf("training.warmup_steps = %d is more than training.steps = %d: the learning rate never reaches training.lr = %g (it ends at %.3g, %d/%d of it)",
			t.WarmupSteps, t.Steps, t.LR, t.LR*float64(t.Steps)/float64(t.WarmupSteps), t.Steps, t.WarmupSteps))
	}
	if t := c.Training; t.WarmupSteps < shortWarmup && t.LR >= largeLR && t.Steps > t.WarmupSteps {
		notes = append(notes, fmt.Sprintf("training.warmup_steps = %d at training.lr = %g: Adam's first updates move every weight by about the learning rate, whatever its gradient's size, so with a warmup this short the first steps can throw the loss up and down; reference recipes warm up over hundreds of steps or 1–10%% of the run (docs/training.md#learning-rate-and-warmup)",
			t.WarmupSteps, t.LR))
	}
	n := c.Model.NumParams()
	if state := n * StateBytesPerParam; state > memoryNoteBytes {
		msg := fmt.Sprintf("the model's %s parameters need %.1f GiB for fp32 weights, gradients and AdamW moments (%d bytes/parameter), before activations",
			data.Count(n), GiB(state), StateBytesPerParam)
		if p.FSDP && p.WorldSize > 1 {
			msg += fmt.Sprintf("; %.1f GiB per rank with fsdp over %d ranks", GiB(state)/float64(p.WorldSize), p.WorldSize)
		}
		notes = append(notes, msg)
	}
	if w, sp := c.Model.SlidingWindow, p.SequenceParallelDegree; w > 0 && sp > 1 && w < c.Data.SeqLen {
		switch p.Attention {
		case "zigzag":
			notes = append(notes, fmt.Sprintf("parallelism.attention = \"zigzag\" under model.sliding_window = %d sends every block it sends without the window, and its layout, balanced for the causal triangle, is not for a window shorter than seq_len/%d; ring, burst and distflash send only the blocks the window reaches (distflash plan prices each)", w, sp))
		case "ulysses", "attn2d":
			notes = append(notes, fmt.Sprintf("parallelism.attention = %q under model.sliding_window = %d sends every block it sends without the window; ring, burst and distflash send only the blocks the window reaches (distflash plan prices each)", p.Attention, w))
		}
	}
	return notes
}

// A warmup of fewer than shortWarmup steps to a learning rate of largeLR or more is a note.
const (
	shortWarmup = 10
	largeLR     = 1e-4
)

// gib converts bytes to GiB.
func GiB(b int64) float64 { return float64(b) / (1 << 30) }
