//go:build mpi

package transport

// The MPI communicator: a thin cgo binding of the MPI C API (MPI-3), used through the same
// Comm interface as the in-process world, with the same results bit for bit and the same
// bytes counted per call site.
//
// Point-to-point calls are MPI_Isend / MPI_Irecv; Request.Wait is MPI_Wait. The collectives
// move data with MPI's non-blocking collectives (MPI_Iallgather, MPI_Ialltoall,
// MPI_Ialltoallv, MPI_Iallgatherv, MPI_Ibarrier) and do the sums of ReduceScatter and
// AllReduce here in rank order, as the in-process world does: MPI_SUM does not fix the order
// of a reduction, and the Comm contract (and the bit-identical results across worlds) does.
//
// Go memory handed to MPI for a non-blocking call stays pinned (runtime.Pinner) until the
// request completes, as the cgo pointer rules ask of memory C holds across calls.

/*
// The compiler and linker flags of MPI come from pkg-config's generic name mpi
// (mpi_pkgconfig.go) or, with the tag mpicc, from the C compiler itself (CC=mpicc, the MPI's
// compiler wrapper, or CGO_CFLAGS and CGO_LDFLAGS): docs/cluster.md.
#include <stdlib.h>
#if defined(__has_include)
#if !__has_include(<mpi.h>)
#error "distflash: mpi.h is not on the include path: build with -tags mpi where pkg-config knows mpi (Debian, Ubuntu), or with CC=mpicc (the MPI's compiler wrapper: mpicc, Cray's cc) go build -tags 'mpi mpicc' (docs/cluster.md)"
#endif
#endif
#include <mpi.h>

// df_mpi_h names the MPI whose mpi.h this binary was compiled against: Open MPI and the
// MPICH family (MPICH, Intel MPI, MVAPICH, Cray MPICH) say their version in macros.
#define DF_STR1(x) #x
#define DF_STR(x) DF_STR1(x)
static const char *df_mpi_h(void) {
#if defined(OPEN_MPI)
	return "Open MPI " DF_STR(OMPI_MAJOR_VERSION) "." DF_STR(OMPI_MINOR_VERSION) "." DF_STR(OMPI_RELEASE_VERSION) " (MPI " DF_STR(MPI_VERSION) "." DF_STR(MPI_SUBVERSION) ")";
#elif defined(MPICH_VERSION)
	return "MPICH " MPICH_VERSION " (MPI " DF_STR(MPI_VERSION) "." DF_STR(MPI_SUBVERSION) ")";
#else
	return "MPI " DF_STR(MPI_VERSION) "." DF_STR(MPI_SUBVERSION);
#endif
}

// df_library_version is MPI_Get_library_version, which MPI-3 lets a process call before
// MPI_Init: what the library loaded at run time says it is.
static int df_library_version(char *buf, int *n) { return MPI_Get_library_version(buf, n); }

// Open MPI's handles are macros over its globals, which cgo cannot use: these return them.
static MPI_Comm df_world(void) { return MPI_COMM_WORLD; }
static MPI_Datatype df_float(void) { return MPI_FLOAT; }

// MPI_IN_PLACE is (void *)1 in Open MPI: a Go variable of pointer type must never hold it (the
// runtime throws "invalid pointer found on stack" when it copies a goroutine's stack with such
// a value in a pointer slot), so the in-place collectives name it here, in C.
static int df_iallgather(const void *s, int in_place, int n, MPI_Datatype t, void *d, MPI_Comm c, MPI_Request *r) {
	return MPI_Iallgather(in_place ? MPI_IN_PLACE : s, n, t, d, n, t, c, r);
}
static int df_iallgatherv_in_place(void *d, const int *counts, const int *displs, MPI_Datatype t, MPI_Comm c, MPI_Request *r) {
	return MPI_Iallgatherv(MPI_IN_PLACE, 0, t, d, counts, displs, t, c, r);
}

// df_open_mpi is 1 for Open MPI, whose direct launch by srun needs PMIx (SrunWithoutPMIx).
static int df_open_mpi(void) {
#ifdef OPEN_MPI
	return 1;
#else
	return 0;
#endif
}

static int df_init(int want, int *got) { return MPI_Init_thread(NULL, NULL, want, got); }
static int df_thread_multiple(void) { return MPI_THREAD_MULTIPLE; }
static int df_thread_serialized(void) { return MPI_THREAD_SERIALIZED; }
static int df_errors_return(MPI_Comm c) { return MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN); }

static int df_tag_ub(int *ub) {
	void *v;
	int flag = 0;
	int rc = MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &v, &flag);
	*ub = (rc == MPI_SUCCESS && flag) ? *(int *)v : 32767;
	return rc;
}

// df_wait and df_test complete a request and, for a receive, give the values received.
static int df_wait(MPI_Request *r, int *count) {
	MPI_Status st;
	int rc = MPI_Wait(r, &st);
	if (rc == MPI_SUCCESS && count != NULL) MPI_Get_count(&st, MPI_FLOAT, count);
	return rc;
}
static int df_test(MPI_Request *r, int *flag, int *count) {
	MPI_Status st;
	int rc = MPI_Test(r, flag, &st);
	if (rc == MPI_SUCCESS && *flag && count != NULL) MPI_Get_count(&st, MPI_FLOAT, count);
	return rc;
}
static int df_abort(int code) { return MPI_Abort(MPI_COMM_WORLD, code); }
static int df_success(void) { return MPI_SUCCESS; }
*/
import "C"

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"distflash/kernels"
)

