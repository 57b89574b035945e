/* ccl_sim.h - the device kernels compiled for the host CPU (kernels/src/host_kernel.cpp):
 * the same source as the CUDA build (kernels/src/ccl_kernel_body.h), one OS thread per
 * CUDA thread. Always built (no nvcc needed); the emulated device launches plans here.
 */
#ifndef CCL_SIM_H
#define CCL_SIM_H

#include "ccl_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Runs the plan's kernel on the CPU and returns when every block finished: grid of
 * n_channels blocks of ccl_sim_threads() threads. CCL_DEV_INVALID for a malformed plan
 * (the checks of ccl_dev_launch_plan), CCL_DEV_RUNTIME_ERROR if threads cannot be created;
 * the message is in ccl_sim_last_error(). Same memory contract as ccl_dev_launch_plan,
 * with "device" memory being this process's memory. */
ccl_dev_result_t ccl_sim_launch_plan(const ccl_dev_plan_t *plan);
/* Threads per block of this build (CCL_THREADS). */
uint32_t ccl_sim_threads(void);
/* 1 when this build is instrumented with ThreadSanitizer. */
int32_t ccl_sim_tsan(void);
/* ThreadSanitizer annotations for synchronisation it cannot see (Rust's futex-based
 * locks): release on addr before the synchronising store, acquire on addr after the
 * synchronising load. No-ops unless ccl_sim_tsan(). */
void ccl_sim_hb_release(const void *addr);
void ccl_sim_hb_acquire(const void *addr);
/* Message of the last failing ccl_sim_* call on this thread ("" if none); never NULL. */
const char *ccl_sim_last_error(void);
/* ccl_dev_host_elem of this build (the CUDA path of the element code, with the software
 * __half / bf16 / fp8 types of ccl_host_sim.h). */
ccl_dev_result_t ccl_sim_host_elem(uint32_t dtype, uint32_t op, uint32_t avg_divisor,
                                   uint64_t scalar_bits, int32_t has_in, uint64_t in_bits,
                                   uint64_t local_bits, int32_t do_finish, uint64_t *out);

#ifdef __cplusplus
}
#endif

#endif /* CCL_SIM_H */
