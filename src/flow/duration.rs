//! Durations as flow files write them, checked against waymark's range: a number of seconds
//! (`90`, `0.5`) or a humantime string (`"90s"`, `"2m 30s"`). The flow loader reports a rejection
//! as a diagnostic at the value; the command line (`gc --older-than`) reads its arguments here too,
//! so that every duration waymark takes means the same thing wherever it is written.

use super::raw::RawDuration;
use super::validate::{MAX_DURATION, MIN_DURATION, number};
use std::time::Duration;

/// What to write instead, for a duration that is not one.
pub(crate) const FORMS: &str =
    "write seconds as a number (`90`, `0.5`) or a string such as \"90s\", \"2m 30s\", \"1h\"";

/// Why a duration was refused.
#[derive(Debug)]
pub(crate) struct Invalid {
    pub(crate) message: String,
    /// What the diagnostic's caret says, when not its default.
    pub(crate) label: Option<&'static str>,
    pub(crate) help: Option<&'static str>,
}

/// Why `text` is not a duration, in words rather than humantime's byte offsets ("expected number
/// at 8").
fn why(text: &str, e: &humantime::DurationError) -> String {
    use humantime::DurationError as E;
    let rest = |at: usize| text.get(at..).unwrap_or_default().trim_end();
    match e {
        E::NumberExpected(at) if rest(*at).is_empty() => "a number is missing at its end".into(),
        E::NumberExpected(at) => format!("a number was expected where it says `{}`", rest(*at)),
        E::InvalidCharacter(at) => match text.get(*at..).and_then(|r| r.chars().next()) {
            Some(c) => format!("`{c}` cannot be part of a duration (where it says `{}`)", rest(*at)),
            None => e.to_string(),
        },
        E::NumberOverflow => "a number in it is too large".into(),
        E::Empty => "it is empty".into(),
        // The unit's own message names the units there are.
        E::UnknownUnit { .. } => e.to_string(),
    }
}

