//! The directory's metrics (docs/metrics.md, "Broadcasts"): fetches by API
//! and outcome, broadcasts it could not count by rule and cause, the ids
//! held, and WeCom's partial successes by rule and kind. No account, app or
//! member is ever a label.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FetchLabels {
    pub api: String,
    pub outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub rule: String,
    pub cause: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub rule: String,
    pub kind: String,
}

#[derive(Clone)]
pub struct DirectoryMetrics {
    fetches: Family<FetchLabels, Counter>,
    unresolved: Family<CauseLabels, Counter>,
    invalid: Family<KindLabels, Counter>,
    members: Gauge,
    units: Gauge,
}

impl DirectoryMetrics {
    pub fn register(registry: &mut Registry) -> DirectoryMetrics {
        let m = DirectoryMetrics {
            fetches: Family::default(),
            unresolved: Family::default(),
            invalid: Family::default(),
            members: Gauge::default(),
            units: Gauge::default(),
        };
        registry.register(
            "directory_fetches",
            "Fetches of WeCom's directory (agent/get, user/simplelist, tag/get) by this instance, by outcome",
            m.fetches.clone(),
        );
        registry.register(
            "directory_unresolved",
            "Broadcasts (@all, toparty, totag) whose members the directory could not count, by cause: charged \
             unseen_cost, or refused",
            m.unresolved.clone(),
        );
        registry.register(
            "recipients_invalid",
            "Recipients WeCom answered invalid in a partial success (invaliduser, invalidparty, invalidtag)",
            m.invalid.clone(),
        );
        registry.register(
            "directory_members",
            "Member ids of WeCom's directory this instance holds ([directory] max_members bounds them)",
            m.members.clone(),
        );
        registry.register("directory_units", "Visible ranges, departments and tags held", m.units.clone());
        m
    }

    pub fn fetched(&self, api: &str, outcome: &str) {
        self.fetches.get_or_create(&FetchLabels { api: api.into(), outcome: outcome.into() }).inc();
    }

    pub fn unresolved(&self, rule: &str, cause: &str) {
        self.unresolved.get_or_create(&CauseLabels { rule: rule.into(), cause: cause.into() }).inc();
    }

    pub fn invalid(&self, rule: &str, kind: &str, n: u64) {
        self.invalid.get_or_create(&KindLabels { rule: rule.into(), kind: kind.into() }).inc_by(n);
    }

    pub fn held(&self, members: u64, units: usize) {
        self.members.set(i64::try_from(members).unwrap_or(i64::MAX));
        self.units.set(i64::try_from(units).unwrap_or(i64::MAX));
    }
}
