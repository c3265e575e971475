package data

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"
)

// Formats lists the values Source.Format accepts, in the order error messages list them;
// "" reads as "text".
var Formats = []string{"text", "jsonl", "c4", "parquet", "tokens"}

// DefaultInclude returns the file name patterns read from a directory when Source.Include is
// empty, which depend on the format:
//
//	text    *.go *.txt *.md (Go sources, for the default corpus, the Go source tree; and
//	        plain text and Markdown, so a directory of notes or books needs no patterns)
//	jsonl   *.jsonl *.jsonl.gz *.jsonl.zst
//	c4      c4-*.json c4-*.json.gz c4-*.json.zst (the names of allenai/c4's files)
//	parquet *.parquet
//	tokens  *.tokens (the shards WriteShards writes)
//
// None of them matches the .part files of an unfinished FetchC4 or the .tmp file of an
// unfinished shard. An unknown format gets the text patterns.
func DefaultInclude(format string) []string {
	switch format {
	case "jsonl":
		return []string{"*.jsonl", "*.jsonl.gz", "*.jsonl.zst"}
	case "c4":
		return []string{"c4-*.json", "c4-*.json.gz", "c4-*.json.zst"}
	case "parquet":
		return []string{"*.parquet"}
	case "tokens":
		return []string{"*.tokens"}
	}
	return []string{"*.go", "*.txt", "*.md"}
}

// checkFormat returns the canonical name of format ("" is "text") or an error listing the
// accepted ones.
func checkFormat(format string) (string, error) {
	if format == "" {
		return "text", nil
	}
	if !slices.Contains(Formats, format) {
		return "", fmt.Errorf("data: unknown format %q: accepted: %s", format, strings.Join(Formats, ", "))
	}
	return format, nil
}

// ReadDocuments returns the first n documents of src (all of them when n <= 0), for
// evaluation: C4's validation loss is the loss on its first N documents.
//
// Unlike LoadTokens it reads the files in path order, not in the order Source.Seed gives,
// and returns each document on its own (no DocSeparator), so the same N documents come back
// whatever the seed. Documents within a file come in file order; empty documents are
// skipped and not counted. MaxBytes bounds the text as in LoadTokens (separators counted,
// the last document cut to fit). The format must be a text format (text, jsonl, c4 or parquet).
func ReadDocuments(src Source, n int) ([][]byte, error) {
	format, err := checkFormat(src.Format)
	if err != nil {
		return nil, err
	}
	if format == "tokens" {
		return nil, fmt.Errorf("data: ReadDocuments reads text, and format \"tokens\" holds token ids: use the text, jsonl, c4 or parquet files the shards were made from")
	}
	w, err := newDocWalk(src, false)
	if err != nil {
		return nil, err
	}
	defer w.flushLog()
	var docs [][]byte
	errEnough := errors.New("enough documents")
	_, err = w.each(func(d []byte) error {
		docs = append(docs, bytes.Clone(d))
		if n > 0 && len(docs) == n {
			return errEnough
		}
		return nil
	})
	if err != nil && err != errEnough {
		return nil, err
	}
	return docs, nil
}

// docWalk reads the documents of a Source: its files in reading order and how to read them.
type docWalk struct {
	src     Source
	format  string
	key     *textKey // Source.TextKey
	include []string
	files   []string
	// onRead, when set, is called with the number of bytes read from disk (before
	// decompression) as the walk reads them, and onFile as it opens each file, for
	// progress reports.
	onRead func(n int64)
	onFile func()
	// onText, when set, is called with the bytes of text of each document the walk gives (a
	// separator before every one but the first counted), for a reader ahead of its consumer
	// to relate the input read to the text read.
	onText func(n int64)

	// Set by each: the text passed on (separators included), the files opened, and
	// whether MaxBytes ended the walk before the text did.
	textBytes int64
	filesRead int
	cut       bool
	// Lines for Source.Log, kept until flushLog writes them on the caller's goroutine.
	mu       sync.Mutex
	pending  []string
	warnings int // warnings so far, of which the first maxWarnings are logged
	// Rows of Parquet files whose text is null, skipped, and the files that had them.
	parquetNulls     int64
	parquetNullFiles []string
}

// maxWarnings is how many warnings a walk logs one by one; the rest are counted in one
// line at its end.
const maxWarnings = 3

// warn queues a warning for Source.Log.
func (w *docWalk) warn(msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.warnings++
	if w.warnings <= maxWarnings {
		w.pending = append(w.pending, "data: warning: "+msg)
	}
}

