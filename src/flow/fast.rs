//! A fast path for reading the flow file: a byte scanner for a strict subset of TOML that builds
//! the raw types (`raw.rs`) directly, with the spans the full reader gives, and without building
//! the `toml` crate's document first.
//!
//! It gives up (`None`) on anything it is not certain about: syntax outside the subset, a key
//! outside the subset, a value of a type the full reader would report, a duplicate key, an escape
//! it does not decode, a table header it does not know. The full reader (`toml` and `raw::read`)
//! then reads the file as if this one did not exist, so every syntax error and every shape
//! diagnostic stays the full reader's, by construction. What this path accepts, it reads exactly
//! as the full reader does (tested by comparing both on every flow in the repository and on
//! generated ones, `tests` below).
//!
//! The subset:
//! - Lines of `key = value`, `[[step]]`, `[defaults]` and `[policies.NAME]`, with blank lines,
//!   comments, spaces and tabs, LF or CRLF line ends.
//! - Keys: bare (`A-Za-z0-9_-`), or quoted without escapes; never dotted.
//! - The top level: `name`, `resume_within`, `max_parallel`, `fail_fast`, `timeout`, `env_file`,
//!   `secret_env` and `env` (an inline table), before the first header.
//! - A step: `name`, `needs`, `run`, `shell`, `timeout`, `retry`, `workdir`, `kill_signal`,
//!   `kill_grace`, `detect_errors`, `env` and `compensate`; `[defaults]` and policies: their keys.
//! - Values: basic strings (escapes `\" \\ \b \t \n \f \r \uXXXX \UXXXXXXXX`), literal strings,
//!   multi-line literal strings, decimal integers within `i64`, finite decimal floats, booleans,
//!   arrays of strings (over several lines, with comments and a trailing comma), and inline
//!   tables on one line (a retry policy, an `env`).

use super::raw::{DEFAULTS_KEYS, FLOW_KEYS, HOOK_KEYS, POLICY_KEYS, STEP_KEYS};
use super::raw::{RawCommand, RawDefaults, RawDuration, RawFlow, RawPolicy, RawRetry, RawStep, Str, StrMap};
use std::ops::Range;
use toml::Spanned;

/// The input is outside the subset: the full reader decides.
struct Bail;

type Fast<T> = Result<T, Bail>;

/// The raw flow of `source`, when `source` is in the subset; `None` to read it the full way.
pub(crate) fn read(source: &str) -> Option<RawFlow> {
    Scanner { src: source, bytes: source.as_bytes(), pos: 0, tables: 0 }.flow().ok()
}

/// A key as written (its span, quotes included) and its text.
type Key<'s> = (Range<usize>, &'s str);

/// A value as written, before it is checked against the key it belongs to.
enum Value<'s> {
    Str(String),
    Int(i64),
    /// A float (finite), read from its text where it is used, as the full reader does.
    Float,
    Bool(bool),
    Strs(Vec<Str>),
    Table(Vec<(Key<'s>, Spanned<Value<'s>>)>),
}

/// The table that `key = value` lines belong to.
enum Current {
    Top,
    Step,
    Defaults,
    Policy(String),
    Params,
    Hooks,
    Errors,
    ExitCodes,
}

/// The tables of the top level written as `[NAME]`, each at most once.
const TABLES: [&str; 5] = ["defaults", "params", "hooks", "errors", "exit_codes"];

struct Scanner<'s> {
    src: &'s str,
    bytes: &'s [u8],
    pos: usize,
    /// The [`TABLES`] written so far.
    tables: u32,
}

/// The keys of a `[[step]]` ([`STEP_KEYS`]) the fast path leaves to the full reader.
const STEP_KEYS_LEFT: [&str; 2] = ["exit_codes", "catch"];

/// The most parameters, or entries of an inline table, the fast path reads: it finds a repeated
/// one by looking through those before, which past a few dozen would cost more than the full
/// reader's map (80,000 parameters took 15 s); longer ones are left to the full reader.
const MAX_SEARCHED: usize = 64;

/// The index of `key` in `keys`, marked in `seen`; a key outside `keys` or seen before bails.
fn mark(keys: &[&str], seen: &mut u32, key: &str) -> Fast<usize> {
    let i = keys.iter().position(|k| *k == key).ok_or(Bail)?;
    if *seen & (1 << i) != 0 {
        return Err(Bail);
    }
    *seen |= 1 << i;
    Ok(i)
}

fn string(v: Spanned<Value<'_>>) -> Fast<Str> {
    let span = v.span();
    match v.into_inner() {
        Value::Str(s) => Ok(Spanned::new(span, s)),
        _ => Err(Bail),
    }
}

fn strings(v: Spanned<Value<'_>>) -> Fast<Spanned<Vec<Str>>> {
    let span = v.span();
    match v.into_inner() {
        Value::Strs(s) => Ok(Spanned::new(span, s)),
        _ => Err(Bail),
    }
}

fn boolean(v: Spanned<Value<'_>>) -> Fast<bool> {
    match v.into_inner() {
        Value::Bool(b) => Ok(b),
        _ => Err(Bail),
    }
}

fn whole(v: Spanned<Value<'_>>) -> Fast<Spanned<i64>> {
    let span = v.span();
    match v.into_inner() {
        Value::Int(i) => Ok(Spanned::new(span, i)),
        _ => Err(Bail),
    }
}

/// A number, read from its text as the full reader reads one.
fn number(src: &str, v: &Spanned<Value<'_>>) -> Fast<Option<f64>> {
    match v.get_ref() {
        Value::Int(_) | Value::Float => src.get(v.span()).and_then(|t| t.parse().ok()).map(Some).ok_or(Bail),
        _ => Ok(None),
    }
}

fn seconds(src: &str, v: Spanned<Value<'_>>) -> Fast<Spanned<f64>> {
    let x = number(src, &v)?.ok_or(Bail)?;
    Ok(Spanned::new(v.span(), x))
}

fn duration(src: &str, v: Spanned<Value<'_>>) -> Fast<Spanned<RawDuration>> {
    let span = v.span();
    let raw = match number(src, &v)? {
        Some(x) => RawDuration::Seconds(x),
        None => match v.into_inner() {
            Value::Str(s) => RawDuration::Text(s),
            _ => return Err(Bail),
        },
    };
    Ok(Spanned::new(span, raw))
}

