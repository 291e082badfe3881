//! Reading the memory store's state file (`[store] state_file`) as a user
//! would: for "has the write happened yet", never for a decision.

use std::path::Path;

use serde_json::Value;

/// The file's JSON, if it exists and is whole.
pub fn read(path: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The pair's state in the file.
pub fn pair(path: &Path, account: &str, rule: &str) -> Option<Value> {
    let file = read(path)?;
    let pairs = file["pairs"].as_array()?;
    pairs.iter().find(|p| p["account"] == account && p["rule"] == rule).cloned()
}

/// Calls counted in the pair's calendar quota (its first), as written.
pub fn used(path: &Path, account: &str, rule: &str) -> Option<u64> {
    let pair = pair(path, account, rule)?;
    pair["limits"].as_array()?.iter().find_map(|l| l["used"].as_u64())
}

/// The files in `dir` whose name starts with `prefix`.
pub fn named(dir: &Path, prefix: &str) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix)))
        .collect();
    found.sort();
    found
}
