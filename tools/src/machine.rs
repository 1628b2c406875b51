//! What machine a measurement ran on (benchmarks and chaos runs print it with their figures).

/// `"<cores> cores (<CPU model>), <memory> GiB RAM"`, read from `/proc`; unknown parts are
/// shown as such rather than failing.
pub fn describe() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or_else(
            || "? GiB".into(),
            |kb| format!("{:.0} GiB", kb / 1024.0 / 1024.0),
        );
    format!("{cores} cores ({cpu}), {mem} RAM")
}
