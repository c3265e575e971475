package transport

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestMPIEnvLaunchers: the variables of each launcher give its rank and size; a Slurm batch
// script (SLURM_PROCID without srun's SLURM_STEP_NUM_TASKS) is not a launch; Open MPI's own
// variables, and MPICH Hydra's, win over the Slurm ones that surround a launch inside an
// allocation; bad values are errors that name the variable.
func TestMPIEnvLaunchers(t *testing.T) {
	cases := []struct {
		name    string
		env     map[string]string
		want    *Launch
		wantErr string
	}{
		{"none", map[string]string{"HOME": "/root"}, nil, ""},
		{"openmpi", map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "PMIX_RANK": "3"},
			&Launch{Launcher: "Open MPI's mpirun", Rank: 3, Size: 4, Vars: []string{"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4"}}, ""},
		{"openmpi-in-slurm", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"},
			&Launch{Launcher: "Open MPI's mpirun", Rank: 1, Size: 2, Vars: []string{"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2"}}, ""},
		{"mpich", map[string]string{"PMI_RANK": "0", "PMI_SIZE": "8"},
			&Launch{Launcher: "a PMI launcher (MPICH or Intel MPI mpiexec, srun --mpi=pmi2)", Rank: 0, Size: 8, Vars: []string{"PMI_RANK=0", "PMI_SIZE=8"}}, ""},
		{"mpich-in-slurm", map[string]string{"PMI_RANK": "3", "PMI_SIZE": "8", "PMI_FD": "6", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4",
			"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}, // Hydra's proxies started by srun, one a node
			&Launch{Launcher: "a PMI launcher (MPICH or Intel MPI mpiexec, srun --mpi=pmi2)", Rank: 3, Size: 8, Vars: []string{"PMI_RANK=3", "PMI_SIZE=8"}}, ""},
		{"srun", map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "16"},
			&Launch{Launcher: "srun", Rank: 5, Size: 16, Vars: []string{"SLURM_PROCID=5", "SLURM_STEP_NUM_TASKS=16"}}, ""},
		{"sbatch-script", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_JOB_ID": "42"}, nil, ""},
		{"pmix", map[string]string{"PMIX_RANK": "2"},
			&Launch{Launcher: "a PMIx launcher", Rank: 2, Vars: []string{"PMIX_RANK=2"}}, ""},
		{"bad-rank", map[string]string{"OMPI_COMM_WORLD_RANK": "one", "OMPI_COMM_WORLD_SIZE": "2"}, nil, `OMPI_COMM_WORLD_RANK="one"`},
		{"negative-rank", map[string]string{"PMIX_RANK": "-1"}, nil, `PMIX_RANK="-1"`},
		{"size-not-above-rank", map[string]string{"PMI_RANK": "4", "PMI_SIZE": "4"}, nil, `PMI_SIZE="4"`},
		{"zero-size", map[string]string{"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "0"}, nil, `SLURM_STEP_NUM_TASKS="0"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mpiEnvFrom(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// clearLaunchEnv empties every variable MPIEnv reads, for the rest of the test.
func clearLaunchEnv(t *testing.T) {
	for _, v := range launchVars {
		t.Setenv(v.rank, "")
		if v.size != "" {
			t.Setenv(v.size, "")
		}
	}
}

// TestMPICheckLaunch: a binary without MPI started as one of several ranks says so and how to
// rebuild; one started alone, or as the only rank, is fine; a binary with MPI is always fine.
func TestMPICheckLaunch(t *testing.T) {
	cases := []struct {
		name    string
		env     map[string]string
		refused bool
	}{
		{"alone", nil, false},
		{"one-rank", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}, false},
		{"four-ranks", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}, true},
		{"srun", map[string]string{"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}, true},
		{"pmix-rank-1", map[string]string{"PMIX_RANK": "1"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clearLaunchEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			err := CheckLaunch()
			if !tc.refused || MPIBuilt {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("a binary without MPI started as one of several ranks was not refused")
			}
			for _, s := range []string{"built without MPI", "rebuild with -tags mpi", "rank"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			for k, v := range tc.env {
				if !strings.Contains(err.Error(), k+"="+v) {
					t.Errorf("error %q does not name %s=%s", err, k, v)
				}
			}
		})
	}
	t.Run("bad-variable", func(t *testing.T) {
		clearLaunchEnv(t)
		t.Setenv("PMI_RANK", "x")
		t.Setenv("PMI_SIZE", "2")
		if err := CheckLaunch(); err == nil || !strings.Contains(err.Error(), "PMI_RANK") {
			t.Fatalf("error %v, want one naming PMI_RANK", err)
		}
	})
}

// TestMPIOptionsFromEnv: the watchdog timeout and thread level come from the environment, with
// defaults, and a bad value names its variable.
func TestMPIOptionsFromEnv(t *testing.T) {
	cases := []struct {
		env     map[string]string
		want    MPIOptions
		wantErr string
	}{
		{nil, MPIOptions{Timeout: DefaultMPITimeout}, ""},
		{map[string]string{"DISTFLASH_MPI_TIMEOUT": "90s"}, MPIOptions{Timeout: 90 * time.Second}, ""},
		{map[string]string{"DISTFLASH_MPI_TIMEOUT": "0"}, MPIOptions{}, ""},
		{map[string]string{"DISTFLASH_MPI_THREAD": "serialized"}, MPIOptions{Timeout: DefaultMPITimeout, Serialized: true}, ""},
		{map[string]string{"DISTFLASH_MPI_THREAD": "multiple", "DISTFLASH_MPI_TIMEOUT": "1m"}, MPIOptions{Timeout: time.Minute}, ""},
		{map[string]string{"DISTFLASH_MPI_TIMEOUT": "ten"}, MPIOptions{}, `DISTFLASH_MPI_TIMEOUT="ten"`},
		{map[string]string{"DISTFLASH_MPI_TIMEOUT": "-5s"}, MPIOptions{}, `DISTFLASH_MPI_TIMEOUT="-5s"`},
		{map[string]string{"DISTFLASH_MPI_THREAD": "funneled"}, MPIOptions{}, `DISTFLASH_MPI_THREAD="funneled"`},
		{map[string]string{"DISTFLASH_MPI_SYNC_SEND": "1"}, MPIOptions{Timeout: DefaultMPITimeout, SyncSend: true}, ""},
		{map[string]string{"DISTFLASH_MPI_SYNC_SEND": "false"}, MPIOptions{Timeout: DefaultMPITimeout}, ""},
		{map[string]string{"DISTFLASH_MPI_SYNC_SEND": "yes"}, MPIOptions{}, `DISTFLASH_MPI_SYNC_SEND="yes"`},
	}
	for _, tc := range cases {
		got, err := mpiOptionsFrom(func(k string) string { return tc.env[k] })
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error %v, want one naming %s", tc.env, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%v: got %+v, %v; want %+v", tc.env, got, err, tc.want)
		}
	}
}

// TestSrunWithoutPMIx: rank 0 of an srun step of several ranks started without PMIx gets a
// warning naming the --mpi type and the fix; PMIx steps, other ranks, single tasks and
// processes srun did not start get none.
func TestSrunWithoutPMIx(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want string // "" = no warning
	}{
		{"pmi2", map[string]string{"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_MPI_TYPE": "pmi2", "PMI_RANK": "0"}, "4 ranks with --mpi=pmi2"},
		{"none", map[string]string{"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}, "2 ranks with --mpi=none"},
		{"pmix", map[string]string{"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_MPI_TYPE": "pmix", "PMIX_RANK": "0"}, ""},
		{"rank-1", map[string]string{"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_MPI_TYPE": "pmi2"}, ""},
		{"one-task", map[string]string{"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}, ""},
		{"batch-script", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, ""},
		{"alone", nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := srunWithoutPMIxFrom(func(k string) string { return tc.env[k] })
			if tc.want == "" {
				if got != "" {
					t.Fatalf("warned %q", got)
				}
				return
			}
			for _, s := range []string{tc.want, "srun --mpi=pmix", "MpiDefault=pmix"} {
				if !strings.Contains(got, s) {
					t.Errorf("warning %q does not say %q", got, s)
				}
			}
		})
	}
}

// TestLocalRank: the host-local rank comes from the first launcher variable set (Open MPI,
// Hydra, srun), 0 without one or with garbage.
func TestLocalRank(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want int
	}{
		{nil, 0},
		{map[string]string{"OMPI_COMM_WORLD_LOCAL_RANK": "3"}, 3},
		{map[string]string{"MPI_LOCALRANKID": "2"}, 2},
		{map[string]string{"SLURM_LOCALID": "5"}, 5},
		{map[string]string{"OMPI_COMM_WORLD_LOCAL_RANK": "1", "SLURM_LOCALID": "7"}, 1},
		{map[string]string{"SLURM_LOCALID": "x"}, 0},
		{map[string]string{"SLURM_LOCALID": "-2"}, 0},
	} {
		if got := localRankFrom(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("%v: %d, want %d", tc.env, got, tc.want)
		}
	}
}

// TestNCCLOptionsFromEnv reads DISTFLASH_NCCL_TIMEOUT.
func TestNCCLOptionsFromEnv(t *testing.T) {
	for _, tc := range []struct {
		value   string
		want    time.Duration
		wantErr string
	}{
		{"", DefaultNCCLTimeout, ""},
		{"90s", 90 * time.Second, ""},
		{"0", 0, ""},
		{"ten", 0, `DISTFLASH_NCCL_TIMEOUT="ten"`},
		{"-5s", 0, `DISTFLASH_NCCL_TIMEOUT="-5s"`},
	} {
		o, err := ncclOptionsFrom(func(k string) string {
			if k == "DISTFLASH_NCCL_TIMEOUT" {
				return tc.value
			}
			return ""
		})
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: %v, want an error naming %s", tc.value, err, tc.wantErr)
			}
		case err != nil || o.Timeout != tc.want:
			t.Errorf("%q: %v, %v; want %v", tc.value, o.Timeout, err, tc.want)
		}
	}
}
