#!/usr/bin/env bash
# Regenerates the screenshots in docs/images/ from the browser tests, which drive Debian's headless
# Chromium with the flags of app/tests/api/chromium.rs (`--headless --no-sandbox --disable-gpu …`,
# a 1280 × 900 window, stretched to the page's height; 390 × 844 for the phone) and save each page
# they check under target/browser-artifacts/ (PAYONCE_SCREENSHOTS=1 turns that on). Needs
# .ci/install-browser and DATABASE_URL (or the zero-config PostgreSQL), like the tests, and Redis
# for the Lab's run (REDIS_URL, default 127.0.0.1:6379).
set -euo pipefail
cd "$(dirname "$0")/../.."
PAYONCE_SCREENSHOTS=1 cargo test -p payonce --test api -- \
    browser::the_fixed_pages_as_an_operator_sees_them browser::the_shop_fits_a_phone \
    admin_refunds::in_a_browser_a_double_click_and_back_are_one_refund lab::lab_page_runs_a_storm_and_shows_double_charges_in_red
artifacts=target/browser-artifacts   # beside the sources, wherever CARGO_TARGET_DIR is (chromium.rs)
for name in dashboard-overview dashboard-keys dashboard-key-stuck dashboard-key-expired dashboard-gateway-audit \
    shop-phone-home shop-phone-checkout lab; do
    cp "$artifacts/$name.png" "docs/images/$name.png"
done
cp "$artifacts/admin-payment-refunded.png" docs/images/dashboard-payment-refunds.png
echo "updated $(ls docs/images/*.png | wc -l) screenshots in docs/images/"
