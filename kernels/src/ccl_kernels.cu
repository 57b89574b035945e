// ccl_kernels.cu - device kernels executing one rank's plan (ccl_core::schedule), and the
// C ABI of kernels/include/ccl_device.h. Compiled by nvcc (CUDA) and, unchanged, by hipcc
// through ccl_portability.h.
//
// Execution model (mirrors the host executor, ccl-core/src/executor.rs):
// * one thread block per channel; a block runs the lanes of its channel round-robin and
//   never blocks on one lane while another could progress;
// * thread 0 decides whether the next step of a lane can run (its inbound message is
//   there: tail > consumed; its outbound slot is free: posted - head < nslots), the whole
//   block moves the data, then thread 0 publishes (fence, then one counter store);
// * LL (p.proto == CCL_PROTO_LL): the receiver polls the flags of 16-byte lines instead
//   of tail; a step stages its input and output in shared memory (ll_recv_block /
//   ll_send_block around the same typed step code);
// * probe: after each step thread 0 stores the channel's new SendCount / RecvCount into
//   the probing frame (mapped host memory) after a system-scope fence: one store per step
//   by one thread, so the host sees progress while the kernel runs;
// * wait metrics: thread 0 times the passes in which no lane of its channel can run (from
//   the second one, GPU global timer) and, when a step runs again, adds the episode to the
//   reasons the lanes were blocked for (inbound missing = upstream; no free outbound slot,
//   LL scrub pending or throttled = downstream), like the host executor's WaitEpisode;
//   cumulative ns, one store per reason per episode end into the frame's extension slots;
// * injected faults (CCLD_INJECT, carried in the plan): throttled lanes' sends keep a
//   minimum gap per channel; stalled channels stop after stall_after steps per lane and
//   spin until abort;
// * reductions: compute in the type's arithmetic (float for half/bf16/fp8), round once;
//   fp8 saturates (SATFINITE); integer arithmetic wraps; max/min ignore a NaN operand.

#include "ccl_portability.h"
#include "ccl_device.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ccl_kernel_body.h"

