package data

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// c4Server serves generated gzip files of C4's validation split at /en/NAME, as the
// Hugging Face Hub does, and records the requests.
type c4Server struct {
	*httptest.Server
	files map[string][]byte // name -> content

	mu       sync.Mutex
	requests []string // "NAME RANGE" of each request
	// handle, when set, answers a request instead of http.ServeContent (which honours
	// Range); n counts the requests for this name so far, from 1.
	handle func(w http.ResponseWriter, r *http.Request, name string, content []byte, n int) bool
}

func newC4Server(t *testing.T) *c4Server {
	s := &c4Server{files: map[string][]byte{}}
	for i := range 8 {
		name, err := C4FileName("validation", i)
		if err != nil {
			t.Fatal(err)
		}
		var docs []string
		for j := range 40 + 20*i {
			docs = append(docs, fmt.Sprintf("validation file %d document %d: %s", i, j, strings.Repeat("words ", j)))
		}
		s.files[name] = gzipData(t, c4Lines(t, docs...))
	}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, ok := strings.CutPrefix(r.URL.Path, "/en/")
		content, found := s.files[name]
		s.mu.Lock()
		s.requests = append(s.requests, strings.TrimSpace(name+" "+r.Header.Get("Range")))
		n := 0
		for _, q := range s.requests {
			if strings.HasPrefix(q, name) {
				n++
			}
		}
		handle := s.handle
		s.mu.Unlock()
		if !ok || !found {
			http.NotFound(w, r)
			return
		}
		if handle != nil && handle(w, r, name, content, n) {
			return
		}
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(content))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *c4Server) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// checkFetched checks that dir holds exactly the named files with the server's content.
func checkFetched(t *testing.T, s *c4Server, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, names) {
		t.Fatalf("%s holds %q, want %q", dir, got, names)
	}
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, s.files[name]) {
			t.Errorf("%s: %d bytes differ from the server's %d", name, len(b), len(s.files[name]))
		}
	}
}

const (
	val0 = "c4-validation.00000-of-00008.json.gz"
	val1 = "c4-validation.00001-of-00008.json.gz"
	val2 = "c4-validation.00002-of-00008.json.gz"
)

