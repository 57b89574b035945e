//! The NCCL C API, loaded at run time with `dlopen("libnccl.so.2")` so that
//! `LD_LIBRARY_PATH` picks the implementation (ours or NVIDIA's). Only public symbols are
//! used. All `unsafe` for calling into the library lives here.

use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::Library;

/// `NCCL_VERSION_CODE` of the ABI this crate is written against (2.30.7).
pub const NCCL_HEADERS_VERSION: i32 = 23007;
/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;
/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;

/// `ncclUniqueId`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// Opaque bytes.
    pub internal: [u8; UNIQUE_ID_BYTES],
}

/// `ncclComm_t`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comm(pub *mut c_void);
// SAFETY: an ncclComm_t is an opaque handle that NCCL allows to be used from any thread
// (one thread at a time per communicator, which the engine guarantees; ncclCommAbort is
// documented as callable concurrently).
unsafe impl Send for Comm {}
// SAFETY: sharing `&Comm` shares only the handle value (a pointer-sized integer), which
// NCCL allows any thread to use under the engine's one-thread-per-communicator rule.
unsafe impl Sync for Comm {}

/// A failed NCCL call: its `ncclResult_t` and the call's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclError {
    /// The `ncclResult_t`.
    pub code: i32,
    /// Which function failed.
    pub call: &'static str,
}

type R = c_int;
type Stream = *mut c_void;
type Coll =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> R;
type Rooted =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, Comm, Stream) -> R;
type NoOp = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> R;
type NoOpRooted =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> R;
type P2p = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> R;

/// The loaded library and the functions the tests use.
pub struct Nccl {
    _lib: Library,
    get_version: unsafe extern "C" fn(*mut c_int) -> R,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> R,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> R,
    comm_destroy: unsafe extern "C" fn(Comm) -> R,
    comm_abort: unsafe extern "C" fn(Comm) -> R,
    get_error_string: unsafe extern "C" fn(R) -> *const c_char,
    get_last_error: Option<unsafe extern "C" fn(Comm) -> *const c_char>,
    group_start: unsafe extern "C" fn() -> R,
    group_end: unsafe extern "C" fn() -> R,
    all_reduce: Coll,
    reduce: Rooted,
    broadcast: NoOpRooted,
    reduce_scatter: Coll,
    all_gather: NoOp,
    alltoall: Option<NoOp>,
    gather: Option<NoOpRooted>,
    scatter: Option<NoOpRooted>,
    send: P2p,
    recv: P2p,
    premulsum: Option<unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, Comm) -> R>,
    redop_destroy: Option<unsafe extern "C" fn(c_int, Comm) -> R>,
    comm_register: Option<unsafe extern "C" fn(Comm, *mut c_void, usize, *mut *mut c_void) -> R>,
    comm_deregister: Option<unsafe extern "C" fn(Comm, *mut c_void) -> R>,
}

/// Why the library could not be used.
#[derive(Debug)]
pub struct LoadError(pub String);

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol is declared with the prototype NCCL's public header gives it;
        // the Library outlives the copied function pointer (both live in `Nccl`).
        let s = unsafe { $lib.get::<_>(concat!($name, "\0").as_bytes()) };
        match s {
            Ok(f) => *f,
            Err(e) => return Err(LoadError(format!("libnccl.so.2 lacks {}: {e}", $name))),
        }
    }};
}
macro_rules! opt_sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: as in `sym!`.
        let s = unsafe { $lib.get::<_>(concat!($name, "\0").as_bytes()) };
        s.ok().map(|f| *f)
    }};
}

fn check(code: R, call: &'static str) -> Result<(), NcclError> {
    if code == 0 {
        Ok(())
    } else {
        Err(NcclError { code, call })
    }
}

impl Nccl {
    /// Loads `libnccl.so.2` through the dynamic linker's search path.
    pub fn load() -> Result<Nccl, LoadError> {
        Self::load_from("libnccl.so.2")
    }

    /// Loads the library at `path` (a soname or a file path).
    pub fn load_from(path: &str) -> Result<Nccl, LoadError> {
        // SAFETY: loading a shared library runs its initialisers; libnccl.so.2 is the
        // library this program exists to drive.
        let lib = unsafe { Library::new(path) }
            .map_err(|e| LoadError(format!("cannot load {path}: {e}")))?;
        Ok(Nccl {
            get_version: sym!(lib, "ncclGetVersion"),
            get_unique_id: sym!(lib, "ncclGetUniqueId"),
            comm_init_rank: sym!(lib, "ncclCommInitRank"),
            comm_destroy: sym!(lib, "ncclCommDestroy"),
            comm_abort: sym!(lib, "ncclCommAbort"),
            get_error_string: sym!(lib, "ncclGetErrorString"),
            get_last_error: opt_sym!(lib, "ncclGetLastError"),
            group_start: sym!(lib, "ncclGroupStart"),
            group_end: sym!(lib, "ncclGroupEnd"),
            all_reduce: sym!(lib, "ncclAllReduce"),
            reduce: sym!(lib, "ncclReduce"),
            broadcast: sym!(lib, "ncclBroadcast"),
            reduce_scatter: sym!(lib, "ncclReduceScatter"),
            all_gather: sym!(lib, "ncclAllGather"),
            alltoall: opt_sym!(lib, "ncclAlltoAll"),
            gather: opt_sym!(lib, "ncclGather"),
            scatter: opt_sym!(lib, "ncclScatter"),
            send: sym!(lib, "ncclSend"),
            recv: sym!(lib, "ncclRecv"),
            premulsum: opt_sym!(lib, "ncclRedOpCreatePreMulSum"),
            redop_destroy: opt_sym!(lib, "ncclRedOpDestroy"),
            comm_register: opt_sym!(lib, "ncclCommRegister"),
            comm_deregister: opt_sym!(lib, "ncclCommDeregister"),
            _lib: lib,
        })
    }

