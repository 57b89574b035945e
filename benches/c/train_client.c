/* An independent training-loop client of libnccl.so.2, built against NVIDIA's nccl.h.
 *
 * It forks N rank processes. Each inits the world communicator (DP), splits tensor-parallel
 * pairs with ncclCommSplit (color = rank / 2), and loops:
 *   compute, AllReduce on DP, AllReduce on TP, pipeline Send/Recv
 *   between stage pairs (stage = TP pair; rank r sends to r + 2 and receives from r - 2 on
 *   DP), and every k iterations a barrier (a 4-byte AllReduce, as PyTorch's).
 * Every result value is verified. A wrong value or a failed call prints one line
 *   ccld-client: rank R pid P: ERROR ...
 * on stderr and exits non-zero. Buffers are host memory (ccl-d's CPU backend).
 *
 * Lines on stdout, for a harness (one line per write, flushed):
 *   READY rank=R pid=P           after both communicators exist
 *   FAULT rank=R kind=K iter=I unix_ns=T   when a fault switch of its own takes effect
 *   DONE rank=R iters=I          at a clean end
 *
 * Fault switches (all from --fault-after seconds into the loop on; one rank each):
 *   --slow-rank R --slow-factor F   compute F times longer on rank R
 *   --inconsistent-rank R           rank R calls ncclAllGather(count / n) once instead of
 *                                   ncclAllReduce(count) on DP
 *   --skip-rank R                   rank R skips one DP AllReduce
 *   --bad-call-rank R               rank R issues its DP AllReduce once in a group with a
 *                                   second AllReduce of an invalid data type: ncclGroupEnd
 *                                   fails (NCCL cancels the whole group) and the rank stays
 *                                   in its error handling (waits for a signal) alive
 * Length: --iters I (exact), or --seconds S (rank 0 decides, announced through the barrier).
 * Sizes: --ranks N (2..64), --count C floats per AllReduce, --compute-us U, --barrier-every K.
 * Compute: --compute-mode wait (default) sleeps U us, as the host thread of a rank whose
 *   GPU computes (its CPU is idle in cudaStreamSynchronize or in the next enqueue); busy
 *   spins a CPU loop for U us (CPU-bound training: ranks compete for cores, and on a host
 *   with fewer cores than ranks the scheduler makes one rank or another late by itself).
 * --no-tp and --no-pipeline leave out the TP communicator and the pipeline traffic.
 *
 * Exit status: 0 when every rank ended cleanly; otherwise the first failing rank's. */
#include <nccl.h>

#include <errno.h>
#include <stdarg.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAX_RANKS = 64 };

struct opts {
  int ranks;
  long iters;
  double seconds;
  size_t count;
  long compute_us;
  int compute_busy;
  int barrier_every;
  int tp;
  int pipeline;
  double fault_after;
  int slow_rank;
  double slow_factor;
  int inconsistent_rank;
  int skip_rank;
  int bad_call_rank;
};

static struct opts o = {
    .ranks = 4,
    .iters = 0,
    .seconds = 10.0,
    .count = 16384,
    .compute_us = 2000,
    .barrier_every = 10,
    .tp = 1,
    .pipeline = 1,
    .fault_after = 3.0,
    .slow_rank = -1,
    .slow_factor = 4.0,
    .inconsistent_rank = -1,
    .skip_rank = -1,
    .bad_call_rank = -1,
};

static int g_rank = -1;

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long long unix_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

static void die(int code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fprintf(stderr, "ccld-client: rank %d pid %d: ERROR %s\n", g_rank, (int)getpid(), msg);
  fflush(stderr);
  fflush(stdout);
  /* exit(), not _exit(): the library's exit handlers (probe flush) run. */
  exit(code);
}

#define CHECK(call, what)                                                                   \
  do {                                                                                      \
    ncclResult_t r_ = (call);                                                               \
    if (r_ != ncclSuccess)                                                                  \
      die(2, "%s failed: %s (%d): %s", what, ncclGetErrorString(r_), (int)r_,              \
          ncclGetLastError(NULL));                                                          \
  } while (0)

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
}

/* `us` microseconds of computation. wait: sleeps until the deadline (a host thread
 * waiting for its GPU; a stopped process resumes late and is late). busy: a CPU loop. */
static volatile uint64_t sink;
static void compute(double us) {
  double end = mono_s() + us / 1e6;
  if (!o.compute_busy) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = (long long)ts.tv_nsec + (long long)(us * 1e3);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
    return;
  }
  uint64_t x = 88172645463325252ULL;
  while (mono_s() < end) {
    for (int i = 0; i < 256; i++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
  }
  sink = x;
}

