"""Send every call of a wechatpy client through wxgate.

wechatpy 1.8.x sets its host in ``WeChatClient.API_BASE_URL``, but some of its
calls ignore it and go to ``https://api.weixin.qq.com/`` whatever it says: the
access-token request (``client/__init__.py`` ``fetch_access_token``), the Mini
Program APIs and ``sns/jscode2session`` (``client/api/wxa.py``), customer
service (``customservice.py``), datacube, card, invoice, scan, wifi, device,
marketing, cloud, shakearound, merchant and semantic. This module rewrites
each request's URL just before it is sent, on the client's own
``requests.Session``, so all of them reach wxgate; nothing else changes.

Copy this file next to your code (it needs only ``requests``, which wechatpy
depends on)::

    from wechatpy import WeChatClient
    from wechatpy_wxgate import through_wxgate

    client = through_wxgate(WeChatClient(appid, secret), "http://wxgate:8080")

    # One account per base URL (wxgate's `@account` prefix) ...
    client = through_wxgate(WeChatClient(appid, secret), "http://wxgate:8080/@" + appid)
    # ... or the X-Wx-Account header on every call:
    client = through_wxgate(WeChatClient(appid, secret), "http://wxgate:8080", account=appid)

Leave ``API_BASE_URL`` as it is: its default (``https://api.weixin.qq.com/cgi-bin/``)
is rewritten like the hard-coded URLs. It works the same on ``WeChatOAuth``
and ``WeChatComponent`` (anything with the ``_http`` session that
``BaseWeChatClient.__init__`` creates). For WeCom (``wechatpy.enterprise``)
pass ``hosts=("https://qyapi.weixin.qq.com/",)`` to a wxgate whose upstream
is ``qyapi.weixin.qq.com``. WeChat Pay (``api.mch.weixin.qq.com``) and
``mp.weixin.qq.com`` URLs are left alone.
"""

import requests

#: URL prefixes sent to wxgate instead; everything else goes where it went.
WECHAT_HOSTS = ("https://api.weixin.qq.com/",)


class WxgateSession(requests.Session):
    """A ``requests.Session`` that sends calls for WeChat's hosts to wxgate.

    ``base_url`` is wxgate's address, optionally with an ``@account`` first
    segment (``http://wxgate:8080/@wx1234567890abcdef``). With ``account``
    every request carries ``X-Wx-Account: <account>``.
    """

    def __init__(self, base_url, account=None, hosts=WECHAT_HOSTS):
        super(WxgateSession, self).__init__()
        self.wxgate_base = base_url.rstrip("/") + "/"
        self.wechat_hosts = tuple(hosts)
        if account:
            self.headers["X-Wx-Account"] = account

    def wxgate_url(self, url):
        """``url`` with a WeChat host prefix replaced by wxgate's base URL."""
        for host in self.wechat_hosts:
            if url.startswith(host):
                return self.wxgate_base + url[len(host):]
        return url

    def request(self, method, url, *args, **kwargs):
        # Rewritten before requests resolves proxies, cookies and adapters,
        # so those follow wxgate's address, not WeChat's.
        return super(WxgateSession, self).request(method, self.wxgate_url(url), *args, **kwargs)


def through_wxgate(client, base_url, account=None, hosts=WECHAT_HOSTS):
    """Gives a wechatpy client (or ``WeChatOAuth``, ``WeChatComponent``) a
    :class:`WxgateSession` in place of its own ``requests.Session``; returns
    the client."""
    client._http = WxgateSession(base_url, account=account, hosts=hosts)
    return client
