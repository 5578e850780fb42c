//! Test certificates, made at test time with the `openssl` CLI (no private key is checked in):
//! a [`TestCa`] and certificates it issues for `127.0.0.1` / `localhost`, usable by a server and
//! as a client certificate.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A certificate authority in its own directory.
#[derive(Debug)]
pub struct TestCa {
    dir: PathBuf,
    name: String,
    /// The CA certificate (PEM), what clients and servers trust.
    pub cert: PathBuf,
    /// The CA's private key (PEM).
    pub key: PathBuf,
}

/// A certificate and its private key (PEM files).
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl (is it installed? .ci/run installs it): {e}"));
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl TestCa {
    /// A new CA named `name`, its files under `dir/<name>/`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let subject = format!("/CN={name}");
        openssl(
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                &subject,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
            &dir,
        );
        TestCa { cert: dir.join("ca.pem"), key: dir.join("ca.key"), dir, name: name.to_owned() }
    }

    /// A certificate for `127.0.0.1` and `localhost` named `name`, for servers and clients.
    pub fn issue(&self, name: &str) -> Issued {
        let extensions = format!("{name}.ext");
        std::fs::write(
            self.dir.join(&extensions),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .unwrap_or_else(|e| panic!("{}: {e}", self.dir.display()));
        let (key, csr, cert) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"));
        let subject = format!("/CN={name}.{}", self.name);
        openssl(
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &subject,
            ],
            &self.dir,
        );
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &cert,
                "-extfile",
                &extensions,
            ],
            &self.dir,
        );
        Issued { cert: self.dir.join(cert), key: self.dir.join(key) }
    }
}
