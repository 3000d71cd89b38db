//! Batches of pipelined requests: READs, or WRITEs, of whole pages that a client sent one
//! behind the other, executed as one unit with all their pages in flight together.
//!
//! The kernel at queue depth 16 sends 16 single-page swap-ins at once; served one by one,
//! each page's splits are a frame to each node. Gathered, the pages of all 16 reach each node
//! in one frame ([`Export::read_many`], [`Export::write_many`]).
//!
//! Invariants: a batch holds requests of one kind (READ or WRITE with its data) with valid
//! flags, each covering whole pages inside the export, at most [`BATCH_REQUESTS`] requests and
//! [`BATCH_BYTES`] bytes; each request of a batch gets exactly one reply, as it would alone
//! (the export answers each request's outcome separately).

use std::io::Write;

use super::export::{Export, SubmittedReads};
use super::transmission::{allowed_flags, reply_error, Job, Payload, Replies};
use super::wire;

/// Most bytes of page data one batch of pipelined requests carries (the client's window).
pub(super) const BATCH_BYTES: u64 = 1 << 20;
/// Most requests in one batch.
pub(super) const BATCH_REQUESTS: usize = 64;

/// What a worker executes: one request, or a batch of pipelined requests of one kind (READs
/// or WRITEs of whole pages) whose pages all go in flight together.
pub(super) enum Work {
    /// A request on its own.
    One(Job),
    /// Requests executed together.
    Batch(Vec<Job>),
}

/// Pipelined requests gathered into one [`Work::Batch`]: READs or WRITEs (one kind per batch)
/// of whole pages inside the export, with valid flags, up to [`BATCH_REQUESTS`] requests and
/// [`BATCH_BYTES`] bytes.
#[derive(Default)]
pub(super) struct Batch {
    jobs: Vec<Job>,
    bytes: u64,
}

impl Work {
    /// `jobs` (at least one) as work: a lone request as itself.
    pub(super) fn of(mut jobs: Vec<Job>) -> Work {
        match jobs.len() {
            1 => Work::One(jobs.pop().expect("one job")),
            _ => Work::Batch(jobs),
        }
    }
}

impl Batch {
    /// Whether `job` may join this batch.
    pub(super) fn takes(&self, job: &Job, export: &Export, structured: bool) -> bool {
        let r = &job.req;
        let kind_ok = matches!(
            (r.kind, &job.payload),
            (wire::CMD_READ, _) | (wire::CMD_WRITE, Payload::Data(_))
        );
        kind_ok
            && allowed_flags(r.kind, structured).is_some_and(|a| r.flags & !a == 0)
            && export.whole_pages(r.offset, r.len.into())
            && self.jobs.first().is_none_or(|f| f.req.kind == r.kind)
            && self.jobs.len() < BATCH_REQUESTS
            && self.bytes + u64::from(r.len) <= BATCH_BYTES
    }

    /// Whether `work` is READs of whole pages that [`submit_reads`] can start without
    /// waiting.
    pub(super) fn submittable(work: &Work, export: &Export, structured: bool) -> bool {
        match work {
            Work::One(job) => {
                Batch::default().takes(job, export, structured) && job.req.kind == wire::CMD_READ
            }
            Work::Batch(jobs) => jobs[0].req.kind == wire::CMD_READ,
        }
    }

    pub(super) fn push(&mut self, job: Job) {
        self.bytes += u64::from(job.req.len);
        self.jobs.push(job);
    }

    pub(super) fn full(&self) -> bool {
        self.jobs.len() >= BATCH_REQUESTS || self.bytes >= BATCH_BYTES
    }

    /// The gathered work, if any: a lone request as itself.
    pub(super) fn take(&mut self) -> Option<Work> {
        self.bytes = 0;
        let jobs = std::mem::take(&mut self.jobs);
        (!jobs.is_empty()).then(|| Work::of(jobs))
    }
}

