package config

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"distflash/model"
)

// writeConfig writes text to a TOML file in a fresh directory and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "x.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// wantErr fails unless err is non-nil and its message contains every one of subs.
func wantErr(t *testing.T, err error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one mentioning %q", subs)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

// resolvedDefault is Default after Validate, with Path set.
func resolvedDefault(t *testing.T, path string) Config {
	t.Helper()
	want := Default()
	if err := want.Validate(); err != nil {
		t.Fatalf("DefaultConfig does not validate: %v", err)
	}
	want.Path = path
	return want
}

func TestConfigFilesLoad(t *testing.T) {
	paths, err := filepath.Glob("configs/*.toml")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 9 {
		t.Fatalf("configs/ holds %d TOML files, want at least 9: %q", len(paths), paths)
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			cfg, err := Load(path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := strings.TrimSuffix(filepath.Base(path), ".toml"); cfg.Run.Name != want {
				t.Errorf("run.name = %q, want the file's name %q", cfg.Run.Name, want)
			}
			if cfg.Path != path {
				t.Errorf("Path = %q, want %q", cfg.Path, path)
			}
			if s := cfg.Summary(); !strings.Contains(s, cfg.Run.Name) {
				t.Errorf("Summary %q does not name the run", s)
			}
		})
	}
}

// TestConfigTinyIsDefaults checks that configs/tiny.toml writes out Default exactly.
func TestConfigTinyIsDefaults(t *testing.T) {
	const path = "configs/tiny.toml"
	got, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := resolvedDefault(t, path); !reflect.DeepEqual(got, want) {
		t.Errorf("%s differs from DefaultConfig:\n got %+v\nwant %+v", path, got, want)
	}
	if reqs := got.Requirements(); len(reqs) != 0 {
		t.Errorf("Requirements of %s = %q, want none", path, reqs)
	}
}

// TestConfigPaperModels checks the shapes of the papers' models against §4 of DistFlashAttn.
func TestConfigPaperModels(t *testing.T) {
	tests := []struct {
		file                             string
		dim, layers, heads, kvHeads, ffn int
		params                           int64 // 0 = not checked
	}{
		{"llama7b-512k", 4096, 32, 32, 32, 11008, 6738415616}, // LLaMA-7B: 6.74B
		{"llama-gqa", 4096, 32, 32, 8, 11008, 0},
		{"llama-33h", 4224, 32, 33, 33, 11008, 0},
		{"llama-16h", 2048, 64, 16, 16, 11008, 0},
		{"llama-8h", 1024, 128, 8, 8, 11008, 0},
		{"llama-4h", 512, 256, 4, 4, 11008, 0},
		{"llama-2h", 256, 512, 2, 2, 11008, 0},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			cfg, err := Load("configs/"+tt.file+".toml", nil)
			if err != nil {
				t.Fatal(err)
			}
			m := cfg.Model
			if m.Dim != tt.dim || m.NLayers != tt.layers || m.NHeads != tt.heads || m.NKVHeads != tt.kvHeads ||
				m.FFNDim != tt.ffn || m.HeadDim != 128 || m.VocabSize != 32000 {
				t.Errorf("model = %+v, want dim %d, %d layers, %d heads, %d kv heads, head_dim 128, ffn %d, vocab 32000",
					m, tt.dim, tt.layers, tt.heads, tt.kvHeads, tt.ffn)
			}
			if tt.params != 0 && m.NumParams() != tt.params {
				t.Errorf("NumParams = %d, want %d", m.NumParams(), tt.params)
			}
			p := cfg.Parallelism
			if p.WorldSize != 16 || p.SequenceParallelDegree != 16 || p.Attention != "distflash" || !p.FSDP {
				t.Errorf("parallelism = %+v, want 16 ranks, sequence parallel 16, distflash, fsdp", p)
			}
			if cfg.Data.SeqLen != 512<<10 || cfg.Checkpoint.Activation != "attn_output" {
				t.Errorf("seq_len %d, activation %q: want 512K and attn_output", cfg.Data.SeqLen, cfg.Checkpoint.Activation)
			}
		})
	}
}

func TestConfigDefaultsRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(Default()); err != nil {
		t.Fatal(err)
	}
	path := writeConfig(t, buf.String())
	got, err := Load(path, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	if want := resolvedDefault(t, path); !reflect.DeepEqual(got, want) {
		t.Errorf("round trip changed the defaults:\n got %+v\nwant %+v\nTOML:\n%s", got, want, buf.String())
	}
	// An empty file is the defaults too.
	empty := writeConfig(t, "")
	got, err = Load(empty, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := resolvedDefault(t, empty); !reflect.DeepEqual(got, want) {
		t.Errorf("empty file:\n got %+v\nwant %+v", got, want)
	}
}

func TestConfigUnknownKey(t *testing.T) {
	tests := []struct {
		name, text string
		want       []string
		notWant    string
	}{
		{"misspelt key", "[training]\nstepz = 3\n", []string{"unknown key training.stepz", "did you mean training.steps?"}, ""},
		{"misspelt model key", "[model]\nn_head = 8\n", []string{"model.n_head", "did you mean model.n_heads?"}, ""},
		{"misspelt section", "[trainig]\nsteps = 3\n", []string{"unknown key trainig ", "did you mean training?"}, "trainig.steps"},
		{"key of another section", "[training]\nseq_len = 64\n", []string{"training.seq_len", "data.seq_len"}, ""},
		{"key outside its section", "steps = 3\n", []string{"unknown key steps", "did you mean training.steps?"}, ""},
		{"no close match", "[data]\nxyzzy_plugh = 1\n", []string{"unknown key data.xyzzy_plugh"}, "did you mean"},
		{"two unknown keys", "[run]\nnmae = \"a\"\n[eval]\nsample = 3\n", []string{"run.nmae", "run.name", "eval.sample", "eval.samples"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.text)
			_, err := Load(path, nil)
			wantErr(t, err, append([]string{path + ": "}, tt.want...)...)
			if err != nil && tt.notWant != "" && strings.Contains(err.Error(), tt.notWant) {
				t.Errorf("error %q mentions %q", err, tt.notWant)
			}
		})
	}
}

func TestConfigTypeMismatch(t *testing.T) {
	tests := []struct {
		name, text, key string
	}{
		{"string for int", "[training]\nsteps = \"many\"\n", "training.steps"},
		{"float for int", "[data]\nseq_len = 1.5\n", "data.seq_len"},
		{"string for array", "[data]\ninclude = \"*.go\"\n", "data.include"},
		{"int for bool", "[parallelism]\nfsdp = 1\n", "parallelism.fsdp"},
		{"int for string", "[run]\nname = 7\n", "run.name"},
		{"negative seed", "[run]\nseed = -1\n", "run.seed = -1"},
		{"malformed TOML", "[training\nsteps = 3\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.text)
			_, err := Load(path, nil)
			wantErr(t, err, path+":", tt.key) // path:line: key: ...
		})
	}
}

func TestConfigMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "absent.toml"), nil)
	wantErr(t, err, "absent.toml")
}

