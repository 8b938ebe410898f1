//! The overload bench's picture of its 10x run (a module of `benches/overload.rs`).

use std::path::Path;

use super::{OVERLOAD, SERVICE, WARM, WORKERS};

/// The 10x run's picture: pressure and shed share per 100 ms, the overload window shaded and
/// named, the 0.5 shed floor marked; title, axis labels with units, ticks and a legend in the
/// embedded font (`shedgate::plot`).
pub(crate) fn plot(samples: &[(f64, f64, f64)], path: &Path) {
    use plotters::prelude::*;
    use shedgate::plot::{FONT, PALETTE};
    shedgate::plot::register_font().unwrap();
    let root = BitMapBackend::new(path, (1100, 520)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let root = root
        .titled(
            &format!(
                "shedgate at 10x the upstream's capacity ({WORKERS} workers x {} ms): pressure and shed share",
                SERVICE.as_millis()
            ),
            (FONT, 22).into_font().color(&BLACK),
        )
        .unwrap();
    let t_max = samples.last().map_or(1.0, |s| s.0).ceil();
    let mut chart = ChartBuilder::on(&root.margin(6, 10, 10, 24))
        .x_label_area_size(48)
        .y_label_area_size(58)
        // Headroom above 1.0 for the legend and the overload window's name.
        .build_cartesian_2d(0.0..t_max, 0.0..1.32)
        .unwrap();
    // The overload window, shaded and named.
    let (from, to) = (WARM as f64, (WARM + OVERLOAD) as f64);
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(from, 0.0), (to, 1.32)],
            RGBColor(255, 240, 200).filled(),
        )))
        .unwrap();
    chart
        .configure_mesh()
        .x_desc("time since the load started (s); 0.5x capacity before and after the overload")
        .y_desc("pressure, shed share (0-1)")
        .x_labels(t_max as usize + 1)
        .y_labels(11)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| {
            if *y > 1.0 + 1e-9 {
                String::new()
            } else {
                format!("{y:.1}")
            }
        })
        .axis_desc_style((FONT, 16))
        .label_style((FONT, 14))
        .light_line_style(RGBColor(245, 245, 245))
        .bold_line_style(RGBColor(220, 220, 220))
        .draw()
        .unwrap();
    chart
        .draw_series(DashedLineSeries::new(
            [(0.0, 0.5), (t_max, 0.5)],
            8,
            5,
            BLACK.stroke_width(1),
        ))
        .unwrap()
        .label("shed floor: nothing is shed at pressure 0.5 or below")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], BLACK.stroke_width(1)));
    type Pick = fn(&(f64, f64, f64)) -> f64;
    let series: [(&str, usize, Pick); 2] = [
        (
            "pressure (controller output), sampled every 100 ms",
            0,
            |s| s.1,
        ),
        ("shed share: shed / all requests in each 100 ms", 1, |s| s.2),
    ];
    for (label, colour, value) in series {
        let colour = PALETTE[colour];
        chart
            .draw_series(LineSeries::new(
                samples.iter().map(|s| (s.0, value(s))),
                colour.stroke_width(2),
            ))
            .unwrap()
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(3))
            });
    }
    chart
        .draw_series(std::iter::once(Text::new(
            format!("overload: 10x capacity, {from:.0}-{to:.0} s"),
            (from + 0.15, 1.27),
            (FONT, 16).into_font().color(&RGBColor(140, 90, 0)),
        )))
        .unwrap();
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(180, 180, 180))
        .draw()
        .unwrap();
    root.present().unwrap();
}
