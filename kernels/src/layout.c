/* layout.c - the layout of the C ABI's structs as the C compiler sees them (sizeof and
 * offsetof), compiled from the same header the kernels use. The tests compare these values
 * with the Rust mirrors (kernels::ffi) and with probe's ProbingFrame<8>. */
#include <stddef.h>
#include <stdint.h>

#include "ccl_device.h"

typedef struct ccl_layout_entry {
  const char *name;
  uint64_t value;
} ccl_layout_entry_t;

#define SZ(T) {"sizeof " #T, sizeof(T)}
#define OFF(T, f) {"offsetof " #T " " #f, offsetof(T, f)}

static const ccl_layout_entry_t ENTRIES[] = {
    SZ(ccl_trace_id_t),
    OFF(ccl_trace_id_t, comm_id),
    OFF(ccl_trace_id_t, op_counter),
    OFF(ccl_trace_id_t, extension),
    SZ(ccl_frame_header_t),
    OFF(ccl_frame_header_t, op_counter),
    OFF(ccl_frame_header_t, mode),
    OFF(ccl_frame_header_t, kernel_index),
    OFF(ccl_frame_header_t, n_channels),
    OFF(ccl_frame_header_t, reserved),
    SZ(ccl_channel_counts_t),
    OFF(ccl_channel_counts_t, send_count),
    OFF(ccl_channel_counts_t, recv_count),
    SZ(ccl_frame_block8_t),
    OFF(ccl_frame_block8_t, trace),
    OFF(ccl_frame_block8_t, channels),
    SZ(ccl_probing_frame8_t),
    OFF(ccl_probing_frame8_t, header),
    OFF(ccl_probing_frame8_t, blocks),
    {"CCL_FRAME_BYTES(8)", CCL_FRAME_BYTES(8)},
    {"CCL_FRAME_BYTES(1)", CCL_FRAME_BYTES(1)},
    {"CCL_FRAME_BYTES(32)", CCL_FRAME_BYTES(32)},
    {"CCL_FRAME_SEND_OFFSET(8, 5, 3)", CCL_FRAME_SEND_OFFSET(8, 5, 3)},
    {"CCL_FRAME_SEND_OFFSET(32, 7, 31)", CCL_FRAME_SEND_OFFSET(32, 7, 31)},
    {"CCL_FRAME_TOTAL_BYTES(8)", CCL_FRAME_TOTAL_BYTES(8)},
    {"CCL_FRAME_TOTAL_BYTES(32)", CCL_FRAME_TOTAL_BYTES(32)},
    {"CCL_FRAME_WAIT_OFFSET(8, 5, 3)", CCL_FRAME_WAIT_OFFSET(8, 5, 3)},
    {"CCL_FRAME_WAIT_OFFSET(32, 7, 31)", CCL_FRAME_WAIT_OFFSET(32, 7, 31)},
    {"CCL_LL_CHUNK(64)", CCL_LL_CHUNK(64)},
    {"CCL_LL_CHUNK(200)", CCL_LL_CHUNK(200)},
    {"CCL_LL_CHUNK(131072)", CCL_LL_CHUNK(131072)},
    SZ(ccl_dev_step_t),
    OFF(ccl_dev_step_t, kind),
    OFF(ccl_dev_step_t, src_buf),
    OFF(ccl_dev_step_t, dst_buf),
    OFF(ccl_dev_step_t, src_off),
    OFF(ccl_dev_step_t, dst_off),
    OFF(ccl_dev_step_t, count),
    SZ(ccl_dev_conn_t),
    OFF(ccl_dev_conn_t, slots),
    OFF(ccl_dev_conn_t, tail),
    OFF(ccl_dev_conn_t, head),
    OFF(ccl_dev_conn_t, slot_bytes),
    OFF(ccl_dev_conn_t, nslots),
    OFF(ccl_dev_conn_t, ll_sync),
    OFF(ccl_dev_conn_t, descs),
    SZ(ccl_dev_ptr_info_t),
    OFF(ccl_dev_ptr_info_t, kind),
    OFF(ccl_dev_ptr_info_t, device),
    OFF(ccl_dev_ptr_info_t, device_ptr),
    SZ(ccl_dev_lane_t),
    OFF(ccl_dev_lane_t, channel),
    OFF(ccl_dev_lane_t, first_step),
    OFF(ccl_dev_lane_t, n_steps),
    OFF(ccl_dev_lane_t, conn_in),
    OFF(ccl_dev_lane_t, conn_out),
    OFF(ccl_dev_lane_t, flags),
    SZ(ccl_dev_local_t),
    OFF(ccl_dev_local_t, kind),
    OFF(ccl_dev_local_t, src_buf),
    OFF(ccl_dev_local_t, dst_buf),
    OFF(ccl_dev_local_t, src_off),
    OFF(ccl_dev_local_t, dst_off),
    OFF(ccl_dev_local_t, count),
    SZ(ccl_dev_plan_t),
    OFF(ccl_dev_plan_t, n_channels),
    OFF(ccl_dev_plan_t, n_lanes),
    OFF(ccl_dev_plan_t, n_locals),
    OFF(ccl_dev_plan_t, n_steps),
    OFF(ccl_dev_plan_t, n_conns),
    OFF(ccl_dev_plan_t, unit),
    OFF(ccl_dev_plan_t, dtype),
    OFF(ccl_dev_plan_t, op),
    OFF(ccl_dev_plan_t, reduce),
    OFF(ccl_dev_plan_t, avg_divisor),
    OFF(ccl_dev_plan_t, scalar_bits),
    OFF(ccl_dev_plan_t, scalar_dev),
    OFF(ccl_dev_plan_t, steps),
    OFF(ccl_dev_plan_t, lanes),
    OFF(ccl_dev_plan_t, locals),
    OFF(ccl_dev_plan_t, conns),
    OFF(ccl_dev_plan_t, bufs),
    OFF(ccl_dev_plan_t, frame),
    OFF(ccl_dev_plan_t, frame_capacity),
    OFF(ccl_dev_plan_t, frame_block),
    OFF(ccl_dev_plan_t, proto),
    OFF(ccl_dev_plan_t, abort_flag),
    OFF(ccl_dev_plan_t, throttle_gap_ns),
    OFF(ccl_dev_plan_t, stall_channel),
    OFF(ccl_dev_plan_t, stall_after),
    OFF(ccl_dev_plan_t, check),
    OFF(ccl_dev_plan_t, rank),
    OFF(ccl_dev_plan_t, desc),
    {"CCL_CHECK_BYTES", CCL_CHECK_BYTES},
    {"CCL_CHECK_RECORD_OFFSET(5)", CCL_CHECK_RECORD_OFFSET(5)},
    {"CCL_DESC_WORDS", CCL_DESC_WORDS},
    SZ(ccl_ipc_handle_t),
};

size_t ccl_layout_count(void) { return sizeof(ENTRIES) / sizeof(ENTRIES[0]); }

/* NULL past the end. */
const char *ccl_layout_name(size_t i) { return i < ccl_layout_count() ? ENTRIES[i].name : NULL; }

uint64_t ccl_layout_value(size_t i) { return i < ccl_layout_count() ? ENTRIES[i].value : 0; }
