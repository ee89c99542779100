//! The PyTorch snapshot reader on arbitrary bytes, raw and behind a pickle protocol header.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = adaptalloc_cli::trace::parse_snapshot(data, "fuzz.pickle");
    let mut pickle = vec![0x80, 0x04];
    pickle.extend_from_slice(data);
    let _ = adaptalloc_cli::trace::parse_snapshot(&pickle, "fuzz.pickle");
});
