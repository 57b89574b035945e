/* Bad input through the C ABI, built against NVIDIA's nccl.h and run on ccl-d's
 * libnccl.so.2: every call must return the documented error code (never crash or hang).
 *
 *   badinput            checks that need no working communicator
 *   badinput randomid   ncclCommInitRank with an id of random bytes must fail quickly
 *   badinput noroot     ncclCommInitRank to a root that is no longer listening must fail
 *                       (run with a short CCLD_BOOTSTRAP_TIMEOUT_S)
 *
 * Exit 0 = all checks passed. */
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int fails = 0;
#define EXPECT(cond, ...)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      fails++;                                                                 \
    }                                                                          \
  } while (0)

#define EXPECT_CODE(call, want)                                                           \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    EXPECT(r_ == (want), "%s returned %d (%s), want %d; last error: %s", #call, (int)r_, \
           ncclGetErrorString(r_), (int)(want), ncclGetLastError(NULL));                  \
  } while (0)

#define EXPECT_LAST_ERROR(text) \
  EXPECT(strstr(ncclGetLastError(NULL), text) != NULL, "last error %s lacks %s", ncclGetLastError(NULL), text)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void basic(void) {
  int v = 0;
  EXPECT_CODE(ncclGetVersion(&v), ncclSuccess);
  EXPECT(v == NCCL_VERSION_CODE, "version %d", v);
  EXPECT(v == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), "version %d", v);
  EXPECT_CODE(ncclGetVersion(NULL), ncclInvalidArgument);
  EXPECT_LAST_ERROR("version is NULL");

  EXPECT(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "%s", ncclGetErrorString(ncclSuccess));
  EXPECT(strcmp(ncclGetErrorString(ncclInvalidArgument),
                "invalid argument (run with NCCL_DEBUG=WARN for details)") == 0, "bad string");
  EXPECT(strcmp(ncclGetErrorString(ncclRemoteError),
                "remote process exited or there was a network error") == 0, "bad string");
  EXPECT(strcmp(ncclGetErrorString((ncclResult_t)1234), "unknown result code") == 0, "bad string");
  EXPECT(strcmp(pncclGetErrorString(ncclTimeout), "timeout") == 0, "bad p-string");

  /* NULL out-pointers and NULL / junk communicators. */
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  EXPECT_CODE(ncclGetUniqueId(NULL), ncclInvalidArgument);
  EXPECT_CODE(ncclCommInitRank(NULL, 2, id, 0), ncclInvalidArgument);
  ncclComm_t comm = (ncclComm_t)0x1;
  EXPECT_CODE(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  EXPECT(comm == NULL, "comm not cleared on failure");
  EXPECT_CODE(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  EXPECT_LAST_ERROR("rank 2");
  EXPECT_CODE(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument);
  EXPECT_CODE(ncclCommInitAll(NULL, 2, NULL), ncclInvalidArgument);
  EXPECT_CODE(ncclCommInitAll(&comm, 0, NULL), ncclInvalidArgument);

  int n = 0;
  EXPECT_CODE(ncclCommCount(NULL, &n), ncclInvalidArgument);
  EXPECT_LAST_ERROR("comm is NULL");
  int junk_storage[64] = {0};
  ncclComm_t junk = (ncclComm_t)(void *)junk_storage;
  EXPECT_CODE(ncclCommCount(junk, &n), ncclInvalidArgument);
  EXPECT_LAST_ERROR("not a live communicator");
  EXPECT_CODE(ncclCommUserRank(junk, &n), ncclInvalidArgument);
  EXPECT_CODE(ncclCommCuDevice(NULL, &n), ncclInvalidArgument);
  ncclResult_t async = ncclSuccess;
  EXPECT_CODE(ncclCommGetAsyncError(junk, &async), ncclInvalidArgument);
  EXPECT_CODE(ncclCommFinalize(NULL), ncclInvalidArgument);
  EXPECT_CODE(ncclCommDestroy(NULL), ncclSuccess);
  EXPECT_CODE(ncclCommAbort(NULL), ncclSuccess);
  EXPECT_CODE(ncclCommDestroy(junk), ncclInvalidArgument);
  EXPECT_CODE(ncclCommSplit(junk, 0, 0, &comm, NULL), ncclInvalidArgument);
  EXPECT_CODE(ncclCommSplit(junk, 0, 0, NULL, NULL), ncclInvalidArgument);

  float buf[16] = {0};
  EXPECT_CODE(ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument);
  EXPECT_CODE(ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, junk, NULL), ncclInvalidArgument);
  EXPECT_CODE(ncclBcast(buf, 16, ncclFloat, 0, junk, NULL), ncclInvalidArgument);
  EXPECT_CODE(ncclSend(buf, 16, ncclFloat, 1, NULL, NULL), ncclInvalidArgument);
  EXPECT_CODE(ncclRecv(buf, 16, ncclFloat, 1, NULL, NULL), ncclInvalidArgument);
  EXPECT_CODE(pncclAllGather(buf, buf, 1, ncclFloat, NULL, NULL), ncclInvalidArgument);
  ncclRedOp_t op;
  float scalar = 2.0f;
  EXPECT_CODE(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, NULL),
              ncclInvalidArgument);
  EXPECT_CODE(ncclRedOpDestroy(ncclSum, NULL), ncclInvalidArgument);

  /* Configuration with a wrong magic: rejected before any network activity. */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0x12345678;
  EXPECT_CODE(ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), ncclInvalidArgument);
  EXPECT_LAST_ERROR("magic");
  ncclConfig_t cfg2 = NCCL_CONFIG_INITIALIZER;
  cfg2.blocking = 7;
  EXPECT_CODE(ncclCommInitRankConfig(&comm, 1, id, 0, &cfg2), ncclInvalidArgument);
  EXPECT_LAST_ERROR("blocking");

  /* Host memory allocation. */
  void *p = NULL;
  EXPECT_CODE(ncclMemAlloc(&p, 5000), ncclSuccess);
  EXPECT(p != NULL && ((uintptr_t)p % 4096) == 0, "ncclMemAlloc gave %p", p);
  if (p) memset(p, 0xab, 5000);
  EXPECT_CODE(ncclMemFree(p), ncclSuccess);
  EXPECT_CODE(ncclMemFree(p), ncclInvalidArgument);
  EXPECT_CODE(ncclMemFree(buf), ncclInvalidArgument);
  EXPECT_CODE(ncclMemAlloc(NULL, 16), ncclInvalidArgument);
  EXPECT_CODE(ncclMemAlloc(&p, 0), ncclInvalidArgument);

  /* Functions this library does not implement: ncclInvalidUsage plus a message. */
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_CODE(ncclGroupSimulateEnd(&sim), ncclInvalidUsage);
  EXPECT_LAST_ERROR("ncclGroupSimulateEnd is not supported by this library yet");
  ncclParamHandle_t ph;
  EXPECT_CODE(ncclParamBind(&ph, "NCCL_BUFFSIZE"), ncclInvalidUsage);
  EXPECT_LAST_ERROR("ncclParamBind is not supported by this library yet");
  const char *val = NULL;
  int len = 0;
  EXPECT_CODE(pncclParamGetParameter("NCCL_BUFFSIZE", &val, &len), ncclInvalidUsage);
  EXPECT_LAST_ERROR("ncclParamGetParameter is not supported");
  EXPECT_CODE(ncclCommGrow(NULL, 2, &id, 1, &comm, NULL), ncclInvalidUsage);
  EXPECT_LAST_ERROR("ncclCommGrow is not supported");
  ncclParamDumpAll(); /* void: must simply return */
  EXPECT_LAST_ERROR("ncclParamDumpAll is not supported");
}