// MPIBuilt reports whether this binary has the MPI communicator (built with -tags mpi).
const MPIBuilt = true

// mpi is the process's MPI state: MPI is initialised once per process and cannot be again
// after MPI_Finalize.
var mpi struct {
	mu        sync.Mutex
	env       *mpiEnv
	world     *mpiComm
	board     *ErrorBoard // OpenErrorBoard's, closed by FinalizeMPI
	finalized bool
	thread    chan func() // runs a function on the OS thread that initialised MPI
}

// mpiEnv is what the communicators of this process share.
type mpiEnv struct {
	opt       MPIOptions
	multiple  bool       // MPI_THREAD_MULTIPLE; otherwise every call holds mu
	mu        sync.Mutex // serialises MPI calls without MPI_THREAD_MULTIPLE
	worldRank int
	tagUB     int
	float     C.MPI_Datatype
	ctr       counter // bytes sent, per call site, over all communicators

	pendMu  sync.Mutex
	pending map[*mpiRequest]struct{} // started, not yet waited for
	library string
}

// InitMPI initialises MPI with the options of MPIOptionsFromEnv and returns the communicator
// of all processes of the job (MPI_COMM_WORLD). Later calls return the same communicator.
//
// It asks for MPI_THREAD_MULTIPLE, which Open MPI (since 3.0) and MPICH provide: any goroutine
// may then call the communicator, and a wait blocks in MPI_Wait. A library that offers only
// MPI_THREAD_SERIALIZED is used under one lock, and waits poll MPI_Test so that other
// goroutines can call MPI meanwhile; below SERIALIZED it is refused, because goroutines move
// between OS threads. Errors return (MPI_ERRORS_RETURN) and are turned into panics with a *Failure
// that says which call on which rank failed (Recover makes it an error again): the Comm methods return no errors, as a lost rank is not
// something a step can recover from.
func InitMPI() (Comm, error) {
	opt, err := MPIOptionsFromEnv()
	if err != nil {
		return nil, err
	}
	return InitMPIWith(opt)
}

