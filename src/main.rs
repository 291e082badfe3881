//! `wxgate [--config rules.toml]` serves; `wxgate check --config rules.toml`
//! validates and prints the compiled rules; `wxgate sim` serves a WeChat
//! API simulator (no rules config needed); `wxgate probe` asks a running
//! wxgate's admin listener whether it is ready (container health checks);
//! `wxgate ca init --out DIR` makes the CA of `[intercept]`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use wxgate::config::Config;
use wxgate::limit::penalty::PenaltyLength;
use wxgate::limit::{Limit, Rule};
use wxgate::server::Threads;
use wxgate::time::SystemClock;

/// mimalloc instead of glibc malloc: a proxy allocates and frees small
/// buffers on one thread and drops them on another all the time, which glibc
/// handles with locks and consolidation passes (~10 % of CPU in `perf`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The config read when neither `--config` nor `WXGATE_CONFIG` names one.
const DEFAULT_CONFIG: &str = "rules.toml";

#[derive(Parser)]
#[command(version, about = "Outbound proxy for the WeChat server API: shared quotas, no 45009")]
struct Cli {
    /// Config file.
    #[arg(long, short, global = true, env = "WXGATE_CONFIG", default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the config, print each compiled rule, exit non-zero on any error.
    Check,
    /// Try wxgate on this machine with nothing else: the WeChat simulator
    /// (`wxgate sim`'s demo) and wxgate with deploy/try.toml (or --config),
    /// in one process, until Ctrl-C. Not for production.
    Try(TryArgs),
    /// Serve a WeChat API simulator (quotas, 45009/45033, tokens, /__stats) for
    /// local tries and load tests. Needs no rules config. Reference: docs/sim.md.
    Sim(SimArgs),
    /// GET a running wxgate's /readyz (or --url): exit 0 on a 2xx answer, else 1 with the reason.
    Probe(ProbeArgs),
    /// The CA of [intercept] (CONNECT tunnels to WeChat's hosts). Reference: docs/intercept.md.
    #[command(subcommand)]
    Ca(CaCommand),
}

#[derive(Subcommand)]
enum CaCommand {
    /// Make a CA certificate (DIR/ca.pem) and key (DIR/ca-key.pem, mode 0600) for [intercept],
    /// and print the lines wxgate and each service need. Needs no rules config.
    Init(CaInitArgs),
}

#[derive(clap::Args)]
struct CaInitArgs {
    /// Directory to write ca.pem and ca-key.pem in (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Replace ca.pem and ca-key.pem if they exist (services trusting the old CA stop working).
    #[arg(long)]
    force: bool,
    /// What the CA is for, in its name (default: this machine's host name).
    #[arg(long)]
    name: Option<String>,
    /// wxgate's address as services reach it, for the printed HTTPS_PROXY line.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    proxy: String,
}

#[derive(clap::Args)]
struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9999")]
    listen: std::net::SocketAddr,
    /// Limits file (TOML); without it, the built-in demo (the same as deploy/sim.toml).
    #[arg(long)]
    limits: Option<PathBuf>,
}

#[derive(clap::Args)]
struct TryArgs {
    /// Where the simulator listens; the config's `[server] upstream` is set to it.
    #[arg(long, default_value = "127.0.0.1:9999")]
    sim: std::net::SocketAddr,
    /// Where wxgate listens (default: the config's `[server] listen`).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Where its admin API listens (default: the config's `[server] admin_listen`).
    #[arg(long)]
    admin: Option<std::net::SocketAddr>,
    /// Print the built-in config (deploy/try.toml's text) and exit.
    #[arg(long)]
    print_config: bool,
}

/// The config `wxgate try` serves when `--config` names none: built in, so
/// that it runs from any directory (deploy/try.toml is its readable copy).
const TRY_CONFIG: &str = include_str!("../deploy/try.toml");

/// The variable of the try config's demo account's secret, which `wxgate
/// try` sets itself (the simulator issues a token for any secret).
const TRY_SECRET_ENV: &str = "WXGATE_TRY_SECRET";