static float dp_value(int rank, long it, size_t i) {
  return (float)(rank + 1) + (float)((size_t)it % 7 + i % 5);
}

static float tp_value(int rank, long it, size_t i) {
  return (float)(2 * rank + 1) + (float)((size_t)it % 3 + i % 11);
}

static int32_t pp_value(int rank, long it, size_t i) {
  return (int32_t)(rank * 1000 + (int)(it % 100)) + (int32_t)(i % 9);
}

static int run_rank(int rank, int n, ncclUniqueId id) {
  g_rank = rank;
  ncclComm_t dp = NULL, tp = NULL;
  CHECK(ncclCommInitRank(&dp, n, id, rank), "ncclCommInitRank(DP)");
  int tp_n = 0, tp_members[2] = {0, 0};
  if (o.tp) {
    CHECK(ncclCommSplit(dp, rank / 2, rank, &tp, NULL), "ncclCommSplit(TP)");
    if (tp == NULL) die(2, "ncclCommSplit(TP) gave no communicator");
    CHECK(ncclCommCount(tp, &tp_n), "ncclCommCount(TP)");
    int want = (rank / 2) * 2 + 1 < n ? 2 : 1;
    if (tp_n != want) die(3, "TP communicator has %d ranks, want %d", tp_n, want);
    tp_members[0] = (rank / 2) * 2;
    tp_members[1] = tp_members[0] + 1;
  }
  size_t count = o.count;
  float *dsend = malloc(count * sizeof(float));
  float *drecv = malloc(count * sizeof(float));
  float *tsend = malloc(count * sizeof(float));
  float *trecv = malloc(count * sizeof(float));
  size_t pp_count = count / 4 ? count / 4 : 1;
  int32_t *psend = malloc(pp_count * sizeof(int32_t));
  int32_t *precv = malloc(pp_count * sizeof(int32_t));
  if (!dsend || !drecv || !tsend || !trecv || !psend || !precv) die(4, "out of memory");
  int next = rank + 2 < n ? rank + 2 : -1;
  int prev = rank - 2 >= 0 ? rank - 2 : -1;
  say("READY rank=%d pid=%d\n", rank, (int)getpid());

  double t0 = mono_s();
  int inconsistent_done = 0, skip_done = 0, slow_announced = 0;
  long it = 0;
  for (;;) {
    if (o.iters > 0 && it >= o.iters) break;
    int faulting = mono_s() - t0 >= o.fault_after;
    /* compute */
    double us = (double)o.compute_us;
    if (rank == o.slow_rank && faulting) {
      us *= o.slow_factor;
      if (!slow_announced) {
        slow_announced = 1;
        say("FAULT rank=%d kind=slow iter=%ld unix_ns=%lld\n", rank, it, unix_ns());
      }
    }
    compute(us);

    /* DP AllReduce (or the fault switches' replacement) */
    for (size_t i = 0; i < count; i++) dsend[i] = dp_value(rank, it, i);
    int check_dp = 1;
    if (rank == o.inconsistent_rank && faulting && !inconsistent_done) {
      inconsistent_done = 1;
      check_dp = 0;
      say("FAULT rank=%d kind=inconsistent iter=%ld unix_ns=%lld\n", rank, it, unix_ns());
      size_t part = count / (size_t)n ? count / (size_t)n : 1;
      float *gath = malloc(part * (size_t)n * sizeof(float));
      if (!gath) die(4, "out of memory");
      CHECK(ncclAllGather(dsend, gath, part, ncclFloat, dp, NULL), "ncclAllGather(DP, inconsistent)");
      free(gath);
    } else if (rank == o.bad_call_rank && faulting) {
      say("FAULT rank=%d kind=bad-call iter=%ld unix_ns=%lld\n", rank, it, unix_ns());
      CHECK(ncclGroupStart(), "ncclGroupStart");
      CHECK(ncclAllReduce(dsend, drecv, count, ncclFloat, ncclSum, dp, NULL), "ncclAllReduce(DP)");
      ncclResult_t bad = ncclAllReduce(dsend, drecv, count, (ncclDataType_t)99, ncclSum, dp, NULL);
      ncclResult_t end = ncclGroupEnd();
      if (bad == ncclSuccess || end == ncclSuccess)
        die(6, "a bad data type was accepted (call %d, ncclGroupEnd %d)", (int)bad, (int)end);
      fprintf(stderr, "ccld-client: rank %d pid %d: ncclGroupEnd: %s: %s; waiting in the error handler\n",
              rank, (int)getpid(), ncclGetErrorString(end), ncclGetLastError(dp));
      for (;;) pause();
    } else if (rank == o.skip_rank && faulting && !skip_done) {
      skip_done = 1;
      check_dp = 0;
      say("FAULT rank=%d kind=skip iter=%ld unix_ns=%lld\n", rank, it, unix_ns());
    } else {
      CHECK(ncclAllReduce(dsend, drecv, count, ncclFloat, ncclSum, dp, NULL), "ncclAllReduce(DP)");
    }
    if (check_dp) {
      for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int q = 0; q < n; q++) want += dp_value(q, it, i);
        if (drecv[i] != want)
          die(5, "wrong value: DP AllReduce iter %ld [%zu] = %g, want %g", it, i, (double)drecv[i],
              (double)want);
      }
    }

    /* TP AllReduce */
    if (tp) {
      for (size_t i = 0; i < count; i++) tsend[i] = tp_value(rank, it, i);
      CHECK(ncclAllReduce(tsend, trecv, count, ncclFloat, ncclSum, tp, NULL), "ncclAllReduce(TP)");
      for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int k = 0; k < tp_n; k++) want += tp_value(tp_members[k], it, i);
        if (trecv[i] != want)
          die(5, "wrong value: TP AllReduce iter %ld [%zu] = %g, want %g", it, i, (double)trecv[i],
              (double)want);
      }
    }

    /* pipeline: activations to the next stage, from the previous one */
    if (o.pipeline && (next >= 0 || prev >= 0)) {
      for (size_t i = 0; i < pp_count; i++) psend[i] = pp_value(rank, it, i);
      CHECK(ncclGroupStart(), "ncclGroupStart");
      if (next >= 0) CHECK(ncclSend(psend, pp_count, ncclInt32, next, dp, NULL), "ncclSend(pipeline)");
      if (prev >= 0) CHECK(ncclRecv(precv, pp_count, ncclInt32, prev, dp, NULL), "ncclRecv(pipeline)");
      CHECK(ncclGroupEnd(), "ncclGroupEnd(pipeline)");
      if (prev >= 0) {
        for (size_t i = 0; i < pp_count; i++)
          if (precv[i] != pp_value(prev, it, i))
            die(5, "wrong value: pipeline Recv from rank %d iter %ld [%zu] = %d, want %d", prev, it,
                i, (int)precv[i], (int)pp_value(prev, it, i));
      }
    }

    it++;
    /* barrier: a 4-byte AllReduce; rank 0 also announces the end of a --seconds run */
    if (o.barrier_every > 0 && it % o.barrier_every == 0) {
      int stop = o.iters == 0 && rank == 0 && mono_s() - t0 >= o.seconds;
      int32_t b = 1 + (stop ? 1 << 16 : 0), sum = 0;
      CHECK(ncclAllReduce(&b, &sum, 1, ncclInt32, ncclSum, dp, NULL), "ncclAllReduce(barrier)");
      if ((sum & 0xffff) != n || (sum >> 16) > 1)
        die(5, "wrong value: barrier iter %ld = %#x, want %#x or %#x", it, (unsigned)sum,
            (unsigned)n, (unsigned)(n + (1 << 16)));
      if (sum >> 16) break;
    } else if (o.iters == 0 && o.barrier_every <= 0 && mono_s() - t0 >= o.seconds) {
      break; /* no barrier: only exact with --iters; every rank stops on its own clock */
    }
  }
  if (tp) CHECK(ncclCommDestroy(tp), "ncclCommDestroy(TP)");
  CHECK(ncclCommDestroy(dp), "ncclCommDestroy(DP)");
  free(dsend); free(drecv); free(tsend); free(trecv); free(psend); free(precv);
  say("DONE rank=%d iters=%ld\n", rank, it);
  return 0;
}

