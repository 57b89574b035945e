/* Prints every ABI fact of nccl.h that a program compiles in: struct sizes and offsets,
 * enum values and macros. Built once against ccl-d's header and once against NVIDIA's;
 * the two outputs must be identical. */
#include <stddef.h>
#include <stdio.h>
#include <nccl.h>

#define SZ(t) printf("sizeof(%s) = %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offsetof(%s, %s) = %zu\n", #t, #f, offsetof(t, f))
#define VAL(v) printf("%s = %lld\n", #v, (long long)(v))

int main(void) {
  SZ(ncclUniqueId);
  SZ(ncclComm_t);
  SZ(ncclResult_t);
  SZ(ncclRedOp_t);
  SZ(ncclDataType_t);
  SZ(ncclScalarResidence_t);
  SZ(ncclCommMemStat_t);
  SZ(ncclConfig_t);
  SZ(ncclSimInfo_t);
  SZ(ncclWaitSignalDesc_t);
  SZ(ncclWindow_t);
  SZ(ncclParamHandle_t);
  SZ(cudaStream_t);

  OFF(ncclConfig_t, size);
  OFF(ncclConfig_t, magic);
  OFF(ncclConfig_t, version);
  OFF(ncclConfig_t, blocking);
  OFF(ncclConfig_t, cgaClusterSize);
  OFF(ncclConfig_t, minCTAs);
  OFF(ncclConfig_t, maxCTAs);
  OFF(ncclConfig_t, netName);
  OFF(ncclConfig_t, splitShare);
  OFF(ncclConfig_t, trafficClass);
  OFF(ncclConfig_t, commName);
  OFF(ncclConfig_t, collnetEnable);
  OFF(ncclConfig_t, CTAPolicy);
  OFF(ncclConfig_t, shrinkShare);
  OFF(ncclConfig_t, nvlsCTAs);
  OFF(ncclConfig_t, nChannelsPerNetPeer);
  OFF(ncclConfig_t, nvlinkCentricSched);
  OFF(ncclConfig_t, graphUsageMode);
  OFF(ncclConfig_t, numRmaCtx);
  OFF(ncclConfig_t, maxP2pPeers);
  OFF(ncclConfig_t, graphStreamOrdering);
  OFF(ncclSimInfo_t, size);
  OFF(ncclSimInfo_t, magic);
  OFF(ncclSimInfo_t, version);
  OFF(ncclSimInfo_t, estimatedTime);
  OFF(ncclWaitSignalDesc_t, opCnt);
  OFF(ncclWaitSignalDesc_t, peer);
  OFF(ncclWaitSignalDesc_t, sigIdx);
  OFF(ncclWaitSignalDesc_t, ctx);

  {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    const int *p = &c.blocking;
    printf("config.size = %zu magic = %#x version = %u\n", c.size, c.magic, c.version);
    for (int i = 0; i < 4; i++) printf("config int %d = %d\n", i, p[i]);
    printf("config.netName = %p commName = %p\n", (void *)c.netName, (void *)c.commName);
    printf("config.splitShare = %d trafficClass = %d\n", c.splitShare, c.trafficClass);
    printf("config tail = %d %d %d %d %d %d %d %d %d %d %d\n", c.collnetEnable, c.CTAPolicy,
           c.shrinkShare, c.nvlsCTAs, c.nChannelsPerNetPeer, c.nvlinkCentricSched,
           c.graphUsageMode, c.numRmaCtx, c.maxP2pPeers, c.graphStreamOrdering, c.blocking);
  }
  {
    ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
    printf("siminfo = %zu %#x %u %f\n", s.size, s.magic, s.version, s.estimatedTime);
  }

  VAL(NCCL_MAJOR);
  VAL(NCCL_MINOR);
  VAL(NCCL_PATCH);
  printf("NCCL_SUFFIX = \"%s\"\n", NCCL_SUFFIX);
  VAL(NCCL_VERSION_CODE);
  VAL(NCCL_VERSION(2, 30, 7));
  VAL(NCCL_VERSION(2, 8, 4));
  VAL(NCCL_VERSION(3, 0, 1));
  VAL(NCCL_UNIQUE_ID_BYTES);
  VAL(NCCL_SPLIT_NOCOLOR);
  VAL(NCCL_CONFIG_UNDEF_INT);
  printf("NCCL_CONFIG_UNDEF_PTR = %p\n", (void *)NCCL_CONFIG_UNDEF_PTR);
  printf("NCCL_COMM_NULL = %p\n", (void *)NCCL_COMM_NULL);
  printf("NCCL_UNDEF_FLOAT = %f\n", NCCL_UNDEF_FLOAT);
  VAL(NCCL_API_MAGIC);
  VAL(NCCL_WIN_DEFAULT);
  VAL(NCCL_WIN_COLL_SYMMETRIC);
  VAL(NCCL_WIN_STRICT_ORDERING);
  VAL(NCCL_WIN_REQUIRED_ALIGNMENT);
  VAL(NCCL_CTA_POLICY_DEFAULT);
  VAL(NCCL_CTA_POLICY_EFFICIENCY);
  VAL(NCCL_CTA_POLICY_ZERO);
  VAL(NCCL_SHRINK_DEFAULT);
  VAL(NCCL_SHRINK_ABORT);
  VAL(NCCL_REVOKE_DEFAULT);
  VAL(NCCL_SUSPEND_MEM);

  VAL(ncclSuccess);
  VAL(ncclUnhandledCudaError);
  VAL(ncclSystemError);
  VAL(ncclInternalError);
  VAL(ncclInvalidArgument);
  VAL(ncclInvalidUsage);
  VAL(ncclRemoteError);
  VAL(ncclInProgress);
  VAL(ncclTimeout);
  VAL(ncclNumResults);
  VAL(ncclSum);
  VAL(ncclProd);
  VAL(ncclMax);
  VAL(ncclMin);
  VAL(ncclAvg);
  VAL(ncclNumOps);
  VAL(ncclMaxRedOp);
  VAL(ncclInt8);
  VAL(ncclChar);
  VAL(ncclUint8);
  VAL(ncclInt32);
  VAL(ncclInt);
  VAL(ncclUint32);
  VAL(ncclInt64);
  VAL(ncclUint64);
  VAL(ncclFloat16);
  VAL(ncclHalf);
  VAL(ncclFloat32);
  VAL(ncclFloat);
  VAL(ncclFloat64);
  VAL(ncclDouble);
  VAL(ncclBfloat16);
  VAL(ncclFloat8e4m3);
  VAL(ncclFloat8e5m2);
  VAL(ncclNumTypes);
  VAL(ncclScalarDevice);
  VAL(ncclScalarHostImmediate);
  VAL(ncclStatGpuMemSuspend);
  VAL(ncclStatGpuMemSuspended);
  VAL(ncclStatGpuMemPersist);
  VAL(ncclStatGpuMemTotal);
  return 0;
}
