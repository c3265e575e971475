//go:build cuda

package transport

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"distflash/internal/ctest"
	"distflash/kernels"
)

// TestCUDAHostNCCLStub runs the CUDA backend and the NCCL communicator on one rank through
// gpustub (testdata/gpustub/gpustub.c), a shared library that stands in for the NVIDIA driver,
// cuBLAS and NCCL, exports every entry point of kernels/cuda's X-macro lists, moves data
// through host memory and logs every call. It checks the cgo glue of kernels/cuda (symbols,
// signatures, handles, streams, events, buffer addresses) and the calls nccl.go makes,
// without a GPU: it needs only a C compiler (CI has gcc).
//
// The stub is compiled into a temporary directory, and the test binary runs itself again as a
// child with DISTFLASH_LIBCUDA, DISTFLASH_CUBLAS and DISTFLASH_LIBNCCL naming it (a process
// loads those libraries once). The child (stubChild) opens the backend, drives every Comm
// method on a one-rank world and checks the values it downloads; it marks each phase in the
// stub's log. The parent then checks the log against stubPhases: per phase, the calls expected
// in that order (other calls may come between them) and no NCCL call besides them, and across
// the log the device's context, failures and handles (checkStubLog). Twice: NCCL
// 2.23.4, whose Split is ncclCommSplit, and NCCL 2.17.1 without ncclCommSplit, whose Split makes
// a communicator from a new unique id.
func TestCUDAHostNCCLStub(t *testing.T) {
	if os.Getenv(stubChildEnv) != "" {
		stubChild(t)
		return
	}
	cc := ctest.Compiler(t, "the GPU stub library")
	for _, tc := range []struct {
		name    string
		version int
		split   bool // the library has ncclCommSplit (NCCL ≥ 2.18)
	}{
		{"nccl-2.23.4", 22304, true},
		{"nccl-2.17.1", 21701, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			lib := filepath.Join(dir, "libgpustub.so")
			// -I: the stub includes the backend's own nccl_abi.h and cuda_abi.h; --no-undefined:
			// it must define every entry point it declares
			args := slices.Concat(cc[1:], []string{"-shared", "-fPIC", "-Wall", "-Wextra",
				"-I", filepath.Join("..", "..", "kernels", "cuda"), "-o", lib, filepath.Join("testdata", "gpustub", "gpustub.c"),
				"-Wl,--no-undefined", "-lpthread"})
			if !tc.split {
				args = append(args, "-DGPUSTUB_NO_SPLIT")
			}
			out, err := exec.Command(cc[0], args...).CombinedOutput()
			if err != nil {
				t.Fatalf("%s %s: %v\n%s", cc[0], strings.Join(args, " "), err, out)
			}
			if len(out) > 0 {
				t.Logf("%s: %s", cc[0], out)
			}
			logPath := filepath.Join(dir, "calls.log")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCUDAHostNCCLStub$", "-test.v")
			cmd.Env = append(os.Environ(), stubChildEnv+"=1", "DISTFLASH_LIBCUDA="+lib, "DISTFLASH_CUBLAS="+lib,
				"DISTFLASH_LIBNCCL="+lib, "GPUSTUB_LOG="+logPath, fmt.Sprintf("GPUSTUB_NCCL_VERSION=%d", tc.version),
				"GPUSTUB_ASYNC_ERROR=")
			out, err = cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("the child test failed: %v\n%s", err, out)
			}
			calls, err := os.ReadFile(logPath)
			if err != nil {
				t.Fatal(err)
			}
			checkStubLog(t, string(calls), stubPhases(tc.version, tc.split))
		})
	}
}

// stubChildEnv marks the child process of TestCUDAHostNCCLStub.
const stubChildEnv = "DISTFLASH_GPUSTUB_CHILD"

