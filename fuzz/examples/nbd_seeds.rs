//! Writes the seed inputs of the NBD fuzz targets into `corpus/nbd_handshake/` and
//! `corpus/nbd_transmission/` (run from `fuzz/`: `cargo run --example nbd_seeds`).
//!
//! Each seed is a whole, valid conversation a real client could have (plus a few of the
//! refusals the server must give), so that even a short fuzz run starts from inputs that get
//! through the handshake and into every command, and mutates from there. The first byte of
//! every seed is the target's setting byte (see each target's documentation). The seeds are
//! built with the server's own encoders of the NBD wire, whose byte tables its unit tests
//! check against the protocol document.

use std::path::Path;

use hydramem::nbd::wire::*;
use hydramem::nbd::MAX_PAYLOAD;

fn option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
    let len = u32::try_from(data.len()).expect("a small option");
    OptionHeader { option, len }.put(out);
    out.extend_from_slice(data);
}

fn info(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut b = Vec::new();
    InfoRequest {
        name: name.into(),
        infos: infos.to_vec(),
    }
    .put(&mut b);
    b
}

fn req(out: &mut Vec<u8>, kind: u16, flags: u16, cookie: u64, offset: u64, len: u32) {
    let r = Request {
        flags,
        kind,
        cookie,
        offset,
        len,
    };
    out.extend_from_slice(&r.to_bytes());
    if kind == CMD_WRITE {
        // A recognisable pattern, different for every write.
        out.extend((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(cookie as u8)));
    }
}

/// Every command the server offers, with unaligned ranges and the flags it accepts, ending in
/// DISC; `size` is the export's.
fn commands(out: &mut Vec<u8>, size: u64, structured: bool) {
    req(out, CMD_WRITE, CMD_FLAG_FUA, 1, 4000, 200);
    req(out, CMD_READ, 0, 2, 3990, 220);
    req(out, CMD_WRITE, 0, 3, 8192, 4096);
    req(
        out,
        CMD_READ,
        if structured { CMD_FLAG_DF } else { 0 },
        4,
        8192,
        4096,
    );
    req(out, CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 5, 8200, 100);
    req(out, CMD_TRIM, 0, 6, 0, 4096);
    req(out, CMD_FLUSH, 0, 7, 0, 0);
    req(out, CMD_READ, 0, 8, size - 10, 10);
    req(out, CMD_READ, 0, 9, 0, 0);
    req(out, CMD_DISC, 0, 10, 0, 0);
}

/// Requests the server must refuse with EINVAL, and go on.
fn refusals(out: &mut Vec<u8>, size: u64) {
    req(out, CMD_READ, 0, 11, size, 1);
    req(out, CMD_WRITE, 0, 12, size - 1, 2);
    req(out, 99, 0, 13, 0, 0);
    req(out, CMD_WRITE_ZEROES, 1 << 4, 14, 0, 1);
    req(out, CMD_TRIM, 0, 15, u64::MAX, 2);
    req(out, CMD_READ, 0, 16, 0, MAX_PAYLOAD as u32 + 1);
    req(out, CMD_READ, 0, 17, 0, 1);
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    let path = dir.join(format!("seed-{name}"));
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    println!("{} ({} bytes)", path.display(), bytes.len());
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let hs = root.join("nbd_handshake");
    let tx = root.join("nbd_transmission");
    for d in [&hs, &tx] {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    }

    // nbd_handshake: setting byte (low four bits: shutdown after n - 1 options; 0 none), then
    // the client's bytes. The handshake target's export is 20,000 bytes named "disk".
    let size = 20_000;
    let flags = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes();

    let mut b = vec![0];
    b.extend_from_slice(&flags);
    option(&mut b, OPT_LIST, &[]);
    option(&mut b, OPT_STRUCTURED_REPLY, &[]);
    option(&mut b, OPT_INFO, &info("disk", &[INFO_BLOCK_SIZE]));
    option(
        &mut b,
        OPT_GO,
        &info("", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
    );
    commands(&mut b, size, true);
    write(&hs, "structured-go-then-commands", &b);

    let mut b = vec![0];
    b.extend_from_slice(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes());
    option(&mut b, OPT_EXPORT_NAME, b"disk");
    commands(&mut b, size, false);
    write(&hs, "export-name-padded-then-commands", &b);

    let mut b = vec![0];
    b.extend_from_slice(&flags);
    option(&mut b, OPT_INFO, &info("other", &[]));
    option(&mut b, OPT_GO, &[0, 0, 0, 9]);
    option(&mut b, OPT_STARTTLS, &[]);
    option(&mut b, OPT_LIST, b"x");
    option(&mut b, 42, b"unknown");
    option(&mut b, OPT_ABORT, &[]);
    write(&hs, "refusals-then-abort", &b);

    // The longest export name a client may send, and not ours: the refusal quotes it, and must
    // still be a protocol string (at most 4096 bytes).
    let mut b = vec![0];
    b.extend_from_slice(&flags);
    option(
        &mut b,
        OPT_INFO,
        &info(&"é".repeat(MAX_STRING / 2), &[INFO_NAME]),
    );
    option(&mut b, OPT_ABORT, &[]);
    write(&hs, "longest-unknown-name", &b);

    let mut b = vec![2]; // shutdown after one option
    b.extend_from_slice(&flags);
    option(&mut b, OPT_LIST, &[]);
    option(&mut b, OPT_GO, &info("disk", &[]));
    option(&mut b, OPT_EXPORT_NAME, b"disk");
    write(&hs, "shutdown-during-options", &b);

    // nbd_transmission: setting byte (bit 0 structured, bit 1 two workers, bits 2-3 size
    // 0 / 4096 / 20,000 / 65,536, bits 4-7 shutdown after n - 1 requests), then requests.
    for (setting, name) in [
        (0x0c, "simple-64k"),
        (0x0d, "structured-64k"),
        (0x0e, "pool-64k"),
        (0x08, "simple-20000"),
    ] {
        let size = [0, 4096, 20_000, 65_536][usize::from(setting >> 2 & 3)];
        let mut b = vec![setting];
        refusals(&mut b, size);
        commands(&mut b, size, setting & 3 != 0);
        write(&tx, name, &b);
    }
    let mut b = vec![0x3d]; // structured, 64 KiB, shutdown after two requests
    commands(&mut b, 65_536, true);
    write(&tx, "shutdown-after-two", &b);
    let mut b = vec![0x04]; // simple, 4096 bytes: a write cut short ends the connection
    req(&mut b, CMD_WRITE, 0, 1, 0, 4096);
    b.truncate(b.len() - 100);
    write(&tx, "cut-write", &b);
}
