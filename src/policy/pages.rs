//! Cutting an artifact into pages a reader can use: each page a piece of the value that stands
//! on its own where the value allows it, within the page budget, and never small but for the
//! last.
//!
//! A value is paged by its own parts first:
//!
//! - an array by its items: each page `items`, a run of them in order;
//! - a map by its entries, in key order: each page `entries`, a map of some of them;
//! - a string by its lines (a page ends after a `\n`), a line longer than a page after a space,
//!   and a word longer than a page at a character: each page `text`.
//!
//! When that cannot keep every page within the budget and at least a quarter of it (an item or
//! entry alone over the budget, or a small item between two that fill a page each), and for
//! anything else (a number, a boolean, null), the value is paged as the text of its canonical
//! JSON instead, cut after a comma where it can be: each page `json`. Joined, the `json` pages
//! are that text, which parses back into the value.
//!
//! Invariants, for any value and budget of at least [`MIN_PAGE_TOKENS`]:
//!
//! - every page's body (its `items`, `entries`, `text` or `json` as canonical JSON) is within
//!   the budget (one character, the only thing never cut, is a few tokens at most);
//! - every page but the last is at least a quarter of the budget;
//! - the pages together are the whole value: items in order, every entry with its value, text
//!   byte for byte;
//! - the same value and budget always give the same pages (for one token counter).
//!
//! Pages are cut once, when the artifact is stored, and their places in its bytes are stored
//! with it ([`index_of`]): reading a page reads that page's bytes and parses them, nothing more
//! ([`stored_page`]). An artifact stored before pages were indexed is cut when read, from its bytes
//! and the page budget stored with it.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::tokens::{count, fits};
use crate::json::key_json;
use crate::store::{PageIndex, StoredArtifact};

/// The least page budget: three quarters of the least inline budget, so that a page read with
/// the few fields around it stays within any run's output. Artifacts stored with less (before
/// pages had a floor, their budget could be one token) are read with this one.
pub const MIN_PAGE_TOKENS: usize = super::MIN_INLINE_TOKENS * 3 / 4;

/// One page of an artifact, as `read_artifact`, `ts_artifact` and `toolscript artifact --page`
/// give it: `{page, pages, items | entries | text | json}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ArtifactPage {
    /// Which page, from 0.
    pub page: usize,
    /// How many pages the artifact has.
    pub pages: usize,
    /// What the page holds.
    #[serde(flatten)]
    pub content: PageContent,
}

/// What one page of an artifact holds. An artifact's pages are all of one kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum PageContent {
    /// Items of an array, in order: the pages' items, concatenated, are the array.
    Items(Vec<Value>),
    /// Entries of a map, in key order: the pages' maps, merged, are the map (no key is on two
    /// pages).
    Entries(Map<String, Value>),
    /// Characters of a string: the pages' texts, concatenated, are the string.
    Text(String),
    /// Characters of the value's canonical JSON: the pages' texts, concatenated, parse into
    /// the value.
    Json(String),
}

impl PageContent {
    /// The field that holds it in a page: `items`, `entries`, `text` or `json`.
    pub(crate) fn field(&self) -> &'static str {
        match self {
            PageContent::Items(_) => "items",
            PageContent::Entries(_) => "entries",
            PageContent::Text(_) => "text",
            PageContent::Json(_) => "json",
        }
    }

    /// The page's body as a value (what is counted against the budget).
    pub(crate) fn into_value(self) -> Value {
        match self {
            PageContent::Items(items) => Value::Array(items),
            PageContent::Entries(entries) => Value::Object(entries),
            PageContent::Text(text) | PageContent::Json(text) => Value::String(text),
        }
    }
}

/// The budget an artifact stored with `page_tokens` is read with: at least [`MIN_PAGE_TOKENS`].
pub(crate) fn read_budget(page_tokens: usize) -> usize {
    page_tokens.max(MIN_PAGE_TOKENS)
}