func TestValidateInvalid(t *testing.T) {
	tests := []struct {
		name   string
		modify func(c *Config)
		want   []string
	}{
		{"model heads", func(c *Config) { c.Model.NHeads = 3 }, []string{"model.n_heads"}},
		{"model kv heads", func(c *Config) { c.Model.NKVHeads = 3 }, []string{"model.n_heads = 4 is not a multiple of model.n_kv_heads = 3"}},
		{"data format", func(c *Config) { c.Data.Format = "arrow" }, []string{"data.format", `"arrow"`, "text, jsonl, c4, parquet, tokens"}},
		{"lr schedule", func(c *Config) { c.Training.LRSchedule = "cosin" }, []string{"training.lr_schedule", `did you mean "cosine"?`}},
		{"mixed precision", func(c *Config) { c.Training.MixedPrecision = "fp8" }, []string{"training.mixed_precision", "fp32, bf16, fp16"}},
		{"backend", func(c *Config) { c.Parallelism.Backend = "gloo" }, []string{"parallelism.backend", "inproc, mpi, nccl"}},
		{"attention", func(c *Config) { c.Parallelism.Attention = "flash" }, []string{"parallelism.attention", "distflash, ring, zigzag, burst, ulysses, attn2d"}},
		{"activation", func(c *Config) { c.Checkpoint.Activation = "full" }, []string{"checkpoint.activation", "none, layer, attn_output"}},
		{"device", func(c *Config) { c.Device.Kind = "tpu" }, []string{"device.kind", "cpu, cuda"}},
		{"seq_len", func(c *Config) { c.Data.SeqLen = 0 }, []string{"data.seq_len = 0"}},
		{"batch_size", func(c *Config) { c.Data.BatchSize = -1 }, []string{"data.batch_size = -1"}},
		{"balance_documents alone", func(c *Config) { c.Parallelism.BalanceDocuments = true }, []string{"parallelism.balance_documents = true", "data.document_mask"}},
		{"position_reset alone", func(c *Config) { c.Data.PositionReset = true }, []string{"data.position_reset = true", "data.document_mask"}},
		{"steps", func(c *Config) { c.Training.Steps = 0 }, []string{"training.steps = 0"}},
		{"grad_accum_steps", func(c *Config) { c.Training.GradAccumSteps = 0 }, []string{"training.grad_accum_steps = 0"}},
		{"loss scale", func(c *Config) { c.Training.LossScaleInit = 0 }, []string{"training.loss_scale_init = 0", "65536"}},
		{"loss scale growth", func(c *Config) { c.Training.LossScaleGrowthInterval = 0 }, []string{"training.loss_scale_growth_interval = 0"}},
		{"skip_spikes_max_consecutive", func(c *Config) { c.Training.SkipSpikesMaxConsecutive = 0 }, []string{"training.skip_spikes_max_consecutive = 0: want at least 1"}},
		{"skip_spikes_max_total", func(c *Config) { c.Training.SkipSpikesMaxTotal = -2 }, []string{"training.skip_spikes_max_total = -2: want at least 1"}},
		{"world vs sp", func(c *Config) { c.Parallelism.WorldSize, c.Parallelism.SequenceParallelDegree = 6, 4 },
			[]string{"parallelism.world_size = 6 is not a multiple of parallelism.sequence_parallel_degree = 4"}},
		{"eval interval without data", func(c *Config) { c.Eval.Interval, c.Data.Eval = 10, "" }, []string{"eval.interval = 10", "data.eval"}},
		{"world_size", func(c *Config) { c.Parallelism.WorldSize = 0 }, []string{"parallelism.world_size = 0"}},
		{"sequence_parallel_degree", func(c *Config) { c.Parallelism.SequenceParallelDegree = 0 }, []string{"parallelism.sequence_parallel_degree = 0"}},
		{"world not multiple of sp", func(c *Config) { c.Parallelism.WorldSize, c.Parallelism.SequenceParallelDegree = 6, 4 },
			[]string{"parallelism.world_size = 6", "parallelism.sequence_parallel_degree = 4"}},
		{"lr zero", func(c *Config) { c.Training.LR = 0 }, []string{"training.lr = 0"}},
		{"min_lr above lr", func(c *Config) { c.Training.MinLR = 1 }, []string{"training.min_lr = 1"}},
		{"min_lr negative", func(c *Config) { c.Training.MinLR = -1e-4 }, []string{"training.min_lr"}},
		{"beta1 one", func(c *Config) { c.Training.Beta1 = 1 }, []string{"training.beta1 = 1"}},
		{"beta2 negative", func(c *Config) { c.Training.Beta2 = -0.1 }, []string{"training.beta2"}},
		{"eps zero", func(c *Config) { c.Training.Eps = 0 }, []string{"training.eps = 0"}},
		{"weight_decay negative", func(c *Config) { c.Training.WeightDecay = -0.1 }, []string{"training.weight_decay"}},
		{"grad_clip negative", func(c *Config) { c.Training.GradClip = -1 }, []string{"training.grad_clip"}},
		{"warmup negative", func(c *Config) { c.Training.WarmupSteps = -1 }, []string{"training.warmup_steps = -1"}},
		{"seq_len above max", func(c *Config) { c.Data.SeqLen = 4096 }, []string{"data.seq_len = 4096", "model.max_seq_len = 2048"}},
		{"byte tokenizer vocab", func(c *Config) { c.Model.VocabSize = 100 }, []string{"model.vocab_size = 100", `data.tokenizer = "byte"`, ">= 256"}},
		{"keep", func(c *Config) { c.Checkpoint.Keep = 0 }, []string{"checkpoint.keep = 0"}},
		{"compression low", func(c *Config) { c.Checkpoint.CompressionLevel = 0 }, []string{"checkpoint.compression_level = 0", "zstd", "1..22"}},
		{"compression high", func(c *Config) { c.Checkpoint.CompressionLevel = 23 }, []string{"checkpoint.compression_level = 23"}},
		{"run name path", func(c *Config) { c.Run.Name = "../x" }, []string{"run.name"}},
		{"include pattern", func(c *Config) { c.Data.Include = []string{"[*.go"} }, []string{"data.include"}},
		{"eval seq_len", func(c *Config) { c.Eval.SeqLen = 1 << 20 }, []string{"eval.seq_len"}},
		{"two problems", func(c *Config) { c.Training.Steps, c.Device.Kind = 0, "gpu" }, []string{"training.steps", "device.kind"}},
		{"sources and train", func(c *Config) {
			c.Data.Train, c.Data.Sources = "web.jsonl", []SourceConfig{{Path: "code.jsonl", Weight: 1}}
		}, []string{`data.train = "web.jsonl" and [[data.sources]] both name the training data`}},
		{"source without path", func(c *Config) { c.Data.Sources = []SourceConfig{{Name: "web", Weight: 1}} }, []string{`data.sources[1] ("web"): path is empty`}},
		{"source weight", func(c *Config) { c.Data.Sources = []SourceConfig{{Path: "a.jsonl", Weight: 1}, {Path: "b.jsonl"}} }, []string{`data.sources[2] ("b"): weight = 0: must be a finite number > 0`}},
		{"source weight NaN", func(c *Config) { c.Data.Sources = []SourceConfig{{Path: "a.jsonl", Weight: math.NaN()}} }, []string{`data.sources[1] ("a"): weight = NaN`}},
		{"source format", func(c *Config) { c.Data.Sources = []SourceConfig{{Path: "a", Format: "csv", Weight: 1}} }, []string{`data.sources[1] ("a").format = "csv": want one of text, jsonl, c4, parquet, tokens`}},
		{"source include", func(c *Config) { c.Data.Sources = []SourceConfig{{Path: "a", Include: []string{"[x"}, Weight: 1}} }, []string{`data.sources[1] ("a"): include pattern "[x"`}},
		{"source names", func(c *Config) {
			c.Data.Sources = []SourceConfig{{Path: "x/web/*.jsonl", Weight: 1}, {Path: "y/web", Weight: 1}}
		}, []string{`data.sources[1] and data.sources[2] are both named "web": give each a name`}},
		{"source eval of shards", func(c *Config) {
			c.Data.Sources = []SourceConfig{{Path: "shards/web", Format: "tokens", Weight: 1, Eval: "web-val.jsonl"}}
		}, []string{`eval = "web-val.jsonl" is read as format "tokens"`, "set eval_format"}},
		{"eval interval without any eval", func(c *Config) {
			c.Eval.Interval, c.Data.Sources = 10, []SourceConfig{{Path: "a", Weight: 1}}
		}, []string{"eval.interval = 10", "set data.eval (or a source's eval)"}},
		{"nccl on the cpu", func(c *Config) { c.Parallelism.Backend = "nccl" },
			[]string{`parallelism.backend = "nccl" with device.kind = "cpu"`, `device.kind = "cuda"`, `parallelism.backend = "mpi"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Path = "configs/x.toml"
			tt.modify(&c)
			err := c.Validate()
			wantErr(t, err, tt.want...)
			if err != nil && !strings.HasPrefix(err.Error(), "configs/x.toml: ") {
				t.Errorf("error %q does not start with the config's path", err)
			}
		})
	}
}

func TestValidateWithoutPath(t *testing.T) {
	c := Default()
	c.Training.Steps = 0
	err := c.Validate()
	wantErr(t, err, "training.steps")
	if err != nil && !strings.HasPrefix(err.Error(), "training.steps") {
		t.Errorf("error %q: want it to start with the key when there is no path", err)
	}
}

func TestOverride(t *testing.T) {
	tests := []struct {
		name  string
		sets  []string
		check func(c Config) bool
	}{
		{"int", []string{"training.steps=20"}, func(c Config) bool { return c.Training.Steps == 20 }},
		{"float", []string{"training.lr=3e-4"}, func(c Config) bool { return c.Training.LR == 3e-4 }},
		{"int for float", []string{"training.grad_clip=2"}, func(c Config) bool { return c.Training.GradClip == 2 }},
		{"bool", []string{"parallelism.fsdp=true"}, func(c Config) bool { return c.Parallelism.FSDP }},
		{"bare string", []string{"run.name=foo"}, func(c Config) bool { return c.Run.Name == "foo" }},
		{"quoted string", []string{`run.name="foo bar"`}, func(c Config) bool { return c.Run.Name == "foo bar" }},
		{"number as string", []string{"run.name=123"}, func(c Config) bool { return c.Run.Name == "123" }},
		{"bare path", []string{"data.train=/tmp/some dir/x.txt"}, func(c Config) bool { return c.Data.Train == "/tmp/some dir/x.txt" }},
		{"bare enum", []string{"checkpoint.activation=attn_output"}, func(c Config) bool { return c.Checkpoint.Activation == "attn_output" }},
		{"empty string", []string{"data.eval="}, func(c Config) bool { return c.Data.Eval == "" }},
		{"array", []string{`data.include=["*.go","*.md"]`}, func(c Config) bool {
			return reflect.DeepEqual(c.Data.Include, []string{"*.go", "*.md"})
		}},
		{"model key", []string{"model.n_kv_heads=4"}, func(c Config) bool { return c.Model.NKVHeads == 4 }},
		{"sub-table", []string{"model.rope_scaling.type=yarn", "model.rope_scaling.factor=4"}, func(c Config) bool {
			return c.Model.RopeScaling == model.RopeScaling{Type: "yarn", Factor: 4, OriginalMaxPositionEmbeddings: 512}
		}},
		{"spaces", []string{" training.steps = 7 "}, func(c Config) bool { return c.Training.Steps == 7 }},
		{"in order", []string{"training.steps=5", "training.steps=6"}, func(c Config) bool { return c.Training.Steps == 6 }},
		{"others untouched", []string{"training.steps=5"}, func(c Config) bool { return c.Training.LR == 3e-3 && c.Run.Name == "tiny" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load("configs/tiny.toml", tt.sets)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) {
				t.Errorf("--set %q gave %+v", tt.sets, cfg)
			}
		})
	}
}

func TestOverrideErrors(t *testing.T) {
	tests := []struct {
		name string
		set  string
		want []string
	}{
		{"unknown key", "training.stepz=20", []string{"--set training.stepz=20", "unknown key training.stepz", "did you mean training.steps?"}},
		{"unknown section", "trainig.steps=20", []string{"trainig", "did you mean training?"}},
		{"no equals", "noequals", []string{`"noequals"`, "section.key=value"}},
		{"no section", "steps=20", []string{"steps=20", "section.key"}},
		{"bad key", "training.st eps=20", []string{"section.key"}},
		{"wrong type", "training.steps=abc", []string{"--set training.steps=abc", "training.steps"}},
		{"float for int", "data.seq_len=1.5", []string{"data.seq_len"}},
		{"bare string for array", "data.include=*.go", []string{"data.include"}},
		{"second key smuggled", "training.steps=20\nlr = 5", []string{"training.steps"}},
		{"invalid value", "training.steps=0", []string{"training.steps = 0"}},
		{"invalid enum", "device.kind=gpu", []string{"device.kind", `"gpu"`}},
		{"negative seed", "run.seed=-1", []string{"run.seed = -1"}},
		{"sub-table key", "model.rope_scaling.factr=2", []string{"unknown key model.rope_scaling.factr"}},
		{"sub-table value", "model.rope_scaling.type=ntk", []string{`model.rope_scaling.type = "ntk": unknown`, "linear, dynamic, yarn, llama3"}},
		{"empty table name", "model..factor=2", []string{"section.key"}},
		{"newline shown quoted", "training.stepz=1\n", []string{`--set "training.stepz=1\n"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load("configs/tiny.toml", []string{tt.set})
			wantErr(t, err, tt.want...)
		})
	}
}

