// Package fuzztest holds what the fuzz targets of distflash's file readers share (ckpt's
// checkpoints, weights' Hugging Face config.json and index, safetensors files, data's
// tokenizers, shards and documents, plan's configs): a file of the fuzzer's bytes (File), the
// check that an error names the file it is about (MustName), and a watchdog that turns a
// hanging input into a crasher (Watchdog). Only tests import it.
package fuzztest

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// File writes b to name in a fresh directory and returns its path.
func File(t *testing.T, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// MustName fails t unless err names path.
func MustName(t *testing.T, err error, path string) {
	t.Helper()
	if !strings.Contains(err.Error(), path) {
		t.Fatalf("error does not name %s: %v", path, err)
	}
}

// HangLimit is how long one input may take under go test -fuzz before the worker is crashed
// on purpose, so that the fuzzer saves the input that hangs as a crasher (it saves none for an
// input that merely never returns).
const HangLimit = 20 * time.Second

// Watchdog arms HangLimit for input b when fuzzing (never when the seeds run as tests, on a
// machine of any speed); call the returned function when the input is done.
func Watchdog(b ...[]byte) func() {
	if f := flag.Lookup("test.fuzz"); f == nil || f.Value.String() == "" {
		return func() {}
	}
	t := time.AfterFunc(HangLimit, func() { panic(fmt.Sprintf("input ran past %v: %q", HangLimit, b)) })
	return func() { t.Stop() }
}
