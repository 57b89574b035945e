//! Bearer-token authentication and TLS configuration for the analyzer service and its
//! clients.
//!
//! * Token: the server reads a token file (`--token-file`), trims surrounding whitespace
//!   and refuses (gRPC `Unauthenticated`) every RPC whose `authorization` metadata is not
//!   exactly `Bearer <token>`. Refusals are counted in `ccld_auth_failures_total`. Clients
//!   read the same file and send the header on every call.
//! * TLS: rustls through tonic, with the `ring` crypto provider. The server takes a PEM
//!   certificate chain and private key; a client takes the PEM CA certificate that signed
//!   it (and optionally the name to verify, when the address is an IP).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
use tonic::{Request, Status};

use crate::metrics::Metrics;

/// Maximum size of a token file.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// Errors loading credentials.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A file could not be read.
    #[error("cannot read {what} file {path}: {source}")]
    Read {
        /// Which file (`token`, `TLS certificate`, ...).
        what: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The token file is empty, too long or not a valid header value.
    #[error("token file {path}: {reason}")]
    BadToken {
        /// Path.
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
    /// A PEM file does not contain what it should.
    #[error("{what} file {path} holds no PEM {expect} block")]
    BadPem {
        /// Which file.
        what: &'static str,
        /// Path.
        path: PathBuf,
        /// The expected PEM block kind.
        expect: &'static str,
    },
    /// Only one of certificate and key was given.
    #[error("--tls-cert and --tls-key must be given together")]
    HalfTls,
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, AuthError> {
    std::fs::read(path).map_err(|source| AuthError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// Validates a token string (what the file holds, trimmed).
pub fn validate_token(t: &str) -> Result<(), &'static str> {
    if t.is_empty() {
        return Err("the token is empty");
    }
    if t.len() > MAX_TOKEN_BYTES {
        return Err("the token is longer than 4096 bytes");
    }
    if !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the token must be printable ASCII without spaces");
    }
    Ok(())
}

/// Reads and validates a token file.
pub fn load_token(path: &Path) -> Result<String, AuthError> {
    let raw = read("token", path)?;
    let s = String::from_utf8(raw).map_err(|_| AuthError::BadToken {
        path: path.to_path_buf(),
        reason: "the file is not UTF-8",
    })?;
    let t = s.trim().to_string();
    validate_token(&t).map_err(|reason| AuthError::BadToken {
        path: path.to_path_buf(),
        reason,
    })?;
    Ok(t)
}

fn pem_has(bytes: &[u8], label_part: &str) -> bool {
    let s = String::from_utf8_lossy(bytes);
    s.lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.contains(label_part))
}

/// Server TLS from PEM certificate chain and key files.
pub fn server_tls(cert: &Path, key: &Path) -> Result<ServerTlsConfig, AuthError> {
    let c = read("TLS certificate", cert)?;
    let k = read("TLS key", key)?;
    if !pem_has(&c, "CERTIFICATE") {
        return Err(AuthError::BadPem {
            what: "TLS certificate",
            path: cert.to_path_buf(),
            expect: "CERTIFICATE",
        });
    }
    if !pem_has(&k, "PRIVATE KEY") {
        return Err(AuthError::BadPem {
            what: "TLS key",
            path: key.to_path_buf(),
            expect: "PRIVATE KEY",
        });
    }
    Ok(ServerTlsConfig::new().identity(Identity::from_pem(c, k)))
}

/// Client TLS trusting the CA in `ca` (PEM); `domain` overrides the name checked against
/// the server certificate (needed when connecting by IP address to a certificate issued
/// for a host name).
pub fn client_tls(ca: &Path, domain: Option<&str>) -> Result<ClientTlsConfig, AuthError> {
    let c = read("CA certificate", ca)?;
    if !pem_has(&c, "CERTIFICATE") {
        return Err(AuthError::BadPem {
            what: "CA certificate",
            path: ca.to_path_buf(),
            expect: "CERTIFICATE",
        });
    }
    let mut cfg = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(c));
    if let Some(d) = domain {
        cfg = cfg.domain_name(d.to_string());
    }
    Ok(cfg)
}

/// Compares two byte strings in time independent of where they differ.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Server-side interceptor: checks `authorization: Bearer <token>` when a token is set.
#[derive(Clone)]
pub struct AuthInterceptor {
    expected: Option<Arc<Vec<u8>>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for AuthInterceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthInterceptor")
            .field("token_required", &self.expected.is_some())
            .finish()
    }
}