fn string_map(v: Spanned<Value<'_>>) -> Fast<StrMap> {
    let Value::Table(entries) = v.into_inner() else { return Err(Bail) };
    let mut out = StrMap::new();
    for ((span, key), value) in entries {
        out.insert(Spanned::new(span, key.to_owned()), string(value)?);
    }
    Ok(out)
}

fn policy(src: &str, entries: Vec<(Key<'_>, Spanned<Value<'_>>)>) -> Fast<RawPolicy> {
    let mut raw = RawPolicy::default();
    let mut seen = 0;
    for ((_, key), value) in entries {
        policy_key(src, &mut raw, &mut seen, key, value)?;
    }
    Ok(raw)
}

fn policy_key(src: &str, raw: &mut RawPolicy, seen: &mut u32, key: &str, v: Spanned<Value<'_>>) -> Fast<()> {
    mark(&POLICY_KEYS, seen, key)?;
    match key {
        "attempts" => raw.attempts = Some(whole(v)?),
        "exception_types" => raw.exception_types = Some(strings(v)?),
        "backoff_seconds" => raw.backoff_seconds = Some(seconds(src, v)?),
        "backoff_multiplier" => raw.backoff_multiplier = Some(seconds(src, v)?),
        "backoff_max_seconds" => raw.backoff_max_seconds = Some(seconds(src, v)?),
        _ => raw.jitter = Some(boolean(v)?),
    }
    Ok(())
}

fn retry(src: &str, v: Spanned<Value<'_>>) -> Fast<Spanned<RawRetry>> {
    let span = v.span();
    let raw = match v.into_inner() {
        Value::Str(s) => RawRetry::Named(s),
        Value::Table(entries) => RawRetry::Inline(policy(src, entries)?),
        _ => return Err(Bail),
    };
    Ok(Spanned::new(span, raw))
}

fn command(v: Spanned<Value<'_>>) -> Fast<Spanned<RawCommand>> {
    let span = v.span();
    let raw = match v.into_inner() {
        Value::Str(s) => RawCommand::Shell(s),
        Value::Strs(s) => RawCommand::Run(s),
        _ => return Err(Bail),
    };
    Ok(Spanned::new(span, raw))
}

fn defaults_key(src: &str, raw: &mut RawDefaults, seen: &mut u32, key: &str, v: Spanned<Value<'_>>) -> Fast<()> {
    mark(&DEFAULTS_KEYS, seen, key)?;
    match key {
        "timeout" => raw.timeout = Some(duration(src, v)?),
        "retry" => raw.retry = Some(retry(src, v)?),
        "kill_signal" => raw.kill_signal = Some(string(v)?),
        "kill_grace" => raw.kill_grace = Some(duration(src, v)?),
        _ => raw.detect_errors = Some(string(v)?),
    }
    Ok(())
}

fn step_key(src: &str, raw: &mut RawStep, seen: &mut u32, key: &str, v: Spanned<Value<'_>>) -> Fast<()> {
    mark(&STEP_KEYS, seen, key)?;
    match key {
        "name" => raw.name = Some(string(v)?),
        "needs" => raw.needs = Some(strings(v)?),
        "run" => raw.run = Some(strings(v)?),
        "shell" => raw.shell = Some(string(v)?),
        // Left to the full reader.
        _ if STEP_KEYS_LEFT.contains(&key) => return Err(Bail),
        _ => {
            let more = raw.more_mut();
            match key {
                "timeout" => more.timeout = Some(duration(src, v)?),
                "retry" => more.retry = Some(retry(src, v)?),
                "workdir" => more.workdir = Some(string(v)?),
                "kill_signal" => more.kill_signal = Some(string(v)?),
                "kill_grace" => more.kill_grace = Some(duration(src, v)?),
                "detect_errors" => more.detect_errors = Some(string(v)?),
                "env" => more.env = string_map(v)?,
                _ => more.compensate = Some(command(v)?),
            }
        }
    }
    Ok(())
}

fn top_key(src: &str, raw: &mut RawFlow, seen: &mut u32, key: &str, v: Spanned<Value<'_>>) -> Fast<()> {
    mark(&FLOW_KEYS, seen, key)?;
    match key {
        "name" => raw.name = Some(string(v)?),
        "resume_within" => raw.resume_within = Some(duration(src, v)?),
        "max_parallel" => raw.max_parallel = Some(whole(v)?),
        "fail_fast" => raw.fail_fast = Some(boolean(v)?),
        "timeout" => raw.timeout = Some(duration(src, v)?),
        "env_file" => raw.env_file = Some(string(v)?),
        "secret_env" => raw.secret_env = Some(strings(v)?),
        "env" => raw.env = string_map(v)?,
        // The tables, written as `key = value` (an inline table), are the full reader's.
        _ => return Err(Bail),
    }
    Ok(())
}