// InitMPIWith is InitMPI with explicit options.
func InitMPIWith(opt MPIOptions) (Comm, error) {
	mpi.mu.Lock()
	defer mpi.mu.Unlock()
	if mpi.finalized {
		return nil, fmt.Errorf("parallel: InitMPI after FinalizeMPI: MPI cannot be initialised twice in one process")
	}
	if mpi.world != nil {
		return mpi.world, nil
	}
	// Open MPI can install handlers for SIGSEGV, SIGBUS, SIGFPE and SIGILL that print a
	// stack and exit; in place of the Go runtime's they would turn a nil dereference into a
	// crash instead of a panic. Open MPI 4.1 kept the Go runtime's in a test here even when
	// asked for its own; this keeps them with any version, unless the user set the parameter
	// on purpose.
	if _, ok := os.LookupEnv("OMPI_MCA_opal_signal"); !ok {
		os.Setenv("OMPI_MCA_opal_signal", "")
	}
	// MPI_Init_thread and MPI_Finalize run on one OS thread, as the standard asks of the
	// thread that initialises MPI; goroutines would otherwise move between threads.
	mpi.thread = make(chan func())
	go func() {
		runtime.LockOSThread()
		for f := range mpi.thread {
			f()
		}
	}()
	onThread := func(f func()) {
		done := make(chan struct{})
		mpi.thread <- func() { f(); close(done) }
		<-done
	}
	want := C.df_thread_multiple()
	if opt.Serialized {
		want = C.df_thread_serialized()
	}
	if w := SrunWithoutPMIx(); w != "" && C.df_open_mpi() == 1 {
		fmt.Fprintln(os.Stderr, w)
	}
	var got C.int
	var rc C.int
	onThread(func() { rc = C.df_init(want, &got) })
	if rc != C.df_success() {
		return nil, fmt.Errorf("parallel: MPI_Init_thread: %s", mpiErrString(rc))
	}
	e := &mpiEnv{opt: opt, float: C.df_float(), pending: map[*mpiRequest]struct{}{}}
	switch {
	case got >= C.df_thread_multiple() && !opt.Serialized:
		e.multiple = true
	case got >= C.df_thread_serialized():
	default:
		onThread(func() { C.MPI_Finalize() })
		close(mpi.thread)
		mpi.finalized = true
		return nil, fmt.Errorf("parallel: the MPI library offers thread level %d, below MPI_THREAD_SERIALIZED (%d): goroutines move between OS threads, so distflash needs SERIALIZED or MULTIPLE (Open MPI ≥ 3.0 and MPICH offer MULTIPLE)", int(got), int(C.df_thread_serialized()))
	}
	world := C.df_world()
	var ub, rank, size C.int
	for _, step := range []struct {
		what string
		rc   C.int
	}{
		{"MPI_Comm_set_errhandler(MPI_ERRORS_RETURN)", C.df_errors_return(world)},
		{"MPI_Comm_rank", C.MPI_Comm_rank(world, &rank)},
		{"MPI_Comm_size", C.MPI_Comm_size(world, &size)},
		{"MPI_Comm_get_attr(MPI_TAG_UB)", C.df_tag_ub(&ub)},
	} {
		if step.rc != C.df_success() {
			return nil, fmt.Errorf("parallel: %s: %s", step.what, mpiErrString(step.rc))
		}
	}
	e.worldRank, e.tagUB = int(rank), int(ub)
	e.library = MPILibrary()
	mpi.env = e
	mpi.world = &mpiComm{e: e, comm: world, id: "world", rank: int(rank), size: int(size)}
	return mpi.world, nil
}

// MPIBuiltWith names the MPI whose mpi.h this binary was compiled against and the MPI
// standard it declares: "Open MPI 4.1.4 (MPI 3.1)", "MPICH 4.0.2 (MPI 4.0)" (MPICH and the MPIs
// derived from it: Intel MPI, MVAPICH, Cray MPICH, each with its MPICH base version), or
// "MPI 3.1" for another.
func MPIBuiltWith() string { return C.GoString(C.df_mpi_h()) }

// MPILibrary names the MPI library this process loaded and its version, from
// MPI_Get_library_version (which MPI-3 allows before MPI_Init): "Open MPI v4.1.4",
// "MPICH 4.0.2". It can differ from MPIBuiltWith when the dynamic linker finds another
// libmpi than the one the binary was built against (LD_LIBRARY_PATH, a module loaded).
func MPILibrary() string {
	var buf [C.MPI_MAX_LIBRARY_VERSION_STRING]C.char
	var n C.int
	if C.df_library_version(&buf[0], &n) != C.df_success() {
		return "an MPI library that does not say its version"
	}
	return libraryName(C.GoStringN(&buf[0], n))
}

