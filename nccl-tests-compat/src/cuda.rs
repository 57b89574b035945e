//! Optional CUDA runtime, loaded at run time: when `libcudart.so` loads and reports a
//! device, buffers live in device memory and every rank gets a stream. This path cannot
//! be exercised without a GPU; it is kept small: device count/selection, malloc/free,
//! memcpy, streams and the PCI bus id. All `unsafe` for CUDA lives here.

use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::Library;

type E = c_int;

/// The few cudart entry points used.
pub struct Cuda {
    _lib: Library,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> E,
    set_device: unsafe extern "C" fn(c_int) -> E,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> E,
    free: unsafe extern "C" fn(*mut c_void) -> E,
    memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> E,
    stream_create: unsafe extern "C" fn(*mut *mut c_void) -> E,
    stream_sync: unsafe extern "C" fn(*mut c_void) -> E,
    stream_destroy: unsafe extern "C" fn(*mut c_void) -> E,
    pci_bus_id: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> E,
    error_string: unsafe extern "C" fn(E) -> *const c_char,
}

/// A failed CUDA call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    /// cudaError_t
    pub code: i32,
    /// Function.
    pub call: &'static str,
    /// cudaGetErrorString
    pub message: String,
}

const SONAMES: &[&str] = &[
    "libcudart.so",
    "libcudart.so.13",
    "libcudart.so.12",
    "libcudart.so.11.0",
    "libcudart.so.10.2",
];

macro_rules! get {
    ($lib:expr, $name:literal) => {{
        // SAFETY: declared with the prototype from the CUDA runtime API; the Library lives
        // as long as the copied pointer (both in `Cuda`).
        let s = unsafe { $lib.get::<_>(concat!($name, "\0").as_bytes()) };
        match s {
            Ok(f) => *f,
            Err(_) => return None,
        }
    }};
}

impl Cuda {
    /// Loads cudart and returns it when it reports at least one device; `None` otherwise
    /// (no library, no driver, no device): the host-memory path is used then.
    /// `CCLD_TESTS_NO_CUDA=1` forces the host path.
    pub fn try_load() -> Option<(Cuda, i32)> {
        if std::env::var("CCLD_TESTS_NO_CUDA").is_ok_and(|v| v == "1") {
            return None;
        }
        let lib = SONAMES.iter().find_map(|n| {
            // SAFETY: loading cudart runs its initialisers, which is how it is meant to be used.
            unsafe { Library::new(n) }.ok()
        })?;
        let cuda = Cuda {
            get_device_count: get!(lib, "cudaGetDeviceCount"),
            set_device: get!(lib, "cudaSetDevice"),
            malloc: get!(lib, "cudaMalloc"),
            free: get!(lib, "cudaFree"),
            memcpy: get!(lib, "cudaMemcpy"),
            stream_create: get!(lib, "cudaStreamCreate"),
            stream_sync: get!(lib, "cudaStreamSynchronize"),
            stream_destroy: get!(lib, "cudaStreamDestroy"),
            pci_bus_id: get!(lib, "cudaDeviceGetPCIBusId"),
            error_string: get!(lib, "cudaGetErrorString"),
            _lib: lib,
        };
        let mut n: c_int = 0;
        // SAFETY: valid out pointer.
        let rc = unsafe { (cuda.get_device_count)(&mut n) };
        if rc != 0 || n < 1 {
            return None;
        }
        Some((cuda, n))
    }

    fn check(&self, code: E, call: &'static str) -> Result<(), CudaError> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: cudaGetErrorString returns a static string.
        let p = unsafe { (self.error_string)(code) };
        let message = if p.is_null() {
            String::new()
        } else {
            // SAFETY: non-null, NUL-terminated, static.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(CudaError {
            code,
            call,
            message,
        })
    }

    /// cudaSetDevice
    pub fn set_device(&self, dev: i32) -> Result<(), CudaError> {
        // SAFETY: plain value argument.
        self.check(unsafe { (self.set_device)(dev) }, "cudaSetDevice")
    }

    /// cudaMalloc on the current device.
    pub fn malloc(&self, size: usize) -> Result<usize, CudaError> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        self.check(unsafe { (self.malloc)(&mut p, size.max(1)) }, "cudaMalloc")?;
        Ok(p as usize)
    }

    /// cudaFree
    pub fn free(&self, p: usize) -> Result<(), CudaError> {
        // SAFETY: p came from cudaMalloc and is freed once.
        self.check(unsafe { (self.free)(p as *mut c_void) }, "cudaFree")
    }

    /// Host -> device copy.
    pub fn to_device(&self, dst: usize, src: &[u8]) -> Result<(), CudaError> {
        // SAFETY: dst is a device allocation of at least src.len() bytes (caller checks
        // bounds); src is a live slice. Kind 1 = cudaMemcpyHostToDevice.
        self.check(
            unsafe { (self.memcpy)(dst as *mut c_void, src.as_ptr().cast(), src.len(), 1) },
            "cudaMemcpy",
        )
    }

    /// Device -> host copy.
    pub fn to_host(&self, dst: &mut [u8], src: usize) -> Result<(), CudaError> {
        // SAFETY: src is a device allocation of at least dst.len() bytes (caller checks
        // bounds); dst is a live, uniquely borrowed slice. Kind 2 = cudaMemcpyDeviceToHost.
        self.check(
            unsafe { (self.memcpy)(dst.as_mut_ptr().cast(), src as *const c_void, dst.len(), 2) },
            "cudaMemcpy",
        )
    }

    /// Device -> device copy.
    pub fn d2d(&self, dst: usize, src: usize, len: usize) -> Result<(), CudaError> {
        // SAFETY: both device ranges are within allocations (caller); kind 3.
        self.check(
            unsafe { (self.memcpy)(dst as *mut c_void, src as *const c_void, len, 3) },
            "cudaMemcpy",
        )
    }

    /// cudaStreamCreate
    pub fn stream_create(&self) -> Result<usize, CudaError> {
        let mut s: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        self.check(unsafe { (self.stream_create)(&mut s) }, "cudaStreamCreate")?;
        Ok(s as usize)
    }

    /// cudaStreamSynchronize
    pub fn stream_sync(&self, s: usize) -> Result<(), CudaError> {
        // SAFETY: s is a stream from stream_create or the null stream.
        self.check(
            unsafe { (self.stream_sync)(s as *mut c_void) },
            "cudaStreamSynchronize",
        )
    }

    /// cudaStreamDestroy
    pub fn stream_destroy(&self, s: usize) -> Result<(), CudaError> {
        // SAFETY: s came from stream_create, destroyed once.
        self.check(
            unsafe { (self.stream_destroy)(s as *mut c_void) },
            "cudaStreamDestroy",
        )
    }

    /// "dddd:bb:dd" of `dev` (from cudaDeviceGetPCIBusId).
    pub fn pci_id(&self, dev: i32) -> String {
        let mut buf = [0 as c_char; 64];
        // SAFETY: buffer length passed correctly.
        let rc = unsafe { (self.pci_bus_id)(buf.as_mut_ptr(), buf.len() as c_int, dev) };
        if rc != 0 {
            return "0000:00:00".to_string();
        }
        // SAFETY: cudart NUL-terminates within the given length.
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        // "0000:07:00.0" -> "0000:07:00"
        s.rsplit_once('.')
            .map(|(a, _)| a.to_string())
            .unwrap_or(s)
            .to_lowercase()
    }
}
