// rccl_shim.cpp - hipStream_t entry points of librccl.so.1 over the shared device ABI.
#include "rccl_device.h"

extern "C" {

ccl_dev_result_t rccl_dev_launch_plan(const ccl_dev_plan_t *plan, hipStream_t stream) {
  return ccl_dev_launch_plan(plan, (ccl_stream_t)stream);
}

ccl_dev_result_t rccl_dev_launch_host_fn(hipStream_t stream, ccl_host_fn_t fn, void *user) {
  return ccl_dev_launch_host_fn((ccl_stream_t)stream, fn, user);
}

ccl_dev_result_t rccl_dev_memcpy_async(void *dst, const void *src, size_t bytes, hipStream_t stream) {
  return ccl_dev_memcpy_async(dst, src, bytes, (ccl_stream_t)stream);
}

const char *rccl_dev_version(void) { return "ccl-d device ABI 0.1 (HIP)"; }

}  // extern "C"