// MPIInfo describes the MPI in use, for a log line: library, ranks, thread level, watchdog,
// and GOMAXPROCS (mpirun binds each rank to one core by default on 2 ranks, to a socket
// above: a rank then uses only those cores; see the README for --bind-to none).
func MPIInfo() string {
	mpi.mu.Lock()
	defer mpi.mu.Unlock()
	e := mpi.env
	if e == nil {
		return "MPI not initialised"
	}
	lvl := "MPI_THREAD_SERIALIZED (calls under one lock, waits polled)"
	if e.multiple {
		lvl = "MPI_THREAD_MULTIPLE"
	}
	wd := "no watchdog"
	if e.opt.Timeout > 0 {
		wd = fmt.Sprintf("a wait longer than %v aborts the job", e.opt.Timeout)
	}
	if e.opt.SyncSend {
		wd += ", synchronous sends"
	}
	return fmt.Sprintf("%s, %d ranks, %s, %s, GOMAXPROCS %d", e.library, mpi.world.size, lvl, wd, runtime.GOMAXPROCS(0))
}

// FinalizeMPI ends MPI (MPI_Finalize), after which no communicator may be used. Every rank
// must call it; it returns an error when requests were started and never waited for (each
// Isend and Irecv must be waited for) or when MPI_Finalize fails.
func FinalizeMPI() error {
	mpi.mu.Lock()
	defer mpi.mu.Unlock()
	if mpi.env == nil || mpi.finalized {
		return nil
	}
	e := mpi.env
	if mpi.board != nil {
		mpi.board.close()
		mpi.board = nil
	}
	e.pendMu.Lock()
	var leaked []string
	for r := range e.pending {
		leaked = append(leaked, r.describe())
	}
	e.pendMu.Unlock()
	var rc C.int
	done := make(chan struct{})
	mpi.thread <- func() { rc = C.MPI_Finalize(); close(done) }
	<-done
	close(mpi.thread)
	mpi.finalized = true
	if len(leaked) > 0 {
		if len(leaked) > 5 {
			leaked = append(leaked[:5], "…")
		}
		return fmt.Errorf("parallel: FinalizeMPI on rank %d: %d requests were never waited for: %s", e.worldRank, len(e.pending), strings.Join(leaked, "; "))
	}
	if rc != C.df_success() {
		return fmt.Errorf("parallel: MPI_Finalize on rank %d: %s", e.worldRank, mpiErrString(rc))
	}
	return nil
}

// AbortMPI ends every rank of the job (MPI_Abort on the world) with code as the exit status;
// before InitMPI it asks MPICH's launcher Hydra, if it started this process, to end them
// (Open MPI's mpirun ends a job whose process exits with a failure by itself); after
// FinalizeMPI, or if MPI_Abort returns, it exits this process.
func AbortMPI(code int) {
	mpi.mu.Lock()
	e := mpi.env
	done := mpi.finalized
	mpi.mu.Unlock()
	if e != nil && !done {
		e.abort(code)
	}
	if e == nil {
		hydraAbort(code)
	}
	os.Exit(code)
}

func (e *mpiEnv) abort(code int) {
	if !e.multiple {
		// Serialised: wait a little for the call in progress (the lock is never released:
		// the process ends here), then abort regardless, which beats hanging.
		for i := 0; i < 100 && !e.mu.TryLock(); i++ {
			time.Sleep(10 * time.Millisecond)
		}
	}
	C.df_abort(C.int(code))
	os.Exit(code)
}

// mpiErrString is MPI's text for an error code.
func mpiErrString(rc C.int) string {
	var buf [C.MPI_MAX_ERROR_STRING]C.char
	var n C.int
	if C.MPI_Error_string(rc, &buf[0], &n) != C.df_success() {
		return fmt.Sprintf("MPI error %d", int(rc))
	}
	return C.GoStringN(&buf[0], n)
}

// call runs one MPI call, under the lock when MPI is not MPI_THREAD_MULTIPLE.
func (e *mpiEnv) call(f func() C.int) C.int {
	if !e.multiple {
		e.mu.Lock()
		defer e.mu.Unlock()
	}
	return f()
}

// mpiComm is one process's handle on an MPI communicator.
type mpiComm struct {
	e          *mpiEnv
	comm       C.MPI_Comm
	id         string // "world", then "world/0:color" for the groups Split makes
	rank, size int
	splits     int
}

