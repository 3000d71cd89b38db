//! The transmission phase: requests in, replies out, over one connection.
//!
//! The connection's thread reads requests (a header, and for a WRITE its payload). A request
//! with nothing in flight and nothing buffered behind it (a client at queue depth 1) is
//! executed right there; otherwise it goes to a small pool of worker threads of this
//! connection, which execute it on the [`Export`] and send its reply. Replies go out in
//! completion order, which the protocol allows (the client matches them by cookie). A pool,
//! because a page operation mostly waits on the network (the CPU idle meanwhile), so a client
//! that keeps requests in flight on one connection (the kernel, qemu, fio at depth 16) gets
//! them served concurrently, as from a disk; the inline path, because handing a lone request
//! to a worker costs a thread wake-up (tens of µs here, a fifth of a page write). Measured on
//! the shared 2-core development machine with fio's nbd engine, 4 KiB random writes at depth
//! 16 on one connection: 5,800–5,900 IOPS with one worker, 6,400–8,000 with eight (noisy:
//! another build shared the cores). With `workers == 1` every request runs in order on the
//! reading thread.
//!
//! Requests a client pipelined are also *batched*: READs, or WRITEs, of whole pages that are
//! already buffered behind one another (the kernel at queue depth 16 sends 16 single-page
//! swap-ins at once) are gathered — up to 64 requests and 1 MiB, one kind per batch — and
//! executed as one unit with all their pages in flight together ([`Export::read_many`],
//! [`Export::write_many`]): the pages of 16 requests reach each memory node in one frame
//! instead of 16. The last request buffered sends the batch off; any other request (a partial
//! page, FLUSH, TRIM, an invalid one) closes the batch before it and runs on its own.
//!
//! Pipelined READs of whole pages (a batch, or one alone) use the asynchronous form: the
//! connection's thread *starts* them ([`Export::submit_reads`]: slots taken, runs posted) and
//! goes on reading requests, and one completer thread per connection ends them in order and
//! replies straight from the pages read. No worker is woken for them and no thread waits per
//! request; the pool serves the rest (writes, partial pages, zeroing). The completer never
//! waits for one of the client's operation slots: the READs queued behind it hold slots that
//! only it gives back. So a READ is started only with every page's slot free (else the
//! connection's thread reads it itself, waiting as any call), and READs whose submission
//! failed are read again by a worker.
//!
//! Invariants:
//! - a request is replied to exactly once: with its data, with success once every page it
//!   wrote is acknowledged under the resilience mode (so FLUSH has nothing to wait for and FUA
//!   is implied), or with an error (EINVAL for requests outside the export, over the maximum
//!   payload, with unknown commands or flags; EIO when the remote memory fails, with the
//!   reason as the structured error message). The connection goes on after any of them;
//! - a request that breaks framing (wrong magic, a payload cut short) ends this connection
//!   only; requests already read are still executed and replied to before it closes;
//! - NBD_CMD_DISC, end of input or a shutdown stop reading; in-flight requests finish and are
//!   replied to, then the connection closes;
//! - with structured replies a READ is answered by one OFFSET_DATA chunk (so DF always holds),
//!   other commands by a NONE chunk, errors by an ERROR chunk with a message; without, by
//!   simple replies.

use std::io::{self, BufReader, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::batch::{complete_reads, execute_batch, submit_reads, Batch, Work};
use super::export::{Export, ExportError, SubmittedReads};
use super::handshake::{read_or_eof, Negotiated};
use super::limits::{Budget, Deadlined, Limits, Permit};
use super::pool::{Pool, Task};
use super::wire::{self, Request};
use super::{NbdError, MAX_PAYLOAD};

/// How a connection's transmission phase ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The client sent NBD_CMD_DISC.
    Disconnect,
    /// The input ended (the client closed, or the server is shutting down).
    Closed,
}

/// A request read off the wire, ready to execute.
pub(super) struct Job {
    pub(super) req: Request,
    pub(super) payload: Payload,
    /// Its bytes of the server's budget, given back when the job is dropped (replied to).
    pub(super) _permit: Permit,
}

/// The payload of a request.
pub(super) enum Payload {
    /// The command carries none.
    None,
    /// A WRITE's data.
    Data(Vec<u8>),
    /// A WRITE over the maximum payload: its data was read and dropped.
    Discarded,
}

/// The sending half: replies of the workers, one at a time.
pub(super) struct Replies<W> {
    w: Mutex<W>,
    pub(super) structured: bool,
    failed: AtomicBool,
}

impl<W: Write> Replies<W> {
    /// Writes one reply made of `parts` and pushes it out.
    fn send(&self, parts: &[&[u8]]) {
        // A client that stopped taking replies (the write timed out, or the socket broke)
        // gets no more: its connection ends at the next request.
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        let mut w = self.w.lock();
        let r = parts
            .iter()
            .try_for_each(|p| w.write_all(p))
            .and_then(|()| w.flush());
        if let Err(e) = r {
            if !self.failed.swap(true, Ordering::Relaxed) {
                tracing::debug!(error = %e, "NBD client no longer takes replies");
            }
        }
    }

