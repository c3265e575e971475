package data

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExpandPathGOROOT(t *testing.T) {
	envGOROOT := os.Getenv("GOROOT")
	tests := []struct {
		name   string
		env    string // GOROOT environment value for the case; "" = unset, so `go env` answers
		path   string
		suffix string
	}{
		{"env or go env", envGOROOT, "$GOROOT", ""},
		{"braces", envGOROOT, "${GOROOT}/src", "src"},
		{"go env", "", "$GOROOT/src", "src"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("GOROOT", tt.env)
			if tt.env == "" {
				os.Unsetenv("GOROOT") // t.Setenv restores it afterwards
			}
			got, err := ExpandPath(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(got, "$") || !strings.HasSuffix(got, tt.suffix) {
				t.Errorf("ExpandPath(%q) = %q", tt.path, got)
			}
			root := strings.TrimSuffix(got, tt.suffix)
			if fi, err := os.Stat(filepath.Join(root, "src", "runtime")); err != nil || !fi.IsDir() {
				t.Errorf("ExpandPath(%q) = %q: no src/runtime directory under %s (%v)", tt.path, got, root, err)
			}
		})
	}
}

func TestExpandPath(t *testing.T) {
	home, err := os.UserHomeDir()
	if err != nil {
		t.Skip(err)
	}
	t.Setenv("DISTFLASH_TEST_DIR", "/some/where")
	t.Setenv("GOROOT", "/fake/goroot")
	tests := []struct {
		path    string
		want    string
		wantErr string
	}{
		{"/plain/path", "/plain/path", ""},
		{"relative/dir", "relative/dir", ""},
		{"~", home, ""},
		{"~/corpus/x.txt", home + "/corpus/x.txt", ""},
		{"a/~/b", "a/~/b", ""},
		{"$DISTFLASH_TEST_DIR/x", "/some/where/x", ""},
		{"${DISTFLASH_TEST_DIR}x", "/some/wherex", ""},
		{"$GOROOT/src", "/fake/goroot/src", ""},
		{"~/$DISTFLASH_TEST_DIR", home + "//some/where", ""},
		{"$DISTFLASH_NOT_SET_XYZ/train", "", "$DISTFLASH_NOT_SET_XYZ is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			got, err := ExpandPath(tt.path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), tt.path) {
					t.Fatalf("ExpandPath(%q) = %q, %v; want an error naming the path and %q", tt.path, got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("ExpandPath(%q) = %q, want %q", tt.path, got, tt.want)
			}
		})
	}
}
