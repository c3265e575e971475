package world

import (
	"reflect"
	"strings"
	"testing"

	"distflash/config"
)

// TestDisagreements: each key that is not the same on every rank is named once, in key order,
// with the ranks that hold each value; a key a rank lacks is "(absent)"; alike ranks give none.
func TestDisagreements(t *testing.T) {
	for _, c := range []struct {
		name string
		per  []map[string]string
		want []string
	}{
		{"alike", []map[string]string{{"a": "1", "b": "x"}, {"a": "1", "b": "x"}}, nil},
		{"one key", []map[string]string{{"model.ffn_dim": "352"}, {"model.ffn_dim": "384"}},
			[]string{"model.ffn_dim: rank 0: 352; rank 1: 384"}},
		{"grouped ranks", []map[string]string{{"s": "10", "t": "a"}, {"s": "20", "t": "a"}, {"s": "10", "t": "a"}, {"s": "20"}},
			[]string{"s: ranks 0, 2: 10; ranks 1, 3: 20", "t: ranks 0, 1, 2: a; rank 3: (absent)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := disagreements(c.per); !reflect.DeepEqual(got, c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// TestAgreementKeys: what a process sends names every config key as the config's TOML does, the
// binary, the flags and the data on disk, and not the config file's name.
func TestAgreementKeys(t *testing.T) {
	cfg := config.Default()
	cfg.Path = "/somewhere/on/this/host.toml"
	cfg.Data.Train = "."
	got, err := agreement(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"model.ffn_dim", "training.steps", "parallelism.world_size", "distflash version", "command-line flags", "data.train (on disk)"} {
		if _, ok := got[k]; !ok {
			t.Errorf("no %q among %d keys", k, len(got))
		}
	}
	if _, ok := got["path"]; ok {
		t.Errorf("the config file's name is compared: %q", got["path"])
	}
	if d := got["data.train (on disk)"]; !strings.HasSuffix(d, " files") {
		t.Errorf("data.train (on disk) = %q, want its bytes and files", d)
	}
	cfg.Data.Train = "/no/such/data"
	if got, _ = agreement(&cfg); got["data.train (on disk)"] != "absent" {
		t.Errorf("data that is not there: %q", got["data.train (on disk)"])
	}
}
