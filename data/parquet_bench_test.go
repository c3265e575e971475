package data

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress"
)

// webText makes documents that compress about as web text does: words drawn from a
// vocabulary of made-up words with a skewed (roughly Zipf) frequency, in sentences and
// paragraphs, so that neither the jsonl nor the Parquet file is unrealistically small.
type webText struct {
	r     *rng
	vocab []string
}

func newWebText(seed uint64) *webText {
	r := newRNG(seed, 99, 0)
	w := &webText{r: r}
	const letters = "etaoinshrdlucmfwypvbgkjqxz"
	for range 5000 {
		n := 2 + r.intn(9)
		b := make([]byte, n)
		for i := range b {
			b[i] = letters[min(r.intn(len(letters)), r.intn(len(letters)))] // skewed to common letters
		}
		w.vocab = append(w.vocab, string(b))
	}
	return w
}

// doc returns a document of about n bytes.
func (w *webText) doc(n int) string {
	var b strings.Builder
	for b.Len() < n {
		for i, k := 0, 5+w.r.intn(20); i < k; i++ {
			v := w.vocab[min(w.r.intn(len(w.vocab)), w.r.intn(len(w.vocab)), w.r.intn(len(w.vocab)))]
			if i == 0 {
				v = strings.ToUpper(v[:1]) + v[1:]
			}
			b.WriteString(v)
			b.WriteByte(' ')
		}
		b.WriteString(". ")
		if w.r.intn(6) == 0 {
			b.WriteString("\n\n")
		}
	}
	return b.String()
}

// docLen returns a document length: 500 bytes to 6 KB, as web pages run (C4's and
// FineWeb's median is about 2 KB).
func (w *webText) docLen() int { return 500 + w.r.intn(2000) + w.r.intn(2000)*w.r.intn(3) }

// benchRow is a row of the benchmark's Parquet files: FineWeb's text and a few of its
// other columns, which the reader must skip.
type benchRow struct {
	Text  string  `parquet:"text" json:"text"`
	ID    string  `parquet:"id" json:"id"`
	URL   string  `parquet:"url" json:"url"`
	Score float64 `parquet:"score" json:"score"`
}

