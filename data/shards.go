package data

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"io"
	"math"
	"os"
	"slices"
	"unicode/utf8"
)

// A token shard is a file of token ids with a small header, written by ShardWriter (and by
// WriteShards, for `distflash data tokenize`) and read by ReadShard and by LoadTokens with
// format "tokens". All integers are little-endian. Version 3, the one written:
//
//	offset  size  field
//	0       8     magic "DFTOK1\x00\x00"
//	8       4     version (3)
//	12      4     bytes per token: 2 (uint16, vocabularies up to 65536) or 4 (uint32)
//	16      4     vocabulary size: every token is below it
//	20      4     header size: offset of the first token, a multiple of 8
//	24      8     number of tokens
//	32      8     number of documents
//	40      8     bytes of text the tokens encode, a DocSeparator between documents included
//	48      8     tokenizer fingerprint (TokenizerFingerprint)
//	56      4     CRC-32C (Castagnoli) of the body: the bytes from the header size to the end
//	60      4     CRC-32C of the header: its header-size bytes with this field zeroed
//	64      2     length n of the tokenizer name
//	66      n     tokenizer name (Tokenizer.Name), UTF-8
//	66+n          zero bytes up to the header size
//	header  ...   the tokens, bytes per token each
//	...     8×D   the document table: for each of the D documents, a uint64, the index among
//	              the shard's tokens of the document's first token
//
// The document table records where each document starts, as Megatron-LM's indexed
// datasets keep document indices beside their token buffer, rather than a convention that
// some token ends a document: the separator between documents is the encoding of
// DocSeparator, which a document may hold too. Document 0 starts at 0, and document i > 0
// right after the separator that ends document i-1; so document i's tokens run from its
// start to the next document's start less the separator (to the end for the last), and
// LoadTokens can join the documents with a boundary token instead (Source.Boundary,
// data.document_mask).
//
// The header's checksum is verified whenever a header is read, the body's whenever the
// tokens are: a damaged shard is an error naming the file and "checksum mismatch", never a
// stream of wrong tokens. Version 2 has the same header but no document table, and its
// body checksum covers the tokens alone; it is still read, but cannot be read with a
// document boundary. Version 1, written before checksums, has no checksum fields: the name
// length is at offset 56 and the name at 58. It is still read (ShardHeader.Version says
// which; LoadTokens warns on Source.Log that its tokens are not verified).
//
// A shard holds whole documents: their tokens, with the encoding of DocSeparator between
// consecutive ones, exactly as LoadTokens would put them in its stream. The file size is
// the header size plus tokens × bytes per token (plus 8 × documents in version 3); anything
// else is a truncated or foreign file.
const (
	shardMagic      = "DFTOK1\x00\x00"
	shardVersion    = 3    // the version written
	shardDocsFrom   = 3    // the first version with a document table
	shardFixedSize  = 66   // versions 2 and 3's header bytes before the tokenizer name
	shardFixedV1    = 58   // version 1's
	maxShardNameLen = 1024 // longest tokenizer name a shard header holds
)

// crcTable is the CRC-32C (Castagnoli) table of the shards' checksums.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// ShardHeader describes a token shard; see ReadShardHeader.
type ShardHeader struct {
	Version     int    // format version: 3; 2 for a shard without a document table; 1 for one without checksums either
	TokenBytes  int    // bytes per token on disk: 2 (uint16) or 4 (uint32)
	VocabSize   int    // vocabulary size of the tokenizer; every token is below it
	HeaderSize  int64  // offset of the first token
	Tokens      int64  // number of tokens
	Documents   int64  // number of documents
	TextBytes   int64  // bytes of text the tokens encode, DocSeparators between documents included
	Fingerprint uint64 // TokenizerFingerprint of the tokenizer that wrote the shard
	Tokenizer   string // Name of the tokenizer that wrote the shard
	Checksum    uint32 // CRC-32C of the body as stored: tokens and document table (versions 2 and 3; 0 in version 1)
}

// HasDocStarts reports whether the shard records where its documents start (version 3 on).
func (h ShardHeader) HasDocStarts() bool { return h.Version >= shardDocsFrom }

// tableBytes returns the size of the shard's document table: 8 bytes a document from
// version 3 on, none before.
func (h ShardHeader) tableBytes() int64 {
	if h.HasDocStarts() {
		return 8 * h.Documents
	}
	return 0
}

