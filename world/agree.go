package world

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"distflash/config"
	"distflash/data"
	"distflash/internal/cli"
	"distflash/parallel/transport"
)

// agree refuses a job whose processes would not run the same thing: every process of an MPI
// launch sends every other what it runs — the resolved config key by key, the binary's version,
// the command's flags, and the size and file count of the data it reads — before the first
// collective of the run, and each one compares. Processes started with other --set values,
// config files that differ between hosts, another build or other data would otherwise exchange
// tensors of other shapes (a failed collective), stop at other steps (a hang) or train on
// different tokens (silently). The error is the same on every process: it names each key that
// differs and its value on each rank.
func agree(cfg *config.Config) error {
	mine, err := agreement(cfg)
	if err != nil {
		return err
	}
	b, err := json.Marshal(mine)
	if err != nil {
		return err
	}
	all, err := transport.AllGatherBytes(b)
	if err != nil {
		return err
	}
	per := make([]map[string]string, len(all))
	for r, b := range all {
		if err := json.Unmarshal(b, &per[r]); err != nil {
			return fmt.Errorf("rank %d's agreement: %w", r, err)
		}
	}
	if diffs := disagreements(per); len(diffs) > 0 {
		return fmt.Errorf("the %d processes of this job were not started alike: each must run the same binary with the same config, flags and data (a --set given to some processes, or config files that differ between hosts?):\n  %s",
			len(all), strings.Join(diffs, "\n  "))
	}
	return nil
}

// agreement is what this process runs, as the keys agree compares.
func agreement(cfg *config.Config) (map[string]string, error) {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	out, err := config.Flatten(raw)
	if err != nil {
		return nil, err
	}
	delete(out, "path") // the file's name may differ between hosts; what it says is compared
	out["distflash version"] = cli.Version()
	out["command-line flags"] = strings.Join(cli.Given(), " ")
	type named struct{ key, path string }
	paths := []named{{"data.train", cfg.Data.Train}, {"data.eval", cfg.Data.Eval}}
	if len(cfg.Data.Sources) > 0 {
		paths = []named{{"data.eval", cfg.Data.HeldOut()}}
		for i, s := range cfg.Data.Sources {
			paths = append(paths, named{fmt.Sprintf("data.sources.%d.path", i), s.Path}, named{fmt.Sprintf("data.sources.%d.eval", i), s.Eval})
		}
	}
	for _, d := range paths {
		if d.path != "" {
			out[d.key+" (on disk)"] = dataFingerprint(d.path)
		}
	}
	return out, nil
}

// dataFingerprint describes the data that path (a file, directory or glob, $VARS expanded)
// names as a reader sees it — its bytes and files, or that there is none — so that processes
// reading other copies of it see another fingerprint. It reads no contents: the data may be
// large.
func dataFingerprint(path string) string {
	p, err := data.ExpandPath(path)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	matches, err := filepath.Glob(p)
	if err != nil || len(matches) == 0 {
		return "absent"
	}
	var files, bytes int64
	for _, m := range matches {
		err := filepath.WalkDir(m, func(_ string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Type().IsRegular() {
				info, err := d.Info()
				if err != nil {
					return err
				}
				files++
				bytes += info.Size()
			}
			return nil
		})
		if err != nil {
			return "unreadable"
		}
	}
	return fmt.Sprintf("%d bytes in %d files", bytes, files)
}

// disagreements lists, in key order, each key whose value is not the same on every rank, with
// the ranks that hold each value: "model.ffn_dim: rank 0: 352; rank 1: 384".
func disagreements(per []map[string]string) []string {
	keys := map[string]bool{}
	for _, m := range per {
		for k := range m {
			keys[k] = true
		}
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		var values []string
		ranks := map[string][]int{}
		for r, m := range per {
			v, ok := m[k]
			if !ok {
				v = "(absent)"
			}
			if _, seen := ranks[v]; !seen {
				values = append(values, v)
			}
			ranks[v] = append(ranks[v], r)
		}
		if len(values) == 1 {
			continue
		}
		parts := make([]string, len(values))
		for i, v := range values {
			parts[i] = RankList(ranks[v]) + ": " + v
		}
		out = append(out, k+": "+strings.Join(parts, "; "))
	}
	return out
}

// RankList names ranks, in the order given: "rank 3", "ranks 0, 2".
func RankList(rs []int) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprint(r)
	}
	if len(rs) == 1 {
		return "rank " + s[0]
	}
	return "ranks " + strings.Join(s, ", ")
}
