//! The error-file parser on arbitrary bytes: never a panic, and a reported class is a bare name.
#![no_main]

use libfuzzer_sys::fuzz_target;
use waymark::classify::error_file::{ErrorFileOutcome, parse_error_file};

fuzz_target!(|data: &[u8]| {
    if let ErrorFileOutcome::Reported(r) = parse_error_file(data, "error.json") {
        assert!(!r.class.is_empty() && !r.class.contains('.'), "not a bare class name: {r:?}");
    }
});
