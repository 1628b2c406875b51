//! Recurring schedules: a workflow started on the ticks of a cron expression in a time zone,
//! fired by the supervisor leader once per tick, and what happens to ticks missed while no
//! leader could fire them ([`MissedTicks`]).
//!
//! The expression is parsed and walked by `croner`: it reads the usual five fields and an
//! optional leading seconds field (`0 0 2 * * *` is 02:00:00 every day), the `L`, `W` and `#`
//! extensions, and computes occurrences on `jiff`'s zoned times — the calendar the engine
//! already uses for resources' time windows, with a zone's daylight saving rules — in either
//! direction, which is what catching up missed ticks needs. (`cron` and `saffron` compute on
//! `chrono`, a second calendar with its own zone database; `cronexpr` has no seconds.)

use std::fmt;

use croner::Cron;
use croner::parser::{CronParser, Seconds};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::Serialize;

use crate::{Error, Result};

/// The longest schedule name, in bytes.
pub const SCHEDULE_NAME_MAX: usize = 200;

/// The zone of a schedule that names none.
pub const SCHEDULE_ZONE_DEFAULT: &str = "UTC";

/// What the leader does with the ticks of a schedule that passed without being fired: the
/// engines were stopped, no instance led for a while, or the database was away.
///
/// A tick is fired late, when it is found due, whatever the policy, as long as it is the
/// only one due: a leader that wakes up half a second after a tick fires it. The policy
/// decides when several ticks are due at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissedTicks {
    /// Missed ticks are dropped: when more than one tick is due, none of them is fired and
    /// the schedule waits for its next tick to come. For work that only makes sense on time
    /// (a reminder at 09:00 is noise at 15:00).
    Skip,
    /// The missed ticks are fired as one: the latest due tick is fired once, the earlier ones
    /// are dropped. For work that catches up by itself (a report of everything since the
    /// last one). The default.
    #[default]
    FireOnce,
    /// Every missed tick is fired, one run each, up to the latest `max` of them (the older
    /// ones are dropped). For work done per period (a daily settlement that must exist for
    /// each day). `max` is at least 1.
    FireAll {
        /// How many of the latest due ticks are fired at most.
        max: u32,
    },
}

impl MissedTicks {
    /// How the policy is stored (`skip`, `fire_once`, `fire_all:<max>`).
    pub fn as_stored(&self) -> String {
        match self {
            Self::Skip => "skip".into(),
            Self::FireOnce => "fire_once".into(),
            Self::FireAll { max } => format!("fire_all:{max}"),
        }
    }

    /// The policy stored as `s` (see [`MissedTicks::as_stored`]); `None` for anything else.
    pub fn from_stored(s: &str) -> Option<Self> {
        match s {
            "skip" => Some(Self::Skip),
            "fire_once" => Some(Self::FireOnce),
            _ => s
                .strip_prefix("fire_all:")
                .and_then(|m| m.parse().ok())
                .filter(|&max| max >= 1)
                .map(|max| Self::FireAll { max }),
        }
    }
}

impl fmt::Display for MissedTicks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_stored())
    }
}

/// A cron expression in a time zone, parsed: what computes a schedule's ticks.
#[derive(Clone)]
pub struct CronSpec {
    expression: String,
    cron: Cron,
    zone_name: String,
    zone: TimeZone,
}

impl fmt::Debug for CronSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CronSpec")
            .field("expression", &self.expression)
            .field("zone", &self.zone_name)
            .finish()
    }
}

impl CronSpec {
    /// Parses `expression` (five fields, or six with leading seconds) in the IANA time zone
    /// `zone`.
    ///
    /// # Errors
    /// The reason, naming the expression or the zone.
    pub fn parse(expression: &str, zone: &str) -> std::result::Result<Self, String> {
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(expression)
            .map_err(|e| format!("cron expression `{expression}`: {e}"))?;
        let tz = TimeZone::get(zone).map_err(|e| format!("time zone `{zone}`: {e}"))?;
        let spec = Self {
            expression: expression.to_owned(),
            cron,
            zone_name: zone.to_owned(),
            zone: tz,
        };
        // An expression that never matches (`0 0 30 2 *`) is refused now, not at its first
        // tick.
        spec.next_after(0)
            .map_err(|e| format!("cron expression `{expression}`: {e}"))?;
        Ok(spec)
    }