// stubChild is the child process: the backend and a one-rank NCCL world on gpustub. It writes
// "# PHASE" into the stub's log before each phase.
func stubChild(t *testing.T) {
	logPath := os.Getenv("GPUSTUB_LOG")
	mark := func(phase string) {
		f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err == nil {
			_, err = fmt.Fprintf(f, "# %s\n", phase)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			panic(err)
		}
	}
	mark("open")
	be, err := kernels.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := be.(interface{ Device() string }).Device(), "GPUSTUB H100 (sm_90, 132 SMs)"; got != want {
		t.Errorf("Device() = %q, want %q", got, want)
	}
	mark("compute") // a launch and GEMMs, which the stub only logs: float32, and 16-bit operands into 16 and 32 bits
	x, y := be.Alloc(4), be.Alloc(4)
	be.Scale(x, 2)
	be.MatMul(y, x, x, 2, 2, 2, false, false, 0)
	xh, yh := be.Alloc(2), be.Alloc(2) // 4 values packed two to an element
	be.MatMulHalf(yh, xh, xh, 2, 2, 2, false, true, 0, kernels.BF16, true)
	be.MatMulHalf(y, xh, xh, 2, 2, 2, true, false, 1, kernels.FP16, false)
	lib, ok := be.(NCCLLib)
	if !ok {
		t.Fatalf("%T is no NCCLLib", be)
	}
	if err := NewWorld(1).Run(func(boot Comm) error { return stubWorld(be, lib, boot, mark) }); err != nil {
		t.Fatal(err)
	}
	mark("close-backend")
	if err := be.(interface{ Close() error }).Close(); err != nil {
		t.Fatal(err)
	}
}

// stubWorld is one rank's part of stubChild: every Comm method once, on device buffers of
// known values. Each phase uses buffers of a different length, which the log's counts show.
func stubWorld(be kernels.Backend, lib NCCLLib, boot Comm, mark func(string)) error {
	seq := func(n int, from float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = from + float32(i)
		}
		return v
	}
	upload := func(v []float32) kernels.Buf {
		b := be.Alloc(len(v))
		be.Upload(b, v)
		return b
	}
	expect := func(what string, b kernels.Buf, want []float32) error {
		got := make([]float32, len(want))
		be.Download(got, b)
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s on one rank: got %v, want %v", what, got, want)
		}
		return nil
	}
	closer := func(c Comm) error { return c.(interface{ Close() error }).Close() }

	mark("init")
	c, err := NewNCCL(boot, lib, NCCLOptions{}) // no watchdog: its polls would interleave with the phases
	if err != nil {
		return err
	}
	nc := c.(*ncclComm)

	mark("p2p") // a send to self and its receive, as a schedule posts them
	src, dst := upload(seq(5, 10)), be.Alloc(5)
	sr, rr := c.Isend(src, 0, 1, "p2p"), c.Irecv(dst, 0, 1, "p2p")
	Start(c)
	sr.Wait()
	rr.Wait()
	if err := expect("Isend/Irecv to self", dst, seq(5, 10)); err != nil {
		return err
	}

	mark("allreduce-comm") // one rank: nothing to reduce, no NCCL call
	buf := upload(seq(6, 20))
	c.AllReduce(buf, "allreduce")
	if err := expect("AllReduce", buf, seq(6, 20)); err != nil {
		return err
	}
	mark("allreduce") // ncclAllReduce itself, issued as AllReduce issues it on more ranks
	nc.collective("ncclAllReduce", "ar", func() { nc.must("ncclAllReduce", lib.NCCLAllReduce(nc.h, buf)) })
	if err := expect("ncclAllReduce", buf, seq(6, 20)); err != nil {
		return err
	}

	mark("allgather")
	src, dst = upload(seq(7, 30)), be.Alloc(7)
	c.AllGather(dst, src, "allgather")
	if err := expect("AllGather", dst, seq(7, 30)); err != nil {
		return err
	}

	mark("reducescatter")
	src, dst = upload(seq(8, 40)), be.Alloc(8)
	c.ReduceScatter(dst, src, "reducescatter")
	if err := expect("ReduceScatter", dst, seq(8, 40)); err != nil {
		return err
	}

	mark("alltoall") // from values 3 to 12 of a buffer: the views' offsets reach the stub
	big, dst := upload(seq(12, 50)), be.Alloc(9)
	c.AllToAll(dst, be.Slice(big, 3, 9), "alltoall")
	if err := expect("AllToAll", dst, seq(9, 53)); err != nil {
		return err
	}

	mark("error") // a send to rank 1 of 1: NCCL's error and its description come back
	one := upload(seq(4, 70))
	if err := lib.NCCLGroupStart(nc.h); err != nil {
		return err
	}
	sendErr := lib.NCCLSend(nc.h, one, 1)
	if err := lib.NCCLGroupEnd(nc.h); err != nil {
		return err
	}
	if sendErr == nil || !strings.Contains(sendErr.Error(), "ncclSend: ncclResult_t 4: invalid argument") {
		return fmt.Errorf("NCCLSend to rank 1 of 1: error %v, want one with %q", sendErr,
			"ncclSend: ncclResult_t 4: invalid argument")
	}

	mark("split")
	sub := c.Split(3, 5, "split")
	mark("split-allgather")
	src, dst = upload(seq(3, 60)), be.Alloc(3)
	sub.AllGather(dst, src, "split")
	if err := expect("AllGather on the split", dst, seq(3, 60)); err != nil {
		return err
	}

	mark("barrier")
	c.Barrier()

	mark("poll") // the watchdog's look: the stream's state and the asynchronous error
	if busy, err := lib.NCCLPoll(c.(*ncclComm).h); busy || err != nil {
		return fmt.Errorf("NCCLPoll on an idle communicator: busy %v, %v", busy, err)
	}

	mark("close-split")
	if err := closer(sub); err != nil {
		return err
	}
	mark("close")
	return closer(c)
}

