//go:build cuda

package kernels

// The CUDA backend's cuDNN path run against cudnnstub (testdata/cudnnstub/cudnnstub.c), a
// shared library built here with the C compiler that stands in for libcudnn.so.9: it checks
// every descriptor, attribute and finalisation as cuDNN documents them, logs every call, and
// writes out each operation graph and each execution's variant pack. The backend runs on the
// fake device of cuda_fake_test.go (its kernels and copies are recorded, not run), with a
// cuDNN handle on the stub. Needs no GPU.

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"distflash/internal/ctest"
	"distflash/kernels/cuda"
)

const cudnnStubChildEnv = "DISTFLASH_CUDNNSTUB_CHILD"

// The stub's context and stream (any non-null values: the stub only records them).
const (
	stubCtx    = 0xc0de0000
	stubStream = 0x5eed0000
)

// cudnnStubScenarios are the child processes of TestCUDAHostCUDNNStub: each loads the library
// once (a process loads cuDNN once), with the stub's settings in env. $NVRTC13 and $NVRTC12
// stand for the stub NVRTC libraries stubNVRTC builds, $SITE for a pip-style site-packages
// holding the cuDNN stub and an NVRTC wheel's folder.
var cudnnStubScenarios = []struct {
	name string
	env  []string
}{
	{"h100-cudnn-9.10.2", []string{"CUDNNSTUB_VERSION=91002"}},
	{"h100-cudnn-9.26.0", []string{"CUDNNSTUB_VERSION=92600"}},
	{"h100-cudnn-9.0.0", []string{"CUDNNSTUB_VERSION=90000"}},
	{"h100-cudnn-9.26.0-deterministic", []string{"CUDNNSTUB_VERSION=92600"}},
	{"a100-cudnn-9.5.1", []string{"CUDNNSTUB_VERSION=90501", "CUDNNSTUB_SM=80", "CUDNNSTUB_CUDART=12080", "DISTFLASH_LIBNVRTC=$NVRTC12"}},
	{"no-engine", []string{"CUDNNSTUB_ENGINES_A=0", "CUDNNSTUB_ENGINES_FALLBACK=0"}},
	{"fallback-engine", []string{"CUDNNSTUB_ENGINES_A=1", "CUDNNSTUB_PLAN_FAILS=1"}},
	{"workspace-oom", []string{"CUDNNSTUB_VERSION=92600", "CUDNNSTUB_WORKSPACE=1099511627776"}},
	{"plan-cache-full", []string{"CUDNNSTUB_VERSION=92600"}},
	{"too-old", []string{"CUDNNSTUB_VERSION=80907"}},
	{"buggy-9.10.0", []string{"CUDNNSTUB_VERSION=91000"}},
	{"missing", nil},
	{"cudnn-mode-missing", nil},
	{"no-nvrtc", []string{"DISTFLASH_LIBNVRTC=/nonexistent/libnvrtc.so.13"}},
	{"no-nvrtc-builtins", []string{"DISTFLASH_LIBNVRTC=$NOBUILTINS"}},
	{"nvrtc-cuda-mismatch", []string{"CUDNNSTUB_CUDART=12080"}},
	{"nvrtc-wheel-layout", []string{"DISTFLASH_LIBNVRTC=", "DISTFLASH_LIBCUDNN=$SITE/nvidia/cudnn/lib/libcudnn.so.9",
		"DISTFLASH_LIBCUDA=$SITE/nvidia/cudnn/lib/libcudnn.so.9", "CUDNNSTUB_VERSION=92600"}},
}

// TestCUDAHostCUDNNStub builds cudnnstub and the stub NVRTC and runs each scenario of
// cudnnStubScenarios in a child process of the test binary (DISTFLASH_LIBCUDNN and
// DISTFLASH_LIBCUDA naming the stub, or a file that does not exist for "missing";
// DISTFLASH_LIBNVRTC the stub NVRTC of CUDA 13 unless the scenario says otherwise; no python3
// and no LD_LIBRARY_PATH, so that only what the scenario names is found); the child's checks
// are cudnnStubChild's.
func TestCUDAHostCUDNNStub(t *testing.T) {
	if os.Getenv(cudnnStubChildEnv) != "" {
		cudnnStubChild(t, os.Getenv(cudnnStubChildEnv))
		return
	}
	lib := buildCUDNNStub(t)
	nv := stubNVRTC(t, lib)
	empty := t.TempDir()
	for _, sc := range cudnnStubScenarios {
		t.Run(sc.name, func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), "calls.log")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCUDAHostCUDNNStub$", "-test.v")
			cudnn := lib
			if strings.Contains(sc.name, "missing") {
				cudnn = "/nonexistent/libcudnn.so.9"
			}
			cmd.Env = append(os.Environ(), cudnnStubChildEnv+"="+sc.name, "DISTFLASH_LIBCUDNN="+cudnn, "DISTFLASH_LIBCUDA="+lib,
				"DISTFLASH_LIBNVRTC="+nv.lib13, "CUDNNSTUB_LOG="+logPath, "DISTFLASH_ATTENTION=", "PATH="+empty, "LD_LIBRARY_PATH=")
			for _, e := range sc.env {
				e = strings.NewReplacer("$NVRTC12", nv.lib12, "$NOBUILTINS", nv.noBuiltins, "$SITE", nv.site).Replace(e)
				cmd.Env = append(cmd.Env, e)
			}
			out, err := cmd.CombinedOutput()
			if err != nil {
				log, _ := os.ReadFile(logPath)
				t.Fatalf("the child failed: %v\n%s\nthe stub's log (last 60 lines):\n%s", err, out, tail(string(log), 60))
			}
			if testing.Verbose() {
				t.Logf("%s", out)
			}
		})
	}
}

// stubNVRTCs are the stub NVRTC libraries: CUDA 13's and 12's, each with its builtins beside
// it; CUDA 13's without them; and a site-packages tree laid out as pip installs the cuDNN
// and NVRTC wheels (nvidia/cudnn/lib, nvidia/cu13/lib).
type stubNVRTCs struct {
	lib13, lib12, noBuiltins, site string
}

