//! Pictures for operators (cargo feature `plot`, on by default): the shared look of every
//! chart shedgate draws — the embedded font, the output format, the palette — and the
//! picture of a policy's shed curve ([`curve`]).
//!
//! Text is laid out with plotters' `ab_glyph` backend from DejaVu Sans, embedded in the binary
//! (`assets/fonts/DejaVuSans.ttf`, Bitstream Vera licence with public-domain DejaVu changes:
//! `assets/fonts/LICENSE-DejaVu.txt`), so a picture draws the same on a host without any
//! system font or fontconfig.

pub mod curve;

use std::path::Path;
use std::str::FromStr;
use std::sync::OnceLock;

use plotters::style::{FontStyle, RGBColor};

/// The font family name charts use; [`register_font`] binds it to the embedded DejaVu Sans.
pub const FONT: &str = "sans-serif";

/// DejaVu Sans 2.37, 760 kB: Latin, Greek and Cyrillic, so area names in most European
/// languages draw as written.
static DEJAVU_SANS: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// Registers the embedded font as [`FONT`] for plotters. Idempotent; call before drawing.
///
/// # Errors
/// [`PlotError::Font`] if the embedded font cannot be read (a broken build).
pub fn register_font() -> Result<(), PlotError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, DEJAVU_SANS).is_ok()
    });
    if ok { Ok(()) } else { Err(PlotError::Font) }
}

/// A picture's file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// PNG, a bitmap.
    Png,
    /// SVG 1.1, text as `<text>` elements in the [`FONT`] family.
    Svg,
}

impl Format {
    /// The format a file name's extension names (`.png`, `.svg`, any case), if any.
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?;
        ext.parse().ok()
    }
}

impl FromStr for Format {
    type Err = PlotError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("png") {
            Ok(Format::Png)
        } else if s.eq_ignore_ascii_case("svg") {
            Ok(Format::Svg)
        } else {
            Err(PlotError::Format(s.to_owned()))
        }
    }
}

/// Why a picture could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// A format other than `png` or `svg`.
    #[error("unknown picture format {0:?}: use png or svg")]
    Format(String),
    /// The embedded font could not be registered.
    #[error("the embedded font could not be read")]
    Font,
    /// An argument out of range, with what was wrong.
    #[error("{0}")]
    Invalid(String),
    /// Drawing or writing the file failed (plotters' message, with the path).
    #[error("{path}: {message}")]
    Draw {
        /// The output file.
        path: String,
        /// What plotters reported.
        message: String,
    },
}

/// Line colours, in the order series take them: Okabe & Ito's colour-blind-safe palette
/// ("Color Universal Design", 2002), black left out (it is used for marks).
pub const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),   // blue
    RGBColor(213, 94, 0),    // vermillion
    RGBColor(0, 158, 115),   // bluish green
    RGBColor(204, 121, 167), // reddish purple
    RGBColor(230, 159, 0),   // orange
    RGBColor(86, 180, 233),  // sky blue
    RGBColor(240, 228, 66),  // yellow
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_come_from_the_flag_or_the_extension() {
        assert_eq!("SVG".parse::<Format>().unwrap(), Format::Svg);
        assert_eq!("png".parse::<Format>().unwrap(), Format::Png);
        assert!(matches!(
            "jpeg".parse::<Format>(),
            Err(PlotError::Format(_))
        ));
        assert_eq!(
            Format::from_path(Path::new("a/curve.Svg")),
            Some(Format::Svg)
        );
        assert_eq!(Format::from_path(Path::new("curve.png")), Some(Format::Png));
        assert_eq!(Format::from_path(Path::new("curve")), None);
        assert_eq!(Format::from_path(Path::new("curve.gif")), None);
    }

    #[test]
    fn the_embedded_font_registers() {
        register_font().unwrap();
        register_font().unwrap();
    }
}
