package data

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"distflash/sysmem"
)

// Source says where training text comes from.
type Source struct {
	// Path is a file, a directory (walked recursively) or a glob pattern (filepath.Match
	// syntax) naming files or directories, already expanded by ExpandPath. A path that
	// exists is never treated as a pattern.
	Path string
	// Format is how the files are read (Formats lists the names):
	//
	//   - "text" (also "", the default): each file's bytes are one document.
	//   - "jsonl": one JSON object per line, its string field "text" (or TextKey) one
	//     document; blank lines are skipped, and a line that is not such an object is an
	//     error naming the file and line.
	//   - "c4": the same objects (C4's own files: "text", "timestamp", "url"), in files
	//     named c4-*.json, c4-*.json.gz or c4-*.json.zst.
	//   - "parquet": Parquet files (*.parquet, as the Hugging Face Hub publishes datasets),
	//     one document per row, its string or binary column "text" (or TextKey); null rows
	//     are skipped and counted. The package documentation says what is read and what
	//     is refused.
	//   - "tokens": token shards written by WriteShards (distflash data tokenize); see
	//     LoadTokens.
	//
	// jsonl and c4 files may be gzip- or zstd-compressed, which is told by the file's
	// first bytes (its magic number), not its name; a corrupt or truncated stream is an
	// error naming the file. The two formats differ only in DefaultInclude. A compressed
	// file read as text, and binary data (NUL bytes, mostly invalid UTF-8) read as text,
	// jsonl or c4, is an error naming the file and what was found (see checkText).
	Format string
	// TextKey names the field holding a document's text in formats jsonl, c4 and parquet:
	// the member of each JSON line's object, the column of a Parquet file. A dotted path
	// ("meta.body") reaches a nested field: a member of an object, a field of a struct
	// column; a name that itself holds a dot cannot be named. "" means "text". A line
	// without the field, or whose field is not a string, is an error naming the file, the
	// line and the key; a Parquet file without the column lists the columns it has.
	TextKey string
	// Include holds filename patterns (filepath.Match syntax) matched against the base name
	// of each file found inside a directory; nil or empty means DefaultInclude(Format).
	// Files that Path names directly, itself or through a glob, are read whatever their
	// name.
	Include []string
	// MaxBytes bounds the text read, separators included; 0 means no limit. The last
	// document read is cut to fit, so with the byte tokenizer the stream is MaxBytes tokens
	// long (or one less) whenever there is that much text. A truncated read is a prefix of
	// the full read with the same Seed. Token shards record the bytes of text they encode;
	// reading shards that encode more than MaxBytes is an error, since tokens cannot be cut
	// at a byte count.
	MaxBytes int64
	// Seed orders the files: they are sorted by path, shuffled with Seed and read in that
	// order until MaxBytes, so the seed picks which files a truncated read sees. Documents
	// within a file keep their order. Token shards are read in path order whatever the
	// seed: their order was fixed when they were written.
	Seed uint64
	// Log, when set, receives what a user should know about the read, a line each,
	// written on the caller's goroutine: that MaxBytes cut the text short (how much was
	// read of how much), text with some invalid UTF-8 (see checkText), token shards
	// without a checksum. Data that is surely not meant (a compressed file read as text,
	// a binary file) is an error instead.
	Log io.Writer
	// Boundary, when set, is put between consecutive documents instead of the encoding of
	// DocSeparator: the one token that marks where a document starts for document masking
	// (see DocumentBoundary). A document that contains it is an error, since its boundaries
	// could not be told. Token shards hold DocSeparator between their documents, and from
	// version 3 on a table of where each starts, by which format "tokens" puts the boundary
	// in the separators' place: the stream is the one the text the shards were written from
	// gives. Older shards are refused with it.
	Boundary *int32
}

