//! Who may talk to a memory node: the cluster key, the credentials derived from it, and the
//! proofs of the HELLO handshake.
//!
//! A cluster may have a *cluster key*: 32 random bytes in a file that every node, client and
//! operator tool of the cluster reads (`--cluster-key FILE`, `HYDRAMEM_CLUSTER_KEY_FILE`, or
//! `key_file` in the cluster file). From it:
//!
//! - **a node credential per node**, `HMAC(key, "hydramem node v1" ‖ node id)`, which keys both
//!   proofs of a handshake with that node. A proof made for one node (its id, its fresh nonce)
//!   proves nothing to another, so a node that receives a client's proof cannot replay it to
//!   the next node, and a proof seen on the wire cannot be replayed to the same node either
//!   (the nonce is new on every connection);
//! - **an owner handle per client identity**, `HMAC(key, "hydramem owner v1" ‖ client id)`
//!   (first 16 bytes): what a node sees and files slabs under. The client id itself — the
//!   secret a kept identity is reattached with — never leaves the client, so a node, or
//!   whoever reads its traffic or its status, learns no identity it could present.
//!
//! The handshake (protocol 8, bytes in `wire`): the client sends HELLO with its owner handle,
//! flags, a fresh nonce and its process's instance; a node with a key answers with its own fresh nonce and its proof
//! ([`node_proof`]: it knows the node credential), which the client checks *before* it proves
//! anything; the client then sends AUTH with its proof ([`client_proof`]), and only then is the
//! connection's identity set. Both proofs cover both nonces, the owner handle, the flags, the
//! instance and the node id, so no part can be swapped. A node without a key answers HELLO as before
//! protocol 7 and says so ([`AUTH_NONE`]); a client with a key refuses such a node, and a
//! client without a key refuses a node that asks for one — never a silent downgrade.
//!
//! Invariants: proofs are compared in constant time (the `hmac` crate's `verify_slice`); a key
//! file that others than its owner may read is refused, as ssh refuses such a private key;
//! nothing here logs or displays a key, a credential or a client id.

use std::fmt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::wire::{ClientId, Hello, HelloReply};

/// HMAC-SHA-256: the well-kept RustCrypto implementation (`hmac` + `sha2`).
type HmacSha256 = Hmac<Sha256>;

/// Bytes of a cluster key.
pub const KEY_LEN: usize = 32;
/// Bytes of a handshake nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a proof.
pub const PROOF_LEN: usize = 32;
/// A node's HELLO reply: it has no key and authenticates no one.
pub const AUTH_NONE: u32 = 0;
/// A node's HELLO reply: it has a key; the client must check its proof and send AUTH.
pub const AUTH_HMAC: u32 = 1;

/// The first word of a key file, before the key's 64 hex digits.
const KEY_FILE_TAG: &str = "hydramem-cluster-key-v1";

/// Why a key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read or written.
    #[error("cannot {what} the cluster key file {path}: {source}")]
    Io {
        /// read or write.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a key file.
    #[error(
        "{path} is not a hydramem cluster key file (expected one line: {KEY_FILE_TAG} and 64 hex \
         digits); make one with `hydramem key new FILE`"
    )]
    Format {
        /// The file.
        path: PathBuf,
    },
    /// Others than the owner may read the file.
    #[error(
        "the cluster key file {path} may be read by others (mode {mode:o}): whoever reads it \
         can join the cluster and reach every slab; `chmod 600 {path}`"
    )]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// A cluster key. Its `Debug` shows no byte of it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey([u8; KEY_LEN]);

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(…)")
    }
}

impl ClusterKey {
    /// A new random key (the operating system's generator, through `rand`).
    pub fn generate() -> ClusterKey {
        ClusterKey(rand::random())
    }

    /// A key from its bytes (tests, and keys kept elsewhere).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> ClusterKey {
        ClusterKey(bytes)
    }

    /// Reads a key file: refused if it is not one, or if group or others may read it.
    pub fn load(path: &Path) -> Result<ClusterKey, KeyError> {
        use std::os::unix::fs::PermissionsExt;
        let io = |source| KeyError::Io {
            what: "read",
            path: path.to_path_buf(),
            source,
        };
        let mode = std::fs::metadata(path).map_err(io)?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(KeyError::Exposed {
                path: path.to_path_buf(),
                mode: mode & 0o777,
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Self::parse(&text).ok_or_else(|| KeyError::Format {
            path: path.to_path_buf(),
        })
    }

    fn parse(text: &str) -> Option<ClusterKey> {
        let mut words = text.split_whitespace();
        if words.next()? != KEY_FILE_TAG {
            return None;
        }
        let hex = words.next()?;
        if words.next().is_some() || hex.len() != 2 * KEY_LEN || !hex.is_ascii() {
            return None;
        }
        let mut key = [0u8; KEY_LEN];
        for (i, b) in key.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(ClusterKey(key))
    }

    /// Writes the key to a new file only its owner may read (fails if the file exists, so an
    /// existing key is never overwritten by mistake).
    pub fn save(&self, path: &Path) -> Result<(), KeyError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let io = |source| KeyError::Io {
            what: "write",
            path: path.to_path_buf(),
            source,
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(f, "{KEY_FILE_TAG} {hex}").map_err(io)?;
        f.sync_all().map_err(io)
    }

    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        mac(&self.0, label, parts)
    }

    /// The credential of node `node_id`, which keys both proofs of a handshake with it.
    pub fn node_credential(&self, node_id: u32) -> NodeCredential {
        NodeCredential(self.mac(b"hydramem node v1", &[&node_id.to_le_bytes()]))
    }

    /// The owner handle nodes file `client`'s slabs under (see the module doc).
    pub fn owner(&self, client: &ClientId) -> ClientId {
        let m = self.mac(b"hydramem owner v1", &[&client.0]);
        ClientId(m[..16].try_into().expect("16 of 32 bytes"))
    }
}

