package data

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Source says where training text comes from.
type Source struct {
	// Path is a file, a directory (walked recursively) or a glob pattern (filepath.Match
	// syntax) naming files or directories, already expanded by ExpandPath. A path that
	// exists is never treated as a pattern.
	Path string
	// Format is how the files are read. "text" (also "", the default) reads each file's
	// bytes as one document. jsonl, c4 (json.gz) and pre-tokenized shards ("tokens") come
	// in a later version and are an error here.
	Format string
	// Include holds filename patterns (filepath.Match syntax) matched against the base name
	// of each file found inside a directory; nil or empty means DefaultInclude. Files that
	// Path names directly, itself or through a glob, are read whatever their name.
	Include []string
	// MaxBytes bounds the text read, separators included; 0 means no limit. The last file
	// read is cut to fit, so with the byte tokenizer the stream is MaxBytes tokens long
	// (or one less) whenever there is that much text. A truncated read is a prefix of the
	// full read with the same Seed.
	MaxBytes int64
	// Seed orders the files: they are sorted by path, shuffled with Seed and read in that
	// order until MaxBytes, so the seed picks which files a truncated read sees.
	Seed uint64
}

// DefaultInclude is the include pattern list used when Source.Include is empty.
var DefaultInclude = []string{"*.go"}

// DocSeparator is the byte LoadTokens puts between consecutive documents, so that the
// last line of one file never runs into the first line of the next unmarked. Go files end
// in a newline already, so there a boundary reads as a blank line.
const DocSeparator = '\n'

// LoadTokens reads src and tokenizes it with tok into one stream: the documents (files) in
// the order Source.Seed gives, each encoded on its own, with the encoding of DocSeparator
// between consecutive ones. Empty files are skipped.
//
// Directories are walked recursively, skipping (as the go command does) any directory
// below the root whose name is testdata or starts with "." or "_": Go test data is often
// deliberately malformed or machine-generated and is not the text we want to model.
// Symbolic links to files are read; links to directories are not followed.
//
// It is an error if no text is found; the message names the path and the include patterns.
func LoadTokens(src Source, tok Tokenizer) ([]int32, error) {
	if tok == nil {
		return nil, errors.New("data: LoadTokens: nil Tokenizer")
	}
	switch src.Format {
	case "", "text":
	case "jsonl", "c4", "tokens":
		return nil, fmt.Errorf("data: format %q comes in a later version: this version reads \"text\"", src.Format)
	default:
		return nil, fmt.Errorf("data: unknown format %q: accepted: text (jsonl, c4 and tokens come in a later version)", src.Format)
	}
	if src.MaxBytes < 0 {
		return nil, fmt.Errorf("data: MaxBytes = %d: must be >= 0 (0 = no limit)", src.MaxBytes)
	}
	include := src.Include
	if len(include) == 0 {
		include = DefaultInclude
	}
	for _, p := range include {
		if _, err := filepath.Match(p, ""); err != nil {
			return nil, fmt.Errorf("data: include pattern %q: %w", p, err)
		}
	}
	files, err := listFiles(src.Path, include)
	if err != nil {
		return nil, err
	}
	newRNG(src.Seed, domainFiles, 0).shuffle(len(files), func(i, j int) { files[i], files[j] = files[j], files[i] })

	// Read first, then encode: the text is a quarter of the size of its tokens, and knowing
	// its length lets a one-token-per-byte tokenizer fill an exactly sized slice.
	var (
		text []byte
		docs [][2]int // [start, end) of each document in text
	)
	for _, f := range files {
		limit := int64(-1)
		if src.MaxBytes > 0 {
			limit = src.MaxBytes - int64(len(text))
			if len(docs) > 0 {
				limit-- // the separator
			}
			if limit <= 0 {
				break
			}
		}
		start := len(text)
		if len(docs) > 0 {
			text = append(text, DocSeparator)
		}
		n := len(text)
		text, err = readFile(f, limit, text)
		if err != nil {
			return nil, err
		}
		if len(text) == n { // empty file: take back its separator
			text = text[:start]
			continue
		}
		docs = append(docs, [2]int{n, len(text)})
	}
	if len(docs) == 0 {
		if len(files) == 0 {
			return nil, fmt.Errorf("data: no text in %s: no file matches include patterns %q (directories named testdata or starting with . or _ are skipped)", src.Path, include)
		}
		return nil, fmt.Errorf("data: no text in %s: all %d files matching include patterns %q are empty", src.Path, len(files), include)
	}
	return encodeDocs(tok, text, docs), nil
}

