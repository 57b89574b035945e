//! Transports that move chunk data between ranks. `shm` holds the shared-memory primitives
//! (segments, slot FIFOs, futex doorbells, back-off) used between processes of one host and
//! between threads of one process; `socket` carries the same FIFO messages over TCP between
//! hosts (a proxy thread per communicator pumps local FIFOs to and from sockets).

pub(crate) mod current;
pub mod shm;
pub(crate) mod socket;
pub mod wake;