    pub(super) fn done(&self, cookie: u64) {
        if self.structured {
            self.send(&[&wire::done_chunk(cookie)]);
        } else {
            self.send(&[&wire::simple_reply(0, cookie)]);
        }
    }

    pub(super) fn data(&self, cookie: u64, offset: u64, data: &[u8]) {
        if !self.structured {
            self.send(&[&wire::simple_reply(0, cookie), data]);
        } else if data.is_empty() {
            // An OFFSET_DATA chunk must describe at least one byte.
            self.send(&[&wire::done_chunk(cookie)]);
        } else {
            self.send(&[
                &wire::read_chunk_prefix(cookie, offset, data.len() as u32),
                data,
            ]);
        }
    }

    fn error(&self, cookie: u64, error: u32, message: &str) {
        if self.structured {
            self.send(&[&wire::error_chunk(cookie, error, message)]);
        } else {
            self.send(&[&wire::simple_reply(error, cookie)]);
        }
    }
}

/// What the connections of one server share: the worker pool, the budget of bytes in flight,
/// and the time a request may take to arrive and its reply to be taken.
pub struct Shared {
    /// Runs pipelined requests; `None`: every request runs in order on the reading thread.
    pub pool: Option<Pool>,
    /// Bytes of payloads and read buffers in flight.
    pub budget: Arc<Budget>,
    /// From a request's first byte to its last.
    pub request: Duration,
}

impl Shared {
    /// `workers` threads shared by all connections (1 or fewer: no pool, requests in order),
    /// and the limits' budget and request time.
    pub fn new(workers: usize, limits: &Limits) -> Shared {
        Shared {
            pool: (workers > 1).then(|| Pool::new(workers)),
            budget: Budget::new(limits.bytes_in_flight),
            request: limits.request,
        }
    }
}

/// Requests of one connection handed to the pool or the completer and not yet replied to.
#[derive(Default)]
struct InFlight {
    n: Mutex<usize>,
    changed: Condvar,
}

impl InFlight {
    fn get(&self) -> usize {
        *self.n.lock()
    }

    /// One more, once fewer than `max` are in flight.
    fn enter(&self, max: usize) {
        let mut n = self.n.lock();
        while *n >= max {
            self.changed.wait(&mut n);
        }
        *n += 1;
    }

    fn leave(&self) {
        *self.n.lock() -= 1;
        self.changed.notify_all();
    }

    fn wait_idle(&self) {
        let mut n = self.n.lock();
        while *n > 0 {
            self.changed.wait(&mut n);
        }
    }
}

/// What the request reader hands on.
enum Event {
    /// A request, and whether more input is already buffered behind it.
    Job(Job, bool),
    /// The reader is about to wait for budget: requests held back for a batch must go now.
    Flush,
}

/// Serves requests read from `r` on `export`, replying on `w`, until the client disconnects,
/// the input ends, `stopping()` is true between two requests, a reply cannot be sent, or a
/// request breaks framing or its deadline (`Err`). Returns after every request read has been
/// replied to (or its reply failed).
pub fn serve<R: Read, W: Write + Send + 'static>(
    r: &mut BufReader<Deadlined<R>>,
    w: W,
    export: &Arc<Export>,
    negotiated: Negotiated,
    shared: &Shared,
    stopping: impl Fn() -> bool,
) -> Result<End, NbdError> {
    let replies = Arc::new(Replies {
        w: Mutex::new(w),
        structured: negotiated.structured,
        failed: AtomicBool::new(false),
    });
    let inflight = Arc::new(InFlight::default());
    let per_connection = shared.pool.as_ref().map_or(1, Pool::per_connection);
    let structured = replies.structured;
    let result = std::thread::scope(|s| {
        let (rp, fl): (&Replies<W>, &InFlight) = (&replies, &inflight);
        // The completer ends the READs this thread started without waiting (one thread for
        // all of them, however many are in flight), started when the first such READ comes.
        let mut completer: Option<mpsc::SyncSender<(SubmittedReads<'_>, Vec<Job>)>> = None;
        let mut completer_failed = false;
        let mut dispatch = |work: Work, pipelined: bool| {
            let Some(pool) = &shared.pool else {
                return run(work, export, rp);
            };
            // Work with nothing in flight and nothing behind it (a client at queue depth 1)
            // runs here, sparing the wake-up of a worker: tens of µs on these machines, a
            // fifth of a page write.
            if !pipelined && fl.get() == 0 {
                return run(work, export, rp);
            }
            // Pipelined READs of whole pages are started here and ended by the completer: no
            // worker is woken before their splits leave.
            if !completer_failed && Batch::submittable(&work, export, structured) {
                if completer.is_none() {
                    let (tx, rx) = mpsc::sync_channel(per_connection * 2);
                    let (r, f) = (&replies, &inflight);
                    let complete = move || {
                        for (sub, jobs) in rx {
                            match complete_reads(sub, jobs, r) {
                                Ok(()) => f.leave(),
                                // Read again by a worker, which may wait for slots.
                                Err(jobs) => on_pool(pool, Work::of(jobs), export, r, f),
                            }
                        }
                    };
                    match std::thread::Builder::new()
                        .name("nbd-completer".into())
                        .spawn_scoped(s, complete)
                    {
                        Ok(_) => completer = Some(tx),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot start the NBD completer thread");
                            completer_failed = true;
                        }
                    }
                }
                if let Some(tx) = &completer {
                    fl.enter(per_connection);
                    match submit_reads(work, export) {
                        Ok(started) => {
                            if let Err(mpsc::SendError((sub, jobs))) = tx.send(started) {
                                if let Err(jobs) = complete_reads(sub, jobs, rp) {
                                    run(Work::of(jobs), export, rp);
                                }
                                fl.leave();
                            }
                        }
                        Err(work) => {
                            fl.leave();
                            run(work, export, rp);
                        }
                    }
                    return;
                }
            }
            fl.enter(per_connection);
            on_pool(pool, work, export, &replies, &inflight);
        };
        let mut batch = Batch::default();
        let stop = || stopping() || rp.failed.load(Ordering::Relaxed);
        let r = read_requests(r, &stop, shared, |event| match event {
            Event::Flush => {
                if let Some(work) = batch.take() {
                    dispatch(work, true);
                }
            }
            Event::Job(job, pipelined) => {
                if !batch.takes(&job, export, structured) {
                    if let Some(work) = batch.take() {
                        dispatch(work, true);
                    }
                    if !batch.takes(&job, export, structured) {
                        return dispatch(Work::One(job), pipelined);
                    }
                }
                batch.push(job);
                // Requests already buffered behind this one join it; the last of them sends
                // the batch off.
                if !pipelined || batch.full() {
                    if let Some(work) = batch.take() {
                        dispatch(work, pipelined);
                    }
                }
            }
        });
        if let Some(work) = batch.take() {
            dispatch(work, false);
        }
        drop(completer); // the completer ends the reads in flight, and the scope joins it
        r
    });
    inflight.wait_idle();
    result
}