impl AuthInterceptor {
    /// An interceptor requiring `token` (none: every call passes).
    pub fn new(token: Option<&str>, metrics: Arc<Metrics>) -> Self {
        Self {
            expected: token.map(|t| Arc::new(format!("Bearer {t}").into_bytes())),
            metrics,
        }
    }

    /// Checks one request's metadata.
    pub fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let Some(exp) = &self.expected else {
            return Ok(());
        };
        let ok = req
            .metadata()
            .get("authorization")
            .map(|v| ct_eq(v.as_bytes(), exp))
            .unwrap_or(false);
        if ok {
            Ok(())
        } else {
            self.metrics.auth_failures.fetch_add(1, Ordering::Relaxed);
            let why = if req.metadata().get("authorization").is_some() {
                "wrong bearer token"
            } else {
                "missing `authorization: Bearer <token>` metadata"
            };
            Err(Status::unauthenticated(why))
        }
    }
}

impl tonic::service::Interceptor for AuthInterceptor {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.check(&req)?;
        Ok(req)
    }
}

/// Client-side interceptor adding the bearer token to every call.
#[derive(Clone, Default)]
pub struct TokenInterceptor {
    header: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl std::fmt::Debug for TokenInterceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenInterceptor")
            .field("has_token", &self.header.is_some())
            .finish()
    }
}

impl TokenInterceptor {
    /// Adds `Bearer <token>` when a token is given. The token must pass
    /// [`validate_token`].
    pub fn new(token: Option<&str>) -> Result<Self, &'static str> {
        let header = match token {
            None => None,
            Some(t) => {
                validate_token(t)?;
                Some(
                    format!("Bearer {t}")
                        .parse()
                        .map_err(|_| "the token is not a valid header value")?,
                )
            }
        };
        Ok(Self { header })
    }
}

impl tonic::service::Interceptor for TokenInterceptor {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(h) = &self.header {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn token_validation() {
        assert!(validate_token("abc-123_XYZ").is_ok());
        assert!(validate_token("").is_err());
        assert!(validate_token("has space").is_err());
        assert!(validate_token("tab\there").is_err());
        assert!(validate_token("é").is_err());
        assert!(validate_token(&"x".repeat(4097)).is_err());
    }

    #[test]
    fn load_token_trims_and_rejects_empty() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        std::fs::write(&p, "  s3cret\n").unwrap();
        assert_eq!(load_token(&p).unwrap(), "s3cret");
        std::fs::write(&p, "\n\n").unwrap();
        assert!(matches!(load_token(&p), Err(AuthError::BadToken { .. })));
        assert!(matches!(
            load_token(&d.path().join("missing")),
            Err(AuthError::Read { .. })
        ));
    }

    #[test]
    fn interceptor_accepts_only_the_right_token() {
        let m = Arc::new(Metrics::new(0));
        let mut a = AuthInterceptor::new(Some("tok"), m.clone());
        let mut with = |v: Option<&str>| {
            let mut r = Request::new(());
            if let Some(v) = v {
                r.metadata_mut().insert("authorization", v.parse().unwrap());
            }
            a.call(r).map(|_| ()).map_err(|s| s.code())
        };
        assert_eq!(with(Some("Bearer tok")), Ok(()));
        assert_eq!(with(None), Err(tonic::Code::Unauthenticated));
        assert_eq!(with(Some("Bearer tok2")), Err(tonic::Code::Unauthenticated));
        assert_eq!(with(Some("bearer tok")), Err(tonic::Code::Unauthenticated));
        assert_eq!(with(Some("tok")), Err(tonic::Code::Unauthenticated));
        assert_eq!(m.auth_failures.load(Ordering::Relaxed), 4);
        let mut open = AuthInterceptor::new(None, m.clone());
        assert!(open.call(Request::new(())).is_ok());
    }

    #[test]
    fn token_interceptor_sets_header() {
        let mut t = TokenInterceptor::new(Some("abc")).unwrap();
        let r = t.call(Request::new(())).unwrap();
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer abc");
        let mut none = TokenInterceptor::new(None).unwrap();
        assert!(none
            .call(Request::new(()))
            .unwrap()
            .metadata()
            .get("authorization")
            .is_none());
        assert!(TokenInterceptor::new(Some("a b")).is_err());
    }

    #[test]
    fn pem_checks() {
        let d = tempfile::tempdir().unwrap();
        let c = d.path().join("c.pem");
        let k = d.path().join("k.pem");
        std::fs::write(&c, "junk").unwrap();
        std::fs::write(
            &k,
            "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        assert!(matches!(server_tls(&c, &k), Err(AuthError::BadPem { .. })));
        assert!(matches!(
            client_tls(&c, None),
            Err(AuthError::BadPem { .. })
        ));
    }
}
