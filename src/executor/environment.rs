//! What a runner gives every attempt of its run besides the flow's definition: the variables of
//! the flow's `env_file`, read when the runner starts (the first runner and each one that resumes
//! the run) and never recorded, since they may hold secrets; and the run's secrets, the values of
//! the `secret_env` variables wherever they come from, which every sink hides.
//!
//! An attempt's environment, lowest precedence first: the runner's own (inherited), the env
//! file, the flow's `env`, the step's `env`; then waymark's variables over all of them: the
//! run's parameters (`WAYMARK_PARAM_*`, recorded with the run), the outputs of the steps that
//! succeeded before it started (`WAYMARK_OUTPUT_*`) and the attempt's own (`WAYMARK_RUN_ID`, ...).

use crate::flow::Flow;
use crate::flow::dotenv::{self, DotenvError};
use crate::secrets::Secrets;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The most of an env file that is read: a larger one is refused rather than read forever.
const MAX_ENV_FILE: u64 = 16 * 1024 * 1024;

/// The environment a runner gives its run's attempts, on top of the definition.
#[derive(Debug, Default)]
pub(crate) struct RunEnv {
    /// The env file's variables, as read when this runner started.
    pub(crate) file: BTreeMap<String, String>,
    /// The values hidden in everything the run prints or stores: those of the `secret_env`
    /// variables and the inherited store URL's password.
    pub(crate) secrets: Arc<Secrets>,
    /// The values of the `secret_env` variables only: what a parameter value may not hold, and
    /// what is taken out of the files a child writes itself (its outputs and error file), which
    /// are its data. The store's password, which the flow did not declare, is only hidden in what
    /// the run prints and logs.
    pub(crate) declared: Arc<Secrets>,
    /// What the runner says about them before the run goes on: the env file's variables that
    /// waymark sets over it for every attempt, which no step sees.
    pub(crate) warnings: Vec<String>,
}

/// Why the env file cannot be used; nothing runs.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EnvFileError {
    #[error("cannot read the env file {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the env file {} is larger than {} MiB", path.display(), MAX_ENV_FILE / (1024 * 1024))]
    TooLarge { path: PathBuf },
    #[error("the env file {} is not UTF-8 (first invalid byte at offset {offset})", path.display())]
    NotUtf8 { path: PathBuf, offset: usize },
    #[error("{}", syntax(path, errors))]
    Syntax { path: PathBuf, errors: Vec<DotenvError> },
}

fn syntax(path: &Path, errors: &[DotenvError]) -> String {
    let mut text = format!("the env file {} cannot be read as dotenv:", path.display());
    for e in errors {
        text.push_str(&format!("\n  {}:{}: {}", path.display(), e.line, e.message));
    }
    text
}

impl RunEnv {
    /// The environment for a run of `flow` by this runner: its env file read now, and its
    /// secrets' values from `inherited` (the runner's environment), the env file and the flow's
    /// and steps' `env`.
    pub(crate) fn prepare(
        flow: &Flow,
        inherited: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<RunEnv, EnvFileError> {
        let file = match &flow.env_file {
            Some(path) => read_env_file(path)?,
            None => BTreeMap::new(),
        };
        let declared = declared_secrets(flow, &file, &inherited);
        let mut hidden = declared.clone();
        if let Some(url) = inherited("WAYMARK_STORE").and_then(|v| v.into_string().ok()) {
            hidden.extend(crate::store::url::passwords(&url).into_iter().map(String::into_bytes));
        }
        let (secrets, declared) = (Arc::new(Secrets::new(hidden)), Arc::new(Secrets::new(declared)));
        Ok(RunEnv { file, secrets, declared, warnings: Vec::new() })
    }

    /// The env file's variables that waymark sets over it for every attempt (one of
    /// [`crate::flow::model::WAYMARK_VARS`]): its value reaches no step.
    pub(crate) fn shadowed(&self) -> impl Iterator<Item = &str> {
        self.file.keys().map(String::as_str).filter(|k| crate::flow::model::WAYMARK_VARS.contains(k))
    }

    /// The variables an attempt of `step` gets over the inherited environment, lowest precedence
    /// first (a later one wins): the env file, the flow's `env`, the step's `env`.
    pub(crate) fn layered<'a>(
        &'a self,
        flow: &'a Flow,
        step: &'a crate::flow::Step,
    ) -> impl Iterator<Item = (&'a String, &'a String)> {
        self.file.iter().chain(&flow.env).chain(&step.env)
    }
}