// Rank implements Comm.
func (c *mpiComm) Rank() int { return c.rank }

// Size implements Comm.
func (c *mpiComm) Size() int { return c.size }

// Traffic implements Comm: the bytes this process has sent, by call site, over every
// communicator it has (as the in-process world counts a rank's).
func (c *mpiComm) Traffic() Traffic { return c.e.ctr.snapshot() }

// count adds bytes under site as the in-process world does: only when the call sends to
// another rank at all (P > 1), so the same calls give the same Traffic in both worlds.
func (c *mpiComm) count(site string, bytes int64) {
	if c.size > 1 {
		c.e.ctr.add(site, bytes)
	}
}

// opKind says what a request does, for messages.
type opKind int

const (
	opSend opKind = iota
	opRecv
	opColl
)

// mpiRequest is a started MPI operation. Its buffers stay pinned until it completes.
type mpiRequest struct {
	c     *mpiComm
	req   C.MPI_Request
	pin   runtime.Pinner
	kind  opKind
	name  string // the collective's name
	peer  int
	tag   int
	n     int // values sent or expected
	site  string
	after func() // runs once the data is in (the rank-order sums)
	once  sync.Once
}

func (c *mpiComm) newRequest(kind opKind, name string, peer, tag, n int, site string) *mpiRequest {
	r := &mpiRequest{c: c, kind: kind, name: name, peer: peer, tag: tag, n: n, site: site}
	c.e.pendMu.Lock()
	c.e.pending[r] = struct{}{} // keeps the pins reachable until Wait, even if r is dropped
	c.e.pendMu.Unlock()
	return r
}

// ptr pins x's memory for the request's lifetime and returns it for C (nil when empty).
func (r *mpiRequest) ptr(x []float32) unsafe.Pointer {
	if len(x) == 0 {
		return nil
	}
	r.pin.Pin(&x[0])
	return unsafe.Pointer(&x[0])
}

// ints returns a pinned C int array of xs (the counts and displacements of a v-collective,
// which MPI reads until the request completes).
func (r *mpiRequest) ints(xs []int) *C.int {
	out := make([]C.int, len(xs))
	for i, x := range xs {
		out[i] = C.int(x)
	}
	r.pin.Pin(&out[0])
	return &out[0]
}

func (r *mpiRequest) describe() string {
	where := fmt.Sprintf("group %s, site %q", r.c.id, r.site)
	switch r.kind {
	case opSend:
		return fmt.Sprintf("send of %d values to rank %d (tag %d, %s)", r.n, r.peer, r.tag, where)
	case opRecv:
		return fmt.Sprintf("receive of %d values from rank %d (tag %d, %s)", r.n, r.peer, r.tag, where)
	}
	return fmt.Sprintf("%s of %d values (%s)", r.name, r.n, where)
}

// fail panics with a *Failure naming this rank, the operation and MPI's reason.
func (r *mpiRequest) fail(rc C.int) {
	r.release()
	fail("parallel: MPI rank %d (rank %d of group %s): %s: %s", r.c.e.worldRank, r.c.rank, r.c.id, r.describe(), mpiErrString(rc))
}

// start checks the return code of the call that started the request.
func (r *mpiRequest) start(rc C.int) *mpiRequest {
	if rc != C.df_success() {
		r.fail(rc)
	}
	return r
}

func (r *mpiRequest) release() {
	r.pin.Unpin()
	r.c.e.pendMu.Lock()
	delete(r.c.e.pending, r)
	r.c.e.pendMu.Unlock()
}

// Wait implements Request: MPI_Wait, bounded by the watchdog.
func (r *mpiRequest) Wait() { r.once.Do(r.wait) }

