package transport

import "strings"

// libraryName shortens what MPI_Get_library_version says to a name and version for one
// line: the text's first line up to its first comma, with a "NAME Version: V" or
// "KEY VERSION : TEXT" label folded into "NAME V" or "TEXT", and runs of spaces and tabs made
// one space. Open MPI says "Open MPI v4.1.4, package: …, ident: …", MPICH (and MVAPICH)
// "MPICH Version:\t4.0.2\nMPICH Release date: …" on several lines.
func libraryName(s string) string {
	s = strings.TrimRight(s, "\x00")
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	s, _, _ = strings.Cut(s, ",")
	s = strings.Join(strings.Fields(s), " ")
	if key, val, ok := strings.Cut(s, ":"); ok {
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		if k := strings.ToLower(key); val != "" && strings.HasSuffix(k, "version") {
			name := strings.TrimSpace(key[:len(key)-len("version")])
			switch {
			case val[0] >= '0' && val[0] <= '9' && name != "" && name != "MPI":
				s = name + " " + val
			default:
				s = val
			}
		}
	}
	if s == "" {
		return "an MPI library that does not say its version"
	}
	return s
}
