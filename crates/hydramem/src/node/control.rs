//! Memory management of a memory node (paper 4.2, after Infiniswap's daemon): the node lends
//! only memory its machine does not need, and gives it back before local applications suffer.
//!
//! Every control period (default 1 s) the node measures its machine's memory — `MemTotal` and
//! `MemAvailable` from `/proc/meminfo`, lowered to the memory cgroup's limit and use where one
//! applies (cgroup v2 `memory.max`/`memory.current`, v1 `memory.limit_in_bytes`/
//! `memory.usage_in_bytes`, minus inactive file cache, on every level of the node's cgroup
//! path) — and derives its **budget**: the slabs it may hold so that a **headroom** (default
//! 25% of the machine's memory) stays free:
//!
//! ```text
//! budget = min(capacity / slab_size, (available + ours − headroom) / slab_size)
//! ```
//!
//! where `ours` is the memory the node's own slabs occupy now (pages written in mapped slabs,
//! whole pre-allocated slabs), which it would give back by releasing them. Every slab counts as
//! a whole slab against the budget even if clients have written only part of it: the rest may
//! be written any time.
//!
//! Then, in this order:
//! - **Pre-allocation.** Up to `prealloc` slabs of the budget not in use are mapped and backed
//!   with memory ahead of time (an unmapped pool), so that an ALLOC — notably a replacement slab
//!   a regeneration is about to fill — gets memory that is already there. The backing is done
//!   after the step lets go of its locks, at background priority and in steps (see
//!   [`super::memory::SlabMemory::populate`]): it must not hold up an ALLOC or the machine's
//!   other threads.
//! - **Release.** When the budget shrinks, pooled slabs go first: they hold no data.
//! - **Batch eviction.** If the slabs that stay (mapped and not already reclaimed) still exceed
//!   the budget by E, the node samples E + E′ of them at random and reclaims the E least active
//!   by its own access counters (it serves every access, so it needs to ask no one). A reclaimed
//!   slab keeps serving; its owner learns of it with its next heartbeat, moves it (regenerates
//!   it on another node) and frees it. Only if the owner has not done so within the grace
//!   period (default 30 s) does the node drop it, and the range loses one failure's margin
//!   until its owner repairs it.
//!
//! Invariants: pooled slabs are zero (never handed out before) and never counted as a client's;
//! a slab is dropped without its owner's FREE only after its reclaim deadline; ALLOC is refused
//! while the node holds its budget or drains. Tests replace the measurement by a simulated one
//! (FAULT `MemoryTotal`/`MemoryAvailable`, fault injection only).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::Node;

/// What the control loop measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySample {
    /// Memory of the machine, or the cgroup limit if lower.
    pub total: u64,
    /// Memory available for use (the machine's, or the cgroup's if lower).
    pub available: u64,
}

/// Where the node's view of its machine's memory comes from.
pub trait MemorySource: Send + Sync {
    /// Measures now.
    fn sample(&self) -> io::Result<MemorySample>;
}

/// The real machine: `/proc/meminfo` and the node's memory cgroup.
#[derive(Debug, Clone)]
pub struct SystemMemory {
    meminfo: PathBuf,
    cgroups: Vec<CgroupFiles>,
}

/// The files of one memory cgroup level.
#[derive(Debug, Clone)]
struct CgroupFiles {
    limit: PathBuf,
    usage: PathBuf,
    stat: PathBuf,
    /// The inactive-file key in `stat` (v2 `inactive_file`, v1 `total_inactive_file`).
    inactive_key: &'static str,
}

impl SystemMemory {
    /// The machine this process runs on, in its own cgroup.
    pub fn new() -> SystemMemory {
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        SystemMemory::at(
            Path::new("/proc/meminfo"),
            Path::new("/sys/fs/cgroup"),
            &cgroup,
        )
    }

    /// Reads `meminfo` and the cgroup hierarchy mounted at `root`, for a process whose
    /// `/proc/self/cgroup` says `self_cgroup` (testable against a fake tree).
    pub fn at(meminfo: &Path, root: &Path, self_cgroup: &str) -> SystemMemory {
        let mut cgroups = Vec::new();
        for line in self_cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (base, v2) = if controllers.is_empty() {
                (root.to_path_buf(), true)
            } else if controllers.split(',').any(|c| c == "memory") {
                (root.join("memory"), false)
            } else {
                continue;
            };
            // Every level from the node's cgroup up to the root can carry a limit.
            let mut dir = base.join(path.trim_start_matches('/'));
            loop {
                let files = if v2 {
                    CgroupFiles {
                        limit: dir.join("memory.max"),
                        usage: dir.join("memory.current"),
                        stat: dir.join("memory.stat"),
                        inactive_key: "inactive_file",
                    }
                } else {
                    CgroupFiles {
                        limit: dir.join("memory.limit_in_bytes"),
                        usage: dir.join("memory.usage_in_bytes"),
                        stat: dir.join("memory.stat"),
                        inactive_key: "total_inactive_file",
                    }
                };
                if files.limit.exists() {
                    cgroups.push(files);
                }
                if dir == base || !dir.pop() {
                    break;
                }
            }
        }
        SystemMemory {
            meminfo: meminfo.to_path_buf(),
            cgroups,
        }
    }

    /// Number of cgroup levels with a memory limit file (for the startup log).
    pub fn cgroup_levels(&self) -> usize {
        self.cgroups.len()
    }
}

