package evaluate

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"distflash/ckpt"
)

// WritePasskeyDocuments writes n PasskeyDocuments to path as jsonl, one {"text": ...} document a
// line (data.format = "jsonl" reads them), atomically. path must not exist.
func WritePasskeyDocuments(path string, n, minChars, maxChars int, seed uint64) error {
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("%s exists: choose a new file", path)
	}
	docs, err := PasskeyDocuments(n, minChars, maxChars, seed)
	if err != nil {
		return err
	}
	var b strings.Builder
	for _, d := range docs {
		line, err := json.Marshal(map[string]string{"text": d})
		if err != nil {
			return err
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return ckpt.WriteFileAtomic(path, []byte(b.String()))
}
