//! The intercept CA: made by `wxgate ca init` ([`generate`]), loaded at
//! start ([`Ca::load`]), and the leaf certificates it signs ([`Ca::leaf`]).
//!
//! Validity, and why:
//! - the CA: [`CA_DAYS`] (two years). It has to be handed to every service
//!   that calls WeChat (a trust store, a Secret), so rotating it is a
//!   deployment chore; two years keeps that rare, and ends a forgotten or
//!   leaked CA within a bounded time. Its name constraints
//!   ([`PERMITTED`]) limit what even a leaked key can impersonate to
//!   `*.weixin.qq.com`, and `pathLen = 0` to signing leaves only.
//! - a leaf: [`LEAF_DAYS`] (seven days), minted in memory, never written
//!   anywhere, and minted again after [`LEAF_RENEW_US`] (a day), so a
//!   long-running wxgate never serves an expired one. Short, because minting
//!   is free; an hour back-dated for clients whose clock is a little behind.

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints, SerialNumber,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::ServerConfig;
use time::OffsetDateTime;

use crate::time::Micros;

/// The CA's validity.
pub const CA_DAYS: i64 = 730;
/// A leaf's validity.
pub const LEAF_DAYS: i64 = 7;
/// A leaf older than this is minted again on its next use.
pub const LEAF_RENEW_US: Micros = 86_400 * 1_000_000;
/// The CA may sign names under this DNS subtree only (RFC 5280 name
/// constraints: `api.weixin.qq.com`, `api2.`, `qyapi.`, `sh.api.` ... all
/// match; nothing else does).
pub const PERMITTED: &str = "weixin.qq.com";
/// Back-dating of every certificate, for clients whose clock is behind.
const SKEW_S: i64 = 3600;

/// A new CA, as PEM text.
pub struct NewCa {
    pub cert_pem: String,
    pub key_pem: String,
    /// Its common name, which says what it is for.
    pub name: String,
}

/// Why a CA cannot be made, loaded, or sign a leaf that verifies. Errors
/// name the key and the file, never quote the key.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// A time out of the certificates' range.
    #[error("the clock: {0}")]
    Clock(time::error::ComponentRange),
    /// The system random source failed.
    #[error("no random numbers for a serial number")]
    Random,
    /// A key pair cannot be generated.
    #[error("cannot generate a key: {0}")]
    KeyGen(rcgen::Error),
    /// The new CA cannot sign its own certificate.
    #[error("cannot sign the CA: {0}")]
    SignCa(rcgen::Error),
    /// `ca_cert` cannot be read.
    #[error("[intercept] ca_cert: {}: {source}", .path.display())]
    CertRead { path: PathBuf, source: std::io::Error },
    /// `ca_key` cannot be read (only the kind of error is shown).
    #[error("[intercept] ca_key: {}: cannot read it ({kind})", .path.display())]
    KeyRead { path: PathBuf, kind: std::io::ErrorKind },
    #[error("[intercept] ca_key: {}: not a PEM private key", .path.display())]
    KeyNotPem { path: PathBuf },
    #[error("[intercept] ca_cert: {}: not a PEM certificate", .path.display())]
    CertNotPem { path: PathBuf },
    /// `ca_cert` is no CA certificate rcgen can sign with.
    #[error("[intercept] ca_cert: {}: not a usable CA certificate ({source})", .path.display())]
    NotCa { path: PathBuf, source: rcgen::Error },
    /// `ca_cert` is not an X.509 certificate this wxgate can read.
    #[error("[intercept] ca_cert: {}: not a usable CA certificate ({why})", .path.display())]
    NotX509 { path: PathBuf, why: x509_parser::nom::Err<x509_parser::error::X509Error> },
    /// The CA is not valid now.
    #[error("[intercept] ca_cert: valid from {from} to {to}, not now: make a new CA (`wxgate ca init`) and give it to the services")]
    NotNow { from: OffsetDateTime, to: OffsetDateTime },
    /// `host` is not a name a certificate can be for.
    #[error("a certificate for {host}: {source}")]
    LeafName { host: String, source: rcgen::Error },
    #[error("cannot sign a certificate for {host}: {source}")]
    SignLeaf { host: String, source: rcgen::Error },
    /// rustls cannot set up TLS with wxgate's crypto provider.
    #[error("TLS set-up: {0}")]
    Tls(rustls::Error),
    /// rustls refuses the leaf and its key as a server's.
    #[error("TLS set-up for {host}: {source}")]
    TlsLeaf { host: String, source: rustls::Error },
    /// rustls does not take `ca_cert` as a trust anchor.
    #[error("[intercept] ca_cert: not a usable CA certificate ({0})")]
    NotAnchor(rustls::Error),
    /// No verifier can be built on `ca_cert`.
    #[error("[intercept] ca_cert: {0}")]
    Verifier(rustls::client::VerifierBuilderError),
    /// `host` is not a server name.
    #[error("[intercept] hosts: {host}: {source}")]
    HostName { host: String, source: rustls::pki_types::InvalidDnsNameError },
    /// A leaf does not verify against the CA as a client would check it.
    #[error(
        "[intercept] a certificate for {host} signed with ca_key does not verify against ca_cert ({source}): the key \
         must be the certificate's, the CA valid now, and {host} allowed by its name constraints (`wxgate ca init` \
         makes CAs for *.{PERMITTED})"
    )]
    Unverified { host: String, source: rustls::Error },
}

