//! Time windows: when a resource may be called, as days of the week and a time of day in a
//! named time zone (`MON-FRI 00:00-06:00` in `Europe/Moscow`).

use std::fmt;
use std::str::FromStr;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize};

const DAYS: [&str; 7] = ["MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"];
const ALL_DAYS: u8 = 0b111_1111;

/// The windows in which a resource's steps may be called; outside all of them they wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Windows {
    /// The IANA time zone the times are in (`Europe/Moscow`, `UTC`).
    pub time_zone: String,
    /// The windows, each `DAYS HH:MM-HH:MM` (`MON-FRI 00:00-06:00`, `SAT,SUN 00:00-24:00`).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>, example = json!(["MON-FRI 00:00-06:00"])))]
    pub open: Vec<Window>,
}

/// Whether a moment lies in a window, and if not, how long until one opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowGate {
    /// Inside a window.
    Open,
    /// Outside every window; the next opens in this many milliseconds.
    ClosedFor(i64),
}

impl Windows {
    /// Checks the time zone and that there is a window.
    ///
    /// # Errors
    /// The reason.
    pub fn check(&self) -> Result<(), String> {
        if self.open.is_empty() {
            return Err("time windows need at least one window".into());
        }
        TimeZone::get(&self.time_zone)
            .map(|_| ())
            .map_err(|e| format!("time zone `{}`: {e}", self.time_zone))
    }

    /// Whether `now_ms` (epoch milliseconds) lies in a window, and if not, when the next one
    /// opens.
    ///
    /// # Errors
    /// An unknown time zone, or a moment out of the calendar's range.
    pub fn gate(&self, now_ms: i64) -> Result<WindowGate, String> {
        let tz = TimeZone::get(&self.time_zone)
            .map_err(|e| format!("time zone `{}`: {e}", self.time_zone))?;
        let now = Timestamp::from_millisecond(now_ms)
            .map_err(|e| e.to_string())?
            .to_zoned(tz.clone());
        let today = now.date();
        // Each window's occurrences from yesterday (one past midnight may still hold) to a
        // week ahead, as instants: the one holding now, else the earliest start after now.
        let mut next: Option<i64> = None;
        for ahead in -1..=7_i64 {
            let date = today
                .checked_add(jiff::Span::new().days(ahead))
                .map_err(|e| e.to_string())?;
            let wd = date.weekday().to_monday_zero_offset();
            for w in self.open.iter().filter(|w| w.days & (1 << wd) != 0) {
                let start = instant(&tz, date, w.start)?;
                let end_date = if w.end <= w.start || w.end == 24 * 60 {
                    date.tomorrow().map_err(|e| e.to_string())?
                } else {
                    date
                };
                let end = instant(&tz, end_date, w.end % (24 * 60))?;
                if start <= now_ms && now_ms < end {
                    return Ok(WindowGate::Open);
                }
                if start > now_ms && next.is_none_or(|n| start < n) {
                    next = Some(start);
                }
            }
        }
        Ok(WindowGate::ClosedFor(
            next.map_or(86_400_000, |n| n - now_ms).max(1),
        ))
    }
}

/// The instant of `minute` after midnight of `date` in `tz`. A wall time that a clock
/// change skips counts as that time plus the skipped span (`02:30` on a night the clocks go
/// from 02:00 to 03:00 is `03:30`); one it repeats counts as the first.
fn instant(tz: &TimeZone, date: jiff::civil::Date, minute: u16) -> Result<i64, String> {
    let at = date.at(
        i8::try_from(minute / 60).unwrap_or(0),
        i8::try_from(minute % 60).unwrap_or(0),
        0,
        0,
    );
    Ok(at
        .to_zoned(tz.clone())
        .map_err(|e| e.to_string())?
        .timestamp()
        .as_millisecond())
}

/// One window: days of the week and a time of day, `MON-FRI 00:00-06:00`. The start is
/// included and the end is not; `24:00` ends at midnight. An end before the start runs past
/// midnight into the next day (`FRI 22:00-02:00` is open until Saturday 02:00).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Window {
    /// Bit 0 Monday … bit 6 Sunday.
    days: u8,
    /// Minutes after midnight.
    start: u16,
    end: u16,
}

impl FromStr for Window {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            |why: &str| format!("time window `{s}`: {why} (write e.g. `MON-FRI 00:00-06:00`)");
        let (days, times) = s
            .trim()
            .split_once(' ')
            .ok_or_else(|| bad("days and times"))?;
        let mut mask = 0u8;
        for part in days.split(',') {
            mask |= match part.trim().to_ascii_uppercase().as_str() {
                "DAILY" | "*" => ALL_DAYS,
                p => match p.split_once('-') {
                    Some((a, b)) => {
                        let (a, b) = (
                            day_of(a).ok_or_else(|| bad("unknown day"))?,
                            day_of(b).ok_or_else(|| bad("unknown day"))?,
                        );
                        let mut m = 0u8;
                        let mut d = a;
                        loop {
                            m |= 1 << d;
                            if d == b {
                                break m;
                            }
                            d = (d + 1) % 7;
                        }
                    }
                    None => 1 << day_of(p).ok_or_else(|| bad("unknown day"))?,
                },
            };
        }
        let (from, to) = times
            .trim()
            .split_once('-')
            .ok_or_else(|| bad("a start and an end"))?;
        let (start, end) = (
            minute_of(from).ok_or_else(|| bad("a time is HH:MM"))?,
            minute_of(to).ok_or_else(|| bad("a time is HH:MM"))?,
        );
        if start == end || start == 24 * 60 {
            return Err(bad("the window is empty"));
        }
        Ok(Self {
            days: mask,
            start,
            end: if end == 24 * 60 && start > 0 {
                end
            } else {
                end % (24 * 60)
            },
        })
    }
}

