//! A run's parameters: `--param NAME=VALUE` arguments checked against the flow's `[params]`.
//! Pure: no environment, no I/O. A step sees parameter `NAME` as `WAYMARK_PARAM_` followed by the
//! name upper-cased ([`env_name`]); the loader refuses two names that would meet there.

use super::model::Flow;
use std::collections::BTreeMap;

/// Why the parameters given on the command line do not fit the flow. Every one of them is an
/// invalid command line: exit status 2, nothing runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// An argument that is not `NAME=VALUE`.
    #[error("`{arg}` is not NAME=VALUE: {why}")]
    Malformed { arg: String, why: String },
    /// An argument without `=` that names no parameter: not repeated (it may be a secret whose
    /// `NAME=` was left out).
    #[error("an argument of `--param` has no `=`: {why}")]
    NoEquals { why: String },
    /// A name the flow does not declare.
    #[error("{}", undeclared(flow, name, declared))]
    Undeclared { flow: String, name: String, declared: Vec<String> },
    /// A value longer than a step's variable can hold (checked here, not by the argument parser,
    /// which would repeat the whole value in its message).
    #[error(
        "the value of `--param {name}` is {bytes} bytes, more than the system passes to a program in one variable \
         (at most {most} under this name); put it in a file and pass the file's path"
    )]
    TooLong { name: String, bytes: usize, most: usize },
    /// The same name given twice. Its values are not repeated: one may hold a secret, and this is
    /// said before the secrets are known.
    #[error("`--param {name}` is given twice; give each parameter once")]
    Repeated { name: String },
    /// Parameters without a default that were not given.
    #[error("{}", missing(flow, names))]
    Missing { flow: String, names: Vec<String> },
}

fn undeclared(flow: &str, name: &str, declared: &[String]) -> String {
    if declared.is_empty() {
        return format!(
            "flow `{flow}` declares no parameters, so `--param {name}` has nowhere to go; declare it in the flow \
             file under `[params]` (`{name} = \"default\"`, or `{name} = {{}}` when it must be given)"
        );
    }
    let list = declared.iter().map(|d| format!("`{d}`")).collect::<Vec<_>>().join(", ");
    match crate::suggest::closest(name, declared.iter().map(String::as_str)) {
        Some(hint) => format!("flow `{flow}` has no parameter `{name}`: did you mean `{hint}`? Its parameters: {list}"),
        None => format!(
            "flow `{flow}` has no parameter `{name}`; its parameters: {list} (declare new ones under `[params]`)"
        ),
    }
}

fn missing(flow: &str, names: &[String]) -> String {
    let args = names.iter().map(|n| format!("--param {n}=VALUE")).collect::<Vec<_>>().join(" ");
    match names {
        [one] => format!("flow `{flow}` needs the parameter `{one}`, which has no default: add `{args}`"),
        _ => {
            let list = names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
            format!("flow `{flow}` needs the parameters {list}, which have no default: add `{args}`")
        }
    }
}

/// The variable a step sees parameter `name` as: `WAYMARK_PARAM_DATE` for `date`.
pub fn env_name(name: &str) -> String {
    format!("WAYMARK_PARAM_{}", name.to_ascii_uppercase())
}

