/*
 * nccl.h -- C interface of the ccl-d communication library.
 *
 * This header is written for ccl-d (Apache-2.0). It declares the same types, values and
 * functions as NVIDIA NCCL 2.30.7, so a program written against NCCL builds against this
 * header and runs on ccl-d's libnccl.so.2 (or on NVIDIA's, and vice versa).
 *
 * Differences from NVIDIA's header that do not affect the ABI:
 *  - CUDA headers are optional. When they are not included first, cudaStream_t is declared
 *    here as an opaque pointer (pass NULL on the host backend).
 *  - Half/bfloat16/fp8 helper headers are not pulled in.
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* Version of the NCCL API this library implements. */
#define NCCL_MAJOR 2
#define NCCL_MINOR 30
#define NCCL_PATCH 7
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 23007
/* Encodes a version number: 2.8.x and older used two digits for the minor number. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

/* The CUDA stream type, without requiring the CUDA headers. The runtime headers define
 * __CUDA_RUNTIME_H__ / CUDART_VERSION; when they were included first, their typedef is used. */
#if !defined(__CUDA_RUNTIME_H__) && !defined(CUDART_VERSION) && !defined(__DRIVER_TYPES_H__) && \
    !defined(NCCL_NO_CUDA_STREAM_TYPEDEF)
struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Handles. */
typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
#define NCCL_COMM_NULL NULL

/* The rendezvous id of a communicator: 128 opaque bytes, passed by value. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* Result codes. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

/* "Not set" markers of configuration fields. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
/* Color of ranks that take no part in ncclCommSplit. */
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* Marks initialised configuration structures. */
#define NCCL_API_MAGIC 0xcafebeef

/* Flags of ncclCommWindowRegister. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* Values of ncclConfig_t.CTAPolicy. */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* Flags of ncclCommShrink. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* Flags of ncclCommRevoke (must be 0). */
#define NCCL_REVOKE_DEFAULT 0x00

/* Flags of ncclCommSuspend. */
#define NCCL_SUSPEND_MEM 0x01

/* Communicator settings. Always start from NCCL_CONFIG_INITIALIZER, then set fields.
 * size/magic/version let the library accept structures from older headers. */
typedef struct ncclConfig_v23000 {
  size_t size;           /* sizeof(ncclConfig_t) of the caller's header */
  unsigned int magic;    /* NCCL_API_MAGIC */
  unsigned int version;  /* NCCL_VERSION_CODE of the caller's header */
  int blocking;          /* 0: init and operations may return ncclInProgress */
  int cgaClusterSize;
  int minCTAs;           /* minimum number of channels */
  int maxCTAs;           /* maximum number of channels */
  const char *netName;   /* network plugin name, e.g. "Socket" */
  int splitShare;        /* ncclCommSplit children share the parent's resources */
  int trafficClass;
  const char *commName;  /* name used in logs and diagnostics */
  int collnetEnable;
  int CTAPolicy;         /* NCCL_CTA_POLICY_* */
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                        \
  {                                                                                    \
    sizeof(ncclConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE,                           \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,           \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,           \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,           \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,           \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,           \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT            \
  }

/* Result of ncclGroupSimulateEnd. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;   /* 0x74685283 */
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION_CODE, NCCL_UNDEF_FLOAT }

/* Reduction operations. Values >= ncclNumOps are created by ncclRedOpCreatePreMulSum. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/* Element types. */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives. */
typedef enum {
  ncclScalarDevice = 0,        /* read when each operation runs */
  ncclScalarHostImmediate = 1  /* copied before the create call returns */
} ncclScalarResidence_t;

/* Statistics of ncclCommMemStats. */
typedef enum {
  ncclStatGpuMemSuspend = 0,
  ncclStatGpuMemSuspended = 1,
  ncclStatGpuMemPersist = 2,
  ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;

/* One entry of ncclWaitSignal. */
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;

/* Handle of the parameter API. */
typedef struct ncclParamHandle *ncclParamHandle_t;

/* Every function below is exported twice: ncclX and the profiling alias pncclX. */
#define NCCL_CCLD_DECLARE(ret, name, args) \
  ret name args;                           \
  ret p##name args;

/* Library. */
NCCL_CCLD_DECLARE(ncclResult_t, ncclMemAlloc, (void **ptr, size_t size))
NCCL_CCLD_DECLARE(ncclResult_t, ncclMemFree, (void *ptr))
NCCL_CCLD_DECLARE(ncclResult_t, ncclGetVersion, (int *version))
NCCL_CCLD_DECLARE(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId))
NCCL_CCLD_DECLARE(const char *, ncclGetErrorString, (ncclResult_t result))
NCCL_CCLD_DECLARE(const char *, ncclGetLastError, (ncclComm_t comm))

/* Communicator creation. */
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommInitRankConfig,
                  (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank,
                   ncclConfig_t *config))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommInitRank,
                  (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommInitAll, (ncclComm_t * comm, int ndev, const int *devlist))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommInitRankScalable,
                  (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds,
                   ncclConfig_t *config))

