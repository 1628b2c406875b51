// sagaflow console: live regions.
//
// A page names an event stream in <body data-events="…">; each element with data-live="URL"
// is a region whose HTML is fetched again from URL whenever the stream sends a `change`
// event. A region is not replaced while one of its forms is open or being typed in; it is
// refreshed as soon as that form closes.
(function () {
  'use strict';

  var body = document.body;
  var source = body.getAttribute('data-events');
  var regions = document.querySelectorAll('[data-live]');
  var status = document.getElementById('live-status');

  function setStatus(text, cls) {
    if (!status) { return; }
    status.textContent = text;
    status.className = 'live-status ' + cls;
  }

  if (!source || regions.length === 0 || !window.EventSource || !window.fetch) {
    return;
  }

  var busy = false;
  var pending = false;

  function editing() {
    if (document.querySelector('[data-live] details[open]')) { return true; }
    var active = document.activeElement;
    return !!(active && active.closest && active.closest('[data-live] form'));
  }

  function load(region) {
    return fetch(region.getAttribute('data-live'), {
      credentials: 'same-origin',
      headers: { 'Accept': 'text/html' }
    }).then(function (res) {
      if (res.status === 401) {
        window.location.assign('/console/login');
        throw new Error('logged out');
      }
      if (!res.ok) { throw new Error('HTTP ' + res.status); }
      return res.text();
    }).then(function (html) {
      region.innerHTML = html;
    });
  }

  function refresh() {
    if (busy || editing()) {
      pending = true;
      return;
    }
    busy = true;
    pending = false;
    Promise.all(Array.prototype.map.call(regions, load)).then(function () {
      body.setAttribute('data-refreshed', String(Date.now()));
      setStatus('live', 'on');
    }, function () {
      setStatus('stale', 'off');
    }).then(function () {
      busy = false;
      if (pending) { window.setTimeout(refresh, 100); }
    });
  }

  function resumeIfIdle() {
    if (pending) { window.setTimeout(function () { if (!editing()) { refresh(); } }, 50); }
  }

  document.addEventListener('toggle', resumeIfIdle, true);
  document.addEventListener('focusout', resumeIfIdle, true);

  var events = new EventSource(source);
  events.addEventListener('open', function () { setStatus('live', 'on'); });
  events.addEventListener('error', function () { setStatus('reconnecting', 'off'); });
  events.addEventListener('change', refresh);
})();
