/* rccl_device.h - the ROCm flavour of the device ABI, exported by librccl.so.1
 * (scripts/gpu/build-rocm.sh). Everything in ccl_device.h, plus entry points that take a
 * hipStream_t instead of the opaque ccl_stream_t. */
#ifndef RCCL_DEVICE_H
#define RCCL_DEVICE_H

#include <hip/hip_runtime_api.h>

#include "ccl_device.h"

#ifdef __cplusplus
extern "C" {
#endif

ccl_dev_result_t rccl_dev_launch_plan(const ccl_dev_plan_t *plan, hipStream_t stream);
ccl_dev_result_t rccl_dev_launch_host_fn(hipStream_t stream, ccl_host_fn_t fn, void *user);
ccl_dev_result_t rccl_dev_memcpy_async(void *dst, const void *src, size_t bytes, hipStream_t stream);
/* "RCCL-compatible device ABI <major>.<minor>" of this library. */
const char *rccl_dev_version(void);

#ifdef __cplusplus
}
#endif

#endif /* RCCL_DEVICE_H */
