//! `[[quota]]`: an account's own limits for a rule, where its WeChat quota
//! differs from the rule's (a day quota that grows with followers, an
//! uncertified account's lower one):
//!
//! ```toml
//! [[quota]]
//! accounts = ["wxA", "wxB"]      # or account = "wxA"
//! rule = "template_send"
//! limits = [ { count = 30, per = "day" } ]
//! ```
//!
//! An override replaces the rule's limits for those accounts; everything
//! else of the rule (its paths, `reserve` and `max_share` percentages, which
//! are derived again from the new limits, `max_wait`, `concurrency`, ...)
//! applies as written. It is compiled into one variant of the rule per
//! (account, rule) ([`Rule::overridden`]; per listed path for `scope =
//! "path"`), with the same state: a window whose length is kept keeps its
//! count, as on a reload. Every place that decides or estimates for an
//! account asks [`Overrides::rule_of`] for the account's rule. Read and
//! checked in `overrides.rs`.
//!
//! A block of its own, not a key of `[[account]]`: `[[account]]` declares
//! the accounts whose secret wxgate holds, while overrides are wanted as
//! much for accounts it never holds a secret of (a third-party platform's
//! authorizers, services that fetch their own tokens).

use std::collections::HashMap;
use std::sync::Arc;

use crate::limit::{Limit, Rule};

/// At most this many (account, rule) overrides in one config. Each is a
/// compiled rule (a few hundred bytes, and one per listed path for `scope =
/// "path"`) kept for the config's life, listed by `GET /v1/rules` and
/// `wxgate check`, and rebuilt on every reload: 10,000 keeps the config under
/// a few MiB and a reload's compile well under a second. Accounts past it
/// belong in the learned limits (`quota_sync`), not in a file.
pub const MAX_OVERRIDES: usize = 10_000;

/// The compiled `[[quota]]` overrides: each account's variants of the
/// rules it overrides.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Account → its overriding variants (each a state of one rule).
    pub(super) by_account: HashMap<Arc<str>, Box<[Arc<Rule>]>, foldhash::fast::RandomState>,
    /// Every (account, rule) override, in file order (the admin API, `wxgate check`).
    pub listed: Vec<Listed>,
}

/// One (account, rule) override as written.
#[derive(Debug, Clone)]
pub struct Listed {
    pub account: Arc<str>,
    /// The rule's name (`qyapi.send` for a `[[domain]]`'s rule).
    pub rule: Arc<str>,
    pub limits: Vec<Limit>,
    /// Its `[[quota]]`'s line in the config file.
    pub line: usize,
}

impl Overrides {
    /// The rule `account`'s calls of `rule` (a rule or per-path variant
    /// of this config) count against: its override, else `rule` itself.
    /// Without overrides nothing is looked up; with some, one hash of the
    /// account and a scan of its few overrides.
    #[inline]
    pub fn rule_of<'a>(&'a self, account: &str, rule: &'a Arc<Rule>) -> &'a Arc<Rule> {
        if self.by_account.is_empty() {
            return rule;
        }
        self.by_account.get(account).and_then(|own| own.iter().find(|o| o.state == rule.state)).unwrap_or(rule)
    }

    pub fn is_empty(&self) -> bool {
        self.listed.is_empty()
    }

    /// The overrides of the rule named `rule`, in file order.
    pub fn of_rule<'a>(&'a self, rule: &'a str) -> impl Iterator<Item = &'a Listed> + 'a {
        self.listed.iter().filter(move |o| &*o.rule == rule)
    }
}
