//! Hostile-peer tests: the peer process writes garbage into its own outbox
//! (which we map read-only) or into the setup socket. Each must cost only
//! that connection: an error state, never a panic or a stray access.
use super::*;
use crate::mem::{Slab, WrKind};
use crate::wake;
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use std::os::fd::BorrowedFd;

const T: Duration = Duration::from_secs(30);

struct Side {
    qp: ShmQp,
    cq: ShmCq,
    recv: Slab,
    send: Slab,
    ro_mr: ShmMr,
    _mrs: Vec<ShmMr>,
    _pd: ShmPd,
}

fn side(ctx: &ShmContext) -> (ShmPreparedQp, ShmCq, ShmPd, Slab, Slab, ShmMr, Vec<ShmMr>) {
    side_with(
        ctx,
        QpCaps {
            rnr_retry: 7,
            ..QpCaps::default()
        },
    )
}

fn side_with(
    ctx: &ShmContext,
    caps: QpCaps,
) -> (ShmPreparedQp, ShmCq, ShmPd, Slab, Slab, ShmMr, Vec<ShmMr>) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let arena = Arena::with_backing(1 << 20, Backing::Small).unwrap();
    let recv_arena = Arena::with_backing(1 << 20, Backing::Small).unwrap();
    let ro_arena = Arena::with_backing(1 << 16, Backing::Small).unwrap();
    let mr = pd
        .register(&arena, 0, 1 << 20, Access::LOCAL_WRITE)
        .unwrap();
    let rmr = pd
        .register(&recv_arena, 0, 1 << 20, Access::LOCAL_WRITE)
        .unwrap();
    let ro_mr = pd
        .register(
            &ro_arena,
            0,
            1 << 16,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let send = Slab::new(arena, 0, 4096, 64, mr.lkey(), WrKind::Send).unwrap();
    let recv = Slab::new(recv_arena, 0, 4096, 64, rmr.lkey(), WrKind::Recv).unwrap();
    let pqp = pd.create_qp(&cq, &cq, caps).unwrap();
    (pqp, cq, pd, send, recv, ro_mr, vec![mr, rmr])
}

static N: AtomicUsize = AtomicUsize::new(0);

/// A connected pair; `b` has 4 receives posted, `a` none.
fn pair() -> (Side, Side) {
    pair_with(QpCaps {
        rnr_retry: 7,
        ..QpCaps::default()
    })
}

