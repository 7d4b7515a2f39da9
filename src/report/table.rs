//! The report's text layout: tables whose columns fit their cells,
//! wrapped paragraphs, occupancy bars.

use std::fmt;

/// How a table column lines up.
#[derive(Clone, Copy)]
pub(super) enum Align {
    Left,
    Right,
}

/// A text table whose columns are as wide as their widest cell, so long key
/// or runner names never push later columns out of line.
pub(super) struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(super) fn new(columns: &[(&'static str, Align)]) -> Table {
        Table {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    pub(super) fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.columns.len());
        self.rows.push(cells);
    }

    /// Writes the table, each line at most [`WIDTH`] characters where its
    /// columns but the last fit: a left-aligned last column (names, lists,
    /// meanings) wraps at spaces onto lines of its own, under its column
    /// (or indented by four where the other columns leave it too little).
    pub(super) fn render(&self, f: &mut fmt::Formatter<'_>, indent: &str) -> fmt::Result {
        let width = |cell: &str| cell.chars().count();
        let mut widths: Vec<usize> = self.columns.iter().map(|(h, _)| width(h)).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(width(cell));
            }
        }
        let last = self.columns.len() - 1;
        let header: Vec<String> = self.columns.iter().map(|(h, _)| h.to_string()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::from(indent);
            for (k, ((cell, &w), &(_, align))) in
                row.iter().zip(&widths).zip(&self.columns).enumerate()
            {
                if k > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(w - width(cell));
                match align {
                    Align::Left if k == last => {
                        let at = width(&line);
                        let room = WIDTH.saturating_sub(at);
                        let (first, rest) = if width(cell) <= room || room >= MIN_WRAP {
                            (room, room)
                        } else {
                            (0, WIDTH - 4)
                        };
                        let mut pieces = wrap_words(cell, first, rest).into_iter();
                        // An empty first piece: the cell starts on a line
                        // of its own.
                        line.push_str(&pieces.next().unwrap_or_default());
                        let hang = if first > 0 { at } else { 4 };
                        for piece in pieces {
                            writeln!(f, "{}", line.trim_end())?;
                            line = format!("{}{piece}", " ".repeat(hang));
                        }
                    }
                    Align::Left => {
                        line.push_str(cell);
                        line.push_str(&pad);
                    }
                    Align::Right => {
                        line.push_str(&pad);
                        line.push_str(cell);
                    }
                }
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// The widest line a report's default form prints (tables whose columns
/// but the last fit, and every line of prose).
pub(super) const WIDTH: usize = 100;

/// The least room a wrapped last column keeps beside the other columns;
/// with less, it goes on lines of its own.
pub(super) const MIN_WRAP: usize = 24;

/// `text` in pieces of at most `first` characters, then `rest`, broken at
/// spaces (a word longer than a piece is broken inside). A `first` of 0
/// gives an empty first piece.
pub(super) fn wrap_words(text: &str, first: usize, rest: usize) -> Vec<String> {
    let mut pieces = vec![String::new()];
    let mut room = first;
    for word in text.split(' ') {
        let mut word: Vec<char> = word.chars().collect();
        loop {
            let piece = pieces.last_mut().expect("one piece at least");
            let used = piece.chars().count();
            let needed = word.len() + usize::from(used > 0);
            if needed <= room.saturating_sub(used) {
                if used > 0 {
                    piece.push(' ');
                }
                piece.extend(word.iter());
                break;
            }
            if used == 0 && room > 0 && word.len() > room {
                // A word wider than a whole piece: broken inside.
                let rest_of_word = word.split_off(room);
                piece.extend(word.iter());
                word = rest_of_word;
            }
            pieces.push(String::new());
            room = rest.max(1);
            if word.is_empty() {
                break;
            }
        }
    }
    pieces
}

/// Prose wrapped at [`WIDTH`]: the first line starts with `head`, the
/// others are indented by `hang` spaces.
pub(super) fn paragraph(
    f: &mut fmt::Formatter<'_>,
    head: &str,
    text: &str,
    hang: usize,
) -> fmt::Result {
    let at = head.chars().count();
    let pieces = wrap_words(text, WIDTH.saturating_sub(at).max(MIN_WRAP), WIDTH - hang);
    for (i, piece) in pieces.iter().enumerate() {
        if i == 0 {
            writeln!(f, "{head}{piece}")?;
        } else {
            writeln!(f, "{}{piece}", " ".repeat(hang))?;
        }
    }
    Ok(())
}

/// Characters of a packed runner's occupancy bar.
pub(super) const BAR: usize = 20;

/// `[offset, offset + bytes)` of an arena of `arena` bytes as a bar of
/// [`BAR`] characters: `#` where the range lies, `.` elsewhere.
pub(super) fn occupancy(offset: u64, bytes: u64, arena: u64) -> String {
    if arena == 0 {
        return ".".repeat(BAR);
    }
    let scale = |b: u64, up: bool| {
        let x = u128::from(b) * BAR as u128;
        let a = u128::from(arena);
        let cells = if up { x.div_ceil(a) } else { x / a };
        usize::try_from(cells).unwrap_or(BAR).min(BAR)
    };
    let lo = scale(offset, false).min(BAR - 1);
    let hi = scale(offset.saturating_add(bytes), true).max(lo + 1);
    (0..BAR)
        .map(|i| if (lo..hi).contains(&i) { '#' } else { '.' })
        .collect()
}

pub(super) fn ratio(a: u64, b: u64) -> String {
    format!("{:.3}", super::byte_ratio(a, b))
}
