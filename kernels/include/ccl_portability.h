/* ccl_portability.h - lets the same .cu sources compile with nvcc (CUDA) and hipcc (HIP).
 *
 * CUDA build: includes the CUDA runtime and the fp16/bf16/fp8 headers.
 * HIP build (__HIPCC__ or CCL_HIP defined): includes the HIP runtime and maps every cuda*
 * name the sources use onto its hip* equivalent. Types that have no HIP 5.2 header
 * (bfloat16 arithmetic, fp8) are handled by the bit-exact conversions in ccl_kernels.cu,
 * identical to ccl-core/src/reduce/convert.rs.
 */
#ifndef CCL_PORTABILITY_H
#define CCL_PORTABILITY_H

#if defined(__HIPCC__) || defined(CCL_HIP)
#define CCL_PLATFORM_HIP 1
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorNotReady hipErrorNotReady
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaErrorInsufficientDriver hipErrorInsufficientDriver
#define cudaStream_t hipStream_t
#define cudaEvent_t hipEvent_t
#define cudaIpcMemHandle_t hipIpcMemHandle_t
#define cudaPointerAttributes hipPointerAttribute_t
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaPointerGetAttributes hipPointerGetAttributes
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocMapped hipHostMallocMapped
#define cudaHostAllocPortable hipHostMallocPortable
#define cudaHostGetDevicePointer hipHostGetDevicePointer
#define cudaFreeHost hipHostFree
#define cudaHostRegister hipHostRegister
#define cudaHostRegisterMapped hipHostRegisterMapped
#define cudaHostRegisterPortable hipHostRegisterPortable
#define cudaHostUnregister hipHostUnregister
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemset hipMemset
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyDefault hipMemcpyDefault
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaDeviceEnablePeerAccess hipDeviceEnablePeerAccess
#define cudaErrorPeerAccessAlreadyEnabled hipErrorPeerAccessAlreadyEnabled
#define cudaIpcGetMemHandle hipIpcGetMemHandle
#define cudaIpcOpenMemHandle hipIpcOpenMemHandle
#define cudaIpcCloseMemHandle hipIpcCloseMemHandle
#define cudaIpcMemLazyEnablePeerAccess hipIpcMemLazyEnablePeerAccess
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamQuery hipStreamQuery
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaEventCreate hipEventCreate
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventQuery hipEventQuery
#define cudaFuncAttributes hipFuncAttributes
#define cudaFuncGetAttributes hipFuncGetAttributes
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
/* cudaLaunchHostFunc: hipStreamAddCallback through a trampoline (ccl_kernels.cu). */
#define cudaMemoryTypeDevice hipMemoryTypeDevice
#define cudaMemoryTypeManaged hipMemoryTypeUnified
#define cudaMemoryTypeHost hipMemoryTypeHost
#define cudaDeviceCanAccessPeer hipDeviceCanAccessPeer
/* HIP 5.2's attribute struct names the field memoryType; CUDA's names it type. */
#define CCL_PTR_ATTR_TYPE(a) ((a).memoryType)

#else
#define CCL_PLATFORM_HIP 0
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#define CCL_PTR_ATTR_TYPE(a) ((a).type)
#endif

#endif /* CCL_PORTABILITY_H */
