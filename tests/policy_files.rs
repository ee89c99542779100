//! Policy files: every preset loads, the documented default matches the built-in one, broken
//! files get errors naming the file, line and key, and the environment variables work.

use std::sync::Arc;

use adaptalloc::policy::{PRESETS, Policy, RoutingMode};
use adaptalloc::size::GIB;
use adaptalloc::{Allocator, Device, SimDevice};

#[test]
fn every_preset_loads_from_its_file() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().trim_end_matches(".toml").to_string())
        .collect();
    on_disk.sort();
    let mut bundled: Vec<String> = PRESETS.iter().map(|(n, _)| n.to_string()).collect();
    bundled.sort();
    assert_eq!(
        on_disk, bundled,
        "every file in policies/ is a preset, and every preset has a file"
    );
    for (name, _) in PRESETS {
        let from_file = Policy::from_file(&dir.join(format!("{name}.toml"))).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Some(from_file.clone()), Policy::preset(name));
        // A policy survives a round trip through its own TOML.
        assert_eq!(
            Policy::from_toml_str(&from_file.to_toml(), "round-trip").unwrap(),
            from_file,
            "{name}"
        );
        // And an allocator starts on it.
        let alloc = Allocator::with_policy(Arc::new(SimDevice::new(GIB)) as Arc<dyn Device>, from_file);
        drop(alloc.allocate(1 << 20, 0).unwrap());
    }
}

#[test]
fn documented_default_is_the_built_in_default() {
    assert_eq!(Policy::preset("default").unwrap(), Policy::default());
    assert_eq!(
        Policy::preset("passthrough").unwrap().routing.mode,
        RoutingMode::Passthrough
    );
}

#[test]
fn broken_policy_files_name_file_line_and_key() {
    let cases = [
        ("[routing]\nmode = \"adaptive\"\nflavour = 3\n", "p.toml:3", "flavour"),
        ("[bounds]\nheadroom = \"12 parsecs\"\n", "p.toml:2", "unknown unit"),
        ("[suballoc]\nmin_slab = -5\n", "p.toml:2", "negative"),
        ("[routing]\nmode = \"turbo\"\n", "p.toml:2", "turbo"),
        ("[bogus]\n", "p.toml:1", "bogus"),
        ("[bounds]\nheadroom = \"150%\"\n", "p.toml:2", "percentage"),
        ("[suballoc]\ngrowth = 99.0\n", "suballoc.growth", "0..16"),
        ("[suballoc]\nloose_growth = nan\n", "suballoc.loose_growth", "0..16"),
        ("[suballoc]\nloose_growth = -1.0\n", "suballoc.loose_growth", "0..16"),
        ("[bounds]\nspare_share = 1.5\n", "bounds.spare_share", "0..1"),
        // A retired key: where it stands, and what became of it.
        (
            "[bounds]\npressure_max_idle = 0\n",
            "p.toml:2",
            "retired: under the low watermark",
        ),
        (
            "[bounds]\nheadroom = \"5%\"\nmax_idle = \"25%\"\n",
            "p.toml:3",
            "raise `bounds.spare_share`",
        ),
        ("[bounds]\nspare_share = \"half\"\n", "p.toml:2", "spare_share"),
        (
            "[suballoc]\nmin_slab = \"2GiB\"\nmax_slab = \"1GiB\"\n",
            "suballoc.min_slab",
            "min_slab <= max_slab",
        ),
        ("[routing\n", "p.toml:1", ""),
        (
            "[bounds]\nexpected_peak = 0\n",
            "bounds.expected_peak",
            "leave the key out",
        ),
        ("[bounds]\nexpected_peak = \"lots\"\n", "p.toml:2", "expected_peak"),
    ];
    for (text, where_, what) in cases {
        let err = Policy::from_toml_str(text, "p.toml").unwrap_err().to_string();
        assert!(err.contains(where_) && err.contains(what), "for {text:?}: {err}");
    }
    // Bounds that leave nothing of the device, and a given peak it cannot hold, are refused
    // once the device is known (16 GiB), each error naming the file, key, value and device;
    // a device that holds them takes them.
    for (key, value, fits) in [
        ("headroom", "100GiB", 200u64 << 30),
        ("expected_peak", "20GiB", 20 << 30),
    ] {
        let p = Policy::from_toml_str(&format!("[bounds]\n{key} = \"{value}\"\n"), "p.toml").unwrap();
        let err = p.check_fits("p.toml", 16 << 30).unwrap_err().to_string();
        assert!(
            err.contains("p.toml")
                && err.contains(&format!("bounds.{key}"))
                && err.contains(value)
                && err.contains("16GiB"),
            "{err}"
        );
        p.check_fits("p.toml", fits).unwrap();
    }
    Policy::default().check_fits("default", 1 << 30).unwrap();
    let typo = Policy::load("trainig").unwrap_err().to_string();
    assert!(
        typo.contains("trainig") && typo.contains("presets: default, training"),
        "{typo}"
    );
    assert!(Policy::load("training").is_ok());
    let missing = Policy::from_file(std::path::Path::new("no/such/policy.toml"))
        .unwrap_err()
        .to_string();
    assert!(missing.contains("no/such/policy.toml"), "{missing}");
}

/// Environment variables are process-wide: one test sets and reads them all.
#[test]
fn environment_selects_policy_and_report() {
    let dir = std::env::temp_dir().join(format!("adaptalloc-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dev = || Arc::new(SimDevice::new(4 * GIB)) as Arc<dyn Device>;
    // SAFETY (of the test's intent): no other test in this binary reads these variables.
    let set = |k: &str, v: &str| unsafe { std::env::set_var(k, v) };
    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "[bounds]\nheadroom = true\n").unwrap();
    set("ADAPTALLOC_POLICY", broken.to_str().unwrap());
    let err = Allocator::from_env(dev()).unwrap_err().to_string();
    assert!(err.contains("broken.toml:2") && err.contains("headroom"), "{err}");

    set("ADAPTALLOC_POLICY", "multi-tenant");
    let report_path = dir.join("report.json");
    set("ADAPTALLOC_REPORT", report_path.to_str().unwrap());
    let alloc = Allocator::from_env(dev()).unwrap();
    for i in 0..2000u64 {
        let a = alloc.allocate((i % 7 + 1) << 20, 0).unwrap();
        drop(a);
    }
    assert!(alloc.report().unwrap().policy.contains("shared GPU"));
    drop(alloc);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    assert_eq!(json["requests"], 2000);
    assert!(json["recommended_policy"]["routing"]["mode"].is_string());
    unsafe {
        std::env::remove_var("ADAPTALLOC_POLICY");
        std::env::remove_var("ADAPTALLOC_REPORT");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A size that no unit names exactly (a peak the tuning report measured) is written as bytes,
/// so a policy reads back the same; one a unit names is written with it.
#[test]
fn sizes_survive_a_round_trip_exactly() {
    let mut p = Policy::default();
    for bytes in [17 * GIB + 880_803_840, 17 * GIB + 1, 1536 << 20, 18 * GIB] {
        p.bounds.expected_peak = Some(adaptalloc::size::ByteSize(bytes));
        let text = p.to_toml();
        assert_eq!(Policy::from_toml_str(&text, "round-trip").unwrap(), p, "{text}");
    }
    assert!(p.to_toml().contains("expected_peak = \"18GiB\""));
    p.bounds.expected_peak = Some(adaptalloc::size::ByteSize(1536 << 20));
    assert!(p.to_toml().contains("expected_peak = \"1.50GiB\""));
    p.bounds.expected_peak = None;
    assert!(!p.to_toml().contains("expected_peak"), "left out when unknown");
}
