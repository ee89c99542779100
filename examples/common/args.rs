//! The report examples' `--policy NAME|FILE` and `--cost-model FILE` arguments.

#![allow(dead_code)] // each example uses the arguments it takes

use adaptalloc::device::CostModel;
use adaptalloc::policy::Policy;

/// The word after `flag`, or None without the flag; an error saying `needs` when nothing follows.
fn value_of(flag: &str, needs: &str) -> anyhow::Result<Option<String>> {
    let mut args = std::env::args().skip_while(|a| a != flag);
    if args.next().is_none() {
        return Ok(None);
    }
    args.next()
        .map(Some)
        .ok_or_else(|| anyhow::anyhow!("{flag} needs {needs}"))
}

/// The name after `--policy` and the policy it loads (a preset or a file), or None without the
/// flag. An error names what is wrong: the name missing, or the file, line and key at fault.
pub fn policy_arg() -> anyhow::Result<Option<(String, Policy)>> {
    let Some(name) = value_of("--policy", "a preset name or a policy file")? else {
        return Ok(None);
    };
    let policy = Policy::load(&name)?;
    Ok(Some((name, policy)))
}

/// The cost model after `--cost-model`, named by its file's stem (`nvidia-h200`), or None
/// without the flag. An error names the file and what is wrong in it.
pub fn cost_model_arg() -> anyhow::Result<Option<(String, CostModel)>> {
    let Some(file) = value_of("--cost-model", "a cost model file (tuning/cost-models/*.toml)")? else {
        return Ok(None);
    };
    let path = std::path::Path::new(&file);
    let name = path
        .file_stem()
        .map_or(file.clone(), |s| s.to_string_lossy().into_owned());
    Ok(Some((name, CostModel::from_file(path)?)))
}
