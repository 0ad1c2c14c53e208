//! The error class hierarchy: Python 3's built-in exceptions, waymark's runtime errors, and the
//! flow's own `[errors]`. Matching is by name along the method resolution order (MRO), the way a
//! Python `except` clause matches.

use std::collections::{BTreeMap, HashMap, HashSet};

/// Waymark's runtime error: an attempt's deadline passed.
pub(crate) const ACTION_TIMEOUT: &str = "ActionTimeout";
/// Waymark's runtime error: the child died of a signal waymark did not send.
pub(crate) const ACTION_EXECUTION_LOST: &str = "ActionExecutionLost";
/// Waymark's runtime error: the child provably never started.
pub(crate) const ACTION_EXECUTION_NOT_STARTED: &str = "ActionExecutionNotStarted";
/// Waymark's runtime error: the flow's `timeout` (the workflow deadline) passed. It ends the run:
/// no retry policy retries it and no catch handler catches it.
pub(crate) const WORKFLOW_TIMEOUT: &str = "WorkflowTimeout";
/// A non-zero exit with no mapping.
pub(crate) const CALLED_PROCESS_ERROR: &str = "CalledProcessError";

/// `(class, bases)` of every built-in class, parents listed before children.
const BUILTIN: &[(&str, &[&str])] = &[
    ("BaseException", &[]),
    ("BaseExceptionGroup", &["BaseException"]),
    ("GeneratorExit", &["BaseException"]),
    ("KeyboardInterrupt", &["BaseException"]),
    ("SystemExit", &["BaseException"]),
    ("Exception", &["BaseException"]),
    ("ArithmeticError", &["Exception"]),
    ("FloatingPointError", &["ArithmeticError"]),
    ("OverflowError", &["ArithmeticError"]),
    ("ZeroDivisionError", &["ArithmeticError"]),
    ("AssertionError", &["Exception"]),
    ("AttributeError", &["Exception"]),
    ("BufferError", &["Exception"]),
    ("EOFError", &["Exception"]),
    ("ExceptionGroup", &["BaseExceptionGroup", "Exception"]),
    ("ImportError", &["Exception"]),
    ("ModuleNotFoundError", &["ImportError"]),
    ("LookupError", &["Exception"]),
    ("IndexError", &["LookupError"]),
    ("KeyError", &["LookupError"]),
    ("MemoryError", &["Exception"]),
    ("NameError", &["Exception"]),
    ("UnboundLocalError", &["NameError"]),
    ("OSError", &["Exception"]),
    ("BlockingIOError", &["OSError"]),
    ("ChildProcessError", &["OSError"]),
    ("ConnectionError", &["OSError"]),
    ("BrokenPipeError", &["ConnectionError"]),
    ("ConnectionAbortedError", &["ConnectionError"]),
    ("ConnectionRefusedError", &["ConnectionError"]),
    ("ConnectionResetError", &["ConnectionError"]),
    ("FileExistsError", &["OSError"]),
    ("FileNotFoundError", &["OSError"]),
    ("InterruptedError", &["OSError"]),
    ("IsADirectoryError", &["OSError"]),
    ("NotADirectoryError", &["OSError"]),
    ("PermissionError", &["OSError"]),
    ("ProcessLookupError", &["OSError"]),
    ("TimeoutError", &["OSError"]),
    ("ReferenceError", &["Exception"]),
    ("RuntimeError", &["Exception"]),
    ("NotImplementedError", &["RuntimeError"]),
    ("PythonFinalizationError", &["RuntimeError"]),
    ("RecursionError", &["RuntimeError"]),
    ("StopAsyncIteration", &["Exception"]),
    ("StopIteration", &["Exception"]),
    ("SyntaxError", &["Exception"]),
    ("IndentationError", &["SyntaxError"]),
    ("TabError", &["IndentationError"]),
    ("SystemError", &["Exception"]),
    ("TypeError", &["Exception"]),
    ("ValueError", &["Exception"]),
    ("UnicodeError", &["ValueError"]),
    ("UnicodeDecodeError", &["UnicodeError"]),
    ("UnicodeEncodeError", &["UnicodeError"]),
    ("UnicodeTranslateError", &["UnicodeError"]),
    ("Warning", &["Exception"]),
    ("BytesWarning", &["Warning"]),
    ("DeprecationWarning", &["Warning"]),
    ("EncodingWarning", &["Warning"]),
    ("FutureWarning", &["Warning"]),
    ("ImportWarning", &["Warning"]),
    ("PendingDeprecationWarning", &["Warning"]),
    ("ResourceWarning", &["Warning"]),
    ("RuntimeWarning", &["Warning"]),
    ("SyntaxWarning", &["Warning"]),
    ("UnicodeWarning", &["Warning"]),
    ("UserWarning", &["Warning"]),
    // waymark's own classes
    (ACTION_TIMEOUT, &["BaseException"]),
    (ACTION_EXECUTION_LOST, &["BaseException"]),
    (ACTION_EXECUTION_NOT_STARTED, &["Exception"]),
    (WORKFLOW_TIMEOUT, &["BaseException"]),
    ("SubprocessError", &["Exception"]),
    (CALLED_PROCESS_ERROR, &["SubprocessError"]),
];

