/* The exchange of BenchmarkMPIPointToPoint written directly against MPI in C, the reference
 * for its MPI rows: both of 2 ranks send a message to the other at once; GB/s is what one
 * rank sends per second (10^9 bytes).
 *
 *   mpicc -O2 parallel/testdata/mpi_exchange.c -o /tmp/mpi_exchange
 *   mpirun -np 2 /tmp/mpi_exchange        # as root: --allow-run-as-root
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size != 2) {
		if (rank == 0) fprintf(stderr, "mpi_exchange: needs 2 ranks, has %d\n", size);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	const long sizes[] = {4L << 10, 64L << 10, 1L << 20, 16L << 20, 64L << 20};
	for (int s = 0; s < 5; s++) {
		long n = sizes[s] / 4;
		float *send = calloc(n, 4), *recv = calloc(n, 4);
		long iters = (long)(2e9 / sizes[s]); /* about 2 GB each way */
		if (iters > 100000) iters = 100000;
		if (iters < 20) iters = 20;
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (long i = 0; i < iters; i++) {
			MPI_Request q[2];
			MPI_Irecv(recv, n, MPI_FLOAT, 1 - rank, 1, MPI_COMM_WORLD, &q[0]);
			MPI_Isend(send, n, MPI_FLOAT, 1 - rank, 1, MPI_COMM_WORLD, &q[1]);
			MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
		}
		double t = MPI_Wtime() - t0;
		if (rank == 0)
			printf("%8ld bytes: %7.3f GB/s (%ld exchanges)\n", sizes[s], sizes[s] * (double)iters / t / 1e9, iters);
		free(send);
		free(recv);
	}
	MPI_Finalize();
	return 0;
}
