//! Sizes past what a device could hold: every strategy and every peer model refuses them (as
//! cudaMalloc fails them on any GPU), never a size that wrapped around 64 bits.

use std::sync::Arc;

use adaptalloc::device::{CostModel, Device, SimDevice};
use adaptalloc::size::{GIB, MIB};
use adaptalloc_cli::compare::Contender;
use adaptalloc_cli::peers::pytorch::PytorchConf;

#[test]
fn every_contender_refuses_sizes_past_what_a_device_holds() {
    let huge = [
        u64::MAX,
        u64::MAX - 255,
        u64::MAX - MIB,
        u64::MAX - 2 * MIB + 1,
        u64::MAX - 20 * MIB,
        (1 << 63) + 1,
        4 * GIB + 1,
    ];
    for conf in ["", "roundup_power2_divisions:4", "expandable_segments:True"] {
        let conf: PytorchConf = conf.parse().unwrap();
        for c in Contender::all() {
            let dev = Arc::new(
                SimDevice::builder()
                    .capacity(4 * GIB)
                    .cost_model(CostModel::zero())
                    .build(),
            );
            let target = c.target(dev.clone() as Arc<dyn Device>, &conf);
            for size in huge {
                assert_eq!(
                    target.allocate(size, 0),
                    None,
                    "{}: {size} bytes on a 4 GiB device",
                    c.name()
                );
            }
            let p = target
                .allocate(MIB, 0)
                .unwrap_or_else(|| panic!("{}: 1 MiB after the refusals", c.name()));
            target.deallocate(p, 0);
        }
    }
}
