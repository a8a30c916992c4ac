/* OmniPost in-app inbox: <omnipost-inbox base-url="https://omnipost.example.com" token="ibx_…">.
 *
 * A dependency-free web component (open shadow root): a bell with the unread count; the bell unfolds
 * the feed; a click on an item reads it; "Mark all read"; live through the stream (Server-Sent
 * Events, which reconnect by themselves with Last-Event-ID, so nothing written meanwhile is missed).
 * The token is an inbox token the tenant's backend issued for this subscriber.
 */
(function () {
  "use strict";
  if (window.customElements.get("omnipost-inbox")) return;

  var STYLE = [
    ":host{position:relative;display:inline-block;font:14px/1.4 system-ui,sans-serif;color:#1f2937}",
    ".bell{position:relative;display:inline-flex;align-items:center;justify-content:center;border:1px solid #d1d5db;background:#fff;color:#374151;border-radius:999px;width:40px;height:40px;cursor:pointer}",
    ".count{position:absolute;top:-6px;right:-6px;min-width:18px;height:18px;padding:0 5px;border-radius:9px;background:#dc2626;color:#fff;font-size:12px;line-height:18px;box-sizing:border-box}",
    ".count[hidden]{display:none}",
    ".panel{position:absolute;right:0;top:48px;width:340px;max-height:420px;overflow:auto;background:#fff;border:1px solid #e5e7eb;border-radius:8px;box-shadow:0 8px 24px rgba(0,0,0,.12);z-index:1000}",
    ".panel[hidden]{display:none}",
    ".head{display:flex;justify-content:space-between;align-items:center;padding:10px 12px;border-bottom:1px solid #e5e7eb;font-weight:600}",
    ".mark-all{border:0;background:none;color:#2563eb;cursor:pointer;font-size:13px}",
    "ul{list-style:none;margin:0;padding:0}",
    "li{padding:10px 12px;border-bottom:1px solid #f3f4f6;cursor:pointer}",
    "li.unread{background:#eff6ff}",
    "li.unread .title::before{content:'';display:inline-block;width:8px;height:8px;border-radius:4px;background:#2563eb;margin-right:6px}",
    ".title{font-weight:600}",
    ".body{color:#4b5563;font-size:13px;margin-top:2px}",
    ".empty{padding:16px 12px;color:#6b7280}"
  ].join("\n");

  class OmniPostInbox extends HTMLElement {
    static get observedAttributes() { return ["base-url", "token"]; }
  }

  var proto = OmniPostInbox.prototype;

  proto.connectedCallback = function () {
    if (!this.shadowRoot) this._build();
    this._start();
  };

  proto.disconnectedCallback = function () { this._stop(); };

  proto.attributeChangedCallback = function (name, before, after) {
    if (before !== after && this.isConnected && this.shadowRoot) { this._stop(); this._start(); }
  };

  proto._build = function () {
    var root = this.attachShadow({ mode: "open" });
    root.innerHTML =
      "<style>" + STYLE + "</style>" +
      '<button class="bell" part="bell" aria-label="Notifications" aria-expanded="false">' +
      '<svg width="20" height="20" viewBox="0 0 24 24" fill="none" stroke="currentColor" stroke-width="2" ' +
      'stroke-linecap="round" stroke-linejoin="round" aria-hidden="true"><path d="M6 8a6 6 0 0 1 12 0c0 7 3 9 3 9H3s3-2 3-9"/>' +
      '<path d="M10.3 21a1.94 1.94 0 0 0 3.4 0"/></svg>' +
      '<span class="count" hidden></span></button>' +
      '<div class="panel" part="panel" hidden><div class="head"><span>Notifications</span>' +
      '<button class="mark-all" type="button">Mark all read</button></div><ul role="list"></ul></div>';
    this._bell = root.querySelector(".bell");
    this._count = root.querySelector(".count");
    this._panel = root.querySelector(".panel");
    this._list = root.querySelector("ul");
    var self = this;
    this._bell.addEventListener("click", function () {
      var open = self._panel.hasAttribute("hidden");
      if (open) self._panel.removeAttribute("hidden"); else self._panel.setAttribute("hidden", "");
      self._bell.setAttribute("aria-expanded", String(open));
    });
    root.querySelector(".mark-all").addEventListener("click", function () { self._markAll(); });
    this._list.addEventListener("click", function (event) {
      var li = event.target.closest("li[data-id]");
      if (li) self._read(li.getAttribute("data-id"));
    });
  };

  proto._base = function () { return (this.getAttribute("base-url") || "").replace(/\/+$/, "") + "/inbox/v1/"; };

  proto._api = function (path, method, body) {
    var init = { method: method || "GET", headers: { Authorization: "Bearer " + this.getAttribute("token") } };
    if (body !== undefined) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
    return fetch(this._base() + path, init).then(function (response) {
      if (!response.ok) throw new Error("omnipost-inbox: " + path + " answered " + response.status);
      return response.json();
    });
  };

  proto._start = function () {
    var self = this;
    this._items = [];
    if (!this.getAttribute("token") || !this.getAttribute("base-url")) return;
    // The stream first: it starts at the newest item when it opens (its first event, the counts), so
    // the feed read after that covers everything before; an item in both is shown once.
    var loaded = false;
    var url = this._base() + "stream?token=" + encodeURIComponent(this.getAttribute("token"));
    this._source = new EventSource(url);
    this._source.addEventListener("item", function (event) { self._upsert(JSON.parse(event.data), true); });
    this._source.addEventListener("counts", function (event) {
      self._setCounts(JSON.parse(event.data));
      if (!loaded) { loaded = true; self._load(); }
    });
  };

  proto._load = function () {
    var self = this;
    this._api("feed?limit=50").then(function (page) {
      var known = {};
      self._items.forEach(function (item) { known[item.id] = true; });
      self._items = self._items.concat(page.results.filter(function (item) { return !known[item.id]; }));
      self._render();
    }).catch(function (error) { console.warn(error); });
  };

  proto._stop = function () {
    if (this._source) { this._source.close(); this._source = null; }
  };

  proto._upsert = function (item, prepend) {
    for (var i = 0; i < this._items.length; i++) {
      if (this._items[i].id === item.id) { this._items[i] = item; this._render(); return; }
    }
    if (prepend) this._items.unshift(item); else this._items.push(item);
    this._render();
  };

  proto._setCounts = function (counts) {
    this._counts = counts;
    this._count.textContent = counts.unread > 99 ? "99+" : String(counts.unread);
    if (counts.unread > 0) this._count.removeAttribute("hidden"); else this._count.setAttribute("hidden", "");
    this._bell.setAttribute("aria-label", "Notifications, " + counts.unread + " unread");
    this.dispatchEvent(new CustomEvent("omnipost-counts", { detail: counts }));
  };

  proto._read = function (id) {
    var self = this;
    var item = this._items.filter(function (each) { return each.id === id; })[0];
    var counts = this._counts;
    if (item && !item.read_at && counts && counts.unread > 0) {  // at once; the stream's counts confirm it
      this._setCounts({ unseen: Math.max(0, counts.unseen - (item.seen_at ? 0 : 1)), unread: counts.unread - 1,
                        total: counts.total });
    }
    this._api("feed/" + encodeURIComponent(id) + "/read", "POST").then(function (updated) {
      self._upsert(updated, false);
      self.dispatchEvent(new CustomEvent("omnipost-read", { detail: updated }));
      if (updated.action_url) self.dispatchEvent(new CustomEvent("omnipost-action", { detail: updated }));
      return self._api("counts");
    }).then(function (counts) { self._setCounts(counts); }).catch(function (error) { console.warn(error); });
  };

  proto._markAll = function () {
    var self = this;
    this._api("feed/mark-all", "POST", { state: "read" }).then(function () {
      var now = new Date().toISOString();
      self._items.forEach(function (item) { item.read_at = item.read_at || now; item.seen_at = item.seen_at || now; });
      self._render();
      return self._api("counts");
    }).then(function (counts) { self._setCounts(counts); }).catch(function (error) { console.warn(error); });
  };

  proto._render = function () {
    var list = this._list;
    list.textContent = "";
    if (!this._items.length) {
      var empty = document.createElement("li");
      empty.className = "empty";
      empty.textContent = "Nothing yet";
      list.appendChild(empty);
      return;
    }
    this._items.forEach(function (item) {
      var li = document.createElement("li");
      li.setAttribute("data-id", item.id);
      li.className = item.read_at ? "read" : "unread";
      var title = document.createElement("div");
      title.className = "title";
      title.textContent = item.title;  // text, never markup
      var body = document.createElement("div");
      body.className = "body";
      body.textContent = item.body;
      li.appendChild(title);
      li.appendChild(body);
      list.appendChild(li);
    });
  };

  window.customElements.define("omnipost-inbox", OmniPostInbox);
})();
