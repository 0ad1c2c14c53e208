//! The error class hierarchy: Python 3's built-in exceptions, waymark's runtime errors, and the
//! flow's own `[errors]`. Matching is by name along the method resolution order (MRO), the way a
//! Python `except` clause matches.

use std::collections::BTreeMap;

/// Waymark's runtime error: an attempt's deadline passed.
pub const ACTION_TIMEOUT: &str = "ActionTimeout";
/// Waymark's runtime error: the child died of a signal waymark did not send.
pub const ACTION_EXECUTION_LOST: &str = "ActionExecutionLost";
/// Waymark's runtime error: the child provably never started.
pub const ACTION_EXECUTION_NOT_STARTED: &str = "ActionExecutionNotStarted";
/// A non-zero exit with no mapping.
pub const CALLED_PROCESS_ERROR: &str = "CalledProcessError";

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
    ("SubprocessError", &["Exception"]),
    (CALLED_PROCESS_ERROR, &["SubprocessError"]),
];

/// Whether `name` is one of the built-in classes.
pub fn is_builtin(name: &str) -> bool {
    BUILTIN.iter().any(|(n, _)| *n == name)
}

/// The hierarchy in force for one flow: the built-in classes plus the flow's `[errors]`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClassTree {
    /// The flow's own classes and their direct bases, in declaration order.
    pub user: Vec<(String, Vec<String>)>,
}

/// Why a set of user classes cannot form a hierarchy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassError {
    #[error("class `{0}` inherits from itself through {1}")]
    Cycle(String, String),
    #[error("class `{0}` has bases in an order Python could not linearize (no consistent MRO)")]
    Inconsistent(String),
}

impl ClassTree {
    /// A tree with the given user classes; the caller has checked names and that bases exist.
    pub fn new(user: Vec<(String, Vec<String>)>) -> Result<ClassTree, ClassError> {
        let tree = ClassTree { user };
        for (name, _) in &tree.user {
            tree.linearize(name, &mut Vec::new())?;
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
    pub fn knows(&self, name: &str) -> bool {
        self.direct_bases(name).is_some()
    }

    /// Every known class name: built-ins first, then the flow's.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        BUILTIN.iter().map(|(n, _)| *n).chain(self.user.iter().map(|(n, _)| n.as_str()))
    }

    /// Direct bases of a known class, for printing the tree.
    pub fn parents(&self, name: &str) -> Vec<String> {
        self.direct_bases(name).unwrap_or_default().into_iter().map(str::to_owned).collect()
    }

    /// The ordered bases of `name` (its MRO without itself), or `None` for an unknown class.
    pub fn bases(&self, name: &str) -> Option<Vec<String>> {
        let mut mro = self.linearize(name, &mut Vec::new()).ok()??;
        mro.remove(0);
        Some(mro)
    }

    /// C3 linearization, as Python computes `__mro__`. `Ok(None)` for an unknown class.
    fn linearize(&self, name: &str, stack: &mut Vec<String>) -> Result<Option<Vec<String>>, ClassError> {
        if stack.iter().any(|s| s == name) {
            return Err(ClassError::Cycle(name.to_owned(), stack.join(" -> ")));
        }
        let Some(bases) = self.direct_bases(name) else {
            return Ok(None);
        };
        stack.push(name.to_owned());
        let mut seqs: Vec<Vec<String>> = Vec::new();
        for base in &bases {
            if let Some(mro) = self.linearize(base, stack)? {
                seqs.push(mro);
            }
        }
        stack.pop();
        seqs.push(bases.iter().map(|b| b.to_string()).collect());
        let mut out = vec![name.to_owned()];
        loop {
            seqs.retain(|s| !s.is_empty());
            if seqs.is_empty() {
                return Ok(Some(out));
            }
            let head = seqs
                .iter()
                .map(|s| &s[0])
                .find(|c| !seqs.iter().any(|s| s[1..].contains(c)))
                .cloned()
                .ok_or_else(|| ClassError::Inconsistent(name.to_owned()))?;
            for s in &mut seqs {
                if s[0] == head {
                    s.remove(0);
                }
            }
            out.push(head);
        }
    }

    /// The known class names closest to `name`, for "did you mean" hints.
    pub fn suggest(&self, name: &str) -> Option<String> {
        crate::suggest::closest(name, self.names())
    }

    /// Children of each class, for printing the tree top-down.
    pub fn children(&self) -> BTreeMap<String, Vec<String>> {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for name in self.names() {
            for base in self.parents(name) {
                map.entry(base).or_default().push(name.to_owned());
            }
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(user: &[(&str, &[&str])]) -> Result<ClassTree, ClassError> {
        ClassTree::new(user.iter().map(|(n, b)| (n.to_string(), b.iter().map(|s| s.to_string()).collect())).collect())
    }

    #[test]
    fn builtin_bases_follow_python() {
        let t = ClassTree::default();
        assert_eq!(
            t.bases("ConnectionResetError").unwrap(),
            ["ConnectionError", "OSError", "Exception", "BaseException"]
        );
        assert_eq!(t.bases("ActionTimeout").unwrap(), ["BaseException"]);
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
}
