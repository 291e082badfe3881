//! The deployment files agree with the binary they deploy: the Dockerfile
//! (entry point, config path, ports, health check, user), the container,
//! compose and Kubernetes configs (each passes `wxgate check` where it runs,
//! beside the files the image or the ConfigMap puts there; ports, mounts and
//! commands match them; the container and Kubernetes ones take their rules
//! from the shipped rules.toml, can serve WeCom's from
//! deploy/rules-wecom.toml, and answer each SDK's refused calls in the shape
//! that SDK reads), the Kubernetes manifests against the API's schemas
//! (kubernetes-validate), and `wxgate probe`, which the image's health check
//! runs, against a live wxgate, a closed port, and a wxgate that cannot
//! decide.
//!
//! No container engine or cluster is needed: the files are read as the
//! engines read them (a manifest's ConfigMap as its documented `kubectl
//! create configmap` makes it), and everything they ask of wxgate is run
//! against the real binary.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use support::deploy::{entries, read, repo, strings, text, yaml, Yaml};
use support::ports::ClosedPort;
use support::process::{self, run};
use support::{eventually, ConfigToml, Gate, MockWeChat, StoreToml, TempDir, PATIENCE};

const IMAGE: &str = "wxgate:local";
/// A token for configs whose admin listener is beyond loopback.
const TOKEN: (&str, &str) = ("WXGATE_ADMIN_TOKEN", "deploy-test-token");

/// One Dockerfile instruction: its keyword (upper case) and the rest, with
/// line continuations joined and comment lines dropped, as Docker reads it.
#[derive(Debug, Clone)]
struct Instruction {
    keyword: String,
    args: String,
}

/// The Dockerfile's stages, in order; the last is the image.
fn dockerfile() -> Vec<Vec<Instruction>> {
    let mut stages: Vec<Vec<Instruction>> = Vec::new();
    let mut pending = String::new();
    for line in read("Dockerfile").lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                pending.push_str(part);
                pending.push(' ');
                continue;
            }
            None => pending.push_str(trimmed),
        }
        let whole = std::mem::take(&mut pending);
        let (keyword, args) = whole.split_once(char::is_whitespace).unwrap_or((&whole, ""));
        let instruction = Instruction { keyword: keyword.to_uppercase(), args: args.trim().to_owned() };
        if instruction.keyword == "FROM" {
            stages.push(Vec::new());
        }
        // ARGs before the first FROM belong to no stage.
        match stages.last_mut() {
            Some(stage) => stage.push(instruction),
            None => assert_eq!(instruction.keyword, "ARG", "only ARG may precede the first FROM"),
        }
    }
    assert!(pending.is_empty(), "the Dockerfile ends inside a continued line");
    stages
}

fn image_stage() -> Vec<Instruction> {
    dockerfile().pop().expect("the Dockerfile has a stage")
}

fn all_of<'a>(stage: &'a [Instruction], keyword: &str) -> Vec<&'a str> {
    stage.iter().filter(|i| i.keyword == keyword).map(|i| i.args.as_str()).collect()
}

fn one_of<'a>(stage: &'a [Instruction], keyword: &str) -> &'a str {
    let found = all_of(stage, keyword);
    assert_eq!(found.len(), 1, "the image stage has exactly one {keyword}: {found:?}");
    found[0]
}

/// An exec-form (JSON array) argument list; the shell form needs a shell,
/// which the image has not.
fn exec_form(args: &str, what: &str) -> Vec<String> {
    serde_json::from_str(args).unwrap_or_else(|_| panic!("{what} must be in exec form [\"...\"]: {args}"))
}

/// `--name=value` options at the start of `args`, and the rest.
fn options(args: &str) -> (BTreeMap<String, String>, String) {
    let mut opts = BTreeMap::new();
    let mut rest = args.trim();
    while let Some(opt) = rest.strip_prefix("--") {
        let (word, after) = opt.split_once(char::is_whitespace).unwrap_or((opt, ""));
        let (name, value) = word.split_once('=').unwrap_or((word, ""));
        opts.insert(name.to_owned(), value.to_owned());
        rest = after.trim_start();
    }
    (opts, rest.to_owned())
}

/// The image's `ENV` variables (`KEY=value` pairs).
fn image_env() -> BTreeMap<String, String> {
    all_of(&image_stage(), "ENV")
        .iter()
        .flat_map(|args| args.split_whitespace())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or_else(|| panic!("ENV {pair}: use KEY=value"));
            (k.to_owned(), v.trim_matches('"').to_owned())
        })
        .collect()
}

/// The config file the image serves: `WXGATE_CONFIG` of the image.
fn image_config_path() -> String {
    image_env().get("WXGATE_CONFIG").cloned().expect("the image sets WXGATE_CONFIG")
}

/// `COPY` sources and destination (without the options).
fn copy_parts(args: &str) -> (BTreeMap<String, String>, Vec<String>, String) {
    let (opts, rest) = options(args);
    let mut words: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
    let dest = words.pop().expect("COPY has a destination");
    (opts, words, dest)
}

/// A config's `[server]` addresses as written (the file must set both).
struct Listeners {
    listen: SocketAddr,
    admin: SocketAddr,
}

fn listeners(toml_text: &str, what: &str) -> Listeners {
    let value: toml::Value = toml::from_str(toml_text).unwrap_or_else(|e| panic!("{what}: {e}"));
    let addr = |key: &str| -> SocketAddr {
        let text = value["server"].get(key).and_then(|v| v.as_str());
        text.unwrap_or_else(|| panic!("{what}: [server] {key} is set explicitly")).parse().expect("address")
    };
    Listeners { listen: addr("listen"), admin: addr("admin_listen") }
}