func TestFetchC4(t *testing.T) {
	s := newC4Server(t)
	dir := filepath.Join(t.TempDir(), "c4")
	var final []FetchProgress
	opt := FetchOptions{Split: "validation", First: 1, Shards: 2, Dir: dir, BaseURL: s.URL + "/",
		Progress: func(p FetchProgress) {
			if p.Final {
				final = append(final, p)
			}
		}}
	paths, err := FetchC4(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, val1), filepath.Join(dir, val2)}; !slices.Equal(paths, want) {
		t.Errorf("paths %q, want %q", paths, want)
	}
	checkFetched(t, s, dir, val1, val2)
	if len(final) != 2 || final[0].Total != int64(len(s.files[val1])) || final[1].Index != 1 || final[1].Count != 2 || final[0].Skipped {
		t.Errorf("final progress reports %+v", final)
	}
	// Again: complete files are skipped without a request.
	final = nil
	before := len(s.seen())
	if _, err := FetchC4(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	if n := len(s.seen()) - before; n != 0 || len(final) != 2 || !final[0].Skipped {
		t.Errorf("second run made %d requests, reports %+v; want none, two skipped", n, final)
	}
	// The files read as C4.
	docs, err := ReadDocuments(Source{Path: dir, Format: "c4"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 60+80 || !strings.HasPrefix(string(docs[0]), "validation file 1 document 0") {
		t.Errorf("read %d documents, the first %.40q; want 140 starting with file 1's", len(docs), docs[0])
	}
}

// cutHalf answers the first request for each file with half the body (and the full
// Content-Length), then drops the connection, as a network failure would.
func cutHalf(w http.ResponseWriter, r *http.Request, name string, content []byte, n int) bool {
	if n > 1 {
		return false
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(content)))
	w.WriteHeader(http.StatusOK)
	w.Write(content[:len(content)/2])
	return true // the handler returns short of Content-Length: the server closes the connection
}

func TestFetchC4ResumeNextRun(t *testing.T) {
	s := newC4Server(t)
	s.handle = cutHalf
	dir := t.TempDir()
	opt := FetchOptions{Split: "validation", Shards: 1, Dir: dir, BaseURL: s.URL, Retries: -1}
	_, err := FetchC4(context.Background(), opt)
	half := len(s.files[val0]) / 2
	for _, want := range []string{"data: fetch " + s.URL + "/en/" + val0, fmt.Sprintf("the %d bytes received are kept", half), val0 + ".part", "run again to resume"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("interrupted download: error %v, want one mentioning %q", err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, val0+".part")); err != nil || fi.Size() != int64(half) {
		t.Fatalf(".part file: %v, want %d bytes", err, half)
	}
	var resumed int64
	opt.Progress = func(p FetchProgress) { resumed = p.Resumed }
	if _, err := FetchC4(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	if want := []string{val0, fmt.Sprintf("%s bytes=%d-", val0, half)}; !slices.Equal(s.seen(), want) {
		t.Errorf("requests %q, want %q", s.seen(), want)
	}
	if resumed != int64(half) {
		t.Errorf("progress reports %d resumed bytes, want %d", resumed, half)
	}
	checkFetched(t, s, dir, val0)
}

func TestFetchC4ResumeSameRun(t *testing.T) {
	s := newC4Server(t)
	s.handle = cutHalf
	dir := t.TempDir()
	if _, err := FetchC4(context.Background(), FetchOptions{Split: "validation", Shards: 2, Dir: dir, BaseURL: s.URL, Retries: 2, RetryWait: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	want := []string{val0, fmt.Sprintf("%s bytes=%d-", val0, len(s.files[val0])/2), val1, fmt.Sprintf("%s bytes=%d-", val1, len(s.files[val1])/2)}
	if !slices.Equal(s.seen(), want) {
		t.Errorf("requests %q, want %q", s.seen(), want)
	}
	checkFetched(t, s, dir, val0, val1)
}

func TestFetchC4ServerIgnoresRange(t *testing.T) {
	s := newC4Server(t)
	s.handle = func(w http.ResponseWriter, r *http.Request, name string, content []byte, n int) bool {
		w.Header().Set("Content-Length", fmt.Sprint(len(content)))
		w.Write(content) // 200 and the whole file, whatever the Range
		return true
	}
	dir := t.TempDir()
	// A .part file whose bytes are not the file's: appending to it would corrupt the file.
	if err := os.WriteFile(filepath.Join(dir, val0+".part"), bytes.Repeat([]byte{0xAA}, 100), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := FetchC4(context.Background(), FetchOptions{Split: "validation", Shards: 1, Dir: dir, BaseURL: s.URL}); err != nil {
		t.Fatal(err)
	}
	if want := []string{val0 + " bytes=100-"}; !slices.Equal(s.seen(), want) {
		t.Errorf("requests %q, want %q", s.seen(), want)
	}
	checkFetched(t, s, dir, val0)
}

func TestFetchC4PartAlreadyWhole(t *testing.T) {
	s := newC4Server(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, val0+".part"), s.files[val0], 0o644); err != nil {
		t.Fatal(err)
	}
	// The server answers bytes=SIZE- with 416 and Content-Range bytes */SIZE.
	if _, err := FetchC4(context.Background(), FetchOptions{Split: "validation", Shards: 1, Dir: dir, BaseURL: s.URL}); err != nil {
		t.Fatal(err)
	}
	checkFetched(t, s, dir, val0)
}

func TestFetchC4Errors(t *testing.T) {
	tests := []struct {
		name     string
		opt      FetchOptions
		handle   func(w http.ResponseWriter, r *http.Request, name string, content []byte, n int) bool
		want     []string
		requests int
	}{
		{"unknown split", FetchOptions{Split: "test", Shards: 1}, nil, []string{`split "test"`, "train", "validation"}, 0},
		{"no shards", FetchOptions{Split: "validation"}, nil, []string{"shards 0", "8 files"}, 0},
		{"past the end", FetchOptions{Split: "validation", First: 6, Shards: 3}, nil, []string{"first 6, shards 3", "0 to 7"}, 0},
		{"not found", FetchOptions{Split: "validation", Shards: 1, Retries: 3}, func(w http.ResponseWriter, r *http.Request, _ string, _ []byte, _ int) bool {
			http.NotFound(w, r)
			return true
		}, []string{"HTTP 404 Not Found", "no such file", "/en/" + val0}, 1},
		{"forbidden", FetchOptions{Split: "validation", Shards: 1, Retries: 3}, func(w http.ResponseWriter, r *http.Request, _ string, _ []byte, _ int) bool {
			http.Error(w, "no", http.StatusForbidden)
			return true
		}, []string{"HTTP 403 Forbidden", "refused access"}, 1},
		{"server error retried", FetchOptions{Split: "validation", Shards: 1, Retries: 2}, func(w http.ResponseWriter, r *http.Request, _ string, _ []byte, _ int) bool {
			http.Error(w, "oops", http.StatusBadGateway)
			return true
		}, []string{"HTTP 502 Bad Gateway", "server error"}, 3},
		{"not gzip", FetchOptions{Split: "validation", Shards: 1}, func(w http.ResponseWriter, r *http.Request, _ string, _ []byte, _ int) bool {
			w.Write([]byte("<html>a login page</html>"))
			return true
		}, []string{"not a complete gzip stream", "removed", ".part"}, 1},
		{"truncated gzip", FetchOptions{Split: "validation", Shards: 1}, func(w http.ResponseWriter, r *http.Request, _ string, content []byte, _ int) bool {
			w.Write(content[:len(content)-20]) // no Content-Length: the short body looks whole
			return true
		}, []string{"not a complete gzip stream", "unexpected EOF"}, 1},
		{"stalled", FetchOptions{Split: "validation", Shards: 1, StallTimeout: 50 * time.Millisecond}, func(w http.ResponseWriter, r *http.Request, _ string, content []byte, _ int) bool {
			w.Header().Set("Content-Length", fmt.Sprint(len(content)))
			w.Write(content[:100])
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
			return true
		}, []string{"no data arrived", "100 bytes received are kept"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newC4Server(t)
			s.handle = tt.handle
			dir := t.TempDir()
			tt.opt.Dir, tt.opt.BaseURL, tt.opt.RetryWait = dir, s.URL, time.Millisecond
			_, err := FetchC4(context.Background(), tt.opt)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range append(tt.want, "data: fetch") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if n := len(s.seen()); n != tt.requests {
				t.Errorf("%d requests, want %d", n, tt.requests)
			}
			if _, err := os.Stat(filepath.Join(dir, val0)); err == nil {
				t.Errorf("%s exists after a failed download", val0)
			}
		})
	}
}

func TestFetchC4Cancel(t *testing.T) {
	s := newC4Server(t)
	s.handle = func(w http.ResponseWriter, r *http.Request, _ string, content []byte, _ int) bool {
		w.Header().Set("Content-Length", fmt.Sprint(len(content)))
		w.Write(content[:200])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return true
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	_, err := FetchC4(ctx, FetchOptions{Split: "validation", Shards: 1, Dir: dir, BaseURL: s.URL, Retries: 5,
		Progress: func(p FetchProgress) {
			if p.Done >= 200 {
				cancel() // Ctrl-C midway
			}
		}})
	if err == nil || !strings.Contains(err.Error(), "context canceled") || !strings.Contains(err.Error(), "200 bytes received are kept") {
		t.Errorf("cancelled: error %v", err)
	}
	if n := len(s.seen()); n != 1 {
		t.Errorf("%d requests after cancel, want 1 (no retries)", n)
	}
	if fi, err := os.Stat(filepath.Join(dir, val0+".part")); err != nil || fi.Size() != 200 {
		t.Errorf(".part after cancel: %v, want 200 bytes", err)
	}
}

func TestParseContentRange(t *testing.T) {
	for _, tt := range []struct {
		in           string
		start, total int64
		ok           bool
	}{
		{"bytes 100-199/200", 100, 200, true},
		{"bytes 0-0/*", 0, -1, true},
		{"bytes */300", -1, 300, true},
		{"bytes */*", 0, 0, false},
		{"bytes 100-199", 0, 0, false},
		{"items 1-2/3", 0, 0, false},
		{"bytes x-1/3", 0, 0, false},
		{"", 0, 0, false},
	} {
		start, total, ok := parseContentRange(tt.in)
		if ok != tt.ok || ok && (start != tt.start || total != tt.total) {
			t.Errorf("parseContentRange(%q) = %d, %d, %v; want %d, %d, %v", tt.in, start, total, ok, tt.start, tt.total, tt.ok)
		}
	}
}

func TestC4FileName(t *testing.T) {
	for _, tt := range []struct {
		split string
		i     int
		want  string
	}{
		{"validation", 0, "c4-validation.00000-of-00008.json.gz"},
		{"validation", 7, "c4-validation.00007-of-00008.json.gz"},
		{"train", 1023, "c4-train.01023-of-01024.json.gz"},
		{"validation", 8, ""},
		{"train", -1, ""},
		{"en", 0, ""},
	} {
		got, err := C4FileName(tt.split, tt.i)
		if got != tt.want || (err == nil) != (tt.want != "") {
			t.Errorf("C4FileName(%q, %d) = %q, %v; want %q", tt.split, tt.i, got, err, tt.want)
		}
	}
}

// The Hub answers with a redirect to a CDN host; the Range header must survive it.
func TestFetchC4ResumeThroughRedirect(t *testing.T) {
	cdn := newC4Server(t)
	cdn.handle = cutHalf
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, cdn.URL+r.URL.Path, http.StatusFound)
	}))
	defer hub.Close()
	dir := t.TempDir()
	if _, err := FetchC4(context.Background(), FetchOptions{Split: "validation", Shards: 1, Dir: dir, BaseURL: hub.URL, Retries: 1, RetryWait: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if want := []string{val0, fmt.Sprintf("%s bytes=%d-", val0, len(cdn.files[val0])/2)}; !slices.Equal(cdn.seen(), want) {
		t.Errorf("CDN requests %q, want %q", cdn.seen(), want)
	}
	checkFetched(t, cdn, dir, val0)
}

// TestFetchC4NoRoute: a request that cannot leave this machine is retried only where a retry
// may succeed: a host name that does not resolve, and no network on the first try, end the
// fetch at once with why; a temporary DNS failure is retried.
func TestFetchC4NoRoute(t *testing.T) {
	unreachable := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ENETUNREACH)}
	for _, c := range []struct {
		name     string
		err      error
		attempts int
		want     string
	}{
		{"no such host", &net.DNSError{Err: "no such host", Name: "c4.example", IsNotFound: true}, 1, "the host name c4.example does not resolve, so retrying cannot help"},
		{"no network", unreachable, 1, "this machine has no network"},
		{"no network for DNS", &net.DNSError{Err: "dial udp 10.0.0.53:53: connect: network is unreachable", Name: "c4.example", IsTemporary: true}, 1, "this machine has no network"},
		{"name server trouble", &net.DNSError{Err: "server misbehaving", Name: "c4.example", IsTemporary: true}, 3, "server misbehaving"},
	} {
		attempts := 0
		client := &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
			attempts++
			return nil, c.err
		}}}
		_, err := FetchC4(context.Background(), FetchOptions{Split: "validation", Shards: 1, Dir: t.TempDir(), BaseURL: "http://c4.example",
			Client: client, Retries: 2, RetryWait: time.Millisecond})
		if err == nil || !strings.Contains(err.Error(), c.want) || attempts != c.attempts {
			t.Errorf("%s: %d attempts, error %v; want %d attempts and %q", c.name, attempts, err, c.attempts, c.want)
		}
	}
}
