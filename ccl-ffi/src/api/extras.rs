//! The exports the host backend does not run, or answers for trivially: one-sided
//! operations and the parameter API (unsupported: `ncclInvalidUsage` and a last-error
//! message), and the host functions of NCCL's device API (`nccl_device.h`).

use super::*;

// ---------------------------------------------------------------------------------------
// One-sided operations (not supported yet)

export! {
    /// Not supported yet.
    fn ncclPutSignal / pncclPutSignal(
        _localbuff: *const c_void,
        _count: usize,
        _datatype: NcclDataType,
        _peer: c_int,
        _peer_win: Window,
        _peer_win_offset: usize,
        _sig_idx: c_int,
        _ctx: c_int,
        _flags: c_uint,
        comm: CommHandle,
        _stream: CudaStream,
    ) -> NcclResult {
        call("ncclPutSignal", || {
            handles::get(comm)?;
            Err(unsupported("ncclPutSignal"))
        })
    }
}

export! {
    /// Not supported yet.
    fn ncclSignal / pncclSignal(
        _peer: c_int,
        _sig_idx: c_int,
        _ctx: c_int,
        _flags: c_uint,
        comm: CommHandle,
        _stream: CudaStream,
    ) -> NcclResult {
        call("ncclSignal", || {
            handles::get(comm)?;
            Err(unsupported("ncclSignal"))
        })
    }
}

export! {
    /// Not supported yet.
    fn ncclWaitSignal / pncclWaitSignal(
        _n_desc: c_int,
        _signal_descs: *mut WaitSignalDesc,
        comm: CommHandle,
        _stream: CudaStream,
    ) -> NcclResult {
        call("ncclWaitSignal", || {
            handles::get(comm)?;
            Err(unsupported("ncclWaitSignal"))
        })
    }
}

// ---------------------------------------------------------------------------------------
// Parameter API (not supported yet)

macro_rules! unsupported_param {
    ($name:ident / $pname:ident ( $($arg:ident : $ty:ty),* )) => {
        export! {
            /// Not supported yet.
            fn $name / $pname($($arg: $ty),*) -> NcclResult {
                call(stringify!($name), || Err(unsupported(stringify!($name))))
            }
        }
    };
}

unsupported_param!(ncclParamBind / pncclParamBind(_out: *mut ParamHandle, _key: *const c_char));
unsupported_param!(ncclParamGetI8 / pncclParamGetI8(_h: ParamHandle, _out: *mut i8));
unsupported_param!(ncclParamGetI16 / pncclParamGetI16(_h: ParamHandle, _out: *mut i16));
unsupported_param!(ncclParamGetI32 / pncclParamGetI32(_h: ParamHandle, _out: *mut i32));
unsupported_param!(ncclParamGetI64 / pncclParamGetI64(_h: ParamHandle, _out: *mut i64));
unsupported_param!(ncclParamGetU8 / pncclParamGetU8(_h: ParamHandle, _out: *mut u8));
unsupported_param!(ncclParamGetU16 / pncclParamGetU16(_h: ParamHandle, _out: *mut u16));
unsupported_param!(ncclParamGetU32 / pncclParamGetU32(_h: ParamHandle, _out: *mut u32));
unsupported_param!(ncclParamGetU64 / pncclParamGetU64(_h: ParamHandle, _out: *mut u64));
unsupported_param!(ncclParamGetStr / pncclParamGetStr(_h: ParamHandle, _out: *mut *const c_char));
unsupported_param!(ncclParamGet / pncclParamGet(_h: ParamHandle, _out: *mut c_void, _max_len: c_int, _len: *mut c_int));
unsupported_param!(ncclParamGetParameter / pncclParamGetParameter(_key: *const c_char, _value: *mut *const c_char, _value_len: *mut c_int));
unsupported_param!(ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys(_table: *mut *mut *const c_char, _table_len: *mut c_int));

export! {
    /// Not supported yet: logs that and sets the last error.
    fn ncclParamDumpAll / pncclParamDumpAll() -> () {
        let _ = call("ncclParamDumpAll", || Err(unsupported("ncclParamDumpAll")));
    }
}

// ---------------------------------------------------------------------------------------
// Device API host functions (nccl_device.h). The host backend has no device communicator:
// ncclDevCommCreate and the requirement/pointer functions are unsupported;
// ncclCommQueryProperties says so; the team
// functions answer for a backend where every rank is its own LSA team (lsaSize 1).

