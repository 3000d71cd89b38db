//! The NBD server against real memory node processes on loopback, spoken to by a tiny NBD
//! client written here from the protocol document (independent of the server's own wire
//! module, so that a framing mistake there cannot hide itself).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hydramem::client::{ClientConfig, RemoteMemory};
use hydramem::cluster::Cluster;
use hydramem::nbd::{self, Export, ExportConfig, Listener, Shutdown};

const EINVAL: u32 = 22;
const READ: u16 = 0;
const WRITE: u16 = 1;
const DISC: u16 = 2;
const FLUSH: u16 = 3;
const TRIM: u16 = 4;
const WRITE_ZEROES: u16 = 6;
const FUA: u16 = 1;

/// One cluster of 10 memory nodes for every test of this file. It is started by a thread
/// that never ends, because the nodes die with the thread that spawned them
/// (PR_SET_PDEATHSIG), and they must outlive the test that happens to start them. Never
/// dropped, it could not remove a private directory for its cluster file, so the file lives
/// in cargo's temporary directory for tests instead.
fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("nbd-test-cluster-{}.toml", std::process::id()));
            let c = common::cluster_in(10, common::SLAB, 64, &[], Some(file));
            tx.send(c.cluster().clone()).unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("memory nodes started")
    })
}

/// A running server: its address, its remote memory and its shutdown handle.
struct Server {
    addr: SocketAddr,
    mem: Arc<RemoteMemory>,
    shutdown: Arc<Shutdown>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Serves an export of `size` bytes (hydra 8+2) with `workers` shared by its connections.
    fn start(size: u64, workers: usize) -> Server {
        Server::start_with(size, workers, nbd::Limits::default())
    }

    /// The same within `limits`.
    fn start_with(size: u64, workers: usize, limits: nbd::Limits) -> Server {
        let mem = RemoteMemory::connect(cluster(), ClientConfig::new(common::HYDRA, size))
            .expect("connect to the memory nodes");
        let listener = Listener::tcp("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = Shutdown::new();
        let export = Arc::new(Export::new(mem.clone(), size));
        let config = ExportConfig {
            name: "test".into(),
            description: "integration test".into(),
            workers,
            tls: None,
        };
        let sd = shutdown.clone();
        let thread =
            std::thread::spawn(move || nbd::run(listener, export, config, limits, sd).unwrap());
        Server {
            addr,
            mem,
            shutdown,
            thread: Some(thread),
        }
    }

    fn stop(&mut self) {
        self.shutdown.trigger();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        let _ = self.mem.free_all();
    }
}

/// A minimal NBD client: fixed newstyle, NBD_OPT_GO, simple or structured replies.
struct Client {
    s: TcpStream,
    structured: bool,
    size: u64,
    flags: u16,
    next: u64,
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().unwrap())
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

impl Client {
    fn connect(addr: SocketAddr, structured: bool) -> Client {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT");
        assert_eq!(be16(&g[16..]) & 1, 1, "fixed newstyle");
        s.write_all(&3u32.to_be_bytes()).unwrap(); // fixed newstyle, no zeroes
        let mut c = Client {
            s,
            structured,
            size: 0,
            flags: 0,
            next: 1,
        };
        if structured {
            c.option(8, &[]);
            let (opt, ty, _) = c.option_reply();
            assert_eq!((opt, ty), (8, 1), "STRUCTURED_REPLY acknowledged");
        }
        // GO with the default name, asking for block sizes.
        c.option(7, &[0, 0, 0, 0, 0, 1, 0, 3]);
        let mut block = None;
        loop {
            let (opt, ty, data) = c.option_reply();
            assert_eq!(opt, 7);
            match ty {
                1 => break,
                3 if be16(&data) == 0 => {
                    c.size = be64(&data[2..]);
                    c.flags = be16(&data[10..]);
                }
                3 if be16(&data) == 3 => block = Some((be32(&data[2..]), be32(&data[6..]))),
                3 => {}
                t => panic!(
                    "GO failed with reply type {t:#x}: {}",
                    String::from_utf8_lossy(&data)
                ),
            }
        }
        assert_eq!(block, Some((1, 4096)), "block size constraints");
        c
    }