fn toml_value(toml_text: &str, what: &str) -> toml::Value {
    toml::from_str(toml_text).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// `wxgate check` on a file: exit code and what it wrote.
fn check(path: &Path, env: &[(&str, &str)]) -> (i32, String) {
    let (code, out, err) = run(&["check", "--config", path.to_str().expect("utf-8 path")], env);
    (code, format!("{out}{err}"))
}

fn assert_checks(path: &Path, env: &[(&str, &str)]) -> String {
    let (code, said) = check(path, env);
    assert_eq!(code, 0, "wxgate check --config {} fails:\n{said}", path.display());
    said
}

#[test]
fn the_image_runs_the_binary_on_the_config_it_ships() {
    let image = image_stage();
    let binary = Path::new(env!("CARGO_BIN_EXE_wxgate")).file_name().expect("binary name");
    assert_eq!(exec_form(one_of(&image, "ENTRYPOINT"), "ENTRYPOINT"), [binary.to_str().expect("utf-8")]);
    assert!(all_of(&image, "CMD").is_empty(), "no CMD: `docker run wxgate:local check` runs a subcommand");

    // The config WXGATE_CONFIG names is the container config, copied there.
    let config = image_config_path();
    let copied: Vec<String> = all_of(&image, "COPY")
        .iter()
        .map(|args| copy_parts(args))
        .filter(|(opts, _, dest)| !opts.contains_key("from") && *dest == config)
        .flat_map(|(_, sources, _)| sources)
        .collect();
    assert_eq!(copied, ["deploy/container.toml"], "COPY deploy/container.toml {config}");

    // It passes `wxgate check` (beside the rules files the Dockerfile
    // copies) with a token, and without one (a check in CI cannot see the
    // deployment's secrets) with a warning naming the variable; without
    // one wxgate refuses to start and says which to set.
    let dir = TempDir::new("image-config");
    let file = image_config_dir(&dir);
    let said = assert_checks(&file, &[TOKEN]);
    assert!(said.contains("upstream https://api.weixin.qq.com"), "{said}");
    let said = assert_checks(&file, &[]);
    assert!(said.contains("wxgate: warning: WXGATE_ADMIN_TOKEN is not set here"), "{said}");
    let (code, _, refused) = run(&["--config", file.to_str().expect("utf-8 path")], &[]);
    assert_eq!(code, 2, "{refused}");
    assert!(refused.contains("WXGATE_ADMIN_TOKEN"), "the refusal names the variable: {refused}");

    // EXPOSE: the proxy and the admin listener, nothing else.
    let ports = listeners(&read("deploy/container.toml"), "deploy/container.toml");
    let exposed: BTreeSet<u16> = all_of(&image, "EXPOSE")
        .iter()
        .flat_map(|a| a.split_whitespace())
        .map(|p| p.trim_end_matches("/tcp").parse().expect("EXPOSE port"))
        .collect();
    assert_eq!(exposed, BTreeSet::from([ports.listen.port(), ports.admin.port()]));
    assert!(ports.listen.ip().is_unspecified(), "inside a container the proxy listens on every interface");
}

/// The image's config directory as the Dockerfile's image stage fills it
/// (every `COPY` of a repository file into it), written into `dir`; the
/// path of the config `WXGATE_CONFIG` names there.
fn image_config_dir(dir: &TempDir) -> std::path::PathBuf {
    let config = image_config_path();
    let config_dir = Path::new(&config).parent().expect("config dir");
    let mut copied = 0;
    for (opts, sources, dest) in all_of(&image_stage(), "COPY").iter().map(|a| copy_parts(a)) {
        if opts.contains_key("from") {
            continue;
        }
        for source in &sources {
            let name = Path::new(source).file_name().expect("file name");
            let target = if dest.ends_with('/') { Path::new(&dest).join(name) } else { Path::new(&dest).to_path_buf() };
            if target.parent() == Some(config_dir) {
                let name = target.file_name().and_then(|n| n.to_str()).expect("utf-8 name");
                dir.write(name, &read(source));
                copied += 1;
            }
        }
    }
    assert!(copied > 0, "the image stage copies its config into {}", config_dir.display());
    dir.join(Path::new(&config).file_name().and_then(|n| n.to_str()).expect("config file name"))
}

/// The commented-out `[[domain]]` block of the deploy configs: WeCom's
/// rules from rules-wecom.toml beside the config.
const WECOM_BLOCK: &str = "# [[domain]]\n# host = \"qyapi.weixin.qq.com\"\n# rules = \"rules-wecom.toml\"\n";

/// The deployed config `text` loaded in this process from `path`'s
/// directory (so its rules files are the ones beside it), with the admin
/// token its environment would give (`WXGATE_ADMIN_TOKEN`, which a test
/// cannot set for its own process) written into its `[server]`.
fn load_deployed(path: &Path, text: &str, what: &str) -> wxgate::config::Config {
    assert!(text.contains("\n[server]\n"), "{what} has a [server]");
    let with_token = text.replacen("\n[server]\n", &format!("\n[server]\nadmin_token = \"{}\"\n", TOKEN.1), 1);
    let loadable = path.with_file_name("loaded-by-the-test.toml");
    std::fs::write(&loadable, with_token).expect("write");
    let config = wxgate::config::Config::load(&loadable).unwrap_or_else(|e| panic!("{what}: {e}"));
    std::fs::remove_file(&loadable).expect("remove");
    config
}

/// The config at `path` (of `what`), as deployed: its rules and penalties
/// are the shipped rules.toml's, read through `rules` from a file beside it
/// that is rules.toml itself, and it holds none of its own (one source: a
/// rule changed in rules.toml is changed here). Its `[[domain]]` block,
/// uncommented, serves WeCom's rules from rules-wecom.toml beside it (the
/// shipped deploy/rules-wecom.toml), with no error.
fn assert_shipped_rules(path: &Path, what: &str) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{what}: {e}"));
    let own = toml_value(&text, what);
    assert!(own.get("rule").is_none() && own.get("penalty").is_none(), "{what}: no [[rule]] or [[penalty]] of its own");
    let config = load_deployed(path, &text, what);
    let from = config.domains[0].rules_file.clone().unwrap_or_else(|| panic!("{what}: rules = \"...\""));
    assert_eq!(from.parent(), path.parent(), "{what}: its rules file is beside it");
    let from_text = std::fs::read_to_string(&from).unwrap_or_else(|e| panic!("{what}: {}: {e}", from.display()));
    assert!(from_text == read("rules.toml"), "{what}: {} is not the shipped rules.toml", from.display());
    let shipped = wxgate::config::Config::load(&repo("rules.toml")).expect("rules.toml loads");
    let names = |c: &wxgate::config::Config| c.rules.iter().map(|r| r.name.to_string()).collect::<Vec<_>>();
    assert_eq!(names(&config), names(&shipped), "{what}: the shipped rules, in order");
    assert_eq!(config.penalties, shipped.penalties, "{what}: the shipped penalties");
    for (mine, theirs) in config.rules.iter().zip(&shipped.rules) {
        assert_eq!(mine.limits, theirs.limits, "{what}: rule {}", mine.name);
    }

    // WeCom through the same instance: the block uncommented.
    assert!(text.contains(WECOM_BLOCK), "{what} ends with the commented [[domain]] block for WeCom");
    let both = text.replace(WECOM_BLOCK, &WECOM_BLOCK.replace("# ", ""));
    let config = load_deployed(path, &both, &format!("{what} with WeCom"));
    assert_eq!(config.domains.len(), 2, "{what} with WeCom");
    let wecom = config.domains[1].rules_file.clone().expect("WeCom's rules file");
    let wecom_text = std::fs::read_to_string(&wecom).unwrap_or_else(|e| panic!("{what}: {}: {e}", wecom.display()));
    assert!(wecom_text == read("deploy/rules-wecom.toml"), "{what}: {} is deploy/rules-wecom.toml", wecom.display());
    let send = config.rule_in(1, "/cgi-bin/message/send").expect("WeCom's message_send");
    assert_eq!(&*send.name, "qyapi.message_send", "{what} with WeCom");
}

