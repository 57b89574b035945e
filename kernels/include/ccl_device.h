/* ccl_device.h - the C ABI between the Rust runtime (ccl-core) and the device code.
 *
 * Everything device-related the host runtime does goes through these functions: device
 * discovery, mapped (UVA) host memory for the probing frame, device memory, IPC handles,
 * streams/events, host callbacks, and the kernel launcher that executes one rank's plan
 * (the same step lists ccl-core/src/schedule.rs produces for the host executor).
 *
 * The same header is used by the CUDA build (libnccl.so.2) and the HIP build
 * (librccl.so.1); `ccl_stream_t` is a cudaStream_t / hipStream_t passed as an opaque
 * pointer. Every function returns a ccl_dev_result_t; 0 is success. Plain C (C99), no
 * CUDA/HIP types, so gcc and the Rust bindings (kernels/src/lib.rs) read it as is.
 */
#ifndef CCL_DEVICE_H
#define CCL_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- results ---------------------------------------------------------------------- */

typedef int32_t ccl_dev_result_t;
#define CCL_DEV_OK 0
#define CCL_DEV_NO_DEVICE 1      /* no driver, or driver without devices */
#define CCL_DEV_RUNTIME_ERROR 2  /* a CUDA/HIP call failed: ccl_dev_last_error() says which */
#define CCL_DEV_INVALID 3        /* an argument of this ABI was invalid */
#define CCL_DEV_UNSUPPORTED 4    /* not available in this build */
#define CCL_DEV_NOT_READY 5      /* ccl_dev_stream_query: work still pending */

/* ---- probing frame (mirrors probe::frame, design.md section 4) ---------------------- */

#define CCL_FRAME_BLOCKS 8
#define CCL_FRAME_HEADER_BYTES 32
#define CCL_PAPER_CHANNELS 8

typedef struct ccl_trace_id {
  uint64_t comm_id;
  uint32_t op_counter;
  uint32_t extension;
} ccl_trace_id_t;

typedef struct ccl_frame_header {
  uint64_t op_counter;
  uint32_t mode;
  uint32_t kernel_index;
  uint32_t n_channels;
  uint32_t reserved[3];
} ccl_frame_header_t;

typedef struct ccl_channel_counts {
  uint64_t send_count;
  uint64_t recv_count;
} ccl_channel_counts_t;

/* The paper's frame: 8 channels, 1184 bytes. Frames with another channel capacity C
 * have the same shape with C entries per block; use the macros below for them. */
typedef struct ccl_frame_block8 {
  ccl_trace_id_t trace;
  ccl_channel_counts_t channels[CCL_PAPER_CHANNELS];
} ccl_frame_block8_t;

typedef struct ccl_probing_frame8 {
  ccl_frame_header_t header;
  ccl_frame_block8_t blocks[CCL_FRAME_BLOCKS];
} ccl_probing_frame8_t;

#define CCL_FRAME_BLOCK_BYTES(cap) (16u + 16u * (uint64_t)(cap))
#define CCL_FRAME_BYTES(cap) (CCL_FRAME_HEADER_BYTES + CCL_FRAME_BLOCKS * CCL_FRAME_BLOCK_BYTES(cap))
/* Byte offset of channel ch's SendCount in block b of a frame of capacity cap;
 * RecvCount follows at +8. */
#define CCL_FRAME_SEND_OFFSET(cap, b, ch) \
  (CCL_FRAME_HEADER_BYTES + (uint64_t)(b) * CCL_FRAME_BLOCK_BYTES(cap) + 16u + 16u * (uint64_t)(ch))
/* Extension slots (probe::Frame, after the base frame, never inside it): per block and
 * channel CCL_FRAME_EXT_WORDS 64-bit words: cumulative ns the channel waited for upstream
 * data, cumulative ns it waited for a free downstream slot (or a throttled link), then the
 * send and receive steps the schedule expects (written by the host at begin_op), then the
 * ns inbound messages spent on the wire (host socket transport only). */