// stubNVRTC builds testdata/cudnnstub/nvrtcstub.c into libnvrtc.so.MAJOR (nvrtcVersion says
// MAJOR.9) and libnvrtc-builtins.so.MAJOR.9, with those sonames.
func stubNVRTC(t *testing.T, cudnnStub string) stubNVRTCs {
	cc := ctest.Compiler(t, "the NVRTC stub")
	dir := t.TempDir()
	build := func(out, soname string, major int, builtins bool) {
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			t.Fatal(err)
		}
		args := slices.Concat(cc[1:], []string{"-shared", "-fPIC", "-Wall", "-Werror", fmt.Sprintf("-DNVRTC_MAJOR=%d", major),
			"-Wl,-soname," + soname, "-o", out, filepath.Join("testdata", "cudnnstub", "nvrtcstub.c")})
		if builtins {
			args = append(args, "-DBUILTINS")
		}
		if b, err := exec.Command(cc[0], args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", cc[0], strings.Join(args, " "), err, b)
		}
	}
	var n stubNVRTCs
	for _, major := range []int{12, 13} {
		lib := filepath.Join(dir, "nvrtc", fmt.Sprintf("libnvrtc.so.%d", major))
		build(lib, filepath.Base(lib), major, false)
		b := fmt.Sprintf("libnvrtc-builtins.so.%d.9", major)
		build(filepath.Join(dir, "nvrtc", b), b, major, true)
		if major == 13 {
			n.lib13 = lib
		} else {
			n.lib12 = lib
		}
	}
	n.noBuiltins = filepath.Join(dir, "nobuiltins", "libnvrtc.so.13")
	build(n.noBuiltins, "libnvrtc.so.13", 13, false)
	n.site = filepath.Join(dir, "site-packages")
	build(filepath.Join(n.site, "nvidia", "cu13", "lib", "libnvrtc.so.13"), "libnvrtc.so.13", 13, false)
	build(filepath.Join(n.site, "nvidia", "cu13", "lib", "libnvrtc-builtins.so.13.9"), "libnvrtc-builtins.so.13.9", 13, true)
	cudnn := filepath.Join(n.site, "nvidia", "cudnn", "lib", "libcudnn.so.9")
	if err := os.MkdirAll(filepath.Dir(cudnn), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(cudnnStub)
	if err == nil {
		err = os.WriteFile(cudnn, b, 0o755)
	}
	if err == nil {
		err = os.Symlink("libcudnn.so.9", filepath.Join(filepath.Dir(cudnn), "libcudnn_graph.so.9"))
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// buildCUDNNStub compiles the stub into a temporary directory (-Wl,--no-undefined: it must
// define every entry point it declares from cudnn_abi_funcs.h), with libcudnn_graph.so.9 beside
// it (a link to it), as cuDNN 9's libcudnn.so.9 has its sub-libraries.
func buildCUDNNStub(t *testing.T) string {
	cc := ctest.Compiler(t, "the cuDNN stub")
	lib := filepath.Join(t.TempDir(), "libcudnnstub.so")
	args := slices.Concat(cc[1:], []string{"-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-I", filepath.Join("cuda"),
		"-o", lib, filepath.Join("testdata", "cudnnstub", "cudnnstub.c"), "-Wl,--no-undefined", "-lpthread"})
	out, err := exec.Command(cc[0], args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", cc[0], strings.Join(args, " "), err, out)
	}
	if err := os.Symlink(filepath.Base(lib), filepath.Join(filepath.Dir(lib), "libcudnn_graph.so.9")); err != nil {
		t.Fatal(err)
	}
	return lib
}

// ---- the stub's log ----

// stubLine is one line of the log: its first word and its key=value pairs (why= takes the rest
// of the line).
type stubLine struct {
	text string
	name string
	kv   map[string]string
}

func parseStubLine(line string) stubLine {
	l := stubLine{text: line, kv: map[string]string{}}
	if i := strings.Index(line, " why="); i >= 0 {
		l.kv["why"] = line[i+5:]
		line = line[:i]
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return l
	}
	l.name = f[0]
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		l.kv[k] = v
	}
	return l
}

// stubLog reads the log from the child's phase marks on.
type stubLog struct {
	path string
	off  int
}

// mark appends "# phase" to the log.
func (l *stubLog) mark(t *testing.T, phase string) {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err == nil {
		_, err = fmt.Fprintf(f, "# %s\n", phase)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// since returns the lines written since the last call.
func (l *stubLog) since(t *testing.T) []stubLine {
	b, err := os.ReadFile(l.path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	new := b[min(l.off, len(b)):]
	l.off = len(b)
	var lines []stubLine
	sc := bufio.NewScanner(strings.NewReader(string(new)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if s := sc.Text(); s != "" && !strings.HasPrefix(s, "# ") {
			lines = append(lines, parseStubLine(s))
		}
	}
	return lines
}

// stubGraph is an operation graph as the stub wrote it at finalisation.
type stubGraph struct {
	tensors map[int64]stubTensor
	ops     []stubLine
}

type stubTensor struct {
	dtype            int
	dims, strides    []int64
	virtual, byValue bool
	ragged           int64 // the ragged offset's uid, 0 for none
}

func ints(s string) []int64 {
	var v []int64
	for _, f := range strings.Split(s, ",") {
		if f == "" || f == "-" {
			continue
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			panic(err)
		}
		v = append(v, n)
	}
	return v
}

func atoi(s string) int64 {
	if s == "-" || s == "" {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		panic(fmt.Sprintf("%q: %v", s, err))
	}
	return n
}

// graphs returns the operation graphs in lines.
func graphs(lines []stubLine) []*stubGraph {
	var gs []*stubGraph
	var g *stubGraph
	for _, l := range lines {
		switch l.name {
		case "graph":
			g = &stubGraph{tensors: map[int64]stubTensor{}}
			gs = append(gs, g)
		case "tensor":
			g.tensors[atoi(l.kv["uid"])] = stubTensor{dtype: int(atoi(l.kv["dtype"])), dims: ints(l.kv["dims"]),
				strides: ints(l.kv["strides"]), virtual: l.kv["virtual"] == "1", byValue: l.kv["byvalue"] == "1", ragged: atoi(l.kv["ragged"])}
		case "op":
			g.ops = append(g.ops, l)
		}
	}
	return gs
}

// execution is one cudnnBackendExecute: its bound addresses and by-value scalars by uid.
type execution struct {
	stream string
	ws     uint64
	ptrs   map[int64]uint64
	values map[int64]float64
}

func executions(t *testing.T, lines []stubLine) []execution {
	var es []execution
	for _, l := range lines {
		switch l.name {
		case "execute":
			ws, _ := strconv.ParseUint(strings.TrimPrefix(l.kv["workspace"], "0x"), 16, 64)
			es = append(es, execution{stream: l.kv["stream"], ws: ws, ptrs: map[int64]uint64{}, values: map[int64]float64{}})
		case "bind":
			e := &es[len(es)-1]
			uid := atoi(l.kv["uid"])
			if v, ok := l.kv["value"]; ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("%q: %v", l.text, err)
				}
				e.values[uid] = f
			} else {
				p, err := strconv.ParseUint(strings.TrimPrefix(l.kv["ptr"], "0x"), 16, 64)
				if err != nil {
					t.Fatalf("%q: %v", l.text, err)
				}
				e.ptrs[uid] = p
			}
		}
	}
	return es
}

// failures returns the calls that failed, but for the execution plans the stub refuses on
// purpose (CUDNNSTUB_PLAN_FAILS: an engine that does not take the graph, which the builder
// answers by trying the next).
func failures(lines []stubLine) []string {
	var f []string
	for _, l := range lines {
		if l.name == "cudnnBackendFinalize" && l.kv["type"] == "EXECUTION_PLAN" && l.kv["result"] == "3001" {
			continue
		}
		if l.kv["result"] != "" {
			f = append(f, l.text)
		}
	}
	return f
}

// ---- the child ----

// stubBlock is one attention block the child runs.
type stubBlock struct {
	name string
	sh   AttnShape
	kind string // the path expected: "cudnn <kind>" or "own: <why>"
}

// seqPos is n consecutive positions from p0.
func seqPos(p0, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(p0 + i)
	}
	return p
}

// stubStarts returns each position's document start (documents start at starts, sorted) and
// with a window the later of that and p − window + 1.
func stubStarts(pos []int32, starts []int32, window int) []int32 {
	q := make([]int32, len(pos))
	for i, p := range pos {
		for _, s := range starts {
			if s <= p {
				q[i] = s
			}
		}
		if window > 0 {
			q[i] = max(q[i], p-int32(window)+1)
		}
	}
	return q
}

// stubBlocks are the blocks of the main scenario: every kind cuDNN takes, GQA and MHA, and some
// it does not.
func stubBlocks() []stubBlock {
	const H, KVH, hd = 8, 2, 64
	sh := func(qp, kp, qs []int32, causal bool, kvh int) AttnShape {
		s := AttnShape{NQ: len(qp), NK: len(kp), Heads: H, KVHeads: kvh, HeadDim: hd, Causal: causal,
			Scale: float32(1 / math.Sqrt(hd)), QPos: qp, KPos: kp, QStart: qs}
		if !causal {
			s.QPos, s.KPos = nil, nil
		}
		return s
	}
	diag := seqPos(0, 128)
	cyclic := make([]int32, 128)
	for i := range cyclic {
		cyclic[i] = int32(4 * i)
	}
	return []stubBlock{
		{"full", sh(seqPos(0, 128), seqPos(0, 96), nil, false, KVH), "cudnn full"},
		{"past", sh(seqPos(256, 128), seqPos(0, 128), nil, true, KVH), "cudnn full"},
		{"causal", sh(diag, diag, nil, true, KVH), "cudnn causal"},
		{"causal-mha", sh(diag, diag, nil, true, H), "cudnn causal"},
		{"bottom-right", sh(seqPos(64, 64), seqPos(0, 128), nil, true, KVH), "cudnn causal bottom-right"},
		{"shifted", sh(seqPos(32, 128), seqPos(0, 128), nil, true, KVH), "cudnn causal shifted"},
		{"band", sh(diag, diag, stubStarts(diag, nil, 48), true, KVH), "cudnn band"},
		{"documents-diagonal", sh(diag, diag, stubStarts(diag, []int32{0, 40, 100}, 0), true, KVH), "cudnn documents causal"},
		{"documents-past", sh(seqPos(128, 128), seqPos(0, 128), stubStarts(seqPos(128, 128), []int32{0, 50, 180}, 0), true, KVH),
			"cudnn documents"},
		{"documents-band", sh(diag, diag, stubStarts(diag, []int32{0, 40, 100}, 16), true, KVH), "cudnn documents band"},
		{"cyclic", sh(cyclic, cyclic, nil, true, KVH), "own: keys at non-consecutive positions"},
	}
}

// expectPath is the path block b takes in direction dir ("forward" or "backward") on the
// scenario's cuDNN version and GPU ("9.10.2 sm_90"): what stubBlocks says, except where that
// version or GPU cannot compute the block (SDPA.Check's support table, whose first refusing
// rule gives the reason).
func expectPath(scenario, dir string, b stubBlock) string {
	const (
		shift  = "own: a shifted diagonal (right bound 32) needs cuDNN ≥ 9.6"
		window = "own: a sliding window (left bound) needs cuDNN ≥ 9.2"
		skv64  = "own: a backward with 64 key rows (s_kv % 128 = 64) on Hopper needs cuDNN ≥ 9.26 (NaN before)"
		ragged = "own: ragged offsets need cuDNN ≥ 9.1"
		a100   = "own: ragged offsets on sm_80 need cuDNN ≥ 9.18.1"
	)
	over := map[string]map[string]string{
		"9.0.0 sm_90": {
			"bottom-right":                "own: bottom-right alignment needs cuDNN ≥ 9.3",
			"shifted":                     shift,
			"band":                        window,
			"documents-diagonal forward":  ragged,
			"documents-diagonal backward": skv64,
			"documents-past":              ragged,
			"documents-band forward":      window,
			"documents-band backward":     skv64,
		},
		"9.10.2 sm_90": {
			"documents-diagonal backward": skv64,
			"documents-past backward":     "own: a ragged backward on Hopper needs cuDNN ≥ 9.18 (NaN before)",
			"documents-band backward":     skv64,
		},
		"9.5.1 sm_80": {
			"shifted":            shift,
			"documents-diagonal": a100,
			"documents-past":     a100,
			"documents-band":     a100,
		},
	}
	if w, ok := over[scenario][b.name+" "+dir]; ok {
		return w
	}
	if w, ok := over[scenario][b.name]; ok {
		return w
	}
	return b.kind
}

// stubVersion is the cuDNN version the stub reports in this child.
func stubVersion() int {
	if v := int(atoi(os.Getenv("CUDNNSTUB_VERSION"))); v != 0 {
		return v
	}
	return 91002
}

// cudnnStubChild runs scenario name against the stub and checks the log as it goes.
func cudnnStubChild(t *testing.T, name string) {
	log := &stubLog{path: os.Getenv("CUDNNSTUB_LOG")}
	var notices []string
	cudnnNotice = func(m string) { notices = append(notices, m) }
	c, f := newFakeCUDA(t)
	c.initCUDNN()
	c.dnn.open = func() (*cuda.DNN, error) { return cuda.OpenDNNOn(stubCtx, stubStream) }
	if strings.HasPrefix(name, "a100") {
		c.info.major, c.info.minor = 8, 0
	}
	c.SetMatMulPrecision(BF16)
	switch name {
	case "missing", "too-old", "buggy-9.10.0", "no-nvrtc", "no-nvrtc-builtins", "nvrtc-cuda-mismatch":
		stubFallback(t, c, log, name, &notices)
		return
	case "cudnn-mode-missing":
		err := c.SetAttention(AttentionCUDNN)
		for _, want := range []string{"kernels: device.attention = cudnn: ", "cannot load cuDNN", "/nonexistent/libcudnn.so.9", "DISTFLASH_LIBCUDNN"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("SetAttention(cudnn) without cuDNN: %v, want an error with %q", err, want)
			}
		}
		if err := c.SetAttention("fast"); err == nil || !strings.Contains(err.Error(), `device.attention = "fast"`) {
			t.Errorf("SetAttention(fast): %v", err)
		}
		return
	case "no-engine":
		b := stubBlocks()[2]
		for range 2 {
			runStubForward(c, b.sh)
		}
		p := c.AttentionPaths()
		want := "own: cuDNN has no plan: no engine finalises the graph: cudnnStatus_t 3000"
		if len(p.Forward) != 1 || p.Forward[firstKey(p.Forward)] != 2 || !strings.HasPrefix(firstKey(p.Forward), want) {
			t.Errorf("paths without an engine: %v, want 2 blocks %q…", p.Forward, want)
		}
		lines := log.since(t)
		if n := len(graphs(lines)); n != 1 {
			t.Errorf("%d graphs built for two blocks of one shape: a graph cuDNN has no plan for must be remembered", n)
		}
		if p.Plans.Built != 0 || p.Plans.Failed != 1 {
			t.Errorf("plans %+v, want none built and one graph without a plan", p.Plans)
		}
		return
	case "workspace-oom":
		stubWorkspaceOOM(t, c, f, &notices)
		return
	case "plan-cache-full":
		stubCacheFull(t, c, log, &notices)
		return
	case "nvrtc-wheel-layout":
		for _, backward := range []bool{false, true} {
			runStubBlock(c, stubBlocks()[2].sh, backward, stubRun{})
		}
		p := c.AttentionPaths()
		if fwd, bwd := p.CUDNNBlocks(); fwd != 1 || bwd != 1 {
			t.Errorf("paths %v / %v, want the causal block on cuDNN both ways", p.Forward, p.Backward)
		}
		n := cuda.LoadedNVRTC()
		if !strings.HasSuffix(n.File, "site-packages/nvidia/cu13/lib/libnvrtc.so.13") ||
			!strings.HasSuffix(n.Builtins, "site-packages/nvidia/cu13/lib/libnvrtc-builtins.so.13.9") || n.Major != 13 || n.Minor != 9 {
			t.Errorf("NVRTC %+v: want the wheel's nvidia/cu13/lib beside cuDNN's nvidia/cudnn/lib", n)
		}
		if len(notices) != 0 {
			t.Errorf("notices: %q", notices)
		}
		return
	}
	if strings.HasSuffix(name, "-deterministic") {
		c.SetDeterministicAttention(true)
	}

	// every block kind, forward and backward, each twice (the second from the plan cache);
	// the first backward with the queries' O, the second with D only and the lse at an address
	// that is not 16-byte aligned
	version := stubVersion()
	plans := 0
	for _, b := range stubBlocks() {
		for _, backward := range []bool{false, true} {
			dir := map[bool]string{false: "forward", true: "backward"}[backward]
			for rep := range 2 {
				run := stubRun{withO: rep == 0, misalignedLSE: rep == 1}
				log.mark(t, b.name+" "+dir)
				at, memAt := len(f.launches), len(f.memsets)
				bufs := runStubBlock(c, b.sh, backward, run)
				lines := log.since(t)
				if fs := failures(lines); len(fs) > 0 {
					t.Errorf("%s %s: calls failed:\n%s", b.name, dir, strings.Join(fs, "\n"))
				}
				want := expectPath(fmt.Sprintf("%s sm_%d%d", cuda.CUDNNVersionString(version), c.info.major, c.info.minor), dir, b)
				paths := c.AttentionPaths()
				m := paths.Forward
				if backward {
					m = paths.Backward
				}
				if m[want] < int64(rep+1) {
					t.Errorf("%s %s: paths %v, want %q", b.name, dir, m, want)
					continue
				}
				if !strings.HasPrefix(want, "cudnn") {
					if gs := graphs(lines); len(gs) != 0 {
						t.Errorf("%s %s: took the own path but built %d graphs", b.name, dir, len(gs))
					}
					continue
				}
				gs := graphs(lines)
				if rep == 1 && len(gs) != 0 {
					t.Errorf("%s %s: the second block of one shape built a graph again (no plan cache)", b.name, dir)
				}
				if rep == 0 {
					if len(gs) != 1 {
						t.Fatalf("%s %s: %d graphs built, want 1", b.name, dir, len(gs))
					}
					plans++
					spec := c.sdpaSpec(b.sh, mustClassify(t, b.sh), backward, c.precision())
					checkStubGraph(t, b.name+" "+dir, gs[0], spec, b.sh)
					checkContext(t, b.name+" "+dir, lines)
				}
				es := executions(t, lines)
				if len(es) != 1 {
					t.Fatalf("%s %s: %d executions, want 1", b.name, dir, len(es))
				}
				checkExecution(t, b.name+" "+dir, c, f, es[0], b.sh, backward, bufs, version, run)
				checkLaunches(t, b.name+" "+dir, c, f, at, memAt, b.sh, backward, bufs, run)
			}
		}
	}
	// a block of 8192 queries and keys: cuDNN's deterministic backward would ask 1 GiB of
	// workspace on Hopper, above the cap: the own kernel takes it (said once); without
	// determinism cuDNN does
	if version >= 92600 {
		big := stubBigBlock()
		det := strings.HasSuffix(name, "-deterministic")
		want := "cudnn causal"
		if det {
			want = "own: deterministic workspace 1.0 GiB above 256 MiB"
		}
		before := c.AttentionPaths().Backward[want]
		for _, backward := range []bool{false, true} {
			runStubBlock(c, big, backward, stubRun{})
		}
		log.since(t)
		p := c.AttentionPaths()
		if p.Backward[want] != before+1 {
			t.Errorf("the 8192-token backward (deterministic %v): paths %v, want %q", det, p.Backward, want)
		}
		said := 0
		for _, n := range notices {
			if strings.Contains(n, "device.deterministic_attention: cuDNN's deterministic backward asks 1.0 GiB of workspace for a 8192×8192 block") {
				said++
			}
		}
		if (said == 1) != det || len(notices) != said {
			t.Errorf("notices %q: want one about the deterministic workspace (deterministic %v), and no other", notices, det)
		}
		notices = nil
	}
	stubPacked(t, c, f, log)
	plans += stubHalf(t, c, f, log)
	// the first plan of the process: its first engine configuration fails to finalise (the
	// stub's CUDNNSTUB_PLAN_FAILS=1), the next is taken: the second of mode A, or with one
	// mode-A engine the fallback list's first
	first := c.sdpaSpec(stubBlocks()[0].sh, mustClassify(t, stubBlocks()[0].sh), false, c.precision())
	if p := c.dnn.plans[first.Key()]; p == nil || p.plan == nil {
		t.Errorf("no plan for the first block")
	} else {
		wantEngine, wantHeur := int64(1), "A"
		if name == "fallback-engine" {
			wantEngine, wantHeur = 100, "fallback"
		}
		if p.plan.Engine != wantEngine || p.plan.Heuristic != wantHeur || len(p.plan.Tried) != 1 ||
			!strings.Contains(p.plan.Tried[0], "cudnnStatus_t 3001") {
			t.Errorf("first plan: engine %d from heuristics %s after %q; want engine %d from %s after one engine that failed with 3001",
				p.plan.Engine, p.plan.Heuristic, p.plan.Tried, wantEngine, wantHeur)
		}
	}
	if len(notices) != 0 {
		t.Errorf("notices with a working cuDNN: %q", notices)
	}
	// fp16: binary16 operands and outputs, another plan, and the kernels told so
	c.SetMatMulPrecision(FP16)
	for _, backward := range []bool{false, true} {
		log.mark(t, "fp16")
		at := len(f.launches)
		runStubBlock(c, stubBlocks()[2].sh, backward, stubRun{})
		lines := log.since(t)
		gs := graphs(lines)
		if len(gs) != 1 || gs[0].tensors[cuda.UIDQ].dtype != dtHalf || gs[0].tensors[cuda.UIDO].dtype != dtHalf {
			t.Errorf("fp16 (backward %v): %d graphs, Q %+v: want one new graph of half tensors", backward, len(gs), gs)
		}
		for _, l := range f.launches[at:] {
			if fp16 := l.args[len(l.args)-1]; fp16 != 1 {
				t.Errorf("fp16 (backward %v): %s launched with fp16 = %d", backward, l.name, fp16)
			}
		}
	}
	c.SetMatMulPrecision(BF16)
	// the fp32 precision and device.attention = own take the own kernel
	c.SetMatMulPrecision(FP32)
	runStubForward(c, stubBlocks()[2].sh)
	c.SetMatMulPrecision(BF16)
	if err := c.SetAttention(AttentionOwn); err != nil {
		t.Fatal(err)
	}
	runStubForward(c, stubBlocks()[2].sh)
	p := c.AttentionPaths()
	if p.Forward["own: fp32"] != 1 || p.Forward["own: device.attention = own"] != 1 {
		t.Errorf("fp32 and own blocks: %v", p.Forward)
	}
	nvrtc := "NVRTC 13.9"
	if strings.HasPrefix(name, "a100") {
		nvrtc = "NVRTC 12.9"
	}
	if !strings.HasPrefix(p.Library, "cuDNN "+cuda.CUDNNVersionString(version)+" (") || !strings.HasSuffix(p.Library, ", "+nvrtc) {
		t.Errorf("AttentionPaths().Library = %q, want cuDNN %s and %s", p.Library, cuda.CUDNNVersionString(version), nvrtc)
	}
	if want := plans + 2 + map[bool]int{true: 2}[version >= 92600]; p.Plans.Built != want || p.Plans.Failed != 0 || p.Plans.Seconds <= 0 {
		t.Errorf("plans %+v, want %d: the %d checked, fp16's 2 and the big block's 2 (cuDNN ≥ 9.26)", p.Plans, want, plans)
	}
	if !strings.Contains(p.String(), fmt.Sprintf("cuDNN %d plans built in ", p.Plans.Built)) {
		t.Errorf("AttentionPaths().String() = %q: no plan count", p)
	}
	fmt.Println(p)
	// Close waits for the stream before it destroys a plan: nothing queued may outlive its plan
	log.mark(t, "closing")
	f.onSync = func() { log.mark(t, "sync") }
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(log.path)
	if err != nil {
		t.Fatal(err)
	}
	closing := string(raw[strings.LastIndex(string(raw), "# closing\n"):])
	syncAt, destroyAt := strings.Index(closing, "# sync\n"), strings.Index(closing, "cudnnBackendDestroyDescriptor")
	if syncAt < 0 || destroyAt < 0 || syncAt > destroyAt {
		t.Errorf("Close: the stream synchronised at %d of the closing log, the first plan descriptor destroyed at %d: want the sync first", syncAt, destroyAt)
	}
	if !strings.Contains(closing, "cudnnDestroy handle=") {
		t.Errorf("Close did not destroy the cuDNN handle")
	}
	fmt.Printf("%s: %d plans built and checked\n", name, plans)
}

// stubPacked runs the causal block with its operands packed in bf16 (AttnShape.Operands, as a
// 16-bit run's schedules keep them): cuDNN reads them where they are, no conversion is
// launched, and the synthetic O′ is built from the packed dO; a packed operand one word off a
// 16-byte boundary is copied into an aligned slot first.
func stubPacked(t *testing.T, c *CUDA, f *fakeDevice, log *stubLog) {
	sh := stubBlocks()[2].sh
	sh.Operands = BF16
	H, KVH, hd := sh.Heads, sh.KVHeads, sh.HeadDim
	qn, kn := sh.OperandLen(sh.NQ*H*hd), sh.OperandLen(sh.NK*KVH*hd)
	q, k, v, o, do := c.Alloc(qn), c.Alloc(kn), c.Alloc(kn), c.Alloc(qn), c.Alloc(qn)
	st := AttnState{O: c.Alloc(sh.NQ * H * hd), M: c.Alloc(H * sh.NQ), L: c.Alloc(H * sh.NQ)}
	lse, d := c.Alloc(H*sh.NQ), c.Alloc(H*sh.NQ)
	g := [3]Buf{c.Alloc(sh.NQ * H * hd), c.Alloc(sh.NK * KVH * hd), c.Alloc(sh.NK * KVH * hd)}
	ptr := func(b Buf) uint64 { return uint64(dbuf(b).ptr()) }
	for _, run := range []struct {
		name     string
		backward bool
		o        Buf
	}{{"forward", false, nil}, {"backward with O", true, o}, {"backward with D", true, nil}} {
		log.mark(t, "packed "+run.name)
		at := len(f.launches)
		if run.backward {
			c.AttnBackward(g[0], g[1], g[2], q, k, v, run.o, do, lse, d, sh)
		} else {
			c.AttnForward(st, q, k, v, sh)
		}
		es := executions(t, log.since(t))
		got := f.names(at)
		want := map[string][]string{"forward": {"df_cudnn_fold"}, "backward with O": {"df_add_half3"},
			"backward with D": {"df_cudnn_oprime", "df_add_half3"}}[run.name]
		if !slices.Equal(got, want) || len(es) != 1 {
			t.Errorf("packed operands, %s: launches %v and %d executions, want %v and one", run.name, got, len(es), want)
			continue
		}
		e := es[0]
		wantAt := map[int64]uint64{cuda.UIDQ: ptr(q), cuda.UIDK: ptr(k), cuda.UIDV: ptr(v)}
		if run.backward {
			wantAt[cuda.UIDdO] = ptr(do)
		}
		if run.o != nil {
			wantAt[cuda.UIDO] = ptr(o)
		}
		for uid, w := range wantAt {
			if e.ptrs[uid] != w {
				t.Errorf("packed operands, %s: tensor %d bound at %#x, want the packed buffer at %#x", run.name, uid, e.ptrs[uid], w)
			}
		}
		if run.name == "backward with D" {
			// df_cudnn_oprime(dop, op, do, do16, D, …): dO read in 16 bits, nothing written to dop
			if a := f.launches[at].args; a[0] != 0 || a[2] != 0 || a[3] != ptr(do) || a[4] != ptr(d) {
				t.Errorf("packed operands: df_cudnn_oprime args %v, want dO read from the packed %#x", a, ptr(do))
			}
		}
	}
	// a packed q one word (4 bytes) into its buffer: copied to an aligned slot before cuDNN reads it
	log.mark(t, "packed misaligned")
	qm := c.Slice(c.Alloc(qn+1), 1, qn)
	c.AttnForward(st, qm, k, v, sh)
	es := executions(t, log.since(t))
	if len(es) != 1 || es[0].ptrs[cuda.UIDQ] == ptr(qm) || es[0].ptrs[cuda.UIDQ]%16 != 0 {
		t.Errorf("a misaligned packed q: bound at %#x (the slice is at %#x)", es[0].ptrs[cuda.UIDQ], ptr(qm))
	}
	// a packed operand of the other 16-bit format is a caller's bug
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "packed in fp16") {
				t.Errorf("fp16-packed operands on a bf16 backend: %v", r)
			}
		}()
		sh16 := sh
		sh16.Operands = FP16
		c.AttnForward(st, q, k, v, sh16)
	}()
	log.since(t)
}