#[test]
fn the_container_config_takes_the_shipped_rules_from_rules_toml() {
    let dir = TempDir::new("image-rules");
    assert_shipped_rules(&image_config_dir(&dir), "the image's config");
    // In the repository, deploy/rules.toml is rules.toml (a link), so the
    // deploy configs pass `wxgate check` where they are, reading what they
    // read where they run.
    let link = std::fs::read_link(repo("deploy/rules.toml")).expect("deploy/rules.toml is a symbolic link");
    assert_eq!(link, Path::new("../rules.toml"), "deploy/rules.toml links to ../rules.toml");
    for file in ["deploy/container.toml", "deploy/kubernetes-sidecar.toml", "deploy/kubernetes-egress.toml"] {
        assert_checks(&repo(file), &[TOKEN]);
        assert_shipped_rules(&repo(file), file);
    }
}

#[test]
fn the_health_check_probes_the_admin_listener_of_the_container_config() {
    let image = image_stage();
    let (docker_opts, cmd) = options(one_of(&image, "HEALTHCHECK"));
    let cmd = cmd.strip_prefix("CMD").expect("HEALTHCHECK ... CMD [...]").trim();
    let argv = exec_form(cmd, "HEALTHCHECK CMD");
    assert_eq!(argv[..2], ["wxgate", "probe"], "{argv:?}");
    let flag = |name: &str| argv.iter().position(|a| a == name).map(|i| argv[i + 1].clone());
    let url = flag("--url").expect("probe --url");

    // The URL reaches the config's admin listener from inside the container.
    let admin = listeners(&read("deploy/container.toml"), "deploy/container.toml").admin;
    assert_eq!(url, wxgate::ops::tools::healthcheck::admin_url(admin, "/readyz"));

    // Docker kills a check that outlives its --timeout; the probe gives up first, with its reason.
    let probe_timeout = humantime::parse_duration(&flag("--timeout").expect("probe --timeout")).expect("duration");
    let docker_timeout = humantime::parse_duration(&docker_opts["timeout"]).expect("HEALTHCHECK --timeout");
    assert!(probe_timeout < docker_timeout, "probe {probe_timeout:?} < HEALTHCHECK {docker_timeout:?}");

    // The binary takes these very arguments: 0 or 1 (whatever listens on
    // that port here), never 2, clap's usage error (and Docker's "reserved").
    let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
    let (code, out, err) = run(&args, &[]);
    assert!(code == 0 || code == 1, "wxgate {args:?} exited {code}: {out}{err}");
}

#[test]
fn the_image_runs_as_a_user_that_owns_the_state_directory() {
    let image = image_stage();
    let user = one_of(&image, "USER");
    let uid = user.split(':').next().expect("uid");
    assert!(!["root", "0"].contains(&uid), "USER {user} is root");

    // The embedded store's state file is in a directory the user owns.
    let config = toml_value(&read("deploy/container.toml"), "deploy/container.toml");
    let state_file = config["store"]["state_file"].as_str().expect("[store] state_file is set");
    let state_dir = Path::new(state_file).parent().expect("state_file has a directory");
    let owned = all_of(&image, "COPY").iter().map(|a| copy_parts(a)).any(|(opts, _, dest)| {
        Path::new(&dest) == state_dir && opts.get("chown").is_some_and(|c| c.split(':').next() == Some(uid))
    });
    assert!(owned, "COPY --chown={user} ... {} in the image stage", state_dir.display());
}

#[test]
fn the_build_stage_builds_the_locked_release_and_strips_it() {
    let stages = dockerfile();
    assert_eq!(stages.len(), 2, "a build stage and the image");
    let build = &stages[0];
    let runs = all_of(build, "RUN").join("\n");
    assert!(runs.contains("cargo build --release --locked"), "{runs}");
    let env: String = all_of(build, "ENV").join(" ");
    assert!(
        env.contains("CARGO_PROFILE_RELEASE_STRIP=symbols") || runs.contains("strip "),
        "the image's binary is stripped (Cargo.toml's release profile keeps debug info)"
    );

    // The toolchain is at least the crate's rust-version.
    let manifest = toml_value(&read("Cargo.toml"), "Cargo.toml");
    let msrv = manifest["package"]["rust-version"].as_str().expect("rust-version");
    let arg = read("Dockerfile")
        .lines()
        .find_map(|l| l.strip_prefix("ARG RUST_VERSION=").map(str::to_owned))
        .expect("ARG RUST_VERSION=");
    let version = |v: &str| -> (u32, u32) {
        let mut parts = v.split('.').map(|p| p.parse::<u32>().expect("version number"));
        (parts.next().expect("major"), parts.next().expect("minor"))
    };
    assert!(version(&arg) >= version(msrv), "RUST_VERSION {arg} < rust-version {msrv}");

    // The binary links glibc: build and image on the same Debian release.
    let base = |stage: &[Instruction]| one_of(stage, "FROM").split_whitespace().next().expect("image").to_owned();
    let (builder, runtime) = (base(build), base(&stages[1]));
    let debian = [("bookworm", "debian12"), ("trixie", "debian13")]
        .iter()
        .find(|(codename, _)| builder.ends_with(&format!("-{codename}")))
        .unwrap_or_else(|| panic!("build stage {builder}: a Debian release by codename"));
    assert!(runtime.contains(debian.1), "build on {builder}, run on {runtime}: the same Debian release");
}

#[test]
fn the_build_context_holds_what_the_dockerfile_copies_and_not_target() {
    // .dockerignore is an allow-list: "*", then "!path" entries (last match wins).
    let rules: Vec<(bool, String)> = read(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.strip_prefix('!') {
            Some(p) => (true, p.trim_end_matches('/').to_owned()),
            None => (false, l.trim_end_matches('/').to_owned()),
        })
        .collect();
    for (_, pattern) in &rules {
        assert!(pattern == "*" || !pattern.contains(['*', '?', '[']), "this test reads only '*' and plain paths");
    }
    let included = |path: &str| {
        let mut verdict = true;
        for (include, pattern) in &rules {
            if pattern == "*" || path == pattern || path.starts_with(&format!("{pattern}/")) {
                verdict = *include;
            }
        }
        verdict
    };
    for stage in dockerfile() {
        for (opts, sources, _) in all_of(&stage, "COPY").iter().map(|a| copy_parts(a)) {
            if opts.contains_key("from") {
                continue;
            }
            for source in sources {
                let source = source.trim_end_matches('/');
                assert!(repo(source).exists(), "COPY {source}: no such file");
                assert!(included(source), "COPY {source}: excluded by .dockerignore");
            }
        }
    }
    for never in ["target", ".git", "wxgate-state.json", "bench/results"] {
        assert!(!included(never), "{never} is sent to the builder");
    }
}

/// Values of `${VAR:-default}` as compose substitutes them with VAR unset.
fn compose_default(value: &str) -> String {
    match value.strip_prefix("${").and_then(|v| v.strip_suffix('}')) {
        Some(inner) => inner.split_once(":-").map_or(String::new(), |(_, d)| d.to_owned()),
        None => value.to_owned(),
    }
}

/// `host_ip:host:container` → (host ip, host port, container port).
fn published(mapping: &str) -> (String, u16, u16) {
    let parts: Vec<&str> = mapping.split(':').collect();
    assert_eq!(parts.len(), 3, "publish as \"127.0.0.1:host:container\": {mapping}");
    (parts[0].to_owned(), parts[1].parse().expect("host port"), parts[2].parse().expect("container port"))
}

