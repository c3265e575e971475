package weights

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLocalFile: a shard name from inside a file cannot leave its directory, by name or by
// symbolic link, except into the blobs of a Hugging Face hub cache snapshot.
func TestLocalFile(t *testing.T) {
	root := t.TempDir()
	snap := filepath.Join(root, "models--org--m", "snapshots", "abc")
	blobs := filepath.Join(root, "models--org--m", "blobs")
	other := filepath.Join(root, "other")
	for _, d := range []string{snap, blobs, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(blobs, "h1"), filepath.Join(other, "x"), filepath.Join(snap, "real")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{"blob": "../../blobs/h1", "out": "../../../other/x", "abs": filepath.Join(other, "x"),
		"in": "real", "dangling": "nothing-here"}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(snap, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name string
		want string // "" accepted, else part of the error
	}{
		{"real", ""}, {"in", ""}, {"blob", ""}, {"missing", ""},
		{"out", "outside"}, {"abs", "outside"}, {"dangling", "does not resolve"},
		{"../other/x", "no directory part"}, {"..", "no directory part"}, {".", "no directory part"},
		{"", "no directory part"}, {"/etc/passwd", "no directory part"}, {"a/b", "no directory part"},
		{"a\x00b", "no directory part"},
	} {
		path, err := localFile("index.json", snap, tt.name)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q: %v", tt.name, err)
		case tt.want == "" && path != filepath.Join(snap, tt.name):
			t.Errorf("%q: path %s", tt.name, path)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "index.json")):
			t.Errorf("%q: error %v, want one naming index.json and %q", tt.name, err, tt.want)
		}
	}
	// Outside a hub cache, a link to a sibling directory's blobs is refused.
	plain := filepath.Join(root, "plain")
	os.Mkdir(plain, 0o755)
	os.Symlink(filepath.Join(blobs, "h1"), filepath.Join(plain, "blob"))
	if _, err := localFile("index.json", plain, "blob"); err == nil {
		t.Error("a link out of a plain directory was accepted")
	}
}
