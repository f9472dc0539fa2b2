//! The docs a newcomer reads: short enough to read in minutes, opening with the two commands
//! that run the demo and the tests, and with no link that leads nowhere.

use std::path::{Path, PathBuf};

/// The repository's root, where README.md is.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// README.md, ARCHITECTURE.md and every markdown file in `docs/`.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("a readable entry of docs/").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn readme_and_architecture_fit_their_sizes() {
    for (file, limit) in [("README.md", 15_000), ("ARCHITECTURE.md", 20_000)] {
        let bytes = read(&root().join(file)).len();
        assert!(
            bytes <= limit,
            "{file} is {bytes} bytes; at most {limit}: move detail into docs/"
        );
    }
}

#[test]
fn the_readme_opens_with_the_demo_and_the_tests() {
    let readme = read(&root().join("README.md"));
    let block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README.md has a ```sh block");
    let commands: Vec<&str> = block
        .lines()
        .map(|line| line.split(" #").next().unwrap_or("").trim())
        .collect();
    assert_eq!(
        commands,
        [
            "cargo run --release -- run scripts/demo.rhai",
            "bash .ci/setup && cargo test"
        ],
        "the README's first block must be the demo run and the tests"
    );
    let before = &readme[..readme.find("```sh\n").unwrap()];
    assert!(
        !before.contains("```"),
        "the demo and the tests must be the README's first code block"
    );
}

#[test]
fn every_relative_link_leads_to_a_file_and_a_heading() {
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = read(&file);
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let linked = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !linked.exists() {
                broken.push(format!("{}: {target}: no such file", file.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let is_markdown = linked.extension().is_some_and(|ext| ext == "md");
                if !is_markdown || !headings(&read(&linked)).iter().any(|h| h == anchor) {
                    broken.push(format!("{}: {target}: no such heading", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn links_and_headings_are_read_as_markdown_means_them() {
    let text = "# A `run` and its output\n\nSee [x](a.md#b) and [y](c.md).\n```toml\n[z](no.md)\n```\n`[w](no.md)` and [v](#a-run-and-its-output)\n";
    assert_eq!(links(text), ["a.md#b", "c.md", "#a-run-and-its-output"]);
    assert_eq!(headings(text), ["a-run-and-its-output"]);
}

/// Text outside fenced code blocks, with inline code spans left out.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            // Every other piece between backticks is code.
            let pieces = line.split('`').step_by(2);
            out.extend(pieces);
            out.push('\n');
        }
    }
    out
}

/// The targets of the inline links `[text](target)` in `text`'s prose.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    prose
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')'))
        .map(|(target, _)| target.trim().to_string())
        .collect()
}

/// The anchors of `text`'s headings, as GitHub makes them: lowercase, spaces as hyphens, other
/// punctuation dropped.
fn headings(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut anchors = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(title) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let title = title.trim_start_matches('#').trim();
        let anchor = title
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
                _ => None,
            })
            .collect();
        anchors.push(anchor);
    }
    anchors
}