// TestOverrideDoesNotAlias checks that Set leaves copies of the config alone.
func TestOverrideDoesNotAlias(t *testing.T) {
	a := Default()
	a.Data.Include = []string{"*.go"}
	b := a
	if err := b.Set(`data.include=["x"]`); err != nil {
		t.Fatal(err)
	}
	if a.Data.Include[0] != "*.go" || b.Data.Include[0] != "x" {
		t.Errorf("include: a %q, b %q; want a untouched", a.Data.Include, b.Data.Include)
	}
	if err := b.Set("training.steps=oops"); err == nil || b.Training.Steps != a.Training.Steps {
		t.Errorf("a failed Set changed the config (err %v, steps %d)", err, b.Training.Steps)
	}
}

func TestConfigRequirements(t *testing.T) {
	tests := []struct {
		path string
		sets []string
		want []string // substrings, each in some requirement; nil = no requirements
	}{
		{"configs/tiny.toml", nil, nil},
		{"configs/tiny.toml", []string{"checkpoint.activation=attn_output", "training.lr_schedule=linear"}, nil},
		{"configs/tiny.toml", []string{"data.format=c4"}, nil}, // every data format is read
		{"configs/llama7b-512k.toml", nil, []string{`parallelism.backend = "nccl": kernels: parallelism.backend = nccl needs a build with -tags cuda`,
			`device.kind = "cuda" needs a build with -tags cuda`}},
		{"configs/llama7b-512k.toml", []string{"parallelism.attention=attn2d"}, []string{"needs a build with -tags cuda"}},
		{"configs/tiny-sp4.toml", nil, nil},
		{"configs/tiny-sp4.toml", []string{"parallelism.sequence_parallel_degree=2", "parallelism.fsdp=true"}, nil},
		{"configs/tiny.toml", []string{"training.mixed_precision=fp16"}, nil},
		{"configs/tiny.toml", []string{"training.mixed_precision=bf16", "parallelism.world_size=2", "parallelism.fsdp=true"}, nil},
		{"configs/tiny.toml", []string{"parallelism.backend=mpi"}, nil},
		{"configs/tiny.toml", []string{"eval.interval=50", "data.eval=$GOROOT/src/net", "checkpoint.interval=100"}, nil},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.path)+strings.Join(tt.sets, ","), func(t *testing.T) {
			cfg, err := Load(tt.path, tt.sets)
			if err != nil {
				t.Fatal(err)
			}
			reqs := cfg.Requirements()
			if tt.want == nil && len(reqs) != 0 {
				t.Errorf("Requirements = %q, want none", reqs)
			}
			all := strings.Join(reqs, "\n")
			for _, w := range tt.want {
				if !strings.Contains(all, w) {
					t.Errorf("Requirements do not mention %q:\n%s", w, all)
				}
			}
		})
	}
}