/// Runs `work` (one request of `inflight`'s) on a worker of `pool`, which then leaves
/// `inflight`.
fn on_pool<W: Write + Send + 'static>(
    pool: &Pool,
    work: Work,
    export: &Arc<Export>,
    replies: &Arc<Replies<W>>,
    inflight: &Arc<InFlight>,
) {
    let (e, r, f) = (export.clone(), replies.clone(), inflight.clone());
    let task: Task = Box::new(move || {
        run(work, &e, &r);
        drop(r);
        f.leave();
    });
    // Given back only if every worker is gone (a panic): run it here.
    if let Err(task) = pool.submit(task) {
        task();
    }
}

/// Executes one unit of work and sends its replies.
fn run<W: Write>(work: Work, export: &Export, replies: &Replies<W>) {
    match work {
        Work::One(job) => execute(job, export, replies),
        Work::Batch(jobs) => execute_batch(jobs, export, replies),
    }
}

/// The flags command `kind` allows, `None` for an unknown command.
pub(super) fn allowed_flags(kind: u16, structured: bool) -> Option<u16> {
    let fua = wire::CMD_FLAG_FUA;
    match kind {
        wire::CMD_READ if structured => Some(fua | wire::CMD_FLAG_DF),
        wire::CMD_READ | wire::CMD_WRITE | wire::CMD_FLUSH | wire::CMD_TRIM => Some(fua),
        wire::CMD_WRITE_ZEROES => Some(fua | wire::CMD_FLAG_NO_HOLE),
        _ => None,
    }
}

/// Replies to a request whose execution failed: EINVAL for a request outside the export,
/// EIO (logged) when the remote memory failed.
pub(super) fn reply_error<W: Write>(replies: &Replies<W>, req: &Request, e: ExportError) {
    let name = wire::command_name(req.kind);
    match e {
        ExportError::OutOfRange { .. } => {
            fail(replies, req.cookie, name, wire::EINVAL, &e.to_string())
        }
        ExportError::Io(_) => {
            tracing::warn!(cmd = name, offset = req.offset, len = req.len, error = %e, "NBD request failed");
            fail(replies, req.cookie, name, wire::EIO, &e.to_string())
        }
    }
}

