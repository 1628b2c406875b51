//! `sagaflow resources`: the remote resources' limits and load, and the operator's override
//! of their limits (`set`, `reset`), stored with the resource as set by `cli:<operator>`.

use std::time::Duration;

use clap::{ArgGroup, Args, Subcommand};
use sagaflow::{
    CompensationShare, Engine, Rate, ResourceLimits, ResourceView, describe_limits, describe_state,
};
use serde::Serialize;

use crate::exit::{Failure, Outcome};
use crate::output::{self, printable};

/// What `sagaflow resources` does (`list` without a subcommand).
#[derive(Debug, Subcommand)]
pub(crate) enum ResourcesCommand {
    /// Lists the resources the engines declared: limits in force, override, load.
    List,
    /// Overrides a resource's limits for every instance, until `reset`.
    #[command(after_help = "\
The limits in force are the starting point: only the limits given change, the others stay as \
they are (`none` removes one). `--limits` gives them all at once instead, as the HTTP API's \
ResourceLimits JSON (a limit left out is unlimited).

Examples:
  sagaflow resources set payments-api --max-in-flight 4 --reason \"provider asks us to slow down\"
  sagaflow resources set payments-api --rate 100/min --burst 10 --reason \"new contract\"
  sagaflow resources set partner --rate none --reason \"rate lifted\"
  sagaflow resources set payments-api --compensation-in-flight 2 --compensation-rate 5 \\
      --reason \"keep room for the refunds of incident 7\"
  sagaflow resources set partner --limits '{\"max_in_flight\": 2}' --reason \"incident 7\"")]
    Set(Box<SetArgs>),
    /// Clears a resource's override: the limits its code declares apply again.
    Reset {
        /// The resource's name (the first column of `sagaflow resources`).
        name: String,
        #[command(flatten)]
        who: Who,
    },
}

/// Why, and who.
#[derive(Debug, Args)]
pub(crate) struct Who {
    /// Why, in your words (stored with the override; 1 to 2,000 characters).
    #[arg(long, value_name = "TEXT")]
    reason: String,
    /// Who acts, as recorded (`cli:NAME`); default: SAGAFLOW_OPERATOR, else the OS user.
    #[arg(long = "as", value_name = "NAME", env = crate::act::OPERATOR_ENV)]
    operator: Option<String>,
}

/// The arguments of `resources set`: at least one change.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("change").required(true).multiple(true)))]
pub(crate) struct SetArgs {
    /// The resource's name (the first column of `sagaflow resources`).
    name: String,
    /// Attempts in flight at most, across every instance (`none`: unlimited).
    #[arg(long, value_name = "N", group = "change", value_parser = parse_count)]
    max_in_flight: Option<Count>,
    /// Attempts in flight at most per flow key (`none`: unlimited).
    #[arg(long, value_name = "N", group = "change", value_parser = parse_count)]
    per_key: Option<Count>,
    /// Attempts started at most per period: `20/s`, `100/min`, `5/250ms`, `10/30s`
    /// (`none`: unlimited). Keeps the burst in force (1 without one).
    #[arg(long, value_name = "N/PERIOD", group = "change", value_parser = parse_rate)]
    rate: Option<RateArg>,
    /// Attempts that may start at once after a quiet spell (with a rate).
    #[arg(long, value_name = "N", group = "change", value_parser = clap::value_parser!(u32).range(1..))]
    burst: Option<u32>,
    /// Of --max-in-flight, the attempts in flight kept for compensations: forward attempts
    /// hold at most the rest, compensations at most this many (`none`: shared).
    #[arg(long, value_name = "N", group = "change", value_parser = parse_count)]
    compensation_in_flight: Option<Count>,
    /// Of the rate's attempts per period, those kept for compensations, on a limiter of their
    /// own (`none`: shared).
    #[arg(long, value_name = "N", group = "change", value_parser = parse_count)]
    compensation_rate: Option<Count>,
    /// Every limit at once, as ResourceLimits JSON: `{"max_in_flight": 8,
    /// "max_in_flight_per_key": 2, "rate": {"limit": 20, "period_ms": 1000, "burst": 1}}`.
    #[arg(
        long,
        value_name = "JSON",
        group = "change",
        conflicts_with_all = [
            "max_in_flight", "per_key", "rate", "burst", "compensation_in_flight", "compensation_rate",
        ],
        value_parser = parse_limits,
    )]
    limits: Option<ResourceLimits>,
    #[command(flatten)]
    who: Who,
}

/// A concurrency limit, or none.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Count(Option<u32>);

/// A rate without its burst (`limit`, `period_ms`), or none.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RateArg(Option<(u32, u64)>);

fn is_none(s: &str) -> bool {
    matches!(s.trim(), "none" | "unlimited")
}

