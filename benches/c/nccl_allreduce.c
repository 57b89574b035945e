/* The NCCL side of the side-by-side benchmark in the same shape as its OpenMPI peer
 * (benches/c/mpi_allreduce.c), so that both libraries are timed by the same minimal loop
 * (issue 18, scripts/bench-peers.sh). Built against NVIDIA's nccl.h; runs on any
 * libnccl.so.2 (ours on the host backend: buffers are host memory).
 *
 * It forks the rank processes itself (rank 0 is the parent, which made the unique id) and,
 * when there are no more ranks than CPUs the process may run on, binds rank r to the r-th
 * of them, as `mpirun` and `ccl-run` do by default (with more ranks than CPUs neither
 * binds, and neither does this). Per size: `warmup` untimed ncclAllReduce (float, sum, out of
 * place), a barrier (a 1-float AllReduce), `iters` timed ones; the time per operation is
 * averaged over ranks (an AllReduce of the ranks' times). Buffers are written before
 * timing, and the result of the last operation of each size is checked.
 *
 * usage: nccl_allreduce NRANKS MINBYTES MAXBYTES FACTOR ITERS WARMUP
 * prints, on rank 0, one line per size: "bytes time_us busbw_GBps" (busbw as nccl-tests
 * computes it for AllReduce: bytes / time x 2(n-1)/n). Exit status 0 when every rank ran
 * and every result was right; otherwise the first failing rank's (1: wrong results). */
#define _GNU_SOURCE
#include <nccl.h>

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAX_RANKS = 64 };

#define CHECK(call)                                                                 \
  do {                                                                              \
    ncclResult_t r_ = (call);                                                       \
    if (r_ != ncclSuccess) {                                                        \
      fprintf(stderr, "nccl_allreduce: rank %d: %s: %s\n", rank, #call,             \
              ncclGetErrorString(r_));                                              \
      exit(3);                                                                      \
    }                                                                               \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Binds the calling process to the rank-th of the k CPUs it may run on, if n <= k. */
static void bind_rank(int rank, int n) {
  cpu_set_t allowed, one;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  int k = CPU_COUNT(&allowed);
  if (k <= 0 || n > k) return;
  int want = rank, seen = 0;
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, &allowed)) continue;
    if (seen++ == want) {
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      sched_setaffinity(0, sizeof one, &one);
      return;
    }
  }
}

static int run_rank(int rank, int n, ncclUniqueId id, long long minb, long long maxb,
                    long long factor, int iters, int warm) {
  bind_rank(rank, n);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  size_t maxc = (size_t)(maxb / 4);
  float *send = malloc(maxc * sizeof(float));
  float *recv = malloc(maxc * sizeof(float));
  float *one = malloc(2 * sizeof(float));
  double *dt = malloc(2 * sizeof(double));
  if (!send || !recv || !one || !dt) {
    fprintf(stderr, "nccl_allreduce: rank %d: out of memory\n", rank);
    exit(3);
  }
  for (size_t i = 0; i < maxc; i++) {
    send[i] = (float)((i + (size_t)rank) % 8);
    recv[i] = 0.0f;
  }
  one[0] = one[1] = 0.0f;
  int bad = 0;
  for (long long bytes = minb; bytes <= maxb; bytes *= factor) {
    size_t count = (size_t)(bytes / 4);
    for (int i = 0; i < warm; i++)
      CHECK(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, NULL));
    CHECK(ncclAllReduce(one, one + 1, 1, ncclFloat, ncclSum, comm, NULL));
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
      CHECK(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, NULL));
    dt[0] = (now_s() - t0) / iters;
    for (size_t i = 0; i < count; i++) {
      float want = 0.0f;
      for (int r = 0; r < n; r++) want += (float)((i + (size_t)r) % 8);
      if (recv[i] != want) bad = 1;
    }
    CHECK(ncclAllReduce(dt, dt + 1, 1, ncclFloat64, ncclSum, comm, NULL));
    if (rank == 0) {
      double us = dt[1] / n * 1e6;
      double busbw = (double)bytes / (us * 1e3) * 2.0 * (n - 1) / n;
      printf("%lld %.3f %.6f\n", (long long)count * 4, us, busbw);
      fflush(stdout);
    }
    if (bytes > maxb / factor) break;
  }
  if (bad) fprintf(stderr, "nccl_allreduce: rank %d: wrong results\n", rank);
  CHECK(ncclCommDestroy(comm));
  free(send);
  free(recv);
  free(one);
  free(dt);
  return bad ? 1 : 0;
}

int main(int argc, char **argv) {
  int rank = 0;
  if (argc != 7) {
    fprintf(stderr, "usage: %s NRANKS MINBYTES MAXBYTES FACTOR ITERS WARMUP\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  long long minb = atoll(argv[2]), maxb = atoll(argv[3]), factor = atoll(argv[4]);
  int iters = atoi(argv[5]), warm = atoi(argv[6]);
  if (n < 1 || n > MAX_RANKS || minb < 4 || maxb < minb || factor < 2 || iters < 1 ||
      warm < 0) {
    fprintf(stderr, "nccl_allreduce: bad arguments\n");
    return 2;
  }
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  fflush(stdout);
  pid_t pids[MAX_RANKS] = {0};
  for (int q = 1; q < n; q++) {
    pid_t p = fork();
    if (p < 0) {
      fprintf(stderr, "nccl_allreduce: fork: %s\n", strerror(errno));
      return 3;
    }
    if (p == 0) exit(run_rank(q, n, id, minb, maxb, factor, iters, warm));
    pids[q] = p;
  }
  int status = run_rank(0, n, id, minb, maxb, factor, iters, warm);
  for (int q = 1; q < n; q++) {
    int st = 0;
    if (waitpid(pids[q], &st, 0) < 0) {
      if (status == 0) status = 3;
      continue;
    }
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (status == 0) status = code;
  }
  return status;
}
