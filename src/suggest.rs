//! "Did you mean" suggestions by edit distance.

/// The candidate closest to `name`, if it is close enough to be a plausible typo.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (distance(&name.to_lowercase(), &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.to_owned())
}

/// Edit distance over chars where swapping two neighbours counts as one edit (optimal string
/// alignment), so `nmae` is one typo away from `name`.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // d[i][j]: distance between a[..i] and b[..j]
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    d[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
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
