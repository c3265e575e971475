package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
	// binTags are the build tags of the binary the tests build: those of the test binary
	// itself (mpi_train_test.go adds "mpi").
	binTags []string
)

// TestMain removes the binary the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildBinary builds the distflash binary once for all tests that run the real program.
func buildBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "distflash-test-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "distflash")
		args := []string{"build", "-o", binPath}
		if len(binTags) > 0 {
			args = append(args, "-tags", strings.Join(binTags, ","))
		}
		if out, err := exec.Command("go", append(args, ".")...).CombinedOutput(); err != nil {
			binErr = err
			t.Logf("go build:\n%s", out)
		}
	})
	if binErr != nil {
		t.Fatalf("go build: %v", binErr)
	}
	return binPath
}
