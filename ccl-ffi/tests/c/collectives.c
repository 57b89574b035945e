/* Multi-process end-to-end test through the C ABI, built against NVIDIA's nccl.h and run
 * on ccl-d's libnccl.so.2 (processes started by harness.h). Every rank checks every
 * collective (AllReduce out of/in place, AllGather, Broadcast, Reduce, ReduceScatter,
 * AlltoAll, Gather, Scatter, Bcast), a Send/Recv ring and a PreMulSum op on host buffers
 * (stream = NULL), then bad arguments on a live communicator. Exit 0 = all good. */
#include "harness.h"

/* ncclCommQueryProperties is declared by NVIDIA's C++-only nccl_device/core.h; the same
 * layout is repeated here to call it from C (the ABI test checks the layout separately). */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int rank, nRanks, cudaDev, nvmlDev;
  _Bool deviceApiSupport, multimemSupport;
  int ginType, nLsaTeams;
  _Bool hostRmaSupport;
  int railedGinType;
} test_comm_props_t;
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, test_comm_props_t *props);

static int run_rank(int rank, int nranks, ncclUniqueId id) {
  alarm(60);
  ncclComm_t comm = NULL;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  EXPECT(comm != NULL, "comm is NULL after init");
  int n = -1, r = -1;
  CHECK(ncclCommCount(comm, &n));
  CHECK(ncclCommUserRank(comm, &r));
  EXPECT(n == nranks && r == rank, "count %d rank %d", n, r);

  const size_t count = 1031; /* odd on purpose */

  /* AllReduce, float sum, out of place. Small integers are exact in float. */
  float *fs = malloc(count * sizeof(float)), *fr = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) fs[i] = (float)((rank + 1) * (int)(i % 7 + 1));
  CHECK(ncclAllReduce(fs, fr, count, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    float want = (float)((int)(i % 7 + 1) * nranks * (nranks + 1) / 2);
    EXPECT(fr[i] == want, "allreduce[%zu] = %f, want %f", i, fr[i], want);
    EXPECT(fs[i] == (float)((rank + 1) * (int)(i % 7 + 1)), "sendbuff modified");
  }

  /* AllReduce, int32 max, in place. */
  int32_t *im = malloc(count * sizeof(int32_t));
  for (size_t i = 0; i < count; i++) im[i] = (int32_t)((i * 31 + (size_t)rank * 17) % 1000);
  CHECK(ncclAllReduce(im, im, count, ncclInt32, ncclMax, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    int32_t want = -1;
    for (int q = 0; q < nranks; q++) {
      int32_t v = (int32_t)((i * 31 + (size_t)q * 17) % 1000);
      if (v > want) want = v;
    }
    EXPECT(im[i] == want, "allreduce max[%zu] = %d, want %d", i, im[i], want);
  }

  /* AllGather, int32. */
  int32_t *gs = malloc(count * sizeof(int32_t));
  int32_t *gr = malloc(count * (size_t)nranks * sizeof(int32_t));
  for (size_t i = 0; i < count; i++) gs[i] = rank * 100000 + (int32_t)i;
  CHECK(ncclAllGather(gs, gr, count, ncclInt32, comm, NULL));
  for (int q = 0; q < nranks; q++)
    for (size_t i = 0; i < count; i++)
      EXPECT(gr[(size_t)q * count + i] == q * 100000 + (int32_t)i, "allgather[%d][%zu] = %d",
             q, i, gr[(size_t)q * count + i]);

  /* Broadcast, double, from the last rank. */
  double *bd = malloc(count * sizeof(double));
  int root = nranks - 1;
  for (size_t i = 0; i < count; i++) bd[i] = rank == root ? 0.5 * (double)i : -1.0;
  CHECK(ncclBroadcast(bd, bd, count, ncclDouble, root, comm, NULL));
  for (size_t i = 0; i < count; i++) EXPECT(bd[i] == 0.5 * (double)i, "bcast[%zu] = %f", i, bd[i]);

  /* Send/Recv ring, int64, inside a group. */
  int64_t *ss = malloc(count * sizeof(int64_t)), *rr = malloc(count * sizeof(int64_t));
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  for (size_t i = 0; i < count; i++) {
    ss[i] = (int64_t)rank * 1000003 + (int64_t)i;
    rr[i] = -1;
  }
  CHECK(ncclGroupStart());
  CHECK(ncclSend(ss, count, ncclInt64, next, comm, NULL));
  CHECK(ncclRecv(rr, count, ncclInt64, prev, comm, NULL));
  CHECK(ncclGroupEnd());
  for (size_t i = 0; i < count; i++)
    EXPECT(rr[i] == (int64_t)prev * 1000003 + (int64_t)i, "ring[%zu] = %lld", i, (long long)rr[i]);

  /* Reduce (int64 sum) to the middle rank; recvbuff may be NULL elsewhere. */
  {
    int64_t *rs_ = malloc(count * sizeof(int64_t)), *rr_ = malloc(count * sizeof(int64_t));
    int rroot = nranks / 2;
    for (size_t i = 0; i < count; i++) rs_[i] = (int64_t)(rank + 1) * (int64_t)(i + 1);
    CHECK(ncclReduce(rs_, rank == rroot ? rr_ : NULL, count, ncclInt64, ncclSum, rroot, comm, NULL));
    if (rank == rroot)
      for (size_t i = 0; i < count; i++)
        EXPECT(rr_[i] == (int64_t)(nranks * (nranks + 1) / 2) * (int64_t)(i + 1), "reduce[%zu] = %lld", i,
               (long long)rr_[i]);
    free(rs_);
    free(rr_);
  }

  /* ReduceScatter (uint32 sum): block r of the reduced vector lands on rank r. */
  {
    uint32_t *ss_ = malloc(count * (size_t)nranks * sizeof(uint32_t)), *sr_ = malloc(count * sizeof(uint32_t));
    for (size_t i = 0; i < count * (size_t)nranks; i++) ss_[i] = (uint32_t)(rank * 7) + (uint32_t)i;
    CHECK(ncclReduceScatter(ss_, sr_, count, ncclUint32, ncclSum, comm, NULL));
    for (size_t i = 0; i < count; i++) {
      uint32_t j = (uint32_t)((size_t)rank * count + i);
      uint32_t want = (uint32_t)(7 * nranks * (nranks - 1) / 2) + (uint32_t)nranks * j;
      EXPECT(sr_[i] == want, "reducescatter[%zu] = %u want %u", i, sr_[i], want);
    }
    free(ss_);
    free(sr_);
  }

  /* AlltoAll (uint8): block q of rank r's sendbuff goes to rank q at block r. */
  {
    uint8_t *as_ = malloc(count * (size_t)nranks), *ar_ = malloc(count * (size_t)nranks);
    for (int q = 0; q < nranks; q++)
      for (size_t i = 0; i < count; i++) as_[(size_t)q * count + i] = (uint8_t)(rank * 16 + q + (int)i);
    CHECK(ncclAlltoAll(as_, ar_, count, ncclUint8, comm, NULL));
    for (int q = 0; q < nranks; q++)
      for (size_t i = 0; i < count; i++)
        EXPECT(ar_[(size_t)q * count + i] == (uint8_t)(q * 16 + rank + (int)i), "alltoall[%d][%zu]", q, i);
    free(as_);
    free(ar_);
  }

  /* Gather to rank 0 and Scatter from the last rank (float). */
  {
    float *g_s = malloc(count * sizeof(float)), *g_r = malloc(count * (size_t)nranks * sizeof(float));
    for (size_t i = 0; i < count; i++) g_s[i] = (float)(rank * 1000 + (int)i % 1000);
    CHECK(ncclGather(g_s, rank == 0 ? g_r : NULL, count, ncclFloat, 0, comm, NULL));
    if (rank == 0)
      for (int q = 0; q < nranks; q++)
        for (size_t i = 0; i < count; i++)
          EXPECT(g_r[(size_t)q * count + i] == (float)(q * 1000 + (int)i % 1000), "gather[%d][%zu]", q, i);
    int sroot = nranks - 1;
    if (rank == sroot)
      for (size_t i = 0; i < count * (size_t)nranks; i++) g_r[i] = (float)(int)i;
    CHECK(ncclScatter(rank == sroot ? g_r : NULL, g_s, count, ncclFloat, sroot, comm, NULL));
    for (size_t i = 0; i < count; i++)
      EXPECT(g_s[i] == (float)(int)((size_t)rank * count + i), "scatter[%zu] = %f", i, g_s[i]);
    free(g_s);
    free(g_r);
  }

  /* Deprecated in-place ncclBcast (int8) from rank 0. */
  {
    int8_t b8[37];
    for (int i = 0; i < 37; i++) b8[i] = rank == 0 ? (int8_t)(i - 18) : 99;
    CHECK(ncclBcast(b8, 37, ncclInt8, 0, comm, NULL));
    for (int i = 0; i < 37; i++) EXPECT(b8[i] == (int8_t)(i - 18), "bcast8[%d] = %d", i, b8[i]);
  }

  /* PreMulSum (double): each rank scales its input by (rank + 1) before the sum. */
  {
    double scale = (double)(rank + 1), in[5], out[5];
    ncclRedOp_t pms;
    for (int i = 0; i < 5; i++) in[i] = (double)(i + 1);
    CHECK(ncclRedOpCreatePreMulSum(&pms, &scale, ncclDouble, ncclScalarHostImmediate, comm));
    EXPECT((int)pms >= (int)ncclNumOps, "created op %d", (int)pms);
    CHECK(ncclAllReduce(in, out, 5, ncclDouble, pms, comm, NULL));
    double sumscale = (double)(nranks * (nranks + 1) / 2);
    for (int i = 0; i < 5; i++) EXPECT(out[i] == sumscale * (double)(i + 1), "premulsum[%d] = %f", i, out[i]);
    CHECK(ncclRedOpDestroy(pms, comm));
  }

  /* Bad arguments on a live communicator: errors, not crashes. */
  EXPECT(ncclAllReduce(fs, fr, count, (ncclDataType_t)99, ncclSum, comm, NULL) == ncclInvalidArgument,
         "invalid dtype accepted");
  EXPECT(ncclAllReduce(fs, fr, count, ncclFloat, (ncclRedOp_t)-3, comm, NULL) == ncclInvalidArgument,
         "invalid op accepted");
  EXPECT(ncclAllReduce(fs, fr, count, ncclFloat, (ncclRedOp_t)77, comm, NULL) == ncclInvalidArgument,
         "unknown created op accepted");
  EXPECT(ncclAllReduce(NULL, fr, count, ncclFloat, ncclSum, comm, NULL) == ncclInvalidArgument,
         "NULL sendbuff accepted");
  EXPECT(ncclCommCount(comm, NULL) == ncclInvalidArgument, "NULL count accepted");
  ncclComm_t shrunk = NULL;
  int excl = 0;
  EXPECT(ncclCommShrink(comm, &excl, 1, &shrunk, NULL, NCCL_SHRINK_DEFAULT) == ncclInvalidUsage,
         "ncclCommShrink did not return ncclInvalidUsage");
  EXPECT(strstr(ncclGetLastError(comm), "ncclCommShrink is not supported by this library yet") != NULL,
         "last error: %s", ncclGetLastError(comm));

  test_comm_props_t props = {sizeof(props), NCCL_API_MAGIC, NCCL_VERSION_CODE, -1, -1, -1, -1, 1, 1, -1, -1, 1, -1};
  CHECK(ncclCommQueryProperties(comm, &props));
  EXPECT(props.rank == rank && props.nRanks == nranks && !props.deviceApiSupport &&
             !props.multimemSupport && props.ginType == 0 && !props.hostRmaSupport,
         "properties rank %d nRanks %d device api %d", props.rank, props.nRanks,
         (int)props.deviceApiSupport);

  CHECK(ncclCommDestroy(comm));
  free(fs); free(fr); free(im); free(gs); free(gr); free(bd); free(ss); free(rr);
  return 0;
}

int main(int argc, char **argv) {
  int nranks = argc > 1 ? atoi(argv[1]) : 4;
  alarm(90);
  int rc = run_forked(nranks, run_rank);
  if (rc == 0) printf("collectives ok on %d ranks\n", nranks);
  return rc;
}
