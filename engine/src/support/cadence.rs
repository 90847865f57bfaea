//! When a schedule ticks: a cron expression in a time zone (`croner`,
//! `chrono-tz`) or an interval, and the job id of each tick. Pure: the
//! API checks a schedule with it, the scheduler moves schedules along it.

use std::str::FromStr as _;
use std::time::Duration;

use chrono::{DateTime, DurationRound as _, TimeDelta, Utc};
use uuid::Uuid;

use flotilla_store::schedules::ScheduleRow;

/// The shortest interval a schedule may have.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The longest interval a schedule may have.
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 24 * 3600);
/// The namespace of the ticks' job ids (UUID v5).
const TICK_NAMESPACE: Uuid = Uuid::from_u128(0x6f1b_2d3c_9a4e_4b5f_8c7d_0e1f_2a3b_4c5d);

/// When a schedule ticks.
#[derive(Debug, Clone)]
pub(crate) enum Every {
    Cron {
        cron: Box<croner::Cron>,
        zone: chrono_tz::Tz,
    },
    Interval(TimeDelta),
}

impl Every {
    pub(crate) fn of(row: &ScheduleRow) -> Result<Self, String> {
        let interval = row
            .interval_ms
            .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
        Self::parse(row.cron.as_deref(), &row.time_zone, interval)
    }

    pub(crate) fn parse(
        cron: Option<&str>,
        zone: &str,
        interval: Option<Duration>,
    ) -> Result<Self, String> {
        match (cron, interval) {
            (Some(cron), None) => {
                let zone = chrono_tz::Tz::from_str(zone)
                    .map_err(|_| format!("time_zone {zone:?} is not an IANA time zone"))?;
                let cron = croner::Cron::from_str(cron)
                    .map_err(|e| format!("cron {cron:?} does not parse: {e}"))?;
                Ok(Self::Cron {
                    cron: Box::new(cron),
                    zone,
                })
            }
            (None, Some(interval)) => {
                if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
                    return Err(format!(
                        "interval must be from {} to {}",
                        humantime::format_duration(MIN_INTERVAL),
                        humantime::format_duration(MAX_INTERVAL)
                    ));
                }
                TimeDelta::from_std(interval)
                    .map(Self::Interval)
                    .map_err(|e| e.to_string())
            }
            _ => Err("a schedule has exactly one of cron and interval".into()),
        }
    }

    /// The first tick strictly after `after`.
    pub(crate) fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Self::Cron { cron, zone } => cron
                .find_next_occurrence(&after.with_timezone(zone), false)
                .ok()
                .map(|at| at.with_timezone(&Utc)),
            Self::Interval(every) => after.checked_add_signed(*every),
        }
        .map(millis)
    }

    /// The tick after `now`, on the grid of `latest` (the latest tick at
    /// or before `now`): an interval keeps its phase whatever the delay.
    pub(crate) fn next_after_latest(
        &self,
        latest: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        match self {
            Self::Interval(_) => {
                let mut next = self.next_after(latest)?;
                while next <= now {
                    next = self.next_after(next)?;
                }
                Some(next)
            }
            Self::Cron { .. } => self.next_after(now),
        }
    }

    /// The latest tick at or before `now`, counting from the due tick
    /// `due` (itself at or before `now`), and how many ticks came before it
    /// since `due`.
    pub(crate) fn latest_due(
        &self,
        due: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> (DateTime<Utc>, u64) {
        match self {
            Self::Interval(every) => {
                let every_ms = every.num_milliseconds().max(1);
                let behind = (now - due).num_milliseconds().max(0) / every_ms;
                let latest = due + TimeDelta::milliseconds(behind * every_ms);
                (latest, u64::try_from(behind).unwrap_or(0))
            }
            Self::Cron { cron, zone } => {
                let latest = cron
                    .find_previous_occurrence(&now.with_timezone(zone), true)
                    .ok()
                    .map(|at| millis(at.with_timezone(&Utc)))
                    .filter(|latest| *latest >= due)
                    .unwrap_or(due);
                // Each tick from `due` to `latest`, counted up to a bound
                // (a year of minutes): an outage of a week on an hourly
                // cron missed 167 ticks, not one.
                let mut before = 0;
                let mut at = due;
                while at < latest && before < MAX_COUNTED_TICKS {
                    before += 1;
                    match self.next_after(at) {
                        Some(next) => at = next,
                        None => break,
                    }
                }
                (latest, before)
            }
        }
    }
}

