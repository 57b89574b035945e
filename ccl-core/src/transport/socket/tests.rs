//! Tests of the socket transport: the wire format, set-up checks, and pairs of proxies
//! over loopback sockets.

use super::*;
use crate::bootstrap::get_unique_id;
use crate::transport::shm::FifoLayout;
use frame::{DataHeader, DATA_HEADER_BYTES};
use peers::PeerStates;
use proxy::{Inbound, Outbound};

/// This rank's doorbell and poison word, as `Transport::connect` makes them.
fn local_words() -> (Arc<Doorbell>, SharedWord) {
    let region = Arc::new(ShmRegion::anonymous(2 * CACHE_LINE).unwrap());
    (
        Arc::new(Doorbell::new(Arc::clone(&region), 0).unwrap()),
        SharedWord::new(region, 8).unwrap(),
    )
}

/// Four current-collective words at the start of `region`.
fn current_words(region: &Arc<ShmRegion>) -> [SharedWord; 4] {
    [0, 8, 16, 24].map(|o| SharedWord::new(Arc::clone(region), o).unwrap())
}

/// Two ranks (threads) of one communicator, each reaching the other over sockets.
fn pair() -> Vec<Remote> {
    pair_publishing().0
}

/// [`pair`], and the regions holding each rank's own current-collective words.
fn pair_publishing() -> (Vec<Remote>, Vec<Arc<ShmRegion>>) {
    let regions: Vec<_> = (0..2)
        .map(|_| Arc::new(ShmRegion::anonymous(CACHE_LINE).unwrap()))
        .collect();
    let id = get_unique_id().unwrap();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let mine = current_words(&regions[r]);
            std::thread::spawn(move || {
                let boot = Bootstrap::init(
                    &id,
                    2,
                    r,
                    Arc::new(AtomicBool::new(false)),
                    Duration::from_secs(20),
                )
                .unwrap();
                let (bell, poison) = local_words();
                Remote::connect(&boot, vec![r == 1, r == 0], bell, poison, mine).unwrap()
            })
        })
        .collect();
    (hs.into_iter().map(|h| h.join().unwrap()).collect(), regions)
}

/// A rank asks a peer on another host which collective it runs (the Tree wait's
/// inconsistent-call check): the peer's proxy answers from the words its executor
/// publishes, and the answer lands where this rank's executor reads a peer's words.
#[test]
fn a_query_brings_the_remote_peers_current_collective() {
    let (ranks, regions) = pair_publishing();
    let theirs = current_words(&regions[1]);
    crate::transport::current::store(&theirs, [8, 0xabc, 0xdef]);
    let seen = ranks[0].peer_current(1).unwrap();
    assert_eq!(
        crate::transport::current::load(&seen),
        None,
        "nothing asked yet"
    );
    let ask = |r: &Remote| {
        r.query_word(1).unwrap().get().store(1, Ordering::Release);
        r.peer_bell().unwrap().ring();
    };
    ask(&ranks[0]);
    wait_until("the answer", || {
        crate::transport::current::load(&seen) == Some([8, 0xabc, 0xdef])
    });
    // The peer moves on; a new query brings the new collective, and "none" is an
    // answer too.
    crate::transport::current::store(&theirs, [9, 1, 2]);
    ask(&ranks[0]);
    wait_until("the second answer", || {
        crate::transport::current::load(&seen) == Some([9, 1, 2])
    });
    crate::transport::current::store(&theirs, [0, 0, 0]);
    ask(&ranks[0]);
    wait_until("the answer 'none'", || {
        crate::transport::current::load(&seen).is_none()
    });
    assert_eq!(
        seen[3].get().load(Ordering::Relaxed),
        0,
        "no CPU for a remote peer"
    );
    assert_eq!((ranks[0].lost(1), ranks[1].lost(0)), (None, None));
}

