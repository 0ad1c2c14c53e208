//! The flow loader on arbitrary bytes: it must never panic, and every diagnostic it gives must
//! have a line and column and be drawable.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use waymark::flow::{self, Diagnostic};

fn check(text: &str, diagnostics: &[Diagnostic]) {
    for d in diagnostics {
        assert!(d.location.is_some(), "diagnostic without a line and column: {d:?}");
        let _ = d.render("flow.toml", text, false);
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() as u64 > flow::MAX_FLOW_BYTES {
        return;
    }
    match flow::decode(data.to_vec()) {
        Err(bad) => check(&bad.0, &[bad.1]),
        Ok(source) => match flow::parse(&source, Path::new("/fuzz/flow.toml")) {
            Ok((_, warnings)) => check(&source, &warnings),
            Err(diagnostics) => {
                assert!(diagnostics.iter().any(Diagnostic::is_error), "refused without an error");
                check(&source, &diagnostics);
            }
        },
    }
});
