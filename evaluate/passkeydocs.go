package evaluate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"distflash/ckpt"
	"distflash/data"
)

// WritePasskeyDocuments writes n PasskeyDocuments to path, atomically: as Parquet when path ends
// in .parquet (one string column, "text": data.WriteParquet; data.format = "parquet" reads it),
// else as jsonl, one {"text": ...} document a line (data.format = "jsonl"). path must not exist.
func WritePasskeyDocuments(path string, n, minChars, maxChars int, seed uint64) error {
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("%s exists: choose a new file", path)
	}
	docs, err := PasskeyDocuments(n, minChars, maxChars, seed)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if strings.HasSuffix(path, ".parquet") {
		if err := data.WriteParquet(&b, docs); err != nil {
			return err
		}
		return ckpt.WriteFileAtomic(path, b.Bytes())
	}
	for _, d := range docs {
		line, err := json.Marshal(map[string]string{"text": d})
		if err != nil {
			return err
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return ckpt.WriteFileAtomic(path, b.Bytes())
}