    /// The expression, as given.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The zone's name, as given.
    pub fn zone(&self) -> &str {
        &self.zone_name
    }

    /// The instant `ms` (epoch milliseconds) truncated to its second, in the zone.
    fn zoned(&self, ms: i64) -> std::result::Result<jiff::Zoned, String> {
        Timestamp::from_second(ms.div_euclid(1000))
            .map(|t| t.to_zoned(self.zone.clone()))
            .map_err(|e| e.to_string())
    }

    /// The first tick strictly after `ms` (epoch milliseconds).
    ///
    /// # Errors
    /// A moment out of the calendar's range, or an expression that never matches again.
    pub fn next_after(&self, ms: i64) -> std::result::Result<i64, String> {
        let from = self.zoned(ms)?;
        self.cron
            .find_next_occurrence(&from, false)
            .map(|z| z.timestamp().as_millisecond())
            .map_err(|e| e.to_string())
    }

    /// The latest tick at or before `ms` (epoch milliseconds).
    ///
    /// # Errors
    /// As [`CronSpec::next_after`].
    pub fn latest_at_or_before(&self, ms: i64) -> std::result::Result<i64, String> {
        let from = self.zoned(ms)?;
        self.cron
            .find_previous_occurrence(&from, true)
            .map(|z| z.timestamp().as_millisecond())
            .map_err(|e| e.to_string())
    }

    /// What to fire for a schedule whose next tick `due` (epoch milliseconds, a tick of this
    /// expression) is at or before `now` under `policy`: the ticks to fire, oldest first, and
    /// the next tick after `now`.
    ///
    /// # Errors
    /// As [`CronSpec::next_after`].
    pub fn catch_up(
        &self,
        due: i64,
        now: i64,
        policy: MissedTicks,
    ) -> std::result::Result<CatchUp, String> {
        let next = self.next_after(now)?;
        if due > now {
            return Ok(CatchUp { fire: vec![], next });
        }
        let latest = self.latest_at_or_before(now)?.max(due);
        let fire = match policy {
            _ if latest == due => vec![due],
            MissedTicks::Skip => vec![],
            MissedTicks::FireOnce => vec![latest],
            MissedTicks::FireAll { max } => {
                let mut ticks = vec![latest];
                while ticks.len() < max as usize {
                    let Some(&oldest) = ticks.last() else { break };
                    let before = self.latest_at_or_before(oldest - 1000)?;
                    if before < due || before >= oldest {
                        break;
                    }
                    ticks.push(before);
                }
                ticks.reverse();
                ticks
            }
        };
        Ok(CatchUp { fire, next })
    }
}

/// What a due schedule fires (see [`CronSpec::catch_up`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatchUp {
    /// The ticks to fire, oldest first (epoch milliseconds).
    pub fire: Vec<i64>,
    /// The schedule's next tick after now.
    pub next: i64,
}

/// The business key of the run a schedule starts for a tick: `schedule:<name>:<tick>`, the
/// tick in RFC 3339 (UTC). Firing a tick twice finds the run the first firing started.
pub fn tick_key(name: &str, tick_ms: i64) -> String {
    let tick = Timestamp::from_millisecond(tick_ms)
        .map_or_else(|_| tick_ms.to_string(), |t| t.to_string());
    format!("schedule:{name}:{tick}")
}

/// A schedule as stored: what the code declared, its next tick, its last firing, and an
/// operator's pause.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleView {
    /// Its name.
    pub name: String,
    /// The workflow each tick starts.
    pub workflow: String,
    /// Its cron expression.
    pub expression: String,
    /// The IANA time zone the expression reads in.
    pub zone: String,
    /// The input of its runs.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input: serde_json::Value,
    /// What happens to missed ticks.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "fire_once"))]
    #[serde(with = "missed_text")]
    pub missed: MissedTicks,
    /// Its next tick (on the database's clock). A paused schedule keeps the tick it had; it
    /// is due at its first tick after it is resumed.
    #[cfg_attr(feature = "openapi", schema(value_type = chrono::DateTime<chrono::Utc>))]
    pub next_tick_at: crate::clock::Timestamp,
    /// The last tick it fired.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<chrono::DateTime<chrono::Utc>>))]
    pub last_fired_at: Option<crate::clock::Timestamp>,
    /// The run its last firing started.
    pub last_run_id: Option<uuid::Uuid>,
    /// Whether an operator paused it.
    pub paused: bool,
    /// Who paused it (`cli:alice`, `api:ops`).
    pub paused_by: Option<String>,
    /// Why.
    pub paused_reason: Option<String>,
    /// When its row last changed.
    #[cfg_attr(feature = "openapi", schema(value_type = chrono::DateTime<chrono::Utc>))]
    pub updated_at: crate::clock::Timestamp,
}

