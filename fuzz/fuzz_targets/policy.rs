//! The policy parser on arbitrary text: a policy or an error naming file, line and key.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = adaptalloc::policy::Policy::from_toml_str(text, "fuzz.toml");
    }
});
