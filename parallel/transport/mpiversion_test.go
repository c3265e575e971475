package transport

import "testing"

// TestLibraryName: what MPI_Get_library_version says becomes one line naming the library and
// its version. Open MPI's and MPICH's are what Debian's Open MPI 4.1.4 and MPICH 4.0.2 say;
// the others are shaped as those libraries' documentation shows them.
func TestLibraryName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022\x00", "Open MPI v4.1.4"},
		{"MPICH Version:\t4.0.2\nMPICH Release date:\tThu Apr  7 12:34:45 CDT 2022\nMPICH ABI:\t14:2:2\nMPICH Device:\tch4:ucx\n", "MPICH 4.0.2"},
		{"MVAPICH2 Version      \t:\t2.3.7\nMVAPICH2 Release date\t:\tWed March 02 22:00:00 EST 2022\n", "MVAPICH2 2.3.7"},
		{"Intel(R) MPI Library 2021.10 for Linux* OS\n\n", "Intel(R) MPI Library 2021.10 for Linux* OS"},
		{"MPI VERSION    : CRAY MPICH version 8.1.26.52 (ANL base 3.4a2)\nMPI BUILD INFO : Sun Apr 23 12:00 2023\n", "CRAY MPICH version 8.1.26.52 (ANL base 3.4a2)"},
		{"Spectrum: something: else", "Spectrum: something: else"},
		{"\x00", "an MPI library that does not say its version"},
	} {
		if got := libraryName(tc.in); got != tc.want {
			t.Errorf("libraryName(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