/// [`MissedTicks`] as its stored text in JSON.
mod missed_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::MissedTicks;

    pub(super) fn serialize<S: Serializer>(m: &MissedTicks, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&m.as_stored())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<MissedTicks, D::Error> {
        let text = String::deserialize(d)?;
        MissedTicks::from_stored(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("missed-tick policy `{text}`")))
    }
}

/// A recurring start of a workflow, declared in code and registered with the engine's
/// builder (`EngineBuilder::with_schedule`).
///
/// ```
/// use sagaflow_engine::cron::{MissedTicks, Schedule};
///
/// let nightly = Schedule::cron("nightly-report", "0 0 2 * * *")?
///     .workflow("report")
///     .time_zone("Europe/Moscow")?
///     .input(&serde_json::json!({ "kind": "daily" }))?
///     .missed(MissedTicks::FireOnce);
/// assert_eq!(nightly.zone(), "Europe/Moscow");
/// # Ok::<(), sagaflow_engine::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Schedule {
    name: String,
    workflow: String,
    spec: CronSpec,
    input: serde_json::Value,
    missed: MissedTicks,
}

impl Schedule {
    /// A schedule named `name` (unique in the fleet) on the ticks of the cron `expression`:
    /// five fields (`minute hour day-of-month month day-of-week`) or six with seconds first.
    /// It starts the workflow of its name until [`Schedule::workflow`] says otherwise, with
    /// the input `null`, in UTC, missed ticks fired once.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] for an empty or too long name or an expression that does not
    /// parse or never matches, naming the problem.
    pub fn cron(name: impl Into<String>, expression: &str) -> Result<Self> {
        let name = name.into();
        let invalid = |reason: String| Error::InvalidSchedule {
            name: name.clone(),
            reason,
        };
        if name.trim().is_empty() || name.len() > SCHEDULE_NAME_MAX {
            return Err(invalid(format!(
                "the name must be 1 to {SCHEDULE_NAME_MAX} bytes"
            )));
        }
        let spec = CronSpec::parse(expression, SCHEDULE_ZONE_DEFAULT).map_err(invalid)?;
        Ok(Self {
            workflow: name.clone(),
            name,
            spec,
            input: serde_json::Value::Null,
            missed: MissedTicks::default(),
        })
    }

    /// The workflow each tick starts (its newest version). The engine checks that it knows
    /// it when it starts.
    #[must_use]
    pub fn workflow(mut self, workflow: impl Into<String>) -> Self {
        self.workflow = workflow.into();
        self
    }

    /// The input of every run it starts.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] when `input` does not serialise to JSON.
    pub fn input<T: Serialize>(mut self, input: &T) -> Result<Self> {
        self.input = serde_json::to_value(input).map_err(|e| Error::InvalidSchedule {
            name: self.name.clone(),
            reason: format!("the input does not serialise: {e}"),
        })?;
        Ok(self)
    }

    /// The IANA time zone the expression reads in (`Europe/Moscow`; default `UTC`), with its
    /// daylight saving rules: a tick in a skipped hour fires once the hour is over, a tick in
    /// a repeated hour fires once.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] for an unknown zone.
    pub fn time_zone(mut self, zone: &str) -> Result<Self> {
        self.spec = CronSpec::parse(&self.spec.expression, zone).map_err(|reason| {
            Error::InvalidSchedule {
                name: self.name.clone(),
                reason,
            }
        })?;
        Ok(self)
    }