static void usage(const char *why) {
  fprintf(stderr,
          "ccld-client: %s\n"
          "usage: train_client [--ranks N] [--iters I | --seconds S] [--count C]\n"
          "  [--compute-us U] [--compute-mode wait|busy] [--barrier-every K] [--no-tp]\n"
          "  [--no-pipeline]\n"
          "  [--fault-after S] [--slow-rank R [--slow-factor F]] [--inconsistent-rank R]\n"
          "  [--skip-rank R] [--bad-call-rank R]\n",
          why);
  exit(64);
}

static double num(const char *flag, const char *v, double lo, double hi) {
  if (!v) usage("missing value");
  char *end = NULL;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || x < lo || x > hi) {
    fprintf(stderr, "ccld-client: %s %s: want a number in [%g, %g]\n", flag, v, lo, hi);
    exit(64);
  }
  return x;
}

static void parse(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--no-tp")) { o.tp = 0; continue; }
    if (!strcmp(a, "--no-pipeline")) { o.pipeline = 0; continue; }
    if (!strcmp(a, "--help")) usage("help");
    i++;
    if (!strcmp(a, "--ranks")) o.ranks = (int)num(a, v, 2, MAX_RANKS);
    else if (!strcmp(a, "--iters")) o.iters = (long)num(a, v, 1, 1e12);
    else if (!strcmp(a, "--seconds")) o.seconds = num(a, v, 0, 86400);
    else if (!strcmp(a, "--count")) o.count = (size_t)num(a, v, 1, 1 << 26);
    else if (!strcmp(a, "--compute-us")) o.compute_us = (long)num(a, v, 0, 1e8);
    else if (!strcmp(a, "--compute-mode")) {
      if (v && !strcmp(v, "wait")) o.compute_busy = 0;
      else if (v && !strcmp(v, "busy")) o.compute_busy = 1;
      else usage("--compute-mode: want wait or busy");
    }
    else if (!strcmp(a, "--barrier-every")) o.barrier_every = (int)num(a, v, 0, 1e6);
    else if (!strcmp(a, "--fault-after")) o.fault_after = num(a, v, 0, 86400);
    else if (!strcmp(a, "--slow-rank")) o.slow_rank = (int)num(a, v, 0, MAX_RANKS - 1);
    else if (!strcmp(a, "--slow-factor")) o.slow_factor = num(a, v, 1, 1e6);
    else if (!strcmp(a, "--inconsistent-rank")) o.inconsistent_rank = (int)num(a, v, 0, MAX_RANKS - 1);
    else if (!strcmp(a, "--skip-rank")) o.skip_rank = (int)num(a, v, 0, MAX_RANKS - 1);
    else if (!strcmp(a, "--bad-call-rank")) o.bad_call_rank = (int)num(a, v, 0, MAX_RANKS - 1);
    else {
      fprintf(stderr, "ccld-client: unknown option %s\n", a);
      usage("bad arguments");
    }
  }
  if (o.slow_rank >= o.ranks || o.inconsistent_rank >= o.ranks || o.skip_rank >= o.ranks ||
      o.bad_call_rank >= o.ranks)
    usage("a fault rank is not below --ranks");
  if (o.iters == 0 && o.barrier_every == 0)
    usage("--seconds needs barriers (--barrier-every > 0) to end every rank together");
}