/// [`pair`] with `a` created with `caps_a`.
fn pair_with(caps_a: QpCaps) -> (Side, Side) {
    let url = format!(
        "shm:///tmp/rpcrdma-hostile-{}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let ctx = Shm::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    pair_on(&ctx, &listener, &url, caps_a)
}

/// A connected pair through `listener` (at `url`): `a` accepted there,
/// `b` connecting with 4 receives posted.
fn pair_on(ctx: &ShmContext, listener: &ShmListener, url: &str, caps_a: QpCaps) -> (Side, Side) {
    let url = url.to_string();
    let (pa, cqa, pda, sa, ra, roa, ma) = side_with(ctx, caps_a);
    let (mut pb, cqb, pdb, sb, rb, rob, mb) = side(ctx);
    for _ in 0..4 {
        let b = rb.alloc().unwrap();
        pb.post_recv(RecvWr {
            wr_id: b.wr_id(),
            sgl: SgeList::one(Sge::whole(b)),
        })
        .unwrap();
    }
    let u = url.clone();
    let h = std::thread::spawn(move || pb.connect(&u, b"", T).unwrap().0);
    let qa = listener.accept(T).unwrap().accept(pa, b"").unwrap();
    let qb = h.join().unwrap();
    let mk = |qp, cq, recv, send, ro_mr, _mrs, _pd| Side {
        qp,
        cq,
        recv,
        send,
        ro_mr,
        _mrs,
        _pd,
    };
    (
        mk(qa, cqa, ra, sa, roa, ma, pda),
        mk(qb, cqb, rb, sb, rob, mb, pdb),
    )
}

/// Lets the test write into `s`'s own outbox, as a malicious process could.
fn corrupt(s: &Side, f: impl FnOnce(&[AtomicU64], Layout, &Conn)) {
    let inner = lock(&s.qp.shared.inner);
    let conn = inner.conn.as_ref().unwrap();
    f(conn.my_words(), conn.layout, conn);
}

/// Polls `s` until its QP is in error; returns the completions seen.
fn until_error(s: &mut Side) -> Vec<Completion> {
    let deadline = Instant::now() + T;
    let mut out: Vec<Completion> = (0..32).map(|_| Completion::default()).collect();
    let mut seen = Vec::new();
    loop {
        let n = s.cq.poll(&mut out);
        seen.extend(out.iter_mut().take(n).map(std::mem::take));
        if s.qp.state() == QpState::Error && n == 0 {
            return seen;
        }
        assert!(Instant::now() < deadline, "never reached the error state");
        std::thread::yield_now();
    }
}

fn send(s: &mut Side, op: SendOp) {
    let mut b = s.send.alloc().unwrap();
    b.fill(&[1; 100]);
    s.qp.post_send(SendWr::new(b.wr_id(), op, SgeList::one(Sge::data(b))))
        .unwrap();
}

fn all_flushed(seen: &[Completion]) {
    assert!(seen.iter().all(|c| c.status != WcStatus::Success));
    assert!(seen.iter().any(|c| c.opcode == WcOpcode::Recv));
}

#[test]
fn garbage_descriptor_head() {
    let (a, mut b) = pair();
    corrupt(&a, |w, _, _| {
        w[W_DESC_HEAD].store(1 << 40, Ordering::Release)
    });
    let seen = until_error(&mut b);
    all_flushed(&seen);
    drop(seen);
    assert_eq!(b.recv.available(), b.recv.total());
}

#[test]
fn garbage_descriptor_kind_and_sequence() {
    for (kind, seq) in [
        (99u64, 0u64),
        (D_SEND, 77),
        (0, 0),
        (D_SEND | (u32::MAX as u64) << 32, 0),
    ] {
        let (a, mut b) = pair();
        corrupt(&a, |w, l, _| {
            w[l.desc_base()].store(kind, Ordering::Relaxed);
            w[l.desc_base() + 2].store(seq, Ordering::Relaxed);
            w[W_DESC_HEAD].store(1, Ordering::Release);
        });
        let seen = until_error(&mut b);
        assert!(!seen.is_empty());
        drop(seen);
        assert_eq!(b.recv.available(), b.recv.total(), "kind {kind:#x}");
    }
}

#[test]
fn garbage_posted_receive() {
    // (nsge, region/len word, offset)
    for (nsge, a0, off) in [
        (200u64, 0u64, 0u64),
        (1, (999 << 32) | 64, 0),
        (1, 4096, u64::MAX - 10),
        (1, 0xffff_ffff, 1 << 20),
    ] {
        let (mut a, mut b) = pair();
        // Give `a` one honest receive so region 0 exists, then forge the
        // next slot.
        let buf = a.recv.alloc().unwrap();
        a.qp.post_recv(RecvWr {
            wr_id: buf.wr_id(),
            sgl: SgeList::one(Sge::whole(buf)),
        })
        .unwrap();
        corrupt(&a, |w, l, c| {
            let base = l.recv_base() + RECV_WORDS; // slot 1
            w[base].store(nsge, Ordering::Relaxed);
            w[base + 2].store(a0, Ordering::Relaxed);
            w[base + 3].store(off, Ordering::Relaxed);
            w[W_RECV_HEAD].store(c.recv_head + 1, Ordering::Release);
        });
        send(&mut b, SendOp::Send); // consumes the honest receive
        send(&mut b, SendOp::Send); // hits the forged one
        let seen = until_error(&mut b);
        let sends: Vec<_> = seen.iter().filter(|c| c.opcode == WcOpcode::Send).collect();
        assert_eq!(sends[0].status, WcStatus::Success);
        assert_eq!(
            sends[1].status,
            WcStatus::RemInvReqErr,
            "nsge {nsge} a0 {a0:#x}"
        );
        drop(seen);
        assert_eq!(b.send.available(), b.send.total());
    }
}

#[test]
fn forged_key_entries() {
    // The owner flips its read-only key to claim REMOTE_WRITE: our mapping is
    // read-only, so the write is refused (no SIGSEGV).
    let (mut a, mut b) = pair();
    let key = a.qp.expose(&a.ro_mr).unwrap();
    corrupt(&a, |w, l, _| {
        let base = l.key_base() + (key.rkey & (l.key_cap - 1)) as usize * KEY_WORDS;
        let v = w[base + 1].load(Ordering::Relaxed);
        w[base + 1].store(v | Access::REMOTE_WRITE.bits() as u64, Ordering::Relaxed);
    });
    send(&mut b, SendOp::Write(key.at(0)));
    let seen = until_error(&mut b);
    assert_eq!(seen[0].status, WcStatus::RemAccessErr);
    drop(seen);

    // Entries naming unknown regions or absurd lengths.
    for (region, va, len) in [
        (5000u64, 0x1000u64, 64u64),
        (0, 0, u64::MAX),
        (1, u64::MAX - 8, 1 << 40),
    ] {
        let (a, mut b) = pair();
        let rkey = 0x1234_5600u32 | 3;
        corrupt(&a, |w, l, _| {
            let base = l.key_base() + 3 * KEY_WORDS;
            w[base + 1].store(7 | (region << 32), Ordering::Relaxed);
            w[base + 2].store(va, Ordering::Relaxed);
            w[base + 3].store(0, Ordering::Relaxed);
            w[base + 4].store(len, Ordering::Relaxed);
            w[base].store(rkey as u64, Ordering::Release);
        });
        send(
            &mut b,
            SendOp::Write(RemoteAddr {
                addr: va.wrapping_add(1 << 30),
                rkey,
            }),
        );
        let seen = until_error(&mut b);
        assert_eq!(seen[0].status, WcStatus::RemAccessErr, "region {region}");
    }
}

#[test]
fn garbage_on_the_setup_socket() {
    let url = format!(
        "shm:///tmp/rpcrdma-hostile-sock-{}.sock",
        std::process::id()
    );
    let ctx = Shm::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let junk: [&[u8]; 4] = [
        b"",
        b"abc",
        &[0xff; 300],
        &[
            1, 0, 0, 0, 1, 0, 0, 0, 16, 0, 0, 0, 16, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
        ],
    ];
    for j in junk {
        let s = silent(&listener);
        let iov = [std::io::IoSlice::new(j)];
        let _ = nix::sys::socket::sendmsg::<()>(
            s.as_raw_fd(),
            &iov,
            &[],
            nix::sys::socket::MsgFlags::empty(),
            None,
        );
        drop(s);
        assert!(listener.accept(T).is_err(), "junk {j:?} accepted");
    }
    // A HELLO whose outbox is an unsealed memfd is refused too.
    let s = silent(&listener);
    let fd =
        nix::sys::memfd::memfd_create(c"unsealed", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap();
    nix::unistd::ftruncate(&fd, 1 << 20).unwrap();
    Msg::new(M_HELLO, [VERSION, 16, 16, 256], b"")
        .unwrap()
        .send(s.as_fd(), Some(fd.as_fd()))
        .unwrap();
    assert!(matches!(listener.accept(T), Err(VerbsError::Protocol(_))));
}

/// A live listener's socket is never replaced; a stale one (its listener
/// gone, the file left behind) is, and a non-socket is refused.
#[test]
fn a_live_socket_is_never_replaced() {
    let path = format!("/tmp/rpcrdma-live-sock-{}.sock", std::process::id());
    let url = format!("shm://{path}");
    let ctx = Shm::open(&url).unwrap();
    let first = ctx.listen(&url).unwrap();
    let me = std::process::id() as i32;
    assert_eq!(
        probe_socket(Path::new(&path)).unwrap(),
        SocketProbe::Live { pid: Some(me) }
    );
    let err = ctx.listen(&url).unwrap_err().to_string();
    assert!(err.contains(&format!("in use by process {me}")), "{err}");
    // The first still accepts: its file is where it was.
    assert!(Path::new(&path).exists());
    let (pqp, _cq, _pd, _s, _r, _ro, _m) = side(&ctx);
    let u = url.clone();
    let h = std::thread::spawn(move || pqp.connect(&u, b"", T).map(|_| ()));
    // The two probes (ours and the refused listen's) come first: peers
    // that left without a HELLO.
    let mut hang_ups = 0;
    let inc = loop {
        match first.accept(T) {
            Ok(inc) => break inc,
            Err(VerbsError::Protocol("hang-up")) if hang_ups < 2 => hang_ups += 1,
            Err(e) => panic!("accept: {e}"),
        }
    };
    assert_eq!(hang_ups, 2);
    drop(inc);
    let _ = h.join().unwrap();
    // Left behind by a process that died (a bound, unlistened socket file
    // stands for it): stale, replaced.
    drop(first);
    let stale = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    drop(stale);
    assert_eq!(probe_socket(Path::new(&path)).unwrap(), SocketProbe::Stale);
    let second = ctx.listen(&url).unwrap();
    drop(second);
    // Not a socket: refused, left alone.
    std::fs::write(&path, b"x").unwrap();
    assert_eq!(
        probe_socket(Path::new(&path)).unwrap(),
        SocketProbe::NotASocket
    );
    assert!(ctx.listen(&url).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"x");
    std::fs::remove_file(&path).unwrap();
}

/// A raw connection to the setup socket that says nothing (until the
/// test writes to it).
fn silent(listener: &ShmListener) -> OwnedFd {
    let s = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    connect(s.as_raw_fd(), &UnixAddr::new(listener.path()).unwrap()).unwrap();
    s
}

/// Silent connections wait together, each on its own deadline: a good
/// client that comes after fifty of them is accepted first, and a silent
/// one beyond the bound gives its place to a newcomer.
#[test]
fn silent_setup_connections_never_delay_a_good_client() {
    let url = format!("shm:///tmp/rpcrdma-silent-{}.sock", std::process::id());
    let ctx = Shm::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let quiet: Vec<OwnedFd> = (0..50).map(|_| silent(&listener)).collect();
    let (pqp, _cq, _pd, _s, _r, _ro, _m) = side(&ctx);
    let u = url.clone();
    let h = std::thread::spawn(move || pqp.connect(&u, b"good", T).map(|_| ()));
    // Its HELLO is the first thing to complete: no error comes before it
    // (the silent ones have SETUP_TIMEOUT, far longer than this takes).
    let inc = listener.accept(T).expect("the good client first");
    assert_eq!(inc.private_data(), b"good");
    drop(inc);
    let _ = h.join().unwrap();
    // Past the bound, the longest-waiting silent one goes.
    let more: Vec<OwnedFd> = (0..MAX_PENDING_SETUPS + 1 - quiet.len())
        .map(|_| silent(&listener))
        .collect();
    assert!(matches!(listener.accept(T), Err(VerbsError::SetupTimeout)));
    assert_eq!(lock(&listener.pending).len(), MAX_PENDING_SETUPS);
    // The first silent connection was the one closed.
    let mut byte = [0u8; 1];
    assert_eq!(
        nix::sys::socket::recv(
            quiet[0].as_raw_fd(),
            &mut byte,
            nix::sys::socket::MsgFlags::MSG_DONTWAIT
        ),
        Ok(0),
        "closed by the listener"
    );
    drop(more);
}

/// A peer whose uid is not allowed is refused on its credentials, before
/// it sends anything.
#[test]
fn a_foreign_uid_is_refused_before_it_says_anything() {
    let url = format!("shm:///tmp/rpcrdma-foreign-{}.sock", std::process::id());
    let ctx = Shm::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let me = nix::unistd::getuid().as_raw();
    listener.allow_uids(&[me.wrapping_add(4242)]);
    let s = silent(&listener);
    match listener.accept(T) {
        Err(VerbsError::PeerNotAllowed { uid }) => assert_eq!(uid, me),
        other => panic!("expected PeerNotAllowed, got {:?}", other.map(|_| ())),
    }
    // Its REJECT is waiting for it.
    let reply = Msg::recv_timeout(s.as_fd(), T).unwrap();
    assert_eq!(reply.kind, M_REJECT);
}

#[test]
fn uid_allow_list() {
    let url = format!("shm:///tmp/rpcrdma-hostile-uid-{}.sock", std::process::id());
    let ctx = Shm::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    listener.allow_uids(&[nix::unistd::getuid().as_raw().wrapping_add(4242)]);
    let (pqp, _cq, _pd, _s, _r, _ro, _m) = side(&ctx);
    let u = url.clone();
    let h = std::thread::spawn(move || pqp.connect(&u, b"let me in", T).map(|_| ()));
    assert!(matches!(
        listener.accept(T),
        Err(VerbsError::PeerNotAllowed { .. })
    ));
    assert!(matches!(
        h.join().unwrap(),
        Err(VerbsError::Rejected { .. })
    ));
}

#[test]
fn rkey_valid_only_on_its_connection() {
    let url = format!("shm:///tmp/rpcrdma-hostile-two-{}.sock", std::process::id());
    let ctx = Shm::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    // Side A: one PD, two accepted QPs. Side B: one PD, two connecting QPs.
    let (pa1, cqa, pda, _sa, _ra, ro_a, _ma) = side(&ctx);
    let pa2 = pda.create_qp(&cqa, &cqa, QpCaps::default()).unwrap();
    let (pb1, cqb, pdb, sb, _rb, _rob, _mb) = side(&ctx);
    let pb2 = pdb.create_qp(&cqb, &cqb, QpCaps::default()).unwrap();
    let u = url.clone();
    let h = std::thread::spawn(move || {
        let q1 = pb1.connect(&u, b"1", T).unwrap().0;
        let q2 = pb2.connect(&u, b"2", T).unwrap().0;
        (q1, q2)
    });
    let mut qa1 = listener.accept(T).unwrap().accept(pa1, b"").unwrap();
    let _qa2 = listener.accept(T).unwrap().accept(pa2, b"").unwrap();
    let (mut qb1, mut qb2) = h.join().unwrap();
    let key = qa1.expose(&ro_a).unwrap();
    let read = |qp: &mut ShmQp, cq: &ShmCq| {
        let b = sb.alloc().unwrap();
        qp.post_send(SendWr::new(
            b.wr_id(),
            SendOp::Read(key.at(0)),
            SgeList::one(Sge {
                buf: b,
                offset: 0,
                len: 64,
            }),
        ))
        .unwrap();
        let mut out: Vec<Completion> = (0..4).map(|_| Completion::default()).collect();
        let deadline = Instant::now() + T;
        loop {
            if cq.poll(&mut out) > 0 {
                return std::mem::take(&mut out[0]).status;
            }
            assert!(Instant::now() < deadline);
        }
    };
    assert_eq!(read(&mut qb1, &cqb), WcStatus::Success);
    assert_eq!(read(&mut qb2, &cqb), WcStatus::RemAccessErr);
}

/// Permissions ("r--s", "rw-s", ...) of the mapping starting at `addr`.
fn perms(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .find_map(|l| {
            let (range, rest) = l.split_once(' ')?;
            let start = usize::from_str_radix(range.split_once('-')?.0, 16).ok()?;
            (start == addr).then(|| rest.split(' ').next().unwrap_or("").to_owned())
        })
        .expect("mapping listed")
}

#[test]
fn read_only_exposure_is_mapped_read_only() {
    let (mut a, mut b) = pair();
    let key = a.qp.expose(&a.ro_mr).unwrap();
    // b reads (maps the region on first use) and sends (maps a's receive
    // arena, which is the Send target).
    let buf = b.send.alloc().unwrap();
    b.qp.post_send(SendWr::new(
        buf.wr_id(),
        SendOp::Read(key.at(0)),
        SgeList::one(Sge {
            buf,
            offset: 0,
            len: 16,
        }),
    ))
    .unwrap();
    let rb = a.recv.alloc().unwrap();
    a.qp.post_recv(RecvWr {
        wr_id: rb.wr_id(),
        sgl: SgeList::one(Sge::whole(rb)),
    })
    .unwrap();
    send(&mut b, SendOp::Send);
    let mut out: Vec<Completion> = (0..8).map(|_| Completion::default()).collect();
    let mut n = 0;
    let deadline = Instant::now() + T;
    while n < 2 {
        n += b.cq.poll(&mut out[n..]);
        assert!(Instant::now() < deadline);
    }
    assert!(out[..2].iter().all(Completion::is_ok));
    let inner = lock(&b.qp.shared.inner);
    let conn = inner.conn.as_ref().unwrap();
    let mut seen = Vec::new();
    for m in conn.in_regions.iter().flatten() {
        let p = perms(m.addr());
        assert_eq!(p, if m.writable { "rw-s" } else { "r--s" });
        seen.push(p);
    }
    seen.sort();
    assert_eq!(
        seen,
        ["r--s", "rw-s"],
        "the MMU, not only our checks, guards read-only memory"
    );
    // The peer's outbox is mapped read-only as well.
    assert_eq!(perms(conn.peer.addr()), "r--s");
}

/// Passes `fd` over a socket pair, as the setup socket does: what comes
/// out is exactly what a peer receives.
fn as_received(fd: BorrowedFd<'_>) -> OwnedFd {
    let (x, y) = nix::sys::socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    Msg::new(M_REGION, [0; 4], b"")
        .unwrap()
        .send(x.as_fd(), Some(fd))
        .unwrap();
    Msg::recv(y.as_fd()).unwrap().unwrap().fd.unwrap()
}

/// Behaves like a hostile peer holding `fd` (what we sent for read-only
/// memory): every way to write must fail, reading must work and see
/// `marker` at offset 0.
fn hostile_peer_cannot_write(fd: BorrowedFd<'_>, what: &str, marker: u64) {
    use nix::sys::mman::{mmap, mprotect, munmap, MapFlags, ProtFlags};
    use std::num::NonZeroUsize;

    let len = usize::try_from(nix::sys::stat::fstat(fd).unwrap().st_size).unwrap();
    let nz = NonZeroUsize::new(len).unwrap();
    let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    let map_rw = |fd: BorrowedFd<'_>| {
        // SAFETY: a fresh mapping at a kernel-chosen address; expected to
        // fail, and unmapped at once otherwise.
        let r = unsafe { mmap(None, nz, rw, MapFlags::MAP_SHARED, fd, 0) };
        if let Ok(p) = r {
            // SAFETY: the mapping just made, of `len` bytes.
            unsafe { munmap(p, len) }.unwrap();
        }
        r.err()
    };
    // (a) A shared writable mapping of the descriptor as received.
    assert!(map_rw(fd).is_some(), "{what}: mmap(PROT_WRITE) allowed");
    // (b) Reopen through /proc/self/fd read-write (a memfd is mode 0777, so
    // this open itself may succeed), then map that writable.
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let rdwr = nix::fcntl::open(
        path.as_str(),
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    );
    let fds: Vec<BorrowedFd<'_>> = std::iter::once(fd)
        .chain(rdwr.as_ref().ok().map(|f| f.as_fd()))
        .collect();
    if let Ok(f) = &rdwr {
        assert!(
            map_rw(f.as_fd()).is_some(),
            "{what}: reopened O_RDWR mmap(PROT_WRITE) allowed"
        );
    }
    for f in &fds {
        // (c) write(2) / pwrite(2), hole punching, resizing.
        assert!(
            nix::sys::uio::pwrite(f, &[0xff; 8], 0).is_err(),
            "{what}: pwrite"
        );
        assert!(nix::unistd::write(f, &[0xff; 8]).is_err(), "{what}: write");
        assert!(
            nix::fcntl::fallocate(
                f,
                nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                    | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                0,
                len as libc::off_t,
            )
            .is_err(),
            "{what}: punch hole"
        );
        assert!(nix::unistd::ftruncate(f, 0).is_err(), "{what}: ftruncate");
        // Nor can the peer add seals that would hurt us.
        assert!(
            fcntl(f, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_WRITE)).is_err(),
            "{what}: add seal"
        );
    }
    // Reading works, and a read-only mapping cannot be made writable.
    // SAFETY: a fresh read-only mapping, unmapped below.
    let p = unsafe { mmap(None, nz, ProtFlags::PROT_READ, MapFlags::MAP_SHARED, fd, 0) }
        .expect("read-only mapping");
    // SAFETY: `p` maps at least 8 bytes (page-aligned, readable).
    let first = unsafe { (p.as_ptr() as *const AtomicU64).as_ref().unwrap() };
    assert_eq!(first.load(Ordering::Acquire), marker, "{what}: read");
    // SAFETY: the mapping made above; expected to fail.
    assert!(
        unsafe { mprotect(p, len, rw) }.is_err(),
        "{what}: mprotect(PROT_WRITE) allowed"
    );
    // SAFETY: the mapping made above, of `len` bytes.
    unsafe { munmap(p, len) }.unwrap();
    let mut b = [0u8; 8];
    assert_eq!(nix::sys::uio::pread(fd, &mut b, 0).unwrap(), 8);
    assert_eq!(u64::from_ne_bytes(b), marker, "{what}: pread");
}