// stubHalf checks the 16-bit attention of one rank (AttnForwardHalf, AttnBackwardHalf) on
// cuDNN: the graphs are the head dimension's (128 for Q, K, V and O alike); on a plain causal
// block nothing is launched, cleared or copied around the one execution, which binds q, k, v,
// o, dO, the lse and dq, dk, dv to the caller's buffers; a misaligned output goes through
// scratch and one copy; keys no query sees have their dK and dV rows cleared first, and only
// those gradients; a ragged block's backward clears the gradients and scatters the lse, its
// forward takes the float32 state's path; a block cuDNN refuses runs the own 16-bit kernels
// through the float32 state and packs. Nothing waits for the device. It returns the number of
// plans it built.
func stubHalf(t *testing.T, c *CUDA, f *fakeDevice, log *stubLog) int {
	built := 0
	const H, KVH, hd = 8, 2, 128
	mk := func(qp, kp, qs []int32, p Precision) AttnShape {
		return AttnShape{NQ: len(qp), NK: len(kp), Heads: H, KVHeads: KVH, HeadDim: hd, Causal: true, Scale: float32(1 / math.Sqrt(hd)),
			QPos: qp, KPos: kp, QStart: qs, Operands: p}
	}
	diag := seqPos(0, 256)
	cyclic := make([]int32, 128)
	for i := range cyclic {
		cyclic[i] = int32(4 * i)
	}
	ptr := func(b Buf) uint64 { return uint64(dbuf(b).ptr()) }
	type bufs struct{ q, k, v, o, do, lse, dq, dk, dv Buf }
	alloc := func(sh AttnShape, misaligned bool) bufs {
		qn, kn := sh.OperandLen(sh.NQ*H*hd), sh.OperandLen(sh.NK*KVH*hd)
		out := func(n int) Buf {
			if misaligned {
				return c.Slice(c.Alloc(n+1), 1, n)
			}
			return c.Alloc(n)
		}
		return bufs{q: c.Alloc(qn), k: c.Alloc(kn), v: c.Alloc(kn), o: out(qn), do: c.Alloc(qn), lse: out(H * sh.NQ),
			dq: out(qn), dk: c.Alloc(kn), dv: c.Alloc(kn)}
	}
	inWorkspace := func(p cuda.Ptr) bool {
		ws := c.dnn.ws
		return ws != nil && p >= ws.Ptr && p < ws.Ptr+cuda.Ptr(ws.Bytes)
	}
	syncs := f.syncs
	for _, tc := range []struct {
		name       string
		sh         AttnShape
		misaligned bool
	}{
		{"causal", mk(diag, diag, nil, BF16), false},
		{"causal fp16", mk(diag, diag, nil, FP16), false},
		{"causal misaligned", mk(diag, diag, nil, BF16), true},
		{"unseen keys", mk(seqPos(0, 128), diag, nil, BF16), false},
		{"documents", mk(diag, diag, stubStarts(diag, []int32{0, 100, 200}, 0), BF16), false},
		{"cyclic", mk(cyclic, cyclic, nil, BF16), false},
	} {
		sh := tc.sh
		b := alloc(sh, tc.misaligned)
		blk, why := classifyCUDNN(sh)
		for _, backward := range []bool{false, true} {
			dir := map[bool]string{false: "forward", true: "backward"}[backward]
			what := fmt.Sprintf("16-bit %s %s", tc.name, dir)
			log.mark(t, what)
			spec := c.sdpaSpec(sh, blk, backward, cudaPrec(sh.Operands))
			onCUDNN := why == "" && spec.Check() == nil
			before := c.AttentionPaths()
			at, memAt, cpAt := len(f.launches), len(f.memsets), len(f.copies)
			if backward {
				c.AttnBackwardHalf(b.dq, b.dk, b.dv, b.q, b.k, b.v, b.o, b.do, b.lse, sh)
			} else {
				c.AttnForwardHalf(b.o, b.lse, b.q, b.k, b.v, sh)
			}
			lines := log.since(t)
			if fs := failures(lines); len(fs) > 0 {
				t.Errorf("%s: calls failed:\n%s", what, strings.Join(fs, "\n"))
			}
			built += len(graphs(lines))
			after := c.AttentionPaths()
			m, m0 := after.Forward, before.Forward
			if backward {
				m, m0 = after.Backward, before.Backward
			}
			path := pathDelta(m0, m)
			launched, es := f.names(at), executions(t, lines)
			if !onCUDNN {
				wantPath := "own: " + why
				if why == "" {
					wantPath = "own: " + spec.Check().Error()
				}
				want := []string{"df_attn_fwd_bf16_hd128", "df_attn_finish", "df_pack_half"}
				if backward {
					want = []string{"df_attn_prep16", "df_attn_bwd_dq_bf16_hd128", "df_attn_bwd_dkdv_bf16_hd128", "df_attn_dkdv_reduce", "df_pack_half", "df_pack_half", "df_pack_half"}
				}
				if path != wantPath || !slices.Equal(launched, want) || len(es) != 0 {
					t.Errorf("%s: path %q, launches %v, %d executions; want %q, the own kernels %v and no cuDNN", what, path, launched, len(es), wantPath, want)
				}
				continue
			}
			if path != "cudnn "+blk.kind || len(es) != 1 {
				t.Errorf("%s: path %q and %d executions, want %q and one", what, path, len(es), "cudnn "+blk.kind)
				continue
			}
			if gs := graphs(lines); len(gs) == 1 {
				checkStubGraph(t, what, gs[0], spec, sh)
				for _, uid := range []int64{cuda.UIDQ, cuda.UIDK, cuda.UIDV, cuda.UIDO} {
					if d := gs[0].tensors[uid].dims; d[len(d)-1] != hd && d[len(d)-2] != hd {
						t.Errorf("%s: tensor %d of dims %v: want the head dimension %d, not padded", what, uid, d, hd)
					}
				}
			}
			e := es[0]
			wantAt := map[int64]uint64{cuda.UIDQ: ptr(b.q), cuda.UIDK: ptr(b.k), cuda.UIDV: ptr(b.v), cuda.UIDO: ptr(b.o), cuda.UIDStats: ptr(b.lse)}
			if backward {
				wantAt[cuda.UIDdO], wantAt[cuda.UIDdQ], wantAt[cuda.UIDdK], wantAt[cuda.UIDdV] = ptr(b.do), ptr(b.dq), ptr(b.dk), ptr(b.dv)
			}
			if blk.ragged && !backward {
				// the float32 state's path: cuDNN into scratch, folded, finished, packed into o
				want := []string{"df_cudnn_fold", "df_attn_finish", "df_pack_half"}
				if !slices.Equal(launched, want) || f.launches[len(f.launches)-1].args[0] != ptr(b.o) {
					t.Errorf("%s: launched %v, want %v into o", what, launched, want)
				}
				continue
			}
			// the outputs cuDNN writes: the caller's, or (misaligned) scratch copied there after
			copied := map[uint64]uint64{} // destination → source
			for _, cp := range f.copies[cpAt:] {
				copied[uint64(cp.dst)] = uint64(cp.src)
			}
			outs := []int64{cuda.UIDO, cuda.UIDStats}
			if backward {
				outs = []int64{cuda.UIDdQ}
			}
			for uid, w := range wantAt {
				got := e.ptrs[uid]
				if tc.misaligned && slices.Contains(outs, uid) {
					if got == w || got%16 != 0 || copied[w] != got {
						t.Errorf("%s: the misaligned output %d (at %#x) written at %#x, copied from %#x: want aligned scratch copied to it", what, uid, w, got, copied[w])
					}
					continue
				}
				if tc.misaligned && backward && (uid == cuda.UIDStats || uid == cuda.UIDO) {
					if got%16 != 0 || copied[got] != w {
						t.Errorf("%s: the misaligned input %d read at %#x, copied from %#x, want an aligned copy of %#x", what, uid, got, copied[got], w)
					}
					continue
				}
				if blk.ragged && uid == cuda.UIDStats {
					continue // the padded statistics
				}
				if got != w {
					t.Errorf("%s: tensor %d bound at %#x, want the caller's buffer at %#x", what, uid, got, w)
				}
			}
			if !tc.misaligned && len(f.copies) != cpAt {
				t.Errorf("%s: %d copies, want none", what, len(f.copies)-cpAt)
			}
			// launches and clears: none on a plain block but the dQ accumulator's in the workspace
			// (cuDNN before 9.6); a ragged backward's scatter; the gradients no row of cuDNN's covers
			wantLaunch := []string(nil)
			cleared := map[uint64]bool{}
			if blk.ragged {
				wantLaunch = []string{"df_lse_scatter"}
				cleared[ptr(b.dq)], cleared[ptr(b.dk)], cleared[ptr(b.dv)], cleared[e.ptrs[cuda.UIDStats]] = true, true, true, true
			}
			if tc.name == "unseen keys" && backward {
				cleared[ptr(b.dk)], cleared[ptr(b.dv)] = true, true
			}
			if !slices.Equal(launched, wantLaunch) {
				t.Errorf("%s: launched %v, want %v (no df_to_half, df_cudnn_fold, df_add_half3)", what, launched, wantLaunch)
			}
			got := map[uint64]bool{}
			for _, ms := range f.memsets[memAt:] {
				if inWorkspace(ms.dst) && backward && spec.Version < 90600 && !spec.Deterministic {
					continue // the dQ accumulator cuDNN before 9.6 needs cleared
				}
				got[uint64(ms.dst)] = true
			}
			if !maps.Equal(got, cleared) {
				t.Errorf("%s: cleared %v, want %v", what, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(cleared)))
			}
		}
	}
	if f.syncs != syncs {
		t.Errorf("the 16-bit attention waited for the device %d times", f.syncs-syncs)
	}
	return built
}

