//! The node protocol spoken directly: isolation between clients, range checks, and malformed
//! frames that close only their own connection.

mod common;

use std::io::Write;

use common::Raw;
use hydramem::wire::{self, ClientId, Op, Status};

/// A frame of `op` with one run (slab 0) of `n` splits of `split_len` bytes at `offset`,
/// followed by `rest` zero bytes: written byte by byte, to send what a well-behaved sender
/// cannot build.
fn run_frame(op: Op, split_len: u32, offset: u64, n: u32, rest: usize) -> Vec<u8> {
    let mut f = Vec::new();
    let fb = wire::FrameBuilder::begin(&mut f, op, false, Status::Ok, 1);
    for v in [1u32, 0, split_len] {
        f.extend_from_slice(&v.to_le_bytes()); // count, slab, split_len
    }
    f.extend_from_slice(&offset.to_le_bytes());
    f.extend_from_slice(&n.to_le_bytes());
    f.resize(f.len() + rest, 0);
    fb.finish(&mut f).unwrap();
    f
}

fn readv(raw: &mut Raw, slab: u32, offset: u64, len: u32) -> (Status, Vec<u8>) {
    readv_versioned(raw, slab, offset, len).0
}

/// One READV entry; returns (status, data) and the version the node stored.
fn readv_versioned(raw: &mut Raw, slab: u32, offset: u64, len: u32) -> ((Status, Vec<u8>), u64) {
    let (st, data, version) = raw.read_split(slab, offset, len);
    ((st, data), version)
}

fn writev(raw: &mut Raw, slab: u32, offset: u64, data: &[u8]) -> Status {
    raw.write_split(slab, offset, data, 1)
}

#[test]
fn slabs_are_private_zeroed_and_range_checked() {
    let c = common::cluster(1, 1 << 20, 4);
    let addr = c.cluster().nodes[0].addr;
    let (a, b) = (ClientId::random(), ClientId::random());
    let mut ra = Raw::connect(addr);
    ra.hello(a);
    let alloc = [&1u64.to_le_bytes()[..], &512u32.to_le_bytes()].concat();
    let (h, body) = ra.call(Op::Alloc, &alloc);
    assert_eq!(h.status, Status::Ok);
    let slab = u32::from_le_bytes(body.try_into().unwrap());
    let (st, data) = readv(&mut ra, slab, 0, 512);
    assert_eq!(st, Status::Ok);
    assert!(data.iter().all(|x| *x == 0), "fresh slab not zeroed");
    assert_eq!(writev(&mut ra, slab, 4096, &[0xAB; 512]), Status::Ok);

    // Another identity can neither read, write nor free it.
    let mut rb = Raw::connect(addr);
    rb.hello(b);
    assert_eq!(readv(&mut rb, slab, 4096, 512).0, Status::NoSuchSlab);
    assert_eq!(writev(&mut rb, slab, 0, &[1; 8]), Status::NoSuchSlab);
    assert_eq!(
        rb.call(Op::Free, &slab.to_le_bytes()).0.status,
        Status::NoSuchSlab
    );
    assert!(wire::parse_list(&rb.call(Op::List, &[]).1)
        .unwrap()
        .is_empty());

    // Out of range and misaligned accesses are error replies; the connection stays usable.
    assert_eq!(readv(&mut ra, slab, 1 << 20, 512).0, Status::OutOfRange);
    assert_eq!(
        writev(&mut ra, slab, u64::MAX - 1023, &[1; 512]),
        Status::OutOfRange
    );
    assert_eq!(readv(&mut ra, slab, 100, 512).0, Status::BadRequest);
    assert_eq!(writev(&mut ra, slab, 0, &[1; 64]), Status::BadRequest);
    assert_eq!(readv(&mut ra, slab, 4096, 512).1, vec![0xAB; 512]);

    // Versions: a newer write replaces, an older one is refused and changes nothing.
    assert_eq!(ra.write_split(slab, 512, &[5; 512], 50), Status::Ok);
    assert_eq!(ra.write_split(slab, 512, &[3; 512], 30), Status::Stale);
    let got = readv_versioned(&mut ra, slab, 512, 512);
    assert_eq!(got, ((Status::Ok, vec![5; 512]), 50));
    // The checksum is stored beside the version and returned with the split; an older write
    // changes neither, a repeated one neither.
    assert_eq!(
        ra.write_stamped(slab, 2048, &[6; 512], 60, 0xC0FFEE),
        Status::Ok
    );
    assert_eq!(
        ra.write_stamped(slab, 2048, &[7; 512], 59, 1),
        Status::Stale
    );
    assert_eq!(ra.write_stamped(slab, 2048, &[8; 512], 60, 2), Status::Ok);
    assert_eq!(
        ra.read_stamped(slab, 2048, 512),
        (Status::Ok, vec![6; 512], 60, 0xC0FFEE)
    );
    assert_eq!(
        readv_versioned(&mut ra, slab, 1024, 512).1,
        0,
        "never written: version 0"
    );

    // DISCARD: the slots read as zeros and as never written again; only the owner may, and
    // only inside the slab. A write after it lands as on a fresh slot.
    let discard = |raw: &mut Raw, slab: u32, first: u64, n: u64| {
        let mut body = Vec::new();
        wire::put_discard(&mut body, slab, first, n);
        raw.call(Op::Discard, &body).0.status
    };
    assert_eq!(ra.write_split(slab, 3072, &[9; 512], 55), Status::Ok);
    assert_eq!(discard(&mut rb, slab, 6, 1), Status::NoSuchSlab);
    assert_eq!(discard(&mut ra, slab, 2047, 2), Status::OutOfRange);
    assert_eq!(discard(&mut ra, slab, u64::MAX, 2), Status::OutOfRange);
    assert_eq!(discard(&mut ra, slab, 6, 1), Status::Ok);
    assert_eq!(
        readv_versioned(&mut ra, slab, 3072, 512),
        ((Status::Ok, vec![0; 512]), 0),
        "discarded: zeros, never written"
    );
    assert_eq!(ra.write_split(slab, 3072, &[4; 512], 1), Status::Ok);
    assert_eq!(readv_versioned(&mut ra, slab, 3072, 512).1, 1);

    // The same identity on a new connection finds the slab again.
    let mut ra2 = Raw::connect(addr);
    ra2.hello(a);
    // LIST names it with its tag and the newest version it holds (60, written above).
    assert_eq!(
        wire::parse_list(&ra2.call(Op::List, &[]).1).unwrap(),
        vec![wire::Listed {
            slab,
            tag: 1,
            newest: 60
        }]
    );

    // Slab operations before HELLO are refused.
    let mut anon = Raw::connect(addr);
    assert_eq!(anon.call(Op::List, &[]).0.status, Status::NotIdentified);
}