/// Classes of Python's standard library that scripts often die of, by the name a traceback prints
/// for them (`module.QualName`), with their bases (their `__mro__` without themselves, as Python
/// 3.11 has them, nearest first). A class a traceback names that is neither built in nor in the
/// flow's `[errors]` takes its bases from here (`tests::the_standard_library_s_classes_are_python_s`
/// checks them against the python3 on the PATH).
const STDLIB: &[(&str, &[&str])] = &[
    ("urllib.error.URLError", &["OSError", "Exception", "BaseException"]),
    ("urllib.error.HTTPError", &["URLError", "OSError", "Exception", "BaseException"]),
    ("urllib.error.ContentTooShortError", &["URLError", "OSError", "Exception", "BaseException"]),
    ("socket.gaierror", &["OSError", "Exception", "BaseException"]),
    ("socket.herror", &["OSError", "Exception", "BaseException"]),
    ("ssl.SSLError", &["OSError", "Exception", "BaseException"]),
    ("ssl.SSLCertVerificationError", &["SSLError", "OSError", "ValueError", "Exception", "BaseException"]),
    ("ssl.SSLZeroReturnError", &["SSLError", "OSError", "Exception", "BaseException"]),
    ("ssl.SSLEOFError", &["SSLError", "OSError", "Exception", "BaseException"]),
    ("ssl.SSLWantReadError", &["SSLError", "OSError", "Exception", "BaseException"]),
    ("ssl.SSLSyscallError", &["SSLError", "OSError", "Exception", "BaseException"]),
    ("http.client.HTTPException", &["Exception", "BaseException"]),
    (
        "http.client.RemoteDisconnected",
        &[
            "ConnectionResetError",
            "ConnectionError",
            "OSError",
            "BadStatusLine",
            "HTTPException",
            "Exception",
            "BaseException",
        ],
    ),
    ("http.client.IncompleteRead", &["HTTPException", "Exception", "BaseException"]),
    ("http.client.BadStatusLine", &["HTTPException", "Exception", "BaseException"]),
    ("http.client.LineTooLong", &["HTTPException", "Exception", "BaseException"]),
    ("http.client.ResponseNotReady", &["ImproperConnectionState", "HTTPException", "Exception", "BaseException"]),
    ("json.decoder.JSONDecodeError", &["ValueError", "Exception", "BaseException"]),
    ("subprocess.TimeoutExpired", &["SubprocessError", "Exception", "BaseException"]),
    ("subprocess.CalledProcessError", &["SubprocessError", "Exception", "BaseException"]),
    ("asyncio.exceptions.CancelledError", &["BaseException"]),
    ("asyncio.exceptions.IncompleteReadError", &["EOFError", "Exception", "BaseException"]),
    ("asyncio.exceptions.InvalidStateError", &["Exception", "BaseException"]),
    ("asyncio.exceptions.LimitOverrunError", &["Exception", "BaseException"]),
    ("asyncio.exceptions.SendfileNotAvailableError", &["RuntimeError", "Exception", "BaseException"]),
    ("concurrent.futures._base.CancelledError", &["Error", "Exception", "BaseException"]),
    ("concurrent.futures._base.InvalidStateError", &["Error", "Exception", "BaseException"]),
    ("concurrent.futures.process.BrokenProcessPool", &["BrokenExecutor", "RuntimeError", "Exception", "BaseException"]),
    ("sqlite3.Error", &["Exception", "BaseException"]),
    ("sqlite3.DatabaseError", &["Error", "Exception", "BaseException"]),
    ("sqlite3.OperationalError", &["DatabaseError", "Error", "Exception", "BaseException"]),
    ("sqlite3.IntegrityError", &["DatabaseError", "Error", "Exception", "BaseException"]),
    ("sqlite3.ProgrammingError", &["DatabaseError", "Error", "Exception", "BaseException"]),
    ("sqlite3.InterfaceError", &["Error", "Exception", "BaseException"]),
    ("sqlite3.DataError", &["DatabaseError", "Error", "Exception", "BaseException"]),
    ("sqlite3.NotSupportedError", &["DatabaseError", "Error", "Exception", "BaseException"]),
    ("sqlite3.InternalError", &["DatabaseError", "Error", "Exception", "BaseException"]),
    ("zipfile.BadZipFile", &["Exception", "BaseException"]),
    ("zipfile.LargeZipFile", &["Exception", "BaseException"]),
    ("tarfile.TarError", &["Exception", "BaseException"]),
    ("tarfile.ReadError", &["TarError", "Exception", "BaseException"]),
    ("tarfile.CompressionError", &["TarError", "Exception", "BaseException"]),
    ("shutil.Error", &["OSError", "Exception", "BaseException"]),
    ("shutil.SameFileError", &["Error", "OSError", "Exception", "BaseException"]),
    ("shutil.ReadError", &["OSError", "Exception", "BaseException"]),
    ("smtplib.SMTPException", &["OSError", "Exception", "BaseException"]),
    ("smtplib.SMTPServerDisconnected", &["SMTPException", "OSError", "Exception", "BaseException"]),
    (
        "smtplib.SMTPAuthenticationError",
        &["SMTPResponseException", "SMTPException", "OSError", "Exception", "BaseException"],
    ),
    ("smtplib.SMTPResponseException", &["SMTPException", "OSError", "Exception", "BaseException"]),
    ("smtplib.SMTPRecipientsRefused", &["SMTPException", "OSError", "Exception", "BaseException"]),
    ("smtplib.SMTPSenderRefused", &["SMTPResponseException", "SMTPException", "OSError", "Exception", "BaseException"]),
    ("smtplib.SMTPDataError", &["SMTPResponseException", "SMTPException", "OSError", "Exception", "BaseException"]),
    ("smtplib.SMTPConnectError", &["SMTPResponseException", "SMTPException", "OSError", "Exception", "BaseException"]),
    ("ftplib.Error", &["Exception", "BaseException"]),
    ("ftplib.error_perm", &["Error", "Exception", "BaseException"]),
    ("ftplib.error_temp", &["Error", "Exception", "BaseException"]),
    ("ftplib.error_reply", &["Error", "Exception", "BaseException"]),
    ("ftplib.error_proto", &["Error", "Exception", "BaseException"]),
    ("_csv.Error", &["Exception", "BaseException"]),
    ("configparser.Error", &["Exception", "BaseException"]),
    ("configparser.NoSectionError", &["Error", "Exception", "BaseException"]),
    ("configparser.NoOptionError", &["Error", "Exception", "BaseException"]),
    ("configparser.ParsingError", &["Error", "Exception", "BaseException"]),
    ("configparser.MissingSectionHeaderError", &["ParsingError", "Error", "Exception", "BaseException"]),
    ("configparser.DuplicateSectionError", &["Error", "Exception", "BaseException"]),
    ("configparser.InterpolationError", &["Error", "Exception", "BaseException"]),
    ("tomllib.TOMLDecodeError", &["ValueError", "Exception", "BaseException"]),
    ("xml.etree.ElementTree.ParseError", &["SyntaxError", "Exception", "BaseException"]),
    ("xml.parsers.expat.ExpatError", &["Exception", "BaseException"]),
    ("binascii.Error", &["ValueError", "Exception", "BaseException"]),
    ("binascii.Incomplete", &["Exception", "BaseException"]),
    ("zlib.error", &["Exception", "BaseException"]),
    ("gzip.BadGzipFile", &["OSError", "Exception", "BaseException"]),
    ("_lzma.LZMAError", &["Exception", "BaseException"]),
    ("_pickle.PickleError", &["Exception", "BaseException"]),
    ("_pickle.PicklingError", &["PickleError", "Exception", "BaseException"]),
    ("_pickle.UnpicklingError", &["PickleError", "Exception", "BaseException"]),
    ("struct.error", &["Exception", "BaseException"]),
    ("_queue.Empty", &["Exception", "BaseException"]),
    ("queue.Full", &["Exception", "BaseException"]),
    ("re.error", &["Exception", "BaseException"]),
    ("decimal.InvalidOperation", &["DecimalException", "ArithmeticError", "Exception", "BaseException"]),
    (
        "decimal.DivisionByZero",
        &["DecimalException", "ZeroDivisionError", "ArithmeticError", "Exception", "BaseException"],
    ),
    ("decimal.DecimalException", &["ArithmeticError", "Exception", "BaseException"]),
    ("getopt.GetoptError", &["Exception", "BaseException"]),
    ("argparse.ArgumentError", &["Exception", "BaseException"]),
    ("argparse.ArgumentTypeError", &["Exception", "BaseException"]),
    ("email.errors.MessageError", &["Exception", "BaseException"]),
    ("email.errors.HeaderParseError", &["MessageParseError", "MessageError", "Exception", "BaseException"]),
    ("locale.Error", &["Exception", "BaseException"]),
];

