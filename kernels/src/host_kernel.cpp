// host_kernel.cpp - the device kernels (ccl_kernel_body.h) compiled for the host CPU
// through ccl_host_sim.h, and the launcher of include/ccl_sim.h: a grid of blocks, each
// CCL_THREADS OS threads sharing one KernelShared object and one barrier. Built by
// kernels/build.rs with the system C++ compiler on every machine (no nvcc needed).

#include "ccl_host_sim.h"
#include "ccl_device.h"
#include "ccl_sim.h"

#include <sched.h>
#include <time.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include "ccl_kernel_body.h"

#if defined(__SANITIZE_THREAD__)
#define CCL_SIM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CCL_SIM_TSAN 1
#endif
#endif
#ifndef CCL_SIM_TSAN
#define CCL_SIM_TSAN 0
#endif

#if CCL_SIM_TSAN
extern "C" void __tsan_acquire(void *addr);
extern "C" void __tsan_release(void *addr);
#endif

namespace ccl_sim {

namespace {

// One simulated thread block.
struct Block {
  std::mutex m;
  std::condition_variable cv;
  unsigned n = CCL_THREADS;
  unsigned arrived = 0;
  uint64_t generation = 0;
  int acc = 0;     // OR of the predicates of the barrier being filled
  int result = 0;  // OR of the last completed barrier
  KernelShared shared;
};

// Start gate of a launch: threads wait here until every thread exists (or the launch is
// cancelled because one could not be created; then nobody enters the kernel).
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  int state = 0;  // 0 wait, 1 go, 2 cancelled
};

thread_local Block *t_block = nullptr;
thread_local char t_last_error[256] = "";

}  // namespace

int barrier(int pred) {
  Block &b = *t_block;
  std::unique_lock<std::mutex> g(b.m);
  b.acc |= pred;
  const uint64_t gen = b.generation;
  if (++b.arrived == b.n) {
    b.result = b.acc;
    b.acc = 0;
    b.arrived = 0;
    b.generation++;
    b.cv.notify_all();
    return b.result;
  }
  // b.result cannot change before every thread of this barrier has left it: the next
  // barrier completes only once all of them arrived there.
  b.cv.wait(g, [&] { return b.generation != gen; });
  return b.result;
}

void *block_shared() { return &t_block->shared; }

namespace {
thread_local uint64_t t_last_pause = 0;
thread_local uint32_t t_streak = 0;
}  // namespace

void spin_pause() {
  // A call within 1 ms of the previous one continues the streak of waiting.
  uint64_t now = now_ns();
  t_streak = now - t_last_pause < 1000000ull ? t_streak + 1 : 0;
  t_last_pause = now;
  if (t_streak < 8) {
    sched_yield();
  } else {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, nullptr);
  }
}

uint64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

}  // namespace ccl_sim

namespace {

ccl_dev_result_t sim_fail(ccl_dev_result_t code, const char *what) {
  snprintf(ccl_sim::t_last_error, sizeof(ccl_sim::t_last_error), "%s", what);
  return code;
}

// Body of one simulated CUDA thread.
void sim_thread(ccl_sim::Gate *gate, ccl_sim::Block *block, const ccl_dev_plan_t *plan,
                unsigned bx, unsigned tx) {
  {
    std::unique_lock<std::mutex> g(gate->m);
    gate->cv.wait(g, [&] { return gate->state != 0; });
    if (gate->state == 2) return;
  }
  ccl_sim::t_block = block;
  ccl_sim::thread_idx = dim3{tx, 0, 0};
  ccl_sim::block_idx = dim3{bx, 0, 0};
  ccl_sim::block_dim = dim3{CCL_THREADS, 1, 1};
  ccl_sim::grid_dim = dim3{plan->n_channels, 1, 1};
  ccl_plan_kernel(*plan);
  ccl_sim::t_block = nullptr;
}

}  // namespace

extern "C" {

ccl_dev_result_t ccl_sim_launch_plan(const ccl_dev_plan_t *plan) {
  ccl_sim::t_last_error[0] = 0;
  if (!plan) return sim_fail(CCL_DEV_INVALID, "ccl_dev_launch_plan: plan is NULL");
  if (const char *why = plan_error(*plan)) return sim_fail(CCL_DEV_INVALID, why);
  const ccl_dev_plan_t p = *plan;  // the kernel's parameter copy
  const unsigned nb = p.n_channels;
  std::vector<std::unique_ptr<ccl_sim::Block>> blocks;
  std::vector<std::thread> threads;
  ccl_sim::Gate gate;
  bool failed = false;
  try {
    blocks.reserve(nb);
    threads.reserve((size_t)nb * CCL_THREADS);
    for (unsigned b = 0; b < nb; b++) blocks.emplace_back(new ccl_sim::Block());
    for (unsigned b = 0; b < nb; b++)
      for (unsigned t = 0; t < CCL_THREADS; t++)
        threads.emplace_back(sim_thread, &gate, blocks[b].get(), &p, b, t);
  } catch (const std::exception &) {
    failed = true;
  }
  {
    std::lock_guard<std::mutex> g(gate.m);
    gate.state = failed ? 2 : 1;
  }
  gate.cv.notify_all();
  for (auto &t : threads) t.join();
  if (failed) return sim_fail(CCL_DEV_RUNTIME_ERROR, "ccl_sim_launch_plan: cannot create the block threads");
  return CCL_DEV_OK;
}

uint32_t ccl_sim_threads(void) { return CCL_THREADS; }

void ccl_sim_hb_release(const void *addr) {
#if CCL_SIM_TSAN
  __tsan_release(const_cast<void *>(addr));
#else
  (void)addr;
#endif
}

void ccl_sim_hb_acquire(const void *addr) {
#if CCL_SIM_TSAN
  __tsan_acquire(const_cast<void *>(addr));
#else
  (void)addr;
#endif
}

int32_t ccl_sim_tsan(void) { return CCL_SIM_TSAN; }

const char *ccl_sim_last_error(void) { return ccl_sim::t_last_error; }

ccl_dev_result_t ccl_sim_host_elem(uint32_t dtype, uint32_t op, uint32_t avg_divisor,
                                   uint64_t scalar_bits, int32_t has_in, uint64_t in_bits,
                                   uint64_t local_bits, int32_t do_finish, uint64_t *out) {
  ccl_sim::t_last_error[0] = 0;
  if (!host_elem_any(dtype, op, avg_divisor, scalar_bits, has_in, in_bits, local_bits, do_finish, out))
    return sim_fail(CCL_DEV_INVALID, "ccl_dev_host_elem: bad arguments");
  return CCL_DEV_OK;
}

}  // extern "C"