#define CCL_FRAME_EXT_WORDS 5
#define CCL_FRAME_TOTAL_BYTES(cap) \
  (CCL_FRAME_BYTES(cap) + CCL_FRAME_BLOCKS * (uint64_t)(cap) * 8u * CCL_FRAME_EXT_WORDS)
/* Byte offset of channel ch's upstream wait (ns) in block b; the downstream wait follows
 * at +8. */
#define CCL_FRAME_WAIT_OFFSET(cap, b, ch) \
  (CCL_FRAME_BYTES(cap) + ((uint64_t)(b) * (uint64_t)(cap) + (uint64_t)(ch)) * 8u * CCL_FRAME_EXT_WORDS)

/* ---- plans (mirror ccl_core::schedule) ---------------------------------------------- */

/* StepKind */
#define CCL_STEP_SEND 0
#define CCL_STEP_RECV 1
#define CCL_STEP_RECV_REDUCE_SEND 2
#define CCL_STEP_RECV_REDUCE_COPY_SEND 3
#define CCL_STEP_RECV_COPY_SEND 4
#define CCL_STEP_RECV_REDUCE_COPY 5

/* LocalKind */
#define CCL_LOCAL_COPY 0
#define CCL_LOCAL_REDUCE 1

/* ncclDataType_t values */
#define CCL_DT_INT8 0
#define CCL_DT_UINT8 1
#define CCL_DT_INT32 2
#define CCL_DT_UINT32 3
#define CCL_DT_INT64 4
#define CCL_DT_UINT64 5
#define CCL_DT_FLOAT16 6
#define CCL_DT_FLOAT32 7
#define CCL_DT_FLOAT64 8
#define CCL_DT_BFLOAT16 9
#define CCL_DT_FLOAT8E4M3 10
#define CCL_DT_FLOAT8E5M2 11
#define CCL_DT_COUNT 12

/* Element operation (the reducer's Op: Avg on floats is PREMUL with 1/n, on integers SUM
 * plus a final division by avg_divisor). */
#define CCL_OP_SUM 0
#define CCL_OP_PROD 1
#define CCL_OP_MAX 2
#define CCL_OP_MIN 3
#define CCL_OP_PREMUL 4

/* Protocols (NCCL_PROTO; LL128 is not implemented).
 * SIMPLE: message k's bytes in its slot, then a fence, then tail = k + 1.
 * LL: message m (1-based count of messages sent on the connection) is a run of 16-byte
 *   lines {u32 data0, u32 flag0, u32 data1, u32 flag1} from the start of its slot, 8
 *   payload bytes per line (last line zero-padded), both flags = m's low 32 bits; the
 *   sender writes each 8-byte half {data, flag} with one 8-byte store, the receiver polls
 *   the flags and needs no tail (the sender still stores tail, after the lines, so a later
 *   Simple operation starts from the right count). Payload per message: at most
 *   CCL_LL_CHUNK(slot_bytes). The head counter works as in SIMPLE. */
#define CCL_PROTO_SIMPLE 0
#define CCL_PROTO_LL 1
#define CCL_LL_MAX_CHUNK 16384
#define CCL_LL_CHUNK(slot_bytes) \
  ((((slot_bytes) / 2 < CCL_LL_MAX_CHUNK ? (slot_bytes) / 2 : CCL_LL_MAX_CHUNK) / 8) * 8)

/* Most buffers one plan may address (collectives use 2; p2p groups one per call). */
#define CCL_MAX_BUFS 64
/* Most lanes one channel (one thread block) runs. */
#define CCL_MAX_LANES_PER_CHANNEL 64
#define CCL_MAX_CHANNELS 32

typedef struct ccl_dev_step {
  uint32_t kind;    /* CCL_STEP_* */
  uint32_t src_buf; /* index into ccl_dev_plan_t.bufs */
  uint32_t dst_buf;
  uint32_t reserved;
  uint64_t src_off; /* units */
  uint64_t dst_off; /* units */
  uint64_t count;   /* units, > 0 */
} ccl_dev_step_t;

