/* Shared helpers of the C-ABI test programs: checks that exit with a message, and a
 * multi-process runner. The parent forks nranks-1 children FIRST (so no library thread
 * exists at fork time), then creates the unique id and hands it to each child through a
 * pipe. Every process is bounded by alarm(). */
#ifndef CCL_TEST_HARNESS_H
#define CCL_TEST_HARNESS_H

#include <nccl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int g_rank __attribute__((unused)) = -1;

#define CHECK(call)                                                                   \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess) {                                                          \
      fprintf(stderr, "rank %d: %s:%d: %s failed: %d %s: %s\n", g_rank, __FILE__,     \
              __LINE__, #call, (int)r_, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
      exit(2);                                                                        \
    }                                                                                 \
  } while (0)

#define EXPECT(cond, ...)                                                                \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", g_rank, __FILE__, __LINE__, \
              #cond);                                                                    \
      fprintf(stderr, __VA_ARGS__);                                                      \
      fputc('\n', stderr);                                                               \
      exit(3);                                                                           \
    }                                                                                    \
  } while (0)

#define EXPECT_CODE(call, want)                                                           \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    EXPECT(r_ == (want), "%s returned %d (%s), want %d; last error: %s", #call, (int)r_, \
           ncclGetErrorString(r_), (int)(want), ncclGetLastError(NULL));                  \
  } while (0)

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef int (*rank_fn)(int rank, int nranks, ncclUniqueId id);

/* Runs fn on nranks processes (rank 0 is the caller). Returns 0 when every rank returned 0. */
static inline int run_forked(int nranks, rank_fn fn) {
  enum { MAXR = 64 };
  int fds[MAXR][2];
  pid_t pids[MAXR];
  if (nranks < 1 || nranks > MAXR) return 64;
  for (int q = 1; q < nranks; q++) {
    if (pipe(fds[q]) != 0) return 65;
    pid_t p = fork();
    if (p < 0) return 66;
    if (p == 0) {
      ncclUniqueId id;
      alarm(60);
      close(fds[q][1]);
      size_t got = 0;
      while (got < sizeof(id)) {
        ssize_t k = read(fds[q][0], (char *)&id + got, sizeof(id) - got);
        if (k <= 0) _exit(67); /* the parent failed before sending the id */
        got += (size_t)k;
      }
      g_rank = q;
      _exit(fn(q, nranks, id));
    }
    close(fds[q][0]);
    pids[q] = p;
  }
  ncclUniqueId id;
  g_rank = 0;
  ncclResult_t res = ncclGetUniqueId(&id);
  if (res != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId failed: %s: %s\n", ncclGetErrorString(res),
            ncclGetLastError(NULL));
    for (int q = 1; q < nranks; q++) close(fds[q][1]); /* children exit on EOF */
    for (int q = 1; q < nranks; q++) waitpid(pids[q], NULL, 0);
    return 2;
  }
  for (int q = 1; q < nranks; q++) {
    if (write(fds[q][1], &id, sizeof(id)) != (ssize_t)sizeof(id)) return 68;
    close(fds[q][1]);
  }
  int rc = fn(0, nranks, id);
  for (int q = 1; q < nranks; q++) {
    int st = 0;
    if (waitpid(pids[q], &st, 0) < 0) {
      rc = 69;
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d ended with status %#x\n", q, st);
      rc = 70;
    }
  }
  return rc;
}

#endif
