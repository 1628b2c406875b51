//! Writes or checks `docs/public-api.txt`: the public API of the `sagaflow` crate, one item
//! per line, so that every change of it shows in review.
//!
//! A crate's listing, read from rustdoc's JSON output, shows the items the crate
//! re-exports from another crate only as `pub use` lines: their fields and methods
//! are listed with the crate that defines them. This command lists `sagaflow`, then adds,
//! for each item it re-exports from a workspace crate, that item's lines from the defining
//! crate's listing, spelled with the path users write (`sagaflow::Run`, not
//! `sagaflow_engine::Run`).
//!
//! ```text
//! cargo run -p sagaflow-tools --bin sagaflow-public-api            # rewrite the listing
//! cargo run -p sagaflow-tools --bin sagaflow-public-api -- --check # fail when it differs
//! ```
//!
//! The listing is read with the `public-api` library (the one `cargo public-api` prints
//! with, in its `-ss` form: no blanket or auto-trait impls) from rustdoc's JSON output, built
//! by one `cargo doc --workspace --lib` for every crate. That output is unstable: rustdoc is
//! run through `scripts/rustdoc-unstable`, which allows it with `RUSTC_BOOTSTRAP=1` for
//! rustdoc alone. Cargo keys what it compiles on `RUSTC_BOOTSTRAP`, so setting it for cargo
//! would have every dependency checked a second time (8.7 min cold on two cores); this way
//! the dependencies are the ones the lints checked, and the listing takes seconds.
//!
//! Items behind `#[doc(hidden)]` (the `internals` feature the workspace turns on) are not in
//! rustdoc's output, so the listing is the one users see.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::Parser;

/// The workspace crates whose items `sagaflow` re-exports.
const DEFINING_CRATES: [&str; 3] = ["sagaflow_agents", "sagaflow_engine", "sagaflow_supervisor"];

#[derive(Debug, Parser)]
#[command(about = "Write or check docs/public-api.txt, the listing of sagaflow's public API")]
struct Args {
    /// Compare with the checked-in listing instead of rewriting it; exit 1 when they differ.
    #[arg(long)]
    check: bool,
    /// The listing file.
    #[arg(long, default_value = "docs/public-api.txt")]
    out: PathBuf,
}

