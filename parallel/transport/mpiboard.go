//go:build mpi

package transport

/*
#include <mpi.h>

static int df_board_test(MPI_Request *r, int *flag) { return MPI_Test(r, flag, MPI_STATUS_IGNORE); }
static int df_allgather_count(int n, int *all, MPI_Comm c) { return MPI_Allgather(&n, 1, MPI_INT, all, 1, MPI_INT, c); }
static int df_allgatherv_bytes(const void *s, int n, void *d, const int *counts, const int *displs, MPI_Comm c) {
	return MPI_Allgatherv(s, n, MPI_BYTE, d, counts, displs, MPI_BYTE, c);
}
static int df_board_cancel(MPI_Request *r) {
	int rc = MPI_Cancel(r);
	if (rc == MPI_SUCCESS) rc = MPI_Wait(r, MPI_STATUS_IGNORE);
	return rc;
}
*/
import "C"

import (
	"errors"
	"runtime"
	"time"
	"unsafe"
)

var errNotInitialised = errors.New("parallel: the error board needs InitMPI first")

// ErrorBoard carries a failing rank's error to rank 0, which says it once for the job
// (package main's one path for errors after the world starts). It is a duplicate of the world
// communicator, so its messages never meet the ranks' own; rank 0 keeps one receive posted per
// other rank and polls them (no watchdog: the board waits for the whole run).
type ErrorBoard struct {
	e    *mpiEnv
	comm C.MPI_Comm
	rank int
	msgs chan BoardMessage
	stop chan struct{}
	done chan struct{}
}

// OpenErrorBoard makes the board over the world of InitMPI (collective: every process calls it
// once, right after InitMPI). On rank 0 it starts the receives and their polling.
func OpenErrorBoard() (*ErrorBoard, error) {
	mpi.mu.Lock()
	w := mpi.world
	mpi.mu.Unlock()
	if w == nil {
		return nil, errNotInitialised
	}
	b := &ErrorBoard{e: w.e, rank: w.rank}
	if rc := w.e.call(func() C.int { return C.MPI_Comm_dup(w.comm, &b.comm) }); rc != C.MPI_SUCCESS {
		return nil, &Failure{msg: "parallel: MPI_Comm_dup (the error board): " + mpiErrString(rc)}
	}
	if w.rank == 0 {
		b.msgs, b.stop, b.done = make(chan BoardMessage, w.size), make(chan struct{}), make(chan struct{})
		go b.listen(w.size)
	}
	mpi.mu.Lock()
	mpi.board = b
	mpi.mu.Unlock()
	return b, nil
}

// Messages delivers, on rank 0, each error another rank posts (nil on other ranks).
func (b *ErrorBoard) Messages() <-chan BoardMessage { return b.msgs }

// Post sends text to rank 0 and returns at once; on rank 0 it does nothing.
func (b *ErrorBoard) Post(text string) {
	if b.rank == 0 {
		return
	}
	buf := encodeBoard(text)
	var req C.MPI_Request
	var pin runtime.Pinner // never unpinned: the process ends after a post
	pin.Pin(&buf[0])
	b.e.call(func() C.int {
		return C.MPI_Isend(unsafe.Pointer(&buf[0]), boardValues, b.e.float, 0, 0, b.comm, &req)
	})
	// The send completes when rank 0's receive takes it; progress it meanwhile.
	go func() {
		var flag C.int
		for flag == 0 {
			if b.e.call(func() C.int { return C.df_board_test(&req, &flag) }) != C.MPI_SUCCESS {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
}

// listen keeps one receive posted per other rank and delivers what arrives, until close.
func (b *ErrorBoard) listen(size int) {
	defer close(b.done)
	bufs := make([][]float32, size)
	reqs := make([]C.MPI_Request, size)
	var pin runtime.Pinner
	defer pin.Unpin()
	for r := 1; r < size; r++ {
		bufs[r] = make([]float32, boardValues)
		pin.Pin(&bufs[r][0])
		if rc := b.e.call(func() C.int {
			return C.MPI_Irecv(unsafe.Pointer(&bufs[r][0]), boardValues, b.e.float, C.int(r), 0, b.comm, &reqs[r])
		}); rc != C.MPI_SUCCESS {
			bufs[r] = nil
		}
	}
	open := func(r int) bool { return bufs[r] != nil }
	for {
		select {
		case <-b.stop:
			for r := 1; r < size; r++ {
				if open(r) {
					b.e.call(func() C.int { return C.df_board_cancel(&reqs[r]) })
				}
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
		for r := 1; r < size; r++ {
			if !open(r) {
				continue
			}
			var flag C.int
			if b.e.call(func() C.int { return C.df_board_test(&reqs[r], &flag) }) != C.MPI_SUCCESS || flag == 0 {
				continue
			}
			b.msgs <- BoardMessage{Rank: r, Text: decodeBoard(bufs[r])}
			bufs[r] = nil
		}
	}
}

// close cancels rank 0's receives before MPI_Finalize.
func (b *ErrorBoard) close() {
	if b.stop != nil {
		close(b.stop)
		<-b.done
		b.stop = nil
	}
	b.e.call(func() C.int { return C.MPI_Comm_free(&b.comm) })
}

// AllGatherBytes gives every process of the MPI job every process's b, in rank order: a
// collective over the error board's communicator (opened here if main has not), so what the
// processes exchange to agree before the run is not counted as the ranks' traffic. The watchdog
// bounds it as it bounds the ranks' calls.
func AllGatherBytes(b []byte) ([][]byte, error) {
	mpi.mu.Lock()
	board, w := mpi.board, mpi.world
	mpi.mu.Unlock()
	if w == nil {
		return nil, errNotInitialised
	}
	if board == nil {
		var err error
		if board, err = OpenErrorBoard(); err != nil {
			return nil, err
		}
	}
	c := &mpiComm{e: w.e, comm: board.comm, id: "agreement", rank: w.rank, size: w.size}
	counts := make([]C.int, w.size)
	if rc := c.guard("all-gather of the byte counts (agreement)", func() C.int {
		return C.df_allgather_count(C.int(len(b)), &counts[0], c.comm)
	}); rc != C.MPI_SUCCESS {
		return nil, &Failure{msg: "parallel: MPI_Allgather (agreement): " + mpiErrString(rc)}
	}
	displs := make([]C.int, w.size)
	total := 0
	for i, n := range counts {
		displs[i] = C.int(total)
		total += int(n)
	}
	all := make([]byte, max(total, 1))
	var src unsafe.Pointer
	if len(b) > 0 {
		src = unsafe.Pointer(&b[0])
	}
	if rc := c.guard("all-gather of the bytes (agreement)", func() C.int {
		return C.df_allgatherv_bytes(src, C.int(len(b)), unsafe.Pointer(&all[0]), &counts[0], &displs[0], c.comm)
	}); rc != C.MPI_SUCCESS {
		return nil, &Failure{msg: "parallel: MPI_Allgatherv (agreement): " + mpiErrString(rc)}
	}
	out := make([][]byte, w.size)
	for i := range out {
		out[i] = all[int(displs[i]) : int(displs[i])+int(counts[i])]
	}
	return out, nil
}