// stubBigBlock is a causal block of 8192 queries and keys, 8 heads of 64.
func stubBigBlock() AttnShape {
	pos := seqPos(0, 8192)
	return AttnShape{NQ: 8192, NK: 8192, Heads: 8, KVHeads: 2, HeadDim: 64, Causal: true, Scale: 0.125, QPos: pos, KPos: pos}
}

// stubWorkspaceOOM checks a workspace the device cannot hold (the stub asks 1 TiB, the fake
// device has 16 GiB): every block runs the own kernel, that is said once, nothing panics.
func stubWorkspaceOOM(t *testing.T, c *CUDA, f *fakeDevice, notices *[]string) {
	f.maxAlloc = 16 << 30
	for _, b := range stubBlocks()[:4] {
		runStubBlock(c, b.sh, false, stubRun{})
		runStubBlock(c, b.sh, true, stubRun{withO: true})
	}
	p := c.AttentionPaths()
	if fwd, bwd := p.CUDNNBlocks(); fwd != 0 || bwd != 0 {
		t.Errorf("cuDNN blocks %d, %d with a workspace that does not fit", fwd, bwd)
	}
	for _, m := range []map[string]int64{p.Forward, p.Backward} {
		for k, n := range m {
			if !strings.HasPrefix(k, "own: cuDNN's workspace of 1024.0 GiB does not fit in device memory") || n != 4 {
				t.Errorf("path %q × %d, want the own path × 4 saying the workspace does not fit", k, n)
			}
		}
	}
	if len(*notices) != 1 || !strings.Contains((*notices)[0], "does not fit in device memory") {
		t.Errorf("notices %q, want one about the workspace", *notices)
	}
}