/* One FIFO link end (a connection): nslots slots of slot_bytes in `slots` (device memory,
 * reachable by both sides: same device, peer access, or an IPC-opened mapping), and two
 * monotonically increasing counters in memory both sides can read: `tail` (messages
 * posted, written by the sender) and `head` (messages consumed, written by the receiver).
 * Message k lives in slot k % nslots; the size of message k is implied by the schedule
 * (the k-th send of a lane matches the k-th receive of its peer's lane).
 *
 * ll_sync (LL plans only; 0 = nothing to do): the slots may hold bytes that are not LL
 * lines of this connection (never-initialised memory, or earlier SIMPLE messages, whose
 * data could look like a valid flag). The receiver's kernel then zeroes the LL part of
 * every slot (the first 2 * CCL_LL_CHUNK(slot_bytes) bytes) before its lanes start and
 * stores ll_sync into the 64-bit word right after *head (head[1], receiver-written);
 * the sender's kernel sends its first message on the connection only once head[1] ==
 * ll_sync (equality: the sequence may wrap; it skips 0). Both runtimes count scrubs per connection the same way (a connection is
 * "dirty" when created and after every SIMPLE operation on it), so the values agree. */
typedef struct ccl_dev_conn {
  void *slots;
  uint64_t *tail;
  uint64_t *head; /* head[1]: the LL scrub word (see ll_sync) */
  uint64_t slot_bytes;
  uint32_t nslots;
  uint32_t ll_sync;
  /* The descriptor check (see ccl_dev_plan_t.check): CCL_DESC_WORDS words per slot, the
   * descriptor of the message in that slot, written by the sender before the message's
   * data; NULL: this connection carries no descriptors. */
  uint64_t *descs;
} ccl_dev_conn_t;

/* The descriptor check. The first message of every lane of an operation carries the
 * descriptor of the operation (ccl_core::desc: sequence number, kind, datatype, op, count,
 * root; for Send/Recv the pair's sequence number): the sender stores
 * ccl_dev_plan_t.desc[step's src_buf] into the slot's descriptor words before the data (so
 * before the fence that precedes the tail store); the receiver, once its lane's first
 * message is there (SIMPLE: tail observed, then a fence; LL: the flags, and for a mismatch
 * also the tail), compares them with desc[dst_buf]. Later messages of the lane carry no
 * descriptor and are not compared: equal descriptors mean equal schedules on both sides
 * (the plan is a function of the descriptor, the rank count and the tuning agreed at
 * init), so a skipped operation, another collective, count, type, op or root always shows
 * in a first message (its sequence number or fields differ; a slot's stale descriptor
 * belongs to an earlier operation and never equals the wanted one). On a mismatch thread 0
 * of the block fills its channel's record in the check area and sets the area's stop
 * word; every block of the communicator's kernels then stops (the stop word counts as an
 * abort) and, before it returns, sends a poison descriptor (CCL_DESC_POISON_MARK, the
 * sender's rank) as the next message on each of its outbound connections, with
 * CCL_TAIL_POISON set in that tail store: the receiver sees the bit in the tail it reads
 * anyway, at any message, and fails too instead of hanging or consuming the poison as
 * data.
 * Check area (mapped host memory, CCL_CHECK_BYTES): word 0 = stop; the record of channel c
 * at byte CCL_CHECK_RECORD_OFFSET(c) = {1, connection index, got[3], want[3]}. */
#define CCL_DESC_WORDS 3
#define CCL_DESC_POISON_MARK 0xBDull
#define CCL_TAIL_POISON (1ull << 63)
/* The start gate's 32-bit word in the abort flag's memory (see ccl_dev_plan_t.start_gate). */
#define CCL_GATE_WORD 2
#define CCL_CHECK_RECORD_OFFSET(c) (64u + 64u * (uint64_t)(c))
#define CCL_CHECK_BYTES CCL_CHECK_RECORD_OFFSET(CCL_MAX_CHANNELS)

typedef struct ccl_dev_lane {
  uint32_t channel;
  uint32_t first_step; /* index into ccl_dev_plan_t.steps */
  uint32_t n_steps;
  int32_t conn_in;  /* index into ccl_dev_plan_t.conns, -1 if the lane never receives */
  int32_t conn_out; /* index into ccl_dev_plan_t.conns, -1 if the lane never sends */
  uint32_t flags;   /* CCL_LANE_* */
} ccl_dev_lane_t;