#[derive(clap::Args)]
struct ProbeArgs {
    /// What to GET, e.g. http://127.0.0.1:9090/readyz. Without it: /readyz on
    /// the config's admin_listen (0.0.0.0 and :: probed on loopback), or on the
    /// default admin_listen (127.0.0.1:9090) when no config is named and there
    /// is no rules.toml in this directory.
    #[arg(long)]
    url: Option<String>,
    /// Longest wait to connect, and for each read and write.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let check = match &cli.command {
        // The simulator reads its own file, never the rules config.
        Some(Command::Sim(args)) => return sim(args),
        // `probe` reads no config when given --url: a health check must not
        // depend on the rules file on disk being valid (a broken edit is
        // refused by the running wxgate, which keeps serving).
        Some(Command::Probe(args)) => return probe(args, &cli.config),
        // A CA is made before any config names it.
        Some(Command::Ca(CaCommand::Init(args))) => return ca_init(args),
        Some(Command::Check) => true,
        Some(Command::Try(args)) => return try_it(args, &cli.config),
        None => false,
    };
    // `check` runs where the deployment's environment is not (CI, a
    // laptop): an [[account]]'s secret_env unset here is a warning naming
    // it, checked with a stand-in; start-up refuses it.
    let unset: std::cell::RefCell<Vec<String>> = std::cell::RefCell::default();
    let env = |name: &str| match std::env::var(name) {
        Ok(value) => Some(value),
        Err(_) if check => {
            unset.borrow_mut().push(name.to_owned());
            Some(format!("stand-in-for-{name}"))
        }
        Err(_) => None,
    };
    let loaded = if check { check_load(&cli.config, &env) } else { Config::load(&cli.config).map(|c| (c, None)) };
    let (config, admin_warning) = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("wxgate: invalid config: {e}");
            return ExitCode::from(2);
        }
    };
    if check {
        let mut started = match check_start(&config) {
            Ok(started) => started,
            Err(e) => {
                eprintln!("wxgate: invalid config: {}: {e}", config.source.display());
                return ExitCode::from(2);
            }
        };
        started.warnings.splice(0..0, admin_warning);
        let mut unset = unset.borrow().clone();
        unset.sort_unstable();
        unset.dedup();
        started.warnings.extend(unset.iter().map(|name| {
            let try_sets = if name == TRY_SECRET_ENV { " (`wxgate try` sets it itself)" } else { "" };
            format!(
                "the environment variable {name} (an [[account]]'s secret_env) is not set here: start-up refuses the \
                 config where it is not set{try_sets}"
            )
        }));
        for warning in config.warnings.iter().map(ToString::to_string).chain(started.warnings.iter().cloned()) {
            eprintln!("wxgate: warning: {warning}");
        }
        print_rules(&config, &started);
        return ExitCode::SUCCESS;
    }
    run(config)
}

/// The variable start-up reads the admin token from when `[server]
/// admin_token` is not given.
const ADMIN_TOKEN_ENV: &str = "WXGATE_ADMIN_TOKEN";

/// The config as `wxgate check` reads it. The admin token, like the token
/// key ([`check_start`]), is usually a secret of the serving environment
/// only, which a check in CI cannot see: a config that loads only with
/// `WXGATE_ADMIN_TOKEN` set (an admin listener beyond loopback, no
/// `admin_token`) is checked as loaded with it, with a warning naming what
/// start-up needs (start-up itself still refuses it, exit 2).
fn check_load(
    path: &std::path::Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Config, Option<String>), wxgate::config::ConfigError> {
    let here = Config::load_with_env(path, env);
    let Err(e) = here else { return here.map(|c| (c, None)) };
    if std::env::var_os(ADMIN_TOKEN_ENV).is_some() {
        return Err(e);
    }
    // As loaded where the token is set (a stand-in, never used).
    std::env::set_var(ADMIN_TOKEN_ENV, "stand-in");
    let with_token = Config::load_with_env(path, env);
    std::env::remove_var(ADMIN_TOKEN_ENV);
    // Refused with the token set too: what fails whatever the environment.
    let config = with_token?;
    let warning = format!(
        "{ADMIN_TOKEN_ENV} is not set here and [server] admin_token is not given, so start-up here fails (exit 2): \
         \"{e}\"; set {ADMIN_TOKEN_ENV} where wxgate runs"
    );
    Ok((config, Some(warning)))
}

/// What `wxgate check` learns by building what start-up builds.
struct Started {
    /// The token cache as it starts here: `None`: off; `Some(shared)`.
    cache: Option<bool>,
    /// Whether the token key comes from where wxgate runs only (Redis,
    /// neither `WXGATE_TOKEN_KEY` here nor `[tokens] key_file`): then
    /// `cache` is as it starts with the key set.
    key_elsewhere: bool,
    /// Needs left to the environment at start, in words.
    warnings: Vec<String>,
}