    /// `ncclGetVersion`.
    pub fn version(&self) -> Result<i32, NcclError> {
        let mut v: c_int = 0;
        // SAFETY: valid out pointer.
        check(unsafe { (self.get_version)(&mut v) }, "ncclGetVersion")?;
        Ok(v)
    }

    /// `ncclGetUniqueId`.
    pub fn unique_id(&self) -> Result<UniqueId, NcclError> {
        let mut id = UniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: valid out pointer to a 128-byte id.
        check(unsafe { (self.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
        Ok(id)
    }

    /// `ncclCommInitRank`.
    pub fn comm_init_rank(&self, nranks: i32, id: UniqueId, rank: i32) -> Result<Comm, NcclError> {
        let mut c = Comm(std::ptr::null_mut());
        // SAFETY: valid out pointer; id passed by value as the ABI requires.
        let code = unsafe { (self.comm_init_rank)(&mut c, nranks, id, rank) };
        check(code, "ncclCommInitRank")?;
        Ok(c)
    }

    /// `ncclCommDestroy`.
    pub fn comm_destroy(&self, c: Comm) -> Result<(), NcclError> {
        // SAFETY: `c` came from a successful init and is destroyed once.
        check(unsafe { (self.comm_destroy)(c) }, "ncclCommDestroy")
    }

    /// `ncclCommAbort` (callable from any thread).
    pub fn comm_abort(&self, c: Comm) -> Result<(), NcclError> {
        // SAFETY: `c` came from a successful init.
        check(unsafe { (self.comm_abort)(c) }, "ncclCommAbort")
    }

    /// `ncclGetErrorString`.
    pub fn error_string(&self, code: i32) -> String {
        // SAFETY: NCCL returns a static NUL-terminated string (or NULL, handled).
        let p = unsafe { (self.get_error_string)(code) };
        cstr(p)
    }

    /// `ncclGetLastError(NULL)`; empty when the library lacks it.
    pub fn last_error(&self) -> String {
        match self.get_last_error {
            // SAFETY: NULL comm is allowed; the result is a NUL-terminated string or NULL.
            Some(f) => cstr(unsafe { f(Comm(std::ptr::null_mut())) }),
            None => String::new(),
        }
    }

    /// `ncclGroupStart`.
    pub fn group_start(&self) -> Result<(), NcclError> {
        // SAFETY: no arguments.
        check(unsafe { (self.group_start)() }, "ncclGroupStart")
    }

    /// `ncclGroupEnd`.
    pub fn group_end(&self) -> Result<(), NcclError> {
        // SAFETY: no arguments.
        check(unsafe { (self.group_end)() }, "ncclGroupEnd")
    }

    /// Whether the optional collectives this binary needs exist.
    pub fn has(&self, name: &str) -> bool {
        match name {
            "ncclAlltoAll" => self.alltoall.is_some(),
            "ncclGather" => self.gather.is_some(),
            "ncclScatter" => self.scatter.is_some(),
            "ncclRedOpCreatePreMulSum" => self.premulsum.is_some() && self.redop_destroy.is_some(),
            "ncclCommRegister" => self.comm_register.is_some() && self.comm_deregister.is_some(),
            _ => false,
        }
    }

    /// Runs one operation. Buffers are addresses valid for the sizes NCCL derives from
    /// the arguments (the engine allocates them so).
    pub fn run(&self, call: &Call, comm: Comm, stream: usize) -> Result<(), NcclError> {
        let s = stream as Stream;
        let sb = call.send as *const c_void;
        let rb = call.recv as *mut c_void;
        let (c, t, op, root) = (call.count, call.dtype, call.op, call.root);
        let missing = |n: &'static str| NcclError { code: 5, call: n };
        // SAFETY: (all arms) sb and rb are valid for the sizes NCCL derives from count,
        // dtype and the communicator's size: the engine allocates every buffer that large
        // (`run`'s contract); the function pointers have the public prototypes.
        let code = unsafe {
            match call.kind {
                CallKind::AllReduce => (self.all_reduce)(sb, rb, c, t, op, comm, s),
                CallKind::Reduce => (self.reduce)(sb, rb, c, t, op, root, comm, s),
                CallKind::Broadcast => (self.broadcast)(sb, rb, c, t, root, comm, s),
                CallKind::ReduceScatter => (self.reduce_scatter)(sb, rb, c, t, op, comm, s),
                CallKind::AllGather => (self.all_gather)(sb, rb, c, t, comm, s),
                CallKind::AlltoAll => {
                    (self.alltoall.ok_or(missing("ncclAlltoAll"))?)(sb, rb, c, t, comm, s)
                }
                CallKind::Gather => {
                    (self.gather.ok_or(missing("ncclGather"))?)(sb, rb, c, t, root, comm, s)
                }
                CallKind::Scatter => {
                    (self.scatter.ok_or(missing("ncclScatter"))?)(sb, rb, c, t, root, comm, s)
                }
                CallKind::Send => (self.send)(call.send as *mut c_void, c, t, root, comm, s),
                CallKind::Recv => (self.recv)(rb, c, t, root, comm, s),
            }
        };
        check(code, call.kind.name())
    }

    /// `ncclRedOpCreatePreMulSum` with a host-immediate scalar (`scalar` holds the
    /// element's bytes).
    pub fn create_premulsum(
        &self,
        scalar: &mut [u8; 8],
        dtype: i32,
        comm: Comm,
    ) -> Result<i32, NcclError> {
        let f = self.premulsum.ok_or(NcclError {
            code: 5,
            call: "ncclRedOpCreatePreMulSum",
        })?;
        let mut op: c_int = 0;
        // SAFETY: valid out pointer; the scalar is read during the call (host immediate = 1).
        let code = unsafe { f(&mut op, scalar.as_mut_ptr().cast(), dtype, 1, comm) };
        check(code, "ncclRedOpCreatePreMulSum")?;
        Ok(op)
    }

    /// `ncclRedOpDestroy`.
    pub fn destroy_redop(&self, op: i32, comm: Comm) -> Result<(), NcclError> {
        let f = self.redop_destroy.ok_or(NcclError {
            code: 5,
            call: "ncclRedOpDestroy",
        })?;
        // SAFETY: op was created on comm.
        check(unsafe { f(op, comm) }, "ncclRedOpDestroy")
    }

    /// `ncclCommRegister`.
    pub fn register(&self, comm: Comm, ptr: usize, size: usize) -> Result<usize, NcclError> {
        let f = self.comm_register.ok_or(NcclError {
            code: 5,
            call: "ncclCommRegister",
        })?;
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: ptr/size describe a live allocation owned by the engine.
        let code = unsafe { f(comm, ptr as *mut c_void, size, &mut h) };
        check(code, "ncclCommRegister")?;
        Ok(h as usize)
    }

    /// `ncclCommDeregister`.
    pub fn deregister(&self, comm: Comm, handle: usize) -> Result<(), NcclError> {
        let f = self.comm_deregister.ok_or(NcclError {
            code: 5,
            call: "ncclCommDeregister",
        })?;
        // SAFETY: handle came from register on this comm.
        check(
            unsafe { f(comm, handle as *mut c_void) },
            "ncclCommDeregister",
        )
    }
}

fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null pointers returned by NCCL's string functions are NUL-terminated and
    // stay valid at least until the next call on this thread; we copy at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Which NCCL function a [`Call`] invokes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// ncclAllReduce
    AllReduce,
    /// ncclReduce
    Reduce,
    /// ncclBroadcast
    Broadcast,
    /// ncclReduceScatter
    ReduceScatter,
    /// ncclAllGather
    AllGather,
    /// ncclAlltoAll
    AlltoAll,
    /// ncclGather
    Gather,
    /// ncclScatter
    Scatter,
    /// ncclSend (root = peer)
    Send,
    /// ncclRecv (root = peer)
    Recv,
}

impl CallKind {
    /// The C function's name.
    pub fn name(self) -> &'static str {
        match self {
            CallKind::AllReduce => "ncclAllReduce",
            CallKind::Reduce => "ncclReduce",
            CallKind::Broadcast => "ncclBroadcast",
            CallKind::ReduceScatter => "ncclReduceScatter",
            CallKind::AllGather => "ncclAllGather",
            CallKind::AlltoAll => "ncclAlltoAll",
            CallKind::Gather => "ncclGather",
            CallKind::Scatter => "ncclScatter",
            CallKind::Send => "ncclSend",
            CallKind::Recv => "ncclRecv",
        }
    }
}

/// One NCCL call with raw arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// Function.
    pub kind: CallKind,
    /// Send buffer address.
    pub send: usize,
    /// Receive buffer address.
    pub recv: usize,
    /// Element count argument.
    pub count: usize,
    /// Raw ncclDataType_t.
    pub dtype: i32,
    /// Raw ncclRedOp_t.
    pub op: i32,
    /// Root, or peer for Send/Recv.
    pub root: i32,
}
