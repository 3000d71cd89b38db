//! Thread priorities: background work yields the CPU to the work it serves.
//!
//! Linux keeps a nice value per thread, so one thread of a process can run at the lowest
//! priority while the others keep theirs. Measured on two cores, where the client, the nodes
//! and the application share the CPU: span compaction repacking rows raised span's read
//! latency until it ran at nice 19. A low priority is not enough for work that spends long in
//! one system call on a kernel without preemption: a memory node backing a pooled 64 MiB slab
//! also has to do it in steps (`SlabMemory::populate` in `node/memory.rs`).

/// Gives the calling thread the lowest CPU priority (nice 19). Best effort: a refusal leaves
/// the thread at its inherited priority and says so at debug level, naming `what`.
pub fn background(what: &str) {
    // SAFETY: gettid takes nothing and returns the calling thread's id; it touches no memory.
    let tid = unsafe { libc::gettid() };
    let Ok(tid) = libc::id_t::try_from(tid) else {
        return;
    };
    // SAFETY: setpriority takes plain integers and touches no memory of ours; a bad argument
    // only makes it fail with an error code.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, 19) };
    if r != 0 {
        tracing::debug!(what, "runs at its inherited priority");
    }
}