    /// What happens to ticks missed while no leader fired them (default
    /// [`MissedTicks::FireOnce`]).
    #[must_use]
    pub fn missed(mut self, policy: MissedTicks) -> Self {
        self.missed = policy;
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The workflow it starts.
    pub fn workflow_name(&self) -> &str {
        &self.workflow
    }

    /// Its cron expression.
    pub fn expression(&self) -> &str {
        self.spec.expression()
    }

    /// Its time zone.
    pub fn zone(&self) -> &str {
        self.spec.zone()
    }

    /// The input of its runs.
    pub fn input_value(&self) -> &serde_json::Value {
        &self.input
    }

    /// Its missed-tick policy.
    pub fn missed_policy(&self) -> MissedTicks {
        self.missed
    }

    /// The parsed expression and zone.
    pub fn spec(&self) -> &CronSpec {
        &self.spec
    }

    /// Checks what the builder could not: a [`MissedTicks::FireAll`] of at least one tick.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`].
    pub fn check(&self) -> Result<()> {
        if self.missed == (MissedTicks::FireAll { max: 0 }) {
            return Err(Error::InvalidSchedule {
                name: self.name.clone(),
                reason: "MissedTicks::FireAll needs a max of at least 1".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: i64 = 60_000;

    #[test]
    fn an_expression_reads_with_or_without_seconds_in_its_zone() {
        let daily = CronSpec::parse("0 0 2 * * *", "Europe/Moscow").expect("parses");
        // 2026-11-24T00:00:00Z is 03:00 in Moscow: the next 02:00 there is 23:00Z.
        let t0 = 1_795_478_400_000;
        assert_eq!(daily.next_after(t0), Ok(t0 + 23 * 60 * MINUTE));
        let minutely = CronSpec::parse("* * * * *", "UTC").expect("parses");
        assert_eq!(minutely.next_after(t0), Ok(t0 + MINUTE));
        assert_eq!(minutely.next_after(t0 + 500), Ok(t0 + MINUTE));
        assert_eq!(minutely.latest_at_or_before(t0 + 500), Ok(t0));
    }

    #[test]
    fn bad_expressions_and_zones_are_named() {
        let e = CronSpec::parse("61 * * * *", "UTC").expect_err("minute 61");
        assert!(e.contains("61 * * * *"), "{e}");
        let e = CronSpec::parse("* * * * *", "Mars/Olympus").expect_err("zone");
        assert!(e.contains("Mars/Olympus"), "{e}");
        let e = Schedule::cron("", "* * * * *").expect_err("empty name");
        assert!(matches!(e, Error::InvalidSchedule { .. }));
        let e = Schedule::cron("s", "0 0 2 * * *")
            .and_then(|s| s.time_zone("Nowhere/City"))
            .expect_err("zone");
        assert!(e.to_string().contains("Nowhere/City"), "{e}");
    }

    #[test]
    fn missed_ticks_follow_the_policy() {
        let spec = CronSpec::parse("* * * * *", "UTC").expect("parses");
        let due = 1_795_478_400_000;
        let now = due + 10 * MINUTE + 30_000;
        let next = due + 11 * MINUTE;
        let on_time = spec.catch_up(due, due + 400, MissedTicks::Skip);
        assert_eq!(
            on_time,
            Ok(CatchUp {
                fire: vec![due],
                next: due + MINUTE
            })
        );
        let skip = spec.catch_up(due, now, MissedTicks::Skip);
        assert_eq!(skip, Ok(CatchUp { fire: vec![], next }));
        let once = spec.catch_up(due, now, MissedTicks::FireOnce);
        assert_eq!(
            once,
            Ok(CatchUp {
                fire: vec![due + 10 * MINUTE],
                next
            })
        );
        let all = spec.catch_up(due, now, MissedTicks::FireAll { max: 3 });
        let last3 = vec![due + 8 * MINUTE, due + 9 * MINUTE, due + 10 * MINUTE];
        assert_eq!(all, Ok(CatchUp { fire: last3, next }));
        let few = spec.catch_up(due, due + 2 * MINUTE, MissedTicks::FireAll { max: 10 });
        let three = vec![due, due + MINUTE, due + 2 * MINUTE];
        assert_eq!(few.map(|c| c.fire), Ok(three));
        assert_eq!(
            spec.catch_up(due, due - 1, MissedTicks::FireOnce)
                .map(|c| c.fire),
            Ok(vec![])
        );
    }

    #[test]
    fn policies_are_stored_and_read_back() {
        for p in [
            MissedTicks::Skip,
            MissedTicks::FireOnce,
            MissedTicks::FireAll { max: 7 },
        ] {
            assert_eq!(MissedTicks::from_stored(&p.as_stored()), Some(p));
        }
        assert_eq!(MissedTicks::from_stored("fire_all:0"), None);
        assert_eq!(MissedTicks::from_stored("often"), None);
        assert_eq!(
            tick_key("nightly", 1_795_478_400_000),
            "schedule:nightly:2026-11-24T00:00:00Z"
        );
    }
}
