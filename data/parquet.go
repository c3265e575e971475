package data

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/parquet-go/parquet-go"
)

// Parquet files (format "parquet") are read with github.com/parquet-go/parquet-go, the
// maintained successor of segmentio/parquet-go: it is pure Go (CGO_ENABLED=0 builds keep
// working), it decodes every codec the Hugging Face Hub's files use (snappy, zstd and gzip
// among them), dictionary and plain encodings, data pages v1 (pyarrow's default) and v2,
// and it reads a file through an io.ReaderAt one page at a time, so that only the pages
// of the text column being read are in memory, never a whole file or row group.
//
// The reader:
//
//   - Opens each file's footer, finds the text column (Source.TextKey, "text" when empty;
//     a dotted path "meta.body" names the leaf body of the struct column meta) and reads
//     that column alone, row group by row group and page by page, in file order: one
//     document per row. The other columns are never read.
//   - Reads a BYTE_ARRAY column: Arrow's string and large_string (both stored as
//     BYTE_ARRAY with the STRING annotation) and binary (BYTE_ARRAY without one). A value
//     with invalid UTF-8 has each invalid byte replaced by U+FFFD, as a jsonl string has,
//     with a warning naming the file, row group and row. Null rows are skipped and counted
//     (one line on Source.Log at the end of the walk); empty strings are skipped as empty
//     documents are in every format.
//   - Refuses, naming the file and what is wrong: a file that is not Parquet (no PAR1
//     magic; one that looks like JSON lines or a compressed file says which format reads
//     it), an encrypted one, a truncated one (no footer), a corrupt footer, a missing text
//     column (listing the file's columns), a column that is not text (naming its type), a
//     repeated (list) column (one text per row is read), and a corrupt page (naming the
//     row group and column). A panic of the library on input it does not expect is turned
//     into the same error.
//
// The tests write files with every codec above and with none (uncompressed), in the
// library and, for a committed fixture, with pyarrow (scripts/make_parquet_fixture.py):
// snappy, zstd, gzip and uncompressed are tested; brotli, lz4 and lz4_raw are decoded by
// the library but not tested here.

// parquetMagic starts and ends a Parquet file; parquetEncryptedMagic ends (and starts) one
// whose footer is encrypted.
var (
	parquetMagic          = []byte("PAR1")
	parquetEncryptedMagic = []byte("PARE")
)

// parquetReadBuffer is the buffer through which page headers and small pages are read.
const parquetReadBuffer = 64 << 10

// parquetValueBatch is how many values a page is read by at a time.
const parquetValueBatch = 256

// eachParquet calls fn with the text of each row of the Parquet file path, in file
// order: the value of the column Source.TextKey names, nulls skipped (and counted in
// w.parquetNulls). Errors from fn come back unchanged.
func (w *docWalk) eachParquet(path string, fn func(d []byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	size := fi.Size()
	if err := checkParquetEnds(f, path, size); err != nil {
		return err
	}
	counted := &countingReaderAt{r: f, onRead: w.onRead, size: size}
	defer counted.finish()
	var pf *parquet.File
	err = safely(func() error {
		var err error
		pf, err = parquet.OpenFile(counted, size,
			parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true), parquet.ReadBufferSize(parquetReadBuffer))
		return err
	})
	if err != nil {
		return fmt.Errorf("data: %s: corrupt Parquet footer (the file's metadata): %w", path, err)
	}
	key := w.key.path
	col, err := parquetTextColumn(pf, w.key.names)
	if err != nil {
		return fmt.Errorf("data: %s: %w", path, err)
	}
	check := textSample{}
	vals := make([]parquet.Value, parquetValueBatch)
	groups := pf.RowGroups()
	for gi, rg := range groups {
		where := func() string {
			return fmt.Sprintf("%s: row group %d (of %d), column %q", path, gi, len(groups), key)
		}
		chunks := rg.ColumnChunks()
		if col.Index() >= len(chunks) {
			return fmt.Errorf("data: %s: corrupt page: the row group has %d column chunks, and the column is number %d", where(), len(chunks), col.Index())
		}
		g := parquetGroup{w: w, where: where, check: &check, fn: fn, vals: vals}
		err := g.read(chunks[col.Index()].Pages())
		w.parquetNulls += g.nulls
		if g.nulls > 0 && !lastIs(w.parquetNullFiles, path) {
			w.parquetNullFiles = append(w.parquetNullFiles, path)
		}
		if err != nil {
			return err
		}
		if g.row != rg.NumRows() {
			return fmt.Errorf("data: %s: corrupt page: %d values for the row group's %d rows", where(), g.row, rg.NumRows())
		}
	}
	return nil
}

