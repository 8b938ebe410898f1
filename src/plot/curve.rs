//! The picture of a policy's shed curve (`shedgate curve`). By default ([`View::ByRank`]):
//! shed probability (0–1) against area rank (1–100), one line per pressure, with the policy's
//! areas and `default_rank` marked at their ranks. [`View::ByPressure`]: shed probability
//! against pressure, one line per rank that has areas. The numbers are [`Curve::shed_probability`] itself, the function the
//! decision calls (docs/decision.md "Decision rule", step 6), so the picture cannot drift from
//! the proxy.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontTransform;

use super::{FONT, Format, PALETTE, PlotError};
use crate::policy::{Curve, Mode, Policy, Rank};
use crate::pressure::Pressure;

/// Pressures drawn when none are given: just above the shed floor (0.55), where the ramp
/// ends; the seed's example pressure 0.75 (rank 50 shed, rank 5 kept); and up to 0.9.
pub const DEFAULT_PRESSURES: &str = "0.55,0.6,0.7,0.75,0.8,0.9";

/// At most one line per palette colour.
pub const MAX_PRESSURES: usize = PALETTE.len();

/// Picture size in pixels (SVG: user units), width × height.
pub const SIZE: (u32, u32) = (1100, 680);

/// Longest area label, in characters, before the rest of the names become "+N more".
const LABEL_CHARS: usize = 56;

/// Parses a comma-separated list of pressures (`0.5,0.6,0.75`), each in `[0, 1]`, sorted
/// ascending for the legend.
///
/// # Errors
/// [`PlotError::Invalid`] naming the value: not a number, outside `[0, 1]`, given twice, an
/// empty list, or more than [`MAX_PRESSURES`] values.
pub fn parse_pressures(list: &str) -> Result<Vec<Pressure>, PlotError> {
    let mut out: Vec<Pressure> = Vec::new();
    for item in list.split(',').map(str::trim) {
        let value: f64 = item
            .parse()
            .map_err(|_| PlotError::Invalid(format!("--pressures: {item:?} is not a number")))?;
        let p = Pressure::new(value)
            .ok_or_else(|| PlotError::Invalid(format!("--pressures: {item} is outside [0, 1]")))?;
        if out.contains(&p) {
            return Err(PlotError::Invalid(format!(
                "--pressures: {item} is given twice"
            )));
        }
        out.push(p);
    }
    if out.len() > MAX_PRESSURES {
        return Err(PlotError::Invalid(format!(
            "--pressures: {} values, at most {MAX_PRESSURES} (one colour each)",
            out.len()
        )));
    }
    out.sort_by(|a, b| a.get().total_cmp(&b.get()));
    Ok(out)
}

/// One drawn line: `(rank, shed probability)` for every rank `1..=100`.
pub fn points(curve: Curve, pressure: Pressure) -> Vec<(f64, f64)> {
    (1..=100u8)
        .filter_map(Rank::new)
        .map(|r| (f64::from(r.get()), curve.shed_probability(r, pressure)))
        .collect()
}

/// The legend entry for one pressure: the pressure and which ranks it keeps, from
/// [`Curve::threshold`].
pub fn legend(pressure: Pressure) -> String {
    let p = pressure.get();
    if p <= Pressure::SHED_FLOOR.get() {
        format!("pressure {p:.2}: nothing shed (at or below the 0.5 floor)")
    } else if p >= 1.0 {
        format!("pressure {p:.2}: every supersedable event shed")
    } else {
        let t = Curve::threshold(pressure);
        format!("pressure {p:.2}: ranks ≤ {} kept", t.floor())
    }
}

/// The marks under the curves: for each rank that has areas or is `default_rank`, one label.
/// Ranks ascending.
pub fn marks(policy: &Policy) -> Vec<(Rank, String)> {
    let mut by_rank: BTreeMap<Rank, Vec<&str>> = BTreeMap::new();
    for area in policy.areas() {
        by_rank.entry(area.rank).or_default().push(&area.name);
    }
    by_rank.entry(policy.default_rank()).or_default();
    by_rank
        .into_iter()
        .map(|(rank, names)| {
            let mut label = if rank == policy.default_rank() {
                format!("default_rank {rank}: every unlisted place")
            } else {
                format!("rank {rank}:")
            };
            let mut sep = if names.is_empty() || rank == policy.default_rank() {
                ", "
            } else {
                " "
            };
            for (i, name) in names.iter().enumerate() {
                if label.chars().count() + name.chars().count() + 2 > LABEL_CHARS {
                    label.push_str(&format!(" +{} more", names.len() - i));
                    break;
                }
                label.push_str(sep);
                label.push_str(name);
                sep = ", ";
            }
            (rank, label)
        })
        .collect()
}

