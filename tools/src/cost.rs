//! The cost model for many nodes (issue 32): from the CPU one saga costs in the engine and in
//! PostgreSQL, how many sagas a second one PostgreSQL server of `k` cores carries and how
//! many engine nodes that rate needs; and Jain's index of how evenly several hosts shared
//! the work. Pure arithmetic, so that the benchmark's printed projection can be checked by
//! hand and by the tests below.

/// The PostgreSQL server sizes the benchmark projects to (cores).
pub const SERVER_CORES: [u32; 4] = [2, 8, 32, 96];

/// The cores of one engine node in the projection.
pub const NODE_CORES: u32 = 4;

/// The share of a machine's cores the projection lets the work use: headroom for bursts,
/// autovacuum, checkpoints and the operating system.
pub const UTILISATION: f64 = 0.7;

/// What one PostgreSQL server of a given size carries, and the engine nodes that rate needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Projection {
    /// The server's cores.
    pub server_cores: u32,
    /// Sagas a second the server's CPU carries at the assumed utilisation.
    pub sagas_per_s: f64,
    /// Engine nodes of [`Projection::node_cores`] cores needed for that rate, at the same
    /// utilisation (rounded up).
    pub engine_nodes: u64,
    /// Cores of one engine node.
    pub node_cores: u32,
}

/// The projection for a server of `server_cores` cores, when one saga costs `server_ms` CPU
/// milliseconds in PostgreSQL and `engine_ms` in the engine, both machines' cores used to
/// `utilisation` (0 < u ≤ 1). It assumes the CPU is what runs out first: WAL bandwidth, the
/// latency of `fsync`, lock waits and the network are not in it.
///
/// `None` when a cost is not a positive finite number, a core count is zero, or the
/// utilisation is outside (0, 1].
pub fn project(
    server_ms: f64,
    engine_ms: f64,
    server_cores: u32,
    node_cores: u32,
    utilisation: f64,
) -> Option<Projection> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(server_ms)
        || !positive(engine_ms)
        || server_cores == 0
        || node_cores == 0
        || !(positive(utilisation) && utilisation <= 1.0)
    {
        return None;
    }
    let sagas_per_s = f64::from(server_cores) * utilisation * 1000.0 / server_ms;
    let engine_cores = sagas_per_s * engine_ms / 1000.0;
    let nodes = (engine_cores / (f64::from(node_cores) * utilisation)).ceil();
    Some(Projection {
        server_cores,
        sagas_per_s,
        // A positive finite value (server_cores × engine_ms / server_ms / node_cores at most).
        engine_nodes: nodes.max(1.0) as u64,
        node_cores,
    })
}

/// Sagas a second a machine of `cores` cores carries when the engine and PostgreSQL share
/// it and CPU is the only limit: every core fully used, each saga costing `server_ms` +
/// `engine_ms` CPU milliseconds. The benchmark sets it beside the rate it measured, as a check
/// of the model on the machine it ran on. `None` for no cores or a cost that is not a
/// positive finite number.
pub fn shared_machine(cores: u32, server_ms: f64, engine_ms: f64) -> Option<f64> {
    let per_saga = server_ms + engine_ms;
    (cores > 0 && server_ms >= 0.0 && engine_ms >= 0.0 && per_saga.is_finite() && per_saga > 0.0)
        .then(|| f64::from(cores) * 1000.0 / per_saga)
}

/// Jain's fairness index of the shares `x`: (Σx)² / (n·Σx²), 1 when all are equal, 1/n when
/// one took everything. `None` for no shares, a negative or non-finite one, or all zero.
pub fn jain(x: &[f64]) -> Option<f64> {
    if x.is_empty() || x.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return None;
    }
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    if squares == 0.0 {
        return None;
    }
    Some(sum * sum / (x.len() as f64 * squares))
}

#[cfg(test)]
mod tests {
    use super::{jain, project, shared_machine};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn the_projection_scales_with_the_server_and_sizes_the_nodes() {
        // 0.5 ms of PostgreSQL CPU per saga: 2,000 sagas/s per core, 70% of 8 cores = 11,200.
        let p = project(0.5, 1.0, 8, 4, 0.7).unwrap_or_else(|| unreachable!());
        assert!(close(p.sagas_per_s, 11_200.0), "{}", p.sagas_per_s);
        // 11,200 sagas/s × 1 ms = 11.2 cores of engine; 2.8 usable cores a node → 4 nodes.
        assert_eq!(p.engine_nodes, 4);
        let p = project(0.5, 1.0, 96, 4, 0.7).unwrap_or_else(|| unreachable!());
        assert!(close(p.sagas_per_s, 134_400.0));
        assert_eq!(p.engine_nodes, 48);
        // A rate one node covers still needs that one node.
        let p = project(10.0, 0.01, 2, 4, 0.7).unwrap_or_else(|| unreachable!());
        assert_eq!(p.engine_nodes, 1);
    }

    #[test]
    fn the_projection_refuses_what_it_cannot_compute() {
        assert!(project(0.0, 1.0, 8, 4, 0.7).is_none());
        assert!(project(0.5, f64::NAN, 8, 4, 0.7).is_none());
        assert!(project(0.5, 1.0, 0, 4, 0.7).is_none());
        assert!(project(0.5, 1.0, 8, 0, 0.7).is_none());
        assert!(project(0.5, 1.0, 8, 4, 1.5).is_none());
        assert!(project(0.5, 1.0, 8, 4, 0.0).is_none());
    }

    #[test]
    fn a_shared_machine_carries_its_cores_over_the_sum_of_both_costs() {
        let r = shared_machine(2, 0.34, 0.16).unwrap_or_else(|| unreachable!());
        assert!(close(r, 4_000.0), "{r}");
        assert_eq!(shared_machine(0, 0.34, 0.16), None);
        assert_eq!(shared_machine(2, 0.0, 0.0), None);
        assert_eq!(shared_machine(2, f64::INFINITY, 0.16), None);
    }

    #[test]
    fn jains_index_is_one_for_equal_shares_and_one_over_n_for_a_single_taker() {
        assert_eq!(jain(&[5.0, 5.0, 5.0, 5.0]), Some(1.0));
        assert_eq!(jain(&[7.0, 0.0, 0.0, 0.0]), Some(0.25));
        let j = jain(&[3.0, 1.0]).unwrap_or_else(|| unreachable!());
        assert!(close(j, 16.0 / 20.0));
        assert_eq!(jain(&[]), None);
        assert_eq!(jain(&[0.0, 0.0]), None);
        assert_eq!(jain(&[1.0, -1.0]), None);
    }
}