#[derive(Debug, thiserror::Error)]
enum ListingError {
    #[error("could not run `cargo doc`: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("`cargo doc` with JSON output, or `cargo metadata`, failed ({0})")]
    Failed(std::process::ExitStatus),
    #[error("`cargo metadata` printed no target directory: {0}")]
    Metadata(#[source] serde_json::Error),
    #[error("reading {path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: public_api::Error,
    },
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Builds rustdoc's JSON for the workspace's libraries; returns the directory it is in.
fn rustdoc_json() -> Result<PathBuf, ListingError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // The workspace's root and target directory, wherever they are configured.
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .output()
        .map_err(ListingError::Spawn)?;
    if !out.status.success() {
        return Err(ListingError::Failed(out.status));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(ListingError::Metadata)?;
    let dir = |key: &str| {
        meta[key]
            .as_str()
            .map(PathBuf::from)
            .ok_or_else(|| ListingError::Metadata(serde::de::Error::custom(format!("no {key}"))))
    };
    let (root, target) = (dir("workspace_root")?, dir("target_directory")?);
    let status = Command::new(&cargo)
        .args(["doc", "--workspace", "--lib", "--no-deps", "--locked"])
        .env("RUSTDOC", root.join("scripts/rustdoc-unstable"))
        .env("RUSTDOCFLAGS", "-Z unstable-options --output-format json")
        .status()
        .map_err(ListingError::Spawn)?;
    if !status.success() {
        return Err(ListingError::Failed(status));
    }
    Ok(target.join("doc"))
}

/// The listing of one crate from its rustdoc JSON in `dir`, one item per line.
///
/// It leaves out what a reader cannot use or already has: the methods of a trait impl (the
/// impl's own line says the trait is implemented, and the trait defines the methods; an
/// impl's associated types stay, they say something), impls of
/// `core::marker::StructuralPartialEq` (the compiler's mark of a derived `PartialEq`, which
/// stable Rust cannot name), and impls of another crate's hidden traits (a path segment
/// that starts with `__`, such as the ones a derive implements for its own use).
fn listing(dir: &Path, krate: &str) -> Result<String, ListingError> {
    let path = dir.join(format!("{krate}.json"));
    let api = public_api::Builder::from_rustdoc_json(&path)
        .omit_blanket_impls(true)
        .omit_auto_trait_impls(true)
        .build()
        .map_err(|source| ListingError::Json { path, source })?;
    // What each item is, to tell an impl's methods by their parent. An item at two paths
    // keeps one of its lines here, which is enough to tell whether it is a trait impl.
    let lines: HashMap<_, _> = api.items().map(|i| (i.id(), i.to_string())).collect();
    let mut text = String::new();
    for item in api.items() {
        // Rendered again rather than looked up: an item re-exported at two paths (the root
        // and the prelude) is two lines with one id.
        let line = &item.to_string();
        let parent = item.parent_id().and_then(|p| lines.get(&p));
        if unreadable_impl(line) || parent.is_some_and(|p| trait_impl(p) && is_fn(line)) {
            continue;
        }
        text.push_str(line);
        text.push('\n');
    }
    Ok(text)
}

/// The trait a line implements, when it is a trait impl (`impl<T> a::Trait<T> for a::B`).
fn implemented_trait(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("impl")?;
    let (head, _) = rest.split_once(" for ")?;
    // Past the impl's own generics, if any: the trait's path is the last word.
    head.split_whitespace().last()
}

fn trait_impl(line: &str) -> bool {
    implemented_trait(line).is_some()
}

fn is_fn(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().take(4).collect();
    words.contains(&"fn")
}

/// An impl a reader cannot use: `StructuralPartialEq`, or a hidden trait of another crate.
fn unreadable_impl(line: &str) -> bool {
    implemented_trait(line).is_some_and(|t| {
        let path = t.split('<').next().unwrap_or(t);
        path == "core::marker::StructuralPartialEq"
            || path.split("::").any(|segment| segment.starts_with("__"))
    })
}

/// The item a listing line is about: the type an `impl` is for, or the first path of any
/// other line, without its generics, arguments or field type.
fn subject(line: &str) -> &str {
    let line = line.rsplit("] ").next().unwrap_or(line);
    let rest = match line.strip_prefix("impl") {
        Some(imp) => imp.rsplit(" for ").next().unwrap_or(imp),
        None => line,
    };
    // An impl for a reference (`impl X for &a::B`, `pub fn &a::B::f`) is about `a::B`.
    let path = rest
        .split_whitespace()
        .find(|t| t.contains("::"))
        .unwrap_or("")
        .trim_start_matches('&');
    // Cut at a bracket, or at a single `:` (a field's type), never inside `::`.
    let b = path.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'(' | b'<' => break,
            b':' if b.get(i + 1) == Some(&b':') => i += 2,
            b':' => break,
            _ => i += 1,
        }
    }
    &path[..i]
}

/// `path` (of a workspace crate, `sagaflow_engine::model::Run::id`) as users write it,
/// when `sagaflow` re-exports its item: at the root (`pub use sagaflow::Run`), in a module of
/// the facade (`pub use sagaflow::migration::Migration`, whatever module of the engine
/// defines it), or in a module re-exported whole (`pub use sagaflow::http`,
/// `pub use sagaflow::testing::interleave`), below which its items keep their path.
fn spell(path: &str, reexported: &[String]) -> Option<String> {
    // The item is the first segment that is not a module (modules are lower case), or the
    // last one (a function).
    let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let item = segments[1..]
        .iter()
        .position(|s| s.starts_with(|c: char| c.is_ascii_uppercase()))
        .map_or(segments.len() - 1, |i| i + 1);
    let named = |name: &str| {
        let in_module = format!("::{name}");
        reexported
            .iter()
            .find(|r| *r == name)
            .or_else(|| reexported.iter().find(|r| r.ends_with(&in_module)))
    };
    let (reexport, after) = named(segments[item])
        .map(|r| (r, item + 1))
        .or_else(|| (1..item).find_map(|m| named(segments[m]).map(|r| (r, m + 1))))?;
    let mut out = format!("sagaflow::{reexport}");
    for s in &segments[after..] {
        out.push_str("::");
        out.push_str(s);
    }
    if path.ends_with("::") {
        out.push_str("::");
    }
    Some(out)
}