// tokenBytes returns the bytes per token of a shard for a vocabulary: 2 up to 65536 ids,
// else 4.
func tokenBytes(vocab int) int {
	if vocab <= 1<<16 {
		return 2
	}
	return 4
}

// fingerprintProbe is the text TokenizerFingerprint encodes: ASCII words, digits, runs of
// spaces, tabs and newlines, punctuation, code, and multi-byte UTF-8 (accents, CJK, emoji).
const fingerprintProbe = "The quick brown fox jumps over the lazy dog. 0123456789 3.14159\n" +
	"    indented\tTabbed  double  spaced\r\n\n" +
	"func main() { fmt.Println(\"héllo, wörld\") } // x += y[i] * 2;\n" +
	"Ünïcödé naïveté café — 日本語のテキスト, 中文文本, 한국어 텍스트 😀🚀 ∑∫√∞ ﬁ\n" +
	"<html><body class=\"x\">&amp;</body></html> https://example.com/a?b=c&d=e#f"

// TokenizerFingerprint is a 64-bit FNV-1a hash of a tokenizer's name, its vocabulary size and
// the tokens it encodes a fixed probe text into. Two tokenizers that agree on all three
// almost surely tokenize alike; two SentencePiece models with the same name and vocabulary
// size but different pieces get different fingerprints.
func TokenizerFingerprint(tok Tokenizer) uint64 {
	h := fnv.New64a()
	var b [8]byte
	h.Write([]byte(tok.Name()))
	h.Write([]byte{0})
	binary.LittleEndian.PutUint64(b[:], uint64(tok.VocabSize()))
	h.Write(b[:])
	for _, id := range tok.Encode([]byte(fingerprintProbe)) {
		binary.LittleEndian.PutUint32(b[:4], uint32(id))
		h.Write(b[:4])
	}
	return h.Sum64()
}

// encode returns the header's bytes in version 2 and 3's layout, padded to h.HeaderSize, with
// the header's checksum.
func (h ShardHeader) encode() []byte {
	b := make([]byte, h.HeaderSize)
	copy(b, shardMagic)
	le := binary.LittleEndian
	le.PutUint32(b[8:], uint32(h.Version))
	le.PutUint32(b[12:], uint32(h.TokenBytes))
	le.PutUint32(b[16:], uint32(h.VocabSize))
	le.PutUint32(b[20:], uint32(h.HeaderSize))
	le.PutUint64(b[24:], uint64(h.Tokens))
	le.PutUint64(b[32:], uint64(h.Documents))
	le.PutUint64(b[40:], uint64(h.TextBytes))
	le.PutUint64(b[48:], h.Fingerprint)
	le.PutUint32(b[56:], h.Checksum)
	le.PutUint16(b[64:], uint16(len(h.Tokenizer)))
	copy(b[shardFixedSize:], h.Tokenizer)
	le.PutUint32(b[60:], crc32.Checksum(b, crcTable)) // computed with the field still zero
	return b
}

// headerSize returns the version 2 and 3 header size for a tokenizer name of n bytes.
func headerSize(n int) int64 {
	return headerSizeFor(shardFixedSize, n)
}

// headerSizeFor returns the header size for fixed bytes before a tokenizer name of n bytes.
func headerSizeFor(fixed, n int) int64 {
	return int64(fixed+n+7) &^ 7
}

// ReadShardHeader reads and checks the header of the token shard at path (its checksum
// too, in version 2), and checks that the file's size is what the header says: a file that
// is not a shard, of another version, damaged, truncated or with bytes after its tokens is
// an error that says which. It does not read the tokens, so it does not verify their
// checksum; ReadShard does.
func ReadShardHeader(path string) (ShardHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return ShardHeader{}, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	return readShardHeader(f, path)
}

