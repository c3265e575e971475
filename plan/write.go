package plan

import (
	"encoding/json"
	"fmt"
	"io"
)

// Write writes rep to w in format: "text" is the breakdown of one plan (WriteDetail) or a
// table of several (WriteTable: a sweep, every schedule); "json" is the Report itself.
func Write(w io.Writer, rep Report, format string) error {
	switch {
	case format == "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	case format != "text":
		return fmt.Errorf("plan: format %q: want text or json", format)
	case len(rep.Plans) == 1:
		WriteDetail(w, rep)
	default:
		WriteTable(w, rep)
	}
	return nil
}
