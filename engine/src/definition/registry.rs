//! The set of workflow definitions an engine can run.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::Workflow;
use crate::Error;

/// Workflow definitions by name and version. New runs use the highest version of a name;
/// existing runs stay on the version they started with.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    by_name: HashMap<String, BTreeMap<i32, Arc<Workflow>>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a definition.
    ///
    /// # Errors
    /// [`Error::InvalidDefinition`] when the same name and version is registered twice, or
    /// for a workflow rebuilt from its published description: it has no code to run.
    pub fn register(&mut self, wf: Workflow) -> Result<(), Error> {
        if wf.without_code {
            return Err(Error::InvalidDefinition {
                workflow: wf.name.clone(),
                reason: format!(
                    "version {} was rebuilt from its published description and has no code to \
                     run: register the workflow built with its steps",
                    wf.version
                ),
            });
        }
        let versions = self.by_name.entry(wf.name.clone()).or_default();
        if versions.contains_key(&wf.version) {
            return Err(Error::InvalidDefinition {
                workflow: wf.name.clone(),
                reason: format!("version {} is registered twice", wf.version),
            });
        }
        versions.insert(wf.version, Arc::new(wf));
        Ok(())
    }

    /// The newest version of a workflow.
    ///
    /// # Errors
    /// [`Error::WorkflowNotFound`].
    pub fn latest(&self, name: &str) -> Result<&Arc<Workflow>, Error> {
        self.by_name
            .get(name)
            .and_then(|v| v.values().next_back())
            .ok_or_else(|| Error::WorkflowNotFound(name.to_string()))
    }

    /// A specific version.
    pub fn get(&self, name: &str, version: i32) -> Option<&Arc<Workflow>> {
        self.by_name.get(name).and_then(|v| v.get(&version))
    }

    /// A definition by its `name@version` key.
    pub fn by_key(&self, key: &str) -> Option<&Arc<Workflow>> {
        let (name, version) = key.rsplit_once('@')?;
        self.get(name, version.parse().ok()?)
    }

    /// Every `name@version` key, for the claim filter.
    pub fn keys(&self) -> Vec<String> {
        self.by_name
            .values()
            .flat_map(|v| v.values().map(|w| w.key()))
            .collect()
    }

    /// Every registered workflow, by name and version.
    pub fn workflows(&self) -> impl Iterator<Item = &Arc<Workflow>> {
        self.by_name.values().flat_map(|v| v.values())
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}