// logf queues a line for Source.Log.
func (w *docWalk) logf(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending = append(w.pending, fmt.Sprintf(format, args...))
}

// flushLog writes the queued lines to Source.Log (and drops them when it is nil). Only
// the goroutine that called LoadTokens, ReadDocuments or WriteShards calls it, so the
// lines never interleave with the caller's own writes to the same writer.
func (w *docWalk) flushLog() {
	w.mu.Lock()
	lines := w.pending
	w.pending = nil
	w.mu.Unlock()
	if w.src.Log == nil {
		return
	}
	for _, l := range lines {
		fmt.Fprintln(w.src.Log, l)
	}
}

// finishLog queues the walk's closing lines: how many warnings were not shown, and the
// cut MaxBytes made.
func (w *docWalk) finishLog() {
	if n := w.warnings - maxWarnings; n > 0 {
		w.logf("data: warning: %d more like it in %s", n, w.src.Path)
	}
	switch nf := len(w.parquetNullFiles); {
	case nf == 1:
		w.logf("data: %s null texts skipped in %s", commas(w.parquetNulls), w.parquetNullFiles[0])
	case nf > 1:
		w.logf("data: %s null texts skipped in %s, in %d files (the first %s)", commas(w.parquetNulls), w.src.Path, nf, w.parquetNullFiles[0])
	}
	if !w.cut || w.src.MaxBytes == 0 || w.src.Log == nil {
		return // the line would be dropped: spare the stat of every file
	}
	var disk, nonEmpty int64
	for _, f := range w.files {
		if fi, err := os.Stat(f); err == nil && fi.Size() > 0 {
			disk += fi.Size()
			nonEmpty++
		}
	}
	if w.format == "text" {
		// The whole read: every file and the separators between them.
		all := disk + max(nonEmpty-1, 0)
		w.logf("data: read %s of %s bytes of text in %s, from %s of %s files (data.max_bytes = %d; set 0 for all)",
			commas(w.textBytes), commas(all), w.src.Path, commas(int64(w.filesRead)), commas(int64(len(w.files))), w.src.MaxBytes)
		return
	}
	w.logf("data: read %s bytes of text in %s, from %s of %s files holding %s bytes on disk (data.max_bytes = %d; set 0 for all)",
		commas(w.textBytes), w.src.Path, commas(int64(w.filesRead)), commas(int64(len(w.files))), commas(disk), w.src.MaxBytes)
}

// commas formats n with thousands separators: 23,456,789.
func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// newDocWalk validates src and lists its files: sorted by path, then shuffled with src.Seed
// when shuffle is set.
func newDocWalk(src Source, shuffle bool) (*docWalk, error) {
	format, err := checkFormat(src.Format)
	if err != nil {
		return nil, err
	}
	if src.MaxBytes < 0 {
		return nil, fmt.Errorf("data: MaxBytes = %d: must be >= 0 (0 = no limit)", src.MaxBytes)
	}
	include := src.Include
	if len(include) == 0 {
		include = DefaultInclude(format)
	}
	for _, p := range include {
		if _, err := filepath.Match(p, ""); err != nil {
			return nil, fmt.Errorf("data: include pattern %q: %w", p, err)
		}
	}
	key, err := newTextKey(src.TextKey)
	if err != nil {
		return nil, err
	}
	files, err := listFiles(src.Path, include)
	if err != nil {
		return nil, err
	}
	if shuffle {
		newRNG(src.Seed, domainFiles, 0).shuffle(len(files), func(i, j int) { files[i], files[j] = files[j], files[i] })
	}
	return &docWalk{src: src, format: format, key: key, include: include, files: files}, nil
}

// errStopWalk ends a walk early without an error: the byte budget is spent.
var errStopWalk = errors.New("stop walk")

