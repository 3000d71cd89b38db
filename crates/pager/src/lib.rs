//! hydramem-pager: the library `hydramem run` preloads into a program (LD_PRELOAD) to page
//! the program's memory to the cluster from user space, with no swap device, no root and no
//! change to the program.
//!
//! At load, if `HYDRAMEM_PAGER` holds a configuration (see `hydramem::run_config`), the
//! library creates the process's userfaultfd and starts the evictor, which watches the
//! program's resident anonymous memory. The first time it passes half of `--local-memory`,
//! the pager connects to the cluster (a program that stays small never does) and starts its
//! fault thread; above `--local-memory` the evictor sends cold pages out (`evict.rs`) and the
//! fault thread brings them back when touched (`pager.rs`). The page table is `table/mod.rs`.
//!
//! Invariants:
//! - without the variable the library does nothing at all;
//! - the pager's threads allocate only from its own heap (`alloc.rs`) and run on stacks of
//!   their own (`hooks.rs`), both excluded from paging (`exclude.rs`);
//! - a forked child is not paged: before fork every page comes back (`Pager::before_fork`),
//!   and in the child the library is inert; a program the process executes gets a pager of
//!   its own (the variable is inherited, the userfaultfd is not);
//! - at exit the pager appends its report to the report file; the memory it held in the
//!   cluster is released by `hydramem run` once the program has exited.

pub mod ahead;
pub mod alloc;
pub mod evict;
pub mod exclude;
pub mod hooks;
pub mod malloc;
pub mod pager;
pub mod print;
pub mod regions;
// The start of the pager is only reached from the constructor, which tests do not build.
pub mod standby;
#[cfg_attr(test, allow(dead_code))]
mod start;
pub mod stats;
pub mod table;
pub mod throttle;
pub mod uffd;

use std::sync::Arc;

use crate::pager::Pager;

/// The page size the pager works in.
pub const PAGE: usize = 4096;

/// The pager's heap: the global allocator of the library, and where the C allocator's entry
/// points serve the pager's threads from (`malloc.rs`).
#[cfg_attr(not(test), global_allocator)]
static HEAP: alloc::PagerAlloc = alloc::new();

/// Whether the pager is off in this process (a forked child).
pub fn disabled() -> bool {
    start::disabled()
}

/// The running pager, if this process has one.
pub fn running() -> Option<&'static Arc<Pager>> {
    start::running()
}