/// The most missed ticks of a cron counted at once (a year of minutes);
/// past it the count stops there.
const MAX_COUNTED_TICKS: u64 = 366 * 24 * 60;

/// Instants are kept to the millisecond (as timers are).
pub(crate) fn millis(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::milliseconds(1)).unwrap_or(at)
}

/// The job id of `schedule_id`'s tick at `tick`.
#[must_use]
pub fn tick_job_id(schedule_id: Uuid, tick: DateTime<Utc>) -> Uuid {
    let name = format!(
        "{schedule_id}@{}",
        tick.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );
    Uuid::new_v5(&TICK_NAMESPACE, name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;

    #[test]
    fn a_cron_ticks_in_its_time_zone() {
        let every = Every::parse(Some("0 9 * * *"), "Europe/Amsterdam", None).unwrap();
        let winter = Utc.with_ymd_and_hms(2026, 1, 15, 12, 0, 0).unwrap();
        assert_eq!(
            every.next_after(winter),
            Some(Utc.with_ymd_and_hms(2026, 1, 16, 8, 0, 0).unwrap()),
            "09:00 in Amsterdam is 08:00 UTC in winter"
        );
        let summer = Utc.with_ymd_and_hms(2026, 7, 15, 12, 0, 0).unwrap();
        assert_eq!(
            every.next_after(summer),
            Some(Utc.with_ymd_and_hms(2026, 7, 16, 7, 0, 0).unwrap()),
            "and 07:00 UTC in summer"
        );
    }

    #[test]
    fn bad_schedules_are_named() {
        let cases = [
            (Some("61 * * * *"), "UTC", None, "cron"),
            (Some("* * * * *"), "Mars/Olympus", None, "time_zone"),
            (None, "UTC", Some(Duration::from_millis(10)), "interval"),
            (None, "UTC", None, "exactly one"),
            (
                Some("* * * * *"),
                "UTC",
                Some(Duration::from_secs(5)),
                "exactly one",
            ),
        ];
        for (cron, zone, interval, named) in cases {
            let why = Every::parse(cron, zone, interval).unwrap_err();
            assert!(why.contains(named), "{why}");
        }
    }

    #[test]
    fn the_latest_due_tick_of_an_interval_counts_those_before_it() {
        let every = Every::parse(None, "UTC", Some(Duration::from_secs(60))).unwrap();
        let due = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let now = due + TimeDelta::seconds(150);
        assert_eq!(
            every.latest_due(due, now),
            (due + TimeDelta::seconds(120), 2)
        );
        assert_eq!(every.latest_due(due, due), (due, 0));
    }

    #[test]
    fn the_latest_due_tick_of_a_cron_counts_every_tick_before_it() {
        // Hourly, a week behind: 168 ticks, the last taken, 167 before it.
        let hourly = Every::parse(Some("0 * * * *"), "UTC", None).unwrap();
        let due = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let now = due + TimeDelta::days(7) - TimeDelta::minutes(30);
        assert_eq!(
            hourly.latest_due(due, now),
            (due + TimeDelta::hours(167), 167)
        );
        assert_eq!(hourly.latest_due(due, due), (due, 0));
    }

    #[test]
    fn a_ticks_job_id_is_the_same_for_the_same_tick_only() {
        let schedule = Uuid::new_v4();
        let tick = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(tick_job_id(schedule, tick), tick_job_id(schedule, tick));
        assert_ne!(
            tick_job_id(schedule, tick),
            tick_job_id(schedule, tick + TimeDelta::seconds(1))
        );
        assert_ne!(
            tick_job_id(schedule, tick),
            tick_job_id(Uuid::new_v4(), tick)
        );
    }
}