/// Reads requests until DISC, end of input, `stopping()`, or a framing error, passing each to
/// `on` with whether more input is already buffered behind it. Between requests the reader
/// waits as long as the client is idle; once a request's first byte is in, the rest of it
/// must come within the request time. Each request takes its bytes (payload, or data to read)
/// from the budget before its payload is read; if they are not free, held-back requests are
/// flushed first, then the reader waits for them. (A shutdown also ends the reading side of
/// the socket, which wakes a blocked read; the check here stops a client whose requests are
/// already buffered, or keep coming.)
fn read_requests<R: Read>(
    r: &mut BufReader<Deadlined<R>>,
    stopping: &dyn Fn() -> bool,
    shared: &Shared,
    mut on: impl FnMut(Event),
) -> Result<End, NbdError> {
    loop {
        if stopping() {
            return Ok(End::Closed);
        }
        let mut hb = [0u8; wire::REQUEST_LEN];
        r.get_mut().no_deadline();
        if !read_or_eof(r, &mut hb[..1])? {
            return Ok(End::Closed);
        }
        r.get_mut()
            .until(Instant::now() + shared.request, REQUEST_LATE);
        r.read_exact(&mut hb[1..])?;
        let req = Request::parse(&hb)?;
        if req.kind == wire::CMD_DISC {
            return Ok(End::Disconnect);
        }
        let truncated = || NbdError::TruncatedPayload {
            len: req.len,
            offset: req.offset,
        };
        let held = match (req.kind, req.len as usize) {
            (wire::CMD_READ | wire::CMD_WRITE, n) if n <= MAX_PAYLOAD => n,
            _ => 0,
        };
        let permit = match shared.budget.try_take(held) {
            Some(p) => p,
            None => {
                on(Event::Flush);
                let p = shared.budget.take(held);
                r.get_mut()
                    .until(Instant::now() + shared.request, REQUEST_LATE);
                p
            }
        };
        let payload = match req.payload_len() as usize {
            0 if req.kind != wire::CMD_WRITE => Payload::None,
            n if n > MAX_PAYLOAD => {
                // The client broke the advertised limit; keep the stream framed and refuse,
                // but only a payload that really arrived whole (else it is cut, as below).
                let skipped = io::copy(&mut r.by_ref().take(n as u64), &mut io::sink())?;
                if skipped < n as u64 {
                    return Err(truncated());
                }
                Payload::Discarded
            }
            n => {
                let mut d = vec![0u8; n];
                r.read_exact(&mut d).map_err(|e| match e.kind() {
                    io::ErrorKind::UnexpectedEof => truncated(),
                    _ => NbdError::Io(e),
                })?;
                Payload::Data(d)
            }
        };
        let pipelined = !r.buffer().is_empty();
        on(Event::Job(
            Job {
                req,
                payload,
                _permit: permit,
            },
            pipelined,
        ));
    }
}

/// Why a connection was cut inside a request.
const REQUEST_LATE: &str =
    "a request did not arrive whole within the request time (a stalled or trickling client)";

/// Executes one request and sends its reply.
pub(super) fn execute<W: Write>(job: Job, export: &Export, replies: &Replies<W>) {
    let Request {
        flags,
        kind,
        cookie,
        offset,
        len,
    } = job.req;
    let name = wire::command_name(kind);
    metrics::counter!("hydramem_nbd_requests_total", "cmd" => name).increment(1);
    let Some(allowed) = allowed_flags(kind, replies.structured) else {
        let msg = format!("unknown command type {kind}");
        return fail(replies, cookie, name, wire::EINVAL, &msg);
    };
    if flags & !allowed != 0 {
        let msg = format!("command flags {flags:#x} are not valid for {name}");
        return fail(replies, cookie, name, wire::EINVAL, &msg);
    }
    let r = match (kind, job.payload) {
        (wire::CMD_READ, _) if len as usize > MAX_PAYLOAD => {
            let msg = format!("read of {len} bytes exceeds the maximum payload of {MAX_PAYLOAD}");
            return fail(replies, cookie, name, wire::EINVAL, &msg);
        }
        (wire::CMD_READ, _) => {
            let mut buf = vec![0u8; len as usize];
            match export.read(offset, &mut buf) {
                Ok(()) => {
                    metrics::counter!("hydramem_nbd_bytes_total", "dir" => "read")
                        .increment(len as u64);
                    return replies.data(cookie, offset, &buf);
                }
                Err(e) => Err(e),
            }
        }
        (wire::CMD_WRITE, Payload::Discarded) => {
            let msg = format!("write of {len} bytes exceeds the maximum payload of {MAX_PAYLOAD}");
            return fail(replies, cookie, name, wire::EINVAL, &msg);
        }
        (wire::CMD_WRITE, Payload::Data(d)) => export.write(offset, &d).inspect(|()| {
            metrics::counter!("hydramem_nbd_bytes_total", "dir" => "write").increment(len as u64)
        }),
        // NO_HOLE asks for the zeros to be stored: never discarded.
        (wire::CMD_WRITE_ZEROES, _) if flags & wire::CMD_FLAG_NO_HOLE != 0 => {
            export.zero(offset, len as u64)
        }
        (wire::CMD_TRIM | wire::CMD_WRITE_ZEROES, _) => export.trim(offset, len as u64),
        // FLUSH: every write already replied to is acknowledged by the remote memory.
        _ => Ok(()),
    };
    match r {
        Ok(()) => replies.done(cookie),
        Err(e) => reply_error(replies, &job.req, e),
    }
}