// DocumentBoundary returns the token that starts each document of a packed stream when
// documents are masked (data.document_mask): the tokenizer's end-of-sequence token where it
// has one (SpecialTokens), and 0 for the byte tokenizer, whose text never holds a NUL byte
// (checkText refuses it in files). For any other tokenizer it is an error.
func DocumentBoundary(tok Tokenizer) (int32, error) {
	if s, ok := tok.(SpecialTokens); ok {
		if _, eos := s.Specials(); eos >= 0 {
			return eos, nil
		}
	}
	if _, ok := tok.(ByteTokenizer); ok {
		return 0, nil
	}
	return 0, fmt.Errorf("data: data.document_mask: tokenizer %q has no end-of-sequence token to mark document boundaries with", tok.Name())
}

// DocSeparator is the byte LoadTokens puts between consecutive documents, so that the
// last line of one file never runs into the first line of the next unmarked. Go files end
// in a newline already, so there a boundary reads as a blank line.
const DocSeparator = '\n'

// LoadTokens reads src and tokenizes it with tok into one stream: the documents in the
// order Source.Seed gives, each encoded on its own, with the encoding of DocSeparator
// between consecutive ones. Empty documents (and files) are skipped.
//
// Directories are walked recursively, skipping (as the go command does) any directory
// below the root whose name is testdata or starts with "." or "_": Go test data is often
// deliberately malformed or machine-generated and is not the text we want to model.
// Symbolic links to files are read; links to directories are not followed.
//
// With format "tokens" the stream is the shards' tokens, shard after shard in path order
// with the encoding of DocSeparator between them: the stream LoadTokens gave for the source
// the shards were written from (with Source.Boundary too: see there). Every shard must
// have been written by tok (same name, vocabulary and TokenizerFingerprint); the error for
// one that was not names both tokenizers.
//
// It is an error if no text is found; the message names the path and the include patterns.
func LoadTokens(src Source, tok Tokenizer) ([]int32, error) {
	if tok == nil {
		return nil, errors.New("data: LoadTokens: nil Tokenizer")
	}
	format, err := checkFormat(src.Format)
	if err != nil {
		return nil, err
	}
	if format == "tokens" {
		return loadShards(src, tok)
	}
	w, err := newDocWalk(src, true)
	if err != nil {
		return nil, err
	}
	// The stream is built in parts and joined at the end: one copy, where growing one slice
	// would copy it several times over.
	var (
		parts [][]int32
		cur   []int32
		total int
	)
	if _, ok := tok.(ByteTokenizer); ok && format == "text" {
		// One token per byte: the files' sizes bound the stream, so one part holds it.
		cur = make([]int32, 0, w.textBound())
	}
	add := func(t []int32) {
		total += len(t)
		for len(t) > 0 {
			if len(cur) == cap(cur) {
				if len(cur) > 0 {
					parts = append(parts, cur)
				}
				cur = make([]int32, 0, max(4<<20, total/4))
			}
			n := copy(cur[len(cur):cap(cur)], t)
			cur, t = cur[:len(cur)+n], t[n:]
		}
	}
	sep := tok.Encode([]byte{DocSeparator})
	if src.Boundary != nil {
		sep = []int32{*src.Boundary}
	}
	docs := 0
	err = encodeDocs(context.Background(), w, tok, 0, func(d []int32, _ int) error {
		if src.Boundary != nil && slices.Contains(d, *src.Boundary) {
			return fmt.Errorf("data: %s: document %d holds token %d, the document boundary of data.document_mask, so its documents cannot be told apart", src.Path, docs+1, *src.Boundary)
		}
		if docs > 0 {
			add(sep)
		}
		docs++
		add(d)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(parts) == 0 {
		return slices.Clip(cur), nil
	}
	tokens := make([]int32, 0, total)
	for _, p := range append(parts, cur) {
		tokens = append(tokens, p...)
	}
	return tokens, nil
}

// textBound returns an upper bound of the bytes of text a text-format walk reads: the sizes
// of its files and a separator between each, capped by MaxBytes.
func (w *docWalk) textBound() int64 {
	var n int64
	for _, f := range w.files {
		if fi, err := os.Stat(f); err == nil {
			n += fi.Size() + 1
		}
		if w.src.MaxBytes > 0 && n >= w.src.MaxBytes {
			return w.src.MaxBytes
		}
	}
	return n
}

// appendEncoder returns a function that appends the encoding of text to dst: the
// tokenizer's own AppendEncode when it has one, else Encode and append.
func appendEncoder(tok Tokenizer) func(dst []int32, text []byte) []int32 {
	if a, ok := tok.(interface {
		AppendEncode(dst []int32, text []byte) []int32
	}); ok {
		return a.AppendEncode
	}
	return func(dst []int32, text []byte) []int32 { return append(dst, tok.Encode(text)...) }
}

// loadShards is LoadTokens for format "tokens".
func loadShards(src Source, tok Tokenizer) ([]int32, error) {
	w, err := newDocWalk(src, false)
	if err != nil {
		return nil, err
	}
	defer w.flushLog()
	var (
		paths          []string
		total, textLen int64
	)
	sep := tok.Encode([]byte{DocSeparator})
	checked := map[string]bool{}
	for _, f := range w.files {
		if d := filepath.Dir(f); !checked[d] {
			checked[d] = true
			if err := checkShardSet(d); err != nil {
				return nil, err
			}
			if note := shardSetNote(d); note != "" {
				w.logf("%s", note)
			}
		}
		h, err := ReadShardHeader(f)
		if err != nil {
			return nil, err
		}
		if h.Version < 2 {
			w.warn(fmt.Sprintf("token shard %s is version %d and carries no checksum: its tokens are read unverified; write it again with distflash data tokenize", f, h.Version))
		}
		if err := checkShardTokenizer(h, f, tok); err != nil {
			return nil, err
		}
		if src.Boundary != nil && !h.HasDocStarts() {
			return nil, fmt.Errorf("data: token shard %s is version %d, which does not record where its documents start, so data.document_mask cannot mark them: write the shards again with distflash data tokenize (version %d keeps a document table)",
				f, h.Version, shardVersion)
		}
		if h.Documents == 0 {
			continue
		}
		if len(paths) > 0 {
			textLen++
		}
		paths = append(paths, f)
		total += h.Tokens
		if src.Boundary != nil {
			// Each separator between documents becomes one boundary token.
			total += (h.Documents - 1) * (1 - int64(len(sep)))
		}
		textLen += h.TextBytes
	}
	if len(paths) == 0 {
		if len(w.files) == 0 {
			return nil, fmt.Errorf("data: no token shards in %s: no file matches include patterns %q (directories named testdata or starting with . or _ are skipped)", src.Path, w.include)
		}
		return nil, fmt.Errorf("data: no tokens in %s: all %d shards matching include patterns %q are empty", src.Path, len(w.files), w.include)
	}
	if src.MaxBytes > 0 && textLen > src.MaxBytes {
		return nil, fmt.Errorf("data: the %d token shards in %s encode %d bytes of text, more than MaxBytes = %d, and tokens cannot be cut at a byte count: read them all with MaxBytes = 0 (data.max_bytes = 0), or write the shards with the limit (distflash data tokenize applies data.max_bytes)",
			len(paths), src.Path, textLen, src.MaxBytes)
	}
	join := sep
	if src.Boundary != nil {
		join = []int32{*src.Boundary}
	}
	total += int64(len(paths)-1) * int64(len(join))
	if total > int64(math.MaxInt)/2 {
		return nil, fmt.Errorf("data: the token shards in %s hold %d tokens, too many for memory", src.Path, total)
	}
	if err := sysmem.Check(fmt.Sprintf("data: the %d tokens of the %d token shards in %s (as their headers say)", total, len(paths), src.Path), 4*float64(total)); err != nil {
		return nil, err
	}
	tokens := make([]int32, 0, int(total))
	for i, f := range paths {
		if i > 0 {
			tokens = append(tokens, join...)
		}
		base := len(tokens)
		var starts []int64
		if _, tokens, starts, err = appendShard(tokens, f); err != nil {
			return nil, err
		}
		if src.Boundary != nil {
			if tokens, err = markDocuments(tokens, base, starts, sep, *src.Boundary, f); err != nil {
				return nil, err
			}
		}
	}
	if n := w.warnings - maxWarnings; n > 0 {
		w.logf("data: warning: %d more like it in %s", n, src.Path)
	}
	return tokens, nil
}

// markDocuments rewrites the shard at path, read into tokens[base:] with its document
// table starts, so that its documents are joined by the boundary token instead of sep:
// the stream LoadTokens gives for the shard's documents with that Source.Boundary. It
// checks that a separator precedes every document and that no document holds the
// boundary.
func markDocuments(tokens []int32, base int, starts []int64, sep []int32, boundary int32, path string) ([]int32, error) {
	body := tokens[base:]
	if len(sep) == 0 {
		// The boundary tokens lengthen the stream: read from a copy.
		body = slices.Clone(body)
		tokens = slices.Grow(tokens, len(starts))
	}
	n := int64(len(body))
	out := base
	for i, s := range starts {
		end := n
		if i+1 < len(starts) {
			end = starts[i+1] - int64(len(sep))
			if end < s || !slices.Equal(body[end:starts[i+1]], sep) {
				return tokens[:base], fmt.Errorf("data: token shard %s: document table: document %d starts at token %d, which does not follow the separator %v after document %d (at %d): the table does not match the tokens; write the shard again with distflash data tokenize",
					path, i+1, starts[i+1], sep, i, s)
			}
		}
		doc := body[s:end]
		if j := slices.Index(doc, boundary); j >= 0 {
			return tokens[:base], fmt.Errorf("data: token shard %s: document %d holds token %d (at token %d of the shard), the document boundary of data.document_mask, so its documents cannot be told apart",
				path, i, boundary, s+int64(j))
		}
		if i > 0 {
			tokens = append(tokens[:out], boundary)
			out++
		}
		// out <= base+s: each separator before it gave at most one token, so copy moves
		// the document left (or not at all) over tokens already read.
		out += copy(tokens[out:out+len(doc)], doc)
	}
	return tokens[:out], nil
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

// readFile appends up to limit bytes of the file (all of it if limit < 0) to dst and says
// whether the file holds more. A file whose first bytes say it is not text (sniffError)
// is an error.
func readFile(path string, limit int64, dst []byte) ([]byte, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return dst, false, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	var head [sniffLen]byte
	n, err := f.ReadAt(head[:], 0)
	if err != nil && err != io.EOF {
		return dst, false, fmt.Errorf("data: %w", err)
	}
	if err := sniffError(path, "text", head[:n]); err != nil {
		return dst, false, err
	}
	var r io.Reader = f
	if limit >= 0 {
		r = io.LimitReader(f, limit)
	}
	size := int64(-1)
	if fi, err := f.Stat(); err == nil {
		size = fi.Size()
		n := size
		if limit >= 0 {
			n = min(n, limit)
		}
		if err := sysmem.Check(fmt.Sprintf("data: reading %s (%d bytes; data.max_bytes bounds what is read)", path, size), float64(n)); err != nil {
			return dst, false, err
		}
		dst = slices.Grow(dst, int(n)+bytes.MinRead)
	}
	start := len(dst)
	b := bytes.NewBuffer(dst)
	if _, err := b.ReadFrom(r); err != nil {
		return dst, false, fmt.Errorf("data: %w", err)
	}
	read := int64(b.Len() - start)
	return b.Bytes(), limit >= 0 && read == limit && size > limit, nil
}