/// The bases of the standard library's class that a traceback prints as `printed`
/// (`urllib.error.URLError`), if it is one of [`STDLIB`].
pub(crate) fn stdlib_bases(printed: &str) -> Option<Vec<String>> {
    STDLIB.iter().find(|(name, _)| *name == printed).map(|(_, bases)| bases.iter().map(|b| b.to_string()).collect())
}

/// The classes of [`STDLIB`] whose bare name is `bare` (`URLError`), by the names tracebacks print
/// (`urllib.error.URLError`): a traceback naming one gets its bases from there, so a policy listing
/// the bare name matches it, and what derives from it, as Python's `except` would; where several
/// modules have the name (`Error`), it matches all of them.
pub(crate) fn stdlib_named(bare: &str) -> Vec<&'static str> {
    STDLIB.iter().map(|(printed, _)| *printed).filter(|printed| printed.rsplit('.').next() == Some(bare)).collect()
}

/// The class Python 3 gives the name `alias` to: `IOError`, `EnvironmentError` and `WindowsError`
/// are `OSError` itself, so an `except IOError:` catches every `OSError`, and no traceback names
/// them.
pub(crate) fn alias_of(alias: &str) -> Option<&'static str> {
    matches!(alias, "IOError" | "EnvironmentError" | "WindowsError").then_some("OSError")
}

