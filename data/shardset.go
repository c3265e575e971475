package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// ShardSetFile is the file WriteShards puts beside the shards of a directory: the set's
// members, so that a shard deleted, added or replaced later is an error naming it, not a
// quietly different training set.
const ShardSetFile = "shards.json"

// ShardSet is what ShardSetFile holds.
type ShardSet struct {
	Tokenizer string          `json:"tokenizer"`
	Shards    []ShardSetEntry `json:"shards"`
}

// ShardSetEntry is one shard of a set: its file name, and the counts of its header.
type ShardSetEntry struct {
	Name      string `json:"name"`
	Tokens    int64  `json:"tokens"`
	Documents int64  `json:"documents"`
}

// writeShardSet writes the set of the shards paths (all in dir) into dir.
func writeShardSet(dir string, paths []string, tokenizer string) error {
	set := ShardSet{Tokenizer: tokenizer}
	for _, p := range paths {
		h, err := ReadShardHeader(p)
		if err != nil {
			return err
		}
		set.Shards = append(set.Shards, ShardSetEntry{Name: filepath.Base(p), Tokens: h.Tokens, Documents: h.Documents})
	}
	b, err := json.MarshalIndent(set, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ShardSetFile), append(b, '\n'), 0o644)
}

// checkShardSet compares the token shards of dir with its ShardSetFile, when it has one: a
// shard of the set that is missing, a *.tokens file that is not one of the set, or a shard
// whose header counts differ from the set's is an error naming the file. A directory without
// the file (shards written before it existed, or by hand) passes.
func checkShardSet(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, ShardSetFile))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	var set ShardSet
	if err := json.Unmarshal(b, &set); err != nil {
		return fmt.Errorf("data: %s: %w", filepath.Join(dir, ShardSetFile), err)
	}
	have, err := filepath.Glob(filepath.Join(dir, "*.tokens"))
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	for i := range have {
		have[i] = filepath.Base(have[i])
	}
	sort.Strings(have)
	var want []string
	for _, s := range set.Shards {
		want = append(want, s.Name)
	}
	var missing, extra []string
	for _, n := range want {
		if !slices.Contains(have, n) {
			missing = append(missing, n)
		}
	}
	for _, n := range have {
		if !slices.Contains(want, n) {
			extra = append(extra, n)
		}
	}
	where := filepath.Join(dir, ShardSetFile)
	switch {
	case len(missing) > 0:
		return fmt.Errorf("data: %s lists %d shards, and %s %s missing: the set is incomplete; restore them, or tokenize the data again (distflash data tokenize)",
			where, len(want), strings.Join(missing, ", "), isAre(len(missing)))
	case len(extra) > 0:
		return fmt.Errorf("data: %s holds %s, which %s not in the set %s lists: remove %s, or tokenize the data again",
			dir, strings.Join(extra, ", "), isAre(len(extra)), where, itThem(len(extra)))
	}
	for _, s := range set.Shards {
		p := filepath.Join(dir, s.Name)
		h, err := ReadShardHeader(p)
		if err != nil {
			return err
		}
		if h.Tokens != s.Tokens || h.Documents != s.Documents {
			return fmt.Errorf("data: %s has %d tokens in %d documents, the set %s lists %d in %d: it was replaced; tokenize the data again",
				p, h.Tokens, h.Documents, where, s.Tokens, s.Documents)
		}
	}
	return nil
}

// tokenizeShardName matches the names data tokenize gives the shards of a directory.
var tokenizeShardName = regexp.MustCompile(`^shard-[0-9]{6}\.tokens$`)

// shardSetNote is a note for a directory of shards that lacks its ShardSetFile although its
// shards are named as WriteShards names them, which writes the file beside every set: it was
// deleted (or the shards were written before it existed), so a shard deleted, added or
// replaced goes unnoticed. "" when the file is there or the names are another writer's.
func shardSetNote(dir string) string {
	if _, err := os.Lstat(filepath.Join(dir, ShardSetFile)); !errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	for _, e := range ents {
		if tokenizeShardName.MatchString(e.Name()) {
			return fmt.Sprintf("data: note: %s holds shards named as data tokenize names them (shard-NNNNNN.tokens), but no %s, which data tokenize writes beside them: "+
				"the set cannot be checked, so a shard deleted, added or replaced goes unnoticed; tokenize the data again to have it checked", dir, ShardSetFile)
		}
	}
	return ""
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

func itThem(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}
