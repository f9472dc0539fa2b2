//! The run's warnings: each read of a field the map did not have, at a place in the script
//! that does not handle the `()` it gives (`rhai_ast::fields` finds those places and reports
//! each miss), once per place, at most [`MAX_WARNINGS`] of them.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::error::Warning;
use crate::rhai_ast::fields::FieldPlan;
use crate::sync::lock;

/// Places reported at most; the others are counted.
pub(crate) const MAX_WARNINGS: usize = 20;
/// A map's fields named in a warning, at most.
const MAX_FIELDS: usize = 20;
/// Characters of a field's name kept in a warning.
const MAX_NAME_CHARS: usize = 64;

/// The warnings of one run, as the executor finds them.
#[derive(Debug, Default)]
pub(crate) struct Warnings {
    /// The places already reported (or counted).
    seen: HashSet<u32>,
    pub(crate) list: Vec<Warning>,
    /// Places that found a field missing after [`MAX_WARNINGS`] others had.
    pub(crate) left_out: usize,
}

impl Warnings {
    /// A missing field at site `site` of `plan`, in `map`.
    fn missing(&mut self, plan: &FieldPlan, site: u32, map: &rhai::Map) {
        if !self.seen.insert(site) {
            return;
        }
        if self.list.len() >= MAX_WARNINGS {
            self.left_out += 1;
            return;
        }
        if let Some(site) = plan.site(site) {
            let (line, column) = crate::engine::line_column(site.position);
            self.list.push(missing_field(
                &site.name,
                map.keys().map(|k| k.as_str()),
                line,
                column,
            ));
        }
    }
}

/// Reports the plan's missing fields into `warnings` while `engine` runs.
pub(crate) fn watch(
    engine: &mut rhai::Engine,
    plan: Arc<FieldPlan>,
    warnings: Arc<Mutex<Warnings>>,
) {
    let reported = Arc::clone(&plan);
    crate::rhai_ast::fields::watch(engine, plan, move |site, map| {
        lock(&warnings).missing(&reported, site, map);
    });
}

/// The warning for a read of `field` from a map with `fields` (in the map's order, sorted).
pub(crate) fn missing_field<'a>(
    field: &str,
    fields: impl Iterator<Item = &'a str> + Clone,
    line: Option<usize>,
    column: Option<usize>,
) -> Warning {
    let closest = closest(field, fields.clone()).map(str::to_string);
    let empty = fields.clone().next().is_none();
    let shown: Vec<String> = fields.take(MAX_FIELDS).map(shorten).collect();
    let hint = match (&closest, empty) {
        (Some(c), _) => format!("; did you mean `{}`?", shorten(c)),
        (None, true) => ": the map has no fields".to_string(),
        (None, false) => String::new(),
    };
    Warning {
        line,
        column,
        message: format!(
            "the map has no field `{}`, so it reads as (){hint}",
            shorten(field)
        ),
        field: shorten(field),
        fields: shown,
        closest: closest.as_deref().map(shorten),
    }
}

fn shorten(name: &str) -> String {
    if name.chars().count() <= MAX_NAME_CHARS {
        return name.to_string();
    }
    let head: String = name.chars().take(MAX_NAME_CHARS - 1).collect();
    format!("{head}…")
}

/// The field nearest to `name`: one that begins or ends with it (or it with them), else one
/// that contains it, else one within a few edits; the shortest difference wins.
pub(crate) fn closest<'a>(name: &str, fields: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let wanted = name.to_lowercase();
    if wanted.is_empty() {
        return None;
    }
    let limit = (wanted.chars().count() / 3).clamp(1, 3);
    fields
        .filter_map(|field| {
            let have = field.to_lowercase();
            let gap = have.chars().count().abs_diff(wanted.chars().count());
            let rank = if have == wanted {
                (0, 0)
            } else if have.starts_with(&wanted)
                || have.ends_with(&wanted)
                || wanted.starts_with(&have) && have.chars().count() >= 2
                || wanted.ends_with(&have) && have.chars().count() >= 2
            {
                (1, gap)
            } else if have.contains(&wanted) && wanted.chars().count() >= 3 {
                (2, gap)
            } else {
                // Long names are not compared edit by edit (the cost is their product).
                if wanted.len() > MAX_NAME_CHARS || have.len() > MAX_NAME_CHARS {
                    return None;
                }
                let d = edits(&wanted, &have);
                if d > limit {
                    return None;
                }
                (3, d)
            };
            Some((rank, field))
        })
        .min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)))
        .map(|(_, field)| field)
}

/// Edits from `a` to `b`: insertions, deletions, substitutions and swaps of two neighbours
/// (`emial` is one edit from `email`).
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    rows[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closest_field_is_found_by_prefix_containment_or_a_few_edits() {
        let fields = ["age_days", "author", "id", "title", "created_at"];
        let near = |name: &str| closest(name, fields.iter().copied());
        assert_eq!(near("age"), Some("age_days"));
        assert_eq!(near("autor"), Some("author"));
        assert_eq!(near("tilte"), Some("title"));
        assert_eq!(near("ib"), Some("id"));
        assert_eq!(near("Title"), Some("title"));
        assert_eq!(near("created"), Some("created_at"));
        assert_eq!(near("days"), Some("age_days"));
        assert_eq!(near("zzz"), None);
        assert_eq!(near(""), None);
        assert_eq!(closest("x", std::iter::empty()), None);
    }

    #[test]
    fn a_warning_names_the_field_the_map_s_fields_and_the_closest() {
        let w = missing_field("age", ["age_days", "id"].into_iter(), Some(3), Some(9));
        assert_eq!(w.field, "age");
        assert_eq!(w.fields, vec!["age_days", "id"]);
        assert_eq!(w.closest.as_deref(), Some("age_days"));
        assert!(w.message.contains("`age`") && w.message.contains("did you mean `age_days`"));
        assert_eq!(
            w.line_text(),
            format!("line 3, column 9: {} (its fields: age_days, id)", w.message)
        );
        let empty = missing_field("age", std::iter::empty(), None, None);
        assert!(empty.message.contains("no fields"), "{}", empty.message);
        assert_eq!(empty.closest, None);
    }

    #[test]
    fn a_warning_about_a_huge_map_stays_small() {
        let names: Vec<String> = (0..1000)
            .map(|i| format!("{}{i}", "f".repeat(500)))
            .collect();
        let w = missing_field(
            &"g".repeat(10_000),
            names.iter().map(String::as_str),
            None,
            None,
        );
        assert_eq!(w.fields.len(), MAX_FIELDS);
        assert!(w.fields.iter().all(|f| f.chars().count() <= MAX_NAME_CHARS));
        assert!(w.message.len() < 300, "{}", w.message.len());
        assert!(w.line_text().ends_with(", …)"), "{}", w.line_text());
        assert!(w.field.chars().count() <= MAX_NAME_CHARS);
    }
}
