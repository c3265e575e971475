package transport

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// MPIOptions tunes the MPI communicator (InitMPIWith).
type MPIOptions struct {
	// Timeout bounds every wait for a message or a collective: a rank that waits longer
	// prints what it waited for and aborts the whole job (MPI_Abort), so a hang (a rank
	// stopped or stuck, or ranks disagreeing on the order of calls) ends the job instead of
	// holding the machines. 0 waits forever.
	Timeout time.Duration
	// Serialized asks for MPI_THREAD_SERIALIZED even when the library offers
	// MPI_THREAD_MULTIPLE: every MPI call then runs under one lock and waits poll MPI_Test
	// with the lock released. It is what InitMPI falls back to on a library without
	// MPI_THREAD_MULTIPLE; asking for it exercises that path.
	Serialized bool
	// SyncSend makes every Isend synchronous (MPI_Issend): a send then completes only once
	// its receiver has posted the receive, whatever the message size, as with NCCL. Code
	// that waits for a send before posting the receive its peer waits for (correct only with
	// the in-process world's eager sends) then stops at once, and the watchdog names the
	// send, instead of stopping only above MPI's eager size. For tests.
	SyncSend bool
}

// DefaultMPITimeout is MPIOptions.Timeout when DISTFLASH_MPI_TIMEOUT is not set: far longer
// than any wait of a healthy step (a checkpoint write included), far shorter than a lost
// allocation.
const DefaultMPITimeout = 10 * time.Minute

// MPIOptionsFromEnv reads MPIOptions from DISTFLASH_MPI_TIMEOUT (a Go duration such as 90s or
// 10m; 0 waits forever; default DefaultMPITimeout), DISTFLASH_MPI_THREAD (multiple, the
// default, or serialized) and DISTFLASH_MPI_SYNC_SEND (a boolean, default false), naming the
// variable when its value is not one of those.
func MPIOptionsFromEnv() (MPIOptions, error) { return mpiOptionsFrom(os.Getenv) }

func mpiOptionsFrom(getenv func(string) string) (MPIOptions, error) {
	o := MPIOptions{Timeout: DefaultMPITimeout}
	var err error
	if o.Timeout, err = timeoutEnv(getenv, "DISTFLASH_MPI_TIMEOUT", DefaultMPITimeout); err != nil {
		return o, err
	}
	switch s := getenv("DISTFLASH_MPI_THREAD"); s {
	case "", "multiple":
	case "serialized":
		o.Serialized = true
	default:
		return o, fmt.Errorf("parallel: environment variable DISTFLASH_MPI_THREAD=%q: want multiple or serialized", s)
	}
	if s := getenv("DISTFLASH_MPI_SYNC_SEND"); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return o, fmt.Errorf("parallel: environment variable DISTFLASH_MPI_SYNC_SEND=%q: want true or false (1 or 0)", s)
		}
		o.SyncSend = b
	}
	return o, nil
}

// Launch is what the environment says about how this process was started by an MPI launcher
// (mpirun, mpiexec, srun).
type Launch struct {
	// Launcher names what started the process, for messages ("Open MPI's mpirun", "srun", …).
	Launcher string
	// Rank is this process's rank among the processes launched together.
	Rank int
	// Size is the number of processes launched together; 0 when the environment does not say.
	Size int
	// Vars are the variables the rank and size were read from, as NAME=value.
	Vars []string
}

