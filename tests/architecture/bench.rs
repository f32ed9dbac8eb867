//! The bench's import graph (`benches/compare`), checked as `src/`'s is, with layers of
//! its own and one module per file: a section's cells are apart from each other and from
//! what they share, so a circle between two files of one folder counts. Its paths are
//! read as Rust resolves them: `crate::`, `super::`, `self::`, a module's own `mod`
//! children named bare, and groups (`use super::{round::Round, tasks::Side}`).

use std::collections::BTreeSet;
use std::path::Path;

use super::{Graph, assert_no_circle, assert_no_upward_import, assert_placed};

/// The bench's layers, top to bottom; `main` is the crate root (main.rs). A module may
/// import from its own layer (without a circle) and from any layer below it.
const BENCH_LAYERS: &[(&str, &[&str])] = &[
    ("main", &["main"]),
    (
        "sections",
        &[
            "console",
            "cycle",
            "history",
            "hotkey",
            "primitives",
            "reaper",
            "renewal",
            "stock",
        ],
    ),
    (
        "cells",
        &[
            "console::locks_page",
            "cycle::anatomy",
            "cycle::overhead",
            "cycle::reference",
            "cycle::uncontended",
            "history::batches",
            "history::cycle",
            "hotkey::contended",
            "hotkey::fair",
            "hotkey::pool",
            "hotkey::procs",
            "primitives::election_procs",
            "primitives::failover",
            "primitives::permits_procs",
            "primitives::rw_peer",
            "primitives::throughput",
            "primitives::writer",
        ],
    ),
    (
        "the cells' contenders and helpers",
        &[
            "hotkey::ceiling",
            "hotkey::load",
            "hotkey::queue",
            "hotkey::recording",
            "hotkey::thread",
            "hotkey::workers",
            "primitives::contenders",
            "primitives::rw_lines",
            "stock::hand",
        ],
    ),
    (
        "what a section's cells share",
        &[
            "cycle::comparison",
            "hotkey::round",
            "hotkey::tasks",
            "primitives::loads",
            "primitives::procs",
        ],
    ),
    (
        "what every section shares",
        &[
            "contenders",
            "handwritten",
            "handwritten::floor",
            "handwritten::seeds",
            "handwritten::write",
            "servers",
            "servers::mysql",
            "servers::postgres",
            "servers::sqlite",
            "stock_example",
            "workers",
        ],
    ),
    (
        "leaves",
        &["heap", "measure", "report", "settings", "trace"],
    ),
];

/// Rust code without its comments and without the insides of its string and character
/// literals (each left as `""`), so that a path in either is not taken for an import.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |k: usize| c[k].is_alphanumeric() || c[k] == '_';
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c[i] == 'r' && (i == 0 || !ident(i - 1)) && matches!(next, Some('#' | '"')) {
            // A raw string: r"..." or r#"..."#, ended by a quote and as many hashes.
            let hashes = c[i + 1..].iter().take_while(|&&h| h == '#').count();
            if c.get(i + 1 + hashes) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            i += hashes + 2;
            while i < c.len() && !(c[i] == '"' && c[i + 1..].iter().take(hashes).all(|&h| h == '#'))
            {
                i += 1;
            }
            i += hashes + 1;
            out.push_str("\"\"");
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && next == Some('\\') {
            // An escaped character literal: '\n', '\'', '\u{..}'.
            i += 2;
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push_str("\"\"");
        } else {
            // Anything else, a lifetime's quote included.
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Identifiers, `::`, and every other character but whitespace as a token of its own.
fn tokens(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut word = c.to_string();
            while let Some(&n) = chars.peek().filter(|n| n.is_alphanumeric() || **n == '_') {
                word.push(n);
                chars.next();
            }
            out.push(word);
        } else if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.push("::".to_owned());
        } else if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    out
}

/// A module of the bench: its path from the crate root and the tokens of its file.
struct BenchModule {
    path: Vec<String>,
    tokens: Vec<String>,
    /// Its `mod` children, by name.
    children: BTreeSet<String>,
}

/// A module's name in the graph: `hotkey::round`, or `main` for the crate root.
fn bench_name(path: &[String]) -> String {
    if path.is_empty() {
        "main".to_owned()
    } else {
        path.join("::")
    }
}

/// The bench's modules, found from main.rs through their `mod` declarations. A module
/// declared with `#[path]` outside the bench (the stock example's) is known by name, not
/// read: its paths are not the bench's.
fn bench_modules() -> (Vec<BenchModule>, BTreeSet<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/compare");
    let mut known = BTreeSet::new();
    let mut read = Vec::new();
    let mut todo = vec![(Vec::<String>::new(), root.join("main.rs"), root.clone())];
    while let Some((path, file, dir)) = todo.pop() {
        known.insert(bench_name(&path));
        let text = std::fs::read_to_string(&file).expect("a readable bench file");
        let tokens = tokens(&code_only(&text));
        let mut children = BTreeSet::new();
        for w in tokens.windows(3) {
            if w[0] == "mod" && w[2] == ";" {
                children.insert(w[1].clone());
            }
        }
        for child in &children {
            let mut child_path = path.clone();
            child_path.push(child.clone());
            let flat = dir.join(format!("{child}.rs"));
            let folder = dir.join(child).join("mod.rs");
            if flat.exists() {
                todo.push((child_path, flat, dir.join(child)));
            } else if folder.exists() {
                todo.push((child_path, folder, dir.join(child)));
            } else {
                known.insert(bench_name(&child_path));
            }
        }
        read.push(BenchModule {
            path,
            tokens,
            children,
        });
    }
    (read, known)
}

