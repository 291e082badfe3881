//! The docs lead somewhere: every relative link in the README and the
//! markdown files shipped beside it (docs/, deploy/, bench/, contrib/)
//! names a file of the repository, and every `#anchor` a heading of the file
//! it points into (by GitHub's slug rules); every section the shipped
//! configs, deploy files and docs name in words (`README, "Penalties"`,
//! `README's "Tokens"`, `("Upstream failover")` in the README) is a heading
//! of the README, every `docs/….md` a shipped config or deploy file names
//! exists, and every file a documented curl command sends (`-d @x`) is
//! shipped. A renamed heading or a moved file fails here, not in a reader's
//! browser or shell.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The repository's markdown a reader follows links in: the top-level
/// files and those under docs/, deploy/, bench/ and contrib/ (bench/results
/// included), relative to the repository.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    collect(&repo(), Path::new(""), false, &mut files);
    for dir in ["docs", "deploy", "bench", "contrib"] {
        collect(&repo(), Path::new(dir), true, &mut files);
    }
    files.sort();
    files
}

fn collect(root: &Path, dir: &Path, deep: bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return };
    for entry in entries {
        let entry = entry.expect("directory entry");
        let path = dir.join(entry.file_name());
        let kind = entry.file_type().expect("file type");
        if kind.is_dir() && deep {
            collect(root, &path, deep, out);
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The shipped files that may name docs in comments: the root config, the
/// image, and everything under deploy/ but markdown (checked as markdown).
fn shipped_files() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("rules.toml"), PathBuf::from("Dockerfile")];
    collect_all(&repo(), Path::new("deploy"), &mut files);
    files.sort();
    files
}

/// Every file under `dir` but markdown.
fn collect_all(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return };
    for entry in entries {
        let entry = entry.expect("directory entry");
        let path = dir.join(entry.file_name());
        let kind = entry.file_type().expect("file type");
        if kind.is_dir() {
            collect_all(root, &path, out);
        } else if kind.is_file() && path.extension().is_none_or(|e| e != "md") {
            out.push(path);
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A markdown file's lines outside fenced code blocks, with inline code
/// spans blanked: (line number, text). Links and headings live only there.
fn prose(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker: String = trimmed.chars().take_while(|&c| c == '`' || c == '~').collect();
        if let Some(open) = &fence {
            if marker.len() >= open.len() && marker.starts_with(&open[..1]) && trimmed[marker.len()..].trim().is_empty()
            {
                fence = None;
            }
            continue;
        }
        if marker.len() >= 3 && (marker.chars().all(|c| c == '`') || marker.chars().all(|c| c == '~')) {
            fence = Some(marker);
            continue;
        }
        out.push((i + 1, without_code_spans(line)));
    }
    out
}

/// `line` with each inline code span (`` `x` ``, ``` ``x`` ```) replaced by
/// its text between quote-free markers, so a link-like text in code is no link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => {
                out.push_str(&"x".repeat(after[..end].chars().count().min(1)));
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The raw text of each heading (ATX `#` and setext `===`/`---`) outside code.
fn headings(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    let mut previous: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let marker: String = trimmed.chars().take_while(|&c| c == '`' || c == '~').collect();
        if let Some(open) = &fence {
            if marker.len() >= open.len() && marker.starts_with(&open[..1]) && trimmed[marker.len()..].trim().is_empty()
            {
                fence = None;
            }
            previous = None;
            continue;
        }
        if marker.len() >= 3 && (marker.chars().all(|c| c == '`') || marker.chars().all(|c| c == '~')) {
            fence = Some(marker);
            previous = None;
            continue;
        }
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        let indent = line.len() - trimmed.len();
        if (1..=6).contains(&hashes) && indent < 4 && trimmed[hashes..].starts_with([' ', '\t']) {
            let title = trimmed[hashes..].trim();
            let title = title.trim_end_matches('#').trim_end();
            out.push(title.to_owned());
            previous = None;
            continue;
        }
        let underline = line.trim();
        let is_underline =
            !underline.is_empty() && (underline.chars().all(|c| c == '=') || underline.chars().all(|c| c == '-'));
        match previous {
            Some(p) if is_underline && !p.trim().is_empty() && !p.contains('|') => {
                out.push(p.trim().to_owned());
                previous = None;
            }
            _ => previous = Some(line),
        }
    }
    out
}