/// Builds what start-up builds from `config` (the app: the upstream client
/// with `upstream_ca`, the token cache with its key, the accounts' needs,
/// `[intercept]`'s CA), over a stand-in store: only the store (its state
/// file, Redis) and the listeners are left out. `Err`: start-up fails
/// here, whatever the environment. A need only the environment at start
/// can meet is a warning: the token key over Redis, when neither
/// `WXGATE_TOKEN_KEY` (here) nor `[tokens] key_file` gives it (the key is
/// usually a secret of the serving environment only, which a check in CI
/// cannot see); then the app is built again as with the key set.
fn check_start(config: &Config) -> Result<Started, String> {
    use wxgate::features::token_cache::cache::KEY_ENV;
    check_intercept(config).map_err(|e| e.to_string())?;
    let redis = matches!(config.store, wxgate::config::StoreConfig::Redis(_));
    let key_elsewhere = redis && std::env::var_os(KEY_ENV).is_none() && config.tokens.key_file.is_none();
    let here = build_app(config);
    if !key_elsewhere {
        return Ok(Started { cache: here?, key_elsewhere, warnings: Vec::new() });
    }
    // As started where the key is set (a stand-in key, never used).
    std::env::set_var(KEY_ENV, "00".repeat(32));
    let with_key = build_app(config);
    std::env::remove_var(KEY_ENV);
    let cache = with_key?;
    let mut warnings = Vec::new();
    match here {
        Err(e) => warnings.push(format!(
            "{KEY_ENV} is not set here and [tokens] key_file is not given, so start-up here fails (exit 1): \
             \"{e}\"; set {KEY_ENV} (the same on every instance) where wxgate runs"
        )),
        Ok(None) if config.tokens.cache.is_none() => warnings.push(format!(
            "[tokens]: the token cache is off over Redis unless {KEY_ENV} is set where wxgate runs (it is not set \
             here, and [tokens] key_file is not given): without it every instance fetches its own access tokens, \
             and each fetch invalidates the others' five minutes later"
        )),
        Ok(Some(false)) => warnings.push(format!(
            "[tokens] cache = true over Redis: unless {KEY_ENV} is set where wxgate runs (it is not set here, and \
             [tokens] key_file is not given), tokens are cached in each instance only, and each instance's fetch \
             invalidates the others' five minutes later"
        )),
        Ok(_) => {}
    }
    Ok(Started { cache, key_elsewhere, warnings })
}

/// Start-up's app over a stand-in store; `Ok`: the token cache (`None`
/// off, `Some(shared)`).
fn build_app(config: &Config) -> Result<Option<bool>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async {
        let clock: Arc<dyn wxgate::time::Clock> = Arc::new(SystemClock);
        let store: Arc<dyn wxgate::store::Store> = Arc::new(wxgate::store::memory::MemoryStore::new(clock.clone()));
        let metrics = wxgate::telemetry::metrics::Metrics::new();
        let app =
            wxgate::proxy::app::App::new(config.clone(), store, clock, metrics, None).map_err(|e| e.to_string())?;
        let cache = app.features.token_cache.cache.as_ref().map(|c| c.shared);
        Ok(cache)
    })
}

/// `[intercept]`'s CA as start-up checks it: the files load, the key is
/// the certificate's, and a certificate for each host verifies now.
fn check_intercept(config: &Config) -> Result<(), wxgate::transport::intercept::ca::CaError> {
    use wxgate::time::Clock as _;
    let Some(ic) = &config.intercept else { return Ok(()) };
    let ca = wxgate::transport::intercept::ca::Ca::load(&ic.ca_cert, &ic.ca_key)?;
    for host in &ic.hosts {
        ca.leaf(host, SystemClock.now_us())?;
    }
    Ok(())
}