fn is_bare(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// A byte that may not appear in a string or a comment (a control character other than tab).
fn is_control(b: u8) -> bool {
    (b < 0x20 && b != b'\t') || b == 0x7f
}

impl<'s> Scanner<'s> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn eat(&mut self, b: u8) -> Fast<()> {
        if self.peek() == Some(b) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Bail)
        }
    }

    fn spaces(&mut self) {
        while let Some(b' ' | b'\t') = self.peek() {
            self.pos += 1;
        }
    }

    /// `#` to the end of the line (not included).
    fn comment(&mut self) -> Fast<()> {
        self.eat(b'#')?;
        while let Some(&b) = self.bytes.get(self.pos) {
            match b {
                b'\n' => break,
                b'\r' if self.bytes.get(self.pos + 1) == Some(&b'\n') => break,
                _ if is_control(b) => return Err(Bail),
                _ => self.pos += 1,
            }
        }
        Ok(())
    }

    /// A line end (LF or CRLF), or the end of the file.
    fn newline(&mut self) -> Fast<()> {
        match self.peek() {
            None => Ok(()),
            Some(b'\n') => {
                self.pos += 1;
                Ok(())
            }
            Some(b'\r') if self.bytes.get(self.pos + 1) == Some(&b'\n') => {
                self.pos += 2;
                Ok(())
            }
            _ => Err(Bail),
        }
    }

    /// What may follow a value or a header on its line: spaces, a comment, the line end.
    fn end_of_line(&mut self) -> Fast<()> {
        self.spaces();
        if self.peek() == Some(b'#') {
            self.comment()?;
        }
        self.newline()
    }

    /// Spaces, line ends and comments, as between the items of an array.
    fn blank(&mut self) -> Fast<()> {
        loop {
            match self.peek() {
                Some(b' ' | b'\t') => self.pos += 1,
                Some(b'\n' | b'\r') => self.newline()?,
                Some(b'#') => self.comment()?,
                _ => return Ok(()),
            }
        }
    }

    fn flow(mut self) -> Fast<RawFlow> {
        let mut flow = RawFlow::default();
        let mut current = Current::Top;
        // The keys written in the current table.
        let mut seen = 0u32;
        loop {
            self.spaces();
            match self.peek() {
                None => return Ok(flow),
                Some(b'\n' | b'\r') => self.newline()?,
                Some(b'#') => self.end_of_line()?,
                Some(b'[') => {
                    current = self.header(&mut flow)?;
                    seen = 0;
                    self.end_of_line()?;
                }
                Some(_) => {
                    let (key_span, key) = self.key()?;
                    self.spaces();
                    self.eat(b'=')?;
                    self.spaces();
                    let value = self.value(false)?;
                    let src = self.src;
                    match &current {
                        Current::Top => top_key(src, &mut flow, &mut seen, key, value)?,
                        Current::Step => {
                            let step = flow.step.last_mut().ok_or(Bail)?;
                            step_key(src, step.get_mut(), &mut seen, key, value)?
                        }
                        Current::Defaults => {
                            let defaults = flow.defaults.as_mut().ok_or(Bail)?;
                            defaults_key(src, defaults, &mut seen, key, value)?
                        }
                        Current::Policy(name) => {
                            let policy = flow.policies.get_mut(name.as_str()).ok_or(Bail)?;
                            policy_key(src, policy.get_mut(), &mut seen, key, value)?
                        }
                        Current::Hooks => {
                            let hook = match mark(&HOOK_KEYS, &mut seen, key)? {
                                0 => &mut flow.hooks.on_success,
                                1 => &mut flow.hooks.on_failure,
                                _ => &mut flow.hooks.on_exit,
                            };
                            *hook = Some(command(value)?);
                        }
                        Current::Params => {
                            if flow.params.len() >= MAX_SEARCHED
                                || flow.params.iter().any(|(name, _)| name.get_ref() == key)
                            {
                                return Err(Bail);
                            }
                            let name = Spanned::new(key_span, key.to_owned());
                            let default = match value.get_ref() {
                                Value::Table(entries) if entries.is_empty() => None,
                                _ => Some(string(value)?),
                            };
                            flow.params.push((name, default));
                        }
                        Current::Errors => {
                            if flow.errors.contains_key(key) {
                                return Err(Bail);
                            }
                            let bases = strings(value)?;
                            flow.errors.insert(Spanned::new(key_span, key.to_owned()), bases);
                        }
                        Current::ExitCodes => {
                            if flow.exit_codes.contains_key(key) {
                                return Err(Bail);
                            }
                            let class = string(value)?;
                            flow.exit_codes.insert(Spanned::new(key_span, key.to_owned()), class);
                        }
                    }
                    self.end_of_line()?;
                }
            }
        }
    }

    /// `[[step]]`, `[NAME]` of [`TABLES`] or `[policies.NAME]` (NAME bare), written without
    /// spaces.
    fn header(&mut self, flow: &mut RawFlow) -> Fast<Current> {
        let start = self.pos;
        if self.bytes[start..].starts_with(b"[[step]]") {
            self.pos += 8;
            flow.step.push(Spanned::new(start..self.pos, RawStep::default()));
            return Ok(Current::Step);
        }
        self.eat(b'[')?;
        let name_start = self.pos;
        while self.peek().is_some_and(is_bare) {
            self.pos += 1;
        }
        let name = &self.src[name_start..self.pos];
        if name == "policies" && self.peek() == Some(b'.') {
            self.pos += 1;
            let policy_start = self.pos;
            while self.peek().is_some_and(is_bare) {
                self.pos += 1;
            }
            let policy_span = policy_start..self.pos;
            if policy_span.is_empty() {
                return Err(Bail);
            }
            self.eat(b']')?;
            let policy = self.src[policy_span.clone()].to_owned();
            if flow.policies.contains_key(policy.as_str()) {
                return Err(Bail);
            }
            let table = Spanned::new(start..self.pos, RawPolicy::default());
            flow.policies.insert(Spanned::new(policy_span, policy.clone()), table);
            return Ok(Current::Policy(policy));
        }
        self.eat(b']')?;
        let current = match mark(&TABLES, &mut self.tables, name)? {
            0 => {
                flow.defaults = Some(RawDefaults::default());
                Current::Defaults
            }
            1 => Current::Params,
            2 => Current::Hooks,
            3 => Current::Errors,
            _ => Current::ExitCodes,
        };
        Ok(current)
    }

    /// A bare key, or a quoted one without escapes.
    fn key(&mut self) -> Fast<Key<'s>> {
        let start = self.pos;
        match self.peek() {
            Some(q @ (b'"' | b'\'')) => {
                self.pos += 1;
                let inner = self.pos;
                while let Some(b) = self.peek() {
                    if b == q {
                        break;
                    }
                    if b == b'\\' || is_control(b) {
                        return Err(Bail);
                    }
                    self.pos += 1;
                }
                let text = &self.src[inner..self.pos];
                self.eat(q)?;
                Ok((start..self.pos, text))
            }
            _ => {
                while self.peek().is_some_and(is_bare) {
                    self.pos += 1;
                }
                if self.pos == start {
                    return Err(Bail);
                }
                Ok((start..self.pos, &self.src[start..self.pos]))
            }
        }
    }

    /// A value; `inline` inside an inline table (which holds no table).
    fn value(&mut self, inline: bool) -> Fast<Spanned<Value<'s>>> {
        let start = self.pos;
        let value = match self.peek().ok_or(Bail)? {
            b'"' => Value::Str(self.basic()?),
            b'\'' => Value::Str(self.literal()?),
            b'[' => Value::Strs(self.array()?),
            b'{' if !inline => Value::Table(self.table()?),
            _ => self.scalar()?,
        };
        Ok(Spanned::new(start..self.pos, value))
    }

    /// A basic string (`"..."`), its escapes decoded.
    fn basic(&mut self) -> Fast<String> {
        self.eat(b'"')?;
        if self.peek() == Some(b'"') && self.bytes.get(self.pos + 1) == Some(&b'"') {
            return Err(Bail); // a multi-line basic string
        }
        let start = self.pos;
        // Most strings hold no escape: found whole, and copied once.
        let plain = self.bytes[start..].iter().position(|&b| b == b'"' || b == b'\\' || is_control(b));
        let end = start + plain.ok_or(Bail)?;
        if self.bytes[end] == b'"' {
            self.pos = end + 1;
            return Ok(self.src[start..end].to_owned());
        }
        let mut out = String::new();
        let mut run = start;
        self.pos = end;
        loop {
            let b = self.peek().ok_or(Bail)?;
            match b {
                b'"' => {
                    out.push_str(&self.src[run..self.pos]);
                    self.pos += 1;
                    return Ok(out);
                }
                b'\\' => {
                    out.push_str(&self.src[run..self.pos]);
                    let (c, len) = match self.bytes.get(self.pos + 1).ok_or(Bail)? {
                        b'"' => ('"', 2),
                        b'\\' => ('\\', 2),
                        b'b' => ('\u{8}', 2),
                        b't' => ('\t', 2),
                        b'n' => ('\n', 2),
                        b'f' => ('\u{c}', 2),
                        b'r' => ('\r', 2),
                        b'u' => (self.unicode(4)?, 6),
                        b'U' => (self.unicode(8)?, 10),
                        _ => return Err(Bail),
                    };
                    out.push(c);
                    self.pos += len;
                    run = self.pos;
                }
                _ if is_control(b) => return Err(Bail),
                _ => self.pos += 1,
            }
        }
    }

    /// The character of the escape `\u` or `\U` at `pos`, with `digits` hex digits.
    fn unicode(&self, digits: usize) -> Fast<char> {
        let hex = self.src.get(self.pos + 2..self.pos + 2 + digits).ok_or(Bail)?;
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Bail);
        }
        u32::from_str_radix(hex, 16).ok().and_then(char::from_u32).ok_or(Bail)
    }

    /// A literal string (`'...'`) or a multi-line literal string (`'''...'''`).
    fn literal(&mut self) -> Fast<String> {
        self.eat(b'\'')?;
        if self.bytes[self.pos..].starts_with(b"''") {
            self.pos += 2;
            // A line end right after the opening quotes is not part of the string.
            if self.peek() == Some(b'\n') {
                self.pos += 1;
            }
            let start = self.pos;
            loop {
                match self.peek().ok_or(Bail)? {
                    b'\'' if self.bytes[self.pos..].starts_with(b"'''") => {
                        let text = self.src[start..self.pos].to_owned();
                        self.pos += 3;
                        // Quotes right after the closing ones belong to the string: not handled.
                        if self.peek() == Some(b'\'') {
                            return Err(Bail);
                        }
                        return Ok(text);
                    }
                    b'\n' => self.pos += 1,
                    b if is_control(b) => return Err(Bail),
                    _ => self.pos += 1,
                }
            }
        }
        let start = self.pos;
        loop {
            match self.peek().ok_or(Bail)? {
                b'\'' => {
                    let text = self.src[start..self.pos].to_owned();
                    self.pos += 1;
                    return Ok(text);
                }
                b if is_control(b) => return Err(Bail),
                _ => self.pos += 1,
            }
        }
    }

    /// An array of strings, over as many lines as it takes.
    fn array(&mut self) -> Fast<Vec<Str>> {
        self.eat(b'[')?;
        let mut out = Vec::new();
        loop {
            self.blank()?;
            if self.peek() == Some(b']') {
                self.pos += 1;
                return Ok(out);
            }
            let start = self.pos;
            let s = match self.peek() {
                Some(b'"') => self.basic()?,
                Some(b'\'') => self.literal()?,
                _ => return Err(Bail),
            };
            out.push(Spanned::new(start..self.pos, s));
            self.blank()?;
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(out);
                }
                _ => return Err(Bail),
            }
        }
    }

    /// An inline table on one line, without a trailing comma; its keys are not repeated.
    fn table(&mut self) -> Fast<Vec<(Key<'s>, Spanned<Value<'s>>)>> {
        self.eat(b'{')?;
        self.spaces();
        let mut out: Vec<(Key<'s>, Spanned<Value<'s>>)> = Vec::new();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(out);
        }
        loop {
            let key = self.key()?;
            if out.len() >= MAX_SEARCHED || out.iter().any(|(k, _)| k.1 == key.1) {
                return Err(Bail);
            }
            self.spaces();
            self.eat(b'=')?;
            self.spaces();
            let value = self.value(true)?;
            out.push((key, value));
            self.spaces();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.spaces();
                }
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(out);
                }
                _ => return Err(Bail),
            }
        }
    }

    /// A boolean, a decimal integer within `i64` or a finite decimal float.
    fn scalar(&mut self) -> Fast<Value<'s>> {
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'-' | b'.' | b':')) {
            self.pos += 1;
        }
        let text = &self.src[start..self.pos];
        match text {
            "true" => return Ok(Value::Bool(true)),
            "false" => return Ok(Value::Bool(false)),
            _ => {}
        }
        let bytes = text.as_bytes();
        let mut i = usize::from(bytes.first() == Some(&b'-'));
        let digits = |i: &mut usize| {
            let from = *i;
            while bytes.get(*i).is_some_and(u8::is_ascii_digit) {
                *i += 1;
            }
            *i - from
        };
        let int_start = i;
        let int_len = digits(&mut i);
        if int_len == 0 || (int_len > 1 && bytes[int_start] == b'0') {
            return Err(Bail);
        }
        let mut float = false;
        if bytes.get(i) == Some(&b'.') {
            i += 1;
            if digits(&mut i) == 0 {
                return Err(Bail);
            }
            float = true;
        }
        if let Some(b'e' | b'E') = bytes.get(i) {
            i += 1;
            if let Some(b'+' | b'-') = bytes.get(i) {
                i += 1;
            }
            if digits(&mut i) == 0 {
                return Err(Bail);
            }
            float = true;
        }
        if i != bytes.len() {
            return Err(Bail);
        }
        if float {
            let x: f64 = text.parse().map_err(|_| Bail)?;
            if !x.is_finite() {
                return Err(Bail);
            }
            Ok(Value::Float)
        } else {
            text.parse().map(Value::Int).map_err(|_| Bail)
        }
    }
}