func (r *mpiRequest) wait() {
	e := r.c.e
	var count C.int
	var pc *C.int
	if r.kind == opRecv {
		pc = &count
	}
	var rc, flag C.int
	if e.multiple {
		// A request that is complete already (a small send, a message that has arrived)
		// needs no watchdog.
		if rc = C.df_test(&r.req, &flag, pc); rc == C.df_success() && flag == 0 {
			var t *time.Timer
			if e.opt.Timeout > 0 {
				t = time.AfterFunc(e.opt.Timeout, func() { r.hang() })
			}
			rc = C.df_wait(&r.req, pc)
			if t != nil {
				t.Stop()
			}
		}
	} else {
		start := time.Now()
		for i := 0; ; i++ {
			e.mu.Lock()
			rc = C.df_test(&r.req, &flag, pc)
			e.mu.Unlock()
			if rc != C.df_success() || flag != 0 {
				break
			}
			if e.opt.Timeout > 0 && time.Since(start) > e.opt.Timeout {
				r.hang()
			}
			switch {
			case i < 1000:
				runtime.Gosched()
			default:
				time.Sleep(min(time.Duration(i-999)*time.Microsecond, 200*time.Microsecond))
			}
		}
	}
	if rc != C.df_success() {
		r.fail(rc)
	}
	r.release()
	if r.kind == opRecv && int(count) != r.n {
		fail("parallel: rank %d expected %d values from rank %d (tag %d), got %d (MPI rank %d, group %s, site %q)", r.c.rank, r.n, r.peer, r.tag, int(count), e.worldRank, r.c.id, r.site)
	}
	if r.after != nil {
		r.after()
	}
}

// hang is the watchdog: the request has not completed within the timeout, so a rank has died,
// is stuck, or the ranks disagree on the order of their calls. It says so and ends the job.
func (r *mpiRequest) hang() {
	e := r.c.e
	fmt.Fprintf(os.Stderr, "parallel: MPI rank %d (rank %d of group %s) waited %v for the %s; a rank has died or stopped, or the ranks disagree on the order of calls: aborting the job (set DISTFLASH_MPI_TIMEOUT to wait longer)\n",
		e.worldRank, r.c.rank, r.c.id, e.opt.Timeout, r.describe())
	e.abort(124)
}

// guard runs a blocking MPI call (one that has no non-blocking form) under the watchdog.
func (c *mpiComm) guard(what string, f func() C.int) C.int {
	if c.e.opt.Timeout > 0 {
		r := &mpiRequest{c: c, kind: opColl, name: what}
		t := time.AfterFunc(c.e.opt.Timeout, r.hang)
		defer t.Stop()
	}
	return c.e.call(f)
}

func (c *mpiComm) checkPeer(what string, peer int) {
	if peer < 0 || peer >= c.size {
		panic(fmt.Sprintf("parallel: %s rank %d of %d", what, peer, c.size))
	}
}

func (c *mpiComm) checkTag(tag int) {
	if tag < 0 {
		panic("parallel: negative tags are reserved")
	}
	if tag > c.e.tagUB {
		panic(fmt.Sprintf("parallel: tag %d above this MPI's largest tag %d (MPI_TAG_UB)", tag, c.e.tagUB))
	}
}

// cint converts a count or displacement for MPI, whose C API takes int.
func cint(n int, what string) C.int {
	if n > math.MaxInt32 {
		panic(fmt.Sprintf("parallel: %s of %d values: MPI counts are C ints (at most %d)", what, n, math.MaxInt32))
	}
	return C.int(n)
}

// Isend implements Comm with MPI_Isend; buf stays pinned, and must not change, until Wait.
func (c *mpiComm) Isend(buf kernels.Buf, dst, tag int, site string) Request {
	c.checkPeer("send to", dst)
	c.checkTag(tag)
	h := host(buf)
	r := c.newRequest(opSend, "", dst, tag, len(h), site)
	p := r.ptr(h)
	n := cint(len(h), "send")
	c.e.ctr.add(site, int64(4*len(h)))
	if c.e.opt.SyncSend {
		return r.start(c.e.call(func() C.int {
			return C.MPI_Issend(p, n, c.e.float, C.int(dst), C.int(tag), c.comm, &r.req)
		}))
	}
	return r.start(c.e.call(func() C.int {
		return C.MPI_Isend(p, n, c.e.float, C.int(dst), C.int(tag), c.comm, &r.req)
	}))
}

