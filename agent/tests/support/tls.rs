//! A throwaway certificate authority made with the `openssl` command: a CA and one
//! server certificate it signed, valid for the names and IPs given (peer TLS tests).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::oci::{require_tool, run};

/// PEM files under a test's temp dir.
pub struct Certs {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Makes a CA and a server certificate for `dns` names and `ips` under `dir`.
pub fn make_certs(dir: &Path, dns: &[&str], ips: &[&str]) -> Certs {
    require_tool("openssl");
    std::fs::create_dir_all(dir).expect("certs dir");
    let p = |name: &str| dir.join(name);
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "2", "-subj", "/CN=tessera-test-ca"])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        .arg("-keyout")
        .arg(p("ca.key"))
        .arg("-out")
        .arg(p("ca.pem")));
    let san: Vec<String> = dns
        .iter()
        .map(|d| format!("DNS:{d}"))
        .chain(ips.iter().map(|i| format!("IP:{i}")))
        .collect();
    std::fs::write(
        p("ext.cnf"),
        format!(
            "subjectAltName={}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
            san.join(",")
        ),
    )
    .expect("write ext.cnf");
    run(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-subj", "/CN=tessera-test"])
        .arg("-keyout")
        .arg(p("server.key"))
        .arg("-out")
        .arg(p("server.csr")));
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
        .arg("-in")
        .arg(p("server.csr"))
        .arg("-CA")
        .arg(p("ca.pem"))
        .arg("-CAkey")
        .arg(p("ca.key"))
        .arg("-extfile")
        .arg(p("ext.cnf"))
        .arg("-out")
        .arg(p("server.pem")));
    Certs {
        ca: p("ca.pem"),
        cert: p("server.pem"),
        key: p("server.key"),
    }
}
