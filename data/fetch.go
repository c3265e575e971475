package data

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// C4BaseURL is where FetchC4 downloads from unless told otherwise: the allenai/c4 dataset on
// the Hugging Face Hub, whose "en" variant is the C4 of the LLaMA and DistFlashAttn papers.
const C4BaseURL = "https://huggingface.co/datasets/allenai/c4/resolve/main"

// c4Splits holds the number of files in each split of C4's "en" variant.
var c4Splits = map[string]int{"train": 1024, "validation": 8}

// C4FileName returns the name of file i of a split of C4 "en", as allenai/c4 names it:
// c4-validation.00000-of-00008.json.gz. Splits are train (1024 files) and validation (8).
func C4FileName(split string, i int) (string, error) {
	n, ok := c4Splits[split]
	if !ok {
		return "", fmt.Errorf("data: C4 split %q: want train (1024 files) or validation (8 files)", split)
	}
	if i < 0 || i >= n {
		return "", fmt.Errorf("data: C4 %s file %d: the split has files 0 to %d", split, i, n-1)
	}
	return fmt.Sprintf("c4-%s.%05d-of-%05d.json.gz", split, i, n), nil
}

// FetchOptions says which C4 files FetchC4 downloads, where to, and how.
type FetchOptions struct {
	Split   string // train or validation
	First   int    // index of the first file
	Shards  int    // number of files, from First on
	Dir     string // where the files go ("" = the current directory)
	BaseURL string // "" = C4BaseURL; files are at BaseURL/en/NAME
	// Client makes the requests; nil means a client without an overall timeout (files are
	// hundreds of MB), relying on StallTimeout.
	Client *http.Client
	// Retries is how many times a file's download is resumed after a network error, a
	// stall or an HTTP 429 or 5xx status before FetchC4 gives up; negative means none.
	Retries int
	// RetryWait is the wait before the first retry, doubled for each next one (0 = 1s).
	RetryWait time.Duration
	// StallTimeout ends a response that delivers no data for this long, which counts as a
	// network error (0 = 60s).
	StallTimeout time.Duration
	// Progress, when set, is called as each file starts, as its bytes arrive, and once
	// when it is done.
	Progress func(FetchProgress)
}

// FetchProgress reports a download.
type FetchProgress struct {
	File    string // the file's path
	Index   int    // its position in the files fetched, from 0
	Count   int    // the number of files fetched
	Done    int64  // bytes on disk, resumed bytes included
	Total   int64  // the file's size; -1 while unknown
	Resumed int64  // bytes that were on disk from an earlier, interrupted download
	Skipped bool   // the file was complete already; nothing was downloaded
	Final   bool   // the file is complete
	// Retry, when > 0, says that the download failed with Err and is tried again (the
	// Retry-th time of Retries) after Wait.
	Retry, Retries int
	Wait           time.Duration
	Err            error
}

