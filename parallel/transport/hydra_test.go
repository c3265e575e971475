package transport

import (
	"io"
	"os"
	"strconv"
	"testing"
)

// TestHydraAbort: under MPICH's Hydra (PMI_FD with PMI_RANK and Hydra's MPI_LOCALNRANKS) the
// failing process asks Hydra, on PMI_FD, to end the job with its status; under any other
// launcher (srun --mpi=pmi2 also gives PMI_FD, for PMI-2; Open MPI's mpirun none) it says
// nothing.
func TestHydraAbort(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"hydra", map[string]string{"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2", "MPI_LOCALRANKID": "0"}, "cmd=abort exitcode=2\n"},
		{"srun-pmi2", map[string]string{"PMI_RANK": "0", "PMI_SIZE": "2", "SLURM_STEP_NUM_TASKS": "2"}, ""},
		{"openmpi", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, ""},
		{"none", map[string]string{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			env := map[string]string{"PMI_FD": strconv.Itoa(int(w.Fd()))}
			for k, v := range tc.env {
				env[k] = v
			}
			if tc.name == "openmpi" || tc.name == "none" {
				delete(env, "PMI_FD")
			}
			hydraAbortFrom(func(k string) string { return env[k] }, 2, 0)
			w.Close()
			got, err := io.ReadAll(r)
			if err != nil || string(got) != tc.want {
				t.Errorf("wrote %q (%v), want %q", got, err, tc.want)
			}
		})
	}
}