/// A heading's visible text: links as their text, code and emphasis marks dropped.
fn visible(title: &str) -> String {
    let mut out = String::new();
    let mut rest = title;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else { break };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else { break };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out.replace(['`', '*'], "")
}

/// GitHub's anchor for a heading: lower case, every character but letters,
/// digits, `_`, `-` and spaces dropped, spaces to `-`.
fn slug(title: &str) -> String {
    visible(title)
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown text: each heading's slug, a repeated one
/// with `-1`, `-2`, … as GitHub numbers them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for title in headings(text) {
        let base = slug(&title);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// The inline link targets of a markdown text: (line, target), the target
/// without its title; reference definitions (`[x]: target`) included.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (line, prose) in prose(text) {
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].trim().trim_start_matches('<');
            let target = target.split_whitespace().next().unwrap_or("").trim_end_matches('>');
            out.push((line, target.to_owned()));
            rest = &after[end..];
        }
        let trimmed = prose.trim_start();
        if trimmed.starts_with('[') {
            if let Some((_, target)) = trimmed.split_once("]: ") {
                out.push((line, target.split_whitespace().next().unwrap_or("").to_owned()));
            }
        }
    }
    out
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// `dir/relative`, normalised; `None` if it leaves the repository.
fn resolve(dir: &Path, relative: &str) -> Option<PathBuf> {
    let joined = dir.join(relative);
    let mut parts: Vec<Component> = Vec::new();
    for part in joined.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::Normal(_) => parts.push(part),
            _ => return None,
        }
    }
    Some(parts.iter().collect())
}

/// What is wrong with `target` linked from `from`, if anything.
fn check_link(from: &Path, target: &str) -> Option<String> {
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        from.to_path_buf()
    } else {
        let dir = from.parent().unwrap_or(Path::new(""));
        match resolve(dir, path) {
            Some(f) => f,
            None => return Some(format!("{target}: outside the repository")),
        }
    };
    let on_disk = repo().join(&file);
    if !on_disk.exists() {
        return Some(format!("{target}: no file {}", file.display()));
    }
    let anchor = anchor?;
    if file.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let known = anchors(&read(&file));
    (!known.contains(anchor)).then(|| format!("{target}: {} has no heading with anchor #{anchor}", file.display()))
}

#[test]
fn every_relative_link_in_the_docs_points_to_a_file_and_heading_that_exist() {
    let files = markdown_files();
    assert!(files.iter().any(|f| f == Path::new("README.md")), "{files:?}");
    assert!(files.iter().any(|f| f.starts_with("docs")), "{files:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        for (line, target) in links(&read(file)) {
            if target.is_empty() || is_external(&target) {
                continue;
            }
            checked += 1;
            if let Some(why) = check_link(file, &target) {
                broken.push(format!("{}:{line}: {why}", file.display()));
            }
        }
    }
    assert!(checked > 50, "only {checked} relative links found: is the parser blind?");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Section names quoted after `README` (`README, "X"`, `README's "X"`,
/// `README "X"`) in `text`: (line, name).
fn readme_sections_named(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("README") {
            let after = &rest[at + "README".len()..];
            let after = after.strip_prefix("'s").or_else(|| after.strip_prefix(',')).unwrap_or(after);
            let after = after.trim_start_matches([' ', '(']);
            if let Some(quoted) = after.strip_prefix('"') {
                if let Some(end) = quoted.find('"') {
                    out.push((i + 1, quoted[..end].to_owned()));
                }
            }
            rest = &rest[at + "README".len()..];
        }
    }
    out
}

/// Sections the README names in its own text: `("Upstream failover")`.
fn own_sections_named(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (line, prose) in prose(text) {
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("(\"") {
            let after = &rest[at + 2..];
            if let Some(end) = after.find("\")") {
                out.push((line, after[..end].to_owned()));
            }
            rest = after;
        }
    }
    out
}