/// What the picture puts on its x axis.
#[derive(Debug, Clone, PartialEq)]
pub enum View {
    /// Rank 1–100 on the x axis, one line per pressure: which ranks go at a given pressure.
    ByRank(Vec<Pressure>),
    /// Pressure 0.4–1.0 on the x axis, one line per rank that has areas, and `default_rank`:
    /// at which pressure a given area starts to go.
    ByPressure,
}

/// One line of the pressure view: the rank, its label, and `(pressure, shed probability)`
/// points.
pub type PressureLine = (Rank, String, Vec<(f64, f64)>);

/// The lines of the pressure view: for each rank that has areas or is `default_rank`,
/// its label from [`marks`] and `(pressure, shed probability)` for pressure 0.40–1.00 in
/// steps of 0.002.
pub fn pressure_lines(policy: &Policy) -> Vec<PressureLine> {
    let curve = policy.curve();
    marks(policy)
        .into_iter()
        .map(|(rank, label)| {
            let line = (200..=500u32)
                .map(|i| f64::from(i) / 500.0)
                .map(|p| (p, curve.shed_probability(rank, Pressure::saturating(p))))
                .collect();
            (rank, label, line)
        })
        .collect()
}

/// Draws the curve picture of `policy` in `view` into `out` as `format`, [`SIZE`] pixels.
///
/// # Errors
/// [`PlotError::Invalid`] for a pressure list that is empty or longer than
/// [`MAX_PRESSURES`]; [`PlotError::Font`]; [`PlotError::Draw`] when the file cannot be
/// written.
pub fn draw(policy: &Policy, view: &View, out: &Path, format: Format) -> Result<(), PlotError> {
    if let View::ByRank(pressures) = view
        && (pressures.is_empty() || pressures.len() > MAX_PRESSURES)
    {
        return Err(PlotError::Invalid(format!(
            "between 1 and {MAX_PRESSURES} pressures, got {}",
            pressures.len()
        )));
    }
    super::register_font()?;
    let fail = |message: String| PlotError::Draw {
        path: out.display().to_string(),
        message,
    };
    match format {
        Format::Png => {
            let root = BitMapBackend::new(out, SIZE).into_drawing_area();
            render(&root, policy, view).map_err(|e| fail(e.to_string()))?;
            root.present().map_err(|e| fail(e.to_string()))
        }
        Format::Svg => {
            let root = SVGBackend::new(out, SIZE).into_drawing_area();
            render(&root, policy, view).map_err(|e| fail(e.to_string()))?;
            root.present().map_err(|e| fail(e.to_string()))
        }
    }
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// The title, the subtitle and the chart's frame; then the view.
fn render<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    policy: &Policy,
    view: &View,
) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let mode = match policy.mode() {
        Mode::Enforce => "enforce mode",
        Mode::Warn => "warn mode: would-sheds are counted, nothing is shed",
    };
    let root = root.titled(
        &format!("Shed curve of policy {} ({mode})", policy.version()),
        (FONT, 24).into_font().color(&BLACK),
    )?;
    let what = match view {
        View::ByRank(_) => "by its area's rank, at each pressure",
        View::ByPressure => "by pressure, for each rank that has areas",
    };
    root.draw(&Text::new(
        format!(
            "Probability that a supersedable event is shed, {what} ({}). Events of \
             never-streams are not shed.",
            policy.curve()
        ),
        (60, 0),
        (FONT, 15).into_font().color(&RGBColor(60, 60, 60)),
    ))?;
    let area = root.margin(28, 10, 10, 30);
    match view {
        View::ByRank(pressures) => by_rank(&area, policy, pressures),
        View::ByPressure => by_pressure(&area, policy),
    }
}

/// A chart of shed probability (0–1) against `x`: the shared axes, grid and label styles.
type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn frame<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    x: std::ops::Range<f64>,
    x_desc: &str,
    x_labels: usize,
    x_format: &dyn Fn(&f64) -> String,
) -> Result<Chart<'a, DB>, DrawingAreaErrorKind<DB::ErrorType>> {
    let mut chart = ChartBuilder::on(area)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d(x, 0.0..1.04)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("shed probability (0–1)")
        .x_labels(x_labels)
        .y_labels(11)
        .x_label_formatter(x_format)
        .y_label_formatter(&|y| format!("{y:.1}"))
        .axis_desc_style((FONT, 17))
        .label_style((FONT, 14))
        .light_line_style(RGBColor(240, 240, 240))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()?;
    Ok(chart)
}

