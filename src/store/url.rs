//! Which store a command uses: `--store URL`, else `$WAYMARK_STORE`, else the state directory's
//! SQLite database.
//!
//! - `sqlite:` is the default store, the database of the state directory (`--state-dir`); and
//!   `sqlite:PATH` names the state directory, or its database file `PATH/waymark.db` (logs and
//!   lock files live beside the database).
//! - `postgres://...` or `postgresql://...` is a PostgreSQL database shared by a fleet of runners,
//!   as a standard connection URL (user, password, host, port, database, and parameters such as
//!   `sslmode`, `connect_timeout`, `application_name`); the state directory then keeps only the
//!   logs of the attempts that run on this host.
//!
//!   `sslmode` follows libpq's: `disable`, `prefer` (the default), `require`, `verify-ca` and
//!   `verify-full`, with `sslrootcert=FILE`. `tokio-postgres` parses only the first three, so the
//!   last two and `sslrootcert` are taken out of the URL here ([`PgConfig::check`],
//!   [`PgConfig::roots`]), the connection is made with `require`, and the store's rustls
//!   configuration does the checking (`postgres.rs`).
//!
//! A URL is shown everywhere without its password ([`redact`]).

use std::path::PathBuf;

/// A PostgreSQL store's connection settings: the parsed URL, and how the server's certificate is
/// checked when TLS is used.
#[derive(Debug, Clone)]
pub(crate) struct PgConfig {
    /// The URL as `tokio-postgres` parses it (`verify-ca` and `verify-full` read as `require`).
    pub(crate) conn: postgres::Config,
    /// What of the server's certificate is checked.
    pub(crate) check: CertCheck,
    /// `sslrootcert`: the certificate authorities the server's certificate must chain to; `None`
    /// for the system's root certificates.
    pub(crate) roots: Option<RootsFile>,
}

/// The certificates of an `sslrootcert` file, read when the URL is parsed.
#[derive(Debug, Clone)]
pub(crate) struct RootsFile {
    pub(crate) path: PathBuf,
    pub(crate) certs: std::sync::Arc<rustls::RootCertStore>,
}

impl From<postgres::Config> for PgConfig {
    /// A URL without `sslrootcert`, with the checks of its `sslmode`.
    fn from(conn: postgres::Config) -> PgConfig {
        PgConfig { conn, check: CertCheck::Nothing, roots: None }
    }
}

impl std::ops::Deref for PgConfig {
    type Target = postgres::Config;
    fn deref(&self) -> &postgres::Config {
        &self.conn
    }
}

/// What of the server's certificate is checked (libpq's `sslmode` semantics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CertCheck {
    /// `prefer` and `require` without `sslrootcert`: encryption without authentication, as libpq
    /// does it.
    Nothing,
    /// `verify-ca`, or `prefer`/`require` with `sslrootcert` (as libpq): the certificate chains to
    /// a root.
    Chain,
    /// `verify-full`: the chain and the host name.
    Full,
}

/// A store as chosen.
#[derive(Debug, Clone)]
pub(crate) enum StoreUrl {
    /// The SQLite database of a state directory: this one, or the configured one.
    Sqlite(Option<PathBuf>),
    /// A PostgreSQL database: its parsed configuration and its URL without the password.
    Postgres { config: Box<PgConfig>, shown: String },
}

/// Why a store URL is not usable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum UrlError {
    #[error(
        "store `{0}` is not one waymark knows; give `sqlite:` (the state directory's database, the default), \
         `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DATABASE`"
    )]
    Scheme(String),
    #[error(
        "store `{shown}` is not a valid PostgreSQL URL: {why}; the form is `postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=require`"
    )]
    Postgres { shown: String, why: String },
}

