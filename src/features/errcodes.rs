//! The last answers of WeChat an operator looks for first, as a feature
//! ([`crate::features`]): throttling (45009, 45011, 45033, and any errcode
//! a `[[penalty]]` names) and a refused token (40001, 40014, 42001), with
//! their time, rule and account, and the penalty it started. Read by the
//! admin API's `GET /v1/errcodes` and the console. Runs after the
//! penalties' hook, so it sees the penalty WeChat's answer started.
//!
//! Bounded: the last [`KEEP`] such answers of this instance. A call whose
//! answer is anything else costs one comparison.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::features::hooks::{Answered, Env, Feature};
use crate::time::Micros;

/// Answers kept.
pub const KEEP: usize = 200;

/// Errcodes kept besides those a `[[penalty]]` names.
pub const WATCHED: [i64; 6] = [45009, 45011, 45033, 40001, 40014, 42001];

/// One answer of WeChat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub at_us: Micros,
    pub errcode: i64,
    pub account: String,
    pub rule: Option<Arc<str>>,
    /// The penalty it started, as long as the client was told to wait.
    pub penalty_us: Option<Micros>,
}

/// The last answers (see the module).
#[derive(Default)]
pub struct Errcodes {
    seen: Mutex<VecDeque<Seen>>,
}

impl Errcodes {
    fn keep(&self, seen: Seen) {
        let mut all = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() == KEEP {
            all.pop_front();
        }
        all.push_back(seen);
    }

    /// The answers kept, newest first.
    pub fn newest_first(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).iter().rev().cloned().collect()
    }
}

impl Feature for Errcodes {
    type Ctx = ();

    async fn on_answer(&self, env: Env<'_>, _: &mut (), answered: &mut Answered<'_>) {
        let Some(code) = answered.errcode.filter(|&c| c != 0) else { return };
        if !WATCHED.contains(&code) && !answered.config.penalties.iter().any(|p| p.errcode == code) {
            return;
        }
        self.keep(Seen {
            at_us: env.core.clock.now_us(),
            errcode: code,
            account: answered.account.to_owned(),
            rule: answered.rule.map(|r| r.name.clone()),
            penalty_us: answered.penalty,
        });
    }
}
