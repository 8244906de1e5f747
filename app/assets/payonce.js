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
