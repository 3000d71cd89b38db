//! The program's userfaultfd: registration of its regions, and the operations that resolve
//! faults (map a fetched page, map zeros, wake, write-protect, poison).
//!
//! Written here rather than taken from the `userfaultfd` crate: its -sys crate generates the
//! bindings with bindgen at build time (a libclang dependency for every build), and it lacks
//! UFFDIO_POISON, which the pager needs (a page lost with more nodes than the scheme
//! survives raises SIGBUS). The
//! structures and numbers are those of linux/userfaultfd.h (UAPI, stable).
//!
//! Invariants: the descriptor is close-on-exec (a program this one executes gets its own
//! pager) and non-blocking (the fault thread polls it, then reads under the table lock, as the
//! evictor does before it drops a batch); it
//! reports faults from the kernel too (not user-mode only), so a system call that touches a
//! page that is out waits for it like the program would.

use std::os::fd::{AsRawFd, OwnedFd};

use hydramem::run_config::{open_userfaultfd, UserfaultfdDenied};

use crate::PAGE;

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
const UFFDIO_WAKE: libc::c_ulong = 0x8010_AA02;
const UFFDIO_COPY: libc::c_ulong = 0xC028_AA03;
const UFFDIO_ZEROPAGE: libc::c_ulong = 0xC020_AA04;
const UFFDIO_WRITEPROTECT: libc::c_ulong = 0xC018_AA06;
const UFFDIO_POISON: libc::c_ulong = 0xC020_AA08;

const FEATURE_EVENT_REMAP: u64 = 1 << 2;
const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const FEATURE_THREAD_ID: u64 = 1 << 8;
const FEATURE_POISON: u64 = 1 << 14;

const REGISTER_MODE_MISSING: u64 = 1 << 0;
const REGISTER_MODE_WP: u64 = 1 << 1;
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;

const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_REMAP: u8 = 0x14;
const EVENT_UNMAP: u8 = 0x16;
const PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

#[repr(C)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
struct Register {
    range: Range,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct Copy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct ZeroPage {
    range: Range,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
struct WriteProtect {
    range: Range,
    mode: u64,
}

#[repr(C)]
struct Poison {
    range: Range,
    mode: u64,
    updated: i64,
}

/// struct uffd_msg: an event byte, padding, then 24 bytes of arguments.
#[repr(C)]
struct Msg {
    event: u8,
    reserved: [u8; 7],
    arg: [u64; 3],
}

/// Why the userfaultfd could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum UffdError {
    /// No userfaultfd for this process.
    #[error(transparent)]
    Create(UserfaultfdDenied),
    /// The kernel lacks what the pager needs.
    #[error(
        "this kernel's userfaultfd lacks the munmap/mremap events the pager needs ({0}): \
         Linux 4.11 or later is needed"
    )]
    Api(std::io::Error),
    /// A range could not be registered.
    #[error("registering {len} bytes at {start:#x} with userfaultfd: {source}")]
    Register {
        /// First byte.
        start: usize,
        /// Bytes.
        len: usize,
        /// What failed.
        source: std::io::Error,
    },
}

/// A fault or event the kernel reported.
#[derive(Debug, Clone, Copy)]
pub enum Report {
    /// A missing page at `addr` (page-aligned), on a write if `write`, by thread `tid`.
    Missing {
        /// The page's address.
        addr: usize,
        /// The fault was a write.
        write: bool,
        /// The faulting thread.
        tid: i32,
    },
    /// A write to the write-protected page at `addr`.
    WriteProtect {
        /// The page's address.
        addr: usize,
    },
    /// `[from, from + len)` moved to `to` (mremap).
    Remap {
        /// Old start.
        from: usize,
        /// New start.
        to: usize,
        /// Bytes moved.
        len: usize,
    },
    /// `[start, end)` was unmapped.
    Unmap {
        /// First byte.
        start: usize,
        /// One past the last byte.
        end: usize,
    },
}

/// The program's userfaultfd.
pub struct Uffd {
    fd: OwnedFd,
    poison: bool,
}

