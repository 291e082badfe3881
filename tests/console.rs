//! The console (`GET /` on the admin listener) in a real headless Chromium,
//! driven over the DevTools protocol (tests/support/browser.rs): it signs
//! in with the admin token as a user would at the browser's prompt, loads
//! with no console error and no request leaving the admin origin, shows an
//! account's use, its penalty and WeChat's errcode within one refresh of
//! the calls, lifts the penalty on a confirmed click, and a forged POST
//! from a page on another origin changes nothing. A screenshot is saved
//! (the path is printed) for review. With queued delivery: each caller's
//! queue, a delivery looked up and cancelled by a confirmed click. A
//! penalty restored after a restart is listed; a page opened with the
//! token in its URL works.

use crate::support;

use std::time::Duration;

use support::browser::Browser;
use support::*;

const TOKEN: &str = "console-test-token";
const SEND: &str = "/cgi-bin/message/custom/send";

/// Completed refreshes of the page.
async fn refreshes(page: &support::browser::Page) -> u64 {
    page.eval("Number(document.body.dataset.refreshes || 0)").await.as_u64().unwrap_or(0)
}

/// The text of the row of `table` for `account` (empty when none).
async fn row(page: &support::browser::Page, table: &str, account: &str) -> String {
    let js = format!(r#"(document.querySelector('#{table} tr[data-account="{account}"]') || {{}}).textContent || """#);
    page.eval(&js).await.as_str().unwrap_or("").to_owned()
}

async fn penalty_active(gate: &Gate, account: &str) -> bool {
    let b = admin(gate.admin_addr(), "GET", &format!("/v1/buckets/{account}/send"), Some(TOKEN)).await;
    b.json()["penalty"]["active"] == true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_use_penalties_and_errcodes_and_lifts_a_penalty_in_a_real_browser() {
    let mock = MockWeChat::start().await;
    let send = rule("send").matching(SEND).limit(600, "1m").limit(1000, "day");
    let menu = rule("menu").matching("/cgi-bin/menu/get").limit_burst(100, "1m", 20);
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).server("admin_token", TOKEN).with(send).with(menu)).await;
    let origin = format!("http://{}", gate.admin_addr());

    // Six minutes of traffic on wxgate's clock, for the plots (a reading
    // every 10 s): menu reads past their window are refused.
    const ROUNDS: u32 = 36;
    for round in 0..ROUNDS {
        for (account, n) in [("wx5f3c1a2b", 10 + round % 12), ("wx0d9e8f7a", 1), ("wx77aa01bc", round % 3)] {
            for _ in 0..n {
                let a = gate.get_as(account, SEND).await;
                assert_eq!(a.status, 200, "round {round} {account}: {:?} {}", a.header("x-wxgate-reason"), a.text());
            }
        }
        for _ in 0..(round % 9) * 3 {
            gate.get_as("wx5f3c1a2b", "/cgi-bin/menu/get").await;
        }
        gate.advance(Duration::from_secs(10));
    }
    mock.respond(|_| errcode_reply(40001));
    assert_eq!(gate.get_as("wx77aa01bc", SEND).await.status, 200, "a refused token is passed on");
    mock.respond(|_| ok_reply());
    eventually_async("the plots' readings", PATIENCE, async || {
        let h = admin(gate.admin_addr(), "GET", "/v1/history", Some(TOKEN)).await.json();
        h["readings"].as_array().is_some_and(|r| r.len() as u32 >= ROUNDS)
    })
    .await;

    let browser = Browser::start();
    let page = browser.page().await;
    page.sign_in_with("on-call", TOKEN).await;
    page.open(&format!("{origin}/?every=1")).await;
    eventually_async("a first refresh", PATIENCE, async || refreshes(&page).await >= 1).await;
    assert!(page.seen().auth_challenges >= 1, "the browser was asked for the token");

    // Calls that spend wx0d9e8f7a's quota, then WeChat's 45009 to it.
    for _ in 0..4 {
        assert_eq!(gate.get_as("wx0d9e8f7a", SEND).await.status, 200);
    }
    mock.respond(|_| errcode_reply(45009));
    assert_eq!(gate.get_as("wx0d9e8f7a", SEND).await.status, 429);
    mock.respond(|_| ok_reply());
    // Shown by the first refresh that started after them.
    let after = refreshes(&page).await + 2;
    eventually_async("a refresh after the calls", PATIENCE, async || refreshes(&page).await >= after).await;
    let used = row(&page, "accounts", "wx0d9e8f7a").await;
    assert!(used.contains("41 / 1000"), "the account's use today (36 + 4 + the refused one): {used:?}");
    let penalty = row(&page, "penalties", "wx0d9e8f7a").await;
    assert!(penalty.contains("45009") && penalty.contains("send"), "its penalty and WeChat's errcode: {penalty:?}");
    let errcode = page.eval("document.querySelector('#errcodes tbody tr').textContent").await;
    assert!(errcode.as_str().is_some_and(|t| t.contains("45009") && t.contains("wx0d9e8f7a")), "{errcode}");

    let shot = page.screenshot().await;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&dir).expect("screenshot directory");
    std::fs::write(dir.join("console.png"), &shot).expect("write the screenshot");
    println!("screenshot: {}", dir.join("console.png").display());

    let seen = page.seen();
    assert!(seen.errors.is_empty(), "no console error, no policy violation: {:?}", seen.errors);
    let elsewhere: Vec<&String> = seen.requests.iter().filter(|u| !u.starts_with(&format!("{origin}/"))).collect();
    assert!(elsewhere.is_empty(), "every request to the admin origin: {elsewhere:?}");
    assert!(seen.requests.iter().any(|u| u.ends_with("/v1/accounts?top=20")), "{:?}", seen.requests);

    // Lifting the penalty: a click, a confirmation, and calls flow again.
    assert!(penalty_active(&gate, "wx0d9e8f7a").await);
    page.eval(r#"document.querySelector('#penalties tr[data-account="wx0d9e8f7a"] button').click()"#).await;
    eventually_async("the penalty lifted", PATIENCE, async || !penalty_active(&gate, "wx0d9e8f7a").await).await;
    let asked = page.seen().dialogs;
    assert!(
        asked.iter().any(|d| d.starts_with("Lift the penalty of wx0d9e8f7a on send?")),
        "confirmed first: {asked:?}"
    );
    assert_eq!(gate.get_as("wx0d9e8f7a", SEND).await.status, 200);
    let after = refreshes(&page).await + 2;
    eventually_async("a refresh after the lift", PATIENCE, async || refreshes(&page).await >= after).await;
    assert_eq!(row(&page, "penalties", "wx0d9e8f7a").await, "", "gone from the page");

    // A page on another origin posts to the admin API with the browser's
    // credentials: refused, nothing changed.
    let imposed = admin(gate.admin_addr(), "POST", "/v1/penalties/wx0d9e8f7a/send?seconds=600", Some(TOKEN)).await;
    assert_eq!(imposed.status, 200);
    let attacker = MockWeChat::start().await;
    let form = format!(
        r#"<!doctype html><form id="f" method="POST" action="{origin}/v1/accounts/wx0d9e8f7a/clear"></form>
<script>document.getElementById("f").submit()</script>"#
    );
    attacker.respond(move |_| Reply::Json { body: form.clone(), content_type: "text/html; charset=utf-8" });
    page.open(&format!("{}/forged", attacker.url())).await;
    let mut answer = String::new();
    eventually_async("the forged POST answered", PATIENCE, async || {
        answer = page.eval("location.href + ' ' + document.body.innerText").await.as_str().unwrap_or("").to_owned();
        answer.starts_with(&format!("{origin}/v1/accounts/wx0d9e8f7a/clear"))
    })
    .await;
    assert!(answer.contains("refused: Origin is not the admin listener"), "{answer}");
    assert!(penalty_active(&gate, "wx0d9e8f7a").await, "the forged clear changed nothing");
}

