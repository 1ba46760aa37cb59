//! The plots as PNG: each SVG the report draws, rendered by `resvg`.
//!
//! One drawing, two formats: the PNG is the SVG rasterized, never a second
//! plot that could drift from the first. SVG is what a browser or a document
//! embeds; PNG is what a chat message, an issue or a slide takes.
//!
//! Text needs a font, and the binary carries none: the machine's fonts are
//! scanned once (`fontdb`, pure Rust) and the plots' `sans-serif` is mapped
//! to a sans face found there, so the output is the same on one machine run
//! after run. A machine with no font at all still gets its PNGs — lines and
//! bars, no labels — and is told so once, with what to install.

use std::sync::Arc;

use anyhow::{Context, Result};
use resvg::{tiny_skia, usvg};

/// Families tried, in order, for the plots' `sans-serif`.
const SANS: [&str; 5] = ["DejaVu Sans", "Liberation Sans", "Noto Sans", "Arial", "Helvetica"];

/// Renders SVG documents to PNG with the fonts found on this machine.
pub struct Renderer {
    options: usvg::Options<'static>,
    /// Whether any font was found (without one, text is left out).
    pub has_fonts: bool,
}

impl Renderer {
    /// Scans the machine's fonts once, for every plot of a run.
    pub fn with_system_fonts() -> Renderer {
        let mut fonts = usvg::fontdb::Database::new();
        fonts.load_system_fonts();
        let family = |name: &str| fonts.faces().any(|f| f.families.iter().any(|(n, _)| n == name));
        let sans = SANS
            .iter()
            .map(|s| s.to_string())
            .find(|s| family(s))
            .or_else(|| fonts.faces().next().and_then(|f| f.families.first().map(|(n, _)| n.clone())));
        let has_fonts = sans.is_some();
        if let Some(sans) = sans {
            fonts.set_sans_serif_family(sans);
        }
        let options = usvg::Options { fontdb: Arc::new(fonts), ..usvg::Options::default() };
        Renderer { options, has_fonts }
    }

    /// The PNG of one SVG document, at its own size.
    pub fn png(&self, svg: &str) -> Result<Vec<u8>> {
        let tree = usvg::Tree::from_str(svg, &self.options).context("the plot is not valid SVG")?;
        let size = tree.size().to_int_size();
        let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height()).context("the plot has no area")?;
        resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
        pixmap.encode_png().context("cannot encode the plot as PNG")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PNG's signature, then the IHDR chunk's width and height (big-endian).
    fn dimensions(png: &[u8]) -> (u32, u32) {
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let be = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
        (be(16), be(20))
    }

    #[test]
    fn a_plot_is_rendered_at_its_size_with_its_colours() {
        let svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"40\" height=\"30\">\
                   <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
                   <rect x=\"10\" y=\"10\" width=\"20\" height=\"10\" fill=\"#0072B2\"/></svg>";
        let png = Renderer::with_system_fonts().png(svg).unwrap();
        assert_eq!(dimensions(&png), (40, 30));
        let again = Renderer::with_system_fonts().png(svg).unwrap();
        assert_eq!(png, again, "the same drawing gives the same bytes");
        let decoded = tiny_skia::Pixmap::decode_png(&png).unwrap();
        let at = |x: u32, y: u32| decoded.pixel(x, y).unwrap();
        assert_eq!((at(2, 2).red(), at(2, 2).green(), at(2, 2).blue()), (255, 255, 255));
        assert_eq!((at(20, 15).red(), at(20, 15).green(), at(20, 15).blue()), (0x00, 0x72, 0xB2));
    }

    #[test]
    fn text_is_drawn_with_a_machine_font() {
        // `.ci/setup` installs fonts-dejavu-core where it is missing.
        let renderer = Renderer::with_system_fonts();
        assert!(renderer.has_fonts, "no font found on this machine");
        let blank = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"80\" height=\"20\" font-family=\"sans-serif\">\
                     <rect width=\"100%\" height=\"100%\" fill=\"white\"/></svg>";
        let text = blank.replace("</svg>", "<text x=\"2\" y=\"15\" font-size=\"14\">5h 7d</text></svg>");
        let dark = |svg: &str| {
            let png = tiny_skia::Pixmap::decode_png(&renderer.png(svg).unwrap()).unwrap();
            png.pixels().iter().filter(|p| p.red() < 128).count()
        };
        assert_eq!(dark(blank), 0);
        assert!(dark(&text) > 20, "the label was not drawn");
    }
}
