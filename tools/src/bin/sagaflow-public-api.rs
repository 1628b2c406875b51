//! Writes or checks `docs/public-api.txt`: the public API of the `sagaflow` crate, one item
//! per line, so that every change of it shows in review.
//!
//! `cargo public-api` lists a crate's items from rustdoc's JSON output, but items the crate
//! re-exports from another crate appear only as `pub use` lines: their fields and methods
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
//! Needs `cargo-public-api` (`cargo install --locked cargo-public-api`); rustdoc's JSON output
//! is unstable, so it runs with `RUSTC_BOOTSTRAP=1` on the stable toolchain.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use clap::Parser;

/// The workspace crates whose items `sagaflow` re-exports.
const DEFINING_CRATES: [&str; 2] = ["sagaflow_engine", "sagaflow_supervisor"];

/// The features `sagaflow` builds a defining crate with, so that its listing holds the impls
/// they add (`ToSchema` of the types the HTTP API answers with).
fn features_of(krate: &str) -> &'static str {
    match krate {
        "sagaflow_engine" => "openapi",
        _ => "",
    }
}

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
    #[error(
        "could not run `cargo public-api` (install it: cargo install --locked cargo-public-api): {0}"
    )]
    Spawn(#[source] std::io::Error),
    #[error("`cargo public-api -p {package}` failed:\n{stderr}")]
    Failed { package: String, stderr: String },
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The listing of one package with `features` (`cargo public-api -ss`: no blanket or
/// auto-trait impls).
fn listing(package: &str, features: &str) -> Result<String, ListingError> {
    let mut command = Command::new("cargo");
    command.args(["public-api", "-ss", "--color", "never", "-p", package]);
    if !features.is_empty() {
        command.args(["--features", features]);
    }
    let out = command
        .env("RUSTC_BOOTSTRAP", "1")
        .output()
        .map_err(ListingError::Spawn)?;
    if !out.status.success() {
        return Err(ListingError::Failed {
            package: package.to_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The item a listing line is about: the type an `impl` is for, or the first path of any
/// other line, without its generics, arguments or field type.
fn subject(line: &str) -> &str {
    let line = line.rsplit("] ").next().unwrap_or(line);
    let rest = match line.strip_prefix("impl") {
        Some(imp) => imp.rsplit(" for ").next().unwrap_or(imp),
        None => line,
    };
    let path = rest
        .split_whitespace()
        .find(|t| t.contains("::"))
        .unwrap_or("");
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
        // The item is the first segment that is not a module (modules are lower case), or
        // the last one (a function).
        let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        let item = segments[1..]
            .iter()
            .position(|s| s.starts_with(|c: char| c.is_ascii_uppercase()))
            .map_or(segments.len() - 1, |i| i + 1);
        let name = segments[item];
        if reexported.iter().any(|r| r == name) {
            out.push_str("sagaflow::");
            out.push_str(&segments[item..].join("::"));
            if path.ends_with("::") {
                out.push_str("::");
            }
        } else {
            out.push_str(path);
        }
        rest = &rest[at + len..];
    }
    out.push_str(rest);
    out
}

/// `sagaflow`'s listing with the lines of the items it re-exports from workspace crates.
fn build() -> Result<String, ListingError> {
    let own = listing("sagaflow", "")?;
    let mut lines: BTreeSet<String> = BTreeSet::new();
    let mut reexported: Vec<String> = Vec::new();
    for line in own.lines() {
        if let Some(name) = line.strip_prefix("pub use sagaflow::") {
            reexported.push(name.to_owned());
        }
        lines.insert(line.to_owned());
    }
    for krate in DEFINING_CRATES {
        let theirs = listing(&krate.replace('_', "-"), features_of(krate))?;
        for line in theirs.lines() {
            let s = subject(line);
            let Some(rest) = s.strip_prefix(krate).and_then(|r| r.strip_prefix("::")) else {
                continue;
            };
            // The item at its re-exported path (`sagaflow_engine::Run`), or one of its
            // members (`sagaflow_engine::Run::id`).
            let shown = reexported.iter().any(|name| {
                rest == name
                    || rest
                        .strip_prefix(name.as_str())
                        .is_some_and(|m| m.starts_with("::"))
            });
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
    for l in lines {
        text.push_str(&user_paths(&l, &reexported));
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
    }
}