// parquetGroup reads the text column of one row group, page by page, calling fn with each
// row's text.
type parquetGroup struct {
	w          *docWalk
	where      func() string // the file, row group and column, for messages
	check      *textSample   // the file's first values, checked for binary data
	fn         func(d []byte) error
	row, nulls int64           // rows read so far, and of them null
	vals       []parquet.Value // a batch of values, shared by the file's row groups
	buf        []byte          // a value with invalid UTF-8, repaired
}

// read reads every page of pages (and closes them).
func (g *parquetGroup) read(pages parquet.Pages) error {
	defer safely(pages.Close)
	for {
		var page parquet.Page
		err := safely(func() error {
			var err error
			page, err = pages.ReadPage()
			return err
		})
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("data: %s: corrupt page: %w", g.where(), err)
		}
		err = g.page(page)
		parquet.Release(page)
		if err != nil {
			return err
		}
	}
}

// page reads the values of one page.
func (g *parquetGroup) page(page parquet.Page) error {
	values := page.Values()
	for {
		var n int
		rerr := safely(func() error {
			var err error
			n, err = values.ReadValues(g.vals)
			return err
		})
		if rerr != nil && rerr != io.EOF {
			return fmt.Errorf("data: %s: corrupt page: %w", g.where(), rerr)
		}
		if n == 0 && rerr == nil {
			return fmt.Errorf("data: %s: corrupt page: the reader gives no values and no end", g.where())
		}
		for _, v := range g.vals[:n] {
			if err := g.value(v); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			return nil
		}
	}
}

// value passes one row's value to fn: nulls counted and skipped, invalid UTF-8 repaired
// with a warning.
func (g *parquetGroup) value(v parquet.Value) error {
	r := g.row
	g.row++
	if v.IsNull() {
		g.nulls++
		return nil
	}
	d := v.ByteArray()
	valid := utf8.Valid(d)
	if !valid {
		g.w.warn(fmt.Sprintf("%s, row %d: invalid UTF-8 (read as U+FFFD)", g.where(), r))
	}
	if err := g.check.add(d, !valid); err != nil {
		return fmt.Errorf("data: %s: %w", g.where(), err)
	}
	if !valid {
		g.buf = appendValidUTF8(g.buf[:0], d)
		d = g.buf
	}
	return g.fn(d)
}

// lastIs reports whether the last element of s is v.
func lastIs(s []string, v string) bool {
	return len(s) > 0 && s[len(s)-1] == v
}

// textSample watches the first textCheckLen bytes of a column's values: a column where
// more than maxInvalidPercent of them are invalid UTF-8 holds binary data (images, say),
// not text, and is refused as a binary file read as text is.
type textSample struct {
	n, bad int
}

// add counts d, whose bytes are all valid UTF-8 unless invalid is set, and returns the
// error for a sample that is not text once it is complete.
func (s *textSample) add(d []byte, invalid bool) error {
	if s.n >= textCheckLen {
		return nil
	}
	d = d[:min(len(d), textCheckLen-s.n)]
	s.n += len(d)
	if invalid {
		bad, _ := invalidUTF8(d)
		s.bad += bad
	}
	if s.n >= textCheckLen && s.bad*100 > maxInvalidPercent*s.n {
		return fmt.Errorf("%d%% of the first 64 KiB of the column's values is not UTF-8 (more than %d%% is refused): it holds binary data, not text; name the text column with data.text_key",
			s.bad*100/s.n, maxInvalidPercent)
	}
	return nil
}

// safely calls f and turns a panic of the Parquet library (on input it does not expect,
// which a corrupt file can be) into an error.
func safely(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the Parquet reader failed on it: %v", p)
		}
	}()
	return f()
}

// checkParquetEnds checks the magic numbers that start and end a Parquet file and the
// footer length, so that a file that is not Parquet, or a truncated one, gets an error
// that says so.
func checkParquetEnds(f io.ReaderAt, path string, size int64) error {
	var head [sniffLen]byte
	hn, err := f.ReadAt(head[:], 0)
	if err != nil && err != io.EOF {
		return fmt.Errorf("data: read %s: %w", path, err)
	}
	h := head[:hn]
	switch {
	case size == 0:
		return fmt.Errorf("data: %s is empty, not a Parquet file", path)
	case bytes.HasPrefix(h, parquetEncryptedMagic):
		return fmt.Errorf("data: %s is an encrypted Parquet file (magic PARE), which is not read: decrypt it first", path)
	case !bytes.HasPrefix(h, parquetMagic):
		return fmt.Errorf("data: %s is not a Parquet file: it does not start with the PAR1 magic of one (it starts %s)", path, describeHead(h))
	case size < 12:
		return fmt.Errorf("data: %s is truncated: %d bytes, too short to hold a Parquet footer (an interrupted download?)", path, size)
	}
	var tail [8]byte
	if _, err := f.ReadAt(tail[:], size-8); err != nil {
		return fmt.Errorf("data: read %s: %w", path, err)
	}
	if !bytes.Equal(tail[4:], parquetMagic) {
		if bytes.Equal(tail[4:], parquetEncryptedMagic) {
			return fmt.Errorf("data: %s is a Parquet file with an encrypted footer (magic PARE), which is not read: decrypt it first", path)
		}
		return fmt.Errorf("data: %s is truncated: it starts as a Parquet file but does not end with the PAR1 magic of its footer (an interrupted download?)", path)
	}
	if n := int64(binary.LittleEndian.Uint32(tail[:4])); n > size-12 {
		return fmt.Errorf("data: %s is truncated or corrupt: its footer says it is %d bytes long, and the file has only %d bytes before it", path, n, size-12)
	}
	return nil
}

