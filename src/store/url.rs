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
//! A URL is shown everywhere without its password ([`redact`]).

use std::path::PathBuf;

/// A store as chosen.
#[derive(Debug, Clone)]
pub(crate) enum StoreUrl {
    /// The SQLite database of a state directory: this one, or the configured one.
    Sqlite(Option<PathBuf>),
    /// A PostgreSQL database: its parsed configuration and its URL without the password.
    Postgres { config: Box<postgres::Config>, shown: String },
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
        let config: postgres::Config = text
            .parse()
            .map_err(|e: postgres::Error| UrlError::Postgres { shown: shown.clone(), why: e.to_string() })?;
        if config.get_hosts().is_empty() {
            return Err(UrlError::Postgres { shown, why: "it names no host".into() });
        }
        return Ok(StoreUrl::Postgres { config: Box::new(config), shown });
    }
    Err(UrlError::Scheme(redact(text)))
}

/// The store a command uses: `--store` (given), else `$WAYMARK_STORE`, else the default.
pub(crate) fn configured(flag: Option<&str>) -> Result<StoreUrl, UrlError> {
    let env = std::env::var("WAYMARK_STORE").ok().filter(|v| !v.is_empty());
    match flag.map(str::to_owned).or(env) {
        Some(text) => parse(&text),
        None => Ok(StoreUrl::Sqlite(None)),
    }
}

/// A URL without its password: `postgres://user:secret@host/db` is shown as
/// `postgres://user@host/db`, and a `password=` parameter is dropped.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => format!("{}@{host}", user.split_once(':').map_or(user, |(u, _)| u)),
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let kept: Vec<&str> = query.split('&').filter(|p| !p.starts_with("password=")).collect();
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
        assert_eq!(redact("postgresql://u@h/d?password=x&application_name=a"), "postgresql://u@h/d?application_name=a");
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
    }
}
