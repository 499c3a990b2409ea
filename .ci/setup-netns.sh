#!/usr/bin/env bash
# What tests/test_multihost.py needs to build hosts from network namespaces: iproute2 (ip)
# and util-linux (unshare), run as root. Installs what is missing; never fails the CI run
# (without them the multi-host tests skip, saying why).
set -uo pipefail
missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null \
            || echo "setup-netns: could not install ${missing[*]}; multi-host tests will skip" >&2
    else
        echo "setup-netns: ${missing[*]} missing and not root with apt-get; multi-host tests will skip" >&2
    fi
fi
exit 0
