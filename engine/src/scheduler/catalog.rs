//! What a scheduler runs: the registry and what its claims derive from it, computed once per
//! change of the registry rather than on every claim.
//!
//! Definitions are registered and unregistered while an engine runs: a change builds a new
//! [`Registry`] and swaps in a new [`Catalog`] (copy on write). The claim, completion and
//! evaluation loops read the current one once per pass, so a pass sees one registry from its
//! beginning to its end.

use std::sync::{Arc, RwLock};

use crate::definition::Registry;

/// A registry and the claim filter it implies.
#[derive(Debug)]
pub struct Catalog {
    /// The definitions.
    pub registry: Arc<Registry>,
    /// Every registered `name@version`: the steps claimed and the runs evaluated.
    pub keys: Vec<String>,
    /// The resources the registered workflows' steps call, claimed each on its own.
    pub resources: Vec<String>,
    /// Whether a registered step calls no resource: without one, the ordinary claim (which
    /// takes only such steps) is not asked.
    pub plain_steps: bool,
}

impl Catalog {
    /// The catalog of `registry`.
    pub fn new(registry: Arc<Registry>) -> Self {
        let keys = registry.keys();
        let mut resources: Vec<String> = registry
            .workflows()
            .flat_map(|w| w.resources().map(str::to_owned).collect::<Vec<_>>())
            .collect();
        resources.sort();
        resources.dedup();
        let plain_steps = registry
            .workflows()
            .any(|w| w.steps().iter().any(|d| d.resource().is_none()));
        Self {
            registry,
            keys,
            resources,
            plain_steps,
        }
    }
}

/// The current catalog, swapped whole when the registry changes.
#[derive(Debug)]
pub(super) struct Current(RwLock<Arc<Catalog>>);

impl Current {
    pub(super) fn new(registry: Arc<Registry>) -> Self {
        Self(RwLock::new(Arc::new(Catalog::new(registry))))
    }

    /// The catalog now (a reference count taken under an uncontended read lock).
    pub(super) fn load(&self) -> Arc<Catalog> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts the catalog of `registry` in place of the current one.
    pub(super) fn store(&self, registry: Arc<Registry>) {
        let next = Arc::new(Catalog::new(registry));
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = next;
    }
}