/// Whether `name` is one of the built-in classes.
pub(crate) fn is_builtin(name: &str) -> bool {
    BUILTIN.iter().any(|(n, _)| *n == name)
}

/// The hierarchy in force for one flow: the built-in classes plus the flow's `[errors]`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ClassTree {
    /// The flow's own classes and their direct bases, in declaration order.
    pub(crate) user: Vec<(String, Vec<String>)>,
    /// The bases of the known classes asked for so far.
    #[serde(skip)]
    memo: Memo,
}

/// [`ClassTree::bases`] remembered per known class (at most the built-ins and the flow's
/// classes): classifying each failed attempt asks for a few, and each answer linearized the
/// whole built-in hierarchy anew (a fifth of a failing attempt's instructions, by callgrind).
/// Not part of the tree's value: never compared, serialised or cloned.
#[derive(Default)]
struct Memo(std::sync::Mutex<HashMap<String, Vec<String>>>);

impl Clone for Memo {
    fn clone(&self) -> Memo {
        Memo::default()
    }
}

impl PartialEq for Memo {
    fn eq(&self, _: &Memo) -> bool {
        true
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

/// Most classes a flow's `[errors]` may declare: far more than any flow needs, and a bound on
/// the work and memory of checking the hierarchy.
pub(crate) const MAX_USER_CLASSES: usize = 10_000;
/// Longest method resolution order (a class and all its bases): bounds the work per class.
pub(crate) const MAX_MRO: usize = 1_000;

/// Why a set of user classes cannot form a hierarchy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClassError {
    #[error("class `{0}` inherits from itself through {1}")]
    Cycle(String, String),
    #[error("class `{0}` has bases in an order Python could not linearize (no consistent MRO)")]
    Inconsistent(String),
    #[error("[errors] declares more than {MAX_USER_CLASSES} classes; `{0}` is one too many")]
    TooMany(String),
    #[error("class `{0}` has a chain of more than {MAX_MRO} classes (itself and all its bases)")]
    TooDeep(String),
}

impl ClassTree {
    /// A tree with the given user classes; the caller has checked names and that bases exist.
    /// Every class is linearized once (memoised, without recursion), so checking costs the
    /// total length of the MROs, bounded by [`MAX_USER_CLASSES`] × [`MAX_MRO`].
    pub(crate) fn new(user: Vec<(String, Vec<String>)>) -> Result<ClassTree, ClassError> {
        if let Some((name, _)) = user.get(MAX_USER_CLASSES) {
            return Err(ClassError::TooMany(name.clone()));
        }
        let tree = ClassTree { user, memo: Memo::default() };
        let mut lin = Linearizer::new(&tree);
        for (name, _) in &tree.user {
            lin.mro(name)?;
        }
        Ok(tree)
    }