// Irecv implements Comm with MPI_Irecv; Wait panics when the message does not have exactly
// buf.Len() values, as in the in-process world.
func (c *mpiComm) Irecv(buf kernels.Buf, src, tag int, site string) Request {
	c.checkPeer("receive from", src)
	c.checkTag(tag)
	h := host(buf)
	r := c.newRequest(opRecv, "", src, tag, len(h), site)
	p := r.ptr(h)
	n := cint(len(h), "receive")
	return r.start(c.e.call(func() C.int {
		return C.MPI_Irecv(p, n, c.e.float, C.int(src), C.int(tag), c.comm, &r.req)
	}))
}

// overlap reports whether a and b share memory.
func overlap(a, b []float32) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+4*uintptr(len(b)) && b0 < a0+4*uintptr(len(a))
}

// AllGather implements Comm with MPI_Iallgather (in place when src is this rank's block of dst).
func (c *mpiComm) AllGather(dst, src kernels.Buf, site string) {
	d, s, P := host(dst), host(src), c.size
	n := len(s)
	if len(d) != P*n {
		panic(fmt.Sprintf("parallel: all-gather of %d into %d on %d ranks", n, len(d), P))
	}
	c.count(site, int64((P-1)*n*4))
	r := c.newRequest(opColl, "all-gather", -1, 0, n, site)
	dp := r.ptr(d)
	var sp unsafe.Pointer
	inPlace := C.int(0)
	switch {
	case n > 0 && &s[0] == &d[c.rank*n]:
		inPlace = 1
	case overlap(s, d):
		sp = r.ptr(append([]float32(nil), s...))
	default:
		sp = r.ptr(s)
	}
	cn := cint(n, "all-gather")
	r.start(c.e.call(func() C.int {
		return C.df_iallgather(sp, inPlace, cn, c.e.float, dp, c.comm, &r.req)
	})).Wait()
}

// ReduceScatter implements Comm: MPI_Ialltoall gives this rank chunk Rank of every rank's
// src, which are then summed here in rank order.
func (c *mpiComm) ReduceScatter(dst, src kernels.Buf, site string) {
	d, s, P := host(dst), host(src), c.size
	n := len(d)
	if len(s) != P*n {
		panic(fmt.Sprintf("parallel: reduce-scatter of %d into %d on %d ranks", len(s), n, P))
	}
	c.count(site, int64((P-1)*n*4))
	parts := make([]float32, P*n)
	r := c.newRequest(opColl, "reduce-scatter", -1, 0, n, site)
	sp, pp, cn := r.ptr(s), r.ptr(parts), cint(n, "reduce-scatter")
	r.after = func() { sumRankOrder(d, parts, P) }
	r.start(c.e.call(func() C.int {
		return C.MPI_Ialltoall(sp, cn, c.e.float, pp, cn, c.e.float, c.comm, &r.req)
	})).Wait()
}

// sumRankOrder sets d[i] to the float32 sum, in rank order from zero, of parts[r·len(d)+i].
func sumRankOrder(d, parts []float32, P int) {
	n := len(d)
	for i := range d {
		var s float32
		for r := 0; r < P; r++ {
			s += parts[r*n+i]
		}
		d[i] = s
	}
}