// stubComm names the log variables of one communicator: its handle, stream and events.
type stubComm struct{ comm, stream, toComm, toCompute string }

// made is the calls that make the communicator's stream and events (before its handle).
func (s stubComm) made() []string {
	return []string{
		"cuStreamCreate stream=" + s.stream + " flags=1",
		"cuEventCreate event=" + s.toComm + " flags=2",
		"cuEventCreate event=" + s.toCompute + " flags=2",
	}
}

// group is one NCCL group of ops on the communicator (each with ncclFloat32 on its stream),
// after its stream's wait for the compute stream.
func (s stubComm) group(ops ...string) []string {
	calls := []string{
		"cuEventRecord event=" + s.toComm + " stream=$compute",
		"cuStreamWaitEvent stream=" + s.stream + " event=" + s.toComm,
		"ncclGroupStart depth=1",
	}
	for _, op := range ops {
		calls = append(calls, op+" datatype=7 comm="+s.comm+" stream="+s.stream)
	}
	return append(calls, "ncclGroupEnd depth=1")
}

// join is the compute stream's wait for the communicator's stream.
func (s stubComm) join() []string {
	return []string{
		"cuEventRecord event=" + s.toCompute + " stream=" + s.stream,
		"cuStreamWaitEvent stream=$compute event=" + s.toCompute,
	}
}

// sync is the host's wait for the communicator's stream, then its asynchronous error.
func (s stubComm) sync() []string {
	return []string{"cuStreamSynchronize stream=" + s.stream, "ncclCommGetAsyncError comm=" + s.comm + " error=0"}
}

// close is Close: sync, then ncclCommDestroy after the stream, then the stream and events go.
func (s stubComm) close() []string {
	return append(s.sync(),
		"cuStreamSynchronize stream="+s.stream,
		"ncclCommDestroy comm="+s.comm,
		"cuStreamDestroy stream="+s.stream,
		"cuEventDestroy event="+s.toComm,
		"cuEventDestroy event="+s.toCompute,
	)
}

