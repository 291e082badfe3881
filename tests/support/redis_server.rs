//! A real `redis-server` process on a free loopback port, for one test.
//! Never the shared server on 6379. Stopped and cleaned up on drop.
//!
//! Self-contained: `benches/decisions.rs` includes this file by path, so it
//! uses nothing else from `support` (its waits are its own deadline loops).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    child: Child,
    dir: PathBuf,
    args: Vec<String>,
}

fn store_config(url: String, nodes: Vec<String>, prefix: &str) -> wxgate::config::RedisConfig {
    wxgate::config::RedisConfig {
        url,
        username: None,
        password: None,
        tls_ca: None,
        key_prefix: prefix.to_owned(),
        timeout: Duration::from_secs(5),
        nodes,
        sentinel: None,
        wait_replicas: 0,
        resilience: wxgate::config::Resilience::strict(),
        batch: true,
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

impl RedisServer {
    /// Starts `redis-server` (or `$WXGATE_TEST_REDIS_SERVER`, e.g. a Valkey or
    /// Redis 6.2 binary) and waits until it answers PING.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> RedisServer {
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _attempt in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!("wxgate-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("redis dir");
            let child = spawn(port, &dir, &args);
            let mut server = RedisServer { port, child, dir, args: args.clone() };
            if server.wait_ready(Duration::from_secs(10)) {
                return server;
            }
            // Port taken between our probe and the server's bind: try another.
            let _ = server.child.kill();
        }
        panic!("redis-server did not start");
    }

    /// Kills the server (like a crash); [`RedisServer::restart`] brings it back on the same port.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a fresh, empty server on the same port.
    /// The port may be briefly taken meanwhile (another test's client
    /// socket can get it as its ephemeral port): the server is started
    /// again until it binds, for up to 10 s.
    pub fn restart(&mut self) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            self.child = spawn(self.port, &self.dir, &self.args);
            if self.wait_ready(Duration::from_secs(10)) {
                return;
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not come back on port {}", self.port);
    }

    /// SIGSTOP: the server keeps its connections but answers nothing.
    pub fn pause(&self) {
        signal(self.child.id(), "-STOP");
    }

    /// SIGCONT after [`RedisServer::pause`].
    pub fn resume(&self) {
        signal(self.child.id(), "-CONT");
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if self.ping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        // A server with requirepass answers -NOAUTH: up all the same.
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).is_ok() && (&buf == b"+PONG\r\n" || buf.starts_with(b"-NOAUTH"))
    }

    /// SIGCONT in case the server was paused; nothing if it has exited and
    /// been reaped already (its pid may belong to another process by now).
    fn resume_quietly(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = Command::new("kill").args(["-CONT", &self.child.id().to_string()]).stderr(Stdio::null()).status();
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A Redis store's settings for this server, keys under `prefix`: a
    /// generous timeout, and no fallback (every Redis failure is an error).
    pub fn store_config(&self, prefix: &str) -> wxgate::config::RedisConfig {
        store_config(self.url(), Vec::new(), prefix)
    }

    /// How many times Redis has run command `name` (lower case, e.g.
    /// "evalsha"), from `INFO commandstats`.
    pub fn command_calls(&self, name: &str) -> u64 {
        let stats = self.command("INFO commandstats");
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Lua script runs Redis has served (`EVALSHA`, `EVAL` and their `_RO`
    /// forms, `FCALL`), from `INFO commandstats`: every store decision is
    /// one. Background reads (the epoch check's `GET`) are not counted.
    pub fn script_runs(&self) -> u64 {
        ["evalsha", "evalsha_ro", "eval", "eval_ro", "fcall", "fcall_ro"].iter().map(|c| self.command_calls(c)).sum()
    }

    /// Runs one command on a fresh connection that first authenticates with
    /// `password` (`None`: no AUTH): Redis' reply, or its error.
    pub fn query_as(&self, password: Option<&str>, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let url = match password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => self.url(),
        };
        let client = redis::Client::open(url)?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut conn)
    }

    /// A pair state's fields as wxgate's scripts keep them (lua/prelude.lua
    /// `state_read`: a MessagePack map in one string value; the hash an
    /// older wxgate wrote too), read by one EVAL on a fresh connection
    /// authenticated with `password`. Empty for a missing key.
    pub fn state_as(&self, password: Option<&str>, key: &str) -> std::collections::HashMap<String, i64> {
        const READ: &str = "local s = redis.pcall('GET', KEYS[1]) \
            if type(s) == 'table' then return redis.call('HGETALL', KEYS[1]) end \
            local out = {} \
            if not s then return out end \
            for k, v in pairs(cmsgpack.unpack(s)) do out[#out + 1] = k; out[#out + 1] = string.format('%d', v) end \
            return out";
        let flat: Vec<String> = match self.query_as(password, &["EVAL", READ, "1", key]) {
            Ok(redis::Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    other => format!("{other:?}"),
                })
                .collect(),
            other => panic!("reading the state {key}: {other:?}"),
        };
        flat.chunks(2).filter_map(|kv| Some((kv.first()?.clone(), kv.get(1)?.parse().ok()?))).collect()
    }

    /// [`RedisServer::state_as`] without AUTH.
    pub fn state(&self, key: &str) -> std::collections::HashMap<String, i64> {
        self.state_as(None, key)
    }

    /// One field of a pair state ([`RedisServer::state`]).
    pub fn state_field(&self, key: &str, field: &str) -> Option<i64> {
        self.state(key).get(field).copied()
    }

    /// Like [`RedisServer::query_as`], for a command that must succeed.
    pub fn run_as(&self, password: Option<&str>, args: &[&str]) -> redis::Value {
        self.query_as(password, args).unwrap_or_else(|e| panic!("redis {args:?}: {e}"))
    }

    /// Every key and everything stored under it (strings, hashes, sorted
    /// sets, whatever their type), as raw bytes: what a reader of Redis sees.
    pub fn dump_all(&self) -> Vec<u8> {
        fn bytes(v: &redis::Value, out: &mut Vec<u8>) {
            match v {
                redis::Value::BulkString(b) => out.extend_from_slice(b),
                redis::Value::SimpleString(s) => out.extend_from_slice(s.as_bytes()),
                redis::Value::Array(items) | redis::Value::Set(items) => items.iter().for_each(|i| bytes(i, out)),
                redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
                    bytes(k, out);
                    bytes(v, out);
                }),
                other => out.extend_from_slice(format!("{other:?}").as_bytes()),
            }
            out.push(b'\n');
        }
        let mut out = Vec::new();
        let keys = match self.run_as(None, &["KEYS", "*"]) {
            redis::Value::Array(keys) => keys,
            other => panic!("KEYS answered {other:?}"),
        };
        for key in keys {
            let redis::Value::BulkString(name) = &key else { continue };
            let name = String::from_utf8_lossy(name).into_owned();
            out.extend_from_slice(name.as_bytes());
            out.push(b'=');
            let kind = match self.run_as(None, &["TYPE", &name]) {
                redis::Value::SimpleString(t) => t,
                other => format!("{other:?}"),
            };
            let value = match kind.as_str() {
                "string" => self.run_as(None, &["GET", &name]),
                "hash" => self.run_as(None, &["HGETALL", &name]),
                "zset" => self.run_as(None, &["ZRANGE", &name, "0", "-1", "WITHSCORES"]),
                "set" => self.run_as(None, &["SMEMBERS", &name]),
                "list" => self.run_as(None, &["LRANGE", &name, "0", "-1"]),
                _ => redis::Value::Nil,
            };
            bytes(&value, &mut out);
        }
        out
    }

    /// How many client connections last ran command `name` (lower case, e.g.
    /// "evalsha"), from `CLIENT LIST`.
    pub fn clients_last_running(&self, password: Option<&str>, name: &str) -> usize {
        let list: String = match self.run_as(password, &["CLIENT", "LIST"]) {
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            redis::Value::VerbatimString { text, .. } => text,
            other => panic!("CLIENT LIST answered {other:?}"),
        };
        list.lines().filter(|l| l.contains(&format!(" cmd={name} "))).count()
    }

    /// Runs one command with redis-cli semantics over a raw socket (RESP inline).
    pub fn command(&self, line: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect redis");
        let _ = s.set_read_timeout(Some(Duration::from_millis(1000)));
        s.write_all(format!("{line}\r\n").as_bytes()).expect("write redis");
        let mut buf = vec![0u8; 65536];
        let n = s.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

fn spawn(port: u16, dir: &std::path::Path, extra: &[String]) -> Child {
    let bin = std::env::var("WXGATE_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    Command::new(&bin)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--dir", dir.to_str().expect("utf-8 temp dir")])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {bin} (install redis-server): {e}"))
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").args([sig, &pid.to_string()]).status().map(|s| s.success()).unwrap_or(false);
    assert!(ok, "kill {sig} {pid} failed");
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume_quietly();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of `n` masters (no replicas) on loopback, built with
/// `redis-cli --cluster create`. Stopped on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start(n: usize) -> RedisCluster {
        Self::start_with_replicas(n, 0)
    }

    /// `masters` masters with `replicas` replicas each (`--cluster-replicas`),
    /// every replica in sync when it returns.
    pub fn start_with_replicas(masters: usize, replicas: usize) -> RedisCluster {
        let n = masters * (1 + replicas);
        let mut nodes = Vec::new();
        for _attempt in 0..100 + n {
            if nodes.len() == n {
                break;
            }
            // The cluster bus listens on port + 10000: that one must be free too.
            let port = free_port();
            if port > 55_000 || TcpListener::bind(("127.0.0.1", port + 10_000)).is_err() {
                continue;
            }
            let dir = std::env::temp_dir().join(format!("wxgate-cluster-{}-{port}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("cluster dir");
            let args: Vec<String> =
                ["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"].iter().map(|s| s.to_string()).collect();
            let child = spawn(port, &dir, &args);
            let mut server = RedisServer { port, child, dir, args };
            if server.wait_ready(Duration::from_secs(10)) {
                nodes.push(server);
            } else {
                let _ = server.child.kill();
            }
        }
        assert_eq!(nodes.len(), n, "redis-server cluster nodes did not start");
        let addrs: Vec<String> = nodes.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        let cli = std::env::var("WXGATE_TEST_REDIS_CLI").unwrap_or_else(|_| "redis-cli".into());
        let out = Command::new(&cli)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cli}: {e}"));
        assert!(out.status.success(), "cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        let cluster = RedisCluster { nodes };
        let start = Instant::now();
        while !cluster.nodes.iter().all(|n| n.command("CLUSTER INFO").contains("cluster_state:ok")) {
            assert!(start.elapsed() < Duration::from_secs(20), "cluster never became ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        // In sync from both sides: each replica's link up, and each master
        // listing its replicas online (it does so at their first ACK, a
        // moment after their link is up; a master with none online looks
        // like one that never had a replica to jobs_sending.lua).
        while !cluster.nodes.iter().all(|n| {
            let info = n.command("INFO replication");
            if info.contains("role:master") {
                info.matches("state=online").count() >= replicas
            } else {
                info.contains("master_link_status:up")
            }
        }) {
            assert!(start.elapsed() < Duration::from_secs(30), "the cluster's replicas never synced");
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    /// The replica of the master on `port` (a cluster started with replicas).
    pub fn replica_of(&self, port: u16) -> &RedisServer {
        let table = self.nodes[0].command("CLUSTER NODES");
        let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        let port_of =
            |addr: &str| addr.split('@').next().and_then(|a| a.rsplit(':').next()).and_then(|p| p.parse().ok());
        let master = rows.iter().find(|f| f.len() > 2 && port_of(f[1]) == Some(port)).expect("the master's row");
        let replica = rows
            .iter()
            .find(|f| f.len() > 3 && f[2].contains("slave") && f[3] == master[0])
            .and_then(|f| port_of(f[1]))
            .unwrap_or_else(|| panic!("no replica of the master on {port}"));
        self.nodes.iter().find(|n| n.port == replica).expect("a node of this cluster")
    }

    /// Seed node URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// A Redis Cluster store's settings for this cluster (see
    /// [`RedisServer::store_config`]).
    pub fn store_config(&self, prefix: &str) -> wxgate::config::RedisConfig {
        let urls = self.urls();
        store_config(urls[0].clone(), urls, prefix)
    }

    /// The node listening on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes.iter().find(|n| n.port == port).expect("a node on that port")
    }

    /// The port of the master that holds `key`.
    pub fn node_of(&self, key: &str) -> u16 {
        let slot: u16 = self.nodes[0]
            .command(&format!("CLUSTER KEYSLOT {key}"))
            .trim()
            .trim_start_matches(':')
            .parse()
            .expect("slot");
        let table = self.nodes[0].command("CLUSTER NODES");
        for line in table.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 {
                continue;
            }
            let port: u16 = match f[1].split('@').next().and_then(|a| a.rsplit(':').next()).and_then(|p| p.parse().ok())
            {
                Some(p) => p,
                None => continue,
            };
            for range in &f[8..] {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>()) {
                    if (a..=b).contains(&slot) {
                        return port;
                    }
                }
            }
        }
        panic!("no node owns slot {slot}");
    }
}

/// A Sentinel-managed Redis on loopback: a master, a replica and three
/// sentinels (`redis-server --sentinel`, quorum 2, down-after 500 ms), all
/// killed on drop. The sentinels' ids and peers are declared up front, so
/// the set is ready in about a second instead of waiting for discovery.
pub struct RedisSentinelSet {
    pub master: RedisServer,
    pub replica: RedisServer,
    /// [`RedisSentinelSet::start_lagging`]: the replica's link to the master.
    pub link: Option<LaggingLink>,
    sentinels: Vec<(u16, Child)>,
    dir: std::path::PathBuf,
}

/// A TCP relay between a replica and its master that can hold back what
/// the master sends ([`LaggingLink::hold`]) while the link stays up: the
/// replica falls behind, as over a slow link, and what was held is never
/// delivered if the master dies (the relay then closes the replica's side).
/// Bytes from the replica to the master (its acks) always pass.
pub struct LaggingLink {
    pub port: u16,
    held: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Bytes of the master's stream held back so far.
    pub held_bytes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl LaggingLink {
    /// Relays every connection made to it to `127.0.0.1:<to>`.
    pub fn start(to: u16) -> LaggingLink {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let port = listener.local_addr().expect("relay addr").port();
        let held = Arc::new(AtomicBool::new(false));
        let held_bytes = Arc::new(AtomicUsize::new(0));
        let (h, hb) = (held.clone(), held_bytes.clone());
        std::thread::spawn(move || {
            for down in listener.incoming() {
                let Ok(down) = down else { return };
                let Ok(up) = TcpStream::connect(("127.0.0.1", to)) else { continue };
                let (mut down_r, mut up_w) = (down.try_clone().expect("clone"), up.try_clone().expect("clone"));
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n @ 1..) = down_r.read(&mut buf) {
                        if up_w.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = up_w.shutdown(std::net::Shutdown::Both);
                });
                let (h, hb) = (h.clone(), hb.clone());
                let (mut up_r, mut down_w) = (up, down);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    // What the master sent and the replica has not been given.
                    let mut kept = Vec::new();
                    while let Ok(n @ 1..) = up_r.read(&mut buf) {
                        if h.load(Ordering::Acquire) {
                            kept.extend_from_slice(&buf[..n]);
                            hb.fetch_add(n, Ordering::Relaxed);
                            continue;
                        }
                        if down_w.write_all(&kept).is_err() || down_w.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        kept.clear();
                    }
                    // The master is gone: what was held is lost with it.
                    let _ = down_w.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        LaggingLink { port, held, held_bytes }
    }

    /// From now on, what the master sends is held back.
    pub fn hold(&self) {
        self.held.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Waits (up to 10 s) until `replica` holds everything `master` had written
/// when called: the replica's processed offset reaches the master's (any
/// master, a Cluster's too, whatever slots it serves).
pub fn wait_replicated(master: &RedisServer, replica: &RedisServer) {
    let offset = |server: &RedisServer, field: &str| {
        let info = server.command("INFO replication");
        info.lines().find_map(|l| l.strip_prefix(field)?.trim().parse::<u64>().ok())
    };
    let target = offset(master, "master_repl_offset:").expect("the master's replication offset");
    let started = Instant::now();
    while offset(replica, "slave_repl_offset:").is_none_or(|at| at < target) {
        assert!(started.elapsed() < Duration::from_secs(10), "the replica never caught up with the master");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A master and one replica reaching it through a [`LaggingLink`], with no
/// sentinels: a failover is done by hand ([`ReplicatedRedis::fail_over`]),
/// as an operator (or a managed service) promotes a replica.
pub struct ReplicatedRedis {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub link: LaggingLink,
}

impl ReplicatedRedis {
    pub fn start() -> ReplicatedRedis {
        let fast_sync = ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"];
        let master = RedisServer::start_with(&fast_sync);
        let link = LaggingLink::start(master.port);
        let port = link.port.to_string();
        let mut replica_args = fast_sync.to_vec();
        replica_args.extend(["--replicaof", "127.0.0.1", port.as_str()]);
        let replica = RedisServer::start_with(&replica_args);
        let started = Instant::now();
        while !(replica.command("INFO replication").contains("master_link_status:up")
            && master.command("INFO replication").contains("state=online"))
        {
            assert!(started.elapsed() < Duration::from_secs(15), "the replica never synced");
            std::thread::sleep(Duration::from_millis(20));
        }
        ReplicatedRedis { master, replica, link }
    }

    /// The master crashes (SIGKILL: what the link held back is lost with
    /// it) and the replica is promoted (`REPLICAOF NO ONE`).
    pub fn fail_over(&mut self) {
        self.master.stop();
        self.replica.run_as(None, &["REPLICAOF", "NO", "ONE"]);
        assert!(self.replica.command("ROLE").contains("master"), "the replica was promoted");
    }
}

/// The name the sentinels monitor the master as.
pub const SENTINEL_MASTER: &str = "wxm";

impl RedisSentinelSet {
    pub fn start() -> RedisSentinelSet {
        Self::start_linked(false)
    }

    /// A set whose replica reaches the master through a [`LaggingLink`]
    /// (`link`); the sentinels' failover timeout is long enough that they
    /// do not point the replica straight at the master during a test.
    pub fn start_lagging() -> RedisSentinelSet {
        Self::start_linked(true)
    }

    fn start_linked(lagging: bool) -> RedisSentinelSet {
        let fast_sync = ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"];
        let master = RedisServer::start_with(&fast_sync);
        let link = lagging.then(|| LaggingLink::start(master.port));
        let upstream = link.as_ref().map_or(master.port, |l| l.port);
        let mut replica_args: Vec<String> = fast_sync.iter().map(|s| s.to_string()).collect();
        replica_args.extend(["--replicaof".to_owned(), "127.0.0.1".to_owned(), upstream.to_string()]);
        let replica = RedisServer::start_with(&replica_args.iter().map(String::as_str).collect::<Vec<_>>());
        let dir = std::env::temp_dir().join(format!("wxgate-sentinel-{}-{}", std::process::id(), master.port));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("sentinel dir");
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let id = |i: usize| format!("{:040x}", 0xa11ce000 + i + master.port as usize * 8);
        let mut sentinels = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let mut conf = format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel myid {}\n\
                 sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {} 2\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} 500\n\
                 sentinel failover-timeout {SENTINEL_MASTER} {}\n\
                 sentinel known-replica {SENTINEL_MASTER} 127.0.0.1 {}\n",
                dir.display(),
                id(i),
                master.port,
                if lagging { 60_000 } else { 5_000 },
                replica.port
            );
            for (j, other) in ports.iter().enumerate().filter(|(j, _)| *j != i) {
                conf.push_str(&format!("sentinel known-sentinel {SENTINEL_MASTER} 127.0.0.1 {other} {}\n", id(j)));
            }
            let path = dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(&path, conf).expect("sentinel conf");
            let bin = std::env::var("WXGATE_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
            let child = Command::new(&bin)
                .arg(&path)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {bin} --sentinel: {e}"));
            sentinels.push((*port, child));
        }
        let set = RedisSentinelSet { master, replica, link, sentinels, dir };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(15) {
            let ready = set.sentinels.iter().all(|(port, _)| {
                let info = raw_command(*port, &format!("SENTINEL MASTER {SENTINEL_MASTER}"));
                info.contains("num-other-sentinels\r\n$1\r\n2") && info.contains("num-slaves\r\n$1\r\n1")
            }) && set.replica.command("INFO replication").contains("master_link_status:up");
            if ready {
                return set;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the sentinel set did not become ready within 15 s");
    }

    /// The sentinels' URLs.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(|(port, _)| format!("redis://127.0.0.1:{port}")).collect()
    }

    /// The port of the master the first sentinel that answers names.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|(port, _)| {
            let reply = raw_command(*port, &format!("SENTINEL get-master-addr-by-name {SENTINEL_MASTER}"));
            reply.lines().filter(|l| !l.starts_with('*') && !l.starts_with('$')).nth(1)?.trim().parse().ok()
        })
    }

    /// `SENTINEL FAILOVER` (the old master stays up and is made a replica of
    /// the new one), and waits until the sentinels name the replica.
    pub fn fail_over(&self, limit: Duration) {
        let asked = raw_command(self.sentinels[0].0, &format!("SENTINEL FAILOVER {SENTINEL_MASTER}"));
        assert!(asked.starts_with("+OK"), "SENTINEL FAILOVER answered {asked:?}");
        let started = Instant::now();
        while !(self.master_port() == Some(self.replica.port) && self.replica.command("ROLE").contains("master")) {
            assert!(started.elapsed() < limit, "the sentinels promoted no replica within {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs the master (a crash), and waits until the sentinels name the
    /// replica; returns how long that took.
    pub fn kill_master_and_wait_promotion(&mut self, limit: Duration) -> Duration {
        self.master.stop();
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.master_port() == Some(self.replica.port) && self.replica.command("ROLE").contains("master") {
                return started.elapsed();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the sentinels promoted no replica within {limit:?}");
    }
}

impl Drop for RedisSentinelSet {
    fn drop(&mut self) {
        for (_, child) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One command to the Redis (or sentinel) on `port`; its raw answer.
fn raw_command(port: u16, line: &str) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return String::new() };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(format!("{line}\r\n").as_bytes()).is_err() {
        return String::new();
    }
    let mut buf = vec![0u8; 65536];
    let n = s.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}
