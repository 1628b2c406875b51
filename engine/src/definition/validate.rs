//! Checks of a step graph, each naming the offending step.

use super::{StepDef, StepKind};

const NAME_MAX: usize = 64;

/// Checks the resource a step names.
pub(super) fn check_resource(step: &str, name: &str) -> Result<(), String> {
    crate::resource::check_name(name).map_err(|e| format!("step `{step}`: {e}"))
}

pub(super) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(format!(
            "step name `{name}` must be 1 to {NAME_MAX} characters"
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
    {
        return Err(format!(
            "step name `{name}` may only hold ASCII letters, digits, `_`, `-` and `.`"
        ));
    }
    Ok(())
}

/// Returns every step reachable from `start` by following `next` (excluding `start`).
fn reachable(steps: &[StepDef], start: usize, next: impl Fn(&StepDef) -> &[usize]) -> Vec<bool> {
    let mut seen = vec![false; steps.len()];
    let mut stack: Vec<usize> = next(&steps[start]).to_vec();
    while let Some(i) = stack.pop() {
        if !seen[i] {
            seen[i] = true;
            stack.extend_from_slice(next(&steps[i]));
        }
    }
    seen
}

pub(super) fn check_graph(steps: &[StepDef]) -> Result<(), String> {
    if steps.is_empty() {
        return Err("the workflow has no steps".into());
    }
    // Cycles: Kahn's algorithm; whatever cannot be ordered sits on or behind a cycle.
    let mut indegree: Vec<usize> = steps.iter().map(|s| s.deps.len()).collect();
    let mut queue: Vec<usize> = (0..steps.len()).filter(|&i| indegree[i] == 0).collect();
    let mut ordered = 0;
    while let Some(i) = queue.pop() {
        ordered += 1;
        for &d in &steps[i].dependents {
            indegree[d] -= 1;
            if indegree[d] == 0 {
                queue.push(d);
            }
        }
    }
    if ordered < steps.len() {
        let on_cycle = (0..steps.len())
            .find(|&i| indegree[i] > 0 && reachable(steps, i, |s| &s.deps)[i])
            .or_else(|| (0..steps.len()).find(|&i| indegree[i] > 0))
            .unwrap_or(0);
        return Err(format!(
            "step `{}` is part of a dependency cycle",
            steps[on_cycle].name
        ));
    }

    let pivots: Vec<usize> = (0..steps.len())
        .filter(|&i| steps[i].kind == StepKind::Pivot)
        .collect();
    if pivots.len() > 1 {
        return Err(format!(
            "steps `{}` and `{}` are both pivots; a saga has at most one point of no return",
            steps[pivots[0]].name, steps[pivots[1]].name
        ));
    }
    for s in steps {
        if s.kind != StepKind::Compensatable && s.compensation.is_some() {
            let kind = if s.kind == StepKind::Pivot {
                "pivot"
            } else {
                "retriable"
            };
            return Err(format!(
                "step `{}` is {kind} and cannot have a compensation",
                s.name
            ));
        }
        let r = s.settings.retry;
        if r.max_failures == Some(0) {
            return Err(format!(
                "step `{}`: the failure threshold must be at least 1",
                s.name
            ));
        }
        if r.initial_backoff > r.max_backoff {
            return Err(format!(
                "step `{}`: the initial backoff exceeds the maximum backoff",
                s.name
            ));
        }
        let d = s.settings.deadline;
        if d.initial.is_zero() || d.cap < d.initial {
            return Err(format!(
                "step `{}`: the deadline must be positive and at most its cap",
                s.name
            ));
        }
    }
    for (i, s) in steps.iter().enumerate() {
        if s.kind != StepKind::Compensatable {
            continue;
        }
        let ancestors = reachable(steps, i, |s| &s.deps);
        if let Some(a) =
            (0..steps.len()).find(|&a| ancestors[a] && steps[a].kind != StepKind::Compensatable)
        {
            return Err(format!(
                "compensatable step `{}` depends on {} step `{}`; it could never be undone",
                s.name,
                if steps[a].kind == StepKind::Pivot {
                    "pivot"
                } else {
                    "retriable"
                },
                steps[a].name
            ));
        }
        if let (Some(&p), true) = (pivots.first(), s.compensation.is_some())
            && !reachable(steps, p, |s| &s.deps)[i]
        {
            return Err(format!(
                "compensatable step `{}` must run before pivot `{}` (make the pivot depend on it)",
                s.name, steps[p].name
            ));
        }
    }
    Ok(())
}