/// `source:target[:ro]` → (source, target).
fn mount(volume: &str) -> (String, String) {
    let parts: Vec<&str> = volume.split(':').collect();
    (parts[0].to_owned(), parts[1].to_owned())
}

/// Whether this build of wxgate has the `sim` subcommand (another branch
/// adds it): its `--help`, if so.
fn sim_help() -> Option<String> {
    let (code, out, _) = run(&["sim", "--help"], &[]);
    (code == 0).then_some(out)
}

#[test]
fn compose_runs_two_instances_on_redis_in_front_of_the_simulator() {
    let docs = yaml("deploy/compose.yaml");
    let services = entries(&docs[0]["services"], "services");
    let service = |name: &str| -> &Yaml {
        services.iter().find(|(n, _)| *n == name).map(|(_, s)| *s).unwrap_or_else(|| panic!("no service {name}"))
    };
    let config_path = image_config_path();

    // Services of the wxgate image are built from this repository.
    let ours: Vec<(&str, &Yaml)> =
        services.iter().filter(|(_, s)| s["image"].as_str() == Some(IMAGE)).copied().collect();
    for (name, s) in &ours {
        let context = repo("deploy").join(text(&s["build"]["context"], "build.context"));
        assert_eq!(context.canonicalize().expect("context"), repo("").canonicalize().expect("repo"), "{name}");
        assert!(context.join(text(&s["build"]["dockerfile"], "build.dockerfile")).is_file(), "{name}");
    }

    // The wxgate instances: no command (they serve), compose-rules.toml at the image's config path.
    let gateways: Vec<(&str, &Yaml)> = ours.iter().filter(|(_, s)| s["command"].is_badvalue()).copied().collect();
    assert_eq!(gateways.len(), 2, "two wxgate instances");
    let rules_text = read("deploy/compose-rules.toml");
    let rules = toml_value(&rules_text, "deploy/compose-rules.toml");
    let ports = listeners(&rules_text, "deploy/compose-rules.toml");
    let (mut proxy_ports, mut admin_ports) = (BTreeSet::new(), BTreeSet::new());
    for (name, s) in &gateways {
        let mounts: Vec<(String, String)> = strings(&s["volumes"], "volumes").iter().map(|v| mount(v)).collect();
        assert!(mounts.contains(&("./compose-rules.toml".into(), config_path.clone())), "{name}: {mounts:?}");
        let env: Vec<(String, String)> = entries(&s["environment"], "environment")
            .into_iter()
            .map(|(k, v)| (k.to_owned(), compose_default(text(v, k))))
            .collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_checks(&repo("deploy/compose-rules.toml"), &env);

        let mapped: Vec<(String, u16, u16)> = strings(&s["ports"], "ports").iter().map(|p| published(p)).collect();
        let inside: BTreeSet<u16> = mapped.iter().map(|m| m.2).collect();
        assert_eq!(inside, BTreeSet::from([ports.listen.port(), ports.admin.port()]), "{name}: {mapped:?}");
        for (ip, host, inside) in mapped {
            assert_eq!(ip, "127.0.0.1", "{name} publishes on the host's loopback only");
            let fresh = if inside == ports.listen.port() { proxy_ports.insert(host) } else { admin_ports.insert(host) };
            assert!(fresh, "host port {host} published twice");
        }
        let needs: Vec<&str> = entries(&s["depends_on"], "depends_on").iter().map(|(k, _)| *k).collect();
        assert!(needs.contains(&"redis") && needs.contains(&"wechat"), "{name} depends on {needs:?}");
    }
    assert_eq!(rules["store"]["instances"].as_integer(), Some(gateways.len() as i64), "[store] instances");

    // Redis is the service the store URL names, on Redis's own port.
    let url = rules["store"]["url"].as_str().expect("[store] url");
    assert_eq!(url, "redis://redis:6379");
    assert!(text(&service("redis")["image"], "redis image").starts_with("redis:"));

    // WeChat is `wxgate sim`, listening where the upstream points.
    let upstream: http::Uri = rules["server"]["upstream"].as_str().expect("upstream").parse().expect("upstream URL");
    let wechat = service(upstream.host().expect("upstream host"));
    assert_eq!(wechat["image"].as_str(), Some(IMAGE));
    let command = strings(&wechat["command"], "wechat command");
    let arg = |flag: &str| command.iter().position(|a| a == flag).map(|i| command[i + 1].clone());
    assert_eq!(command[0], "sim");
    let sim_listen: SocketAddr = arg("--listen").expect("sim --listen").parse().expect("address");
    assert!(sim_listen.ip().is_unspecified(), "the sim listens for the other containers");
    assert_eq!(Some(sim_listen.port()), upstream.port_u16(), "upstream {upstream} and sim {sim_listen}");
    let limits = arg("--limits").expect("sim --limits");
    let sim_mounts: Vec<(String, String)> =
        strings(&wechat["volumes"], "wechat volumes").iter().map(|v| mount(v)).collect();
    let source = sim_mounts.iter().find(|(_, target)| *target == limits).map(|(s, _)| s.clone());
    let source = source.unwrap_or_else(|| panic!("--limits {limits} is mounted: {sim_mounts:?}"));
    match sim_help() {
        Some(help) => {
            assert!(help.contains("--listen") && help.contains("--limits"), "wxgate sim --help:\n{help}");
            assert!(repo("deploy").join(&source).is_file(), "deploy/{source} exists");
        }
        None => eprintln!("NOTE: this build has no `wxgate sim`: its command line and {source} were not checked"),
    }

    // The curl loop in the header calls a limited rule on both instances'
    // published ports, then reads each one's /metrics.
    let header: String = read("deploy/compose.yaml").lines().take_while(|l| l.starts_with('#')).collect();
    let proxy: Vec<u16> = proxy_ports.into_iter().collect();
    assert_eq!(proxy[1], proxy[0] + 1, "the loop alternates between consecutive ports");
    assert!(header.contains(&format!("port=$(({} + i % 2))", proxy[0])), "the loop's ports are {proxy:?}");
    for port in admin_ports {
        assert!(header.contains(&format!("127.0.0.1:{port}/metrics")), "the header reads /metrics on {port}");
    }
    let path = "/cgi-bin/message/template/send";
    assert!(header.contains(path));
    let limited = rules["rule"].as_array().expect("rules").iter().any(|r| {
        let matches = r["match"].as_array().is_some_and(|m| m.iter().any(|p| p.as_str() == Some(path)));
        matches && r["limits"].as_array().is_some_and(|l| !l.is_empty())
    });
    assert!(limited, "the loop's path has a rule with limits in compose-rules.toml");
}

/// The Kubernetes objects of a file, by kind.
fn objects<'a>(docs: &'a [Yaml], kind: &str) -> Vec<&'a Yaml> {
    docs.iter().filter(|d| d["kind"].as_str() == Some(kind)).collect()
}

