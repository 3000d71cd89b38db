//! hydramem: resilient, highly available remote memory for unmodified applications.
//!
//! The system of the Hydra paper (FAST'22) in user space. Memory nodes ([`node`]) donate slabs
//! of their machine's memory; a client ([`client::RemoteMemory`]) splits every 4 KiB page into
//! k data and r parity splits with Reed-Solomon and spreads them over k + r nodes chosen by
//! CodingSets ([`placement`]), so its data survives r lost nodes at 1 + r/k memory cost. Clients
//! and nodes speak the protocol of [`wire`] over TCP; the cluster file ([`cluster`]) lists the
//! nodes. See docs/architecture.md for the design.
//!
//! ```no_run
//! use hydramem::client::{ClientConfig, Mode, RemoteMemory, Resilience};
//! use hydramem::cluster::Cluster;
//!
//! let cluster = Cluster::load("hydramem.cluster.toml".as_ref())?;
//! let scheme = Resilience::Hydra { k: 8, r: 2, delta: 1, mode: Mode::FailureRecovery };
//! let mem = RemoteMemory::connect(&cluster, ClientConfig::new(scheme, 1 << 30))?;
//! mem.write_page(0x2000, &[7u8; 4096])?; // once all 10 splits are acknowledged
//! let mut page = [0u8; 4096];
//! mem.read_page(0x2000, &mut page)?; // any 8 of the 9 splits asked suffice
//! assert_eq!(page, [7u8; 4096]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// The library and, behind the `tools` feature, the tools built on it (bench, faultrun,
// release, sim, status): the library never imports a tool, and builds without them, which is
// how the build checks it. docs/architecture.md, "Layers", gives the order of the rest.
pub mod auth;
pub mod backup;
#[cfg(feature = "tools")]
pub mod bench;
pub mod client;
pub mod cluster;
pub mod embedded;
#[cfg(feature = "tools")]
pub mod faultrun;
pub mod integrity;
pub mod membership;
pub mod mount;
pub mod nbd;
pub mod node;
pub mod placement;
pub mod priority;
#[cfg(feature = "tools")]
pub mod release;
pub mod rpc;
pub mod run_config;
pub mod sampled;
pub mod shutdown;
#[cfg(feature = "tools")]
pub mod sim;
pub mod span;
#[cfg(feature = "tools")]
pub mod status;
pub mod supervisor;
pub mod tags;
pub mod tls;
pub mod units;
pub mod wire;

/// The unit of remote I/O.
pub const PAGE_SIZE: usize = 4096;
