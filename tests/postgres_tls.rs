//! The PostgreSQL store over TLS, through the real binary, against the cluster of
//! `.ci/postgres.sh`: its role and database `waymark_tls` take TLS connections only, with a server
//! certificate (for 127.0.0.1 and localhost) signed by the test CA `$WAYMARK_TEST_PG_CA`.

mod common;

use common::{Env, postgres_url};
use std::process::Output;

/// The `waymark_tls` database of the test server, as `postgres://waymark_tls:PASSWORD@HOST:PORT/`
/// without the database (`waymark_tls`), and the test CA's certificate; `None` (after a `SKIPPED`
/// line) without a TLS-capable server or openssl, which CI must have.
fn tls_server(test: &str) -> Option<(String, String)> {
    use std::io::Write;
    let url = postgres_url(test)?;
    let openssl = std::process::Command::new("openssl").arg("version").output().is_ok_and(|o| o.status.success());
    let ca = std::env::var("WAYMARK_TEST_PG_CA").ok().filter(|c| !c.is_empty() && openssl);
    let Some(ca) = ca else {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test} needs openssl and a TLS-capable PostgreSQL: CI must set WAYMARK_TEST_PG_CA (.ci/postgres.sh does)"
        );
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test}: needs openssl and WAYMARK_TEST_PG_CA; `eval \"$(bash .ci/postgres.sh start)\"` with \
             openssl installed sets it"
        );
        return None;
    };
    let host_port = url.split_once('@').unwrap().1.split_once('/').unwrap().0;
    Some((format!("postgres://waymark_tls:waymark_tls@{host_port}"), ca))
}

/// `waymark ARGS` on store `url`, in `env`.
fn waymark(env: &Env, url: &str, args: &[&str]) -> Output {
    env.cmd(args).env("WAYMARK_STORE", url).env("WAYMARK_HOST_ID", "tls-host").output().unwrap()
}

/// The first line of stderr, with the server's port as PORT.
fn first_error_line(out: &Output, base: &str) -> String {
    let port = base.rsplit_once(':').unwrap().1;
    let text = String::from_utf8_lossy(&out.stderr).replace(port, "PORT");
    assert!(!text.contains("waymark_tls:waymark_tls"), "the password is never shown: {text}");
    text.lines().next().unwrap_or_default().to_owned()
}

/// A flow of its own for each test (the tests share the database).
fn flow(env: &Env, name: &str) {
    env.write("flow.toml", &format!("name = '{name}'\n[[step]]\nname = 'a'\nshell = 'echo ran >> ran.log'\n"));
}

#[test]
fn require_encrypts_without_checking_the_certificate_where_a_plain_connection_is_refused() {
    let Some((base, _ca)) =
        tls_server("require_encrypts_without_checking_the_certificate_where_a_plain_connection_is_refused")
    else {
        return;
    };
    let env = Env::new();
    flow(&env, "tls-require");
    // The server lets `waymark_tls` in over TLS only.
    let plain = waymark(&env, &format!("{base}/waymark_tls?sslmode=disable"), &["run", "--quiet", "flow.toml"]);
    assert_eq!(plain.status.code(), Some(4), "{}", first_error_line(&plain, &base));
    assert_eq!(
        first_error_line(&plain, &base),
        "error: the state database postgres://waymark_tls@127.0.0.1:PORT/waymark_tls?sslmode=disable refused this \
         user's credentials: pg_hba.conf rejects connection for host \"127.0.0.1\", user \"waymark_tls\", database \
         \"waymark_tls\", no encryption"
    );
    assert_eq!(env.count("ran.log"), 0);
    // `require` encrypts, and takes the certificate of a CA it does not know, as libpq does.
    let tls = waymark(&env, &format!("{base}/waymark_tls?sslmode=require"), &["run", "--quiet", "flow.toml"]);
    assert_eq!(tls.status.code(), Some(0), "{}", first_error_line(&tls, &base));
    assert_eq!(env.count("ran.log"), 1);
    // So does `prefer`, the default, when the server offers TLS.
    let default = waymark(&env, &format!("{base}/waymark_tls"), &["run", "--quiet", "flow.toml"]);
    assert_eq!(default.status.code(), Some(0), "{}", first_error_line(&default, &base));
    assert_eq!(env.count("ran.log"), 2);
}