/// Replies `error` to a request and counts it.
fn fail<W: Write>(replies: &Replies<W>, cookie: u64, cmd: &'static str, error: u32, msg: &str) {
    metrics::counter!("hydramem_nbd_errors_total", "cmd" => cmd).increment(1);
    tracing::debug!(cmd, error, msg, "NBD request refused");
    replies.error(cookie, error, msg);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{IoError, Page};
    use crate::nbd::export::{MemStore, PageStore, PendingPages};
    use crate::nbd::handshake::transmission_flags;
    use crate::nbd::wire::*;
    use std::sync::atomic::AtomicUsize;

    fn req(kind: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
        Request {
            flags,
            kind,
            cookie,
            offset,
            len,
        }
        .to_bytes()
        .to_vec()
    }

    /// Reply bytes, shared with the test that reads them.
    #[derive(Clone, Default)]
    pub(crate) struct Out(pub(crate) Arc<Mutex<Vec<u8>>>);

    impl Write for Out {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn shared(workers: usize) -> Shared {
        Shared::new(workers, &Limits::default())
    }

    fn reader(input: &[u8]) -> BufReader<Deadlined<&[u8]>> {
        BufReader::new(Deadlined::new(input))
    }

    /// Serves `input` on a fresh 64 KiB export and returns the end and the reply bytes.
    fn run(input: &[u8], structured: bool, workers: usize) -> (Result<End, NbdError>, Vec<u8>) {
        let export = Arc::new(Export::new(MemStore::new(65536, Default::default()), 65536));
        let neg = Negotiated {
            structured,
            flags: transmission_flags(structured),
        };
        let out = Out::default();
        let r = serve(
            &mut reader(input),
            out.clone(),
            &export,
            neg,
            &shared(workers),
            || false,
        );
        let bytes = out.0.lock().clone();
        (r, bytes)
    }

    /// Simple replies in `b`: (error, cookie, data) given the read lengths by cookie.
    fn simple(mut b: &[u8], read_len: impl Fn(u64) -> usize) -> Vec<(u32, u64, Vec<u8>)> {
        let mut v = Vec::new();
        while !b.is_empty() {
            assert_eq!(b[..4], SIMPLE_REPLY_MAGIC.to_be_bytes());
            let err = u32::from_be_bytes(b[4..8].try_into().unwrap());
            let cookie = u64::from_be_bytes(b[8..16].try_into().unwrap());
            let n = if err == 0 { read_len(cookie) } else { 0 };
            v.push((err, cookie, b[16..16 + n].to_vec()));
            b = &b[16 + n..];
        }
        v
    }

    /// Structured chunks in `b`: (header, payload).
    fn chunks(mut b: &[u8]) -> Vec<(ChunkHeader, Vec<u8>)> {
        let mut v = Vec::new();
        while !b.is_empty() {
            let h = ChunkHeader::parse(b[..CHUNK_HEADER_LEN].try_into().unwrap()).unwrap();
            let end = CHUNK_HEADER_LEN + h.len as usize;
            v.push((h, b[CHUNK_HEADER_LEN..end].to_vec()));
            b = &b[end..];
        }
        v
    }

    #[test]
    fn write_then_read_unaligned_with_simple_replies() {
        let mut inp = req(CMD_WRITE, CMD_FLAG_FUA, 1, 4000, 200);
        inp.extend_from_slice(&[7u8; 200]);
        inp.extend(req(CMD_READ, 0, 2, 3990, 220));
        inp.extend(req(CMD_FLUSH, 0, 3, 0, 0));
        inp.extend(req(CMD_DISC, 0, 4, 0, 0));
        inp.extend(req(CMD_READ, 0, 5, 0, 1)); // after DISC: never read
        let (r, out) = run(&inp, false, 1);
        assert_eq!(r.unwrap(), End::Disconnect);
        let rs = simple(&out, |c| if c == 2 { 220 } else { 0 });
        assert_eq!(rs.len(), 3);
        assert_eq!((rs[0].0, rs[0].1), (0, 1));
        let mut want = vec![0u8; 220];
        want[10..210].fill(7);
        assert_eq!(rs[1], (0, 2, want));
        assert_eq!((rs[2].0, rs[2].1), (0, 3));
    }

    #[test]
    fn pipelined_whole_page_requests_are_served_as_batches() {
        // 16 pipelined 4 KiB writes and a partial write (of a page none of them touches: the
        // protocol orders nothing among requests in flight together, and a batch and a
        // partial write go to different workers) that goes alone; then, on a second
        // connection, 16 pipelined reads and a read of the partial page: every reply right,
        // and the pages of the pipelined requests went to the store in list calls.
        let store = MemStore::new(1 << 20, Default::default());
        let export = Arc::new(Export::new(store.clone(), 1 << 20));
        let page = |i: u64| vec![i as u8 + 1; 4096];
        let neg = Negotiated {
            structured: false,
            flags: transmission_flags(false),
        };
        let workers = shared(4);
        let serve_all = |inp: &[u8]| {
            let out = Out::default();
            let end = serve(
                &mut reader(inp),
                out.clone(),
                &export,
                neg,
                &workers,
                || false,
            );
            assert_eq!(end.unwrap(), End::Disconnect);
            let bytes = out.0.lock().clone();
            bytes
        };
        let partial_page = 3 * 8192 + 4096; // an odd page: no whole-page write touches it
        let mut inp = Vec::new();
        for i in 0..16u64 {
            inp.extend(req(CMD_WRITE, 0, i, i * 8192, 4096));
            inp.extend(page(i));
        }
        inp.extend(req(CMD_WRITE, 0, 101, partial_page + 5, 10)); // partial: not batched
        inp.extend_from_slice(&[0xEE; 10]);
        inp.extend(req(CMD_DISC, 0, 999, 0, 0));
        let rs = simple(&serve_all(&inp), |_| 0);
        assert_eq!(rs.len(), 16 + 1);
        assert!(rs.iter().all(|r| r.0 == 0), "{rs:?}");
        let mut inp = Vec::new();
        for i in 0..16u64 {
            inp.extend(req(CMD_READ, 0, 200 + i, i * 8192, 4096));
        }
        inp.extend(req(CMD_READ, 0, 300, partial_page, 4096));
        inp.extend(req(CMD_DISC, 0, 999, 0, 0));
        let rs = simple(&serve_all(&inp), |_| 4096);
        assert_eq!(rs.len(), 17);
        for (err, cookie, data) in rs {
            assert_eq!(err, 0, "request {cookie}");
            let want = if cookie == 300 {
                let mut w = vec![0u8; 4096];
                w[5..15].fill(0xEE);
                w
            } else {
                page(cookie - 200)
            };
            assert!(data == want, "read of request {cookie}");
        }
        assert!(store.lists() >= 2, "{} list calls", store.lists());
    }

    /// A store whose started READs all fail when ended; it notes the threads that read.
    struct FailedSubmissions {
        inner: Arc<MemStore>,
        readers: Mutex<Vec<String>>,
    }

    struct Failed;

    impl PendingPages for Failed {
        fn wait(self: Box<Self>) -> Result<Box<[Page]>, IoError> {
            Err(IoError::Again {
                what: "read",
                addr: 0,
                why: "the test store fails every submission",
            })
        }
    }

    impl FailedSubmissions {
        fn note(&self) {
            let me = std::thread::current().name().unwrap_or("").to_string();
            self.readers.lock().push(me);
        }
    }

    impl PageStore for FailedSubmissions {
        fn read_page(&self, addr: u64, page: &mut Page) -> Result<(), IoError> {
            self.note();
            self.inner.read_page(addr, page)
        }
        fn write_page(&self, addr: u64, page: &Page) -> Result<(), IoError> {
            self.inner.write_page(addr, page)
        }
        fn read_list(&self, list: &mut [(u64, &mut Page)]) -> Result<(), IoError> {
            self.note();
            self.inner.read_list(list)
        }
        fn submit_read<'s>(
            &'s self,
            _addrs: Vec<u64>,
        ) -> Result<Box<dyn PendingPages + 's>, IoError> {
            Ok(Box::new(Failed))
        }
    }

    #[test]
    fn reads_whose_submission_failed_are_read_again_by_a_worker_not_the_completer() {
        // The completer must never read itself: a read waits for the client's slots, and the
        // READs queued behind it hold slots that only it gives back.
        let inner = MemStore::new(1 << 20, Default::default());
        for i in 0..256u64 {
            inner.write_page(i * 4096, &[i as u8; 4096]).unwrap();
        }
        let store = Arc::new(FailedSubmissions {
            inner,
            readers: Mutex::new(Vec::new()),
        });
        let export = Arc::new(Export::new(store.clone(), 1 << 20));
        let neg = Negotiated {
            structured: false,
            flags: transmission_flags(false),
        };
        // Two full batches of pipelined READs go to the completer.
        let mut inp = Vec::new();
        for i in 0..130u64 {
            inp.extend(req(CMD_READ, 0, i, (i % 256) * 4096, 4096));
        }
        inp.extend(req(CMD_DISC, 0, 999, 0, 0));
        let out = Out::default();
        let end = serve(
            &mut reader(&inp),
            out.clone(),
            &export,
            neg,
            &shared(4),
            || false,
        );
        assert_eq!(end.unwrap(), End::Disconnect);
        let rs = simple(&out.0.lock(), |_| 4096);
        assert_eq!(rs.len(), 130);
        for (err, cookie, data) in rs {
            assert_eq!(err, 0, "request {cookie}");
            assert!(data == vec![cookie as u8; 4096], "read of request {cookie}");
        }
        let readers = store.readers.lock();
        assert!(
            readers.iter().all(|t| t != "nbd-completer"),
            "the completer read: {readers:?}"
        );
        assert!(
            readers.iter().any(|t| t.starts_with("nbd-worker")),
            "no worker read again: {readers:?}"
        );
    }

    #[test]
    fn bad_requests_get_einval_and_the_connection_goes_on() {
        let mut inp = req(CMD_READ, 0, 1, 65535, 2); // past the end
        inp.extend(req(CMD_WRITE, 0, 2, 65535, 2));
        inp.extend_from_slice(&[1, 2]);
        inp.extend(req(99, 0, 3, 0, 0)); // unknown command
        inp.extend(req(CMD_WRITE_ZEROES, 1 << 4, 4, 0, 1)); // FAST_ZERO not offered
        inp.extend(req(CMD_READ, CMD_FLAG_DF, 5, 0, 1)); // DF needs structured replies
        inp.extend(req(CMD_WRITE, 0, 6, 0, MAX_PAYLOAD as u32 + 1));
        inp.extend(vec![0u8; MAX_PAYLOAD + 1]);
        inp.extend(req(CMD_TRIM, 0, 7, u64::MAX, 2)); // offset + len overflows
        inp.extend(req(CMD_READ, 0, 8, 65535, 1)); // the last byte: fine
        let (r, out) = run(&inp, false, 1);
        assert_eq!(r.unwrap(), End::Closed);
        let rs = simple(&out, |c| if c == 8 { 1 } else { 0 });
        let errs: Vec<(u32, u64)> = rs.iter().map(|r| (r.0, r.1)).collect();
        assert_eq!(
            errs,
            [
                (EINVAL, 1),
                (EINVAL, 2),
                (EINVAL, 3),
                (EINVAL, 4),
                (EINVAL, 5),
                (EINVAL, 6),
                (EINVAL, 7),
                (0, 8)
            ]
        );
    }

    #[test]
    fn structured_replies_with_a_worker_pool() {
        let mut inp = Vec::new();
        for i in 0..16u64 {
            inp.extend(req(CMD_WRITE, 0, i, i * 4096 + 1, 4095));
            inp.extend(vec![i as u8 + 1; 4095]);
        }
        let (r, out) = run(&inp, true, 4);
        assert_eq!(r.unwrap(), End::Closed);
        let cs = chunks(&out);
        assert_eq!(cs.len(), 16);
        let mut cookies: Vec<u64> = cs.iter().map(|c| c.0.cookie).collect();
        cookies.sort();
        assert_eq!(cookies, (0..16).collect::<Vec<_>>());
        assert!(cs
            .iter()
            .all(|c| c.0.kind == REPLY_TYPE_NONE && c.0.flags == REPLY_FLAG_DONE));

        let mut inp = req(CMD_READ, CMD_FLAG_DF, 9, 100, 50);
        inp.extend(req(CMD_READ, 0, 10, 65500, 100));
        inp.extend(req(CMD_READ, 0, 11, 0, 0));
        let (_, out) = run(&inp, true, 1);
        let cs = chunks(&out);
        assert_eq!(cs[0].0.kind, REPLY_TYPE_OFFSET_DATA);
        assert_eq!(cs[0].1.len(), 58);
        assert_eq!(cs[0].1[..8], 100u64.to_be_bytes());
        assert_eq!(cs[1].0.kind, REPLY_TYPE_ERROR);
        assert_eq!(cs[1].1[..4], EINVAL.to_be_bytes());
        let msg_len = u16::from_be_bytes([cs[1].1[4], cs[1].1[5]]) as usize;
        assert!(String::from_utf8_lossy(&cs[1].1[6..6 + msg_len]).contains("beyond the end"));
        assert_eq!(cs[2].0.kind, REPLY_TYPE_NONE);
    }

    #[test]
    fn broken_framing_ends_the_connection_after_replying_to_what_was_read() {
        let mut inp = req(CMD_WRITE, 0, 1, 0, 3);
        inp.extend_from_slice(&[1, 2, 3]);
        inp.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        inp.extend(vec![0u8; 24]);
        let (r, out) = run(&inp, false, 2);
        assert!(matches!(r, Err(NbdError::Wire(_))));
        assert_eq!(simple(&out, |_| 0), [(0, 1, vec![])]);

        let mut cut = req(CMD_WRITE, 0, 1, 0, 100);
        cut.extend_from_slice(&[0; 50]);
        assert!(matches!(
            run(&cut, false, 1).0,
            Err(NbdError::TruncatedPayload { .. })
        ));
    }

    #[test]
    fn an_oversized_write_cut_short_ends_the_connection_unanswered() {
        // Found by fuzzing: the payload of a write over the maximum was skipped without
        // checking that it all arrived, so a cut one was answered EINVAL as if whole and the
        // connection "closed" cleanly instead of failing like any cut payload.
        let mut inp = req(CMD_FLUSH, 0, 1, 0, 0);
        inp.extend(req(CMD_WRITE, 0, 2, 0, MAX_PAYLOAD as u32 + 1));
        inp.extend_from_slice(&[0; 16]);
        let (r, out) = run(&inp, false, 1);
        assert!(matches!(
            r,
            Err(NbdError::TruncatedPayload { len, .. }) if len == MAX_PAYLOAD as u32 + 1
        ));
        assert_eq!(simple(&out, |_| 0), [(0, 1, vec![])]);
    }

    proptest::proptest! {
        /// Any bytes after the handshake: the server replies, ends or refuses, never panics.
        #[test]
        fn arbitrary_requests_never_panic(
            reqs in proptest::collection::vec((0u16..10, proptest::prelude::any::<u16>(), 0u64..70_000, 0u32..10_000), 0..12),
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            structured: bool,
        ) {
            let mut inp = Vec::new();
            for (i, (kind, flags, offset, len)) in reqs.into_iter().enumerate() {
                inp.extend(req(kind, flags, i as u64, offset, len));
                if kind == CMD_WRITE {
                    inp.extend(vec![0xab; len as usize]);
                }
            }
            inp.extend(tail);
            let _ = run(&inp, structured, 2);
        }
    }

    #[test]
    fn workers_have_exited_when_the_pool_is_dropped() {
        // Found by fuzzing (LeakSanitizer saw a worker's thread-local destructor list alive
        // after serve returned): a join that does not wait for thread-local destructors let
        // workers outlive their pool. Here every worker that ran a write holds a
        // thread-local whose destructor takes 50 ms; all must have run once the pool is gone.
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        static ENDED: AtomicUsize = AtomicUsize::new(0);
        struct Mark;
        impl Drop for Mark {
            fn drop(&mut self) {
                std::thread::sleep(std::time::Duration::from_millis(50));
                ENDED.fetch_add(1, Ordering::SeqCst);
            }
        }
        thread_local! {
            static MARK: Mark = {
                STARTED.fetch_add(1, Ordering::SeqCst);
                Mark
            };
        }
        struct Marking(Arc<MemStore>);
        impl PageStore for Marking {
            fn read_page(&self, addr: u64, page: &mut crate::client::Page) -> Result<(), IoError> {
                self.0.read_page(addr, page)
            }
            fn write_page(&self, addr: u64, page: &crate::client::Page) -> Result<(), IoError> {
                let name = std::thread::current().name().map(str::to_owned);
                if name.is_some_and(|n| n.starts_with("nbd-worker")) {
                    MARK.with(|_| ());
                }
                self.0.write_page(addr, page)
            }
        }
        let store = Arc::new(Marking(MemStore::new(65536, Default::default())));
        let export = Arc::new(Export::new(store, 65536));
        let neg = Negotiated {
            structured: true,
            flags: transmission_flags(true),
        };
        // Writes of part of a page: not batched, so each goes to a worker.
        let mut inp = Vec::new();
        for i in 0..16u64 {
            inp.extend(req(CMD_WRITE, 0, i, i * 4096, 4000));
            inp.extend(vec![1; 4000]);
        }
        let workers = shared(4);
        serve(
            &mut reader(&inp),
            Vec::new(),
            &export,
            neg,
            &workers,
            || false,
        )
        .unwrap();
        // The pool is the server's: its workers exit when it is dropped, and not before.
        drop(workers);
        let started = STARTED.load(Ordering::SeqCst);
        assert!(started > 0, "no worker ran a write");
        assert_eq!(ENDED.load(Ordering::SeqCst), started);
    }

    #[test]
    fn trim_and_write_zeroes_may_discard_but_not_with_no_hole() {
        // A store that discards, and records which pages it was asked to.
        struct Discarding(Arc<MemStore>, Mutex<Vec<u64>>);
        impl PageStore for Discarding {
            fn read_page(&self, addr: u64, page: &mut crate::client::Page) -> Result<(), IoError> {
                if self.1.lock().contains(&addr) {
                    page.fill(0);
                    return Ok(());
                }
                self.0.read_page(addr, page)
            }
            fn write_page(&self, addr: u64, page: &crate::client::Page) -> Result<(), IoError> {
                self.0.write_page(addr, page)
            }
            fn discard(&self, addrs: &[u64]) -> bool {
                self.1.lock().extend(addrs);
                true
            }
        }
        let inner = MemStore::new(65536, Default::default());
        let store = Arc::new(Discarding(inner.clone(), Mutex::new(Vec::new())));
        let export = Arc::new(Export::new(store.clone(), 65536));
        let neg = Negotiated {
            structured: true,
            flags: transmission_flags(true),
        };
        let mut inp = req(CMD_WRITE, 0, 1, 0, 65536);
        inp.extend(vec![7; 65536]);
        inp.extend(req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 2, 0, 4 * 4096));
        inp.extend(req(CMD_WRITE_ZEROES, 0, 3, 4 * 4096, 4 * 4096));
        inp.extend(req(CMD_TRIM, 0, 4, 8 * 4096, 4 * 4096));
        let inline = shared(1);
        serve(&mut reader(&inp), Vec::new(), &export, neg, &inline, || {
            false
        })
        .unwrap();
        let asked = store.1.lock().clone();
        let want: Vec<u64> = (4..12).map(|p| p * 4096).collect();
        assert_eq!(asked, want, "pages 4..12 discarded, 0..4 (NO_HOLE) written");
        assert_eq!(
            inner.writes(),
            16 + 4,
            "the write's 16 pages, then 4 zero pages"
        );
        let mut back = vec![1u8; 65536];
        export.read(0, &mut back).unwrap();
        assert!(back[..12 * 4096].iter().all(|&b| b == 0));
        assert!(back[12 * 4096..].iter().all(|&b| b == 7));
    }

    #[test]
    fn multi_conn_is_safe_because_writes_share_the_export() {
        // Two "connections" (two serve calls on one export) write the two halves of one page
        // at once; the page holds both.
        let export = Arc::new(Export::new(
            MemStore::new(8192, std::time::Duration::from_millis(3)),
            8192,
        ));
        let neg = Negotiated {
            structured: false,
            flags: 0,
        };
        let hs: Vec<_> = [0u64, 2048]
            .into_iter()
            .map(|half| {
                let export = export.clone();
                std::thread::spawn(move || {
                    let mut inp = req(CMD_WRITE, 0, 1, 4096 + half, 2048);
                    inp.extend(vec![1 + (half / 2048) as u8; 2048]);
                    let inline = shared(1);
                    serve(&mut reader(&inp), Vec::new(), &export, neg, &inline, || {
                        false
                    })
                    .unwrap();
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        let mut page = vec![0u8; 4096];
        export.read(4096, &mut page).unwrap();
        assert!(page[..2048].iter().all(|&b| b == 1) && page[2048..].iter().all(|&b| b == 2));
    }
}
