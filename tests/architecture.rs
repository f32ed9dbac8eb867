//! The import graphs of `src/` and of the bench (`benches/compare`): no circle between
//! modules and no module importing from a layer above its own (docs/architecture.md for
//! `src/`, `benches/compare/main.rs` for the bench). It reads the sources, so it needs no
//! server; `cargo test --test architecture -- --nocapture` prints the graphs.
//!
//! In `src/`, a module's files (`engine/renewal.rs` under `engine`) count as that module:
//! a parent and its children are one unit. Imports are `crate::module` paths outside
//! comments. The bench is read file by file (`architecture/bench.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, top to bottom, as `src/lib.rs` lists them. A module may import from its
/// own layer (without a circle) and from any layer below it.
const LAYERS: &[(&str, &[&str])] = &[
    // The web console (feature `web`): pages over the API, which nothing below may use.
    ("console", &["web"]),
    (
        "API",
        &[
            "lib",
            "admin",
            "any",
            "campaign",
            "election",
            "fencing",
            "guard",
            "history",
            "job",
            "locker",
            "multi",
            "optimistic",
            "owner",
            "primitive",
            "row_lock",
            "rwlock",
            "schedule",
            "semaphore",
        ],
    ),
    (
        "lock algorithm",
        &[
            "core",
            "acquire",
            "engine",
            "fair",
            "lease",
            "line",
            "queue",
            "reaper",
            "recorder",
            "several",
            "stand_aside",
            "wakeups",
        ],
    ),
    ("lock-table access", &["table", "migrate"]),
    ("per-database statements", &["dialect"]),
    (
        "leaves",
        &[
            "config",
            "error",
            "ident",
            "inflight",
            "jobs",
            "key_label",
            "metrics",
            "retry",
            "stats",
        ],
    ),
];

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.ends_with("bin") {
            // The CLI is a crate of its own, a user of the library's API.
            continue;
        } else if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// The top-level module a file belongs to: `src/engine/renewal.rs` -> `engine`.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("a file under src/");
    let first = relative.components().next().expect("a path");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_owned()
}

/// Every `crate::name` (and a macro's `$crate::name`) on a line that is not a comment.
fn imports_of(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
            rest = after;
        }
    }
    found
}

fn import_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let module = module_of(&src, &file);
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        let imports = graph.entry(module.clone()).or_default();
        for imported in imports_of(&text) {
            if imported != module {
                imports.insert(imported);
            }
        }
    }
    graph
}

type Layers = [(&'static str, &'static [&'static str])];
type Graph = BTreeMap<String, BTreeSet<String>>;

fn layer_of(layers: &Layers, module: &str) -> Option<usize> {
    layers
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

/// The modules of `graph` that `layers` does not place.
fn unplaced(graph: &Graph, layers: &Layers) -> Vec<String> {
    graph
        .keys()
        .filter(|m| layer_of(layers, m).is_none())
        .cloned()
        .collect()
}

/// Every import of a module from a layer above its own (or from no layer at all), in
/// words.
fn upward_imports(graph: &Graph, layers: &Layers) -> Vec<String> {
    let mut upward = Vec::new();
    for (module, imports) in graph {
        let Some(own) = layer_of(layers, module) else {
            continue;
        };
        for imported in imports {
            match layer_of(layers, imported) {
                Some(theirs) if theirs < own => upward.push(format!(
                    "{module} ({}) imports {imported} ({})",
                    layers[own].0, layers[theirs].0
                )),
                Some(_) => {}
                // src/: a re-export through lib.rs (`crate::Error`) instead of the
                // defining module.
                None => upward.push(format!("{module} imports {imported}, in no layer")),
            }
        }
    }
    upward
}

/// Every circle of `graph`, one per module on it, as the path that closes it.
fn circles(graph: &Graph) -> Vec<String> {
    graph
        .keys()
        .filter_map(|module| circle_from(graph, module))
        .map(|path| path.join(" -> "))
        .collect()
}

fn print_graph(graph: &Graph) {
    for (module, imports) in graph {
        println!("{module:>20} -> {}", imports.len());
        println!("{:>20}    {imports:?}", "");
    }
}

/// A circle through `start`, if there is one, as the path that closes it.
fn circle_from(graph: &Graph, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &Graph,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        let here = path.last().expect("a non-empty path").clone();
        for next in graph.get(&here).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_owned()];
    let mut seen = BTreeSet::new();
    walk(graph, start, &mut path, &mut seen).then_some(path)
}

/// Fails unless `layers` places every module of `graph`; `list` names where they are
/// listed.
fn assert_placed(graph: &Graph, layers: &Layers, list: &str) {
    let unplaced = unplaced(graph, layers);
    assert!(
        unplaced.is_empty(),
        "modules missing from {list}: {unplaced:?}"
    );
}

/// Prints `graph` (seen with `--nocapture`), then fails on any upward import.
fn assert_no_upward_import(graph: &Graph, layers: &Layers) {
    print_graph(graph);
    let upward = upward_imports(graph, layers);
    assert!(upward.is_empty(), "upward imports: {upward:#?}");
}

fn assert_no_circle(graph: &Graph) {
    let circles = circles(graph);
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

#[test]
fn every_module_has_a_layer() {
    assert_placed(
        &import_graph(),
        LAYERS,
        "LAYERS (tests/architecture.rs) and docs/architecture.md",
    );
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    assert_no_upward_import(&import_graph(), LAYERS);
}

#[test]
fn no_import_circles() {
    assert_no_circle(&import_graph());
}

#[test]
fn the_checker_sees_a_circle_and_an_upward_import() {
    // The checks above must be able to fail: a made-up graph with both faults.
    let mut graph = Graph::new();
    graph.insert("acquire".into(), ["core".into()].into());
    graph.insert("core".into(), ["acquire".into(), "guard".into()].into());
    assert_eq!(circles(&graph).len(), 2);
    assert_eq!(
        upward_imports(&graph, LAYERS),
        ["core (lock algorithm) imports guard (API)"]
    );
    assert_eq!(
        imports_of("use crate::table::X;\n// crate::guard\n$crate::dialect::Y"),
        ["dialect".to_owned(), "table".to_owned()].into()
    );
}

// The bench's graph, read file by file.
#[path = "architecture/bench.rs"]
mod bench;
