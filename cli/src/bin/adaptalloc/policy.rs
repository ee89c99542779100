//! `adaptalloc policy check FILE` and `adaptalloc policy show [PRESET]`.

use std::path::PathBuf;

use adaptalloc::policy::{PRESETS, Policy};

#[derive(clap::Subcommand)]
pub enum Command {
    /// Checks a policy file: every key known, every value valid.
    Check { file: PathBuf },
    /// Prints a preset with its documentation (default: the built-in default).
    Show { preset: Option<String> },
}

pub fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Check { file } => {
            let policy = Policy::from_file(&file)?;
            crate::common::emit(&format!("{}: ok ({})\n", file.display(), policy.description))?;
        }
        Command::Show { preset } => {
            let name = preset.as_deref().unwrap_or("default");
            let Some((_, text)) = PRESETS.iter().find(|(n, _)| *n == name) else {
                let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
                anyhow::bail!("no preset {name:?}; presets: {}", names.join(", "));
            };
            crate::common::emit(text)?;
        }
    }
    Ok(())
}