/// Queued delivery on the page: each caller's queue with its counts and
/// drained-at time, a delivery looked up by caller and id, cancelled with
/// a confirmed click, and never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_queues_and_cancels_a_delivery_in_a_real_browser() {
    use support::queue::{gate, msgid, queued, until_state, wechat};
    let (mock, _tokens) = wechat(|_, n| msgid(n)).await;
    let dir = TempDir::new("console-queue");
    let send_path = "/cgi-bin/message/template/send";
    let token = rule("token").matching("/cgi-bin/token").matching("/cgi-bin/stable_token").limit(2000, "day");
    let send = rule("template_send").matching(send_path).limit_burst(1, "1m", 1).limit(1000, "day").set("queue", true);
    let gate =
        gate(&mock, &dir, &format!("{token}\n{send}"), "", &format!("{}\n{}", caller("hr"), caller("marketing"))).await;
    let first = queued(&gate, "hr", send_path, "{}").await;
    until_state(&gate, "hr", &first, "sent").await;
    let waiting = queued(&gate, "hr", send_path, "{}").await;
    until_state(&gate, "hr", &waiting, "waiting").await;
    let marketing = queued(&gate, "marketing", send_path, "{}").await;

    let browser = Browser::start();
    let page = browser.page().await;
    let origin = format!("http://{}", gate.admin_addr());
    page.open(&format!("{origin}/?every=1")).await;
    eventually_async("a first refresh", PATIENCE, async || refreshes(&page).await >= 1).await;
    let rows =
        page.eval("[...document.querySelectorAll('#queues tbody tr')].map(r => r.textContent).join('\\n')").await;
    let rows = rows.as_str().unwrap_or("").to_owned();
    assert!(rows.contains("hr") && rows.contains("marketing") && rows.contains("template_send"), "{rows}");
    // Times in the quota's zone, the header says which: hr's queue is
    // drained a minute after 10:00 Beijing (02:00 UTC), wxgate's clock.
    let header = page.eval("document.getElementById('refreshed').textContent").await;
    assert!(
        header.as_str().is_some_and(|h| h.starts_with("updated 10:00:") && h.contains("times in UTC+08:00")),
        "{header}"
    );
    let drained = page.eval("[...document.querySelectorAll('#queues tbody tr')].find(r => r.textContent.startsWith('hr')).lastElementChild.textContent").await;
    assert!(
        drained.as_str().is_some_and(|d| d.starts_with("2026-11-29 10:0")),
        "drained at, Beijing time: {drained} ({rows})"
    );
    let off_hidden = page.eval("document.getElementById('queues-off').hidden").await;
    assert_eq!(off_hidden.as_bool(), Some(true), "queued delivery is on: no \"off\" note");

    // Look one up, then cancel it: a click, a confirmation.
    let look = format!(
        "document.getElementById('job-caller').value = 'hr'; document.getElementById('job-id').value = '{waiting}';
         document.getElementById('job').requestSubmit(); true"
    );
    page.eval(&look).await;
    let mut shown = String::new();
    eventually_async("the delivery shown", PATIENCE, async || {
        shown = page.eval("document.getElementById('job-result').textContent").await.as_str().unwrap_or("").to_owned();
        shown.contains("\"state\": \"waiting\"")
    })
    .await;
    assert!(!shown.contains("errcode"), "the admin's view: {shown}");
    page.eval("document.querySelector('#job-result button').click()").await;
    until_state(&gate, "hr", &waiting, "cancelled").await;
    assert!(
        page.seen().dialogs.iter().any(|d| d.starts_with(&format!("Cancel delivery {waiting} of hr?"))),
        "confirmed"
    );
    eventually_async("the page shows it cancelled", PATIENCE, async || {
        let text = page.eval("document.getElementById('job-result').textContent").await;
        text.as_str().is_some_and(|t| t.contains("\"state\": \"cancelled\""))
    })
    .await;
    gate.advance(Duration::from_secs(120));
    until_state(&gate, "marketing", &marketing, "sent").await;
    gate.settle().await;
    let sent = mock.calls().iter().filter(|c| c.path_and_query.starts_with(send_path)).count();
    assert_eq!(sent, 2, "the first, and marketing's after a minute; never the cancelled one");
    let seen = page.seen();
    assert!(seen.errors.is_empty(), "no console error: {:?}", seen.errors);
    assert!(seen.requests.iter().all(|u| u.starts_with(&format!("{origin}/"))), "{:?}", seen.requests);
}