#[cfg(test)]
mod tests {
    //! The fast path against the full reader: on every input, either the fast path gives up or
    //! both read the same raw flow (spans included), and loading the flow gives the same flow,
    //! warnings and errors.

    use super::super::raw::{DEFAULTS_KEYS, FLOW_KEYS, HOOK_KEYS, POLICY_KEYS, STEP_KEYS};
    use super::super::{Reader, parse_by, raw, validate::ProgramSearch};
    use proptest::prelude::*;
    use std::path::Path;

    /// Whether the fast path read `src`; panics when it read it differently from the full
    /// reader, or read what the full reader rejects.
    fn differential(src: &str) -> bool {
        let fast = super::read(src);
        let Some(fast) = fast else { return false };
        let full = toml::de::DeTable::parse(src).map(|doc| raw::read(doc.get_ref(), src));
        match full {
            Ok((full, diags)) if diags.is_empty() => {
                assert_eq!(format!("{fast:?}"), format!("{full:?}"), "the two readers differ on {src:?}");
            }
            Ok((_, diags)) => panic!("the fast path read {src:?}, which the full reader reports: {diags:?}"),
            Err(e) => panic!("the fast path read {src:?}, which is not TOML: {e}"),
        }
        // Loading: the same flow and diagnostics, those that name a key path included (the fast
        // path's are indexed from the document parsed on the first one). A PATH without the
        // programs makes a warning of every `run`.
        let path = Path::new("/x/flow.toml");
        let nowhere = ProgramSearch { path: Some("/nonexistent-waymark-test".into()) };
        for search in [None, Some(&nowhere)] {
            let by_fast = parse_by(src, path, search, Reader::Fast);
            let by_full = parse_by(src, path, search, Reader::Full);
            assert_eq!(by_fast, by_full, "loading differs on {src:?}");
        }
        true
    }