/// The variables of the env file at `path`, or why they cannot be had (every bad line at once).
pub(crate) fn read_env_file(path: &Path) -> Result<BTreeMap<String, String>, EnvFileError> {
    let read = |source| EnvFileError::Read { path: path.to_owned(), source };
    let mut bytes = Vec::new();
    std::fs::File::open(path).and_then(|f| f.take(MAX_ENV_FILE + 1).read_to_end(&mut bytes)).map_err(read)?;
    if bytes.len() as u64 > MAX_ENV_FILE {
        return Err(EnvFileError::TooLarge { path: path.to_owned() });
    }
    let text = String::from_utf8(bytes)
        .map_err(|e| EnvFileError::NotUtf8 { path: path.to_owned(), offset: e.utf8_error().valid_up_to() })?;
    dotenv::parse(&text).map_err(|errors| EnvFileError::Syntax { path: path.to_owned(), errors })
}

/// The secrets a run of `flow` would hide, for what is said before (or without) a run: from the
/// environment, the flow's `env` tables and the env file (none from one that cannot be read).
pub(crate) fn secrets_to_hide(flow: &Flow) -> Secrets {
    secrets_in(flow, &env_file_or_none(flow))
}

/// The variables of `flow`'s env file, for what is said before (or without) a run: none from one
/// that cannot be read (the run says why).
pub(crate) fn env_file_or_none(flow: &Flow) -> BTreeMap<String, String> {
    flow.env_file.as_deref().and_then(|path| read_env_file(path).ok()).unwrap_or_default()
}

/// [`secrets_to_hide`], with the env file's variables `file` read already.
pub(crate) fn secrets_in(flow: &Flow, file: &BTreeMap<String, String>) -> Secrets {
    Secrets::new(declared_secrets(flow, file, &|name: &str| std::env::var_os(name)))
}

/// What to say of each name of `secret_env` that is set nowhere a step's variable comes from (the
/// inherited environment, the env file's variables `file`, the `env` tables) while a name close to
/// it is (one edit away): most likely misspelt, it hides nothing, and the variable meant is shown
/// and stored as it is. An unset name with no such one is let be (an optional secret, not set
/// this time).
pub(crate) fn misspelt_secrets(flow: &Flow, file: &BTreeMap<String, String>) -> Vec<String> {
    let tables = || std::iter::once(file).chain(std::iter::once(&flow.env)).chain(flow.steps.iter().map(|s| &s.env));
    let set = |name: &str| std::env::var_os(name).is_some() || tables().any(|t| t.contains_key(name));
    let mut said = Vec::new();
    // A name of fewer than 4 letters is one edit from too many.
    let unset: Vec<&String> = flow.secret_env.iter().filter(|n| n.len() >= 4 && !set(n)).collect();
    if unset.is_empty() {
        return said;
    }
    let inherited: Vec<String> = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()).collect();
    for name in unset {
        let candidates = tables()
            .flat_map(|t| t.keys().map(String::as_str))
            .chain(inherited.iter().map(String::as_str))
            .filter(|c| !flow.secret_env.iter().any(|s| s == c));
        // One edit away at most (a transposition, a letter, the case): an optional secret beside a
        // variable of a similar name (`DB_PASS`, `DB_PATH`) is let be.
        let near = |c: &&str| strsim::osa_distance(&name.to_lowercase(), &c.to_lowercase()) <= 1;
        if let Some(meant) = candidates.clone().find(near) {
            said.push(format!(
                "`secret_env` names `{name}`, which is set nowhere (not in waymark's environment, the env file or an \
                 `env` table), so it hides nothing, while `{meant}` is set: did you mean `{meant}`?"
            ));
        }
    }
    said
}

