//! Proves: a span made from a view keeps the view's address and length; it
//! cannot be stretched over or moved onto other bytes.
use replay_arena::sim::{AsSpan, Span};
use replay_arena::View;

fn stretch(view: &View<'_>) -> Span {
    let mut span = view.span();
    span.len *= 2;
    span.addr += 256;
    span
}

fn main() {}
