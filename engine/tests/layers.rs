//! The engine's layers point down: each top-level module may use the modules of its own
//! layer and of the layers below, never one above. The layers, bottom first:
//!
//! 0. nouns: states and counters, the operator's actions, errors, clocks, crash and pause
//!    points, cron, trace context, resource windows, and the read model (runs, steps,
//!    history, alerts, notices as the application sees them);
//! 1. definitions, the agent protocol (outcomes included) and wait types;
//! 2. the pure transitions with their write intents;
//! 3. the store (SQL);
//! 4. metrics and signals;
//! 5. the use cases: scheduler, operator, migration, deliver, rescue.
//!
//! `UPWARD` lists the imports allowed to point up: none (it started with fourteen). A new
//! upward import fails the test, and so would an entry whose import is gone. This reads the
//! sources, so it runs without a database.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and its layer.
const LAYERS: &[(&str, u8)] = &[
    ("action", 0),
    ("clock", 0),
    ("crash", 0),
    ("cron", 0),
    ("error", 0),
    ("interleave", 0),
    ("model", 0),
    ("resource", 0),
    ("rows", 0),
    ("state", 0),
    ("trace", 0),
    ("definition", 1),
    ("outcome", 1),
    ("protocol", 1),
    ("wait", 1),
    ("transition", 2),
    ("store", 3),
    ("metrics", 4),
    ("signals", 4),
    ("deliver", 5),
    ("migration", 5),
    ("operator", 5),
    ("rescue", 5),
    ("scheduler", 5),
];

/// Imports that point up, `(from, to)`: none. It started with 14 and may only shrink; an
/// entry here needs an ADR that says why the layering cannot hold.
const UPWARD: &[(&str, &str)] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The Rust files of module `m`: `m.rs` and everything under `m/`.
fn files_of(m: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let file = src().join(format!("{m}.rs"));
    if file.is_file() {
        out.push(file);
    }
    let mut dirs = vec![src().join(m)];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out
}

/// The names `lib.rs` re-exports at the crate root, with the module each comes from.
fn reexports() -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    let mut map = BTreeMap::new();
    for item in lib.split("pub use ").skip(1) {
        let item = &item[..item.find(';').expect("a use ends")];
        let Some((module, names)) = item.split_once("::") else {
            continue;
        };
        for name in names
            .trim_matches(|c: char| c == '{' || c == '}' || c.is_whitespace())
            .split(',')
        {
            let name = name.trim();
            if !name.is_empty() {
                map.insert(name.to_owned(), module.trim().to_owned());
            }
        }
    }
    map
}

/// The first segments of every `crate::` path in `text`, groups (`crate::{a, b::C}`)
/// included.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut end = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    end = j;
                    break;
                }
            }
            // Top-level items of the group only.
            let mut depth = 0;
            let mut item = String::new();
            for c in group[..end].chars().chain([',']) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if let Some(first) = first_segment(&item) {
                            out.insert(first);
                        }
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
        } else if let Some(first) = first_segment(rest) {
            out.insert(first);
        }
    }
    out
}

fn first_segment(path: &str) -> Option<String> {
    let name: String = path
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// Which top-level modules each module uses.
fn imports() -> BTreeMap<&'static str, BTreeSet<String>> {
    let roots = reexports();
    let modules: BTreeSet<&str> = LAYERS.iter().map(|(m, _)| *m).collect();
    let mut graph = BTreeMap::new();
    for (m, _) in LAYERS {
        let mut used = BTreeSet::new();
        for f in files_of(m) {
            let source = std::fs::read_to_string(&f).expect("source");
            // Comments (doc links included) import nothing.
            let text: String = source
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .map(|l| format!("{l}\n"))
                .collect();
            for first in crate_paths(&text) {
                let target = if modules.contains(first.as_str()) {
                    first
                } else if let Some(module) = roots.get(&first) {
                    module.clone()
                } else {
                    continue;
                };
                if target != *m {
                    used.insert(target);
                }
            }
        }
        graph.insert(*m, used);
    }
    graph
}

#[test]
fn every_module_of_the_engine_has_a_layer() {
    let listed: BTreeSet<&str> = LAYERS.iter().map(|(m, _)| *m).collect();
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    for line in lib.lines() {
        let line = line.trim();
        let Some(decl) = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("mod "))
            .or_else(|| line.strip_prefix("pub(crate) mod "))
        else {
            continue;
        };
        let name = decl.trim_end_matches(';').trim();
        assert!(
            listed.contains(name),
            "module `{name}` has no layer in LAYERS"
        );
    }
}

#[test]
fn imports_point_down_or_are_listed_until_they_go() {
    let layer: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let allowed: BTreeSet<(&str, &str)> = UPWARD.iter().copied().collect();
    let mut upward = BTreeSet::new();
    for (from, used) in imports() {
        for to in used {
            if layer[to.as_str()] > layer[from] {
                upward.insert((from, to));
            }
        }
    }
    let new: Vec<_> = upward
        .iter()
        .filter(|(f, t)| !allowed.contains(&(*f, t.as_str())))
        .collect();
    assert!(
        new.is_empty(),
        "imports that point up a layer (move the type down, or pass it in): {new:?}"
    );
    let gone: Vec<_> = allowed
        .iter()
        .filter(|(f, t)| !upward.contains(&(*f, (*t).to_owned())))
        .collect();
    assert!(
        gone.is_empty(),
        "entries of UPWARD whose import is gone: remove them: {gone:?}"
    );
}

