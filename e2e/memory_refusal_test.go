package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestSuggestedLengthRuns (issue 33, items 2 and 5): in a memory cgroup, the longest
// data.seq_len a refusal suggests trains (the suggestion leaves room for what the estimate
// misses, so the run is not killed); and a model whose state alone does not fit is told to
// shard it with FSDP over enough MPI processes, not to change what does not shrink it (the
// activation policy, more sequence-parallel ranks).
func TestSuggestedLengthRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a cgroup needs root; CI runs this as root")
	}
	slow(t, "TestTrainRefusesTooSmallCgroup refuses in a cgroup")
	cg := newMemoryCgroup(t, 256<<20)
	dir := t.TempDir()
	inCgroup := func(args ...string) (string, error) {
		script := `echo $$ > "$0/cgroup.procs" && exec "$@"`
		out, err := exec.Command("sh", append([]string{"-c", script, cg.dir, bin}, args...)...).CombinedOutput()
		return string(out), err
	}
	base := []string{"train", "--progress=false", "--set", "training.steps=2", "--set", "data.max_bytes=1048576",
		"--set", "data.batch_size=1", "--set", "model.max_seq_len=1048576"}
	out, err := inCgroup(append(base, "--set", "data.seq_len=1048576", "--set", "run.output_dir="+filepath.Join(dir, "big"))...)
	m := regexp.MustCompile(`The longest data.seq_len that fits is (\d+)`).FindStringSubmatch(out)
	if err == nil || m == nil {
		t.Fatalf("seq_len 1M in a 256 MiB cgroup: %v; want a refusal naming the longest that fits:\n%s", err, out)
	}
	out, err = inCgroup(append(base, "--set", "data.seq_len="+m[1], "--set", "run.output_dir="+filepath.Join(dir, "fits"))...)
	if err != nil {
		t.Errorf("the suggested data.seq_len = %s in the same cgroup: %v\n%s", m[1], err, tailOf(out, 10))
	}
	t.Logf("suggested and trained: data.seq_len = %s", m[1])

	// a model of about 200M parameters: its fp32 state (16 bytes a parameter) is 3 GiB
	big := []string{"train", "--progress=false", "--set", "model.dim=1024", "--set", "model.n_layers=16", "--set", "model.n_heads=16",
		"--set", "model.n_kv_heads=16", "--set", "model.ffn_dim=2816", "--set", "run.output_dir=" + filepath.Join(dir, "huge")}
	out, err = inCgroup(big...)
	for _, want := range []string{"The model state alone does not fit", "parallelism.fsdp = true over", "MPI processes"} {
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("a model whose state does not fit: %v; no %q in:\n%s", err, want, out)
		}
	}
	for _, wrong := range []string{`checkpoint.activation = "layer"`, "more parallelism.sequence_parallel_degree"} {
		if strings.Contains(out, wrong) {
			t.Errorf("the refusal names %q, which does not shrink the model state:\n%s", wrong, out)
		}
	}
}

