//! The report examples' `--policy NAME|FILE` and `--cost-model FILE` arguments.

#![allow(dead_code)] // each example uses the arguments it takes

use adaptalloc::device::CostModel;
use adaptalloc::policy::Policy;

/// The name after `--policy` and the policy it loads (a preset or a file), or None without the
/// flag. An error names what is wrong: the name missing, or the file, line and key at fault.
pub fn policy_arg() -> anyhow::Result<Option<(String, Policy)>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == "--policy") else {
        return Ok(None);
    };
    let name = args
        .get(i + 1)
        .ok_or_else(|| anyhow::anyhow!("--policy needs a preset name or a policy file"))?;
    Ok(Some((name.clone(), Policy::load(name)?)))
}

/// The cost model after `--cost-model`, named by its file's stem (`nvidia-h200`), or None
/// without the flag. An error names the file and what is wrong in it.
pub fn cost_model_arg() -> anyhow::Result<Option<(String, CostModel)>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == "--cost-model") else {
        return Ok(None);
    };
    let file = args
        .get(i + 1)
        .ok_or_else(|| anyhow::anyhow!("--cost-model needs a cost model file (tuning/cost-models/*.toml)"))?;
    let path = std::path::Path::new(file);
    let name = path
        .file_stem()
        .map_or(file.clone(), |s| s.to_string_lossy().into_owned());
    Ok(Some((name, CostModel::from_file(path)?)))
}