// TestConfigNotes: a model state above 16 GiB is a note (with its share per rank under
// FSDP), not a requirement: the memory check is per rank, against what the process has.
func TestConfigNotes(t *testing.T) {
	cfg, err := Load("configs/llama7b-512k.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(cfg.Notes(), "\n")
	for _, w := range []string{"6.74B parameters", "100.4 GiB", "6.3 GiB per rank"} {
		if !strings.Contains(all, w) {
			t.Errorf("Notes do not mention %q:\n%s", w, all)
		}
	}
	if strings.Contains(strings.Join(cfg.Requirements(), "\n"), "GiB") {
		t.Errorf("Requirements still name the model state's size: %q", cfg.Requirements())
	}
	tiny, err := Load("configs/tiny.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := tiny.Notes(); len(n) != 0 {
		t.Errorf("tiny: notes %q, want none", n)
	}
	short := tiny
	short.Training.WarmupSteps, short.Training.Steps = 100, 10
	if n := strings.Join(short.Notes(), "\n"); !strings.Contains(n, "training.warmup_steps = 100 is more than training.steps = 10") || !strings.Contains(n, "10/100") {
		t.Errorf("a warmup of 100 in a run of 10 steps: notes %q", n)
	}
	for _, c := range []struct {
		warmup int
		lr     float64
		note   bool
	}{{2, 3e-4, true}, {0, 3e-3, true}, {9, 1e-4, true}, {10, 3e-3, false}, {2, 5e-5, false}} {
		quick := tiny
		quick.Training.WarmupSteps, quick.Training.LR, quick.Training.MinLR = c.warmup, c.lr, 0
		n := strings.Join(quick.Notes(), "\n")
		if got := strings.Contains(n, fmt.Sprintf("training.warmup_steps = %d at training.lr = %g: Adam's first updates", c.warmup, c.lr)); got != c.note {
			t.Errorf("warmup %d to lr %g: notes %q, want a note on the warmup: %v", c.warmup, c.lr, n, c.note)
		}
	}
	// a sliding window under a schedule that sends every block anyway
	for _, c := range []struct {
		attention string
		window    string
		want      string // "": no note
	}{
		{"zigzag", "32", `"zigzag" under model.sliding_window = 32 sends every block`},
		{"ulysses", "32", `"ulysses" under model.sliding_window = 32 sends every block`},
		{"attn2d", "32", `"attn2d" under model.sliding_window = 32`},
		{"ring", "32", ""},
		{"distflash", "32", ""},
		{"zigzag", "128", ""}, // no shorter than the sequence: nothing hidden
	} {
		cfg, err := Load("configs/tiny-sp4.toml", []string{"parallelism.attention=" + c.attention, "model.sliding_window=" + c.window})
		if err != nil {
			t.Fatal(err)
		}
		all := strings.Join(cfg.Notes(), "\n")
		if c.want == "" && all != "" || !strings.Contains(all, c.want) {
			t.Errorf("%s, window %s: notes %q, want %q", c.attention, c.window, all, c.want)
		}
	}
}

func TestConfigSummary(t *testing.T) {
	tests := []struct {
		path string
		want []string
	}{
		{"configs/tiny.toml", []string{"tiny:", "804.0K params", "1024 tokens/step", "world 1 (inproc)", "head_dim 32"}},
		{"configs/tiny-sp4.toml", []string{"1024 tokens/step", "world 4", "sequence parallel 4", "distflash"}},
		{"configs/llama7b-512k.toml", []string{"6.74B params", "524.3K tokens/step", "world 16 (nccl", "fsdp"}},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.path), func(t *testing.T) {
			cfg, err := Load(tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			s := cfg.Summary()
			for _, w := range tt.want {
				if !strings.Contains(s, w) {
					t.Errorf("Summary %q does not contain %q", s, w)
				}
			}
		})
	}
}