    fn option(&mut self, opt: u32, data: &[u8]) {
        let mut b = b"IHAVEOPT".to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
    }

    fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(be64(&h), 0x0003_e889_0455_65a9);
        let mut data = vec![0u8; be32(&h[16..]) as usize];
        self.s.read_exact(&mut data).unwrap();
        (be32(&h[8..]), be32(&h[12..]), data)
    }

    /// Sends a request; returns its cookie.
    fn send(&mut self, kind: u16, flags: u16, offset: u64, len: u32, data: &[u8]) -> u64 {
        let cookie = self.next;
        self.next += 1;
        let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
        cookie
    }

    /// Reads one whole reply: (cookie, error, data). `read_len` gives the length of the data
    /// of a successful simple reply to a READ with that cookie (0 for other requests).
    fn reply(&mut self, read_len: impl Fn(u64) -> usize) -> (u64, u32, Vec<u8>) {
        let mut m = [0u8; 4];
        self.s.read_exact(&mut m).unwrap();
        if be32(&m) == 0x6744_6698 {
            assert!(!self.structured, "simple reply after STRUCTURED_REPLY");
            let mut h = [0u8; 12];
            self.s.read_exact(&mut h).unwrap();
            let (err, cookie) = (be32(&h), be64(&h[4..]));
            let mut data = vec![0u8; if err == 0 { read_len(cookie) } else { 0 }];
            self.s.read_exact(&mut data).unwrap();
            return (cookie, err, data);
        }
        assert_eq!(be32(&m), 0x668e_33ef, "reply magic");
        assert!(self.structured, "structured reply without negotiation");
        let (mut data, mut err) = (Vec::new(), 0);
        loop {
            let mut h = [0u8; 16];
            self.s.read_exact(&mut h).unwrap();
            let (flags, ty, cookie) = (be16(&h), be16(&h[2..]), be64(&h[4..]));
            let mut p = vec![0u8; be32(&h[12..]) as usize];
            self.s.read_exact(&mut p).unwrap();
            match ty {
                0 => {}
                1 => data.extend_from_slice(&p[8..]),
                0x8001 => {
                    err = be32(&p);
                    let n = be16(&p[4..]) as usize;
                    assert_eq!(n + 6, p.len(), "error message length");
                }
                t => panic!("unexpected chunk type {t}"),
            }
            if flags & 1 != 0 {
                return (cookie, err, data);
            }
            self.s.read_exact(&mut m).unwrap();
            assert_eq!(be32(&m), 0x668e_33ef, "chunk magic");
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        let c = self.send(WRITE, FUA, offset, data.len() as u32, data);
        let (cookie, err, _) = self.reply(|_| 0);
        assert_eq!(cookie, c);
        err
    }

    fn read(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, u32> {
        let c = self.send(READ, 0, offset, len as u32, &[]);
        let (cookie, err, data) = self.reply(|_| len);
        assert_eq!(cookie, c);
        if err != 0 {
            return Err(err);
        }
        assert_eq!(data.len(), len);
        Ok(data)
    }

    fn command(&mut self, kind: u16, flags: u16, offset: u64, len: u32) -> u32 {
        let c = self.send(kind, flags, offset, len, &[]);
        let (cookie, err, _) = self.reply(|_| 0);
        assert_eq!(cookie, c);
        err
    }

    /// Sends DISC and waits for the server to close.
    fn disconnect(mut self) {
        self.send(DISC, 0, 0, 0, &[]);
        let mut b = [0u8; 1];
        assert_eq!(self.s.read(&mut b).unwrap(), 0, "server closes after DISC");
    }
}

/// Deterministic bytes for (offset, round).
fn pattern(offset: u64, len: usize, round: u8) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((offset + i).wrapping_mul(31) as u8) ^ round)
        .collect()
}

