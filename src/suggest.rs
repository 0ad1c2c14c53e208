//! "Did you mean" suggestions by edit distance.

/// The candidate closest to `name`, if it is close enough to be a plausible typo.
///
/// Edit distance counts swapping two neighbours as one edit (optimal string alignment), so `nmae`
/// is one typo away from `name`. Candidates whose length alone puts them out of reach are skipped
/// before any distance is computed: thousands of unknown names stay cheap to report.
pub(crate) fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let name = name.to_lowercase();
    let len = name.chars().count();
    let limit = (len / 3).max(1);
    candidates
        .into_iter()
        .filter(|c| c.chars().count().abs_diff(len) <= limit)
        .map(|c| (strsim::osa_distance(&name, &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_near_misses_only() {
        let keys = ["attempts", "exception_types", "backoff_seconds"];
        assert_eq!(closest("atempts", keys).as_deref(), Some("attempts"));
        assert_eq!(closest("exception_type", keys).as_deref(), Some("exception_types"));
        assert_eq!(closest("colour", keys), None);
        assert_eq!(closest("nmae", ["name", "env"]).as_deref(), Some("name"));
        assert_eq!(closest("ConectionError", ["ConnectionError", "OSError"]).as_deref(), Some("ConnectionError"));
    }
}