#[test]
fn malformed_frames_close_only_their_connection() {
    let c = common::cluster(1, 1 << 20, 4);
    let addr = c.cluster().nodes[0].addr;
    let mut good = Raw::connect(addr);
    good.hello(ClientId::random());
    for garbage in [
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        vec![0xFF; 64],
        // Valid magic and version, absurd length.
        [
            b"HYDM".as_slice(),
            &[1, 0x10, 0, 0],
            &[0; 8],
            &u32::MAX.to_le_bytes(),
        ]
        .concat(),
        // A WRITEV whose run claims more data than the frame holds.
        run_frame(Op::WriteV, 4000, 0, 1, 20),
        // Runs of no splits, of 0-byte splits, and one that reaches past 2^64.
        run_frame(Op::ReadV, 512, 0, 0, 0),
        run_frame(Op::ReadV, 0, 0, 1, 8),
        run_frame(Op::ReadV, 512, u64::MAX - 511, 1, 8),
    ] {
        let mut bad = Raw::connect(addr);
        bad.s.write_all(&garbage).unwrap();
        let mut buf = [0u8; 16];
        use std::io::Read;
        // The node closes the connection: read returns 0 (or an error), never a reply.
        match bad.s.read(&mut buf) {
            Ok(0) | Err(_) => {}
            Ok(n) => panic!("node answered {n} bytes to garbage"),
        }
        // The other connection and the node are unaffected.
        assert_eq!(good.call(Op::Ping, &[]).0.status, Status::Ok);
    }
}

