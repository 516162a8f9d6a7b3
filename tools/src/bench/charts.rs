//! SVG charts of a bench run (`leasekeeper-tools bench --charts DIR`): a line
//! chart (the scale-out curve) and a bar chart (ours against the
//! baselines), drawn with plotters' SVG backend alone, so the charts are
//! plain text files that diff and render on GitHub.

use anyhow::{Context, Result, bail};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

const SIZE: (u32, u32) = (960, 500);
const FONT: &str = "sans-serif";

/// A white SVG canvas of [`SIZE`] to be written to `path`.
fn canvas(path: &Path) -> Result<DrawingArea<SVGBackend<'_>, plotters::coord::Shift>> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root)
}

/// Both charts' frame on `root`: the title, the margin, the axes' label areas.
fn framed<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(title, (FONT, 22))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(80);
    builder
}

/// A line chart of one series, `name`, through `points` (x ascending),
/// each point marked and labelled with its y value, written to `path`.
pub(crate) fn line_chart(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    name: &str,
    points: &[(f64, f64)],
) -> Result<()> {
    let points: Vec<(f64, f64)> = points.iter().copied().filter(|p| p.1.is_finite()).collect();
    if points.is_empty() {
        bail!("{}: no point to draw", path.display());
    }
    let x_max = points.iter().map(|p| p.0).fold(1.0, f64::max);
    let y_max = points.iter().map(|p| p.1).fold(1.0, f64::max);
    let root = canvas(path)?;
    let mut chart = framed(&root, title).build_cartesian_2d(0.0..x_max + 0.5, 0.0..y_max * 1.2)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(x_max as usize + 1)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(WHITE)
        .label_style((FONT, 14))
        .draw()?;
    let color = RGBColor(31, 119, 180);
    chart
        .draw_series(LineSeries::new(
            points.iter().copied(),
            color.stroke_width(3),
        ))?
        .label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3)));
    chart.draw_series(
        points
            .iter()
            .map(|&(x, y)| Circle::new((x, y), 5, color.filled())),
    )?;
    chart.draw_series(
        points
            .iter()
            .map(|&(x, y)| Text::new(format!("{y:.0}"), (x, y + y_max * 0.03), centred_above())),
    )?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE)
        .border_style(BLACK)
        .label_font((FONT, 15))
        .draw()?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A bar chart, one bar per `(name, value)`, each labelled with its value
/// (`n/a` for a value that could not be measured), written to `path`.
pub(crate) fn bar_chart(
    path: &Path,
    title: &str,
    y_desc: &str,
    bars: &[(&str, f64)],
) -> Result<()> {
    if bars.is_empty() {
        bail!("{}: no bar to draw", path.display());
    }
    let y_max = bars
        .iter()
        .map(|b| b.1)
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max);
    let root = canvas(path)?;
    let mut chart = framed(&root, title)
        // An integer range includes its end: `0..n - 1` is the n bars.
        .build_cartesian_2d((0..bars.len() - 1).into_segmented(), 0.0..y_max * 1.15)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_desc)
        .x_labels(bars.len())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => bars.get(*i).map_or(String::new(), |b| b.0.to_string()),
            _ => String::new(),
        })
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(WHITE)
        .label_style((FONT, 14))
        .draw()?;
    let palette = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(127, 127, 127),
    ];
    chart.draw_series(
        bars.iter()
            .enumerate()
            .filter(|(_, b)| b.1.is_finite())
            .map(|(i, &(_, v))| {
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), 0.0),
                        (SegmentValue::Exact(i + 1), v),
                    ],
                    palette[i % palette.len()].filled(),
                );
                bar.set_margin(0, 0, 12, 12);
                bar
            }),
    )?;
    chart.draw_series(bars.iter().enumerate().map(|(i, &(_, v))| {
        let (text, at) = if v.is_finite() {
            (format!("{v:.0}"), v)
        } else {
            ("n/a".to_string(), 0.0)
        };
        Text::new(
            text,
            (SegmentValue::CenterOf(i), at + y_max * 0.02),
            centred_above(),
        )
    }))?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A value label: black, centred horizontally, its bottom at the point.
fn centred_above() -> TextStyle<'static> {
    (FONT, 15)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Bottom))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("lk-charts-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_line_chart_is_written_with_its_series_and_values() {
        let dir = temp_dir("line");
        let path = dir.join("scale.svg");
        line_chart(
            &path,
            "Scale-out",
            ("instances", "tasks/s"),
            "no-op runtime",
            &[(1.0, 2000.0), (2.0, 2600.0), (4.0, 2700.0)],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        for text in ["Scale-out", "no-op runtime", "instances", "2600"] {
            assert!(svg.contains(text), "{text} missing from\n{svg}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_bar_chart_names_every_bar_and_marks_the_unmeasured() {
        let dir = temp_dir("bars");
        let path = dir.join("bars.svg");
        bar_chart(
            &path,
            "Ours vs baselines",
            "tasks/s",
            &[
                ("fleet", 1900.0),
                ("graphile best", f64::NAN),
                ("raw ceiling", 2300.0),
            ],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for text in ["fleet", "graphile best", "raw ceiling", "1900", "n/a"] {
            assert!(svg.contains(text), "{text} missing from\n{svg}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn nothing_to_draw_is_an_error_not_an_empty_file() {
        let dir = temp_dir("empty");
        assert!(line_chart(&dir.join("a.svg"), "t", ("x", "y"), "s", &[(1.0, f64::NAN)]).is_err());
        assert!(bar_chart(&dir.join("b.svg"), "t", "y", &[]).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