unsupported_param!(ncclDevCommCreate / pncclDevCommCreate(_comm: CommHandle, _reqs: *const c_void, _out_dev_comm: *mut c_void));
unsupported_param!(ncclDevCommDestroy / pncclDevCommDestroy(_comm: CommHandle, _dev_comm: *const c_void));
unsupported_param!(ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer(_window: Window, _offset: usize, _out_ptr: *mut *mut c_void));
unsupported_param!(ncclGetMultimemDevicePointer / pncclGetMultimemDevicePointer(_window: Window, _offset: usize, _multimem: *mut c_void, _out_ptr: *mut *mut c_void));
unsupported_param!(ncclGetLsaDevicePointer / pncclGetLsaDevicePointer(_window: Window, _offset: usize, _lsa_rank: c_int, _out_ptr: *mut *mut c_void));
unsupported_param!(ncclGetPeerDevicePointer / pncclGetPeerDevicePointer(_window: Window, _offset: usize, _peer: c_int, _out_ptr: *mut *mut c_void));
unsupported_param!(ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement(_comm: CommHandle, _team: Team, _n_barriers: c_int, _out_handle: *mut c_void, _out_req: *mut c_void));
unsupported_param!(ncclGinOutboxCreateRequirement / pncclGinOutboxCreateRequirement(_n_blocks: c_int, _size_log2: c_int, _out_handle: *mut c_void, _out_req: *mut c_void));
unsupported_param!(ncclGinInboxA2ACreateRequirement / pncclGinInboxA2ACreateRequirement(_peers: Team, _n_blocks: c_int, _size_log2: c_int, _out_handle: *mut c_void, _out_req: *mut c_void));
unsupported_param!(ncclLsaBarrierCreateRequirement / pncclLsaBarrierCreateRequirement(_team: Team, _n_barriers: c_int, _out_handle: *mut c_void, _out_req: *mut c_void));
unsupported_param!(ncclLLA2ACreateRequirement / pncclLLA2ACreateRequirement(_n_blocks: c_int, _n_slots: c_int, _out_handle: *mut c_void, _out_req: *mut c_void));

export! {
    /// Describes `comm` for the device API: this backend reports no device API support
    /// (fields the caller's `size` covers are written; wrong magic is an error).
    fn ncclCommQueryProperties / pncclCommQueryProperties(comm: CommHandle, props: *mut c_void) -> NcclResult {
        call("ncclCommQueryProperties", || {
            let c = handles::get(comm)?;
            if props.is_null() {
                return Err(CclError::arg("props is NULL"));
            }
            let mut header = [0u8; 16];
            // SAFETY: every ncclCommProperties_t starts with the 16-byte size/magic/version
            // header (caller's contract); byte copy, no alignment assumption.
            unsafe { std::ptr::copy_nonoverlapping(props.cast::<u8>(), header.as_mut_ptr(), 16) };
            let body = crate::device::properties_image(
                &header,
                crate::device::Props { rank: c.rank(), nranks: c.nranks(), cuda_dev: c.cuda_device() },
            )?;
            // SAFETY: the caller's struct is `size` bytes long and `body` covers bytes
            // 16..min(size, 56) of it.
            unsafe { std::ptr::copy_nonoverlapping(body.as_ptr(), props.cast::<u8>().add(16), body.len()) };
            Ok(())
        })
    }
}

export! {
    /// Slots an LL all-to-all needs: `maxElts * ceil(maxEltSize / 8)` (NCCL's formula);
    /// -1 with a last-error message for negative or overflowing arguments.
    fn ncclLLA2ACalcSlots / pncclLLA2ACalcSlots(max_elts: c_int, max_elt_size: c_int) -> c_int {
        call_value("ncclLLA2ACalcSlots", -1, || {
            if max_elts < 0 || max_elt_size < 0 {
                return Err(CclError::arg(format!(
                    "maxElts {max_elts} and maxEltSize {max_elt_size} must be non-negative"
                )));
            }
            let words = (max_elt_size as i64 + 7) / 8;
            c_int::try_from(max_elts as i64 * words)
                .map_err(|_| CclError::arg("slot count overflows int"))
        })
    }
}

fn world_team(c: &Arc<Comm>) -> Team {
    Team {
        n_ranks: c.nranks(),
        rank: c.rank(),
        stride: 1,
    }
}

export! {
    /// All ranks: `{nRanks, rank, 1}`. A bad `comm` gives `{0, 0, 0}` and a last error.
    fn ncclTeamWorld / pncclTeamWorld(comm: CommHandle) -> Team {
        call_value("ncclTeamWorld", Team::default(), || Ok(world_team(&handles::get(comm)?)))
    }
}

export! {
    /// The load/store-accessible team: on the host backend just this rank, `{1, 0, 1}`.
    fn ncclTeamLsa / pncclTeamLsa(comm: CommHandle) -> Team {
        call_value("ncclTeamLsa", Team::default(), || {
            handles::get(comm)?;
            Ok(Team { n_ranks: 1, rank: 0, stride: 1 })
        })
    }
}

export! {
    /// The rail team (outer factor of the LSA team): with lsaSize 1 it is the world.
    fn ncclTeamRail / pncclTeamRail(comm: CommHandle) -> Team {
        call_value("ncclTeamRail", Team::default(), || Ok(world_team(&handles::get(comm)?)))
    }
}

export! {
    /// World rank of `team` rank `rank`: `comm.rank + (rank - team.rank) * team.stride`.
    fn ncclTeamRankToWorld / pncclTeamRankToWorld(comm: CommHandle, team: Team, rank: c_int) -> c_int {
        call_value("ncclTeamRankToWorld", -1, || {
            let c = handles::get(comm)?;
            Ok(c.rank().wrapping_add(rank.wrapping_sub(team.rank).wrapping_mul(team.stride)))
        })
    }
}

export! {
    /// LSA rank of `team` rank `rank`: `lsaRank + (rank - team.rank) * team.stride` with
    /// lsaRank 0 on the host backend.
    fn ncclTeamRankToLsa / pncclTeamRankToLsa(comm: CommHandle, team: Team, rank: c_int) -> c_int {
        call_value("ncclTeamRankToLsa", -1, || {
            handles::get(comm)?;
            Ok(rank.wrapping_sub(team.rank).wrapping_mul(team.stride))
        })
    }
}
