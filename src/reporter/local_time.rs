//! Wall-clock times as the plain lines show them: the local time of day to the millisecond
//! (`12:03:04.512`), with the date and the UTC offset said once, and again whenever they change
//! (midnight, a daylight-saving switch). The time zone is the system's (`TZ`, else
//! `/etc/localtime`), read once when the reporter starts; UTC when it cannot be read.
//!
//! Without `TZ`, `/etc/localtime` is read as the TZif file it is: jiff would take the zone's
//! name from the link's target and look it up in its database, whose first use walks the whole
//! of `/usr/share/zoneinfo` (600 files: about a millisecond of every run's start-up). Only the
//! offsets are ever shown, so the name is not needed.

use jiff::tz::TimeZone;
use jiff::{Timestamp, ZonedDateTime};
use std::path::Path;
use std::time::SystemTime;

/// The zone of `localtime` (a TZif file) when `TZ` is not set; jiff's own lookup otherwise (a
/// name, a POSIX rule, a path), and when `localtime` is not a TZif file. UTC when it is missing.
fn system_zone(tz_set: bool, localtime: &Path) -> TimeZone {
    if tz_set {
        return TimeZone::system();
    }
    match std::fs::read(localtime) {
        Ok(data) => TimeZone::tzif("localtime", &data).unwrap_or_else(|_| TimeZone::system()),
        Err(_) => TimeZone::UTC,
    }
}

/// The local time zone, and the day (date and offset) last said.
pub(crate) struct LocalTime {
    tz: TimeZone,
    day: Option<(jiff::civil::Date, jiff::tz::Offset)>,
}

impl LocalTime {
    /// The system's time zone.
    pub(crate) fn system() -> LocalTime {
        LocalTime::new(system_zone(std::env::var_os("TZ").is_some(), Path::new("/etc/localtime")))
    }

    pub(crate) fn new(tz: TimeZone) -> LocalTime {
        LocalTime { tz, day: None }
    }

    fn zoned(&self, at: SystemTime) -> ZonedDateTime {
        // A time outside jiff's range (year ±9999) cannot come from a clock; the epoch stands in.
        Timestamp::try_from(at).unwrap_or(Timestamp::UNIX_EPOCH).to_zoned_datetime(self.tz.clone())
    }

    /// `12:03:04.512`.
    pub(crate) fn time_of_day(&self, at: SystemTime) -> String {
        time_of_day(&self.zoned(at))
    }

    /// The time of day at `at`, and the day when it differs from the one last returned here
    /// (`None` when it is the same; always `Some` the first time). One conversion per line, the
    /// day compared as values and written only when it changed: a line's stamp is most of what
    /// the plain reporter spends on it.
    pub(crate) fn stamp(&mut self, at: SystemTime) -> (String, Option<String>) {
        let zoned = self.zoned(at);
        let this = (zoned.date(), zoned.offset());
        let new = (self.day != Some(this)).then(|| day(&zoned));
        self.day = Some(this);
        (time_of_day(&zoned), new)
    }

    /// A time later than `now` (a retry's wake-up): the time of day, with the date in front
    /// when it falls on another day (`2026-12-02 03:00:00.000`).
    pub(crate) fn later(&self, at: SystemTime, now: SystemTime) -> String {
        let (then, today) = (self.zoned(at), self.zoned(now));
        if then.date() == today.date() {
            self.time_of_day(at)
        } else {
            then.strftime("%Y-%m-%d %H:%M:%S%.3f").to_string()
        }
    }
}

/// `12:03:04.512`.
fn time_of_day(z: &ZonedDateTime) -> String {
    format!("{:02}:{:02}:{:02}.{:03}", z.hour(), z.minute(), z.second(), z.millisecond())
}

/// `2026-12-01 (UTC+01:00)`: the date and the offset from UTC.
fn day(z: &ZonedDateTime) -> String {
    z.strftime("%Y-%m-%d (UTC%:z)").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    /// 2026-03-29 00:59:59.250 UTC, a second before Europe's switch to summer time.
    fn before_switch() -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_774_745_999_250)
    }

    fn paris() -> LocalTime {
        LocalTime::new(TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap())
    }

    /// A TZif file of Europe/Paris (from the public-domain tz database), as `/etc/localtime`.
    fn paris_file() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tz/Europe-Paris.tzif")
    }

    #[test]
    fn without_tz_the_zone_is_read_from_the_localtime_file_and_is_utc_without_one() {
        let mut t = LocalTime::new(system_zone(false, &paris_file()));
        assert_eq!(t.time_of_day(before_switch()), "01:59:59.250");
        let (time, day) = t.stamp(before_switch() + Duration::from_secs(1));
        assert_eq!((time.as_str(), day.as_deref()), ("03:00:00.250", Some("2026-03-29 (UTC+02:00)")));
        let mut t = LocalTime::new(system_zone(false, Path::new("/nonexistent/localtime")));
        let (time, day) = t.stamp(before_switch());
        assert_eq!((time.as_str(), day.as_deref()), ("00:59:59.250", Some("2026-03-29 (UTC+00:00)")));
    }

    #[test]
    fn times_are_local_to_the_millisecond() {
        let t = paris();
        assert_eq!(t.time_of_day(before_switch()), "01:59:59.250");
        assert_eq!(t.time_of_day(before_switch() + Duration::from_secs(1)), "03:00:00.250");
        assert_eq!(LocalTime::new(TimeZone::UTC).time_of_day(before_switch()), "00:59:59.250");
    }

    #[test]
    fn the_day_is_said_first_and_again_when_the_date_or_the_offset_changes() {
        let mut t = paris();
        let at = before_switch();
        assert_eq!(t.stamp(at), ("01:59:59.250".into(), Some("2026-03-29 (UTC+01:00)".into())));
        assert_eq!(t.stamp(at + Duration::from_millis(500)), ("01:59:59.750".into(), None));
        assert_eq!(
            t.stamp(at + Duration::from_secs(1)),
            ("03:00:00.250".into(), Some("2026-03-29 (UTC+02:00)".into())),
            "summer time"
        );
        assert_eq!(t.stamp(at + Duration::from_secs(21 * 3600)), ("23:59:59.250".into(), None), "still the same day");
        assert_eq!(
            t.stamp(at + Duration::from_secs(21 * 3600 + 1)),
            ("00:00:00.250".into(), Some("2026-03-30 (UTC+02:00)".into()))
        );
    }

    #[test]
    fn a_wake_up_on_another_day_has_its_date() {
        let t = LocalTime::new(TimeZone::UTC);
        let now = before_switch();
        assert_eq!(t.later(now + Duration::from_millis(200), now), "00:59:59.450");
        assert_eq!(t.later(now + Duration::from_secs(86_400), now), "2026-03-30 00:59:59.250");
    }
}
