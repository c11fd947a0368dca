#!/usr/bin/env bash
# Make the local base image every qoss image is built FROM, without any image registry:
# a minimal Debian 12 (bookworm) made with mmdebstrap from the host's Debian sources
# (bookworm, -updates, -security, as apt here has them, so its packages are the newest
# there), which it keeps for apt; imported into podman and finished by
# deploy/base/Dockerfile. Debian 12, root.
#
#   bash deploy/base/build-base.sh [IMAGE]     default localhost/qoss-base:bookworm
#
# Needs mmdebstrap and podman (scripts/compose-check.sh installs them). podman must be able
# to run containers here: CONTAINERS_CONF=deploy/podman/containers.conf on Debian 12's podman.
# mmdebstrap fetches with apt, many packages at a time, and unpacks them at once: about a
# third of the time debootstrap takes here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
image=${1:-localhost/qoss-base:bookworm}
rootfs_image=localhost/qoss-rootfs:bookworm
suite=bookworm

# The host's apt sources for Debian's bookworm suites, as deb822 stanzas, and the main
# mirror among them (the one serving the plain "bookworm" suite).
sources=$(python3 - "$suite" <<'PY'
import glob, re, sys

suite = sys.argv[1]
stanzas = []  # (uris, suites, components)
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for block in re.split(r"\n\s*\n", open(path).read()):
        fields, key = {}, None
        for line in block.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0] in " \t" and key:
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if fields.get("enabled", "yes").lower() == "no" or "deb" not in fields.get("types", "").split():
            continue
        stanzas.append((fields.get("uris", "").split(), fields.get("suites", "").split(),
                        fields.get("components", "").split()))
for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        continue
    for line in lines:
        line = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
        if len(line) >= 4 and line[0] == "deb":
            stanzas.append(([line[1]], [line[2]], line[3:]))
out, main = [], None
for uris, suites, components in stanzas:
    ours = [s for s in suites if s == suite or s.startswith(suite + "-")]
    if not ours or not uris:
        continue
    if suite in ours and main is None:
        main = uris[0]
    out.append(f"Types: deb\nURIs: {' '.join(uris)}\nSuites: {' '.join(ours)}\n"
               f"Components: {' '.join(components) or 'main'}\n"
               "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
if main is None:
    sys.exit(f"build-base: apt on this machine has no source for Debian {suite}")
print(main)
print("\n".join(out), end="")
PY
)
mirror=$(head -n 1 <<<"$sources")

tmp=$(mktemp -d /var/tmp/qoss-base.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

echo "build-base: mmdebstrap $suite from $mirror" >&2
tail -n +2 <<<"$sources" >"$tmp/debian.sources"
# The root file system as a tar file (mmdebstrap removes apt's lists and downloaded packages
# from it), imported only once it is whole.
timeout 1200 mmdebstrap --variant=minbase --include=ca-certificates --format=tar "$suite" "$tmp/root.tar" \
  "$tmp/debian.sources" >"$tmp/mmdebstrap.log" 2>&1 || { tail -n 30 "$tmp/mmdebstrap.log" >&2; exit 1; }
podman import -q "$tmp/root.tar" "$rootfs_image" >/dev/null
timeout 1200 podman build --build-arg ROOTFS="$rootfs_image" -t "$image" "$here" >"$tmp/build.log" 2>&1 \
  || { tail -n 30 "$tmp/build.log" >&2; exit 1; }
echo "build-base: $image" >&2
