//! The shape of `src/`, checked: no import cycles among its modules, the
//! top-level parts (`src/x.rs` with `src/x/`) in the layers of [`LAYERS`],
//! each importing only the layers below it, the configuration independent
//! of everything that runs, and one module that reads a clock. `cargo test --test all architecture:: -- --nocapture` prints the
//! module graph (who imports whom).
//!
//! Edges are read from the source text: `use` trees and every
//! `crate::`/`super::`/`self::` path outside comments, string literals and
//! `#[cfg(test)]` modules, each resolved to the deepest module it names.
//! A `mod x;` declaration alone is not an import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`store::redis::conn`; `crate` for lib.rs) → source text.
fn modules() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                if let Some(name) = module_name(&root, &path) {
                    out.insert(name, std::fs::read_to_string(&path).expect("read source"));
                }
            }
        }
    }
    out
}

fn module_name(root: &Path, path: &Path) -> Option<String> {
    let rel: PathBuf = path.strip_prefix(root).ok()?.with_extension("");
    let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    match parts.as_slice() {
        [one] if one == "lib" => Some("crate".into()),
        // The binary is its own crate: it sees the library through `wxgate::`.
        [one] if one == "main" => None,
        _ => Some(parts.join("::")),
    }
}

/// The code of a file without comments, string and char literals, and its
/// `#[cfg(test)]` module (which sits at the end of the file by convention).
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'"' => {
                // A raw string r#"..."# has its `r#` already copied: skip to the matching close.
                let hashes = text[..i].chars().rev().take_while(|&c| c == '#').count();
                i += 1;
                while i < b.len() {
                    if b[i] == b'\\' && hashes == 0 {
                        i += 2;
                        continue;
                    }
                    if b[i] == b'"' && b[i + 1..].iter().take(hashes).all(|&c| c == b'#') {
                        i += 1 + hashes;
                        break;
                    }
                    i += 1;
                }
                out.push_str("\"\"");
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') || (b.get(i + 1) == Some(&b'\\') && b.get(i + 3) == Some(&b'\'')) => {
                // A char literal ('x' or '\n'), not a lifetime.
                i += if b[i + 1] == b'\\' { 4 } else { 3 };
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    out
}

/// Every path a `use` tree names, expanded: `a::{b, c::d}` → `a::b`, `a::c::d`.
fn expand_use(tree: &str) -> Vec<String> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or("").trim().trim_end_matches("::*");
        return vec![path.to_owned()];
    };
    let prefix = tree[..open].trim().trim_end_matches("::");
    let close = tree.rfind('}').unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    let mut out = Vec::new();
    for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        for sub in expand_use(part) {
            if sub == "self" || sub.is_empty() {
                out.push(prefix.to_owned());
            } else {
                out.push(format!("{prefix}::{sub}"));
            }
        }
    }
    out
}

/// The deepest module of `known` that `path` (as written in `from`) names.
fn resolve(path: &str, from: &str, known: &BTreeSet<String>) -> Option<String> {
    let mut segs = path.split("::").map(str::trim).filter(|s| !s.is_empty());
    let mut at: Vec<String> = match segs.next()? {
        "crate" => Vec::new(),
        "self" => split(from),
        "super" => {
            let mut m = split(from);
            m.pop();
            m
        }
        _ => return None, // an external crate or a local name
    };
    let mut rest: Vec<&str> = segs.collect();
    while rest.first() == Some(&"super") {
        at.pop();
        rest.remove(0);
    }
    for seg in rest {
        let mut next = at.clone();
        next.push(seg.to_owned());
        if known.contains(&next.join("::")) {
            at = next;
        } else {
            break;
        }
    }
    let module = if at.is_empty() { "crate".to_owned() } else { at.join("::") };
    known.contains(&module).then_some(module)
}

fn split(module: &str) -> Vec<String> {
    if module == "crate" {
        Vec::new()
    } else {
        module.split("::").map(str::to_owned).collect()
    }
}