fn parse_count(s: &str) -> Result<Count, String> {
    if is_none(s) {
        return Ok(Count(None));
    }
    match s.trim().parse::<u32>() {
        Ok(n) if n >= 1 => Ok(Count(Some(n))),
        _ => Err("expected a whole number of at least 1, or `none`".into()),
    }
}

/// `N/PERIOD`: `20/s`, `100/min`, `5/250ms`, `10/30s`, `1000/h`; a period up to a day.
fn parse_rate(s: &str) -> Result<RateArg, String> {
    const SHAPE: &str = "expected N/PERIOD such as 20/s, 100/min, 5/250ms or 10/30s, or `none`";
    if is_none(s) {
        return Ok(RateArg(None));
    }
    let (limit, period) = s.trim().split_once('/').ok_or(SHAPE)?;
    let limit = match limit.trim().parse::<u32>() {
        Ok(n) if n >= 1 => n,
        _ => return Err(format!("{SHAPE}: N is a whole number of at least 1")),
    };
    let period = period.trim();
    // A unit alone is one of it: `s` is `1s`.
    let period = if period.starts_with(|c: char| c.is_ascii_digit()) {
        period.to_owned()
    } else {
        format!("1{period}")
    };
    let period = humantime::parse_duration(&period).map_err(|e| format!("{SHAPE}: {e}"))?;
    let ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 || period > Duration::from_secs(86_400) || period.subsec_micros() % 1000 != 0 {
        return Err(format!(
            "{SHAPE}: the period is whole milliseconds, from 1 ms to a day"
        ));
    }
    Ok(RateArg(Some((limit, ms))))
}

fn parse_limits(s: &str) -> Result<ResourceLimits, String> {
    serde_json::from_str(s).map_err(|e| format!("not ResourceLimits JSON: {e}"))
}

/// `resources --json`: the answer of `GET /api/v1/resources`.
#[derive(Debug, Serialize)]
struct ResourcesAnswer {
    resources: Vec<ResourceView>,
}

/// `resources set --json` and `resources reset --json`: the answer of `PUT` and `DELETE
/// /api/v1/resources/{name}/limits`.
#[derive(Debug, Serialize)]
struct LimitsAnswer {
    resource: ResourceView,
    actor: String,
    reason: String,
}

pub(crate) async fn resources(
    engine: &Engine,
    command: Option<ResourcesCommand>,
    json: bool,
) -> Outcome {
    match command.unwrap_or(ResourcesCommand::List) {
        ResourcesCommand::List => list(engine, json).await,
        ResourcesCommand::Set(args) => set(engine, *args, json).await,
        ResourcesCommand::Reset { name, who } => reset(engine, &name, &who, json).await,
    }
}

async fn list(engine: &Engine, json: bool) -> Outcome {
    let resources = engine.resources().await?;
    if json {
        return output::json(&ResourcesAnswer { resources });
    }
    if resources.is_empty() {
        output::line("no resources: no engine of this database declared one");
        return Ok(());
    }
    let mut t = output::table(&[
        "RESOURCE",
        "IN FLIGHT",
        "WAITING",
        "LIMITS",
        "STATE",
        "OVERRIDE BY",
        "REASON",
        "CODE'S LIMITS",
    ]);
    for r in &resources {
        t.add_row([
            r.name.clone(),
            with_compensations(r.in_flight, r.compensations_in_flight),
            with_compensations(r.waiting, r.compensations_waiting),
            describe_limits(&r.limits),
            describe_state(r),
            printable(r.override_by.as_deref()),
            printable(r.override_reason.as_deref()),
            describe_limits(&r.defaults),
        ]);
    }
    output::print_table(&t);
    Ok(())
}

/// A count with the compensations among it, when there are any: `5`, `5 (2 undoing)`.
fn with_compensations(all: i64, compensations: i64) -> String {
    if compensations > 0 {
        format!("{all} ({compensations} undoing)")
    } else {
        all.to_string()
    }
}

/// The resource named, or exit 3 naming those there are.
async fn find(engine: &Engine, name: &str) -> Result<ResourceView, Failure> {
    let all = engine.resources().await?;
    let names: Vec<String> = all.iter().map(|r| r.name.clone()).collect();
    all.into_iter().find(|r| r.name == name).ok_or_else(|| {
        Failure::not_found(if names.is_empty() {
            format!("no resource `{name}`: no engine of this database declared one")
        } else {
            format!(
                "no resource `{name}`; the resources are {}",
                names.join(", ")
            )
        })
    })
}