// readShardHeader reads the header of the shard open as f, leaving f at its first token.
func readShardHeader(f *os.File, path string) (ShardHeader, error) {
	fi, err := f.Stat()
	if err != nil {
		return ShardHeader{}, fmt.Errorf("data: %w", err)
	}
	size := fi.Size()
	fixed := make([]byte, shardFixedSize)
	n, err := f.ReadAt(fixed, 0)
	if err != nil && err != io.EOF {
		return ShardHeader{}, fmt.Errorf("data: read token shard %s: %w", path, err)
	}
	if n < len(shardMagic) || string(fixed[:len(shardMagic)]) != shardMagic {
		what := ""
		switch head := fixed[:n]; {
		case bytes.HasPrefix(head, gzipMagic):
			what = " (it is gzip-compressed: format \"c4\" or \"jsonl\" reads it)"
		case bytes.HasPrefix(head, zstdMagic):
			what = " (it is zstd-compressed: format \"c4\" or \"jsonl\" reads it)"
		case bytes.HasPrefix(bytes.TrimSpace(head), []byte("{")):
			what = " (it looks like JSON: format \"c4\" or \"jsonl\" reads it)"
		}
		return ShardHeader{}, fmt.Errorf("data: %s is not a token shard: it starts with %q, want the magic %q%s; shards are written by distflash data tokenize",
			path, fixed[:min(n, len(shardMagic))], shardMagic, what)
	}
	if n < 12 {
		return ShardHeader{}, fmt.Errorf("data: token shard %s is truncated: %d bytes, shorter than a header", path, size)
	}
	le := binary.LittleEndian
	h := ShardHeader{
		Version:     int(le.Uint32(fixed[8:])),
		TokenBytes:  int(le.Uint32(fixed[12:])),
		VocabSize:   int(le.Uint32(fixed[16:])),
		HeaderSize:  int64(le.Uint32(fixed[20:])),
		Fingerprint: le.Uint64(fixed[48:]),
	}
	fixedLen, nameLenAt := shardFixedSize, 64
	switch h.Version {
	case 1:
		fixedLen, nameLenAt = shardFixedV1, 56
	case 2, shardVersion:
	default:
		return ShardHeader{}, fmt.Errorf("data: token shard %s has version %d: this build reads versions 1 to %d (a newer distflash wrote it, or the file is damaged)", path, h.Version, shardVersion)
	}
	if n < fixedLen {
		return ShardHeader{}, fmt.Errorf("data: token shard %s is truncated: %d bytes, shorter than the %d-byte header", path, size, fixedLen)
	}
	nameLen := int(le.Uint16(fixed[nameLenAt:]))
	if h.Version >= 2 {
		// Verify the header's checksum before trusting any of its fields. Its length is
		// the header size field's, unless that is out of range (then the name's).
		hl := h.HeaderSize
		if hl < shardFixedSize || hl > headerSize(maxShardNameLen) {
			hl = headerSize(min(nameLen, maxShardNameLen))
		}
		if size < hl {
			return ShardHeader{}, fmt.Errorf("data: token shard %s is truncated: %d bytes, shorter than its %d-byte header", path, size, hl)
		}
		head := make([]byte, hl)
		if _, err := f.ReadAt(head, 0); err != nil {
			return ShardHeader{}, fmt.Errorf("data: read token shard %s: %w", path, err)
		}
		stored := le.Uint32(head[60:])
		clear(head[60:64])
		if got := crc32.Checksum(head, crcTable); got != stored {
			return ShardHeader{}, fmt.Errorf("data: token shard %s: header checksum mismatch (CRC-32C %08x, the header says %08x): the file is damaged; write it again with distflash data tokenize",
				path, got, stored)
		}
		h.Checksum = le.Uint32(fixed[56:])
	}
	counts := [3]uint64{le.Uint64(fixed[24:]), le.Uint64(fixed[32:]), le.Uint64(fixed[40:])}
	for i, name := range []string{"token", "document", "text byte"} {
		if counts[i] > math.MaxInt64 {
			return ShardHeader{}, fmt.Errorf("data: token shard %s: header's %s count %d is out of range", path, name, counts[i])
		}
	}
	h.Tokens, h.Documents, h.TextBytes = int64(counts[0]), int64(counts[1]), int64(counts[2])
	switch {
	case h.TokenBytes != 2 && h.TokenBytes != 4:
		return ShardHeader{}, fmt.Errorf("data: token shard %s: %d bytes per token: want 2 (uint16) or 4 (uint32)", path, h.TokenBytes)
	case h.VocabSize <= 0:
		return ShardHeader{}, fmt.Errorf("data: token shard %s: vocabulary size %d: must be > 0", path, h.VocabSize)
	case h.TokenBytes == 2 && h.VocabSize > 1<<16:
		return ShardHeader{}, fmt.Errorf("data: token shard %s: vocabulary size %d does not fit 2-byte tokens (at most 65536)", path, h.VocabSize)
	case nameLen == 0 || nameLen > maxShardNameLen:
		return ShardHeader{}, fmt.Errorf("data: token shard %s: tokenizer name of %d bytes: want 1 to %d", path, nameLen, maxShardNameLen)
	case h.HeaderSize != headerSizeFor(fixedLen, nameLen):
		return ShardHeader{}, fmt.Errorf("data: token shard %s: header size %d, want %d for a %d-byte tokenizer name", path, h.HeaderSize, headerSizeFor(fixedLen, nameLen), nameLen)
	case size < h.HeaderSize:
		return ShardHeader{}, fmt.Errorf("data: token shard %s is truncated: %d bytes, shorter than its %d-byte header", path, size, h.HeaderSize)
	}
	name := make([]byte, nameLen)
	if _, err := f.ReadAt(name, int64(fixedLen)); err != nil {
		return ShardHeader{}, fmt.Errorf("data: read token shard %s: %w", path, err)
	}
	h.Tokenizer = string(name)
	if !utf8.ValidString(h.Tokenizer) {
		return ShardHeader{}, fmt.Errorf("data: token shard %s: tokenizer name %q is not UTF-8", path, h.Tokenizer)
	}
	if h.Tokens > (math.MaxInt64-h.HeaderSize)/int64(h.TokenBytes) {
		return ShardHeader{}, fmt.Errorf("data: token shard %s: header's token count %d is out of range", path, h.Tokens)
	}
	want := h.HeaderSize + h.Tokens*int64(h.TokenBytes)
	table := ""
	if h.HasDocStarts() {
		if h.Documents > (math.MaxInt64-want)/8 {
			return ShardHeader{}, fmt.Errorf("data: token shard %s: header's document count %d is out of range", path, h.Documents)
		}
		if h.Documents == 0 && h.Tokens > 0 {
			return ShardHeader{}, fmt.Errorf("data: token shard %s: header says %d tokens but no documents", path, h.Tokens)
		}
		want += h.tableBytes()
		table = fmt.Sprintf(" and a table of %d document starts of 8 bytes", h.Documents)
	}
	if size < want {
		return ShardHeader{}, fmt.Errorf("data: token shard %s is truncated: its header says %d tokens of %d bytes%s after a %d-byte header, %d bytes in all, but the file has %d",
			path, h.Tokens, h.TokenBytes, table, h.HeaderSize, want, size)
	}
	if size > want {
		return ShardHeader{}, fmt.Errorf("data: token shard %s has %d bytes after its end: its header says %d tokens of %d bytes%s after a %d-byte header, %d bytes in all",
			path, size-want, h.Tokens, h.TokenBytes, table, h.HeaderSize, want)
	}
	if _, err := f.Seek(h.HeaderSize, io.SeekStart); err != nil {
		return ShardHeader{}, fmt.Errorf("data: read token shard %s: %w", path, err)
	}
	return h, nil
}

