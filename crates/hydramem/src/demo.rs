//! `hydramem demo`: the README's first command, a tour that finishes on its own.
//!
//! Starts 12 memory nodes on loopback, writes a working set as Hydra 8+2 pages, reads it back,
//! SIGKILLs the two nodes that hold the most of it (r = 2 lost machines), reads everything back
//! again from the 10 that remain, and prints what it measured.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use hydramem::bench::fill_page;
use hydramem::client::{ClientConfig, Mode, RemoteMemory, Resilience};
use hydramem::embedded::{EmbeddedCluster, EmbeddedOptions};
use hydramem::rpc::Access;
use hydramem::status;
use hydramem::units::human;
use hydramem::PAGE_SIZE;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Memory nodes to start.
    #[arg(long, env = "HYDRAMEM_NODES", default_value_t = 12)]
    nodes: usize,
    /// Size of the working set.
    #[arg(long, env = "HYDRAMEM_SIZE", default_value = "64MiB", value_parser = hydramem::units::parse_size)]
    size: hydramem::units::Size,
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("  {prefix:<28} [{bar:30}] {pos}/{len} pages {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.set_prefix(what.to_string());
    pb
}

/// Reads every page with `threads` threads, verifying contents; returns (pages/s, mismatches).
fn read_all(mem: &RemoteMemory, pages: u64, threads: u64, what: &str) -> Result<(f64, u64)> {
    let pb = bar(pages, what);
    let bad = AtomicU64::new(0);
    let t0 = Instant::now();
    let err = parking_lot::Mutex::new(None);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (pb, bad, err) = (&pb, &bad, &err);
            s.spawn(move || {
                let mut page = [0u8; PAGE_SIZE];
                let mut want = [0u8; PAGE_SIZE];
                let mut p = t;
                while p < pages {
                    if let Err(e) = mem.read_page(p * PAGE_SIZE as u64, &mut page) {
                        err.lock().get_or_insert(e);
                        return;
                    }
                    fill_page(&mut want, 7, p, 0);
                    if page != want {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                    pb.inc(1);
                    p += threads;
                }
            });
        }
    });
    if let Some(e) = err.into_inner() {
        bail!("{what}: {e}");
    }
    let rate = pages as f64 / t0.elapsed().as_secs_f64();
    pb.finish_with_message(format!("{:.0} pages/s", rate));
    Ok((rate, bad.load(Ordering::Relaxed)))
}

fn qd1_read_p50(mem: &RemoteMemory, pages: u64, n: u64) -> Result<f64> {
    let mut v = Vec::with_capacity(n as usize);
    let mut page = [0u8; PAGE_SIZE];
    for i in 0..n {
        let p = (i * 7919) % pages;
        let t = Instant::now();
        mem.read_page(p * PAGE_SIZE as u64, &mut page)?;
        v.push(t.elapsed());
    }
    v.sort();
    Ok(v[v.len() / 2].as_secs_f64() * 1e6)
}