/// Issue 61: a penalty the store holds but this instance saw no call of
/// (restored from the state file after a restart) is under "Penalties
/// now" and in the accounts table, as `/v1/buckets` shows it. The console
/// listed only the pairs this instance admitted lately and those of the
/// errcodes it saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_restored_from_the_state_file_is_on_the_console_after_a_restart() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("console-restart");
    let config =
        ConfigToml::new(&mock.url()).server("admin_token", TOKEN).with(rule("send").matching(SEND).limit(1000, "day"));
    let path = dir.write("wxgate.toml", &config.to_string());
    let gate = support::process::spawn_path(&path, &[]).expect("serving");
    let imposed =
        admin(gate.admin.expect("admin"), "POST", "/v1/penalties/wx3c4d5e6f/send?seconds=3600", Some(TOKEN)).await;
    assert_eq!(imposed.status, 200, "{}", imposed.text());
    gate.stop().await;

    let gate = support::process::spawn_path(&path, &[]).expect("serving again");
    let addr = gate.admin.expect("admin");
    let bucket = admin(addr, "GET", "/v1/buckets/wx3c4d5e6f/send", Some(TOKEN)).await.json();
    assert_eq!(bucket["penalty"]["active"], true, "restored: {bucket}");
    let browser = Browser::start();
    let page = browser.page().await;
    page.sign_in_with("on-call", TOKEN).await;
    page.open(&format!("http://{addr}/?every=1")).await;
    eventually_async("a refresh", PATIENCE, async || refreshes(&page).await >= 1).await;
    let penalty = row(&page, "penalties", "wx3c4d5e6f").await;
    assert!(penalty.contains("send") && penalty.contains("60 min"), "under \"Penalties now\": {penalty:?}");
    let account = row(&page, "accounts", "wx3c4d5e6f").await;
    assert!(account.contains("0 / 1000") && account.contains("60 min"), "in the accounts table: {account:?}");
    let note = page.eval("document.getElementById('accounts-note').textContent").await;
    assert!(note.as_str().is_some_and(|n| n.contains("1 more under a penalty")), "{note}");
    let seen = page.seen();
    assert!(seen.errors.is_empty(), "no console error: {:?}", seen.errors);
}

