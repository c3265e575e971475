package transporttest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"distflash/parallel/transport"
)

// MPIRanksPass runs the test named test of this test binary on np ranks (MPIRunSelf), with
// the extra environment env, and fails t unless every rank passed it (none skipped it).
func MPIRanksPass(t testing.TB, np int, env []string, test string) {
	t.Helper()
	out, took, err := MPIRunSelf(t, np, 3*time.Minute, env, "-test.run=^"+test+"$", "-test.v")
	passed := strings.Count(out, "--- PASS: "+test+" ")
	if err != nil || passed != np {
		t.Fatalf("%d MPI ranks: %v; %d of %d ranks passed; output:\n%s", np, err, passed, np, out)
	}
	if strings.Contains(out, "--- SKIP: "+test) {
		t.Fatalf("a rank skipped the checks:\n%s", out)
	}
	t.Logf("%d ranks passed in %v", np, took.Round(time.Millisecond))
}

// MPIRunSelf runs this test binary under its MPI's launcher (MPILauncher) on np ranks with
// args and the extra environment env, stopping it (SIGTERM, which the launcher passes on to
// the ranks, then SIGKILL) after limit (if > 0). It returns the output of all ranks, the
// launcher's error and the time it ran. A machine without the launcher skips the test, except
// under CI (CI set), which installs Open MPI and MPICH: there the test fails.
func MPIRunSelf(t testing.TB, np int, limit time.Duration, env []string, args ...string) (string, time.Duration, error) {
	t.Helper()
	launcher, argv, err := MPILauncher(np)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if limit > 0 {
		ctx, cancel = context.WithTimeout(ctx, limit)
	}
	defer cancel()
	argv = append(append(argv, os.Args[0]), args...)
	cmd := exec.CommandContext(ctx, launcher, argv...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s did not finish within %v: %w", filepath.Base(launcher), limit, err)
	}
	return out.String(), time.Since(start), err
}

// MPILauncher returns the launcher of the MPI this binary was built against
// (transport.MPIBuiltWith) and its arguments that start np ranks, to which the program and
// its arguments are appended: Open MPI's mpirun (as root, as in CI, it needs
// --allow-run-as-root; --oversubscribe lets 4 ranks share 2 cores), or for the MPICH family
// (a build with CC=mpicc.mpich and -tags 'mpi mpicc') MPICH's mpiexec, Hydra, which needs
// neither: mpiexec.mpich (Debian's name beside Open MPI's mpirun), mpiexec.hydra or mpiexec.
// The error says what is missing and how to install it.
func MPILauncher(np int) (string, []string, error) {
	built := transport.MPIBuiltWith()
	if strings.HasPrefix(built, "MPICH") {
		for _, name := range []string{"mpiexec.mpich", "mpiexec.hydra", "mpiexec"} {
			if path, err := exec.LookPath(name); err == nil {
				return path, []string{"-n", fmt.Sprint(np)}, nil
			}
		}
		return "", nil, fmt.Errorf("this binary is built against %s, but MPICH's mpiexec (mpiexec.mpich, mpiexec.hydra or mpiexec) is not on PATH: install MPICH (Debian: apt-get install mpich libmpich-dev; .ci/run does) to run the MPI tests", built)
	}
	path, err := exec.LookPath("mpirun")
	if err != nil {
		return "", nil, fmt.Errorf("mpirun is not on PATH: install Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev; .ci/run does) to run the MPI tests")
	}
	return path, []string{"--allow-run-as-root", "--oversubscribe", "-np", fmt.Sprint(np)}, nil
}
