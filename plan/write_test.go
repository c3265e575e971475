package plan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestWrite: text is the breakdown of one plan and a table of several, json the report; any
// other format is refused by name.
func TestWrite(t *testing.T) {
	cfg := loadPlanConfig(t, "../configs/tiny.toml")
	one, err := Make(cfg, Request{Cluster: "1x1xA100-80GB"})
	if err != nil {
		t.Fatal(err)
	}
	sweep, err := Make(cfg, Request{Cluster: "1x1xA100-80GB", Sweep: "seq_len=256..1K"})
	if err != nil {
		t.Fatal(err)
	}
	var detail, table, js bytes.Buffer
	if err := Write(&detail, one, "text"); err != nil {
		t.Fatal(err)
	}
	if err := Write(&table, sweep, "text"); err != nil {
		t.Fatal(err)
	}
	if err := Write(&js, one, "json"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(detail.String(), "memory per rank:") || strings.Contains(table.String(), "memory per rank:") || !strings.Contains(table.String(), "1K") {
		t.Errorf("detail:\n%s\ntable:\n%s", detail.String(), table.String())
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Plans) != 1 {
		t.Errorf("json: %v, %d plans", err, len(back.Plans))
	}
	if err := Write(&js, one, "yaml"); err == nil || !strings.Contains(err.Error(), `"yaml"`) {
		t.Errorf("yaml: %v", err)
	}
}
