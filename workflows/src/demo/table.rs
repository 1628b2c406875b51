//! A printed table of `label  value   note` rows, labels left- and values right-aligned.

use std::fmt::Write as _;

/// One row: label, value, note (may be empty).
type Row = (String, String, String);

/// Rows collected first, so the columns can be aligned when printed.
#[derive(Debug, Default)]
pub(crate) struct Table {
    rows: Vec<Row>,
}

impl Table {
    /// Adds a row.
    pub(crate) fn row(
        &mut self,
        label: impl Into<String>,
        value: impl ToString,
        note: impl Into<String>,
    ) {
        self.rows
            .push((label.into(), value.to_string(), note.into()));
    }

    /// Prints the rows, aligned.
    pub(crate) fn print(&self) {
        let lw = self.width(|r| &r.0);
        let vw = self.width(|r| &r.1);
        for (l, v, n) in &self.rows {
            let mut line = format!("  {l:<lw$}  {v:>vw$}");
            if !n.is_empty() {
                let _ = write!(line, "   {n}");
            }
            println!("{}", line.trim_end());
        }
    }

    /// The widest cell of one column, in characters.
    fn width(&self, cell: impl Fn(&Row) -> &String) -> usize {
        self.rows
            .iter()
            .map(|r| cell(r).chars().count())
            .max()
            .unwrap_or(0)
    }
}
