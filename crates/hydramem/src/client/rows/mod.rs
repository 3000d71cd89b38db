//! Rows of span coding: the unit of a span-coded client's address space, below the page map
//! of [`crate::span`]. A row is k whole pages and r parity pages over them, piece j in slab j
//! of its range's coding group at slot `row in range`; all k + r pieces of a row carry one
//! version, so the rest of the client — versions, re-routing, repair and regeneration, drain —
//! treats a row as it treats a Hydra page whose splits are 4096 bytes long.
//!
//! - **Writing** ([`RemoteMemory::write_rows`]): each row's parity is encoded into its slot's
//!   side buffer and its k + r pieces are posted, the data straight from the caller's pages
//!   (positions without a page carry a zero page, so that every piece of a row has the row's
//!   version and any k of them decode); the rows of a call are all posted before any node is
//!   flushed, so each node gets one frame. A row completes only when every piece is
//!   acknowledged (lost pieces are re-routed with the same version, as for a page write): so
//!   an acknowledged row survives any r lost nodes.
//! - **Reading** ([`RemoteMemory::read_piece`]): one request, for the piece that is the page,
//!   expecting the version the span map recorded. If the node is down or regenerating, the
//!   reply fails or carries another version, or it has not come within the hedge delay (four
//!   times the recent latency of healthy piece reads over all nodes: a slow node must not
//!   raise its own threshold), the read also asks every other piece of the row and decodes
//!   the page from k that carry the version: whichever completes first wins. A piece with a newer version means the row was reused after the caller looked the
//!   page up — the page moved — and the caller looks again ([`PieceRead::Moved`]); if the page is
//!   still there at that version, the row cannot have been reused, the newer pieces are the
//!   remains of a write never acknowledged, and the caller reads again decoding around them
//!   ([`Newer::Stale`]). A read never combines pieces of two versions.
//!
//! Writing is in `write.rs`, reading in `read.rs`, and what a client that reattaches reads
//! back of the rows the nodes hold in `held.rs`; this file holds the types they share.

use std::time::{Duration, Instant};

use super::slots::{self};
use super::{Group, Page};
use crate::PAGE_SIZE;

/// What stands for a row position that has no page.
static ZERO_PAGE: Page = [0; PAGE_SIZE];

/// The shortest hedge delay: below it, the degraded read's k requests would cost more than
/// the wait they save.
const MIN_HEDGE: Duration = Duration::from_micros(300);
/// The hedge delay in multiples of the recent piece latency over all nodes.
const HEDGE_FACTOR: u64 = 4;

/// One row of a [`RemoteMemory::write_rows`] call.
#[derive(Debug, Clone, Copy)]
pub struct RowWrite<'a> {
    /// The row's index in the row space.
    pub row: u64,
    /// Its data pages by position (at most k; the positions after them hold zero pages).
    pub pages: &'a [&'a Page],
    /// The page number of each of `pages` (as many): stored with its piece as its tag, page
    /// + 1, from which a client that reattaches rebuilds its page map (see [`crate::tags`]).
    pub ids: &'a [u64],
}

/// What the nodes hold for one address range of the row space ([`RemoteMemory::row_stamps`]).
struct RangeStamps {
    /// The range's first row.
    first_row: u64,
    /// Per piece position (k + r): the (version, tag) of each of the range's rows, or `None`
    /// when that piece's node is gone or did not answer.
    pieces: Vec<Option<Vec<(u64, u64)>>>,
}

/// One row as the nodes hold it ([`RemoteMemory::held_rows`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRow {
    /// The row's index in the row space.
    pub row: u64,
    /// The newest version at least k of its pieces carry: the row as last written whole.
    pub version: u64,
    /// (position, page number) of each data position that holds a page.
    pub pages: Vec<(usize, u64)>,
}

/// How a [`RemoteMemory::read_piece`] ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceRead {
    /// The page is in the caller's buffer (from its piece, or decoded from k others).
    Done {
        /// Whether it was decoded (its node was down, slow or regenerating).
        decoded: bool,
    },
    /// The row holds a newer version than the caller expected: it was reused after the page
    /// moved. Look the page up again.
    Moved,
}

/// A page to read as a piece of a row ([`RemoteMemory::read_pieces`]).
#[derive(Debug, Clone, Copy)]
pub struct PieceWant {
    /// The page's address (for messages).
    pub addr: u64,
    /// Its row.
    pub row: u64,
    /// Its position in the row.
    pub pos: usize,
    /// The version its row was written with.
    pub version: u64,
    /// What a piece of a newer version means.
    pub newer: Newer,
}

/// What a piece read makes of a piece of its row that carries a newer version than the one
/// it wants ([`PieceWant::newer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Newer {
    /// The row was reused after the caller looked the page up: the read ends as
    /// [`PieceRead::Moved`] and the caller looks again.
    Moved,
    /// The caller looked again and the page is still in this row at this version, so the row
    /// cannot have been reused: the newer pieces are the remains of a write never acknowledged
    /// (a client that stopped mid-write under the same identity). They are not the page; it
    /// is decoded from k pieces of the wanted version.
    Stale,
}

/// A piece read in flight.
struct PieceOp<'m> {
    op: slots::Op<'m>,
    group: std::sync::Arc<Group>,
    want: PieceWant,
    rir: u64,
    range: usize,
    degraded: bool,
    /// A read alone (not one of a batch, whose pieces are waited for one after another): its
    /// latency is the node's, and goes into the moving averages.
    timed: bool,
    start: Instant,
    posted: Instant,
}

/// What one look at a piece read decided.
enum Look {
    /// The page's own piece arrived with the version.
    Piece,
    /// k pieces of the version arrived (this mask): decode the page.
    Decode(u32),
    /// A piece carries a newer version: the row was reused.
    Moved,
}

mod held;
mod read;
mod write;
