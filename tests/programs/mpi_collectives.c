/* Allreduce and alltoall over every rank of MPI_COMM_WORLD, results checked: each rank prints
 * "rank R: allreduce SUM alltoall ok|BAD" and exits non-zero on a wrong result.
 * Built by tests/tests/libfabric_mpi.rs with mpicc (Debian's libopenmpi-dev). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size; MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &size);
    long v = rank + 1, sum = 0;
    MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    int *out = malloc(size * sizeof(int)), *in = malloc(size * sizeof(int));
    for (int i = 0; i < size; i++) out[i] = rank * 100 + i;
    MPI_Alltoall(out, 1, MPI_INT, in, 1, MPI_INT, MPI_COMM_WORLD);
    int ok = sum == (long)size * (size + 1) / 2;
    for (int i = 0; i < size; i++) ok &= in[i] == i * 100 + rank;
    printf("rank %d: allreduce %ld alltoall %s\n", rank, sum, ok ? "ok" : "BAD");
    MPI_Finalize();
    return ok ? 0 : 1;
}
