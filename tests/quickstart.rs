//! The README's quick start, run as written: its "serve" block (`cargo run
//! --release -- try`, run here as the test binary `wxgate try`, on free
//! loopback ports) and its "calls" block (curl, in bash, with the
//! addresses replaced by those ports), and what it says they print. The
//! README cannot drift from what wxgate does.

use crate::support;

use std::process::Command;

use support::process;

/// The fenced block right after the line `<!-- quick start: {name} -->`.
fn block(readme: &str, name: &str) -> String {
    let marker = format!("<!-- quick start: {name} -->");
    let at = readme.find(&marker).unwrap_or_else(|| panic!("README.md has no {marker}"));
    let rest = &readme[at + marker.len()..];
    let open = rest.find("```sh\n").expect("a ```sh block after the marker") + "```sh\n".len();
    let close = rest[open..].find("```").expect("the block ends") + open;
    rest[open..close].to_owned()
}

#[tokio::test]
async fn the_readme_quick_start_runs_as_written_and_prints_what_it_says() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
    let serve = block(&readme, "serve");
    let args = serve.trim().strip_prefix("cargo run --release -- ").expect("the serve block runs wxgate with cargo");
    let mut args: Vec<&str> = args.split_whitespace().collect();
    assert_eq!(args, ["try"], "the serve block is `cargo run --release -- try`");
    args.extend(["--sim", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]);
    // From a directory with nothing in it: the try config is built in.
    let elsewhere = support::TempDir::new("quickstart-elsewhere");
    let wxgate = process::spawn_args_in(elsewhere.path(), &args, &[]).expect("wxgate try serves");
    let admin = wxgate.admin.expect("the admin API runs");

    let calls = block(&readme, "calls")
        .replace("127.0.0.1:8080", &wxgate.addr.to_string())
        .replace("127.0.0.1:9090", &admin.to_string());
    assert!(!calls.contains(":8080") && !calls.contains(":9090"), "every address was replaced: {calls}");
    let run = tokio::task::spawn_blocking(move || Command::new("bash").args(["-c", &calls]).output())
        .await
        .expect("join")
        .expect("bash runs the calls block");
    let out = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(run.status.success(), "the calls block failed: {out}\n{}", String::from_utf8_lossy(&run.stderr));
    let lines: Vec<&str> = out.lines().map(str::trim_end).collect();
    let expected_calls =
        ["call 1: 200", "call 2: 200", "call 3: 200", "call 4: 200", "call 5: 200", "call 6: 429", "call 7: 429"];
    assert_eq!(&lines[..7], expected_calls, "{out}");
    assert!(lines[7].starts_with("HTTP/1.1 429"), "{out}");
    assert!(lines.iter().any(|l| l.to_ascii_lowercase().starts_with("retry-after: ")), "{out}");
    assert!(lines.iter().any(|l| l.contains("\"errcode\":45009")), "{out}");
    let metric = |outcome: &str| {
        let series = format!("wxgate_calls_total{{rule=\"template_send\",outcome=\"{outcome}\"}} ");
        lines.iter().find_map(|l| l.strip_prefix(&series)).map(str::to_owned)
    };
    assert_eq!(metric("forwarded").as_deref(), Some("5"), "{out}");
    assert_eq!(metric("throttled").as_deref(), Some("3"), "{out}");
    // The queued message, sent by wxgate with the demo account's token.
    let job = lines.last().expect("the delivery's JSON");
    assert!(job.contains("\"state\":\"sent\"") && job.contains("\"account\":\"wxdemo\""), "{out}");
    assert!(job.contains("\"answer\":{\"body\":{\"errcode\":0"), "{out}");
    // What the README says the calls print.
    for said in [
        "Calls 1 to 5 reach the simulator (200)",
        "429 with\n`Retry-After`",
        "5 `forwarded` and 3\n`throttled`",
        "the `GET` shows `\"state\":\"sent\"`",
    ] {
        assert!(readme.contains(said), "README.md says {said:?}");
    }
    wxgate.stop().await;
}

/// `wxgate try`'s built-in config is deploy/try.toml, its readable copy,
/// byte for byte (`wxgate try --print-config` shows it).
#[test]
fn the_built_in_try_config_is_deploy_try_toml() {
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/try.toml")).expect("try.toml");
    let (code, stdout, stderr) = process::run(&["try", "--print-config"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, shipped);
}