// ReadShard reads the token shard at path: its header (checked as by ReadShardHeader) and
// its tokens, whose checksum must match the header's (versions 2 and 3, the document table
// included in 3) and each of which must be below the header's vocabulary size.
func ReadShard(path string) (ShardHeader, []int32, error) {
	h, toks, _, err := appendShard(nil, path)
	return h, toks, err
}

// ReadShardDocuments is ReadShard that also returns the shard's document table (version 3):
// starts[i] is the index in tokens of document i's first token. It is nil for versions 1
// and 2, which do not record where documents start (ShardHeader.HasDocStarts). The table
// is checked: document 0 starts at 0 and the starts do not decrease nor pass the tokens.
func ReadShardDocuments(path string) (h ShardHeader, tokens []int32, starts []int64, err error) {
	return appendShard(nil, path)
}

// appendShard reads the shard at path, appends its tokens to dst and returns its document
// table (nil before version 3).
func appendShard(dst []int32, path string) (ShardHeader, []int32, []int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return ShardHeader{}, dst, nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	h, err := readShardHeader(f, path)
	if err != nil {
		return h, dst, nil, err
	}
	if h.Tokens > int64(math.MaxInt-len(dst)) {
		return h, dst, nil, fmt.Errorf("data: token shard %s: %d tokens do not fit in memory", path, h.Tokens)
	}
	start := len(dst)
	dst = slices.Grow(dst, int(h.Tokens))[:start+int(h.Tokens)]
	out := dst[start:]
	buf := make([]byte, min(1<<20, max(len(out)*h.TokenBytes, 8)))
	var crc uint32
	for i := 0; i < len(out); {
		n := min(len(out)-i, len(buf)/h.TokenBytes)
		chunk := buf[:n*h.TokenBytes]
		if _, err := io.ReadFull(f, chunk); err != nil {
			return h, dst[:start], nil, fmt.Errorf("data: read token shard %s: %w", path, err)
		}
		crc = crc32.Update(crc, crcTable, chunk)
		if h.TokenBytes == 2 {
			for j := range n {
				out[i+j] = int32(binary.LittleEndian.Uint16(chunk[2*j:]))
			}
		} else {
			for j := range n {
				out[i+j] = int32(binary.LittleEndian.Uint32(chunk[4*j:]))
			}
		}
		i += n
	}
	var starts []int64
	if h.HasDocStarts() {
		if h.Documents > int64(math.MaxInt/8) {
			return h, dst[:start], nil, fmt.Errorf("data: token shard %s: %d documents do not fit in memory", path, h.Documents)
		}
		starts = make([]int64, h.Documents)
		for i := 0; i < len(starts); {
			n := min(len(starts)-i, len(buf)/8)
			chunk := buf[:8*n]
			if _, err := io.ReadFull(f, chunk); err != nil {
				return h, dst[:start], nil, fmt.Errorf("data: read token shard %s: %w", path, err)
			}
			crc = crc32.Update(crc, crcTable, chunk)
			for j := range n {
				starts[i+j] = int64(binary.LittleEndian.Uint64(chunk[8*j:]))
			}
			i += n
		}
	}
	if h.Version >= 2 && crc != h.Checksum {
		what := fmt.Sprintf("its %d tokens", h.Tokens)
		if h.HasDocStarts() {
			what += fmt.Sprintf(" and %d document starts", h.Documents)
		}
		return h, dst[:start], nil, fmt.Errorf("data: token shard %s: checksum mismatch: %s have CRC-32C %08x, the header says %08x: the file is damaged; write it again with distflash data tokenize",
			path, what, crc, h.Checksum)
	}
	for i, id := range out {
		if id < 0 || int(id) >= h.VocabSize {
			return h, dst[:start], nil, fmt.Errorf("data: token shard %s: token %d (at byte %d) is %d, outside the vocabulary [0, %d)",
				path, i, h.HeaderSize+int64(i)*int64(h.TokenBytes), uint32(id), h.VocabSize)
		}
	}
	for i, s := range starts {
		switch {
		case i == 0 && s != 0:
			return h, dst[:start], nil, fmt.Errorf("data: token shard %s: document table: document 0 starts at token %d, want 0", path, s)
		case s < 0 || s > h.Tokens:
			return h, dst[:start], nil, fmt.Errorf("data: token shard %s: document table: document %d starts at token %d, outside the %d tokens", path, i, uint64(s), h.Tokens)
		case i > 0 && s < starts[i-1]:
			return h, dst[:start], nil, fmt.Errorf("data: token shard %s: document table: document %d starts at token %d, before document %d (at %d)", path, i, s, i-1, starts[i-1])
		}
	}
	return h, dst, starts, nil
}