// stubCacheFull checks the plan cache's bound: past it new shapes run the own kernel (said
// once) and no plan is evicted.
func stubCacheFull(t *testing.T, c *CUDA, log *stubLog, notices *[]string) {
	cudnnMaxPlans = 2
	blocks := stubBlocks()
	for _, i := range []int{0, 2, 4, 0, 2} {
		runStubForward(c, blocks[i].sh)
	}
	p := c.AttentionPaths()
	if p.Forward["cudnn full"] != 2 || p.Forward["cudnn causal"] != 2 || p.Forward["own: cuDNN plan cache full"] != 1 || p.Plans.Built != 2 {
		t.Errorf("paths %v, plans %+v: want the first two shapes on cuDNN twice each, the third on the own kernel", p.Forward, p.Plans)
	}
	if n := len(graphs(log.since(t))); n != 2 {
		t.Errorf("%d graphs built: the cached plans were evicted or rebuilt", n)
	}
	if len(*notices) != 1 || !strings.Contains((*notices)[0], "2 attention plans built, the most a run keeps") {
		t.Errorf("notices %q", *notices)
	}
}

func firstKey(m map[string]int64) string {
	for k := range m {
		return k
	}
	return ""
}

func mustClassify(t *testing.T, sh AttnShape) cudnnBlock {
	b, why := classifyCUDNN(sh)
	if why != "" {
		t.Fatalf("classifyCUDNN: %s", why)
	}
	return b
}