/// Whether the README has a heading `name` (or `name` and a parenthesis:
/// "Day counts in step with WeChat" for "… (quota_sync)").
fn readme_has(headings: &[String], name: &str) -> bool {
    headings.iter().any(|h| h == name || h.starts_with(&format!("{name} (")))
}

#[test]
fn every_readme_section_the_configs_and_docs_name_exists() {
    let readme_headings: Vec<String> = headings(&read(Path::new("README.md"))).iter().map(|h| visible(h)).collect();
    let mut wrong = Vec::new();
    let mut checked = 0;
    let mut sources = shipped_files();
    sources.extend(markdown_files());
    for file in &sources {
        let text = read(file);
        let mut named = readme_sections_named(&text);
        if file == Path::new("README.md") {
            named.extend(own_sections_named(&text));
        }
        for (line, name) in named {
            checked += 1;
            if !readme_has(&readme_headings, &name) {
                wrong.push(format!("{}:{line}: the README has no section \"{name}\"", file.display()));
            }
        }
    }
    assert!(checked > 10, "only {checked} README sections named: is the parser blind?");
    assert!(wrong.is_empty(), "{}\n(README headings: {readme_headings:?})", wrong.join("\n"));
}

#[test]
fn every_doc_the_shipped_configs_name_exists() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in shipped_files() {
        for (i, line) in read(&file).lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("docs/") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '#'))
                    .collect();
                let name = name.trim_end_matches('.');
                if name.contains(".md") {
                    checked += 1;
                    if let Some(why) = check_link(Path::new("x"), name) {
                        wrong.push(format!("{}:{}: {why}", file.display(), i + 1));
                    }
                }
                rest = &rest[at + "docs/".len()..];
            }
        }
    }
    assert!(checked > 0, "no docs/….md named in the shipped files: is the scan blind?");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn slugs_follow_githubs_rules() {
    assert_eq!(slug("Upstream failover"), "upstream-failover");
    assert_eq!(slug("Configuration reference (`rules.toml`)"), "configuration-reference-rulestoml");
    assert_eq!(slug("`[[penalty]]`"), "penalty");
    assert_eq!(slug("`[server]`, `[store]`, `[log]`"), "server-store-log");
    assert_eq!(slug("Bounding the accounts: server max_accounts"), "bounding-the-accounts-server-max_accounts");
    assert_eq!(
        slug("Messages to many: cost by recipients, per-member limits"),
        "messages-to-many-cost-by-recipients-per-member-limits"
    );
    assert_eq!(slug("`/__stats`"), "__stats");
    assert_eq!(slug("See [the docs](docs/x.md)"), "see-the-docs");
    let twice = anchors("# A\n\n## A\n\n```\n# not a heading\n```\nB\n---\n");
    assert_eq!(twice, ["a", "a-1", "b"].map(String::from).into_iter().collect());
    assert_eq!(without_code_spans("a `[x](y)` b"), "a x b");
}

/// The files documented curl commands send (`-d @body.json`, `--data-binary
/// @x`, `-F media=@x`) are shipped (relative to the repository), or the
/// command fails as written.
#[test]
fn every_file_a_documented_command_sends_is_shipped() {
    let mut missing = Vec::new();
    for file in markdown_files() {
        let text = read(&file);
        for (i, line) in text.lines().enumerate() {
            if !line.contains("curl") && !line.trim_start().starts_with("-") {
                continue;
            }
            let mut rest = line;
            while let Some(at) = rest.find('@') {
                let before = rest[..at].trim_end();
                let sends = before.ends_with("-d")
                    || before.ends_with("--data")
                    || before.ends_with("--data-binary")
                    || before.ends_with("--data-raw")
                    || rest[..at].ends_with('=') && before.contains("-F");
                let name: String = rest[at + 1..]
                    .chars()
                    .take_while(|c| !c.is_whitespace() && !matches!(c, '\'' | '"' | '`'))
                    .collect();
                if sends && !name.is_empty() && name != "-" && !repo().join(&name).exists() {
                    missing.push(format!("{}:{}: @{name} is not a shipped file", file.display(), i + 1));
                }
                rest = &rest[at + 1..];
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}
