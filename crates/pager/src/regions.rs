//! Which memory of the program the pager pages: its large private anonymous mappings (heap
//! arenas of the C library, big allocations, allocators' chunks) and its brk heap, found in
//! /proc/self/maps. Stacks, file mappings, shared memory and the pager's own ranges stay
//! local.
//!
//! The brk heap is paged although it grows and shrinks by brk: it is where the C library's
//! main arena puts every small allocation of a single-threaded program (sqlite's page cache,
//! most of a Python program's objects), so leaving it local would leave those programs' data
//! local. Growth adds a new mapping (found at the next scan); shrinking is an unmap, which
//! the kernel reports like munmap.
//! Also which pages of a range are resident (/proc/self/pagemap, which needs no privilege
//! for the present bit).
//!
//! Invariants: a region is a whole mapping as the kernel listed it, read-write, private,
//! anonymous, at least the configured size, outside every excluded range.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;

use crate::PAGE;

/// A mapping the pager may page: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

/// The pageable mappings listed in `maps` (the text of /proc/self/maps), at least `min`
/// bytes long, for which `excluded` says no.
pub fn pageable(maps: &str, min: usize, excluded: impl Fn(usize, usize) -> bool) -> Vec<Region> {
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_ascii_whitespace();
            let range = f.next()?;
            let perms = f.next()?;
            let (_offset, _dev, inode) = (f.next()?, f.next()?, f.next()?);
            let path = f.next().unwrap_or("");
            let (a, b) = range.split_once('-')?;
            let start = usize::from_str_radix(a, 16).ok()?;
            let end = usize::from_str_radix(b, 16).ok()?;
            let anon =
                inode == "0" && (path.is_empty() || path.starts_with("[anon:") || path == "[heap]");
            let ok = perms.starts_with("rw-p") && anon && end - start >= min;
            (ok && !excluded(start, end)).then_some(Region { start, end })
        })
        .collect()
}

/// Reads /proc/self/maps.
pub fn read_maps() -> std::io::Result<String> {
    let mut s = String::new();
    File::open("/proc/self/maps")?.read_to_string(&mut s)?;
    Ok(s)
}

/// Resident-page queries on this process.
pub struct Pagemap {
    file: File,
    buf: Vec<u64>,
}

impl Pagemap {
    /// Opens /proc/self/pagemap.
    pub fn open() -> std::io::Result<Pagemap> {
        Ok(Pagemap {
            file: File::open("/proc/self/pagemap")?,
            buf: Vec::new(),
        })
    }

    /// Calls `f` with the address of every resident page of the `n` pages from `start`.
    pub fn resident(
        &mut self,
        start: usize,
        n: usize,
        mut f: impl FnMut(usize),
    ) -> std::io::Result<()> {
        self.buf.resize(n, 0);
        // SAFETY: u64 has no invalid bit patterns; the byte view covers exactly `buf`.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast::<u8>(), n * 8) };
        let got = self.file.read_at(bytes, (start / PAGE * 8) as u64)?;
        for (i, e) in self.buf[..got / 8].iter().enumerate() {
            // Bit 63: present in memory.
            if e >> 63 == 1 {
                f(start + i * PAGE);
            }
        }
        Ok(())
    }
}

/// Anonymous memory resident in this process, in bytes (resident minus shared pages of
/// /proc/self/statm: what a memory limit on the program would count, less its files).
pub fn resident_anon(statm: &File) -> std::io::Result<u64> {
    let mut buf = [0u8; 128];
    let n = statm.read_at(&mut buf, 0)?;
    let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
    let mut f = text.split_ascii_whitespace().skip(1);
    let resident: u64 = f.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let shared: u64 = f.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    Ok(resident.saturating_sub(shared) * PAGE as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1234 /usr/bin/redis-server
55d0c1a00000-55d0c1c21000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0004000000 rw-p 00000000 00:00 0
7f0004000000-7f0008000000 ---p 00000000 00:00 0
7f0010000000-7f0010010000 rw-p 00000000 00:00 0
7f0020000000-7f0020400000 rw-p 00000000 00:00 0 [anon:jemalloc]
7f0030000000-7f0030400000 rw-s 00000000 00:01 77 /dev/zero (deleted)
7f0040000000-7f0040400000 rw-p 00000000 08:01 99 /var/lib/data.bin
7ffc00000000-7ffc00400000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn only_large_private_anonymous_mappings_and_the_brk_heap() {
        let r = pageable(MAPS, 1 << 20, |_, _| false);
        assert_eq!(
            r,
            vec![
                Region {
                    start: 0x55d0c1a00000,
                    end: 0x55d0c1c21000
                },
                Region {
                    start: 0x7f0000000000,
                    end: 0x7f0004000000
                },
                Region {
                    start: 0x7f0020000000,
                    end: 0x7f0020400000
                },
            ]
        );
    }

    #[test]
    fn excluded_ranges_are_skipped() {
        let r = pageable(MAPS, 1 << 20, |s, _| s == 0x7f0000000000);
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn resident_pages_are_seen() {
        let mut v = vec![0u8; 64 * PAGE];
        let base = (v.as_mut_ptr() as usize + PAGE - 1) & !(PAGE - 1);
        // SAFETY: base + PAGE is inside v.
        unsafe { std::ptr::write_volatile((base + PAGE) as *mut u8, 1) };
        let mut pm = Pagemap::open().unwrap();
        let mut seen = Vec::new();
        pm.resident(base, 4, |a| seen.push(a)).unwrap();
        assert!(seen.contains(&(base + PAGE)));
    }
}