#[test]
fn verify_full_with_the_servers_ca_checks_the_chain_and_the_host_name() {
    let Some((base, ca)) = tls_server("verify_full_with_the_servers_ca_checks_the_chain_and_the_host_name") else {
        return;
    };
    let env = Env::new();
    flow(&env, "tls-verify-full");
    let url = format!("{base}/waymark_tls?sslmode=verify-full&sslrootcert={ca}");
    let out = waymark(&env, &url, &["run", "--quiet", "flow.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", first_error_line(&out, &base));
    assert_eq!(env.count("ran.log"), 1);

    // The same server under a name its certificate does not carry (`hostaddr` still reaches it):
    // verify-full refuses it, verify-ca (the chain only) takes it.
    let port = base.rsplit_once(':').unwrap().1;
    let renamed = format!("postgres://waymark_tls:waymark_tls@db.invalid:{port}/waymark_tls?hostaddr=127.0.0.1");
    let full = waymark(&env, &format!("{renamed}&sslmode=verify-full&sslrootcert={ca}"), &["history"]);
    assert_eq!(full.status.code(), Some(4), "{}", first_error_line(&full, &base));
    assert_eq!(
        first_error_line(&full, &base),
        format!(
            "error: cannot reach the state database postgres://waymark_tls@db.invalid:PORT/waymark_tls?hostaddr=\
             127.0.0.1&sslmode=verify-full&sslrootcert={ca}: error performing TLS handshake: invalid peer \
             certificate: certificate not valid for name \"db.invalid\"; certificate is only valid for \
             IpAddress(127.0.0.1) or DnsName(\"localhost\") (the server's certificate was checked against the \
             certificates of sslrootcert `{ca}`: its chain and host name)"
        )
    );
    let chain = waymark(&env, &format!("{renamed}&sslmode=verify-ca&sslrootcert={ca}"), &["history"]);
    assert_eq!(chain.status.code(), Some(0), "{}", first_error_line(&chain, &base));
    assert!(String::from_utf8_lossy(&chain.stdout).contains("tls-verify-full"), "the run is listed");
}

#[test]
fn verify_full_against_another_ca_is_refused_naming_the_certificate_problem() {
    let Some((base, _ca)) = tls_server("verify_full_against_another_ca_is_refused_naming_the_certificate_problem")
    else {
        return;
    };
    let env = Env::new();
    flow(&env, "tls-other-ca");
    let other = env.path("other-ca.crt");
    let made = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=another CA"])
        .arg("-keyout")
        .arg(env.path("other-ca.key"))
        .arg("-out")
        .arg(&other)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let other = other.display().to_string();
    for (mode, checked) in [("verify-full", "its chain and host name"), ("verify-ca", "its chain")] {
        let url = format!("{base}/waymark_tls?sslmode={mode}&sslrootcert={other}");
        let out = waymark(&env, &url, &["run", "--quiet", "flow.toml"]);
        assert_eq!(out.status.code(), Some(4), "{mode}: {}", first_error_line(&out, &base));
        assert_eq!(
            first_error_line(&out, &base),
            format!(
                "error: cannot reach the state database postgres://waymark_tls@127.0.0.1:PORT/waymark_tls?sslmode=\
                 {mode}&sslrootcert={other}: error performing TLS handshake: invalid peer certificate: \
                 UnknownIssuer (the server's certificate was checked against the certificates of sslrootcert \
                 `{other}`: {checked})"
            )
        );
    }
    assert_eq!(env.count("ran.log"), 0, "nothing ran");
}

#[test]
fn an_unreadable_sslrootcert_or_an_unknown_sslmode_is_a_usage_error() {
    // No server needed: the URL is refused before any connection.
    let env = Env::new();
    flow(&env, "tls-usage");
    let missing = env.path("missing.crt").display().to_string();
    let out = waymark(
        &env,
        &format!("postgres://u:secret@127.0.0.1:1/db?sslmode=verify-full&sslrootcert={missing}"),
        &["run", "flow.toml"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).lines().next().unwrap(),
        format!(
            "error: store `postgres://u@127.0.0.1:1/db?sslmode=verify-full&sslrootcert={missing}` is not a valid \
             PostgreSQL URL: cannot read the certificates of sslrootcert `{missing}`: I/O error: No such file or \
             directory (os error 2); the form is `postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=require`"
        )
    );
    let out = waymark(&env, "postgres://u:secret@127.0.0.1:1/db?sslmode=allow", &["run", "flow.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).lines().next().unwrap(),
        "error: store `postgres://u@127.0.0.1:1/db?sslmode=allow` is not a valid PostgreSQL URL: sslmode `allow` is \
         not one waymark knows; give disable, prefer, require, verify-ca or verify-full; the form is \
         `postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=require`"
    );
    assert_eq!(env.count("ran.log"), 0);
}