/// Whether the other end dropped `s` (end of stream or reset) within 10 s.
fn dropped(mut s: TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 8];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn junk_wrong_secrets_and_truncated_hellos_are_dropped_and_the_real_peer_gets_through() {
    let mut ranks = pair();
    let addr = ranks[1].listener.local_addr().unwrap();
    let good = Hello {
        stream: StreamId::p2p(0),
        comm_hash: ranks[1].comm_hash,
        from: 0,
        to: 1,
        secret: ranks[1].secret,
    };
    let mut bad_secret = good;
    bad_secret.secret[0] ^= 1;
    let mut other_comm = good;
    other_comm.comm_hash ^= 1;
    let sends: [&[u8]; 4] = [
        &[0x5a; HELLO_BYTES],
        &bad_secret.encode(),
        &other_comm.encode(),
        &good.encode()[..10],
    ];
    let mut junk = Vec::new();
    for bytes in sends {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(bytes).unwrap();
        if bytes.len() < HELLO_BYTES {
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
        junk.push(s);
    }
    let (r0, r1) = ranks.split_at_mut(1);
    let mut real = r0[0].connect_to(1, StreamId::p2p(0)).unwrap();
    let mut got = r1[0]
        .accept_from(0, StreamId::p2p(0), &AtomicBool::new(false))
        .expect("the real peer's connection is accepted past the junk");
    for (i, s) in junk.into_iter().enumerate() {
        assert!(dropped(s), "junk connection {i} was not dropped");
    }
    real.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    got.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    // Nothing was lost: both control connections are still up.
    assert_eq!(ranks[0].lost(1), None);
    assert_eq!(ranks[1].lost(0), None);
}

#[test]
fn a_missing_peer_is_a_timeout_naming_it_not_a_hang() {
    let mut ranks = pair();
    ranks[1].timeout = Duration::from_millis(300);
    let e = ranks[1]
        .accept_from(0, StreamId::tree(0), &AtomicBool::new(false))
        .unwrap_err();
    assert!(
        matches!(&e, CclError::Timeout(m) if m.contains("rank 0") && m.contains("tree channel 0")),
        "{e:?}"
    );
    let e = ranks[1]
        .accept_from(0, StreamId::tree(0), &AtomicBool::new(true))
        .unwrap_err();
    assert!(matches!(e, CclError::Aborted(_)), "{e:?}");
}

/// A proxy serving one inbound stream whose other end the test writes.
fn proxy_with_inbound() -> (Proxy, TcpStream, FifoReceiverEnd) {
    let (proxy, feed, rx, _) = proxy_with_inbound_wire();
    (proxy, feed, rx)
}

/// [`proxy_with_inbound`] and the stream's wire-time counter.
fn proxy_with_inbound_wire() -> (Proxy, TcpStream, FifoReceiverEnd, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let feed = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (sock, _) = listener.accept().unwrap();
    sock.set_nonblocking(true).unwrap();
    let proxy = test_proxy(0);
    let layout = FifoLayout::for_buffer(4096, 4).unwrap();
    let fifo = Arc::new(ShmRegion::anonymous(layout.bytes()).unwrap());
    let tx = crate::transport::shm::FifoSender::new(Arc::clone(&fifo), 0, layout).unwrap();
    let rx = crate::transport::shm::FifoReceiver::new(fifo, 0, layout).unwrap();
    let wire = Arc::new(AtomicU64::new(0));
    proxy
        .add(Cmd::Data(Box::new(DataStream {
            peer: 1,
            id: StreamId::ring(0),
            sock,
            extra: Vec::new(),
            out: None,
            inb: Some(Inbound::Fifo(tx)),
            wire: Arc::clone(&wire),
        })))
        .unwrap();
    (proxy, feed, rx, wire)
}

type FifoReceiverEnd = crate::transport::shm::FifoReceiver;

/// A running proxy of rank `rank` (of 2) with private words and no streams yet.
fn test_proxy(rank: usize) -> Proxy {
    test_proxy_leased(rank, proxy::DRIVE_LEASE)
}

/// [`test_proxy`] whose `drive` keeps the thread off the sockets for `lease`.
fn test_proxy_leased(rank: usize, lease: Duration) -> Proxy {
    let (bell, poison) = local_words();
    let wake_region = Arc::new(ShmRegion::anonymous(CACHE_LINE).unwrap());
    Proxy::start(ProxyLocal {
        rank,
        nranks: 2,
        exec_bell: bell,
        poison,
        current: None,
        wake_bell: Doorbell::new(wake_region, 0).unwrap(),
        wake: Arc::new(EventFd::new().unwrap()),
        flush: Duration::from_millis(100),
        drive_lease: lease,
    })
    .unwrap()
}

/// A proxy of rank `rank` serving one stream with `peer` over `sock` and `extra`.
fn proxy_serving(
    rank: usize,
    peer: usize,
    socks: (TcpStream, Vec<TcpStream>),
    out: Option<Outbound>,
    inb: Option<Inbound>,
) -> Proxy {
    proxy_serving_leased(rank, peer, socks, out, inb, proxy::DRIVE_LEASE)
}

/// [`proxy_serving`] with [`test_proxy_leased`].
fn proxy_serving_leased(
    rank: usize,
    peer: usize,
    (sock, extra): (TcpStream, Vec<TcpStream>),
    out: Option<Outbound>,
    inb: Option<Inbound>,
    lease: Duration,
) -> Proxy {
    for s in std::iter::once(&sock).chain(&extra) {
        s.set_nonblocking(true).unwrap();
    }
    let proxy = test_proxy_leased(rank, lease);
    proxy
        .add(Cmd::Data(Box::new(DataStream {
            peer,
            id: StreamId::ring(0),
            sock,
            extra,
            out,
            inb,
            wire: Default::default(),
        })))
        .unwrap();
    proxy
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The FIFOs of a link between two proxies: the sending executor's end and its proxy's
/// end, then the receiving proxy's end and its executor's end.
fn fifo_pairs(
    layout: FifoLayout,
) -> (
    crate::transport::shm::FifoSender,
    crate::transport::shm::FifoReceiver,
    crate::transport::shm::FifoSender,
    crate::transport::shm::FifoReceiver,
) {
    use crate::transport::shm::{FifoReceiver, FifoSender};
    let fifo = || Arc::new(ShmRegion::anonymous(layout.bytes()).unwrap());
    let (a, b) = (fifo(), fifo());
    (
        FifoSender::new(Arc::clone(&a), 0, layout).unwrap(),
        FifoReceiver::new(a, 0, layout).unwrap(),
        FifoSender::new(Arc::clone(&b), 0, layout).unwrap(),
        FifoReceiver::new(b, 0, layout).unwrap(),
    )
}

/// Over shared memory a sender gets a slot back when the receiver consumes a message;
/// over sockets too (the probe's wait metrics mean the same): a sent message keeps its
/// slot until the peer's credit.
#[test]
fn the_sender_gets_a_slot_back_only_when_the_remote_receiver_consumes() {
    let layout = FifoLayout::for_buffer(4096, 4).unwrap();
    let (mut send, a_out, b_in, mut recv) = fifo_pairs(layout);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a_sock = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b_sock, _) = listener.accept().unwrap();
    let a = proxy_serving(
        0,
        1,
        (a_sock, vec![]),
        Some(Outbound::Fifo(a_out, Arc::new(sendref::SendRefs::new(4)))),
        None,
    );
    let b = proxy_serving(1, 0, (b_sock, vec![]), None, Some(Inbound::Fifo(b_in)));
    for i in 0..4u8 {
        let slot = send.try_reserve().expect("a free slot");
        slot[..3].copy_from_slice(&[i, i, i]);
        send.commit_with_desc(3, [u64::from(i), 0, 9]);
    }
    wait_until("all four messages delivered", || recv.pending() == 4);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        send.try_reserve().is_none(),
        "a slot came back before the receiver consumed anything"
    );
    let (data, desc) = recv.try_peek_with_desc().unwrap().unwrap();
    assert_eq!((data, desc), (&[0u8, 0, 0][..], [0, 0, 9]));
    recv.release();
    wait_until("the slot comes back after one consumed message", || {
        send.try_reserve().is_some()
    });
    send.try_reserve().expect("the slot that came back")[0] = 4;
    send.commit_with_desc(1, [4, 0, 9]);
    for i in 1..5u8 {
        wait_until("the next message", || recv.pending() > 0);
        let (data, desc) = recv.try_peek_with_desc().unwrap().unwrap();
        assert_eq!(desc, [u64::from(i), 0, 9]);
        assert!(data.iter().all(|x| *x == i), "message {i}: {data:?}");
        recv.release();
    }
    assert_eq!((a.peers.lost(1), b.peers.lost(0)), (None, None));
}