/// What we hand a peer for read-only memory (a REMOTE_READ exposure, our
/// outbox) must refuse every way of writing, through any descriptor; our
/// own mapping keeps working. Small and (if reserved) Huge backings.
#[test]
fn hostile_peer_cannot_write_read_only_memory() {
    let (mut a, _b) = pair();
    // Our outbox, exactly as sent at setup.
    {
        let inner = lock(&a.qp.shared.inner);
        let conn = inner.conn.as_ref().unwrap();
        assert_eq!(conn.mine.peer_access(), PeerAccess::ReadOnly);
        hostile_peer_cannot_write(as_received(conn.mine.fd()).as_fd(), "outbox", MAGIC);
        // Our own mapping still writes.
        conn.set_flag(0);
    }
    // A REMOTE_READ exposure of a Small arena, through the real path.
    a.qp.expose(&a.ro_mr).unwrap();
    let ro_arena = a.ro_mr.info.arena.clone();
    assert_eq!(ro_arena.peer_access(), PeerAccess::ReadOnly);
    let word = |ar: &Arena| {
        // SAFETY: the arena's first 8 bytes, page-aligned, mapped read-write
        // for as long as `ar` lives.
        unsafe { (ar.as_ptr() as *const AtomicU64).as_ref().unwrap() }
    };
    word(&ro_arena).store(0x5eed, Ordering::Release);
    hostile_peer_cannot_write(as_received(ro_arena.fd()).as_fd(), "small region", 0x5eed);

    // Huge: the same sealing call `expose` makes (if hugepages are free).
    match Arena::with_backing(2 << 20, Backing::Huge) {
        Ok(huge) => {
            word(&huge).store(7, Ordering::Release);
            huge.share_read_only().unwrap();
            word(&huge).store(0x4a6e, Ordering::Release); // still ours to write
            hostile_peer_cannot_write(as_received(huge.fd()).as_fd(), "huge region", 0x4a6e);
        }
        Err(e) => eprintln!("no hugepages reserved ({e}): Huge case skipped"),
    }
}

