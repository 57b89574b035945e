/* Communicator features through the C ABI (NVIDIA's nccl.h, ccl-d's libnccl.so.2):
 *
 *   features initall N      ncclCommInitAll of N ranks in this process; grouped AllReduce
 *                           and ReduceScatter over all of them from one thread; a group
 *                           with a failing call fails at ncclGroupEnd and runs nothing
 *   features split N        N processes; ncclCommSplit by parity with reversed keys, an
 *                           AllReduce in each half; NCCL_SPLIT_NOCOLOR gives NULL
 *   features nonblocking N  N processes; blocking = 0 in ncclConfig_t: init may return
 *                           ncclInProgress, then ncclCommGetAsyncError is polled
 *   features abort N        N processes; rank 0 blocks in an AllReduce the others never
 *                           join; another thread's ncclCommAbort must end it with an error
 *
 * Exit 0 = all good. */
#include "harness.h"

#include <pthread.h>

static int initall(int n) {
  ncclComm_t comms[16];
  EXPECT(n >= 1 && n <= 16, "bad n %d", n);
  CHECK(ncclCommInitAll(comms, n, NULL));
  const size_t count = 257;
  float *send[16], *recv[16], *rs[16];
  for (int r = 0; r < n; r++) {
    int c = -1, rk = -1;
    CHECK(ncclCommCount(comms[r], &c));
    CHECK(ncclCommUserRank(comms[r], &rk));
    EXPECT(c == n && rk == r, "comm %d: count %d rank %d", r, c, rk);
    send[r] = malloc(count * (size_t)n * sizeof(float));
    recv[r] = malloc(count * (size_t)n * sizeof(float));
    rs[r] = malloc(count * sizeof(float));
    for (size_t i = 0; i < count * (size_t)n; i++) send[r][i] = (float)(r + 1) + (float)(i % 5);
    for (size_t i = 0; i < count * (size_t)n; i++) recv[r][i] = -7.0f;
  }
  /* As NVIDIA's (ncclGroupErrCheck): a call that fails inside a group fails the group's
   * ncclGroupEnd with its error, and none of the group's operations run. */
  int junk_storage[64] = {0};
  ncclComm_t junk = (ncclComm_t)(void *)junk_storage;
  for (int variant = 0; variant < 2; variant++) {
    CHECK(ncclGroupStart());
    for (int r = 0; r < n; r++)
      CHECK(ncclAllReduce(send[r], recv[r], count, ncclFloat, ncclSum, comms[r], NULL));
    if (variant == 0)
      EXPECT_CODE(ncclAllReduce(send[0], recv[0], count, (ncclDataType_t)99, ncclSum, comms[0], NULL),
                  ncclInvalidArgument);
    else
      EXPECT_CODE(ncclAllReduce(send[0], recv[0], count, ncclFloat, ncclSum, junk, NULL),
                  ncclInvalidArgument);
    EXPECT_CODE(ncclGroupEnd(), ncclInvalidArgument);
    for (int r = 0; r < n; r++)
      EXPECT(recv[r][0] == -7.0f && recv[r][count - 1] == -7.0f,
             "variant %d: comm %d ran an operation of a failed group", variant, r);
  }
  EXPECT_CODE(ncclGroupEnd(), ncclInvalidUsage); /* nothing left open */
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++)
    CHECK(ncclAllReduce(send[r], recv[r], count, ncclFloat, ncclSum, comms[r], NULL));
  CHECK(ncclGroupEnd());
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++)
    CHECK(ncclReduceScatter(send[r], rs[r], count, ncclFloat, ncclMax, comms[r], NULL));
  CHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    for (size_t i = 0; i < count; i++) {
      float want = (float)(n * (n + 1) / 2) + (float)n * (float)(i % 5);
      EXPECT(recv[r][i] == want, "comm %d allreduce[%zu] = %f want %f", r, i, recv[r][i], want);
      size_t j = (size_t)r * count + i;
      float wmax = (float)n + (float)(j % 5);
      EXPECT(rs[r][i] == wmax, "comm %d reducescatter[%zu] = %f want %f", r, i, rs[r][i], wmax);
    }
  }
  for (int r = 0; r < n; r++) {
    CHECK(ncclCommDestroy(comms[r]));
    free(send[r]); free(recv[r]); free(rs[r]);
  }
  return 0;
}

