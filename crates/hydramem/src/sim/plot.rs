//! PNG line charts for the sweeps, drawn with `plotters` on its bitmap backend.
//!
//! Text is rendered by `ab_glyph` from DejaVu Sans embedded in the binary
//! (`assets/DejaVuSans.ttf`, Bitstream Vera licence, see `assets/DejaVuSans-LICENSE.txt`), so
//! plotting needs no system font library and works on a bare CI machine.
//!
//! A chart is a set of series over one x axis. A series has a line (closed form) and/or
//! markers with vertical error bars (Monte Carlo with its interval). Log axes are drawn by
//! plotting log10 of the values on a linear axis and labelling ticks as powers of ten; values
//! ≤ 0 cannot appear on a log axis and are left out of that series (a Monte Carlo point with no
//! loss observed is drawn at its interval's upper bound instead, as a down-pointing bar).

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;

use super::SimError;

/// One line and/or set of markers.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// (x, y) points.
    pub points: Vec<(f64, f64)>,
    /// Per point, an interval (low, high) drawn as an error bar; empty for none.
    pub intervals: Vec<(f64, f64)>,
    /// Draw markers (true) or a line (false).
    pub markers: bool,
    /// Index into the palette, so a closed form and its Monte Carlo share a colour.
    pub color: usize,
}

/// A whole chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Caption above the plot.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// The series, drawn in order.
    pub series: Vec<Series>,
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        // The font is part of the binary: failing to parse it is a build defect.
        plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            include_bytes!("../../assets/DejaVuSans.ttf"),
        )
        .map_err(|_| ())
        .expect("the embedded DejaVu Sans font parses");
    });
}

fn axis(v: f64, log: bool) -> Option<f64> {
    match log {
        false => Some(v),
        true if v > 0.0 => Some(v.log10()),
        true => None,
    }
}