    fn direct_bases(&self, name: &str) -> Option<Vec<&str>> {
        if let Some((_, bases)) = self.user.iter().find(|(n, _)| n == name) {
            return Some(bases.iter().map(String::as_str).collect());
        }
        BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, b)| b.to_vec())
    }

    /// Whether `name` is a class this tree knows.
    pub(crate) fn knows(&self, name: &str) -> bool {
        self.direct_bases(name).is_some()
    }

    /// Every known class name: built-ins first, then the flow's.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        BUILTIN.iter().map(|(n, _)| *n).chain(self.user.iter().map(|(n, _)| n.as_str()))
    }

    /// Direct bases of a known class, for printing the tree.
    pub(crate) fn parents(&self, name: &str) -> Vec<String> {
        self.direct_bases(name).unwrap_or_default().into_iter().map(str::to_owned).collect()
    }

    /// The ordered bases of `name` (its MRO without itself), or `None` for an unknown class.
    pub(crate) fn bases(&self, name: &str) -> Option<Vec<String>> {
        let mut memo = self.memo.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(bases) = memo.get(name) {
            return Some(bases.clone());
        }
        let mut lin = Linearizer::new(self);
        let mro = lin.mro(name).ok()??.to_vec();
        let bases: Vec<String> = mro.iter().skip(1).map(|&id| lin.names[id as usize].to_owned()).collect();
        // Only known classes are kept: an unknown name (a child may report any) is not.
        memo.insert(name.to_owned(), bases.clone());
        Some(bases)
    }

    /// The ordered bases of a class a child reported with `listed` bases (nearest first, as an
    /// error file gives them). A list that ends with `BaseException` is the class's whole chain
    /// (the Python helper writes its `__mro__`), taken as it is: a library's class may have a
    /// built-in's name (urllib3's `TimeoutError` is no `OSError`). A list that does not is
    /// completed: each known name followed by its own bases, as Python's MRO would have them
    /// (`["ConnectionError"]` is `ConnectionError, OSError, Exception, BaseException`), a name the
    /// tree does not know kept where it is listed, with no bases of its own. Listed in an order no
    /// MRO can have (a class before its own base), they are kept as listed, each known one's
    /// missing bases after them.
    pub(crate) fn with_bases(&self, listed: &[String]) -> Vec<String> {
        // A whole chain: it ends with BaseException, and has Exception in it if one of its known
        // names derives from it (`["ConnectionError", "BaseException"]` was written by hand).
        let under_exception = |b: &String| self.bases(b).is_some_and(|up| up.iter().any(|u| u == "Exception"));
        if listed.last().is_some_and(|b| b == "BaseException")
            && (listed.iter().any(|b| b == "Exception") || !listed.iter().any(under_exception))
        {
            return listed.to_vec();
        }
        // The reported class, under a name no class can have.
        const REPORTED: &str = "";
        let unknown = listed.iter().filter(|b| !self.knows(b)).map(|b| (b.as_str(), Vec::new()));
        let reported = (REPORTED, listed.iter().map(String::as_str).collect());
        let mut lin = Linearizer::with(self, unknown.chain(std::iter::once(reported)));
        if let Ok(Some(mro)) = lin.mro(REPORTED).map(|mro| mro.map(<[u32]>::to_vec)) {
            return mro.iter().skip(1).map(|&id| lin.names[id as usize].to_owned()).collect();
        }
        let mut bases: Vec<String> = Vec::new();
        for name in listed.iter().cloned().chain(listed.iter().flat_map(|b| self.bases(b).unwrap_or_default())) {
            if !bases.contains(&name) {
                bases.push(name);
            }
        }
        bases
    }

    /// The known class names closest to `name`, for "did you mean" hints.
    pub(crate) fn suggest(&self, name: &str) -> Option<String> {
        crate::suggest::closest(name, self.names())
    }

    /// Children of each class, for printing the tree top-down.
    pub(crate) fn children(&self) -> BTreeMap<String, Vec<String>> {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for name in self.names() {
            for base in self.parents(name) {
                map.entry(base).or_default().push(name.to_owned());
            }
        }
        map
    }
}

/// C3 linearization, as Python computes `__mro__`, over interned class ids. Each class is
/// linearized once and remembered; the walk over bases uses an explicit stack, so a deep
/// hierarchy cannot overflow the call stack.
struct Linearizer<'t> {
    /// Id → name, and name → id with the class's direct bases.
    names: Vec<&'t str>,
    ids: HashMap<&'t str, u32>,
    direct: Vec<Vec<&'t str>>,
    done: HashMap<u32, Vec<u32>>,
}

