//! `[[account]]` → [`SecretAccount`]: the accounts whose secret wxgate
//! holds, so that it fetches their tokens itself and adds the current one
//! to calls that carry none (`crate::features::broker`). The secret is read
//! when the config is (at start, on every reload: a rotated secret file
//! takes effect on reload) from `secret_file` (mode checked as for every
//! secret file) or `secret_env`; it is never printed.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::errors::Invalid;
use super::units::{check_secret_mode, valid_name};

/// `[[account]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccount {
    pub id: String,
    pub name: Option<String>,
    pub kind: String,
    pub secret_file: Option<PathBuf>,
    pub secret_env: Option<String>,
    pub token_api: Option<String>,
    pub agent: Option<String>,
}

/// What kind of WeChat account an `[[account]]` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountKind {
    OfficialAccount,
    MiniProgram,
    /// A WeCom app: `id` is the corpid, `agent` the app's AgentId.
    WeCom,
    /// A third-party platform (`component_appid`): its token needs the
    /// `component_verify_ticket` WeChat pushes to the platform, so wxgate
    /// answers its `api_component_token` requests from the cache and
    /// checks their secret, but fetches none itself.
    Platform,
}

impl AccountKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AccountKind::OfficialAccount => "official_account",
            AccountKind::MiniProgram => "mini_program",
            AccountKind::WeCom => "wecom",
            AccountKind::Platform => "platform",
        }
    }
}

/// The token API wxgate fetches an account's token with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenApi {
    /// `POST /cgi-bin/stable_token` (the default for official accounts and
    /// mini programs): independent of `/cgi-bin/token`, renewed by WeChat
    /// 5 minutes early.
    StableToken,
    /// `GET /cgi-bin/token`.
    Token,
    /// WeCom `GET /cgi-bin/gettoken`.
    GetToken,
    /// `POST /cgi-bin/component/api_component_token` (platforms; never
    /// fetched by wxgate itself).
    ComponentToken,
}

impl TokenApi {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenApi::StableToken => "stable_token",
            TokenApi::Token => "token",
            TokenApi::GetToken => "gettoken",
            TokenApi::ComponentToken => "api_component_token",
        }
    }

    /// The API's path.
    pub fn path(self) -> &'static str {
        match self {
            TokenApi::StableToken => "/cgi-bin/stable_token",
            TokenApi::Token => "/cgi-bin/token",
            TokenApi::GetToken => "/cgi-bin/gettoken",
            TokenApi::ComponentToken => "/cgi-bin/component/api_component_token",
        }
    }
}

/// An account's secret (appsecret, corpsecret, component_appsecret). Never
/// printed: `Debug` shows only that there is one.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Whether `other` is this very secret (the same read of the config),
    /// not only an equal one: a cheap test that a cached slot still fits.
    pub fn same_read(&self, other: &Secret) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether `given` is this secret, in time that does not depend on
    /// where they differ.
    pub fn is(&self, given: &[u8]) -> bool {
        super::units::same_bytes(&self.0, given)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Where a secret was read from, for `wxgate check` and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    File(PathBuf),
    Env(String),
}

impl std::fmt::Display for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretSource::File(p) => write!(f, "file {}", p.display()),
            SecretSource::Env(v) => write!(f, "environment variable {v}"),
        }
    }
}

/// One `[[account]]`, compiled.
#[derive(Debug, Clone)]
pub struct SecretAccount {
    /// The account name calls use (`@name`, `X-Wx-Account`, grants): `name`,
    /// else `id`.
    pub name: Arc<str>,
    /// The appid (the corpid for WeCom, the component_appid for a platform).
    pub id: String,
    pub kind: AccountKind,
    pub token_api: TokenApi,
    /// WeCom: the app's AgentId.
    pub agent: Option<String>,
    pub secret: Secret,
    pub source: SecretSource,
}

impl SecretAccount {
    /// Whether wxgate fetches this account's token itself and adds it to
    /// calls without one (every kind but a platform).
    pub fn injects(&self) -> bool {
        self.kind != AccountKind::Platform
    }
}