#[test]
fn corrupt_reports_count_on_the_callers_slabs_and_bad_ones_are_refused_with_a_status() {
    use hydramem::wire::{CorruptCause, CorruptReport};
    let c = common::cluster(1, 1 << 20, 4);
    let addr = c.cluster().nodes[0].addr;
    let (a, b) = (ClientId::random(), ClientId::random());
    let mut ra = Raw::connect(addr);
    ra.hello(a);
    let mut rb = Raw::connect(addr);
    rb.hello(b);
    let (sa, sb) = (ra.alloc(512), rb.alloc(512));
    let body = |list: &[CorruptReport]| {
        let mut out = Vec::new();
        wire::put_corrupt(&mut out, list);
        out
    };
    let report = |slab, splits| CorruptReport {
        slab,
        splits,
        cause: CorruptCause::Checksum,
    };

    // a's own slab counts; b's slab counts for the node only (an unknown slab to a).
    let (h, reply) = ra.call(Op::Corrupt, &body(&[report(sa, 4), report(sb, 9)]));
    assert_eq!(h.status, Status::Ok);
    assert_eq!(wire::parse_corrupt_reply(&reply), Ok(1));
    let stats = hydramem::status::fetch(
        addr,
        &hydramem::rpc::Access::open(),
        std::time::Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(stats.corrupt_reported, 13);
    let of = |id| stats.slabs.iter().find(|s| s.slab == id).unwrap().corrupt;
    assert_eq!((of(sa), of(sb)), (4, 0));

    // Bad values are refused as a whole, counted nowhere, and the connection stays usable.
    let mut bad = body(&[report(sa, 1)]);
    bad[12] = 9;
    assert_eq!(ra.call(Op::Corrupt, &bad).0.status, Status::BadRequest);
    assert_eq!(
        ra.call(Op::Corrupt, &body(&[report(sa, 1), report(sa, 0)]))
            .0
            .status,
        Status::BadRequest
    );
    assert_eq!(readv(&mut ra, sa, 0, 512).0, Status::Ok);
    let stats = hydramem::status::fetch(
        addr,
        &hydramem::rpc::Access::open(),
        std::time::Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(stats.corrupt_reported, 13);

    // Only an identified client may report.
    let mut anon = Raw::connect(addr);
    assert_eq!(
        anon.call(Op::Corrupt, &body(&[report(sa, 1)])).0.status,
        Status::NotIdentified
    );
}

#[test]
fn a_run_lands_and_is_served_whole_and_its_splits_are_judged_one_by_one() {
    let c = common::cluster(1, 1 << 20, 4);
    let addr = c.cluster().nodes[0].addr;
    let mut raw = Raw::connect(addr);
    raw.hello(ClientId::random());
    let slab = raw.alloc(512);
    let split = |b: u8| vec![b; 512];
    let (a, b, x, y) = (split(1), split(2), split(3), split(4));

    // Four consecutive slots written as one run, read back as one run and one by one.
    let four: Vec<(u64, u32, &[u8])> = vec![
        (10, 0xC0, &a),
        (10, 0xC1, &b),
        (10, 0xC2, &a),
        (10, 0xC3, &b),
    ];
    assert_eq!(
        raw.write_run(slab, 1024, 512, &four),
        vec![(Status::Ok, 10); 4]
    );
    let (st, stamps, data) = raw.read_run(slab, 1024, 512, 4);
    assert_eq!(st, Status::Ok);
    assert_eq!(stamps, vec![(10, 0xC0), (10, 0xC1), (10, 0xC2), (10, 0xC3)]);
    assert_eq!(data, [&a[..], &b, &a, &b].concat());
    assert_eq!(
        raw.read_split(slab, 1024 + 512, 512),
        (Status::Ok, b.clone(), 10)
    );

    // Versions that differ inside a run: each split gets its own outcome, and only the newer
    // ones change; a repeated version is acknowledged without rewriting.
    let mixed: Vec<(u64, u32, &[u8])> = vec![(11, 1, &x), (9, 2, &y), (0, 3, &y), (10, 4, &y)];
    assert_eq!(
        raw.write_run(slab, 1024, 512, &mixed),
        vec![
            (Status::Ok, 11),
            (Status::Stale, 10),
            (Status::BadRequest, 0),
            (Status::Ok, 10)
        ]
    );
    let (_, stamps, data) = raw.read_run(slab, 1024, 512, 4);
    assert_eq!(stamps, vec![(11, 1), (10, 0xC1), (10, 0xC2), (10, 0xC3)]);
    assert_eq!(data, [&x[..], &b, &a, &b].concat());

    // A run that reaches past the slab, or of another split length, fails as a whole; the
    // connection stays.
    let two: Vec<(u64, u32, &[u8])> = vec![(12, 0, &x), (12, 0, &x)];
    let end = (1 << 20) - 512;
    assert_eq!(
        raw.write_run(slab, end, 512, &two),
        vec![(Status::OutOfRange, 0); 2]
    );
    assert_eq!(raw.read_run(slab, end, 512, 2).0, Status::OutOfRange);
    assert_eq!(raw.read_run(slab, 0, 256, 2).0, Status::BadRequest);
    assert_eq!(
        raw.read_split(slab, end, 512).1,
        vec![0; 512],
        "nothing stored"
    );
}

#[test]
fn runs_whose_reply_would_not_fit_one_frame_are_refused_and_the_others_served() {
    let c = common::cluster(1, 1 << 20, 4);
    let addr = c.cluster().nodes[0].addr;
    let mut raw = Raw::connect(addr);
    raw.hello(ClientId::random());
    let slab = raw.alloc(4096);
    // Five runs of the whole slab (1 MiB each): three fit a 4 MiB reply, two do not.
    let mut body = 5u32.to_le_bytes().to_vec();
    for _ in 0..5 {
        for v in [slab, 4096] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&256u32.to_le_bytes());
        body.extend((0..256u64).flat_map(|c| c.to_le_bytes()));
    }
    let (h, reply) = raw.call(Op::ReadV, &body);
    assert_eq!(h.status, Status::Ok);
    let mut statuses = Vec::new();
    let mut runs = wire::ReplyRuns::new(&reply).unwrap();
    while let Some(run) = runs.next_run().unwrap() {
        assert_eq!((run.n, run.data().len() / 256), (256, run.split_len()));
        statuses.push(run.status);
    }
    assert_eq!(
        statuses,
        [[Status::Ok; 3].as_slice(), &[Status::BadRequest; 2]].concat()
    );
    assert!(reply.len() <= wire::MAX_BODY);
    assert_eq!(raw.call(Op::Ping, &[]).0.status, Status::Ok);
}