/// The pages of `value` for `page_tokens` (see the module's docs).
pub(crate) fn pages(value: &Value, page_tokens: usize) -> Vec<PageContent> {
    let page_tokens = page_tokens.max(1);
    match value {
        Value::Array(items) => {
            let units: Vec<String> = items.iter().map(key_json).collect();
            if let Some(runs) = unit_runs(&units, ('[', ']'), page_tokens) {
                return runs
                    .into_iter()
                    .map(|run| PageContent::Items(items[run].to_vec()))
                    .collect();
            }
        }
        Value::Object(map) => {
            // Canonical JSON's order, whatever order the map keeps.
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let units: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{}:{}", json_string(k), key_json(v)))
                .collect();
            if let Some(runs) = unit_runs(&units, ('{', '}'), page_tokens) {
                return runs
                    .into_iter()
                    .map(|run| {
                        let page = entries[run]
                            .iter()
                            .map(|(k, v)| ((*k).clone(), (*v).clone()));
                        PageContent::Entries(page.collect())
                    })
                    .collect();
            }
        }
        Value::String(text) => {
            return text_runs(text, page_tokens, &['\n', ' '])
                .into_iter()
                .map(|run| PageContent::Text(text[run].to_string()))
                .collect();
        }
        _ => {}
    }
    let text = key_json(value);
    text_runs(&text, page_tokens, &[','])
        .into_iter()
        .map(|run| PageContent::Json(text[run].to_string()))
        .collect()
}

/// `text` as a JSON string: how a page of text is counted.
fn json_string(text: &str) -> String {
    key_json(&Value::String(text.to_string()))
}

/// Whether `text` is at least `tokens` tokens. A token is at least a byte, so text shorter in
/// bytes is not counted.
fn reaches(text: &str, tokens: usize) -> bool {
    text.len() >= tokens && count(text) >= tokens
}

/// Cuts `units` (the JSON of items or entries, joined by commas between `brackets`) into runs,
/// each within `page_tokens` and, but the last, at least a quarter of it; `None` when cuts at
/// unit boundaries cannot do that.
///
/// Each page is filled while the units' own counts fit; the page as a whole is then counted,
/// since a BPE may merge tokens across a comma, and shortened until it fits. Filling greedily
/// can fail where another cut would not (`[60, 30, 20, 90]` for 100 tokens): such values are
/// paged as JSON text, which is rare enough not to search for the other cut.
fn unit_runs(
    units: &[String],
    (open, close): (char, char),
    page_tokens: usize,
) -> Option<Vec<Range<usize>>> {
    let body = |run: Range<usize>| {
        let mut out = String::with_capacity(units[run.clone()].iter().map(|u| u.len() + 1).sum());
        out.push(open);
        for (i, unit) in units[run].iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(unit);
        }
        out.push(close);
        out
    };
    let costs: Vec<usize> = units.iter().map(|u| count(u)).collect();
    let brackets = count(&format!("{open}{close}"));
    let quarter = page_tokens / 4;
    let mut runs = Vec::new();
    let mut start = 0;
    while start < units.len() {
        let (mut end, mut estimate) = (start, brackets);
        while end < units.len() {
            let cost = costs[end] + usize::from(end > start);
            if end > start && estimate + cost > page_tokens {
                break;
            }
            estimate += cost;
            end += 1;
        }
        let mut tokens = count(&body(start..end));
        while end > start + 1 && tokens > page_tokens {
            end -= 1;
            tokens = count(&body(start..end));
        }
        if tokens > page_tokens || (end < units.len() && tokens < quarter) {
            return None;
        }
        runs.push(start..end);
        start = end;
    }
    if runs.is_empty() {
        runs.push(0..0);
    }
    Some(runs)
}

