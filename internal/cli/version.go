package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"distflash/parallel/transport"
)

// Version describes this binary: its module version or VCS commit (with "+dirty" for a build
// from a modified tree), the Go version, the build tags that select CUDA and MPI and, in an MPI
// build, the MPI it was compiled against (its mpi.h) and the MPI library it loaded.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "distflash (no build information)"
	}
	v, commit, dirty, tags := bi.Main.Version, "", false, ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		case "-tags":
			tags = s.Value
		}
	}
	if commit != "" {
		if len(commit) > 12 {
			commit = commit[:12]
		}
		v = "commit " + commit
		if dirty {
			v += "+dirty"
		}
	}
	out := fmt.Sprintf("distflash %s, %s %s/%s", v, bi.GoVersion, runtime.GOOS, runtime.GOARCH)
	if tags != "" {
		out += ", tags " + tags
	}
	if mpi := transport.MPIBuiltWith(); mpi != "" {
		out += ", MPI built against " + mpi + ", library " + transport.MPILibrary()
	}
	return out
}