/// The ConfigMaps the header of the manifest `path` says to make, as its
/// one documented `kubectl create configmap NAME --from-file=KEY=FILE ...
/// --dry-run=client -o yaml | kubectl apply -f -` (run from the
/// repository's root, again after each edit) makes them: name → key → text.
/// The manifest defines no ConfigMap itself, which `kubectl apply -f` would
/// otherwise put back over the one made from the files.
fn documented_config_maps(path: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    assert!(
        objects(&yaml(path), "ConfigMap").is_empty(),
        "{path} defines a ConfigMap beside the one its documented command makes: one way to supply it"
    );
    // Comment lines, with `\` continuations joined.
    let mut lines = Vec::new();
    let mut pending = String::new();
    for line in read(path).lines().filter_map(|l| l.trim_start().strip_prefix('#')) {
        match line.trim().strip_suffix('\\') {
            Some(part) => pending.push_str(part),
            None => lines.push(std::mem::take(&mut pending) + line.trim()),
        }
    }
    let mut maps = BTreeMap::new();
    for command in lines.iter().filter_map(|l| l.split_once("kubectl create configmap ").map(|(_, c)| c)) {
        let (create, then) = command.split_once('|').unwrap_or((command, ""));
        assert_eq!(
            then.trim(),
            "kubectl apply -f -",
            "{path}: `{command}` applies what it makes (again after an edit)"
        );
        let mut words = create.split_whitespace();
        let name = words.next().expect("configmap name").to_owned();
        let mut data = BTreeMap::new();
        let mut rest = Vec::new();
        for word in words {
            match word.strip_prefix("--from-file=") {
                Some(source) => {
                    let (key, file) = source.split_once('=').unwrap_or_else(|| {
                        (Path::new(source).file_name().and_then(|n| n.to_str()).expect("file name"), source)
                    });
                    assert!(data.insert(key.to_owned(), read(file)).is_none(), "{path}: key {key} given twice");
                }
                None => rest.push(word),
            }
        }
        assert_eq!(rest, ["--dry-run=client", "-o", "yaml"], "{path}: `{command}`: options this test does not render");
        let size: usize = data.values().map(String::len).sum();
        assert!(size < 1 << 20, "{path}: ConfigMap {name} is {size} bytes; Kubernetes takes at most 1 MiB");
        assert!(maps.insert(name.clone(), data).is_none(), "{path}: ConfigMap {name} is made by two commands");
    }
    maps
}

/// The config file `file_name` of the ConfigMap `map_name` that the manifest
/// `path` says how to make.
fn pod_config(path: &str, map_name: &str, file_name: &str) -> String {
    let maps = documented_config_maps(path);
    let map = maps.get(map_name).unwrap_or_else(|| {
        panic!("{path}: its header says how to make ConfigMap {map_name} (kubectl create configmap {map_name} --from-file=...)")
    });
    map.get(file_name).cloned().unwrap_or_else(|| panic!("{path}: ConfigMap {map_name} has a key {file_name}"))
}

/// The ConfigMap `map_name` of the manifest `path` as the pod sees it
/// mounted: each of its keys a file in `dir`; the path of `file_name` there.
fn pod_config_dir(path: &str, map_name: &str, dir: &TempDir, file_name: &str) -> std::path::PathBuf {
    let maps = documented_config_maps(path);
    let map = maps.get(map_name).unwrap_or_else(|| panic!("{path}: ConfigMap {map_name}"));
    for (key, text) in map {
        dir.write(key, text);
    }
    assert!(map.contains_key(file_name), "{path}: ConfigMap {map_name} has a key {file_name}");
    dir.join(file_name)
}