/// `line` with every path of a re-exported item (`sagaflow_engine::model::Run`) spelled as
/// users write it (`sagaflow::Run`). Paths of items `sagaflow` does not re-export stay as
/// they are, so an internal type leaking into the API stands out.
fn user_paths(line: &str, reexported: &[String]) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = DEFINING_CRATES
        .iter()
        .filter_map(|k| rest.find(&format!("{k}::")))
        .min()
    {
        out.push_str(&rest[..at]);
        let mut len = rest[at..]
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len() - at);
        // A single trailing `:` introduces a type or bounds; it is not part of the path.
        if rest[at..at + len].ends_with(':') && !rest[at..at + len].ends_with("::") {
            len -= 1;
        }
        let path = &rest[at..at + len];
        match spell(path, reexported) {
            Some(spelled) => out.push_str(&spelled),
            None => out.push_str(path),
        }
        rest = &rest[at + len..];
    }
    out.push_str(rest);
    out
}

/// `sagaflow`'s listing with the lines of the items it re-exports from workspace crates.
fn build() -> Result<String, ListingError> {
    let dir = rustdoc_json()?;
    let own = listing(&dir, "sagaflow")?;
    let mut lines: BTreeSet<String> = BTreeSet::new();
    let mut reexported: Vec<String> = Vec::new();
    for line in own.lines() {
        if let Some(name) = line.strip_prefix("pub use sagaflow::") {
            reexported.push(name.to_owned());
        }
        lines.insert(line.to_owned());
    }
    for krate in DEFINING_CRATES {
        let theirs = listing(&dir, krate)?;
        for line in theirs.lines() {
            let s = subject(line);
            // An item of this crate, or an impl it adds to another workspace crate's type
            // (the HTTP agent's `From<&HttpAgent> for Resource`).
            if !DEFINING_CRATES
                .iter()
                .any(|k| s.starts_with(&format!("{k}::")))
            {
                continue;
            }
            // An item `sagaflow` re-exports, or one of its members.
            let shown = spell(s, &reexported).is_some();
            if shown {
                lines.insert(line.to_owned());
            }
        }
    }
    let mut text = String::from(
        "# The public API of the `sagaflow` crate, generated by\n\
         # `cargo run -p sagaflow-tools --bin sagaflow-public-api`. Do not edit by hand; the test\n\
         # command fails when the code and this listing differ.\n",
    );
    // Sorted as users read them, after the paths are spelled their way.
    let lines: BTreeSet<String> = lines.iter().map(|l| user_paths(l, &reexported)).collect();
    // A re-export of a workspace item is listed by the item's own lines, under the path users
    // write: its `pub use` line would say it twice. Re-exports of other crates' items (`uuid`,
    // `sea_orm`) stay.
    let defined: BTreeSet<&str> = lines
        .iter()
        .filter(|l| !l.starts_with("pub use "))
        .map(|l| subject(l))
        .collect();
    let lines = lines.iter().filter(|l| {
        l.strip_prefix("pub use ")
            .is_none_or(|path| !defined.contains(path))
    });
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    Ok(text)
}