pub fn run(a: DemoArgs) -> Result<()> {
    let started = Instant::now();
    let pages = a.size.bytes() / PAGE_SIZE as u64;
    if pages == 0 {
        bail!("--size must be at least one page (4096 bytes)");
    }
    println!(
        "hydramem demo: Hydra 8+2 erasure-coded remote memory on {} local memory nodes\n",
        a.nodes
    );
    println!(
        "1. starting {} memory nodes on loopback (16 MiB slabs)",
        a.nodes
    );
    let mut cluster = EmbeddedCluster::start(EmbeddedOptions {
        etcd: None,
        binary: hydramem::embedded::self_exe()?,
        nodes: a.nodes,
        slab_size: 16 << 20,
        capacity: 1 << 30,
        extra_args: vec!["--log".into(), "error".into()],
        cluster_file: None,
        key_file: None,
        tls_dir: None,
    })?;
    let resilience = Resilience::Hydra {
        k: 8,
        r: 2,
        delta: 1,
        mode: Mode::FailureRecovery,
    };
    let cfg = ClientConfig::new(resilience, pages * PAGE_SIZE as u64);
    let mem = RemoteMemory::connect(cluster.cluster(), cfg)?;
    let me = mem.owner().fingerprint();

    println!(
        "2. writing {} ({} pages) as {}",
        human(pages * PAGE_SIZE as u64),
        pages,
        resilience.label()
    );
    let pb = bar(pages, "write");
    let t0 = Instant::now();
    let threads = 8u64;
    let err = parking_lot::Mutex::new(None);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (pb, mem, err) = (&pb, &mem, &err);
            s.spawn(move || {
                let mut page = [0u8; PAGE_SIZE];
                let mut p = t;
                while p < pages {
                    fill_page(&mut page, 7, p, 0);
                    if let Err(e) = mem.write_page(p * PAGE_SIZE as u64, &page) {
                        err.lock().get_or_insert(e);
                        return;
                    }
                    pb.inc(1);
                    p += threads;
                }
            });
        }
    });
    if let Some(e) = err.into_inner() {
        bail!("write failed: {e}");
    }
    let write_rate = pages as f64 / t0.elapsed().as_secs_f64();
    pb.finish_with_message(format!("{write_rate:.0} pages/s"));

    // What the nodes hold for us, from their own counters.
    let mut per_node = Vec::new();
    let mut held = 0u64;
    for n in &cluster.cluster().nodes {
        let st = status::fetch(n.addr, &Access::open(), Duration::from_secs(2))
            .map_err(anyhow::Error::msg)?;
        let mine: u64 = st
            .slabs
            .iter()
            .filter(|s| s.owner == me)
            .map(|s| s.held)
            .sum();
        held += mine;
        per_node.push((n.id as usize, mine));
    }
    let overhead = held as f64 / (pages * PAGE_SIZE as u64) as f64;
    println!(
        "   the nodes hold {} for {} of data: {:.3} bytes per byte (replication ×3 would hold 3.0)",
        human(held),
        human(pages * PAGE_SIZE as u64),
        overhead
    );

    println!("3. reading everything back");
    let (healthy_rate, bad1) = read_all(&mem, pages, 8, "read (all nodes up)")?;
    let healthy_p50 = qd1_read_p50(&mem, pages, 2000)?;

    // Maintenance: drain a member, stop it, bring it back empty.
    let drained = mem.group_of(0).expect("range 0 is mapped").nodes[0] as usize;
    let addr = cluster.cluster().nodes[drained].addr;
    println!("4. maintenance: draining memory node {drained}; its slab moves to a spare node while reads go on");
    let t0 = Instant::now();
    let before = mem.regen_stats();
    status::drain(addr, true, &Access::open(), Duration::from_secs(2))
        .map_err(anyhow::Error::msg)?;
    let total = status::fetch(addr, &Access::open(), Duration::from_secs(2))
        .map_err(anyhow::Error::msg)?
        .slabs
        .len() as u64;
    let pb = bar(total, "drain (slabs moved)");
    let mut reads = 0u64;
    let mut page = [0u8; PAGE_SIZE];
    loop {
        let left = status::fetch(addr, &Access::open(), Duration::from_secs(2))
            .map_err(anyhow::Error::msg)?
            .slabs
            .len() as u64;
        pb.set_position(total.saturating_sub(left));
        if left == 0 {
            break;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("node {drained} still holds {left} slabs after 30 s of draining");
        }
        // Reads go on meanwhile.
        for _ in 0..64 {
            let p = reads * 7919 % pages;
            mem.read_page(p * PAGE_SIZE as u64, &mut page)?;
            reads += 1;
        }
    }
    let drain_secs = t0.elapsed().as_secs_f64();
    pb.finish_with_message(format!("{drain_secs:.2} s"));
    let after_drain = mem.regen_stats();
    let moved = after_drain.done - before.done;
    cluster.restart(drained)?;
    let back = Instant::now();
    while !mem.transport().is_up(drained as u16) {
        if back.elapsed() > Duration::from_secs(10) {
            bail!("node {drained} did not come back after its restart");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "   {moved} slab copied off node {drained} in {drain_secs:.2} s ({reads} reads meanwhile); node {drained} stopped and restarted empty"
    );

    let mut per_node = Vec::new();
    for n in &cluster.cluster().nodes {
        let st = status::fetch(n.addr, &Access::open(), Duration::from_secs(2))
            .map_err(anyhow::Error::msg)?;
        per_node.push((
            n.id as usize,
            st.slabs
                .iter()
                .filter(|s| s.owner == me)
                .map(|s| s.held)
                .sum::<u64>(),
        ));
    }
    per_node.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
    let victims: Vec<usize> = per_node.iter().take(2).map(|(i, _)| *i).collect();
    println!(
        "5. SIGKILL memory nodes {} and {} (the two holding the most data: their slabs are gone)",
        victims[0], victims[1]
    );
    for v in &victims {
        cluster.kill(*v)?;
    }
    std::thread::sleep(Duration::from_millis(100));
    let decodes0 = mem.stats().decodes.load(Ordering::Relaxed);
    println!(
        "6. reading everything back from the {} surviving nodes",
        a.nodes - 2
    );
    let (degraded_rate, bad2) = read_all(&mem, pages, 8, "read (2 nodes dead)")?;
    let decoded = mem.stats().decodes.load(Ordering::Relaxed) - decodes0;
    let down: Vec<String> = (0..a.nodes as u16)
        .filter(|n| !mem.transport().is_up(*n))
        .map(|n| n.to_string())
        .collect();
    println!(
        "   the client found nodes {} down and rebuilt the missing splits of {decoded} pages",
        down.join(", ")
    );
    let degraded_p50 = qd1_read_p50(&mem, pages, 2000)?;

    println!("7. regenerating: the client moves the lost splits to the spare nodes, which rebuild them from the survivors");
    let t0 = Instant::now();
    // Progress from the nodes themselves: the pages their regenerations have rebuilt.
    let per_slab = mem.layout().pages_per_range;
    let rebuilt = |c: &EmbeddedCluster| -> u64 {
        c.cluster()
            .nodes
            .iter()
            .filter_map(|n| status::fetch(n.addr, &Access::open(), Duration::from_millis(200)).ok())
            .map(|s| s.regen_pages)
            .sum()
    };
    let base = rebuilt(&cluster);
    let pb = bar(0, "regenerate (slots rebuilt)");
    let regen = loop {
        let st = mem.regen_stats();
        if st.failed > 0 {
            bail!("a slab regeneration failed (see the log)");
        }
        // Only the regenerations of this step (not the drain's copy).
        let started = st.started - after_drain.started;
        pb.set_length(started.max(1) * per_slab);
        pb.set_position(rebuilt(&cluster).saturating_sub(base));
        if started > 0 && st.done == st.started && mem.degraded_ranges() == 0 {
            let mut st = st;
            st.started = started;
            st.done -= after_drain.done;
            st.busy -= after_drain.busy;
            break st;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("regeneration did not finish within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    pb.finish_with_message(format!("{} slabs", regen.done));
    println!(
        "   {} slabs ({}) rebuilt on the spare nodes while reads went on",
        regen.done,
        human(regen.done * (16u64 << 20)),
    );
    let g = mem.group_of(0).expect("range 0 is mapped");
    let more: Vec<usize> = g.nodes[..10]
        .iter()
        .map(|n| *n as usize)
        .filter(|n| !victims.contains(n))
        .take(2)
        .collect();
    println!(
        "8. SIGKILL memory nodes {} and {} too: 4 of 12 machines gone, but never more than 2 splits of a page",
        more[0], more[1]
    );
    for v in &more {
        cluster.kill(*v)?;
    }
    std::thread::sleep(Duration::from_millis(100));
    let (after_rate, bad3) = read_all(&mem, pages, 8, "read (4 nodes dead)")?;
    drop(mem);
    cluster.shutdown();

    println!("\nsummary");
    println!(
        "  data written             {} in {} pages of 8 data + 2 parity splits",
        human(pages * PAGE_SIZE as u64),
        pages
    );
    println!("  remote memory used       {overhead:.3}× the data (measured on the nodes)");
    println!("  write throughput         {write_rate:.0} pages/s (8 threads)");
    println!("  read, all nodes up       {healthy_rate:.0} pages/s, QD1 p50 {healthy_p50:.1} µs, wrong pages: {bad1}");
    println!("  read, 2 nodes killed     {degraded_rate:.0} pages/s, QD1 p50 {degraded_p50:.1} µs, wrong pages: {bad2}");
    let each = regen.busy.as_secs_f64() / regen.done.max(1) as f64;
    println!(
        "  slab regeneration        {} slabs of {}, {:.2} s each on average (each read {} from 8 survivors: {:.0} MB/s)",
        regen.done,
        human(16 << 20),
        each,
        human(8 * (16 << 20)),
        8.0 * (16u64 << 20) as f64 / 1e6 / each.max(1e-9)
    );
    println!("  read, 2 more killed      {after_rate:.0} pages/s after regeneration, wrong pages: {bad3}");
    println!(
        "  total time               {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if bad1 + bad2 + bad3 > 0 {
        bail!("{} pages read back wrong", bad1 + bad2 + bad3);
    }
    println!("\nevery page read back exactly, with 2 and then 4 of 12 machines gone.");
    Ok(())
}