fn ioctl<T>(fd: i32, request: libc::c_ulong, arg: &mut T) -> std::io::Result<()> {
    // SAFETY: every request used here takes a pointer to a structure of exactly type T,
    // which lives for the call; the kernel checks the addresses inside it.
    let r = unsafe { libc::ioctl(fd, request, arg as *mut T) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn open_fd(dev: Option<i32>) -> Result<OwnedFd, UffdError> {
    open_userfaultfd(libc::O_CLOEXEC | libc::O_NONBLOCK, dev).map_err(UffdError::Create)
}

impl Uffd {
    /// Creates the userfaultfd with the events the pager needs (mremap, munmap) and, where
    /// the kernel has it (Linux 6.6), poisoning; through `dev`, a descriptor of
    /// /dev/userfaultfd, where the system call is not allowed (see `open_userfaultfd`).
    pub fn new(dev: Option<i32>) -> Result<Uffd, UffdError> {
        let base = FEATURE_EVENT_REMAP | FEATURE_EVENT_UNMAP | FEATURE_THREAD_ID;
        // The API handshake can be done once per descriptor: a refused feature set needs a
        // new descriptor.
        let fd = open_fd(dev)?;
        let mut api = Api {
            api: UFFD_API,
            features: base | FEATURE_POISON,
            ioctls: 0,
        };
        if ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api).is_ok() {
            return Ok(Uffd { fd, poison: true });
        }
        let fd = open_fd(dev)?;
        let mut api = Api {
            api: UFFD_API,
            features: base,
            ioctls: 0,
        };
        ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api).map_err(UffdError::Api)?;
        Ok(Uffd { fd, poison: false })
    }

    /// The descriptor, for poll.
    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Registers `[start, start + len)` for missing-page and write-protect faults.
    ///
    /// # Safety
    /// The range must be the program's memory, which no Rust reference of this process
    /// points into: from now on the pager maps, protects, drops and poisons pages there.
    pub unsafe fn register(&self, start: usize, len: usize) -> Result<(), UffdError> {
        let mut r = Register {
            range: Range {
                start: start as u64,
                len: len as u64,
            },
            mode: REGISTER_MODE_MISSING | REGISTER_MODE_WP,
            ioctls: 0,
        };
        ioctl(self.fd(), UFFDIO_REGISTER, &mut r).map_err(|source| UffdError::Register {
            start,
            len,
            source,
        })
    }

    /// Reads one report; None if none is pending (or the kernel sent one the pager did not
    /// ask for).
    pub fn read(&self) -> std::io::Result<Option<Report>> {
        let mut m = Msg {
            event: 0,
            reserved: [0; 7],
            arg: [0; 3],
        };
        let size = std::mem::size_of::<Msg>();
        // SAFETY: reads at most `size` bytes into `m`, a plain-data structure of that size.
        let n = unsafe { libc::read(self.fd(), (&mut m as *mut Msg).cast(), size) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        if n as usize != size {
            return Ok(None);
        }
        let [a, b, c] = m.arg;
        Ok(match m.event {
            EVENT_PAGEFAULT => {
                let addr = b as usize & !(PAGE - 1);
                if a & PAGEFAULT_FLAG_WP != 0 {
                    Some(Report::WriteProtect { addr })
                } else {
                    Some(Report::Missing {
                        addr,
                        write: a & PAGEFAULT_FLAG_WRITE != 0,
                        tid: (c & 0xffff_ffff) as u32 as i32,
                    })
                }
            }
            EVENT_REMAP => Some(Report::Remap {
                from: a as usize,
                to: b as usize,
                len: c as usize,
            }),
            EVENT_UNMAP => Some(Report::Unmap {
                start: a as usize,
                end: b as usize,
            }),
            _ => None,
        })
    }

    /// Maps a copy of `page` at `addr`, writable, and wakes the threads waiting on it. False
    /// if a page was already there or the range is no longer registered (nothing to do then).
    pub fn copy(&self, addr: usize, page: &[u8; PAGE]) -> bool {
        let mut c = Copy {
            dst: addr as u64,
            src: page.as_ptr() as u64,
            len: PAGE as u64,
            mode: 0,
            copy: 0,
        };
        ioctl(self.fd(), UFFDIO_COPY, &mut c).is_ok()
    }

    /// Maps the zero page at `addr` and wakes the threads waiting on it.
    pub fn zero(&self, addr: usize) -> bool {
        let mut z = ZeroPage {
            range: Range {
                start: addr as u64,
                len: PAGE as u64,
            },
            mode: 0,
            zeropage: 0,
        };
        ioctl(self.fd(), UFFDIO_ZEROPAGE, &mut z).is_ok()
    }

    /// Wakes the threads waiting on the page at `addr` (they fault again).
    pub fn wake(&self, addr: usize) {
        let mut r = Range {
            start: addr as u64,
            len: PAGE as u64,
        };
        let _ = ioctl(self.fd(), UFFDIO_WAKE, &mut r);
    }

    /// Write-protects `[addr, addr + len)`. False if the range is not (or no longer)
    /// registered.
    pub fn protect(&self, addr: usize, len: usize) -> bool {
        let mut w = WriteProtect {
            range: Range {
                start: addr as u64,
                len: len as u64,
            },
            mode: WRITEPROTECT_MODE_WP,
        };
        ioctl(self.fd(), UFFDIO_WRITEPROTECT, &mut w).is_ok()
    }

    /// Lets writes to the page at `addr` go on, and wakes the threads waiting on it.
    pub fn unprotect(&self, addr: usize) {
        let mut w = WriteProtect {
            range: Range {
                start: addr as u64,
                len: PAGE as u64,
            },
            mode: 0,
        };
        // A failed un-protect wakes no one: a thread that wrote to a page another thread
        // unmapped meanwhile (ENOENT), or while an unmap or move is still being reported
        // (EAGAIN), would sleep on it for good. Woken, it faults again and finds the page
        // gone, mapped anew, or still there to un-protect.
        if ioctl(self.fd(), UFFDIO_WRITEPROTECT, &mut w).is_err() {
            self.wake(addr);
        }
    }

    /// Makes the page at `addr` raise SIGBUS when touched (its bytes are lost), and wakes the
    /// threads waiting on it. False if the kernel cannot poison (before Linux 6.6).
    pub fn poison(&self, addr: usize) -> bool {
        if !self.poison {
            return false;
        }
        let mut p = Poison {
            range: Range {
                start: addr as u64,
                len: PAGE as u64,
            },
            mode: 0,
            updated: 0,
        };
        ioctl(self.fd(), UFFDIO_POISON, &mut p).is_ok()
    }
}

/// Whether `fd` becomes readable within `timeout_ms` milliseconds (0: now).
pub fn readable(fd: i32, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, timeout_ms) > 0 }
}