impl<'t> Linearizer<'t> {
    fn new(tree: &'t ClassTree) -> Linearizer<'t> {
        Linearizer::with(tree, std::iter::empty())
    }

    /// The tree's classes, then `more` (each shadowing a class of the same name).
    fn with(tree: &'t ClassTree, more: impl Iterator<Item = (&'t str, Vec<&'t str>)>) -> Linearizer<'t> {
        let mut lin = Linearizer { names: Vec::new(), ids: HashMap::new(), direct: Vec::new(), done: HashMap::new() };
        let builtin = BUILTIN.iter().map(|(n, b)| (*n, b.to_vec()));
        let user = tree.user.iter().map(|(n, b)| (n.as_str(), b.iter().map(String::as_str).collect::<Vec<_>>()));
        // A user class shadows a built-in of the same name, as `direct_bases` does.
        for (name, bases) in builtin.chain(user).chain(more) {
            match lin.ids.get(name) {
                Some(&id) => lin.direct[id as usize] = bases,
                None => {
                    lin.ids.insert(name, lin.names.len() as u32);
                    lin.names.push(name);
                    lin.direct.push(bases);
                }
            }
        }
        lin
    }

    /// The MRO of `name` (itself first), `Ok(None)` for an unknown class.
    fn mro(&mut self, name: &str) -> Result<Option<&[u32]>, ClassError> {
        let Some(&root) = self.ids.get(name) else { return Ok(None) };
        // Depth-first over bases: (class, index of the next base to visit).
        let mut stack: Vec<(u32, usize)> = vec![(root, 0)];
        let mut on_stack: HashSet<u32> = HashSet::from([root]);
        while let Some(&(id, next)) = stack.last() {
            if self.done.contains_key(&id) {
                stack.pop();
                on_stack.remove(&id);
                continue;
            }
            if let Some(base) = self.direct[id as usize].get(next) {
                stack.last_mut().expect("not empty").1 += 1;
                let Some(&b) = self.ids.get(base) else { continue };
                if on_stack.contains(&b) {
                    let path: Vec<&str> = stack.iter().map(|(i, _)| self.names[*i as usize]).collect();
                    return Err(ClassError::Cycle(self.names[b as usize].to_owned(), path.join(" -> ")));
                }
                if !self.done.contains_key(&b) {
                    on_stack.insert(b);
                    stack.push((b, 0));
                }
            } else {
                let merged = self.merge(id)?;
                if merged.len() > MAX_MRO {
                    return Err(ClassError::TooDeep(self.names[id as usize].to_owned()));
                }
                self.done.insert(id, merged);
            }
        }
        Ok(self.done.get(&root).map(Vec::as_slice))
    }

    /// The C3 merge for `id`, whose known bases are all linearized: `id` followed by the merge
    /// of its bases' MROs and the list of its bases.
    fn merge(&self, id: u32) -> Result<Vec<u32>, ClassError> {
        let bases: Vec<u32> = self.direct[id as usize].iter().filter_map(|b| self.ids.get(b).copied()).collect();
        let mut seqs: Vec<&[u32]> = bases.iter().filter_map(|b| self.done.get(b).map(Vec::as_slice)).collect();
        if let [only] = seqs[..]
            && bases.len() == 1
        {
            // One base: its MRO, unchanged (the merge could not do otherwise).
            return Ok(std::iter::once(id).chain(only.iter().copied()).collect());
        }
        seqs.push(&bases);
        // How often each class occurs in the tails (all but the current head) of the sequences.
        let mut in_tails: HashMap<u32, usize> = HashMap::new();
        for seq in &seqs {
            for c in seq.iter().skip(1) {
                *in_tails.entry(*c).or_default() += 1;
            }
        }
        let mut heads = vec![0usize; seqs.len()];
        let mut out = vec![id];
        loop {
            let mut live = seqs.iter().zip(&heads).filter(|(s, h)| **h < s.len()).peekable();
            if live.peek().is_none() {
                return Ok(out);
            }
            let head = live
                .map(|(s, h)| s[*h])
                .find(|c| in_tails.get(c).is_none_or(|n| *n == 0))
                .ok_or_else(|| ClassError::Inconsistent(self.names[id as usize].to_owned()))?;
            for (seq, h) in seqs.iter().zip(heads.iter_mut()) {
                if *h < seq.len() && seq[*h] == head {
                    *h += 1;
                    if let Some(next) = seq.get(*h)
                        && let Some(n) = in_tails.get_mut(next)
                    {
                        *n -= 1;
                    }
                }
            }
            out.push(head);
            if out.len() > MAX_MRO {
                return Err(ClassError::TooDeep(self.names[id as usize].to_owned()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(user: &[(&str, &[&str])]) -> Result<ClassTree, ClassError> {
        ClassTree::new(user.iter().map(|(n, b)| (n.to_string(), b.iter().map(|s| s.to_string()).collect())).collect())
    }

    #[test]
    fn bases_are_remembered_for_known_classes_only_and_are_not_part_of_the_tree() {
        let t = tree(&[("Flaky", &["ConnectionError"])]).unwrap();
        let first = t.bases("Flaky").unwrap();
        assert_eq!(first, ["ConnectionError", "OSError", "Exception", "BaseException"]);
        assert_eq!(t.bases("Flaky").unwrap(), first, "the remembered answer is the same");
        for i in 0..100 {
            assert_eq!(t.bases(&format!("Unknown{i}")), None);
        }
        assert_eq!(t.memo.0.lock().unwrap().len(), 1, "a name a child made up is not kept");
        // Clones, comparisons and the serialised tree ignore what was remembered.
        assert_eq!(t.clone().memo.0.lock().unwrap().len(), 0);
        assert_eq!(t, tree(&[("Flaky", &["ConnectionError"])]).unwrap());
        assert_eq!(serde_json::to_value(&t).unwrap(), serde_json::json!({ "user": [["Flaky", ["ConnectionError"]]] }));
    }

    /// The table of the standard library's classes is what Python says of them: for each class
    /// the python3 on the PATH has, the name its tracebacks print and its bases.
    #[test]
    fn the_standard_library_s_classes_are_python_s() {
        let script = "import importlib, sys\n\
            for line in sys.stdin:\n\
            \x20   printed = line.strip(); mod, _, name = printed.rpartition('.')\n\
            \x20   try: c = getattr(importlib.import_module(mod), name)\n\
            \x20   except Exception: print(printed, '-'); continue\n\
            \x20   shown = c.__module__ + '.' + c.__qualname__\n\
            \x20   mro = [k.__name__ for k in c.__mro__[1:] if issubclass(k, BaseException)]\n\
            \x20   print(printed, shown, ','.join(mro))\n";
        let child = std::process::Command::new("python3")
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn();
        let Ok(mut child) = child else {
            assert!(std::env::var_os("CI").is_none(), "python3 is required under CI");
            eprintln!("SKIPPED the_standard_library_s_classes_are_python_s: no python3");
            return;
        };
        let names: String = STDLIB.iter().map(|(n, _)| format!("{n}\n")).collect();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), names.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let said = String::from_utf8(out.stdout).unwrap();
        let mut checked = 0;
        for ((printed, bases), line) in STDLIB.iter().zip(said.lines()) {
            let fields: Vec<&str> = line.split(' ').collect();
            assert_eq!(fields[0], *printed);
            if fields[1] == "-" {
                continue; // Not in this Python.
            }
            assert_eq!(fields[1], *printed, "the name a traceback prints");
            assert_eq!(fields[2], bases.join(","), "the bases of {printed}");
            checked += 1;
        }
        assert!(checked * 10 >= STDLIB.len() * 9, "only {checked} of {} checked:\n{said}", STDLIB.len());
    }

    /// A name of the standard library's classes is known by its bare name, whichever module has it.
    #[test]
    fn a_standard_library_class_is_known_by_its_bare_name() {
        for bare in ["URLError", "HTTPError", "SSLCertVerificationError", "RemoteDisconnected"] {
            assert_eq!(stdlib_named(bare).len(), 1, "{bare}");
        }
        assert_eq!(stdlib_named("HTTPError"), ["urllib.error.HTTPError"]);
        assert!(stdlib_named("Error").len() > 3, "sqlite3's, configparser's and others'");
        assert_eq!(stdlib_named("CancelledError").len(), 2, "asyncio's and concurrent.futures'");
        assert!(stdlib_named("urllib.error.URLError").is_empty(), "a bare name only");
        assert!(stdlib_named("FlakyDisk").is_empty());
    }

    /// Bases a child reports bring their own, in the order Python's MRO would give them.
    #[test]
    fn reported_bases_are_completed_as_python_would() {
        let t = tree(&[("Flaky", &["ConnectionError"])]).unwrap();
        let with = |listed: &[&str]| t.with_bases(&listed.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(with(&["ConnectionError"]), ["ConnectionError", "OSError", "Exception", "BaseException"]);
        // A whole chain, as the Python helper writes it, is kept as it is, even where a name is a
        // built-in's (urllib3's ReadTimeoutError: its TimeoutError is no OSError).
        let urllib3 = ["TimeoutError", "RequestError", "PoolError", "HTTPError", "Exception", "BaseException"];
        assert_eq!(with(&urllib3), urllib3);
        assert_eq!(with(&["ConnectionError", "OSError", "Exception", "BaseException"]), with(&["ConnectionError"]));
        // Two bases: the C3 order (what they share comes after both).
        assert_eq!(
            with(&["Flaky", "ValueError"]),
            ["Flaky", "ConnectionError", "OSError", "ValueError", "Exception", "BaseException"]
        );
        // A name the tree does not know stays where it was listed, with nothing of its own.
        assert_eq!(
            with(&["TimeoutException", "TransportError", "OSError"]),
            ["TimeoutException", "TransportError", "OSError", "Exception", "BaseException"]
        );
        assert_eq!(with(&["TimeoutException"]), ["TimeoutException"]);
        assert_eq!(with(&[]), Vec::<String>::new());
        // An order no MRO has (a class before its own base) is kept, completed after it.
        assert_eq!(with(&["Exception", "OSError"]), ["Exception", "OSError", "BaseException"]);
        assert_eq!(with(&["OSError", "OSError"]), ["OSError", "Exception", "BaseException"]);
        assert_eq!(with(&["BaseException"]), ["BaseException"]);
        // Ending with BaseException, but short of a known name's own bases: completed.
        assert_eq!(with(&["ConnectionError", "BaseException"]), with(&["ConnectionError"]));
        // A class outside Exception, its whole chain: as it is.
        assert_eq!(with(&["Interrupted", "BaseException"]), ["Interrupted", "BaseException"]);
    }

    #[test]
    fn builtin_bases_follow_python() {
        let t = ClassTree::default();
        assert_eq!(
            t.bases("ConnectionResetError").unwrap(),
            ["ConnectionError", "OSError", "Exception", "BaseException"]
        );
        assert_eq!(t.bases("ActionTimeout").unwrap(), ["BaseException"]);
        assert_eq!(t.bases(WORKFLOW_TIMEOUT).unwrap(), ["BaseException"]);
        assert!(!t.bases(WORKFLOW_TIMEOUT).unwrap().iter().any(|b| b == "Exception"), "outside `Exception`");
        assert_eq!(t.bases("ActionExecutionNotStarted").unwrap(), ["Exception", "BaseException"]);
        assert_eq!(t.bases("ExceptionGroup").unwrap(), ["BaseExceptionGroup", "Exception", "BaseException"]);
        assert_eq!(t.bases("Nope"), None);
    }

    #[test]
    fn user_classes_linearize_like_python() {
        // class A(OSError); class B(ValueError); class C(A, B)
        let t = tree(&[("A", &["OSError"]), ("B", &["ValueError"]), ("C", &["A", "B"])]).unwrap();
        assert_eq!(t.bases("C").unwrap(), ["A", "OSError", "B", "ValueError", "Exception", "BaseException"]);
    }

    #[test]
    fn cycles_and_bad_orders_are_rejected() {
        assert!(matches!(tree(&[("A", &["B"]), ("B", &["A"])]), Err(ClassError::Cycle(..))));
        assert!(matches!(tree(&[("A", &["Exception", "OSError"])]), Err(ClassError::Inconsistent(_))));
    }

    /// `Ai = [A(i-1), B(i-1)]`, `Bi` the same: the old recursive C3 took 4^i steps (20 s at 23
    /// levels); memoised it is quadratic in the number of levels.
    #[test]
    fn a_ladder_of_multiple_bases_linearizes_once_per_class() {
        let mut user =
            vec![("A0".to_owned(), vec!["Exception".to_owned()]), ("B0".to_owned(), vec!["Exception".to_owned()])];
        for i in 1..=60 {
            let bases = vec![format!("A{}", i - 1), format!("B{}", i - 1)];
            user.push((format!("A{i}"), bases.clone()));
            user.push((format!("B{i}"), bases));
        }
        let t = ClassTree::new(user).unwrap();
        let bases = t.bases("A60").unwrap();
        // A59, B59, A58, B58, ..., A0, B0, Exception, BaseException
        assert_eq!(bases.len(), 2 * 60 + 2);
        assert_eq!(&bases[..4], ["A59", "B59", "A58", "B58"]);
        assert_eq!(&bases[118..], ["A0", "B0", "Exception", "BaseException"]);
    }

    fn chain(n: usize) -> Vec<(String, Vec<String>)> {
        (0..n)
            .map(|i| (format!("C{i}"), vec![if i == 0 { "Exception".into() } else { format!("C{}", i - 1) }]))
            .collect()
    }

    #[test]
    fn long_chains_are_capped_not_overflowing_the_stack() {
        let t = ClassTree::new(chain(998)).unwrap();
        assert_eq!(t.bases("C997").unwrap().len(), 999);
        assert_eq!(ClassTree::new(chain(999)), Err(ClassError::TooDeep("C998".into())));
        assert_eq!(ClassTree::new(chain(100_000)), Err(ClassError::TooMany("C10000".into())));
        let mut cyclic = chain(5_000);
        cyclic[0].1 = vec!["C4999".into()];
        assert!(matches!(ClassTree::new(cyclic), Err(ClassError::Cycle(..))));
    }
}
