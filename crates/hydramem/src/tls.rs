//! TLS on the node protocol: the cluster's own certificate authority, a certificate per
//! member, and connections that are encrypted and authenticated both ways (rustls).
//!
//! The cluster key (see [`crate::auth`]) proves membership but sends everything in the clear;
//! on a network others can read or alter, members use TLS as well. A cluster has one CA
//! (`hydramem tls ca DIR`: `ca.pem`, and `ca.key`, which signs members and should stay
//! offline); each node and client machine gets a member directory (`hydramem tls issue DIR
//! NAME`: `ca.pem`, `cert.pem`, `key.pem`), passed as `--tls DIR` (or `HYDRAMEM_TLS_DIR`, or
//! `tls_dir` in the cluster file). Every member certificate names [`MEMBER_NAME`] and may
//! serve and connect: a node accepts a connection only from a peer whose certificate the
//! cluster CA signed, and a client or node connects only to one. Which node a peer is stays
//! the business of the cluster key's per-node credential (a member certificate does not
//! name a node), so TLS adds privacy and keeps outsiders out, and the key keeps members
//! honest about who they are.
//!
//! [`Link`] is a blocking connection, plain or TLS, for the connections served one request at
//! a time (a node's connections, tools, a regenerating node's sources); the client's data path
//! drives its [`rustls::ClientConnection`] itself (`client::tcp`), because its sending and
//! receiving run on different threads.
//!
//! Invariants: a key file group or others may read is refused, as the cluster key's is; a
//! handshake that does not finish within the socket's timeouts and the given deadline fails;
//! a peer without a certificate from the cluster CA never gets a byte of the protocol.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};

/// The environment variable naming the TLS member directory (as `--tls` does).
pub const TLS_DIR_ENV: &str = "HYDRAMEM_TLS_DIR";

/// The name every member certificate carries and every connection checks.
pub const MEMBER_NAME: &str = "hydramem-member";
/// The CA's distinguished name (rebuilt when issuing: the CA's key and name are all a
/// signature needs).
const CA_NAME: &str = "hydramem cluster CA";
/// How long issued certificates are valid, in years (then issue new ones: `hydramem tls
/// issue`).
const VALID_YEARS: i32 = 5;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("cannot {what} {path}: {source}")]
    Io {
        /// read, write or create.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A file is not what it should be.
    #[error("{path}: {what}; make the member directory with `hydramem tls issue`")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// Others than the owner may read a private key.
    #[error(
        "the private key {path} may be read by others (mode {mode:o}): whoever reads it can \
         pass for a member of the cluster; `chmod 600 {path}`"
    )]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// rustls refused the certificates or key.
    #[error("the TLS files in {dir} do not make a valid configuration: {reason}")]
    Config {
        /// The member directory.
        dir: PathBuf,
        /// rustls's reason.
        reason: String,
    },
    /// A certificate could not be made.
    #[error("cannot make a certificate: {0}")]
    Issue(#[from] rcgen::Error),
}

/// A member's TLS identity: its certificate and key, and the cluster CA it trusts.
#[derive(Clone)]
pub struct Tls {
    dir: PathBuf,
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

/// Two configurations are the same if loaded from the same directory.
impl PartialEq for Tls {
    fn eq(&self, other: &Tls) -> bool {
        self.dir == other.dir
    }
}

impl Eq for Tls {}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tls({})", self.dir.display())
    }
}

