//! Instants as operators type and read them: ISO 8601 in, ISO 8601 UTC out (milliseconds).

/// Milliseconds since the epoch of an ISO-8601 date-time: `YYYY-MM-DDTHH:MM[:SS[.fff]]` with
/// `Z`, `±HH:MM` or no zone (UTC).
pub fn parse_datetime(text: &str) -> Result<i64, String> {
    let bad = || format!("--to-datetime {text:?}: expected an ISO-8601 time like 2026-11-22T10:00:00Z");
    let (date, time) = text.split_once(['T', ' ']).ok_or_else(bad)?;
    let d: Vec<&str> = date.split('-').collect();
    let [y, mo, da] = d.as_slice() else { return Err(bad()) };
    let num =
        |s: &str, lo: i64, hi: i64| s.parse::<i64>().ok().filter(|v| (lo..=hi).contains(v)).ok_or_else(bad);
    let (year, month) = (num(y, 1970, 9999)?, num(mo, 1, 12)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    let day = num(da, 1, month_days)?;
    let (clock, offset_secs) = if let Some(c) = time.strip_suffix('Z') {
        (c, 0)
    } else if let Some(i) = time.rfind(['+', '-']).filter(|&i| i >= 5) {
        let (c, zone) = time.split_at(i);
        let sign = if zone.starts_with('-') { -1 } else { 1 };
        let (h, m) = zone[1..].split_once(':').ok_or_else(bad)?;
        (c, sign * (num(h, 0, 23)? * 3600 + num(m, 0, 59)? * 60))
    } else {
        (time, 0)
    };
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, ""));
    let t: Vec<&str> = hms.split(':').collect();
    let (h, mi, s) = match t.as_slice() {
        [h, m] => (num(h, 0, 23)?, num(m, 0, 59)?, 0),
        [h, m, s] => (num(h, 0, 23)?, num(m, 0, 59)?, num(s, 0, 60)?),
        _ => return Err(bad()),
    };
    let millis = if frac.is_empty() {
        0
    } else if frac.bytes().all(|b| b.is_ascii_digit()) {
        format!("{frac:0<3}")[..3].parse::<i64>().map_err(|_| bad())?
    } else {
        return Err(bad());
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok((days * 86_400 + h * 3600 + mi * 60 + s - offset_secs) * 1000 + millis)
}

/// `ms` since the epoch as `YYYY-MM-DDTHH:MM:SS.fffZ` (the inverse of [`parse_datetime`]'s
/// day count, Howard Hinnant's civil-from-days).
pub fn iso_utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offsets::tables::{SnapshotRow, snapshots_table};
    use cluster_state::ids::Partition;

    #[test]
    fn snapshot_times_print_as_iso_utc_and_parse_back() {
        let cases = [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (1_795_362_909_123, "2026-11-22T15:55:09.123Z"),
            (4_107_542_399_999, "2100-02-28T23:59:59.999Z"),
        ];
        for (ms, text) in cases {
            assert_eq!(iso_utc(ms), text);
            assert_eq!(parse_datetime(text), Ok(ms as i64), "{text}");
        }
        let rows = [
            SnapshotRow::new((
                "before-deploy".into(),
                Ok(cluster_state::znode::OffsetSnapshot {
                    created_ms: 0,
                    offsets: [(
                        "events".to_owned(),
                        (0..3)
                            .map(|p| {
                                (
                                    Partition::new(p).unwrap(),
                                    cluster_state::znode::OffsetData::new(7).unwrap(),
                                )
                            })
                            .collect(),
                    )]
                    .into(),
                }),
            )),
            SnapshotRow::new(("broken".into(), Err("not JSON".into()))),
        ];
        let table = snapshots_table(&rows);
        let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[1], ["before-deploy", "1970-01-01T00:00:00.000Z", "3", "events"]);
        assert_eq!(lines[2], ["broken", "unreadable:", "not", "JSON"]);
        let json = serde_json::to_value(&rows[1]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"name": "broken", "topics": [], "partitions": 0, "error": "not JSON"})
        );
    }

    #[test]
    fn datetimes_parse_with_and_without_zones() {
        assert_eq!(parse_datetime("1970-01-01T00:00:00Z").unwrap(), 0);
        assert_eq!(parse_datetime("2026-11-22T10:00:00Z").unwrap(), 1_795_341_600_000);
        assert_eq!(parse_datetime("2026-11-22T11:00:00+01:00").unwrap(), 1_795_341_600_000);
        assert_eq!(parse_datetime("2026-11-22T09:30:00.250-00:30").unwrap(), 1_795_341_600_250);
        assert_eq!(parse_datetime("2026-11-22 10:00").unwrap(), 1_795_341_600_000);
        assert_eq!(parse_datetime("2028-02-29T00:00:00Z").unwrap(), 1_835_395_200_000);
        for bad in [
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-11-22",
            "2026-11-22T25:00:00Z",
            "2026-11-22T10:00:00.x",
            "2026-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
        ] {
            let err = parse_datetime(bad).unwrap_err();
            assert!(err.contains(bad) && err.contains("ISO-8601"), "{bad}: {err}");
        }
    }
}
