// Package parallel is how distflash splits the work of a step across ranks: the parallel
// dimensions of a world (Dims: data-parallel replicas × sequence-parallel ranks × Ulysses
// groups), the token layouts that split a sequence across ranks (Layout), the
// sequence-parallel attention schedules of the papers (DistFlashAttn, ring, zig-zag,
// BurstAttention, Ulysses, Attention2D, the Ulysses × ring hybrid: NewAttention), document
// balancing, and FSDP (fsdp.go). Every schedule is written against transport.Comm, the
// communicator of package parallel/transport, and reads the same on the in-process world, MPI
// and NCCL.
package parallel