// each calls fn with every non-empty document in reading order, the last one cut so that
// the documents and the separators between them fit in MaxBytes. fn must not keep d, whose
// storage is reused; an error from fn ends the walk and is returned. It returns the number
// of documents read and is an error when there were none (naming the path and the
// include patterns).
func (w *docWalk) each(fn func(d []byte) error) (int, error) {
	var (
		used int64 // bytes of text passed to fn, separators included
		docs int
		buf  []byte
	)
	// budget is how many bytes the next document may have (-1: no limit); 0 ends the walk.
	budget := func() int64 {
		if w.src.MaxBytes == 0 {
			return -1
		}
		b := w.src.MaxBytes - used
		if docs > 0 {
			b-- // the separator
		}
		return max(b, 0)
	}
	emit := func(d []byte) error {
		if len(d) == 0 {
			return nil
		}
		if docs > 0 {
			used++
		}
		used += int64(len(d))
		docs++
		if w.onText != nil {
			w.onText(int64(len(d)) + int64(min(docs-1, 1)))
		}
		return fn(d)
	}
	for i, f := range w.files {
		limit := budget()
		if limit == 0 {
			w.cut = true // files are left
			break
		}
		if w.onFile != nil {
			w.onFile()
		}
		w.filesRead = i + 1
		var err error
		if w.format == "text" {
			var cut bool
			buf, cut, err = readFile(f, limit, buf[:0])
			if err == nil && w.onRead != nil {
				w.onRead(int64(len(buf)))
			}
			if err == nil {
				var warning string
				if warning, err = checkText(f, w.format, buf, false); warning != "" {
					w.warn(warning)
				}
			}
			if err == nil {
				w.cut = w.cut || cut
				err = emit(buf)
			}
		} else {
			read := w.eachJSON
			if w.format == "parquet" {
				read = w.eachParquet
			}
			err = read(f, func(d []byte) error {
				limit := budget()
				if limit == 0 {
					w.cut = true // documents are left
					return errStopWalk
				}
				if limit > 0 && int64(len(d)) > limit {
					w.cut = true
					d = d[:limit]
				}
				return emit(d)
			})
		}
		if err == errStopWalk {
			break
		}
		if err != nil {
			return docs, err
		}
	}
	w.textBytes = used
	w.finishLog()
	if docs == 0 {
		if len(w.files) == 0 {
			return 0, fmt.Errorf("data: no text in %s: no file matches include patterns %q (directories named testdata or starting with . or _ are skipped)", w.src.Path, w.include)
		}
		return 0, fmt.Errorf("data: no text in %s: all %d files matching include patterns %q are empty", w.src.Path, len(w.files), w.include)
	}
	return docs, nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r      io.Reader
	onRead func(int64)
	n      int64 // bytes read so far
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if n > 0 && c.onRead != nil {
		c.onRead(int64(n))
	}
	return n, err
}

// MaxExpansion is how many times its compressed size a jsonl or c4 file may expand once it has
// produced more than MaxExpansionFloor bytes: C4's gzip files expand about 3×, zstd text rarely
// beyond 20×; a stream that expands further (a decompression bomb, of blank lines say, which
// MaxLineBytes does not stop) is refused with an error naming the file. Tests lower them.
var (
	MaxExpansion      int64 = 1000
	MaxExpansionFloor int64 = 256 << 20
)

// bombGuard counts the bytes a decompressor produces from the compressed bytes in counted
// and fails once they exceed the MaxExpansion limit.
type bombGuard struct {
	r       io.Reader
	counted *countingReader
	out     int64
	path    string
}

func (g *bombGuard) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	g.out += int64(n)
	if g.out > MaxExpansionFloor && g.out > MaxExpansion*max(g.counted.n, 1) {
		return n, &bombError{path: g.path, out: g.out, in: g.counted.n}
	}
	return n, err
}

// bombError is bombGuard's error.
type bombError struct {
	path    string
	out, in int64
}

func (e *bombError) Error() string {
	return fmt.Sprintf("data: %s: %d bytes decompressed from %d: more than %d times its compressed size, refused as a decompression bomb",
		e.path, e.out, e.in, MaxExpansion)
}

// Magic numbers at the start of compressed files.
var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// MaxLineBytes is the longest line of a jsonl or c4 file (after decompression) that is read:
// a longer one is an error naming the file and line, so that a file of one endless line, or
// a small compressed file that expands to one (a decompression bomb), cannot take all
// memory. It is far above real documents (C4's longest are well under 1 MiB). Tests lower it.
var MaxLineBytes = 64 << 20

// MaxZstdWindow is the largest zstd window (the history a decoder keeps, allocated as the
// stream asks for it) a jsonl or c4 file may use: zstd's own --ultra -22 uses 128 MiB, and
// larger windows (--long=28 and up) are refused with an error naming the file, so that a few
// bytes of frame header cannot make the reader allocate the decoder's default 512 MiB.
const MaxZstdWindow = 128 << 20

