"""Drives wxgate with the real wechatpy SDK, for tests/sdks.rs.

    python wechatpy_driver.py --base http://127.0.0.1:PORT[/@account] [options] CALL...
    python wechatpy_driver.py --via intercept [options] CALL...

Makes each CALL (a name from CALLS) in order on one WeChatClient and prints
one JSON line per call with what the SDK's caller sees: the result, or the
exception's class, its errcode and errmsg as wechatpy exposes them, and the
HTTP status and Retry-After of the response the exception carries.

--via api_base_url (default): the client's API_BASE_URL is <base>/cgi-bin/,
as wechatpy's docs suggest; --via contrib: API_BASE_URL is left alone and
contrib/wechatpy_wxgate.py routes every call (on PYTHONPATH); --via intercept: nothing is changed in
the client (it calls https://api.weixin.qq.com as shipped) and the
environment routes it (HTTPS_PROXY, REQUESTS_CA_BUNDLE: wxgate's [intercept]).
--token T gives
the client a token (no token request); without it the client fetches its own
with --appid/--secret. Nothing leaves loopback: any other URL is refused
before a connection is made, and reported as the call's error (with --via
intercept: any URL requests would not send through a proxy on loopback).
"""

import argparse
import json
import sys
from urllib.parse import urlparse

import requests
from wechatpy import WeChatClient
from wechatpy.exceptions import WeChatClientException

CALLS = {
    "user.get": lambda c: c.user.get("oOPENID"),
    "menu.get": lambda c: c.menu.get(),
    "message.send_text": lambda c: c.message.send_text("oOPENID", "hello"),
    "fetch_access_token": lambda c: c.fetch_access_token(),
    "wxa.get_category": lambda c: c.wxa.get_category(),
    "wxa.code_to_session": lambda c: c.wxa.code_to_session("JSCODE"),
    "customservice.get_session_list": lambda c: c.customservice.get_session_list("kf1@test"),
    "datacube.get_user_summary": lambda c: c.datacube.get_user_summary("2026-11-01", "2026-11-02"),
    # --wecom (wechatpy.enterprise): an app message to everyone the app
    # sees, and to department 2, as wechatpy sends them.
    "wecom.send_all": lambda c: c.message.send_text(AGENT[0], "@all", "all hands at 10"),
    "wecom.send_party": lambda c: c.message.send_text(AGENT[0], "", "team meeting", party_ids=["2"]),
}

# --agent: the WeCom app's AgentId for the wecom.* calls.
AGENT = [0]


class TokenlessClient(WeChatClient):
    """--no-token: wxgate is the token server. Shadowing the `access_token`
    property makes every call carry `access_token=` (empty), which wxgate
    fills; the client never requests a token itself (no secret)."""

    access_token = ""


class Refuse(requests.adapters.BaseAdapter):
    """The transport for every URL that is not on loopback."""

    def send(self, request, **kwargs):
        raise requests.ConnectionError("sdk driver: refusing to leave loopback: " + request.url)

    def close(self):
        pass


class LoopbackOnly(requests.adapters.HTTPAdapter):
    """The transport for http:// URLs whose host is 127.0.0.1 (with or
    without user info: a base URL may carry caller:key@)."""

    def send(self, request, **kwargs):
        if urlparse(request.url).hostname != "127.0.0.1":
            raise requests.ConnectionError("sdk driver: refusing to leave loopback: " + request.url)
        return super().send(request, **kwargs)


def loopback_only(session):
    session.mount("https://", Refuse())
    session.mount("http://", LoopbackOnly())


class ViaLoopbackProxy(requests.adapters.HTTPAdapter):
    """The transport with --via intercept: only through a proxy on loopback."""

    def send(self, request, **kwargs):
        proxy = requests.utils.select_proxy(request.url, kwargs.get("proxies") or {})
        if not proxy or urlparse(proxy).hostname != "127.0.0.1":
            raise requests.ConnectionError("sdk driver: refusing to leave loopback (no proxy on loopback): " + request.url)
        return super().send(request, **kwargs)


def proxied_only(session):
    session.mount("https://", ViaLoopbackProxy())
    session.mount("http://", Refuse())


def outcome(name, call):
    try:
        return {"call": name, "ok": True, "result": call()}
    except WeChatClientException as e:
        response = getattr(e, "response", None)
        return {
            "call": name,
            "ok": False,
            "error": type(e).__name__,
            "wechat_client_exception": True,
            "errcode": e.errcode,
            "errmsg": e.errmsg,
            "status": response.status_code if response is not None else None,
            "retry_after": response.headers.get("Retry-After") if response is not None else None,
        }
    except Exception as e:  # what else reaches the caller: transport errors, the guard
        return {"call": name, "ok": False, "error": type(e).__name__, "wechat_client_exception": False,
                "errcode": None, "errmsg": str(e), "status": None, "retry_after": None}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", default="")
    p.add_argument("--via", choices=["api_base_url", "contrib", "intercept"], default="api_base_url")
    p.add_argument("--account", help="X-Wx-Account on every call (contrib only)")
    p.add_argument("--appid", default="wxsdktest")
    p.add_argument("--secret", default="SECRET")
    p.add_argument("--token")
    p.add_argument("--no-token", action="store_true",
                   help="send access_token= (empty) on every call: no secret, no token request, no 40001 retry")
    p.add_argument("--wecom", action="store_true",
                   help="a wechatpy.enterprise client: --appid is the corpid, --secret the app's, --agent its AgentId")
    p.add_argument("--agent", type=int, default=0)
    p.add_argument("calls", nargs="+", choices=sorted(CALLS))
    a = p.parse_args()
    AGENT[0] = a.agent

    if a.wecom:
        from wechatpy.enterprise import WeChatClient as WeComClient

        client = WeComClient(a.appid, a.secret, access_token=a.token, timeout=10)
    elif a.no_token:
        client = TokenlessClient(a.appid, None, timeout=10, auto_retry=False)
    else:
        client = WeChatClient(a.appid, a.secret, access_token=a.token, timeout=10)
    base = a.base.rstrip("/")
    if a.via == "intercept":
        proxied_only(client._http)
    else:
        if a.via == "contrib":
            from wechatpy_wxgate import through_wxgate

            hosts = ("https://qyapi.weixin.qq.com/",) if a.wecom else ("https://api.weixin.qq.com/",)
            through_wxgate(client, base, account=a.account, hosts=hosts)
        else:
            client.API_BASE_URL = base + "/cgi-bin/"
        loopback_only(client._http)

    for name in a.calls:
        print(json.dumps(outcome(name, lambda: CALLS[name](client)), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
