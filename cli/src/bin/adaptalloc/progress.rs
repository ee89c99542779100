//! A spinner on stderr for work that may take more than a second; hidden when stderr is not a
//! terminal (pipes, CI), so output stays clean.

use std::io::IsTerminal;

/// Runs `work`, showing `label` with a spinner meanwhile when stderr is a terminal.
pub fn with_spinner<T>(label: &str, work: impl FnOnce() -> T) -> T {
    if !std::io::stderr().is_terminal() {
        return work();
    }
    let bar = indicatif::ProgressBar::new_spinner().with_message(label.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let out = work();
    bar.finish_and_clear();
    out
}
