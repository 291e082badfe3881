//! A private CA and a server certificate it signed, made with rcgen: for
//! the TLS tests of the upstream (`tests/tls.rs`) and of Redis.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A private CA and a server certificate it signed.
pub struct Pki {
    pub ca_pem: String,
    pub cert: CertificateDer<'static>,
    pub key: PrivateKeyDer<'static>,
    /// The server certificate and key in PEM, for servers that read files (redis-server).
    pub cert_pem: String,
    pub key_pem: String,
}

/// A CA, and a server certificate from it for `names` (DNS names or IPs).
pub fn pki(names: &[&str]) -> Pki {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "wxgate test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_key = KeyPair::generate().expect("CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);

    let mut server =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("server params");
    server.distinguished_name.push(DnType::CommonName, names[0]);
    server.use_authority_key_identifier_extension = true;
    let server_key = KeyPair::generate().expect("server key");
    let server_cert = server.signed_by(&server_key, &issuer).expect("server certificate");
    Pki {
        ca_pem: ca_cert.pem(),
        cert_pem: server_cert.pem(),
        key_pem: server_key.serialize_pem(),
        cert: server_cert.der().clone(),
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
    }
}