// encodeDocs encodes each document of text on its own, with the encoding of DocSeparator
// between consecutive ones.
func encodeDocs(tok Tokenizer, text []byte, docs [][2]int) []int32 {
	sep := []byte{DocSeparator}
	if a, ok := tok.(interface {
		AppendEncode(dst []int32, text []byte) []int32
	}); ok {
		tokens := make([]int32, 0, len(text)) // exact for one token per byte
		for i, d := range docs {
			if i > 0 {
				tokens = a.AppendEncode(tokens, sep)
			}
			tokens = a.AppendEncode(tokens, text[d[0]:d[1]])
		}
		return slices.Clip(tokens)
	}
	var tokens []int32
	for i, d := range docs {
		if i > 0 {
			tokens = append(tokens, tok.Encode(sep)...)
		}
		tokens = append(tokens, tok.Encode(text[d[0]:d[1]])...)
	}
	return slices.Clip(tokens)
}

// listFiles returns the files src names, sorted by path and without duplicates.
func listFiles(path string, include []string) ([]string, error) {
	if path == "" {
		return nil, errors.New("data: source path is empty")
	}
	roots := []string{path}
	if _, err := os.Stat(path); err != nil {
		if !errors.Is(err, fs.ErrNotExist) || !hasMeta(path) {
			return nil, fmt.Errorf("data: %w", err)
		}
		matches, gerr := filepath.Glob(path)
		if gerr != nil {
			return nil, fmt.Errorf("data: %s: does not exist, and as a glob pattern: %w", path, gerr)
		}
		if len(matches) == 0 {
			return nil, fmt.Errorf("data: %s: no such file or directory, and nothing matches it as a glob pattern", path)
		}
		roots = matches
	}
	var files []string
	for _, root := range roots {
		info, err := os.Stat(root)
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		if !info.IsDir() {
			if info.Mode().IsRegular() {
				files = append(files, root)
			}
			continue
		}
		err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if p != root && skipDir(d.Name()) {
					return filepath.SkipDir
				}
				return nil
			}
			if !matchAny(include, d.Name()) {
				return nil
			}
			switch {
			case d.Type().IsRegular():
				files = append(files, p)
			case d.Type()&fs.ModeSymlink != 0:
				if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
					files = append(files, p)
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("data: walk %s: %w", root, err)
		}
	}
	slices.Sort(files)
	return slices.Compact(files), nil
}

// skipDir reports whether a directory below the root is left out of the walk.
func skipDir(name string) bool {
	return name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

// matchAny reports whether name matches one of the (already validated) patterns.
func matchAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if ok, _ := filepath.Match(p, name); ok {
			return true
		}
	}
	return false
}

// hasMeta reports whether path contains glob metacharacters.
func hasMeta(path string) bool {
	return strings.ContainsAny(path, `*?[`)
}

// readFile appends up to limit bytes of the file (all of it if limit < 0) to dst.
func readFile(path string, limit int64, dst []byte) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return dst, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if limit >= 0 {
		r = io.LimitReader(f, limit)
	}
	if fi, err := f.Stat(); err == nil {
		n := fi.Size()
		if limit >= 0 {
			n = min(n, limit)
		}
		dst = slices.Grow(dst, int(n)+bytes.MinRead)
	}
	b := bytes.NewBuffer(dst)
	if _, err := b.ReadFrom(r); err != nil {
		return dst, fmt.Errorf("data: %w", err)
	}
	return b.Bytes(), nil
}