fn tick(v: f64, log: bool) -> String {
    if !log {
        if v.abs() >= 100.0 {
            return format!("{v:.0}");
        }
        let r = format!("{v:.3}");
        return r.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    let p = v.round();
    if (v - p).abs() > 1e-6 {
        return String::new();
    }
    match p as i32 {
        0 => "1".into(),
        1 => "10".into(),
        2 => "100".into(),
        3 => "1000".into(),
        e => format!("1e{e}"),
    }
}

/// Renders `chart` to a `width` × `height` PNG at `path`.
pub fn render(chart: &Chart, path: &Path, width: u32, height: u32) -> Result<(), SimError> {
    register_font();
    let out = |reason: String| SimError::Output {
        path: path.display().to_string(),
        reason,
    };
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for s in &chart.series {
        for (i, &(x, y)) in s.points.iter().enumerate() {
            let (Some(x), Some(y)) = (axis(x, chart.log_x), axis(y, chart.log_y)) else {
                continue;
            };
            let (lo, hi) = s.intervals.get(i).copied().unwrap_or((f64::NAN, f64::NAN));
            x0 = x0.min(x);
            x1 = x1.max(x);
            for v in [Some(y), axis(lo, chart.log_y), axis(hi, chart.log_y)]
                .into_iter()
                .flatten()
                .filter(|v| v.is_finite())
            {
                y0 = y0.min(v);
                y1 = y1.max(v);
            }
        }
    }
    if x0 > x1 || y0 > y1 {
        return Err(out(
            "nothing to plot: every value is missing or not positive".into(),
        ));
    }
    if chart.log_y {
        (y0, y1) = (y0.floor(), y1.ceil().max(y0.floor() + 1.0));
    } else {
        let pad = ((y1 - y0) * 0.08).max(0.05 * y1.abs()).max(1e-9);
        (y0, y1) = (
            (y0 - pad).min(if y0 >= 0.0 { 0.0 } else { y0 - pad }),
            y1 + pad,
        );
        if y0 < 0.0
            && chart
                .series
                .iter()
                .all(|s| s.points.iter().all(|p| p.1 >= 0.0))
        {
            y0 = 0.0;
        }
    }
    let xpad = ((x1 - x0) * 0.03).max(1e-9);
    let (x0, x1) = (x0 - xpad, x1 + xpad);

    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| out(e.to_string());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut c = ChartBuilder::on(&root)
        .caption(&chart.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|x| e(&x))?;
    let (log_x, log_y) = (chart.log_x, chart.log_y);
    let x_fmt = move |v: &f64| tick(*v, log_x);
    let y_fmt = move |v: &f64| tick(*v, log_y);
    c.configure_mesh()
        .x_desc(&chart.x_label)
        .y_desc(&chart.y_label)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .y_labels(if log_y { (y1 - y0) as usize + 1 } else { 10 })
        .x_labels(if log_x {
            (x1 - x0).ceil() as usize + 1
        } else {
            10
        })
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|x| e(&x))?;

    for s in &chart.series {
        let color = PALETTE[s.color % PALETTE.len()];
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .enumerate()
            .filter_map(|(i, &(x, y))| {
                let x = axis(x, log_x)?;
                // A zero on a log axis: draw the interval's top instead (an upper bound).
                let y = axis(y, log_y)
                    .or_else(|| s.intervals.get(i).and_then(|iv| axis(iv.1, log_y)))?;
                Some((x, y))
            })
            .collect();
        if s.markers {
            c.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(|x| e(&x))?
                .label(&s.label)
                .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
            for (i, &(x, _)) in s.points.iter().enumerate() {
                let Some(&(lo, hi)) = s.intervals.get(i) else {
                    continue;
                };
                let (Some(x), Some(hi)) = (axis(x, log_x), axis(hi, log_y)) else {
                    continue;
                };
                let lo = axis(lo, log_y).unwrap_or(y0);
                c.draw_series(std::iter::once(PathElement::new(
                    vec![(x, lo.max(y0)), (x, hi.min(y1))],
                    color.stroke_width(1),
                )))
                .map_err(|x| e(&x))?;
            }
        } else {
            c.draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(|x| e(&x))?
                .label(&s.label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_png_with_log_axes_and_rejects_empty_charts() {
        let dir = std::env::temp_dir().join(format!("hm-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.png");
        let mut chart = Chart {
            title: "test".into(),
            x_label: "x".into(),
            y_label: "P(loss)".into(),
            log_x: true,
            log_y: true,
            series: vec![
                Series {
                    label: "closed form".into(),
                    points: vec![(100.0, 1e-4), (1000.0, 1e-3), (10000.0, 1e-2)],
                    intervals: vec![],
                    markers: false,
                    color: 0,
                },
                Series {
                    label: "Monte Carlo".into(),
                    points: vec![(100.0, 0.0), (1000.0, 1.1e-3), (10000.0, 0.011)],
                    intervals: vec![(0.0, 3e-4), (9e-4, 1.3e-3), (0.01, 0.012)],
                    markers: true,
                    color: 0,
                },
            ],
        };
        render(&chart, &path, 640, 480).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(
            bytes.len() > 5000,
            "suspiciously small PNG: {} bytes",
            bytes.len()
        );
        for s in &mut chart.series {
            s.points.iter_mut().for_each(|p| p.1 = 0.0);
            s.intervals.clear();
        }
        let e = render(&chart, &path, 640, 480).unwrap_err().to_string();
        assert!(e.contains("nothing to plot"), "{e}");
        let e = render(
            &Chart {
                log_y: false,
                ..chart
            },
            &dir.join("no/such/dir.png"),
            64,
            48,
        );
        assert!(e.is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ticks() {
        assert_eq!(tick(-3.0, true), "1e-3");
        assert_eq!(tick(2.0, true), "100");
        assert_eq!(tick(2.5, true), "");
        assert_eq!(tick(1.25, false), "1.25");
        assert_eq!(tick(1000.0, false), "1000");
    }
}
