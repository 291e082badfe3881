//! Access tokens the simulator issued: which account each belongs to and
//! until when it is valid.
//!
//! Like WeChat: each `/cgi-bin/token` call issues a new token and cuts the
//! previous one of the same appid down to [`OVERLAP_US`] more; `stable_token`
//! (without `force_refresh`) and WeCom's `gettoken` hand out the current
//! token again until it is close to expiring (its last `min(5 min, ttl / 2)`),
//! then a new one, the old one living out the overlap as well.

use std::collections::HashMap;

use crate::time::Micros;

/// How long a replaced token stays valid (WeChat: 5 minutes).
pub const OVERLAP_US: Micros = 300_000_000;

/// The token endpoints; each keeps its own current token per account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `/cgi-bin/token`: always a new token.
    Token,
    /// `/cgi-bin/stable_token`.
    Stable,
    /// WeCom's `/cgi-bin/gettoken`.
    Corp,
}

struct Issued {
    account: String,
    expires: Micros,
}

#[derive(Default)]
pub struct Tokens {
    issued: HashMap<String, Issued>,
    current: HashMap<(Endpoint, String), String>,
    /// Tokens held after the last sweep of expired ones.
    swept: usize,
}

impl Tokens {
    /// A token for `account` from the `endpoint` at `now`, and its
    /// `expires_in` in seconds. `fresh` makes a new token's text.
    pub fn issue(
        &mut self,
        endpoint: Endpoint,
        account: &str,
        force: bool,
        ttl_us: Micros,
        now: Micros,
        fresh: impl FnOnce() -> Option<String>,
    ) -> Option<(String, i64)> {
        let key = (endpoint, account.to_owned());
        let renew_before = OVERLAP_US.min(ttl_us / 2);
        if let Some(old) = self.current.get(&key).and_then(|t| self.issued.get_mut(t)) {
            if endpoint != Endpoint::Token && !force && old.expires - now > renew_before {
                let token = self.current.get(&key).cloned().unwrap_or_default();
                return Some((token, (old.expires - now) / 1_000_000));
            }
            old.expires = old.expires.min(now + OVERLAP_US);
        }
        let token = fresh()?;
        self.sweep(now);
        self.issued.insert(token.clone(), Issued { account: account.to_owned(), expires: now + ttl_us });
        self.current.insert(key, token.clone());
        Some((token, ttl_us / 1_000_000))
    }

    /// The account of `token` if it was issued here and has not expired at `now`.
    pub fn account_of(&self, token: &str, now: Micros) -> Option<&str> {
        self.issued.get(token).filter(|t| now < t.expires).map(|t| t.account.as_str())
    }

    /// Forgets expired tokens once the map has doubled since the last sweep,
    /// so it holds about the live tokens at most twice over.
    fn sweep(&mut self, now: Micros) {
        if self.issued.len() < 2 * self.swept.max(512) {
            return;
        }
        self.issued.retain(|_, t| now < t.expires);
        let issued = &self.issued;
        self.current.retain(|_, t| issued.contains_key(t));
        self.swept = self.issued.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = 1_000_000;

    #[test]
    fn tokens_expire_and_replaced_ones_live_out_the_overlap() {
        let mut t = Tokens::default();
        let mut n = 0;
        let mut fresh = || {
            n += 1;
            Some(format!("t{n}"))
        };
        let (a, ttl) = t.issue(Endpoint::Token, "wx1", false, 7200 * S, 0, &mut fresh).expect("issued");
        assert_eq!((a.as_str(), ttl), ("t1", 7200));
        assert_eq!(t.account_of("t1", 7200 * S - 1), Some("wx1"));
        assert_eq!(t.account_of("t1", 7200 * S), None, "expired");
        let (b, _) = t.issue(Endpoint::Token, "wx1", false, 7200 * S, 100 * S, &mut fresh).expect("issued");
        assert_eq!(b, "t2");
        assert_eq!(t.account_of("t1", 400 * S - 1), Some("wx1"), "5 minutes of overlap");
        assert_eq!(t.account_of("t1", 400 * S), None);
        let (s1, _) = t.issue(Endpoint::Stable, "wx1", false, 7200 * S, 0, &mut fresh).expect("issued");
        let (s2, left) = t.issue(Endpoint::Stable, "wx1", false, 7200 * S, 1000 * S, &mut fresh).expect("issued");
        assert_eq!((s1.as_str(), s2.as_str(), left), ("t3", "t3", 6200), "stable_token gives the same token");
        let (s3, _) = t.issue(Endpoint::Stable, "wx1", true, 7200 * S, 1000 * S, &mut fresh).expect("issued");
        assert_eq!(s3, "t4", "force_refresh");
        let (s4, _) = t.issue(Endpoint::Stable, "wx1", false, 7200 * S, 7900 * S, &mut fresh).expect("issued");
        assert_eq!(s4, "t5", "renewed in its last 5 minutes");
    }
}