/// module → the modules it imports (never itself or the crate root).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let sources = modules();
    let known: BTreeSet<String> = sources.keys().cloned().collect();
    let mut edges = BTreeMap::new();
    for (module, text) in &sources {
        let code = code_of(text);
        let mut paths = Vec::new();
        for stmt in code.split(';') {
            let stmt = stmt.trim();
            let body = stmt.rsplit_once("use ").filter(|(before, _)| {
                let before = before.trim_end();
                before.is_empty()
                    || before.ends_with('}')
                    || before.ends_with(']')
                    || before.ends_with("pub")
                    || before.ends_with(')')
            });
            if let Some((_, tree)) = body {
                if tree.starts_with("crate") || tree.starts_with("self") || tree.starts_with("super") {
                    paths.extend(expand_use(tree));
                }
            }
        }
        let bytes = code.as_bytes();
        for head in ["crate::", "super::", "self::"] {
            let mut from = 0;
            while let Some(i) = code[from..].find(head).map(|i| i + from) {
                from = i + head.len();
                if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':') {
                    continue;
                }
                let end = code[i..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                    .map_or(code.len(), |e| e + i);
                paths.push(code[i..end].to_owned());
            }
        }
        // Bare paths into a child module (`memory::MemoryStore`, `use units::x`).
        let mut from = 0;
        while let Some(i) = code[from..].find("::").map(|i| i + from) {
            from = i + 2;
            let start = code[..i].rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |s| s + 1);
            if start > 0 && code.as_bytes()[start - 1] == b':' {
                continue;
            }
            let first = &code[start..i];
            let child = if module == "crate" { first.to_owned() } else { format!("{module}::{first}") };
            if !first.is_empty() && known.contains(&child) {
                let end = code[i..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                    .map_or(code.len(), |e| e + i);
                paths.push(format!("self::{}", &code[start..end]));
            }
        }
        let targets: BTreeSet<String> =
            paths.iter().filter_map(|p| resolve(p, module, &known)).filter(|t| t != module && t != "crate").collect();
        edges.insert(module.clone(), targets);
    }
    edges
}