// writeBenchFiles writes about textBytes of documents as a Parquet file (codec, row groups
// of about rowGroupBytes of text) and, when jsonlPath is not empty, as zstd-compressed JSON
// lines with the same columns. Documents are made as they are written, so a large file
// needs little memory.
func writeBenchFiles(t testing.TB, parquetPath, jsonlPath string, textBytes, rowGroupBytes int64, codec compress.Codec) {
	t.Helper()
	pf, err := os.Create(parquetPath)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	pw := parquet.NewGenericWriter[benchRow](pf, parquet.Compression(codec), parquet.PageBufferSize(1<<20))
	var (
		jf  *os.File
		jz  *zstd.Encoder
		jb  *bufio.Writer
		enc *json.Encoder
	)
	if jsonlPath != "" {
		if jf, err = os.Create(jsonlPath); err != nil {
			t.Fatal(err)
		}
		defer jf.Close()
		if jz, err = zstd.NewWriter(jf); err != nil {
			t.Fatal(err)
		}
		jb = bufio.NewWriterSize(jz, 1<<20)
		enc = json.NewEncoder(jb)
	}
	gen := newWebText(1)
	var total, inGroup int64
	rows := make([]benchRow, 0, 256)
	flushRows := func() {
		if _, err := pw.Write(rows); err != nil {
			t.Fatal(err)
		}
		rows = rows[:0]
	}
	for i := 0; total < textBytes; i++ {
		row := benchRow{Text: gen.doc(gen.docLen()), ID: fmt.Sprintf("<urn:uuid:%08x-0000-4000-8000-%012x>", i, i*7919), URL: fmt.Sprintf("https://example.com/page/%d", i), Score: float64(i%1000) / 1000}
		total += int64(len(row.Text))
		inGroup += int64(len(row.Text))
		rows = append(rows, row)
		if enc != nil {
			if err := enc.Encode(row); err != nil {
				t.Fatal(err)
			}
		}
		if len(rows) == cap(rows) {
			flushRows()
		}
		if inGroup >= rowGroupBytes {
			flushRows()
			if err := pw.Flush(); err != nil {
				t.Fatal(err)
			}
			inGroup = 0
		}
	}
	flushRows()
	if err := pw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pf.Close(); err != nil {
		t.Fatal(err)
	}
	if enc != nil {
		if err := jb.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := jz.Close(); err != nil {
			t.Fatal(err)
		}
		if err := jf.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkTokenizeParquet tokenizes the same 32 MB of documents from a Parquet file
// (snappy, as the Hub's conversions are, and zstd) and from jsonl.zst, as data tokenize
// does (WriteShards, the byte tokenizer, so that reading dominates), alternating the two
// in each iteration of one run. It reports MB/s of text for each and their ratio
// (parquet/jsonl.zst; the goal is at least 1).
func BenchmarkTokenizeParquet(b *testing.B) {
	const textBytes = 32 << 20
	for _, codec := range []struct {
		name  string
		codec compress.Codec
	}{{"snappy", &parquet.Snappy}, {"zstd", &parquet.Zstd}} {
		b.Run(codec.name, func(b *testing.B) {
			dir := b.TempDir()
			pq, jl := filepath.Join(dir, "pq", "a.parquet"), filepath.Join(dir, "jl", "a.jsonl.zst")
			for _, d := range []string{filepath.Dir(pq), filepath.Dir(jl)} {
				if err := os.Mkdir(d, 0o755); err != nil {
					b.Fatal(err)
				}
			}
			writeBenchFiles(b, pq, jl, textBytes, 16<<20, codec.codec)
			var text [2]int64
			var took [2]time.Duration
			srcs := [2]Source{{Path: jl, Format: "jsonl"}, {Path: pq, Format: "parquet"}}
			b.ResetTimer()
			for b.Loop() {
				for i, src := range srcs {
					out := filepath.Join(dir, "out.tokens")
					start := time.Now()
					st, err := WriteShards(context.Background(), src, ByteTokenizer{}, ShardOptions{Out: out})
					took[i] += time.Since(start)
					if err != nil {
						b.Fatal(err)
					}
					text[i] += st.TextBytes
					os.Remove(out)
				}
			}
			if text[0] != text[1] {
				b.Fatalf("jsonl.zst gave %d bytes of text, Parquet %d", text[0], text[1])
			}
			mbs := func(i int) float64 { return float64(text[i]) / 1e6 / took[i].Seconds() }
			b.ReportMetric(mbs(0), "jsonl.zst-MB/s")
			b.ReportMetric(mbs(1), "parquet-MB/s")
			b.ReportMetric(mbs(1)/mbs(0), "parquet/jsonl.zst")
			if fi, err := os.Stat(jl); err == nil {
				b.ReportMetric(float64(fi.Size())/1e6, "jsonl.zst-MB")
			}
			if fi, err := os.Stat(pq); err == nil {
				b.ReportMetric(float64(fi.Size())/1e6, "parquet-MB")
			}
		})
	}
}

// peakSampler samples the heap in use (runtime.MemStats.HeapInuse) every interval until
// stop, keeping the largest value.
type peakSampler struct {
	peak atomic.Uint64
	done chan struct{}
	wg   sync.WaitGroup
}

func startPeakSampler(interval time.Duration) *peakSampler {
	s := &peakSampler{done: make(chan struct{})}
	s.wg.Go(func() {
		var ms runtime.MemStats
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > s.peak.Load() {
				s.peak.Store(ms.HeapInuse)
			}
			select {
			case <-s.done:
				return
			case <-t.C:
			}
		}
	})
	return s
}

func (s *peakSampler) stop() uint64 {
	close(s.done)
	s.wg.Wait()
	return s.peak.Load()
}

// vmHWM returns the process's peak resident set size (VmHWM of /proc/self/status), in
// bytes, or 0 where there is none.
func vmHWM() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// resetHWM resets VmHWM to the present resident set size (Linux 4.0 and later), reporting
// whether it could.
func resetHWM() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// TestParquetMemory reads a Parquet file through the walk that LoadTokens, ReadDocuments
// and WriteShards share and checks that what the reader holds stays under twice the
// file's largest row group (the goal; what a reader that loads a row group at a
// time, compressed and decompressed, would need). The reader holds one page of the text
// column at a time (its compressed bytes, its decompressed values, the library's read
// buffer), so its peak is a few pages, far under a row group of any size worth having.
//
// By default it writes 48 MB of text in row groups of 24 MB (about 12 MB each in the file,
// snappy) and measures the growth of the Go heap in use (sampled every millisecond) over
// the heap before the read. That growth is about 5 MB whatever the row group's size: a
// page of 1 MB compressed and decompressed, and the garbage of the pages already read,
// which counts until the collector frees it, at the heap's minimum target of 4 MB (GOGC
// lets garbage reach the live heap again, and the live heap is small). So the check has a
// margin of about 5× here, and a reader that held a row group would fail it. With
// DISTFLASH_PARQUET_MEM_BYTES (say 1e9) it writes a file of that much text in
// /tmp (row groups of DISTFLASH_PARQUET_MEM_ROWGROUP bytes of text, default 128 MB) and
// also reports the process's peak resident set size (VmHWM, reset before the read) over
// its size before the read; that size is skipped under -short.
func TestParquetMemory(t *testing.T) {
	textBytes, rowGroup := int64(48<<20), int64(24<<20)
	big := false
	if s := os.Getenv("DISTFLASH_PARQUET_MEM_BYTES"); s != "" {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("DISTFLASH_PARQUET_MEM_BYTES = %q: %v", s, err)
		}
		textBytes, rowGroup, big = int64(f), 128<<20, true
		if s := os.Getenv("DISTFLASH_PARQUET_MEM_ROWGROUP"); s != "" {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatalf("DISTFLASH_PARQUET_MEM_ROWGROUP = %q: %v", s, err)
			}
			rowGroup = int64(f)
		}
		if testing.Short() {
			t.Skipf("DISTFLASH_PARQUET_MEM_BYTES = %s: a large file is not written under -short", s)
		}
	}
	path := filepath.Join(t.TempDir(), "mem.parquet")
	start := time.Now()
	writeBenchFiles(t, path, "", textBytes, rowGroup, &parquet.Snappy)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s: %.1f MB on disk, %.1f MB of text, in %v", path, float64(fi.Size())/1e6, float64(textBytes)/1e6, time.Since(start).Round(time.Millisecond))

	// The largest row group: its bytes in the file (all columns, compressed) and its text
	// column's bytes, compressed and not.
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	pf, err := parquet.OpenFile(f, fi.Size())
	if err != nil {
		t.Fatal(err)
	}
	var groupDisk, textDisk, textRaw int64
	for _, rg := range pf.Metadata().RowGroups {
		var disk int64
		for _, c := range rg.Columns {
			disk += c.MetaData.TotalCompressedSize
			if c.MetaData.PathInSchema[0] == "text" && c.MetaData.TotalCompressedSize > textDisk {
				textDisk, textRaw = c.MetaData.TotalCompressedSize, c.MetaData.TotalUncompressedSize
			}
		}
		groupDisk = max(groupDisk, disk)
	}
	groups := len(pf.Metadata().RowGroups)
	f.Close()
	pf = nil

	runtime.GC()
	debug.FreeOSMemory()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	hwmOK := resetHWM()
	rssBefore := vmHWM()
	w, err := newDocWalk(Source{Path: path, Format: "parquet"}, false)
	if err != nil {
		t.Fatal(err)
	}
	sampler := startPeakSampler(time.Millisecond)
	var read int64
	start = time.Now()
	docs, err := w.each(func(d []byte) error {
		read += int64(len(d))
		return nil
	})
	elapsed := time.Since(start)
	peak := sampler.stop()
	if err != nil {
		t.Fatal(err)
	}
	if read < textBytes {
		t.Fatalf("read %d bytes of text, wrote %d", read, textBytes)
	}
	heapGrowth := int64(peak) - int64(before.HeapInuse)
	t.Logf("read %d documents, %.1f MB of text, in %v (%.0f MB/s); %d row groups, the largest %.1f MB in the file (its text column %.1f MB compressed, %.1f MB not)",
		docs, float64(read)/1e6, elapsed.Round(time.Millisecond), float64(read)/1e6/elapsed.Seconds(), groups, float64(groupDisk)/1e6, float64(textDisk)/1e6, float64(textRaw)/1e6)
	t.Logf("peak heap in use %.1f MB over %.1f MB before the read: %.1f MB, %.2f× the largest row group in the file, %.2f× its uncompressed text",
		float64(peak)/1e6, float64(before.HeapInuse)/1e6, float64(heapGrowth)/1e6, float64(heapGrowth)/float64(groupDisk), float64(heapGrowth)/float64(textRaw))
	if hwmOK {
		rss := vmHWM() - rssBefore
		t.Logf("peak resident set %.1f MB over %.1f MB before the read: %.1f MB, %.2f× the largest row group in the file",
			float64(vmHWM())/1e6, float64(rssBefore)/1e6, float64(rss)/1e6, float64(rss)/float64(groupDisk))
		if big && rss >= 2*groupDisk {
			t.Errorf("the read grew the resident set by %d bytes, not under twice the largest row group (%d bytes)", rss, groupDisk)
		}
	}
	if heapGrowth >= 2*groupDisk {
		t.Errorf("the read grew the heap in use by %d bytes, not under twice the largest row group (%d bytes in the file)", heapGrowth, groupDisk)
	}
}
