//! A workflow's step graph as SVG: steps in layers from left to right (a step sits one layer
//! after its latest dependency), ordered within a layer by where their dependencies sit, one
//! box per step coloured by its state.

use std::collections::HashMap;

use maud::{Markup, html};

/// One step to draw.
#[derive(Debug, Clone)]
pub(super) struct Node<'a> {
    pub(super) name: &'a str,
    pub(super) after: Vec<&'a str>,
    /// Whether it has a compensation (drawn with a dashed border).
    pub(super) compensates: bool,
    /// Its saga role: a `pivot` is drawn with a thick border.
    pub(super) kind: &'a str,
    /// Its state in a run (stored spelling); `None` for a definition.
    pub(super) state: Option<&'a str>,
}

const W: i64 = 168;
const H: i64 = 46;
const GAP_X: i64 = 56;
const GAP_Y: i64 = 18;
const PAD: i64 = 10;
const NAME_CHARS: usize = 20;

/// Each step's layer: 0 without dependencies, else one more than its latest dependency's.
/// Unknown dependencies are ignored; a cycle (which a valid workflow never has) is cut.
fn layers(nodes: &[Node<'_>]) -> Vec<usize> {
    let index: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.name, i)).collect();
    let mut layer: Vec<Option<usize>> = vec![None; nodes.len()];
    fn visit(
        i: usize,
        nodes: &[Node<'_>],
        index: &HashMap<&str, usize>,
        layer: &mut [Option<usize>],
        depth: usize,
    ) -> usize {
        if let Some(l) = layer[i] {
            return l;
        }
        if depth > nodes.len() {
            return 0;
        }
        let l = nodes[i]
            .after
            .iter()
            .filter_map(|d| index.get(d).copied())
            .filter(|&d| d != i)
            .map(|d| visit(d, nodes, index, layer, depth + 1) + 1)
            .max()
            .unwrap_or(0);
        layer[i] = Some(l);
        l
    }
    (0..nodes.len())
        .map(|i| visit(i, nodes, &index, &mut layer, 0))
        .collect()
}

/// Box positions (top-left corners), and the drawing's width and height.
fn layout(nodes: &[Node<'_>]) -> (Vec<(i64, i64)>, i64, i64) {
    let layer = layers(nodes);
    let count = layer.iter().max().map_or(0, |m| m + 1);
    let index: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.name, i)).collect();
    // Rows within each layer: by the mean row of the dependencies (declaration order breaks
    // ties and orders the first layer).
    let mut row = vec![0_f64; nodes.len()];
    let mut columns: Vec<Vec<usize>> = vec![Vec::new(); count];
    for (l, column) in columns.iter_mut().enumerate() {
        let mut members: Vec<(f64, usize)> = (0..nodes.len())
            .filter(|&i| layer[i] == l)
            .map(|i| {
                let deps: Vec<f64> = nodes[i]
                    .after
                    .iter()
                    .filter_map(|d| index.get(d).map(|&d| row[d]))
                    .collect();
                let key = if deps.is_empty() {
                    i as f64
                } else {
                    deps.iter().sum::<f64>() / deps.len() as f64
                };
                (key, i)
            })
            .collect();
        members.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (r, &(_, i)) in members.iter().enumerate() {
            row[i] = r as f64;
        }
        *column = members.into_iter().map(|(_, i)| i).collect();
    }
    let tallest = columns.iter().map(Vec::len).max().unwrap_or(0) as i64;
    let height = (tallest * (H + GAP_Y) - GAP_Y).max(H) + 2 * PAD;
    let width = (count as i64 * (W + GAP_X) - GAP_X).max(W) + 2 * PAD;
    let mut pos = vec![(0, 0); nodes.len()];
    for (l, members) in columns.iter().enumerate() {
        let used = members.len() as i64 * (H + GAP_Y) - GAP_Y;
        let top = PAD + (height - 2 * PAD - used) / 2;
        for (r, &i) in members.iter().enumerate() {
            pos[i] = (PAD + l as i64 * (W + GAP_X), top + r as i64 * (H + GAP_Y));
        }
    }
    (pos, width, height)
}