impl Default for SystemMemory {
    fn default() -> Self {
        SystemMemory::new()
    }
}

/// A `key: value kB` field of /proc/meminfo, in bytes.
fn meminfo_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// A `key value` field of a cgroup's memory.stat.
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

impl MemorySource for SystemMemory {
    fn sample(&self) -> io::Result<MemorySample> {
        let text = std::fs::read_to_string(&self.meminfo)?;
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} lacks MemTotal or MemAvailable", self.meminfo.display()),
            )
        };
        let mut total = meminfo_field(&text, "MemTotal").ok_or_else(bad)?;
        let mut available = meminfo_field(&text, "MemAvailable").ok_or_else(bad)?;
        for cg in &self.cgroups {
            let Ok(limit) = std::fs::read_to_string(&cg.limit) else {
                continue;
            };
            // "max" (v2) or a huge number (v1) means no limit at this level.
            let Ok(limit) = limit.trim().parse::<u64>() else {
                continue;
            };
            if limit >= total {
                continue;
            }
            let usage = std::fs::read_to_string(&cg.usage)
                .ok()
                .and_then(|u| u.trim().parse::<u64>().ok())
                .unwrap_or(0);
            let inactive = std::fs::read_to_string(&cg.stat)
                .ok()
                .and_then(|s| stat_field(&s, cg.inactive_key))
                .unwrap_or(0);
            total = total.min(limit);
            available = available.min(limit.saturating_sub(usage.saturating_sub(inactive)));
        }
        Ok(MemorySample {
            total,
            available: available.min(total),
        })
    }
}

/// Settings of the control loop.
#[derive(Debug, Clone, Copy)]
pub struct ControlConfig {
    /// How often to measure and act.
    pub period: Duration,
    /// Fraction of the machine's memory kept free for local applications.
    pub headroom: f64,
    /// Most slabs kept pre-allocated.
    pub prealloc: usize,
    /// E′: extra random candidates examined per batch eviction.
    pub evict_extra: usize,
    /// How long an owner has to move a reclaimed slab before the node drops it.
    pub grace: Duration,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            period: Duration::from_secs(1),
            headroom: 0.25,
            prealloc: 1,
            evict_extra: 2,
            grace: Duration::from_secs(30),
        }
    }
}

impl ControlConfig {
    /// Checks the settings; the message says which flag to fix.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..1.0).contains(&self.headroom) {
            return Err(format!(
                "--headroom {} must be a fraction in [0, 1), e.g. 0.25 for 25%",
                self.headroom
            ));
        }
        if self.period.is_zero() {
            return Err("--control-period must be longer than 0".into());
        }
        Ok(())
    }
}

/// The node's memory budget for one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Bytes kept free for local applications.
    pub headroom: u64,
    /// Slabs the node may hold.
    pub slabs: u64,
}

/// `min(max_slabs, (available + ours − headroom) / slab_size)` (see the module doc).
pub fn budget(
    sample: MemorySample,
    headroom_fraction: f64,
    ours: u64,
    slab_size: u64,
    max_slabs: u64,
) -> Budget {
    let headroom = (sample.total as f64 * headroom_fraction) as u64;
    let spare = sample
        .available
        .saturating_add(ours)
        .saturating_sub(headroom);
    Budget {
        headroom,
        slabs: (spare / slab_size).min(max_slabs),
    }
}

/// Runs the control loop until `stop` is set: one step at once, then one per period.
pub fn run(
    node: Arc<Node>,
    source: Box<dyn MemorySource>,
    config: ControlConfig,
    stop: Arc<super::server::Shutdown>,
) {
    crate::priority::background("node memory control");
    let mut warned = false;
    while !stop.is_triggered() {
        match source.sample() {
            Ok(s) => {
                node.control_step(s, &config);
                warned = false;
            }
            Err(e) if !warned => {
                tracing::warn!(error = %e, "cannot measure the machine's memory; keeping the last budget");
                warned = true;
            }
            Err(_) => {}
        }
        // Sleep in short steps so that shutdown is prompt.
        let mut left = config.period;
        while !left.is_zero() && !stop.is_triggered() {
            let step = left.min(Duration::from_millis(50));
            std::thread::sleep(step);
            left -= step;
        }
    }
}

/// A simulated machine, for tests: FAULT `MemoryTotal` / `MemoryAvailable` set it. The
/// simulated available memory is what the machine would have free if the node held nothing;
/// the node's own slabs are taken off it, as they would be on a real machine (so that moving
/// a slab away frees memory, and the budget does not shrink with every slab that leaves).
#[derive(Debug, Default)]
pub struct Simulated {
    /// Simulated total memory, 0 = real.
    pub total: std::sync::atomic::AtomicU64,
    /// Simulated available memory without the node's slabs, `u64::MAX` = real.
    pub available: std::sync::atomic::AtomicU64,
}

