//! The guard with real faults: a memfd mapped past its end raises SIGBUS
//! on the first touch beyond it, deterministically, without exhausting
//! the hugepage pool other processes use.
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};

use super::*;

const PAGE: usize = 4096;

/// A memfd of `file_len` bytes mapped shared read-write over `map_len`.
fn mapped_past_its_end(
    file_len: usize,
    map_len: usize,
    flags: MFdFlags,
) -> Option<(OwnedFd, *mut u8)> {
    let fd = memfd_create(c"guard-test", MFdFlags::MFD_CLOEXEC | flags).ok()?;
    nix::unistd::ftruncate(&fd, file_len as libc::off_t).ok()?;
    // SAFETY: a fresh mapping at a kernel-chosen address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some((fd, p.cast()))
}

fn unmap(p: *mut u8, len: usize) {
    // SAFETY: mapped by `mapped_past_its_end` with this length.
    unsafe { libc::munmap(p.cast(), len) };
}

#[test]
fn a_sigbus_in_a_guarded_mapping_replaces_the_page_and_is_counted() {
    let (fd, p) = mapped_past_its_end(PAGE, 2 * PAGE, MFdFlags::empty()).unwrap();
    // SAFETY: the mapping stays until after the registration is dropped.
    let guard = unsafe { PeerWritable::register(p, 2 * PAGE, PAGE) }.unwrap();
    let probe = guard.probe();
    let before = faults_total();
    // The second page is past the file's end: this store faults, the
    // guard replaces the page and the store runs again.
    // SAFETY: inside our mapping; the fault is the point.
    unsafe {
        std::ptr::write_volatile(p.add(PAGE + 8), 0xa5u8);
        assert_eq!(std::ptr::read_volatile(p.add(PAGE + 8)), 0xa5);
        // The first page is still the file's.
        std::ptr::write_volatile(p, 7u8);
    }
    assert_eq!(guard.faults(), 1);
    assert_eq!(probe.faults(), 1);
    assert!(faults_total() > before);
    let mut first = [0u8; 1];
    nix::sys::uio::pread(&fd, &mut first, 0).unwrap();
    assert_eq!(first[0], 7, "the page that did not fault is still shared");
    drop(guard);
    assert_eq!(
        probe.faults(),
        0,
        "a probe of a dropped registration reads 0"
    );
    unmap(p, 2 * PAGE);
}

#[test]
fn a_hugetlb_mapping_is_replaced_a_whole_hugepage_at_a_time() {
    const HUGE: usize = crate::mem::HUGEPAGE_SIZE;
    let Some((fd, p)) = mapped_past_its_end(2 * HUGE, 2 * HUGE, MFdFlags::MFD_HUGETLB) else {
        println!("skipped: no free 2 MiB hugepages");
        return;
    };
    // SAFETY: the mapping stays until after the registration is dropped.
    let guard = unsafe { PeerWritable::register(p, 2 * HUGE, HUGE) }.unwrap();
    // SAFETY: inside the mapping. Fault both hugepages in first.
    unsafe {
        std::ptr::write_volatile(p, 1u8);
        std::ptr::write_volatile(p.add(HUGE), 2u8);
    }
    // A punched hugepage with an empty pool cannot be produced here
    // without starving other processes of hugepages, so the repair runs
    // as the handler would for a fault in the second hugepage: an
    // address in its middle replaces all of it, and the split of the
    // hugetlb mapping on a 2 MiB boundary is allowed.
    assert!(repair(p as usize + HUGE + 12345));
    assert_eq!(guard.faults(), 1);
    // SAFETY: the whole replaced range is mapped, private and zeroed.
    unsafe {
        assert_eq!(std::ptr::read_volatile(p.add(HUGE)), 0);
        std::ptr::write_volatile(p.add(HUGE), 3u8);
        std::ptr::write_volatile(p.add(2 * HUGE - 1), 4u8);
        std::ptr::write_volatile(p, 5u8);
    }
    let mut b = [0u8; 1];
    nix::sys::uio::pread(&fd, &mut b, 0).unwrap();
    assert_eq!(b[0], 5, "the first hugepage is still the file's");
    nix::sys::uio::pread(&fd, &mut b, HUGE as libc::off_t).unwrap();
    assert_eq!(b[0], 2, "the replaced hugepage no longer reaches the file");
    drop(guard);
    unmap(p, 2 * HUGE);
}

#[test]
fn a_sigbus_outside_guarded_mappings_still_kills_the_process() {
    install().unwrap();
    let (_fd, p) = mapped_past_its_end(PAGE, 2 * PAGE, MFdFlags::empty()).unwrap();
    // A guarded mapping elsewhere changes nothing for this one.
    let (_other_fd, q) = mapped_past_its_end(PAGE, 2 * PAGE, MFdFlags::empty()).unwrap();
    // SAFETY: mapped until the end of the test.
    let _guard = unsafe { PeerWritable::register(q, 2 * PAGE, PAGE) }.unwrap();
    // SAFETY: the child only stores and exits (async-signal-safe after a
    // fork of a threaded process).
    match unsafe { fork() }.unwrap() {
        ForkResult::Child => unsafe {
            std::ptr::write_volatile(p.add(PAGE), 1u8);
            libc::_exit(0);
        },
        ForkResult::Parent { child } => {
            let status = waitpid(child, None).unwrap();
            assert!(
                matches!(status, WaitStatus::Signaled(_, Signal::SIGBUS, _)),
                "{status:?}"
            );
        }
    }
    unmap(p, 2 * PAGE);
    unmap(q, 2 * PAGE);
}
