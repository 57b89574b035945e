//! The data streams' pumps of the socket proxy ([`super`]): one pass of writing what a
//! stream owes its sockets (credit frames, headers, payload pieces) and of reading what
//! its sockets hold into the executor's receive FIFO, plus the one-socket read and write
//! steps they are made of.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::super::frame::{stripe, DataHeader, StreamFrame, DATA_HEADER_BYTES};
use super::{would_block, Inbound, Loop, Outbound};
use crate::error::CclError;
use crate::transport::wake::send_vectored;

/// What one socket's share of a message did in one pass.
enum Io {
    Done,
    Blocked,
    Closed,
    Failed(std::io::Error),
}

/// Writes what is left of `piece` (from `*at`) to `sock`.
fn write_piece(sock: &mut TcpStream, piece: &[u8], at: &mut usize, progress: &mut bool) -> Io {
    while *at < piece.len() {
        // std's `write` on a socket is send(2) with MSG_NOSIGNAL.
        match sock.write(&piece[*at..]) {
            Ok(0) => return Io::Closed,
            Ok(n) => {
                *at += n;
                *progress = true;
            }
            Err(e) if would_block(&e) => return Io::Blocked,
            Err(e) => return Io::Failed(e),
        }
    }
    Io::Done
}

/// Reads what is left of `piece` (from `*at`) from `sock`. A read that returns less than
/// it asked for emptied the socket's receive queue (a TCP read copies until the queue is
/// empty or the buffer full): that counts as blocked without a further read that would
/// only fail with `EAGAIN` (the caller's `poll` or next round sees what comes next).
fn read_piece(sock: &mut TcpStream, piece: &mut [u8], at: &mut usize, progress: &mut bool) -> Io {
    while *at < piece.len() {
        let want = piece.len() - *at;
        match sock.read(&mut piece[*at..]) {
            Ok(0) => return Io::Closed,
            Ok(n) => {
                *at += n;
                *progress = true;
                if n < want {
                    return Io::Blocked;
                }
            }
            Err(e) if would_block(&e) => return Io::Blocked,
            Err(e) => return Io::Failed(e),
        }
    }
    Io::Done
}

/// [`read_piece`] on a stream's first socket, where the next frame's header follows the
/// piece: every read also asks for the rest of that header (`readv` into `next` from
/// `*next_len`), so a header already queued comes with the piece's last bytes, and a
/// read that comes back short says the receive queue is empty, so the caller reads no
/// header that is not there. Returns what [`read_piece`] returns and whether the queue
/// was found empty.
fn read_piece_and_next(
    sock: &mut TcpStream,
    piece: &mut [u8],
    at: &mut usize,
    (next, next_len): (&mut [u8; DATA_HEADER_BYTES], &mut usize),
    progress: &mut bool,
) -> (Io, bool) {
    while *at < piece.len() {
        let want_piece = piece.len() - *at;
        let want = want_piece + (DATA_HEADER_BYTES - *next_len);
        let r = sock.read_vectored(&mut [
            IoSliceMut::new(&mut piece[*at..]),
            IoSliceMut::new(&mut next[*next_len..]),
        ]);
        match r {
            Ok(0) => return (Io::Closed, false),
            Ok(n) => {
                *progress = true;
                let p = n.min(want_piece);
                *at += p;
                *next_len += n - p;
                if n < want {
                    let io = if *at < piece.len() {
                        Io::Blocked
                    } else {
                        Io::Done
                    };
                    return (io, true);
                }
            }
            Err(e) if would_block(&e) => return (Io::Blocked, true),
            Err(e) => return (Io::Failed(e), false),
        }
    }
    (Io::Done, false)
}