// eachJSON opens path, decompresses it if it starts with the gzip or zstd magic number
// (whatever its name), and calls fn with the field Source.TextKey names ("text" by
// default) of the JSON object on each line that is not blank. Errors from fn come back unchanged.
func (w *docWalk) eachJSON(path string, fn func(d []byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	var head [sniffLen]byte
	hn, err := f.ReadAt(head[:], 0)
	if err != nil && err != io.EOF {
		return fmt.Errorf("data: read %s: %w", path, err)
	}
	if err := sniffError(path, w.format, head[:hn]); err != nil {
		return err
	}
	counted := &countingReader{r: f, onRead: w.onRead}
	r, kind, closeR, err := decompress(counted, path)
	if err != nil {
		return err
	}
	defer closeR()
	if kind != "" {
		r = bufio.NewReaderSize(&bombGuard{r: r, counted: counted, path: path}, 256<<10)
	}
	// Check the start of the (decompressed) stream: a corrupt one fails below.
	if sample, _ := r.Peek(textCheckLen + 1); len(sample) > 0 {
		more := len(sample) > textCheckLen
		warning, err := checkText(path, w.format, sample[:min(len(sample), textCheckLen)], more)
		if err != nil {
			return err
		}
		if warning != "" {
			w.warn(warning)
		}
	}
	var long []byte // a line longer than r's buffer
	for n := 1; ; n++ {
		line, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			long = append(long[:0], line...)
			for err == bufio.ErrBufferFull {
				line, err = r.ReadSlice('\n')
				long = append(long, line...)
				if len(long) > MaxLineBytes {
					what := "file"
					if kind != "" {
						what = kind + " stream (a decompression bomb?)"
					}
					return fmt.Errorf("data: %s:%d: line longer than %d bytes: a %s line holds one JSON document, and this %s has none that short",
						path, n, MaxLineBytes, w.format, what)
				}
			}
			line = long
		}
		if err != nil && err != io.EOF {
			if be := (*bombError)(nil); errors.As(err, &be) {
				return be
			}
			if errors.Is(err, zstd.ErrWindowSizeExceeded) {
				return fmt.Errorf("data: %s: the zstd stream asks for a window larger than %d bytes, the most read (recompress it without --long, or with --long=27 or less): %w", path, MaxZstdWindow, err)
			}
			if kind != "" {
				return fmt.Errorf("data: %s: corrupt or truncated %s stream: %w", path, kind, err)
			}
			return fmt.Errorf("data: read %s: %w", path, err)
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte{'\n'}), []byte{'\r'})
		if len(bytes.TrimSpace(line)) > 0 {
			text, jerr := jsonText(line, w.key)
			if jerr != nil {
				return fmt.Errorf("data: %s:%d: %w", path, n, jerr)
			}
			if ferr := fn(text); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
	}
}

// decompress returns a buffered reader of r's content, decompressed when it starts with the
// gzip or zstd magic number, the name of the compression ("" for none) and a function that
// releases the decompressor.
func decompress(r io.Reader, path string) (*bufio.Reader, string, func(), error) {
	br := bufio.NewReaderSize(r, 256<<10)
	head, err := br.Peek(4)
	if err != nil && err != io.EOF {
		return nil, "", nil, fmt.Errorf("data: read %s: %w", path, err)
	}
	switch {
	case bytes.HasPrefix(head, gzipMagic):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, "", nil, fmt.Errorf("data: %s: not a valid gzip file: %w", path, err)
		}
		return bufio.NewReaderSize(zr, 256<<10), "gzip", func() { zr.Close() }, nil
	case bytes.HasPrefix(head, zstdMagic):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(MaxZstdWindow))
		if err != nil {
			return nil, "", nil, fmt.Errorf("data: %s: not a valid zstd file: %w", path, err)
		}
		return bufio.NewReaderSize(zr, 256<<10), "zstd", zr.Close, nil
	}
	return br, "", func() {}, nil
}

// textKey is Source.TextKey prepared for reading: the field or column path ("text" for
// ""), its dot-separated names, and each name quoted as it appears unescaped in JSON.
//
// A dotted path reaches a nested field: "meta.body" is the member body of the object (or
// struct column) meta. So a key whose name itself holds a dot cannot be named: no
// escape is read.
type textKey struct {
	path   string
	names  []string
	quoted []string
}