// FetchC4 downloads files First to First+Shards-1 of a C4 split into Dir and returns their
// paths. A file that exists under its own name is complete and is skipped. A download goes
// to NAME.part and is resumed from where it stopped with an HTTP Range request, both
// within a run (after a network error, see Retries) and in a later run after an
// interruption; a server that ignores Range gets the file again from the start. The file
// is renamed to NAME only after it reads as a complete gzip stream.
func FetchC4(ctx context.Context, opt FetchOptions) ([]string, error) {
	n, ok := c4Splits[opt.Split]
	if !ok {
		return nil, fmt.Errorf("data: fetch c4: split %q: want train (1024 files) or validation (8 files)", opt.Split)
	}
	if opt.Shards < 1 || opt.First < 0 || opt.First+opt.Shards > n {
		return nil, fmt.Errorf("data: fetch c4: first %d, shards %d: the %s split has %d files, 0 to %d; want first >= 0, shards >= 1 and first+shards <= %d",
			opt.First, opt.Shards, opt.Split, n, n-1, n)
	}
	base := strings.TrimSuffix(opt.BaseURL, "/")
	if base == "" {
		base = C4BaseURL
	}
	dir := opt.Dir
	if dir == "" {
		dir = "."
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data: fetch c4: %w", err)
	}
	var paths []string
	for i := opt.First; i < opt.First+opt.Shards; i++ {
		name, _ := C4FileName(opt.Split, i)
		path := filepath.Join(dir, name)
		d := downloader{opt: opt, url: base + "/en/" + name, path: path, index: i - opt.First}
		if err := d.run(ctx); err != nil {
			return paths, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// downloader fetches one file.
type downloader struct {
	opt   FetchOptions
	url   string
	path  string
	index int
	total int64 // the file's size, -1 while unknown
	done  int64 // bytes in the .part file
}

// retryable marks an error after which resuming the download may succeed.
type retryable struct{ err error }

func (e retryable) Error() string { return e.err.Error() }
func (e retryable) Unwrap() error { return e.err }

// errStalled ends a response that stopped delivering data.
var errStalled = errors.New("no data arrived within the stall timeout")

func (d *downloader) report(p FetchProgress) {
	if d.opt.Progress != nil {
		p.File, p.Index, p.Count = d.path, d.index, d.opt.Shards
		d.opt.Progress(p)
	}
}

// run downloads the file unless it is there already.
func (d *downloader) run(ctx context.Context) error {
	if fi, err := os.Stat(d.path); err == nil {
		d.report(FetchProgress{Done: fi.Size(), Total: fi.Size(), Skipped: true, Final: true})
		return nil
	}
	part := d.path + ".part"
	d.total = -1
	resumed := int64(0)
	if fi, err := os.Stat(part); err == nil {
		resumed = fi.Size()
	}
	d.report(FetchProgress{Done: resumed, Total: -1, Resumed: resumed})
	wait := d.opt.RetryWait
	if wait <= 0 {
		wait = time.Second
	}
	for attempt := 0; ; attempt++ {
		err := d.once(ctx, part, resumed)
		if err == nil {
			break
		}
		var r retryable
		if ctx.Err() != nil {
			err = ctx.Err()
		} else if why := noRoute(err, attempt == 0); why != "" {
			err = fmt.Errorf("%w: %s", err, why) // a retry would meet the same at once
		} else if errors.As(err, &r) && attempt < d.opt.Retries {
			pause := min(wait<<attempt, time.Minute)
			d.report(FetchProgress{Done: d.done, Total: d.total, Resumed: resumed, Retry: attempt + 1, Retries: d.opt.Retries, Wait: pause, Err: err})
			select {
			case <-time.After(pause):
				continue
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		if d.done > 0 {
			return fmt.Errorf("data: fetch %s: %w (the %d bytes received are kept in %s: run again to resume)", d.url, err, d.done, part)
		}
		return fmt.Errorf("data: fetch %s: %w", d.url, err)
	}
	if err := verifyGzip(part); err != nil {
		os.Remove(part)
		return fmt.Errorf("data: fetch %s: the download is not a complete gzip stream (%w); removed %s, run again to download it afresh", d.url, err, part)
	}
	if err := os.Rename(part, d.path); err != nil {
		return fmt.Errorf("data: fetch %s: %w", d.url, err)
	}
	d.report(FetchProgress{Done: d.done, Total: d.done, Resumed: resumed, Final: true})
	return nil
}

// once makes one request, appending what arrives to part; it returns nil when part holds
// the whole file.
func (d *downloader) once(ctx context.Context, part string, resumed int64) error {
	d.done = 0
	if fi, err := os.Stat(part); err == nil {
		d.done = fi.Size()
	}
	stall := d.opt.StallTimeout
	if stall <= 0 {
		stall = time.Minute
	}
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := time.AfterFunc(stall, func() { cancel(errStalled) })
	defer timer.Stop()

	req, err := http.NewRequestWithContext(rctx, http.MethodGet, d.url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "distflash (data fetch)")
	if d.done > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", d.done))
	}
	client := d.opt.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		if c := context.Cause(rctx); c == errStalled {
			err = c
		}
		return retryable{err}
	}
	defer resp.Body.Close()
	flags := os.O_WRONLY | os.O_CREATE | os.O_APPEND
	switch resp.StatusCode {
	case http.StatusOK:
		// The whole file: no Range was sent, or the server ignored it.
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
		d.done = 0
		d.total = resp.ContentLength
	case http.StatusPartialContent:
		start, total, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if !ok || start != d.done {
			os.Remove(part)
			asked := d.done
			d.done = 0
			return retryable{fmt.Errorf("asked for bytes %d on, the server sent Content-Range %q; starting afresh", asked, resp.Header.Get("Content-Range"))}
		}
		d.total = total
	case http.StatusRequestedRangeNotSatisfiable:
		// Nothing after byte d.done: the .part file may be whole already.
		if _, total, ok := parseContentRange(resp.Header.Get("Content-Range")); ok && total == d.done {
			d.total = total
			return nil
		}
		os.Remove(part)
		asked := d.done
		d.done = 0
		return retryable{fmt.Errorf("the server has no bytes from %d on (Content-Range %q); starting afresh", asked, resp.Header.Get("Content-Range"))}
	default:
		return statusError(resp)
	}
	f, err := os.OpenFile(part, flags, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	d.report(FetchProgress{Done: d.done, Total: d.total, Resumed: resumed})
	buf := make([]byte, 256<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			timer.Reset(stall)
			if _, err := f.Write(buf[:n]); err != nil {
				return err
			}
			d.done += int64(n)
			d.report(FetchProgress{Done: d.done, Total: d.total, Resumed: resumed})
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if c := context.Cause(rctx); c == errStalled {
				rerr = c
			}
			return retryable{rerr}
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if d.total >= 0 && d.done != d.total {
		return retryable{fmt.Errorf("the response ended after %d of %d bytes", d.done, d.total)}
	}
	return nil
}

// noRoute says why a request that failed before it reached the server fails again if retried
// ("" when a retry may succeed): its host name does not resolve (a DNS "no such host", which
// names the host's absence, not a name server's trouble), or, on the first try (first), this
// machine has no network to reach the server or a name server on. A temporary DNS failure, a
// network lost during a download, or anything the server said is retried.
func noRoute(err error, first bool) string {
	var dns *net.DNSError
	isDNS := errors.As(err, &dns)
	switch {
	case isDNS && dns.IsNotFound:
		return fmt.Sprintf("the host name %s does not resolve, so retrying cannot help: check --base-url, or this machine's DNS", dns.Name)
	case first && (errors.Is(err, syscall.ENETUNREACH) || isDNS && strings.HasSuffix(dns.Err, syscall.ENETUNREACH.Error())):
		// A DNSError keeps its cause as text: "dial udp ...:53: connect: network is unreachable".
		return "this machine has no network (is it offline?), so retrying cannot help"
	}
	return ""
}

// statusError describes an HTTP status that is not a success; 429 and 5xx are retryable.
func statusError(resp *http.Response) error {
	hint := ""
	switch c := resp.StatusCode; {
	case c == http.StatusNotFound:
		hint = ": no such file; check the split, the file numbers and the base URL"
	case c == http.StatusUnauthorized || c == http.StatusForbidden:
		hint = ": the server refused access"
	case c == http.StatusTooManyRequests:
		hint = ": rate limited"
	case c >= 500:
		hint = ": a server error"
	}
	err := fmt.Errorf("HTTP %s%s", resp.Status, hint)
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
		return retryable{err}
	}
	return err
}

// parseContentRange parses "bytes START-END/TOTAL" or "bytes */TOTAL"; total is -1 when it
// is "*".
func parseContentRange(s string) (start, total int64, ok bool) {
	rest, found := strings.CutPrefix(s, "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, tot, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	total = -1
	if tot != "*" {
		t, err := strconv.ParseInt(tot, 10, 64)
		if err != nil || t < 0 {
			return 0, 0, false
		}
		total = t
	}
	if rng == "*" {
		return -1, total, total >= 0
	}
	first, _, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, false
	}
	start, err := strconv.ParseInt(first, 10, 64)
	if err != nil || start < 0 {
		return 0, 0, false
	}
	return start, total, true
}

// verifyGzip reads the file at path to its end as a (multi-member) gzip stream.
func verifyGzip(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(bufio.NewReaderSize(f, 256<<10))
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, zr); err != nil {
		return err
	}
	return zr.Close()
}