/// Cuts `text` into byte ranges (at character boundaries), each within `page_tokens` as a JSON
/// string. A page is first as long as fits; it then ends after the last of the first of
/// `breaks` it holds that leaves it at least a quarter of the budget, else where it is.
fn text_runs(text: &str, page_tokens: usize, breaks: &[char]) -> Vec<Range<usize>> {
    let quarter = page_tokens / 4;
    let fits_run = |run: Range<usize>| fits(&json_string(&text[run]), page_tokens);
    let mut runs = Vec::new();
    // Most text is a few bytes a token: the first guess; then each page's length.
    let (mut start, mut guess) = (0, page_tokens.saturating_mul(4));
    while start < text.len() {
        let end = longest_fit(text, start, guess, &fits_run);
        guess = end - start;
        let mut cut = end;
        if end < text.len() {
            for &mark in breaks {
                let Some(at) = text[start..end].rfind(mark) else {
                    continue;
                };
                let at = start + at + mark.len_utf8();
                if at == end {
                    break;
                }
                if reaches(&json_string(&text[start..at]), quarter) {
                    cut = at;
                    break;
                }
            }
        }
        runs.push(start..cut);
        start = cut;
    }
    if runs.is_empty() {
        runs.push(0..0);
    }
    runs
}

/// The end of the longest run of `text` from `start` that `fits` (to within a 64th of it, to
/// count less), found from a `guess` of its length in bytes: always past `start`, by one
/// character when not even that fits.
fn longest_fit(
    text: &str,
    start: usize,
    guess: usize,
    fits: &dyn Fn(Range<usize>) -> bool,
) -> usize {
    let after = |i: usize| i + text[i..].chars().next().map_or(0, char::len_utf8);
    // A character boundary strictly between `lo` and `hi`, near `probe`.
    let between = |probe: usize, lo: usize, hi: usize| {
        let mut p = probe.min(text.len());
        while !text.is_char_boundary(p) {
            p -= 1;
        }
        if p <= lo {
            p = after(lo);
        }
        (p < hi).then_some(p)
    };
    // `lo` fits; `hi`, when known, does not.
    let (mut lo, mut hi) = (start, None::<usize>);
    let mut probe = start.saturating_add(guess.max(1));
    while let Some(p) = between(probe, lo, hi.unwrap_or(text.len() + 1)) {
        if fits(start..p) {
            lo = p;
            if p == text.len() {
                return p;
            }
        } else {
            hi = Some(p);
        }
        probe = match hi {
            // Past the guess: a little further at a time, as the next page is usually as long
            // as the last.
            None => lo + ((lo - start) / 8).max(16),
            Some(h) if h - lo <= ((h - start) / 64).max(1) => break,
            Some(h) => lo + (h - lo) / 2,
        };
    }
    if lo == start {
        after(start)
    } else {
        lo
    }
}

/// Every page of the artifact `content` (canonical JSON) stored with `page_tokens`: what
/// [`page_of`] gives one at a time. A budget under [`MIN_PAGE_TOKENS`] is read as that.
///
/// # Errors
///
/// When `content` is not JSON.
pub fn pages_of(content: &str, page_tokens: usize) -> Result<Vec<ArtifactPage>, String> {
    let value: Value =
        serde_json::from_str(content).map_err(|e| format!("the artifact is not JSON: {e}"))?;
    let all = pages(&value, read_budget(page_tokens));
    let total = all.len();
    Ok(all
        .into_iter()
        .enumerate()
        .map(|(page, content)| ArtifactPage {
            page,
            pages: total,
            content,
        })
        .collect())
}

/// Page `n` of the artifact `content` (canonical JSON) stored with `page_tokens`, as
/// `{"page", "pages", "items" | "entries" | "text" | "json"}`.
///
/// # Errors
///
/// When `content` is not JSON, or has no page `n`.
pub fn page_of(content: &str, page_tokens: usize, n: usize) -> Result<Value, String> {
    let all = pages_of(content, page_tokens)?;
    let total = all.len();
    let page = all.into_iter().nth(n).ok_or_else(|| no_page(total, n))?;
    serde_json::to_value(page).map_err(|e| format!("the page does not serialise: {e}"))
}

