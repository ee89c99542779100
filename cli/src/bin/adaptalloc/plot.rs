//! `--plot FILE.svg`: live, reserved and idle bytes over the trace, one panel per strategy, on
//! one time axis, so the difference shows at a glance: the device's capacity as a dashed line,
//! failed requests marked, each panel titled with its failures, driver calls and modelled
//! driver time, one legend above the panels, and a palette that reads without telling red from
//! green (Okabe and Ito's).

use std::path::Path;

use adaptalloc_cli::compare::{CompareOptions, Contender, MemoryPoint, Timeline, timeline};
use adaptalloc_cli::trace::Trace;
use anyhow::Context;
use plotters::prelude::*;

const GIB: f64 = (1u64 << 30) as f64;

/// Okabe-Ito colours.
const BLUE: RGBColor = RGBColor(0, 114, 178);
const GREEN: RGBColor = RGBColor(0, 158, 115);
const ORANGE: RGBColor = RGBColor(230, 159, 0);
const VERMILLION: RGBColor = RGBColor(213, 94, 0);

/// A plotted quantity: its label, colour, stroke width and how to read it from a point.
/// Reserved is drawn first and wider, so that where it equals live (passthrough) both show.
type Line = (&'static str, RGBColor, u32, fn(&MemoryPoint) -> u64);
const LINES: [Line; 3] = [
    ("reserved", BLUE, 5, |p| p.reserved_bytes),
    ("live", GREEN, 2, |p| p.live_bytes),
    ("idle", ORANGE, 2, |p| p.idle_bytes),
];

/// Plots every contender on the first trace (one panel each) into an SVG file.
pub fn plot(path: &Path, trace: &Trace, capacity: u64, opts: &CompareOptions) -> anyhow::Result<()> {
    let series: Vec<(Contender, Timeline)> = opts
        .contenders
        .iter()
        .map(|&c| (c, timeline(trace, c, capacity, opts, 400)))
        .collect();
    let cap = capacity as f64 / GIB;
    let max_y = series
        .iter()
        .flat_map(|(_, t)| t.points.iter().map(|p| p.reserved_bytes.max(p.live_bytes)))
        .max()
        .unwrap_or(1) as f64
        / GIB;
    let max_y = max_y.max(cap) * 1.08;
    let max_x = series
        .iter()
        .flat_map(|(_, t)| t.points.last().map(|p| p.event))
        .max()
        .unwrap_or(1)
        .max(1);
    let height = 90 + 220 * series.len() as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, body) = root.split_vertically(90);
    top.draw(&Text::new(
        format!("{}: memory over the trace (device {cap:.2} GiB)", trace.name),
        (20, 10),
        ("sans-serif", 22).into_font(),
    ))?;
    legend(&top)?;
    for ((contender, t), area) in series.iter().zip(body.split_evenly((series.len(), 1))) {
        let caption = format!(
            "{}: {} failed, {} driver calls, {:.1} ms modelled driver time",
            contender.name(),
            t.failed_at.len(),
            t.driver_calls,
            t.modeled_driver_ns as f64 / 1e6
        );
        let mut chart = ChartBuilder::on(&area)
            .caption(caption, ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(60)
            .build_cartesian_2d(0u64..max_x, 0f64..max_y)?;
        chart
            .configure_mesh()
            .x_desc("event")
            .y_desc("GiB")
            .light_line_style(WHITE)
            .draw()?;
        chart.draw_series(DashedLineSeries::new(
            [(0, cap), (max_x, cap)],
            8,
            6,
            BLACK.stroke_width(1),
        ))?;
        for (_, color, width, get) in LINES {
            chart.draw_series(LineSeries::new(
                t.points.iter().map(|p| (p.event, get(p) as f64 / GIB)),
                color.stroke_width(width),
            ))?;
        }
        // Failed requests: a mark on the capacity line at each (at most one per pixel column).
        let px = (max_x / 900).max(1);
        let mut last = None;
        let marks = t.failed_at.iter().filter(|&&e| {
            let col = e / px;
            let new = last != Some(col);
            last = Some(col);
            new
        });
        chart.draw_series(marks.map(|&e| TriangleMarker::new((e, cap), 6, VERMILLION.filled())))?;
    }
    root.present()
        .with_context(|| format!("{}: cannot write the plot", path.display()))?;
    Ok(())
}

/// One legend for every panel, above them: the three lines, the capacity and the failure mark.
fn legend<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let font = ("sans-serif", 15).into_font();
    let y = 60;
    let mut x = 20;
    for (label, color, width, _) in LINES {
        area.draw(&PathElement::new(vec![(x, y), (x + 30, y)], color.stroke_width(width)))?;
        area.draw(&Text::new(label, (x + 36, y - 8), font.clone()))?;
        x += 130;
    }
    for i in 0..3 {
        area.draw(&PathElement::new(
            vec![(x + i * 12, y), (x + i * 12 + 7, y)],
            BLACK.stroke_width(1),
        ))?;
    }
    area.draw(&Text::new("device capacity", (x + 36, y - 8), font.clone()))?;
    x += 170;
    area.draw(&TriangleMarker::new((x + 10, y), 6, VERMILLION.filled()))?;
    area.draw(&Text::new("failed request", (x + 22, y - 8), font))?;
    Ok(())
}
