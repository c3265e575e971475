package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