fn day_of(s: &str) -> Option<u8> {
    let s = s.trim().to_ascii_uppercase();
    DAYS.iter()
        .position(|d| *d == s)
        .and_then(|i| u8::try_from(i).ok())
}

fn minute_of(s: &str) -> Option<u16> {
    let (h, m) = s.trim().split_once(':')?;
    let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
    (m < 60 && (h < 24 || (h == 24 && m == 0)) && h * 60 + m <= 24 * 60).then_some(h * 60 + m)
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        let on = |d: usize| self.days & (1 << d) != 0;
        if self.days == ALL_DAYS {
            parts.push("DAILY".into());
        } else {
            let mut d = 0;
            while d < 7 {
                if on(d) {
                    let first = d;
                    while d + 1 < 7 && on(d + 1) {
                        d += 1;
                    }
                    parts.push(if d > first {
                        format!("{}-{}", DAYS[first], DAYS[d])
                    } else {
                        DAYS[first].to_owned()
                    });
                }
                d += 1;
            }
        }
        let end = if self.end == 0 { 24 * 60 } else { self.end };
        write!(
            f,
            "{} {:02}:{:02}-{:02}:{:02}",
            parts.join(","),
            self.start / 60,
            self.start % 60,
            end / 60,
            end % 60
        )
    }
}

impl TryFrom<String> for Window {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Window> for String {
    fn from(w: Window) -> Self {
        w.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        s.parse::<Timestamp>().expect("a time").as_millisecond()
    }

    fn windows(tz: &str, open: &[&str]) -> Windows {
        Windows {
            time_zone: tz.into(),
            open: open.iter().map(|w| w.parse().expect("a window")).collect(),
        }
    }

    #[test]
    fn windows_parse_and_print_canonically() {
        let w: Window = "mon-fri 00:00-06:00".parse().expect("parses");
        assert_eq!(w.to_string(), "MON-FRI 00:00-06:00");
        let w: Window = "SAT,SUN 00:00-24:00".parse().expect("parses");
        assert_eq!(w.to_string(), "SAT-SUN 00:00-24:00");
        let w: Window = "FRI-MON 22:00-02:00".parse().expect("parses");
        assert_eq!(w.to_string(), "MON,FRI-SUN 22:00-02:00");
        let w: Window = "DAILY 09:30-17:00".parse().expect("parses");
        assert_eq!(w.to_string(), "DAILY 09:30-17:00");
        for bad in [
            "MON",
            "MOO 00:00-01:00",
            "MON 25:00-26:00",
            "MON 10:00-10:00",
            "MON 9-10",
        ] {
            assert!(bad.parse::<Window>().is_err(), "{bad} must be refused");
        }
        let json = serde_json::to_string(&windows("UTC", &["MON 01:00-02:00"])).expect("json");
        assert_eq!(json, r#"{"time_zone":"UTC","open":["MON 01:00-02:00"]}"#);
    }

    #[test]
    fn a_weekday_night_window_in_moscow_opens_and_closes_on_its_local_time() {
        let w = windows("Europe/Moscow", &["MON-FRI 00:00-06:00"]);
        // Monday 2026-11-23 02:00 in Moscow (UTC+3) is Sunday 23:00 UTC.
        assert_eq!(w.gate(ms("2026-11-22T23:00:00Z")), Ok(WindowGate::Open));
        // Monday 06:00 Moscow: closed until Tuesday 00:00 Moscow, 18 hours.
        assert_eq!(
            w.gate(ms("2026-11-23T03:00:00Z")),
            Ok(WindowGate::ClosedFor(18 * 3_600_000))
        );
        // Saturday noon Moscow: closed until Monday 00:00 Moscow (36 hours).
        assert_eq!(
            w.gate(ms("2026-11-28T09:00:00Z")),
            Ok(WindowGate::ClosedFor(36 * 3_600_000))
        );
    }

    #[test]
    fn a_window_past_midnight_holds_the_early_hours_of_the_next_day() {
        let w = windows("UTC", &["FRI 22:00-02:00"]);
        // Friday 2026-11-27 23:00 and Saturday 01:59 are open; Saturday 02:00 is not.
        assert_eq!(w.gate(ms("2026-11-27T23:00:00Z")), Ok(WindowGate::Open));
        assert_eq!(w.gate(ms("2026-11-28T01:59:00Z")), Ok(WindowGate::Open));
        assert!(matches!(
            w.gate(ms("2026-11-28T02:00:00Z")),
            Ok(WindowGate::ClosedFor(_))
        ));
    }

    #[test]
    fn a_start_in_a_clock_change_gap_opens_when_the_clock_resumes() {
        // Berlin skips 02:00-03:00 on 2026-03-29; a window from 02:30 opens
        // at 03:30 local, 01:30 UTC.
        let w = windows("Europe/Berlin", &["SUN 02:30-04:00"]);
        assert_eq!(
            w.gate(ms("2026-03-29T00:30:00Z")),
            Ok(WindowGate::ClosedFor(60 * 60_000))
        );
        assert!(
            windows("Mars/Olympus", &["MON 00:00-01:00"])
                .check()
                .is_err()
        );
        assert!(windows("UTC", &[]).check().is_err());
    }
}
