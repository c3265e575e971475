// Package ctest finds the C compiler that the tests building stub libraries (kernels' cuDNN
// stub, transport's GPU and NCCL stub) compile them with. Only tests import it.
package ctest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Compiler returns $CC (split into the command and its flags) where it names a program found,
// else gcc or cc on PATH. Without one it skips the test, saying that what (the library the
// test builds) needs it; CI has gcc, so the test runs there.
func Compiler(t *testing.T, what string) []string {
	t.Helper()
	if cc := strings.Fields(os.Getenv("CC")); len(cc) > 0 {
		if p, err := exec.LookPath(cc[0]); err == nil {
			return append([]string{p}, cc[1:]...)
		}
	}
	for _, cc := range []string{"gcc", "cc"} {
		if p, err := exec.LookPath(cc); err == nil {
			return []string{p}
		}
	}
	t.Skipf("no C compiler ($CC, gcc or cc) to build %s; CI has gcc, so this test runs there", what)
	return nil
}
