//! The RMM log reader on arbitrary bytes (after a valid header half the time).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = adaptalloc_cli::trace::parse_rmm(data, "fuzz.log", false);
    let mut with_header = b"Thread,Time,Action,Pointer,Size,Stream\n".to_vec();
    with_header.extend_from_slice(data);
    let _ = adaptalloc_cli::trace::parse_rmm(&with_header, "fuzz.log", true);
});
