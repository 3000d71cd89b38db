//! A few seeded fault runs (the soak runs many: `scripts/soak`): nodes killed, paused,
//! restarted and slowed at random, never more than r at once, under a write-heavy workload;
//! not one acknowledged write may be lost and no read may return bytes nobody wrote.

use std::time::Duration;

use hydramem::faultrun::{run, FaultRunOptions};

#[test]
fn seeded_fault_runs_lose_nothing() {
    for seed in [1u64, 2, 3] {
        let report = run(&FaultRunOptions {
            binary: env!("CARGO_BIN_EXE_hydramem").into(),
            seed,
            nodes: 12,
            threads: 6,
            pages: 3072,
            slab_size: 1 << 20,
            duration: Duration::from_secs(5),
            max_faults: 2,
        })
        .unwrap();
        eprintln!("{}", serde_json::to_string(&report).unwrap());
        assert!(
            !report.faults.is_empty(),
            "seed {seed}: no fault was injected"
        );
        assert!(
            report.acked_writes > 200,
            "seed {seed}: too little work: {report:?}"
        );
        assert_eq!(report.wrong_reads, 0, "seed {seed}: {report:?}");
        assert_eq!(report.lost_writes, 0, "seed {seed}: {report:?}");
        assert_eq!(report.failed_writes, 0, "seed {seed}: {report:?}");
        assert_eq!(report.read_errors, 0, "seed {seed}: {report:?}");
    }
}