/// The limits `args` ask for: the limits in force with the changes given, or those of
/// `--limits`.
fn changed(current: ResourceLimits, args: &SetArgs) -> Result<ResourceLimits, Failure> {
    if let Some(all) = &args.limits {
        return Ok(all.clone());
    }
    let mut limits = current;
    if let Some(Count(n)) = args.max_in_flight {
        limits.max_in_flight = n;
    }
    if let Some(Count(n)) = args.per_key {
        limits.max_in_flight_per_key = n;
    }
    if let Some(RateArg(rate)) = args.rate {
        let burst = limits.rate.as_ref().map_or(1, |r| r.burst);
        limits.rate = rate.map(|(limit, period_ms)| Rate {
            limit,
            period_ms,
            burst,
        });
    }
    if let Some(burst) = args.burst {
        match limits.rate.as_mut() {
            Some(rate) => rate.burst = burst,
            None => {
                return Err(Failure::usage(
                    "--burst applies to a rate, and none is in force: give --rate too",
                ));
            }
        }
    }
    if args.compensation_in_flight.is_some() || args.compensation_rate.is_some() {
        let mut share = limits.compensation_share.unwrap_or_default();
        if let Some(Count(n)) = args.compensation_in_flight {
            share.in_flight = n.unwrap_or(0);
        }
        if let Some(Count(n)) = args.compensation_rate {
            share.rate = n.unwrap_or(0);
        }
        limits.compensation_share = (share != CompensationShare::default()).then_some(share);
    }
    Ok(limits)
}

async fn set(engine: &Engine, args: SetArgs, json: bool) -> Outcome {
    let name = args.name.clone();
    let (op, actor, reason) =
        crate::act::on_behalf(engine, &args.who.reason, args.who.operator.as_deref())?;
    let before = find(engine, &name).await?;
    let was = describe_limits(&before.limits);
    let limits = changed(before.limits, &args)?;
    limits
        .check()
        .map_err(|e| Failure::usage(format!("resource `{name}`: {e}")))?;
    if !op.set_resource_limits(&name, Some(limits)).await? {
        return Err(Failure::not_found(format!("no resource `{name}`")));
    }
    let resource = find(engine, &name).await?;
    let line = format!(
        "resource {name}: limits now {} (were {was}); override set by {actor}",
        describe_limits(&resource.limits)
    );
    report(json, resource, actor, reason, line)
}

/// What a change answers: the resource as it is now, as JSON or in a line.
fn report(
    json: bool,
    resource: ResourceView,
    actor: String,
    reason: String,
    line: String,
) -> Outcome {
    if json {
        return output::json(&LimitsAnswer {
            resource,
            actor,
            reason,
        });
    }
    output::line(line);
    Ok(())
}

async fn reset(engine: &Engine, name: &str, who: &Who, json: bool) -> Outcome {
    let (op, actor, reason) = crate::act::on_behalf(engine, &who.reason, who.operator.as_deref())?;
    find(engine, name).await?;
    if !op.set_resource_limits(name, None).await? {
        return Err(Failure::not_found(format!("no resource `{name}`")));
    }
    let resource = find(engine, name).await?;
    let line = format!(
        "resource {name}: override cleared by {actor}; the code's limits apply: {}",
        describe_limits(&resource.limits)
    );
    report(json, resource, actor, reason, line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_people_write_them() {
        let ok = |s: &str| {
            parse_rate(s)
                .map(|r| r.0)
                .unwrap_or_else(|e| panic!("{s}: {e}"))
        };
        assert_eq!(ok("20/s"), Some((20, 1_000)));
        assert_eq!(ok("100/min"), Some((100, 60_000)));
        assert_eq!(ok("5/250ms"), Some((5, 250)));
        assert_eq!(ok("10/30s"), Some((10, 30_000)));
        assert_eq!(ok("1000/h"), Some((1000, 3_600_000)));
        assert_eq!(ok("100/d"), Some((100, 86_400_000)));
        assert_eq!(ok("none"), None);
        for bad in [
            "20",
            "0/s",
            "x/s",
            "20/",
            "20/2d",
            "20/0s",
            "20/fortnight",
            "20/1us",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_described_rate_reads_back() {
        for (limit, period_ms) in [(20, 1_000), (100, 60_000), (5, 250), (10, 30_000)] {
            let limits = ResourceLimits {
                rate: Some(Rate {
                    limit,
                    period_ms,
                    burst: 1,
                }),
                ..ResourceLimits::default()
            };
            let text = describe_limits(&limits);
            let rate = text.split(' ').next().unwrap_or_default();
            assert_eq!(
                parse_rate(rate).map(|r| r.0),
                Ok(Some((limit, period_ms))),
                "{text}"
            );
        }
    }

    #[test]
    fn counts_are_at_least_one_or_none() {
        assert_eq!(parse_count("8").map(|c| c.0), Ok(Some(8)));
        assert_eq!(parse_count("none").map(|c| c.0), Ok(None));
        assert!(parse_count("0").is_err());
        assert!(parse_count("-1").is_err());
    }
}