// ShardWriter writes one token shard. It writes to path+".tmp" and renames the file to path
// in Close, so a shard under its own name is always complete.
type ShardWriter struct {
	path   string
	f      *os.File
	w      *bufio.Writer
	h      ShardHeader
	sep    []int32
	buf    []byte
	starts []int64 // the document table
}

// CreateShard starts a token shard at path for tokens of tok. The file must not exist.
func CreateShard(path string, tok Tokenizer) (*ShardWriter, error) {
	name := tok.Name()
	vocab := tok.VocabSize()
	if name == "" || len(name) > maxShardNameLen || !utf8.ValidString(name) {
		return nil, fmt.Errorf("data: create token shard %s: tokenizer name %q: want 1 to %d bytes of UTF-8", path, name, maxShardNameLen)
	}
	if vocab <= 0 || int64(vocab) > math.MaxUint32 {
		return nil, fmt.Errorf("data: create token shard %s: vocabulary size %d: want 1 to %d", path, vocab, uint32(math.MaxUint32))
	}
	if _, err := os.Lstat(path); err == nil {
		return nil, fmt.Errorf("data: create token shard %s: the file exists; remove it or write elsewhere", path)
	}
	h := ShardHeader{Version: shardVersion, TokenBytes: tokenBytes(vocab), VocabSize: vocab,
		HeaderSize: headerSize(len(name)), Fingerprint: TokenizerFingerprint(tok), Tokenizer: name}
	f, err := os.OpenFile(path+".tmp", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data: create token shard: %w", err)
	}
	w := &ShardWriter{path: path, f: f, w: bufio.NewWriterSize(f, 1<<20), h: h, sep: tok.Encode([]byte{DocSeparator})}
	if _, err := w.w.Write(h.encode()); err != nil { // counts are filled in by Close
		w.Abort()
		return nil, fmt.Errorf("data: write token shard %s: %w", w.f.Name(), err)
	}
	return w, nil
}