/// Parse a store URL (as given to `--store` or in `WAYMARK_STORE`).
pub(crate) fn parse(text: &str) -> Result<StoreUrl, UrlError> {
    if let Some(path) = text.strip_prefix("sqlite:") {
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Ok(StoreUrl::Sqlite(None));
        }
        let path = PathBuf::from(path);
        let dir = if path.file_name().is_some_and(|n| n == "waymark.db") {
            path.parent().map(PathBuf::from).unwrap_or(path)
        } else {
            path
        };
        return Ok(StoreUrl::Sqlite(Some(dir)));
    }
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        let shown = redact(text);
        let bad = |why: String| UrlError::Postgres { shown: shown.clone(), why };
        if text.split_once("://").is_some_and(|(_, rest)| ambiguous(rest)) {
            return Err(bad("an `@`, `/` or `?` in its user or password, or an `@` after them, is read otherwise \
                            by the PostgreSQL driver (it takes all before the first `@` for the user and password): \
                            write them as `%40`, `%2F` and `%3F` (and `:` in a user as `%3A`)"
                .into()));
        }
        let (text, mode, roots) = take_tls_params(text).map_err(bad)?;
        let conn: postgres::Config = text.parse().map_err(|e: postgres::Error| {
            // The driver's words (`invalid connection string`), then which parameter it refused.
            match std::error::Error::source(&e) {
                Some(why) => bad(format!("{e}: {why}")),
                None => bad(e.to_string()),
            }
        })?;
        if conn.get_hosts().is_empty() {
            return Err(bad("it names no host".into()));
        }
        let check = match (mode.as_deref(), &roots) {
            (Some("verify-full"), _) => CertCheck::Full,
            (Some("verify-ca"), _) | (_, Some(_)) => CertCheck::Chain,
            _ => CertCheck::Nothing,
        };
        let roots = match roots {
            Some(path) => {
                let certs = super::postgres::load_roots(&path).map_err(bad)?;
                Some(RootsFile { path, certs: std::sync::Arc::new(certs) })
            }
            None => None,
        };
        return Ok(StoreUrl::Postgres { config: Box::new(PgConfig { conn, check, roots }), shown });
    }
    Err(UrlError::Scheme(redact(text)))
}

/// Take `sslmode` and `sslrootcert` out of a PostgreSQL URL: the URL for `tokio-postgres` (with
/// `verify-ca` and `verify-full` as `require`), the mode given, and the root certificates' file
/// (`sslrootcert=system`, like none, means the system's).
fn take_tls_params(url: &str) -> Result<(String, Option<String>, Option<PathBuf>), String> {
    let Some((base, query)) = url.split_once('?') else { return Ok((url.to_owned(), None, None)) };
    let (mut mode, mut roots) = (None, None);
    let mut kept = Vec::new();
    for param in query.split('&') {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        let value = percent_encoding::percent_decode_str(value).decode_utf8_lossy().into_owned();
        match key {
            "sslmode" => {
                let given = match value.as_str() {
                    "disable" | "prefer" | "require" => value.as_str(),
                    "verify-ca" | "verify-full" => "require",
                    _ => {
                        return Err(format!(
                            "sslmode `{value}` is not one waymark knows; give disable, prefer, require, verify-ca \
                             or verify-full"
                        ));
                    }
                };
                kept.push(format!("sslmode={given}"));
                mode = Some(value);
            }
            "sslrootcert" if value.is_empty() => return Err("sslrootcert names no file".into()),
            "sslrootcert" => roots = (value != "system").then(|| PathBuf::from(value)),
            _ => kept.push(param.to_owned()),
        }
    }
    let url = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    Ok((url, mode, roots))
}

/// The store a command uses: `--store` (given), else `$WAYMARK_STORE`, else the default.
pub(crate) fn configured(flag: Option<&str>) -> Result<StoreUrl, UrlError> {
    let env = std::env::var("WAYMARK_STORE").ok().filter(|v| !v.is_empty());
    match flag.map(str::to_owned).or(env) {
        Some(text) => parse(&text),
        None => Ok(StoreUrl::Sqlite(None)),
    }
}

/// Whether the `@` of URL `rest` (what follows `scheme://`) may not be where the driver takes it:
/// the driver takes the user and password to be all before the first `@`, wherever it is. So a
/// `/` or `?` before it (a password holding one, or no user at all and an `@` further on), or any
/// `@` after it (a password holding one), would be read as neither meant: an `@` is written `%40`
/// everywhere else.
fn ambiguous(rest: &str) -> bool {
    match rest.split_once('@') {
        None => false,
        Some((credentials, after)) => credentials.contains(['/', '?']) || after.contains('@'),
    }
}