// newTextKey returns key prepared for reading, or an error for a path with an empty name
// ("a..b", ".text").
func newTextKey(key string) (*textKey, error) {
	if key == "" {
		key = "text"
	}
	k := &textKey{path: key, names: strings.Split(key, ".")}
	for _, n := range k.names {
		if n == "" {
			return nil, fmt.Errorf("data: data.text_key = %q: a dotted path of field names has an empty name (a field whose name holds a dot cannot be named)", key)
		}
		var q bytes.Buffer
		enc := json.NewEncoder(&q)
		enc.SetEscapeHTML(false) // a key "a<b" appears as it is
		if err := enc.Encode(n); err != nil {
			return nil, fmt.Errorf("data: data.text_key = %q: %w", key, err)
		}
		k.quoted = append(k.quoted, strings.TrimSuffix(q.String(), "\n"))
	}
	return k, nil
}

// example says what a document of key looks like, for error messages.
func (k *textKey) example() string {
	inner := `"..."`
	for i := len(k.names) - 1; i >= 0; i-- {
		inner = fmt.Sprintf("{%s: %s, ...}", k.quoted[i], inner)
	}
	if k.path == "text" {
		return "C4 and jsonl documents are " + inner
	}
	return fmt.Sprintf("data.text_key = %q: each line is %s", k.path, inner)
}

// jsonText returns the field key names of the JSON object in line, which must be a
// string; when an object has the member several times, the last counts (as when decoding
// into a map). Each name must match exactly ("text", not "Text"). The result may share
// line's storage.
//
// A small scanner validates line and finds the field (a dotted key: the first name in
// line, the next in that member's object, and so on); only a string with escapes or
// invalid UTF-8 is decoded by encoding/json (which also writes the error messages), so
// reading C4 runs at the speed of the scan, not of the general decoder.
func jsonText(line []byte, key *textKey) ([]byte, error) {
	s := jsonScanner{b: line, key: key.quoted[0], name: key.names[0]}
	raw, kind, ok := s.object()
	if !ok {
		var v any
		err := json.Unmarshal(line, &v)
		switch {
		case err != nil:
			return nil, fmt.Errorf("not valid JSON: %w", err)
		case s.notObject:
			return nil, fmt.Errorf("%s, not a JSON object (%s)", jsonKind(bytes.TrimSpace(line)), key.example())
		}
		return nil, errors.New("not valid JSON") // unreachable while the scanner agrees with encoding/json
	}
	for i := 1; i < len(key.names) && raw != nil; i++ {
		if kind != '{' {
			return nil, fmt.Errorf("%q is %s, want an object holding %q (%s)", strings.Join(key.names[:i], "."), jsonKind(raw), key.names[i], key.example())
		}
		s = jsonScanner{b: raw, key: key.quoted[i], name: key.names[i]}
		if raw, kind, ok = s.object(); !ok {
			return nil, errors.New("not valid JSON") // unreachable: the whole line was validated
		}
		if raw == nil {
			return nil, fmt.Errorf("the object has no %q field: %q has no %q (%s)", key.path, strings.Join(key.names[:i], "."), key.names[i], key.example())
		}
	}
	switch {
	case raw == nil:
		return nil, fmt.Errorf("the object has no %q field (%s)", key.path, key.example())
	case kind != '"':
		return nil, fmt.Errorf(`%q is %s, want a string`, key.path, jsonKind(raw))
	}
	body := raw[1 : len(raw)-1]
	if !s.escaped && utf8.Valid(body) {
		return body, nil
	}
	return unquoteJSON(body), nil
}

// unquoteJSON decodes the body of a JSON string that jsonScanner has validated, as
// encoding/json does: escapes resolved, a \u escape of a surrogate that is not half of a
// pair and each byte of invalid UTF-8 replaced by U+FFFD.
func unquoteJSON(body []byte) []byte {
	out := make([]byte, 0, len(body))
	for len(body) > 0 {
		// The bytes up to the next escape, in one piece when they are valid UTF-8.
		n := bytes.IndexByte(body, '\\')
		if n < 0 {
			n = len(body)
		}
		out = appendValidUTF8(out, body[:n])
		body = body[n:]
		if len(body) == 0 {
			break
		}
		switch e := body[1]; e {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := hex4(body[2:])
			body = body[6:]
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if len(body) >= 6 && body[0] == '\\' && body[1] == 'u' {
					r2 = hex4(body[2:])
				}
				if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
					r = d
					body = body[6:]
				} else {
					r = utf8.RuneError
				}
			}
			out = utf8.AppendRune(out, r)
			continue
		default: // " \\ /
			out = append(out, e)
		}
		body = body[2:]
	}
	return out
}

