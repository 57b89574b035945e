/* The ccl_device.h functions of a build without device kernels (no nvcc at build time):
 * each does nothing and returns CCL_DEV_UNSUPPORTED; ccl_dev_built says 0 and
 * ccl_dev_last_error "". Including the header makes the C compiler check every
 * prototype. Linked by build.rs only when the kernels (src/ccl_kernels.cu) are not. */
#include "ccl_device.h"

#define UNSUPPORTED { return CCL_DEV_UNSUPPORTED; }

int32_t ccl_dev_built(void) { return 0; }
int32_t ccl_dev_platform(void) UNSUPPORTED
const char *ccl_dev_last_error(void) { return ""; }
ccl_dev_result_t ccl_dev_device_count(int32_t *count) UNSUPPORTED
ccl_dev_result_t ccl_dev_get_device(int32_t *device) UNSUPPORTED
ccl_dev_result_t ccl_dev_set_device(int32_t device) UNSUPPORTED
ccl_dev_result_t ccl_dev_pointer_info(const void *p, ccl_dev_ptr_info_t *info) UNSUPPORTED
ccl_dev_result_t ccl_dev_can_access_peer(int32_t device, int32_t peer, int32_t *can) UNSUPPORTED
ccl_dev_result_t ccl_dev_host_alloc_mapped(size_t bytes, void **host, void **dev) UNSUPPORTED
ccl_dev_result_t ccl_dev_host_free(void *host) UNSUPPORTED
ccl_dev_result_t ccl_dev_malloc(size_t bytes, void **dev) UNSUPPORTED
ccl_dev_result_t ccl_dev_free(void *dev) UNSUPPORTED
ccl_dev_result_t ccl_dev_memset(void *dev, int32_t value, size_t bytes) UNSUPPORTED
ccl_dev_result_t ccl_dev_memcpy(void *dst, const void *src, size_t bytes) UNSUPPORTED
ccl_dev_result_t ccl_dev_memcpy_async(void *dst, const void *src, size_t bytes, ccl_stream_t s) UNSUPPORTED
ccl_dev_result_t ccl_dev_enable_peer_access(int32_t peer_device) UNSUPPORTED
ccl_dev_result_t ccl_dev_ipc_get_mem_handle(void *dev, ccl_ipc_handle_t *handle) UNSUPPORTED
ccl_dev_result_t ccl_dev_ipc_open_mem_handle(const ccl_ipc_handle_t *handle, void **dev) UNSUPPORTED
ccl_dev_result_t ccl_dev_ipc_close_mem_handle(void *dev) UNSUPPORTED
ccl_dev_result_t ccl_dev_host_register(void *host, size_t bytes, void **dev_out) UNSUPPORTED
ccl_dev_result_t ccl_dev_host_unregister(void *host) UNSUPPORTED
ccl_dev_result_t ccl_dev_stream_create(ccl_stream_t *s) UNSUPPORTED
ccl_dev_result_t ccl_dev_stream_destroy(ccl_stream_t s) UNSUPPORTED
ccl_dev_result_t ccl_dev_stream_synchronize(ccl_stream_t s) UNSUPPORTED
ccl_dev_result_t ccl_dev_stream_query(ccl_stream_t s) UNSUPPORTED
ccl_dev_result_t ccl_dev_event_create(ccl_event_t *e) UNSUPPORTED
ccl_dev_result_t ccl_dev_event_create_untimed(ccl_event_t *e) UNSUPPORTED
ccl_dev_result_t ccl_dev_event_destroy(ccl_event_t e) UNSUPPORTED
ccl_dev_result_t ccl_dev_event_query(ccl_event_t e) UNSUPPORTED
ccl_dev_result_t ccl_dev_event_record(ccl_event_t e, ccl_stream_t s) UNSUPPORTED
ccl_dev_result_t ccl_dev_stream_wait_event(ccl_stream_t s, ccl_event_t e) UNSUPPORTED
ccl_dev_result_t ccl_dev_event_elapsed_ms(ccl_event_t start, ccl_event_t end, float *ms) UNSUPPORTED
ccl_dev_result_t ccl_dev_launch_host_fn(ccl_stream_t s, ccl_host_fn_t fn, void *user) UNSUPPORTED
ccl_dev_result_t ccl_dev_preload(int32_t *num_regs) UNSUPPORTED
ccl_dev_result_t ccl_dev_launch_plan(const ccl_dev_plan_t *plan, ccl_stream_t s) UNSUPPORTED
ccl_dev_result_t ccl_dev_host_elem(uint32_t dtype, uint32_t op, uint32_t avg_divisor,
                                   uint64_t scalar_bits, int32_t has_in, uint64_t in_bits,
                                   uint64_t local_bits, int32_t do_finish, uint64_t *out) UNSUPPORTED
ccl_dev_result_t ccl_dev_copy_bandwidth(size_t bytes, int32_t iters, double *gbps) UNSUPPORTED