/// Checks every wxgate container of `path` against the config its ConfigMap
/// holds (as the manifest's documented command makes it, every key mounted
/// beside the config): the config passes `wxgate check`, takes its rules
/// from the shipped rules.toml (and WeCom's, uncommented, from
/// rules-wecom.toml) and has a `default` rule; ports,
/// probes, mount, the admin token and the token key (both from a Secret),
/// and the Redis Service agree with it; `[store] instances` is left to the
/// heartbeats; a wxgate beside another container is a native sidecar
/// (an init container with `restartPolicy: Always` and a startup probe).
fn check_kubernetes(path: &str, redis_services: &BTreeSet<String>) -> usize {
    let docs = yaml(path);
    let config_path = image_config_path();
    let config_dir = Path::new(&config_path).parent().expect("config dir").to_str().expect("utf-8").to_owned();
    let mut containers = 0;
    for deployment in objects(&docs, "Deployment") {
        let pod = &deployment["spec"]["template"]["spec"];
        let replicas = deployment["spec"]["replicas"].as_i64().expect("replicas");
        let init = pod["initContainers"].as_vec().map_or(&[][..], |v| &v[..]);
        let main = pod["containers"].as_vec().expect("containers");
        for c in init.iter().chain(main) {
            if c["image"].as_str() != Some(IMAGE) {
                continue;
            }
            containers += 1;
            if main.iter().any(|m| m["image"].as_str() != Some(IMAGE)) {
                assert!(
                    init.iter().any(|i| std::ptr::eq(i, c)) && c["restartPolicy"].as_str() == Some("Always"),
                    "{path}: wxgate beside a service is a native sidecar (initContainers, restartPolicy: Always)"
                );
                assert_eq!(c["startupProbe"]["httpGet"]["path"].as_str(), Some("/readyz"), "{path}: startupProbe");
            }
            let args = strings(&c["args"], "args");
            assert!(args.is_empty() || args == ["--config", config_path.as_str()], "{path}: args {args:?}");
            // The ConfigMap mounted over the image's config directory.
            let volume = c["volumeMounts"]
                .as_vec()
                .expect("volumeMounts")
                .iter()
                .find(|m| m["mountPath"].as_str() == Some(&config_dir))
                .map(|m| text(&m["name"], "volume name").to_owned())
                .unwrap_or_else(|| panic!("{path}: a volume mounted at {config_dir}"));
            let source = pod["volumes"]
                .as_vec()
                .expect("volumes")
                .iter()
                .find(|v| v["name"].as_str() == Some(volume.as_str()))
                .map(|v| &v["configMap"])
                .expect("the volume is a ConfigMap");
            let map_name = text(&source["name"], "configMap name");
            assert!(source["items"].is_badvalue(), "{path}: every key of ConfigMap {map_name} is mounted");
            // The ConfigMap the pod sees: what the one documented command makes.
            let file_name = Path::new(&config_path).file_name().expect("name").to_str().expect("utf-8");
            let config_text = pod_config(path, map_name, file_name);
            let dir = TempDir::new("kubernetes");
            let config_file = pod_config_dir(path, map_name, &dir, file_name);
            assert_checks(&config_file, &[TOKEN]);
            assert_shipped_rules(&config_file, &format!("{path}'s ConfigMap {map_name}"));
            let loaded = load_deployed(&config_file, &config_text, path);
            let config_text = config_text.as_str();

            let ports = listeners(config_text, path);
            let config = toml_value(config_text, path);
            let named: BTreeMap<String, u16> = c["ports"]
                .as_vec()
                .expect("ports")
                .iter()
                .map(|p| (text(&p["name"], "port name").to_owned(), p["containerPort"].as_i64().expect("port") as u16))
                .collect();
            let declared: BTreeSet<u16> = named.values().copied().collect();
            let mut wanted = BTreeSet::from([ports.admin.port()]);
            if !ports.listen.ip().is_loopback() {
                wanted.insert(ports.listen.port());
            }
            assert_eq!(declared, wanted, "{path}: containerPorts are the config's non-loopback listeners");
            for (probe, endpoint) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
                let get = &c[probe]["httpGet"];
                assert_eq!(get["path"].as_str(), Some(endpoint), "{path}: {probe}");
                let port = get["port"].as_str().map(|n| named[n]).or(get["port"].as_i64().map(|p| p as u16));
                assert_eq!(port, Some(ports.admin.port()), "{path}: {probe} on the admin port");
            }
            if !ports.admin.ip().is_loopback() {
                let env = c["env"].as_vec().expect("env");
                assert!(
                    env.iter()
                        .any(|e| e["name"].as_str() == Some(TOKEN.0) && !e["valueFrom"]["secretKeyRef"].is_badvalue()),
                    "{path}: {} from a Secret",
                    TOKEN.0
                );
            }
            assert_eq!(c["securityContext"]["runAsNonRoot"].as_bool(), Some(true), "{path}");
            assert!(replicas >= 1, "{path}: replicas");
            // An instance that starts while Redis is away hears no other:
            // `instances` is the least the fallback divides the limits by.
            let instances = config["store"].get("instances").and_then(toml::Value::as_integer);
            assert!(
                instances.is_some_and(|n| n >= replicas),
                "{path}: [store] instances ({instances:?}) is at least the Deployment's replicas ({replicas})"
            );
            let env = c["env"].as_vec().expect("env");
            assert!(
                env.iter()
                    .any(|e| e["name"].as_str() == Some("WXGATE_TOKEN_KEY")
                        && !e["valueFrom"]["secretKeyRef"].is_badvalue()),
                "{path}: WXGATE_TOKEN_KEY from a Secret (the shared token cache)"
            );
            assert!(
                env.iter().any(|e| e["name"].as_str() == Some("WXGATE_REDIS_PASSWORD")
                    && !e["valueFrom"]["secretKeyRef"].is_badvalue()),
                "{path}: WXGATE_REDIS_PASSWORD from a Secret (the shipped Redis requires one)"
            );
            assert_eq!(
                loaded.rule_for("/cgi-bin/no-such-api").map(|r| r.name.to_string()).as_deref(),
                Some("default"),
                "{path}: a `default` rule (every other API: penalties only)"
            );
            let url: http::Uri = config["store"]["url"].as_str().expect("[store] url").parse().expect("URL");
            assert!(redis_services.contains(url.host().expect("host")), "{path}: Redis {url} is a Service");
        }
    }
    // Every Service's named target ports exist on the pods it selects.
    for service in objects(&docs, "Service") {
        let selector = entries(&service["spec"]["selector"], "selector");
        let pods: Vec<&Yaml> = docs
            .iter()
            .filter(|d| {
                let labels = &d["spec"]["template"]["metadata"]["labels"];
                !labels.is_badvalue() && selector.iter().all(|(k, v)| labels[*k].as_str() == v.as_str())
            })
            .collect();
        assert!(!pods.is_empty(), "{path}: Service {:?} selects no pods", service["metadata"]["name"]);
        for port in service["spec"]["ports"].as_vec().expect("ports") {
            let target = text(&port["targetPort"], "targetPort");
            let found = pods.iter().any(|p| {
                p["spec"]["template"]["spec"]["containers"].as_vec().expect("containers").iter().any(|c| {
                    c["ports"].as_vec().is_some_and(|ps| ps.iter().any(|cp| cp["name"].as_str() == Some(target)))
                })
            });
            assert!(found, "{path}: targetPort {target} names a container port");
        }
    }
    containers
}

#[test]
fn the_kubernetes_files_run_the_image_on_configs_that_pass_check() {
    let egress = yaml("deploy/kubernetes-egress.yaml");
    let redis: BTreeSet<String> = objects(&egress, "Service")
        .into_iter()
        .filter(|s| s["spec"]["ports"].as_vec().is_some_and(|ps| ps.iter().any(|p| p["port"].as_i64() == Some(6379))))
        .map(|s| text(&s["metadata"]["name"], "name").to_owned())
        .collect();
    assert_eq!(redis.len(), 1, "kubernetes-egress.yaml has one Redis Service");
    assert_eq!(check_kubernetes("deploy/kubernetes-sidecar.yaml", &redis), 1);
    assert_eq!(check_kubernetes("deploy/kubernetes-egress.yaml", &redis), 1);
    let deployment = objects(&egress, "Deployment")[0];
    let replicas = deployment["spec"]["replicas"].as_i64();
    assert!(replicas >= Some(2), "the shared egress runs 2+ replicas");
    let proxy = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert!(!proxy["lifecycle"]["preStop"].is_badvalue(), "the egress drains (preStop) before it stops accepting");
    // The shipped Redis requires a password, keeps protected mode, and
    // only wxgate's pods reach it.
    let redis_sets = objects(&egress, "StatefulSet");
    let redis = &redis_sets[0]["spec"]["template"]["spec"]["containers"][0];
    let args = strings(&redis["args"], "redis args");
    assert!(args.windows(2).any(|w| w[0] == "--requirepass" && w[1] == "$(REDIS_PASSWORD)"), "{args:?}");
    assert!(!args.iter().any(|a| a == "--protected-mode"), "Redis keeps protected mode: {args:?}");
    let policies = objects(&egress, "NetworkPolicy");
    assert!(
        policies.iter().any(|p| p["spec"]["podSelector"]["matchLabels"]["app"].as_str() == Some("wxgate-redis")),
        "a NetworkPolicy narrows who reaches Redis"
    );
    assert!(
        policies.iter().any(|p| p["spec"]["podSelector"]["matchLabels"]["app"].as_str() == Some("wxgate-egress")),
        "a NetworkPolicy narrows who reaches the shared egress"
    );
}

/// Who calls through a shipped config, the SDK it calls with, and the HTTP
/// status its refusals must come as: the shape that SDK reads
/// (docs/sdks.md). `None`: the config's own `[server] caller` (one service).
struct SdkCaller {
    config: &'static str,
    caller: Option<&'static str>,
    sdk: &'static str,
    status: u16,
}