// launchVars are the launchers MPIEnv recognises, first match wins: each sets a rank
// variable and (except PMIx) a size variable in every process it starts. Slurm's SLURM_PROCID
// and SLURM_NTASKS are also set in a batch script that srun did not start (SLURM_PROCID=0), so
// srun is recognised by SLURM_STEP_NUM_TASKS, which only srun sets.
var launchVars = []struct{ launcher, rank, size string }{
	{"Open MPI's mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
	{"a PMI launcher (MPICH or Intel MPI mpiexec, srun --mpi=pmi2)", "PMI_RANK", "PMI_SIZE"},
	{"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"},
	{"a PMIx launcher", "PMIX_RANK", ""},
}

// MPIEnv reports how this process was launched, from the variables that Open MPI's mpirun,
// MPICH's and Intel MPI's mpiexec, PMIx launchers and Slurm's srun set in every process they
// start. It returns nil when none is set (the process was started on its own), and an error
// naming the variable when one holds something that is not a rank or size.
func MPIEnv() (*Launch, error) { return mpiEnvFrom(os.Getenv) }

func mpiEnvFrom(getenv func(string) string) (*Launch, error) {
	for _, v := range launchVars {
		rs := getenv(v.rank)
		if rs == "" || (v.size != "" && getenv(v.size) == "") {
			continue
		}
		l := &Launch{Launcher: v.launcher, Vars: []string{v.rank + "=" + rs}}
		var err error
		if l.Rank, err = strconv.Atoi(rs); err != nil || l.Rank < 0 {
			return nil, fmt.Errorf("parallel: environment variable %s=%q: want a rank ≥ 0", v.rank, rs)
		}
		if v.size != "" {
			ss := getenv(v.size)
			l.Vars = append(l.Vars, v.size+"="+ss)
			if l.Size, err = strconv.Atoi(ss); err != nil || l.Size < 1 || l.Rank >= l.Size {
				return nil, fmt.Errorf("parallel: environment variable %s=%q (with %s=%s): want a process count > rank", v.size, ss, v.rank, rs)
			}
		}
		return l, nil
	}
	return nil, nil
}

// SrunWithoutPMIx returns a warning for rank 0 of a job step that srun started without PMIx
// (srun --mpi=pmi2 or --mpi=none: SLURM_STEP_NUM_TASKS > 1 and no PMIX_RANK), and "" for any
// other process. Open MPI built without Slurm's PMI-1/PMI-2 libraries, as Debian's is, finds
// the other ranks of an srun step only through PMIx: MPI_Init aborts every rank with a
// message that suggests rebuilding Slurm or Open MPI, where `srun --mpi=pmix` is the fix.
func SrunWithoutPMIx() string { return srunWithoutPMIxFrom(os.Getenv) }

func srunWithoutPMIxFrom(getenv func(string) string) string {
	n, err := strconv.Atoi(getenv("SLURM_STEP_NUM_TASKS"))
	if err != nil || n < 2 || getenv("SLURM_PROCID") != "0" || getenv("PMIX_RANK") != "" {
		return ""
	}
	how := getenv("SLURM_MPI_TYPE")
	if how == "" {
		how = "none"
	}
	return fmt.Sprintf("mpi: srun started these %d ranks with --mpi=%s, without PMIx; Open MPI built without Slurm's PMI-1/PMI-2 support (as Debian builds it) joins srun's ranks only through PMIx, so MPI_Init may abort: run srun --mpi=pmix (srun --mpi=list shows what this cluster offers), or set MpiDefault=pmix in slurm.conf", n, how)
}

// CheckLaunch returns an error when this process is one of several started by an MPI launcher
// but the binary was built without MPI (without -tags mpi): each process would otherwise train
// alone and they would overwrite each other's output. It also returns MPIEnv's error.
func CheckLaunch() error {
	l, err := MPIEnv()
	if err != nil || l == nil || MPIBuilt {
		return err
	}
	if l.Size > 1 || (l.Size == 0 && l.Rank > 0) {
		n := "several"
		if l.Size > 0 {
			n = strconv.Itoa(l.Size)
		}
		return fmt.Errorf("parallel: this process was started by %s as rank %d of %s (%v), but this binary was built without MPI; rebuild with -tags mpi (go build -tags mpi .), which needs an MPI library (Debian: apt-get install openmpi-bin libopenmpi-dev)", l.Launcher, l.Rank, n, l.Vars)
	}
	return nil
}

// localRankVars are the variables launchers set to a process's rank among those on its host,
// first match wins: Open MPI's mpirun, MPICH's and Intel MPI's Hydra, Slurm's srun.
var localRankVars = []string{"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}

// LocalRank is this process's rank among the processes a launcher started on its host (0
// when none says): the GPU a rank takes is its local rank modulo the host's GPUs, as llm.c
// and torchrun choose.
func LocalRank() int { return localRankFrom(os.Getenv) }

func localRankFrom(getenv func(string) string) int {
	for _, v := range localRankVars {
		if r, err := strconv.Atoi(getenv(v)); err == nil && r >= 0 {
			return r
		}
	}
	return 0
}

// timeoutEnv reads a watchdog's timeout from the environment variable name: a Go duration ≥ 0
// (0 waits forever), def when it is not set.
func timeoutEnv(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	s := getenv(name)
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return def, fmt.Errorf("parallel: environment variable %s=%q: want a duration ≥ 0 such as 90s or 10m (0 waits forever)", name, s)
	}
	return d, nil
}