// WriteDocument appends a document: the encoding of DocSeparator when the shard already
// holds a document, then tokens, the encoding of textBytes bytes of text. Every token must be
// in [0, VocabSize).
func (w *ShardWriter) WriteDocument(tokens []int32, textBytes int) error {
	for i, id := range tokens {
		if id < 0 || int(id) >= w.h.VocabSize {
			return fmt.Errorf("data: write token shard %s: token %d of document %d is %d, outside the vocabulary [0, %d) of tokenizer %q",
				w.path, i, w.h.Documents, id, w.h.VocabSize, w.h.Tokenizer)
		}
	}
	if w.h.Documents > 0 {
		if err := w.write(w.sep); err != nil {
			return err
		}
		w.h.TextBytes++
	}
	w.starts = append(w.starts, w.h.Tokens)
	if err := w.write(tokens); err != nil {
		return err
	}
	w.h.Documents++
	w.h.TextBytes += int64(textBytes)
	return nil
}

// write appends tokens to the file.
func (w *ShardWriter) write(tokens []int32) error {
	w.buf = w.buf[:0]
	for _, id := range tokens {
		if w.h.TokenBytes == 2 {
			w.buf = binary.LittleEndian.AppendUint16(w.buf, uint16(id))
		} else {
			w.buf = binary.LittleEndian.AppendUint32(w.buf, uint32(id))
		}
	}
	if _, err := w.w.Write(w.buf); err != nil {
		return fmt.Errorf("data: write token shard %s: %w", w.f.Name(), err)
	}
	w.h.Checksum = crc32.Update(w.h.Checksum, crcTable, w.buf)
	w.h.Tokens += int64(len(tokens))
	return nil
}

// Size is the bytes the shard will take when closed as it stands: its header, the tokens it
// has been given (on disk or still buffered) and the document table Close writes.
func (w *ShardWriter) Size() int64 {
	return w.h.HeaderSize + w.h.Tokens*int64(w.h.TokenBytes) + 8*int64(len(w.starts))
}

// Header returns the header the shard has so far: its counts and checksum grow with each
// document (the checksum covers the document table only once Close has written it).
func (w *ShardWriter) Header() ShardHeader { return w.h }

// Close writes the document table, the header's counts and checksums, closes the file and
// renames it to its path. On error the temporary file is removed.
func (w *ShardWriter) Close() error {
	w.buf = w.buf[:0]
	for _, s := range w.starts {
		w.buf = binary.LittleEndian.AppendUint64(w.buf, uint64(s))
	}
	_, err := w.w.Write(w.buf)
	w.h.Checksum = crc32.Update(w.h.Checksum, crcTable, w.buf)
	if err == nil {
		err = w.w.Flush()
	}
	if err == nil {
		_, err = w.f.WriteAt(w.h.encode(), 0)
	}
	if err == nil {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(w.f.Name(), w.path)
	}
	if err != nil {
		os.Remove(w.f.Name())
		return fmt.Errorf("data: close token shard %s: %w", w.path, err)
	}
	return nil
}

// Abort closes and removes the unfinished shard.
func (w *ShardWriter) Abort() {
	w.f.Close()
	os.Remove(w.f.Name())
}

// checkShardTokenizer returns an error, naming both tokenizers, when the shard h was not
// written by tok.
func checkShardTokenizer(h ShardHeader, path string, tok Tokenizer) error {
	if h.Fingerprint == TokenizerFingerprint(tok) && h.VocabSize == tok.VocabSize() && h.Tokenizer == tok.Name() {
		return nil
	}
	why := ""
	if h.Tokenizer == tok.Name() && h.VocabSize == tok.VocabSize() {
		why = ": the names and vocabulary sizes agree, but the two tokenize a probe text differently (fingerprints %016x and %016x)"
		why = fmt.Sprintf(why, h.Fingerprint, TokenizerFingerprint(tok))
	}
	return fmt.Errorf("data: token shard %s was written by tokenizer %q (vocabulary %d), but the configured tokenizer is %q (vocabulary %d)%s; re-run distflash data tokenize with this tokenizer, or configure the shard's",
		path, h.Tokenizer, h.VocabSize, tok.Name(), tok.VocabSize(), why)
}
