//! Tables that fit the terminal: the width comes from `COLUMNS`, else the terminal of stdout;
//! piped into a file or another program with neither, a table keeps its natural width. A
//! table has a wide layout (one line per row) and a narrow one (values folded into fewer,
//! multi-line cells), taken when the wide one does not fit; short values never wrap, the
//! rest wraps at spaces.

use comfy_table::{CellAlignment, ColumnConstraint, ContentArrangement, Table};
use std::io::IsTerminal;

/// No outer border, a line under the header and one between columns (as `psql` prints).
const STYLE: &str = "     ─┼ │          ";

/// Narrower than this, wrapping makes a table harder to read than letting the terminal do it.
const MIN_WIDTH: u16 = 40;

/// The width tables are fitted to, if any.
pub fn terminal_width() -> Option<u16> {
    let columns = std::env::var("COLUMNS").ok().and_then(|text| text.trim().parse::<u16>().ok());
    let width = columns.or_else(|| {
        let stdout = std::io::stdout();
        if !stdout.is_terminal() {
            return None;
        }
        console::Term::stdout().size_checked().map(|(_rows, columns)| columns)
    });
    width.map(|width| width.max(MIN_WIDTH))
}

/// A table with `header`, fitted to `width` when given.
pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>, width: Option<u16>) -> Table {
    let mut table = Table::new();
    table.load_preset(STYLE).set_header(header.into_iter().map(Into::into).collect::<Vec<String>>());
    if let Some(width) = width {
        table.set_content_arrangement(ContentArrangement::Dynamic).set_width(width);
    }
    table
}

/// A table's cells before it is laid out.
#[derive(Debug, Default)]
pub struct Layout {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// Columns aligned right: numbers, sizes, durations.
    pub right: Vec<usize>,
    /// Columns never wrapped: ids, counts, times, metric values.
    pub fixed: Vec<usize>,
}

impl Layout {
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Layout {
        Layout { header: header.into_iter().map(Into::into).collect(), ..Layout::default() }
    }

    /// Its width unwrapped.
    pub fn width(&self) -> usize {
        natural_width(&self.header, &self.rows)
    }

    pub fn into_table(self, width: Option<u16>) -> Table {
        let mut table = new(self.header, width);
        for row in self.rows {
            table.add_row(row);
        }
        align_right(&mut table, &self.right);
        for index in self.fixed {
            if let Some(column) = table.column_mut(index) {
                column.set_constraint(ColumnConstraint::ContentWidth);
            }
        }
        table
    }
}

/// `wide` when it fits `width` (or nothing limits the width), else `narrow()`.
pub fn fit(wide: Layout, narrow: impl FnOnce() -> Layout, width: Option<u16>) -> Table {
    match width {
        Some(limit) if wide.width() > usize::from(limit) => narrow().into_table(width),
        _ => wide.into_table(width),
    }
}

/// Aligns the listed columns to the right (numbers, sizes, durations).
pub fn align_right(table: &mut Table, columns: &[usize]) {
    for index in columns {
        if let Some(column) = table.column_mut(*index) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// The width a table with these rows takes unwrapped, borders included.
pub fn natural_width(header: &[String], rows: &[Vec<String>]) -> usize {
    let widest_line = |text: &str| text.lines().map(console::measure_text_width).max().unwrap_or(0);
    let mut widths: Vec<usize> = header.iter().map(|cell| widest_line(cell)).collect();
    for row in rows {
        for (index, cell) in row.iter().enumerate() {
            if index < widths.len() {
                widths[index] = widths[index].max(widest_line(cell));
            }
        }
    }
    // Each column has a space either side, and one separator between two columns.
    widths.iter().map(|width| width + 2).sum::<usize>() + widths.len().saturating_sub(1)
}

/// A table's text with the spaces comfy-table pads the last column with removed.
pub fn render(table: &Table) -> String {
    table.lines().map(|line| line.trim_end().to_string()).collect::<Vec<_>>().join("\n")
}