    /// Every flow file of the repository, the TOML of README.md, and the string literals of the
    /// tests that look like flow text.
    fn corpus() -> Vec<(String, String)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut out = Vec::new();
        let mut dirs = vec![root.join("examples"), root.join("tests"), root.join("src"), root.join("bench")];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let name = path.display().to_string();
                let Ok(text) = std::fs::read_to_string(&path) else { continue };
                match path.extension().and_then(|e| e.to_str()) {
                    Some("toml") => out.push((name, text)),
                    Some("rs") => {
                        for (i, lit) in string_literals(&text).into_iter().enumerate() {
                            if lit.contains('=') || lit.contains('[') {
                                out.push((format!("{name} literal {i}"), lit));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        for (i, block) in readme.split("```toml\n").skip(1).enumerate() {
            out.push((format!("README.md block {i}"), block[..block.find("```").unwrap()].to_owned()));
        }
        out.sort();
        out
    }

    /// The string literals of Rust source `text`, escapes decoded (a best effort: any text is a
    /// fair input).
    fn string_literals(text: &str) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        let mut out = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '/' if chars.get(i + 1) == Some(&'/') => {
                    while i < chars.len() && chars[i] != '\n' {
                        i += 1;
                    }
                }
                '\'' => {
                    // A char literal ('"', '\'', '\u{7f}'), or a lifetime.
                    let close = (i + 2..(i + 12).min(chars.len())).find(|&j| chars[j] == '\'');
                    match close {
                        Some(j) if j == i + 2 || chars[i + 1] == '\\' => i = j + 1,
                        _ => i += 1,
                    }
                }
                'r' if matches!(chars.get(i + 1), Some('"' | '#'))
                    && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')) =>
                {
                    let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
                    let open = i + 1 + hashes;
                    if chars.get(open) != Some(&'"') {
                        i += 1;
                        continue;
                    }
                    let closing: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                    let start = open + 1;
                    let mut j = start;
                    while j < chars.len() && !chars[j..].starts_with(&closing) {
                        j += 1;
                    }
                    out.push(chars[start..j.min(chars.len())].iter().collect());
                    i = j + closing.len();
                }
                '"' => {
                    let mut s = String::new();
                    i += 1;
                    while i < chars.len() && chars[i] != '"' {
                        if chars[i] == '\\' && i + 1 < chars.len() {
                            i += 1;
                            match chars[i] {
                                'n' => s.push('\n'),
                                't' => s.push('\t'),
                                'r' => s.push('\r'),
                                '0' => s.push('\0'),
                                '\n' => {
                                    while i + 1 < chars.len() && chars[i + 1].is_whitespace() {
                                        i += 1;
                                    }
                                }
                                'u' => {
                                    let end = (i..chars.len()).find(|&j| chars[j] == '}').unwrap_or(i);
                                    let hex: String = chars[(i + 2).min(end)..end].iter().collect();
                                    s.extend(u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32));
                                    i = end;
                                }
                                c => s.push(c),
                            }
                        } else {
                            s.push(chars[i]);
                        }
                        i += 1;
                    }
                    out.push(s);
                    i += 1;
                }
                _ => i += 1,
            }
        }
        out
    }

    #[test]
    fn every_flow_of_the_repository_is_read_the_same_or_left_to_the_full_reader() {
        let corpus = corpus();
        assert!(corpus.len() > 500, "the corpus was found: {}", corpus.len());
        let mut handled = Vec::new();
        for (name, text) in &corpus {
            let crlf = text.replace("\r\n", "\n").replace('\n', "\r\n");
            let variants = [
                text.clone(),
                crlf,
                text.trim_end().to_owned(),
                format!("{text}# end"),
                format!("# start\n\n{text}"),
                text.replace(" = ", "="),
                text.replace('\n', " \t\n"),
            ];
            for (v, variant) in variants.iter().enumerate() {
                if differential(variant) && v == 0 {
                    handled.push(name.as_str());
                }
            }
        }
        // The fast path is not a path that always gives up: the common files are its own.
        for example in ["hello.toml", "fanout.toml", "retry.toml", "timeout.toml"] {
            let found = |n: &&str| n.ends_with(&format!("/examples/{example}"));
            if !handled.iter().any(found) {
                panic!("examples/{example} is left to the full reader");
            }
        }
        assert!(handled.len() > corpus.len() / 8, "{} of {} handled", handled.len(), corpus.len());
    }

    /// The flow of issue 11: 10,000 steps, the first `sleep 1000`, the others `true`.
    fn big() -> String {
        let mut src = String::from("name = \"big\"\n");
        for i in 0..10_000 {
            let run = if i == 0 { "[\"sleep\", \"1000\"]" } else { "[\"true\"]" };
            src.push_str(&format!("[[step]]\nname = \"s{i}\"\nrun = {run}\n"));
        }
        src
    }

    #[test]
    fn the_common_shape_is_read_by_the_fast_path() {
        let src = big();
        let raw = super::read(&src).expect("the fast path reads the common shape");
        assert_eq!(raw.step.len(), 10_000);
        assert!(differential(&src));
        // A validation error found through the fast path is located and named as before.
        let bad = src.replacen("name = \"s9999\"\n", "name = \"s9999\"\nretry = { attempts = 0 }\n", 1);
        assert!(super::read(&bad).is_some());
        let by_fast = parse_by(&bad, Path::new("/x/big.toml"), None, Reader::Fast).unwrap_err();
        assert_eq!(
            by_fast[0].message,
            "`step[9999].retry.attempts`: `attempts` counts total executions and must be at least 1"
        );
        assert_eq!(by_fast, parse_by(&bad, Path::new("/x/big.toml"), None, Reader::Full).unwrap_err());
    }

    #[test]
    fn what_the_fast_path_gives_up_on() {
        let step = "[[step]]\nname = 'a'\nrun = ['true']\n";
        for src in [
            format!("{step}name = 'b'\n"),                               // duplicate key
            format!("{step}nmae = 'b'\n"),                               // unknown key
            format!("{step}timeout = true\n"),                           // wrong type
            format!("{step}retry = {{ attempts = 1, attempts = 2 }}\n"), // duplicate in a table
            format!("{step}shell = \"a\\e\"\n"),                         // an escape not decoded
            format!("{step}shell = \"a\\x41\"\n"),                       // (TOML 1.1)
            format!("{step}shell = \"\"\"a\"\"\"\n"),                    // multi-line basic string
            format!("{step}[step.retry]\nattempts = 2\n"),               // an unknown header
            format!("[defaults]\n[defaults]\n{step}"),                   // a table twice
            format!("[policies.a]\n[policies.a]\n{step}"),               // a policy twice
            format!("{step}retry.attempts = 2\n"),                       // a dotted key
            format!("{step}timeout = 1_000\n"),                          // an underscore
            format!("{step}timeout = 0x10\n"),                           // not decimal
            format!("{step}timeout = 01\n"),                             // a leading zero
            format!("{step}timeout = inf\n"),                            // not finite
            format!("{step}timeout = 1e400\n"),                          // not finite either
            format!("{step}timeout = 9223372036854775808\n"),            // past i64
            format!("{step}timeout = 1979-05-27\n"),                     // a date
            format!("{step}env = {{ A = 'x', }}\n"),                     // a trailing comma
            format!("{step}env = {{ A = 'x',\n B = 'y' }}\n"),           // a line end in a table
            format!("{step}shell = 'a\rb'\n"),                           // a bare CR
            format!("{step}shell = '''a''''\n"),                         // a quote after '''
            format!("{step}shell = 'a' 'b'\n"),                          // two values
            format!("\u{feff}{step}"),                                   // a byte-order mark
            format!("{step}# a \u{7f} in a comment\n"),                  // a control character
            format!("[params]\n{}{step}", (0..65).map(|i| format!("p{i} = 'v'\n")).collect::<String>()), // many
            format!("{step}env = {{ {} }}\n", (0..65).map(|i| format!("K{i} = 'v'")).collect::<Vec<_>>().join(", ")),
        ] {
            assert!(super::read(&src).is_none(), "the fast path read {src:?}");
            assert!(!differential(&src));
        }
    }

    #[test]
    fn up_to_64_parameters_and_entries_of_a_table_are_read() {
        let params: String = (0..64).map(|i| format!("p{i} = 'v'\n")).collect();
        let env = (0..64).map(|i| format!("K{i} = 'v'")).collect::<Vec<_>>().join(", ");
        let src = format!("[params]\n{params}[[step]]\nname = 'a'\nrun = ['true']\nenv = {{ {env} }}\n");
        assert!(differential(&src), "the fast path gave up on {src:?}");
    }

    #[test]
    fn odd_numbers_strings_and_keys_of_the_subset_are_read_as_the_full_reader_reads_them() {
        let step = "[[step]]\nname = 'a'\nrun = ['true']\n";
        for value in [
            "1e03",
            "-1.5e-07",
            "0e0",
            "0.0e0",
            "-0e5",
            "0.50",
            "1.0E+00",
            "-0",
            "-0.0",
            "9223372036854775807",
            "-9223372036854775808",
            "1e308",
            "4.9e-324",
            "123456789012345678",
            "0.1",
        ] {
            for key in ["timeout", "kill_grace"] {
                let src = format!("{step}{key} = {value}\n");
                assert!(differential(&src), "{src:?}");
            }
            let src = format!("{step}retry = {{ backoff_seconds = {value}, backoff_multiplier = {value} }}\n");
            assert!(differential(&src), "{src:?}");
        }
        for value in ["0", "-0", "9223372036854775807", "-9223372036854775808", "-1"] {
            let src = format!("max_parallel = {value}\n{step}retry = {{ attempts = {value} }}\n");
            assert!(differential(&src), "{src:?}");
        }
        for src in [
            format!("{step}shell = \"\\u0000 \\U0010FFFF \\uFFFD \\\\ \\\" \\b\\f\\r\\n\\t\"\n"),
            format!("{step}shell = ''\nworkdir = \"\"\n"),
            format!("{step}shell = '''\n'''\n"),
            format!("{step}shell = '''\n\n'''\n"),
            format!("{step}shell = '''a''b'''\n"),
            format!("{step}shell = '''''a'''\n"),
            format!("{step}shell = '\u{85}\u{2028}\u{fffd}\u{10ffff}'\n"),
            format!("[exit_codes]\n\"\" = 'X'\n'3' = 'Y'\n4 = 'Z'\n{step}"),
            format!("[errors]\n'é' = []\n\"a b\" = ['Exception']\n{step}"),
            format!("[params]\nx = {{ }}\n'y' = ''\n{step}"),
            format!("{step}env = {{ \"\" = '', 'a.b' = 'x', A-B_9 = 'y' }}\n"),
            format!("name\t=\t'x'\t#\t\n\t\t{step}"),
            format!("{step}needs = [\n# only a comment\n]\n"),
            format!("{step}needs = ['a',# c\n'b'\n,\n]\n"),
        ] {
            assert!(differential(&src), "{src:?}");
        }
    }

    /// A flow in the fast path's subset, written with the variety a person or a generator might
    /// use: every key of the subset, each value in every form the subset accepts.
    fn subset_flow(rng: &mut fastrand::Rng) -> String {
        let nl = if rng.u8(..8) == 0 { "\r\n" } else { "\n" };
        let mut out = String::new();
        let line = |rng: &mut fastrand::Rng, out: &mut String, text: &str| {
            if rng.u8(..6) == 0 {
                out.push_str(["  ", "\t", " "][rng.usize(..3)]);
            }
            out.push_str(text);
            match rng.u8(..8) {
                0 => out.push_str(" # a comment"),
                1 => out.push_str(" \t"),
                2 => out.push_str("\t#é🎉 \"'[{"),
                _ => {}
            }
            out.push_str(nl);
            if rng.u8(..6) == 0 {
                out.push_str([nl, "# comment", "   "][rng.usize(..3)]);
                out.push_str(nl);
            }
        };
        let kv = |rng: &mut fastrand::Rng, key: &str, value: String| {
            let key = match rng.u8(..10) {
                0 => format!("\"{key}\""),
                1 => format!("'{key}'"),
                _ => key.to_owned(),
            };
            let eq = [" = ", "=", " =\t", "  =  "][rng.usize(..4)];
            format!("{key}{eq}{value}")
        };
        let keys = |rng: &mut fastrand::Rng, all: &[&'static str]| {
            let mut ks: Vec<&'static str> = all.iter().copied().filter(|_| rng.bool()).collect();
            rng.shuffle(&mut ks);
            ks
        };
        // The keys the fast path reads: the top level's other than its tables, a step's other
        // than those it leaves.
        let top: Vec<&'static str> = FLOW_KEYS
            .iter()
            .copied()
            .filter(|k| !super::TABLES.contains(k) && !matches!(*k, "policies" | "step"))
            .collect();
        let step: Vec<&'static str> =
            STEP_KEYS.iter().copied().filter(|k| !super::STEP_KEYS_LEFT.contains(k)).collect();
        for key in keys(rng, &top) {
            let v = value(rng, key, nl);
            let text = kv(rng, key, v);
            line(rng, &mut out, &text);
        }
        let mut tables = 0u32;
        for p in 0..rng.usize(0..7) {
            match rng.u8(..10) {
                t @ 2..=5 if tables & (1 << t) == 0 => {
                    tables |= 1 << t;
                    line(rng, &mut out, ["[params]", "[hooks]", "[errors]", "[exit_codes]"][usize::from(t - 2)]);
                    for i in 0..rng.usize(0..4) {
                        let (key, v) = match t {
                            2 => (
                                ["date", "\"my-date\"", "'Zone'"][i % 3],
                                if rng.bool() { string(rng, nl) } else { "{}".into() },
                            ),
                            3 => (HOOK_KEYS[i % 3], value(rng, "compensate", nl)),
                            4 => (["Busy", "\"Net.Err\"", "'x'"][i % 3], strings(rng, nl)),
                            _ => (["3", "\"75\"", "segv"][i % 3], string(rng, nl)),
                        };
                        let text = format!("{key} = {v}");
                        line(rng, &mut out, &text);
                    }
                }
                0 if tables & 1 == 0 => {
                    tables |= 1;
                    line(rng, &mut out, "[defaults]");
                    for key in keys(rng, &DEFAULTS_KEYS) {
                        let v = value(rng, key, nl);
                        let text = kv(rng, key, v);
                        line(rng, &mut out, &text);
                    }
                }
                1 => {
                    let header = format!("[policies.p{p}-{}]", ["x", "_", "N", "9"][rng.usize(..4)]);
                    line(rng, &mut out, &header);
                    for key in keys(rng, &POLICY_KEYS) {
                        let v = value(rng, key, nl);
                        let text = kv(rng, key, v);
                        line(rng, &mut out, &text);
                    }
                }
                _ => {
                    line(rng, &mut out, "[[step]]");
                    for key in keys(rng, &step) {
                        let v = value(rng, key, nl);
                        let text = kv(rng, key, v);
                        line(rng, &mut out, &text);
                    }
                }
            }
        }
        if rng.u8(..4) == 0 {
            out.truncate(out.trim_end().len());
        }
        out
    }

    /// Text for a string: letters, spaces, unicode, quotes, backslashes, tabs, shell variables.
    fn text(rng: &mut fastrand::Rng) -> String {
        const PIECES: [&str; 16] =
            ["a", "Z", "0", " ", "é", "🎉", "\t", "\"", "'", "\\", "$HOME", "${X}", "\u{85}", "\u{a0}", "-", "."];
        (0..rng.usize(0..8)).map(|_| PIECES[rng.usize(..PIECES.len())]).collect()
    }

    /// A TOML string holding (about) `text(rng)`, in one of the forms of the subset.
    fn string(rng: &mut fastrand::Rng, nl: &str) -> String {
        let t = text(rng);
        match rng.u8(..4) {
            0 if !t.contains('\'') => format!("'{t}'"),
            1 if !t.contains("'") => {
                let first = if rng.bool() { "\n" } else { "" };
                let body = t.replace(' ', "\n");
                let _ = nl; // a line end inside a multi-line string is LF only in the subset
                format!("'''{first}{body}'''")
            }
            _ => {
                let mut s = String::from("\"");
                for c in t.chars() {
                    match c {
                        '"' => s.push_str("\\\""),
                        '\\' => s.push_str("\\\\"),
                        '\t' if rng.bool() => s.push_str("\\t"),
                        'é' if rng.bool() => s.push_str("\\u00E9"),
                        '🎉' if rng.bool() => s.push_str("\\U0001F389"),
                        c => s.push(c),
                    }
                }
                if rng.u8(..6) == 0 {
                    s.push_str(["\\n", "\\r", "\\b", "\\f", "\\u0000"][rng.usize(..5)]);
                }
                s.push('"');
                s
            }
        }
    }

    fn strings(rng: &mut fastrand::Rng, nl: &str) -> String {
        let items: Vec<String> = (0..rng.usize(0..4)).map(|_| string(rng, nl)).collect();
        match rng.u8(..3) {
            0 if !items.is_empty() => {
                let sep = format!(",{nl}  ");
                let comment = if rng.bool() { " # items" } else { "" };
                format!("[{comment}{nl}  {}{},{nl}]", items.join(&sep), if rng.bool() { "" } else { " # last" })
            }
            1 => format!("[ {} ]", items.join(" , ")),
            _ => format!("[{}]", items.join(", ")),
        }
    }

    fn integer(rng: &mut fastrand::Rng) -> String {
        match rng.u8(..6) {
            0 => "0".into(),
            1 => "-0".into(),
            2 => i64::MAX.to_string(),
            3 => i64::MIN.to_string(),
            _ => rng.i64(-5..100_000).to_string(),
        }
    }

    fn number(rng: &mut fastrand::Rng) -> String {
        const FLOATS: [&str; 9] = ["0.5", "1.25", "-0.0", "1e3", "2.5E-3", "1e+2", "100.0", "3.0e0", "0.001"];
        if rng.bool() { FLOATS[rng.usize(..FLOATS.len())].into() } else { integer(rng) }
    }

    fn inline(rng: &mut fastrand::Rng, entries: Vec<String>) -> String {
        if entries.is_empty() {
            return ["{}", "{ }"][rng.usize(..2)].into();
        }
        if rng.bool() { format!("{{ {} }}", entries.join(", ")) } else { format!("{{{}}}", entries.join(",")) }
    }

    /// A value of the type `key` takes, in the subset.
    fn value(rng: &mut fastrand::Rng, key: &str, nl: &str) -> String {
        match key {
            "name" | "env_file" | "shell" | "workdir" | "kill_signal" | "detect_errors" => string(rng, nl),
            "resume_within" | "timeout" | "kill_grace" => match rng.u8(..3) {
                0 => string(rng, nl),
                1 => ["\"90s\"", "'2m 30s'", "\"1h\""][rng.usize(..3)].into(),
                _ => number(rng),
            },
            "max_parallel" | "attempts" => integer(rng),
            "fail_fast" | "jitter" => ["true", "false"][rng.usize(..2)].into(),
            "secret_env" | "needs" | "run" | "exception_types" => strings(rng, nl),
            "backoff_seconds" | "backoff_multiplier" | "backoff_max_seconds" => number(rng),
            "compensate" => {
                if rng.bool() {
                    string(rng, nl)
                } else {
                    strings(rng, nl)
                }
            }
            "env" => {
                let n = rng.usize(0..4);
                let entries = (0..n)
                    .map(|i| {
                        let k = [format!("K{i}"), format!("\"k {i}\""), format!("'k.{i}'")][rng.usize(..3)].clone();
                        format!("{k} = {}", string(rng, nl))
                    })
                    .collect();
                inline(rng, entries)
            }
            _ => {
                // retry: a name or a policy
                if rng.bool() {
                    return string(rng, nl);
                }
                let keys: Vec<&str> = POLICY_KEYS.iter().copied().filter(|_| rng.bool()).collect();
                let entries = keys
                    .into_iter()
                    .map(|k| {
                        let v = value(rng, k, nl);
                        format!("{k} = {v}")
                    })
                    .collect();
                inline(rng, entries)
            }
        }
    }

    /// Small changes that take a flow out of the subset, or out of TOML, or keep it in.
    const NEAR_MISSES: [&str; 44] = [
        "\n",
        "\r\n",
        "\r",
        " ",
        "\t",
        "#",
        "=",
        "\"",
        "'",
        "''",
        "'''",
        "\"\"\"",
        "\\",
        "\\e",
        "\\x41",
        "\\u00",
        "\\uD800",
        "[",
        "]",
        "[[step]]\n",
        "[step]\n",
        "[ [step] ]\n",
        "[defaults]\n",
        "[policies.a]\n",
        "[policies.\"q\"]\n",
        "[[step.catch]]\n",
        "[step.retry]\n",
        "[params]\n",
        "{",
        "}",
        ",",
        ".",
        "name = 'x'\n",
        "run = ['x']\n",
        "retry = { attempts = 2 }\n",
        "a.b = 1\n",
        "1_0",
        "0x1",
        "+1",
        "é",
        "\u{7f}",
        "\u{0}",
        "\u{feff}",
        "nan",
    ];

    fn near_miss(rng: &mut fastrand::Rng, src: &str) -> String {
        let mut s = src.to_owned();
        for _ in 0..rng.usize(1..4) {
            let boundaries: Vec<usize> = (0..=s.len()).filter(|&i| s.is_char_boundary(i)).collect();
            let at = boundaries[rng.usize(..boundaries.len())];
            match rng.u8(..4) {
                0 => {
                    // Remove a few characters.
                    let end = boundaries.iter().copied().find(|&e| e >= at + rng.usize(1..4)).unwrap_or(s.len());
                    s.replace_range(at..end, "");
                }
                1 => {
                    // Repeat a line (a duplicate key or table).
                    let lines: Vec<&str> = s.split_inclusive('\n').collect();
                    if !lines.is_empty() {
                        let i = rng.usize(..lines.len());
                        let mut v: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
                        v.insert(rng.usize(i..=lines.len()), lines[i].to_owned());
                        s = v.concat();
                    }
                }
                _ => s.insert_str(at, NEAR_MISSES[rng.usize(..NEAR_MISSES.len())]),
            }
        }
        s
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(3_000))]

        #[test]
        fn generated_flows_of_the_subset_are_read_by_the_fast_path_as_by_the_full_reader(seed in any::<u64>()) {
            let src = subset_flow(&mut fastrand::Rng::with_seed(seed));
            prop_assert!(differential(&src), "the fast path gave up on {:?}", src);
        }

        #[test]
        fn near_misses_are_read_the_same_or_left_to_the_full_reader(seed in any::<u64>()) {
            let mut rng = fastrand::Rng::with_seed(seed);
            let flow = subset_flow(&mut rng);
            let src = near_miss(&mut rng, &flow);
            differential(&src);
        }
    }
}
