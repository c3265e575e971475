package plan

import (
	"testing"

	"distflash/config"
	"distflash/internal/fuzztest"
)

// FuzzLoadConfig feeds config.Load arbitrary TOML: whatever the bytes, it returns, an error
// names the file, and a config it accepts can be summarized, checked against this build and
// planned without a panic. The seeds in testdata/fuzz/FuzzLoadConfig hold the attacks.
func FuzzLoadConfig(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		defer fuzztest.Watchdog(b)()
		path := fuzztest.File(t, "run.toml", b)
		cfg, err := config.Load(path, nil)
		if err != nil {
			fuzztest.MustName(t, err, path)
			return
		}
		cfg.Summary()
		cfg.Requirements()
		MemoryFor(cfg, 80e9)
	})
}
