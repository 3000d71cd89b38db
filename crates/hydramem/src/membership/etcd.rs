//! [`Registry`] on a real etcd, through etcd-client (the maintained etcd v3 client, gRPC).
//!
//! etcd-client is async; hydramem's data path is threads. The registry owns a small tokio
//! runtime (one worker thread, so the client's connection tasks progress on their own) and
//! every call blocks the calling thread on it with the configured deadline. Calls are rare
//! (a keep-alive per third of a lease, a watch per client), so the hop costs nothing that
//! matters.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, EventType, GetOptions, LeaseTimeToLiveOptions, PutOptions,
    WatchOptions, WatchStream,
};
use tokio::runtime::Runtime;

use super::{Change, Entry, EtcdConfig, MembershipError, Registry, Watch};

/// A connection to etcd (see the module doc).
pub struct EtcdRegistry {
    rt: std::sync::Arc<Runtime>,
    client: Client,
    endpoints: String,
    timeout: Duration,
}

impl EtcdRegistry {
    /// Connects to `cfg`'s endpoints. The connection is made lazily by the client: an etcd
    /// that is down makes the calls fail, not this.
    pub fn connect(cfg: &EtcdConfig) -> Result<EtcdRegistry, MembershipError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("hm-etcd")
            .enable_all()
            .build()
            .map_err(MembershipError::Runtime)?;
        let timeout = cfg.timeout();
        let endpoints = cfg.endpoints.join(",");
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(timeout, timeout);
        let client = rt
            .block_on(async {
                tokio::time::timeout(timeout, Client::connect(&cfg.endpoints, Some(options))).await
            })
            .map_err(|_| unreachable(&endpoints, "connect", "timed out".into()))?
            .map_err(|e| unreachable(&endpoints, "connect", e.to_string()))?;
        Ok(EtcdRegistry {
            rt: std::sync::Arc::new(rt),
            client,
            endpoints,
            timeout,
        })
    }

    /// Runs `f` on the runtime within the deadline.
    fn call<T, F>(&self, what: &'static str, f: F) -> Result<T, MembershipError>
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.rt
            .block_on(async { tokio::time::timeout(self.timeout, f).await })
            .map_err(|_| {
                unreachable(
                    &self.endpoints,
                    what,
                    format!("no answer within {:?}", self.timeout),
                )
            })?
            .map_err(|e| unreachable(&self.endpoints, what, e.to_string()))
    }
}

fn unreachable(endpoints: &str, what: &'static str, reason: String) -> MembershipError {
    MembershipError::Unreachable {
        endpoints: endpoints.to_string(),
        what,
        reason,
    }
}

impl Registry for EtcdRegistry {
    fn grant(&self, ttl: Duration) -> Result<i64, MembershipError> {
        let ttl = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let mut c = self.client.clone();
        self.call("LeaseGrant", async move { c.lease_grant(ttl, None).await })
            .map(|r| r.id())
    }

    fn keep_alive(&self, lease: i64) -> Result<bool, MembershipError> {
        let mut c = self.client.clone();
        self.call("LeaseKeepAlive", async move {
            let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
            keeper.keep_alive().await?;
            Ok(stream.message().await?.is_some_and(|r| r.ttl() > 0))
        })
    }

    fn revoke(&self, lease: i64) -> Result<(), MembershipError> {
        let mut c = self.client.clone();
        self.call("LeaseRevoke", async move { c.lease_revoke(lease).await })
            .map(drop)
    }

    fn time_to_live(&self, lease: i64) -> Result<Option<i64>, MembershipError> {
        let mut c = self.client.clone();
        self.call("LeaseTimeToLive", async move {
            c.lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new()))
                .await
        })
        .map(|r| (r.ttl() > 0).then_some(r.ttl()))
    }

    fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), MembershipError> {
        let (key, value) = (key.to_string(), value.to_vec());
        let mut c = self.client.clone();
        self.call("Put", async move {
            c.put(key, value, Some(PutOptions::new().with_lease(lease)))
                .await
        })
        .map(drop)
    }

    fn list(&self, prefix: &str) -> Result<(Vec<Entry>, i64), MembershipError> {
        let prefix = prefix.to_string();
        let mut c = self.client.clone();
        let r = self.call("Range", async move {
            c.get(prefix, Some(GetOptions::new().with_prefix())).await
        })?;
        let rev = r.header().map_or(0, |h| h.revision());
        let entries = r
            .kvs()
            .iter()
            .map(|kv| Entry {
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                value: kv.value().to_vec(),
                lease: kv.lease(),
            })
            .collect();
        Ok((entries, rev))
    }

    fn watch(&self, prefix: &str, from: i64) -> Result<Box<dyn Watch>, MembershipError> {
        let prefix = prefix.to_string();
        let mut c = self.client.clone();
        let stream = self.call("Watch", async move {
            c.watch(
                prefix,
                Some(WatchOptions::new().with_prefix().with_start_revision(from)),
            )
            .await
        })?;
        Ok(Box::new(EtcdWatch {
            rt: self.rt.clone(),
            stream,
        }))
    }
}

/// A watch stream of [`EtcdRegistry`].
struct EtcdWatch {
    rt: std::sync::Arc<Runtime>,
    stream: WatchStream,
}

impl Watch for EtcdWatch {
    fn next(&mut self, wait: Duration) -> Result<Vec<Change>, MembershipError> {
        let stream = &mut self.stream;
        let got = self
            .rt
            .block_on(async { tokio::time::timeout(wait, stream.message()).await });
        let resp = match got {
            Err(_) => return Ok(Vec::new()),
            Ok(Err(e)) => return Err(MembershipError::WatchEnded(e.to_string())),
            Ok(Ok(None)) => return Err(MembershipError::WatchEnded("etcd closed it".into())),
            Ok(Ok(Some(r))) => r,
        };
        if resp.canceled() {
            return Err(MembershipError::WatchEnded(format!(
                "cancelled by etcd ({}; compacted to {})",
                resp.cancel_reason(),
                resp.compact_revision()
            )));
        }
        Ok(resp
            .events()
            .iter()
            .filter_map(|ev| {
                let kv = ev.kv()?;
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                Some(match ev.event_type() {
                    EventType::Put => Change::Put(Entry {
                        key,
                        value: kv.value().to_vec(),
                        lease: kv.lease(),
                    }),
                    EventType::Delete => Change::Delete(key),
                })
            })
            .collect())
    }
}
