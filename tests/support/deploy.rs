//! The repository's deployment files as tests read them: paths in the
//! repository, YAML documents (compose, Kubernetes, Prometheus rules),
//! `promtool` and `kubernetes-validate`.

use std::path::{Path, PathBuf};

pub use yaml_rust2::Yaml;

/// `path` inside the repository.
pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The text of a repository file.
pub fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Every YAML document of a repository file (`---`-separated).
pub fn yaml(path: &str) -> Vec<Yaml> {
    yaml_rust2::YamlLoader::load_from_str(&read(path)).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

/// A YAML string, or the panic that names what was expected.
pub fn text<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str().unwrap_or_else(|| panic!("{what}: expected a string, found {y:?}"))
}

/// A YAML list of strings (empty if the key is absent).
pub fn strings(y: &Yaml, what: &str) -> Vec<String> {
    match y {
        Yaml::BadValue | Yaml::Null => Vec::new(),
        Yaml::Array(items) => items.iter().map(|i| text(i, what).to_owned()).collect(),
        other => panic!("{what}: expected a list of strings, found {other:?}"),
    }
}

/// The entries of a YAML mapping as (string key, value).
pub fn entries<'a>(y: &'a Yaml, what: &str) -> Vec<(&'a str, &'a Yaml)> {
    y.as_hash()
        .unwrap_or_else(|| panic!("{what}: expected a mapping, found {y:?}"))
        .iter()
        .map(|(k, v)| (text(k, what), v))
        .collect()
}

/// `promtool`: on PATH, or where `scripts/test.sh` puts it
/// (`target/tools/prometheus/usr/bin/promtool`, from Debian's `prometheus`
/// package). Absent: `None` with a loud note on a developer's machine; a
/// failure in CI (`CI` set), where scripts/test.sh must have provided it.
pub fn promtool() -> Option<PathBuf> {
    tool("promtool", "target/tools/prometheus/usr/bin", "the Prometheus rules")
}

/// `kubernetes-validate` (PyPI, the Kubernetes API's JSON schemas bundled):
/// on PATH, or where `scripts/test.sh` installs it, pinned
/// (`target/tools/kubernetes-validate/bin`, from
/// `tests/tools/kubernetes-validate.txt`). Absent: as [`promtool`].
pub fn kubernetes_validate() -> Option<PathBuf> {
    tool("kubernetes-validate", "target/tools/kubernetes-validate/bin", "the Kubernetes manifests' schemas")
}

/// A tool on PATH or in `dir` of the repository; absent: `None` with a loud
/// note on a developer's machine, a failure in CI (`CI` set), where
/// scripts/test.sh must have provided it.
fn tool(name: &str, dir: &str, checks: &str) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    let found = on_path.or_else(|| Some(repo(dir).join(name)).filter(|p| p.is_file()));
    if found.is_none() {
        let why = format!("{name} not found (on PATH or {dir}): scripts/test.sh installs it");
        assert!(std::env::var_os("CI").is_none(), "{why}; CI must run these checks");
        eprintln!("\n!!!!! SKIPPED: {why}; {checks} were NOT checked !!!!!\n");
    }
    found
}

/// Runs `tool <args>` in the repository: whether it succeeded, and everything it wrote.
pub fn run_tool(tool: &Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(tool)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", tool.display()));
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), said)
}

/// Runs `promtool <args>` in the repository: whether it succeeded, and everything it wrote.
pub fn run_promtool(promtool: &Path, args: &[&str]) -> (bool, String) {
    run_tool(promtool, args)
}
