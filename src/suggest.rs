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

/// For a key of a flow file (a few candidates): the closest candidate as [`closest`] finds it, or
/// else the one candidate that `name`, of at least 4 characters, is the start of: a word cut
/// short (`on_fail` for `on_failure`).
pub(crate) fn closest_key(name: &str, candidates: &[&str]) -> Option<String> {
    closest(name, candidates.iter().copied()).or_else(|| {
        let name = name.to_lowercase();
        if name.chars().count() < 4 {
            return None;
        }
        let mut starting = candidates.iter().filter(|c| c.to_lowercase().starts_with(&name));
        match (starting.next(), starting.next()) {
            (Some(only), None) => Some((*only).to_owned()),
            _ => None,
        }
    })
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

    #[test]
    fn a_key_cut_short_suggests_the_one_key_it_starts() {
        let hooks = ["on_success", "on_failure", "on_exit"];
        assert_eq!(closest_key("on_fail", &hooks).as_deref(), Some("on_failure"));
        assert_eq!(closest_key("on_s", &hooks).as_deref(), Some("on_success"));
        assert_eq!(closest_key("on_exti", &hooks).as_deref(), Some("on_exit"), "a typo first");
        assert_eq!(closest_key("on_", &hooks), None, "too short, and more than one");
        assert_eq!(closest_key("exception", &["exception_types", "exception_type_x"]), None, "more than one");
    }
}