/// Where each of `all`, the pages of a value whose canonical JSON is `text`, is in `text`: a
/// page of `items` or `entries` is the bytes between its brackets (the commas between pages are
/// in no page), one of `text` the bytes of its JSON string between the quotes (escaping is the
/// same for a piece of a string as in the whole), one of `json` its own bytes. `None` when the
/// pages are not where they should be, which the checks make impossible to miss: the artifact
/// is then stored without an index, and cut when read.
pub(crate) fn index_of(all: &[PageContent], text: &str) -> Option<PageIndex> {
    let kind = all.first()?.field();
    let bracketed = matches!(kind, "items" | "entries");
    let mut pos = usize::from(kind != "json");
    let mut ranges = Vec::with_capacity(all.len());
    for (n, page) in all.iter().enumerate() {
        if page.field() != kind {
            return None;
        }
        if bracketed && n > 0 {
            if text.as_bytes().get(pos) != Some(&b',') {
                return None;
            }
            pos += 1;
        }
        let body = match page {
            PageContent::Items(items) => {
                let units: Vec<String> = items.iter().map(key_json).collect();
                units.join(",")
            }
            PageContent::Entries(entries) => {
                let mut sorted: Vec<(&String, &Value)> = entries.iter().collect();
                sorted.sort_by(|a, b| a.0.cmp(b.0));
                let units: Vec<String> = sorted
                    .iter()
                    .map(|(k, v)| format!("{}:{}", json_string(k), key_json(v)))
                    .collect();
                units.join(",")
            }
            PageContent::Text(t) => {
                let quoted = json_string(t);
                quoted[1..quoted.len() - 1].to_string()
            }
            PageContent::Json(t) => t.clone(),
        };
        let end = pos + body.len();
        if text.get(pos..end) != Some(body.as_str()) {
            return None;
        }
        ranges.push(pos as u64..end as u64);
        pos = end;
    }
    // What is left is the closing bracket or quote, or nothing.
    (pos + usize::from(kind != "json") == text.len()).then(|| PageIndex::new(kind, ranges))
}

/// The page whose body's bytes are `bytes`, in an artifact of pages of `kind` (see
/// [`index_of`]).
fn page_from(kind: &str, bytes: &[u8]) -> Result<PageContent, String> {
    let body =
        std::str::from_utf8(bytes).map_err(|e| format!("the page is not UTF-8 text: {e}"))?;
    let bad = |e: serde_json::Error| format!("the page does not parse: {e}");
    Ok(match kind {
        "items" => PageContent::Items(serde_json::from_str(&format!("[{body}]")).map_err(bad)?),
        "entries" => {
            PageContent::Entries(serde_json::from_str(&format!("{{{body}}}")).map_err(bad)?)
        }
        "text" => PageContent::Text(serde_json::from_str(&format!("\"{body}\"")).map_err(bad)?),
        "json" => PageContent::Json(body.to_string()),
        other => return Err(format!("its pages are of an unknown kind `{other}`")),
    })
}

/// Page `n` of `artifact` as a store gives it for page `n` (`Store::artifact_page`):
/// with an index, the page's bytes alone are parsed; without one (an artifact stored before
/// pages were indexed), the whole is cut into pages.
///
/// # Errors
///
/// When it has no page `n` (the message gives the pages it has), or its bytes do not parse.
pub fn stored_page(artifact: &StoredArtifact, n: usize) -> Result<ArtifactPage, String> {
    let Some(index) = &artifact.index else {
        let text = String::from_utf8_lossy(&artifact.content);
        let all = pages_of(&text, artifact.page_tokens)?;
        let total = all.len();
        return all.into_iter().nth(n).ok_or_else(|| no_page(total, n));
    };
    let total = index.ranges.len();
    if n >= total {
        return Err(no_page(total, n));
    }
    Ok(ArtifactPage {
        page: n,
        pages: total,
        content: page_from(&index.kind, &artifact.content)?,
    })
}