impl Tls {
    /// Loads the member directory `dir` (`ca.pem`, `cert.pem`, `key.pem`).
    pub fn load(dir: &Path) -> Result<Tls, TlsError> {
        let ca = read_certs(&dir.join("ca.pem"))?;
        let certs = read_certs(&dir.join("cert.pem"))?;
        let key = read_key(&dir.join("key.pem"))?;
        let config = |e: &dyn std::fmt::Display| TlsError::Config {
            dir: dir.to_path_buf(),
            reason: e.to_string(),
        };
        let mut roots = RootCertStore::empty();
        for c in ca {
            roots.add(c).map_err(|e| config(&e))?;
        }
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder(roots.clone())
            .build()
            .map_err(|e| config(&e))?;
        let server = ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| config(&e))?;
        let client = ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| config(&e))?;
        Ok(Tls {
            dir: dir.to_path_buf(),
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }

    /// The member directory it was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A client side of a new connection to a member.
    pub fn client(&self) -> ClientConnection {
        let name = ServerName::try_from(MEMBER_NAME).expect("a valid DNS name");
        ClientConnection::new(self.client.clone(), name)
            .expect("a client configuration that rustls built accepts a connection")
    }

    /// A server side of a new connection from a member.
    pub fn server(&self) -> ServerConnection {
        ServerConnection::new(self.server.clone())
            .expect("a server configuration that rustls built accepts a connection")
    }

    /// Runs the server side of a TLS handshake on the blocking socket `sock` (whose read
    /// timeout paces the wait), `early` being bytes of it already read off the socket, within
    /// `deadline`; then splits the session for one reader and many writers ([`Shared`]).
    pub fn start_server<S>(
        &self,
        sock: S,
        early: &[u8],
        deadline: Instant,
    ) -> io::Result<(SessionReader<S>, SessionWriter<S>)>
    where
        for<'a> &'a S: Read + Write,
    {
        let mut conn = self.server();
        let mut rd = early;
        while !rd.is_empty() {
            conn.read_tls(&mut rd)?;
            conn.process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
        handshake(&mut *conn, &mut &sock, deadline)?;
        let shared = Arc::new(Shared {
            conn: parking_lot::Mutex::new(conn),
            sock,
        });
        let reader = SessionReader {
            shared: shared.clone(),
            raw: vec![0; 16 << 10],
            start: 0,
            end: 0,
        };
        Ok((reader, SessionWriter(shared)))
    }
}

/// A server's TLS session over a blocking socket, shared by one reading thread and any
/// number of writing ones (the NBD transmission phase: a connection's thread reads requests,
/// workers send replies). The reader waits on the socket without holding the session, so
/// writers are never held up by a quiet client; each takes the session only to move bytes.
#[derive(Debug)]
pub struct Shared<S> {
    conn: parking_lot::Mutex<ServerConnection>,
    sock: S,
}

/// The reading side of a [`Shared`] session: plaintext in. Ciphertext read off the socket
/// and not yet taken by the session waits in `raw`.
#[derive(Debug)]
pub struct SessionReader<S> {
    shared: Arc<Shared<S>>,
    raw: Vec<u8>,
    start: usize,
    end: usize,
}

/// The writing side of a [`Shared`] session: plaintext out; clones write to the same session.
#[derive(Debug)]
pub struct SessionWriter<S>(Arc<Shared<S>>);

impl<S> Clone for SessionWriter<S> {
    fn clone(&self) -> Self {
        SessionWriter(self.0.clone())
    }
}

impl<S> Read for SessionReader<S>
where
    for<'a> &'a S: Read + Write,
{
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut conn = self.shared.conn.lock();
            match conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            // Nothing decrypted is waiting. The session takes ciphertext only while its
            // plaintext is drained, so it is given what was read before, a piece at a time.
            if self.start < self.end {
                let mut rd = &self.raw[self.start..self.end];
                self.start += conn.read_tls(&mut rd)?;
                conn.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                // A session message to answer (a key update).
                send_pending(&mut **conn, &self.shared.sock)?;
                continue;
            }
            drop(conn);
            // Wait on the socket with the session free, so writers go on meanwhile.
            let n = (&self.shared.sock).read(&mut self.raw)?;
            if n == 0 {
                // The end of the stream: the session then says whether it was a clean close.
                self.shared.conn.lock().read_tls(&mut &[][..])?;
                continue;
            }
            (self.start, self.end) = (0, n);
        }
    }
}