// download is Download of n values: a copy on the compute stream, waited for.
func download(n int) []string {
	return []string{fmt.Sprintf("cuMemcpyDtoHAsync bytes=%d stream=$compute", 4*n), "cuStreamSynchronize stream=$compute"}
}

// stubPhase is the calls expected in one phase of the child, in order. A pattern is a call's
// name and some of its logged key=value pairs; a value $NAME is a variable: bound to the value
// the first time it matches, it must match the same value afterwards, and two variables never
// stand for the same value (so $comm is never the compute stream).
type stubPhase struct {
	name  string
	calls []string
}

// stubPhases is what the child's phases must call with an NCCL of the given version.
func stubPhases(version int, split bool) []stubPhase {
	comm := stubComm{"$comm", "$commStream", "$toComm", "$toCompute"}
	sub := stubComm{"$sub", "$subStream", "$subToComm", "$subToCompute"}
	cat := func(parts ...[]string) []string { return slices.Concat(parts...) }

	// NCCL ≥ 2.18: ncclCommSplit (config NULL); before: a new unique id for the split's ranks
	splitCalls := cat(sub.made(), []string{"ncclCommSplit comm=$comm color=3 key=5 config=NULL newcomm=$sub"})
	if !split {
		splitCalls = cat([]string{"ncclGetUniqueId id=2"}, sub.made(),
			[]string{"ncclCommInitRank nranks=1 rank=0 id=2 comm=$sub"})
	}
	return []stubPhase{
		{"open", []string{
			"cuInit",
			"cuDeviceGet ordinal=0 device=0",
			"cuDevicePrimaryCtxRetain device=0 ctx=$ctx",
			"cuCtxSetCurrent ctx=$ctx",
			"cuStreamCreate stream=$compute flags=1",
			"cuMemPoolSetAttribute attr=4 value=18446744073709551615",
			"cublasCreate handle=$blas",
			"cublasSetStream handle=$blas stream=$compute",
			"cublasSetMathMode handle=$blas mode=16", // default math, reductions in the compute type
			"cuMemAllocAsync bytes=33554432 stream=$compute",
			"cublasSetWorkspace handle=$blas stream=$compute bytes=33554432", // after cublasSetStream, which resets it
			// the modules in ptxKernels' sorted order (attn_f32, attn_mma, cudnn_aux, elementwise,
			// half), each from its one compute_80 PTX, which the driver compiles for the sm_90
			"cuModuleLoadDataEx target=sm_80",
			"cuModuleGetFunction name=df_scale",
			"cuFuncSetAttribute func=df_scale attr=8 value=232448",
			"cuModuleLoadDataEx target=sm_80",
		}},
		{"compute", []string{
			"cuLaunchKernel func=df_scale stream=$compute",
			"cublasGemmEx handle=$blas stream=$compute transa=0 transb=0 m=2 n=2 k=2 types=0,0,0 compute=68 operands=device",
			// C = A·Bᵀ row-major is Cᵀ = B·Aᵀ column-major: cuBLAS's A is MatMul's B, transposed
			"cublasGemmEx handle=$blas stream=$compute transa=1 transb=0 m=2 n=2 k=2 types=14,14,14 compute=68 operands=device",
			"cublasGemmEx handle=$blas stream=$compute transa=0 transb=1 m=2 n=2 k=2 types=2,2,0 compute=68 operands=device",
		}},
		{"init", cat(
			[]string{fmt.Sprintf("ncclGetVersion version=%d", version), "ncclGetUniqueId id=1"},
			comm.made(),
			[]string{"ncclCommInitRank nranks=1 rank=0 id=1 comm=$comm"},
		)},
		{"p2p", cat(comm.group("ncclSend count=5 peer=0", "ncclRecv count=5 peer=0"), comm.join(), download(5))},
		{"allreduce-comm", download(6)},
		{"allreduce", cat(comm.group("ncclAllReduce count=6 op=0 inplace=1"), comm.join(), download(6))},
		{"allgather", cat(comm.group("ncclAllGather sendcount=7 inplace=0"), comm.join(), download(7))},
		{"reducescatter", cat(comm.group("ncclReduceScatter recvcount=8 op=0 inplace=0"), comm.join(), download(8))},
		{"alltoall", cat(comm.group("ncclSend count=9 peer=0", "ncclRecv count=9 peer=0"), comm.join(), download(9))},
		{"error", []string{
			"ncclGroupStart depth=1",
			"ncclSend count=4 datatype=7 peer=1 comm=$comm stream=$commStream result=4",
			"ncclGetErrorString code=4",
			"ncclGroupEnd depth=1",
		}},
		{"split", splitCalls},
		{"split-allgather", cat(sub.group("ncclAllGather sendcount=3"), sub.join(), download(3))},
		{"barrier", cat(comm.join(), comm.sync())},
		{"poll", []string{"cuStreamQuery stream=$commStream", "ncclCommGetAsyncError comm=$comm error=0"}},
		{"close-split", sub.close()},
		{"close", comm.close()},
		{"close-backend", []string{
			"cuStreamSynchronize stream=$compute",
			"cublasDestroy handle=$blas",
			"cuModuleUnload", "cuModuleUnload", "cuModuleUnload",
			"cuStreamDestroy stream=$compute",
			"cuDevicePrimaryCtxRelease device=0 refs=0",
		}},
	}
}