fn lost_within(peers: &PeerStates, peer: usize) -> Option<String> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if let Some(why) = peers.lost(peer) {
            return Some(why);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

#[test]
fn a_message_arrives_whole_with_its_descriptor() {
    let (proxy, mut feed, mut rx) = proxy_with_inbound();
    let h = DataHeader {
        len: 5,
        desc: [7, 8, 9],
    };
    // Written in pieces: the proxy reassembles a header and payload split anywhere.
    let mut bytes = h.encode().to_vec();
    bytes.extend_from_slice(b"hello");
    for chunk in bytes.chunks(3) {
        feed.write_all(chunk).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let t0 = Instant::now();
    loop {
        if let Some((data, desc)) = rx.try_peek_with_desc().unwrap() {
            assert_eq!((data, desc), (&b"hello"[..], [7, 8, 9]));
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no message");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(proxy.peers.lost(1), None);
}

/// Waits until the FIFO holds `n` messages (not consumed), at most 10 s.
fn wait_messages(rx: &mut FifoReceiverEnd, n: usize) {
    let t0 = Instant::now();
    while rx.try_peek_ahead(n - 1).unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no message {n}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn the_time_a_message_takes_to_arrive_is_counted_as_wire_time() {
    let (_proxy, mut feed, mut rx, wire) = proxy_with_inbound_wire();
    let h = DataHeader {
        len: 100,
        desc: [1, 2, 3],
    };
    let mut bytes = h.encode().to_vec();
    bytes.extend_from_slice(&[5u8; 100]);
    // A message that crawls: its second half comes 200 ms after its first byte.
    let t0 = Instant::now();
    feed.write_all(&bytes[..60]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    feed.write_all(&bytes[60..]).unwrap();
    wait_messages(&mut rx, 1);
    let slow = wire.load(Ordering::Relaxed);
    // The proxy times from the moment it reads the first bytes, which a loaded machine
    // may delay by some milliseconds (seen: 197.9 ms while a build ran).
    assert!(
        slow >= 150_000_000 && slow <= t0.elapsed().as_nanos() as u64,
        "wire time of the crawling message: {slow} ns"
    );
    // One written at once: far less (its bytes arrive together).
    feed.write_all(&bytes).unwrap();
    wait_messages(&mut rx, 2);
    let fast = wire.load(Ordering::Relaxed) - slow;
    assert!(
        fast < 100_000_000,
        "wire time of a whole message: {fast} ns"
    );
}

/// `k` connected socket pairs on 127.0.0.1: (the ends the test or a sender keeps, the
/// accepted ends).
fn socket_pairs(k: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    (0..k)
        .map(|_| {
            let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (b, _) = listener.accept().unwrap();
            b.set_nonblocking(true).unwrap();
            (a, b)
        })
        .unzip()
}

/// A proxy (rank 0) serving one inbound stream from rank 1 over `k` sockets, with
/// 1 MiB slots; the test writes the other ends.
fn proxy_with_striped_inbound(k: usize) -> (Proxy, Vec<TcpStream>, FifoReceiverEnd) {
    proxy_with_striped_inbound_leased(k, proxy::DRIVE_LEASE)
}

/// [`proxy_with_striped_inbound`] with [`test_proxy_leased`].
fn proxy_with_striped_inbound_leased(
    k: usize,
    lease: Duration,
) -> (Proxy, Vec<TcpStream>, FifoReceiverEnd) {
    let (feeds, mut socks) = socket_pairs(k);
    let layout = FifoLayout::for_buffer(4 << 20, 4).unwrap();
    let fifo = Arc::new(ShmRegion::anonymous(layout.bytes()).unwrap());
    let tx = crate::transport::shm::FifoSender::new(Arc::clone(&fifo), 0, layout).unwrap();
    let rx = crate::transport::shm::FifoReceiver::new(fifo, 0, layout).unwrap();
    let first = socks.remove(0);
    let proxy = proxy_serving_leased(0, 1, (first, socks), None, Some(Inbound::Fifo(tx)), lease);
    (proxy, feeds, rx)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A 200,000-byte payload (`pattern(_, seed)`) and its header.
fn message_of_200k(seed: u8, desc: [u64; 3]) -> (Vec<u8>, DataHeader) {
    let payload = pattern(200_000, seed);
    let h = DataHeader {
        len: payload.len(),
        desc,
    };
    (payload, h)
}

/// The wire format of a striped stream, written by hand: a 200,000-byte payload over
/// 3 sockets is cut into pieces of 66,688 bytes (200,000 / 3 rounded up to 64), the
/// header and piece 0 on socket 0. The pieces are written last-socket first: the
/// receiver reassembles whatever the order of arrival.
#[test]
fn a_payload_striped_by_hand_over_three_sockets_is_reassembled() {
    let (proxy, mut feeds, mut rx) = proxy_with_striped_inbound(3);
    let (payload, h) = message_of_200k(5, [4, 5, 6]);
    feeds[2].write_all(&payload[133_376..]).unwrap();
    feeds[1].write_all(&payload[66_688..133_376]).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    feeds[0].write_all(&h.encode()).unwrap();
    feeds[0].write_all(&payload[..66_688]).unwrap();
    // A short message next: whole on socket 0.
    let short = DataHeader {
        len: 3,
        desc: [7, 7, 7],
    };
    feeds[0].write_all(&short.encode()).unwrap();
    feeds[0].write_all(b"abc").unwrap();
    wait_messages(&mut rx, 2);
    let (data, desc) = rx.try_peek_with_desc().unwrap().unwrap();
    assert_eq!(desc, [4, 5, 6]);
    assert!(data == &payload[..], "striped payload corrupted");
    rx.release();
    let (data, desc) = rx.try_peek_with_desc().unwrap().unwrap();
    assert_eq!((data, desc), (&b"abc"[..], [7, 7, 7]));
    assert_eq!(proxy.peers.lost(1), None);
}

#[test]
fn a_piece_cut_short_on_an_extra_socket_loses_the_peer_and_delivers_nothing() {
    let (proxy, mut feeds, mut rx) = proxy_with_striped_inbound(3);
    let (payload, h) = message_of_200k(1, [1, 2, 3]);
    feeds[0].write_all(&h.encode()).unwrap();
    feeds[0].write_all(&payload[..66_688]).unwrap();
    feeds[1].write_all(&payload[66_688..133_376]).unwrap();
    feeds[2].write_all(&payload[133_376..140_000]).unwrap();
    let last = feeds.pop().unwrap();
    drop(last);
    let why = lost_within(&proxy.peers, 1).expect("peer marked lost");
    assert!(
        why.contains("on socket 2 in the middle of a 200000-byte message (140000 received)"),
        "{why}"
    );
    assert!(
        rx.try_peek_checked().unwrap().is_none(),
        "a partial message was delivered"
    );
}

/// Two proxies joined by a 4-socket stream: payloads of every shape (empty, under one
/// piece, one byte over, several pieces, a whole slot) arrive whole, in order, with
/// their descriptors, and the sender's slots come back as the receiver consumes.
#[test]
fn payloads_striped_between_two_proxies_arrive_whole_and_in_order() {
    let layout = FifoLayout::for_buffer(4 << 20, 4).unwrap();
    let (mut send, a_out, b_in, mut recv) = fifo_pairs(layout);
    let (mut a_socks, mut b_socks) = socket_pairs(4);
    let a_first = a_socks.remove(0);
    let b_first = b_socks.remove(0);
    let a = proxy_serving(
        0,
        1,
        (a_first, a_socks),
        Some(Outbound::Fifo(a_out, Arc::new(sendref::SendRefs::new(4)))),
        None,
    );
    let b = proxy_serving(1, 0, (b_first, b_socks), None, Some(Inbound::Fifo(b_in)));
    let lens = [0, 1, 65_536, 65_537, 200_000, 777_777, layout.slot_bytes];
    let sender = std::thread::spawn(move || {
        for (i, len) in lens.into_iter().enumerate() {
            let t0 = Instant::now();
            let slot = loop {
                if let Some(slot) = send.try_reserve() {
                    break slot;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "no slot for message {i}"
                );
                std::thread::sleep(Duration::from_millis(1));
            };
            slot[..len].copy_from_slice(&pattern(len, i as u8));
            send.commit_with_desc(len, [i as u64, len as u64, 9]);
        }
    });
    for (i, len) in lens.into_iter().enumerate() {
        wait_until("the next message", || recv.pending() > 0);
        let (data, desc) = recv.try_peek_with_desc().unwrap().unwrap();
        assert_eq!(desc, [i as u64, len as u64, 9], "message {i}");
        assert!(
            data == &pattern(len, i as u8)[..],
            "message {i} ({len} bytes) corrupted"
        );
        recv.release();
    }
    sender.join().unwrap();
    assert_eq!((a.peers.lost(1), b.peers.lost(0)), (None, None));
}

/// Messages posted by reference ([`sendref`]) arrive with the referenced bytes, not
/// the slot's, striped like any payload, and in order with copied ones; the written
/// count says when each referenced buffer may be reused. A reference revoked before
/// the proxy reached it is never read: the stream ends instead, with nothing of it
/// delivered, and the sending side does not blame its peer.
#[test]
fn referenced_payloads_arrive_from_the_buffer_and_a_revoked_one_is_never_sent() {
    let layout = FifoLayout::for_buffer(4 << 20, 4).unwrap();
    let (mut send, a_out, b_in, mut recv) = fifo_pairs(layout);
    let (mut a_socks, mut b_socks) = socket_pairs(2);
    let (a_first, b_first) = (a_socks.remove(0), b_socks.remove(0));
    let refs = Arc::new(sendref::SendRefs::new(layout.nslots));
    let out = Outbound::Fifo(a_out, Arc::clone(&refs));
    let a = proxy_serving(0, 1, (a_first, a_socks), Some(out), None);
    let b = proxy_serving(1, 0, (b_first, b_socks), None, Some(Inbound::Fifo(b_in)));
    // Message 0 by reference (two pieces), 1 copied, 2 by reference.
    let bufs = [pattern(300_000, 1), pattern(10, 2), pattern(70_000, 3)];
    for (i, buf) in bufs.iter().enumerate() {
        let seq = send.committed();
        let slot = send.try_reserve().expect("a free slot");
        if i == 1 {
            slot[..buf.len()].copy_from_slice(buf);
        } else {
            slot[..buf.len()].fill(0xEE);
            refs.post(seq, buf.as_ptr() as usize, buf.len());
        }
        send.commit_with_desc(buf.len(), [i as u64, 0, 9]);
    }
    wait_until("the three messages written", || refs.written(2));
    for (i, buf) in bufs.iter().enumerate() {
        wait_until("the next message", || recv.pending() > 0);
        let (data, desc) = recv.try_peek_with_desc().unwrap().unwrap();
        assert_eq!(desc, [i as u64, 0, 9]);
        assert!(data == &buf[..], "message {i} is not its buffer's bytes");
        recv.release();
    }
    // Message 3: posted and revoked under the proxy's lock before it could be sent.
    let buf = pattern(50_000, 4);
    a.while_idle(|| {
        let seq = send.committed();
        send.try_reserve().expect("a free slot")[..buf.len()].fill(0xEE);
        refs.post(seq, buf.as_ptr() as usize, buf.len());
        send.commit(buf.len());
        refs.revoke(seq);
    });
    wait_until("the stream ends", || refs.broken());
    assert!(!refs.written(3));
    drop(buf);
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        recv.try_peek_checked().unwrap().is_none(),
        "a revoked message arrived"
    );
    assert_eq!(
        a.peers.lost(1),
        None,
        "the sender's own failure blamed on its peer"
    );
    drop(b);
}

/// A waiting executor that drives the proxy moves the data itself while its proxy
/// thread stays asleep (a message that waits 20 ms in the socket is still there at the
/// next `drive`, which delivers it), and after `release` the thread takes the sockets
/// over again. The lease is long here, so that a test thread the scheduler holds off
/// for a while does not let it lapse.
#[test]
fn a_driving_executor_moves_the_data_and_the_proxy_thread_takes_over_after_release() {
    let (proxy, mut feeds, mut rx) = proxy_with_striped_inbound_leased(1, Duration::from_secs(60));
    // The first drive takes the stream in and holds the thread off.
    proxy.drive();
    for i in 0..10u8 {
        // Small enough for the socket buffers while nobody reads.
        let payload = pattern(32_000, i);
        let h = DataHeader {
            len: payload.len(),
            desc: [u64::from(i), 1, 2],
        };
        feeds[0].write_all(&h.encode()).unwrap();
        feeds[0].write_all(&payload).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(rx.pending(), 0, "message {i} landed without a drive");
        let t0 = Instant::now();
        while rx.pending() == 0 {
            proxy.drive();
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "message {i} never came"
            );
        }
        let got = rx.try_peek_checked().unwrap().unwrap();
        assert!(got == &payload[..], "message {i} corrupted");
        rx.release();
    }
    proxy.release();
    let (payload, h) = message_of_200k(99, [7, 8, 9]);
    feeds[0].write_all(&h.encode()).unwrap();
    feeds[0].write_all(&payload).unwrap();
    wait_until("the proxy thread to deliver after release", || {
        rx.pending() > 0
    });
    assert!(rx.try_peek_checked().unwrap().unwrap() == &payload[..]);
    assert_eq!(proxy.peers.lost(1), None);
}

#[test]
fn a_corrupt_frame_drops_the_connection_and_loses_the_peer() {
    let (proxy, mut feed, mut rx) = proxy_with_inbound();
    feed.write_all(&[0xee; DATA_HEADER_BYTES]).unwrap();
    let why = lost_within(&proxy.peers, 1).expect("peer marked lost");
    assert!(why.contains("corrupt data frame"), "{why}");
    assert!(dropped(feed));
    assert!(
        rx.try_peek_checked().unwrap().is_none(),
        "junk was delivered"
    );
}

#[test]
fn an_oversized_frame_is_refused_before_any_byte_lands() {
    let (proxy, mut feed, mut rx) = proxy_with_inbound();
    let h = DataHeader {
        len: 1 << 20,
        desc: [1, 2, 3],
    };
    feed.write_all(&h.encode()).unwrap();
    let why = lost_within(&proxy.peers, 1).expect("peer marked lost");
    assert!(why.contains("1048576 bytes"), "{why}");
    assert!(rx.try_peek_checked().unwrap().is_none());
}

#[test]
fn a_truncated_message_loses_the_peer_and_delivers_nothing() {
    let (proxy, mut feed, mut rx) = proxy_with_inbound();
    let h = DataHeader {
        len: 100,
        desc: [1, 2, 3],
    };
    feed.write_all(&h.encode()).unwrap();
    feed.write_all(&[1u8; 50]).unwrap();
    drop(feed);
    let why = lost_within(&proxy.peers, 1).expect("peer marked lost");
    assert!(
        why.contains("middle of a 100-byte message (50 received)"),
        "{why}"
    );
    assert!(rx.try_peek_checked().unwrap().is_none());
}

#[test]
fn offers_round_trip_and_junk_is_an_error() {
    let a: SocketAddr = "10.1.2.3:4567".parse().unwrap();
    let s = *b"0123456789abcdef";
    let o = Offer {
        secret: s,
        sockets: 8,
        addr: a,
    };
    assert_eq!(decode_offer(&encode_offer(&o)).unwrap(), o);
    let v6: SocketAddr = "[fe80::1%2]:99".parse().unwrap();
    let o6 = Offer { addr: v6, ..o };
    assert_eq!(decode_offer(&encode_offer(&o6)).unwrap().addr, v6);
    assert!(decode_offer(&s).is_err());
    let mut junk = s.to_vec();
    junk.push(1);
    junk.extend_from_slice(b"not an address");
    assert!(decode_offer(&junk).is_err());
    // A socket count out of bounds is junk too.
    for bad in [0, MAX_SOCKETS + 1] {
        let mut b = encode_offer(&o);
        b[SECRET_BYTES] = bad as u8;
        assert!(decode_offer(&b).is_err(), "{bad} sockets accepted");
    }
}

#[test]
fn sockets_per_stream_is_nvidias_product_bounded_at_64() {
    assert_eq!(sockets_per_stream(1, 1), (1, None));
    assert_eq!(sockets_per_stream(2, 4), (8, None));
    assert_eq!(sockets_per_stream(16, 4), (64, None));
    let (k, warn) = sockets_per_stream(4, 32);
    assert_eq!(k, 64, "sockets per thread shrink to 64 / 4");
    assert!(warn.unwrap().contains("using 16 per thread"));
    assert_eq!(sockets_per_stream(16, 64).0, 64);
}

#[test]
fn a_socket_buffer_is_fixed_only_where_the_system_allows_that_much_of_both() {
    let m = Some(4 << 20);
    assert_eq!(fixed_buffer(4 << 20, m, m), Some(4 << 20));
    assert_eq!(fixed_buffer(1 << 20, m, Some(1 << 20)), Some(1 << 20));
    // Debian's stock maxima (212,992 bytes): a clamped buffer would stop autotuning.
    assert_eq!(fixed_buffer(4 << 20, Some(212_992), m), None);
    assert_eq!(fixed_buffer(4 << 20, m, Some(212_992)), None);
    // 0 asks for autotuning; unreadable maxima leave it on.
    assert_eq!(fixed_buffer(0, m, m), None);
    assert_eq!(fixed_buffer(4 << 20, None, m), None);
    assert_eq!(
        fixed_buffer(1 << 30, Some(u64::MAX), Some(u64::MAX)),
        Some(1 << 30)
    );
}

#[test]
fn the_default_buffer_is_fixed_only_where_the_ranks_fit_the_cores() {
    assert_eq!(default_buffer(1, 2), SOCKET_BUFFER);
    assert_eq!(default_buffer(2, 2), SOCKET_BUFFER);
    assert_eq!(default_buffer(3, 2), 0);
    assert_eq!(default_buffer(8, 64), SOCKET_BUFFER);
}

/// `tune` sets both buffers to what it is given (the kernel reports twice the value, its
/// bookkeeping included), and leaves them to autotuning without one.
#[test]
fn tune_fixes_both_buffers_or_leaves_them_to_the_kernel() {
    let read = |s: &TcpStream, opt| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `s` owns an open socket; `v` and `len` are writable locals of the sizes
        // passed.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "getsockopt: {}", std::io::Error::last_os_error());
        v
    };
    // Below Debian's stock maxima (212,992), so that any machine allows it.
    let bytes = 96 << 10;
    let (a, b) = socket_pairs(1);
    tune(&a[0], Some(bytes)).unwrap();
    tune(&b[0], None).unwrap();
    assert_eq!(read(&a[0], libc::SO_SNDBUF), 2 * bytes);
    assert_eq!(read(&a[0], libc::SO_RCVBUF), 2 * bytes);
    assert_ne!(read(&b[0], libc::SO_SNDBUF), 2 * bytes);
}

#[test]
fn ranks_that_stripe_differently_fail_naming_the_variables() {
    let o = |sockets| Offer {
        secret: [0; SECRET_BYTES],
        sockets,
        addr: "127.0.0.1:1".parse().unwrap(),
    };
    assert!(check_same_sockets(&[o(4), o(4), o(4)]).is_ok());
    let e = check_same_sockets(&[o(4), o(4), o(2)]).unwrap_err();
    assert!(
        matches!(&e, CclError::InvalidUsage(m) if m.contains("rank 2 uses 2 sockets")
            && m.contains("rank 0 uses 4") && m.contains("NCCL_NSOCKS_PERTHREAD")),
        "{e:?}"
    );
}

/// A proxy (rank 0) whose thread a drive keeps off the sockets for a minute, sending to
/// a raw socket, and the executor's end of its send FIFO (slots of `slot_bytes`).
fn leased_sender(slot_bytes: usize) -> (Proxy, crate::transport::shm::FifoSender, TcpStream) {
    let layout = FifoLayout::for_buffer(slot_bytes * 4, 4).unwrap();
    let (send, out, _, _) = fifo_pairs(layout);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let sock = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (peer, _) = listener.accept().unwrap();
    let proxy = proxy_serving_leased(
        0,
        1,
        (sock, vec![]),
        Some(Outbound::Fifo(out, Arc::new(sendref::SendRefs::new(4)))),
        None,
        Duration::from_secs(60),
    );
    // The first drive takes the stream in and holds the thread off.
    proxy.drive();
    (proxy, send, peer)
}

/// Reads one data frame from `peer`: its header and payload.
fn read_frame(peer: &mut TcpStream) -> (DataHeader, Vec<u8>) {
    let mut hdr = [0u8; DATA_HEADER_BYTES];
    peer.read_exact(&mut hdr).unwrap();
    let h = match frame::StreamFrame::decode(&hdr, usize::MAX, 0).unwrap() {
        frame::StreamFrame::Data(h) => h,
        other => panic!("expected a data frame, got {other:?}"),
    };
    let mut payload = vec![0u8; h.len];
    peer.read_exact(&mut payload).unwrap();
    (h, payload)
}

/// A job's end settles the sockets: what it committed last is written by that round, on
/// the executor's thread, while the lease keeps the proxy thread asleep (a commit alone
/// moves nothing before the lease ends).
#[test]
fn a_settled_job_sends_what_it_committed_last_while_the_proxy_thread_sleeps() {
    let (proxy, mut send, mut peer) = leased_sender(4096);
    peer.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let payload = pattern(3000, 5);
    send.try_reserve().expect("a free slot")[..3000].copy_from_slice(&payload);
    send.commit_with_desc(3000, [1, 2, 3]);
    let mut b = [0u8; 1];
    let e = peer
        .read(&mut b)
        .expect_err("a commit alone sent something");
    assert!(would_block_or_timeout(&e), "{e}");
    proxy.settle();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (h, got) = read_frame(&mut peer);
    assert_eq!((h.len, h.desc), (3000, [1, 2, 3]));
    assert!(got == payload, "payload corrupted");
    assert_eq!(proxy.peers.lost(1), None);
}

/// A settle that cannot write everything (the peer reads nothing yet, the socket's
/// buffers fill) hands the sockets back: the proxy thread writes the rest although the
/// lease has a minute to run.
#[test]
fn a_settle_that_leaves_bytes_unwritten_hands_the_sockets_back() {
    let len = 16 << 20;
    let (proxy, mut send, mut peer) = leased_sender(len);
    let payload = pattern(len, 9);
    send.try_reserve()
        .expect("a free slot")
        .copy_from_slice(&payload);
    send.commit_with_desc(len, [4, 5, 6]);
    proxy.settle();
    peer.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let (h, got) = read_frame(&mut peer);
    assert_eq!((h.len, h.desc), (len, [4, 5, 6]));
    assert!(got == payload, "payload corrupted");
}

fn would_block_or_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Shrinks a socket's kernel send and receive buffers (`SO_SNDBUF`, `SO_RCVBUF`), so that
/// a `sendmsg` of a frame writes only part of it.
fn shrink_buffers(s: &TcpStream, bytes: libc::c_int) {
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        super::set_int_option(s, libc::SOL_SOCKET, opt, bytes).expect("setsockopt");
    }
}

/// A stream that carries both directions (a 2-rank ring or Tree link): each side's
/// credits leave in the same `sendmsg` as its next message when one is ready, so frames
/// of both kinds interleave on the wire, and with small socket buffers writes end inside
/// payloads and headers (and can end inside a credit). Every message still arrives whole,
/// in order, with its descriptor, both ways, and every slot comes back.
#[test]
fn credits_riding_with_messages_both_ways_survive_partial_writes() {
    const N: usize = 300;
    let slot = 65_536;
    let lens = [0, 1, 31, 32, 33, 4095, 4096, 20_000, slot];
    let layout = FifoLayout::for_buffer(4 * slot, 4).unwrap();
    let (a_send, a_out, b_in, b_recv) = fifo_pairs(layout);
    let (b_send, b_out, a_in, a_recv) = fifo_pairs(layout);
    let (a_sock, b_sock) = {
        let (mut a, mut b) = socket_pairs(1);
        (a.remove(0), b.remove(0))
    };
    for s in [&a_sock, &b_sock] {
        shrink_buffers(s, 16 << 10);
    }
    let lease = Duration::from_secs(60);
    let refs = || Arc::new(sendref::SendRefs::new(4));
    let a = proxy_serving_leased(
        0,
        1,
        (a_sock, vec![]),
        Some(Outbound::Fifo(a_out, refs())),
        Some(Inbound::Fifo(a_in)),
        lease,
    );
    let b = proxy_serving_leased(
        1,
        0,
        (b_sock, vec![]),
        Some(Outbound::Fifo(b_out, refs())),
        Some(Inbound::Fifo(b_in)),
        lease,
    );
    // This thread drives both proxies (their threads sleep under the lease) and plays
    // both executors: each sends N messages and receives N.
    let mut sides = [(a_send, a_recv, 0usize, 0usize), (b_send, b_recv, 0, 0)];
    let message = |side: usize, i: usize| {
        let len = lens[i % lens.len()];
        (
            pattern(len, (i * 2 + side) as u8),
            [i as u64, len as u64, side as u64],
        )
    };
    let t0 = Instant::now();
    while sides.iter().any(|s| s.2 < N || s.3 < N) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "stalled: sent, received, sent and not credited, received and not consumed {:?}",
            sides
                .iter()
                .map(|s| (s.2, s.3, s.0.in_flight(), s.1.pending()))
                .collect::<Vec<_>>()
        );
        for (side, (send, recv, sent, got)) in sides.iter_mut().enumerate() {
            if *sent < N {
                if let Some(buf) = send.try_reserve() {
                    let (payload, desc) = message(side, *sent);
                    buf[..payload.len()].copy_from_slice(&payload);
                    send.commit_with_desc(payload.len(), desc);
                    *sent += 1;
                }
            }
            if recv.pending() > 0 {
                // What the other side sent.
                let (payload, desc) = message(1 - side, *got);
                let (data, d) = recv.try_peek_with_desc().unwrap().unwrap();
                assert_eq!(d, desc, "side {side}, message {}", *got);
                assert!(
                    data == &payload[..],
                    "side {side}, message {} corrupted",
                    *got
                );
                recv.release();
                *got += 1;
            }
        }
        a.drive();
        b.drive();
    }
    // Every slot comes back: the last credits leave alone (nothing more to send).
    wait_until("every slot back on both sides", || {
        a.drive();
        b.drive();
        sides.iter().all(|s| s.0.in_flight() == 0)
    });
    assert_eq!((a.peers.lost(1), b.peers.lost(0)), (None, None));
}
