//! Every page of `docs/` is a doc test: src/lib.rs's `guide` module includes each one, so that
//! each `rust` block of the guide compiles (`cargo test --all-features --doc`). This test fails
//! when a page is added to `docs/` without being listed there, which would leave its blocks
//! unchecked.

use std::fs;
use std::path::Path;

#[test]
fn every_page_of_the_guide_is_included_as_a_doc_test() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = fs::read_to_string(root.join("src/lib.rs")).expect("src/lib.rs");
    let mut pages: Vec<String> = fs::read_dir(root.join("docs"))
        .expect("the docs/ folder")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .filter_map(|path| Some(path.file_name()?.to_str()?.to_owned()))
        .collect();
    pages.sort();
    assert!(
        pages.len() >= 10,
        "expected the guide's pages, found {pages:?}"
    );
    let missing: Vec<&String> = pages
        .iter()
        .filter(|page| !lib.contains(&format!("= \"{page}\";")))
        .collect();
    assert!(
        missing.is_empty(),
        "pages of docs/ not in src/lib.rs's `guide` module (add `Name = \"page.md\";`): {missing:?}"
    );
}