const SDK_CALLERS: &[SdkCaller] = &[
    // The image's config: one service, whichever SDK; most read only 200.
    SdkCaller {
        config: "deploy/container.toml",
        caller: None,
        sdk: "wechatpy, WxJava, EasyWeChat, silenceper",
        status: 200,
    },
    SdkCaller { config: "deploy/kubernetes-sidecar.yaml", caller: None, sdk: "wechatpy", status: 200 },
    SdkCaller { config: "deploy/kubernetes-egress.yaml", caller: Some("orders"), sdk: "wechatpy", status: 200 },
    SdkCaller { config: "deploy/kubernetes-egress.yaml", caller: Some("billing"), sdk: "WxJava", status: 200 },
    SdkCaller { config: "deploy/kubernetes-egress.yaml", caller: Some("shop"), sdk: "EasyWeChat", status: 200 },
    SdkCaller {
        config: "deploy/kubernetes-egress.yaml",
        caller: Some("notify"),
        sdk: "silenceper/wechat",
        status: 200,
    },
    // Reads the body whatever the status: the default 429 and Retry-After.
    SdkCaller { config: "deploy/kubernetes-egress.yaml", caller: Some("campaigns"), sdk: "wechat-api", status: 429 },
];

/// The config a shipped file serves, written into `dir` with the files it
/// reads beside it: the image's config directory for the image's config, a
/// manifest's ConfigMap as its documented command makes it.
fn served_config(path: &str, dir: &TempDir) -> std::path::PathBuf {
    if path == "deploy/container.toml" {
        return image_config_dir(dir);
    }
    let docs = yaml(path);
    let volumes = objects(&docs, "Deployment")[0]["spec"]["template"]["spec"]["volumes"].clone();
    let map_name = text(&volumes[0]["configMap"]["name"], "configMap name").to_owned();
    let config = image_config_path();
    let file_name = Path::new(&config).file_name().and_then(|n| n.to_str()).expect("config file name");
    pod_config_dir(path, &map_name, dir, file_name)
}

/// A test key for the shipped caller `name` (the shipped files hold
/// placeholder hashes no key has).
fn test_key(name: &str) -> String {
    format!("deploy-test-key-of-{name}")
}

/// `config_text` as shipped, on this machine: both listeners on free
/// loopback ports, `upstream` the mock WeChat, the memory store, and each
/// keyed caller's `key_sha256` that of [`test_key`]. Everything that shapes
/// a refusal (`[server] caller`, the callers' `throttle_status`, the
/// penalties and rules) is left as shipped.
fn shipped_on_loopback(config_text: &str, what: &str, upstream: &str) -> String {
    let mut config: toml::Table = toml::from_str(config_text).unwrap_or_else(|e| panic!("{what}: {e}"));
    let server = config.get_mut("server").and_then(|s| s.as_table_mut()).expect("[server]");
    server.insert("listen".into(), "127.0.0.1:0".into());
    server.insert("admin_listen".into(), "127.0.0.1:0".into());
    server.insert("upstream".into(), upstream.into());
    config.insert("store".into(), toml::Value::Table(toml::Table::from_iter([("kind".into(), "memory".into())])));
    for caller in config.get_mut("caller").and_then(|c| c.as_array_mut()).into_iter().flatten() {
        let caller = caller.as_table_mut().expect("[[caller]]");
        if caller.contains_key("key_sha256") {
            let name = caller["name"].as_str().expect("caller name").to_owned();
            caller.insert("key_sha256".into(), support::key_sha256(&test_key(&name)).into());
        }
    }
    toml::to_string(&config).expect("TOML")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_configs_refuse_each_sdks_calls_in_the_shape_that_sdk_reads() {
    for case in SDK_CALLERS {
        let what = format!("{} ({}, {})", case.config, case.caller.unwrap_or("its service"), case.sdk);
        let dir = TempDir::new("sdk-shapes");
        let served = served_config(case.config, &dir);
        let shipped = std::fs::read_to_string(&served).expect("served config");
        let config: toml::Value = toml::from_str(&shipped).unwrap_or_else(|e| panic!("{what}: {e}"));
        // The caller the config declares for it (a service's own: its
        // [server] caller, if any), and an account it may spend.
        let name = case.caller.or(config["server"].get("caller").and_then(|c| c.as_str()));
        let declared = config
            .get("caller")
            .and_then(|c| c.as_array())
            .and_then(|cs| cs.iter().find(|c| name.is_some() && c["name"].as_str() == name).and_then(|c| c.as_table()));
        assert!(declared.is_some() || case.caller.is_none(), "{what}: a [[caller]] named {name:?}");
        let account = declared
            .and_then(|c| c.get("accounts"))
            .and_then(|a| a.get(0))
            .and_then(|a| a.as_str())
            .unwrap_or("wx0123456789abcdef");

        // WeChat refuses the first call with its own 45009: wxgate answers it
        // and pauses the account's rule; the second call is wxgate's refusal.
        let mock = MockWeChat::start().await;
        mock.respond(|_| support::errcode_reply(45009));
        std::fs::write(&served, shipped_on_loopback(&shipped, &what, &mock.url())).expect("write");
        let gate = Gate::start_file(&served).await;
        let bearer = format!("Bearer {}", test_key(name.unwrap_or_default()));
        let mut headers = vec![("x-wx-account", account)];
        if declared.is_some_and(|c| c.contains_key("key_sha256")) {
            headers.push(("authorization", bearer.as_str()));
        }
        let path = "/cgi-bin/message/template/send?access_token=sdk-token";
        for (turn, reason) in [("WeChat's own 45009", None), ("wxgate's refusal", Some("penalty"))] {
            let answer = gate.post_with(path, r#"{"touser":"o1"}"#, &headers).await;
            assert_eq!(answer.status, case.status, "{what}: {turn} came as {}: {}", answer.status, answer.text());
            assert_eq!(answer.json()["errcode"], 45009, "{what}: {turn}: {}", answer.text());
            assert!(answer.header("retry-after").is_some(), "{what}: {turn} carries Retry-After");
            if let Some(reason) = reason {
                assert_eq!(answer.header("x-wxgate-reason"), Some(reason), "{what}: {turn}");
            }
        }
        assert_eq!(mock.count(), 1, "{what}: the refused call never reached WeChat");
    }
}

/// The oldest Kubernetes a manifest's comments say it needs (`Kubernetes
/// 1.N+`), as `1.N.0`.
fn oldest_kubernetes(path: &str) -> String {
    let file = read(path);
    let minor = file.split("Kubernetes 1.").skip(1).find_map(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        (rest[digits.len()..].starts_with('+')).then(|| digits.parse::<u32>().ok()).flatten()
    });
    format!("1.{}.0", minor.unwrap_or_else(|| panic!("{path} names the Kubernetes it needs (Kubernetes 1.N+)")))
}

#[test]
fn the_kubernetes_files_pass_the_kubernetes_api_schemas() {
    let Some(tool) = support::deploy::kubernetes_validate() else { return };
    let validate = |file: &str, version: Option<&str>| {
        let mut args = vec!["--strict"];
        if let Some(v) = version {
            args.extend(["--kubernetes-version", v]);
        }
        args.push(file);
        support::deploy::run_tool(&tool, &args)
    };
    // The files, against the oldest Kubernetes they name and the newest the tool knows.
    for file in ["deploy/kubernetes-sidecar.yaml", "deploy/kubernetes-egress.yaml"] {
        let oldest = oldest_kubernetes(file);
        for version in [Some(oldest.as_str()), None] {
            let (ok, said) = validate(file, version);
            assert!(ok && said.contains("passed"), "{file} against Kubernetes {version:?}:\n{said}");
        }
    }

    // The check is real: a misspelled field and a wrong type are refused.
    let dir = TempDir::new("kubernetes-validate");
    let sidecar = read("deploy/kubernetes-sidecar.yaml");
    for (from, to, named) in [
        ("  restartPolicy: Always", "  restartPolicyy: Always", "restartPolicyy"),
        ("containerPort: 9090", "containerPort: \"9090\"", "containerPort"),
    ] {
        assert!(sidecar.contains(from), "the sidecar has {from}");
        let broken = dir.write("broken.yaml", &sidecar.replacen(from, to, 1));
        let (ok, said) = validate(broken.to_str().expect("utf-8"), None);
        assert!(!ok && said.contains(named), "{to} passed kubernetes-validate:\n{said}");
    }
}

/// Runs `wxgate probe <args>`: exit code and the one line it wrote.
fn probe(args: &[&str]) -> (i32, String) {
    let mut all = vec!["probe"];
    all.extend_from_slice(args);
    let (code, out, err) = run(&all, &[]);
    let said = format!("{out}{err}");
    assert_eq!(said.trim_end().lines().count(), 1, "one line: {said:?}");
    (code, said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_says_0_to_a_live_wxgate_and_1_to_a_closed_port() {
    let gate =
        process::spawn(&ConfigToml::new("http://127.0.0.1:9").to_string(), "probe-live", &[]).expect("wxgate starts");
    let admin = gate.admin.expect("admin listener");
    let url = format!("http://{admin}/readyz");
    let (code, said) = probe(&["--url", &url]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("200"), "{said}");

    // --url needs no config: not a valid one, not any.
    let dir = TempDir::new("probe-no-config");
    let broken = dir.write("rules.toml", "[server\nlisten = ");
    let (code, said) = probe(&["--url", &url, "--config", broken.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{said}");

    let closed = ClosedPort::new();
    let (code, said) = probe(&["--url", &format!("{}/readyz", closed.url())]);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("cannot connect") && said.contains(&closed.port.to_string()), "{said}");

    let (code, said) = probe(&["--url", &format!("http://{admin}/no-such-endpoint")]);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("404"), "{said}");
}

#[test]
fn probe_without_url_asks_the_configs_admin_listener_and_never_exits_2() {
    // An admin listener on every interface is probed on loopback, at its port.
    let closed = ClosedPort::new();
    let dir = TempDir::new("probe-config");
    let config = ConfigToml::new("http://127.0.0.1:9")
        .server("admin_listen", format!("0.0.0.0:{}", closed.port))
        .server("admin_token", "t")
        .to_string();
    let path = dir.write("rules.toml", &config);
    let (code, said) = probe(&["--config", path.to_str().expect("utf-8")]);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains(&format!("http://127.0.0.1:{}/readyz", closed.port)), "{said}");

    // A config it cannot read is unhealthy (1), not a usage error (2, which Docker reserves).
    let broken = dir.write("broken.toml", "[server\n");
    let (code, said) = probe(&["--config", broken.to_str().expect("utf-8")]);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("invalid config"), "{said}");
    let off = dir.write("off.toml", &ConfigToml::new("http://127.0.0.1:9").server("admin_listen", "off").to_string());
    let (code, said) = probe(&["--config", off.to_str().expect("utf-8")]);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("admin_listen is off"), "{said}");
}