impl<S> Write for SessionWriter<S>
where
    for<'a> &'a S: Read + Write,
{
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let s = &*self.0;
        let mut conn = s.conn.lock();
        // What an earlier write left encrypted goes first, so the session has room.
        send_pending(&mut **conn, &s.sock)?;
        let n = conn.writer().write(buf)?;
        send_pending(&mut **conn, &s.sock)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        let s = &*self.0;
        let mut conn = s.conn.lock();
        conn.writer().flush()?;
        send_pending(&mut **conn, &s.sock)?;
        Ok(())
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let format = |what: String| TlsError::Format {
        path: path.to_path_buf(),
        what,
    };
    let text = std::fs::read(path).map_err(|source| TlsError::Io {
        what: "read",
        path: path.to_path_buf(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format(format!("not PEM certificates ({e})")))?;
    if certs.is_empty() {
        return Err(format("no certificate in it".into()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    check_private(path)?;
    let text = std::fs::read(path).map_err(|source| TlsError::Io {
        what: "read",
        path: path.to_path_buf(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| TlsError::Format {
        path: path.to_path_buf(),
        what: format!("not a PEM private key ({e})"),
    })
}

/// Refuses a private key file that group or others may read.
fn check_private(path: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|source| TlsError::Io {
            what: "read",
            path: path.to_path_buf(),
            source,
        })?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(TlsError::Exposed {
            path: path.to_path_buf(),
            mode: mode & 0o777,
        });
    }
    Ok(())
}

/// Writes `text` to a new file `path` (never over an existing one), readable by its owner
/// only if `private`.
fn create(path: &Path, text: &str, private: bool) -> Result<(), TlsError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .map_err(|source| TlsError::Io {
            what: "create",
            path: path.to_path_buf(),
            source,
        })?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|source| TlsError::Io {
            what: "write",
            path: path.to_path_buf(),
            source,
        })
}

fn ca_params() -> Result<rcgen::CertificateParams, TlsError> {
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, CA_NAME);
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

/// Valid from the first of January of this year (room for clocks that lag) for
/// [`VALID_YEARS`] years.
fn validity(p: &mut rcgen::CertificateParams) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Days to years without a calendar library: off by a day at a year's turn, which the
    // backdated start absorbs.
    let year = 1970 + i32::try_from(secs / 31_556_952).unwrap_or(0);
    p.not_before = rcgen::date_time_ymd(year, 1, 1);
    p.not_after = rcgen::date_time_ymd(year + VALID_YEARS, 1, 1);
}

/// Makes a new cluster CA in `dir` (created if missing): `ca.pem` and `ca.key` (mode 600).
/// Refuses to overwrite an existing CA.
pub fn new_ca(dir: &Path) -> Result<(), TlsError> {
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Io {
        what: "create",
        path: dir.to_path_buf(),
        source,
    })?;
    let key = rcgen::KeyPair::generate()?;
    let mut params = ca_params()?;
    validity(&mut params);
    let cert = params.self_signed(&key)?;
    create(&dir.join("ca.key"), &key.serialize_pem(), true)?;
    create(&dir.join("ca.pem"), &cert.pem(), false)
}

/// Issues a member certificate signed by the CA in `ca_dir` into the new member directory
/// `out` (`ca.pem`, `cert.pem`, `key.pem`), `name` as its common name (for the operator: the
/// machine it is for).
pub fn issue(ca_dir: &Path, name: &str, out: &Path) -> Result<(), TlsError> {
    let ca_pem = std::fs::read_to_string(ca_dir.join("ca.pem")).map_err(|source| TlsError::Io {
        what: "read",
        path: ca_dir.join("ca.pem"),
        source,
    })?;
    let ca_key_path = ca_dir.join("ca.key");
    check_private(&ca_key_path)?;
    let ca_key_pem = std::fs::read_to_string(&ca_key_path).map_err(|source| TlsError::Io {
        what: "read",
        path: ca_key_path.clone(),
        source,
    })?;
    let ca_key = rcgen::KeyPair::from_pem(&ca_key_pem).map_err(|e| TlsError::Format {
        path: ca_key_path,
        what: format!("not the CA's private key ({e})"),
    })?;
    let issuer = rcgen::Issuer::new(ca_params()?, ca_key);
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(vec![MEMBER_NAME.to_string()])?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params);
    let cert = params.signed_by(&key, &issuer)?;
    std::fs::create_dir_all(out).map_err(|source| TlsError::Io {
        what: "create",
        path: out.to_path_buf(),
        source,
    })?;
    create(&out.join("key.pem"), &key.serialize_pem(), true)?;
    create(&out.join("cert.pem"), &cert.pem(), false)?;
    create(&out.join("ca.pem"), &ca_pem, false)
}

/// A blocking connection to a peer: plain TCP, or TLS over it (see the module doc).
#[derive(Debug)]
pub enum Link {
    /// No TLS.
    Tcp(TcpStream),
    /// This end connected.
    Client(Box<rustls::StreamOwned<ClientConnection, TcpStream>>),
    /// This end accepted.
    Server(Box<rustls::StreamOwned<ServerConnection, TcpStream>>),
}

impl Link {
    /// The connection `sock`, with TLS as its client if `tls`: the handshake runs now, within
    /// the socket's read timeout per step and `deadline` in all.
    pub fn connect(sock: TcpStream, tls: Option<&Tls>, deadline: Instant) -> io::Result<Link> {
        match tls {
            None => Ok(Link::Tcp(sock)),
            Some(t) => {
                let mut s = rustls::StreamOwned::new(t.client(), sock);
                handshake(&mut *s.conn, &mut s.sock, deadline)?;
                Ok(Link::Client(Box::new(s)))
            }
        }
    }

    /// The accepted connection `sock`, with TLS as its server if `tls` (handshake as in
    /// [`Link::connect`]).
    pub fn accept(sock: TcpStream, tls: Option<&Tls>, deadline: Instant) -> io::Result<Link> {
        match tls {
            None => Ok(Link::Tcp(sock)),
            Some(t) => {
                let mut s = rustls::StreamOwned::new(t.server(), sock);
                handshake(&mut *s.conn, &mut s.sock, deadline)?;
                Ok(Link::Server(Box::new(s)))
            }
        }
    }