// stubCall is one line of the stub's log: a call's name and its key=value pairs.
type stubCall struct {
	line string
	name string
	args map[string]string
}

func parseStubCall(line string) stubCall {
	f := strings.Fields(line)
	c := stubCall{line: line, name: f[0], args: map[string]string{}}
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		c.args[k] = v
	}
	return c
}

// stubBindings holds the values of the variables of stubPhases.
type stubBindings struct {
	val map[string]string // variable → value
	vr  map[string]string // value → variable
}

// match reports whether call matches pattern p, binding p's unbound variables if so.
func (b *stubBindings) match(call stubCall, p stubCall) bool {
	if call.name != p.name {
		return false
	}
	bind := map[string]string{}
	for k, want := range p.args {
		got, ok := call.args[k]
		if !ok {
			return false
		}
		if !strings.HasPrefix(want, "$") {
			if got != want {
				return false
			}
			continue
		}
		if v, ok := b.val[want]; ok {
			if v != got {
				return false
			}
		} else if other, ok := b.vr[got]; (ok && other != want) || (bind[want] != "" && bind[want] != got) {
			return false
		} else {
			bind[want] = got
		}
	}
	for k, v := range bind {
		b.val[k], b.vr[v] = v, k
	}
	return true
}

// stubContextFree lists the calls that may run without the device's context current on their
// thread: those that need none, and those that Open and Close make in cgo calls of their own
// after making it current in another. Every other call runs in a helper that makes it current
// first, so a call logged without it (cur=-) is a helper that forgot to.
var stubContextFree = map[string]bool{
	"cuInit": true, "cuDeviceGetCount": true, "cuDeviceGet": true, "cuDeviceGetName": true,
	"cuDeviceGetAttribute": true, "cuDevicePrimaryCtxRetain": true, "cuDevicePrimaryCtxRelease": true,
	"cuCtxSetCurrent": true, "cuStreamCreate": true, "cuStreamDestroy": true, "cuDeviceGetDefaultMemPool": true,
	"cuMemPoolSetAttribute": true, "cuModuleUnload": true, "cuGetErrorName": true, "cuGetErrorString": true,
	"cublasGetStatusName": true, "cublasGetStatusString": true, "ncclGetVersion": true, "ncclGetErrorString": true,
}