// appendValidUTF8 appends b to dst with each byte of invalid UTF-8 replaced by U+FFFD.
func appendValidUTF8(dst, b []byte) []byte {
	if utf8.Valid(b) {
		return append(dst, b...)
	}
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			dst = utf8.AppendRune(dst, utf8.RuneError)
		} else {
			dst = append(dst, b[:n]...)
		}
		b = b[n:]
	}
	return dst
}

// hex4 returns the value of the four hex digits at the start of b.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// jsonKind names the kind of the JSON value v for error messages.
func jsonKind(v []byte) string {
	if len(v) == 0 {
		return "missing"
	}
	switch v[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// jsonMaxDepth is the deepest nesting jsonScanner accepts, encoding/json's limit.
const jsonMaxDepth = 10000

// jsonScanner validates JSON text (RFC 8259, as encoding/json accepts it: any bytes but
// control characters inside strings) and finds the top-level member of an object whose
// name is name (key: quoted, as it appears unescaped).
type jsonScanner struct {
	b         []byte
	key       string // `"text"`
	name      string // text
	i         int
	depth     int
	escaped   bool // the last top-level member named name is a string with a backslash escape
	notObject bool // the text is valid JSON but not an object
}

// object scans b as one JSON object with optional surrounding whitespace. It returns the
// raw value of the last top-level member named s.name (nil if none) and its first byte, and
// whether b is valid.
func (s *jsonScanner) object() (raw []byte, kind byte, ok bool) {
	s.ws()
	if s.i == len(s.b) || s.b[s.i] != '{' {
		s.notObject = s.value() && s.end()
		return nil, 0, false
	}
	s.i++
	s.depth = 1
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil, 0, s.end()
	}
	for {
		s.ws()
		keyStart := s.i
		keyEscaped, okKey := s.str()
		if !okKey {
			return nil, 0, false
		}
		key := s.b[keyStart:s.i]
		s.ws()
		if s.i == len(s.b) || s.b[s.i] != ':' {
			return nil, 0, false
		}
		s.i++
		s.ws()
		valStart := s.i
		valEscaped, okVal := false, false
		if s.i < len(s.b) && s.b[s.i] == '"' {
			valEscaped, okVal = s.str()
		} else {
			okVal = s.value()
		}
		if !okVal {
			return nil, 0, false
		}
		if s.isKey(key, keyEscaped) {
			raw, kind = s.b[valStart:s.i], s.b[valStart]
			s.escaped = valEscaped
		}
		s.ws()
		if s.i == len(s.b) {
			return nil, 0, false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return raw, kind, s.end()
		default:
			return nil, 0, false
		}
	}
}

// isKey reports whether the raw (quoted) key is s.name.
func (s *jsonScanner) isKey(key []byte, escaped bool) bool {
	if !escaped {
		return string(key) == s.key
	}
	var k string
	return json.Unmarshal(key, &k) == nil && k == s.name
}

// end reports whether only whitespace is left.
func (s *jsonScanner) end() bool {
	s.ws()
	return s.i == len(s.b)
}

// ws skips whitespace.
func (s *jsonScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value scans one JSON value.
func (s *jsonScanner) value() bool {
	if s.i == len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, ok := s.str()
		return ok
	case c == '{' || c == '[':
		return s.container(c)
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	}
	return false
}

// container scans an object or array (open is its first byte) below the top level.
func (s *jsonScanner) container(open byte) bool {
	if s.depth++; s.depth > jsonMaxDepth {
		return false
	}
	defer func() { s.depth-- }()
	close := byte(']')
	if open == '{' {
		close = '}'
	}
	s.i++
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == close {
		s.i++
		return true
	}
	for {
		s.ws()
		if open == '{' {
			if s.i == len(s.b) || s.b[s.i] != '"' {
				return false
			}
			if _, ok := s.str(); !ok {
				return false
			}
			s.ws()
			if s.i == len(s.b) || s.b[s.i] != ':' {
				return false
			}
			s.i++
			s.ws()
		}
		if !s.value() {
			return false
		}
		s.ws()
		if s.i == len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case close:
			s.i++
			return true
		default:
			return false
		}
	}
}