/// One `--param` argument, `NAME=VALUE`, split at the first `=` (the value may hold more), for a
/// flow that declares the parameters `declared`. Parsed once the flow is read, not by the
/// argument parser, whose message would repeat the whole argument: the value may be a secret, and
/// this is said before the secrets are known. So an argument is named by what is before its `=`,
/// and one without `=` only when it is a declared name (otherwise it may be a value whose
/// `NAME=` was left out).
pub fn parse_arg(arg: &str, declared: &[&str]) -> Result<(String, String), ParamError> {
    let Some((name, value)) = arg.split_once('=') else {
        let why = match declared {
            _ if declared.contains(&arg) => {
                return Err(ParamError::Malformed {
                    arg: arg.to_owned(),
                    why: format!("it has no `=`; write `--param {arg}=VALUE`"),
                });
            }
            [] => "write `--param NAME=VALUE` with a name declared under the flow's `[params]`".to_owned(),
            _ => format!(
                "write `--param NAME=VALUE` with one of the flow's parameters: {}",
                declared.iter().map(|d| format!("`{d}`")).collect::<Vec<_>>().join(", ")
            ),
        };
        return Err(ParamError::NoEquals { why });
    };
    let malformed = |why: String| ParamError::Malformed { arg: format!("{name}=..."), why };
    if name.is_empty() {
        return Err(malformed(
            "the name before `=` is empty; write `--param NAME=VALUE`, e.g. `--param date=2026-01-31`".into(),
        ));
    }
    if !super::validate::is_identifier(name) {
        return Err(malformed(format!(
            "`{name}` is not a parameter name (ASCII letters, digits and `_`, not starting with a digit); \
             give one of the names the flow declares under `[params]`"
        )));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// The value of every declared parameter for a run: what `given` sets (parsed `--param`
/// arguments, in the order given), else the default. An undeclared name, a name given twice or a
/// required parameter left out is an error; the first undeclared name is reported before missing
/// ones (a misspelt name is the likelier cause of both).
pub fn resolve(flow: &Flow, given: &[(String, String)]) -> Result<BTreeMap<String, String>, ParamError> {
    let mut set: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, value) in given {
        if !flow.params.contains_key(name) {
            return Err(ParamError::Undeclared {
                flow: flow.name.clone(),
                name: name.clone(),
                declared: flow.params.keys().cloned().collect(),
            });
        }
        // A step gets it as `WAYMARK_PARAM_NAME=value`: one string, which the kernel limits.
        let most = super::validate::max_arg().saturating_sub(env_name(name).len() + 1);
        if value.len() > most {
            return Err(ParamError::TooLong { name: name.clone(), bytes: value.len(), most });
        }
        if set.insert(name, value).is_some() {
            return Err(ParamError::Repeated { name: name.clone() });
        }
    }
    let mut values = BTreeMap::new();
    let mut missing = Vec::new();
    for (name, param) in &flow.params {
        match set.get(name.as_str()).copied().or(param.default.as_deref()) {
            Some(value) => {
                values.insert(name.clone(), value.to_owned());
            }
            None => missing.push(name.clone()),
        }
    }
    if missing.is_empty() { Ok(values) } else { Err(ParamError::Missing { flow: flow.name.clone(), names: missing }) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn flow(params: &str) -> Flow {
        let src = format!("name = 'nightly'\n[params]\n{params}\n[[step]]\nname = 'a'\nrun = ['true']\n");
        crate::flow::parse(&src, Path::new("/x/f.toml")).unwrap().0
    }

    fn given(args: &[&str]) -> Vec<(String, String)> {
        args.iter().map(|a| parse_arg(a, &["date", "region"]).unwrap()).collect()
    }

    #[test]
    fn defaults_apply_and_given_values_win() {
        let f = flow("date = 'today'\nregion = 'eu'\nbatch = {}");
        let values = resolve(&f, &given(&["batch=7", "region=us=east"])).unwrap();
        assert_eq!(
            values.into_iter().collect::<Vec<_>>(),
            [("batch".into(), "7".into()), ("date".into(), "today".into()), ("region".into(), "us=east".into())]
        );
        assert_eq!(resolve(&f, &given(&["batch="])).unwrap()["batch"], "", "an empty value is a value");
    }

    #[test]
    fn an_undeclared_parameter_says_which_exist() {
        let f = flow("date = 'today'\nregion = 'eu'");
        let err = resolve(&f, &given(&["dte=2026-01-31"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "flow `nightly` has no parameter `dte`: did you mean `date`? Its parameters: `date`, `region`"
        );
        let err = resolve(&f, &given(&["zone=1"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "flow `nightly` has no parameter `zone`; its parameters: `date`, `region` (declare new ones under `[params]`)"
        );
        let none = crate::flow::parse("name = 'bare'\n[[step]]\nname = 'a'\nrun = ['true']\n", Path::new("/x/f.toml"))
            .unwrap()
            .0;
        assert_eq!(
            resolve(&none, &given(&["date=1"])).unwrap_err().to_string(),
            "flow `bare` declares no parameters, so `--param date` has nowhere to go; declare it in the flow file \
             under `[params]` (`date = \"default\"`, or `date = {}` when it must be given)"
        );
    }

    #[test]
    fn a_missing_required_parameter_says_how_to_give_it() {
        let f = flow("date = {}\nregion = 'eu'\nbatch = {}");
        assert_eq!(
            resolve(&f, &given(&["region=us"])).unwrap_err(),
            ParamError::Missing { flow: "nightly".into(), names: vec!["batch".into(), "date".into()] }
        );
        assert_eq!(
            resolve(&f, &given(&["region=us"])).unwrap_err().to_string(),
            "flow `nightly` needs the parameters `batch`, `date`, which have no default: add \
             `--param batch=VALUE --param date=VALUE`"
        );
        assert_eq!(
            resolve(&f, &given(&["batch=1"])).unwrap_err().to_string(),
            "flow `nightly` needs the parameter `date`, which has no default: add `--param date=VALUE`"
        );
    }

    #[test]
    fn an_undeclared_name_is_reported_before_missing_ones() {
        let f = flow("date = {}");
        assert!(matches!(resolve(&f, &given(&["dat=1"])), Err(ParamError::Undeclared { .. })));
    }

    #[test]
    fn a_parameter_given_twice_is_refused() {
        let f = flow("date = 'today'");
        assert_eq!(
            resolve(&f, &given(&["date=1", "date=2"])).unwrap_err().to_string(),
            "`--param date` is given twice; give each parameter once"
        );
    }

    #[test]
    fn a_malformed_argument_says_how_to_write_it() {
        let msg = |arg: &str| parse_arg(arg, &["date", "region"]).unwrap_err().to_string();
        assert_eq!(msg("date"), "`date` is not NAME=VALUE: it has no `=`; write `--param date=VALUE`");
        // Not a declared name: it may be a value whose `NAME=` was left out, so it is not repeated.
        let unnamed = "an argument of `--param` has no `=`: write `--param NAME=VALUE` with one of the flow's \
                       parameters: `date`, `region`";
        assert_eq!(msg("hunter2"), unnamed);
        assert_eq!(msg(""), unnamed);
        assert_eq!(
            parse_arg("hunter2", &[]).unwrap_err().to_string(),
            "an argument of `--param` has no `=`: write `--param NAME=VALUE` with a name declared under the \
             flow's `[params]`"
        );
        assert_eq!(
            msg("=x"),
            "`=...` is not NAME=VALUE: the name before `=` is empty; write `--param NAME=VALUE`, e.g. \
             `--param date=2026-01-31`"
        );
        assert!(msg("1day=x").contains("`1day` is not a parameter name"), "{}", msg("1day=x"));
        // The value is never repeated: it may be a secret.
        assert_eq!(
            msg("my-tok=hunter2"),
            "`my-tok=...` is not NAME=VALUE: `my-tok` is not a parameter name (ASCII letters, digits and `_`, not \
             starting with a digit); give one of the names the flow declares under `[params]`"
        );
        assert_eq!(parse_arg("a=b=c", &[]).unwrap(), ("a".into(), "b=c".into()));
        assert_eq!(parse_arg("_x=", &[]).unwrap(), ("_x".into(), String::new()));
    }

    /// A value too long for the variable a step gets it as is a usage error, naming the limit
    /// and not the value; one just short of it is taken.
    #[test]
    fn a_value_too_long_to_pass_is_refused() {
        let f = flow("day = {}");
        let most = crate::flow::validate::max_arg() - "WAYMARK_PARAM_DAY=".len();
        assert!(resolve(&f, &given(&[&format!("day={}", "x".repeat(most))])).is_ok());
        let err = resolve(&f, &given(&[&format!("day={}", "x".repeat(most + 1))])).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "the value of `--param day` is {} bytes, more than the system passes to a program in one variable \
                 (at most {most} under this name); put it in a file and pass the file's path",
                most + 1
            )
        );
    }

    #[test]
    fn steps_see_parameters_upper_cased() {
        assert_eq!(env_name("date"), "WAYMARK_PARAM_DATE");
        assert_eq!(env_name("run_Id2"), "WAYMARK_PARAM_RUN_ID2");
    }
}