/* Communicator lifetime. */
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommFinalize, (ncclComm_t comm))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommDestroy, (ncclComm_t comm))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommAbort, (ncclComm_t comm))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommSplit,
                  (ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommShrink,
                  (ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                   ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t comm, ncclUniqueId *uniqueId))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommGrow,
                  (ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                   ncclComm_t *newcomm, ncclConfig_t *config))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommSuspend, (ncclComm_t comm, int flags))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommResume, (ncclComm_t comm))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommMemStats,
                  (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value))

/* Logging. ncclResetDebugInit re-reads NCCL_DEBUG* (deprecated in NCCL). */
NCCL_CCLD_DECLARE(void, ncclResetDebugInit, (void))

/* Queries. */
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t *asyncError))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int *count))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int *device))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int *rank))

/* Buffer registration. */
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommRegister,
                  (const ncclComm_t comm, void *buff, size_t size, void **handle))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void *handle))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommWindowRegister,
                  (ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags))
NCCL_CCLD_DECLARE(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win))
NCCL_CCLD_DECLARE(ncclResult_t, ncclWinGetUserPtr,
                  (ncclComm_t comm, ncclWindow_t win, void **outUserPtr))

/* Custom reduction operations. */
NCCL_CCLD_DECLARE(ncclResult_t, ncclRedOpCreatePreMulSum,
                  (ncclRedOp_t * op, void *scalar, ncclDataType_t datatype,
                   ncclScalarResidence_t residence, ncclComm_t comm))
NCCL_CCLD_DECLARE(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm))

/* Collectives. The last two arguments are always the communicator and the stream. */
NCCL_CCLD_DECLARE(ncclResult_t, ncclReduce,
                  (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                   ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream))
NCCL_CCLD_DECLARE(ncclResult_t, ncclBcast,
                  (void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                   cudaStream_t stream))
NCCL_CCLD_DECLARE(ncclResult_t, ncclBroadcast,
                  (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                   int root, ncclComm_t comm, cudaStream_t stream))
NCCL_CCLD_DECLARE(ncclResult_t, ncclAllReduce,
                  (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))
NCCL_CCLD_DECLARE(ncclResult_t, ncclReduceScatter,
                  (const void *sendbuff, void *recvbuff, size_t recvcount,
                   ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))
NCCL_CCLD_DECLARE(ncclResult_t, ncclAllGather,
                  (const void *sendbuff, void *recvbuff, size_t sendcount,
                   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream))
NCCL_CCLD_DECLARE(ncclResult_t, ncclAlltoAll,
                  (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                   ncclComm_t comm, cudaStream_t stream))
NCCL_CCLD_DECLARE(ncclResult_t, ncclGather,
                  (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                   int root, ncclComm_t comm, cudaStream_t stream))
NCCL_CCLD_DECLARE(ncclResult_t, ncclScatter,
                  (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                   int root, ncclComm_t comm, cudaStream_t stream))

/* Point-to-point. */
NCCL_CCLD_DECLARE(ncclResult_t, ncclSend,
                  (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                   ncclComm_t comm, cudaStream_t stream))
NCCL_CCLD_DECLARE(ncclResult_t, ncclRecv,
                  (void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                   ncclComm_t comm, cudaStream_t stream))

/* One-sided operations (not supported by ccl-d yet: they return ncclInvalidUsage). */
NCCL_CCLD_DECLARE(ncclResult_t, ncclPutSignal,
                  (const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
                   ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                   unsigned int flags, ncclComm_t comm, cudaStream_t stream))
NCCL_CCLD_DECLARE(ncclResult_t, ncclSignal,
                  (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                   cudaStream_t stream))
NCCL_CCLD_DECLARE(ncclResult_t, ncclWaitSignal,
                  (int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
                   cudaStream_t stream))

/* Groups. */
NCCL_CCLD_DECLARE(ncclResult_t, ncclGroupStart, (void))
NCCL_CCLD_DECLARE(ncclResult_t, ncclGroupEnd, (void))
NCCL_CCLD_DECLARE(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo))

/* Parameter API (not supported by ccl-d yet: they return ncclInvalidUsage). */
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamBind, (ncclParamHandle_t * out, const char *key))
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamGetI8, (ncclParamHandle_t h, int8_t *out))
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamGetI16, (ncclParamHandle_t h, int16_t *out))
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamGetI32, (ncclParamHandle_t h, int32_t *out))
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamGetI64, (ncclParamHandle_t h, int64_t *out))
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamGetU8, (ncclParamHandle_t h, uint8_t *out))
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamGetU16, (ncclParamHandle_t h, uint16_t *out))
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamGetU32, (ncclParamHandle_t h, uint32_t *out))
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamGetU64, (ncclParamHandle_t h, uint64_t *out))
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamGetStr, (ncclParamHandle_t h, const char **out))
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamGet, (ncclParamHandle_t h, void *out, int maxLen, int *len))
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamGetParameter,
                  (const char *key, const char **value, int *valueLen))
NCCL_CCLD_DECLARE(ncclResult_t, ncclParamGetAllParameterKeys, (const char ***table, int *tableLen))
NCCL_CCLD_DECLARE(void, ncclParamDumpAll, (void))

#undef NCCL_CCLD_DECLARE

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