/* ccl_dev_lane_t.flags: the lane's sends obey the plan's throttle_gap_ns (CCLD_INJECT s2/s3;
 * the runtime flags the lanes whose outbound peer is the throttled link, or all). */
#define CCL_LANE_THROTTLED 1u

/* ccl_dev_plan_t.stall_channel (CCLD_INJECT h3): no stall, every channel, or a channel. */
#define CCL_STALL_NONE 0xffffffffu
#define CCL_STALL_ALL 0xfffffffeu

typedef struct ccl_dev_local {
  uint32_t kind; /* CCL_LOCAL_* */
  uint32_t src_buf;
  uint32_t dst_buf;
  uint32_t reserved;
  uint64_t src_off;
  uint64_t dst_off;
  uint64_t count;
} ccl_dev_local_t;

/* One rank's operation. All arrays (steps, lanes, locals, conns) must be in memory the
 * device can read (device memory or mapped host memory) until the kernel finished. */
typedef struct ccl_dev_plan {
  uint32_t n_channels; /* grid size: one thread block per channel */
  uint32_t n_lanes;
  uint32_t n_locals;
  uint32_t n_steps;
  uint32_t n_conns;
  uint32_t unit;       /* bytes per unit: element size (ring plans) or 1 (p2p plans) */
  uint32_t dtype;      /* CCL_DT_*, meaningful when reduce != 0 */
  uint32_t op;         /* CCL_OP_* */
  uint32_t reduce;     /* 1 for reducing collectives */
  uint32_t avg_divisor;/* integer Avg: divide the final result by this; 0 = none */
  uint64_t scalar_bits;/* PREMUL scalar as dtype bits (little-endian), if scalar_dev is NULL */
  const void *scalar_dev; /* PREMUL scalar in device memory (ncclScalarDevice), or NULL */
  const ccl_dev_step_t *steps;
  const ccl_dev_lane_t *lanes;
  const ccl_dev_local_t *locals;
  const ccl_dev_conn_t *conns;
  void *bufs[CCL_MAX_BUFS];
  /* Probe: the frame (mapped host memory, device pointer), its channel capacity, the block
   * of this operation; frame == NULL disables the counters. */
  uint64_t *frame;
  uint32_t frame_capacity;
  uint32_t frame_block;
  uint32_t proto; /* CCL_PROTO_* */
  uint32_t reserved;
  /* Mapped host memory the host sets non-zero to make the kernel give up (ncclCommAbort);
   * NULL: never aborts. Word CCL_GATE_WORD of the same memory is the start gate (see
   * start_gate): with a frame, abort_flag points to at least (CCL_GATE_WORD + 1) words. */
  const uint32_t *abort_flag;
  /* Completion words (mapped host memory, device pointer; NULL: none): when a block ends,
   * however it ends, its thread 0 stores start_gate into done[blockIdx.x] after a system
   * fence. The host finds an operation complete when every block's word holds its value,
   * with plain loads: no CUDA call, so a kernel waiting at its start gate never waits for
   * a host thread that waits for the CUDA driver (ccl_core::device::completion). */
  uint32_t *done;
  /* Injected faults (CCLD_INJECT; the host backend's rules). Throttle: a send of a lane
   * flagged CCL_LANE_THROTTLED starts at least throttle_gap_ns after the previous such send
   * of its channel (0 = no throttle); the time is waiting downstream. Stall: the lanes of
   * stall_channel (or every channel) stop after stall_after steps and spin until abort
   * (the time is waiting upstream). */
  uint64_t throttle_gap_ns;
  uint32_t stall_channel; /* CCL_STALL_NONE, CCL_STALL_ALL or a channel */
  uint32_t stall_after;
  /* The descriptor check (see CCL_DESC_WORDS): the check area (mapped host memory, device
   * pointer; NULL: no descriptors are sent or checked), this rank (in poison descriptors),
   * and the descriptor of each buffer index (a collective's one descriptor in every entry,
   * a Send/Recv group's per call). */
  uint64_t *check;
  uint32_t rank;
  /* The start gate: with a frame and an abort flag, every block waits, before it does
   * anything, until abort_flag[CCL_GATE_WORD] - start_gate (32-bit, wrapping) is >= 0, or
   * an abort. The host stores the gate word after it prepared the operation's frame block
   * (ccl_core::device::completion): the frame words the kernel writes are then never
   * cleared behind it, although no host function runs between two kernels. */
  uint32_t start_gate;
  uint64_t desc[CCL_MAX_BUFS][CCL_DESC_WORDS];
} ccl_dev_plan_t;

