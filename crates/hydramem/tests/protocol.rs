//! The node protocol spoken directly: isolation between clients, range checks, and malformed
//! frames that close only their own connection.

mod common;

use std::io::Write;

use common::Raw;
use hydramem::wire::{self, ClientId, Entry, Op, Status};

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
        writev(&mut ra, slab, u64::MAX - 511, &[1; 512]),
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
        // A WRITEV whose entry claims more data than the frame holds.
        {
            let mut b = 1u32.to_le_bytes().to_vec();
            Entry {
                slab: 0,
                len: 4000,
                offset: 0,
                cookie: 1,
                version: 1,
                crc: 0,
            }
            .put(&mut b);
            let mut f = Vec::new();
            let fb = wire::FrameBuilder::begin(&mut f, Op::WriteV, false, Status::Ok, 1);
            f.extend_from_slice(&b);
            fb.finish(&mut f).unwrap();
            f
        },
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
    let stats = hydramem::status::fetch(addr, std::time::Duration::from_secs(5)).unwrap();
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
    let stats = hydramem::status::fetch(addr, std::time::Duration::from_secs(5)).unwrap();
    assert_eq!(stats.corrupt_reported, 13);

    // Only an identified client may report.
    let mut anon = Raw::connect(addr);
    assert_eq!(
        anon.call(Op::Corrupt, &body(&[report(sa, 1)])).0.status,
        Status::NotIdentified
    );
}
