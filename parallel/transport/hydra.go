package transport

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// hydraAbort asks MPICH's (or Intel MPI's) launcher Hydra, when it started this process, to
// end the whole job with status code, as MPI_Abort does once MPI has started. Hydra ends a job
// when one of its processes is killed or aborts, not when one exits with a status before
// MPI_Init: the others would go on, to say again a refusal that every rank makes alike (after
// the grace main gives rank 0 to end the job), or to wait in MPI_Init for this process
// forever. It writes PMI-1's abort command to the connection Hydra gives each process
// (PMI_FD; Hydra alone also sets MPI_LOCALNRANKS, where srun --mpi=pmi2 sets PMI_FD for PMI-2),
// once Hydra has read what this process printed (waiting at most 100 ms), which would
// otherwise go with the job, and returns if Hydra has not ended this process within a
// second. Under any other launcher, or off Linux, it does nothing: Open MPI's mpirun ends a
// job whose process fails on its own.
func hydraAbort(code int) { hydraAbortFrom(os.Getenv, code, time.Second) }

// hydraAbortFrom is hydraAbort with the environment read by getenv, waiting up to wait to be
// ended once it has asked.
func hydraAbortFrom(getenv func(string) string, code int, wait time.Duration) {
	fd, err := strconv.Atoi(getenv("PMI_FD"))
	if err != nil || fd < 0 || getenv("PMI_RANK") == "" || getenv("MPI_LOCALNRANKS") == "" {
		return
	}
	for i := 0; i < 100 && (unreadOutput(1) > 0 || unreadOutput(2) > 0); i++ {
		time.Sleep(time.Millisecond)
	}
	if writeFD(fd, fmt.Appendf(nil, "cmd=abort exitcode=%d\n", code)) != nil {
		return
	}
	time.Sleep(wait)
}