#[test]
fn the_path_reader_sees_groups_and_reexports() {
    let found = crate_paths(
        "use crate::{store::Store, wait::{A, B}, RunState};\nlet x = crate::metrics::f();",
    );
    let want: BTreeSet<String> = ["store", "wait", "RunState", "metrics"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    assert_eq!(found, want);
    assert_eq!(reexports().get("Store").map(String::as_str), Some("store"));
}

/// The public operations of `Store` and `StoreTx` defined in `text`, as `Type::name`: the
/// `pub fn`s at the first level of an `impl Store` or `impl StoreTx<'_>` block.
fn store_operations(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut depth = 0_usize;
    let mut block: Option<&str> = None;
    for line in text.lines() {
        if depth == 0 {
            block = if line.starts_with("impl Store {") {
                Some("Store")
            } else if line.starts_with("impl StoreTx<'_> {") {
                Some("StoreTx")
            } else {
                None
            };
        }
        if let Some(ty) = block
            && depth == 1
        {
            let rest = line.trim_start();
            let rest = rest
                .strip_prefix("pub async fn ")
                .or_else(|| rest.strip_prefix("pub fn "));
            if let Some(rest) = rest {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.insert(format!("{ty}::{name}"));
            }
        }
        depth += line.matches('{').count();
        depth = depth.saturating_sub(line.matches('}').count());
    }
    out
}

/// The operations the store's module docs list under `# Operations`.
fn listed_operations(docs: &str) -> BTreeSet<String> {
    let section = docs
        .split("//! # Operations")
        .nth(1)
        .and_then(|s| s.split("//! Files:").next())
        .expect("store/mod.rs has an `# Operations` section followed by `Files:`");
    section
        .split("[`")
        .skip(1)
        .filter_map(|s| s.split("`]").next())
        .filter(|s| s.starts_with("Store::") || s.starts_with("StoreTx::"))
        .map(str::to_owned)
        .collect()
}

/// The words an operation's name may start with: the nouns the store works on, and the
/// connection's own verbs.
const NOUNS: &[&str] = &[
    "alert",
    "attempts",
    "callback",
    "definition",
    "delivery",
    "fence",
    "history",
    "instance",
    "leader",
    "outbox",
    "parks",
    "plan",
    "replica",
    "wal",
    "queue",
    "resource",
    "run",
    "schedule",
    "schema",
    "stats",
    "step",
    "wait",
    "workflows",
];
const CONNECTION: &[&str] = &[
    "backend",
    "begin",
    "check_file",
    "commit",
    "commit_from",
    "connect",
    "connection",
    "executor",
    "from_connection",
    "has_file",
    "is_replica",
    "lost_or",
    "notify",
    "now_ms",
    "open",
    "open_replica",
    "pause_point",
    "primary_looks",
    "primary_moves",
    "primary_split_brain",
    "rollback",
    "target",
    "with_pause_hook",
];

#[test]
fn the_store_lists_every_operation_in_one_place_noun_first() {
    let mut defined = BTreeSet::new();
    for f in files_of("store") {
        let text = std::fs::read_to_string(&f).expect("readable source");
        defined.extend(store_operations(&text));
    }
    assert!(
        defined.len() > 100,
        "the reader found {} operations",
        defined.len()
    );
    let docs = std::fs::read_to_string(src().join("store/mod.rs")).expect("store/mod.rs");
    let listed = listed_operations(&docs);
    let unlisted: Vec<_> = defined.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&defined).collect();
    assert!(
        unlisted.is_empty() && gone.is_empty(),
        "store/mod.rs `# Operations`: add {unlisted:?}; remove {gone:?}"
    );
    let not_noun_first: Vec<_> = defined
        .iter()
        .filter_map(|op| op.split("::").nth(1))
        .filter(|name| {
            !CONNECTION.contains(name)
                && !NOUNS.iter().any(|n| {
                    *name == *n
                        || name.starts_with(&format!("{n}_"))
                        || name.starts_with(&format!("{n}s_"))
                })
        })
        .collect();
    assert!(
        not_noun_first.is_empty(),
        "store operations whose name does not start with a noun: {not_noun_first:?}"
    );
}

#[test]
fn the_operation_reader_sees_first_level_pub_fns_of_store_impls() {
    let text = "impl Store {\n    pub async fn run_get(&self) {\n        if x {}\n    }\n    \
                fn private(&self) {}\n}\nimpl StoreTx<'_> {\n    pub fn plan_apply(&mut self) {}\n}\n\
                impl Other {\n    pub fn not_this(&self) {}\n}\n";
    let want: BTreeSet<String> = ["Store::run_get", "StoreTx::plan_apply"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    assert_eq!(store_operations(text), want);
}