/// HMAC-SHA-256 under `key` of `label` and `parts`, each part preceded by its length so that
/// no two different sequences of parts hash alike; not yet finalized.
fn keyed(key: &[u8], label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(label);
    for p in parts {
        m.update(&(p.len() as u32).to_le_bytes());
        m.update(p);
    }
    m
}

fn mac(key: &[u8], label: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    keyed(key, label, parts).finalize().into_bytes().into()
}

/// One node's credential (see the module doc). Its `Debug` shows no byte of it.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeCredential([u8; 32]);

impl fmt::Debug for NodeCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NodeCredential(…)")
    }
}

/// What both proofs of one handshake cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transcript {
    /// The node's id (its reply's).
    pub node_id: u32,
    /// The owner handle said in HELLO.
    pub owner: ClientId,
    /// The HELLO flags.
    pub flags: u32,
    /// The client's nonce.
    pub client_nonce: [u8; NONCE_LEN],
    /// The node's nonce.
    pub node_nonce: [u8; NONCE_LEN],
    /// The HELLO's instance (the process speaking for the identity).
    pub instance: u64,
}

impl Transcript {
    fn keyed(&self, cred: &NodeCredential, label: &[u8]) -> HmacSha256 {
        keyed(
            &cred.0,
            label,
            &[
                &self.node_id.to_le_bytes(),
                &self.owner.0,
                &self.flags.to_le_bytes(),
                &self.client_nonce,
                &self.node_nonce,
                &self.instance.to_le_bytes(),
            ],
        )
    }

    fn proof(&self, cred: &NodeCredential, label: &[u8]) -> [u8; PROOF_LEN] {
        self.keyed(cred, label).finalize().into_bytes().into()
    }

    fn verify(&self, cred: &NodeCredential, label: &[u8], proof: &[u8; PROOF_LEN]) -> bool {
        self.keyed(cred, label).verify_slice(proof).is_ok()
    }
}

const NODE_PROOF: &[u8] = b"hydramem node proof v2";
const CLIENT_PROOF: &[u8] = b"hydramem client proof v2";

/// The node's proof in its HELLO reply.
pub fn node_proof(cred: &NodeCredential, t: &Transcript) -> [u8; PROOF_LEN] {
    t.proof(cred, NODE_PROOF)
}

/// Whether `proof` is the node's proof for `t` (constant time).
pub fn node_proof_ok(cred: &NodeCredential, t: &Transcript, proof: &[u8; PROOF_LEN]) -> bool {
    t.verify(cred, NODE_PROOF, proof)
}

/// The client's proof in AUTH. Another label than the node's, so that a node's proof sent
/// back is not a client's.
pub fn client_proof(cred: &NodeCredential, t: &Transcript) -> [u8; PROOF_LEN] {
    t.proof(cred, CLIENT_PROOF)
}

/// Whether `proof` is the client's proof for `t` (constant time).
pub fn client_proof_ok(cred: &NodeCredential, t: &Transcript, proof: &[u8; PROOF_LEN]) -> bool {
    t.verify(cred, CLIENT_PROOF, proof)
}

