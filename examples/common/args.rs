//! The report examples' `--policy NAME|FILE` argument.

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