impl Loop {
    /// Writes what the stream owes its sockets: a credit frame between messages, the
    /// message being written, then the next committed ones. A credit frame owed when the
    /// next message is ready leaves in the same `sendmsg` as that message's header and
    /// first piece (one system call and one TCP segment fewer: on a 2-rank ring or Tree
    /// the stream carries both directions, and a credit leaves after nearly every message
    /// received); with nothing to send it leaves alone.
    pub(super) fn pump_out(&mut self, i: usize) -> bool {
        let mut progress = false;
        self.data[i].note_consumed();
        loop {
            let d = &mut self.data[i];
            if d.done {
                return progress;
            }
            if d.out_len.is_none() && d.credit_owed > 0 && d.credit_frame.is_none() {
                let n = u32::try_from(d.credit_owed).unwrap_or(u32::MAX);
                d.credit_owed -= u64::from(n);
                d.credit_frame = Some((StreamFrame::credit(n), 0));
            }
            let unacked = d.unacked;
            let k = d.s.ways();
            let Some(out) = d.s.out.as_mut() else {
                return self.write_credit(i).is_none_or(|p| p || progress);
            };
            let (payload, desc) = match out.peek(unacked) {
                Ok(Some(m)) => m,
                // Nothing to send with it: the credit frame (if any) leaves alone.
                Ok(None) => return self.write_credit(i).is_none_or(|p| p || progress),
                Err(CclError::Aborted(why)) => {
                    // Our own operation failed with this message unwritten: the stream
                    // cannot go on, but the peer is not to blame.
                    self.end_data(i, why);
                    return true;
                }
                Err(e) => {
                    let why = format!("local send FIFO is corrupt: {e}");
                    self.fail_data(i, why);
                    return true;
                }
            };
            let len = payload.len();
            if d.out_len.is_none() {
                d.out_len = Some(len);
                d.sent = 0;
                d.extra_sent.fill(0);
            }
            let hdr = DataHeader { len, desc }.encode();
            // The first socket: a credit frame owed (only before the message's first
            // byte), the header, then the first piece.
            let first = &payload[stripe(len, k, 0)];
            let total = DATA_HEADER_BYTES + first.len();
            let mut blocked = false;
            while d.sent < total {
                let credit = match &d.credit_frame {
                    Some((frame, written)) => &frame[*written..],
                    None => &[][..],
                };
                let r = if d.sent < DATA_HEADER_BYTES {
                    send_vectored(
                        d.s.sock.as_raw_fd(),
                        &[
                            IoSlice::new(credit),
                            IoSlice::new(&hdr[d.sent..]),
                            IoSlice::new(first),
                        ],
                    )
                } else {
                    // std's `write` on a socket is send(2) with MSG_NOSIGNAL.
                    d.s.sock.write(&first[d.sent - DATA_HEADER_BYTES..])
                };
                match r {
                    Ok(0) => {
                        self.end_data(i, "connection closed while sending".into());
                        return true;
                    }
                    Ok(n) => {
                        // The credit frame's bytes went first.
                        let c = n.min(credit.len());
                        if let Some((_, written)) = d.credit_frame.as_mut() {
                            *written += c;
                            if *written == DATA_HEADER_BYTES {
                                d.credit_frame = None;
                            }
                        }
                        d.sent += n - c;
                        progress = true;
                    }
                    Err(e) if would_block(&e) => {
                        blocked = true;
                        break;
                    }
                    Err(e) => {
                        self.end_data(i, format!("send failed: {e}"));
                        return true;
                    }
                }
            }
            // The other sockets: one piece each, raw.
            let mut broken = None;
            for (j, (sock, at)) in d.s.extra.iter_mut().zip(&mut d.extra_sent).enumerate() {
                match write_piece(sock, &payload[stripe(len, k, j + 1)], at, &mut progress) {
                    Io::Done => {}
                    Io::Blocked => blocked = true,
                    Io::Closed => {
                        broken = Some(format!(
                            "connection closed while sending (socket {})",
                            j + 1
                        ))
                    }
                    Io::Failed(e) => broken = Some(format!("send failed (socket {}): {e}", j + 1)),
                }
                if broken.is_some() {
                    break;
                }
            }
            if let Some(why) = broken {
                self.end_data(i, why);
                return true;
            }
            if blocked {
                return progress;
            }
            d.out_len = None;
            d.sent = 0;
            match out {
                // The slot stays taken until the peer's credit (`pump_in`).
                Outbound::Fifo(f, refs) => {
                    d.unacked += 1;
                    // An executor may wait for a referenced message to be written.
                    if refs.set_written(f.released() + d.unacked as u64) {
                        self.ring_exec = true;
                    }
                }
                Outbound::Ll(f) => {
                    f.release();
                    self.ring_exec = true;
                }
            }
        }
    }

    /// Writes the stream's credit frame, if any, on its own: `Some(progress)`, or `None`
    /// when the connection ended (the stream stopped).
    fn write_credit(&mut self, i: usize) -> Option<bool> {
        let mut progress = false;
        let d = &mut self.data[i];
        let Some((frame, written)) = d.credit_frame.as_mut() else {
            return Some(false);
        };
        match write_piece(&mut d.s.sock, &frame[..], written, &mut progress) {
            Io::Done => d.credit_frame = None,
            Io::Blocked => {}
            Io::Closed => {
                self.end_data(i, "connection closed while sending".into());
                return None;
            }
            Io::Failed(e) => {
                self.end_data(i, format!("send failed: {e}"));
                return None;
            }
        }
        Some(progress)
    }

