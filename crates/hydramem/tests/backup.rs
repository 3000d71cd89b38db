//! The ssd-backup scheme against live node processes: pages written through the backup store
//! read back exactly after the nodes holding their only remote copy are SIGKILLed, whether
//! they were still queued for the backup file or already in it, and so do pages written after
//! the loss.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use hydramem::backup::{BackedStore, BackupConfig, FrontStore, StoreScheme};
use hydramem::bench::fill_page;
use hydramem::client::{ClientConfig, RemoteMemory};
use hydramem::nbd::PageStore;
use hydramem::PAGE_SIZE;

use common::SLAB;

const P: u64 = PAGE_SIZE as u64;

/// Reads every page of `want` (page → version) back, one by one and in one list call.
fn check(store: &dyn PageStore, want: &HashMap<u64, u64>, when: &str) {
    let (mut page, mut expect) = ([0u8; PAGE_SIZE], [0u8; PAGE_SIZE]);
    for (&p, &v) in want {
        store
            .read_page(p * P, &mut page)
            .unwrap_or_else(|e| panic!("{when}: read of page {p}: {e}"));
        fill_page(&mut expect, 5, p, v);
        assert!(page == expect, "{when}: page {p} is not version {v}");
    }
    let addrs: Vec<u64> = want.keys().map(|p| p * P).collect();
    // A submission is one window of the client's at most.
    for part in addrs.chunks(hydramem::client::WINDOW) {
        let pages = store
            .submit_read(part.to_vec())
            .and_then(|s| s.wait())
            .unwrap_or_else(|e| panic!("{when}: batched read: {e}"));
        for (a, got) in part.iter().zip(pages.iter()) {
            fill_page(&mut expect, 5, a / P, want[&(a / P)]);
            assert!(*got == expect, "{when}: page {} (batched)", a / P);
        }
    }
}

fn write(
    store: &dyn PageStore,
    pages: impl Iterator<Item = u64>,
    v: u64,
    want: &mut HashMap<u64, u64>,
) {
    let mut buf = Vec::new();
    for p in pages {
        let mut page = [0u8; PAGE_SIZE];
        fill_page(&mut page, 5, p, v);
        buf.push((p, page));
        want.insert(p, v);
    }
    // In runs of 32 pages: the batched calls, as the NBD export sends them.
    for run in buf.chunks(32) {
        let list: Vec<(u64, &[u8; PAGE_SIZE])> = run.iter().map(|(p, pg)| (p * P, pg)).collect();
        store
            .write_list(&list)
            .expect("write through the backup store");
    }
}

#[test]
fn every_page_survives_the_nodes_of_its_only_remote_copy() {
    let mut cluster = common::cluster(5, SLAB, 16);
    let pages_per_range = SLAB / P;
    let ranges = 3;
    let dir = tempfile::tempdir().unwrap();
    let config = ClientConfig::new(
        StoreScheme::SsdBackup.resilience(),
        ranges * pages_per_range * P,
    );
    let mem = RemoteMemory::connect(cluster.cluster(), config).unwrap();
    let backup = BackupConfig {
        dir: dir.path().into(),
        ..BackupConfig::default()
    };
    let front = FrontStore::new(mem.clone(), StoreScheme::SsdBackup, &backup).unwrap();
    let store = front.store();
    let mut want = HashMap::new();
    let all = 0..ranges * pages_per_range;
    write(&*store, all.clone(), 1, &mut want);
    check(&*store, &want, "all nodes up");
    // Half the pages are rewritten just before the kill, so that some are still queued.
    let backed: &Arc<BackedStore> = front.backup().unwrap();
    backed.flush();
    write(&*store, all.clone().step_by(2), 2, &mut want);
    let holders: BTreeSet<u16> = (0..ranges)
        .map(|r| mem.group_of(r * pages_per_range * P).unwrap().nodes[0])
        .collect();
    for &n in &holders {
        cluster.kill(n as usize).unwrap();
    }
    check(&*store, &want, "holders killed");
    // Writes after the loss: to a replacement slab or, failing that, to the file.
    write(&*store, all.clone().step_by(3), 3, &mut want);
    check(&*store, &want, "rewritten after the loss");
    backed.flush();
    check(&*store, &want, "queue drained");
    let path = backed.path().to_path_buf();
    front.close().unwrap();
    assert!(!path.exists(), "{} left behind", path.display());
}
