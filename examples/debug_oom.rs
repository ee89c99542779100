use adaptalloc::Allocator;
use adaptalloc::compare::passthrough_min_capacity;
use adaptalloc::device::{Device, Granularity, SimDevice};
use adaptalloc::policy::Policy;
use adaptalloc::trace::{Op, read_csv};
use std::sync::Arc;
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let f: f64 = std::env::args().nth(2).map(|s| s.parse().unwrap()).unwrap_or(1.0);
    let t = read_csv(std::path::Path::new(&path), false).unwrap();
    let min = passthrough_min_capacity(&t, Granularity::default());
    let cap = (min as f64 * f) as u64;
    let dev = Arc::new(SimDevice::new(cap));
    let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, Policy::default());
    let mut live = std::collections::HashMap::new();
    let mut shown = 0;
    for (i, e) in t.events.iter().enumerate() {
        match e.op {
            Op::Alloc => match alloc.allocate_raw(e.size, e.stream) {
                Ok(p) => {
                    live.insert(e.id, p);
                }
                Err(err) => {
                    if shown < 3 {
                        println!("event {i}: {err}");
                        shown += 1;
                    }
                }
            },
            Op::Free => {
                if let Some(p) = live.remove(&e.id) {
                    alloc.deallocate(p, e.stream).unwrap();
                }
            }
        }
    }
    println!("cap {cap} min {min} peak live {}", t.peak_live_bytes());
}
