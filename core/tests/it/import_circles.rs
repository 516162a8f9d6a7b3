//! No import circles: the modules of core (`core/src`), of the dashboard
//! (`src`) and of the tools (`tools/src`) depend on each other one way. A circle (`lease/store` names
//! `metrics`, which names `maintenance`, which names `lease/client`, which
//! names `lease/store`) means none of them can be read, moved or tested
//! without the others, and it grows unnoticed one `use` at a time.
//!
//! The check reads the sources, not the compiler: every path a file's code
//! names (`use` trees and paths written inline, comments and strings left
//! out, tests left out) through `crate::`, `$crate::`, `super::` or
//! `self::`, resolved to the module it lands in. Modules are taken two
//! levels deep (`lease/store`, `queue/store`, `metrics`): deeper files
//! count as their two-level ancestor, so a circle inside one room (the
//! files of `queue/store/`) is that room's business. A module naming its own
//! submodules (declaring and re-exporting them) is not a dependency; a
//! submodule naming its parent is.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// How many levels of the module tree are nodes of the graph.
const DEPTH: usize = 2;

#[test]
fn core_has_no_import_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert_no_circles(&src);
}

#[test]
fn the_dashboard_has_no_import_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    assert_no_circles(&src);
}

#[test]
fn the_tools_have_no_import_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/src");
    assert_no_circles(&src);
}

#[test]
fn the_check_finds_a_circle_and_ignores_comments_strings_and_tests() {
    let files = [
        (
            "lease/store.rs",
            "use crate::metrics;\nfn f() { crate::metrics::took_over(1); }",
        ),
        (
            "metrics.rs",
            "fn f() { for t in crate::maintenance::Table::ALL {} }",
        ),
        (
            "maintenance/mod.rs",
            "use crate::lease::{client::LeaseTiming, Holder};\n\
             // crate::worker is only mentioned\n\
             const S: &str = \"crate::worker::run\";",
        ),
        (
            "lease/client.rs",
            "use super::store::{self, Acquired};\nuse super::{Holder};",
        ),
        (
            "lease/mod.rs",
            "pub mod client;\npub mod store;\npub use store::Acquired;",
        ),
        (
            "worker/mod.rs",
            "#[cfg(test)]\nmod tests {\n    use crate::maintenance;\n}\n\
             fn f() -> char { '{' }",
        ),
    ];
    let graph = graph_of(
        files
            .iter()
            .map(|(p, s)| (module_of(Path::new(p)), s.to_string())),
    );
    let circles = circles(&graph);
    assert_eq!(
        circles,
        vec![vec![
            "lease/client".to_string(),
            "lease/store".into(),
            "metrics".into(),
            "maintenance".into(),
        ]],
        "{graph:?}"
    );
    assert!(!graph.contains_key("worker"), "{graph:?}");
    assert!(!graph["maintenance"].contains("worker"), "{graph:?}");
}

/// Fails naming each circle among the modules under `src`.
fn assert_no_circles(src: &Path) {
    let mut files = Vec::new();
    sources(src, src, &mut files);
    assert!(!files.is_empty(), "no sources under {}", src.display());
    let graph = graph_of(files.into_iter());
    let circles = circles(&graph);
    let described: Vec<String> = circles
        .iter()
        .map(|circle| {
            let mut steps = Vec::new();
            for (i, from) in circle.iter().enumerate() {
                let to = &circle[(i + 1) % circle.len()];
                steps.push(format!("{from} → {to}"));
            }
            steps.join(", ")
        })
        .collect();
    assert!(
        circles.is_empty(),
        "import circles under {}:\n{}",
        src.display(),
        described.join("\n")
    );
}

/// The `.rs` files under `dir`, each as its module path and its text,
/// but the files that hold only tests.
fn sources(root: &Path, dir: &Path, out: &mut Vec<(Vec<String>, String)>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_stem().is_some_and(|s| s != "tests")
        {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((module_of(path.strip_prefix(root).unwrap()), text));
        }
    }
}

/// The module path of a file, relative to its crate's `src`.
fn module_of(relative: &Path) -> Vec<String> {
    let mut segments: Vec<String> = relative
        .with_extension("")
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if matches!(
        segments.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        segments.pop();
    }
    segments
}

/// The graph's node for a module path.
fn node(module: &[String]) -> String {
    module[..module.len().min(DEPTH)].join("/")
}

/// Each node's dependencies on other nodes.
fn graph_of(
    files: impl Iterator<Item = (Vec<String>, String)>,
) -> BTreeMap<String, BTreeSet<String>> {
    let files: Vec<(Vec<String>, String)> = files.collect();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, text) in &files {
        let from = node(module);
        for path in paths(&code_of(text)) {
            let Some(target) = resolve(module, &path, &modules) else {
                continue;
            };
            let to = node(&target);
            // A module naming itself, or its own submodules (declaring and
            // re-exporting them), is no dependency.
            if to == from || target.starts_with(module) {
                continue;
            }
            graph.entry(from.clone()).or_default().insert(to);
        }
    }
    graph
}

/// The module `path` (as written in `module`: `crate::…`, `super::…`,
/// `self::…`) lands in: the longest prefix of it that is a module of the
/// crate. `None` for paths into other crates.
fn resolve(
    module: &[String],
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut segments = path.iter().peekable();
    let mut at: Vec<String> = match segments.peek().map(|s| s.as_str()) {
        Some("crate" | "$crate") => {
            segments.next();
            Vec::new()
        }
        Some("super" | "self") => module.to_vec(),
        _ => return None,
    };
    while let Some(step) = segments.peek() {
        match step.as_str() {
            "super" => {
                at.pop()?;
            }
            "self" => {}
            _ => break,
        }
        segments.next();
    }
    let rest: Vec<&String> = segments.collect();
    for len in (0..=rest.len()).rev() {
        let mut candidate = at.clone();
        candidate.extend(rest[..len].iter().map(|s| s.to_string()));
        if modules.contains(&candidate) {
            return Some(candidate);
        }
    }
    Some(at)
}

