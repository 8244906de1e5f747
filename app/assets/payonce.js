// Live countdowns on the dashboard: <span class="countdown" data-remaining="SECONDS">.
// The server sends the seconds left on a lease (not a clock time), so the browser's clock may be
// wrong without the countdown being wrong. Without JavaScript the server's text stays.
(function () {
  "use strict";
  function tick() {
    var now = Date.now();
    document.querySelectorAll(".countdown[data-remaining]").forEach(function (el) {
      if (!el.dataset.seen) { el.dataset.seen = String(now); }
      var left = Number(el.dataset.remaining) - (now - Number(el.dataset.seen)) / 1000;
      var secs = Math.ceil(Math.abs(left));
      el.textContent = left > 0 ? "live, " + secs + " s left" : "lapsed " + secs + " s ago";
      el.classList.toggle("lapsed", left <= 0);
    });
  }
  document.addEventListener("DOMContentLoaded", tick);
  setInterval(tick, 250);
})();

// The live refresh (htmx, every 2 s) replaces a part of the page. What a person was doing in it
// survives the swap: open disclosures stay open (by id; htmx itself puts the keyboard focus back
// on the element with the focused element's id), and what changed is said once in the page's
// polite live region (the swapped part's data-announce), so a screen reader hears "3 keys match"
// instead of nothing, or the whole table.
(function () {
  "use strict";
  var open = [];
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    open = Array.prototype.map.call(target.querySelectorAll("details[open][id]"), function (el) { return el.id; });
    if (target.matches && target.matches("details[open][id]")) { open.push(target.id); }
  });
  document.addEventListener("htmx:afterSwap", function () {
    open.forEach(function (id) {
      var el = document.getElementById(id);
      if (el) { el.open = true; }
    });
    var region = document.getElementById("live-status");
    var source = document.querySelector("[data-announce]");
    if (region && source && source.dataset.announce !== region.dataset.last) {
      // The first refresh only records the page's state; later ones announce a change.
      if (region.dataset.last !== undefined) { region.textContent = source.dataset.announce; }
      region.dataset.last = source.dataset.announce;
    }
  });
})();

// Signing out ends the live refresh. A refresh still on its way when the session is deleted is
// answered "sign in again" (HX-Redirect to the login page, as for a session that expired), and
// htmx would follow that redirect over the sign-out's own navigation: the operator who had just
// signed out would read "Your session expired". So once the sign-out form is sent, no refresh
// starts and no refresh's answer is acted on.
(function () {
  "use strict";
  var leaving = false;
  document.addEventListener("submit", function (event) {
    if (event.target.matches && event.target.matches("form[action='/admin/logout']")) { leaving = true; }
  });
  ["htmx:beforeRequest", "htmx:beforeOnLoad"].forEach(function (name) {
    document.addEventListener(name, function (event) { if (leaving) { event.preventDefault(); } });
  });
})();