// str scans a string and reports whether it has a backslash escape.
func (s *jsonScanner) str() (escaped, ok bool) {
	if s.i == len(s.b) || s.b[s.i] != '"' {
		return false, false
	}
	s.i++
	for s.i < len(s.b) {
		// Skip the bytes that need no attention in one step.
		j := s.i
		for j < len(s.b) && s.b[j] >= 0x20 && s.b[j] != '"' && s.b[j] != '\\' {
			j++
		}
		s.i = j
		if j == len(s.b) {
			return false, false
		}
		switch c := s.b[j]; {
		case c == '"':
			s.i++
			return escaped, true
		case c < 0x20:
			return false, false
		}
		// A backslash.
		escaped = true
		if j+1 == len(s.b) {
			return false, false
		}
		switch s.b[j+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			s.i = j + 2
		case 'u':
			if j+6 > len(s.b) {
				return false, false
			}
			for _, h := range s.b[j+2 : j+6] {
				if !isHex(h) {
					return false, false
				}
			}
			s.i = j + 6
		default:
			return false, false
		}
	}
	return false, false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// number scans a number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *jsonScanner) number() bool {
	if s.b[s.i] == '-' {
		s.i++
	}
	if s.i == len(s.b) {
		return false
	}
	if s.b[s.i] == '0' {
		s.i++
	} else if !s.digits() {
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if !s.digits() {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

// digits scans one or more decimal digits.
func (s *jsonScanner) digits() bool {
	j := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > j
}

// literal scans the literal lit.
func (s *jsonScanner) literal(lit string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
		return false
	}
	s.i += len(lit)
	return true
}

// Data a user did not mean to train on. Before a file is read as text (format "text": the
// file's bytes; "jsonl" and "c4": the decompressed stream), its first bytes are sniffed and
// its content checked:
//
//   - A gzip or zstd file read as "text" is refused, naming the format that reads it
//     (compressed JSON lines are "jsonl" or "c4"; compressed plain text is not read). An
//     xz, bzip2 or zip file, or a token shard, is refused in every text format.
//   - A NUL byte is refused: anywhere in a "text" file, in the first textCheckLen bytes of
//     a jsonl or c4 stream (later ones fail as invalid JSON). Text has none; binary files
//     and UTF-16 text have many.
//   - More than maxInvalidPercent (30%) of the first textCheckLen (64 KiB) bytes in invalid
//     UTF-8 sequences is refused: random or compressed bytes score about 43%, text in a
//     legacy single-byte encoding (Latin-1, Windows-1252) a few percent.
//   - Less invalid UTF-8 than that (a legacy encoding, a few damaged bytes) is read, with
//     a warning on Source.Log naming the file, the share and the first offset.
const (
	textCheckLen      = 64 << 10
	maxInvalidPercent = 30
)

// More magic numbers, of files no text format reads.
var (
	xzMagic    = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	bzip2Magic = []byte("BZh")
	zipMagic   = []byte("PK\x03\x04")
	utf16LEBOM = []byte{0xff, 0xfe}
	utf16BEBOM = []byte{0xfe, 0xff}
)

// sniffError returns the error for a file of a text format (text, jsonl or c4) whose
// first bytes are head, or nil when they may start text: for format text, a gzip or zstd
// file; for any, an xz, bzip2 or zip file, a Parquet file (naming data.format =
// "parquet") or a token shard.
func sniffError(path, format string, head []byte) error {
	switch {
	case format == "text" && compression(head) != "":
		kind := compression(head)
		return fmt.Errorf(`data: %s is %s-compressed, and data.format = "text" reads files as they are: %s-compressed JSON lines ({"text": "..."} per line) are data.format = "jsonl" (or "c4" for allenai/c4's c4-*.json.gz files); compressed plain text is not read: decompress it first`,
			path, kind, kind)
	case bytes.HasPrefix(head, xzMagic), isBzip2(head), bytes.HasPrefix(head, zipMagic):
		kind := "an xz-compressed file"
		switch {
		case isBzip2(head):
			kind = "a bzip2-compressed file"
		case bytes.HasPrefix(head, zipMagic):
			kind = "a zip archive"
		}
		fix := "unpack it"
		if format != "text" {
			fix = "unpack it, or recompress it with gzip or zstd"
		}
		return fmt.Errorf(`data: %s is %s, which data.format = %q does not read: the text formats read plain files, and jsonl and c4 also gzip- or zstd-compressed ones; %s`,
			path, kind, format, fix)
	case bytes.HasPrefix(head, parquetMagic):
		return fmt.Errorf(`data: %s is a Parquet file (it starts with the PAR1 magic), and data.format = %q reads text: set data.format = "parquet" (data.text_key names its text column, "text" by default)`, path, format)
	case bytes.HasPrefix(head, []byte(shardMagic)):
		return fmt.Errorf(`data: %s is a token shard (written by distflash data tokenize), and data.format = %q reads text: set data.format = "tokens"`, path, format)
	}
	return nil
}

// invalidUTF8 counts the bytes of b that are not part of a valid UTF-8 sequence (each one
// U+FFFD when repaired) and returns the offset of the first (-1 for none).
func invalidUTF8(b []byte) (bad, first int) {
	first = -1
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			bad++
			if first < 0 {
				first = i
			}
		}
		i += n
	}
	return bad, first
}

