//! `adaptalloc gpu-bench` on the stub libcuda (tests/stub/libcuda.c): the command's own code
//! through CudaDevice and CUDA's pool, with no GPU. Skips, saying why, where no C compiler
//! exists or a real CUDA driver is present.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::stub::{run_on_stub, stub_or_skip};

/// `adaptalloc gpu-bench` end to end on the stub: a cost model that parses, and a results table
/// with every strategy and CUDA's pool replaying a small workload through the driver.
#[test]
fn gpu_bench_runs_on_a_stub_libcuda() {
    let Some(dir) = stub_or_skip("bench") else {
        return;
    };
    let cost = dir.join("stub-gpu.toml");
    let results = dir.join("results.md");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_adaptalloc"));
    cmd.arg("gpu-bench")
        .arg("--quick")
        .arg("--cost-model")
        .arg(&cost)
        .arg("--results")
        .arg(&results);
    let (ok, text) = run_on_stub(&mut cmd, &dir, 256 << 20);
    assert!(ok, "gpu-bench failed:\n{text}");
    let model = adaptalloc::device::CostModel::from_file(&cost).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(
        model.description.contains("adaptalloc stub GPU"),
        "{}",
        model.description
    );
    // Every virtual-memory call was timed on the stub's VMM, with handles from 2 MiB up to what
    // half its free memory holds twice (32 MiB of 256 MiB); each with its median and the mean's
    // 95% interval, and cuMemCreate priced at each size.
    let written = std::fs::read_to_string(&cost).unwrap();
    for line in [
        "2MiB create     median",
        "(95%, n = 4)",
        "32MiB release",
        "(95%, n = 2)",
    ] {
        assert!(written.contains(line), "{line:?} missing:\n{written}");
    }
    assert!(written.contains("128MiB: not measured"), "{written}");
    // Every per-handle price is a curve over the sizes measured; the access grant is the one
    // over a run of handles, per handle.
    assert!(written.contains("2MiB run grant"), "{written}");
    // A page copy timed as a split makes it, on the stub's page tags.
    assert!(
        written.contains("# A page kept in a split handle, copied on the device"),
        "{written}"
    );
    assert!(written.contains("\ncopy_ns = "), "{written}");
    // The run grant's price by run length, with none and with 4 other handles mapped (quick).
    for line in [
        "Run grants of 2MiB handles",
        "#       0 others mapped: 1: ",
        "#       4 others mapped: 1: ",
    ] {
        assert!(written.contains(line), "{line:?} missing:\n{written}");
    }
    let v = &model.vmm;
    for curve in [&v.create_ns, &v.set_access_ns, &v.unmap_ns, &v.release_ns] {
        let sizes: Vec<u64> = curve.points.iter().map(|p| p.0.0).collect();
        assert_eq!(sizes, [2 << 20, 8 << 20, 32 << 20], "{written}");
    }
    let table = std::fs::read_to_string(&results).unwrap();
    // small-churn (13 MiB peak) fits the stub's 256 MiB; the GiB-sized workloads are skipped.
    for name in ["passthrough", "caching", "suballoc", "adaptive", "cuda-pool"] {
        assert!(
            table.contains(&format!("| small-churn | {name} | 0 |")),
            "{name} missing or failed:\n{table}"
        );
    }
    assert!(table.contains("skipped"), "{table}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `scripts/gpu-run.sh` (the GPU checks from prebuilt binaries) end to end on the stub, with a
/// stand-in nvidia-smi: every step runs or is reported as not run, the calibrated cost model and
/// the results table land in OUT, and a step that fails (here the CUDA tests, whose binary is
/// not staged) is reported with its exit status without stopping the rest.
#[test]
fn gpu_run_script_runs_on_a_stub_libcuda() {
    let Some(dir) = stub_or_skip("run") else {
        return;
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let staged = dir.join("staged");
    let bin = staged.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_adaptalloc"), bin.join("adaptalloc")).unwrap();
    let tools = dir.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    let smi = tools.join("nvidia-smi");
    std::fs::write(&smi, "#!/bin/sh\necho 'adaptalloc stub GPU, 256 MiB'\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = dir.join("out");
    let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("scripts/gpu-run.sh"))
        .arg(&staged)
        .arg(&out)
        .arg("120")
        .current_dir(&root)
        .env("PATH", path)
        // No torch here: the script says so and skips the PyTorch steps.
        .env("PYTHONPATH", dir.join("no-such-site"));
    let (ok, text) = run_on_stub(&mut cmd, &dir, 256 << 20);
    assert!(ok, "gpu-run.sh failed:\n{text}");
    let log = std::fs::read_to_string(out.join("log.txt")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.starts_with("gpu-bench calibrate+bundled") && l.contains("rc=0")),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l.starts_with("cuda tests") && !l.contains("rc=0")),
        "the missing test binary is reported: {log}"
    );
    let model = out.join("adaptalloc-stub-gpu-256-mib.toml");
    adaptalloc::device::CostModel::from_file(&model).unwrap_or_else(|e| panic!("{e}\n{log}"));
    let table = std::fs::read_to_string(out.join("gpu-bench.md")).unwrap();
    assert!(table.contains("| small-churn | adaptive | 0 |"), "{table}");
    std::fs::remove_dir_all(&dir).ok();
}
