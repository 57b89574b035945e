/* A one-rank stand-in for libnccl.so.2, used only by this crate's tests to exercise the
 * perf engine without the real library: every collective over a single rank is a copy.
 * Knobs (environment): MOCK_NCCL_FAIL=1 makes ncclAllReduce fail with ncclSystemError;
 * MOCK_NCCL_CORRUPT=1 makes ncclAllReduce write a wrong first element. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { int rank; } mock_comm;
typedef struct { char internal[128]; } ncclUniqueId;

static size_t esize(int t) {
  switch (t) {
    case 0: case 1: case 10: case 11: return 1;
    case 6: case 9: return 2;
    case 2: case 3: case 7: return 4;
    default: return 8;
  }
}

int ncclGetVersion(int *v) { *v = 23007; return 0; }
int ncclGetUniqueId(ncclUniqueId *id) { memset(id, 0, sizeof(*id)); return 0; }
int ncclCommInitRank(void **comm, int nranks, ncclUniqueId id, int rank) {
  (void)id;
  if (nranks != 1 || rank != 0) return 5;
  *comm = calloc(1, sizeof(mock_comm));
  return 0;
}
int ncclCommDestroy(void *comm) { free(comm); return 0; }
int ncclCommAbort(void *comm) { (void)comm; return 0; }
const char *ncclGetErrorString(int r) { return r == 0 ? "no error" : "mock error"; }
const char *ncclGetLastError(void *comm) { (void)comm; return ""; }
int ncclGroupStart(void) { return 0; }
int ncclGroupEnd(void) { return 0; }

static void cp(void *dst, const void *src, size_t count, int t) {
  if (dst != src) memmove(dst, src, count * esize(t));
}

int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, void *c, void *st) {
  (void)op; (void)c; (void)st;
  const char *f = getenv("MOCK_NCCL_FAIL");
  if (f && f[0] == '1') return 2;
  cp(r, s, n, t);
  const char *k = getenv("MOCK_NCCL_CORRUPT");
  if (k && k[0] == '1' && n > 0) ((unsigned char *)r)[0] ^= 0x5a;
  return 0;
}
int ncclReduce(const void *s, void *r, size_t n, int t, int op, int root, void *c, void *st) {
  (void)op; (void)root; (void)c; (void)st; cp(r, s, n, t); return 0;
}
int ncclBroadcast(const void *s, void *r, size_t n, int t, int root, void *c, void *st) {
  (void)root; (void)c; (void)st; cp(r, s, n, t); return 0;
}
int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, void *c, void *st) {
  (void)op; (void)c; (void)st; cp(r, s, n, t); return 0;
}
int ncclAllGather(const void *s, void *r, size_t n, int t, void *c, void *st) {
  (void)c; (void)st; cp(r, s, n, t); return 0;
}
int ncclAlltoAll(const void *s, void *r, size_t n, int t, void *c, void *st) {
  (void)c; (void)st; cp(r, s, n, t); return 0;
}
int ncclGather(const void *s, void *r, size_t n, int t, int root, void *c, void *st) {
  (void)root; (void)c; (void)st; cp(r, s, n, t); return 0;
}
int ncclScatter(const void *s, void *r, size_t n, int t, int root, void *c, void *st) {
  (void)root; (void)c; (void)st; cp(r, s, n, t); return 0;
}
static const void *pending_send;
int ncclSend(const void *s, size_t n, int t, int peer, void *c, void *st) {
  (void)n; (void)t; (void)peer; (void)c; (void)st; pending_send = s; return 0;
}
int ncclRecv(void *r, size_t n, int t, int peer, void *c, void *st) {
  (void)peer; (void)c; (void)st;
  if (!pending_send) return 5;
  cp(r, pending_send, n, t);
  pending_send = 0;
  return 0;
}
int ncclRedOpCreatePreMulSum(int *op, void *scalar, int t, int res, void *c) {
  (void)scalar; (void)t; (void)res; (void)c; *op = 5; return 0;
}
int ncclRedOpDestroy(int op, void *c) { (void)op; (void)c; return 0; }
int ncclCommRegister(void *c, void *b, size_t n, void **h) { (void)c; (void)b; (void)n; *h = (void *)1; return 0; }
int ncclCommDeregister(void *c, void *h) { (void)c; (void)h; return 0; }
