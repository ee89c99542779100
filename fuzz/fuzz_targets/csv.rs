//! The CSV trace reader on arbitrary bytes: a trace or a typed error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = adaptalloc_cli::trace::parse_csv(data, "fuzz.csv", false);
    let _ = adaptalloc_cli::trace::parse_csv(data, "fuzz.csv", true);
});