// stubBufs are a block's buffers on the fake device.
type stubBufs struct {
	q, k, v, o, m, l, do, lse, d, dq, dk, dv Buf
}

// stubRun is how a backward is called: with the queries' O (else with D alone), with the lse a
// slice one element into its buffer (not 16-byte aligned).
type stubRun struct {
	withO, misalignedLSE bool
}

func runStubBlock(c *CUDA, sh AttnShape, backward bool, run stubRun) stubBufs {
	H, KVH, hd := sh.Heads, sh.KVHeads, sh.HeadDim
	b := stubBufs{q: c.Alloc(sh.NQ * H * hd), k: c.Alloc(sh.NK * KVH * hd), v: c.Alloc(sh.NK * KVH * hd),
		o: c.Alloc(sh.NQ * H * hd), m: c.Alloc(H * sh.NQ), l: c.Alloc(H * sh.NQ)}
	if !backward {
		c.AttnForward(AttnState{O: b.o, M: b.m, L: b.l}, b.q, b.k, b.v, sh)
		return b
	}
	b.do, b.lse, b.d = c.Alloc(sh.NQ*H*hd), c.Alloc(H*sh.NQ), c.Alloc(H*sh.NQ)
	if run.misalignedLSE {
		b.lse = c.Slice(c.Alloc(H*sh.NQ+1), 1, H*sh.NQ)
	}
	b.dq, b.dk, b.dv = c.Alloc(sh.NQ*H*hd), c.Alloc(sh.NK*KVH*hd), c.Alloc(sh.NK*KVH*hd)
	var o Buf
	if run.withO {
		o = b.o
	}
	c.AttnBackward(b.dq, b.dk, b.dv, b.q, b.k, b.v, o, b.do, b.lse, b.d, sh)
	return b
}

func runStubForward(c *CUDA, sh AttnShape) { runStubBlock(c, sh, false, stubRun{}) }

// checkContext checks that every call that reaches the device ran with the stub's context
// current (kernels/cuda's helpers make it current first: a goroutine's cgo calls may run on
// several threads).
func checkContext(t *testing.T, what string, lines []stubLine) {
	want := fmt.Sprintf("%#x", stubCtx)
	for _, l := range lines {
		switch l.name {
		case "cudnnBackendFinalize", "cudnnBackendExecute", "cudnnCreate", "cudnnSetStream":
			if l.kv["cur"] != want {
				t.Errorf("%s: %q ran with context %s current, want %s", what, l.text, l.kv["cur"], want)
			}
		}
	}
}

// Pointwise modes and data types as the stub logs them (cudnn_abi.h's values).
const (
	pwAdd, pwMul, pwDiv, pwSub, pwExp, pwLog, pwIdentity = 0, 1, 6, 9, 13, 15, 21
	pwCmpGT, pwCmpGE, pwCmpLT, pwAnd, pwGenIndex, pwSel  = 302, 303, 304, 400, 501, 601
	dtFloat, dtHalf, dtInt32, dtBF16, dtBool             = 0, 2, 4, 9, 11
)

