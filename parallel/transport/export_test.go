package transport

// PoolAllocs is the count of host buffers the pool of a Staged communicator has allocated.
func PoolAllocs(c Comm) int { return c.(*stagedComm).pool.allocs }

// TakeCopies returns the count of message copies the in-process world w has made since the last
// call, and restarts it.
func TakeCopies(w *World) int64 { return w.copies.Swap(0) }
