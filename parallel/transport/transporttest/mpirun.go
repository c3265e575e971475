package transporttest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// MPIRanksPass runs the test named test of this test binary on np ranks under mpirun, with
// the extra environment env, and fails t unless every rank passed it (none skipped it).
func MPIRanksPass(t testing.TB, np int, env []string, test string) {
	t.Helper()
	out, took, err := MPIRunSelf(t, np, 3*time.Minute, env, "-test.run=^"+test+"$", "-test.v")
	passed := strings.Count(out, "--- PASS: "+test+" ")
	if err != nil || passed != np {
		t.Fatalf("mpirun -np %d: %v; %d of %d ranks passed; output:\n%s", np, err, passed, np, out)
	}
	if strings.Contains(out, "--- SKIP: "+test) {
		t.Fatalf("a rank skipped the checks:\n%s", out)
	}
	t.Logf("%d ranks passed in %v", np, took.Round(time.Millisecond))
}

// MPIRunSelf runs this test binary under mpirun on np ranks with args and the extra
// environment env, stopping it (SIGTERM, which mpirun passes on to the ranks, then SIGKILL)
// after limit (if > 0). It returns the output of all ranks, mpirun's error and the time it ran. A
// machine without mpirun skips the test: CI installs Open MPI, so there it always runs.
func MPIRunSelf(t testing.TB, np int, limit time.Duration, env []string, args ...string) (string, time.Duration, error) {
	t.Helper()
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("mpirun is not on PATH: install Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev; .ci/run does) to run the MPI tests")
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if limit > 0 {
		ctx, cancel = context.WithTimeout(ctx, limit)
	}
	defer cancel()
	// As root (CI) mpirun needs --allow-run-as-root; --oversubscribe lets 4 ranks share 2 cores.
	argv := append([]string{"--allow-run-as-root", "--oversubscribe", "-np", fmt.Sprint(np), os.Args[0]}, args...)
	cmd := exec.CommandContext(ctx, mpirun, argv...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("mpirun did not finish within %v: %w", limit, err)
	}
	return out.String(), time.Since(start), err
}