func TestConfigTokensPerStep(t *testing.T) {
	c := Default()
	c.Data.BatchSize, c.Data.SeqLen, c.Training.GradAccumSteps = 2, 64, 3
	c.Parallelism.WorldSize, c.Parallelism.SequenceParallelDegree = 8, 2 // 4 data-parallel replicas
	if got, want := c.TokensPerStep(), int64(2*64*3*4); got != want {
		t.Errorf("TokensPerStep = %d, want %d", got, want)
	}
}

// TestConfigSequenceParallelChecks: a schedule that cannot split the heads, or a sequence that
// does not split evenly over the layout's chunks, is refused with the reason.
func TestConfigSequenceParallelChecks(t *testing.T) {
	for _, c := range []struct {
		sets []string
		want string
	}{
		{[]string{"parallelism.attention=ulysses", "parallelism.world_size=8", "parallelism.sequence_parallel_degree=8"}, "n_heads (4) divisible by the 8"},
		{[]string{"parallelism.attention=zigzag", "data.seq_len=100"}, "must be a multiple of 8"},
		{[]string{"parallelism.attention=distflash", "data.seq_len=66"}, "must be a multiple of 4"},
	} {
		_, err := Load("configs/tiny-sp4.toml", c.sets)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want it to say %q", c.sets, err, c.want)
		}
	}
	if _, err := Load("configs/tiny-sp4.toml", []string{"parallelism.attention=ulysses", "parallelism.world_size=2", "parallelism.sequence_parallel_degree=2"}); err != nil {
		t.Errorf("ulysses on 2 ranks: %v", err)
	}
	if _, err := Load("configs/tiny-sp4.toml", []string{"parallelism.attention=ulysses"}); err != nil {
		t.Errorf("ulysses on 4 ranks, 2 kv heads (replicated): %v", err)
	}
}