/// `wxgate probe`: exit 0 on a 2xx answer, 1 on anything else, never 2
/// (Docker reserves it in `HEALTHCHECK`), with one line saying why.
fn probe(args: &ProbeArgs, config: &std::path::Path) -> ExitCode {
    // No config named and none here: the admin listener of an empty config
    // (wxgate's defaults), so `wxgate probe` works from any directory. A
    // config that is named (--config, WXGATE_CONFIG) must exist.
    let defaults = args.url.is_none() && config == std::path::Path::new(DEFAULT_CONFIG) && !config.exists();
    let load = || if defaults { Config::parse("", config) } else { Config::load(config) };
    let url = match &args.url {
        Some(url) => url.clone(),
        None => match load().map(|c| c.server.admin_listen) {
            Ok(Some(admin)) => wxgate::ops::tools::healthcheck::admin_url(admin, "/readyz"),
            Ok(None) => {
                eprintln!("wxgate probe: {}: admin_listen is off; give --url", config.display());
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("wxgate probe: invalid config: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    match wxgate::ops::tools::healthcheck::probe(&url, args.timeout) {
        Ok(status) => {
            println!("{url}: {status}");
            ExitCode::SUCCESS
        }
        Err(why) if defaults => {
            eprintln!(
                "wxgate probe: {why} (no {DEFAULT_CONFIG} here: the default admin_listen; give --url or --config)"
            );
            ExitCode::FAILURE
        }
        Err(why) => {
            eprintln!("wxgate probe: {why}");
            ExitCode::FAILURE
        }
    }
}

/// `wxgate ca init`: writes the CA files (never over existing ones without
/// `--force`; the key created with mode 0600), then prints what to set.
fn ca_init(args: &CaInitArgs) -> ExitCode {
    match write_ca(args) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("wxgate ca init: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_ca(args: &CaInitArgs) -> Result<String, String> {
    use wxgate::time::Clock as _;
    use wxgate::transport::intercept::ca;
    let label = args.name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "wxgate".to_owned())
    });
    let new = ca::generate(&label, SystemClock.now_us()).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let dir = std::fs::canonicalize(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
    if !args.force {
        for f in [&cert, &key] {
            if f.exists() {
                return Err(format!(
                    "{} exists: services may trust it; give --force to replace it, or another --out",
                    f.display()
                ));
            }
        }
    }
    write_file(&key, new.key_pem.as_bytes(), 0o600, args.force)?;
    write_file(&cert, new.cert_pem.as_bytes(), 0o644, args.force)?;
    let (cert, key) = (cert.display(), key.display());
    let proxy = &args.proxy;
    Ok(format!(
        "# wxgate ca init: made \"{name}\", valid {days} days
#   {cert}      the CA certificate: every service that calls WeChat through wxgate trusts it
#   {key}  its key (mode 0600): only wxgate reads it; whoever holds it can impersonate
#   WeChat's hosts (*.{permitted}) to those services. One per deployment, never shared.

# rules.toml (wxgate):
[intercept]
ca_cert = \"{cert}\"
ca_key = \"{key}\"

# Each service calling WeChat (environment):
HTTPS_PROXY={proxy}
NO_PROXY=localhost,127.0.0.1,.svc,.cluster.local
REQUESTS_CA_BUNDLE={cert}
SSL_CERT_FILE={cert}
NODE_EXTRA_CA_CERTS={cert}
# NO_PROXY: every host the service reaches over HTTPS other than WeChat's; wxgate refuses
#   CONNECT to anything but [intercept] hosts (it is never a general proxy).
# REQUESTS_CA_BUNDLE (Python requests) and SSL_CERT_FILE (Python ssl/httpx, Go, Ruby, OpenSSL)
#   replace the system roots: a service that also calls other HTTPS hosts directly needs both:
#   cat /etc/ssl/certs/ca-certificates.crt {cert} > bundle.pem   (then point both at bundle.pem)
# NODE_EXTRA_CA_CERTS adds to Node's roots; Node's own https ignores HTTPS_PROXY (axios and
#   got need an agent such as https-proxy-agent).
# Java (ignores HTTPS_PROXY):
#   keytool -importcert -noprompt -alias wxgate-intercept -file {cert} -keystore \"$JAVA_HOME/lib/security/cacerts\" -storepass changeit
#   java -Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort=8080 -Dhttp.nonProxyHosts='localhost|127.0.0.1|*.svc' ...
# PHP / curl: curl honours HTTPS_PROXY; CURLOPT_CAINFO={cert} (curl --cacert {cert}).
",
        name = new.name,
        days = ca::CA_DAYS,
        permitted = ca::PERMITTED,
    ))
}

/// Writes a new file with `mode` (unix), created with that mode so the key
/// is never readable by others, even for a moment; with `replace`, an
/// existing file is removed first.
fn write_file(path: &std::path::Path, bytes: &[u8], mode: u32, replace: bool) -> Result<(), String> {
    use std::io::Write as _;
    if replace {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(|e| format!("{}: {e}", path.display()))
}

/// `wxgate sim`: serves until SIGTERM or Ctrl-C.
fn sim(args: &SimArgs) -> ExitCode {
    let mut config = match args
        .limits
        .as_deref()
        .map_or_else(wxgate::ops::tools::sim::SimConfig::demo, wxgate::ops::tools::sim::SimConfig::load)
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("wxgate sim: invalid limits: {e}");
            return ExitCode::from(2);
        }
    };
    config.listen = args.listen;
    // Logs to stderr like the server (`WXGATE_LOG`, default info).
    tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wxgate sim: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let source = config.source.clone();
        let apis = config.apis.len();
        let (addr, handle) = match wxgate::ops::tools::sim::serve(config, Arc::new(SystemClock)).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("wxgate sim: {e}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(listen = %addr, limits = %source, apis, "wxgate sim serving (GET /__stats, POST /__reset)");
        shutdown_signal().await;
        handle.stop();
        tracing::info!("wxgate sim: bye");
        ExitCode::SUCCESS
    })
}

