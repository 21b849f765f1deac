//! Draws the README's picture, `docs/stampede.svg`, from the JSON lines of two `stampede_bench`
//! runs, one naive (plain cache-aside) and one guarded (`get_or_compute`): computations per key
//! in each round, and per-call latency.
//!
//! ```text
//! cargo run --example plot_stampede -- NAIVE.jsonl GUARDED.jsonl OUT.svg
//! docs/regenerate-stampede-svg.sh      # a real run from scratch: redis-server, both modes, plot
//! ```
//!
//! SVG only, through plotters' SVG backend without its font features: text goes into the file as
//! `<text>` elements that the viewer renders with its own fonts, so no font file is needed here.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One round of one run: the fields of BENCH.md's JSON line that the picture shows.
struct Round {
    computes_per_key: f64,
    computes: u64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

const NAIVE: RGBColor = RGBColor(214, 69, 65);
const GUARDED: RGBColor = RGBColor(38, 120, 178);
const GREY: RGBColor = RGBColor(90, 90, 90);
const FONT: &str = "sans-serif";

fn main() {
    if let Err(e) = run() {
        eprintln!("plot_stampede: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [naive, guarded, out] = args.as_slice() else {
        return Err("usage: plot_stampede NAIVE.jsonl GUARDED.jsonl OUT.svg".into());
    };
    let (naive_runs, params) = read_rounds(Path::new(naive))?;
    let (guarded_runs, _) = read_rounds(Path::new(guarded))?;
    if naive_runs.len() != guarded_runs.len() {
        return Err(format!(
            "{} naive rounds but {} guarded ones: plot runs of the same size",
            naive_runs.len(),
            guarded_runs.len()
        )
        .into());
    }
    draw(Path::new(out), &naive_runs, &guarded_runs, &params)?;
    println!("wrote {out}");
    Ok(())
}

/// The rounds of one run, and a line describing its parameters (from the first line: the keys,
/// from `computes / computes_per_key`).
fn read_rounds(path: &Path) -> Result<(Vec<Round>, String), BoxError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut rounds = Vec::new();
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| format!("{} line {}: not JSON ({e})", path.display(), i + 1))?;
        let number = |field: &str| {
            v[field].as_f64().ok_or_else(|| {
                format!(
                    "{} line {}: no number {field:?} (is this stampede_bench output?)",
                    path.display(),
                    i + 1
                )
            })
        };
        if v["errors"].as_u64() != Some(0) {
            return Err(format!("{} line {}: the round had errors", path.display(), i + 1).into());
        }
        rounds.push(Round {
            computes_per_key: number("computes_per_key")?,
            computes: number("computes")? as u64,
            p50_ms: number("p50_ms")?,
            p99_ms: number("p99_ms")?,
            max_ms: number("max_ms")?,
        });
    }
    let first = rounds
        .first()
        .ok_or_else(|| format!("{}: no rounds", path.display()))?;
    let keys = (first.computes as f64 / first.computes_per_key).round();
    Ok((rounds, format!("{keys} keys")))
}