// describeHead says what a file that is not Parquet looks like from its first bytes, and
// which format reads it.
func describeHead(h []byte) string {
	t := bytes.TrimLeft(h, " \t\r\n")
	switch {
	case compression(h) != "":
		return fmt.Sprintf(`with the %s magic: compressed JSON lines are data.format = "jsonl" (or "c4")`, compression(h))
	case bytes.HasPrefix(h, []byte(shardMagic)):
		return `as a token shard: set data.format = "tokens"`
	case bytes.HasPrefix(t, []byte("{")):
		return `like JSON lines: set data.format = "jsonl"`
	case utf8.Valid(h) && bytes.IndexByte(h, 0) < 0:
		return fmt.Sprintf(`%q, like text: set data.format = "text" (or "jsonl" for JSON lines)`, h)
	}
	return fmt.Sprintf("% x", h)
}

// parquetTextColumn returns the leaf column of f that names (a path through struct
// columns) name, or an error saying why it cannot be read as text.
func parquetTextColumn(f *parquet.File, names []string) (*parquet.Column, error) {
	key := strings.Join(names, ".")
	c := f.Root()
	for _, seg := range names {
		next := c.Column(seg)
		if next == nil || c.Leaf() {
			return nil, fmt.Errorf("no column %q (data.text_key; a dotted path names a field of a struct column): the file's columns are %s",
				key, strings.Join(parquetColumns(f.Root()), ", "))
		}
		c = next
	}
	if !c.Leaf() {
		leaves := parquetColumns(c)
		if len(leaves) > 0 && strings.Contains(leaves[0], " repeated") {
			return nil, fmt.Errorf("column %q is a list (its leaves: %s), and one text per row is read: name a column of strings with data.text_key", key, strings.Join(leaves, ", "))
		}
		return nil, fmt.Errorf("column %q is a struct, not one column: name one of its fields with data.text_key (a dotted path): %s", key, strings.Join(leaves, ", "))
	}
	if c.MaxRepetitionLevel() > 0 {
		return nil, fmt.Errorf("column %q is repeated (a list), and one text per row is read: name a column of strings with data.text_key", key)
	}
	if c.Type().Kind() != parquet.ByteArray {
		return nil, fmt.Errorf("column %q is %s, not text (a string, large_string or binary column, BYTE_ARRAY in Parquet, is read): name the text column with data.text_key", key, parquetTypeName(c))
	}
	return c, nil
}

// parquetColumns lists the leaf columns below c (c itself if it is one) as dotted paths
// with their types.
func parquetColumns(c *parquet.Column) []string {
	if c.Leaf() {
		s := strings.Join(c.Path(), ".") + " (" + parquetTypeName(c)
		if c.MaxRepetitionLevel() > 0 {
			s += " repeated"
		}
		return []string{s + ")"}
	}
	var out []string
	for _, child := range c.Columns() {
		out = append(out, parquetColumns(child)...)
	}
	return out
}

// parquetTypeName names the type of the leaf column c: its physical type, and its logical
// type where it has one ("INT64", "BYTE_ARRAY STRING", "INT32 DATE").
func parquetTypeName(c *parquet.Column) string {
	t := c.Type()
	name := t.Kind().String()
	if lt := t.LogicalType(); lt != nil {
		if s := lt.String(); s != "" && s != "<nil>" {
			name += " " + s
		}
	}
	return name
}

// countingReaderAt counts the bytes read through it for a progress report: onRead hears
// of them as they are read, up to the file's size, and finish reports the rest of the file
// (the columns that were not read) once it is done, so that a file read counts its size.
type countingReaderAt struct {
	r        io.ReaderAt
	onRead   func(int64)
	size     int64
	reported int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	if c.onRead != nil && n > 0 {
		if k := min(int64(n), c.size-c.reported); k > 0 {
			c.reported += k
			c.onRead(k)
		}
	}
	return n, err
}

// finish reports the bytes of the file not read.
func (c *countingReaderAt) finish() {
	if c.onRead != nil && c.reported < c.size {
		c.onRead(c.size - c.reported)
		c.reported = c.size
	}
}