/// What is logged: `WXGATE_LOG` (default `info`), with the `notify` crate
/// (the config watcher's) at most at `info` unless `WXGATE_LOG` names it.
/// At `trace` it logs every inotify event of the config file's directory,
/// and the watcher must watch the directory (editors and config maps
/// replace the file): with stderr written to a file there, each log line
/// was an event logged as another line, without end (~40 MB/s idle). The
/// watcher logs the config file's own events itself, at debug.
fn log_filter() -> EnvFilter {
    let filter = EnvFilter::try_from_env("WXGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let names_notify = std::env::var("WXGATE_LOG").is_ok_and(|v| v.contains("notify"));
    match "notify=info".parse() {
        Ok(quiet) if !names_notify => filter.add_directive(quiet),
        _ => filter,
    }
}

/// `wxgate try`: the simulator on `--sim`, then wxgate with `config` (the
/// global `--config`; the built-in [`TRY_CONFIG`], written into a private
/// temporary directory with its queue file, when it is the default
/// `rules.toml`) pointed at it. `WXGATE_TRY_SECRET`, when not set, is a
/// demo secret for the try config's account.
fn try_it(args: &TryArgs, config: &std::path::Path) -> ExitCode {
    if args.print_config {
        print!("{TRY_CONFIG}");
        return ExitCode::SUCCESS;
    }
    let built_in = config == std::path::Path::new("rules.toml");
    let dir = std::env::temp_dir().join(format!("wxgate-try-{}", std::process::id()));
    let path = if built_in {
        let written = std::fs::create_dir_all(&dir)
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            })
            .and_then(|()| std::fs::write(dir.join("try.toml"), TRY_CONFIG));
        if let Err(e) = written {
            eprintln!("wxgate try: cannot write its config into {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
        dir.join("try.toml")
    } else {
        config.to_path_buf()
    };
    let env = |name: &str| match std::env::var(name).ok() {
        None if name == TRY_SECRET_ENV => Some("any-secret-the-simulator-takes".to_owned()),
        value => value,
    };
    let mut config = match Config::load_with_env(&path, &env) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("wxgate try: invalid config: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if let Some(admin) = args.admin {
        config.server.admin_listen = Some(admin);
    }
    let mut sim = match wxgate::ops::tools::sim::SimConfig::demo() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("wxgate try: the simulator's demo limits: {e}");
            return ExitCode::FAILURE;
        }
    };
    sim.listen = args.sim;
    let served = serve(config, Some(sim));
    if built_in {
        let _ = std::fs::remove_dir_all(&dir);
    }
    served
}

fn run(config: Config) -> ExitCode {
    serve(config, None)
}