/// The password a PostgreSQL URL holds, as written and as the driver reads it (percent-decoded),
/// from its user part and from a `password` parameter; none for any other store.
pub(crate) fn passwords(url: &str) -> Vec<String> {
    let Some(rest) = url.strip_prefix("postgres://").or_else(|| url.strip_prefix("postgresql://")) else {
        return Vec::new();
    };
    let decoded = |v: &str| percent_encoding::percent_decode_str(v).decode_utf8_lossy().into_owned();
    let mut found = Vec::new();
    if let Some((credentials, _)) = rest.split_once('@')
        && let Some((_, password)) = credentials.split_once(':')
    {
        found.extend([password.to_owned(), decoded(password)]);
    }
    if let Some((_, query)) = rest.split_once('?') {
        let mut params = query.split('&');
        while let Some(param) = params.next() {
            if let Some((key, value)) = param.split_once('=')
                && decoded(key) == "password"
            {
                // As the driver reads it (to the next `&`), and as `redact` takes it (all that
                // follows, which may hold an unencoded `&`).
                let rest: Vec<&str> = std::iter::once(value).chain(params.by_ref()).collect();
                let all = rest.join("&");
                found.extend([value.to_owned(), decoded(value), all.clone(), decoded(&all)]);
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// A URL without its password: `postgres://user:secret@host/db` is shown as
/// `postgres://user@host/db`, and a `password` parameter is dropped with all after it (its value
/// may hold an unencoded `&`). A URL whose `@` is ambiguous ([`ambiguous`]) is shown as its scheme
/// alone (`postgres://…`), and text that is no URL but has a scheme as `scheme:…`: nothing that
/// may be a password is shown.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return match url.split_once(':') {
            Some((scheme, _)) => format!("{scheme}:…"),
            None => url.to_owned(),
        };
    };
    if ambiguous(rest) {
        return format!("{scheme}://…");
    }
    let (authority, tail) = match rest.split_once('@') {
        None => (String::new(), rest),
        Some((credentials, after)) => {
            (format!("{}@", credentials.split_once(':').map_or(credentials, |(user, _)| user)), after)
        }
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let is_password = |param: &&str| {
                let key = param.split_once('=').map_or(*param, |(key, _)| key);
                percent_encoding::percent_decode_str(key).decode_utf8_lossy() == "password"
            };
            let kept: Vec<&str> = query.split('&').take_while(|param| !is_password(param)).collect();
            if kept.is_empty() { path.to_owned() } else { format!("{path}?{}", kept.join("&")) }
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_postgres_url_s_password_is_found_as_written_and_decoded() {
        assert_eq!(passwords("postgres://u:s%40cret@h/d"), ["s%40cret", "s@cret"]);
        assert_eq!(passwords("postgresql://u@h/d?sslmode=require&password=p%26w"), ["p%26w", "p&w"]);
        // An unencoded `&` in it: the part the driver reads, and all that `redact` leaves out.
        assert_eq!(passwords("postgres://u@h/d?password=pa&wd"), ["pa", "pa&wd"]);
        assert!(passwords("postgres://u@h/d").is_empty());
        assert!(passwords("sqlite:/srv/w").is_empty());
    }

    #[test]
    fn sqlite_urls_name_the_state_directory() {
        assert!(matches!(parse("sqlite:").unwrap(), StoreUrl::Sqlite(None)));
        assert!(
            matches!(parse("sqlite:/srv/w").unwrap(), StoreUrl::Sqlite(Some(p)) if p == std::path::Path::new("/srv/w"))
        );
        let db = parse("sqlite:///srv/w/waymark.db").unwrap();
        assert!(matches!(db, StoreUrl::Sqlite(Some(p)) if p == std::path::Path::new("/srv/w")));
    }

    #[test]
    fn postgres_urls_parse_and_are_shown_without_their_password() {
        let StoreUrl::Postgres { config, shown } =
            parse("postgres://fleet:s3cret@db.example:6543/waymark?sslmode=require").unwrap()
        else {
            panic!("not postgres")
        };
        assert_eq!(shown, "postgres://fleet@db.example:6543/waymark?sslmode=require");
        assert_eq!(config.get_user(), Some("fleet"));
        assert_eq!(config.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(config.get_ssl_mode(), postgres::config::SslMode::Require);
        // A `password` parameter goes with all after it: its value may hold an unencoded `&`.
        assert_eq!(
            redact("postgresql://u@h/d?application_name=a&password=x&b"),
            "postgresql://u@h/d?application_name=a"
        );
        assert_eq!(redact("postgres://h"), "postgres://h");
    }

    #[test]
    fn bad_urls_say_what_is_accepted_and_never_show_the_password() {
        let err = parse("mysql://root:pw@h/db").unwrap_err();
        assert_eq!(
            err.to_string(),
            "store `mysql://root@h/db` is not one waymark knows; give `sqlite:` (the state directory's database, the \
             default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DATABASE`"
        );
        let err = parse("postgres://u:pw@h/db?sslmode=sometimes").unwrap_err();
        assert!(matches!(&err, UrlError::Postgres { shown, .. } if shown == "postgres://u@h/db?sslmode=sometimes"));
        assert!(!err.to_string().contains("pw"), "{err}");
        // An `@`, `/` or `?` in the user or password, or an `@` anywhere after them, not
        // percent-encoded: the driver would read it otherwise (it takes all before the first `@`
        // for them). Refused, shown as the scheme alone.
        for url in [
            "postgres://u:se@cret@h:5432/db",
            "postgres://u:se/cret@h:5432/db",
            "postgres://u:se?cret@h:5432/db",
            "postgres://u:a@b/c@h:5432/db",
            "postgres://fleet:Xy@9?kL@db.example/waymark",
            "postgres://h/db?application_name=a@b",
            "postgres://u:p@h/db?application_name=x@y",
            "postgres://db.example/waymark?user=fleet&password=p@ssw0rd",
        ] {
            let shown = "postgres://…";
            assert_eq!(
                parse(url).unwrap_err().to_string(),
                format!(
                    "store `{shown}` is not a valid PostgreSQL URL: an `@`, `/` or `?` in its user or password, or \
                     an `@` after them, is read otherwise by the PostgreSQL driver (it takes all before the first `@` \
                     for the user and password): write them as `%40`, `%2F` and `%3F` (and `:` in a user as `%3A`); \
                     the form is `postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=require`"
                ),
                "{url}"
            );
        }
        // A parameter or port the driver refuses is named.
        for (url, why) in [
            ("postgres://u:pw@h/db?bogus=1", "unknown option `bogus`"),
            ("postgres://u:pw@h:99999/db", "invalid value for option `port`"),
            ("postgres://u:pw@h/db?connect_timeout=abc", "invalid value for option `connect_timeout`"),
        ] {
            assert_eq!(
                parse(url).unwrap_err().to_string(),
                format!(
                    "store `{}` is not a valid PostgreSQL URL: invalid connection string: {why}; the form is \
                     `postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=require`",
                    url.replace(":pw@", "@")
                ),
            );
        }
        // Not a URL (`:/` for `://`): its scheme alone is shown.
        assert_eq!(
            parse("postgres:/fleet:s3cret@db/waymark").unwrap_err().to_string(),
            "store `postgres:…` is not one waymark knows; give `sqlite:` (the state directory's database, the \
             default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DATABASE`"
        );
        // Percent-encoded, they are the password's and the parameters'. A `password` parameter is
        // left out with all after it (its value may hold an `&`), however its name is written.
        for (url, shown) in [
            ("postgres://u:se%40cret@h:5432/db", "postgres://u@h:5432/db"),
            ("postgres://u:p@h/db?application_name=x%40y", "postgres://u@h/db?application_name=x%40y"),
            ("postgres://u@h/db?sslmode=disable&password=a&application_name=c", "postgres://u@h/db?sslmode=disable"),
            ("postgres://u@h/db?pass%77ord=secret", "postgres://u@h/db"),
        ] {
            assert!(matches!(parse(url), Ok(StoreUrl::Postgres { shown: s, .. }) if s == shown), "{url}");
        }
    }
}