    /// The TCP socket underneath (timeouts, addresses, shutdown).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Link::Tcp(s) => s,
            Link::Client(s) => &s.sock,
            Link::Server(s) => &s.sock,
        }
    }

    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        !matches!(self, Link::Tcp(_))
    }

    /// The socket and, with TLS, the client connection in the state the handshake left it.
    pub fn into_client_parts(self) -> (TcpStream, Option<ClientConnection>) {
        match self {
            Link::Tcp(s) => (s, None),
            Link::Client(s) => {
                let s = *s;
                (s.sock, Some(s.conn))
            }
            Link::Server(s) => (s.sock, None),
        }
    }
}

/// Runs a TLS handshake to its end on a blocking socket: every read timeout is retried until
/// `deadline`; a failure names its cause (a peer outside the cluster fails here).
fn handshake<S: rustls::SideData>(
    conn: &mut rustls::ConnectionCommon<S>,
    sock: &mut (impl Read + Write),
    deadline: Instant,
) -> io::Result<()> {
    while conn.is_handshaking() {
        match conn.complete_io(sock) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the TLS handshake did not finish in time",
                    ));
                }
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "TLS handshake failed: {e} (do both ends hold certificates from the same \
                         cluster CA? see `hydramem tls issue`)"
                    ),
                ))
            }
        }
    }
    // What the handshake's last step left to send (a TLS 1.3 client's Finished).
    send_pending(conn, sock)
}

/// Writes every encrypted byte the session holds to a blocking socket.
fn send_pending<D: rustls::SideData>(
    conn: &mut rustls::ConnectionCommon<D>,
    mut sock: impl Write,
) -> io::Result<()> {
    while conn.wants_write() {
        conn.write_tls(&mut sock)?;
    }
    Ok(())
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Tcp(s) => s.read(buf),
            Link::Client(s) => s.read(buf),
            Link::Server(s) => s.read(buf),
        }
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Link::Tcp(s) => s.write(buf),
            Link::Client(s) => s.write(buf),
            Link::Server(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Link::Tcp(s) => s.flush(),
            Link::Client(s) => s.flush(),
            Link::Server(s) => s.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Duration;

    /// A CA in `root`/ca and members `names` issued from it.
    fn cluster(root: &Path, names: &[&str]) -> Vec<Tls> {
        new_ca(&root.join("ca")).unwrap();
        names
            .iter()
            .map(|n| {
                issue(&root.join("ca"), n, &root.join(n)).unwrap();
                Tls::load(&root.join(n)).unwrap()
            })
            .collect()
    }

    /// Connects `client` to a server with `server`; what each end got.
    fn talk(client: Option<&Tls>, server: Option<&Tls>) -> (io::Result<Vec<u8>>, io::Result<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = server.cloned();
        let t = std::thread::spawn(move || -> io::Result<()> {
            let (s, _) = l.accept()?;
            s.set_read_timeout(Some(Duration::from_millis(200)))?;
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut link = Link::accept(s, server.as_ref(), deadline)?;
            let mut b = [0u8; 5];
            link.read_exact(&mut b)?;
            link.write_all(&b)?;
            link.flush()
        });
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let got = Link::connect(s, client, Instant::now() + Duration::from_secs(5)).and_then(
            |mut link| {
                link.write_all(b"hello")?;
                link.flush()?;
                let mut b = vec![0u8; 5];
                link.read_exact(&mut b)?;
                Ok(b)
            },
        );
        (got, t.join().unwrap())
    }

    #[test]
    fn members_of_one_ca_talk_and_others_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let m = cluster(d.path(), &["a", "b"]);
        let (got, served) = talk(Some(&m[0]), Some(&m[1]));
        assert_eq!(got.unwrap(), b"hello");
        served.unwrap();
        // A member of another cluster is refused both ways.
        let other = tempfile::tempdir().unwrap();
        let o = cluster(other.path(), &["x"]);
        let (got, served) = talk(Some(&o[0]), Some(&m[1]));
        assert!(got.is_err() && served.is_err());
        let (got, served) = talk(Some(&m[0]), Some(&o[0]));
        assert!(got.is_err() && served.is_err());
        // A plain client of a TLS server gets no answer (at most a TLS alert).
        let (got, served) = talk(None, Some(&m[1]));
        assert!(served.is_err());
        assert!(
            got.map_or(true, |b| b != b"hello"),
            "a plain client was answered"
        );
    }

    #[test]
    fn an_exposed_key_is_refused_and_nothing_is_overwritten() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        cluster(d.path(), &["a"]);
        let key = d.path().join("a/key.pem");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Tls::load(&d.path().join("a")).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        assert!(
            new_ca(&d.path().join("ca")).is_err(),
            "an existing CA was overwritten"
        );
        let e = Tls::load(d.path()).unwrap_err();
        assert!(e.to_string().contains("cannot read"), "{e}");
    }
}