/// Every path `module` names that starts at the crate, itself, its parent or one of its
/// children, made absolute, groups spread out (`a::{b, c::d}` is `a::b` and `a::c::d`).
fn bench_paths(module: &BenchModule) -> Vec<Vec<String>> {
    let t = &module.tokens;
    let mut found = Vec::new();
    for i in 0..t.len() {
        let starts = i == 0 || t[i - 1] != "::";
        if !starts || t.get(i + 1).map(String::as_str) != Some("::") {
            continue;
        }
        let mut at = i;
        let mut prefix = match t[i].as_str() {
            "crate" => Vec::new(),
            "self" => module.path.clone(),
            "super" => module.path[..module.path.len().saturating_sub(1)].to_vec(),
            child if module.children.contains(child) => {
                let mut p = module.path.clone();
                p.push(child.to_owned());
                p
            }
            _ => continue,
        };
        // `super::super::`
        while t.get(at + 1).map(String::as_str) == Some("::")
            && t.get(at + 2).map(String::as_str) == Some("super")
        {
            prefix.pop();
            at += 2;
        }
        path_tail(t, at + 1, prefix, &mut found);
    }
    found
}

/// Reads the rest of a path from `t[at]` (a `::` or its end) on, after `prefix`; pushes
/// each whole path onto `found` and returns where it ended.
fn path_tail(
    t: &[String],
    mut at: usize,
    mut prefix: Vec<String>,
    found: &mut Vec<Vec<String>>,
) -> usize {
    while t.get(at).map(String::as_str) == Some("::") {
        match t.get(at + 1).map(String::as_str) {
            Some("{") => {
                at += 2;
                while at < t.len() && t[at] != "}" {
                    if t[at] == "," {
                        at += 1;
                        continue;
                    }
                    let mut item = prefix.clone();
                    if t[at] != "self" && t[at] != "*" {
                        item.push(t[at].clone());
                    }
                    at = path_tail(t, at + 1, item, found);
                    // `as alias`
                    while at < t.len() && t[at] != "," && t[at] != "}" {
                        at += 1;
                    }
                }
                return at + 1;
            }
            Some(word) if word.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                prefix.push(word.to_owned());
                at += 2;
            }
            // `::<` (a turbofish) or `::*`: the path ends here.
            _ => break,
        }
    }
    found.push(prefix);
    at
}

/// The module a path ends in: its longest beginning that is a known module.
fn module_of_path(path: &[String], known: &BTreeSet<String>) -> String {
    (0..=path.len())
        .rev()
        .map(|n| bench_name(&path[..n]))
        .find(|name| known.contains(name))
        .unwrap_or_else(|| "main".to_owned())
}

fn bench_graph() -> Graph {
    let (modules, known) = bench_modules();
    let mut graph: Graph = known.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    for module in &modules {
        let name = bench_name(&module.path);
        for path in bench_paths(module) {
            let imported = module_of_path(&path, &known);
            if imported != name {
                graph.entry(name.clone()).or_default().insert(imported);
            }
        }
    }
    graph
}

#[test]
fn every_bench_module_has_a_layer() {
    assert_placed(
        &bench_graph(),
        BENCH_LAYERS,
        "BENCH_LAYERS (tests/architecture/bench.rs)",
    );
}

#[test]
fn no_bench_module_imports_from_a_layer_above_it() {
    assert_no_upward_import(&bench_graph(), BENCH_LAYERS);
}

#[test]
fn no_import_circles_in_the_bench() {
    assert_no_circle(&bench_graph());
}

#[test]
fn the_bench_checker_reads_paths_as_rust_does() {
    let code = code_only(
        "use super::{round::{Counts, Round}, tasks::{self, Side}};\n\
         // crate::main_only\n/* crate::a /* nested */ crate::b */\n\
         let s = \"crate::in_a_string\"; let r = r#\"crate::raw\"#; let q = '\"';\n\
         load::counting_pool::<DB>(&url); crate::servers::BenchDb::NAME; fn f<'a>() {}\n\
         use crate::{report::Table, measure::*}; super::super::settings::Settings",
    );
    let module = BenchModule {
        path: vec!["hotkey".into(), "contended".into()],
        tokens: tokens(&code),
        children: ["load".to_owned()].into(),
    };
    let known: BTreeSet<String> = [
        "main",
        "hotkey",
        "hotkey::contended",
        "hotkey::contended::load",
        "hotkey::round",
        "hotkey::tasks",
        "servers",
        "report",
        "measure",
        "settings",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    let named: BTreeSet<String> = bench_paths(&module)
        .iter()
        .map(|p| module_of_path(p, &known))
        .collect();
    let expected = [
        "hotkey::round",
        "hotkey::tasks",
        "hotkey::contended::load",
        "servers",
        "report",
        "measure",
        "settings",
    ];
    assert_eq!(named, expected.into_iter().map(str::to_owned).collect());
}
