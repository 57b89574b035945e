/* The OpenMPI peer of the side-by-side benchmark (issue 18, scripts/bench-peers.sh):
 * MPI_Allreduce of floats (sum, out of place) over sizes min..max (bytes, times factor),
 * timed like nccl-tests: `warmup` untimed operations, a barrier, `iters` timed ones; the
 * time per operation is averaged over ranks. Buffers are written before timing.
 *
 * usage: mpi_allreduce MINBYTES MAXBYTES FACTOR ITERS WARMUP
 * prints, on rank 0, one line per size: "bytes time_us busbw_GBps" (AllReduce busbw as
 * nccl-tests computes it: bytes / time x 2(n-1)/n), and checks the result of the last
 * operation of each size (exit 1 on a wrong value). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc != 6) {
        if (rank == 0)
            fprintf(stderr, "usage: %s MINBYTES MAXBYTES FACTOR ITERS WARMUP\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    long long minb = atoll(argv[1]), maxb = atoll(argv[2]), factor = atoll(argv[3]);
    int iters = atoi(argv[4]), warm = atoi(argv[5]);
    if (minb < 4 || maxb < minb || factor < 2 || iters < 1 || warm < 0) {
        if (rank == 0) fprintf(stderr, "bad arguments\n");
        MPI_Finalize();
        return 2;
    }
    size_t maxc = (size_t)(maxb / 4);
    float *send = malloc(maxc * sizeof(float));
    float *recv = malloc(maxc * sizeof(float));
    if (!send || !recv) {
        fprintf(stderr, "out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < maxc; i++) {
        send[i] = (float)((i + (size_t)rank) % 8);
        recv[i] = 0.0f;
    }
    int bad = 0;
    for (long long bytes = minb; bytes <= maxb; bytes *= factor) {
        int count = (int)(bytes / 4);
        for (int i = 0; i < warm; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double dt = (MPI_Wtime() - t0) / iters, sum = 0.0;
        MPI_Allreduce(&dt, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < count; i++) {
            float want = 0.0f;
            for (int r = 0; r < n; r++) want += (float)(((size_t)i + (size_t)r) % 8);
            if (recv[i] != want) bad = 1;
        }
        if (rank == 0) {
            double us = sum / n * 1e6;
            double busbw = (double)bytes / (us * 1e3) * 2.0 * (n - 1) / n;
            printf("%lld %.3f %.6f\n", (long long)count * 4, us, busbw);
            fflush(stdout);
        }
        if (bytes > maxb / factor) break;
    }
    int anybad = 0;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (anybad && rank == 0) fprintf(stderr, "mpi_allreduce: wrong results\n");
    free(send);
    free(recv);
    MPI_Finalize();
    return anybad ? 1 : 0;
}
