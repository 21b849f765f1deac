//! No broken link in the docs: every relative link and `#anchor` in `README.md`,
//! `CONTRIBUTING.md` and `docs/*.md` resolves to a file (or folder) of the repository and, for an
//! anchor, to a heading of the page it points at, slugged as GitHub slugs them. No network:
//! links with a scheme (`https:`, `mailto:`) are not followed.
//!
//! The checker is tested on pages made for the purpose (a missing file, a missing anchor, code
//! that only looks like a link), so that a checker that finds nothing cannot pass for one that
//! found nothing wrong.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    let mut guide: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("the docs/ folder")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    guide.sort();
    assert!(
        guide.len() >= 10,
        "expected the guide's pages in docs/, found {guide:?}"
    );
    pages.extend(guide);

    let broken = broken_links(root, &pages);
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_checker_reports_a_missing_file_and_a_missing_anchor_and_nothing_else() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let root = dir.path();
    fs::create_dir(root.join("docs")).unwrap();
    fs::write(
        root.join("README.md"),
        "# Title\n\n## Redis under memory pressure (`maxmemory`)\n\n\
         [ok](docs/page.md) [ok](docs/page.md#the-stampede-examplesstampede_benchrs) \
         [ok](#redis-under-memory-pressure-maxmemory) [ok](docs/) ![ok](docs/page.md)\n\
         [ok](https://example.com/nowhere.md) [ok](docs/page.md#a-heading-1)\n\
         [gone](docs/missing.md) [bad anchor](docs/page.md#no-such-heading)\n\
         `[code](not/a/link.md)`\n\n```sh\n[also code](nowhere.md)\n```\n\n\
         [ref]: docs/also-missing.md\n",
    )
    .unwrap();
    fs::write(
        root.join("docs/page.md"),
        "# Page\n\n## The stampede: `examples/stampede_bench.rs`\n\n## A heading\n\n## A heading\n\n\
         [back](../README.md#title) [self](#page) [bad](#nope)\n",
    )
    .unwrap();

    let pages = [root.join("README.md"), root.join("docs/page.md")];
    let broken = broken_links(root, &pages);
    let targets: Vec<&str> = broken
        .iter()
        .map(|line| line.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(
        targets,
        [
            "docs/missing.md",
            "docs/page.md#no-such-heading",
            "docs/also-missing.md",
            "#nope"
        ],
        "{broken:#?}"
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("Redis under memory pressure (`maxmemory`)"),
        "redis-under-memory-pressure-maxmemory"
    );
    assert_eq!(
        slug("The stampede: `examples/stampede_bench.rs`"),
        "the-stampede-examplesstampede_benchrs"
    );
    assert_eq!(
        slug("Freshness under steady load: hard expiry, stale-while-revalidate, XFetch"),
        "freshness-under-steady-load-hard-expiry-stale-while-revalidate-xfetch"
    );
    assert_eq!(slug("Keys, values, TTLs"), "keys-values-ttls");
    assert_eq!(slug("A — B"), "a--b");
    assert_eq!(
        slug("[The lock](lock.md) on its own"),
        "the-lock-on-its-own"
    );
}

/// Every link of `pages` that does not resolve, as `page:line: target`.
fn broken_links(root: &Path, pages: &[PathBuf]) -> Vec<String> {
    let mut anchors: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    let mut broken = Vec::new();
    for page in pages {
        let text = fs::read_to_string(page)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", page.display()));
        let here = page.parent().expect("a page sits in a folder");
        for (line, target) in links(&text) {
            if has_scheme(&target) {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                here.join(path)
            };
            let ok = file.exists()
                && inside(root, &file)
                && anchor.is_none_or(|anchor| {
                    let known = anchors
                        .entry(file.clone())
                        .or_insert_with(|| headings_of(&file));
                    known.contains(anchor)
                });
            if !ok {
                let shown = page.strip_prefix(root).unwrap_or(page);
                broken.push(format!("{}:{line}: {target}", shown.display()));
            }
        }
    }
    broken
}