/// What a client answers to a node's HELLO reply: `None` when nothing is to be proved (neither
/// has a key), the proof to send in AUTH when both have one and the node's proof is right, and
/// why not otherwise — a node without a key when this end has one, or the reverse (never a
/// silent downgrade), or a wrong proof (refused before this end proves anything).
pub fn respond(
    key: Option<&ClusterKey>,
    hello: &Hello,
    reply: &HelloReply,
) -> Result<Option<[u8; PROOF_LEN]>, String> {
    match (key, reply.auth) {
        (None, AUTH_NONE) => Ok(None),
        (None, _) => Err(
            "it requires the cluster key; give it with --cluster-key FILE (or \
             HYDRAMEM_CLUSTER_KEY_FILE, or key_file in the cluster file)"
                .into(),
        ),
        (Some(_), AUTH_NONE) => Err("it runs without a cluster key, and this end has one: \
             refusing to send anything unauthenticated; start the node with --cluster-key, or \
             drop the key here"
            .into()),
        (Some(key), AUTH_HMAC) => {
            let cred = key.node_credential(reply.node_id);
            let t = Transcript {
                node_id: reply.node_id,
                owner: hello.client,
                flags: hello.flags,
                client_nonce: hello.nonce,
                node_nonce: reply.nonce,
                instance: hello.instance,
            };
            if !node_proof_ok(&cred, &t, &reply.proof) {
                return Err(format!(
                    "its proof of the cluster key is wrong: it holds another key, or is not \
                     node {} of this cluster",
                    reply.node_id
                ));
            }
            Ok(Some(client_proof(&cred, &t)))
        }
        (Some(_), other) => Err(format!(
            "it asks for an authentication this build does not know ({other})"
        )),
    }
}

/// A fresh nonce.
pub fn nonce() -> [u8; NONCE_LEN] {
    rand::random()
}

/// The key file named by `flag`, else by `HYDRAMEM_CLUSTER_KEY_FILE`, else by the cluster
/// file's `key_file`, loaded; `None` if none names one.
pub fn key_from(
    flag: Option<&Path>,
    cluster_key_file: Option<&Path>,
) -> Result<Option<ClusterKey>, KeyError> {
    let env = std::env::var_os("HYDRAMEM_CLUSTER_KEY_FILE").map(PathBuf::from);
    match flag
        .map(Path::to_path_buf)
        .or(env)
        .or(cluster_key_file.map(Path::to_path_buf))
    {
        Some(p) => ClusterKey::load(&p).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript() -> Transcript {
        Transcript {
            node_id: 3,
            owner: ClientId([7; 16]),
            flags: 0,
            client_nonce: [1; NONCE_LEN],
            node_nonce: [2; NONCE_LEN],
            instance: 4,
        }
    }

    #[test]
    fn proofs_verify_only_for_their_node_transcript_and_direction() {
        let key = ClusterKey::from_bytes([9; KEY_LEN]);
        let cred = key.node_credential(3);
        let t = transcript();
        let p = client_proof(&cred, &t);
        assert!(client_proof_ok(&cred, &t, &p));
        // Another node's credential (a node replaying a client's proof to the next node).
        assert!(!client_proof_ok(&key.node_credential(4), &t, &p));
        // The node's proof is not the client's, and the reverse.
        assert!(!node_proof_ok(&cred, &t, &p));
        assert!(!client_proof_ok(&cred, &t, &node_proof(&cred, &t)));
        // Every field is covered.
        let changed = [
            Transcript { node_id: 4, ..t },
            Transcript {
                owner: ClientId([8; 16]),
                ..t
            },
            Transcript { flags: 2, ..t },
            Transcript {
                client_nonce: [3; NONCE_LEN],
                ..t
            },
            Transcript {
                node_nonce: [3; NONCE_LEN],
                ..t
            },
            Transcript { instance: 5, ..t },
        ];
        for c in changed {
            assert!(!client_proof_ok(&cred, &c, &p), "{c:?}");
        }
        // Another key.
        let other = ClusterKey::from_bytes([10; KEY_LEN]).node_credential(3);
        assert!(!client_proof_ok(&other, &t, &p));
    }

    #[test]
    fn owner_handles_differ_per_identity_and_per_key_and_hide_the_id() {
        let a = ClusterKey::from_bytes([9; KEY_LEN]);
        let b = ClusterKey::from_bytes([10; KEY_LEN]);
        let id = ClientId([5; 16]);
        assert_eq!(a.owner(&id), a.owner(&id));
        assert_ne!(a.owner(&id), a.owner(&ClientId([6; 16])));
        assert_ne!(a.owner(&id), b.owner(&id));
        assert_ne!(a.owner(&id), id);
    }

    #[test]
    fn key_files_round_trip_and_exposed_or_malformed_ones_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = ClusterKey::generate();
        key.save(&path).unwrap();
        assert_eq!(ClusterKey::load(&path).unwrap(), key);
        assert!(
            key.save(&path).is_err(),
            "an existing key file is not overwritten"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ClusterKey::load(&path).unwrap_err();
        assert!(matches!(e, KeyError::Exposed { mode: 0o644, .. }), "{e}");
        let bad = dir.path().join("bad");
        for text in [
            "",
            "hydramem-cluster-key-v1",
            "hydramem-cluster-key-v1 00",
            "x 00",
        ] {
            std::fs::write(&bad, text).unwrap();
            std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o600)).unwrap();
            assert!(
                matches!(ClusterKey::load(&bad), Err(KeyError::Format { .. })),
                "{text:?}"
            );
        }
        assert_eq!(format!("{key:?}"), "ClusterKey(…)");
    }
}