/// Why there is no page `n` of an artifact of `total` pages.
fn no_page(total: usize, n: usize) -> String {
    format!(
        "the artifact has {total} pages (0 to {}), not {n}",
        total.saturating_sub(1)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The body of a page as counted against the budget.
    fn tokens(page: &PageContent) -> usize {
        count(&key_json(&page.clone().into_value()))
    }

    /// The value `pages` stand for, put together as docs/results.md tells a reader to: items
    /// concatenated, maps merged, text concatenated, JSON text concatenated and parsed.
    fn assemble(pages: &[PageContent]) -> Value {
        match &pages[0] {
            PageContent::Items(_) => Value::Array(
                pages
                    .iter()
                    .flat_map(|p| match p {
                        PageContent::Items(items) => items.clone(),
                        other => panic!("an items page, not {other:?}"),
                    })
                    .collect(),
            ),
            PageContent::Entries(_) => {
                let mut all = Map::new();
                for page in pages {
                    let PageContent::Entries(entries) = page else {
                        panic!("an entries page, not {page:?}")
                    };
                    for (k, v) in entries {
                        assert!(all.insert(k.clone(), v.clone()).is_none(), "{k} twice");
                    }
                }
                Value::Object(all)
            }
            PageContent::Text(_) | PageContent::Json(_) => {
                let text: String = pages
                    .iter()
                    .map(|p| match p {
                        PageContent::Text(t) | PageContent::Json(t) => t.as_str(),
                        other => panic!("a text page, not {other:?}"),
                    })
                    .collect();
                match &pages[0] {
                    PageContent::Json(_) => serde_json::from_str(&text).unwrap(),
                    _ => Value::String(text),
                }
            }
        }
    }

    /// Every invariant of the module's docs, for `value` paged for `budget`; the pages.
    fn check(value: &Value, budget: usize) -> Vec<PageContent> {
        let all = pages(value, budget);
        assert!(!all.is_empty());
        let field = all[0].field();
        for (n, page) in all.iter().enumerate() {
            assert_eq!(page.field(), field, "page {n}: one kind of page");
            let t = tokens(page);
            assert!(
                t <= budget,
                "page {n} of {} is {t} tokens, over {budget}",
                all.len()
            );
            if n + 1 < all.len() {
                assert!(
                    t >= budget / 4,
                    "page {n} of {} is {t} tokens, under a quarter of {budget}",
                    all.len()
                );
            }
        }
        assert_eq!(&assemble(&all), value, "the pages are the whole value");
        assert_eq!(pages(value, budget), all, "the same pages again");
        // The stored index finds every page in the bytes, and a page read from its bytes alone
        // is the page.
        let text = key_json(value);
        let index = index_of(&all, &text).expect("every page is where it should be");
        assert_eq!(index.ranges.len(), all.len());
        let stored = StoredArtifact::new(text.clone().into_bytes(), budget, "page", "r")
            .with_index(index.clone());
        for (n, page) in all.iter().enumerate() {
            let range = index.ranges[n].start as usize..index.ranges[n].end as usize;
            let mut one = stored.clone();
            one.content = text.as_bytes()[range].to_vec();
            let read = stored_page(&one, n).unwrap();
            assert_eq!((&read.content, read.page, read.pages), (page, n, all.len()));
        }
        let over = stored_page(&stored, all.len()).unwrap_err();
        assert!(over.contains("pages (0 to"), "{over}");
        all
    }

    fn record(i: usize) -> Value {
        json!({
            "id": i, "name": format!("user number {i}"), "email": format!("user{i}@example.com"),
            "role": "reader", "note": format!("record {i} of the forty, with a sentence in it"),
            "tags": ["alpha", "beta", format!("t{i}")], "active": i.is_multiple_of(2),
        })
    }

    /// About 11 KB each (as canonical JSON): what a run at the smallest budget hands over.
    fn eleven_kb() -> Vec<(&'static str, Value)> {
        let records: Vec<Value> = (0..62).map(record).collect();
        let map: Map<String, Value> = (0..58).map(|i| (format!("record{i}"), record(i))).collect();
        let lines: String = (0..250)
            .map(|i| format!("line {i}: some words of a log or a file, ok\n"))
            .collect();
        let words: String = (0..1500).map(|i| format!("wörd{} ", i % 10)).collect();
        let log: Vec<String> = (0..290)
            .map(|i| format!("log line {i}: record{i} was written"))
            .collect();
        vec![
            ("array of records", Value::Array(records)),
            ("map of records", Value::Object(map)),
            ("text of lines", Value::String(lines)),
            ("text without a newline", Value::String(words)),
            ("log lines", json!(log)),
        ]
    }

    #[test]
    fn an_11_kb_value_at_the_smallest_budget_has_few_pages_none_small() {
        let budget = MIN_PAGE_TOKENS;
        for (name, value) in eleven_kb() {
            let bytes = key_json(&value).len();
            assert!((10_000..13_000).contains(&bytes), "{name}: {bytes} bytes");
            let all = check(&value, budget);
            // A token per byte (without the BPE) makes pages of about 150 bytes.
            let most = if cfg!(feature = "tokens") {
                60
            } else {
                4 * bytes / budget + 1
            };
            assert!(all.len() <= most, "{name}: {} pages", all.len());
            let kind = match value {
                // A record is about 180 bytes: counted a token a byte, one alone is over the
                // page budget.
                _ if name.contains("records") && !cfg!(feature = "tokens") => "json",
                Value::Array(_) => "items",
                Value::Object(_) => "entries",
                _ => "text",
            };
            assert_eq!(all[0].field(), kind, "{name}");
        }
    }

    #[test]
    fn text_with_lines_is_cut_after_a_newline_and_without_at_a_space() {
        let lines: String = (0..300)
            .map(|i| format!("line {i} of the text\n"))
            .collect();
        let all = check(&json!(lines), 120);
        for page in &all[..all.len() - 1] {
            let PageContent::Text(t) = page else { panic!() };
            assert!(t.ends_with('\n'), "{t:?}");
        }
        // No final newline: the last line is on the last page, whole.
        let unfinished = format!("{lines}the last line, unfinished");
        let all = check(&json!(unfinished), 120);
        let PageContent::Text(last) = all.last().unwrap() else {
            panic!()
        };
        assert!(last.ends_with("the last line, unfinished"), "{last:?}");
        for page in &all[..all.len() - 1] {
            let PageContent::Text(t) = page else { panic!() };
            assert!(t.ends_with('\n'), "{t:?}");
        }
        let words = "naïve café ☕ 😀 ".repeat(400);
        for page in &check(&json!(words), 100)[..] {
            let PageContent::Text(t) = page else { panic!() };
            assert!(!t.starts_with(' '), "{t:?}");
        }
    }

    #[test]
    fn the_edges_are_paged_whole_and_within_the_budget() {
        let big_map: Map<String, Value> =
            (0..80).map(|i| (format!("k{i:02}"), record(i))).collect();
        // Deeper than serde_json parses (128 levels), an artifact could not be read at all.
        let mut deep = json!("the bottom");
        for i in 0..120 {
            deep = if i % 2 == 0 {
                json!([deep, i])
            } else {
                json!({"level": deep})
            };
        }
        let long_line = format!("{}\nshort\n{}", "x".repeat(5000), "y ".repeat(3000));
        let cases: Vec<(&str, Value, &str)> = vec![
            ("empty array", json!([]), "items"),
            ("empty map", json!({}), "entries"),
            ("empty string", json!(""), "text"),
            ("a number", json!(12345.5), "json"),
            ("null", Value::Null, "json"),
            (
                "one big map in an array",
                json!([Value::Object(big_map.clone())]),
                "json",
            ),
            (
                "a map of one huge string",
                json!({"body": "word ".repeat(4000)}),
                "json",
            ),
            ("a map of big maps", Value::Object(big_map), "entries"),
            (
                "text without a newline",
                json!("abcdefghij".repeat(2000)),
                "text",
            ),
            ("very long lines", json!(long_line), "text"),
            ("deep nesting", deep, "json"),
            ("escapes", json!("\"\\\u{1}\t\n".repeat(1000)), "text"),
            ("astral characters", json!("😀".repeat(3000)), "text"),
            (
                "keys beyond ASCII",
                json!({"é": string_of(60), "ß": string_of(60), "a": string_of(60), "😀": string_of(60)}),
                "entries",
            ),
        ];
        for budget in [MIN_PAGE_TOKENS, 137, 400, 1040] {
            for (name, value, kind) in &cases {
                let all = check(value, budget);
                // Counted a token a byte, a record alone is over the smaller budgets.
                let bytes_made_json = !cfg!(feature = "tokens") && all[0].field() == "json";
                if all.len() > 1 && !bytes_made_json {
                    assert_eq!(all[0].field(), *kind, "{name} at {budget}");
                }
            }
        }
    }

    /// A string of at least `tokens` tokens as JSON, and not many more.
    fn string_of(tokens: usize) -> Value {
        let mut text = String::new();
        let mut i = 0;
        while count(&json_string(&text)) < tokens {
            text.push_str(&format!("w{i} "));
            i += 1;
        }
        Value::String(text)
    }

    #[test]
    fn a_small_item_between_two_full_ones_makes_the_array_json_text() {
        let budget = 300;
        // Items cannot be cut: a page of the small one alone would be under a quarter.
        let (full, small) = (string_of(budget * 4 / 5 + 5), string_of(budget / 5));
        let value = json!([full.clone(), small, full]);
        let all = check(&value, budget);
        assert_eq!(all[0].field(), "json");
        // One item over the budget: the same.
        let all = check(&json!([1, string_of(budget + 1), 2]), budget);
        assert_eq!(all[0].field(), "json");
        // Items that pair up stay items.
        let half = string_of(budget * 2 / 3);
        let value = json!([half.clone(), 1, half, 2]);
        let all = check(&value, budget);
        assert_eq!(all[0].field(), "items");
        assert_eq!(all.len(), 2);
    }

    #[test]
    fn stored_budgets_under_the_floor_are_read_with_it() {
        let text = key_json(&json!("word ".repeat(3000)));
        let tiny = pages_of(&text, 1).unwrap();
        assert_eq!(tiny, pages_of(&text, MIN_PAGE_TOKENS).unwrap());
        // Pages of 150 tokens, not of one character.
        assert!(tiny.len() * 100 < text.len(), "{} pages", tiny.len());
        assert_eq!(tiny[1].page, 1);
        assert_eq!(tiny[1].pages, tiny.len());
        let last = page_of(&text, 1, tiny.len() - 1).unwrap();
        assert_eq!(last, serde_json::to_value(&tiny[tiny.len() - 1]).unwrap());
        assert!(last["text"].is_string(), "{last}");
        let over = page_of(&text, 1, tiny.len()).unwrap_err();
        assert!(over.contains("pages (0 to"), "{over}");
        assert!(pages_of("{not json", 100).is_err());
    }

    /// Random JSON: strings with lines, escapes and characters beyond ASCII, arrays, maps,
    /// nested.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-z é☕😀\"\\\\\n\t0-9]{0,200}".prop_map(Value::from),
            ("[a-z \n]{0,40}", 0usize..80).prop_map(|(s, n)| Value::from(s.repeat(n))),
        ];
        leaf.prop_recursive(5, 600, 60, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..60).prop_map(Value::Array),
                prop::collection::btree_map("[a-zé]{1,8}", inner, 0..30)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

        /// Any value, any budget from the floor: pages within it, none under a quarter but the
        /// last, together the value, the same every time.
        #[test]
        fn any_value_is_paged_within_the_budget_and_restored_exactly(
            value in json_value(),
            budget in MIN_PAGE_TOKENS..700,
        ) {
            check(&value, budget);
        }
    }
}