impl Simulated {
    /// Nothing simulated.
    pub fn new() -> Simulated {
        Simulated {
            total: 0.into(),
            available: u64::MAX.into(),
        }
    }

    /// The real sample with the simulated fields replaced; `ours` is what the node's slabs
    /// occupy now.
    pub fn apply(&self, mut s: MemorySample, ours: u64) -> MemorySample {
        let t = self.total.load(Ordering::Relaxed);
        if t != 0 {
            s.total = t;
        }
        let a = self.available.load(Ordering::Relaxed);
        if a != u64::MAX {
            s.available = a.saturating_sub(ours);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn budget_keeps_the_headroom_free() {
        let s = MemorySample {
            total: 100 * MIB,
            available: 60 * MIB,
        };
        // 60 available + 0 ours − 25 headroom = 35 slabs of 1 MiB, capped by capacity.
        assert_eq!(budget(s, 0.25, 0, MIB, 1000).slabs, 35);
        assert_eq!(budget(s, 0.25, 0, MIB, 1000).headroom, 25 * MIB);
        assert_eq!(budget(s, 0.25, 0, MIB, 20).slabs, 20);
        // What the node holds itself counts as available to it.
        assert_eq!(budget(s, 0.25, 10 * MIB, MIB, 1000).slabs, 45);
        // Below the headroom: nothing.
        let low = MemorySample {
            total: 100 * MIB,
            available: 10 * MIB,
        };
        assert_eq!(budget(low, 0.25, 0, MIB, 1000).slabs, 0);
        assert_eq!(budget(low, 0.0, 0, 4 * MIB, 1000).slabs, 2);
    }

    #[test]
    fn reads_meminfo_and_the_tightest_cgroup_level() {
        let dir = std::env::temp_dir().join(format!("hm-ctl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let leaf = dir.join("cg/a/b");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(
            dir.join("meminfo"),
            "MemTotal:       16384000 kB\nMemFree: 1 kB\nMemAvailable:    8192000 kB\n",
        )
        .unwrap();
        let src = |cg: &str| SystemMemory::at(&dir.join("meminfo"), &dir.join("cg"), cg);
        // No cgroup: the machine.
        let m = src("").sample().unwrap();
        assert_eq!(m.total, 16384000 * 1024);
        assert_eq!(m.available, 8192000 * 1024);
        // v2: the leaf is unlimited, its parent allows 1 GiB of which 700 MiB are used and
        // 100 MiB of those are inactive file cache.
        std::fs::write(leaf.join("memory.max"), "max\n").unwrap();
        std::fs::write(leaf.join("memory.current"), "5\n").unwrap();
        let a = dir.join("cg/a");
        std::fs::write(a.join("memory.max"), format!("{}\n", 1024 * MIB)).unwrap();
        std::fs::write(a.join("memory.current"), format!("{}\n", 700 * MIB)).unwrap();
        std::fs::write(
            a.join("memory.stat"),
            format!("anon 1\ninactive_file {}\n", 100 * MIB),
        )
        .unwrap();
        let s = src("0::/a/b");
        assert_eq!(s.cgroup_levels(), 2);
        let m = s.sample().unwrap();
        assert_eq!(m.total, 1024 * MIB);
        assert_eq!(m.available, 424 * MIB);
        // v1 layout under root/memory.
        let v1 = dir.join("cg/memory/x");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), format!("{}\n", 512 * MIB)).unwrap();
        std::fs::write(v1.join("memory.usage_in_bytes"), format!("{}\n", 500 * MIB)).unwrap();
        let m = src("4:memory:/x\n3:cpu:/y").sample().unwrap();
        assert_eq!((m.total, m.available), (512 * MIB, 12 * MIB));
        // A missing meminfo is an error that names the file.
        let err = SystemMemory::at(&dir.join("nope"), &dir, "")
            .sample()
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        std::fs::write(dir.join("meminfo"), "MemTotal: 5 kB\n").unwrap();
        assert!(src("")
            .sample()
            .unwrap_err()
            .to_string()
            .contains("MemAvailable"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_real_machine_can_be_measured() {
        let m = SystemMemory::new().sample().unwrap();
        assert!(m.total > 0 && m.available <= m.total);
    }

    #[test]
    fn simulation_replaces_only_what_is_set() {
        let sim = Simulated::new();
        let real = MemorySample {
            total: 10,
            available: 5,
        };
        assert_eq!(sim.apply(real, 3), real);
        sim.available.store(8, Ordering::Relaxed);
        assert_eq!(sim.apply(real, 3).available, 5);
        assert_eq!(sim.apply(real, 30).available, 0);
        sim.total.store(99, Ordering::Relaxed);
        assert_eq!(sim.apply(real, 0).total, 99);
    }

    #[test]
    fn bad_settings_are_refused() {
        let c = |headroom| ControlConfig {
            headroom,
            ..ControlConfig::default()
        };
        assert!(c(1.0).validate().is_err());
        assert!(c(-0.1).validate().is_err());
        assert!(c(0.25).validate().is_ok());
    }
}
