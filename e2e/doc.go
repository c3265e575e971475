// Package e2e holds the end-to-end tests of distflash: each runs the real binary (built once
// per test binary by TestMain, with the test binary's build tags) the way a user or a cluster
// would, and checks what it writes, prints and exits with. The tests may also read the
// project's packages (train, evaluate, weights, ckpt, config...) to compute what the binary
// should have produced. README.md in this directory says which file checks what, how each
// runs (build tags, mpirun, root, network namespaces, Slurm) and what `go test -short` skips.
//
// The package has no code of its own: this file holds only its documentation.
package e2e