/// Executes a batch ([`Batch`]: whole-page READs or WRITEs with valid flags) with all its pages
/// in flight at once, and replies to each request.
pub(super) fn execute_batch<W: Write>(jobs: Vec<Job>, export: &Export, replies: &Replies<W>) {
    metrics::counter!("hydramem_nbd_batches_total").increment(1);
    metrics::counter!("hydramem_nbd_batched_requests_total").increment(jobs.len() as u64);
    if jobs[0].req.kind == wire::CMD_READ {
        let mut bufs: Vec<Vec<u8>> = jobs.iter().map(|j| vec![0u8; j.req.len as usize]).collect();
        let mut reqs: Vec<(u64, &mut [u8])> = jobs
            .iter()
            .zip(bufs.iter_mut())
            .map(|(j, b)| (j.req.offset, &mut b[..]))
            .collect();
        let results = export.read_many(&mut reqs);
        drop(reqs);
        for ((job, buf), r) in jobs.iter().zip(&bufs).zip(results) {
            let (cookie, offset) = (job.req.cookie, job.req.offset);
            let cmd = wire::command_name(wire::CMD_READ);
            metrics::counter!("hydramem_nbd_requests_total", "cmd" => cmd).increment(1);
            match r {
                Ok(()) => {
                    metrics::counter!("hydramem_nbd_bytes_total", "dir" => "read")
                        .increment(buf.len() as u64);
                    replies.data(cookie, offset, buf);
                }
                Err(e) => reply_error(replies, &job.req, e),
            }
        }
    } else {
        let reqs: Vec<(u64, &[u8])> = jobs
            .iter()
            .map(|j| match &j.payload {
                Payload::Data(d) => (j.req.offset, &d[..]),
                // `Batch::takes` admits WRITEs with their data only.
                Payload::None | Payload::Discarded => (j.req.offset, &[][..]),
            })
            .collect();
        let results = export.write_many(&reqs);
        for ((job, (_, d)), r) in jobs.iter().zip(&reqs).zip(results) {
            let cmd = wire::command_name(wire::CMD_WRITE);
            metrics::counter!("hydramem_nbd_requests_total", "cmd" => cmd).increment(1);
            match r {
                Ok(()) => {
                    metrics::counter!("hydramem_nbd_bytes_total", "dir" => "write")
                        .increment(d.len() as u64);
                    replies.done(job.req.cookie);
                }
                Err(e) => reply_error(replies, &job.req, e),
            }
        }
    }
}

/// Starts the READs of `work` (see [`Batch::submittable`]) with all their pages in flight and
/// returns at once: the connection's completer ends them ([`complete_reads`]). Gives the work
/// back if the export cannot start them (it then runs as any other).
pub(super) fn submit_reads(
    work: Work,
    export: &Export,
) -> Result<(SubmittedReads<'_>, Vec<Job>), Work> {
    let jobs = match work {
        Work::One(job) => vec![job],
        Work::Batch(jobs) => jobs,
    };
    let reqs: Vec<(u64, u64)> = jobs
        .iter()
        .map(|j| (j.req.offset, u64::from(j.req.len)))
        .collect();
    match export.submit_reads(&reqs) {
        Ok(sub) => Ok((sub, jobs)),
        Err(_) if jobs.len() == 1 => Err(Work::One(jobs.into_iter().next().expect("one"))),
        Err(_) => Err(Work::Batch(jobs)),
    }
}

/// Ends READs started by [`submit_reads`] and replies to each, straight from the pages read.
/// If they failed, gives the jobs back unanswered: each is then read again on its own, so
/// that each gets its own outcome, by a thread that may wait for the client's slots (the
/// completer may not: the slots it would wait for may be held by the READs queued behind
/// it, which only it ends).
pub(super) fn complete_reads<W: Write>(
    sub: SubmittedReads<'_>,
    jobs: Vec<Job>,
    replies: &Replies<W>,
) -> Result<(), Vec<Job>> {
    if jobs.len() > 1 {
        metrics::counter!("hydramem_nbd_batches_total").increment(1);
        metrics::counter!("hydramem_nbd_batched_requests_total").increment(jobs.len() as u64);
    }
    let pages = match sub.wait() {
        Ok(pages) => pages,
        Err(_) => return Err(jobs),
    };
    let mut bytes = pages.as_flattened();
    for job in jobs {
        let (data, rest) = bytes.split_at(job.req.len as usize);
        bytes = rest;
        let cmd = wire::command_name(wire::CMD_READ);
        metrics::counter!("hydramem_nbd_requests_total", "cmd" => cmd).increment(1);
        metrics::counter!("hydramem_nbd_bytes_total", "dir" => "read").increment(data.len() as u64);
        replies.data(job.req.cookie, job.req.offset, data);
    }
    Ok(())
}
