package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"distflash/parallel/transport"
	"distflash/world"
)

// job is this process's place in an MPI job that runs one command on every rank (train, eval,
// generate under mpirun or srun), joined before the command reads anything, so that every
// error after the start takes one path (fail): rank 0 says its own error; any other rank posts
// its error to rank 0 on the error board and leaves the saying to it; rank 0 says a posted
// error only when it has none of its own within boardSettle, and then once for all the ranks
// that posted the same words. Whoever says it ends the job (MPI_Abort), so it is said once.
type job struct {
	rank   int
	board  *transport.ErrorBoard // nil when joining failed
	stderr io.Writer

	mu  sync.Mutex    // held by whoever says the job's error; it ends the process
	own chan struct{} // closed when this rank's command has ended in an error
}

// boardSettle is how long rank 0 waits, after another rank posted an error, for an error of its
// own (every rank meets a refusal of the config alike, rank 0 perhaps a little later) before it
// says the posted one.
const boardSettle = 2 * time.Second

// boardGrace is how long a rank other than 0 waits, after posting its error, for rank 0 to say
// it and end the job, before saying it itself: rank 0 may be gone or unable to (not started,
// killed, stuck in a call that MPI cannot interrupt), and an error is never lost.
const boardGrace = 8 * time.Second

// joinJob joins the MPI job this process belongs to when a launcher started it as one of
// several processes and args name a command every rank runs; it returns nil otherwise. An
// error (a binary without MPI, an MPI that does not start) comes with a job that can still
// fail, without a board.
func joinJob(args []string, stderr io.Writer) (*job, error) {
	l, err := transport.MPIEnv()
	if err != nil || l == nil || l.Size < 2 || len(args) == 0 {
		return nil, err
	}
	if c := root.Find(args[0]); c == nil || !c.EveryRank {
		return nil, nil
	}
	j := &job{rank: l.Rank, stderr: stderr, own: make(chan struct{})}
	if err := transport.CheckLaunch(); err != nil {
		return j, err
	}
	if _, err := transport.InitMPI(); err != nil {
		return j, err
	}
	if j.board, err = transport.OpenErrorBoard(); err != nil {
		return j, err
	}
	if j.rank == 0 {
		go j.watch()
	}
	return j, nil
}

// watch, on rank 0, says the errors other ranks post when rank 0 has none of its own.
func (j *job) watch() {
	first, ok := <-j.board.Messages()
	if !ok {
		return
	}
	posted := []transport.BoardMessage{first}
	settle := time.After(boardSettle)
	for {
		select {
		case m := <-j.board.Messages():
			posted = append(posted, m)
			continue
		case <-j.own:
			return // rank 0 says its own
		case <-settle:
		}
		break
	}
	j.mu.Lock()
	fmt.Fprint(j.stderr, sayPosted(posted))
	transport.AbortMPI(2)
}

// sayPosted is what rank 0 prints of errors other ranks posted: each text once, after the
// ranks that posted it ("distflash: ranks 1, 3: …").
func sayPosted(posted []transport.BoardMessage) string {
	var texts []string
	ranks := map[string][]int{}
	for _, m := range posted {
		if _, ok := ranks[m.Text]; !ok {
			texts = append(texts, m.Text)
		}
		ranks[m.Text] = append(ranks[m.Text], m.Rank)
	}
	var b strings.Builder
	for _, t := range texts {
		slices.Sort(ranks[t])
		fmt.Fprintf(&b, "distflash: %s: %s\n", world.RankList(ranks[t]), t)
	}
	return b.String()
}

// fail says err once for the job, as the type's comment tells, and ends it with exit status 2;
// it does not return, so it runs once. j may be nil: a process that runs alone says err and
// exits.
func (j *job) fail(err error) {
	if j == nil {
		fmt.Fprintln(os.Stderr, "distflash:", err)
		transport.AbortMPI(2)
	}
	close(j.own)
	if j.rank > 0 {
		if j.board != nil {
			j.board.Post(err.Error())
		}
		time.Sleep(boardGrace)
	}
	j.mu.Lock()
	if j.rank > 0 {
		fmt.Fprintf(j.stderr, "distflash: rank %d: %v\n", j.rank, err)
	} else {
		fmt.Fprintln(j.stderr, "distflash:", err)
	}
	// the whole job ends now (MPI_Abort once MPI has started), not after the others wait
	transport.AbortMPI(2)
}

// end finishes a job whose command went well on this rank (MPI_Finalize, which the command has
// usually done already).
func (j *job) end() error {
	if j == nil {
		return nil
	}
	return transport.FinalizeMPI()
}