// TestCgroupFileCacheIsAvailable (issue 43, item 3): the file cache of a memory cgroup, which
// the kernel reclaims before it kills anything, is not counted as used. After a process in the
// group writes a file of twice the group's limit to disk (not tmpfs, whose pages are not
// reclaimable), the group's usage is nearly its limit, almost all of it inactive file cache;
// plan still sees about the memory it saw before the file, and the tiny run trains there.
func TestCgroupFileCacheIsAvailable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a cgroup needs root; CI runs this as root")
	}
	const limit = 384 << 20
	cg := newMemoryCgroup(t, limit)
	inCgroup := func(args ...string) (string, error) {
		script := `echo $$ > "$0/cgroup.procs" && exec "$@"`
		out, err := exec.Command("sh", append([]string{"-c", script, cg.dir}, args...)...).CombinedOutput()
		return string(out), err
	}
	available := func() (float64, string) {
		t.Helper()
		out, err := inCgroup(bin, "plan", "--cluster", "1x1xcpu", "--flops", "1e9", "--format", "json")
		if err != nil {
			t.Fatalf("plan in the cgroup: %v\n%s", err, out)
		}
		var rep struct {
			Cluster struct {
				GPU struct {
					MemBytes float64 `json:"mem_bytes"`
				} `json:"gpu"`
				MemSource string `json:"mem_source"`
			} `json:"cluster"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("plan's json: %v\n%s", err, out)
		}
		return rep.Cluster.GPU.MemBytes, rep.Cluster.MemSource
	}
	before, src := available()
	if before <= 0 || before > limit {
		t.Fatalf("plan in a %d MiB cgroup sees %.0f MiB (%s)", limit>>20, before/(1<<20), src)
	}

	dir := t.TempDir()
	if fs, err := exec.Command("stat", "-f", "-c", "%T", dir).Output(); err != nil || strings.TrimSpace(string(fs)) == "tmpfs" {
		// the package's directory lies in the checkout, on disk
		if dir, err = os.MkdirTemp(".", "filecache-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if fs, err := exec.Command("stat", "-f", "-c", "%T", dir).Output(); err != nil || strings.TrimSpace(string(fs)) == "tmpfs" {
			t.Skipf("no directory on disk to write the file to (%s: %q, %v): tmpfs pages are not file cache", dir, fs, err)
		}
	}
	file := filepath.Join(dir, "cache.bin")
	if out, err := inCgroup("dd", "if=/dev/zero", "of="+file, "bs=1M", fmt.Sprint("count=", 2*limit>>20), "conv=fsync"); err != nil {
		t.Fatalf("write %d MiB in the cgroup: %v\n%s", 2*limit>>20, err, out)
	}
	var stat []string // memory.stat's file cache
	var inactive int64
	b, _ := os.ReadFile(filepath.Join(cg.dir, "memory.stat"))
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "file ") || strings.HasPrefix(line, "cache ") {
			stat = append(stat, line)
		}
		if k, v, _ := strings.Cut(line, " "); k == "inactive_file" || k == "total_inactive_file" {
			n, _ := strconv.ParseInt(v, 10, 64)
			inactive = max(inactive, n)
		}
	}
	if inactive < limit/2 {
		t.Fatalf("the file of %d MiB left %d MiB of inactive file cache in the cgroup; memory.stat:\n%s", 2*limit>>20, inactive>>20, strings.Join(stat, "\n"))
	}
	after, _ := available()
	t.Logf("available in the %d MiB cgroup: %.0f MiB before a file of %d MiB was written in it, %.0f MiB after (%s)",
		limit>>20, before/(1<<20), 2*limit>>20, after/(1<<20), src)
	if after < 0.9*before {
		t.Errorf("after a file of %d MiB was written in the cgroup, plan sees %.0f MiB available, %.0f MiB before: the file cache counted as used; memory.stat:\n%s",
			2*limit>>20, after/(1<<20), before/(1<<20), strings.Join(stat, "\n"))
	}
	out, err := inCgroup(bin, "train", "--progress=false", "--set", "training.steps=2", "--set", "data.max_bytes=1048576",
		"--set", "run.output_dir="+filepath.Join(t.TempDir(), "runs"))
	if err != nil {
		t.Errorf("the tiny run in the cgroup, its file cache full: %v\n%s", err, tailOf(out, 10))
	}
}

// TestTrainRefusesEvalThatDoesNotFit (issue 43, item 4): the held-out evaluation during
// training runs on the training ranks beside the training state, a forward of up to
// eval.seq_len tokens. In a 640 MiB cgroup, tiny's training step at data.seq_len 1024 fits
// (about 0.5 GiB by plan) and its evaluation at eval.seq_len 32768 does not (about 1.5 GiB):
// train refuses before step 1, naming eval.seq_len and the longest that fits, and plan says
// both figures; the suggested eval.seq_len trains with its evaluation in the same cgroup.
func TestTrainRefusesEvalThatDoesNotFit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a cgroup needs root; CI runs this as root")
	}
	cg := newMemoryCgroup(t, 640<<20)
	inCgroup := func(args ...string) (string, error) {
		script := `echo $$ > "$0/cgroup.procs" && exec "$@"`
		out, err := exec.Command("sh", append([]string{"-c", script, cg.dir, bin}, args...)...).CombinedOutput()
		return string(out), err
	}
	dir := t.TempDir()
	heldOut := filepath.Join(dir, "heldout")
	if err := os.MkdirAll(heldOut, 0o755); err != nil {
		t.Fatal(err)
	}
	// one document longer than eval.seq_len, so that an evaluation scores the whole length
	text := strings.Repeat("a held-out document, long enough for the whole evaluation length.\n", 600)
	if err := os.WriteFile(filepath.Join(heldOut, "doc.txt"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	sets := []string{"--set", "data.seq_len=1024", "--set", "model.max_seq_len=32768", "--set", "eval.interval=1",
		"--set", "eval.samples=1", "--set", "data.eval=" + heldOut, "--set", "data.max_bytes=1048576"}
	at := func(evalLen string) []string { return append(slices.Clone(sets), "--set", "eval.seq_len="+evalLen) }

	out, err := inCgroup(append([]string{"plan", "--cluster", "1x1xcpu", "--flops", "1e9", "--format", "json"}, at("32768")...)...)
	var rep struct {
		Plans []struct {
			Memory struct {
				Peak float64
				Fits bool
			} `json:"memory"`
			Eval *struct {
				Peak float64
				Fits bool
			} `json:"eval_memory"`
			EvalMaxSeqLen int `json:"eval_max_seq_len"`
		} `json:"plans"`
	}
	if err != nil || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Plans) != 1 {
		t.Fatalf("plan in the cgroup: %v\n%s", err, out)
	}
	if p := rep.Plans[0]; !p.Memory.Fits || p.Eval == nil || p.Eval.Fits || p.Eval.Peak <= p.Memory.Peak || p.EvalMaxSeqLen <= 0 {
		t.Errorf("plan's json: the step %+v, the evaluation %+v (longest eval.seq_len %d); want a step that fits and a larger evaluation that does not",
			p.Memory, p.Eval, p.EvalMaxSeqLen)
	}
	out, _ = inCgroup(append([]string{"plan", "--cluster", "1x1xcpu", "--flops", "1e9"}, at("32768")...)...)
	for _, want := range []string{"held-out evaluation during training", "eval.seq_len", "DOES NOT FIT", "longest eval.seq_len that fits"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan's text lacks %q:\n%s", want, out)
		}
	}

	runDir := filepath.Join(dir, "big")
	out, err = inCgroup(append([]string{"train", "--progress=false", "--set", "training.steps=2", "--set", "run.output_dir=" + runDir}, at("32768")...)...)
	m := regexp.MustCompile(`The longest eval.seq_len that fits is (\d+)`).FindStringSubmatch(out)
	if err == nil || m == nil || !strings.Contains(out, "eval.seq_len = 32768") || strings.Contains(out, "step 1") {
		t.Fatalf("eval.seq_len 32768 over data.seq_len 1024 in a 640 MiB cgroup: %v; want a refusal before step 1 naming eval.seq_len and the longest that fits:\n%s", err, tailOf(out, 10))
	}
	if _, err := os.Stat(runDir); !os.IsNotExist(err) {
		t.Errorf("the refused run wrote its directory: %v", err)
	}
	if testing.Short() {
		return // the suggested length's evaluation is the slow part
	}
	out, err = inCgroup(append([]string{"train", "--progress=false", "--set", "training.steps=1", "--set", "run.output_dir=" + filepath.Join(dir, "fits")}, at(m[1])...)...)
	if err != nil || !strings.Contains(out, "eval step 1") {
		t.Errorf("the suggested eval.seq_len = %s in the same cgroup: %v\n%s", m[1], err, tailOf(out, 10))
	}
	t.Logf("suggested and evaluated during training: eval.seq_len = %s", m[1])
}