/* An id of (seeded) random bytes must be rejected quickly, never hang. */
static void random_id(void) {
  ncclUniqueId id;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < sizeof(id.internal); i++) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    id.internal[i] = (char)(x & 0xff);
  }
  ncclComm_t comm = NULL;
  double t0 = now();
  ncclResult_t r = ncclCommInitRank(&comm, 2, id, 1);
  double dt = now() - t0;
  EXPECT(r != ncclSuccess && r != ncclInProgress, "random id accepted (%d)", (int)r);
  EXPECT(comm == NULL, "comm set on failure");
  EXPECT(dt < 20.0, "random id took %.1f s to fail", dt);
  printf("random id: %s after %.2f s: %s\n", ncclGetErrorString(r), dt, ncclGetLastError(NULL));
}

/* A child creates an id (its process hosts the root) and exits; joining that id must fail
 * within a bounded time. */
static void no_root(void) {
  int fd[2];
  if (pipe(fd) != 0) { fails++; return; }
  pid_t p = fork();
  if (p == 0) {
    ncclUniqueId id;
    close(fd[0]);
    if (ncclGetUniqueId(&id) != ncclSuccess) _exit(2);
    if (write(fd[1], &id, sizeof(id)) != (ssize_t)sizeof(id)) _exit(3);
    _exit(0);
  }
  close(fd[1]);
  ncclUniqueId id;
  ssize_t got = read(fd[0], &id, sizeof(id));
  int st = 0;
  waitpid(p, &st, 0);
  EXPECT(got == (ssize_t)sizeof(id) && WIFEXITED(st) && WEXITSTATUS(st) == 0,
         "child could not create an id (status %#x)", st);
  if (got != (ssize_t)sizeof(id)) return;
  ncclComm_t comm = NULL;
  double t0 = now();
  ncclResult_t r = ncclCommInitRank(&comm, 2, id, 1);
  double dt = now() - t0;
  EXPECT(r != ncclSuccess && r != ncclInProgress, "joined a dead root (%d)", (int)r);
  EXPECT(dt < 30.0, "joining a dead root took %.1f s to fail", dt);
  EXPECT(comm == NULL, "comm set on failure");
  printf("no root: %s after %.2f s: %s\n", ncclGetErrorString(r), dt, ncclGetLastError(NULL));
}

int main(int argc, char **argv) {
  alarm(120);
  const char *mode = argc > 1 ? argv[1] : "basic";
  if (strcmp(mode, "basic") == 0) basic();
  else if (strcmp(mode, "randomid") == 0) random_id();
  else if (strcmp(mode, "noroot") == 0) no_root();
  else return 64;
  if (fails) fprintf(stderr, "%d check(s) failed\n", fails);
  else printf("%s ok\n", mode);
  return fails ? 1 : 0;
}
