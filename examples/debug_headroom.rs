use adaptalloc::Allocator;
use adaptalloc::compare::passthrough_min_capacity;
use adaptalloc::device::{Device, Granularity, SimDevice};
use adaptalloc::trace::{Op, read_csv};
use std::sync::Arc;
fn main() {
    let t = read_csv(std::path::Path::new("../shared/traces/cpu-gpt2-train.csv"), false).unwrap();
    let cap = passthrough_min_capacity(&t, Granularity::default()) * 12 / 10;
    let dev = Arc::new(SimDevice::new(cap));
    let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
    let headroom = alloc.report().unwrap().memory.headroom_bytes;
    let mut live = std::collections::HashMap::new();
    let mut prev = (0u64, 0u64);
    for (i, e) in t.events.iter().enumerate() {
        match e.op {
            Op::Alloc => {
                if let Ok(p) = alloc.allocate_raw(e.size, e.stream) {
                    live.insert(e.id, p);
                }
            }
            Op::Free => {
                if let Some(p) = live.remove(&e.id) {
                    alloc.deallocate(p, e.stream).unwrap();
                }
            }
        }
        let free = dev.capacity() - dev.used_bytes();
        let st = alloc.stats();
        if free < headroom && st.releasable_idle_bytes > 0 {
            println!(
                "event {i} {:?} size {} free {free} headroom {headroom} releasable {} idle {} prev free {} prev rel {} drv {}",
                e.op,
                e.size,
                st.releasable_idle_bytes,
                st.idle_bytes.current,
                prev.0,
                prev.1,
                dev.stats().driver_allocs
            );
            break;
        }
        prev = (free, st.releasable_idle_bytes);
    }
}