fn datetime(unix_s: i64) -> Result<OffsetDateTime, CaError> {
    OffsetDateTime::from_unix_timestamp(unix_s).map_err(CaError::Clock)
}

/// A random serial number (RFC 5280: positive, at most 20 octets).
fn serial() -> Result<SerialNumber, CaError> {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).map_err(|_| CaError::Random)?;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

/// A CA for `[intercept]` (ECDSA P-256), valid [`CA_DAYS`] from `now_us`,
/// constrained to [`PERMITTED`], named after `label` (the machine or
/// deployment it is for) and its date.
pub fn generate(label: &str, now_us: Micros) -> Result<NewCa, CaError> {
    let now = now_us / 1_000_000;
    let key = KeyPair::generate().map_err(CaError::KeyGen)?;
    let mut params = CertificateParams::default();
    let date = datetime(now)?.date();
    let name = format!("wxgate intercept CA ({label}, {date}): for {PERMITTED} hosts only");
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name.clone());
    dn.push(DnType::OrganizationName, "wxgate");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: vec![GeneralSubtree::DnsName(PERMITTED.into())],
        excluded_subtrees: Vec::new(),
    });
    params.not_before = datetime(now - SKEW_S)?;
    params.not_after = datetime(now + CA_DAYS * 86_400)?;
    params.serial_number = Some(serial()?);
    let cert = params.self_signed(&key).map_err(CaError::SignCa)?;
    Ok(NewCa { cert_pem: cert.pem(), key_pem: key.serialize_pem(), name })
}

/// A loaded CA: what signs the leaves, and its certificate (to check them).
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    /// The certificate's validity, Unix seconds.
    not_before: i64,
    not_after: i64,
}

impl std::fmt::Debug for Ca {
    /// Never shows the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ca { .. }")
    }
}

