//! A rule's `recipients`: the table as serde reads it, and what it
//! compiles to ([`Metering`], read by `crate::proxy::meter`).

use serde::Deserialize;

use super::errors::Invalid;

/// `recipients = { field = "touser", separator = "|", ... }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRecipients {
    pub field: String,
    pub separator: Option<String>,
    pub all: Option<String>,
    #[serde(default)]
    pub unseen: Vec<String>,
    pub unseen_cost: Option<u64>,
    pub max: Option<usize>,
    pub directory: Option<bool>,
}

/// A rule's `recipients`, compiled: where a call's body names whom it is
/// to, and what that costs (`crate::proxy::meter` reads it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metering {
    /// The rule's name (its 400s name it).
    pub rule: String,
    /// The field's path in the JSON body (`"touser"`, `"a.b"`: `["a", "b"]`).
    pub field: Vec<String>,
    /// What separates ids in a string field (`None`: the string is one id;
    /// an array of strings is read whatever this is).
    pub separator: Option<String>,
    /// The field's value meaning every member (`"@all"`), which wxgate
    /// cannot count: costs `unseen_cost`.
    pub all: Option<String>,
    /// Fields naming members wxgate cannot see (`toparty`, `totag`): when
    /// any is present and not empty, the call costs `unseen_cost` more.
    pub unseen: Vec<Vec<String>>,
    /// What members wxgate cannot see cost (`None`: such a call is refused
    /// with 400).
    pub unseen_cost: Option<u64>,
    /// Most recipients one call may name: at most [`Metering::MAX`]
    /// (WeCom's own limit for `touser`), the default.
    pub max: usize,
    /// `cost = "recipients"`: the rule's limits count recipients.
    pub by_recipients: bool,
    /// `directory = true`: `all` (the app's visible range) and the
    /// `unseen` fields `toparty` and `totag` are resolved to members
    /// through WeCom's directory (`crate::features::directory`), each
    /// member counted and given its windows; `unseen_cost` is then what
    /// they cost only while the directory cannot answer.
    pub directory: bool,
}

/// WeCom's fields naming departments and tags (doc 90236), which
/// `directory = true` resolves.
pub const PARTY_FIELD: &str = "toparty";
pub const TAG_FIELD: &str = "totag";

impl Metering {
    /// Longest recipient id read (WeCom userids are at most 64 bytes).
    pub const MAX_ID: usize = 256;

    /// Most recipients one call may ever name, and the default `max`:
    /// WeCom's own limit for `touser` ("最多支持1000个", doc 90236, "发送应用
    /// 消息"). Each recipient of a `per_recipient` rule is state wxgate
    /// holds for up to its longest window: one call must not bring more.
    pub const MAX: usize = 1000;

    /// Where [`Metering::max`] comes from, for the 400 past it.
    pub fn max_from(&self) -> &'static str {
        if self.max == Self::MAX {
            "WeCom's own limit for touser, doc 90236"
        } else {
            "the rule's recipients.max"
        }
    }

    /// What `wxgate check` says of it.
    pub fn says(&self) -> String {
        let field = self.field.join(".");
        let split = self.separator.as_ref().map_or(String::new(), |s| format!(" split by \"{s}\""));
        let cost = if self.by_recipients { "each call costs its recipients" } else { "each call costs 1" };
        let unseen: Vec<String> =
            self.all.iter().map(|a| format!("\"{a}\"")).chain(self.unseen.iter().map(|u| u.join("."))).collect();
        let unseen = match (unseen.is_empty(), self.unseen_cost) {
            (true, _) => String::new(),
            (false, _) if self.directory => format!(
                "; {} resolved through WeCom's directory ({})",
                unseen.join(", "),
                match self.unseen_cost {
                    Some(c) => format!("costing {c} more while it cannot answer"),
                    None => "refused (503) while it cannot answer".into(),
                }
            ),
            (false, Some(c)) => format!("; {} cost {c} more", unseen.join(", ")),
            (false, None) => format!("; calls naming {} are refused (400)", unseen.join(", ")),
        };
        format!("recipients: read from the body's \"{field}\"{split} (at most {}); {cost}{unseen}", self.max)
    }

    /// The admin API's view.
    pub fn shown(&self) -> serde_json::Value {
        serde_json::json!({
            "cost": if self.by_recipients { "recipients" } else { "call" },
            "field": self.field.join("."),
            "separator": self.separator,
            "all": self.all,
            "unseen": self.unseen.iter().map(|u| u.join(".")).collect::<Vec<_>>(),
            "unseen_cost": self.unseen_cost,
            "max": self.max,
            "directory": self.directory,
        })
    }

    pub(super) fn compile(rule: &str, raw: RawRecipients, by_recipients: bool) -> Result<Metering, Invalid> {
        let path = |text: &str| -> Result<Vec<String>, Invalid> {
            let parts: Vec<String> = text.split('.').map(str::to_owned).collect();
            if parts.iter().any(|p| p.is_empty()) {
                return Err(Invalid::new(format!("\"{text}\" is not a field path (names separated by \".\")")));
            }
            Ok(parts)
        };
        let field = path(&raw.field)?;
        if raw.separator.as_deref() == Some("") {
            return Err(
                Invalid::new("must not be empty (leave it out for a field that is an array)").field("separator")
            );
        }
        let unseen = raw.unseen.iter().map(|u| path(u)).collect::<Result<Vec<_>, _>>()?;
        if unseen.contains(&field) {
            return Err(Invalid::new(format!("lists the recipients field \"{}\" itself", raw.field)).field("unseen"));
        }
        if raw.unseen_cost == Some(0) {
            return Err(Invalid::new("must be at least 1 (leave it out to refuse such calls)").field("unseen_cost"));
        }
        let max = raw.max.unwrap_or(Self::MAX);
        if max == 0 || max > Self::MAX {
            return Err(Invalid::new(format!(
                "between 1 and {} recipients (WeCom's own limit for touser; each recipient is state wxgate holds)",
                Self::MAX
            ))
            .field("max"));
        }
        let directory = raw.directory.unwrap_or(false);
        if directory
            && raw.all.is_none()
            && !unseen.iter().any(|u| u.len() == 1 && (u[0] == PARTY_FIELD || u[0] == TAG_FIELD))
        {
            return Err(Invalid::new(format!(
                "resolves \"all\" and the unseen fields \"{PARTY_FIELD}\" and \"{TAG_FIELD}\" through WeCom's \
                 directory: give at least one of them"
            ))
            .field("directory"));
        }
        Ok(Metering {
            rule: rule.to_owned(),
            field,
            separator: raw.separator,
            all: raw.all,
            unseen,
            unseen_cost: raw.unseen_cost,
            max,
            by_recipients,
            directory,
        })
    }
}