/// Whether `file` is inside the repository (a link to `../../elsewhere` is broken on GitHub).
fn inside(root: &Path, file: &Path) -> bool {
    match (root.canonicalize(), file.canonicalize()) {
        (Ok(root), Ok(file)) => file.starts_with(root),
        _ => false,
    }
}

fn has_scheme(target: &str) -> bool {
    target.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty() && scheme.bytes().all(|b| b.is_ascii_alphabetic())
    })
}

/// The anchors a page offers: its headings' slugs (a repeated heading gets `-1`, `-2`, ... as on
/// GitHub), plus explicit `id="..."`/`name="..."` attributes. Not a Markdown file: none.
fn headings_of(file: &Path) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    if file.extension().is_none_or(|ext| ext != "md") {
        return anchors;
    }
    let Ok(text) = fs::read_to_string(file) else {
        return anchors;
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    for line in prose_lines(&text) {
        let trimmed = line.trim_start();
        let hashes = trimmed.bytes().take_while(|&b| b == b'#').count();
        if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
            let base = slug(trimmed[hashes..].trim().trim_end_matches('#').trim());
            let n = seen.entry(base.clone()).or_insert(0);
            anchors.insert(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                rest = &rest[at + attr.len()..];
                if let Some(end) = rest.find('"') {
                    anchors.insert(rest[..end].to_owned());
                }
            }
        }
    }
    anchors
}

/// GitHub's slug of a heading: the rendered text (a link counts as its text), lower-cased, with
/// everything but letters, digits, `-`, `_` and spaces removed, and each space a `-`.
fn slug(heading: &str) -> String {
    let text = link_texts(heading);
    text.chars()
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// `[text](target)` → `text`.
fn link_texts(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        match after.find("](").and_then(|close| {
            let tail = &after[close + 2..];
            tail.find(')').map(|end| (close, close + 2 + end + 1))
        }) {
            Some((close, end)) => {
                out.push_str(&rest[..open]);
                out.push_str(&after[..close]);
                rest = &after[end..];
            }
            None => {
                out.push_str(&rest[..=open]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The lines of `text` outside fenced code blocks, with their inline code spans removed.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let marker = if trimmed.starts_with("```") {
            Some("```")
        } else if trimmed.starts_with("~~~") {
            Some("~~~")
        } else {
            None
        };
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => lines.push(line),
            _ => {}
        }
    }
    lines
}

/// Every link target in `text` with its line number: inline links and images `[..](target)` and
/// reference definitions `[name]: target`, outside code.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut fence: Option<&str> = None;
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                continue;
            }
            (Some(open), Some(m)) if open == m => {
                fence = None;
                continue;
            }
            (Some(_), _) => continue,
            (None, None) => {}
        }
        let prose = without_code_spans(line);
        if let Some(definition) = prose.trim_start().strip_prefix('[') {
            if let Some((_, target)) = definition
                .split_once("]:")
                .filter(|(label, _)| !label.contains(']'))
            {
                if let Some(target) = target.split_whitespace().next() {
                    found.push((i + 1, target.trim_matches(['<', '>']).to_owned()));
                }
                continue;
            }
        }
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let end = tail.find(')').unwrap_or(tail.len());
            let target = tail[..end].split_whitespace().next().unwrap_or("");
            found.push((i + 1, target.trim_matches(['<', '>']).to_owned()));
            rest = &tail[end..];
        }
    }
    found
}

/// `line` with every `` `code` `` span removed (a span may use several backticks).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(open) = rest.find('`') {
        let ticks = rest[open..].bytes().take_while(|&b| b == b'`').count();
        let delimiter = &rest[open..open + ticks];
        let after = &rest[open + ticks..];
        match after.find(delimiter) {
            Some(close) => {
                out.push_str(&rest[..open]);
                rest = &after[close + ticks..];
            }
            None => {
                out.push_str(rest);
                return out;
            }
        }
    }
    out.push_str(rest);
    out
}