#[test]
fn handshake_flags_and_unaligned_io_at_many_offsets() {
    // A size that is not a whole number of pages: the last byte lives in a partial page.
    let size = (3 << 20) + 1000;
    let server = Server::start(size, 4);
    for structured in [false, true] {
        let mut c = Client::connect(server.addr, structured);
        assert_eq!(c.size, size);
        // HAS_FLAGS, SEND_FLUSH, SEND_FUA, SEND_TRIM, SEND_WRITE_ZEROES, CAN_MULTI_CONN, and
        // SEND_DF only with structured replies; never READ_ONLY or ROTATIONAL.
        let want = 1 | 4 | 8 | 32 | 64 | 256 | if structured { 128 } else { 0 };
        assert_eq!(c.flags, want, "transmission flags {:#x}", c.flags);
        let mut model = vec![0u8; size as usize];
        let round = structured as u8 + 1;
        let offsets = [
            0u64,
            1,
            511,
            4095,
            4096,
            4097,
            8190,
            12_345,
            65_535,
            (1 << 20) - 3,
            (2 << 20) + 4000,
            size - 5000,
            size - 1,
        ];
        for (i, &o) in offsets.iter().enumerate() {
            let len = [1usize, 7, 512, 4096, 4097, 9000, 20_000][i % 7].min((size - o) as usize);
            let data = pattern(o, len, round);
            assert_eq!(c.write(o, &data), 0, "write {len} at {o}");
            model[o as usize..][..len].copy_from_slice(&data);
        }
        // Every offset read back byte-exact, with reads that straddle the writes.
        for &o in &offsets {
            let from = o.saturating_sub(100);
            let len = (10_000u64).min(size - from) as usize;
            let got = c.read(from, len).unwrap();
            assert!(
                got == model[from as usize..][..len],
                "read {len} at {from} differs"
            );
        }
        assert_eq!(c.read(size - 1, 1).unwrap(), [model[size as usize - 1]]);
        assert_eq!(c.command(FLUSH, 0, 0, 0), 0);
        // Zero-length requests inside the export succeed.
        assert_eq!(c.read(size, 0).unwrap(), Vec::<u8>::new());
        c.disconnect();
    }
}

#[test]
fn trim_and_write_zeroes_zero_whole_and_partial_pages() {
    let size = 1 << 20;
    let server = Server::start(size, 2);
    let mut c = Client::connect(server.addr, true);
    let data = pattern(0, 5 * 4096, 9);
    assert_eq!(c.write(0, &data), 0);
    // WRITE_ZEROES with NO_HOLE over a partial, a whole and another partial page.
    assert_eq!(c.command(WRITE_ZEROES, 2 | FUA, 1000, 8000), 0);
    assert_eq!(c.command(TRIM, 0, 4 * 4096 + 10, 20), 0);
    let got = c.read(0, 5 * 4096).unwrap();
    let mut want = data.clone();
    want[1000..9000].fill(0);
    want[4 * 4096 + 10..][..20].fill(0);
    assert!(got == want, "zeroed bytes differ");
    // A range never written reads as zeros and zeroing it is accepted.
    assert_eq!(c.command(TRIM, 0, 512 << 10, 512 << 10), 0);
    assert_eq!(c.read((1 << 20) - 4096, 4096).unwrap(), vec![0; 4096]);
}

#[test]
fn out_of_range_and_invalid_requests_get_einval_and_the_connection_goes_on() {
    let size = 1 << 20;
    let server = Server::start(size, 1);
    for structured in [false, true] {
        let mut c = Client::connect(server.addr, structured);
        assert_eq!(c.read(size - 1, 2), Err(EINVAL));
        assert_eq!(c.read(size, 1), Err(EINVAL));
        assert_eq!(c.read(u64::MAX - 1, 4), Err(EINVAL));
        assert_eq!(c.write(size - 1, &[1, 2]), EINVAL);
        assert_eq!(c.command(TRIM, 0, size, 1), EINVAL);
        assert_eq!(c.command(WRITE_ZEROES, 0, size - 10, 11), EINVAL);
        assert_eq!(c.command(77, 0, 0, 0), EINVAL, "unknown command");
        assert_eq!(
            c.command(WRITE_ZEROES, 1 << 4, 0, 1),
            EINVAL,
            "FAST_ZERO not offered"
        );
        assert_eq!(
            c.read(0, (32 << 20) + 1),
            Err(EINVAL),
            "over the maximum payload"
        );
        // Nothing was written by the refused requests, and the connection still works.
        assert_eq!(c.read(size - 2, 2).unwrap(), [0, 0]);
        assert_eq!(c.write(size - 1, &[0x5a]), 0);
        assert_eq!(c.read(size - 1, 1).unwrap(), [0x5a]);
        assert_eq!(c.write(size - 1, &[0]), 0);
        c.disconnect();
    }
}

