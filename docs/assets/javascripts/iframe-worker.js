/* raysim's docs, opened from disk (file://): the browser refuses a Web Worker there, which
   Material's search runs in. This runs the worker's script in a hidden same-origin iframe
   instead, with the worker's globals (postMessage, onmessage, importScripts) mapped onto it.
   Served over http(s) it does nothing. It replaces the shim Material's offline plugin would load
   from a CDN, so the site makes no outside request. */
(function () {
  "use strict";
  if (location.protocol !== "file:" || window.__fileWorker) return;
  window.__fileWorker = true;

  function loadScripts(doc, urls) {
    return urls.reduce(function (done, url) {
      return done.then(function () {
        return new Promise(function (resolve, reject) {
          var script = doc.createElement("script");
          script.src = url;
          script.onload = resolve;
          script.onerror = function () { reject(new Error("cannot load " + url)); };
          doc.head.appendChild(script);
        });
      });
    }, Promise.resolve());
  }

  function FileWorker(url) {
    var target = document.createDocumentFragment();
    var self = this;
    var queue = [];
    var ready = false;
    var frame = document.createElement("iframe");
    frame.style.display = "none";
    frame.setAttribute("aria-hidden", "true");
    (document.body || document.documentElement).appendChild(frame);
    var win = frame.contentWindow;
    var doc = win.document;
    doc.open();
    doc.write("<!doctype html><html><head></head><body></body></html>");
    doc.close();
    var base = new URL(String(url), location.href);

    this.onmessage = null;
    this.onerror = null;
    this.addEventListener = target.addEventListener.bind(target);
    this.removeEventListener = target.removeEventListener.bind(target);

    function toPage(data) {
      var event = new MessageEvent("message", { data: data });
      target.dispatchEvent(event);
      if (typeof self.onmessage === "function") self.onmessage(event);
    }
    function toWorker(data) {
      setTimeout(function () {
        win.dispatchEvent(new win.MessageEvent("message", { data: data }));
      }, 0);
    }
    win.postMessage = function (data) { setTimeout(function () { toPage(data); }, 0); };
    win.importScripts = function () {
      var urls = Array.prototype.map.call(arguments, function (u) {
        return new URL(u, base).href;
      });
      return loadScripts(doc, urls);
    };
    win.addEventListener("error", function (event) {
      if (typeof self.onerror === "function") self.onerror(event);
    });

    this.postMessage = function (data) {
      if (ready) toWorker(data);
      else queue.push(data);
    };
    this.terminate = function () { frame.remove(); };

    loadScripts(doc, [base.href]).then(function () {
      ready = true;
      queue.splice(0).forEach(toWorker);
    }, function (error) {
      if (typeof self.onerror === "function") self.onerror(error);
    });
  }

  window.Worker = FileWorker;
})();