/* ---- runtime ------------------------------------------------------------------------ */

typedef void *ccl_stream_t;
typedef void *ccl_event_t;
typedef void (*ccl_host_fn_t)(void *user);

/* Opaque IPC handles (cudaIpcMemHandle_t / cudaIpcEventHandle_t are 64 bytes). */
#define CCL_IPC_HANDLE_BYTES 64
typedef struct ccl_ipc_handle {
  unsigned char bytes[CCL_IPC_HANDLE_BYTES];
} ccl_ipc_handle_t;

/* 1 when this library was built with device kernels; 0 otherwise. */
int32_t ccl_dev_built(void);
/* 0 = CUDA, 1 = HIP. */
int32_t ccl_dev_platform(void);
/* Message of the last failing runtime call on this thread ("" if none); never NULL. */
const char *ccl_dev_last_error(void);

/* Number of devices; CCL_DEV_NO_DEVICE (with *count = 0) when there is no driver or no
 * device: never aborts. */
ccl_dev_result_t ccl_dev_device_count(int32_t *count);
ccl_dev_result_t ccl_dev_get_device(int32_t *device);
ccl_dev_result_t ccl_dev_set_device(int32_t device);
/* Kinds of memory (ccl_dev_ptr_info_t.kind). */
#define CCL_PTR_HOST 0        /* unregistered host memory: kernels cannot reach it */
#define CCL_PTR_DEVICE 1      /* device memory (cudaMalloc, IPC-opened) */
#define CCL_PTR_MANAGED 2     /* managed (unified) memory */
#define CCL_PTR_HOST_PINNED 3 /* pinned host memory (cudaHostAlloc, cudaHostRegister) */

/* What cudaPointerGetAttributes says of a pointer. */
typedef struct ccl_dev_ptr_info {
  int32_t kind;     /* CCL_PTR_* */
  int32_t device;   /* the device it belongs to (device / managed memory), else -1 */
  void *device_ptr; /* the address kernels use for these bytes; NULL if none */
} ccl_dev_ptr_info_t;

/* Kind, device and kernel address of p (unregistered host memory: CCL_PTR_HOST, never an
 * error). */
ccl_dev_result_t ccl_dev_pointer_info(const void *p, ccl_dev_ptr_info_t *info);
/* cudaDeviceCanAccessPeer: *can = 1 when kernels on `device` can reach `peer`'s memory. */
ccl_dev_result_t ccl_dev_can_access_peer(int32_t device, int32_t peer, int32_t *can);

/* Pinned, mapped host memory (cudaHostAlloc(cudaHostAllocMapped|Portable)), zeroed;
 * *dev is the device-side address of the same bytes. */
ccl_dev_result_t ccl_dev_host_alloc_mapped(size_t bytes, void **host, void **dev);
ccl_dev_result_t ccl_dev_host_free(void *host);
ccl_dev_result_t ccl_dev_malloc(size_t bytes, void **dev);
ccl_dev_result_t ccl_dev_free(void *dev);
ccl_dev_result_t ccl_dev_memset(void *dev, int32_t value, size_t bytes);
ccl_dev_result_t ccl_dev_memcpy(void *dst, const void *src, size_t bytes);
ccl_dev_result_t ccl_dev_memcpy_async(void *dst, const void *src, size_t bytes, ccl_stream_t s);
/* cudaDeviceEnablePeerAccess(peer_device) from the current device; already enabled is
 * success. */
ccl_dev_result_t ccl_dev_enable_peer_access(int32_t peer_device);