// compression names the compression whose magic number starts head: "gzip", "zstd" or ""
// for neither.
func compression(head []byte) string {
	switch {
	case bytes.HasPrefix(head, gzipMagic):
		return "gzip"
	case bytes.HasPrefix(head, zstdMagic):
		return "zstd"
	}
	return ""
}

// isBzip2 reports whether head starts a bzip2 file: "BZh", the block size '1' to '9', and
// the magic of a first block or of the end of an empty stream (text may start "BZh9").
func isBzip2(head []byte) bool {
	return len(head) >= 10 && bytes.HasPrefix(head, bzip2Magic) && head[3] >= '1' && head[3] <= '9' &&
		(string(head[4:10]) == "1AY&SY" || string(head[4:10]) == "\x17rE8P\x90")
}

// sniffLen is how many of a file's first bytes sniffError looks at.
const sniffLen = 16

// checkText checks b, all (format text) or the start (jsonl or c4; more says whether
// there is more) of what path gives to read, as described above textCheckLen: it returns an
// error when b is not text, and otherwise a warning ("" for none) when b holds invalid
// UTF-8.
func checkText(path, format string, b []byte, more bool) (warning string, err error) {
	what := `UTF-8 text`
	if format != "text" {
		what = `JSON lines of UTF-8 text`
	}
	if i := bytes.IndexByte(b[:min(len(b), textCheckLen)], 0); i >= 0 || format == "text" && bytes.IndexByte(b, 0) >= 0 {
		if i < 0 {
			i = bytes.IndexByte(b, 0)
		}
		hint := "a binary file? leave it out with data.include, or point data.train elsewhere"
		if bytes.HasPrefix(b, utf16LEBOM) || bytes.HasPrefix(b, utf16BEBOM) {
			hint = "it starts with a UTF-16 byte-order mark: convert it to UTF-8 (iconv -f UTF-16 -t UTF-8)"
		}
		return "", fmt.Errorf("data: %s: NUL byte at offset %d: this is not text, and data.format = %q reads %s; %s", path, i, format, what, hint)
	}
	if utf8.Valid(b) {
		return "", nil
	}
	end := min(len(b), textCheckLen)
	for k := 0; k < utf8.UTFMax-1 && end < len(b) && end > 0 && !utf8.RuneStart(b[end]); k++ {
		end-- // do not cut a rune at the end of the sample
	}
	head := b[:end]
	bad, first := invalidUTF8(head)
	span := "the first 64 KiB"
	if len(head) == len(b) && !more {
		span = fmt.Sprintf("its %d bytes", len(head))
	}
	if bad*100 > maxInvalidPercent*len(head) {
		return "", fmt.Errorf("data: %s: %d%% of %s is not UTF-8 (first invalid byte at offset %d; more than %d%% is refused): this is not text, and data.format = %q reads %s; a binary file? leave it out with data.include, or point data.train elsewhere",
			path, bad*100/len(head), span, first, maxInvalidPercent, format, what)
	}
	how := "read as it is"
	if format != "text" {
		how = "invalid bytes in strings read as U+FFFD"
	}
	if first < 0 { // the sample is valid; the rest is not
		first = len(head)
		for first < len(b) {
			r, n := utf8.DecodeRune(b[first:])
			if r == utf8.RuneError && n == 1 {
				break
			}
			first += n
		}
		return fmt.Sprintf("%s: invalid UTF-8 at offset %d (%s): a legacy encoding such as Latin-1, or damaged bytes?", path, first, how), nil
	}
	return fmt.Sprintf("%s: %.1f%% of %s is not UTF-8 (first at offset %d; %s, up to %d%% is): a legacy encoding such as Latin-1, or damaged bytes?",
		path, float64(bad)*100/float64(len(head)), span, first, how, maxInvalidPercent), nil
}
