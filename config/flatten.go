package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// Flatten turns a config written as JSON (sections as nested objects, as a checkpoint keeps
// it) into its dotted keys ("training.steps") and their values as compact JSON, numbers in one
// normal form so that 1e-05 and 0.00001 read the same. Objects are walked, and so are arrays
// of objects, element i's keys under "i." ("data.sources.0.weight"); everything else (other
// arrays included) is a value.
func Flatten(raw json.RawMessage) (map[string]string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("config JSON: %w", err)
	}
	top, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("config JSON is %T, want an object", v)
	}
	out := map[string]string{}
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok {
				walk(prefix+k+".", sub)
				continue
			}
			if objs, ok := objects(v); ok {
				for i, sub := range objs {
					walk(prefix+k+"."+strconv.Itoa(i)+".", sub)
				}
				continue
			}
			out[prefix+k] = valueText(v)
		}
	}
	walk("", top)
	return out, nil
}

// valueText renders a JSON value compactly, numbers in a normal form.
func valueText(v any) string {
	if n, ok := v.(json.Number); ok {
		if f, err := strconv.ParseFloat(string(n), 64); err == nil {
			return strconv.FormatFloat(f, 'g', -1, 64)
		}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// objects returns v's elements when v is a non-empty array of objects.
func objects(v any) ([]map[string]any, bool) {
	arr, ok := v.([]any)
	if !ok || len(arr) == 0 {
		return nil, false
	}
	out := make([]map[string]any, len(arr))
	for i, e := range arr {
		if out[i], ok = e.(map[string]any); !ok {
			return nil, false
		}
	}
	return out, true
}