namespace {

// ---------------------------------------------------------------------------------------
// Runtime helpers
// ---------------------------------------------------------------------------------------

thread_local char g_last_error[256] = "";

ccl_dev_result_t fail(cudaError_t e, const char *what) {
  snprintf(g_last_error, sizeof(g_last_error), "%s: %s", what, cudaGetErrorString(e));
  (void)cudaGetLastError();  // clear the sticky non-fatal error state
  return CCL_DEV_RUNTIME_ERROR;
}

ccl_dev_result_t invalid(const char *what) {
  snprintf(g_last_error, sizeof(g_last_error), "%s", what);
  return CCL_DEV_INVALID;
}

#if CCL_PLATFORM_HIP
struct HostFnCall {
  ccl_host_fn_t fn;
  void *user;
};
void host_fn_trampoline(hipStream_t, hipError_t, void *arg) {
  HostFnCall *c = (HostFnCall *)arg;
  c->fn(c->user);
  delete c;
}
#endif

#define CCL_CHECK(call)                          \
  do {                                           \
    cudaError_t e_ = (call);                     \
    if (e_ != cudaSuccess) return fail(e_, #call); \
  } while (0)

}  // namespace

extern "C" {

int32_t ccl_dev_built(void) { return 1; }
int32_t ccl_dev_platform(void) { return CCL_PLATFORM_HIP; }
const char *ccl_dev_last_error(void) { return g_last_error; }

ccl_dev_result_t ccl_dev_device_count(int32_t *count) {
  if (!count) return invalid("ccl_dev_device_count: count is NULL");
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    *count = 0;
    if (e != cudaSuccess) fail(e, "cudaGetDeviceCount");
    else snprintf(g_last_error, sizeof(g_last_error), "cudaGetDeviceCount: no device");
    return CCL_DEV_NO_DEVICE;
  }
  *count = n;
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_get_device(int32_t *device) {
  if (!device) return invalid("ccl_dev_get_device: device is NULL");
  int d = 0;
  CCL_CHECK(cudaGetDevice(&d));
  *device = d;
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_set_device(int32_t device) {
  CCL_CHECK(cudaSetDevice(device));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_pointer_info(const void *p, ccl_dev_ptr_info_t *info) {
  if (!info) return invalid("ccl_dev_pointer_info: info is NULL");
  info->kind = CCL_PTR_HOST;
  info->device = -1;
  info->device_ptr = NULL;
  cudaPointerAttributes a;
  memset(&a, 0, sizeof(a));
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    // Unregistered host memory on older runtimes reports an error: it is host memory.
    (void)cudaGetLastError();
    return CCL_DEV_OK;
  }
  switch (CCL_PTR_ATTR_TYPE(a)) {
    case cudaMemoryTypeDevice: info->kind = CCL_PTR_DEVICE; info->device = a.device; break;
    case cudaMemoryTypeManaged: info->kind = CCL_PTR_MANAGED; info->device = a.device; break;
    case cudaMemoryTypeHost: info->kind = CCL_PTR_HOST_PINNED; break;
    default: return CCL_DEV_OK;  // unregistered
  }
  info->device_ptr = a.devicePointer;
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_can_access_peer(int32_t device, int32_t peer, int32_t *can) {
  if (!can) return invalid("ccl_dev_can_access_peer: can is NULL");
  int c = 0;
  CCL_CHECK(cudaDeviceCanAccessPeer(&c, device, peer));
  *can = c ? 1 : 0;
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_host_alloc_mapped(size_t bytes, void **host, void **dev) {
  if (!host || !dev || bytes == 0) return invalid("ccl_dev_host_alloc_mapped: bad arguments");
  void *h = NULL;
  CCL_CHECK(cudaHostAlloc(&h, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  memset(h, 0, bytes);
  void *d = NULL;
  cudaError_t e = cudaHostGetDevicePointer(&d, h, 0);
  if (e != cudaSuccess) {
    (void)cudaFreeHost(h);
    return fail(e, "cudaHostGetDevicePointer");
  }
  *host = h;
  *dev = d;
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_host_free(void *host) {
  CCL_CHECK(cudaFreeHost(host));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_malloc(size_t bytes, void **dev) {
  if (!dev) return invalid("ccl_dev_malloc: dev is NULL");
  CCL_CHECK(cudaMalloc(dev, bytes));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_free(void *dev) {
  CCL_CHECK(cudaFree(dev));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_memset(void *dev, int32_t value, size_t bytes) {
  CCL_CHECK(cudaMemset(dev, value, bytes));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_memcpy(void *dst, const void *src, size_t bytes) {
  CCL_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_memcpy_async(void *dst, const void *src, size_t bytes, ccl_stream_t s) {
  CCL_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)s));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_enable_peer_access(int32_t peer_device) {
  cudaError_t e = cudaDeviceEnablePeerAccess(peer_device, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
    return CCL_DEV_OK;
  }
  if (e != cudaSuccess) return fail(e, "cudaDeviceEnablePeerAccess");
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_ipc_get_mem_handle(void *dev, ccl_ipc_handle_t *handle) {
  if (!handle) return invalid("ccl_dev_ipc_get_mem_handle: handle is NULL");
  cudaIpcMemHandle_t h;
  static_assert(sizeof(h) <= CCL_IPC_HANDLE_BYTES, "IPC handle larger than the ABI's");
  CCL_CHECK(cudaIpcGetMemHandle(&h, dev));
  memset(handle, 0, sizeof(*handle));
  memcpy(handle->bytes, &h, sizeof(h));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_ipc_open_mem_handle(const ccl_ipc_handle_t *handle, void **dev) {
  if (!handle || !dev) return invalid("ccl_dev_ipc_open_mem_handle: bad arguments");
  cudaIpcMemHandle_t h;
  memcpy(&h, handle->bytes, sizeof(h));
  CCL_CHECK(cudaIpcOpenMemHandle(dev, h, cudaIpcMemLazyEnablePeerAccess));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_ipc_close_mem_handle(void *dev) {
  CCL_CHECK(cudaIpcCloseMemHandle(dev));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_host_register(void *host, size_t bytes, void **dev_out) {
  if (!host || !dev_out || bytes == 0) return invalid("ccl_dev_host_register: bad arguments");
  CCL_CHECK(cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  void *d = NULL;
  cudaError_t e = cudaHostGetDevicePointer(&d, host, 0);
  if (e != cudaSuccess) {
    (void)cudaHostUnregister(host);
    return fail(e, "cudaHostGetDevicePointer");
  }
  *dev_out = d;
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_host_unregister(void *host) {
  if (!host) return invalid("ccl_dev_host_unregister: host is NULL");
  CCL_CHECK(cudaHostUnregister(host));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_stream_create(ccl_stream_t *s) {
  if (!s) return invalid("ccl_dev_stream_create: s is NULL");
  cudaStream_t st;
  CCL_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  *s = (ccl_stream_t)st;
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_stream_destroy(ccl_stream_t s) {
  CCL_CHECK(cudaStreamDestroy((cudaStream_t)s));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_stream_synchronize(ccl_stream_t s) {
  CCL_CHECK(cudaStreamSynchronize((cudaStream_t)s));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_stream_query(ccl_stream_t s) {
  cudaError_t e = cudaStreamQuery((cudaStream_t)s);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return CCL_DEV_NOT_READY;
  }
  if (e != cudaSuccess) return fail(e, "cudaStreamQuery");
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_event_create(ccl_event_t *ev) {
  if (!ev) return invalid("ccl_dev_event_create: ev is NULL");
  cudaEvent_t e;
  CCL_CHECK(cudaEventCreate(&e));
  *ev = (ccl_event_t)e;
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_event_create_untimed(ccl_event_t *ev) {
  if (!ev) return invalid("ccl_dev_event_create_untimed: ev is NULL");
  cudaEvent_t e;
  CCL_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  *ev = (ccl_event_t)e;
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_event_query(ccl_event_t ev) {
  cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return CCL_DEV_NOT_READY;
  }
  if (e != cudaSuccess) return fail(e, "cudaEventQuery");
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_event_destroy(ccl_event_t e) {
  CCL_CHECK(cudaEventDestroy((cudaEvent_t)e));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_event_record(ccl_event_t e, ccl_stream_t s) {
  CCL_CHECK(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_stream_wait_event(ccl_stream_t s, ccl_event_t e) {
  CCL_CHECK(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_event_elapsed_ms(ccl_event_t start, ccl_event_t end, float *ms) {
  if (!ms) return invalid("ccl_dev_event_elapsed_ms: ms is NULL");
  CCL_CHECK(cudaEventSynchronize((cudaEvent_t)end));
  CCL_CHECK(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end));
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_launch_host_fn(ccl_stream_t s, ccl_host_fn_t fn, void *user) {
  if (!fn) return invalid("ccl_dev_launch_host_fn: fn is NULL");
#if CCL_PLATFORM_HIP
  // HIP 5.2 declares hipLaunchHostFunc but libamdhip64 5.2 does not export it: use a stream
  // callback through a trampoline (freed by the callback).
  HostFnCall *call = new HostFnCall{fn, user};
  hipError_t e = hipStreamAddCallback((hipStream_t)s, host_fn_trampoline, call, 0);
  if (e != hipSuccess) {
    delete call;
    return fail(e, "hipStreamAddCallback");
  }
#else
  CCL_CHECK(cudaLaunchHostFunc((cudaStream_t)s, fn, user));
#endif
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_launch_plan(const ccl_dev_plan_t *plan, ccl_stream_t s) {
  if (!plan) return invalid("ccl_dev_launch_plan: plan is NULL");
  const ccl_dev_plan_t &p = *plan;
  if (const char *why = plan_error(p)) return invalid(why);
  ccl_plan_kernel<<<dim3(p.n_channels), dim3(CCL_THREADS), 0, (cudaStream_t)s>>>(p);
  CCL_CHECK(cudaGetLastError());
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_preload(int32_t *num_regs) {
  // Loads the module of the plan kernel now: with lazy module loading (CUDA 12.2+'s
  // default, CUDA_MODULE_LOADING=LAZY) the first launch would load it, which can wait for
  // kernels already running on the device, and those spin on peers that wait for this
  // launch (issue 15 blocker 6). cudaFuncGetAttributes forces the load, as NCCL does.
  cudaFuncAttributes attr;
  CCL_CHECK(cudaFuncGetAttributes(&attr, (const void *)ccl_plan_kernel));
  if (num_regs) *num_regs = (int32_t)attr.numRegs;
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_host_elem(uint32_t dtype, uint32_t op, uint32_t avg_divisor,
                                   uint64_t scalar_bits, int32_t has_in, uint64_t in_bits,
                                   uint64_t local_bits, int32_t do_finish, uint64_t *out) {
  if (!host_elem_any(dtype, op, avg_divisor, scalar_bits, has_in, in_bits, local_bits, do_finish, out))
    return invalid("ccl_dev_host_elem: bad arguments");
  return CCL_DEV_OK;
}

ccl_dev_result_t ccl_dev_copy_bandwidth(size_t bytes, int32_t iters, double *gbps) {
  if (!gbps || bytes == 0 || iters <= 0) return invalid("ccl_dev_copy_bandwidth: bad arguments");
  void *a = NULL, *b = NULL;
  cudaEvent_t e0, e1;
  CCL_CHECK(cudaMalloc(&a, bytes));
  CCL_CHECK(cudaMalloc(&b, bytes));
  CCL_CHECK(cudaEventCreate(&e0));
  CCL_CHECK(cudaEventCreate(&e1));
  CCL_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));  // warm-up
  CCL_CHECK(cudaEventRecord(e0, 0));
  for (int32_t i = 0; i < iters; i++) CCL_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
  CCL_CHECK(cudaEventRecord(e1, 0));
  CCL_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CCL_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  // A copy reads and writes `bytes`: report the bytes moved (read + write) per second, as
  // bandwidthTest does for device-to-device copies (2 x bytes).
  *gbps = ms > 0 ? 2.0 * (double)bytes * iters / (ms * 1e-3) / 1e9 : 0.0;
  (void)cudaEventDestroy(e0);
  (void)cudaEventDestroy(e1);
  (void)cudaFree(a);
  (void)cudaFree(b);
  return CCL_DEV_OK;
}

}  // extern "C"
