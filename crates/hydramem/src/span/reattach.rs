//! Reattaching: a span client that comes back under a kept identity (`--client-id`) rebuilds
//! its page map and row table from what the nodes hold, since both lived in the process that
//! ended.
//!
//! Every piece carries its row's version and a tag ([`crate::tags`]): a data piece names its
//! page, the parity pieces hold the code's parity over those names. The client reads every
//! piece's version and tag (STAMPS: no data moves), and for each row takes the newest version
//! at least k of its pieces carry — the row as last written whole ([`RemoteMemory::held_rows`]);
//! the names of data pieces whose node is gone are decoded from k others. A page then lives in
//! the row with the newest version that names it.
//!
//! Why the newest version is the page's current location: a row's version is taken when the
//! row is written; the writes of one page are never concurrent — batches in flight together
//! share no page ([`super::gather`]) and a batch writes each page once; and a compaction's
//! copy of a page, which may be made while a write of it is in flight, never carries a newer
//! version than that write ([`super::busy`]) — so the page's last write has the highest
//! version of all rows naming it. A write that failed
//! part way may have left k pieces of a new row: the page then reads as that write's bytes,
//! which a failed write allows. Pages named beyond the client's size refuse the reattach.

use crate::client::{IoError, RemoteMemory};

use super::map::{Loc, PageMap};
use super::table::RowTable;

/// The page map and row table the nodes' rows describe, and the pages found.
pub fn rebuild(mem: &RemoteMemory, map: &PageMap, rows: u64) -> Result<(RowTable, u64), IoError> {
    let (held, garbage) = mem.held_rows()?;
    let n = usize::try_from(rows).expect("a row count that fits memory");
    let mut held_flags = vec![false; n];
    for row in garbage.iter().chain(held.iter().map(|h| &h.row)) {
        if let Some(f) = held_flags.get_mut(*row as usize) {
            *f = true;
        }
    }
    let mut beyond = 0u64;
    for h in &held {
        if h.row >= rows {
            beyond += 1;
            continue;
        }
        for &(pos, page) in &h.pages {
            if page >= map.pages() {
                beyond += 1;
                continue;
            }
            let loc = Loc {
                row: h.row,
                pos,
                version: h.version,
            };
            if map.get(page).is_none_or(|old| old.version < loc.version) {
                map.set(page, loc);
            }
        }
    }
    if beyond > 0 {
        return Err(IoError::Store(
            format!(
                "the memory nodes hold {beyond} pages or rows of this identity beyond its size \
                 of {} bytes: connect with the size it was written with (or larger), or free the \
                 identity with `hydramem free`",
                mem.size()
            )
            .into(),
        ));
    }
    let mut live = vec![0u8; n];
    let mut pages = 0;
    map.for_each(|_, loc| {
        live[loc.row as usize] += 1;
        pages += 1;
    });
    Ok((RowTable::rebuilt(rows, &live, &held_flags), pages))
}