impl Ca {
    /// Reads `[intercept] ca_cert` and `ca_key` (PEM). Errors name the key
    /// and file, never quote the key.
    pub fn load(cert_path: &std::path::Path, key_path: &std::path::Path) -> Result<Ca, CaError> {
        let (cert_at, key_at) = (|| cert_path.to_owned(), || key_path.to_owned());
        let cert_pem =
            std::fs::read_to_string(cert_path).map_err(|source| CaError::CertRead { path: cert_at(), source })?;
        let key_pem =
            std::fs::read_to_string(key_path).map_err(|e| CaError::KeyRead { path: key_at(), kind: e.kind() })?;
        let key = KeyPair::from_pem(&key_pem).map_err(|_| CaError::KeyNotPem { path: key_at() })?;
        let cert: CertificateDer<'static> = rustls_pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map_err(|_| CaError::CertNotPem { path: cert_at() })?;
        let issuer =
            Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|source| CaError::NotCa { path: cert_at(), source })?;
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
            .map_err(|why| CaError::NotX509 { path: cert_at(), why })?;
        let validity = parsed.validity();
        let (not_before, not_after) = (validity.not_before.timestamp(), validity.not_after.timestamp());
        Ok(Ca { issuer, cert, not_before, not_after })
    }

    /// When the CA expires, Unix seconds.
    pub fn not_after(&self) -> i64 {
        self.not_after
    }

    /// A TLS server config for `host`: a fresh key and a leaf certificate
    /// for it signed by the CA, valid [`LEAF_DAYS`] from `now_us`; HTTP/1.1
    /// only (ALPN).
    pub fn leaf(&self, host: &str, now_us: Micros) -> Result<Arc<ServerConfig>, CaError> {
        let now = now_us / 1_000_000;
        // rustls clients take a trust anchor as it is; OpenSSL's (Python's) check its dates.
        if now < self.not_before || now >= self.not_after {
            return Err(CaError::NotNow { from: datetime(self.not_before)?, to: datetime(self.not_after)? });
        }
        let key = KeyPair::generate().map_err(CaError::KeyGen)?;
        let mut params = CertificateParams::new(vec![host.to_owned()])
            .map_err(|source| CaError::LeafName { host: host.to_owned(), source })?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = datetime(now - SKEW_S)?;
        params.not_after = datetime(now + LEAF_DAYS * 86_400)?;
        params.serial_number = Some(serial()?);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|source| CaError::SignLeaf { host: host.to_owned(), source })?;
        let der = cert.der().clone();
        self.verify(&der, host, now)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(CaError::Tls)?
            .with_no_client_auth()
            .with_single_cert(vec![der], key)
            .map_err(|source| CaError::TlsLeaf { host: host.to_owned(), source })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Checks a leaf as a client trusting only the CA would: the CA key
    /// signed it (the key file matches the certificate), both are within
    /// their validity, and the CA's name constraints allow `host`.
    fn verify(&self, leaf: &CertificateDer<'static>, host: &str, now_s: i64) -> Result<(), CaError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.clone()).map_err(CaError::NotAnchor)?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .map_err(CaError::Verifier)?;
        let name = ServerName::try_from(host.to_owned())
            .map_err(|source| CaError::HostName { host: host.to_owned(), source })?;
        let now = UnixTime::since_unix_epoch(std::time::Duration::from_secs(now_s.max(0) as u64));
        verifier
            .verify_server_cert(leaf, &[], &name, &[], now)
            .map(|_| ())
            .map_err(|source| CaError::Unverified { host: host.to_owned(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_US: Micros = 1_795_000_000 * 1_000_000;

    #[test]
    fn a_new_ca_signs_leaves_for_wechat_hosts_only() {
        let ca = generate("test", NOW_US).expect("ca");
        assert!(ca.name.contains("wxgate intercept CA") && ca.name.contains(PERMITTED), "{}", ca.name);
        let dir = std::env::temp_dir().join(format!("wxgate-ca-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (c, k) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
        std::fs::write(&c, &ca.cert_pem).expect("write");
        std::fs::write(&k, &ca.key_pem).expect("write");
        let loaded = Ca::load(&c, &k).expect("load");
        for host in ["api.weixin.qq.com", "api2.weixin.qq.com", "qyapi.weixin.qq.com", "sh.api.weixin.qq.com"] {
            loaded.leaf(host, NOW_US).unwrap_or_else(|e| panic!("{host}: {e}"));
        }
        let refused = loaded.leaf("example.com", NOW_US).expect_err("outside the name constraints").to_string();
        assert!(refused.contains("name constraints"), "{refused}");
        let late = NOW_US + (CA_DAYS + 1) * 86_400 * 1_000_000;
        assert!(loaded.leaf("api.weixin.qq.com", late).is_err(), "an expired CA signs nothing usable");
        // Another CA's key with this certificate: caught at start.
        let other = generate("other", NOW_US).expect("ca");
        std::fs::write(&k, &other.key_pem).expect("write");
        let mixed = Ca::load(&c, &k).expect("load");
        assert!(mixed.leaf("api.weixin.qq.com", NOW_US).is_err(), "a key that is not the CA's");
        assert!(!format!("{mixed:?}").contains("PRIVATE"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
