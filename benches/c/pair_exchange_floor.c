/* The floor of a 2-rank 8-byte AllReduce on this machine, without any library: two
 * processes, bound to the first two CPUs the caller may run on, add two floats through
 * shared memory. Each message is one cache line (the two values and a sequence number
 * written last); a rank waits for the partner's line of the same operation by spinning on
 * it. Message k goes to line k % 2 of the sender's pair of lines, so a partner one
 * operation ahead never overwrites a line still to be read. This is what an 8-byte
 * AllReduce costs when the per-call work is nothing and one cache line moves each way,
 * the reference against which docs/performance.md sets ours and OpenMPI's.
 *
 * build: cc -O2 -o /tmp/pair_exchange_floor benches/c/pair_exchange_floor.c
 * usage: pair_exchange_floor ITERS
 * prints "8 time_us" (time per operation, mean of the two ranks) like nccl_allreduce.c;
 * exit status 0 when both ranks' sums were right, 1 when one was wrong, 2 for bad
 * arguments, 3 when the mapping or the second process could not be made or a rank was
 * killed. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct line {
  float v[2];
  uint64_t seq; /* written last, with release order */
  char pad[48];
} __attribute__((aligned(64)));

struct shared {
  struct line out[2][2]; /* [rank][k % 2] */
  double us[2];
  int bad[2];
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Binds the calling process to the k-th CPU it may run on, if there is one. */
static void bind_to(int k) {
  cpu_set_t allowed, one;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return;
  int seen = 0;
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (CPU_ISSET(c, &allowed) && seen++ == k) {
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      sched_setaffinity(0, sizeof one, &one);
      return;
    }
  }
}

static pid_t parent, child;

/* Whether the other process still runs (checked now and then while spinning, so that a
 * killed partner ends the run instead of leaving this one spinning forever). */
static int partner_alive(int me) {
  if (me == 1) return getppid() == parent;
  return waitpid(child, NULL, WNOHANG) == 0;
}

/* Runs operations first..last-1 as `me`; returns whether every sum was right. Exits with
 * status 3 when the partner is gone. */
static int run(struct shared *s, int me, uint64_t first, uint64_t last) {
  int ok = 1;
  for (uint64_t k = first; k < last; k++) {
    struct line *mine = &s->out[me][k % 2], *theirs = &s->out[1 - me][k % 2];
    float x0 = (float)(k % 1000) + (float)me, x1 = 2.0f * (float)me;
    mine->v[0] = x0;
    mine->v[1] = x1;
    __atomic_store_n(&mine->seq, k + 1, __ATOMIC_RELEASE);
    for (uint32_t polls = 1; __atomic_load_n(&theirs->seq, __ATOMIC_ACQUIRE) != k + 1; polls++) {
      __builtin_ia32_pause();
      if (polls % (1u << 22) == 0 && !partner_alive(me)) {
        fprintf(stderr, "pair_exchange_floor: rank %d: the other rank is gone\n", me);
        exit(3);
      }
    }
    float y0 = theirs->v[0], y1 = theirs->v[1];
    /* Rank 0's value first on both ranks: the same bits everywhere. */
    float s0 = me == 0 ? x0 + y0 : y0 + x0, s1 = me == 0 ? x1 + y1 : y1 + x1;
    if (s0 != 2.0f * (float)(k % 1000) + 1.0f || s1 != 2.0f) ok = 0;
  }
  return ok;
}

int main(int argc, char **argv) {
  long long iters = argc == 2 ? atoll(argv[1]) : 0;
  if (iters < 1) {
    fprintf(stderr, "usage: %s ITERS\n", argv[0]);
    return 2;
  }
  struct shared *s =
      mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) {
    perror("pair_exchange_floor: mmap");
    return 3;
  }
  parent = getpid();
  child = fork();
  if (child < 0) {
    perror("pair_exchange_floor: fork");
    return 3;
  }
  int me = child == 0 ? 1 : 0;
  bind_to(me);
  uint64_t warm = (uint64_t)iters / 10 + 1;
  int ok = run(s, me, 0, warm);
  double t0 = now_s();
  ok &= run(s, me, warm, warm + (uint64_t)iters);
  s->us[me] = (now_s() - t0) / (double)iters * 1e6;
  s->bad[me] = !ok;
  if (me == 1) return ok ? 0 : 1;
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || s->bad[0] || s->bad[1]) {
    fprintf(stderr, "pair_exchange_floor: wrong sums\n");
    return 1;
  }
  printf("8 %.3f\n", (s->us[0] + s->us[1]) / 2.0);
  return 0;
}