/// The circles of `graph`: each strongly connected component of more than
/// one node, its nodes in the order of one walk round it.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for start in graph.keys() {
        if seen.contains(start) {
            continue;
        }
        let reach_from_start = reachable(graph, start);
        let component: BTreeSet<String> = reach_from_start
            .iter()
            .filter(|n| reachable(graph, n).contains(start))
            .cloned()
            .collect();
        seen.extend(component.iter().cloned());
        if component.len() > 1 {
            out.push(walk_round(graph, start, &component));
        }
    }
    out
}

/// The nodes reachable from `from` (itself included).
fn reachable(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut reached = BTreeSet::from([from.to_string()]);
    let mut todo = vec![from.to_string()];
    while let Some(n) = todo.pop() {
        for next in graph.get(&n).into_iter().flatten() {
            if reached.insert(next.clone()) {
                todo.push(next.clone());
            }
        }
    }
    reached
}

/// One shortest walk from `start` back to itself inside `component`.
fn walk_round(
    graph: &BTreeMap<String, BTreeSet<String>>,
    start: &str,
    component: &BTreeSet<String>,
) -> Vec<String> {
    // Breadth first from start's successors until start comes round again.
    let mut came_from: BTreeMap<String, String> = BTreeMap::new();
    let mut frontier = vec![start.to_string()];
    'search: while !frontier.is_empty() {
        let mut next_frontier = Vec::new();
        for n in frontier {
            for next in graph.get(&n).into_iter().flatten() {
                if !component.contains(next) || came_from.contains_key(next) {
                    continue;
                }
                came_from.insert(next.clone(), n.clone());
                if next == start {
                    break 'search;
                }
                next_frontier.push(next.clone());
            }
        }
        frontier = next_frontier;
    }
    let mut walk = vec![start.to_string()];
    let mut at = came_from[start].clone();
    while at != start {
        walk.push(at.clone());
        at = came_from[&at].clone();
    }
    walk.reverse();
    walk.rotate_right(1);
    walk
}

/// `text` without its comments, string and character literals, and
/// `#[cfg(test)]` modules: the code whose paths are dependencies.
fn code_of(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"…", r#"…"#, and so on.
            let mut hashes = 0;
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{…}'), or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    without_test_modules(&out)
}

/// `code` without its `#[cfg(test)] mod … { … }` blocks.
fn without_test_modules(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let Some(open) = trimmed
            .starts_with("mod ")
            .then(|| trimmed.find(['{', ';']))
            .flatten()
        else {
            rest = after;
            continue;
        };
        if trimmed.as_bytes()[open] == b';' {
            rest = &trimmed[open + 1..];
            continue;
        }
        let mut depth = 0;
        let mut end = trimmed.len();
        for (k, ch) in trimmed[open..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &trimmed[end..];
    }
    out.push_str(rest);
    out
}

/// Every path `code` names through the crate: `use` trees expanded, and
/// paths written inline (`crate::metrics::took_over(…)`).
fn paths(code: &str) -> Vec<Vec<String>> {
    let tokens = tokens(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "use" {
            let end = tokens[i..]
                .iter()
                .position(|t| t == ";")
                .map_or(tokens.len(), |p| i + p);
            use_tree(&tokens[i + 1..end], &[], &mut out);
            i = end + 1;
            continue;
        }
        let t = tokens[i].as_str();
        let starts_path = matches!(t, "crate" | "$crate" | "super" | "self")
            && tokens.get(i + 1).is_some_and(|n| n == "::")
            && !(i > 0 && tokens[i - 1] == "::");
        if starts_path {
            let mut path = vec![t.to_string()];
            let mut j = i + 1;
            while tokens.get(j).is_some_and(|n| n == "::")
                && tokens.get(j + 1).is_some_and(|n| is_ident(n))
            {
                path.push(tokens[j + 1].clone());
                j += 2;
            }
            out.push(path);
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// The paths of a `use` tree (`crate::{a::b, c::{self, d}}`), each after
/// `prefix`.
fn use_tree(tokens: &[String], prefix: &[String], out: &mut Vec<Vec<String>>) {
    // Split at the commas of this level.
    let mut depth = 0;
    let mut start = 0;
    let mut parts = Vec::new();
    for (k, t) in tokens.iter().enumerate() {
        match t.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "," if depth == 0 => {
                parts.push(&tokens[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&tokens[start..]);
    for part in parts {
        let mut path = prefix.to_vec();
        let mut k = 0;
        while k < part.len() {
            match part[k].as_str() {
                "::" => k += 1,
                "{" => {
                    let close = part.len() - 1;
                    use_tree(&part[k + 1..close], &path, out);
                    path.clear();
                    break;
                }
                "as" | "*" => break,
                ident => {
                    path.push(ident.to_string());
                    k += 1;
                }
            }
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
}

fn is_ident(token: &str) -> bool {
    token
        .chars()
        .all(|c| c.is_alphanumeric() || c == '_' || c == '$')
        && !token.is_empty()
}

/// Identifiers (with `$crate`), `::`, and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' || c == '$' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '$')
            {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".to_string());
            i += 2;
        } else if c.is_whitespace() {
            i += 1;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}