static int split_rank(int rank, int nranks, ncclUniqueId id) {
  ncclComm_t comm = NULL, half = NULL, none = (ncclComm_t)0x1;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  int color = rank % 2;
  CHECK(ncclCommSplit(comm, color, -rank, &half, NULL));
  EXPECT(half != NULL, "split gave NULL");
  int members = 0, mine = 0;
  for (int q = 0; q < nranks; q++)
    if (q % 2 == color) {
      members++;
      if (q > rank) mine++; /* reversed keys: higher ranks come first */
    }
  int c = -1, r = -1;
  CHECK(ncclCommCount(half, &c));
  CHECK(ncclCommUserRank(half, &r));
  EXPECT(c == members && r == mine, "split count %d rank %d, want %d %d", c, r, members, mine);
  int64_t v = rank, sum = 0;
  CHECK(ncclAllReduce(&v, &sum, 1, ncclInt64, ncclSum, half, NULL));
  int64_t want = 0;
  for (int q = 0; q < nranks; q++)
    if (q % 2 == color) want += q;
  EXPECT(sum == want, "sum in half %lld want %lld", (long long)sum, (long long)want);
  /* Rank 0 opts out of a second split. */
  ncclComm_t second = NULL;
  CHECK(ncclCommSplit(comm, rank == 0 ? NCCL_SPLIT_NOCOLOR : 0, rank, rank == 0 ? &none : &second, NULL));
  if (rank == 0) {
    EXPECT(none == NULL, "NOCOLOR gave a communicator");
  } else {
    CHECK(ncclCommCount(second, &c));
    EXPECT(c == nranks - 1, "second split count %d", c);
    CHECK(ncclCommDestroy(second));
  }
  CHECK(ncclCommDestroy(half));
  CHECK(ncclCommDestroy(comm));
  return 0;
}

static void wait_ready(ncclComm_t comm) {
  double t0 = now_s();
  ncclResult_t st = ncclInProgress;
  while (st == ncclInProgress) {
    CHECK(ncclCommGetAsyncError(comm, &st));
    EXPECT(now_s() - t0 < 30.0, "still in progress after 30 s");
    if (st == ncclInProgress) usleep(1000);
  }
  EXPECT(st == ncclSuccess, "async error %d: %s", (int)st, ncclGetLastError(comm));
}

static int nonblocking_rank(int rank, int nranks, ncclUniqueId id) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "nonblocking-test";
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &cfg);
  EXPECT(r == ncclSuccess || r == ncclInProgress, "init returned %d: %s", (int)r, ncclGetLastError(NULL));
  EXPECT(comm != NULL, "no communicator handle while init is in progress");
  wait_ready(comm);
  int32_t v = rank + 1, out = 0;
  r = ncclAllReduce(&v, &out, 1, ncclInt32, ncclSum, comm, NULL);
  EXPECT(r == ncclSuccess || r == ncclInProgress, "allreduce returned %d", (int)r);
  wait_ready(comm);
  EXPECT(out == nranks * (nranks + 1) / 2, "sum %d", out);
  CHECK(ncclCommFinalize(comm));
  wait_ready(comm);
  CHECK(ncclCommDestroy(comm));
  return 0;
}

static void *abort_later(void *arg) {
  usleep(500 * 1000);
  ncclResult_t r = ncclCommAbort((ncclComm_t)arg);
  return (void *)(intptr_t)r;
}

static int abort_rank(int rank, int nranks, ncclUniqueId id) {
  ncclComm_t comm = NULL;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  if (rank != 0) {
    /* Never join rank 0's AllReduce; leave once rank 0 is surely done. */
    sleep(3);
    CHECK(ncclCommAbort(comm));
    return 0;
  }
  float x[64] = {0};
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, abort_later, comm) == 0, "pthread_create");
  double t0 = now_s();
  ncclResult_t r = ncclAllReduce(x, x, 64, ncclFloat, ncclSum, comm, NULL);
  double dt = now_s() - t0;
  void *ret = NULL;
  pthread_join(t, &ret);
  EXPECT(r != ncclSuccess, "AllReduce succeeded without its peers");
  EXPECT(dt < 10.0, "AllReduce took %.1f s to notice the abort", dt);
  EXPECT((intptr_t)ret == ncclSuccess, "ncclCommAbort returned %d", (int)(intptr_t)ret);
  /* The handle is gone: using it again is an error, not a crash. */
  int n = 0;
  EXPECT(ncclCommCount(comm, &n) == ncclInvalidArgument, "aborted handle still usable");
  printf("aborted AllReduce returned %s after %.2f s\n", ncclGetErrorString(r), dt);
  return 0;
}

int main(int argc, char **argv) {
  alarm(90);
  const char *mode = argc > 1 ? argv[1] : "";
  int n = argc > 2 ? atoi(argv[2]) : 4;
  int rc;
  if (strcmp(mode, "initall") == 0) rc = initall(n);
  else if (strcmp(mode, "split") == 0) rc = run_forked(n, split_rank);
  else if (strcmp(mode, "nonblocking") == 0) rc = run_forked(n, nonblocking_rank);
  else if (strcmp(mode, "abort") == 0) rc = run_forked(n, abort_rank);
  else return 64;
  if (rc == 0) printf("%s ok on %d ranks\n", mode, n);
  return rc;
}
