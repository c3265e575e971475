package data

import (
	"fmt"
	"path/filepath"
	"time"
)

// What the progress reports of WriteShards and FetchC4 say to a person: how far a tokenize has
// read (TokenizeProgress.Read), and the lines of a fetch's log (FetchLog).

// Read is how far the tokenize has read, in bytes of its total: the files' bytes, or the text's
// when a MaxBytes (maxBytes, 0 for none) ends the read before the files end.
func (p TokenizeProgress) Read(maxBytes int64) (done, total int64) {
	if maxBytes > 0 && maxBytes < p.InputTotal {
		return p.TextBytes, maxBytes
	}
	return p.InputBytes, p.InputTotal
}

// FetchLog keeps the account of a FetchC4 for the lines of its log.
type FetchLog struct {
	Downloaded int64     // bytes downloaded, those of resumed downloads that were on disk not counted
	file       int       // the file being fetched, from 1 (0: none yet)
	began      time.Time // when it began
}

// Line is what the report p adds to the log: a retry, a file complete already, or a file
// downloaded and at what speed; "" when it adds nothing (the bytes of a file arriving).
func (l *FetchLog) Line(p FetchProgress) string {
	if p.Index+1 != l.file {
		l.file, l.began = p.Index+1, time.Now()
	}
	name := fmt.Sprintf("[%d/%d] %s", p.Index+1, p.Count, filepath.Base(p.File))
	switch {
	case p.Retry > 0:
		return fmt.Sprintf("%s: %v; retry %d of %d in %s", name, p.Err, p.Retry, p.Retries, p.Wait)
	case !p.Final:
		return ""
	case p.Skipped:
		return fmt.Sprintf("%s: complete already (%.1f MB)", name, float64(p.Done)/1e6)
	}
	got := p.Done - p.Resumed
	l.Downloaded += got
	secs := time.Since(l.began).Seconds()
	resumed := ""
	if p.Resumed > 0 {
		resumed = fmt.Sprintf(", resumed after %.1f MB", float64(p.Resumed)/1e6)
	}
	return fmt.Sprintf("%s: %.1f MB in %.1fs (%.1f MB/s%s)", name, float64(p.Done)/1e6, secs, float64(got)/1e6/secs, resumed)
}
