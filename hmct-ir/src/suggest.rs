//! "Did you mean": the names closest to a mistyped one, and the clause that offers
//! them, for every error that names an unknown node, op type, metric or option.

/// Up to three of `candidates` closest to `name` (normalized Levenshtein similarity
/// of at least 0.5, ignoring ASCII case, or `name` contained in the candidate), best
/// first.
pub fn close_matches<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let lower = name.to_ascii_lowercase();
    let mut scored: Vec<(f64, &str)> = candidates
        .into_iter()
        .filter_map(|c| {
            let score = similarity(&lower, &c.to_ascii_lowercase());
            let contains = !lower.is_empty() && c.to_ascii_lowercase().contains(&lower);
            (score >= 0.5 || contains).then_some((score.max(if contains { 0.5 } else { 0.0 }), c))
        })
        .collect();
    // Equal scores in name order, so the message does not depend on hashing.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored
        .into_iter()
        .take(3)
        .map(|(_, c)| c.to_string())
        .collect()
}

/// `" (did you mean 'a' or 'b'?)"`, or nothing when there is nothing to offer.
pub fn did_you_mean(suggestions: &[String]) -> String {
    if suggestions.is_empty() {
        String::new()
    } else {
        format!(" (did you mean {}?)", quote_list(suggestions))
    }
}

/// `'a', 'b' or 'c'`.
pub fn quote_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("'{s}'")).collect();
    match quoted.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// 1 minus the edit distance over the longer length, in characters (1 for two empty
/// names).
fn similarity(a: &str, b: &str) -> f64 {
    let longest = a.chars().count().max(b.chars().count());
    if longest == 0 {
        return 1.0;
    }
    1.0 - levenshtein(a, b) as f64 / longest as f64
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_and_similarity() {
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(similarity("", ""), 1.0);
        assert_eq!(similarity("abcd", "abce"), 0.75);
    }

    #[test]
    fn best_first_then_by_name() {
        let names = ["conv2d_21", "conv2d_2", "relu", "Conv2D_3"];
        assert_eq!(
            close_matches("conv2d_22", names),
            ["conv2d_2", "conv2d_21", "Conv2D_3"]
        );
        assert!(close_matches("softmax", names).is_empty());
        assert_eq!(did_you_mean(&[]), "");
        assert_eq!(
            did_you_mean(&["a".into(), "b".into(), "c".into()]),
            " (did you mean 'a', 'b' or 'c'?)"
        );
    }
}