int main(int argc, char **argv) {
  parse(argc, argv);
  /* Bounded: no rank outlives its run by more than a minute. */
  unsigned limit = (unsigned)(o.iters > 0 ? 600 : o.seconds + 60);
  int n = o.ranks;
  /* The unique id is made before the fork, as a launcher does; the bootstrap root it
   * starts lives in this (rank 0's) process. */
  ncclUniqueId id;
  g_rank = 0;
  CHECK(ncclGetUniqueId(&id), "ncclGetUniqueId");
  fflush(stdout);
  fflush(stderr);
  pid_t pids[MAX_RANKS] = {0};
  for (int q = 1; q < n; q++) {
    pid_t p = fork();
    if (p < 0) die(66, "fork: %s", strerror(errno));
    if (p == 0) {
      alarm(limit);
      exit(run_rank(q, n, id));
    }
    pids[q] = p;
  }
  alarm(limit);
  int rc = run_rank(0, n, id);
  for (int q = 1; q < n; q++) {
    int st = 0;
    if (waitpid(pids[q], &st, 0) < 0) {
      fprintf(stderr, "ccld-client: waitpid(rank %d): %s\n", q, strerror(errno));
      if (!rc) rc = 69;
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      if (WIFSIGNALED(st))
        fprintf(stderr, "ccld-client: rank %d pid %d ended by signal %d\n", q, (int)pids[q],
                WTERMSIG(st));
      else
        fprintf(stderr, "ccld-client: rank %d pid %d exited with %d\n", q, (int)pids[q],
                WEXITSTATUS(st));
      if (!rc) rc = WIFEXITED(st) ? WEXITSTATUS(st) : 70;
    }
  }
  if (!rc) say("ALL OK ranks=%d\n", n);
  return rc;
}