/// Issue 61: opened as `http://user:token@host:port/` (the token in the
/// URL, no prompt), the page refreshes and shows data. fetch() refused
/// every path resolved against that URL ("Request cannot be constructed
/// from a URL that includes credentials").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_opened_with_the_token_in_its_url_refreshes() {
    let mock = MockWeChat::start().await;
    let send = rule("send").matching(SEND).limit(1000, "day");
    let gate = Gate::start_text(ConfigToml::new(&mock.url()).server("admin_token", TOKEN).with(send)).await;
    for _ in 0..3 {
        assert_eq!(gate.get_as("wx5f3c1a2b", SEND).await.status, 200);
    }
    let browser = Browser::start();
    let page = browser.page().await;
    page.open(&format!("http://on-call:{TOKEN}@{}/?every=1", gate.admin_addr())).await;
    let problem = "document.getElementById('problem').hidden ? '' : document.getElementById('problem').textContent";
    let mut shown = String::new();
    eventually_async("a refresh, or a problem shown", PATIENCE, async || {
        shown = page.eval(problem).await.as_str().unwrap_or("").to_owned();
        !shown.is_empty() || refreshes(&page).await >= 2
    })
    .await;
    assert_eq!(shown, "", "no problem shown");
    let used = row(&page, "accounts", "wx5f3c1a2b").await;
    assert!(used.contains("3 / 1000"), "the account's use: {used:?}");
    let seen = page.seen();
    assert!(seen.errors.is_empty(), "no console error: {:?}", seen.errors);
}