// checkStubLog checks the stub's log: the child's phases in order, each with its calls as a
// subsequence and no NCCL call besides; every call the device's context needs made with it
// current, and every NCCL call but ncclGetVersion after a cuCtxSetCurrent of its own (each of
// kernels/cuda's helpers makes the context current first: a goroutine's cgo calls may run on
// different threads); no failed call but those expected; every stream, event, module and
// communicator made destroyed.
func checkStubLog(t *testing.T, log string, phases []stubPhase) {
	t.Helper()
	var names []string
	byPhase := map[string][]stubCall{}
	var all []stubCall
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "# "); ok {
			names = append(names, p)
			continue
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		if len(names) == 0 {
			t.Fatalf("the stub logged %q before the child's first phase", line)
		}
		c := parseStubCall(line)
		byPhase[names[len(names)-1]] = append(byPhase[names[len(names)-1]], c)
		all = append(all, c)
	}
	want := make([]string, len(phases))
	for i, p := range phases {
		want[i] = p.name
	}
	if !slices.Equal(names, want) {
		t.Fatalf("the child's phases: %v, want %v", names, want)
	}
	show := func(calls []stubCall) string {
		var s strings.Builder
		for _, c := range calls {
			s.WriteString("\n\t" + c.line)
		}
		return s.String()
	}

	b := &stubBindings{val: map[string]string{}, vr: map[string]string{}}
	expectedFailures := 0
	for _, p := range phases {
		calls := byPhase[p.name]
		i := 0
		nccl := 0
		for _, pat := range p.calls {
			pc := parseStubCall(pat)
			if isNCCLOp(pc.name) {
				nccl++
			}
			if pc.args["result"] != "" {
				expectedFailures++
			}
			for i < len(calls) && !b.match(calls[i], pc) {
				i++
			}
			if i == len(calls) {
				t.Fatalf("phase %s: no call %q (in order after the ones before it); variables %v; the phase's calls:%s",
					p.name, pat, b.val, show(calls))
			}
			i++
		}
		got := 0
		for _, c := range calls {
			if isNCCLOp(c.name) {
				got++
			}
		}
		if got != nccl {
			t.Errorf("phase %s: %d NCCL calls, want %d; the phase's calls:%s", p.name, got, nccl, show(calls))
		}
	}

	failed := 0
	count := map[string]int{}
	ctxSet := false // since the last NCCL call
	for _, c := range all {
		count[c.name]++
		switch {
		case c.name == "cuCtxSetCurrent" && c.args["ctx"] == b.val["$ctx"]:
			ctxSet = true
		case isNCCLOp(c.name) && c.name != "ncclGetVersion":
			if !ctxSet {
				t.Errorf("%q: no cuCtxSetCurrent(%s) since the NCCL call before", c.line, b.val["$ctx"])
			}
			ctxSet = false
		}
		if c.args["result"] != "" {
			failed++
		}
		if !stubContextFree[c.name] && c.args["cur"] != b.val["$ctx"] {
			t.Errorf("%q ran without the device's context (%s) current on its thread", c.line, b.val["$ctx"])
		}
	}
	if failed != expectedFailures {
		var lines []stubCall
		for _, c := range all {
			if c.args["result"] != "" {
				lines = append(lines, c)
			}
		}
		t.Errorf("%d calls failed, want %d:%s", failed, expectedFailures, show(lines))
	}
	for _, pair := range [][2]string{
		{"cuStreamCreate", "cuStreamDestroy"},
		{"cuEventCreate", "cuEventDestroy"},
		{"cuModuleLoadDataEx", "cuModuleUnload"},
		{"ncclCommInitRank", "ncclCommDestroy"},
	} {
		made := count[pair[0]]
		if pair[0] == "ncclCommInitRank" {
			made += count["ncclCommSplit"]
		}
		if made != count[pair[1]] {
			t.Errorf("%d made (%s), %d destroyed (%s)", made, pair[0], count[pair[1]], pair[1])
		}
	}
}

// isNCCLOp reports whether a call is one of NCCL's, but for ncclGetErrorString (called each
// time an error is written).
func isNCCLOp(name string) bool {
	return strings.HasPrefix(name, "nccl") && name != "ncclGetErrorString"
}