/// The values of `flow`'s `secret_env` variables, from every place an attempt's variable can come
/// from: the inherited environment, the env file, the flow's `env` and every step's `env`. (The
/// run also hides the password of the store URL the attempts inherit in `WAYMARK_STORE`, so that
/// a nested waymark reaches the same store, which a step that prints its environment would
/// otherwise show.)
fn declared_secrets(
    flow: &Flow,
    file: &BTreeMap<String, String>,
    inherited: &impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Vec<Vec<u8>> {
    use std::os::unix::ffi::OsStringExt;
    let mut values: Vec<Vec<u8>> = Vec::new();
    for name in &flow.secret_env {
        values.extend(inherited(name).map(OsStringExt::into_vec));
        let tables = std::iter::once(file).chain(std::iter::once(&flow.env)).chain(flow.steps.iter().map(|s| &s.env));
        values.extend(tables.filter_map(|t| t.get(name)).map(|v| v.as_bytes().to_vec()));
    }
    values
}

/// The secrets whose value, as this runner has it from its environment or the env file, is
/// written in the flow's definition (in a command, say; paths are not looked in), which every run
/// records: each with the 1-based line of the flow file's text `source` where the value first is,
/// outside a comment (`None` when the text does not show it as is: written with an escape). A
/// value the file itself sets for the secret in an `env` table is left out: the loader warns of
/// it, at the table.
pub(crate) fn secrets_written_in(
    flow: &Flow,
    file: &BTreeMap<String, String>,
    inherited: impl Fn(&str) -> Option<std::ffi::OsString>,
    source: &str,
) -> Vec<(String, Option<usize>)> {
    let set_in_file = |name: &str, v: &str| {
        std::iter::once(&flow.env).chain(flow.steps.iter().map(|s| &s.env)).any(|t| t.get(name).is_some_and(|x| x == v))
    };
    let mut candidates: Vec<(&String, String)> = Vec::new();
    for name in &flow.secret_env {
        let values = inherited(name).and_then(|v| v.into_string().ok()).into_iter().chain(file.get(name).cloned());
        candidates.extend(values.filter(|v| !v.is_empty() && !set_in_file(name, v)).map(|v| (name, v)));
    }
    if candidates.is_empty() {
        return Vec::new(); // the definition is not written out for nothing
    }
    // What is recorded, as the store records it: its strings, but for the paths (the flow file's,
    // and the working directories and env file made absolute from it), which name where the file
    // is, not what it says.
    let recorded: serde_json::Value = crate::store::record::RunDefinition::json_of(flow)
        .ok()
        .and_then(|json| serde_json::from_str(&json).ok())
        .unwrap_or_default();
    let mut strings = Vec::new();
    let mut stack = vec![&recorded];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::String(s) => strings.push(s.as_str()),
            serde_json::Value::Array(items) => stack.extend(items),
            serde_json::Value::Object(map) => stack.extend(
                map.iter().filter(|(k, _)| !matches!(k.as_str(), "path" | "workdir" | "env_file")).map(|(_, v)| v),
            ),
            _ => {}
        }
    }
    let mut found: Vec<(String, Option<usize>)> = Vec::new();
    for (name, value) in candidates {
        if found.iter().any(|(n, _)| n == name) || !strings.iter().any(|s| s.contains(value.as_str())) {
            continue;
        }
        // Where the text shows it before any `#` on its line (not in a comment, as far as one line
        // tells), else where it shows it at all (a `#` line of a multi-line script).
        let before_any_hash = |l: &str| l.find(value.as_str()).is_some_and(|at| !l[..at].contains('#'));
        let line = source
            .lines()
            .position(before_any_hash)
            .or_else(|| source.lines().position(|l| l.contains(value.as_str())))
            .map(|i| i + 1);
        found.push((name.clone(), line));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn flow(dir: &Path) -> Flow {
        let src = "env_file = '.env'\nsecret_env = ['TOKEN', 'PASS', 'UNSET', 'EMPTY']\nenv = { PASS = 'from-flow' }\n\
                   [[step]]\nname = 'a'\nrun = ['true']\nenv = { TOKEN = 'from-step', OTHER = 'x' }\n";
        crate::flow::parse(src, &dir.join("flow.toml")).unwrap().0
    }

    #[test]
    fn secrets_come_from_everywhere_a_variable_can() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".env"), "TOKEN=from-file\nEMPTY=\nPLAIN=not-secret\n").unwrap();
        let inherited = |name: &str| (name == "TOKEN").then(|| OsString::from("from-runner"));
        let env = RunEnv::prepare(&flow(dir.path()), inherited).unwrap();
        assert_eq!(
            env.secrets.redact("from-runner from-file from-flow from-step not-secret x"),
            "*** *** *** *** not-secret x"
        );
        assert_eq!(env.file["PLAIN"], "not-secret");
    }

    /// The store URL a nested waymark would use is passed on, its password hidden in everything
    /// the attempts print.
    #[test]
    fn the_inherited_store_url_s_password_is_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let flow = crate::flow::parse("[[step]]\nname = 'a'\nrun = ['true']\n", &dir.path().join("f.toml")).unwrap().0;
        let url = "postgres://fleet:pa%24%24word@db/waymark";
        let inherited = |name: &str| (name == "WAYMARK_STORE").then(|| OsString::from(url));
        let env = RunEnv::prepare(&flow, inherited).unwrap();
        assert_eq!(
            env.secrets.redact("WAYMARK_STORE=postgres://fleet:pa%24%24word@db/waymark; pa$$word"),
            "WAYMARK_STORE=postgres://fleet:***@db/waymark; ***"
        );
    }

    #[test]
    fn precedence_is_step_over_flow_over_env_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".env"), "A=file\nB=file\nC=file\n").unwrap();
        let src = "env_file = '.env'\nenv = { B = 'flow', C = 'flow' }\n\
                   [[step]]\nname = 'a'\nrun = ['true']\nenv = { C = 'step' }\n";
        let flow = crate::flow::parse(src, &dir.path().join("flow.toml")).unwrap().0;
        let env = RunEnv::prepare(&flow, |_| None).unwrap();
        let seen: BTreeMap<&String, &String> = env.layered(&flow, &flow.steps[0]).collect();
        let seen: Vec<(&str, &str)> = seen.into_iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(seen, [("A", "file"), ("B", "flow"), ("C", "step")]);
    }

    #[test]
    fn a_bad_env_file_names_the_file_and_every_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".env");
        let err = RunEnv::prepare(&flow(dir.path()), |_| None).unwrap_err();
        assert!(
            err.to_string().starts_with(&format!("cannot read the env file {}: No such file", path.display())),
            "{err}"
        );
        std::fs::write(&path, "OK=1\nBROKEN LINE\nX='open\n").unwrap();
        let err = RunEnv::prepare(&flow(dir.path()), |_| None).unwrap_err();
        let p = path.display();
        assert_eq!(
            err.to_string(),
            format!(
                "the env file {p} cannot be read as dotenv:\n  {p}:2: `BROKEN LINE` is not `KEY=value`: write \
                 `NAME=value`, or start the line with `#` to make it a comment\n  {p}:3: the closing ' of `X`'s \
                 value is missing: add it where the value ends"
            )
        );
        std::fs::write(&path, b"A=\xff\n").unwrap();
        let err = RunEnv::prepare(&flow(dir.path()), |_| None).unwrap_err();
        assert_eq!(err.to_string(), format!("the env file {p} is not UTF-8 (first invalid byte at offset 2)"));
    }
}