/// A new private anonymous mapping of `len` bytes, for tests that register memory; its
/// address.
#[cfg(test)]
pub(crate) fn test_mapping(len: usize) -> usize {
    // SAFETY: a new mapping that nothing else refers to; no memory of ours is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap of {len} bytes");
    p as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (10 s at most) for a report and reads it.
    fn next_report(u: &Uffd) -> Option<Report> {
        assert!(readable(u.fd(), 10_000), "no report came");
        u.read().unwrap()
    }

    #[test]
    fn a_writer_whose_page_is_unmapped_meanwhile_is_woken() {
        let Ok(uffd) = Uffd::new(None) else {
            eprintln!("skipped: no userfaultfd for this user");
            return;
        };
        let addr = test_mapping(PAGE);
        let page = addr as *mut libc::c_void;
        // SAFETY: inside the page mapped above.
        unsafe { std::ptr::write_volatile(addr as *mut u8, 1) };
        // SAFETY: the page is this test's; no reference points into it.
        unsafe { uffd.register(addr, PAGE) }.unwrap();
        assert!(uffd.protect(addr, PAGE));
        let (done, written) = std::sync::mpsc::channel();
        // A program thread writes to the protected page and waits for the pager.
        let writer = std::thread::spawn(move || {
            // SAFETY: the page stays mapped (replaced below, never unmapped for good).
            unsafe { std::ptr::write_volatile(addr as *mut u8, 2) };
            done.send(()).unwrap();
        });
        assert!(matches!(
            next_report(&uffd),
            Some(Report::WriteProtect { addr: a }) if a == addr
        ));
        // Another program thread maps a new page over it (an unmap, reported; the call returns
        // once the report is read).
        std::thread::scope(|s| {
            let reader = s.spawn(|| next_report(&uffd));
            // SAFETY: replaces the test's own page.
            let again = unsafe {
                libc::mmap(
                    page,
                    PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            assert_eq!(again, page);
            assert!(matches!(reader.join().unwrap(), Some(Report::Unmap { .. })));
        });
        // The pager lets the write go on: the page is no longer registered, and the writer
        // must still be woken (it then writes to the new page).
        uffd.unprotect(addr);
        let woken = written.recv_timeout(std::time::Duration::from_secs(10));
        // Should it not be, closing the descriptor wakes it.
        drop(uffd);
        writer.join().unwrap();
        woken.expect("the writer was not woken");
        // SAFETY: the test's own page, no longer used.
        unsafe { libc::munmap(page, PAGE) };
    }

    #[test]
    fn structures_have_the_kernel_sizes() {
        // The sizes encoded in the ioctl numbers (bits 16..30).
        let size = |req: libc::c_ulong| ((req >> 16) & 0x3fff) as usize;
        assert_eq!(size(UFFDIO_API), std::mem::size_of::<Api>());
        assert_eq!(size(UFFDIO_REGISTER), std::mem::size_of::<Register>());
        assert_eq!(size(UFFDIO_WAKE), std::mem::size_of::<Range>());
        assert_eq!(size(UFFDIO_COPY), std::mem::size_of::<Copy>());
        assert_eq!(size(UFFDIO_ZEROPAGE), std::mem::size_of::<ZeroPage>());
        assert_eq!(
            size(UFFDIO_WRITEPROTECT),
            std::mem::size_of::<WriteProtect>()
        );
        assert_eq!(size(UFFDIO_POISON), std::mem::size_of::<Poison>());
        assert_eq!(std::mem::size_of::<Msg>(), 32);
    }
}
