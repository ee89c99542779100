//! `--plot FILE.svg`: live, reserved and idle bytes over the trace, one panel per strategy, on
//! one time axis, so the difference shows at a glance.

use std::path::Path;

use adaptalloc_cli::compare::{CompareOptions, Contender, MemoryPoint, timeline};
use adaptalloc_cli::trace::Trace;
use anyhow::Context;
use plotters::prelude::*;

const GIB: f64 = (1u64 << 30) as f64;

/// A plotted quantity: its label, colour and how to read it from a point.
type Line = (&'static str, RGBColor, fn(&MemoryPoint) -> u64);

/// Plots every contender on the first trace (one panel each) into an SVG file.
pub fn plot(path: &Path, trace: &Trace, capacity: u64, opts: &CompareOptions) -> anyhow::Result<()> {
    let series: Vec<(Contender, Vec<MemoryPoint>)> = opts
        .contenders
        .iter()
        .map(|&c| (c, timeline(trace, c, capacity, opts, 400)))
        .collect();
    let max_y = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.reserved_bytes.max(p.live_bytes)))
        .max()
        .unwrap_or(1)
        .max(capacity.min(u64::MAX / 2)) as f64
        / GIB;
    let max_x = series
        .iter()
        .flat_map(|(_, pts)| pts.last().map(|p| p.event))
        .max()
        .unwrap_or(1)
        .max(1);
    let height = 60 + 220 * series.len() as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(50);
    title.titled(
        &format!(
            "{}: memory over the trace (device {:.2} GiB)",
            trace.name,
            capacity as f64 / GIB
        ),
        ("sans-serif", 22),
    )?;
    for ((contender, pts), area) in series.iter().zip(body.split_evenly((series.len(), 1))) {
        let mut chart = ChartBuilder::on(&area)
            .caption(contender.name(), ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(60)
            .build_cartesian_2d(0u64..max_x, 0f64..max_y * 1.05)?;
        chart
            .configure_mesh()
            .x_desc("event")
            .y_desc("GiB")
            .light_line_style(WHITE)
            .draw()?;
        let lines: [Line; 3] = [
            ("reserved", BLUE, |p| p.reserved_bytes),
            ("live", GREEN, |p| p.live_bytes),
            ("idle", RED, |p| p.idle_bytes),
        ];
        for (label, color, get) in lines {
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|p| (p.event, get(p) as f64 / GIB)),
                    color.stroke_width(2),
                ))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()
        .with_context(|| format!("{}: cannot write the plot", path.display()))?;
    Ok(())
}