/// The legend, boxed, where the lines leave room.
fn legend_box<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    position: SeriesLabelPosition,
) -> DrawResult<DB> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(180, 180, 180))
        .draw()
}

fn by_rank<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    policy: &Policy,
    pressures: &[Pressure],
) -> DrawResult<DB> {
    let curve = policy.curve();
    let mut chart = frame(
        area,
        0.0..101.0,
        "area rank (1 = most important, shed last; 100 = shed first)",
        11,
        &|x| format!("{x:.0}"),
    )?;
    let marks = marks(policy);
    for (rank, _) in &marks {
        let x = f64::from(rank.get());
        let colour = if *rank == policy.default_rank() {
            BLACK
        } else {
            RGBColor(150, 150, 150)
        };
        chart.draw_series(DashedLineSeries::new(
            [(x, 0.0), (x, 1.04)],
            6,
            4,
            colour.stroke_width(1),
        ))?;
    }
    for (i, &p) in pressures.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(points(curve, p), colour.stroke_width(3)))?
            .label(legend(p))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(3))
            });
    }
    // Labels last, so that they read over the curves; beside their line, bottom to top.
    let mark_text = (FONT, 14)
        .into_font()
        .color(&RGBColor(70, 70, 70))
        .transform(FontTransform::Rotate270);
    for (rank, label) in marks {
        chart.draw_series(std::iter::once(Text::new(
            label,
            (f64::from(rank.get()) + 0.9, 0.03),
            mark_text.clone(),
        )))?;
    }
    legend_box(&mut chart, SeriesLabelPosition::LowerRight)
}

fn by_pressure<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    policy: &Policy,
) -> DrawResult<DB> {
    let mut chart = frame(
        area,
        0.4..1.0,
        "pressure (0–1; nothing is shed at or below 0.5)",
        13,
        &|x| format!("{x:.2}"),
    )?;
    let floor = Pressure::SHED_FLOOR.get();
    chart.draw_series(DashedLineSeries::new(
        [(floor, 0.0), (floor, 1.04)],
        6,
        4,
        BLACK.stroke_width(1),
    ))?;
    let lines = pressure_lines(policy);
    let n = lines.len();
    for (i, (rank, label, line)) in lines.into_iter().enumerate() {
        // Seven or fewer lines take the palette; more take hues from blue (most important)
        // to red (shed first), in rank order.
        let colour: RGBColor = if n <= PALETTE.len() {
            PALETTE[i]
        } else {
            let hue = 0.62 - 0.62 * f64::from(rank.get() - 1) / 99.0;
            let (r, g, b) = HSLColor(hue, 0.75, 0.45).rgb();
            RGBColor(r, g, b)
        };
        let width = if rank == policy.default_rank() { 4 } else { 3 };
        chart
            .draw_series(LineSeries::new(line, colour.stroke_width(width)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(width))
            });
    }
    legend_box(&mut chart, SeriesLabelPosition::UpperLeft)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: f64) -> Pressure {
        Pressure::new(v).unwrap()
    }

    #[test]
    fn pressures_parse_sorted_and_refuse_what_they_cannot_read() {
        assert_eq!(
            parse_pressures("0.8, 0.55,0.7").unwrap(),
            vec![p(0.55), p(0.7), p(0.8)]
        );
        for (bad, says) in [
            ("0.6,x", "\"x\" is not a number"),
            ("1.2", "outside [0, 1]"),
            ("0.6,0.60", "given twice"),
            ("", "is not a number"),
            ("0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8", "at most 7"),
        ] {
            let e = parse_pressures(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        parse_pressures(DEFAULT_PRESSURES).unwrap();
    }

    #[test]
    fn legends_say_which_ranks_are_kept() {
        assert_eq!(legend(p(0.75)), "pressure 0.75: ranks ≤ 25 kept");
        assert_eq!(legend(p(0.8)), "pressure 0.80: ranks ≤ 20 kept");
        assert!(legend(p(0.5)).contains("nothing shed"));
        assert!(legend(p(1.0)).contains("every supersedable event shed"));
    }

    #[test]
    fn points_are_the_decisions_curve() {
        let curve = Curve::default();
        let line = points(curve, p(0.75));
        assert_eq!(line.len(), 100);
        assert_eq!(line[0], (1.0, 0.0));
        assert_eq!(line[4], (5.0, 0.0));
        assert_eq!(line[49], (50.0, 1.0));
        let r40 = curve.shed_probability(Rank::new(40).unwrap(), p(0.75));
        assert!(r40 > 0.0 && r40 < 1.0);
        assert_eq!(line[39], (40.0, r40));
    }
}