// TestConfigNesting: a config whose arrays or inline tables nest deeper than maxTOMLDepth is
// refused before the decoder (whose time and memory grow with the square of the depth) sees
// it; brackets in strings and comments do not count, and real configs pass.
func TestConfigNesting(t *testing.T) {
	for _, tt := range []struct {
		text string
		line int
		ok   bool
	}{
		{"[model]\ndim = 64\n[data]\ninclude = [\"*.go\", [\"a\"]]\n", 0, true},
		{"x = \"" + strings.Repeat("[{", 100) + "\"\n# " + strings.Repeat("{", 100) + "\ny = '" + strings.Repeat("[", 100) + "'\n", 0, true},
		{"x = \"\"\"\n" + strings.Repeat("{", 100) + "\n\"\"\"\ny = '''" + strings.Repeat("[", 100) + "'''\n", 0, true},
		{"x = \"a\\\"" + strings.Repeat("{", 40) + "\"\n", 0, true},
		{"\n\nx = " + strings.Repeat("{a = ", 33) + "1" + strings.Repeat("}", 33) + "\n", 3, false},
		{"x = " + strings.Repeat("[", 40) + strings.Repeat("]", 40), 1, false},
		{"x = " + strings.Repeat("[", 32) + strings.Repeat("]", 32), 0, true},
	} {
		line, ok := tomlNestingOK([]byte(tt.text))
		if ok != tt.ok || !ok && line != tt.line {
			t.Errorf("%.40q: line %d, ok %v; want line %d, ok %v", tt.text, line, ok, tt.line, tt.ok)
		}
	}
	files, _ := filepath.Glob("configs/*.toml")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if _, ok := tomlNestingOK(b); !ok {
			t.Errorf("%s refused", f)
		}
	}
	path := filepath.Join(t.TempDir(), "deep.toml")
	os.WriteFile(path, []byte("x = "+strings.Repeat("{a = ", 3000)+"1"+strings.Repeat("}", 3000)+"\n"), 0o644)
	if _, err := Load(path, nil); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "nested more than 32 deep") {
		t.Errorf("3000 nested inline tables: %v", err)
	}
}

// TestMain runs the tests from the repository root, where configs/ is and where a user runs
// distflash: the configs name their paths, and the errors their files, as a user sees them.
func TestMain(m *testing.M) {
	if err := os.Chdir(".."); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// TestErrorsNameTheirOrigin: an error about keys that --set gave starts with those --set
// overrides (after the file's path when there is one); any other starts with the path, or
// without a file with the built-in defaults.
func TestErrorsNameTheirOrigin(t *testing.T) {
	file := writeConfig(t, "[training]\nsteps = 10\n")
	zero := writeConfig(t, "[training]\nsteps = 0\n")
	for _, c := range []struct {
		path string
		sets []string
		want string
	}{
		{"", []string{"run.name=x", "training.grad_clip=inf"}, "--set training.grad_clip=inf: training.grad_clip = +Inf: must be a finite number >= 0"},
		{"", []string{"training.steps=5", "training.steps=0"}, "--set training.steps=0: training.steps = 0: must be >= 1"},
		{"", []string{"model.n_kv_heads=3"}, "--set model.n_kv_heads=3: model.n_heads = 4 is not a multiple of model.n_kv_heads = 3"},
		{"", []string{"run.name=x", "parallelism.sequence_parallel_degree=4"}, "--set parallelism.sequence_parallel_degree=4: parallelism.world_size = 1 is not a multiple"},
		{"", []string{"data.seq_len=4096", "model.max_seq_len=1024"}, "--set data.seq_len=4096 --set model.max_seq_len=1024: data.seq_len = 4096 exceeds model.max_seq_len = 1024"},
		{"", []string{"model.rope_scaling.type=bogus"}, "--set model.rope_scaling.type=bogus: model.rope_scaling"},
		{file, []string{"training.steps=0"}, file + " with --set training.steps=0: training.steps = 0"},
		{file, []string{"run.name=x", "device.attention=own"}, file + ` with --set device.attention=own: device.attention = "own" with device.kind = "cpu"`},
		{file, []string{"run.name=x", "model.n_kv_heads=3"}, file + " with --set model.n_kv_heads=3: model.n_heads = 4 is not a multiple"},
		{zero, []string{"run.name=x"}, zero + ": training.steps = 0"},
	} {
		_, err := Load(c.path, c.sets)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q %q: %v, want it to start with %q", c.path, c.sets, err, c.want)
		}
	}
}