/// Every cycle's modules (strongly connected components of more than one).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Two modules are in one cycle when each reaches the other.
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(m) = stack.pop() {
            for next in edges.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = edges.keys().map(|m| (m, reach(m))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for m in edges.keys() {
        if done.contains(m) || !reaches[m].contains(m) {
            continue;
        }
        let comp: Vec<String> =
            edges.keys().filter(|o| reaches[m].contains(*o) && reaches[*o].contains(m)).cloned().collect();
        done.extend(comp.iter().cloned());
        out.push(comp);
    }
    out
}

#[test]
fn src_modules_import_each_other_without_cycles() {
    let edges = graph();
    println!("module -> imports");
    for (m, targets) in &edges {
        println!("{m} -> {}", targets.iter().cloned().collect::<Vec<_>>().join(", "));
    }
    assert!(edges.len() > 30, "read the whole of src/: {:?}", edges.keys());
    // The checker sees what it must: a known edge is found.
    assert!(edges["proxy"].contains("proxy::app") && edges["store::resilient"].contains("store::redis"), "{edges:?}");
    let found = cycles(&edges);
    assert!(found.is_empty(), "import cycles among src/ modules: {found:?}");
}

#[test]
fn the_checker_finds_a_cycle() {
    let mut edges = graph();
    edges.entry("config".into()).or_default().insert("proxy".into());
    assert!(!cycles(&edges).is_empty(), "config -> proxy -> ... -> config must be reported");
    assert_eq!(
        expand_use("crate::store::{memory::MemoryStore, self, redis::{conn, protocol::Keys}}"),
        vec![
            "crate::store::memory::MemoryStore",
            "crate::store",
            "crate::store::redis::conn",
            "crate::store::redis::protocol::Keys"
        ]
    );
}

/// The top-level parts of `src/`, one layer each, highest first: a part
/// imports only the parts below it. `crate` (lib.rs, which starts
/// everything) is above them all.
const LAYERS: &[&str] = &[
    "server",    // the listeners (and the tunnel), wiring them to proxy and admin
    "ops",       // admin API, reload, quota_sync, renewal, the admin view of a pair; tools (sim, probe)
    "proxy",     // the phases of a call, wxgate's own calls, the App they share
    "features",  // the hooks, and the features with their state and contexts
    "admit",     // admitting a call: Core, callers, slots, activity
    "jobs",      // queued delivery's jobs store: SQLite, Redis
    "error",     // the call's errors and the one table that answers them; a component's failure
    "store",     // where decisions are kept: memory, Redis, resilient
    "transport", // downstream connection, bodies, upstream, intercept, workers
    "config",    // raw -> compiled, validated values; the path matcher
    "telemetry", // metrics
    "limit",     // decision types and pure maths, calendar
    "time",      // the clock: decision time, stopwatches, I/O deadlines
];

/// The top-level part of a module (`store::redis::conn` → `store`).
fn part(module: &str) -> &str {
    module.split("::").next().unwrap_or(module)
}

/// part → the parts it imports (never itself; the crate root left out).
fn part_graph(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut parts: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in edges.iter().filter(|(m, _)| *m != "crate") {
        let entry = parts.entry(part(from).to_owned()).or_default();
        entry.extend(targets.iter().map(|t| part(t).to_owned()).filter(|t| t != part(from)));
    }
    parts
}

/// Every import of `edges` (module → module) from a layer to a higher one,
/// or from or to a part [`LAYERS`] does not name, as `from -> to`.
fn upward(edges: &BTreeMap<String, BTreeSet<String>>, layers: &[&str]) -> Vec<String> {
    let rank = |m: &str| layers.iter().position(|l| *l == part(m));
    let mut out = Vec::new();
    for (from, targets) in edges.iter().filter(|(m, _)| *m != "crate") {
        for to in targets {
            match (rank(from), rank(to)) {
                (Some(f), Some(t)) if t >= f => {}
                _ => out.push(format!("{from} -> {to}")),
            }
        }
    }
    out
}

#[test]
fn src_parts_are_the_layers_and_import_only_downwards() {
    let edges = graph();
    let parts = part_graph(&edges);
    println!("part -> imports");
    for (p, targets) in &parts {
        println!("{p} -> {}", targets.iter().cloned().collect::<Vec<_>>().join(", "));
    }
    let named: BTreeSet<String> = LAYERS.iter().map(|l| (*l).to_owned()).collect();
    let found: BTreeSet<String> = parts.keys().cloned().collect();
    assert_eq!(found, named, "the top-level parts of src/ are the layers of LAYERS");
    let cycles = cycles(&parts);
    assert!(cycles.is_empty(), "import cycles among the top-level parts of src/: {cycles:?}");
    let up = upward(&edges, LAYERS);
    assert!(up.is_empty(), "imports from a lower layer to a higher one: {up:?}");
}

#[test]
fn the_checker_finds_a_part_cycle_and_an_upward_import() {
    let mut edges = graph();
    assert!(upward(&edges, LAYERS).is_empty() && cycles(&part_graph(&edges)).is_empty());
    // An import from the limit maths up to the store: an upward import, and
    // a cycle between the parts store and limit (store imports limit).
    edges.entry("limit::decide".into()).or_default().insert("store::pair_op".into());
    assert_eq!(upward(&edges, LAYERS), vec!["limit::decide -> store::pair_op"]);
    let part_cycles = cycles(&part_graph(&edges));
    assert!(
        part_cycles.iter().any(|c| c.contains(&"store".to_owned()) && c.contains(&"limit".to_owned())),
        "store -> limit -> store must be reported: {part_cycles:?}"
    );
    // The order decides what is upward: with limit above store, the
    // store's imports of limit are.
    let mut swapped = LAYERS.to_vec();
    let (s, l) =
        (swapped.iter().position(|p| *p == "store").unwrap(), swapped.iter().position(|p| *p == "limit").unwrap());
    swapped.swap(s, l);
    assert!(upward(&graph(), &swapped).iter().any(|u| u.starts_with("store") && u.contains(" -> limit")));
    // A part the table does not name is reported.
    edges.entry("gadgets".into()).or_default().insert("limit".into());
    assert!(upward(&edges, LAYERS).contains(&"gadgets -> limit".to_owned()));
}

#[test]
fn the_configuration_depends_on_nothing_that_runs() {
    let edges = graph();
    let mut seen = BTreeSet::new();
    let mut stack: Vec<String> =
        edges.keys().filter(|m| *m == "config" || m.starts_with("config::")).cloned().collect();
    while let Some(m) = stack.pop() {
        for next in edges.get(&m).into_iter().flatten() {
            if seen.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    let running =
        ["store", "proxy", "server", "transport::upstream", "transport::sniff", "ops::admin", "ops::reload", "admit"];
    let bad: Vec<&String> =
        seen.iter().filter(|m| running.iter().any(|r| *m == r || m.starts_with(&format!("{r}::")))).collect();
    assert!(bad.is_empty(), "config reaches {bad:?}");
}

#[test]
fn only_the_clock_module_reads_a_clock() {
    for (module, text) in modules() {
        if module == "time" {
            continue;
        }
        let code = code_of(&text);
        for reading in ["Instant::now", "SystemTime::now", "UNIX_EPOCH"] {
            assert!(!code.contains(reading), "src module {module} reads a clock ({reading}): use crate::time");
        }
    }
}

/// What the decision layer must not name: HTTP and transport types. The
/// decision is rules + state + now; a status code or a header is how a
/// layer above shows its result.
const TRANSPORT_NAMES: &[&str] =
    &["http::", "hyper", "HeaderValue", "HeaderMap", "StatusCode", "Response<", "Request<"];

fn transport_names_in(code: &str) -> Vec<&'static str> {
    TRANSPORT_NAMES.iter().copied().filter(|name| code.contains(name)).collect()
}

#[test]
fn the_decision_names_no_http_type() {
    let mut seen = 0;
    for (module, text) in modules() {
        if module == "limit" || module.starts_with("limit::") {
            seen += 1;
            let found = transport_names_in(&code_of(&text));
            assert!(found.is_empty(), "src module {module} names {found:?}: the decision layer uses no http types");
        }
    }
    assert!(seen >= 5, "the limit modules were found ({seen})");
    // The check sees a name in code, and not in a comment or a string.
    assert_eq!(transport_names_in(&code_of("pub status: http::StatusCode,\n")), vec!["http::", "StatusCode"]);
    assert!(transport_names_in(&code_of("// an http::StatusCode\nlet s = \"hyper\";\n")).is_empty());
}

/// The modules of `features` a phase may name: the list (`Features`, the
/// contexts) and the hooks with what they see (and its modules). Any other
/// is a feature's.
fn feature_framework(module: &str) -> bool {
    module == "features"
        || module == "features::component"
        || module == "features::hooks"
        || module.starts_with("features::hooks::")
}

/// Every import of a phase (`proxy` and its modules) of a feature's module,
/// as `from -> to`.
fn phases_naming_features(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut out = Vec::new();
    for (from, targets) in edges.iter().filter(|(m, _)| *m == "proxy" || m.starts_with("proxy::")) {
        for to in targets.iter().filter(|t| part(t) == "features" && !feature_framework(t)) {
            out.push(format!("{from} -> {to}"));
        }
    }
    out
}

#[test]
fn no_phase_names_a_feature() {
    let edges = graph();
    assert!(edges["proxy::answer"].contains("features::hooks"), "the phases' imports are read");
    let named = phases_naming_features(&edges);
    assert!(named.is_empty(), "phases name features (they must reach them through their hooks): {named:?}");
}

#[test]
fn the_checker_finds_a_phase_naming_a_feature() {
    let mut edges = graph();
    edges.entry("proxy::forward".into()).or_default().insert("features::broker::injected".into());
    edges.entry("proxy::identify".into()).or_default().insert("features::hooks::body".into());
    assert_eq!(phases_naming_features(&edges), vec!["proxy::forward -> features::broker::injected"]);
}

/// The field names of the `features!` list in src/features.rs (one
/// `name: Type` per line).
fn listed_features() -> Vec<String> {
    let text = &modules()["features"];
    let start = text.find("\nfeatures!(").expect("the features! list") + "\nfeatures!(".len();
    let list = &text[start..start + text[start..].find(");").expect("the list's end")];
    list.lines().filter_map(|l| l.trim().split_once(':')).map(|(name, _)| name.trim().to_owned()).collect()
}

/// Every place a phase (`proxy` and its modules) reaches a feature's state
/// by its field (`app.features.queue`) instead of through the hooks or the
/// components' loops, as `module: features.<name>`. The import check does
/// not see it: the field is reached through `App`, not imported.
fn phases_reaching_fields(modules: &BTreeMap<String, String>, features: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (module, text) in modules.iter().filter(|(m, _)| *m == "proxy" || m.starts_with("proxy::")) {
        let code = code_of(text);
        for name in features {
            let reach = format!("features.{name}");
            let found = code.match_indices(&reach).any(|(i, _)| {
                let after = code[i + reach.len()..].chars().next();
                !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            });
            if found {
                out.push(format!("{module}: {reach}"));
            }
        }
    }
    out
}

#[test]
fn no_phase_reaches_a_feature_by_its_field() {
    let features = listed_features();
    assert!(features.contains(&"queue".to_owned()) && features.len() >= 8, "the list is read: {features:?}");
    let found = phases_reaching_fields(&modules(), &features);
    assert!(
        found.is_empty(),
        "phases reach features' state by field (use the hooks, or a component's route): {found:?}"
    );
}

#[test]
fn the_checker_finds_a_phase_reaching_a_feature_by_its_field() {
    let mut modules = modules();
    let features = listed_features();
    let code = "pub async fn serve(app: &App) { let jobs = app.features.queue.jobs.get(); }\n";
    modules.insert("proxy::deliveries".into(), code.into());
    // A method of `Features` (a loop over every feature) is not a field.
    modules.insert("proxy::other".into(), "fn f(app: &App) { app.features.queues(); app.features.serves(p); }".into());
    assert_eq!(phases_reaching_fields(&modules, &features), vec!["proxy::deliveries: features.queue"]);
}

#[test]
fn the_features_import_each_other_without_cycles() {
    let edges = graph();
    let inside: BTreeMap<String, BTreeSet<String>> = edges
        .iter()
        .filter(|(m, _)| part(m) == "features")
        .map(|(m, t)| (m.clone(), t.iter().filter(|t| part(t) == "features").cloned().collect()))
        .collect();
    assert!(inside.len() > 10, "the features' modules are read: {:?}", inside.keys());
    let found = cycles(&inside);
    assert!(found.is_empty(), "import cycles inside src/features: {found:?}");
}