#[test]
fn probe_works_in_a_directory_without_a_config() {
    // No rules.toml here and none named: wxgate's default admin listener,
    // not "invalid config". Whether something answers on 127.0.0.1:9090 on
    // this machine is not this test's business: the URL asked is.
    let dir = TempDir::new("probe-anywhere");
    let (code, out, err) = process::run_in(dir.path(), &["probe", "--timeout", "1s"], &[]);
    let said = format!("{out}{err}");
    assert_eq!(said.trim_end().lines().count(), 1, "one line: {said:?}");
    assert!(said.contains("http://127.0.0.1:9090/readyz"), "{said}");
    assert!(!said.contains("invalid config"), "{said}");
    assert!(code == 0 || said.contains("give --url or --config"), "{code}: {said}");

    // A config that is named must exist: the probe says which one it missed.
    for (args, env) in [
        (vec!["probe", "--config", "wxgate.toml"], vec![]),
        (vec!["probe"], vec![("WXGATE_CONFIG", "/etc/wxgate/no-such.toml")]),
    ] {
        let (code, out, err) = process::run_in(dir.path(), &args, &env);
        assert_eq!(code, 1, "{args:?} {env:?}: {out}{err}");
        assert!(err.contains("invalid config") && err.contains("cannot read"), "{args:?} {env:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_says_1_while_wxgate_cannot_decide() {
    // Redis away and fallback = "deny": /readyz is 503, so the container is unhealthy.
    let redis = ClosedPort::new();
    let config = ConfigToml::new("http://127.0.0.1:9")
        .with(StoreToml::redis(&format!("redis://127.0.0.1:{}", redis.port)).set("fallback", "deny"));
    let gate = process::spawn(&config.to_string(), "probe-deny", &[]).expect("wxgate starts without Redis");
    let url = format!("http://{}/readyz", gate.admin.expect("admin listener"));
    let mut last = String::new();
    eventually("probe reports 503", PATIENCE, || {
        let (code, said) = probe(&["--url", &url]);
        last = said;
        code == 1 && last.contains("503")
    })
    .await;
    assert!(last.contains("unavailable") || last.contains("redis"), "the reason says why: {last}");
}

/// What wxgate writes beside the shipped rules.toml when a new user runs
/// the README's `cargo run --release -- --config rules.toml` in the clone
/// (the embedded store's state file and its lock, the queued deliveries'
/// SQLite file with its WAL and shared memory) is ignored by git: a
/// `git add -A` never commits counts, penalties or queued messages.
#[test]
fn what_the_shipped_rules_write_in_the_clone_is_ignored_by_git() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = wxgate::config::Config::load(&root.join("rules.toml")).expect("rules.toml loads");
    let wxgate::config::StoreConfig::Memory(memory) = &config.store else { panic!("rules.toml: the embedded store") };
    let state = memory.state_file.clone().expect("rules.toml keeps a state file");
    let wxgate::config::queue::JobsAt::File(jobs) = &config.queue.at else { panic!("rules.toml: a jobs file") };
    let mut written = Vec::new();
    for (file, suffixes) in [(&state, &["", ".lock", ".tmp"][..]), (jobs, &["", "-wal", "-shm", "-journal"])] {
        let relative = file.strip_prefix(root).unwrap_or(file).to_str().expect("utf-8").to_owned();
        written.extend(suffixes.iter().map(|s| format!("{relative}{s}")));
    }
    for name in &written {
        let ignored = Command::new("git")
            .args(["check-ignore", "--no-index", "-q", name])
            .current_dir(root)
            .status()
            .expect("git runs");
        assert!(ignored.success(), "{name} (written beside rules.toml) is not in .gitignore");
    }
}