// TestAutoTileAndChunk (issue 41): the tile and chunk that training.mlp_tile and
// training.loss_chunk fall back to are multiples of 128 tokens (whole tiles of a GPU's GEMMs)
// within their 256 MiB of float32 values, or fewer than 128 where not even 128 fit; and
// checkpoint.activation = "auto" is the default, valid like the policies it chooses among.
func TestAutoTileAndChunk(t *testing.T) {
	for _, c := range []struct{ ffn, vocab, tile, chunk int }{
		{352, 256, 63488, 262144}, {5632, 32000, 3968, 2048}, {14336, 128256, 1536, 512},
	} {
		tile, chunk := AutoMLPTile(c.ffn), AutoLossChunk(c.vocab)
		if tile != c.tile || chunk != c.chunk || tile%128 != 0 || chunk%128 != 0 || tile*12*c.ffn > 256<<20 || chunk*4*c.vocab > 256<<20 {
			t.Errorf("ffn %d, vocab %d: tile %d, chunk %d; want %d and %d", c.ffn, c.vocab, tile, chunk, c.tile, c.chunk)
		}
	}
	if got := AutoLossChunk(4 << 20); got != 16 {
		t.Errorf("a vocabulary of 4M: chunk %d, want 16 (fewer than 128 fit)", got)
	}
	if got := AutoMLPTile(1 << 30); got != 1 {
		t.Errorf("an MLP of 1G units: tile %d, want 1", got)
	}
	cfg := Default()
	if cfg.Checkpoint.Activation != "auto" {
		t.Errorf("default checkpoint.activation %q, want auto", cfg.Checkpoint.Activation)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
}

// TestTrainSources: the [[data.sources]] tables with what they leave unset taken from [data],
// unnamed ones named after their paths, and data.train as the one source without them; with
// sources the default data.eval is no hold-out, and a source's eval is.
func TestTrainSources(t *testing.T) {
	c := Default()
	c.Data.Format, c.Data.TextKey, c.Data.Include = "jsonl", "body", []string{"*.jsonl"}
	if got, want := c.Data.TrainSources(), []SourceConfig{{Name: "train", Path: "$GOROOT/src", Format: "jsonl", TextKey: "body", Include: []string{"*.jsonl"}, Weight: 1}}; !reflect.DeepEqual(got, want) {
		t.Errorf("one source: %+v, want %+v", got, want)
	}
	if c.Data.HeldOut() != "$GOROOT/test" || !c.Data.HasHeldOut() {
		t.Errorf("one source: held out %q", c.Data.HeldOut())
	}
	c.Data.Sources = []SourceConfig{
		{Path: "~/fineweb-edu/sample/10BT/*.parquet", Format: "parquet", Weight: 3, Eval: "~/fineweb-edu/val.parquet"},
		{Name: "stack", Path: "shards/the-stack", Format: "tokens", TextKey: "content", Include: []string{"*.tokens"}, Weight: 1, Eval: "stack-val.jsonl.zst", EvalFormat: "jsonl"},
		{Path: "c4-train.*.json.gz", Weight: 1},
	}
	want := []SourceConfig{
		{Name: "10BT", Path: "~/fineweb-edu/sample/10BT/*.parquet", Format: "parquet", TextKey: "body", Include: []string{"*.jsonl"}, Weight: 3, Eval: "~/fineweb-edu/val.parquet", EvalFormat: "parquet"},
		{Name: "stack", Path: "shards/the-stack", Format: "tokens", TextKey: "content", Include: []string{"*.tokens"}, Weight: 1, Eval: "stack-val.jsonl.zst", EvalFormat: "jsonl"},
		{Name: "c4-train", Path: "c4-train.*.json.gz", Format: "jsonl", TextKey: "body", Include: []string{"*.jsonl"}, Weight: 1},
	}
	if got := c.Data.TrainSources(); !reflect.DeepEqual(got, want) {
		t.Errorf("sources:\n got %+v\nwant %+v", got, want)
	}
	if c.Data.HeldOut() != "" || !c.Data.HasHeldOut() {
		t.Errorf("sources with evals, default data.eval: held out %q, has %v; want none of data.eval's, but the sources'", c.Data.HeldOut(), c.Data.HasHeldOut())
	}
	c.Data.Eval = "val.jsonl"
	if c.Data.HeldOut() != "val.jsonl" {
		t.Errorf("sources and data.eval set: held out %q", c.Data.HeldOut())
	}
	for path, name := range map[string]string{"shards/code": "code", "/data/dclm/": "dclm", "c4-train.00000-of-01024.json.gz": "c4-train", "./*.parquet": "./*.parquet", "x/.hidden.jsonl": ".hidden"} {
		if got := SourceName(path); got != name {
			t.Errorf("SourceName(%q) = %q, want %q", path, got, name)
		}
	}
}

// TestSourcesFromTOML: [[data.sources]] tables read from a file, and validated there.
func TestSourcesFromTOML(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mix.toml")
	doc := "[data]\ntrain = \"$GOROOT/src\"\n\n[[data.sources]]\nname = \"web\"\npath = \"web/*.parquet\"\nformat = \"parquet\"\nweight = 0.7\neval = \"web-val.parquet\"\n\n[[data.sources]]\npath = \"code.jsonl.zst\"\nformat = \"jsonl\"\ntext_key = \"content\"\nweight = 0.3\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := c.Data.TrainSources()
	if len(got) != 2 || got[0].Name != "web" || got[0].Weight != 0.7 || got[1].Name != "code" || got[1].TextKey != "content" || got[0].TextKey != "text" {
		t.Errorf("sources %+v", got)
	}
	if err := os.WriteFile(path, []byte(doc+"\n[[data.sources]]\npath = \"books\"\nweight = -1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path, nil)
	wantErr(t, err, path, `data.sources[3] ("books"): weight = -1`)
}

// TestFlattenArraysOfObjects: the tables of an array are flattened key by key, other arrays
// stay values.
func TestFlattenArraysOfObjects(t *testing.T) {
	got, err := Flatten([]byte(`{"data": {"include": ["*.go"], "sources": [{"name": "a", "weight": 1e0}, {"name": "b", "weight": 0.5}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"data.include": `["*.go"]`, "data.sources.0.name": `"a"`, "data.sources.0.weight": "1", "data.sources.1.name": `"b"`, "data.sources.1.weight": "0.5"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Flatten = %v, want %v", got, want)
	}
}