// checkStubGraph checks the graph the stub received against what block sh needs: the operand
// tensors (dims, strides, types, ragged offsets), the operations in order, the mask, the
// softmax statistics, GQA's head reductions, and that it is the graph DescribeSDPA describes.
func checkStubGraph(t *testing.T, what string, g *stubGraph, s cuda.SDPA, sh AttnShape) {
	t.Helper()
	errorf := func(format string, args ...any) { t.Errorf(what+": "+format, args...) }
	io := dtBF16
	if s.IO == cuda.Half {
		io = dtHalf
	}
	H, KVH, D := int64(sh.Heads), int64(sh.KVHeads), int64(sh.HeadDim)
	B, SQ, SKV := s.B, s.SQ, s.SKV
	packedT := func(heads, rows, dim int64) ([]int64, []int64) {
		return []int64{B, heads, rows, dim}, []int64{rows * heads * dim, dim, heads * dim, 1}
	}
	type want struct {
		uid           int64
		dtype         int
		dims, strides []int64
	}
	qd, qs := packedT(H, SQ, D)
	kd, ks := packedT(KVH, SKV, D)
	kd[2], kd[3], ks[2], ks[3] = kd[3], kd[2], ks[3], ks[2] // Kᵀ
	vd, vs := packedT(KVH, SKV, D)
	if s.Backward {
		vd[2], vd[3], vs[2], vs[3] = vd[3], vd[2], vs[3], vs[2] // Vᵀ
	}
	od, os := packedT(H, SQ, D)
	wants := []want{
		{cuda.UIDQ, io, qd, qs}, {cuda.UIDK, io, kd, ks}, {cuda.UIDV, io, vd, vs}, {cuda.UIDO, io, od, os},
		{cuda.UIDStats, dtFloat, []int64{B, H, SQ, 1}, []int64{H * SQ, SQ, 1, 1}},
	}
	if s.Backward {
		dqd, dqs := packedT(H, SQ, D)
		dkd, dks := packedT(KVH, SKV, D)
		dvd, dvs := packedT(KVH, SKV, D)
		wants = append(wants, want{cuda.UIDdO, io, od, os}, want{cuda.UIDdQ, io, dqd, dqs}, want{cuda.UIDdK, io, dkd, dks},
			want{cuda.UIDdV, io, dvd, dvs}, want{cuda.UIDSoftmaxSum, dtFloat, []int64{B, H, SQ, 1}, []int64{H * SQ, SQ, 1, 1}})
	}
	for _, w := range wants {
		got, ok := g.tensors[w.uid]
		switch {
		case !ok:
			errorf("no tensor %d", w.uid)
		case got.virtual || got.byValue || got.dtype != w.dtype || !slices.Equal(got.dims, w.dims) || !slices.Equal(got.strides, w.strides):
			errorf("tensor %d: %+v, want type %d dims %v strides %v", w.uid, got, w.dtype, w.dims, w.strides)
		}
	}
	// ragged offsets and sequence lengths
	raggedOf := map[int64]int64{cuda.UIDQ: cuda.UIDOffQ, cuda.UIDK: cuda.UIDOffK, cuda.UIDV: cuda.UIDOffV, cuda.UIDO: cuda.UIDOffO,
		cuda.UIDdO: cuda.UIDOffO, cuda.UIDdQ: cuda.UIDOffQ, cuda.UIDdK: cuda.UIDOffK, cuda.UIDdV: cuda.UIDOffV}
	for uid, off := range raggedOf {
		got, ok := g.tensors[uid]
		if !ok {
			continue
		}
		if want := map[bool]int64{true: off, false: 0}[s.Ragged]; got.ragged != want {
			errorf("tensor %d: ragged offset %d, want %d", uid, got.ragged, want)
		}
	}
	for _, uid := range []int64{cuda.UIDOffQ, cuda.UIDOffK, cuda.UIDOffV, cuda.UIDOffO} {
		got, ok := g.tensors[uid]
		if ok != s.Ragged || (ok && (got.dtype != dtInt32 || !slices.Equal(got.dims, []int64{B + 1, 1, 1, 1}))) {
			errorf("ragged offset tensor %d: %+v (present %v), want int32 [%d,1,1,1] when ragged (%v)", uid, got, ok, B+1, s.Ragged)
		}
	}
	padding := s.Ragged || s.BackwardWorkaround()
	for _, uid := range []int64{cuda.UIDSeqQ, cuda.UIDSeqKV} {
		got, ok := g.tensors[uid]
		if ok != padding || (ok && (got.dtype != dtInt32 || !slices.Equal(got.dims, []int64{B, 1, 1, 1}))) {
			errorf("sequence-length tensor %d: %+v (present %v), want int32 [%d,1,1,1] with the padding mask (%v)", uid, got, ok, B, padding)
		}
	}

	// the operations, as a compact signature: kind and mode
	var sig []string
	modes := map[int64]string{pwAdd: "add", pwMul: "mul", pwDiv: "div", pwSub: "sub", pwExp: "exp", pwLog: "log", pwIdentity: "identity",
		pwCmpGT: "gt", pwCmpGE: "ge", pwCmpLT: "lt", pwAnd: "and", pwGenIndex: "index", pwSel: "select"}
	count := map[string]int{}
	for _, op := range g.ops {
		var x string
		switch op.kv["kind"] {
		case "MATMUL":
			x = "matmul"
		case "REDUCTION":
			x = map[string]string{"0": "sum", "3": "max"}[op.kv["mode"]]
		case "RESHAPE":
			x = "reshape"
		case "POINTWISE":
			x = modes[atoi(op.kv["mode"])]
			if (x == "index") != (op.kv["axis"] != "-") {
				errorf("pointwise %q: an axis on GEN_INDEX and only there, as cudnn-frontend writes it", op.text)
			}
		}
		sig = append(sig, x)
		count[x]++
	}
	joined := strings.Join(sig, " ")
	m := s.Mask
	masks := 0
	if m.Causal {
		masks++
	}
	if m.Left > 0 {
		masks++
	}
	if padding {
		masks++
	}
	if s.Backward && padding && s.Version < 91000 {
		masks++ // the second padding mask of cuDNN 9.0-9.9
	}
	if count["select"] != masks {
		errorf("%d masks (BINARY_SELECT), want %d: %s", count["select"], masks, joined)
	}
	if got, want := count["ge"], map[bool]int{true: 1}[m.Causal]; got != want {
		errorf("%d right bounds (CMP_GE), want %d: %s", got, want, joined)
	}
	if got, want := count["gt"], map[bool]int{true: 1}[m.Left > 0]; got != want {
		errorf("%d left bounds (CMP_GT), want %d: %s", got, want, joined)
	}
	if !s.Backward {
		// Q·Kᵀ, scale, masks, then the composite softmax with its statistics and P·V
		if !strings.HasPrefix(joined, "matmul mul ") || !strings.HasSuffix(joined, " max sub exp sum log add div matmul") {
			errorf("forward operations %q, want matmul mul … max sub exp sum log add div matmul", joined)
		}
		stats := g.ops[len(g.ops)-3] // the add of max and log(sum): the statistics
		if atoi(stats.kv["out"]) != cuda.UIDStats {
			errorf("the log-sum-exp %q is not written to Stats (%d)", stats.text, cuda.UIDStats)
		}
		if last := g.ops[len(g.ops)-1]; atoi(last.kv["out"]) != cuda.UIDO || atoi(last.kv["b"]) != cuda.UIDV {
			errorf("the last operation %q is not O = P·V", last.text)
		}
	} else {
		if !strings.HasPrefix(joined, "mul sum mul matmul mul ") || count["reshape"] != 3 || count["exp"] != 1 {
			errorf("backward operations %q, want mul sum mul (softmax_sum) matmul mul … with 3 reshapes and one exp", joined)
		}
		first := g.ops[0]
		if in := ints(first.kv["in"]); !slices.Equal(in, []int64{cuda.UIDdO, cuda.UIDO}) {
			errorf("softmax_sum from %v, want dO′·O′ (%d, %d)", in, cuda.UIDdO, cuda.UIDO)
		}
		if atoi(g.ops[2].kv["out"]) != cuda.UIDSoftmaxSum || g.tensors[cuda.UIDSoftmaxSum].virtual {
			errorf("softmax_sum is not the non-virtual tensor %d: %q", cuda.UIDSoftmaxSum, g.ops[2].text)
		}
		reductions := count["sum"] - 1
		if want := map[bool]int{true: 2}[H != KVH]; reductions != want {
			errorf("%d head reductions (dK, dV of GQA), want %d: %s", reductions, want, joined)
		}
		_, accum := g.tensors[cuda.UIDdQAccum]
		if accum == s.Deterministic {
			errorf("dQ accumulator present %v with a deterministic backward %v", accum, s.Deterministic)
		}
		if accum != (count["identity"] == 1) {
			errorf("dQ accumulator present %v but %d IDENTITY", accum, count["identity"])
		}
	}
	// GQA: the matmuls read K and V with KVH heads and write the score with H
	for _, op := range g.ops {
		if op.kv["kind"] == "MATMUL" && op.kv["prec"] != strconv.Itoa(dtFloat) {
			errorf("matmul %q does not accumulate in float", op.text)
		}
		if op.kv["kind"] == "MATMUL" && padding != (op.kv["m"] != "-") {
			errorf("matmul %q: M override present %v, padding mask %v", op.text, op.kv["m"] != "-", padding)
		}
	}
	// the stub's graph is the one DescribeSDPA describes
	dg, _ := cuda.DescribeSDPA(s)
	if err := dg.Err(); err != nil {
		errorf("DescribeSDPA: %v", err)
	}
	if len(dg.Ops) != len(g.ops) {
		errorf("%d operations reached the stub, DescribeSDPA has %d", len(g.ops), len(dg.Ops))
	} else {
		for i, op := range dg.Ops {
			if got := atoi(g.ops[i].kv["out"]); got != op.Out.UID {
				errorf("operation %d (%s %s) writes %d at the stub, %d in DescribeSDPA", i, op.Kind, op.Name, got, op.Out.UID)
			}
		}
	}
	for _, tt := range dg.Tensors {
		got, ok := g.tensors[tt.UID]
		if !ok && !tt.ByValue {
			errorf("tensor %d (%s) did not reach the stub", tt.UID, tt.Name)
		} else if ok && (!slices.Equal(got.dims, tt.Dims) || !slices.Equal(got.strides, tt.Strides) || got.dtype != int(tt.Type) || got.virtual != tt.Virtual) {
			errorf("tensor %d (%s): %+v at the stub, %v %v %s virtual=%v in DescribeSDPA", tt.UID, tt.Name, got, tt.Dims, tt.Strides, tt.Type, tt.Virtual)
		}
	}
}

// checkExecution checks the variant pack of one execution: the operands' 16-bit copies (and
// the real O or the synthetic O′), the outputs and statistics at the backend's buffers (the
// statistics copied when ragged or misaligned), the scalars' values (the scale, −Inf or the
// lowest float by cuDNN version, the diagonal's shift, the window), and the workspace.
func checkExecution(t *testing.T, what string, c *CUDA, f *fakeDevice, e execution, sh AttnShape, backward bool, b stubBufs, version int,
	run stubRun) {
	t.Helper()
	errorf := func(format string, args ...any) { t.Errorf(what+": "+format, args...) }
	if e.stream != fmt.Sprintf("%#x", stubStream) {
		errorf("executed on stream %s, want the device's %#x", e.stream, stubStream)
	}
	blk := mustClassify(t, sh)
	spec := c.sdpaSpec(sh, blk, backward, c.precision())
	s := &c.dnn
	p := s.plans[spec.Key()]
	if p == nil || p.plan == nil {
		errorf("no cached plan")
		return
	}
	at := func(m **cuda.Mem) uint64 { return uint64((*m).Ptr) }
	want := map[int64]uint64{cuda.UIDQ: at(&c.halves[0]), cuda.UIDK: at(&c.halves[1]), cuda.UIDV: at(&c.halves[2])}
	if !backward {
		want[cuda.UIDO], want[cuda.UIDStats] = at(&s.scratch[scrO]), at(&s.scratch[scrStats])
	} else {
		want[cuda.UIDO], want[cuda.UIDdO] = at(&s.scratch[scrO]), at(&s.scratch[scrDO])
		if run.withO {
			want[cuda.UIDO] = at(&c.halves[3])
		}
		want[cuda.UIDdQ], want[cuda.UIDdK], want[cuda.UIDdV] = at(&s.scratch[scrDQ]), at(&s.scratch[scrDK]), at(&s.scratch[scrDV])
		want[cuda.UIDStats] = uint64(dbuf(b.lse).ptr())
		if blk.ragged || run.misalignedLSE {
			want[cuda.UIDStats] = at(&s.scratch[scrStats])
		}
	}
	for _, x := range p.lay.Extra {
		want[x.UID] = at(&s.ws) + uint64(x.Off)
	}
	if blk.ragged || spec.BackwardWorkaround() {
		for _, uid := range []int64{cuda.UIDSeqQ, cuda.UIDSeqKV} {
			if v, ok := e.ptrs[uid]; !ok || v < uint64(c.ints.Ptr) || v >= uint64(c.ints.Ptr)+uint64(c.ints.Bytes) {
				errorf("sequence lengths %d at %#x, not in the uploaded integers", uid, v)
			}
			want[uid] = e.ptrs[uid]
		}
	}
	if blk.ragged {
		for _, uid := range []int64{cuda.UIDOffQ, cuda.UIDOffK, cuda.UIDOffV, cuda.UIDOffO} {
			if v, ok := e.ptrs[uid]; !ok || v < uint64(c.ints.Ptr) || v >= uint64(c.ints.Ptr)+uint64(c.ints.Bytes) {
				errorf("ragged offsets %d at %#x, not in the uploaded integers", uid, v)
			}
			want[uid] = e.ptrs[uid]
		}
	}
	for uid, w := range want {
		if got, ok := e.ptrs[uid]; !ok || got != w {
			errorf("tensor %d bound at %#x (present %v), want %#x", uid, got, ok, w)
		}
	}
	for uid := range e.ptrs {
		if _, ok := want[uid]; !ok {
			errorf("tensor %d bound, not expected", uid)
		}
	}
	// every bound operand lies in an allocation large enough for it
	g := p.plan.Graph()
	for _, tt := range g.Tensors {
		a, ok := e.ptrs[tt.UID]
		if !ok || tt.Ragged != nil {
			continue
		}
		extent := int64(1)
		for i, d := range tt.Dims {
			extent += (d - 1) * tt.Strides[i]
		}
		bytes := int(extent) * map[cuda.DataType]int{cuda.Float32: 4, cuda.Int32: 4, cuda.BFloat16: 2, cuda.Half: 2}[tt.Type]
		if err := f.check("tensor "+tt.Name, cuda.Ptr(a), bytes); err != nil {
			errorf("%v", err)
		}
	}
	if e.ws < uint64(s.ws.Ptr) || int(p.ws) > s.ws.Bytes {
		errorf("workspace at %#x of %d bytes, the plan needs %d", e.ws, s.ws.Bytes, p.ws)
	}
	// by-value scalars: the scale, the masks' −Inf, shift and window
	negInf := math.Inf(-1)
	if version < 91000 {
		negInf = -math.MaxFloat32
	}
	for _, tt := range g.Tensors {
		if !tt.ByValue {
			continue
		}
		got, ok := e.values[tt.UID]
		var w float64
		switch tt.Name {
		case "attn_scale":
			w = float64(sh.Scale)
		case "negative_inf", "negative_inf_padding":
			w = negInf
		case "one":
			w = 1
		case "shift_right_bound":
			w = float64(spec.Mask.Shift)
		case "left_bound":
			w = float64(spec.Mask.Left)
			if spec.Mask.BottomRight && !spec.Ragged {
				w = float64(spec.Mask.Left - spec.SKV + spec.SQ)
			}
		case "s_q":
			w = float64(spec.SQ)
		case "s_kv":
			w = float64(spec.SKV)
		default:
			errorf("scalar %d (%s) unexpected", tt.UID, tt.Name)
			continue
		}
		if !ok || (got != w && math.Abs(got-w) > 1e-6*math.Abs(w)) {
			errorf("scalar %s = %v (bound %v), want %v", tt.Name, got, ok, w)
		}
	}
}