/// The `[[account]]` entries by name.
#[derive(Debug, Clone, Default)]
pub struct SecretAccounts {
    by_name: HashMap<Arc<str>, Arc<SecretAccount>>,
    /// In file order, for `wxgate check` and the renewal task.
    pub list: Vec<Arc<SecretAccount>>,
}

impl SecretAccounts {
    pub fn get(&self, name: &str) -> Option<&Arc<SecretAccount>> {
        self.by_name.get(name)
    }

    /// The WeCom app's `[[account]]` named `name`, if it is one: calls for
    /// it count under its corpid. Looks nothing up without `[[account]]`s.
    pub fn wecom(&self, name: &str) -> Option<&Arc<SecretAccount>> {
        if self.list.is_empty() {
            return None;
        }
        self.by_name.get(name).filter(|a| a.kind == AccountKind::WeCom)
    }

    /// The account whose state calls for `name` are counted under: a
    /// WeCom app's corpid, else `name` ([`crate::features::hooks::Who::counted`]).
    pub fn counted<'a>(&'a self, name: &'a str) -> &'a str {
        self.wecom(name).map_or(name, |a| &a.id)
    }

    /// The `[[account]]` whose appid (corpid) is `id` and whose token API
    /// names `kind`'s slot (a token request for it is checked against it).
    pub fn by_id<'a>(&'a self, id: &'a str, platform: bool) -> impl Iterator<Item = &'a Arc<SecretAccount>> + 'a {
        self.list.iter().filter(move |a| a.id == id && (a.kind == AccountKind::Platform) == platform)
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Every `[[account]]`; `Err` names the offending one's span.
pub(super) fn compile(
    list: Vec<Spanned<RawAccount>>,
    dir: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
    line_of: &dyn Fn(usize) -> usize,
) -> Result<SecretAccounts, (Range<usize>, Invalid)> {
    let mut out = SecretAccounts::default();
    let mut secrets: HashMap<(String, Vec<u8>), Arc<str>> = HashMap::new();
    // Where each name was first given (the line of its `[[account]]`).
    let mut lines: HashMap<Arc<str>, usize> = HashMap::new();
    for a in list {
        let span = a.span();
        let a = a.into_inner();
        let table = format!("[[account]] \"{}\"", a.id);
        let err = |e: Invalid| (span.clone(), e.table(table.clone()));
        if !valid_name(&a.id) {
            return Err((span, Invalid::new(format!("[[account]] id \"{}\" must be 1-64 of [A-Za-z0-9_-]", a.id))));
        }
        let (kind, token_api) = kind_and_api(&a.kind, a.token_api.as_deref()).map_err(&err)?;
        let agent = match (kind, a.agent) {
            (AccountKind::WeCom, Some(agent)) if !agent.is_empty() && agent.bytes().all(|b| b.is_ascii_digit()) => {
                Some(agent)
            }
            (AccountKind::WeCom, Some(agent)) => {
                return Err(err(Invalid::at_field(
                    "agent",
                    format!("\"{agent}\" is not an AgentId (digits, e.g. \"1000002\")"),
                )))
            }
            (AccountKind::WeCom, None) => {
                return Err(err(Invalid::at_field(
                    "agent",
                    "a wecom account needs its app's AgentId (its secret is the app's)",
                )))
            }
            (_, Some(_)) => return Err(err(Invalid::at_field("agent", "only a wecom account has an AgentId"))),
            (_, None) => None,
        };
        let name: Arc<str> = match a.name {
            None => a.id.as_str().into(),
            Some(n) if valid_name(&n) => n.into(),
            Some(n) => return Err(err(Invalid::at_field("name", format!("\"{n}\" must be 1-64 of [A-Za-z0-9_-]")))),
        };
        if let Some(first) = out.by_name.get(&name) {
            let line = lines.get(&name).copied().unwrap_or(0);
            if first.id == a.id && first.agent == agent {
                let id = if agent.is_some() { "corpid and agent" } else { "id" };
                return Err(err(Invalid::new(format!(
                    "this account is listed twice: the [[account]] at line {line} has the same {id}; keep one of them"
                ))));
            }
            return Err(err(Invalid::new(format!(
                "the [[account]] at line {line} is also named \"{name}\": give each its own name (two apps of one \
                 corpid need one each)"
            ))));
        }
        lines.insert(name.clone(), line_of(span.start));
        let (secret, source) = match (a.secret_file, a.secret_env) {
            (Some(file), None) => {
                let path = match dir {
                    Some(d) if file.is_relative() => d.join(&file),
                    _ => file,
                };
                (read_secret_file(&path).map_err(&err)?, SecretSource::File(path))
            }
            (None, Some(var)) => {
                let value = env(&var).ok_or_else(|| {
                    err(Invalid::at_field(
                        "secret_env",
                        format!("the environment variable {var} is not set (or not UTF-8)"),
                    ))
                })?;
                let secret = secret_text(&value).map_err(|e| err(e.field(format!("secret_env {var}"))))?;
                (secret, SecretSource::Env(var))
            }
            (Some(_), Some(_)) => return Err(err(Invalid::new("give secret_file or secret_env, not both"))),
            (None, None) => return Err(err(Invalid::new("needs its secret: secret_file or secret_env"))),
        };
        if let Some(other) = secrets.insert((a.id.clone(), secret.expose().to_vec()), name.clone()) {
            return Err(err(Invalid::new(format!(
                "[[account]] \"{other}\" has the same id and secret: one app, one entry (its token is one)"
            ))));
        }
        let account = Arc::new(SecretAccount { name: name.clone(), id: a.id, kind, token_api, agent, secret, source });
        out.by_name.insert(name, account.clone());
        out.list.push(account);
    }
    Ok(out)
}

/// An account's kind and the token API it is fetched with (`token_api`, or
/// the kind's default).
fn kind_and_api(kind: &str, token_api: Option<&str>) -> Result<(AccountKind, TokenApi), Invalid> {
    let kind = match kind {
        "official_account" => AccountKind::OfficialAccount,
        "mini_program" => AccountKind::MiniProgram,
        "wecom" => AccountKind::WeCom,
        "platform" => AccountKind::Platform,
        other => {
            return Err(Invalid::at_field(
                "kind",
                format!(
                "\"{other}\" is unknown (expected \"official_account\", \"mini_program\", \"wecom\" or \"platform\")"
            ),
            ))
        }
    };
    let api = match (kind, token_api) {
        (AccountKind::OfficialAccount | AccountKind::MiniProgram, None | Some("stable_token")) => TokenApi::StableToken,
        (AccountKind::OfficialAccount | AccountKind::MiniProgram, Some("token")) => TokenApi::Token,
        (AccountKind::WeCom, None | Some("gettoken")) => TokenApi::GetToken,
        (AccountKind::Platform, None | Some("api_component_token")) => TokenApi::ComponentToken,
        (_, Some(other)) => {
            let expected = match kind {
                AccountKind::WeCom => "\"gettoken\"",
                AccountKind::Platform => "\"api_component_token\"",
                _ => "\"stable_token\" or \"token\"",
            };
            return Err(Invalid::at_field(
                "token_api",
                format!("\"{other}\" is not a token API of a {} account (expected {expected})", kind.as_str()),
            ));
        }
    };
    Ok((kind, api))
}

fn read_secret_file(path: &Path) -> Result<Secret, Invalid> {
    check_secret_mode(path, "secret_file", "whoever reads it can fetch this account's tokens")?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| Invalid::at_field("secret_file", format!("{}: {e}", path.display())))?;
    secret_text(&text).map_err(|e| e.field(format!("secret_file {}", path.display())))
}

/// A secret as written: surrounding whitespace (a file's last newline) is
/// not part of it; it is printable ASCII, as WeChat's secrets are.
fn secret_text(text: &str) -> Result<Secret, Invalid> {
    let text = text.trim();
    if text.is_empty() {
        return Err(Invalid::new("the secret is empty"));
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Invalid::new("the secret has characters that are not printable ASCII (WeChat's secrets are)"));
    }
    Ok(Secret(Arc::from(text.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_and_never_print() {
        let s = secret_text("  abc123\n").expect("secret");
        assert!(s.is(b"abc123"));
        assert!(!s.is(b"abc124") && !s.is(b"abc12"));
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert!(secret_text(" \n").is_err());
        assert!(secret_text("a b").is_err());
    }
}
