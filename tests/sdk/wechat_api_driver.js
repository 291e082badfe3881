'use strict';
// Drives wxgate with the real wechat-api SDK (node-webot), for tests/sdks.rs.
//
//   node wechat_api_driver.js --base http://127.0.0.1:PORT[/@account] [options] CALL...
//
// Makes each CALL (a name from CALLS) in order on one API object and prints
// one JSON line per call with what the SDK's caller sees: the result, or the
// error's name, code (errcode) and message as wechat-api passes them to the
// callback, with the HTTP status and Retry-After of the response it passes
// beside them. The base URL goes into `api.endpoint`, which every call and
// the token request are built on. --token T gives the API a token (no token
// request); without it the API fetches its own with --appid/--secret.
// --account sets X-Wx-Account on every call (setOpts). Nothing leaves
// loopback: any other URL is refused before a connection is made.
// wechat-api is found through NODE_PATH.

const API = require('wechat-api');

const CALLS = {
  getUser: (api, cb) => api.getUser('oOPENID', cb),
  getMenu: (api, cb) => api.getMenu(cb),
  sendText: (api, cb) => api.sendText('oOPENID', 'hello', cb),
  getLatestToken: (api, cb) => api.getLatestToken(cb),
};

function parse(argv) {
  const a = { appid: 'wxsdktest', secret: 'SECRET', calls: [] };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i].match(/^--(base|appid|secret|token|account)$/);
    if (argv[i] === '--no-token') {
      a.noToken = true;
    } else if (flag) {
      a[flag[1]] = argv[++i];
    } else if (CALLS[argv[i]]) {
      a.calls.push(argv[i]);
    } else {
      throw new Error('unknown argument ' + argv[i] + '; calls: ' + Object.keys(CALLS).join(' '));
    }
  }
  if (!a.base || a.calls.length === 0) throw new Error('usage: --base URL [options] CALL...');
  return a;
}

function outcome(name, err, data, res) {
  const seen = {
    status: res && res.statusCode !== undefined ? res.statusCode : null,
    retry_after: (res && res.headers && res.headers['retry-after']) || null,
  };
  if (err) {
    return Object.assign({ call: name, ok: false, error: err.name, errcode: err.code === undefined ? null : err.code,
      errmsg: err.message }, seen);
  }
  return Object.assign({ call: name, ok: true, result: data === undefined ? null : data }, seen);
}

function main() {
  const a = parse(process.argv.slice(2));
  let stored = a.token ? { accessToken: a.token, expireTime: Date.now() + 3600 * 1000 } : null;
  const api = new API(a.appid, a.secret,
    (cb) => cb(null, stored),
    (token, cb) => { stored = token; cb(null); });
  if (a.noToken) {
    // wxgate is the token server: every call goes out with access_token= (empty),
    // never through getToken/getAccessToken, and without the 40001 retry.
    api.preRequest = function (method, args) {
      this.token = { accessToken: '' };
      method.apply(this, args);
    };
  }
  api.endpoint = a.base.replace(/\/+$/, '');
  if (a.account) api.setOpts({ headers: { 'X-Wx-Account': a.account } });

  const send = api.request;
  api.request = function (url, opts, cb) {
    if (typeof opts === 'function') { cb = opts; opts = {}; }
    if (!/^http:\/\/([^@\/]+@)?127\.0\.0\.1:/.test(url)) {
      return cb(new Error('sdk driver: refusing to leave loopback: ' + url));
    }
    return send.call(this, url, opts, cb);
  };

  const next = (i) => {
    if (i === a.calls.length) return;
    const name = a.calls[i];
    CALLS[name](api, (err, data, res) => {
      process.stdout.write(JSON.stringify(outcome(name, err, data, res)) + '\n');
      next(i + 1);
    });
  };
  next(0);
}

main();