ccl_dev_result_t ccl_dev_ipc_get_mem_handle(void *dev, ccl_ipc_handle_t *handle);
ccl_dev_result_t ccl_dev_ipc_open_mem_handle(const ccl_ipc_handle_t *handle, void **dev);
ccl_dev_result_t ccl_dev_ipc_close_mem_handle(void *dev);

/* Pins an existing host range (e.g. a shared-memory mapping) and maps it for the device:
 * cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable), then
 * cudaHostGetDevicePointer; *dev_out is the device-side address of `host` (kernels reach
 * the same bytes through it). The range must stay mapped until ccl_dev_host_unregister.
 * CCL_DEV_INVALID for NULL pointers or bytes == 0. */
ccl_dev_result_t ccl_dev_host_register(void *host, size_t bytes, void **dev_out);
/* cudaHostUnregister of a range registered by ccl_dev_host_register (its host address). */
ccl_dev_result_t ccl_dev_host_unregister(void *host);

ccl_dev_result_t ccl_dev_stream_create(ccl_stream_t *s);
ccl_dev_result_t ccl_dev_stream_destroy(ccl_stream_t s);
ccl_dev_result_t ccl_dev_stream_synchronize(ccl_stream_t s);
/* CCL_DEV_OK when done, CCL_DEV_NOT_READY while work is pending. */
ccl_dev_result_t ccl_dev_stream_query(ccl_stream_t s);
ccl_dev_result_t ccl_dev_event_create(ccl_event_t *e);
/* An event without timing (cudaEventDisableTiming): for ordering work across streams. */
ccl_dev_result_t ccl_dev_event_create_untimed(ccl_event_t *e);
ccl_dev_result_t ccl_dev_event_destroy(ccl_event_t e);
/* CCL_DEV_OK when the work before the event's last record is done, CCL_DEV_NOT_READY
 * while it is pending, an error when it failed (a kernel fault is sticky: every later
 * query reports it). */
ccl_dev_result_t ccl_dev_event_query(ccl_event_t e);
ccl_dev_result_t ccl_dev_event_record(ccl_event_t e, ccl_stream_t s);
ccl_dev_result_t ccl_dev_stream_wait_event(ccl_stream_t s, ccl_event_t e);
ccl_dev_result_t ccl_dev_event_elapsed_ms(ccl_event_t start, ccl_event_t end, float *ms);
/* cudaLaunchHostFunc: fn(user) runs on a runtime thread after prior work on s. */
ccl_dev_result_t ccl_dev_launch_host_fn(ccl_stream_t s, ccl_host_fn_t fn, void *user);

/* Loads the plan kernel's module on the current device now (cudaFuncGetAttributes), so
 * that lazy module loading never happens at a launch while other kernels spin (call at
 * communicator init). *num_regs (may be NULL): registers per thread of the kernel. */
ccl_dev_result_t ccl_dev_preload(int32_t *num_regs);

/* Launches the plan's kernel on s: local steps first (block 0), then one thread block per
 * channel running its lanes. `plan` itself is host memory (copied into the launch
 * parameters). Returns CCL_DEV_INVALID for a malformed plan (checked on the host). */
ccl_dev_result_t ccl_dev_launch_plan(const ccl_dev_plan_t *plan, ccl_stream_t s);

/* The kernels' element arithmetic run on the HOST CPU (same source, host compilation):
 * one element of dtype, finish?(in OP pre(local)) (has_in != 0) or finish?(pre(local)),
 * values as little-endian bits. For testing the reduction semantics without a GPU. */
ccl_dev_result_t ccl_dev_host_elem(uint32_t dtype, uint32_t op, uint32_t avg_divisor,
                                   uint64_t scalar_bits, int32_t has_in, uint64_t in_bits,
                                   uint64_t local_bits, int32_t do_finish, uint64_t *out);

/* Device-to-device copy bandwidth of this device (GB/s) over `bytes`, `iters` copies:
 * the GPU suite's reference figure. */
ccl_dev_result_t ccl_dev_copy_bandwidth(size_t bytes, int32_t iters, double *gbps);

#ifdef __cplusplus
}
#endif

#endif /* CCL_DEVICE_H */