// AllReduce implements Comm as the in-process world does: a reduce-scatter over near-equal
// chunks (MPI_Ialltoallv, then the rank-order sum here) and an all-gather of the summed chunks
// (MPI_Iallgatherv in place), 2·(P−1)/P of the buffer sent per rank.
func (c *mpiComm) AllReduce(buf kernels.Buf, site string) {
	b, P := host(buf), c.size
	if P == 1 {
		return
	}
	cint(len(b), "all-reduce")
	lo := func(r int) int { return r * len(b) / P }
	me := c.rank
	m := lo(me+1) - lo(me)
	c.count(site, int64((len(b)-m+(P-1)*m)*4))
	sendCounts, sendDispl := make([]int, P), make([]int, P)
	recvCounts, recvDispl := make([]int, P), make([]int, P)
	for q := 0; q < P; q++ {
		sendCounts[q], sendDispl[q] = lo(q+1)-lo(q), lo(q)
		recvCounts[q], recvDispl[q] = m, q*m
	}
	parts := make([]float32, P*m)
	r := c.newRequest(opColl, "all-reduce (reduce-scatter phase)", -1, 0, len(b), site)
	bp, pp := r.ptr(b), r.ptr(parts)
	sc, sd, rcn, rd := r.ints(sendCounts), r.ints(sendDispl), r.ints(recvCounts), r.ints(recvDispl)
	r.after = func() { sumRankOrder(b[lo(me):lo(me+1)], parts, P) }
	r.start(c.e.call(func() C.int {
		return C.MPI_Ialltoallv(bp, sc, sd, c.e.float, pp, rcn, rd, c.e.float, c.comm, &r.req)
	})).Wait()

	g := c.newRequest(opColl, "all-reduce (all-gather phase)", -1, 0, len(b), site)
	bp = g.ptr(b)
	gc, gd := g.ints(sendCounts), g.ints(sendDispl)
	g.start(c.e.call(func() C.int {
		return C.df_iallgatherv_in_place(bp, gc, gd, c.e.float, c.comm, &g.req)
	})).Wait()
}

// AllToAll implements Comm with MPI_Ialltoall.
func (c *mpiComm) AllToAll(dst, src kernels.Buf, site string) {
	d, s, P := host(dst), host(src), c.size
	if len(d) != len(s) || len(s)%P != 0 {
		panic(fmt.Sprintf("parallel: all-to-all of %d into %d on %d ranks", len(s), len(d), P))
	}
	n := len(s) / P
	c.count(site, int64((P-1)*n*4))
	r := c.newRequest(opColl, "all-to-all", -1, 0, len(s), site)
	if overlap(s, d) {
		s = append([]float32(nil), s...)
	}
	sp, dp, cn := r.ptr(s), r.ptr(d), cint(n, "all-to-all")
	r.start(c.e.call(func() C.int {
		return C.MPI_Ialltoall(sp, cn, c.e.float, dp, cn, c.e.float, c.comm, &r.req)
	})).Wait()
}

// Barrier implements Comm with MPI_Ibarrier (counted as a call that sends 0 bytes, as the
// in-process world counts it).
func (c *mpiComm) Barrier() {
	c.count("barrier", 0)
	r := c.newRequest(opColl, "barrier", -1, 0, 0, "barrier")
	r.start(c.e.call(func() C.int { return C.MPI_Ibarrier(c.comm, &r.req) })).Wait()
}

// Split implements Comm with MPI_Comm_split; it counts the (color, key) all-gather that the
// in-process world does, (P−1)·8 bytes, which is what MPI_Comm_split exchanges too.
func (c *mpiComm) Split(color, key int, site string) Comm {
	P := c.size
	if abs(color) >= 1<<24 || abs(key) >= 1<<24 {
		panic(fmt.Sprintf("parallel: split color %d, key %d: must be below 2^24 in magnitude", color, key))
	}
	c.count(site, int64((P-1)*2*4))
	var nc C.MPI_Comm
	// MPI colors are ≥ 0; Comm's may be negative. Ranks are ordered by key, then by rank,
	// as Comm.Split asks.
	rc := c.guard("split", func() C.int { return C.MPI_Comm_split(c.comm, C.int(color+1<<24), C.int(key), &nc) })
	what := fmt.Sprintf("MPI_Comm_split(color %d, key %d, site %q)", color, key, site)
	var rank, size C.int
	if rc == C.df_success() {
		rc = c.e.call(func() C.int { return C.df_errors_return(nc) })
	}
	if rc == C.df_success() {
		rc = c.e.call(func() C.int { return C.MPI_Comm_rank(nc, &rank) })
	}
	if rc == C.df_success() {
		rc = c.e.call(func() C.int { return C.MPI_Comm_size(nc, &size) })
	}
	if rc != C.df_success() {
		fail("parallel: MPI rank %d (rank %d of group %s): %s: %s", c.e.worldRank, c.rank, c.id, what, mpiErrString(rc))
	}
	id := fmt.Sprintf("%s/%d:%d", c.id, c.splits, color)
	c.splits++
	return &mpiComm{e: c.e, comm: nc, id: id, rank: int(rank), size: int(size)}
}
