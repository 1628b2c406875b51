//! The set of workflow definitions an engine can run.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::Workflow;
use crate::Error;

/// Workflow definitions by name and version. New runs use the highest version of a name;
/// existing runs stay on the version they started with.
///
/// A definition taken out at run time ([`Registry::unregister`]) is no longer offered to
/// starts, claims or listings, but stays known by its key ([`Registry::get`],
/// [`Registry::by_key`]) so that the attempts already in flight finish and their runs are
/// evaluated as usual.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    by_name: HashMap<String, BTreeMap<i32, Arc<Workflow>>>,
    /// Unregistered definitions, by `name@version`, kept for the attempts in flight.
    retired: HashMap<String, Arc<Workflow>>,
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
        self.retired.remove(&wf.key());
        versions.insert(wf.version, Arc::new(wf));
        Ok(())
    }

    /// Adds a definition, or puts it in the place of the one registered under the same name
    /// and version (the caller has checked that both describe the same workflow). Returns the
    /// definition it replaced.
    ///
    /// # Errors
    /// [`Error::InvalidDefinition`] for a workflow rebuilt from its published description.
    pub fn replace(&mut self, wf: Workflow) -> Result<Option<Arc<Workflow>>, Error> {
        let previous = self.get_registered(&wf.name, wf.version).cloned();
        // One without code is refused by `register` below, with nothing removed.
        if !wf.without_code
            && let Some(versions) = self.by_name.get_mut(&wf.name)
        {
            versions.remove(&wf.version);
        }
        self.register(wf)?;
        Ok(previous)
    }

    /// Takes a definition out: it is no longer offered to starts and claims. It stays known
    /// by its key for the attempts in flight (see the type's documentation).
    ///
    /// # Errors
    /// [`Error::WorkflowNotFound`] when that name and version is not registered.
    pub fn unregister(&mut self, name: &str, version: i32) -> Result<Arc<Workflow>, Error> {
        let versions = self
            .by_name
            .get_mut(name)
            .ok_or_else(|| Error::WorkflowNotFound(super::workflow_key(name, version)))?;
        let wf = versions
            .remove(&version)
            .ok_or_else(|| Error::WorkflowNotFound(super::workflow_key(name, version)))?;
        if versions.is_empty() {
            self.by_name.remove(name);
        }
        self.retired.insert(wf.key(), wf.clone());
        Ok(wf)
    }

    /// A registered version (not one taken out).
    pub fn get_registered(&self, name: &str, version: i32) -> Option<&Arc<Workflow>> {
        self.by_name.get(name).and_then(|v| v.get(&version))
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

    /// A specific version, registered or taken out while attempts of it were in flight.
    pub fn get(&self, name: &str, version: i32) -> Option<&Arc<Workflow>> {
        self.get_registered(name, version)
            .or_else(|| self.retired.get(&super::workflow_key(name, version)))
    }

    /// A definition by its `name@version` key.
    pub fn by_key(&self, key: &str) -> Option<&Arc<Workflow>> {
        let (name, version) = key.rsplit_once('@')?;
        self.get(name, version.parse().ok()?)
    }

    /// Every registered `name@version` key, for the claim filter.
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

#[cfg(test)]
mod tests {
    use super::Registry;
    use crate::{StepContext, StepError, Workflow};

    fn wf(name: &str, version: i32) -> Workflow {
        Workflow::builder(name, version)
            .step("s", |_: StepContext| async { Ok::<_, StepError>(()) })
            .build()
            .expect("valid")
    }

    #[test]
    fn an_unregistered_version_leaves_starts_and_claims_but_stays_known_by_its_key() {
        let mut r = Registry::new();
        r.register(wf("order", 1)).expect("registered");
        r.register(wf("order", 2)).expect("registered");
        r.unregister("order", 2).expect("taken out");
        assert_eq!(r.latest("order").expect("latest").version(), 1);
        assert_eq!(r.keys(), ["order@1"]);
        assert!(r.get_registered("order", 2).is_none());
        assert!(r.by_key("order@2").is_some(), "kept for attempts in flight");
        assert!(
            r.unregister("order", 2).is_err(),
            "not registered twice over"
        );
        r.unregister("order", 1).expect("taken out");
        assert!(r.is_empty() && r.latest("order").is_err());
        r.register(wf("order", 2)).expect("registered again");
        assert_eq!(r.keys(), ["order@2"]);
    }

    #[test]
    fn a_replaced_definition_takes_the_place_of_the_old_one() {
        let mut r = Registry::new();
        r.register(wf("order", 1)).expect("registered");
        let before = r.get("order", 1).expect("there").clone();
        let previous = r.replace(wf("order", 1)).expect("replaced");
        assert!(previous.is_some_and(|p| std::sync::Arc::ptr_eq(&p, &before)));
        assert!(!std::sync::Arc::ptr_eq(
            r.get("order", 1).expect("there"),
            &before
        ));
        let rebuilt = Workflow::from_description(&before.describe()).expect("rebuilt");
        assert!(r.replace(rebuilt).is_err(), "no code to run");
        assert!(std::sync::Arc::ptr_eq(
            r.get("order", 1).expect("still there"),
            r.latest("order").expect("latest")
        ));
    }
}
