//! `adaptalloc replay --profile FILE`: what ADAPTALLOC_PROFILE does for a live run, on a
//! recorded workload. The first run writes the peak it showed; the second is given it and pays
//! a fraction of the driver time; a broken profile is one clear error.

mod bin_support;

use bin_support::{fails, ok, tmp, write};

/// The modelled driver time on replay's first line, ms.
fn driver_ms(text: &str) -> f64 {
    text.split("modelled driver time ")
        .nth(1)
        .and_then(|t| t.split(" ms").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no driver time in {text}"))
}

#[test]
fn a_second_replay_with_the_profile_is_given_the_peak_and_pays_less() {
    let trace = tmp("profiled.csv");
    // Small random sizes on a device 1.5x their peak live: while the peak is unknown, the
    // strand guard gives many requests exact-size blocks (a driver call each).
    ok(&["synth", "small-churn", "--out", trace.to_str().unwrap()]);
    let prof = tmp("job.toml");
    let _ = std::fs::remove_file(&prof);
    // A replay with the profile on a device of `capacity` ("--capacity-factor 1.5", ...).
    let replay = |capacity: [&str; 2]| {
        ok(&[
            "replay",
            trace.to_str().unwrap(),
            capacity[0],
            capacity[1],
            "--profile",
            prof.to_str().unwrap(),
        ])
    };
    // What replay says about the profile: its lines before the report.
    let said = |text: &str| -> String {
        text.lines()
            .filter(|l| l.starts_with("Profile "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let first = replay(["--capacity-factor", "1.5"]);
    assert!(
        said(&first).ends_with("over 1 runs.") && !said(&first).contains("given"),
        "{first}"
    );
    let second = replay(["--capacity-factor", "1.5"]);
    assert!(
        said(&second).contains("given from the first request") && said(&second).ends_with("over 2 runs."),
        "{second}"
    );
    assert!(
        driver_ms(&second) * 5.0 < driver_ms(&first),
        "{} ms against {} ms",
        driver_ms(&second),
        driver_ms(&first)
    );
    let file = std::fs::read_to_string(&prof).unwrap();
    assert!(
        file.starts_with("# adaptalloc workload profile") && file.contains("runs = 2"),
        "{file}"
    );
    // On a device of another size it is not used, and replaced by one for that device.
    let other = replay(["--capacity", "1GiB"]);
    assert!(
        said(&other).contains("another size; not used") && said(&other).ends_with("over 1 runs."),
        "{other}"
    );
}

#[test]
fn a_broken_profile_or_one_without_a_policy_engine_is_refused() {
    let trace = tmp("refused.csv");
    // Small random sizes on a device 1.5x their peak live: while the peak is unknown, the
    // strand guard gives many requests exact-size blocks (a driver call each).
    ok(&["synth", "small-churn", "--out", trace.to_str().unwrap()]);
    let bad = write(
        "bad-profile.toml",
        b"version = 1\ndevice_total_bytes = 10\npeak_footprint_bytes = 5\npeak_reserved_bytes = 5\n\
          ran_short = false\nlearned_release_per_mop = 0\ngive_peak = true\nruns = 1\nspeed = 2\n",
    );
    let err = fails(&["replay", trace.to_str().unwrap(), "--profile", &bad]);
    assert!(err.contains("bad-profile.toml") && err.contains("speed"), "{err}");
    let err = fails(&[
        "replay",
        trace.to_str().unwrap(),
        "--strategy",
        "passthrough",
        "--profile",
        &bad,
    ]);
    assert!(err.contains("--profile") && err.contains("--strategy"), "{err}");
}
