package ckpt

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"distflash/config"
)

// A resumed run may change most of its config — steps, learning rate, data, world size and
// parallelism (Read re-shards), precision, checkpoint settings — but not what the saved
// tensors mean. These keys, as dotted paths into the config's JSON (a section, or one key of
// a section), must match: the whole [model] section (the shapes, and norm_eps, rope_theta
// and max_seq_len, which change what the weights compute) and data.tokenizer (what the
// token ids mean).
var mustMatch = []string{"model", "data.tokenizer"}

// mayDiffer are the keys inside mustMatch whose difference leaves the saved tensors' meaning
// alone: model.init draws a fresh model's weights, which a checkpoint replaces.
var mayDiffer = []string{"model.init"}

// fatalKey reports whether a difference in key makes a checkpoint unusable.
func fatalKey(key string) bool {
	if slices.Contains(mayDiffer, key) {
		return false
	}
	for _, k := range mustMatch {
		if key == k || strings.HasPrefix(key, k+".") {
			return true
		}
	}
	return false
}

// ConfigDiff is one config key whose value differs between a checkpoint and the current
// run. Values are JSON text; "" means the key is absent on that side.
type ConfigDiff struct {
	Key     string // dotted: "model.dim"
	Saved   string
	Current string
	Fatal   bool // the key must match for the checkpoint to be loaded
}

func (d ConfigDiff) String() string {
	show := func(v string) string {
		if v == "" {
			return "(absent)"
		}
		return v
	}
	return fmt.Sprintf("%s = %s in the checkpoint, %s now", d.Key, show(d.Saved), show(d.Current))
}

// DiffConfig compares the config a checkpoint was saved with to the current one (both as
// JSON objects, sections as nested objects) and returns every key whose value differs, in
// key order, each marked Fatal when the key must match.
func DiffConfig(saved, current json.RawMessage) ([]ConfigDiff, error) {
	a, err := config.Flatten(saved)
	if err != nil {
		return nil, fmt.Errorf("ckpt: saved %w", err)
	}
	b, err := config.Flatten(current)
	if err != nil {
		return nil, fmt.Errorf("ckpt: current %w", err)
	}
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var diffs []ConfigDiff
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if sa, sb := a[k], b[k]; sa != sb {
			diffs = append(diffs, ConfigDiff{Key: k, Saved: sa, Current: sb, Fatal: fatalKey(k)})
		}
	}
	return diffs, nil
}

// HashConfig returns the SHA-256 (hex) of the keys of cfg that must match on resume: equal
// for two configs exactly when DiffConfig finds no fatal difference between them.
func HashConfig(cfg json.RawMessage) (string, error) {
	flat, err := config.Flatten(cfg)
	if err != nil {
		return "", fmt.Errorf("ckpt: %w", err)
	}
	var lines []string
	for k, v := range flat {
		if fatalKey(k) {
			lines = append(lines, k+"="+v+"\n")
		}
	}
	slices.Sort(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "")))
	return hex.EncodeToString(sum[:]), nil
}

// CheckConfig checks that a checkpoint with manifest m can be loaded into a run whose config
// is current (JSON, as given to Commit): the keys that must match (the [model] section and
// data.tokenizer) are equal. The error lists every fatal difference; the other differences
// (DiffConfig) are allowed and are for the caller to report.
func CheckConfig(m Manifest, current json.RawMessage) error {
	return checkConfig(fmt.Sprintf("the checkpoint of step %d", m.Step), m, current)
}

// CheckConfig is CheckConfig(c.Manifest(), current) with the checkpoint's directory in the
// error.
func (c *Checkpoint) CheckConfig(current json.RawMessage) error {
	return checkConfig(c.dir, c.m, current)
}

func checkConfig(what string, m Manifest, current json.RawMessage) error {
	if len(m.Config) == 0 {
		return fmt.Errorf("ckpt: %s has no config to check against", what)
	}
	diffs, err := DiffConfig(m.Config, current)
	if err != nil {
		return err
	}
	var fatal []string
	for _, d := range diffs {
		if d.Fatal {
			fatal = append(fatal, d.String())
		}
	}
	if len(fatal) > 0 {
		return fmt.Errorf("ckpt: %s was saved from another model config: %s (the [model] section and data.tokenizer must match)", what, strings.Join(fatal, "; "))
	}
	return nil
}