fn draw(out: &Path, naive: &[Round], guarded: &[Round], params: &str) -> Result<(), BoxError> {
    let root = SVGBackend::new(out, (1100, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(100);
    let mean = |rounds: &[Round], f: fn(&Round) -> f64| {
        rounds.iter().map(f).sum::<f64>() / rounds.len() as f64
    };
    let naive_cpk = mean(naive, |r| r.computes_per_key);
    head.draw(&Text::new(
        format!(
            "A cold cache, 400 callers at once: plain cache-aside computes each key {naive_cpk:.0} times, stampede-guard once"
        ),
        (30, 18),
        (FONT, 22).into_font().style(FontStyle::Bold),
    ))?;
    head.draw(&Text::new(
        format!(
            "stampede_bench: 8 processes × 50 tasks, {params}, each computation 200 ms, one Redis on loopback, {} rounds (every round starts cold)",
            naive.len()
        ),
        (30, 48),
        (FONT, 15).into_font().color(&GREY),
    ))?;
    for (i, (color, label)) in [
        (
            NAIVE,
            "naive: plain cache-aside (get; on a miss compute, then set)",
        ),
        (GUARDED, "stampede-guard: get_or_compute"),
    ]
    .into_iter()
    .enumerate()
    {
        let x = 30 + 520 * i as i32;
        head.draw(&Rectangle::new([(x, 72), (x + 14, 86)], color.filled()))?;
        head.draw(&Text::new(label, (x + 22, 72), (FONT, 15).into_font()))?;
    }
    let panels = body.split_evenly((1, 2));
    computes_panel(&panels[0], naive, guarded)?;
    latency_panel(&panels[1], naive, guarded, mean)?;
    root.present()?;
    Ok(())
}

/// Left: computations per key in each round, naive next to guarded.
fn computes_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    naive: &[Round],
    guarded: &[Round],
) -> Result<(), BoxError> {
    let top = naive
        .iter()
        .chain(guarded)
        .map(|r| r.computes_per_key)
        .fold(1.0, f64::max)
        * 1.2;
    let groups = naive.len() as f64;
    let mut chart = ChartBuilder::on(area)
        .caption("Computations per key", (FONT, 18))
        .margin(20)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0.0..groups, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("computations / key")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(TRANSPARENT)
        .label_style((FONT, 13))
        .draw()?;
    let bars = |rounds: &[Round], left: f64| -> Vec<(f64, f64, f64)> {
        rounds
            .iter()
            .enumerate()
            .map(|(i, r)| (i as f64 + left, i as f64 + left + 0.36, r.computes_per_key))
            .collect()
    };
    for (rounds, left, color) in [(naive, 0.12, NAIVE), (guarded, 0.52, GUARDED)] {
        let bars = bars(rounds, left);
        chart.draw_series(
            bars.iter()
                .map(|&(x0, x1, y)| Rectangle::new([(x0, 0.0), (x1, y)], color.filled())),
        )?;
        chart.draw_series(bars.iter().map(|&(x0, x1, y)| {
            Text::new(
                format!("{y:.2}"),
                ((x0 + x1) / 2.0 - 0.09, y + top * 0.05),
                (FONT, 14).into_font(),
            )
        }))?;
    }
    for i in 0..naive.len() {
        let (x, y) = area_coord(area, chart.backend_coord(&(i as f64 + 0.5, 0.0)));
        area.draw(&Text::new(
            format!("round {}", i + 1),
            (x - 26, y + 10),
            (FONT, 14).into_font(),
        ))?;
    }
    Ok(())
}

/// A latency figure of a round, by name.
type Stat = (&'static str, fn(&Round) -> f64);

/// `backend_coord` gives pixels of the whole picture; a panel draws in its own.
fn area_coord(area: &DrawingArea<SVGBackend<'_>, Shift>, (x, y): (i32, i32)) -> (i32, i32) {
    let (x0, y0) = area.get_base_pixel();
    (x - x0, y - y0)
}

/// Right: per-call latency (p50, p99, max; mean over the rounds), naive next to guarded.
fn latency_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    naive: &[Round],
    guarded: &[Round],
    mean: impl Fn(&[Round], fn(&Round) -> f64) -> f64,
) -> Result<(), BoxError> {
    let stats: [Stat; 3] = [
        ("p50", |r| r.p50_ms),
        ("p99", |r| r.p99_ms),
        ("max", |r| r.max_ms),
    ];
    let values: Vec<(&str, f64, f64)> = stats
        .iter()
        .map(|&(name, f)| (name, mean(naive, f), mean(guarded, f)))
        .collect();
    let top = values.iter().map(|v| v.1.max(v.2)).fold(1.0, f64::max) * 1.2;
    let mut chart = ChartBuilder::on(area)
        .caption("Per-call latency, ms (mean of the rounds)", (FONT, 18))
        .margin(20)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0.0..values.len() as f64, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("ms")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(TRANSPARENT)
        .label_style((FONT, 13))
        .draw()?;
    let (x, y) = area_coord(area, chart.backend_coord(&(0.05, top * 0.97)));
    for (i, note) in [
        "p50: most calls find the key cached",
        "p99, max: the calls that waited for",
        "a 200 ms computation",
    ]
    .iter()
    .enumerate()
    {
        area.draw(&Text::new(
            *note,
            (x, y + 18 * i as i32),
            (FONT, 13).into_font().color(&GREY),
        ))?;
    }
    for (i, &(name, n, g)) in values.iter().enumerate() {
        let x = i as f64;
        for (left, y, color) in [(0.12, n, NAIVE), (0.52, g, GUARDED)] {
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x + left, 0.0), (x + left + 0.36, y)],
                color.filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                format!("{y:.1}"),
                (x + left + 0.06, y + top * 0.05),
                (FONT, 14).into_font(),
            )))?;
        }
        let (px, py) = area_coord(area, chart.backend_coord(&(x + 0.5, 0.0)));
        area.draw(&Text::new(name, (px - 12, py + 10), (FONT, 14).into_font()))?;
    }
    Ok(())
}
