//! Transports that move chunk data between ranks. `shm` holds the shared-memory primitives
//! (segments, slot FIFOs, futex doorbells, back-off) used between processes of one host and
//! between threads of one process.

pub mod shm;
