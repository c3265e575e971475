package weights

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// localFile returns the path of file name in dir, where name comes from inside a file (a
// shard named by model.safetensors.index.json) and so is not trusted: it must be a plain file
// name (not empty, ".", "..", absolute or with a separator), and the file it names, after
// symbolic links, must lie inside dir. One exception keeps the Hugging Face hub cache
// readable: there dir is models--ORG--NAME/snapshots/REV, whose files are links to
// ../../blobs/HASH, and a link into that blobs directory is accepted. what names the file
// that gave the name, for the error.
func localFile(what, dir, name string) (string, error) {
	if name == "" || name == "." || name == ".." || filepath.Base(name) != name || !filepath.IsLocal(name) || strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("weights: %s names file %q: want a file name in %s (no directory part, no ..)", what, name, dir)
	}
	path := filepath.Join(dir, name)
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		return path, nil // a missing file is the caller's to report
	}
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("weights: %s names file %q, a symbolic link that does not resolve: %w", what, name, err)
	}
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("weights: %w", err)
	}
	inside := func(parent string) bool {
		rel, err := filepath.Rel(parent, target)
		return err == nil && filepath.IsLocal(rel)
	}
	if inside(realDir) {
		return path, nil
	}
	if snaps := filepath.Dir(realDir); filepath.Base(snaps) == "snapshots" && inside(filepath.Join(filepath.Dir(snaps), "blobs")) {
		return path, nil
	}
	return "", fmt.Errorf("weights: %s names file %q, a symbolic link to %s, outside %s: refused", what, name, target, dir)
}