/// The duration `raw` stands for, within waymark's range: at least 1 ms (or exactly 0 where
/// `allow_zero`), at most 100 years, never rounded to something else than what was written; a
/// negative one is refused as negative.
pub(crate) fn resolve(raw: &RawDuration, allow_zero: bool) -> Result<Duration, Invalid> {
    // A duration with a minus sign (`-5`, `"-5s"`): said as such, as the command line says it, not
    // as one below 1 ms or as a malformed string.
    let negative = |got: String| Invalid {
        message: format!("a duration cannot be negative, got {got}"),
        label: Some("negative"),
        help: Some("remove the `-`"),
    };
    let secs = match raw {
        RawDuration::Seconds(s) if *s < 0.0 && s.is_finite() => return Err(negative(format!("{} s", number(*s)))),
        RawDuration::Seconds(s) => *s,
        RawDuration::Text(text) => match humantime::parse_duration(text) {
            Ok(d) => d.as_secs_f64(),
            Err(_)
                if text
                    .trim_start()
                    .strip_prefix('-')
                    .and_then(|rest| humantime::parse_duration(rest.trim_start()).ok())
                    .is_some_and(|d| !d.is_zero()) =>
            {
                return Err(negative(super::toml_quoted(text)));
            }
            Err(e) => {
                return Err(Invalid {
                    message: format!("invalid duration {}: {}", super::toml_quoted(text), why(text, &e)),
                    label: None,
                    help: Some(FORMS),
                });
            }
        },
    };
    let floor = if allow_zero { "0 or at least 1 ms" } else { "at least 1 ms" };
    if !secs.is_finite() {
        return Err(Invalid {
            message: "a duration must be a finite number of seconds".into(),
            label: Some("not a number"),
            help: None,
        });
    }
    if secs < 0.0 || (secs < MIN_DURATION.as_secs_f64() && !(allow_zero && secs == 0.0)) {
        return Err(Invalid {
            // (`-0.0` is 0: said without its sign.)
            message: format!("a duration must be {floor}, got {} s", number(secs + 0.0)),
            label: Some("out of range"),
            help: (secs > 0.0).then_some("waymark counts time in milliseconds; write at least `0.001` or \"1ms\""),
        });
    }
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(Invalid {
            message: "a duration must be at most 100 years".into(),
            label: Some("out of range"),
            help: None,
        });
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A duration given on the command line, read as a flow file reads one: a bare number is seconds
/// (`30`, `0.5`), anything else a humantime string (`30d`, `12h`, `2m 30s`). The error says what was
/// wrong and which forms work.
pub(crate) fn from_arg(arg: &str, allow_zero: bool) -> Result<Duration, String> {
    let trimmed = arg.trim();
    let raw = |text: &str| match text.parse::<f64>() {
        Ok(secs) => RawDuration::Seconds(secs),
        Err(_) => RawDuration::Text(text.to_owned()),
    };
    // A duration with a minus sign (`-1`, `-7d`): said as such, not as a malformed one.
    let negative = trimmed.strip_prefix('-').is_some_and(|rest| resolve(&raw(rest), false).is_ok());
    let resolved = match negative {
        true => {
            Err(Invalid { message: format!("a duration cannot be negative, got {trimmed}"), label: None, help: None })
        }
        false => resolve(&raw(trimmed), allow_zero),
    };
    resolved.map_err(|e| {
        // The forms in the words of a command line; a more precise help (a value below 1 ms) stays.
        let help = match e.help {
            Some(help) if help != FORMS => help,
            _ => "write seconds as a number (`90`, `0.5`) or a duration such as `30d`, `12h`, `2m 30s`",
        };
        format!("{}; {help}", e.message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_read_like_flow_file_values() {
        assert_eq!(from_arg("30", false), Ok(Duration::from_secs(30)));
        assert_eq!(from_arg("0.5", false), Ok(Duration::from_millis(500)));
        assert_eq!(from_arg("30d", false), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(from_arg("2m 30s", false), Ok(Duration::from_secs(150)));
        assert_eq!(from_arg("0", true), Ok(Duration::ZERO));
        assert_eq!(from_arg("0s", true), Ok(Duration::ZERO));
    }

    #[test]
    fn minus_zero_is_zero_in_the_message() {
        let said = resolve(&RawDuration::Seconds(-0.0), false).unwrap_err().message;
        assert_eq!(said, "a duration must be at least 1 ms, got 0 s");
    }

    #[test]
    fn arguments_out_of_range_or_malformed_say_what_works() {
        assert_eq!(
            from_arg("0", false).unwrap_err(),
            "a duration must be at least 1 ms, got 0 s; write seconds as a number (`90`, `0.5`) or a duration such \
             as `30d`, `12h`, `2m 30s`"
        );
        assert_eq!(
            from_arg("-5", true).unwrap_err(),
            "a duration cannot be negative, got -5; write seconds as a number (`90`, `0.5`) or a duration such \
             as `30d`, `12h`, `2m 30s`"
        );
        assert!(from_arg("-7d", true).unwrap_err().starts_with("a duration cannot be negative, got -7d; "));
        assert_eq!(from_arg("-0", true), Ok(Duration::ZERO));
        assert_eq!(
            from_arg("1e-6", true).unwrap_err(),
            "a duration must be 0 or at least 1 ms, got 1e-6 s; waymark counts time in milliseconds; write at \
             least `0.001` or \"1ms\""
        );
        assert!(from_arg("nan", true).unwrap_err().starts_with("a duration must be a finite number of seconds; "));
        assert!(from_arg("200 years", true).unwrap_err().starts_with("a duration must be at most 100 years; "));
        assert!(from_arg("30 dayz", true).unwrap_err().starts_with("invalid duration \"30 dayz\": "));
        // In words, where the text goes wrong, not a byte offset.
        let said = |text: &str| resolve(&RawDuration::Text(text.into()), true).unwrap_err().message;
        assert_eq!(
            said("2 hours and a bit"),
            "invalid duration \"2 hours and a bit\": a number was expected where it says `and a bit`"
        );
        assert_eq!(said("abc"), "invalid duration \"abc\": a number was expected where it says `abc`");
        assert_eq!(said(""), "invalid duration \"\": it is empty");
        assert_eq!(said("5m!"), "invalid duration \"5m!\": `!` cannot be part of a duration (where it says `!`)");
    }

    #[test]
    fn negative_values_are_refused_as_negative() {
        let message = |raw: RawDuration| resolve(&raw, true).unwrap_err().message;
        assert_eq!(message(RawDuration::Seconds(-5.0)), "a duration cannot be negative, got -5 s");
        assert_eq!(message(RawDuration::Seconds(-0.0001)), "a duration cannot be negative, got -0.0001 s");
        assert_eq!(message(RawDuration::Text("-5s".into())), "a duration cannot be negative, got \"-5s\"");
        assert_eq!(message(RawDuration::Text("- 2m 30s".into())), "a duration cannot be negative, got \"- 2m 30s\"");
        assert_eq!(resolve(&RawDuration::Seconds(-0.0), true).unwrap(), Duration::ZERO);
        assert!(message(RawDuration::Seconds(f64::NEG_INFINITY)).starts_with("a duration must be a finite number"));
        assert!(message(RawDuration::Text("-x".into())).starts_with("invalid duration \"-x\": "));
    }
}