    pub(super) fn pump_in(&mut self, i: usize) -> bool {
        let mut progress = false;
        loop {
            let d = &mut self.data[i];
            if d.done {
                return progress;
            }
            if !d.reads() {
                return progress;
            }
            let h = match d.incoming {
                Some(h) => h,
                None => {
                    // The header may have come with the previous payload's last bytes.
                    if d.hdr_len < DATA_HEADER_BYTES {
                        match d.s.sock.read(&mut d.hdr[d.hdr_len..]) {
                            Ok(0) => {
                                // End of stream between messages: the peer closed it (destroy);
                                // a lost peer shows on the control stream.
                                d.stop();
                                let why = (d.hdr_len > 0).then(|| {
                                    format!(
                                        "truncated frame header ({} of {DATA_HEADER_BYTES} bytes)",
                                        d.hdr_len
                                    )
                                });
                                if let Some(why) = why {
                                    self.fail_data(i, why);
                                }
                                return true;
                            }
                            Ok(n) => {
                                if d.hdr_len == 0 && d.s.inb.is_some() {
                                    d.wire_t0 = Some(Instant::now());
                                }
                                d.hdr_len += n;
                                progress = true;
                            }
                            Err(e) if would_block(&e) => return progress,
                            Err(e) if d.hdr_len == 0 => {
                                self.end_data(i, format!("receive failed: {e}"));
                                return true;
                            }
                            Err(e) => {
                                self.fail_data(i, format!("receive failed: {e}"));
                                return true;
                            }
                        }
                    }
                    if d.hdr_len < DATA_HEADER_BYTES {
                        // A short read emptied the receive queue (see `read_piece`).
                        return progress;
                    }
                    d.hdr_len = 0;
                    let cap = d.s.inb.as_ref().map_or(0, Inbound::cap);
                    match StreamFrame::decode(&d.hdr, cap, d.unacked as u32) {
                        Ok(StreamFrame::Credit(n)) => {
                            d.wire_t0 = None;
                            if let Some(Outbound::Fifo(f, _)) = d.s.out.as_mut() {
                                for _ in 0..n {
                                    f.release_oldest();
                                }
                            }
                            d.unacked -= n as usize;
                            self.ring_exec = true;
                            continue;
                        }
                        Ok(StreamFrame::Data(_)) if d.s.inb.is_none() => {
                            let why = "data on a stream that only sends".to_string();
                            self.fail_data(i, why);
                            return true;
                        }
                        Ok(StreamFrame::Data(h)) => {
                            d.incoming = Some(h);
                            d.got = 0;
                            d.extra_got.fill(0);
                            h
                        }
                        Err(why) => {
                            self.fail_data(i, why);
                            return true;
                        }
                    }
                }
            };
            let k = d.s.ways();
            let Some(inb) = d.s.inb.as_mut() else {
                return progress;
            };
            let Some(slot) = inb.reserve() else {
                d.blocked = true;
                // Waiting for the executor is not time on the wire.
                d.wire_t0 = None;
                return progress;
            };
            d.blocked = false;
            if d.wire_t0.is_none() {
                d.wire_t0 = Some(Instant::now());
            }
            let mut blocked = false;
            let mut broken = None;
            // Whether the first socket's receive queue was found empty, and whether the next
            // header started arriving with this payload.
            let mut drained = false;
            let header_before = d.hdr_len;
            let socks = std::iter::once(&mut d.s.sock).chain(d.s.extra.iter_mut());
            let ats = std::iter::once(&mut d.got).chain(d.extra_got.iter_mut());
            for (j, (sock, at)) in socks.zip(ats).enumerate() {
                let piece = &mut slot[stripe(h.len, k, j)];
                let io = if j == 0 {
                    let next = (&mut d.hdr, &mut d.hdr_len);
                    let (io, empty) = read_piece_and_next(sock, piece, at, next, &mut progress);
                    drained = empty;
                    io
                } else {
                    read_piece(sock, piece, at, &mut progress)
                };
                match io {
                    Io::Done => continue,
                    Io::Blocked => {
                        blocked = true;
                        continue;
                    }
                    Io::Closed => broken = Some("connection closed".to_string()),
                    Io::Failed(e) => broken = Some(format!("receive failed: {e}")),
                }
                let on = if j == 0 {
                    String::new()
                } else {
                    format!(" on socket {j}")
                };
                broken = broken.map(|why| format!("{why}{on}"));
                break;
            }
            if let Some(why) = broken {
                let got = d.got + d.extra_got.iter().sum::<usize>();
                let why = format!(
                    "{why} in the middle of a {}-byte message ({got} received)",
                    h.len
                );
                self.fail_data(i, why);
                return true;
            }
            if blocked {
                return progress;
            }
            if let Err(e) = inb.commit(&h) {
                self.fail_data(i, format!("local receive FIFO: {e}"));
                return true;
            }
            if let Some(t0) = d.wire_t0.take() {
                let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
                d.s.wire.fetch_add(ns, Ordering::Relaxed);
            }
            d.incoming = None;
            d.got = 0;
            self.ring_exec = true;
            if header_before == 0 && d.hdr_len > 0 && d.s.inb.is_some() {
                // The next message's wire time starts at its first header byte.
                d.wire_t0 = Some(Instant::now());
            }
            if drained && d.hdr_len < DATA_HEADER_BYTES {
                // Nothing more queued: no header read that could only fail.
                return progress;
            }
        }
    }
}
