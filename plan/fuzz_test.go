package plan

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"distflash/config"
)

// FuzzLoadConfig feeds config.Load arbitrary TOML: whatever the bytes, it returns, an error
// names the file, and a config it accepts can be summarized, checked against this build and
// planned without a panic. The seeds in testdata/fuzz/FuzzLoadConfig hold the attacks.
func FuzzLoadConfig(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
			// Crash on purpose, so that the fuzzer saves an input that hangs.
			defer time.AfterFunc(20*time.Second, func() { panic(fmt.Sprintf("input ran past 20s: %q", b)) }).Stop()
		}
		path := filepath.Join(t.TempDir(), "run.toml")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path, nil)
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error does not name %s: %v", path, err)
			}
			return
		}
		cfg.Summary()
		cfg.Requirements()
		MemoryFor(cfg, 80e9)
	})
}