/// Serves `config` until SIGTERM or Ctrl-C; with `sim`, first the simulator,
/// and `[server] upstream` is where it listens.
fn serve(mut config: Config, sim: Option<wxgate::ops::tools::sim::SimConfig>) -> ExitCode {
    let builder = tracing_subscriber::fmt().with_env_filter(log_filter()).with_writer(std::io::stderr);
    if config.log.json {
        builder.json().flatten_event(true).init();
    } else {
        builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init();
    }
    // Calls are served on `[server] workers` threads of their own; this
    // runtime runs start-up, the admin API, reloads and background tasks.
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wxgate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    runtime.block_on(async move {
        let _sim = match sim {
            Some(sim) => match wxgate::ops::tools::sim::serve(sim, Arc::new(SystemClock)).await {
                Ok((addr, handle)) => {
                    tracing::info!(sim = %addr, "wxgate try: the WeChat simulator serving (GET /__stats)");
                    match config.upstreams_at(addr) {
                        Ok(()) => Some(handle),
                        Err(e) => {
                            eprintln!("wxgate try: {e}");
                            return ExitCode::FAILURE;
                        }
                    }
                }
                Err(e) => {
                    eprintln!("wxgate try: the simulator: {e}");
                    return ExitCode::FAILURE;
                }
            },
            None => None,
        };
        let upstream = config.server.upstream.clone();
        let shutdown_timeout = config.server.shutdown_timeout;
        let rules = config.rules.len();
        let workers = config.server.workers;
        let open = !config.server.caller_auth.required() && !config.server.listen.ip().is_loopback();
        let running = match wxgate::start_on(config, Arc::new(SystemClock), Threads::Workers(workers)).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("wxgate: {e}");
                return ExitCode::FAILURE;
            }
        };
        let admin = running.admin_addr.map_or_else(|| "off".to_owned(), |a| a.to_string());
        tracing::info!(listen = %running.addr, %admin, %upstream, rules, workers, "wxgate serving");
        if open {
            tracing::warn!(
                listen = %running.addr,
                "caller_auth = \"off\" on a listener beyond loopback: any service that reaches it may name any \
                 account (spending or pausing its quota) and any caller (taking its priority); set caller_auth = \
                 \"required\" unless only trusted services can reach this address"
            );
        }
        shutdown_signal().await;
        tracing::info!(deadline = ?shutdown_timeout, "shutting down: no new connections; finishing calls in flight");
        if running.shutdown(shutdown_timeout).await {
            tracing::info!("all calls finished; bye");
        }
        ExitCode::SUCCESS
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// One line of `wxgate check`'s report (writing to a String cannot fail).
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

/// `wxgate check`'s report. Written in one piece; a reader that stops early
/// (`wxgate check | head`) ends it quietly rather than with a panic.
fn print_rules(config: &Config, started: &Started) {
    use std::io::Write as _;
    let mut out = String::new();
    let s = &config.server;
    let tz = s.quota_offset_us / 60_000_000;
    let tz = format!("{}{:02}:{:02}", if tz < 0 { '-' } else { '+' }, tz.abs() / 60, tz.abs() % 60);
    say_server(&mut out, config, started, &tz);
    say_store(&mut out, config);
    for rule in &config.rules {
        say_rule(&mut out, rule, config.rule_http(Some(rule)).recipients.as_deref(), &tz);
        say_queue(&mut out, config, rule);
        say_overrides(&mut out, config, rule);
    }
    say_features(&mut out, config, started);
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
}

/// Whether a rule with `queue = true` can queue calls, and for which
/// accounts: a queued message is sent with an `[[account]]`'s own token,
/// and kept in the jobs store.
fn say_queue(out: &mut String, config: &Config, rule: &wxgate::limit::Rule) {
    use wxgate::config::queue::JobsAt;
    if config.rule_http(Some(rule)).queue.is_none() {
        return;
    }
    let accounts: Vec<&str> = config.accounts.list.iter().filter(|a| a.injects()).map(|a| &*a.name).collect();
    let jobs = match &config.queue.at {
        JobsAt::Off => None,
        JobsAt::File(path) => Some(format!("jobs in {}", path.display())),
        JobsAt::Redis => Some("jobs in Redis".to_owned()),
    };
    match (jobs, accounts.is_empty()) {
        (None, _) => say!(
            out,
            "  queue: no call can be queued: no jobs store ([queue] file = \"off\", or the embedded store with \
             state_file = \"off\" and no [queue] file); Prefer: respond-async gets 400"
        ),
        (Some(_), true) => say!(
            out,
            "  queue: no call can be queued: no [[account]] (a queued message is sent with the account's own token); \
             Prefer: respond-async gets 400"
        ),
        (Some(jobs), false) => say!(
            out,
            "  queue: Prefer: respond-async is kept ({jobs}) and sent at the rule's pace, for accounts {} (any other \
             account's gets 400)",
            accounts.join(", ")
        ),
    }
}

/// The report's server part: the config file, listen and upstream,
/// accounts, penalties, callers.
fn say_server(out: &mut String, config: &Config, started: &Started, tz: &str) {
    let s = &config.server;
    match started.warnings.len() + config.warnings.len() {
        0 => say!(out, "{}: ok", config.source.display()),
        1 => say!(out, "{}: ok, 1 warning (on stderr)", config.source.display()),
        n => say!(out, "{}: ok, {n} warnings (on stderr)", config.source.display()),
    }
    say!(out, "listen {}  upstream {}  quota_timezone {tz}  workers {}", s.listen, s.upstream, s.workers);
    if let Some(accounts) = &s.accounts {
        let mut names: Vec<&str> = accounts.iter().map(String::as_str).collect();
        names.sort_unstable();
        say!(out, "accounts {} (calls of any other account get 400)", names.join(", "));
    }
    for p in &config.penalties {
        let length = match p.length {
            PenaltyLength::Escalating { base } => {
                format!("{}s, doubling while it recurs", base.as_micros() / 1_000_000)
            }
            PenaltyLength::NextMinute => "until the next minute".to_owned(),
        };
        let cap = p.max.map_or_else(|| "the next midnight".to_owned(), |m| format!("{}s", m.as_micros() / 1_000_000));
        say!(out, "penalty errcode {}: {length}, at most until {cap}", p.errcode);
    }
    let auth = s.caller_auth;
    // With caller_auth required, a call without its key is refused (401):
    // no call falls back to a caller.
    if !auth.required() {
        let fallback = s.caller.as_deref().unwrap_or(wxgate::admit::callers::DEFAULT_CALLER);
        say!(out, "caller of calls without X-Wx-Caller: {fallback}");
    }
    match auth {
        wxgate::config::CallerAuth::Required => say!(
            out,
            "caller_auth required: each call proves its [[caller]] with its key and may spend only that caller's accounts"
        ),
        wxgate::config::CallerAuth::Off { .. } if !s.listen.ip().is_loopback() => say!(
            out,
            "caller_auth off on {} (beyond loopback): any service that reaches it may name any caller and spend any account",
            s.listen
        ),
        wxgate::config::CallerAuth::Off { .. } => {}
    }
    for c in &config.callers {
        let rate = c.rate.map_or_else(|| "no flood guard".to_owned(), |r| format!("flood guard {r} per instance"));
        let key = if c.key.is_some() { ", a key" } else { "" };
        let grants = match (&c.grants, auth.required()) {
            (wxgate::config::Grants::Unset, false) => String::new(),
            (g, _) => format!(", accounts: {}", g.describe()),
        };
        let refusals = match c.throttle_status {
            Some(status) if status == http::StatusCode::OK => ", refusals as 200 + errcode 45009",
            Some(_) => ", refusals as 429",
            None => "",
        };
        say!(out, "caller {}: priority {}, {rate}{key}{grants}{refusals}", c.name, c.priority.as_str());
    }
    if !config.callers.is_empty() {
        say!(out, "callers not declared: priority normal, counted together as \"other\"");
    }
    for a in &config.accounts.list {
        let id = match &a.agent {
            Some(agent) => format!("corpid {} agent {agent}", a.id),
            None => format!("appid {}", a.id),
        };
        let does = if a.injects() {
            format!("wxgate fetches its token ({}) and adds it to calls that carry none", a.token_api.as_str())
        } else {
            format!("its {} requests are checked against the secret and cached", a.token_api.as_str())
        };
        say!(out, "account {} ({}, {id}): secret from {}; {does}", a.name, a.kind.as_str(), a.source);
    }
}

/// The report's `[store]` line: the kind, where (never a password: no
/// URL's user info, no sentinel URL), and what the instances share.
fn say_store(out: &mut String, config: &Config) {
    use wxgate::config::{Fallback, StoreConfig};
    match &config.store {
        StoreConfig::Memory(m) => {
            let file = m.state_file.as_ref().map_or_else(
                || "no state file (state is lost on restart)".to_owned(),
                |f| {
                    format!(
                        "state file {} (flushed every {})",
                        f.display(),
                        humantime::format_duration(m.flush_interval)
                    )
                },
            );
            say!(out, "store memory: in this process, limits not shared with other instances; {file}");
        }
        StoreConfig::Redis(r) => {
            let (kind, at) = match (&r.sentinel, r.nodes.as_slice()) {
                (Some(s), _) => {
                    ("redis-sentinel", format!("master \"{}\" via {} sentinels", s.master, s.sentinels.len()))
                }
                (None, []) => ("redis", without_user_info(&r.url)),
                (None, nodes) => {
                    ("redis-cluster", nodes.iter().map(|n| without_user_info(n)).collect::<Vec<_>>().join(", "))
                }
            };
            let res = &r.resilience;
            let fallback = match res.fallback {
                Fallback::Local => format!(
                    "each instance decides alone with 1/{} of each limit (instances {})",
                    res.instances, res.instances
                ),
                Fallback::Allow => "calls are forwarded unthrottled (fallback allow)".to_owned(),
                Fallback::Deny => "calls are refused with 503 (fallback deny)".to_owned(),
            };
            say!(
                out,
                "store {kind} at {at}, key prefix \"{}\": limits shared by every instance; while Redis cannot answer, {fallback}",
                r.key_prefix
            );
        }
    }
}

/// A Redis URL without its user info (`redis://host:6379/0`).
fn without_user_info(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    // No query either: it may hold a password.
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    format!("{scheme}://{host}{path}")
}

/// The report's lines for one rule: its patterns, its options
/// ([`Rule::shown`]), its scope and limits.
fn say_rule(out: &mut String, rule: &Rule, meter: Option<&wxgate::config::Metering>, tz: &str) {
    say!(out, "rule {} [{}]", rule.name, rule.patterns.join(", "));
    if let Some(m) = meter {
        say!(out, "  {}", m.says());
    }
    for line in rule.shown().into_iter().filter_map(|option| option.says) {
        say!(out, "  {line}");
    }
    if rule.scope == wxgate::limit::Scope::Path {
        say!(out, "  scope path: each of its {} paths counts against these limits on its own", rule.patterns.len());
    }
    if rule.scope == wxgate::limit::Scope::App {
        say!(out, "  scope app: each WeCom app (the body's agentid) counts against these limits on its own");
    }
    if rule.limits.is_empty() {
        say!(out, "  no limits (penalties only)");
    }
    for limit in &rule.limits {
        match limit {
            Limit::Window(w) => say!(
                out,
                "  {} per {}: capacity {} + refill {:.4}/s (one every {}us); no {}-window admits more than {}{}",
                w.count(),
                humantime::format_duration(Duration::from_micros(w.per_us() as u64)),
                w.burst(),
                w.refill_per_second(),
                w.interval_us(),
                humantime::format_duration(Duration::from_micros(w.per_us() as u64)),
                w.count(),
                match w.margin_us() {
                    0 => String::new(),
                    m => format!(
                        ", at WeChat too for trips that differ by up to {} (window_margin)",
                        humantime::format_duration(Duration::from_micros(m as u64))
                    ),
                }
            ),
            Limit::Calendar { count, period } => {
                say!(out, "  {count} per calendar {} (resets at 00:00 {tz})", period.as_str())
            }
        }
    }
}

/// A rule's `[[quota]]` overrides: one line per account (at most 20, then
/// how many more), with its limits instead of the rule's.
fn say_overrides(out: &mut String, config: &Config, rule: &Rule) {
    const SHOWN: usize = 20;
    let mut n = 0;
    for o in config.overrides.of_rule(&rule.name) {
        n += 1;
        if n > SHOWN {
            continue;
        }
        let limits: Vec<String> = o
            .limits
            .iter()
            .map(|l| match l {
                Limit::Window(w) => format!(
                    "{} per {} (burst {})",
                    w.count(),
                    humantime::format_duration(Duration::from_micros(w.per_us() as u64)),
                    w.burst()
                ),
                Limit::Calendar { count, period } => format!("{count} per calendar {}", period.as_str()),
            })
            .collect();
        say!(out, "  account {} ([[quota]] line {}): {} instead", o.account, o.line, limits.join(", "));
    }
    if n > SHOWN {
        say!(out, "  ... and {} more accounts with limits of their own (GET /v1/rules lists them)", n - SHOWN);
    }
}

/// The report's last part: quota syncs, the token cache, `[intercept]`,
/// unmatched paths.
fn say_features(out: &mut String, config: &Config, started: &Started) {
    for sync in &config.quota_syncs {
        say!(
            out,
            "quota_sync {} ({}): asks WeChat's quota/get every {} and raises the day count to its `used`; its `daily_limit` {} the account's day quota (learn = \"{}\")",
            sync.rule.state,
            sync.path,
            humantime::format_duration(sync.every),
            if sync.rule.learn_up { "becomes" } else { "lowers" },
            if sync.rule.learn_up { "both" } else { "down" }
        );
    }
    let t = &config.tokens;
    let redis = matches!(config.store, wxgate::config::StoreConfig::Redis(_));
    let cache = match (started.cache, redis) {
        (None, _) => "off".to_owned(),
        (Some(_), false) => "on (in-process)".to_owned(),
        (Some(true), true) if started.key_elsewhere => {
            "on, shared by every instance through Redis where WXGATE_TOKEN_KEY is set (not set here)".to_owned()
        }
        (Some(true), true) => "on, shared by every instance through Redis (sealed with the token key)".to_owned(),
        (Some(false), true) => "on, in each instance only (no token key)".to_owned(),
    };
    say!(
        out,
        "tokens: cache {cache}; min_ttl {}, wait {}",
        humantime::format_duration(t.min_ttl),
        humantime::format_duration(t.wait)
    );
    if let Some(ic) = &config.intercept {
        let hosts: Vec<&str> = ic.hosts.iter().map(|h| &**h).collect();
        say!(out, "intercept CONNECT {}, port 443 (CA {})", hosts.join(", "), ic.ca_cert.display());
    }
    for (i, d) in config.domains.iter().enumerate() {
        let unmatched = if d.routes.has_default() { "rule default" } else { "forwarded unthrottled" };
        if config.domains.len() == 1 {
            if let Some(file) = &d.rules_file {
                say!(out, "rules and penalties from {}", file.display());
            }
            say!(out, "unmatched paths: {unmatched}");
            continue;
        }
        let from = d.rules_file.as_ref().map_or_else(|| "this file".to_owned(), |f| f.display().to_string());
        let how = if i == 0 { "no prefix, or /".to_owned() + &d.host + "/" } else { format!("/{}/", d.host) };
        say!(
            out,
            "domain {} ({how}): {} rules from {from}{}; upstream {}; unmatched paths: {unmatched}",
            d.host,
            d.rules.len(),
            if i == 0 { String::new() } else { format!(", named {}.<rule>", d.name) },
            d.upstream
        );
    }
}