// checkLaunches checks the backend's own launches and memsets around the cuDNN call: the 16-bit
// operands, then (forward) the fold into the state, or (backward) the 16-bit O and dO or dO
// and the synthetic O′, the padded statistics cleared before the scatter of a ragged block,
// and the one add of the three gradients into the float32 ones.
func checkLaunches(t *testing.T, what string, c *CUDA, f *fakeDevice, at, memAt int, sh AttnShape, backward bool, b stubBufs, run stubRun) {
	t.Helper()
	got := f.names(at)
	blk := mustClassify(t, sh)
	var want []string
	switch {
	case !backward:
		want = []string{"df_to_half", "df_to_half", "df_to_half", "df_cudnn_fold"}
	case run.withO:
		want = []string{"df_to_half", "df_to_half", "df_to_half", "df_to_half", "df_to_half"}
	default:
		want = []string{"df_to_half", "df_to_half", "df_to_half", "df_cudnn_oprime"}
	}
	if backward {
		if blk.ragged {
			want = append(want, "df_lse_scatter")
		}
		want = append(want, "df_add_half3")
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s: launches %v, want %v", what, got, want)
		return
	}
	ptr := func(b Buf) uint64 { return uint64(dbuf(b).ptr()) }
	scr := func(i int) uint64 { return uint64(c.dnn.scratch[i].Ptr) }
	if !backward {
		// df_cudnn_fold(o, m, l, o_b, stats, rowmap, nq, H, hd, sq, fp16)
		a := f.launches[len(f.launches)-1].args
		if a[0] != ptr(b.o) || a[1] != ptr(b.m) || a[2] != ptr(b.l) || a[3] != scr(scrO) || a[4] != scr(scrStats) {
			t.Errorf("%s: df_cudnn_fold args %#x: not the state and cuDNN's output and statistics", what, a)
		}
		if blk.ragged == (a[5] == 0) {
			t.Errorf("%s: df_cudnn_fold row map %#x for a ragged block %v", what, a[5], blk.ragged)
		}
		if int(a[6]) != sh.NQ || int(a[7]) != sh.Heads || int(a[8]) != sh.HeadDim {
			t.Errorf("%s: df_cudnn_fold sizes %v", what, a[6:9])
		}
		return
	}
	nq, nk := sh.NQ*sh.Heads*sh.HeadDim, sh.NK*sh.KVHeads*sh.HeadDim
	if run.withO {
		// df_to_half(dst, src, n, fp16): O into the fourth 16-bit slot, dO into its scratch
		o, do := f.launches[at+3].args, f.launches[at+4].args
		if o[0] != uint64(c.halves[3].Ptr) || o[1] != ptr(b.o) || int(o[2]) != nq || do[0] != scr(scrDO) || do[1] != ptr(b.do) || int(do[2]) != nq {
			t.Errorf("%s: the 16-bit O and dO: %v, %v", what, o, do)
		}
	} else {
		// df_cudnn_oprime(dop, op, do, do16, D, nq, H, hd, fp16)
		a := f.launches[at+3].args
		if a[0] != scr(scrDO) || a[1] != scr(scrO) || a[2] != ptr(b.do) || a[3] != 0 || a[4] != ptr(b.d) || int(a[5]) != sh.NQ ||
			int(a[6]) != sh.Heads || int(a[7]) != sh.HeadDim {
			t.Errorf("%s: df_cudnn_oprime args %v", what, a)
		}
	}
	// df_add_half3(dq, gq, nq, dk, gk, dv, gv, nk, fp16)
	a := f.launches[len(f.launches)-1].args
	if a[0] != ptr(b.dq) || a[1] != scr(scrDQ) || int(a[2]) != nq || a[3] != ptr(b.dk) || a[4] != scr(scrDK) ||
		a[5] != ptr(b.dv) || a[6] != scr(scrDV) || int(a[7]) != nk {
		t.Errorf("%s: df_add_half3 args %v", what, a)
	}
	// the 16-bit gradients cleared; a ragged block's padded statistics cleared before the scatter
	cleared := map[uint64]int{}
	for _, m := range f.memsets[memAt:] {
		cleared[uint64(m.dst)] = m.after
	}
	for _, i := range []int{scrDQ, scrDK, scrDV} {
		if _, ok := cleared[scr(i)]; !ok {
			t.Errorf("%s: scratch %d (a 16-bit gradient) not cleared", what, i)
		}
	}
	if blk.ragged {
		scatter := at + len(want) - 2
		if after, ok := cleared[scr(scrStats)]; !ok || after > scatter {
			t.Errorf("%s: the padded statistics cleared %v (before launch %d), want before df_lse_scatter (launch %d)", what, ok, after, scatter)
		}
	}
}

// stubFallback checks the scenarios where cuDNN is not used: the reason said once, every block
// on the own kernel, the reason in AttentionPaths.
func stubFallback(t *testing.T, c *CUDA, log *stubLog, name string, notices *[]string) {
	blocks := stubBlocks()
	for _, b := range blocks[:4] {
		runStubBlock(c, b.sh, false, stubRun{})
		runStubBlock(c, b.sh, true, stubRun{})
	}
	want := map[string]string{
		"missing":             "cannot load cuDNN (tried /nonexistent/libcudnn.so.9: cannot open shared object file",
		"too-old":             "is too old: fused attention needs cuDNN 9.0.0 or later",
		"buggy-9.10.0":        "cuDNN 9.10.0 has known SDPA bugs",
		"no-nvrtc":            "was found, but not the NVRTC it compiles its fused attention kernels with (tried /nonexistent/libnvrtc.so.13: cannot open shared object file",
		"no-nvrtc-builtins":   "loads, but its libnvrtc-builtins.so.13.9 does not",
		"nvrtc-cuda-mismatch": "is NVRTC 13.9, cuDNN 9.10.2 (",
	}[name]
	if len(*notices) != 1 || !strings.Contains((*notices)[0], want) {
		t.Errorf("notices %q, want one that says %q", *notices, want)
	}
	if name != "buggy-9.10.0" && (len(*notices) != 1 || !strings.HasPrefix((*notices)[0], "cuDNN attention is off, every attention block runs the own kernel: ")) {
		t.Errorf("notices %q: want one that says cuDNN attention is off", *notices)
	}
	p := c.AttentionPaths()
	if n, m := len(p.Forward), len(p.Backward); n != 1 || m != 1 {
		t.Errorf("paths %v / %v, want every block on one own path", p.Forward, p.Backward)
	}
	if fwd, bwd := p.CUDNNBlocks(); fwd != 0 || bwd != 0 {
		t.Errorf("cuDNN blocks %d, %d without a usable cuDNN", fwd, bwd)
	}
	for k, n := range p.Forward {
		if !strings.HasPrefix(k, "own: ") || n != 4 {
			t.Errorf("forward path %q × %d, want own × 4", k, n)
		}
	}
	if name != "buggy-9.10.0" && !strings.Contains(p.Library, want) {
		t.Errorf("AttentionPaths().Library = %q, want the reason %q", p.Library, want)
	}
	if gs := graphs(log.since(t)); len(gs) != 0 {
		t.Errorf("%d graphs built without a usable cuDNN", len(gs))
	}
	fmt.Println(p)
}