fn short(name: &str) -> String {
    if name.chars().count() > NAME_CHARS {
        let cut: String = name.chars().take(NAME_CHARS - 1).collect();
        format!("{cut}…")
    } else {
        name.to_owned()
    }
}

/// The graph as an inline SVG; `id` names its arrow marker (unique on the page).
pub(super) fn svg(id: &str, nodes: &[Node<'_>]) -> Markup {
    let (pos, width, height) = layout(nodes);
    let index: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.name, i)).collect();
    let marker = format!("arrow-{id}");
    let marker_ref = format!("url(#{marker})");
    html! {
        div.graph {
            svg xmlns="http://www.w3.org/2000/svg" class="steps" role="img"
                viewBox={ "0 0 " (width) " " (height) } width=(width) height=(height) {
                title { "Step graph" }
                defs {
                    marker id=(marker) viewBox="0 0 10 10" refX="10" refY="5"
                        markerWidth="7" markerHeight="7" orient="auto-start-reverse" {
                        path d="M 0 0 L 10 5 L 0 10 z" class="arrowhead" {}
                    }
                }
                @for (i, n) in nodes.iter().enumerate() {
                    @for d in &n.after {
                        @if let Some(&j) = index.get(d) {
                            @let (x1, y1) = (pos[j].0 + W, pos[j].1 + H / 2);
                            @let (x2, y2) = (pos[i].0, pos[i].1 + H / 2);
                            @let mx = (x1 + x2) / 2;
                            path.edge d={ "M " (x1) " " (y1) " C " (mx) " " (y1) ", " (mx) " " (y2) ", " (x2 - 1) " " (y2) }
                                marker-end=(marker_ref) {}
                        }
                    }
                }
                @for (i, n) in nodes.iter().enumerate() {
                    @let (x, y) = pos[i];
                    @let state = n.state.unwrap_or("defined");
                    g class={ "node st-" (state) @if n.compensates { " comp" } @if n.kind == "pivot" { " pivot" } }
                        data-step=(n.name) {
                        title {
                            (n.name) " — " (state.replace('_', " "))
                            @if n.compensates { " (has a compensation)" }
                            " · " (n.kind)
                        }
                        rect x=(x) y=(y) width=(W) height=(H) rx="7" {}
                        text.name x=(x + 10) y=(y + 19) { (short(n.name)) }
                        text.sub x=(x + 10) y=(y + 36) {
                            @if n.state.is_some() { (state.replace('_', " ")) } @else { (n.kind) }
                            @if n.compensates { " · ↺" }
                        }
                    }
                }
            }
        }
    }
}

/// The legend: the states drawn, and what the borders mean.
pub(super) fn legend(states: &[&str]) -> Markup {
    html! {
        ul.legend {
            @for s in states {
                li { span class={ "swatch st-" (s) } {} (s.replace('_', " ")) }
            }
            li { span.swatch.comp-sample {} "dashed border: has a compensation (↺)" }
            li { span.swatch.pivot-sample {} "thick border: pivot" }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node<'a>(name: &'a str, after: &[&'a str]) -> Node<'a> {
        Node {
            name,
            after: after.to_vec(),
            compensates: false,
            kind: "compensatable",
            state: None,
        }
    }

    #[test]
    fn a_step_sits_one_layer_after_its_latest_dependency() {
        let nodes = [
            node("a", &[]),
            node("b", &["a"]),
            node("c", &["a"]),
            node("d", &["b", "c"]),
            node("e", &["a", "d", "missing"]),
        ];
        assert_eq!(layers(&nodes), [0, 1, 1, 2, 3]);
        let (pos, w, h) = layout(&nodes);
        assert_eq!(pos[1].0, pos[2].0);
        assert!(pos[1].1 < pos[2].1);
        assert!(pos[3].0 > pos[1].0 && pos[4].0 > pos[3].0);
        assert!(w > 4 * W && h >= 2 * H);
    }

    #[test]
    fn a_cycle_does_not_hang_and_names_are_escaped() {
        let nodes = [node("x", &["y"]), node("y", &["x"]), node("<b>", &[])];
        let out = svg("t", &nodes).into_string();
        assert!(out.contains("&lt;b&gt;") && !out.contains("<b>"), "{out}");
    }
}
