//! What `cargo publish` would ship: the library, the CLI, the migrations and the docs the
//! crate docs include, and none of the tests, benches, examples, CI or bench results
//! (`include` in Cargo.toml). Needs no server.

use std::process::Command;

fn packaged_files() -> Vec<String> {
    let output = Command::new(env!("CARGO"))
        .args(["package", "--list", "--allow-dirty", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo package --list failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_package_holds_what_users_build_and_nothing_else() {
    let files = packaged_files();
    for needed in [
        "Cargo.toml",
        "README.md",
        "src/lib.rs",
        "src/bin/dblock/main.rs",
        "docs/crate.md",
        "migrations/postgres/V1__distributed_lock.sql",
        "migrations/mysql/V1__distributed_lock.sql",
        "migrations/sqlite/V1__distributed_lock.sql",
    ] {
        assert!(
            files.iter().any(|f| f == needed),
            "{needed} missing: {files:#?}"
        );
    }
    let unwanted: Vec<&String> = files
        .iter()
        .filter(|f| {
            [
                "tests/",
                "benches/",
                "bench/",
                "examples/",
                ".ci/",
                "target/",
            ]
            .iter()
            .any(|dir| f.starts_with(dir))
        })
        .collect();
    assert!(unwanted.is_empty(), "shipped but not needed: {unwanted:#?}");
    // Every file the crate's sources include must ship, or the package does not build:
    // the migrations (included through a macro) and the docs.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for backend in ["postgres", "mysql", "sqlite"] {
        for entry in std::fs::read_dir(root.join("migrations").join(backend)).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            let path = format!("migrations/{backend}/{name}");
            assert!(files.contains(&path), "{path} is not packaged");
        }
    }
    for path in included_by_the_sources() {
        assert!(
            files.contains(&path),
            "{path} is included by src/ but not packaged"
        );
    }
}

/// The paths of every `include_str!("..")` in `src/`, relative to the package root
/// (the README's doc tests are compiled only in the repository).
fn included_by_the_sources() -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a readable directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a readable file");
            for (at, _) in text.match_indices("include_str!(\"") {
                let rest = &text[at + "include_str!(\"".len()..];
                let relative = &rest[..rest.find('"').expect("a closing quote")];
                if relative.ends_with("README.md") {
                    continue;
                }
                let resolved = dir.join(relative).canonicalize().expect("an included file");
                let shown = resolved.strip_prefix(root).expect("inside the package");
                found.push(shown.to_string_lossy().into_owned());
            }
        }
    }
    assert!(!found.is_empty(), "no include_str! found in src/");
    found
}
