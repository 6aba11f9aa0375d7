#!/usr/bin/env bash
# Install the Debian packages the nodelet test bed needs, only those missing.
# Silent when everything is already there.
set -euo pipefail

pkgs=(containerd runc containernetworking-plugins busybox-static iptables
      protobuf-compiler gcc libc6-dev iproute2 python3 openssl skopeo apache2-utils
      curl shellcheck libseccomp-dev pkg-config)

missing=()
for p in "${pkgs[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
    [[ $status == ii* ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

sudo=()
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "deps: need root to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
fi

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    "${missing[@]}" >/dev/null
echo "deps: done"