/// The lines only one of the listings has, so a failed check says what changed.
fn print_difference(checked_in: &str, code: &str) {
    let (old, new): (BTreeSet<&str>, BTreeSet<&str>) =
        (checked_in.lines().collect(), code.lines().collect());
    for l in old.difference(&new) {
        eprintln!("- {l}");
    }
    for l in new.difference(&old) {
        eprintln!("+ {l}");
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = build().and_then(|text| {
        if args.check {
            let old = std::fs::read_to_string(&args.out).map_err(|source| ListingError::File {
                path: args.out.clone(),
                source,
            })?;
            print_difference(&old, &text);
            return Ok(old == text);
        }
        std::fs::write(&args.out, text).map_err(|source| ListingError::File {
            path: args.out.clone(),
            source,
        })?;
        Ok(true)
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!(
                "{} differs from the public API: review the change, then run \
                 `cargo run -p sagaflow-tools --bin sagaflow-public-api` and commit the listing",
                args.out.display()
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("sagaflow-public-api: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::subject;

    #[test]
    fn subjects() {
        assert_eq!(subject("pub struct a::B"), "a::B");
        assert_eq!(subject("#[non_exhaustive] pub enum a::B"), "a::B");
        assert_eq!(
            subject("pub a::B::field: core::option::Option<u8>"),
            "a::B::field"
        );
        assert_eq!(subject("pub fn a::B::f(&self, x::Y) -> z::W"), "a::B::f");
        assert_eq!(subject("impl core::fmt::Debug for a::B"), "a::B");
        assert_eq!(subject("impl<T> a::B<T>"), "a::B");
        assert_eq!(subject("pub a::B::Variant(x::Y)"), "a::B::Variant");
        assert_eq!(subject("impl a::C for &a::B"), "a::B");
        assert_eq!(subject("pub fn &a::B::f(&self)"), "a::B::f");
    }

    #[test]
    fn trait_impls_and_the_ones_left_out() {
        use super::{implemented_trait, is_fn, unreadable_impl};
        assert_eq!(
            implemented_trait("impl<'de> serde::Deserialize<'de> for a::B"),
            Some("serde::Deserialize<'de>")
        );
        assert_eq!(
            implemented_trait("impl core::clone::Clone for a::B"),
            Some("core::clone::Clone")
        );
        assert_eq!(implemented_trait("impl a::B"), None);
        assert!(unreadable_impl(
            "impl core::marker::StructuralPartialEq for a::B"
        ));
        assert!(unreadable_impl(
            "impl utoipa::__dev::ComposeSchema for a::B"
        ));
        assert!(!unreadable_impl("impl core::cmp::PartialEq for a::B"));
        assert!(!unreadable_impl("impl a::B"));
        assert!(is_fn("pub fn a::B::clone(&self) -> a::B"));
        assert!(is_fn("pub async fn a::B::go(&self)"));
        assert!(!is_fn("pub type a::B::Err = a::E"));
        assert!(!is_fn("pub a::B::fn_count: usize"));
    }

    #[test]
    fn paths_of_reexported_items_are_spelled_as_users_write_them() {
        let names = ["Run".to_owned(), "Error".to_owned()];
        assert_eq!(
            super::user_paths(
                "pub fn sagaflow::Engine::run(&self) -> sagaflow_engine::error::Result<sagaflow_engine::model::Run>",
                &names
            ),
            "pub fn sagaflow::Engine::run(&self) -> sagaflow_engine::error::Result<sagaflow::Run>"
        );
        assert_eq!(
            super::user_paths("pub sagaflow_engine::Run::id: uuid::Uuid", &names),
            "pub sagaflow::Run::id: uuid::Uuid"
        );
        let names = ["http".to_owned()];
        assert_eq!(
            super::user_paths(
                "pub fn sagaflow_agents::http::HttpAgent::name(&self) -> &str",
                &names
            ),
            "pub fn sagaflow::http::HttpAgent::name(&self) -> &str"
        );
        assert_eq!(
            super::user_paths(
                "pub fn sagaflow_agents::http::segment(&str) -> String",
                &names
            ),
            "pub fn sagaflow::http::segment(&str) -> String"
        );
        let names = ["migration::Migration".to_owned()];
        assert_eq!(
            super::user_paths(
                "pub fn sagaflow::X::f(sagaflow_engine::definition::migration::Migration)",
                &names
            ),
            "pub fn sagaflow::X::f(sagaflow::migration::Migration)"
        );
    }
}