/// An arena's role toward peers is fixed by its first exposure, with a
/// clear error for the other one.
#[test]
fn read_only_and_writable_sharing_do_not_mix() {
    let (mut a, _b) = pair();
    // a's receive arena is shared writable (the Send target) ...
    let buf = a.recv.alloc().unwrap();
    a.qp.post_recv(RecvWr {
        wr_id: buf.wr_id(),
        sgl: SgeList::one(Sge::whole(buf)),
    })
    .unwrap();
    assert_eq!(a.recv.arena().peer_access(), PeerAccess::Writable);
    // ... so a REMOTE_READ-only exposure of it is refused ...
    let mr = a
        ._pd
        .register(
            a.recv.arena(),
            0,
            4096,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    assert!(matches!(
        a.qp.expose(&mr),
        Err(VerbsError::Mem(crate::mem::MemError::Sharing(_)))
    ));
    // ... and a read-only arena can be neither a receive buffer nor a
    // REMOTE_WRITE target.
    a.qp.expose(&a.ro_mr).unwrap();
    let ro = a.ro_mr.info.arena.clone();
    let slab = Slab::new(ro.clone(), 0, 4096, 4, a.ro_mr.lkey(), WrKind::Recv).unwrap();
    let b = slab.alloc().unwrap();
    let refused =
        a.qp.post_recv(RecvWr {
            wr_id: b.wr_id(),
            sgl: SgeList::one(Sge::whole(b)),
        })
        .unwrap_err();
    assert_eq!(refused.error, PostError::Invalid);
    drop(refused);
    let wmr = a
        ._pd
        .register(&ro, 0, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    assert!(matches!(
        a.qp.expose(&wmr),
        Err(VerbsError::Mem(crate::mem::MemError::Sharing(_)))
    ));
    assert_eq!(a.qp.state(), QpState::Rts, "refusals do not break the QP");
}

/// Sizes of our own rings are never read back from shared memory: garbage
/// in our outbox header (a peer able to write it, or a stray write) cannot
/// make posting panic (it used to: `% rq_cap` with rq_cap = 0).
#[test]
fn corrupt_own_layout_words_do_not_panic() {
    for v in [0u64, 1 << 40, u64::MAX, 3] {
        let (mut a, mut b) = pair();
        corrupt(&a, |w, _, _| {
            for word in &w[1..4] {
                word.store(v, Ordering::Relaxed);
            }
        });
        for _ in 0..3 {
            let buf = a.recv.alloc().unwrap();
            a.qp.post_recv(RecvWr {
                wr_id: buf.wr_id(),
                sgl: SgeList::one(Sge::whole(buf)),
            })
            .unwrap();
        }
        let key = a.qp.expose(&a.ro_mr).unwrap();
        a.qp.post_send(SendWr::new(
            WrId::default(),
            SendOp::LocalInv(key.rkey),
            SgeList::new(),
        ))
        .unwrap();
        send(&mut a, SendOp::Send); // b has 4 receives posted
        send(&mut b, SendOp::Send);
        let mut out: Vec<Completion> = (0..8).map(|_| Completion::default()).collect();
        let deadline = Instant::now() + T;
        let (mut na, mut nb) = (0, 0);
        while na < 3 || nb < 2 {
            na += a.cq.poll(&mut out[..]);
            nb += b.cq.poll(&mut out[..]);
            assert!(Instant::now() < deadline, "value {v:#x}: {na} {nb}");
        }
        assert_eq!(a.qp.state(), QpState::Rts, "value {v:#x}");
    }
}

#[test]
fn window_keys_keep_their_slot_and_are_never_zero() {
    let (mut a, mut b) = pair();
    let k = a.qp.expose(&a.ro_mr).unwrap();
    let mut windows = Vec::new();
    while let Ok(w) = a.qp.alloc_window() {
        crate::verbs::soft_mr::check_window_keys(&w);
        assert_ne!(
            w.index() as usize,
            KeySlots::slot(k.rkey),
            "the exposure's slot"
        );
        windows.push(w);
    }
    assert_eq!(
        windows.len(),
        MAX_KEYS as usize - 1,
        "one slot is the exposure's"
    );
    assert!(matches!(a.qp.alloc_window(), Err(VerbsError::Limit(_))));
    // Windows live on the other connection's table separately.
    crate::verbs::soft_mr::check_window_keys(&b.qp.alloc_window().unwrap());
    // A bind naming a window this QP never allocated is malformed.
    let mut bad = windows[0].bind(
        windows[0].rkey(1),
        a.ro_mr.lkey(),
        0,
        1,
        Access::REMOTE_READ,
    );
    bad.window = 100_000;
    let e =
        a.qp.post_send(SendWr::new(
            WrId::default(),
            SendOp::Bind(bad),
            SgeList::new(),
        ))
        .unwrap_err();
    assert_eq!(e.error, PostError::Invalid);
}

/// Without randomness an exposure fails with the OS error: a key derived
/// from something guessable (the clock) would let a peer forge access.
#[test]
fn exposing_without_randomness_fails_instead_of_guessable_keys() {
    let (mut a, _b) = pair();
    crate::verbs::random::FAIL_RANDOM.with(|f| f.set(true));
    let exposed = a.qp.expose(&a.ro_mr);
    crate::verbs::random::FAIL_RANDOM.with(|f| f.set(false));
    assert!(
        matches!(
            exposed,
            Err(VerbsError::Os {
                what: "getrandom",
                ..
            })
        ),
        "{exposed:?}"
    );
    // With randomness back, the same exposure works.
    assert!(a.qp.expose(&a.ro_mr).is_ok());
}

/// A peer that stops taking our Sends (its descriptor ring stays full
/// though it has receives posted) fails the waiting Send with
/// `RetryExcErr` after `PEER_STALL_TIMEOUT`, and the queue pair enters
/// the error state: the connection ends instead of pinning its sender.
#[test]
fn a_peer_that_stops_taking_sends_fails_them_with_retry_exceeded() {
    // A descriptor ring of 16 toward b, which has 36 receives: the ring
    // fills before b runs out of receives (that would be RNR instead).
    let (mut a, mut b) = pair_with(QpCaps {
        max_send_wr: 16,
        rnr_retry: 7,
        ..QpCaps::default()
    });
    for _ in 0..32 {
        let buf = b.recv.alloc().unwrap();
        b.qp.post_recv(RecvWr {
            wr_id: buf.wr_id(),
            sgl: SgeList::one(Sge::whole(buf)),
        })
        .unwrap();
    }
    let mut wcs: Vec<Completion> = (0..16).map(|_| Completion::default()).collect();
    let deadline = Instant::now() + T;
    // Sixteen go out and complete; b never looks at them.
    let mut done = 0;
    for _ in 0..16 {
        send(&mut a, SendOp::Send);
    }
    while done < 16 {
        assert!(
            Instant::now() < deadline,
            "broken: {done} of 16 sends completed"
        );
        let n = a.cq.poll(&mut wcs);
        assert!(wcs[..n].iter().all(|c| c.status == WcStatus::Success));
        done += n;
    }
    // The seventeenth finds the ring full, and stays so.
    send(&mut a, SendOp::Send);
    let failed = loop {
        assert!(
            Instant::now() < deadline,
            "broken: the stalled Send never failed"
        );
        let n = a.cq.poll(&mut wcs);
        if let Some(c) = wcs[..n].iter().find(|c| c.status != WcStatus::Success) {
            break c.status;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(failed, WcStatus::RetryExcErr);
    drop(b);
}

/// A sparse memfd costs a peer nothing: the bytes of peer memory one
/// connection maps are bounded (a region past the bound errors that
/// connection), and so are those of the whole process.
#[test]
fn peer_regions_are_bounded_per_connection_and_per_process() {
    use std::sync::atomic::AtomicU64;
    let (mut a, b) = pair();
    // As a hostile b: two size-sealed 1 TiB sparse regions.
    let sparse = || {
        let fd = nix::sys::memfd::memfd_create(
            c"sparse",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC | nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING,
        )
        .unwrap();
        nix::unistd::ftruncate(&fd, MAX_REGION_LEN as libc::off_t).unwrap();
        fcntl(&fd, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK)).unwrap();
        fd
    };
    {
        let inner = lock(&b.qp.shared.inner);
        let sock = &inner.conn.as_ref().unwrap().sock;
        for id in 0..2u32 {
            let fd = sparse();
            Msg::new(M_REGION, [100 + id, 1, 0, 0], b"")
                .unwrap()
                .send(sock.as_fd(), Some(fd.as_fd()))
                .unwrap();
        }
    }
    // a reads them at its next progress: the first fits (1 TiB), the
    // second is past the bound, and a's connection errors.
    send(&mut a, SendOp::Send);
    let mut out: Vec<Completion> = (0..8).map(|_| Completion::default()).collect();
    let deadline = Instant::now() + T;
    let status = loop {
        assert!(Instant::now() < deadline, "broken: no error completion");
        let n = a.cq.poll(&mut out);
        if let Some(c) = out[..n].iter().find(|c| c.status != WcStatus::Success) {
            break c.status;
        }
    };
    assert_eq!(status, WcStatus::RemInvReqErr);
    // The process-wide budget: reservations past it are refused whole.
    let used = AtomicU64::new(0);
    assert!(reserve(&used, 30 << 40, PEER_MAPPED_BUDGET));
    assert!(!reserve(&used, 3 << 40, PEER_MAPPED_BUDGET));
    assert!(reserve(&used, 2 << 40, PEER_MAPPED_BUDGET));
    assert!(!reserve(&used, 1, PEER_MAPPED_BUDGET));
    assert!(!reserve(&used, u64::MAX, PEER_MAPPED_BUDGET));
}

/// Two connections on one CQ, the first with eight messages waiting and
/// the second with one: polled one completion at a time, the second's
/// comes within the first polls, not after all of the first's. The hot
/// list is served round robin from where a full poll stopped, so busy
/// connections early in it cannot starve a later one (a worker's CQ with
/// many busy connections fills its burst every poll).
#[test]
fn a_full_poll_resumes_where_it_stopped_so_no_queue_pair_starves() {
    let url = format!(
        "shm:///tmp/rpcrdma-fair-{}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let ctx = Shm::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    // The accepting side: two queue pairs on one CQ.
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let recv_arena = Arena::with_backing(1 << 20, Backing::Small).unwrap();
    let rmr = pd
        .register(&recv_arena, 0, 1 << 20, Access::LOCAL_WRITE)
        .unwrap();
    let recv = Slab::new(recv_arena, 0, 4096, 64, rmr.lkey(), WrKind::Recv).unwrap();
    let mut accepted = Vec::new();
    let mut peers = Vec::new();
    for posted in [8, 1] {
        let mut pqp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
        for _ in 0..posted {
            let b = recv.alloc().unwrap();
            pqp.post_recv(RecvWr {
                wr_id: b.wr_id(),
                sgl: SgeList::one(Sge::whole(b)),
            })
            .unwrap();
        }
        let (peer, peer_cq, peer_pd, peer_send, _, _, peer_mrs) = side(&ctx);
        let u = url.clone();
        let h = std::thread::spawn(move || peer.connect(&u, b"", T).unwrap().0);
        accepted.push(listener.accept(T).unwrap().accept(pqp, b"").unwrap());
        let qp = h.join().unwrap();
        peers.push((qp, peer_cq, peer_pd, peer_send, peer_mrs));
    }
    // The first peer sends eight, then the second one.
    for (k, n) in [(0usize, 8), (1, 1)] {
        let (qp, peer_cq, _, send_slab, _) = &mut peers[k];
        for _ in 0..n {
            let mut b = send_slab.alloc().unwrap();
            b.fill(&[k as u8; 64]);
            qp.post_send(SendWr::new(
                b.wr_id(),
                SendOp::Send,
                SgeList::one(Sge::data(b)),
            ))
            .unwrap();
        }
        let mut wcs: Vec<Completion> = (0..8).map(|_| Completion::default()).collect();
        let mut done = 0;
        let deadline = Instant::now() + T;
        while done < n {
            assert!(
                Instant::now() < deadline,
                "broken: the peer's Sends never completed"
            );
            done += peer_cq.poll(&mut wcs);
        }
    }
    // One completion per poll: which queue pair each came from.
    let second = accepted[1].qp_num();
    let mut order = Vec::new();
    let mut one = [Completion::default()];
    let deadline = Instant::now() + T;
    while order.len() < 9 {
        assert!(Instant::now() < deadline, "broken: {order:?}");
        if cq.poll(&mut one) == 1 {
            assert_eq!(one[0].status, WcStatus::Success);
            order.push(one[0].qp_num == second);
        }
    }
    let at = order.iter().position(|&s| s).expect("the second's message");
    assert!(
        at <= 2,
        "the second connection waited {at} polls: {order:?}"
    );
}

/// Sends one message from `from` to `to` and checks both completions.
fn send_and_receive(from: &mut Side, to: &mut Side) {
    send(from, SendOp::Send);
    let mut out: Vec<Completion> = (0..8).map(|_| Completion::default()).collect();
    let (mut sent, mut received) = (false, false);
    let deadline = Instant::now() + T;
    while !(sent && received) {
        let n = from.cq.poll(&mut out);
        for c in &out[..n] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            sent |= c.opcode == WcOpcode::Send;
        }
        let n = to.cq.poll(&mut out);
        for c in &out[..n] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            received |= c.opcode == WcOpcode::Recv;
        }
        assert!(Instant::now() < deadline, "send never completed");
        std::thread::yield_now();
    }
}

#[test]
fn a_guarded_fault_in_peer_writable_memory_ends_only_that_connection() {
    let url = format!(
        "shm:///tmp/rpcrdma-guard-{}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let ctx = Shm::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    let caps = QpCaps {
        rnr_retry: 7,
        ..QpCaps::default()
    };
    let (mut a, mut b) = pair_on(&ctx, &listener, &url, caps);
    let (mut c, mut d) = pair_on(&ctx, &listener, &url, caps);
    // `a` copies into `b`'s receive buffers through its writable mapping
    // of `b`'s memfd: memory `b` can punch holes in.
    send_and_receive(&mut a, &mut b);
    send_and_receive(&mut c, &mut d);
    let addr = {
        let inner = lock(&a.qp.shared.inner);
        let conn = inner.conn.as_ref().unwrap();
        let map = conn
            .in_regions
            .iter()
            .flatten()
            .find(|m| m.writable)
            .unwrap();
        assert!(
            map.guard_probe().is_some(),
            "a peer-writable mapping is guarded"
        );
        map.addr() + 100
    };
    // What the SIGBUS handler does for a fault there (a punched hugepage
    // with the pool exhausted, which a test cannot cause without taking
    // every free hugepage of the host): the page replaced and counted.
    assert!(guard::repair(addr));
    let seen = until_error(&mut a);
    assert!(seen.iter().all(|c| c.status != WcStatus::Success));
    assert_eq!(listener.peer_memory_faults(), 1, "counted by its listener");
    // The peer sees its connection end too; the other pair goes on.
    until_error(&mut b);
    // (`d` posted 4 receives; one was used above.)
    for _ in 0..3 {
        send_and_receive(&mut c, &mut d);
    }
    assert_eq!(listener.peer_memory_faults(), 1);
}

#[test]
fn a_uid_gets_its_share_of_connections_and_a_close_makes_room() {
    let url = format!(
        "shm:///tmp/rpcrdma-uid-limit-{}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let ctx = Shm::open(&url).unwrap();
    let listener = ctx.listen(&url).unwrap();
    listener.limit_per_uid(2);
    let me = nix::unistd::getuid().as_raw();
    let caps = QpCaps {
        rnr_retry: 7,
        ..QpCaps::default()
    };
    let (mut a1, b1) = pair_on(&ctx, &listener, &url, caps);
    let (_a2, _b2) = pair_on(&ctx, &listener, &url, caps);
    assert_eq!(listener.connections_of_uid(me), 2);
    // The third is refused at accept, before it says anything.
    let (pqp, _cq, _pd, _s, _r, _ro, _mrs) = side(&ctx);
    let u = url.clone();
    let h = std::thread::spawn(move || pqp.connect(&u, b"", T).map(|_| ()));
    match listener.accept(T) {
        Err(VerbsError::PeerLimit { uid, limit }) => assert_eq!((uid, limit), (me, 2)),
        other => panic!("expected PeerLimit, got {other:?}"),
    }
    assert!(h.join().unwrap().is_err(), "the refused peer was connected");
    assert_eq!(listener.connections_of_uid(me), 2);
    // A close (the peer's disconnect, seen by our next poll) makes room.
    drop(b1);
    until_error(&mut a1);
    assert_eq!(listener.connections_of_uid(me), 1);
    let (_a3, _b3) = pair_on(&ctx, &listener, &url, caps);
    assert_eq!(listener.connections_of_uid(me), 2);
}

/// A receiver whose poller sleeps (its CQ armed) is woken by its peer's
/// Send (an `M_RING` on the connection's socket, which its CQ's wake-up
/// set watches); awake, or disarmed, nobody rings it; armed with a
/// message already waiting, the arm says so instead. Events only: a
/// zero-timeout look at the wake-up descriptor, and a wait whose deadline
/// means broken.
#[test]
fn a_send_rings_the_doorbell_of_a_sleeping_receiver_and_only_then() {
    use std::os::fd::AsRawFd;
    let (mut a, mut b) = pair();
    let mut fds = [wake::pollfd(b.cq.wakeup_fd().unwrap().as_raw_fd())];
    let rung = |fds: &mut [libc::pollfd], t| wake::sleep_on(fds, t);
    let mut out: Vec<Completion> = (0..8).map(|_| Completion::default()).collect();
    send_and_receive(&mut a, &mut b);
    assert!(!rung(&mut fds, Duration::ZERO), "rung while awake");
    assert!(b.cq.arm_wakeup(), "nothing waits: may sleep");
    send(&mut a, SendOp::Send);
    assert!(rung(&mut fds, T), "broken: the Send never rang");
    b.cq.disarm_wakeup();
    // The next poll reads the ring off the socket (and takes the Send).
    let deadline = Instant::now() + T;
    let mut got = 0;
    while got == 0 {
        assert!(Instant::now() < deadline, "broken: the Send never arrived");
        got = b.cq.poll(&mut out);
    }
    assert!(!rung(&mut fds, Duration::ZERO), "read once polled");
    // Armed with a message already there: do not sleep.
    send(&mut a, SendOp::Send);
    assert!(!b.cq.arm_wakeup(), "a message waits: do not sleep");
    b.cq.disarm_wakeup();
    assert!(
        !rung(&mut fds, Duration::ZERO),
        "not armed when it was sent"
    );
    while b.cq.poll(&mut out) > 0 {}
    // A peer's end wakes a sleeper too.
    assert!(b.cq.arm_wakeup());
    a.qp.disconnect();
    assert!(rung(&mut fds, T), "broken: the disconnect never woke it");
    b.cq.disarm_wakeup();
}

/// A Send that waits for a receive the peer has not posted does not
/// sleep through the post: the peer's next look at its queue pair after
/// posting rings the sleeping sender (`Conn::gave_room`), and a receive
/// posted before the sender arms keeps it from sleeping at all. (Without
/// this a client whose first call found the server's receives not yet
/// posted slept for its whole park with the call unsent.)
#[test]
fn a_sender_asleep_on_a_waiting_send_is_rung_when_the_peer_posts_a_receive() {
    use std::os::fd::AsRawFd;
    let (mut a, mut b) = pair();
    let post_recv = |s: &mut Side| {
        let buf = s.recv.alloc().unwrap();
        s.qp.post_recv(RecvWr {
            wr_id: buf.wr_id(),
            sgl: SgeList::one(Sge::whole(buf)),
        })
        .unwrap();
    };
    let mut fds = [wake::pollfd(b.cq.wakeup_fd().unwrap().as_raw_fd())];
    let mut out: Vec<Completion> = (0..8).map(|_| Completion::default()).collect();
    let send_completes = |b: &mut Side, a: &mut Side, out: &mut [Completion]| {
        let deadline = Instant::now() + T;
        let (mut sent, mut received) = (false, false);
        while !(sent && received) {
            assert!(Instant::now() < deadline, "broken: the Send never went");
            let n = b.cq.poll(out);
            sent |= out[..n]
                .iter()
                .any(|c| c.opcode == WcOpcode::Send && c.is_ok());
            let n = a.cq.poll(out);
            received |= out[..n]
                .iter()
                .any(|c| c.opcode == WcOpcode::Recv && c.is_ok());
        }
    };
    // One exchange first, so that a's receive region is mapped at b (a
    // new region's descriptor on the socket would wake b by itself).
    post_recv(&mut a);
    send(&mut b, SendOp::Send);
    send_completes(&mut b, &mut a, &mut out);
    // `a` has no receive posted now: b's Send waits.
    send(&mut b, SendOp::Send);
    assert_eq!(b.cq.poll(&mut out), 0, "sent without a receive");
    assert!(b.cq.arm_wakeup(), "no room yet: may sleep");
    post_recv(&mut a);
    assert_eq!(a.cq.poll(&mut out), 0);
    assert!(
        wake::sleep_on(&mut fds, T),
        "broken: the receive posted never rang the sleeping sender"
    );
    b.cq.disarm_wakeup();
    send_completes(&mut b, &mut a, &mut out);
    // Room given before the sender arms: it does not sleep.
    send(&mut b, SendOp::Send);
    assert_eq!(b.cq.poll(&mut out), 0, "sent without a receive");
    post_recv(&mut a);
    assert!(!b.cq.arm_wakeup(), "room was given: do not sleep");
    b.cq.disarm_wakeup();
    send_completes(&mut b, &mut a, &mut out);
}

/// Rings are cheap to send and bounded to read: a peer that floods its
/// socket with them costs the reader a bounded read per look and only
/// its own connection's time; the connection goes on working. One that
/// attaches a descriptor to a ring ends its connection.
#[test]
fn a_flood_of_rings_is_read_in_bounded_looks_and_a_ring_with_a_descriptor_is_refused() {
    let (mut a, mut b) = pair();
    {
        let inner = lock(&b.qp.shared.inner);
        let sock = &inner.conn.as_ref().unwrap().sock;
        let mut sent = 0;
        while sent < 1000
            && Msg::new(M_RING, [0; 4], b"")
                .unwrap()
                .send(sock.as_fd(), None)
                .is_ok()
        {
            sent += 1;
        }
        assert!(sent > SOCKET_READS_MAX, "only {sent} rings fit the socket");
    }
    {
        let mut inner = lock(&a.qp.shared.inner);
        let conn = inner.conn.as_mut().unwrap();
        conn.drain_socket().unwrap();
        // Bounded: what is left is still queued.
        assert!(Msg::recv(conn.sock.as_fd()).unwrap().is_some());
    }
    send_and_receive(&mut a, &mut b);
    let (r, _w) = nix::unistd::pipe().unwrap();
    {
        let inner = lock(&b.qp.shared.inner);
        let sock = &inner.conn.as_ref().unwrap().sock;
        Msg::new(M_RING, [0; 4], b"")
            .unwrap()
            .send(sock.as_fd(), Some(r.as_fd()))
            .unwrap();
    }
    let result = loop {
        let r = lock(&a.qp.shared.inner)
            .conn
            .as_mut()
            .unwrap()
            .drain_socket();
        if r.is_err() {
            break r;
        }
    };
    assert_eq!(result, Err(WcStatus::RemInvReqErr));
}