#[test]
fn malformed_traffic_closes_only_that_connection() {
    let server = Server::start(1 << 20, 2);
    let mut good = Client::connect(server.addr, true);
    assert_eq!(good.write(100, b"still here"), 0);

    // A request with a wrong magic: that connection is closed...
    let mut bad = Client::connect(server.addr, false);
    bad.s.write_all(&[0xde; 28]).unwrap();
    let mut b = [0u8; 1];
    assert!(
        matches!(bad.s.read(&mut b), Ok(0) | Err(_)),
        "bad connection closed"
    );

    // ...and so is one whose handshake is garbage, or that stops inside a WRITE payload.
    let mut raw = TcpStream::connect(server.addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut g = [0u8; 18];
    raw.read_exact(&mut g).unwrap();
    raw.write_all(&[0xff; 4]).unwrap(); // unknown client flags
    assert!(matches!(raw.read(&mut b), Ok(0) | Err(_)));
    let mut cut = Client::connect(server.addr, false);
    let mut h = 0x2560_9513u32.to_be_bytes().to_vec();
    h.extend_from_slice(&[0, 0, 0, 1]);
    h.extend_from_slice(&[0; 8]);
    h.extend_from_slice(&0u64.to_be_bytes());
    h.extend_from_slice(&4096u32.to_be_bytes());
    h.extend_from_slice(&[0xee; 100]);
    cut.s.write_all(&h).unwrap();
    cut.s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(matches!(cut.s.read(&mut b), Ok(0) | Err(_)));

    // The good connection never noticed; the cut write was not applied.
    assert_eq!(good.read(100, 10).unwrap(), b"still here");
    assert_eq!(good.read(0, 4).unwrap(), [0; 4]);
    let mut another = Client::connect(server.addr, false);
    assert_eq!(another.read(100, 10).unwrap(), b"still here");
}

#[test]
fn two_connections_writing_halves_of_one_page_lose_nothing() {
    // Each round, two connections write the two halves of the same 64 pages at once, every
    // write of a connection in flight together (pipelined, four workers each), so that the
    // read-modify-writes of the two halves of a page overlap. Every page is written once per
    // round by each side: a lost half shows in the round's check.
    let server = Server::start(1 << 20, 4);
    let pages = 64u64;
    let rounds = 6u8;
    let barrier = Arc::new(std::sync::Barrier::new(3));
    let writers: Vec<_> = [0u64, 2048]
        .into_iter()
        .map(|half| {
            let (addr, barrier) = (server.addr, barrier.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr, half == 0);
                for round in 1..=rounds {
                    barrier.wait();
                    for p in 0..pages {
                        let o = p * 4096 + half;
                        c.send(WRITE, 0, o, 2048, &pattern(o, 2048, round));
                    }
                    for _ in 0..pages {
                        assert_eq!(c.reply(|_| 0).1, 0);
                    }
                    barrier.wait();
                }
                c.disconnect();
            })
        })
        .collect();
    let mut c = Client::connect(server.addr, true);
    for round in 1..=rounds {
        barrier.wait();
        barrier.wait();
        let got = c.read(0, (pages * 4096) as usize).unwrap();
        let want = pattern(0, (pages * 4096) as usize, round);
        let lost = (0..pages as usize * 2)
            .filter(|h| got[h * 2048..][..2048] != want[h * 2048..][..2048])
            .count();
        assert_eq!(lost, 0, "round {round}: {lost} half-page writes lost");
    }
    for w in writers {
        w.join().unwrap();
    }
}

#[test]
fn shutdown_replies_to_requests_in_flight_and_loses_no_acknowledged_write() {
    let mut server = Server::start(1 << 20, 4);
    let mut c = Client::connect(server.addr, true);
    // Pipeline writes without waiting, then stop the server while they run.
    let n = 32u64;
    for i in 0..n {
        let o = i * 4096 + 7;
        c.send(WRITE, 0, o, 3000, &pattern(o, 3000, 3));
    }
    // Stop only once the server has read (and answered) a first request: a shutdown that
    // comes before it reads anything may rightly answer nothing, and the test would then
    // check nothing. The rest of the pipeline is in flight or still unread.
    let mut acked = Vec::new();
    let (cookie, err, _) = c.reply(|_| 0);
    assert_eq!(err, 0);
    acked.push(cookie);
    let sd = server.shutdown.clone();
    let stopper = std::thread::spawn(move || sd.trigger());
    // Every request the server read is replied to; then the connection closes.
    loop {
        let mut m = [0u8; 1];
        match c.s.peek(&mut m) {
            Ok(1) => {}
            _ => break,
        }
        let (cookie, err, _) = c.reply(|_| 0);
        assert_eq!(err, 0);
        acked.push(cookie);
    }
    stopper.join().unwrap();
    server.stop();
    // Every acknowledged write is in the remote memory.
    for cookie in acked {
        let o = (cookie - 1) * 4096 + 7;
        let mut page = [0u8; 4096];
        server.mem.read_page(o - 7, &mut page).unwrap();
        assert!(
            page[7..3007] == pattern(o, 3000, 3)[..],
            "acknowledged write {cookie} lost"
        );
    }
}

#[test]
fn connections_beyond_the_cap_are_closed_and_the_clients_inside_keep_working() {
    let limits = nbd::Limits {
        max_connections: 3,
        ..nbd::Limits::default()
    };
    let server = Server::start_with(1 << 20, 4, limits);
    let mut c = Client::connect(server.addr, true);
    assert_eq!(c.write(0, &[9u8; 4096]), 0);
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(server.addr).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap(); // greeted: inside the cap
        idle.push(s);
    }
    // Past the cap: closed at once, before any greeting.
    for _ in 0..20 {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut b = [0u8; 1];
        assert!(
            matches!(s.read(&mut b), Ok(0) | Err(_)),
            "a connection past the cap was served"
        );
    }
    assert_eq!(c.read(0, 4096).unwrap(), vec![9u8; 4096]);
    // A place freed is a place for the next client.
    drop(idle);
    let served = (0..200).any(|_| {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).is_ok() || (std::thread::sleep(Duration::from_millis(20)), false).1
    });
    assert!(served, "closed connections never gave their places back");
    c.disconnect();
}

#[test]
fn a_trickled_handshake_and_a_trickled_request_are_cut_off_and_an_idle_client_is_not() {
    let limits = nbd::Limits {
        handshake: Duration::from_secs(2),
        request: Duration::from_secs(2),
        ..nbd::Limits::default()
    };
    let server = Server::start_with(1 << 20, 4, limits);
    // A client that greets and idles past both deadlines keeps its connection.
    let mut patient = Client::connect(server.addr, false);
    // The handshake a byte every 500 ms: each read is quick, the whole is not.
    let mut slow = TcpStream::connect(server.addr).unwrap();
    let mut g = [0u8; 18];
    slow.read_exact(&mut g).unwrap();
    let mut dribbler = slow.try_clone().unwrap();
    let dribble = std::thread::spawn(move || {
        let mut opt = 3u32.to_be_bytes().to_vec();
        opt.extend_from_slice(b"IHAVEOPT\0\0\0\x07\0\0\0\x08\0\0\0\0\0\0\0\0");
        for b in opt {
            if dribbler.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    // A client past the handshake that sends half a request and stops.
    let mut half = Client::connect(server.addr, false);
    half.s.write_all(&0x2560_9513u32.to_be_bytes()).unwrap();
    let cut = common::closed_after(&mut slow);
    assert!(
        cut < Duration::from_secs(15),
        "trickled handshake held {cut:?}"
    );
    let cut = common::closed_after(&mut half.s);
    assert!(cut < Duration::from_secs(15), "half a request held {cut:?}");
    dribble.join().unwrap();
    // Both cut, well past the deadlines: the idle client reads on.
    assert_eq!(patient.write(4096, &[3u8; 4096]), 0);
    assert_eq!(patient.read(4096, 4096).unwrap(), vec![3u8; 4096]);
    patient.disconnect();
}
